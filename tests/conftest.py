"""Shared test set-up: offline, seeded, CPU."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

# Tests use tiny matrices, where a second OpenMP thread only adds synchronisation (it was
# 10-20x slower on a loaded 2-core machine); heavier tests may raise it locally.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)
    np.random.seed(0)
    yield
