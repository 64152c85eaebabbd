"""What the host does for one sandbox before bubblewrap starts: its ``/tmp`` with an inode cap, its
memory and process cgroup where the host lets it, its process limit of its own, and the
process's limits and user.

=============================  ======================================================================
protection                     how
=============================  ======================================================================
``/tmp`` inodes                bubblewrap's ``--tmpfs`` takes ``--size`` but no ``nr_inodes`` (0.8), so
                               the process that execs bubblewrap makes a private mount namespace
                               (as root; otherwise inside a user namespace of its own, uid and gid
                               mapped to themselves) and mounts there a tmpfs with ``size`` and
                               ``nr_inodes`` = :func:`tmp_inodes` (one per 4 KiB page) on an empty
                               folder, which bubblewrap binds at ``/tmp``. The mount lives and dies
                               with that namespace (the host sees an empty folder, removed after).
                               tmpfs counts every hard link as an inode too, so a flood of files,
                               symlinks or links stops at ``ENOSPC``: about 1 KiB of kernel memory
                               each (inode and dentry), 16 MiB for the default 64 MiB ``/tmp``
process limit per sandbox      ``RLIMIT_NPROC`` counts per user, and since Linux 5.14 per user *in
                               each user namespace* (``kernel/ucount.c``): bubblewrap starts with the
                               user's hard limit (as root the program runs as ``nobody``), makes the
                               sandbox's own user namespace, and the program's first step inside
                               (:data:`STUB`) lowers its limit to ``max_procs``, which then counts
                               only that sandbox's processes: sandboxes at once, or a host process
                               running as ``nobody``, no longer share one count
memory + pids cgroup           where a cgroup v2 hierarchy with the ``memory`` and ``pids`` controllers
                               is writable below this process's cgroup: ``memory.max`` (the whole
                               sandbox, kernel memory included: cgroup v2 charges slab, inodes and
                               socket buffers), ``memory.swap.max`` 0 and ``pids.max``; killed
                               (``cgroup.kill``) and removed after the run
=============================  ======================================================================

:func:`protections` says which are active on this host (``check_sandbox`` prints them). Source:
``mount(2)``, ``user_namespaces(7)``, ``tmpfs(5)`` (``nr_inodes``), the kernel's
``Documentation/admin-guide/cgroup-v2.rst`` (``memory.max``, ``pids.max``, ``cgroup.kill``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import subprocess
import tempfile
import time
from functools import lru_cache
from pathlib import Path

from policyzoo.plugins.env.sandbox import seccomp

NOBODY = 65534
#: open files per process (``RLIMIT_NOFILE``): what the kernel buffers for a program's pipes and sockets
#: stays within MAX_FILES buffers
MAX_FILES = 64
_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000
_libc = ctypes.CDLL(None, use_errno=True)

#: the program's first step inside the box (argv: max_procs, the started pipe's fd, interpreter, code):
#: lower RLIMIT_NPROC in the sandbox's own user namespace, say "started" on the pipe (so a failure
#: before this point is the sandbox's, not the program's), then exec the program in a fresh interpreter
STUB = ("import os, resource, sys\nn, fd = int(sys.argv[1]), int(sys.argv[2])\n"
        "resource.setrlimit(resource.RLIMIT_NPROC, (n, n))\nos.write(fd, b'1')\nos.close(fd)\n"
        "os.execv(sys.argv[3], [sys.argv[3], '-I', '-c', sys.argv[4]])")


def tmp_inodes(tmp_mb: int) -> int:
    """``nr_inodes`` of a ``tmp_mb`` MiB ``/tmp``: one per 4 KiB page (256 per MiB)."""
    return tmp_mb * 256


def cgroup_limits(memory_mb: int, tmp_mb: int, max_procs: int) -> dict[str, str]:
    """The cgroup v2 files written for one sandbox: ``memory.max`` in bytes = ``tmp_mb + max_procs x
    (memory_mb - tmp_mb)`` MiB (:func:`~policyzoo.plugins.env.sandbox.memory_bound`'s worst case, now
    for the whole sandbox and its kernel memory), no swap, ``pids.max`` = ``max_procs`` + 1
    (bubblewrap's own process outside the box is in the cgroup too)."""
    worst = tmp_mb + max_procs * (memory_mb - tmp_mb)
    return {"memory.max": str(worst << 20), "memory.swap.max": "0", "pids.max": str(max_procs + 1)}


def _call(name: str, *args) -> None:
    if getattr(_libc, name)(*args) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{name}: {os.strerror(e)}")


def _mount_tmp(folder: str, tmp_mb: int, owner: int | None) -> None:
    """In a new mount namespace (this process's), a tmpfs of ``tmp_mb`` MiB and :func:`tmp_inodes`
    inodes on ``folder``; the namespace is made private first so nothing reaches the host's mounts."""
    _call("unshare", _CLONE_NEWNS)
    _call("mount", None, b"/", None, _MS_REC | _MS_PRIVATE, None)
    opts = f"size={tmp_mb << 20},nr_inodes={tmp_inodes(tmp_mb)},mode=0755"
    if owner is not None:
        opts += f",uid={owner},gid={owner}"
    _call("mount", b"tmpfs", folder.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts.encode())


def _own_user_namespace() -> None:
    """A user namespace for this (non-root) process with its uid and gid mapped to themselves, so it
    may mount a tmpfs in a mount namespace of its own."""
    uid, gid = os.getuid(), os.getgid()
    _call("unshare", _CLONE_NEWUSER)
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")


def preexec(cpu_s: int, as_mb: int, file_mb: int, tmp_folder: str | None, tmp_mb: int,
            cgroup: Path | None):
    """The function run in the child between fork and exec of bubblewrap: a session of its own, the
    cgroup (joined while still root), the private ``/tmp`` mount, the user (``nobody`` when root),
    and the limits, which bubblewrap and the program inherit."""
    root = os.geteuid() == 0

    def apply():
        os.setsid()  # a process group of its own, killed as a whole
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text("0")  # "0": this process
        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        resource.setrlimit(resource.RLIMIT_NPROC, (hard, hard))  # the box's own namespace gets max_procs
        if tmp_folder is not None:
            if not root:
                _own_user_namespace()
            _mount_tmp(tmp_folder, tmp_mb, NOBODY if root else None)
        if root:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_AS, (as_mb << 20, as_mb << 20))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (MAX_FILES, MAX_FILES))  # pipes and sockets: bounded buffers
    return apply


