"""Fixtures for the circuit tests (helpers live in circuit_helpers.py)."""

import pytest
import torch

from tests.attrgraph.circuits.circuit_helpers import make_pairs, tiny_model


@pytest.fixture(scope="module")
def model64():
    return tiny_model(torch.float64)


@pytest.fixture
def pairs():
    return make_pairs()
