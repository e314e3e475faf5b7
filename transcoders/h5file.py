"""Atomic HDF5 writes, one writer at a time: every HDF5 file of both packages is written through `edit_h5`
(attrgraph's graphs, supernodes and circuits; the transcoders' dashboards).

1. The new file (a copy of the old one, or a fresh one) is written to a temporary file
   `.NAME.PID@HOST.XXXXXXXX.tmp` in the same folder and renamed over the target on success, so a
   crash never leaves a half-written file under the final name; on an exception the temporary is
   deleted and the target is untouched. Files use the HDF5 1.10 format (`LIBVER`), whose metadata
   carries checksums.
2. Temporaries left by writers that died (same host, no process with that PID) are removed by the
   next write (`remove_stale_temporaries`).
3. Writers of one file take turns (POSIX: an flock on the empty `.NAME.lock` beside it, removed by
   its holder when done, so no lock file is left behind), so two processes editing one file at once
   do not drop each other's changes.
4. A full disk: before HDF5 writes a byte, the temporary is grown (`posix_fallocate`) by a bound on
   what the write adds (`reserve`), so a disk too full fails there, as one line of the caller's error
   class with the old file intact and no temporary left; HDF5 itself then never meets a failed write
   (after one, h5py's close can crash the interpreter) and truncates the file to its end on close.
5. Ctrl-C (SIGINT) during a write is held, whatever Python handler is installed, until the
   writer's next checkpoint (`stop_if_interrupted`; h5py would swallow a `KeyboardInterrupt` raised
   inside its own calls and write on), then handed to that handler, which stops the write: the old
   file is left as it was, the temporary removed, and `KeyboardInterrupt` raised.
6. A path that is a symbolic link is written through (`followed`): its target is locked and replaced,
   the link is left as it is (renaming over the link would leave the target with its old contents).

h5py is imported on first use: importing this module loads neither it nor torch.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path

LIBVER = ("v110", "latest")
"""HDF5 file-format bounds of every write: the 1.10 format checksums all metadata."""


def host_tag() -> str:
    """This host's name as temporaries carry it (letters, digits and dashes, at most 64)."""
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:64] or "host"


def _temp_pattern(path: Path) -> re.Pattern:
    """Step 3: `.NAME.PID@HOST.XXXXXXXX.tmp` (mkstemp's random part has no dots)."""
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


