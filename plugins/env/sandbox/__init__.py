"""Running untrusted Python (code a model wrote) in a bubblewrap sandbox.

:func:`run_python` starts ``bwrap`` (Debian package ``bubblewrap``; ``make setup`` installs it)
around a Python interpreter. What it promises, each pinned by a test in ``tests/security/``
(``docs/security.md`` has the threat model and the table):

* **a minimal filesystem view**: an empty read-only root holding only the interpreter, its
  standard library and the shared libraries it loads (:mod:`~policyzoo.plugins.env.sandbox.view`
  lists them and why), plus the user's explicit ``ro_paths``; no ``$HOME``, no checkout, no run
  directory, no ``/sys``; its own ``/proc`` (new PID namespace) and a minimal ``/dev``;
* **no network**: new network namespace (``--unshare-all``: no interface but a down loopback), and
  the syscall filter refuses a socket of any family but ``AF_UNIX`` (``AF_VSOCK`` to the hypervisor,
  ``AF_NETLINK``, ``AF_PACKET``, ``AF_INET``/``AF_INET6``...);
* **bounded memory**: ``/tmp`` is the only writable place, a tmpfs of ``tmp_mb`` MiB and
  ``256 x tmp_mb`` inodes (:mod:`~policyzoo.plugins.env.sandbox.host`: a full ``/tmp``, in bytes or
  in files, symlinks and links, is ``ENOSPC``); extended attributes are refused (kernel memory no
  cap counts); each process's address space is limited to ``memory_mb - tmp_mb`` (``RLIMIT_AS``), so
  one process and its ``/tmp`` stay within ``memory_mb``; a program that forks holds at most
  ``tmp_mb + max_procs * (memory_mb - tmp_mb)`` (:func:`memory_bound`), the ``memory.max`` of its
  cgroup where the host has a writable cgroup v2 (kernel memory included);
* **bounded output**: stdout and stderr are read as they arrive and only the head and the tail
  (``max_output_chars`` bytes in all per stream) are kept (:mod:`~policyzoo.plugins.env.sandbox.capture`):
  the trainer's memory does not grow with what a program prints;
* **no secrets from the environment**: bubblewrap itself starts with an empty environment (so even
  its ``/proc/1/environ`` holds nothing) and the program gets only ``PATH`` and ``HOME=/tmp``;
  ``python -I`` ignores ``PYTHON*`` variables, the user site and the current directory;
* **a smaller kernel surface**: a seccomp filter (:mod:`~policyzoo.plugins.env.sandbox.seccomp`)
  answers ``EPERM`` to the syscalls that hold memory outside ``RLIMIT_AS`` (``memfd_create``,
  ``shmget``, ``msgget``), make namespaces or mounts, or reach keyrings, ``bpf``, ``ptrace``...;
  ``--disable-userns`` forbids a nested user namespace; ``RLIMIT_NOFILE`` (``host.MAX_FILES``) bounds
  the kernel buffers of pipes and sockets;
* **separate process tree**: new PID namespace (the trainer's processes are invisible, no signal
  reaches them); ``--die-with-parent`` and a new session, and the whole process group is killed at
  the wall-clock limit, so nothing outlives the call;
* **limits** (``setrlimit`` before ``bwrap`` starts, inherited): CPU seconds, address space,
  processes, file size; wall-clock ``timeout_s``. When this process runs as root the sandbox runs as
  ``nobody`` (65534) -- root ignores ``RLIMIT_NPROC`` -- through an unprivileged user namespace;
* **independent sandboxes**: ``RLIMIT_NPROC`` = ``max_procs`` is set inside each sandbox's own user
  namespace, where the kernel counts it for that sandbox alone (Linux >= 5.14): a fork bomb gets
  EAGAIN, and sandboxes that run at once, or host processes of the same user (``nobody``), do not
  use up each other's processes (:mod:`~policyzoo.plugins.env.sandbox.host`).

The result is a :class:`SandboxResult` (stdout, stderr, exit code, whether the limit killed it,
and ``sandbox_error`` when the sandbox itself failed before the program ran: the program wrote
nothing yet, so that is no verdict on it; ``python_sandbox`` scores such an episode NaN). The
program's failure is data for the caller (an observation), never an exception here.
:class:`SandboxError` is raised for a sandbox that cannot run here at all (bubblewrap missing or
refused by the kernel, an interpreter that cannot be probed; :func:`check_sandbox` names the cause)
and for a bad ``ro_paths`` entry, with the fix.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from policyzoo.plugins.env.sandbox import host, seccomp
from policyzoo.plugins.env.sandbox.capture import Capture, read_until
from policyzoo.plugins.env.sandbox.view import SandboxError, check_ro_paths, view


@dataclass
class SandboxResult:
    """One run: ``stdout`` / ``stderr`` (text, cut to the caller's limit), ``exit_code`` (negative:
    killed by that signal), ``timed_out`` (the wall-clock limit killed it), ``sandbox_error`` (empty
    when the program started; else why the sandbox itself failed -- bubblewrap could not start, a
    namespace, mount or cgroup could not be made -- which is no verdict on the program)."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    sandbox_error: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.sandbox_error


