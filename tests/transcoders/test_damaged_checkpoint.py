"""Bad input round 7 (docs/bad_inputs.md "Round 7"): a run resumed from a checkpoint that a disk,
a hand edit or a copy damaged. Each is refused before the first step with one
`CorruptCheckpointError` line naming the checkpoint and what is wrong with it; before this round each
was a traceback (JSONDecodeError, KeyError, TypeError, SafetensorError, torch's RuntimeError), a
NaN blamed on the next step, or, for a resized Adam moment, a crash inside the optimizer."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.transcoders.test_checkpoint import run
from transcoders import CorruptCheckpointError

STOP = 2  # of 6 steps: the resume has steps left to take, so the Adam state is used


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A run stopped after STOP steps, its checkpoint left as a resume finds it."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    run(out, stop_after=STOP)
    return out


@pytest.fixture
def copy(stopped, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(stopped, out)
    return out


def edit_meta(out, edit):
    path = out / "checkpoint" / "meta.json"
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))


def edit_state(out, edit):
    path = out / "checkpoint" / "state.safetensors"
    state = load_file(path)
    edit(state)
    save_file(state, path)


def refused(out, pattern):
    with pytest.raises(CorruptCheckpointError, match=pattern) as e:
        run(out)
    message = str(e.value)
    assert message.startswith(f"{out / 'checkpoint'} is damaged: ") and "\n" not in message
    assert message.endswith(
        "remove it to train afresh (or pass another --out), or put back a good copy of it to resume."
    )


def test_an_undamaged_copy_resumes(copy):
    _, info = run(copy)
    assert info["steps"] == 6


@pytest.mark.parametrize(
    "text, pattern",
    [
        (b"{", r"meta\.json is not valid JSON: .* at line 1, column 2;"),
        (b"\xff", r"meta\.json is not UTF-8 text \(byte 0\);"),
        (b"[]", r"meta\.json holds a JSON list, not an object;"),
    ],
)
def test_a_meta_json_that_is_not_an_object(copy, text, pattern):
    (copy / "checkpoint" / "meta.json").write_bytes(text)
    refused(copy, pattern)


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (lambda m: m.pop("step"), r"meta\.json lacks 'step';"),
        (lambda m: m.update(step=-3), r"meta\.json's step is -3, not a count;"),
        (lambda m: m.update(shards="x"), r"meta\.json's shards is 'x', not a count;"),
        (lambda m: m.update(shards=0), r"meta\.json's shards is 0, not a count;"),
        (
            lambda m: m.update(param_groups=[{}]),
            r"meta\.json's param_groups lack Adam's \['betas', 'eps', 'lr', 'weight_decay'\];",
        ),
        (
            lambda m: m["tc_config"].update(kind="x"),
            r"meta\.json's tc_config: kind 'x' is not one of \('sae', 'plt', 'clt'\);",
        ),
        (
            lambda m: m.update(param_order=m["param_order"][::-1]),
            r"meta\.json's param_order \[.*\] is not the run's \[",
        ),
    ],
)
def test_a_meta_json_field_a_resume_cannot_use(copy, edit, pattern):
    edit_meta(copy, edit)
    refused(copy, pattern)


def test_a_truncated_state_file(copy):
    path = copy / "checkpoint" / "state.safetensors"
    path.write_bytes(path.read_bytes()[:1000])
    refused(copy, r"a state file could not be read \(Error while deserializing header: ")


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (
            lambda s: s.pop("tc.W_enc"),
            r"its set's tensors do not fit the run's \(Missing key\(s\) in state_dict: \"W_enc\"",
        ),
        (
            lambda s: s.update({"tc.b_enc": s["tc.b_enc"][:, :5].contiguous()}),
            r"its set's tensors do not fit the run's \(size mismatch for b_enc",
        ),
        (lambda s: s.pop("scale.in"), r"its state lacks \['scale\.in'\];"),
        (
            lambda s: s["tc.W_enc"].view(-1)[:3].fill_(float("nan")),
            r"tc\.W_enc holds NaN or inf, which no good step writes;",
        ),
        (
            lambda s: s.update({"opt.W_enc.exp_avg": s["opt.W_enc.exp_avg"][..., :3].contiguous()}),
            r"opt\.W_enc\.exp_avg has shape \(2, 32, 3\), its parameter's \(2, 32, 32\);",
        ),
    ],
)
def test_a_state_tensor_the_run_cannot_take(copy, edit, pattern):
    edit_state(copy, edit)
    refused(copy, pattern)


def test_the_cli_says_it_in_one_line(copy, capsys, monkeypatch):
    """Through `python -m transcoders.train`: exit 2 and the sentence alone (a traceback before)."""
    from tests.transcoders.tc_helpers import CLI_ARGS
    from transcoders.train import main

    out = copy.parent / "cli"
    args = [*CLI_ARGS, "--n-tokens", "512", "--checkpoint-every", "1", "--out", str(out)]
    assert main(args) == 0
    (out / "checkpoint" / "meta.json").write_text("{")
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"python -m transcoders.train: error: {out / 'checkpoint'} is damaged: "
    )


def test_nan_in_the_checkpoint_is_not_blamed_on_the_next_step(copy):
    """Before, the resumed run stopped with 'a weight became NaN or inf before step 3 ... lower --lr',
    pointing at the learning rate for what the file held."""
    edit_state(copy, lambda s: s["tc.W_dec.0"].view(-1)[0].fill_(float("inf")))
    with pytest.raises(CorruptCheckpointError, match=r"tc\.W_dec\.0 holds NaN or inf") as e:
        run(copy)
    assert "--lr" not in str(e.value)
    assert torch.isinf(
        load_file(copy / "checkpoint" / "state.safetensors")["tc.W_dec.0"]
    ).any()  # left as it was
