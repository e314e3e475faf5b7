"""Rows of a sparse matrix written batch by batch, with a peak of the result plus one batch.

The rows engines (attribute.backward_rows, linear_backward.linear_rows) produce one dense block
of rows per batch of targets. Collecting CSR blocks and stacking them at the end holds every
block and the stacked copy at once (twice the edges); a buffer grown by `realloc` may copy itself
on growth (the old and the new buffer at once). Instead:

1. Each batch's nonzeros are appended to two buffers (values, column indices) held in anonymous
   memory maps, grown by `mremap` (`mmap.resize`): pages move, nothing is copied, and only the
   pages written are resident. A block without zeros (the linear engine's usual block) is copied
   as it is, its columns written once per row; otherwise the nonzeros are selected first.
2. Column indices are int32 while they fit (the usual case), else int64.
3. Rows may arrive in any order (a batch is a list of row numbers); when they arrive in order,
   the buffers are already the CSR arrays, else one permuting copy is made at the end
   (`assemble_csr`, which device_rows.py's rows, compacted on their device, share).
"""

from __future__ import annotations

import mmap

import numpy as np
import scipy.sparse as sp
from jaxtyping import Float, Int

from attrgraph.engine.finite import check_rows

_INT32_MAX = 2**31 - 1


def _anonymous_map(n_bytes: int) -> mmap.mmap:
    # private: a shared anonymous map keeps its first size as backing, and pages past it fault
    flags = getattr(mmap, "MAP_PRIVATE", None)
    return mmap.mmap(-1, max(1, n_bytes)) if flags is None else mmap.mmap(-1, max(1, n_bytes), flags=flags)