def python_path(python: str | None) -> str:
    """The interpreter run inside: ``python`` if given, else the system ``/usr/bin/python3`` (readable
    by ``nobody``), else this interpreter."""
    return python or ("/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)


def user_processes(uid: int) -> int:
    """Processes (and threads) the user ``uid`` runs now, as ``RLIMIT_NPROC`` counts them."""
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = open(f"/proc/{entry}/status").read()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if fields.get("Uid", "").split()[:1] == [str(uid)]:
                n += int(fields.get("Threads", "1").strip() or 1)
    return n


def memory_bound(memory_mb: int, tmp_mb: int, max_procs: int) -> dict:
    """The sandbox's memory in MiB: ``process`` (one process's address space plus ``/tmp``, at most
    ``memory_mb``) and ``worst`` (``max_procs`` processes each at its address-space limit, plus ``/tmp``)."""
    return {"process": memory_mb, "worst": tmp_mb + max_procs * (memory_mb - tmp_mb)}


def command(code: str, python: str | None = None, tmp_mb: int = 64, ro_paths: tuple[str, ...] = (),
            seccomp_fd: int | None = None, tmp_folder: str | None = None, max_procs: int = 8,
            started_fd: int | None = None) -> list[str]:
    """The ``bwrap`` command line that runs ``code`` with ``python -I -c`` (isolated mode: no
    user site, no PYTHON* variables, no current-directory import) in the view of
    :func:`~policyzoo.plugins.env.sandbox.view.view`. ``/tmp`` is ``tmp_folder`` (the private
    tmpfs with an inode cap, :mod:`~policyzoo.plugins.env.sandbox.host`) bound read-write, or
    without one bubblewrap's own ``tmp_mb`` MiB tmpfs. With ``started_fd`` the interpreter first
    runs :data:`~policyzoo.plugins.env.sandbox.host.STUB` (the box's own process limit
    ``max_procs``, "started" written to that fd), which execs the program."""
    exe = python_path(python)
    tmp = ("--bind", tmp_folder, "/tmp") if tmp_folder else ("--size", str(tmp_mb << 20), "--tmpfs", "/tmp")
    run = ([exe, "-I", "-c", host.STUB, str(max_procs), str(started_fd), exe, code] if started_fd is not None
           else [exe, "-I", "-c", code])
    # --as-pid-1: the program is the namespace's init, so bubblewrap's own reaper never outlives the
    # call as a zombie (on a host whose init reaps no orphans they filled RLIMIT_NPROC after 6 runs)
    return [shutil.which("bwrap") or "bwrap", *view(exe, check_ro_paths(ro_paths)),
            "--dev", "/dev", "--remount-ro", "/dev", "--proc", "/proc", *tmp,
            "--remount-ro", "/", "--unshare-all", "--unshare-user", "--disable-userns", "--unshare-net", "--as-pid-1",
            "--die-with-parent", "--new-session", "--clearenv", *(("--seccomp", str(seccomp_fd)) if seccomp_fd else ()),
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--chdir", "/tmp", *run]


def run_python(code: str, timeout_s: float = 5.0, cpu_s: int = 5, memory_mb: int = 512, max_procs: int = 8,
               file_mb: int = 1, max_output_chars: int = 2000, python: str | None = None, tmp_mb: int = 64,
               ro_paths: tuple[str, ...] | list[str] = ()) -> SandboxResult:
    """Run ``code`` in the sandbox (module docstring); returns its :class:`SandboxResult`.

    ``memory_mb`` is one process's whole budget: ``tmp_mb`` of it is ``/tmp`` (must be smaller than
    ``memory_mb``), the rest its address space. ``max_output_chars`` bounds each of stdout and stderr
    while they are read (head and tail kept). Raises :class:`SandboxError` for ``tmp_mb >= memory_mb``
    and a bad ``ro_paths`` entry; a sandbox that fails to start is the result's ``sandbox_error``."""
    if not 0 < tmp_mb < memory_mb:
        raise SandboxError(f"env: python_sandbox: tmp_mb = {tmp_mb}", f"/tmp must be a positive part of memory_mb "
                           f"= {memory_mb} (the address space gets the rest)", "lower tmp_mb or raise memory_mb")
    command(code, python, tmp_mb, tuple(ro_paths))  # a bad ro_paths entry raises before anything is made
    folder = host.tmp_folder() if host.tmp_mount_works() else None
    cgroup = None
    try:
        if host.cgroup_parent() is not None:
            try:
                cgroup = host.make_cgroup(host.cgroup_parent(), memory_mb, tmp_mb, max_procs)
            except OSError as e:
                return SandboxResult("", "", -1, False, f"cgroup: {e}")
        # before Linux 5.14 the limit counts every process of the user, so it is what the user runs plus max_procs
        procs = max_procs + (0 if host.per_sandbox_nproc() else user_processes(host.sandbox_uid()))
        return _run(code, python, tmp_mb, tuple(ro_paths), procs, timeout_s, max_output_chars,
                    host.preexec(cpu_s, memory_mb - tmp_mb, file_mb, folder, tmp_mb, cgroup), folder)
    finally:
        if cgroup is not None:
            host.remove_cgroup(cgroup)
        if folder is not None:
            os.rmdir(folder)


def _run(code: str, python: str | None, tmp_mb: int, ro_paths: tuple[str, ...], max_procs: int, timeout_s: float,
         max_output_chars: int, preexec, folder: str | None) -> SandboxResult:
    """Start bubblewrap with the filter and the "started" pipe, collect the run, and tell a program
    that ran from a sandbox that never started it (nothing came on the pipe)."""
    filt, fd = seccomp.program(), None
    started_r, started_w = os.pipe()
    try:
        if filt is not None:  # the filter travels to bubblewrap through a pipe (--seccomp FD)
            fd, w = os.pipe()
            os.write(w, filt)
            os.close(w)
        cmd = command(code, python, tmp_mb, ro_paths, seccomp_fd=fd, tmp_folder=folder, max_procs=max_procs,
                      started_fd=started_w)
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env={}, pass_fds=tuple(f for f in (fd, started_w) if f is not None),
                                    preexec_fn=preexec)
        except (OSError, subprocess.SubprocessError) as e:
            return SandboxResult("", "", -1, False, f"cannot start bwrap: {e}")
        finally:
            for f in (fd, started_w):
                if f is not None:
                    os.close(f)
            fd = started_w = None
        result = _collect(proc, timeout_s, max_output_chars)
        os.set_blocking(started_r, False)
        try:
            started = os.read(started_r, 1) == b"1"
        except BlockingIOError:
            started = False
        if not started:  # the program never ran: bubblewrap's own failure (its message is on stderr)
            result.sandbox_error = result.stderr.strip()[:500] or f"bwrap exited {result.exit_code} before the program"
        return result
    finally:
        for f in (fd, started_w, started_r):
            if f is not None:
                os.close(f)


def _collect(proc: subprocess.Popen, timeout_s: float, max_output_chars: int) -> SandboxResult:
    """Read ``proc``'s output until it ends or ``timeout_s`` passes (then kill its process group)."""
    out, err = Capture(max_output_chars), Capture(max_output_chars)
    try:
        timed_out = not read_until({proc.stdout: out, proc.stderr: err}, time.monotonic() + timeout_s)
        if timed_out:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            read_until({proc.stdout: out, proc.stderr: err}, time.monotonic() + 5.0)
        proc.wait()
    finally:
        proc.stdout.close()
        proc.stderr.close()
    return SandboxResult(out.text(), err.text(), proc.returncode, timed_out)


def check_sandbox(python: str | None = None, ro_paths: tuple[str, ...] = ()) -> list[str]:
    """Raise :class:`SandboxError` with the fix unless the sandbox runs ``print(1)`` here; returns
    :func:`~policyzoo.plugins.env.sandbox.host.protections` (which protection is active on this host)."""
    if shutil.which("bwrap") is None:
        raise SandboxError("env: python_sandbox", "bubblewrap (bwrap) is not installed",
                           "apt-get install bubblewrap (make setup installs it)")
    r = run_python("print(1)", timeout_s=60, python=python, ro_paths=ro_paths)
    if r.stdout.strip() == "1" and r.ok:
        return host.protections()
    why = r.sandbox_error or r.stderr.strip()[:300]
    if "Resource temporarily unavailable" in why:
        uid = host.sandbox_uid()
        raise SandboxError("env: python_sandbox", f"the sandbox does not start here: {why}; the cause is the shared "
                           f"process limit: RLIMIT_NPROC counts every process of uid {uid} "
                           f"({user_processes(uid)} running now), the sandboxes' and the host's",
                           "run on Linux >= 5.14 (the limit then counts per sandbox), stop the host processes of "
                           "that user, or train without python_sandbox")
    if "cannot start bwrap" in why:
        raise SandboxError("env: python_sandbox", why, "apt-get install bubblewrap")
    raise SandboxError("env: python_sandbox", f"the sandbox does not run here (exit {r.exit_code}): {why}",
                       "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, or a "
                       "container run with them), or train without python_sandbox")
