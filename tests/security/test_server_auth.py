"""The rollout server is not an open door (``policyzoo.engine.rollout.server.auth``).

Fast, no server: ``policyzoo serve`` refuses a host other than loopback without a shared secret and
exits 2 before anything starts; a token file open to group or others is refused with the chmod fix;
with a secret the vLLM command carries the token middleware and the secret travels in the server's
environment, never on its command line; the middleware refuses a request without the right bearer.

Engine group, one real ``policyzoo serve`` on 127.0.0.1 (the tiny model, a token file, always stopped
at the end): every route the server lists in its OpenAPI spec (the OpenAI routes, ``/collective_rpc``,
the weight-transfer routes, ``/health``), ``/metrics``, ``/docs`` and ``/openapi.json`` answer 401
without the token or with a wrong one; with it they are served; the trainer's connect check sends it
and turns a refusal into a UserError; a 1-step training run pushes its weights through the protected
routes and writes the secret nowhere.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from _engine_helpers import ROOT, engine_env, metrics, run_train, tiny_model

from policyzoo import cli
from policyzoo.engine.rollout import server as server_mod
from policyzoo.engine.rollout.server.auth import (
    TOKEN_ENV,
    BearerTokenMiddleware,
    check_bind,
    is_loopback,
    read_token_file,
    resolve_token,
)
from policyzoo.engine.rollout.server.protocol import ServerError
from policyzoo.engine.run import serve
from policyzoo.errors import UserError

TOKEN = "s3cret-token-for-the-tests-0123456789"  # 37 visible ASCII characters (>= 16)


def _token_file(folder: Path, mode: int, text: str = TOKEN) -> Path:
    path = folder / "token"
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def _said(capsys) -> str:
    """What the CLI wrote to stderr, on one line (the console wraps at its width)."""
    return " ".join(capsys.readouterr().err.split())


@pytest.fixture
def no_exec(monkeypatch):
    """``policyzoo serve`` in this process: records the vLLM command and environment instead of
    exec'ing; the model folder is not looked up (a fake with a path)."""
    calls = []
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setattr(serve, "resolve_model", lambda *a: type("M", (), {"path": "/models/m"})())
    monkeypatch.setattr(serve.os, "execve", lambda exe, cmd, env: calls.append((cmd, env)))
    return calls


@pytest.mark.parametrize("host", ["127.0.0.1", "127.4.5.6", "::1", "[::1]", "localhost", "LocalHost"])
def test_loopback_hosts(host):
    assert is_loopback(host)
    check_bind(host, None)  # no secret needed


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.0.0.5", "192.168.1.2", "fe80::1", "serve-a"])
def test_other_hosts_need_a_secret(host):
    assert not is_loopback(host)
    with pytest.raises(UserError, match="needs a shared secret"):
        check_bind(host, None)
    check_bind(host, TOKEN)


def test_a_public_host_without_a_secret_exits_2_before_starting_anything(no_exec, capsys):
    assert cli.main(["serve", "--host", "0.0.0.0"]) == 2
    err = _said(capsys)
    assert "policyzoo serve --host 0.0.0.0" in err and "needs a shared secret" in err
    assert "--token-file" in err and TOKEN_ENV in err  # the two ways to set it
    assert no_exec == []  # nothing started


def test_a_passed_through_host_is_refused(no_exec, capsys):
    assert cli.main(["serve", "--", "--host", "0.0.0.0"]) == 2
    assert "pass --host before --" in _said(capsys) and no_exec == []


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o640, 0o620])
def test_a_token_file_open_to_group_or_others_is_refused(tmp_path, mode, no_exec, capsys):
    path = _token_file(tmp_path, mode)
    assert cli.main(["serve", "--host", "0.0.0.0", "--token-file", str(path)]) == 2
    err = _said(capsys)
    assert f"chmod 600 {path}" in err and "open to group or others" in err and no_exec == []
    with pytest.raises(UserError, match="open to group or others"):  # the trainer's engine.server_token_file
        resolve_token(path, {}, where="engine.server_token_file")


