"""A training step reads from the device as little as it can: on a GPU each read (tests/host_reads.py:
`.item()`, `bool()`, a boolean index, `bincount`, `.tolist()`, ...) waits for every kernel queued, so
the host cannot queue the next step's kernels ahead. Counted here on the CPU, where the dispatcher sees
the same calls: per step one read for the finite checks (the loss and the previous step's weights, in
one), plus AuxK's count of dead features for TopK and BatchTopK (BatchTopK's threshold, a running mean
that the first batch sets, is updated without asking the host which batch it is). Adam's step counter
is a host tensor on every device (torch keeps it there unless `capturable`): its reads are not counted."""

import pytest
import torch

from tests.host_reads import count_host_reads
from tests.transcoders.tc_helpers import tiny_model
from tests.transcoders.test_train import random_sequences, small_cfg
from transcoders.trainer import Trainer


@pytest.mark.parametrize(
    "kind, activation, expected",
    [  # TopK and BatchTopK: AuxK's count of dead features too
        ("plt", "jumprelu", ["tolist"]),
        ("clt", "jumprelu", ["tolist"]),
        ("plt", "topk", ["tolist", "_local_scalar_dense"]),
        ("clt", "topk", ["tolist", "_local_scalar_dense"]),
        ("plt", "batchtopk", ["tolist", "_local_scalar_dense"]),
        ("clt", "batchtopk", ["tolist", "_local_scalar_dense"]),
    ],
)
def test_a_step_reads_the_device_once(tmp_path, kind, activation, expected):
    cfg = small_cfg(
        tmp_path, kind=kind, activation=activation, k=8, n_tokens=256 * 12, checkpoint_every=10**9
    )
    trainer = Trainer(cfg, model=tiny_model(), sequences=random_sequences())
    batches = trainer.store.batches(0)
    trainer.step(*next(batches))  # the first block is built (its model run reads too)
    x, y = next(batches)
    reads = count_host_reads(lambda: trainer.step(x, y), under="/transcoders/")
    assert sorted(r.split(" at ")[0] for r in reads.seen) == sorted(expected), reads.seen


def test_a_nan_weight_is_caught_before_the_next_step_changes_anything(tmp_path):
    """Adam's check moved into the next step's read: weights an infinite learning rate broke at step 0
    stop step 1 before its backward (no weight changes again), naming step 0; a checkpoint checks too."""
    from transcoders import NonFiniteError

    cfg = small_cfg(tmp_path, n_tokens=256 * 12, checkpoint_every=10**9)
    object.__setattr__(cfg, "lr", float("inf"))  # TrainConfig refuses it: forced, to break step 0
    trainer = Trainer(cfg, model=tiny_model(), sequences=random_sequences())
    batches = trainer.store.batches(0)
    trainer.step(*next(batches))
    assert not all(torch.isfinite(p).all() for p in trainer.tc.parameters())
    before = [p.detach().clone().view(torch.int32) for p in trainer.tc.parameters()]  # bits: NaN != NaN
    with pytest.raises(NonFiniteError, match="a weight became NaN or inf at step 0; training stopped"):
        trainer.step(*next(batches))
    assert all(torch.equal(p.detach().view(torch.int32), b) for p, b in zip(trainer.tc.parameters(), before))
    with pytest.raises(NonFiniteError, match="a weight became NaN or inf"):
        trainer.checkpoint()
    assert not (tmp_path / "run" / "checkpoint").exists()
