"""CsrRowWriter rebuilds the matrix whatever the batch order, sizes and gaps."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attrgraph.engine.csr_rows import CsrRowWriter


def write(dense, order, batch, capacity=4):
    out = CsrRowWriter(*dense.shape, capacity=capacity)
    for i in range(0, len(order), batch):
        rows = order[i : i + batch]
        out.append(rows, dense[rows])
    return out.to_csr()


@given(
    n_rows=st.integers(1, 30),
    n_cols=st.integers(1, 20),
    batch=st.integers(1, 7),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=60, deadline=None)
def test_rows_in_any_order_give_the_dense_matrix(n_rows, n_cols, batch, shuffle, seed):
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
    dense[rng.random(dense.shape) < 0.6] = 0
    order = rng.permutation(n_rows) if shuffle else np.arange(n_rows)
    got = write(dense, order, batch)
    np.testing.assert_array_equal(got.toarray(), dense)
    assert got.nnz == np.count_nonzero(dense)
    assert got.indices.dtype == np.int32 and got.has_sorted_indices


def test_block_columns_map_to_global_columns_and_missing_rows_stay_empty():
    out = CsrRowWriter(4, 10)
    out.append(np.array([2]), np.array([[1.0, 0.0, 3.0]], np.float32), np.array([1, 5, 9]))
    out.append(np.array([0]), np.array([[0.0, 2.0]], np.float32), np.array([3, 4]))
    want = np.zeros((4, 10), np.float32)
    want[2, 1], want[2, 9], want[0, 4] = 1, 3, 2
    np.testing.assert_array_equal(out.to_csr().toarray(), want)


def test_a_row_written_twice_is_an_error():
    out = CsrRowWriter(3, 2)
    out.append(np.array([1]), np.ones((1, 2), np.float32))
    out.append(np.array([1]), np.ones((1, 2), np.float32))
    with pytest.raises(ValueError, match="more than once"):
        out.to_csr()


def test_buffers_grow_past_many_pages():
    rng = np.random.default_rng(1)
    dense = rng.standard_normal((300, 500)).astype(np.float32)  # 150k nonzeros from a 4-entry start
    got = write(dense, np.arange(300), 64, capacity=4)
    np.testing.assert_array_equal(got.toarray(), dense)


def test_growth_without_mremap_copies_into_a_larger_map(monkeypatch):
    """Platforms without mremap (macOS, Windows) fall back to copying; the result is the same."""
    import mmap

    import attrgraph.engine.csr_rows as cr

    class NoRemap(mmap.mmap):
        def resize(self, n):
            raise SystemError("mmap: resizing not available--no mremap()")

    def no_remap_map(n_bytes):
        return NoRemap(-1, max(1, n_bytes))

    monkeypatch.setattr(cr, "_anonymous_map", no_remap_map)
    rng = np.random.default_rng(2)
    dense = rng.standard_normal((100, 300)).astype(np.float32)
    dense[rng.random(dense.shape) < 0.5] = 0
    np.testing.assert_array_equal(write(dense, np.arange(100), 16, capacity=4).toarray(), dense)


@pytest.mark.parametrize("shuffle", [False, True])
def test_blocks_without_zeros_are_copied_whole(shuffle):
    """A block with no zero (the linear engine's usual block) takes the copy path: values and
    columns as given, one row after another."""
    rng = np.random.default_rng(2)
    n_rows, n_cols = 12, 40
    want = np.zeros((n_rows, n_cols), np.float32)
    out = CsrRowWriter(n_rows, n_cols, capacity=4)
    order = rng.permutation(n_rows) if shuffle else np.arange(n_rows)
    for i in range(0, n_rows, 5):
        rows = order[i : i + 5]
        columns = np.sort(rng.choice(n_cols, size=7, replace=False))
        block = rng.uniform(1, 2, (len(rows), 7)).astype(np.float32)
        want[np.ix_(rows, columns)] = block
        out.append(rows, block, columns)
    got = out.to_csr()
    np.testing.assert_array_equal(got.toarray(), want)
    assert got.nnz == np.count_nonzero(want) and got.has_sorted_indices