def test_an_owner_only_file_or_the_environment_gives_the_secret(tmp_path):
    assert read_token_file(_token_file(tmp_path, 0o600), "t") == TOKEN  # the newline stripped
    assert resolve_token(None, {TOKEN_ENV: TOKEN}) == TOKEN
    assert resolve_token(None, {}) is None
    assert resolve_token(tmp_path / "token", {TOKEN_ENV: TOKEN}) == TOKEN  # both, the same secret
    with pytest.raises(UserError, match="hold different tokens"):
        resolve_token(tmp_path / "token", {TOKEN_ENV: TOKEN + "x"})
    with pytest.raises(UserError, match="at least 16 visible ASCII characters"):  # 15 characters
        resolve_token(None, {TOKEN_ENV: "a" * 15})
    with pytest.raises(UserError, match="at least 16"):
        resolve_token(None, {TOKEN_ENV: "a b c d e f g h i j"})  # spaces
    with pytest.raises(UserError, match="cannot be read"):
        resolve_token(tmp_path / "missing", {})


def test_with_a_secret_the_server_gets_the_middleware_and_the_secret_only_in_its_environment(tmp_path, no_exec):
    path = _token_file(tmp_path, 0o600)
    assert cli.main(["serve", "--host", "0.0.0.0", "--port", "8123", "--token-file", str(path)]) == 0
    [(cmd, env)] = no_exec
    assert cmd[cmd.index("--middleware") + 1] == serve.MIDDLEWARE and cmd[-2:] == ["--host", "0.0.0.0"]
    assert not any(TOKEN in a for a in cmd) and env[TOKEN_ENV] == TOKEN
    no_exec.clear()
    assert cli.main(["serve"]) == 0  # loopback, no secret: as before, no middleware, no secret passed on
    [(cmd, env)] = no_exec
    assert "--middleware" not in cmd and TOKEN_ENV not in env and cmd[-2:] == ["--host", "127.0.0.1"]


def test_the_middleware_lets_only_the_right_bearer_through(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    ran = []

    async def app(scope, receive, send):
        ran.append(scope["type"])

    mw = BearerTokenMiddleware(app)

    def call(scope_type, headers):
        sent = []

        async def send(message):
            sent.append(message)

        ran.clear()
        asyncio.run(mw({"type": scope_type, "path": "/collective_rpc", "headers": headers}, None, send))
        return bool(ran), sent

    ok = [(b"authorization", f"Bearer {TOKEN}".encode())]
    assert call("http", ok) == (True, [])
    assert call("http", [(b"Authorization", f"bearer {TOKEN}".encode())])[0]  # scheme and header name: any case
    for bad in ([], [(b"authorization", f"Basic {TOKEN}".encode())], [(b"authorization", b"Bearer wrong")],
                [(b"authorization", f"Bearer {TOKEN}x".encode())], [(b"x-token", TOKEN.encode())]):
        served, sent = call("http", bad)
        assert not served and sent[0]["status"] == 401 and (b"www-authenticate", b"Bearer") in sent[0]["headers"]
    served, sent = call("websocket", [])
    assert not served and sent == [{"type": "websocket.close", "code": 1008}]
    assert call("lifespan", [])[0]  # start-up events pass
    monkeypatch.delenv(TOKEN_ENV)
    with pytest.raises(RuntimeError, match=TOKEN_ENV):  # fail closed: no server without its secret
        BearerTokenMiddleware(app)


# ----------------------------------------------------------------------------- one real server
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
def guarded(tmp_path_factory):
    """``(host:port, token file, log)`` of one ``policyzoo serve --token-file`` on 127.0.0.1 for the
    module (a port taken meanwhile: started again), stopped at the end."""
    folder = tmp_path_factory.mktemp("guarded")
    path, log = _token_file(folder, 0o600), folder / "server.log"
    env = {k: v for k, v in engine_env().items() if k != TOKEN_ENV}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1")
    for _ in range(3):
        port = _free_port()
        cmd = [sys.executable, "-m", "policyzoo.cli", "serve", "--model", str(tiny_model()), "--host", "127.0.0.1",
               "--port", str(port), "--max-model-len", "1024", "--token-file", str(path)]
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                    start_new_session=True)
        try:
            deadline = time.time() + 1200  # a shared 2-core machine: vLLM's start-up takes minutes
            while proc.poll() is None and time.time() < deadline:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2,
                                 headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(2)
            if proc.poll() is None and time.time() < deadline:
                yield f"127.0.0.1:{port}", path, log
                return
            assert "address already in use" in log.read_text().lower(), log.read_text()[-3000:]
        finally:
            _stop(proc)
    pytest.fail("no free port for the rollout server in 3 tries")


