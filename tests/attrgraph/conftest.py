"""Fixtures for the attrgraph tests (helpers live in ag_helpers.py)."""

import pytest

from tests.attrgraph.ag_helpers import graph_from_dense, random_graph, tiny_model, tiny_transcoders


@pytest.fixture
def make_random_graph():
    return random_graph


@pytest.fixture
def make_graph_from_dense():
    return graph_from_dense


@pytest.fixture
def make_tiny_model():
    return tiny_model


@pytest.fixture
def make_tiny_transcoders():
    return tiny_transcoders


@pytest.fixture
def one_torch_thread():
    """Run a test with one torch thread (restored after): tiny models are fastest that way, and on a
    shared CPU two spinning threads can be ten times slower than one."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
