"""Each bundled set's manifest names the command that made it (issue 33, part 4): today's
`python -m transcoders.train` parses that command into the very configuration the manifest recorded
when the set was trained, field for field, so that running it again trains the same set. A set
trained before a field existed, or whose default moved since (as `max_grad_norm` did), fails here:
its command would train something else.

The recorded configuration is `dataclasses.asdict` of the `TrainConfig` the run used, written as
JSON by the trainer; the expected one comes from parsing the command's words with the CLI's parser.
"""

import dataclasses
import json
import shlex

import pytest

from transcoders.config_cli import parse_config
from transcoders.paths import BUNDLED
from transcoders.train import TrainConfig, build_parser

SETS = ["default-plt", "default-clt", "default-attn-sae"]
pytestmark = pytest.mark.bundled(*SETS)


def command_argv(command: str) -> list[str]:
    """The trainer's arguments in a manifest's command (environment settings and the
    `python -m transcoders.train` prefix left out)."""
    words = shlex.split(command)
    start = words.index("transcoders.train") + 1
    assert words[start - 2 : start] == ["-m", "transcoders.train"], command
    return words[start:]


@pytest.mark.parametrize("name", SETS)
def test_the_manifest_command_parses_to_the_recorded_config(name):
    manifest = json.loads((BUNDLED[name] / "manifest.json").read_text())
    cfg = parse_config(build_parser(), TrainConfig, command_argv(manifest["command"]))
    parsed = json.loads(json.dumps(dataclasses.asdict(cfg)))  # tuples as the manifest's JSON lists
    assert parsed == manifest["config"]
    assert cfg.save_to == f"data/{name}"  # the command writes the set where it is shipped


@pytest.mark.parametrize("name", SETS)
def test_the_manifest_was_trained_with_one_thread(name):
    """Sums in float32 depend on the thread count: the command fixes it, as the run recorded it."""
    manifest = json.loads((BUNDLED[name] / "manifest.json").read_text())
    assert manifest["command"].startswith("OMP_NUM_THREADS=1 ") and manifest["threads"] == 1


def test_a_command_missing_a_moved_default_is_caught():
    """The check above fails for a set trained at another clipping than today's default."""
    recorded = dataclasses.asdict(TrainConfig(kind="plt", max_grad_norm=128.0))
    cfg = parse_config(build_parser(), TrainConfig, command_argv("python -m transcoders.train --kind plt"))
    assert json.loads(json.dumps(dataclasses.asdict(cfg))) != json.loads(json.dumps(recorded))
