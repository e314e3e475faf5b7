"""The `attrgraph` command line. Each subcommand lives beside the code it drives and
registers itself in `SUBCOMMANDS` (name -> module path exposing `add_parser(sub)` and `run(args)`).

The process is ours, so `main` also sets `OMP_WAIT_POLICY=PASSIVE` (unless the user set it) before
anything imports torch: waiting OpenMP threads then sleep instead of spinning, which keeps two
threads fast beside other busy processes (engine/threads.py)."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import warnings

from transcoders.command import INTERRUPTED as INTERRUPTED_STATUS
from transcoders.command import TERMINATED, close_progress_bars, interrupt_once, restore_interrupt

DESCRIPTION = (
    "Exact attribution graphs for transformers with sparse transcoders: build, show, validate, "
    "export and serve them, convert circuit-tracer's, and import views shared as Neuronpedia links."
)
"""`attrgraph --help`'s description: whole sentences (the docstring's first line is cut mid-sentence)."""
SUBCOMMANDS = {
    "predict": "attrgraph.cli.predict",
    "circuit": "attrgraph.cli.circuit",
    "build": "attrgraph.cli.build",
    "build-many": "attrgraph.cli.build_many",
    "show": "attrgraph.cli.show",
    "validate": "attrgraph.cli.validate",
    "export": "attrgraph.cli.export",
    "import-view": "attrgraph.cli.import_view",
    "convert": "attrgraph.cli.convert",
    "serve": "attrgraph.cli.serve",
    "train-transcoders": "transcoders.train",
}


def add_prompt_options(p: argparse.ArgumentParser) -> None:
    """`--strict` and `--truncate` (attribute.to_tokens), for the commands that take a prompt."""
    p.add_argument(
        "--strict", action="store_true", help="refuse a prompt holding words the model's vocabulary lacks"
    )
    p.add_argument(
        "--truncate",
        action="store_true",
        help="keep the first n_ctx tokens of a longer prompt, saying what was dropped (default: refuse it)",
    )


def passive_openmp() -> bool:
    """Set `OMP_WAIT_POLICY=PASSIVE` unless the user set a policy; True when it is set here.
    libgomp reads the variable once, when torch loads it: once torch is imported, setting it would
    change nothing but what the engine believes (engine/threads.py reads it), so it is left alone."""
    if "OMP_WAIT_POLICY" in os.environ or "torch" in sys.modules:
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    passive_openmp()  # before the subcommands import torch
    parser = argparse.ArgumentParser(prog="attrgraph", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {name: importlib.import_module(path) for name, path in SUBCOMMANDS.items()}
    for module in modules.values():
        module.add_parser(sub)
    args = parser.parse_args(argv)
    from attrgraph.errors import AttrgraphError, ExportWarning, GraphReplacedWarning, PromptWarning
    from transcoders.errors import Terminated

    ours = (PromptWarning, ExportWarning, GraphReplacedWarning)

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, ours):  # one line, like the errors
            print(f"attrgraph {args.command}: warning: {message}", file=sys.stderr)
        else:
            show_default(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():  # restores showwarning and the filters
        for category in ours:  # every run says it, not the first only
            warnings.simplefilter("always", category)
        show_default, warnings.showwarning = warnings.showwarning, show
        previous = interrupt_once()
        try:
            rc = modules[args.command].run(args) or 0
            sys.stdout.flush()  # here, so that a reader gone by now is met below and not at exit
            return rc
        except BrokenPipeError:  # the reader of stdout is gone (`| head`): stop without a word
            _stdout_to_devnull()
            return BROKEN_PIPE
        except Terminated as e:  # train-transcoders stopped by SIGTERM at a checkpointed step
            close_progress_bars()
            if os.environ.get("RANK", "0") == "0":
                print(f"attrgraph {args.command}: {e}", file=sys.stderr)
            return TERMINATED
        except AttrgraphError as e:  # TranscoderError included
            # a user's mistake: its one sentence, not a traceback
            print(f"attrgraph {args.command}: error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # Ctrl-C: one line and the shell's status for SIGINT, 128 + 2
            close_progress_bars()  # so that the line starts a line of its own
            print(f"attrgraph {args.command}: {INTERRUPTED}", file=sys.stderr)
            return INTERRUPTED_STATUS
        finally:  # an in-process caller gets its handler back, unless a Ctrl-C came (we are ending)
            restore_interrupt(previous)


INTERRUPTED = "interrupted; any file being written is left as it was."
"""What Ctrl-C prints: a write it stops keeps the old file and leaves no temporary (graph/store.py)."""


BROKEN_PIPE = 128 + signal.SIGPIPE
"""The exit status when stdout's reader is gone: a command killed by SIGPIPE, as the shell reports it."""


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of what is still buffered
    meets no closed pipe (it would print "Exception ignored ... BrokenPipeError")."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # a stdout that is no file (a test's capture)
        pass


if __name__ == "__main__":
    sys.exit(main())
