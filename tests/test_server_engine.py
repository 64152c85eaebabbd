"""``engine.rollout: server`` against a real rollout server: ``policyzoo serve`` (vLLM's OpenAI server
with policyzoo's worker extension and gloo weight transfer) serving the tiny model on 127.0.0.1, one
process for the whole module, always killed at the end. The trainer samples through it, pushes its
weights after every step and checks the push (sync check at 1e-4 nats); the bad cases are refused
before any model loads (unreachable, another model, another version), and a server that stops
answering mid-run fails the step cleanly, leaves the last checkpoint intact, and ``--resume``
continues once it answers again."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from _engine_helpers import ROOT, engine_env, metrics, run_train, tiny_model

from policyzoo.engine.models import resolve_model
from policyzoo.engine.rollout import server as server_mod
from policyzoo.engine.rollout.server.protocol import ServerError

pytestmark = pytest.mark.engine_group  # starts a vLLM server process: make test-engine


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(log: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**engine_env(), "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "policyzoo.cli", "serve", "--model", str(tiny_model()), "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", "1024"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    return proc, f"127.0.0.1:{port}"


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``host:port`` of one rollout server for the module (a port taken meanwhile: started again);
    ``POLICYZOO_TEST_SERVER=host:port`` reuses a server already started with `policyzoo serve`."""
    if os.environ.get("POLICYZOO_TEST_SERVER"):
        yield os.environ["POLICYZOO_TEST_SERVER"]
        return
    log = tmp_path_factory.mktemp("serve") / "server.log"
    for _ in range(3):
        proc, address = _start(log)
        try:
            deadline = time.time() + 1200  # a shared 2-core machine: vLLM's start-up takes minutes
            while proc.poll() is None and time.time() < deadline:
                try:
                    if httpx.get(f"http://{address}/v1/models", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(2)
            if proc.poll() is None and time.time() < deadline:
                yield address
                return
            assert "address already in use" in log.read_text().lower(), log.read_text()[-3000:]
        finally:
            _stop(proc)
    pytest.fail("no free port for the rollout server in 3 tries")


def _server_args(address: str) -> list[str]:
    return ["engine.rollout=server", f"engine.servers=[{address}]"]


def test_two_steps_through_the_server_with_the_sync_check(server, tmp_path):
    out = tmp_path / "run"
    proc = run_train(out, "train.steps=2", *_server_args(server), timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    train = metrics(out)
    assert [r["step"] for r in train] == [1, 2]
    for r in train:  # the server's log-probs equal the trainer's after every push (tolerance 1e-4 nats)
        assert 0 <= r["sync_max_diff"] <= 1e-4 and r["rollout_tokens"] > 0
    assert json.loads((out / "summary.json").read_text())["rollout"] == "server"


def test_an_unreachable_server_is_refused_before_any_model_loads(tmp_path):
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        for extra in (["--dry-run"], []):
            proc = run_train(tmp_path / f"run{len(extra)}", *_server_args(address), *extra, timeout=600)
            assert proc.returncode == 2, proc.stderr[-3000:]
            assert f"rollout server http://{address}" in proc.stderr and "ConnectError" in proc.stderr
            assert "policyzoo serve" in proc.stderr and "loading the model" not in proc.stderr + proc.stdout


def test_a_server_of_another_model_or_version_is_refused(server, tmp_path, monkeypatch):
    from policyzoo.testing.tiny import build_tiny_model

    other = build_tiny_model(tmp_path / "other", seed=0, layers=3)  # the server serves 2 layers
    proc = run_train(tmp_path / "run", *_server_args(server), "--dry-run", model=other, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "model num_hidden_layers = 2 on the server, 3 here" in proc.stderr
    info = resolve_model(str(tiny_model()), False)
    assert [s.model for s in server_mod.connect([server], info, "float32", 64)] == [str(tiny_model())]
    versions = server_mod.wire.installed_versions()
    monkeypatch.setattr(server_mod.wire, "installed_versions", lambda: {**versions, "policyzoo": "0.0.1"})
    with pytest.raises(ServerError, match=r"policyzoo \S+ on the server, 0.0.1 here \(the versions must be equal\)"):
        server_mod.connect([server], info, "float32", 64)
    with pytest.raises(ServerError, match="dtype float32 on the server, bfloat16 here"):
        server_mod.connect([server], info, "bfloat16", 64)


class _Relay(BaseHTTPRequestHandler):
    """Forwards to the server until ``cut()`` says the server is gone: then it drops every
    connection without a reply, as a dead server does."""

    target: str
    cut = staticmethod(lambda: False)

    def _relay(self):
        if self.cut():
            self.close_connection = True
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        r = httpx.request(self.command, f"http://{self.target}{self.path}", content=body, timeout=600,
                          headers={"Content-Type": self.headers.get("Content-Type", "application/json")})
        self.send_response(r.status_code)
        self.send_header("Content-Type", r.headers.get("content-type", "application/json"))
        self.send_header("Content-Length", str(len(r.content)))
        self.end_headers()
        self.wfile.write(r.content)

    do_GET = do_POST = _relay

    def log_message(self, *args):
        pass


def test_a_server_dying_mid_run_fails_the_step_and_resume_continues(server, tmp_path):
    out = tmp_path / "run"
    gone = {"on": True}
    # the server "dies" as soon as step 1's checkpoint exists: step 2's first request finds it gone
    relay = type("Relay", (_Relay,), {"target": server,
                                      "cut": staticmethod(lambda: gone["on"] and (out / "checkpoints" /
                                                                                 "step-000001").is_dir())})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), relay)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{httpd.server_address[1]}"
        proc = run_train(out, "train.steps=3", "train.save_every=1", *_server_args(address), timeout=1500)
        assert proc.returncode == 2, proc.stderr[-4000:]
        assert "step 2" in proc.stderr and f"rollout server http://{address}" in proc.stderr
        assert "--resume" in proc.stderr  # what to do once it is back
        assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == 1  # intact, not step 2
        assert [r["step"] for r in metrics(out)] == [1]
        gone["on"] = False  # the server is back
        cmd = [sys.executable, "-m", "policyzoo.cli", "train", "--resume", str(out)]
        proc = subprocess.run(cmd, env=engine_env(), capture_output=True, text=True, timeout=1500, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-4000:]
        train = metrics(out)
        assert [r["step"] for r in train] == [1, 2, 3] and all(r["sync_max_diff"] <= 1e-4 for r in train)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_asynchronous_training_through_the_server_stays_within_the_bound(server, tmp_path):
    # engine.max_staleness on the server path (issue 21 item 3): the sampler thread samples the coming
    # steps through the server while the trainer trains; every push waits for the batch in flight (one
    # engine lock), so each group has one version and the push is checked as in the synchronous run
    out = tmp_path / "run"
    proc = run_train(out, "train.steps=3", "engine.max_staleness=1", "train.log_completions_every=1",
                     *_server_args(server), timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    train = metrics(out)
    assert [r["step"] for r in train] == [1, 2, 3] and train[0]["policy_lag_max"] == 0  # nothing ahead of step 1
    assert all(0 <= r["policy_lag_max"] <= 1 and r["sync_max_diff"] <= 1e-4 for r in train)
    rows = [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in rows}) == [1, 2, 3]
    for r in rows:  # no update skipped: step k trains at version k - 1, so version + staleness = k - 1
        assert 0 <= r["policy_lag"] <= 1 and r["policy_version"] + r["policy_lag"] == r["step"] - 1