@pytest.mark.engine_group
def test_every_route_refuses_a_request_without_the_token(guarded):
    address = guarded[0]
    base, auth = f"http://{address}", {"Authorization": f"Bearer {TOKEN}"}
    spec = httpx.get(f"{base}/openapi.json", headers=auth, timeout=30).json()  # the routes the server has
    routes = [(m.upper(), p) for p, ops in spec["paths"].items() for m in ops]
    routes += [("GET", "/metrics"), ("GET", "/docs"), ("GET", "/openapi.json")]  # a mount and FastAPI's own
    listed = {p for _, p in routes}
    for must in ("/v1/completions", "/v1/models", "/collective_rpc", "/init_weight_transfer_engine",
                 "/update_weights", "/reset_prefix_cache", "/health", "/tokenize"):
        assert must in listed, must  # the dev routes are on (VLLM_SERVER_DEV_MODE)
    with httpx.Client(base_url=base, timeout=30) as client:
        for method, path in routes:  # refused before routing: none of them runs
            for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN}):
                r = client.request(method, path.replace("{", "").replace("}", ""), headers=headers)
                assert r.status_code == 401, (method, path, headers, r.status_code)
        # with the token: served (an OpenAI route and policyzoo's identity through /collective_rpc)
        assert client.get("/v1/models", headers=auth).json()["data"][0]["id"] == str(tiny_model())
        rpc = client.post("/collective_rpc", json={"method": "policyzoo_identity"}, headers=auth).json()
        assert rpc["results"][0]["logprobs_mode"] == "processed_logprobs"
        done = client.post("/v1/completions", headers=auth, json={"model": str(tiny_model()), "prompt": [5, 6, 7],
                                                                   "max_tokens": 2, "temperature": 0.0,
                                                                   "ignore_eos": True}).json()
        assert done["usage"]["completion_tokens"] == 2  # 2 tokens asked, eos ignored
    assert TOKEN not in guarded[2].read_text()  # the server's log (its command line) never shows the secret


@pytest.mark.engine_group
def test_the_trainer_sends_the_token_and_names_a_refusal(guarded, monkeypatch):
    from policyzoo.engine.models import resolve_model

    address, path, _ = guarded
    info = resolve_model(str(tiny_model()), False)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(ServerError, match=f"rollout server at http://{address}(.|\n)*none was sent(.|\n)*{TOKEN_ENV}"):
        server_mod.connect([address], info, "float32", 64)
    [s] = server_mod.connect([address], info, "float32", 64, token_file=str(path))  # engine.server_token_file
    assert s.model == str(tiny_model()) and TOKEN not in repr(s)
    monkeypatch.setenv(TOKEN_ENV, "another-token-0123456789")
    with pytest.raises(ServerError, match=f"refused the token(.|\n)*set {TOKEN_ENV}"):
        server_mod.connect([address], info, "float32", 64)


@pytest.mark.engine_group
def test_a_training_step_pushes_through_the_guarded_routes_and_writes_no_secret(guarded, tmp_path):
    address, path, _ = guarded
    out = tmp_path / "run"
    proc = run_train(out, "train.steps=1", "engine.rollout=server", f"engine.servers=[{address}]",
                     f"engine.server_token_file={path}", timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    [step] = metrics(out)
    assert 0 <= step["sync_max_diff"] <= 1e-4  # the push reached the server: its log-probs equal the trainer's
    assert str(path) in (out / "resolved.yaml").read_text()  # the path is recorded ...
    for f in out.rglob("*"):  # ... the secret nowhere in the run directory
        if f.is_file() and f.stat().st_size < 50 * 2**20:
            assert TOKEN.encode() not in f.read_bytes(), f
    assert TOKEN not in proc.stdout + proc.stderr
