"""Output folders (a training run, an export, a validation report): refused before the work when they
cannot be written (no attrgraph import: both packages ask it).

1. A path that exists and is not a folder is refused.
2. Otherwise its nearest existing folder (itself, or the first parent that exists) must be a folder
   this process can create entries in: tried for real, with a temporary folder removed at once (root
   ignores file modes, so asking `os.access` is not enough).
Each refusal is one sentence, raised as the caller's error class.
3. A file is written through `replaced`: into a temporary beside it, renamed over it when complete,
   removed when the write fails, so a full disk, a size limit or Ctrl-C never leaves half a file
   under its name (the old one stays); the failure is one `WriteError` line (h5file.write_error).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def check_output_folder(path: str | os.PathLike, error: type[Exception]) -> None:
    """Refuse, before any work, a folder `path` that a command could not create or write into."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise error(f"{path} is a file; pass a folder to write into (it is created if missing).")
    folder = path
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise error(f"{folder} is a file, so the folder {path} cannot be created; pass another folder.")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".attrgraph-check-", dir=folder))
    except OSError as e:
        reason = e.strerror or str(e) or type(e).__name__
        raise error(f"cannot write into {folder} ({reason}); pass a folder you can write to.") from None


@contextmanager
def replaced(path: str | os.PathLike, error: type[Exception] | None = None) -> Iterator[Path]:
    """A temporary path beside `path` (its name ends as `path`'s does, for writers that add a
    suffix) to write the new file into; renamed over `path` when the block ends (step 3). A failed
    write is `error` (default `WriteError`), one line."""
    from transcoders.errors import WriteError
    from transcoders.h5file import write_error

    error = error or WriteError
    path = Path(path)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) or type(e).__name__ == "SafetensorError":  # safetensors' I/O error
            raise write_error(path, e, error) from None
        raise