def tmp_folder() -> str:
    """An empty folder for one sandbox's ``/tmp`` mount (reachable by ``nobody``; removed after the run)."""
    return tempfile.mkdtemp(prefix="pz-sandbox-tmp-", dir="/tmp")


@lru_cache(maxsize=1)
def tmp_mount_works() -> bool:
    """Whether this process may mount the private ``/tmp`` (:func:`_mount_tmp`): tried once in a child."""
    folder = tmp_folder()
    try:
        return subprocess.run(["true"], preexec_fn=preexec(5, 512, 1, folder, 1, None), timeout=30,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        os.rmdir(folder)


def _cgroup2_here() -> Path | None:
    """This process's cgroup in a cgroup v2 hierarchy with ``memory`` and ``pids`` available below it
    (already in its ``cgroup.subtree_control``, or enabled there now), or None."""
    rel = next((line[3:].strip() for line in Path("/proc/self/cgroup").read_text().splitlines()
                if line.startswith("0::")), None)
    if rel is None:
        return None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[:1] != ["cgroup2"]:
            continue
        here = Path(left.split()[4]) / rel.lstrip("/")
        try:
            if not {"memory", "pids"} <= set((here / "cgroup.controllers").read_text().split()):
                continue
            if not {"memory", "pids"} <= set((here / "cgroup.subtree_control").read_text().split()):
                (here / "cgroup.subtree_control").write_text("+memory +pids")
            return here
        except OSError:
            continue
    return None


@lru_cache(maxsize=1)
def cgroup_parent() -> Path | None:
    """Where sandbox cgroups are made (:func:`_cgroup2_here`, once a probe child could be made and
    removed there), or None: then no cgroup, and :func:`protections` says so."""
    here = _cgroup2_here()
    if here is None:
        return None
    try:
        probe = make_cgroup(here, 512, 64, 8)
        remove_cgroup(probe)
        return here
    except OSError:
        return None


_made = 0


def make_cgroup(parent: Path, memory_mb: int, tmp_mb: int, max_procs: int) -> Path:
    """A new cgroup below ``parent`` with :func:`cgroup_limits` written. Raises OSError."""
    global _made
    _made += 1
    path = parent / f"pz-sandbox-{os.getpid()}-{_made}"
    path.mkdir()
    try:
        for name, value in cgroup_limits(memory_mb, tmp_mb, max_procs).items():
            if name != "memory.swap.max" or (path / name).exists():  # no swap file: no swap accounting
                (path / name).write_text(value)
    except OSError:
        remove_cgroup(path)
        raise
    return path


def remove_cgroup(path: Path) -> None:
    """Kill what still runs in ``path`` (``cgroup.kill``, Linux 5.14) and remove it (retried for up to
    5 s while the killed processes exit)."""
    try:
        (path / "cgroup.kill").write_text("1")
    except OSError:
        pass
    deadline = time.monotonic() + 5.0
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def sandbox_uid() -> int:
    """The host user the sandbox runs as: ``nobody`` when this process is root, else this user."""
    return NOBODY if os.geteuid() == 0 else os.geteuid()


def per_sandbox_nproc() -> bool:
    """Whether ``RLIMIT_NPROC`` counts per user namespace here (Linux 5.14 and later)."""
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    return (major, minor) >= (5, 14)


def protections() -> list[str]:
    """One line per protection, active or not on this host (printed by ``check_sandbox`` and the dry run)."""
    arch = platform.machine()
    return [
        f"syscall filter: {'on' if seccomp.program() is not None else 'OFF'} ({arch}; xattrs, sockets but "
        "AF_UNIX, namespaces, mounts, memfd, SysV memory refused)",
        "/tmp inode cap: " + ("on (nr_inodes = 256 per MiB)" if tmp_mount_works()
                              else "OFF (this process may not mount a tmpfs in a namespace of its own)"),
        "process limit per sandbox: " + ("on (user namespace counts, Linux >= 5.14)" if per_sandbox_nproc()
                                         else f"OFF (Linux {platform.release()} < 5.14: sandboxes of one user "
                                         "share RLIMIT_NPROC)"),
        "memory + pids cgroup: " + (f"on (cgroup v2 below {cgroup_parent()})" if cgroup_parent() is not None
                                    else "OFF (no writable cgroup v2 with memory and pids here; memory is "
                                    "bounded per process, /tmp by size and inodes)"),
    ]