class _MappedArray:
    """A 1-d array of `dtype` in an anonymous memory map that grows in place (step 1). Where the
    platform cannot remap (no mremap: macOS, Windows), growing copies into a larger map."""

    def __init__(self, dtype, capacity: int):
        self.dtype = np.dtype(dtype)
        self.map = _anonymous_map(capacity * self.dtype.itemsize)

    def __len__(self) -> int:
        return len(self.map) // self.dtype.itemsize

    def _resize(self, n: int) -> None:
        try:
            self.map.resize(max(1, n) * self.dtype.itemsize)
        except (SystemError, OSError, ValueError):  # no mremap here
            bigger = _anonymous_map(n * self.dtype.itemsize)
            keep = min(len(self.map), len(bigger))
            bigger[:keep] = self.map[:keep]
            self.map.close()
            self.map = bigger

    def write(self, start: int, values: np.ndarray) -> None:
        """Entries `start...` are `values` (a block [B, n] is written row after row; a row [n] given
        with `rows=B` is written B times)."""
        n = values.size
        need = start + n
        if need > len(self):
            self._resize(max(need, len(self) * 3 // 2))
        view = np.frombuffer(self.map, self.dtype, count=n, offset=start * self.dtype.itemsize)
        view.reshape(values.shape)[...] = values
        del view  # a map with a live view cannot be resized

    def write_rows(self, start: int, row: np.ndarray, rows: int) -> None:
        """Entries `start...` are `rows` copies of `row`, without materializing them."""
        need = start + rows * len(row)
        if need > len(self):
            self._resize(max(need, len(self) * 3 // 2))
        count = rows * len(row)
        view = np.frombuffer(self.map, self.dtype, count=count, offset=start * self.dtype.itemsize)
        view.reshape(rows, len(row))[...] = row
        del view

    def array(self, n: int) -> np.ndarray:
        """The first n entries, as an array on the map (the map is released with the array)."""
        if n == 0:
            return np.zeros(0, self.dtype)
        try:
            self.map.resize(n * self.dtype.itemsize)  # give back the unused tail
        except (SystemError, OSError, ValueError):
            pass  # never written, so never resident
        return np.frombuffer(self.map, self.dtype, count=n)

    def astype(self, dtype, n: int) -> _MappedArray:
        out = _MappedArray(dtype, len(self))
        for i in range(0, n, 1 << 24):
            view = np.frombuffer(
                self.map, self.dtype, count=min(n - i, 1 << 24), offset=i * self.dtype.itemsize
            )
            out.write(i, view)
            del view
        return out


class CsrRowWriter:
    """Collects the rows of an `n_rows x n_cols` matrix (module docstring)."""

    def __init__(self, n_rows: int, n_cols: int, dtype=np.float32, capacity: int = 1 << 16):
        self.n_rows, self.n_cols = n_rows, n_cols
        self.data = _MappedArray(dtype, capacity)
        self.indices = _MappedArray(index_dtype(n_cols, 0), capacity)
        self.nnz = 0
        self.row_order: list[np.ndarray] = []
        self.row_counts: list[np.ndarray] = []

    def append(
        self,
        rows: Int[np.ndarray, " B"],
        block: Float[np.ndarray, "B n"],
        columns: Int[np.ndarray, " n"] | None = None,
    ) -> None:
        """Rows `rows` of the matrix: `block[i, j]` is entry `(rows[i], columns[j])`; `columns`
        ascending (default: all columns)."""
        check_rows(block)  # finite.py: a NaN edge is refused, not stored
        if columns is None:
            columns = np.arange(block.shape[1])
        B, n = block.shape
        dense = np.count_nonzero(block) == block.size  # the usual block: every entry reachable and nonzero
        if dense:
            counts = np.full(B, n, np.int64)
        else:
            mask = block != 0
            counts = mask.sum(1)
        end = self.nnz + int(counts.sum())
        if self.indices.dtype != index_dtype(self.n_cols, end):
            self.indices = self.indices.astype(np.int64, self.nnz)
        columns = columns.astype(self.indices.dtype, copy=False)
        if dense:
            self.data.write(self.nnz, block)
            self.indices.write_rows(self.nnz, columns, B)
        else:
            self.data.write(self.nnz, block[mask])
            self.indices.write(self.nnz, np.broadcast_to(columns, block.shape)[mask])
        self.nnz = end
        self.row_order.append(np.asarray(rows, np.int64))
        self.row_counts.append(counts.astype(np.int64))

    def to_csr(self) -> sp.csr_array:
        """The matrix; rows that no batch wrote are empty. Hands the buffers over (call once)."""
        order = np.concatenate(self.row_order) if self.row_order else np.zeros(0, np.int64)
        counts = np.concatenate(self.row_counts) if self.row_counts else np.zeros(0, np.int64)
        data, indices = self.data.array(self.nnz), self.indices.array(self.nnz)
        self.data = self.indices = None
        return assemble_csr(self.n_rows, self.n_cols, order, counts, data, indices)


def index_dtype(n_cols: int, nnz: int):
    """Step 2: int32 column indices (and row pointers, which scipy wants of the same type) while
    both fit, else int64."""
    return np.int32 if max(n_cols, nnz) <= _INT32_MAX else np.int64


def assemble_csr(
    n_rows: int,
    n_cols: int,
    order: Int[np.ndarray, " n_written"],
    counts: Int[np.ndarray, " n_written"],
    data: np.ndarray,
    indices: np.ndarray,
) -> sp.csr_array:
    """Step 3: the CSR matrix of rows written one after another: the i-th written row is row
    `order[i]`, its `counts[i]` entries next in `data` and `indices`; rows never written are empty."""
    if len(order) and (order.min() < 0 or order.max() >= n_rows or len(np.unique(order)) < len(order)):
        raise ValueError(f"rows written more than once or outside 0..{n_rows - 1}.")
    per_row = np.zeros(n_rows, np.int64)
    per_row[order] = counts
    indptr = np.concatenate([[0], np.cumsum(per_row)]).astype(indices.dtype)
    if np.any(order[1:] < order[:-1]):  # rows out of order: one permuting copy
        by_row = np.argsort(order)
        src_start = (np.cumsum(counts) - counts)[by_row]
        dest_start = np.cumsum(counts[by_row]) - counts[by_row]
        src = np.repeat(src_start - dest_start, counts[by_row]) + np.arange(len(data))
        data, indices = data[src], indices[src]
    return sp.csr_array((data, indices, indptr), shape=(n_rows, n_cols))
