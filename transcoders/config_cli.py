"""Dataclass configs as command-line options: one `--flag` per field, its docstring as the help.

1. Each field `name: T = default` becomes `--name` (underscores as dashes) with that default;
   its help is the docstring under the field, followed by the default.
2. `bool` gives `--name / --no-name`; `int`, `float`, `str` convert the value; `tuple[T, ...]`
   takes one or more values and `tuple[T, T]` exactly two (any fixed length), each converted to
   `T`, stored as a tuple. Other types have no command-line form and raise `TypeError` when the
   parser is built (a programming error, not a user's).
3. `parse_config` parses and builds the dataclass; a value its `__post_init__` refuses
   (`ValueError`, e.g. `ConfigError`) ends the program like a malformed one: one line, exit 2.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import typing

SCALARS = (int, float, str)


def field_docs(cls) -> dict[str, str]:
    """The docstring under each dataclass field (for --help)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for a, b in zip(body, body[1:], strict=False):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
            docs[a.target.id] = str(b.value.value)
    return docs


class _StoreTuple(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, tuple(values))


def _option(name: str, typ) -> dict:
    """argparse keyword arguments for a field of type `typ` (step 2)."""
    if typ is bool:
        return {"action": argparse.BooleanOptionalAction}
    if typ in SCALARS:
        return {"type": typ}
    if typing.get_origin(typ) is tuple:
        args = typing.get_args(typ)
        variadic = len(args) == 2 and args[1] is Ellipsis
        items = set(args[:1] if variadic else args)
        if len(items) == 1 and next(iter(items)) in SCALARS:
            return {"type": items.pop(), "nargs": "+" if variadic else len(args), "action": _StoreTuple}
    raise TypeError(f"config field {name!r} has type {typ!r}, which has no command-line form")


def add_fields(p: argparse.ArgumentParser, cls) -> argparse.ArgumentParser:
    """One option per field of the dataclass `cls`, its docstring as the help (steps 1-2)."""
    docs = field_docs(cls)
    types = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        shown = " ".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default
        help_ = (docs.get(f.name, "") + f" (default: {shown})").replace("%", "%%")
        p.add_argument(
            "--" + f.name.replace("_", "-"), default=f.default, help=help_, **_option(f.name, types[f.name])
        )
    return p


def parse_config(p: argparse.ArgumentParser, cls, argv: list[str] | None = None):
    """Parse `argv` with a parser built by `add_fields` and return the `cls` it describes (step 3)."""
    args = p.parse_args(argv)
    fields = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: v for k, v in vars(args).items() if k in fields})
    except ValueError as e:
        p.error(str(e))
