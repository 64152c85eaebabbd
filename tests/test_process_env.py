"""policyzoo.engine.process.setup_process: vLLM-CPU's KV cache and thread binding set explicitly,
a user's own values kept (run in a subprocess: it sets the process environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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


def test_a_lock_left_by_a_killed_build_is_removed_and_a_live_build_is_left_alone(tmp_path, capsys):
    from policyzoo.engine.process import STALE_LOCK_SECONDS, clear_stale_build_lock

    dead, live = tmp_path / "deepspeed_shm_comm", tmp_path / "other_op"
    for folder in (dead, live):
        folder.mkdir()
        (folder / "lock").touch()
        (folder / "shm.o").touch()
    old = os.path.getmtime(dead / "lock") - STALE_LOCK_SECONDS - 60  # a build killed 16 minutes ago
    for f in dead.iterdir():
        os.utime(f, (old, old))
    os.utime(live / "lock", (old, old))  # an old lock, but the build wrote shm.o just now: alive
    assert clear_stale_build_lock(tmp_path) == [dead / "lock"]
    assert not (dead / "lock").exists() and (live / "lock").exists() and (dead / "shm.o").exists()
    assert "stale build lock" in capsys.readouterr().err
