"""Fixtures for the transcoders tests."""

import pytest

from tests.transcoders.tc_helpers import tiny_model


@pytest.fixture
def model():
    return tiny_model()


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors on a shared 2-core machine: one thread is ~20x faster than two oversubscribed."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
