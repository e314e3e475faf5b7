"""Refuse NaN and inf where attribution would otherwise store them silently.

A transcoder set or model with NaN or inf weights (a diverged training run; `load_transcoders`
refuses such sets, but a set built in Python or a model is not loaded through it), or values that
overflow the dtype, make feature activations, errors and edges NaN. A JumpReLU or ReLU then
reads a NaN pre-activation as inactive, so the graph looks valid: 0 features, NaN influence, and
scores that a comparison with NaN turns into 1. Two checks, each one `NonFiniteValueError` line:
1. `check_state`: after the recorded forward (replacement.py step 1-2), the logits, feature
   activations and errors of every site must be finite.
2. `check_rows`: every block of edge values a rows engine writes (csr_rows.py) must be finite;
   `refuse_rows` for rows counted on their device (device_rows.py).
"""

from __future__ import annotations

import numpy as np
import torch

from attrgraph.errors import NonFiniteValueError

_FIX = "check the model and transcoders for NaN or inf weights, or run them in float32."


def _count(value: torch.Tensor) -> int:
    return int((~torch.isfinite(value)).sum())


def check_state(named: dict[str, torch.Tensor | None]) -> None:
    """Step 1: each named tensor (None: absent) holds finite values only."""
    for name, value in named.items():
        if value is not None and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise NonFiniteValueError(
                f"the forward pass on this prompt gave {_count(value)} NaN or inf {name} of "
                f"{value.numel()}; {_FIX}"
            )


def check_rows(block: np.ndarray) -> None:
    """Step 2: a block of edge values holds finite values only."""
    if not np.isfinite(block).all():
        refuse_rows(int(block.size - np.isfinite(block).sum()), "in one batch of rows")


def refuse_rows(bad: int, where: str) -> None:
    """Step 2 where the non-finite edge values were counted elsewhere (on the device: device_rows.py)."""
    if bad:
        raise NonFiniteValueError(f"attribution gave {bad} NaN or inf edge values {where}; {_FIX}")