def followed(path: str | os.PathLike) -> Path:
    """The file a write of `path` replaces (step 6): a symbolic link's target, followed to its end, so
    that the link keeps leading to the new file and writers through the link and through the file
    take the same lock; any other path as given."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


RESERVE = 1 << 20
"""Bytes reserved beyond the copy of the old file by a writer that gives no bound of its own."""


@contextlib.contextmanager
def edit_h5(path: str | os.PathLike, fresh: bool = False, reserve: int = RESERVE, *, error: type[Exception]):
    """Open a copy of the HDF5 file `path` (or a new file; with `fresh`, always a new one) for
    writing; on success the copy is renamed over `path` with the permissions a plain `open` would
    give, so a crash never leaves a half-written file under the final name. Every writer of HDF5
    files goes through here (graphs, supernodes, circuits, transcoders' dashboards).
    `reserve`: a bound on the bytes the writer adds (step 3: a disk without them is refused before
    HDF5 writes). Missing parent folders are created; stale temporaries of dead writers are
    removed. A full disk or a folder that cannot be written raises `error` (the caller's file error class); Ctrl-C
    raises `KeyboardInterrupt` after removing the temporary (steps 4-5). A symbolic link is written
    through: its target is replaced, the link left as it is (step 6)."""
    path = followed(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = _one_writer(path)
        lock.__enter__()
    except OSError as e:
        raise write_error(path, e, error) from None
    try:
        with _interrupts_held():
            remove_stale_temporaries(path)
            tmp = None
            try:
                try:
                    tmp = new_temporary(path)
                    _prepare(tmp, path if path.exists() and not fresh else None, reserve)
                except OSError as e:
                    raise write_error(path, e, error) from None
                stop_if_interrupted()
                import h5py

                with h5py.File(tmp, "a", libver=LIBVER) as f:
                    yield f
                stop_if_interrupted()  # the last moment the old file can still be kept
                try:
                    umask = os.umask(0)
                    os.umask(umask)
                    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files
                    os.replace(tmp, path)
                except OSError as e:
                    raise write_error(path, e, error) from None
            finally:
                if tmp is not None and os.path.exists(tmp):
                    os.unlink(tmp)
    finally:
        lock.__exit__(None, None, None)


def new_temporary(path: Path) -> str:
    """Step 3's temporary `.NAME.PID@HOST.XXXXXXXX.tmp`, empty, beside `path`."""
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.{os.getpid()}@{host_tag()}.", suffix=".tmp", dir=path.parent
    )
    os.close(fd)
    return tmp


def _empty_image() -> bytes:
    """An HDF5 file with nothing in it, made in memory (no HDF5 write to the disk can fail)."""
    import h5py

    buffer = io.BytesIO()
    with h5py.File(buffer, "w", libver=LIBVER):
        pass
    return buffer.getvalue()


def _prepare(tmp: str, old: Path | None, reserve: int) -> None:
    """Fill the temporary with a copy of `old` (or an empty HDF5 file) and grow it by `reserve`
    bytes (steps 4-5); every failure here is a plain `OSError` from Python or the kernel."""
    if old is not None:
        shutil.copyfile(old, tmp)
    else:
        with open(tmp, "wb") as f:
            f.write(_empty_image())
    if not hasattr(os, "posix_fallocate"):  # macOS, Windows: no reservation
        return
    fd = os.open(tmp, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size + max(int(reserve), 0))
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise  # ENOSPC, EDQUOT, EFBIG: what the write would have met
    finally:
        os.close(fd)


def write_error(path: Path, e: OSError | Exception, error: type[Exception]) -> Exception:
    """One line for an `OSError` met while writing `path` (or safetensors' error, which carries the
    `OSError`'s number only in its text: "I/O error: File too large (os error 27)")."""
    if not isinstance(e, OSError):
        found = re.search(r"os error (\d+)", str(e))
        e = OSError(int(found[1]), os.strerror(int(found[1]))) if found else OSError(str(e))
    reason = e.strerror or str(e) or type(e).__name__
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return error(
            f"cannot write {path}: no space left on its disk ({reason}); free some space or write elsewhere "
            "(the old file, if any, is unchanged)."
        )
    if e.errno == errno.EFBIG:
        return error(
            f"cannot write {path}: the file would pass the size limit ({reason}; see `ulimit -f`); "
            "raise the limit or write elsewhere (the old file, if any, is unchanged)."
        )
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return error(f"cannot write in {path.parent} ({reason}); pass an output in a folder you can write.")
    return error(f"cannot write {path} ({reason}); the old file, if any, is unchanged.")


_held: list = []  # the handler of a SIGINT held by _interrupts_held, due at the next checkpoint


def stop_if_interrupted() -> None:
    """Hand a Ctrl-C held during a write (step 5) to the SIGINT handler the write displaced:
    Python's default raises `KeyboardInterrupt`, as does the CLI's (which also ignores any later
    Ctrl-C); a handler that returns lets the write go on."""
    if _held:
        handler = _held.pop()
        _held.clear()
        handler(signal.SIGINT, None)


@contextlib.contextmanager
def _interrupts_held():
    """Hold SIGINT (record it, raise nothing) while a write runs, so that the write stops at one of
    its own checkpoints (`stop_if_interrupted`) instead of inside h5py, which drops what a handler
    raises where it frees objects (weakref callbacks) and writes on. Whatever Python handler is
    installed is held (Python's default, the CLI's first-Ctrl-C one, a caller's), in the main
    thread; SIG_IGN and SIG_DFL are left alone. A SIGINT still held at the end is handed on then."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return

    def hold(signum, frame):
        _held[:] = [previous]

    _held.clear()
    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is hold:  # the handler handed a Ctrl-C may have set another
            signal.signal(signal.SIGINT, previous)
    stop_if_interrupted()


@contextlib.contextmanager
def _one_writer(path: Path):
    """Step 3: hold the lock `.NAME.lock` beside `path` (`held_lock`)."""
    with held_lock(path.parent / f".{path.name}.lock"):
        yield


@contextlib.contextmanager
def pid_lock(name: Path, busy):
    """Hold the lock `name` (`held_lock`, without waiting) with this process's id written in it; a
    lock held elsewhere raises `busy(pid)`, the pid its holder wrote ('' if none). The pid is written
    unbuffered and only for that message: a full disk leaves it out, and nothing for close() to
    flush and fail on."""
    with contextlib.ExitStack() as stack:
        try:
            held = stack.enter_context(held_lock(name, wait=False))
        except BlockingIOError as e:
            raise busy(str(e)) from None
        if held is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(held.fileno(), 0)
                os.write(held.fileno(), str(os.getpid()).encode())
        yield


@contextlib.contextmanager
def held_lock(name: Path, *, wait: bool = True):
    """Hold an exclusive flock on the file `name` (the kernel releases it when its holder dies),
    yielding the open file (its holder may write into it). The holder removes the file when done; a
    process that then gets the lock of the removed file (it opened it before the removal) sees that
    the name no longer leads to it and locks the file there now instead, so two processes never
    hold the lock of one name at once. With `wait=False`, a lock held elsewhere raises
    `BlockingIOError` whose message is what its holder wrote. Without fcntl (Windows), no lock."""
    try:
        import fcntl
    except ImportError:
        yield None
        return
    while True:
        lock = open(name, "a+")
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                lock.seek(0)
                raise BlockingIOError(lock.read().strip()) from None
            try:
                if os.path.samestat(os.fstat(lock.fileno()), os.stat(name)):
                    break
            except FileNotFoundError:
                pass
        except BaseException:
            lock.close()
            raise
        lock.close()  # removed by the holder before us: lock the file under the name now
    try:
        yield lock
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)  # while still holding it
        lock.close()  # releases the flock
