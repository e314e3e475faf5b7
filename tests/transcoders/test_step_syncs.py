"""A training step reads from the device as little as it can: on a GPU each read (`.item()`, `bool()`,
a boolean index, `bincount`, `repeat_interleave`, `.tolist()`) waits for every kernel queued, so the
host cannot queue the next step's kernels ahead. Counted here on the CPU, where the dispatcher sees
the same calls: per step one read for the finite checks (the loss and the previous step's weights, in
one), plus AuxK's count of dead features for TopK. Adam's step counter is a host tensor on every
device (torch keeps it there unless `capturable`): its reads are not counted."""

import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.transcoders.tc_helpers import tiny_model
from tests.transcoders.test_train import random_sequences, small_cfg
from transcoders.trainer import Trainer

READS = {"_local_scalar_dense", "nonzero", "masked_select", "bincount", "repeat_interleave", "unique"}


class HostReads(TorchDispatchMode):
    """Ops that read a device tensor's values on the host, by the line of project code that made them."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def note(self, what: str) -> None:
        stack = traceback.extract_stack()
        if any("/torch/optim/" in f.filename for f in stack):
            return
        mine = [f for f in stack if "/transcoders/" in f.filename and "/tests/" not in f.filename]
        self.seen.append(f"{what} at {mine[-1].filename.rsplit('/', 1)[-1]}:{mine[-1].lineno}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        bool_index = name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or ()
        )
        if name in READS or bool_index:
            self.note(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "activation, expected",
    [("topk", ["tolist", "_local_scalar_dense"]), ("jumprelu", ["tolist"])],  # TopK: AuxK's dead count
)
def test_a_step_reads_the_device_once(tmp_path, monkeypatch, activation, expected):
    cfg = small_cfg(tmp_path, activation=activation, k=8, n_tokens=256 * 12, checkpoint_every=10**9)
    trainer = Trainer(cfg, model=tiny_model(), sequences=random_sequences())
    batches = trainer.store.batches(0)
    trainer.step(*next(batches))  # the first block is built (its model run reads too)
    x, y = next(batches)
    reads = HostReads()
    tolist = torch.Tensor.tolist

    def counted(t, *a, **k):
        reads.note("tolist")
        return tolist(t, *a, **k)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    with reads:
        trainer.step(x, y)
    assert sorted(r.split(" at ")[0] for r in reads.seen) == sorted(expected), reads.seen


def test_a_nan_weight_is_caught_before_the_next_step_changes_anything(tmp_path):
    """Adam's check moved into the next step's read: weights an infinite learning rate broke at step 0
    stop step 1 before its backward (no weight changes again), naming step 0; a checkpoint checks too."""
    from transcoders import NonFiniteError

    cfg = small_cfg(tmp_path, n_tokens=256 * 12, checkpoint_every=10**9, lr=float("inf"))
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
