"""Dataclass configs as command-line options: one `--flag` per field, its docstring as the help."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect


def field_docs(cls) -> dict[str, str]:
    """The docstring under each dataclass field (for --help)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for a, b in zip(body, body[1:], strict=False):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
            docs[a.target.id] = str(b.value.value)
    return docs


def add_fields(p: argparse.ArgumentParser, cls) -> argparse.ArgumentParser:
    """One option per field of the dataclass `cls`, its docstring as the help."""
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        help_ = (docs.get(f.name, "") + f" (default: {f.default})").replace("%", "%%")
        if f.type in (bool, "bool"):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_)
        else:
            typ = {"int": int, "float": float, "str": str}.get(str(f.type), type(f.default))
            p.add_argument(flag, type=typ, default=f.default, help=help_)
    return p
