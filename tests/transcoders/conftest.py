"""Fixtures for the transcoders tests.

The repository root goes first on sys.path: without it, pytest's rootdir insertion makes
`tests/transcoders` shadow the real `transcoders` package as a namespace package.
"""

import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
for name in [m for m in sys.modules if m == "transcoders" or m.startswith("transcoders.")]:
    if getattr(sys.modules[name], "__file__", None) is None:  # a namespace shadow: drop it
        del sys.modules[name]

from tc_helpers import tiny_model  # noqa: E402


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
