"""The dtype attribution computes in, for a model of any floating dtype.

A bfloat16 model keeps 8 significant bits and a float16 model 11, so a sum of thousands of edges
computed in the model's dtype is off by a few per cent (benchmarks/results/dtypes.md). Hence:

1. The recorded forward (`ReplacementModel.run`) runs the model in its own dtype: it is the model
   being explained, and its patterns, norm scales, activations and errors are what they are.
2. The sources' scaled decoder rows `a_s W_dec_s` (sources.py) and the linear backward
   (linear_backward.py, the default engine) are computed in `compute_dtype(model dtype)`, the
   recorded values and weights cast per layer: float64 and float32 models compute in their own
   dtype, bfloat16 and float16 models in float32. Rows leave as arrays of that dtype.
3. The autograd engine (autograd_rows.py, the reference and the fallback) differentiates through
   the model itself, so its gradients have the model's precision; the contraction with the
   sources and the rows are in `compute_dtype` (numpy has no bfloat16). Logit target vectors
   (`e_tok - 1/d_vocab`) and EAP scores are float32 at least too.

`compute_dtype` is `torch.promote_types(dtype, float32)`: it never lowers a dtype.
4. `precision` (`PRECISIONS`) trades exactness for speed on a GPU: TF32 products, or the linear
   backward's products in bfloat16; rows stay in `compute_dtype`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from attrgraph.errors import OptionError

HALF = (torch.bfloat16, torch.float16)
"""Model dtypes that attribution does not compute in (step 2)."""


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the frozen backward of a model in `dtype` computes in (float32 at least)."""
    return torch.promote_types(dtype, torch.float32)


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of rows computed for a model in `dtype`."""
    return np.dtype(str(compute_dtype(dtype)).removeprefix("torch."))


PRECISIONS = ("fp32", "tf32", "bf16")
"""What the linear engine's products compute in (step 4):
- "fp32" (default): `compute_dtype`, with TF32 off on a GPU: the exactness contract (DESIGN.md);
- "tf32": the same dtypes, float32 products on a GPU's tensor cores in TF32 (10-bit mantissa
  inputs, float32 sums); on the CPU it is "fp32";
- "bf16": the backward's products in bfloat16 (8-bit mantissa), rows and influence in float32.
The price of each against "fp32" is measured in benchmarks/results/precision.md."""


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise OptionError(f"precision is {precision!r}; pass one of {PRECISIONS}.")


def walk_dtype(dtype: torch.dtype, precision: str) -> torch.dtype:
    """The dtype of the linear backward's products for a model in `dtype` (step 4)."""
    check_precision(precision)
    return torch.bfloat16 if precision == "bf16" else compute_dtype(dtype)


@contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    """TF32 on for "tf32", off otherwise (whatever the caller had set), restored after."""
    check_precision(precision)
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
