"""Atomic HDF5 writes, one writer at a time: every HDF5 file of both packages is written through `edit_h5`
(attrgraph's graphs, supernodes and circuits; the transcoders' dashboards).

1. The new file (a copy of the old one, or a fresh one) is written to a temporary file
   `.NAME.PID@HOST.XXXXXXXX.tmp` in the same folder and renamed over the target on success, so a
   crash never leaves a half-written file under the final name; on an exception the temporary is
   deleted and the target is untouched. Files use the HDF5 1.10 format (`LIBVER`), whose metadata
   carries checksums.
2. Temporaries left by writers that died (same host, no process with that PID) are removed by the
   next write (`remove_stale_temporaries`).
3. Writers of one file take turns (POSIX: an flock on the empty `.NAME.lock` beside it, never
   renamed, released by the kernel when a writer dies), so two processes editing one file at once do
   not drop each other's changes.

h5py is imported on first use: importing this module loads neither it nor torch.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

LIBVER = ("v110", "latest")
"""HDF5 file-format bounds of every write: the 1.10 format checksums all metadata."""


def host_tag() -> str:
    """This host's name as temporaries carry it (letters, digits and dashes, at most 64)."""
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:64] or "host"


def _temp_pattern(path: Path) -> re.Pattern:
    """Step 1's `.NAME.PID@HOST.XXXXXXXX.tmp` (mkstemp's random part has no dots)."""
    return re.compile(re.escape(f".{path.name}.") + r"(\d+)@([A-Za-z0-9-]+)\.[^.]+\.tmp")


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporaries of `path` whose writer is gone: written on this host by a PID that
    no longer runs (POSIX only; a live or unknown writer's file is left alone). Returns them."""
    path = Path(path)
    if os.name != "posix" or not path.parent.is_dir():
        return []
    pattern, host, removed = _temp_pattern(path), host_tag(), []
    for entry in path.parent.iterdir():
        m = pattern.fullmatch(entry.name)
        if m is None or m.group(2) != host or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
            continue  # the writer still runs
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue  # a process of another user, or no such PID to ask about
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()
            removed.append(entry)
    return removed


@contextlib.contextmanager
def edit_h5(path: str | os.PathLike, fresh: bool = False):
    """Open a copy of the HDF5 file `path` (or a new file; with `fresh`, always a new one) for
    writing; on success the copy is renamed over `path` with the permissions a plain `open` would
    give, so a crash never leaves a half-written file under the final name. Every writer of HDF5
    files goes through here (graphs, supernodes, circuits, transcoders' dashboards).
    Missing parent folders are created; stale temporaries of dead writers are removed (step 2)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _one_writer(path):
        remove_stale_temporaries(path)
        fd, tmp = tempfile.mkstemp(
            prefix=f".{path.name}.{os.getpid()}@{host_tag()}.", suffix=".tmp", dir=path.parent
        )
        os.close(fd)
        try:
            if path.exists() and not fresh:
                shutil.copyfile(path, tmp)
            import h5py

            with h5py.File(tmp, "w" if fresh else "a", libver=LIBVER) as f:
                yield f
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


@contextlib.contextmanager
def _one_writer(path: Path):
    """Step 3: hold an exclusive flock on `.NAME.lock` (never renamed, so every writer locks the
    same file; the kernel releases it when a writer dies). Without fcntl (Windows), no lock."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path.parent / f".{path.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
