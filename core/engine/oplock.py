"""torch's extension lock, ``TORCH_EXTENSIONS_DIR/<op>/lock``: one a dead process left is removed, and no wait
on it is endless.

torch takes the lock (:class:`torch.utils.file_baton.FileBaton`: a file made with ``O_EXCL`` and held open) at
every load of DeepSpeed's CPU op, not only while compiling it: in a fresh process it runs ninja's up-to-date
check under it (under a second). A process killed while it holds the lock (a timeout, Ctrl-C at start-up, the
out-of-memory killer) leaves the file, and torch's ``FileBaton.wait`` polls for it without limit: every later
start hung with no word, in DeepSpeed's set-up. A lock is *stale* when

* no process of this machine holds it open (``/proc/<pid>/fd``; torch keeps it open from taking to release),
  looked at twice a second apart, and it is older than :data:`HELD_GRACE_SECONDS` (a cache shared between
  machines can thus lose a lock another machine holds: give each machine its own ``POLICYZOO_CACHE``); or,
  only where ``/proc`` cannot tell (another user's processes, not Linux),
* nothing was written in its folder for :data:`STALE_LOAD_LOCK_SECONDS` when the op is built there (a load only
  checks it), :data:`STALE_LOCK_SECONDS` when it is not (a live build writes its object files within minutes).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

#: a lock with nothing written beside it for this long, in a folder without the built op, was left by a killed build
STALE_LOCK_SECONDS = 900
#: the same where the op is built: loading it holds the lock for ninja's up-to-date check only
STALE_LOAD_LOCK_SECONDS = 240
#: a lock no process holds counts as left behind once this old (torch closes it just before removing it)
HELD_GRACE_SECONDS = 2.0
#: a process waiting on a lock says so after this long
WAIT_NOTE_SECONDS = 20.0
#: the console's stderr while the libraries' output goes to ``startup.log`` (set by ``process.captured_output``):
#: what this module says goes there too, so that a wait is never silent on the console
console_fd: int | None = None


def say(line: str) -> None:
    """``line`` on stderr (``startup.log`` while captured) and on the console (:data:`console_fd`)."""
    print(line, file=sys.stderr, flush=True)
    if console_fd is not None:
        os.write(console_fd, (line + "\n").encode())


def holders(lock: Path) -> int | None:
    """How many processes of this machine hold ``lock`` open; None where ``/proc`` cannot tell (not Linux, or a
    process of another user whose file descriptors are not readable)."""
    if not Path("/proc/self/fd").is_dir():
        return None
    target, count, unreadable = os.path.realpath(lock), 0, False
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            names = list(fd_dir.iterdir())
        except PermissionError:
            unreadable = True
            continue
        except OSError:  # the process ended meanwhile
            continue
        for fd in names:
            try:
                count += os.readlink(fd) == target
            except OSError:
                pass
    return None if unreadable and count == 0 else count


def _newest_write(folder: Path) -> float | None:
    try:
        return max(f.stat().st_mtime for f in folder.iterdir())
    except (OSError, ValueError):  # gone meanwhile, or emptied
        return None


def is_stale(lock: Path, now: float | None = None) -> bool:
    """Whether ``lock`` was left by a process that is gone (the rules in the module's docstring)."""
    now = time.time() if now is None else now
    try:
        made = lock.stat()
    except OSError:
        return False
    held = holders(lock)
    if held is not None:  # /proc can tell: stale when no one holds it, seen twice a second apart
        if held or now - made.st_mtime <= HELD_GRACE_SECONDS:
            return False
        time.sleep(1.0)  # a release closes the file a moment before removing it: look again
        try:
            again = lock.stat()
        except OSError:
            return False
        return (again.st_ino, again.st_mtime) == (made.st_ino, made.st_mtime) and holders(lock) == 0
    newest = _newest_write(lock.parent)
    built = any(lock.parent.glob("*.so"))
    return newest is not None and now - newest > (STALE_LOAD_LOCK_SECONDS if built else STALE_LOCK_SECONDS)


def remove_stale(lock: Path) -> bool:
    """Remove ``lock`` when :func:`is_stale`, saying so on stderr. Returns whether it was removed."""
    if not is_stale(lock):
        return False
    lock.unlink(missing_ok=True)
    say(f"policyzoo: removed a lock left by a process that ended while holding it: {lock}")
    return True


def clear_stale_build_lock(root: Path) -> list[Path]:
    """Remove the stale ``<op>/lock`` files under ``root`` (``TORCH_EXTENSIONS_DIR``). Returns those removed."""
    return [lock for lock in root.glob("*/lock") if remove_stale(lock)]


def bounded_wait(baton) -> None:
    """:meth:`FileBaton.wait` that ends: it polls as torch's does, says once what it waits for, and removes the lock
    when its holder is gone (:func:`is_stale`, looked at every 2 s). Installed by :func:`install`."""
    lock, start, looked, told = Path(baton.lock_file_path), time.time(), time.time(), False
    while lock.exists():
        time.sleep(baton.wait_seconds)
        now = time.time()
        if not told and now - start > WAIT_NOTE_SECONDS:
            say(f"policyzoo: waiting for {lock}: another process is building or loading DeepSpeed's CPU op "
                "(a lock whose process has ended is removed)")
            told = True
        if now - looked > 2.0:
            looked = now
            if remove_stale(lock):
                return


def install() -> None:
    """Make every :class:`torch.utils.file_baton.FileBaton` of this process wait with :func:`bounded_wait`."""
    from torch.utils.file_baton import FileBaton

    FileBaton.wait = bounded_wait
