"""Running untrusted Python (code a model wrote) in a bubblewrap sandbox.

:func:`run_python` starts ``bwrap`` (Debian package ``bubblewrap``; ``make setup`` installs it)
around a Python interpreter:

* **no network**: new network namespace (``--unshare-all``: no interface but a down loopback);
* **read-only filesystem view**: ``/`` bound read-only, a private empty ``/tmp`` (tmpfs, the
  only writable place, gone after the run), fresh ``/dev`` and ``/proc``;
* **separate process tree**: new PID namespace; ``--die-with-parent`` and a new session, and the
  whole process group is killed at the wall-clock limit, so nothing outlives the call;
* **limits** (``setrlimit`` before ``bwrap`` starts, inherited): CPU seconds, address space
  (memory), processes (``RLIMIT_NPROC``: a fork bomb gets EAGAIN), file size; wall-clock
  ``timeout_s``. When this process runs as root the sandbox runs as ``nobody`` (65534) --
  root ignores ``RLIMIT_NPROC`` -- through an unprivileged user namespace; as another user the
  process limit is that user's current count plus ``max_procs`` (the limit is per user).

The result is a :class:`SandboxResult` (stdout, stderr, exit code, whether the limit killed it);
the program's failure is data for the caller (an observation), never an exception here.
:class:`SandboxError` is raised only when the sandbox itself cannot run (bubblewrap missing or
refused by the kernel), with the fix.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass

from policyzoo.errors import UserError

NOBODY = 65534


class SandboxError(UserError):
    """The sandbox cannot run here (bubblewrap missing, user namespaces refused)."""


@dataclass
class SandboxResult:
    """One run: ``stdout`` / ``stderr`` (text, cut to the caller's limit), ``exit_code`` (negative:
    killed by that signal), ``timed_out`` (the wall-clock limit killed it)."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


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


def _limits(cpu_s: int, memory_mb: int, max_procs: int, file_mb: int):
    # RLIMIT_NPROC counts every process of the user: as root the sandbox runs as nobody (root ignores
    # the limit), otherwise the limit is what the user already runs plus max_procs
    procs = max_procs + (0 if os.geteuid() == 0 else user_processes(os.geteuid()))

    def apply():
        os.setsid()  # a process group of its own, killed as a whole
        if os.geteuid() == 0:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_NPROC, (procs, procs))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def command(code: str, python: str | None = None) -> list[str]:
    """The ``bwrap`` command line that runs ``code`` with ``python -I -c`` (isolated mode: no
    user site, no PYTHON* variables, no current-directory import)."""
    return ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--unshare-all", "--unshare-net", "--die-with-parent", "--new-session", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--chdir", "/tmp",
            python_path(python), "-I", "-c", code]


def run_python(code: str, timeout_s: float = 5.0, cpu_s: int = 5, memory_mb: int = 512, max_procs: int = 32,
               file_mb: int = 1, max_output_chars: int = 2000, python: str | None = None) -> SandboxResult:
    """Run ``code`` in the sandbox (module docstring); returns its :class:`SandboxResult`."""
    proc = subprocess.Popen(command(code, python), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=_limits(cpu_s, memory_mb, max_procs, file_mb))
    try:
        out, err = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        timed_out = True
    cut = max_output_chars
    return SandboxResult(out.decode(errors="replace")[-cut:], err.decode(errors="replace")[-cut:], proc.returncode,
                         timed_out)


def check_sandbox(python: str | None = None) -> None:
    """Raise :class:`SandboxError` with the fix unless the sandbox runs ``print(1)`` here."""
    if shutil.which("bwrap") is None:
        raise SandboxError("env: python_sandbox", "bubblewrap (bwrap) is not installed",
                           "apt-get install bubblewrap (make setup installs it)")
    try:
        r = run_python("print(1)", timeout_s=60, python=python)
    except OSError as e:
        raise SandboxError("env: python_sandbox", f"cannot start bwrap: {e}", "apt-get install bubblewrap") from None
    if r.stdout.strip() != "1":
        raise SandboxError("env: python_sandbox", f"the sandbox does not run here (exit {r.exit_code}): "
                           f"{r.stderr.strip()[:300]}", "allow unprivileged user namespaces "
                           "(sysctl kernel.unprivileged_userns_clone=1, or a container run with them), or train "
                           "without python_sandbox")
