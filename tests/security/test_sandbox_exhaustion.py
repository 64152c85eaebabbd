"""Exhaustion and isolation attacks against ``run_python`` with its defaults (memory_mb 512 with a
64 MiB /tmp, timeout 5 s, max_procs 8), docs/security.md: kernel memory outside every cap
(extended attributes, a flood of files, symlinks and hard links), sockets of every address family,
sandboxes that run at once (as root, as an ordinary user, beside host processes of the same user),
and a sandbox that cannot start, which must never be scored as the program's failure.

Kernel memory is read from the host's ``/proc/meminfo`` every 20 ms during each attack: the rise
of ``SUnreclaim`` (slab the kernel cannot reclaim) and ``Slab``, and the fall of ``MemAvailable``."""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from textwrap import dedent

import pytest
from _sandbox_helpers import NON_ROOT_UID, as_user_package

from policyzoo.plugins.env import PythonSandbox, SandboxError, run_python
from policyzoo.plugins.env.sandbox import check_sandbox, host

MIB_KB = 1024


def meminfo() -> dict[str, int]:
    """``/proc/meminfo`` in kB."""
    return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in open("/proc/meminfo"))}


def watched(code: str, **kw):
    """Run ``code`` while sampling the host's memory; returns the result and the largest moves in MiB:
    ``SUnreclaim`` and ``Slab`` rises, ``MemAvailable`` fall, from the values just before the run."""
    before, peak, stop = meminfo(), {}, threading.Event()

    def sample():
        while not stop.is_set():
            m = meminfo()
            for key, sign in (("SUnreclaim", 1), ("Slab", 1), ("MemAvailable", -1)):
                peak[key] = max(peak.get(key, 0), sign * (m[key] - before[key]))
            time.sleep(0.02)
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        r = run_python(code, **kw)
    finally:
        stop.set()
        t.join(5)
    return r, {k: v / MIB_KB for k, v in peak.items()}


#: MiB: what an attack may move the host's SUnreclaim and Slab up, and MemAvailable down (the box itself
#: holds at most its 512 MiB; before the fixes the xattr attack took 1.4-1.7 GiB in 5 s)
BOUNDS = {"SUnreclaim": 100, "Slab": 100, "MemAvailable": 1024}


def attack(code: str, tries: int = 3):
    """:func:`watched` until every move is within :data:`BOUNDS`, at most ``tries`` times; returns the last
    result and, per quantity, the smallest move seen. The machine is shared: a neighbour's allocation
    moves these numbers for one try, an attack's own use moves them on every try."""
    best = None
    for _ in range(tries):
        r, moved = watched(code)
        best = moved if best is None else {k: min(v, moved[k]) for k, v in best.items()}
        if all(best[k] < bound for k, bound in BOUNDS.items()):
            break
    return r, best


def leftovers() -> set[str]:
    """The per-sandbox /tmp folders on the host (each must be gone after its run)."""
    return {p.name for p in Path("/tmp").glob("pz-sandbox-tmp-*")}


def test_xattr_flood_is_refused_and_holds_no_kernel_memory():
    # the campaign's attack: 64 KiB user xattrs on ever more files for the whole 5 s (it took 1.4-1.7 GiB
    # of unreclaimable slab before); every xattr call now answers ENOTSUP (95, asm-generic/errno.h)
    code = dedent("""\
        import ctypes, os, time
        libc = ctypes.CDLL(None, use_errno=True)
        ok = refused = 0
        open('/tmp/f', 'w').close()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 4:
            try:
                os.setxattr('/tmp/f', f'user.{ok + refused}', b'x' * 65536)
                ok += 1
            except OSError as e:
                refused += 1
                err = e.errno
        print('set', ok, err, refused > 1000)
        calls = (('get', lambda: os.getxattr('/tmp/f', 'user.a')), ('list', lambda: os.listxattr('/tmp/f')),
                 ('remove', lambda: os.removexattr('/tmp/f', 'user.a')))
        for name, call in calls:
            try:
                call()
                print(name, 'ok')
            except OSError as e:
                print(name, e.errno)
        for nr in (463, 464, 465, 466):  # setxattrat, getxattrat, listxattrat, removexattrat (Linux 6.13)
            print(nr, libc.syscall(nr, -100, b'/tmp/f', 0, b'user.a', None, 0), ctypes.get_errno())
        """)
    r, moved = attack(code)
    assert r.ok, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:4] == ["set 0 95 True", "get 95", "list 95", "remove 95"], r.stdout
    if platform.machine() in ("x86_64", "aarch64"):  # the *xattrat numbers are the same on both
        assert lines[4:] == [f"{nr} -1 95" for nr in (463, 464, 465, 466)], r.stdout
    assert all(moved[k] < bound for k, bound in BOUNDS.items()), moved


