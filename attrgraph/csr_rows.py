"""Rows of a sparse matrix written batch by batch, with a peak of the result plus one batch.

The rows engines (attribute.backward_rows, linear_backward.linear_rows) produce one dense block
of rows per batch of targets. Collecting CSR blocks and stacking them at the end holds every
block and the stacked copy at once (twice the edges). Instead:

1. Each batch's nonzeros are appended to two buffers (values, column indices) that grow in place
   (`ndarray.resize`, i.e. realloc: large blocks are remapped, not copied), by a factor 1.25.
2. Column indices are int32 while the matrix fits (the usual case), else int64.
3. Rows may arrive in any order (a batch is a list of row numbers); when they arrive in order,
   the buffers are already the CSR arrays, else one permuting copy is made at the end.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from jaxtyping import Float, Int

_INT32_MAX = 2**31 - 1


class CsrRowWriter:
    """Collects the rows of an `n_rows x n_cols` matrix (module docstring)."""

    def __init__(self, n_rows: int, n_cols: int, dtype=np.float32, capacity: int = 1 << 16):
        self.n_rows, self.n_cols = n_rows, n_cols
        index_dtype = np.int32 if n_cols <= _INT32_MAX else np.int64
        self.data = np.empty(capacity, dtype)
        self.indices = np.empty(capacity, index_dtype)
        self.nnz = 0
        self.row_order: list[np.ndarray] = []
        self.row_counts: list[np.ndarray] = []

    def _reserve(self, extra: int) -> None:
        need = self.nnz + extra
        if self.indices.dtype == np.int32 and need > _INT32_MAX:
            self.indices = self.indices.astype(np.int64)
        if need > len(self.data):
            size = max(need, int(len(self.data) * 1.25) + 1)
            self.data.resize(size, refcheck=False)
            self.indices.resize(size, refcheck=False)

    def append(
        self,
        rows: Int[np.ndarray, " B"],
        block: Float[np.ndarray, "B n"],
        columns: Int[np.ndarray, " n"] | None = None,
    ) -> None:
        """Rows `rows` of the matrix: `block[i, j]` is entry `(rows[i], columns[j])`; `columns`
        ascending (default: all columns)."""
        if columns is None:
            columns = np.arange(block.shape[1])
        mask = block != 0
        counts = mask.sum(1)
        k = int(counts.sum())
        self._reserve(k)
        end = self.nnz + k
        self.data[self.nnz : end] = block[mask]
        self.indices[self.nnz : end] = np.broadcast_to(columns.astype(self.indices.dtype), block.shape)[mask]
        self.nnz = end
        self.row_order.append(np.asarray(rows, np.int64))
        self.row_counts.append(counts.astype(np.int64))

    def to_csr(self) -> sp.csr_array:
        """The matrix; rows that no batch wrote are empty. Hands the buffers over (call once)."""
        order = np.concatenate(self.row_order) if self.row_order else np.zeros(0, np.int64)
        counts = np.concatenate(self.row_counts) if self.row_counts else np.zeros(0, np.int64)
        if len(order) and (
            order.min() < 0 or order.max() >= self.n_rows or len(np.unique(order)) < len(order)
        ):
            raise ValueError(f"rows written more than once or outside 0..{self.n_rows - 1}.")
        per_row = np.zeros(self.n_rows, np.int64)
        per_row[order] = counts
        indptr = np.concatenate([[0], np.cumsum(per_row)]).astype(self.indices.dtype)
        data, indices = self.data, self.indices
        self.data = self.indices = None
        data.resize(self.nnz, refcheck=False)
        indices.resize(self.nnz, refcheck=False)
        if np.any(order[1:] < order[:-1]):  # rows out of order: one permuting copy
            by_row = np.argsort(order)
            src_start = (np.cumsum(counts) - counts)[by_row]
            dest_start = np.cumsum(counts[by_row]) - counts[by_row]
            src = np.repeat(src_start - dest_start, counts[by_row]) + np.arange(len(data))
            data, indices = data[src], indices[src]
        return sp.csr_array((data, indices, indptr), shape=(self.n_rows, self.n_cols))
