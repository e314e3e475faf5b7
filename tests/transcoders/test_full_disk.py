"""A full disk while the transcoders package writes (../shared/BAD_INPUTS.md round 2 asked it of
graphs: one line, the old file intact, no temporary left). Before this round a training checkpoint,
a saved set (any format) and a run's manifest were written in place: a full disk ended in
safetensors' `SafetensorError` traceback, left `checkpoint.tmp` behind, and a save over an existing
set left half a weights file under its name.

On a real 3 MB tmpfs (`small_tmpfs`, root only), filled to a few kB before the write."""

import os

import pytest
import torch

from tests.transcoders.tc_helpers import CLI_ARGS, random_set
from transcoders import WriteError, load_transcoders, save_transcoders
from transcoders.h5file import write_error


def fill(folder, leave: int) -> None:
    """Fill `folder`'s file system up to `leave` bytes."""
    st = os.statvfs(folder)
    (folder / "filler").write_bytes(b"\0" * max(st.f_bavail * st.f_frsize - leave, 0))


def files(folder) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_safetensors_errors_are_read_for_their_os_error():
    """safetensors reports the OSError only in its text; the line names what it was."""
    from pathlib import Path

    for text, said in [
        ("Error while serializing: I/O error: File too large (os error 27)", "would pass the size limit"),
        (
            "Error while serializing: I/O error: No space left on device (os error 28)",
            "no space left on its disk",
        ),
    ]:
        assert said in str(write_error(Path("w.safetensors"), Exception(text), WriteError))


@pytest.mark.parametrize("fmt", ["native", "circuit-tracer", "gemmascope", "sae-lens"])
def test_a_save_over_a_set_on_a_full_disk_keeps_the_old_set(small_tmpfs, fmt):
    folder = small_tmpfs / "set"
    save_transcoders(random_set("plt", "jumprelu", n_layers=2, seed=0), folder, format=fmt)
    before = files(folder)
    fill(small_tmpfs, 8_192)
    with pytest.raises(WriteError, match=r"^cannot write .*: no space left on its disk") as e:
        save_transcoders(random_set("plt", "jumprelu", n_layers=2, seed=1), folder, format=fmt)
    assert "\n" not in str(e.value)
    (small_tmpfs / "filler").unlink()
    if fmt != "sae-lens":  # sae_lens's save_model writes in place: the error is one line, no more
        assert files(folder) == before  # every file as it was, no temporary beside them
        torch.testing.assert_close(
            load_transcoders(folder).W_enc, random_set("plt", "jumprelu", n_layers=2).W_enc
        )


def test_a_checkpoint_on_a_full_disk_stops_the_run_in_one_line(small_tmpfs, capsys):
    from transcoders.train import main

    out = small_tmpfs / "run"
    fill(small_tmpfs, 64_000)  # less than one checkpoint
    assert main([*CLI_ARGS, "--checkpoint-every", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(
        f"python -m transcoders.train: error: cannot write {out / 'checkpoint.tmp'}/state.safetensors: no space left"
    )
    assert err.endswith("The run stopped; no checkpoint was kept yet.")
    assert not out.exists()  # no checkpoint.tmp left, nor the run folder the run made (run_folder.py)


def test_a_full_disk_at_the_final_save_says_the_set_is_in_the_checkpoint(small_tmpfs, capsys, monkeypatch):
    """The last checkpoint holds the trained set: once there is room, the same command saves it
    without training again."""
    import transcoders.train as train_module
    from transcoders.train import main

    out = small_tmpfs / "run"
    args = [*CLI_ARGS, "--checkpoint-every", "1000", "--out", str(out)]
    save_native = train_module.save_native

    def after_the_checkpoint_the_disk_fills(tc, dest):
        fill(small_tmpfs, 4_096)
        return save_native(tc, dest)

    monkeypatch.setattr(train_module, "save_native", after_the_checkpoint_the_disk_fills)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "weights.safetensors: no space left on its disk" in err
    assert err.endswith(
        f"The trained set is in {out / 'checkpoint'}: the same command saves it without training again."
    )
    assert not (out / "transcoders" / "weights.safetensors").exists()  # no half file under its name
    monkeypatch.setattr(train_module, "save_native", save_native)
    (small_tmpfs / "filler").unlink()
    assert main(args) == 0
    assert load_transcoders(out / "transcoders").n_layers == 4