def test_flood_of_files_symlinks_and_links_stops_at_the_inode_cap():
    # a 64 MiB /tmp has nr_inodes = 64 x 256 = 16384 (one per 4 KiB page); its root folder takes one,
    # and tmpfs counts each hard link as one too, so at most 16383 entries of any kind, then ENOSPC (28).
    # Before the cap the campaign made 431k entries in 5 s (+591 MiB of slab); now ~1 KiB each is <= 16 MiB.
    code = ("import os, time\nn, err = 0, None\nopen('/tmp/a', 'w').close()\nt0 = time.monotonic()\n"
            "while time.monotonic() - t0 < 4:\n    try:\n        k = n % 3\n"
            "        if k == 0:\n            open(f'/tmp/f{n}', 'w').close()\n"
            "        elif k == 1:\n            os.symlink('x' * 40, f'/tmp/s{n}')\n"
            "        else:\n            os.link('/tmp/a', f'/tmp/l{n}')\n        n += 1\n"
            "    except OSError as e:\n        err = e.errno\n        break\n"
            "print(n + 1, err, os.statvfs('/tmp').f_files)")
    before = leftovers()
    r, moved = attack(code)
    assert r.ok, r.stderr
    entries, err, files = (int(x) for x in r.stdout.split())
    assert err == 28 and files == 16384 and 16000 <= entries <= 16383, r.stdout  # n made + /tmp/a
    assert all(moved[k] < bound for k, bound in BOUNDS.items()), moved
    assert leftovers() == before  # the mount went with its namespace, the folder is removed


def test_tmp_mount_is_sized_and_private():
    r = run_python("print([l for l in open('/proc/self/mountinfo') if ' /tmp ' in l][0])")
    assert r.ok and "size=65536k" in r.stdout and "nr_inodes=16384" in r.stdout, r.stdout  # 64 MiB, 64 x 256
    assert "nosuid" in r.stdout and "nodev" in r.stdout
    assert not any("pz-sandbox-tmp-" in line for line in open("/proc/self/mountinfo"))  # no host mount


FAMILIES = sorted({name: int(getattr(socket, name)) for name in dir(socket)
                   if name.startswith("AF_") and name != "AF_UNIX"}.items())


@pytest.mark.parametrize(("name", "family"), FAMILIES, ids=[n for n, _ in FAMILIES])
def test_no_socket_of_any_family_but_unix(name, family):
    # socket() and socketpair() with every type: EAFNOSUPPORT (97) from the filter, also when the
    # family's upper 32 bits are set (the kernel reads an int: the filter checks the same low word)
    nr = {"x86_64": (41, 53), "aarch64": (198, 199)}[platform.machine()]
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\npair = (ctypes.c_int * 2)()\nout = []\n"
            f"for t in (1, 2, 3, 5):\n    out.append((libc.socket({family}, t, 0), ctypes.get_errno()))\n"
            f"    out.append((libc.socketpair({family}, t, 0, pair), ctypes.get_errno()))\n"
            f"out.append((libc.syscall({nr[0]}, ctypes.c_long({family} | (1 << 32)), 1, 0), ctypes.get_errno()))\n"
            "print(sorted(set(out)))")
    r = run_python(code)
    assert r.ok and r.stdout == "[(-1, 97)]\n", (name, r.stdout, r.stderr)


