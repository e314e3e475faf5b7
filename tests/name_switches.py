"""A static scan for code that switches on a transcoder kind's or a nonlinearity's name (STYLE.md:
"Variation lives with its class"), shared by tests/attrgraph/test_no_kind_switches.py and
tests/transcoders/test_no_activation_switches.py.

`violations(source, names, fields)` flags (1) a comparison, `match` case or dict key with one of
`names` as a string literal, and (2) a comparison with, or lookup by, a config's attribute named in
`fields` (`cfg.kind`, `x.cfg.activation`, `tcfg.activation`, ...).
"""

import ast


def _strings(node: ast.AST) -> list[str]:
    """String literals of `node`, or of the elements of a tuple / list / set literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


def _config_field(node: ast.AST, fields: tuple[str, ...]) -> bool:
    if not (isinstance(node, ast.Attribute) and node.attr in fields):
        return False
    owner = node.value
    name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
    return name.endswith("cfg")


def violations(source: str, names: set[str], fields: tuple[str, ...]) -> list[tuple[int, str]]:
    out, what = [], " / ".join(fields)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            named = sorted({s for o in operands for s in _strings(o)} & names)
            if named:
                out.append((node.lineno, f"compares with {named}"))
            if any(_config_field(o, fields) for o in operands):
                out.append((node.lineno, f"compares a config's {what}"))
        elif isinstance(node, ast.match_case):
            named = sorted({s for n in ast.walk(node.pattern) for s in _strings(n)} & names)
            if named:
                out.append((node.pattern.lineno, f"matches {named}"))
        elif isinstance(node, ast.Dict):
            named = sorted({s for k in node.keys if k is not None for s in _strings(k)} & names)
            if named:
                out.append((node.lineno, f"dispatches on {named}"))
        elif isinstance(node, ast.Subscript) and _config_field(node.slice, fields):
            out.append((node.lineno, f"looks up by a config's {what}"))
    return out
