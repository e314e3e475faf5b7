"""Fixtures for the viewer tests (helpers live in viewer_helpers.py)."""

import pytest

from tests.attrgraph.viewer.viewer_helpers import chromium, ioi_graph, toy_circuits


@pytest.fixture(scope="session")
def ioi():
    """The pruned IOI graph of the bundled model (tests using it carry the `bundled` marker)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return ioi_graph()
    finally:
        torch.set_num_threads(n)


@pytest.fixture
def ioi_file(ioi, tmp_path):
    """A fresh file holding the IOI graph as "ioi" and two toy circuits."""
    from attrgraph.graph.store import save_graph

    path = tmp_path / "graphs.h5"
    save_graph(ioi, path, "ioi")
    toy_circuits(path)
    return path


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = chromium(tmp_path_factory.mktemp("chromium"))
    yield driver
    driver.quit()