def test_every_family_number_is_refused_and_unix_still_works():
    # numbers 0..63 (AF_MAX is 46 on Linux 6.x) beyond those the socket module names: only AF_UNIX (1)
    # opens; asyncio's self-pipe and multiprocessing's Pipe (AF_UNIX socket pairs) keep working
    code = dedent("""\
        import ctypes, asyncio, multiprocessing
        libc = ctypes.CDLL(None, use_errno=True)
        opened = []
        for f in range(64):
            for t in (1, 2, 3):
                fd = libc.socket(f, t, 0)
                if fd >= 0 or ctypes.get_errno() != 97:
                    opened.append((f, t, fd, ctypes.get_errno()))
        print(sorted({(f, t) for f, t, fd, e in opened if fd >= 0}), [o for o in opened if o[2] < 0])
        async def main():
            return 42
        print(asyncio.run(main()))
        a, b = multiprocessing.Pipe()
        a.send('pong')
        print(b.recv())
        """)
    r = run_python(code)
    assert r.ok, r.stderr
    # AF_UNIX opens with SOCK_STREAM (1), SOCK_DGRAM (2) and SOCK_RAW (3, which net/unix/af_unix.c's
    # unix_create turns into SOCK_DGRAM); every other family fails with 97 and nothing else
    assert r.stdout.splitlines() == ["[(1, 1), (1, 2), (1, 3)] []", "42", "pong"], r.stdout


FORK_CHILDREN = ("import os, time\nkids = []\nfor _ in range({n}):\n    pid = os.fork()\n    if pid == 0:\n"
                 "        time.sleep(1)\n        os._exit(0)\n    kids.append(pid)\n"
                 "for k in kids:\n    os.waitpid(k, 0)\nprint(len(kids))")


def _hold(uid: int, n: int) -> list[subprocess.Popen]:
    """``n`` host processes of ``uid`` that sleep (killed by the caller)."""
    return [subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "60"])
            for _ in range(n)]


def _end(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
        p.wait(10)


def test_twice_max_procs_sandboxes_at_once_beside_host_nobody_processes():
    # 16 = 2 x max_procs sandboxes at once, each using its whole limit (the program + 7 children = 8),
    # while 9 host processes run as nobody, more than max_procs: under one shared RLIMIT_NPROC count
    # none of them could start ("Creating new namespace failed: Resource temporarily unavailable")
    assert os.geteuid() == 0, "the suite runs as root (CI); the non-root case is the next test"
    hogs = _hold(65534, 9)
    try:
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda _: run_python(FORK_CHILDREN.format(n=7), timeout_s=60), range(16)))
    finally:
        _end(hogs)
    assert [(r.stdout, r.sandbox_error) for r in results] == [("7\n", "")] * 16, [r.stderr for r in results]
    r = run_python(FORK_CHILDREN.format(n=8), timeout_s=60)  # the 9th process of one sandbox is refused
    assert not r.ok and "BlockingIOError" in r.stderr and not r.sandbox_error


def test_twice_max_procs_sandboxes_at_once_as_an_ordinary_user(user_dir):
    # the same as an ordinary user beside 9 host processes of that user, through the system Python
    probe = ("import json\nfrom concurrent.futures import ThreadPoolExecutor\n"
             "from policyzoo.plugins.env.sandbox import run_python\n"
             f"code = {FORK_CHILDREN.format(n=7)!r}\n"
             "with ThreadPoolExecutor(16) as pool:\n"
             "    rs = list(pool.map(lambda _: run_python(code, timeout_s=60), range(16)))\n"
             "t = run_python('print(open(\"/proc/self/mountinfo\").read())')\n"
             "print(json.dumps([[r.stdout, r.sandbox_error, r.stderr[-300:]] for r in rs] + [t.stdout]))")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(user_dir), "PYTHONPATH": str(as_user_package(user_dir))}

    def become():
        os.setgroups([])
        os.setgid(NON_ROOT_UID)
        os.setuid(NON_ROOT_UID)
    hogs = _hold(NON_ROOT_UID, 9)
    try:
        res = subprocess.run(["/usr/bin/python3", "-c", probe], env=env, capture_output=True, text=True,
                             timeout=300, preexec_fn=become, cwd=str(user_dir))
    finally:
        _end(hogs)
    assert res.returncode == 0, res.stderr[-2000:]
    *runs, mounts = json.loads(res.stdout)
    assert [r[:2] for r in runs] == [["7\n", ""]] * 16, runs
    assert "nr_inodes=16384" in mounts  # the inode cap holds for an ordinary user too


