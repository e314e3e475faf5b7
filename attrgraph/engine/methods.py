"""The attribution methods `attribute(method=...)` runs, and the options each takes.

A table with no engine behind it, so that the command line can refuse an option its method does
not take (`--tau` without `--method hierarchical`) before torch and the model load, in the same
words `attribute` uses from Python, each spelled where it is read: `method='standard'` and `tau` for
Python, `--method standard` and `--tau` for the command line.
"""

from __future__ import annotations

from attrgraph.errors import OptionError

METHODS = ("standard", "hierarchical", "adaptive")

OPTIONS = {
    "standard": {"max_n_logits", "desired_logit_prob", "targets", "progress", "precision"},
    "hierarchical": {"targets", "tau"},
    "adaptive": {"max_n_logits", "desired_logit_prob", "max_feature_nodes"},
}
"""The options each method takes beyond (model, transcoders, prompt, exclude_bos, embedding,
batch_size, backend)."""

NEEDED = {"adaptive": "max_feature_nodes"}
"""The option a method cannot run without."""

FLAGS = {
    "max_n_logits": "--max-logits",
    "desired_logit_prob": "--logit-prob",
    "max_feature_nodes": "--max-feature-nodes",
}
"""Options whose command-line flag is not the option's name with '-' for '_'."""


def check_method(method: str, given: dict, cli: bool = False) -> None:
    """`OptionError` unless `method` is one of `METHODS`, takes every option of `given` that is not
    None (`precision="fp32"` and `progress=False`, the defaults, count as not given) and has the
    option it needs. `cli` words the sentence for the command line."""
    if method not in METHODS:
        raise OptionError(f"method is {method!r}; pass one of {METHODS}.")

    def option(k: str) -> str:
        return FLAGS.get(k, "--" + k.replace("_", "-")) if cli else k

    def named(m: str) -> str:
        return f"--method {m}" if cli else f"method={m!r}"

    defaults = {"precision": "fp32", "progress": False}
    used = [k for k, v in given.items() if v is not None and not (k in defaults and v == defaults[k])]
    wrong = sorted(k for k in used if k not in OPTIONS[method])
    if wrong:
        takers = {k: " or ".join(named(m) for m in METHODS if k in OPTIONS[m]) for k in wrong}
        raise OptionError(
            f"{named(method)} does not take {', '.join(option(k) for k in wrong)} "
            f"({'; '.join(f'{option(k)} is for {m}' for k, m in takers.items())}); leave it out or change "
            f"{'--method' if cli else 'method'}."
        )
    need = NEEDED.get(method)
    if need is not None and given.get(need) is None:
        raise OptionError(f"{named(method)} needs {option(need)}, the most features to explore.")
