"""host_copy.py: pieces of device tensors land where numpy's own slice assignment puts them, however
the staging buffers split and reuse them (on the CPU the buffers are plain memory; on a GPU,
tests/test_devices.py's resident-rows case runs the pinned path through `DeviceRows.to_csr`)."""

from unittest import mock

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attrgraph.engine import host_copy
from attrgraph.engine.host_copy import HostCopy


@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=8),
    stage=st.integers(1, 9),
    wide_index=st.booleans(),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=80, deadline=None)
def test_pieces_land_where_slice_assignment_puts_them(lengths, stage, wide_index, seed):
    """Parts of several lengths, written one after another in a shuffled order of places, through
    buffers of `stage` entries (so a part is split, and each buffer is reused many times)."""
    rng = np.random.default_rng(seed)
    total = sum(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    values = [torch.from_numpy(rng.standard_normal(n).astype(np.float32)) for n in lengths]
    itype = np.int64 if wide_index else np.int32
    columns = [torch.from_numpy(rng.integers(0, 2**31 - 1, n).astype(itype)) for n in lengths]
    want_values, want_columns = np.full(total, np.nan, np.float32), np.full(total, -1, itype)
    got_values, got_columns = want_values.copy(), want_columns.copy()
    with mock.patch.object(host_copy, "STAGE_ENTRIES", stage):
        copy = HostCopy(torch.device("cpu"), (got_values, got_columns))
        for j in rng.permutation(len(lengths)):
            want_values[starts[j] : starts[j] + lengths[j]] = values[j].numpy()
            want_columns[starts[j] : starts[j] + lengths[j]] = columns[j].numpy()
            copy.put(int(starts[j]), values[j], columns[j])
        copy.finish()
    np.testing.assert_array_equal(got_values, want_values)
    np.testing.assert_array_equal(got_columns, want_columns)
