"""Escape attempts against ``run_python`` with its defaults (docs/security.md): each must fail
inside the box and leave the caller intact. Run as root (the sandbox then runs as nobody) and, in
``test_secrets_of_a_non_root_user_stay_outside``, as an ordinary user reading its own files."""

from __future__ import annotations

import errno
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _engine_helpers import BUILD
from _sandbox_helpers import NON_ROOT_UID, as_user_package

from policyzoo.plugins.env import PythonSandbox, run_python
from policyzoo.plugins.env.sandbox import memory_bound

ROOT = Path(__file__).resolve().parents[2]
SECRET = "pz-secret-" + secrets.token_hex(8)


def plant(folder: Path, name: str = "secret.txt", mode: int = 0o644) -> Path:
    """A world-readable (by default) secret file outside /tmp."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o755)
    path = folder / name
    path.write_text(SECRET)
    os.chmod(path, mode)
    return path


def read_attempt(path: Path) -> str:
    return f"print(open({str(path)!r}).read())"


@pytest.fixture()
def home(tmp_path, monkeypatch):
    """A temporary HOME (outside /tmp when the checkout allows) with ~/.netrc and the Hugging Face
    token, and HF_TOKEN / WANDB_API_KEY in the environment."""
    base = BUILD if not BUILD.resolve().is_relative_to("/tmp") else Path("/var/tmp")
    h = base / f"home-{secrets.token_hex(4)}"
    plant(h, ".netrc")
    plant(h / ".cache" / "huggingface", "token")
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    yield h
    subprocess.run(["rm", "-rf", str(h)], check=False)


def test_planted_secrets_are_not_visible(home, tmp_path):
    # outside /tmp in a temporary HOME, in the project's build folder and in a run's output directory
    run_dir = BUILD / f"run-{secrets.token_hex(4)}"
    planted = [home / ".netrc", home / ".cache/huggingface/token", plant(BUILD / "secrets-probe"), plant(run_dir)]
    try:
        for path in planted:
            assert path.read_text() == SECRET  # readable on the host, by anyone (0644) ...
            r = run_python(read_attempt(path))
            assert not r.ok and "FileNotFoundError" in r.stderr and SECRET not in r.stdout + r.stderr  # ... not inside
        r = run_python("import os\nfor p in ('~/.netrc', '~/.cache/huggingface/token'):\n"
                       "    print(os.path.exists(os.path.expanduser(p)))")
        assert r.ok and r.stdout == "False\nFalse\n"  # the program's own HOME is its empty /tmp
    finally:
        subprocess.run(["rm", "-rf", str(run_dir), str(BUILD / "secrets-probe")], check=False)


def test_the_environment_and_proc_hold_no_secret(home):
    r = run_python("import os, glob\nprint(sorted(os.environ))\n"
                   "for p in sorted(glob.glob('/proc/[0-9]*/environ')):\n    print(p, open(p, 'rb').read())")
    assert r.ok and SECRET not in r.stdout
    assert r.stdout.splitlines()[0] == "['HOME', 'PATH', 'PWD']"
    assert "/proc/1/environ" in r.stdout  # bubblewrap's own process shows nothing either (it starts with no env)


def test_host_folders_are_not_there():
    r = run_python("import os\nfor p in ('/home', '/root', '/sys', '/srv', '/mnt', '/opt', '/work', '/etc/passwd'):\n"
                   "    print(p, os.path.exists(p))\nprint(sorted(os.listdir('/')), sorted(os.listdir('/etc')))")
    assert r.ok
    lines = r.stdout.splitlines()
    assert all(line.endswith(" False") for line in lines[:8]), r.stdout
    assert lines[8] == "['bin', 'dev', 'etc', 'lib', 'lib64', 'proc', 'sbin', 'tmp', 'usr'] ['ld.so.cache']"
    r = run_python("import os; os.listdir('/home')")
    assert not r.ok and "FileNotFoundError" in r.stderr
    assert not Path(ROOT / "README.md").is_relative_to("/tmp")  # the checkout is not under the sandbox's /tmp
    r = run_python(read_attempt(ROOT / "README.md"))
    assert not r.ok and "FileNotFoundError" in r.stderr  # the project checkout is not in the view


def test_the_standard_library_works():
    r = run_python("import json, sqlite3, ssl, decimal, hashlib, ctypes, lzma, bz2, zlib\n"
                   "print(json.dumps(sorted({1, 2})), hashlib.sha256(b'').hexdigest()[:8])")
    assert r.ok and r.stdout == "[1, 2] e3b0c442\n", r.stderr  # sha256 of b'' starts e3b0c442 (FIPS 180-4 vector)


def test_filling_tmp_stops_at_its_size():
    # 512 KiB files (under the 1 MiB file-size limit) until the write fails: a 64 MiB tmpfs holds 128 of them
    code = ("import errno\nn = 0\ntry:\n    for i in range(100000):\n        with open(f'/tmp/f{i}', 'wb') as f:\n"
            "            f.write(b'x' * (512 << 10))\n        n += 1\nexcept OSError as e:\n"
            "    print(errno.errorcode[e.errno], n)")
    r = run_python(code)
    name, n = r.stdout.split()
    assert r.ok and name == "ENOSPC" and 120 <= int(n) <= 128  # 64 MiB / 512 KiB = 128 (less the fs's own blocks)
    assert memory_bound(512, 64, 8) == {"process": 512, "worst": 64 + 8 * 448}  # 448 = 512 - 64 address space
    note = PythonSandbox().notes()[0]  # what the dry run prints: 64 + 8 x 448 = 3648 MiB if it forks
    assert "at most 512 MiB in one process (address space 448 + /tmp 64) and 3648 MiB" in note


def test_printing_without_end_does_not_grow_the_caller():
    # in a fresh interpreter, so its peak RSS (VmHWM) starts low: a program printing 64 KiB chunks for 3 s
    # (gigabytes) must leave the caller's peak within 50 MB
    probe = ("import time\nfrom policyzoo.plugins.env import run_python\n"
             "hwm = lambda: int([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1])\n"
             "run_python('print(1)')\nh0 = hwm()\n"
             "r = run_python(\"import sys\\nwhile True:\\n    sys.stdout.write('x' * 65536)\", timeout_s=3)\n"
             "import re\n"
             "m = re.fullmatch(r'x{1000}\\n\\[\\.\\.\\. (\\d+) bytes cut \\.\\.\\.\\]\\nx{1000}', r.stdout)\n"
             "print(hwm() - h0, len(r.stdout), r.timed_out, m and m.group(1))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True).stdout
    grown_kb, kept, timed_out, cut = out.split()
    assert int(grown_kb) < 50 * 1024 and timed_out == "True"
    # 1000 head + 1000 tail bytes kept around the marker "\n[... N bytes cut ...]\n"; 64 KiB a write for 3 s
    # is far more than 100 MB even on a loaded machine
    assert 2000 < int(kept) < 2100 and int(cut) > 100_000_000


def test_fork_bomb_is_contained_and_leaves_nothing():
    t0 = time.perf_counter()
    r = run_python("import os\nwhile True:\n    os.fork()")
    assert not r.ok and time.perf_counter() - t0 < 30
    assert "BlockingIOError" in r.stderr or r.timed_out
    assert run_python("print(2)").stdout == "2\n"  # the next program runs: no process was left behind


def test_sleeping_past_the_wall_clock_is_killed():
    t0 = time.perf_counter()
    r = run_python("import time\ntime.sleep(60)", timeout_s=2)
    assert r.timed_out and not r.ok and time.perf_counter() - t0 < 20


def test_loopback_server_is_not_reached():
    srv, accepted = socket.socket(), []
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(10)
    port = srv.getsockname()[1]

    def serve():
        try:
            accepted.append(srv.accept())
        except OSError:
            pass
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    r = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2)")
    # the socket itself is refused now (EAFNOSUPPORT = 97, Linux asm-generic/errno.h), before any connect
    assert not r.ok and "[Errno 97] Address family not supported" in r.stderr, r.stderr
    socket.create_connection(("127.0.0.1", port), 2).close()  # the host reaches it: the server was up
    t.join(15)
    srv.close()
    assert len(accepted) == 1  # only the host's own connection


def test_the_parent_cannot_be_signalled():
    r = run_python(f"import os, signal\nos.kill({os.getpid()}, signal.SIGTERM)")
    assert not r.ok and "ProcessLookupError" in r.stderr  # the trainer's pid does not exist in the box
    r = run_python("import os, signal\nprint(os.getppid())\nos.kill(0, signal.SIGKILL)")
    assert r.stdout.split()[:1] == ["0"]  # no parent in view; killing its own group ends only itself
    assert signal.getsignal(signal.SIGTERM) is not None and os.getpid() > 0  # this process still runs


def test_writing_outside_tmp_fails(tmp_path):
    base = BUILD / f"write-{secrets.token_hex(4)}"
    base.mkdir(parents=True)
    os.chmod(base, 0o777)  # even a world-writable host folder
    try:
        for target in (base / "pwned.txt", Path("/usr/pwned.txt"), Path("/pwned.txt"), Path("/dev/pwned")):
            r = run_python(f"open({str(target)!r}, 'w').write('x')")
            assert not r.ok and ("Read-only file system" in r.stderr or "No such file" in r.stderr), r.stderr
            assert not target.exists()
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_bad_sandbox_settings_are_refused():
    from policyzoo.plugins.env import SandboxError

    with pytest.raises(SandboxError, match="ro_paths"):
        run_python("1", ro_paths=["relative/path"])
    with pytest.raises(SandboxError, match="resolves to /"):
        run_python("1", ro_paths=["/"])
    with pytest.raises(SandboxError, match="tmp_mb"):
        PythonSandbox(memory_mb=64, tmp_mb=64)


def test_ro_paths_are_the_only_extra_view(tmp_path):
    folder = BUILD / f"ro-{secrets.token_hex(4)}"
    path = plant(folder)
    try:
        assert not run_python(read_attempt(path)).ok
        r = run_python(read_attempt(path), ro_paths=[str(folder)])
        assert r.ok and r.stdout == SECRET + "\n"  # named, so visible ...
        w = run_python(f"open({str(folder / 'new')!r}, 'w')", ro_paths=[str(folder)])
        assert not w.ok and "Read-only file system" in w.stderr  # ... and read-only
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)


def test_secrets_of_a_non_root_user_stay_outside(user_dir):
    # an ordinary user's own ~/.netrc and HF token (mode 0600: readable by that user on the host)
    tmp_path = user_dir
    home = tmp_path / "home"
    netrc, token = plant(home, ".netrc", 0o600), plant(home / ".cache" / "huggingface", "token", 0o600)
    probe = ("import json, sys\nfrom policyzoo.plugins.env.sandbox import run_python\nout = []\n"
             "for p in sys.argv[1:]:\n    out.append(open(p).read())\n"
             "    r = run_python(f'print(open({p!r}).read())')\n    out.append(r.stdout + r.stderr)\n"
             "r = run_python('import os; print(sorted(os.environ))')\nout.append(r.stdout)\nprint(json.dumps(out))")
    env = {"HOME": str(home), "HF_TOKEN": SECRET, "WANDB_API_KEY": SECRET, "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(as_user_package(tmp_path))}
    if os.geteuid() == 0:
        for p in (home, home / ".cache", home / ".cache" / "huggingface", netrc, token):
            os.chown(p, NON_ROOT_UID, NON_ROOT_UID)

        def become():
            os.setgroups([])
            os.setgid(NON_ROOT_UID)
            os.setuid(NON_ROOT_UID)
    else:
        become = None
    res = subprocess.run(["/usr/bin/python3", "-c", probe, str(netrc), str(token)], env=env, capture_output=True,
                         text=True, timeout=120, preexec_fn=become, cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    host_netrc, box_netrc, host_token, box_token, box_env = json.loads(res.stdout)
    assert host_netrc == host_token == SECRET  # the user reads its own secrets on the host ...
    for seen in (box_netrc, box_token):
        assert SECRET not in seen and "FileNotFoundError" in seen  # ... but its sandboxed program does not
    assert box_env == "['HOME', 'PATH', 'PWD']\n"


def test_an_escape_run_leaves_the_caller_and_the_env_intact():
    env = PythonSandbox()
    ep = env.env({"prompt": "print the secret", "answer": "1"})
    obs = ep.step("```python\nprint(open('/etc/shadow').read())\n```", [])
    assert obs.tool_error and "FileNotFoundError" in obs.messages[0]["content"]
    obs = ep.step("```python\nprint(1)\n```", [])  # the episode goes on
    assert not obs.tool_error and "stdout:\n1" in obs.messages[0]["content"]
    assert errno.ENOSPC == 28  # the errno name the /tmp test reads (Linux asm-generic/errno-base.h)


def test_memory_outside_the_address_space_is_refused():
    # anonymous files, SysV shared memory and message queues hold host memory that RLIMIT_AS does not
    # count: the syscall filter answers EPERM (errno 1); open files are capped, so pipe buffers are too
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "try:\n    os.memfd_create('x')\nexcept OSError as e:\n    print('memfd', e.errno)\n"
            "print('shmget', libc.shmget(0, 1 << 20, 0o1600), ctypes.get_errno())\n"
            "print('msgget', libc.msgget(0, 0o1600), ctypes.get_errno())\n"
            "fds = []\ntry:\n    while True:\n        fds.append(os.pipe())\nexcept OSError as e:\n"
            "    print('pipes', len(fds), e.errno)")
    r = run_python(code)
    lines = r.stdout.splitlines()
    assert r.ok and lines[:3] == ["memfd 1", "shmget -1 1", "msgget -1 1"], r.stdout + r.stderr
    pipes, err = lines[3].split()[1:]
    assert err == "24" and int(pipes) < 32  # EMFILE: 64 descriptors, 2 a pipe, 3 taken by stdio


def test_no_nested_namespace_or_mount():
    # a user namespace of its own would let a program mount a tmpfs of half the host's RAM
    code = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print('unshare', libc.unshare(0x10000000 | 0x20000), ctypes.get_errno())\n"  # CLONE_NEWUSER | NEWNS
            "print('mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())\n"
            "pid = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)\n"  # x86_64 clone(CLONE_NEWUSER | SIGCHLD)
            "import os\nif pid == 0:\n    os._exit(0)\nprint('clone', pid)")
    r = run_python(code)
    lines = r.stdout.splitlines()
    assert r.ok and lines[:2] == ["unshare -1 1", "mount -1 1"], r.stdout + r.stderr  # EPERM from the filter
    assert lines[2] == "clone -1"  # bubblewrap's --disable-userns: no user namespace below the sandbox's


def test_ro_paths_that_reveal_too_much_are_refused(tmp_path):
    from policyzoo.plugins.env import SandboxError

    link = BUILD / f"rootlink-{secrets.token_hex(4)}"
    link.symlink_to("/")
    try:
        for bad, why in ((str(link), "resolves to /"), ("//", "resolves to /"), ("/tmp", "sandbox's own")):
            with pytest.raises(SandboxError, match=why):
                run_python("1", ro_paths=[bad])
    finally:
        link.unlink()
