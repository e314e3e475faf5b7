"""config_cli: a dataclass becomes command-line options (defaults, types, help from field docstrings,
bool and tuple fields) and bad values end the program in one line with exit code 2."""

import argparse
import dataclasses
from dataclasses import dataclass

import pytest

from transcoders.config_cli import add_fields, field_docs, parse_config


@dataclass(frozen=True)
class Toy:
    n_steps: int = 3
    """Steps to run (100% of them)."""
    rate: float = 0.5
    """Learning rate."""
    name: str = "run"
    """A name."""
    shuffle: bool = True
    """Shuffle the data."""
    sizes: tuple[int, ...] = (1, 2)
    """Widths, one per layer."""
    span: tuple[float, float] = (0.0, 1.0)
    """Lower and upper bound."""
    undocumented: int = 7

    def __post_init__(self):
        if self.n_steps < 1:
            raise ValueError(f"n_steps is {self.n_steps}; pass 1 or more.")


def parser() -> argparse.ArgumentParser:
    return add_fields(argparse.ArgumentParser(prog="toy"), Toy)


def test_defaults_give_the_dataclass_defaults():
    assert parse_config(parser(), Toy, []) == Toy()


def test_values_are_converted_to_the_field_types():
    argv = ["--n-steps", "12", "--rate", "1e-3", "--name", "x", "--no-shuffle", "--sizes", "4", "8", "16"]
    cfg = parse_config(parser(), Toy, argv + ["--span", "-1", "2.5"])
    assert cfg == Toy(n_steps=12, rate=0.001, name="x", shuffle=False, sizes=(4, 8, 16), span=(-1.0, 2.5))
    assert type(cfg.n_steps) is int and type(cfg.rate) is float and type(cfg.sizes) is tuple
    assert parse_config(parser(), Toy, ["--shuffle"]).shuffle is True


def test_help_is_the_field_docstring_and_the_default():
    helps = {a.dest: a.help for a in parser()._actions}
    assert helps["n_steps"] == "Steps to run (100%% of them). (default: 3)"  # % escaped for argparse
    assert helps["sizes"] == "Widths, one per layer. (default: 1 2)"
    assert helps["undocumented"] == " (default: 7)"
    text = parser().format_help()
    assert "Steps to run (100% of them). (default: 3)" in " ".join(text.split())
    assert "--shuffle, --no-shuffle" in text


def test_field_docs_reads_the_string_under_each_field():
    assert field_docs(Toy) == {
        "n_steps": "Steps to run (100% of them).",
        "rate": "Learning rate.",
        "name": "A name.",
        "shuffle": "Shuffle the data.",
        "sizes": "Widths, one per layer.",
        "span": "Lower and upper bound.",
    }


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--n-steps", "three"], "argument --n-steps: invalid int value: 'three'"),
        (["--rate", "fast"], "argument --rate: invalid float value: 'fast'"),
        (["--sizes", "4", "x"], "argument --sizes: invalid int value: 'x'"),
        (["--sizes"], "argument --sizes: expected at least one argument"),
        (["--span", "1"], "argument --span: expected 2 arguments"),
        (["--shuffle=yes"], "argument --shuffle/--no-shuffle: ignored explicit argument 'yes'"),
        (["--n-step", "3", "--bogus"], "unrecognized arguments: --bogus"),
        (["--n-steps", "0"], "toy: error: n_steps is 0; pass 1 or more."),  # __post_init__'s refusal
    ],
)
def test_bad_values_exit_2_in_one_line(capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        parse_config(parser(), Toy, argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and words in err and "Traceback" not in err


def test_a_field_without_a_command_line_form_is_refused_when_the_parser_is_built():
    @dataclass
    class Bad:
        layers: list[int] = dataclasses.field(default_factory=list)
        """Not a tuple."""

    with pytest.raises(TypeError, match="'layers' has type list\\[int\\]"):
        add_fields(argparse.ArgumentParser(), Bad)


def test_the_real_configs_document_every_field():
    """Every option of `python -m transcoders.train` and `python -m attrgraph.bundled.train_model` has help."""
    from attrgraph.bundled.train_model import ModelTrainConfig
    from transcoders.train import TrainConfig

    for cls in (TrainConfig, ModelTrainConfig):
        assert set(field_docs(cls)) == {f.name for f in dataclasses.fields(cls)}, cls.__name__