def test_a_sandbox_that_cannot_start_is_unscorable_and_named(monkeypatch):
    # the shared process limit full: bubblewrap's user gets RLIMIT_NPROC 1, so its clone of the box
    # fails with EAGAIN. That is the sandbox's failure: no verdict (reward NaN, counted), never a 0.
    real = host.preexec

    def full(*args, **kw):
        apply = real(*args, **kw)

        def tight():
            apply()
            resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
        return tight
    before = leftovers()
    monkeypatch.setattr(host, "preexec", full)
    r = run_python("print(1)")
    assert not r.ok and "Resource temporarily unavailable" in r.sandbox_error, r
    env = PythonSandbox.__new__(PythonSandbox)  # the env without its start-up check (which would fail here)
    env.params = PythonSandbox.Params()
    ep = env.env({"prompt": "p", "tests": "assert True"})
    obs = ep.step("```python\nprint(1)\n```", [])
    assert obs.done and not obs.messages  # the model is shown nothing: there was no run
    assert math.isnan(ep.reward()) and ep.scores == {"sandbox_failure": 1.0}
    with pytest.raises(SandboxError, match="shared process limit: RLIMIT_NPROC counts every process of uid"):
        check_sandbox()
    monkeypatch.setattr(host, "preexec", real)
    ok = env.env({"prompt": "p", "tests": "assert True"})
    ok.step("```python\nprint(1)\n```", [])
    assert ok.reward() == 1.0 and ok.scores == {"sandbox_failure": 0.0}  # a passing program scores as before
    assert leftovers() == before


def test_check_sandbox_says_which_protections_are_active():
    lines = check_sandbox()
    assert [line.split(":")[0] for line in lines] == ["syscall filter", "/tmp inode cap", "process limit per sandbox",
                                                     "memory + pids cgroup"]
    assert lines[0].startswith("syscall filter: on") and lines[1].startswith("/tmp inode cap: on")
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    assert lines[2].startswith("process limit per sandbox: " + ("on" if (major, minor) >= (5, 14) else "OFF"))
    # a cgroup v2 hierarchy that offers memory and pids at this process's cgroup, read independently
    rel = [x[3:] for x in open("/proc/self/cgroup").read().splitlines() if x.startswith("0::")][0].strip("/")
    roots = [line.split(" - ")[0].split()[4] for line in open("/proc/self/mountinfo")
             if line.split(" - ")[1].startswith("cgroup2 ")]
    offered = any({"memory", "pids"} <= set((Path(m) / rel / "cgroup.controllers").read_text().split())
                  for m in roots if (Path(m) / rel / "cgroup.controllers").exists())
    if not offered:  # without one there is none to use (with one, "on" needs it writable too)
        assert lines[3].startswith("memory + pids cgroup: OFF"), lines[3]
    assert any("protections on this host" in n for n in PythonSandbox().notes())  # the dry run prints them


def test_cgroup_limits_bound_the_whole_sandbox():
    # memory.max = 64 + 8 x (512 - 64) = 3648 MiB = 3648 x 2^20 = 3825205248 bytes; pids: 8 + bubblewrap's 1
    assert host.cgroup_limits(512, 64, 8) == {"memory.max": "3825205248", "memory.swap.max": "0", "pids.max": "9"}
    assert host.tmp_inodes(64) == 16384 and host.tmp_inodes(1) == 256  # one inode per 4 KiB page


def test_other_abis_cannot_open_a_socket():
    # x86_64 only (aarch64 has no second ABI here): the x32 ABI's socket (41 | 0x40000000) and i386's
    # socketcall (102, SYS_SOCKET = 1) through `int 0x80` -- machine code in an executable page:
    # push rbx; mov eax, 102; mov ebx, 1; xor ecx, ecx; int 0x80; pop rbx; ret. The filter answers EPERM
    # (-1 from libc, -EPERM = -1 in eax) to both; a kernel without i386 emulation kills the program
    # (SIGSEGV) instead. Let through, socketcall with a NULL argument array would give -EFAULT (-14).
    if platform.machine() != "x86_64":
        assert platform.machine() == "aarch64" and "x86_64" not in host.seccomp.ARCHES[platform.machine()]
        return
    code = dedent("""\
        import ctypes, mmap
        libc = ctypes.CDLL(None, use_errno=True)
        print('x32', libc.syscall(41 | 0x40000000, 2, 1, 0), ctypes.get_errno(), flush=True)
        page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(bytes.fromhex('53b866000000bb0100000031c9cd805bc3'))
        call = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
        print('i386', call())
        """)
    r = run_python(code)
    assert r.stdout.splitlines()[0] == "x32 -1 1", r.stdout + r.stderr
    assert (r.ok and r.stdout.splitlines()[1] == "i386 -1") or r.exit_code in (-11, 139), r
