"""The escape attempts inside a real 1-step ``python_sandbox`` run on a tiny model: every attempt runs
(its failure reaches completions.jsonl as the tool message), fails inside the box, and the run goes
on to its checkpoint with no secret in any file it wrote.

The model is the tiny Llama made to end every turn at once: all embeddings equal, the layers'
output projections zero (the residual stream stays the embedding, RMS-normalised to ones) and an
untied head whose only non-zero row is EOS's, so EOS's logit is 128 (hidden size x 1) and every
other is 0: p(EOS) = 1 / (1 + 258 e^-128) = 1 to float precision. An empty turn with
``code_blocks: false`` is an empty program, so the sandbox runs exactly the row's ``tests``
column: the attack."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from _engine_helpers import BUILD, engine_env, metrics, train_cmd

SECRET = "pz-run-secret-" + secrets.token_hex(8)


def eos_model(folder: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from policyzoo.testing.tiny import build_tokenizer

    if (folder / "model.safetensors").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(folder)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.fill_(1.0)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.zero_()
        model.lm_head.weight[tok.eos_token_id] = 1.0
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


def attacks(planted: list[str], port: int, parent: int) -> dict[str, str]:
    reads = "\n".join(f"try:\n    print('LEAK', open({p!r}).read())\nexcept OSError as e:\n"
                      "    print('read', type(e).__name__)" for p in planted)
    return {
        "secrets": reads + "\nimport os, glob\nprint('env', sorted(os.environ))\n"
                   "print('procs', glob.glob('/proc/[0-9]*'), open('/proc/1/environ', 'rb').read())\n"
                   "print('home', os.path.exists('/home'), 'sys', os.path.exists('/sys'))\n"
                   "import signal, socket\ntry:\n    os.kill(" + str(parent) + ", signal.SIGTERM)\n"
                   "except OSError as e:\n    print('kill', type(e).__name__)\n"
                   "try:\n    socket.create_connection(('127.0.0.1', " + str(port) + "), 2)\n"
                   "except OSError as e:\n    print('connect', type(e).__name__)\n"
                   "try:\n    open('/pwned', 'w')\nexcept OSError as e:\n    print('write', type(e).__name__)",
        "fill_tmp": "import errno\ntry:\n    for i in range(10**5):\n"
                    "        open(f'/tmp/f{i}', 'wb').write(b'x' * (512 << 10))\n"
                    "except OSError as e:\n    print('fill', errno.errorcode[e.errno])",
        "flood": "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)",
        "fork_bomb": "import os\nwhile True:\n    os.fork()",
        "sleep": "import time\ntime.sleep(60)",
    }


@pytest.fixture()
def planted():
    folder = BUILD / f"planted-{secrets.token_hex(4)}"
    folder.mkdir(parents=True)
    os.chmod(folder, 0o755)
    (folder / ".netrc").write_text(SECRET)
    os.chmod(folder / ".netrc", 0o644)
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], check=False)


def test_every_escape_fails_inside_a_training_run(tmp_path, planted):
    srv, accepted = socket.socket(), []
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.settimeout(1.0)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                accepted.append(srv.accept())
            except OSError:
                continue
    threading.Thread(target=serve, daemon=True).start()
    out = tmp_path / "run"
    out.mkdir()
    (out / "planted.txt").write_text(SECRET)  # in the run's own output directory too
    rows = attacks([str(planted / ".netrc"), str(out / "planted.txt")], srv.getsockname()[1], os.getpid())
    data, held = tmp_path / "attacks.jsonl", tmp_path / "held.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"attack {k}", "tests": v}) + "\n" for k, v in rows.items()))
    held.write_text(json.dumps({"prompt": "benign", "tests": "print(1)"}) + "\n")
    env = {**engine_env(), "HF_TOKEN": SECRET, "WANDB_API_KEY": SECRET}
    cmd = train_cmd(out, "train.steps=1", "algorithm.sample.n=2", f"train.prompts_per_step={len(rows)}",
                    f"data.path={data}", f"data.eval_path={held}", "data.limit=null",
                    "algorithm.env.use=python_sandbox", "algorithm.env.max_turns=2",
                    "algorithm.env.max_total_tokens=700", "algorithm.env.code_blocks=false",
                    "algorithm.env.timeout_s=2", "algorithm.env.max_output_chars=400",
                    "algorithm.env.stop_when_passed=false", "rewards=null",
                    "train.save_every=1", model=eos_model(BUILD / "test-models" / "tiny-eos-v1"))
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    finally:
        stop.set()
        srv.close()
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [r["step"] for r in metrics(out) if r.get("kind") == "train"] == [1]
    done = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    seen = {k: "\n".join(r["completion"] for r in done if f"attack {k}<|im_end|>" in r["prompt"]) for k in rows}
    assert all(seen.values()), sorted(k for k, v in seen.items() if not v)  # every attack ran in the run
    assert seen["secrets"].count("read FileNotFoundError") >= 2 and "LEAK" not in seen["secrets"]
    assert "env ['HOME', 'PATH', 'PWD']" in seen["secrets"] and "home False sys False" in seen["secrets"]
    assert "procs ['/proc/1'] b'PATH=/usr/bin:/bin\\x00HOME=/tmp\\x00PWD=/tmp\\x00'" in seen["secrets"]  # its own only
    assert "kill ProcessLookupError" in seen["secrets"] and "write OSError" in seen["secrets"]
    assert "connect" in seen["secrets"] and accepted == []  # refused or unreachable; the server saw no one
    assert "fill ENOSPC" in seen["fill_tmp"]
    assert "bytes cut" in seen["flood"] and len(seen["flood"]) < 2_000  # 2 samples x 1 turn x a 400-byte cut
    assert "timed out" in seen["sleep"]
    assert "BlockingIOError" in seen["fork_bomb"] or "timed out" in seen["fork_bomb"]
    assert any(p.name.startswith("checkpoint") or p.name == "final" for p in out.iterdir())  # nothing lost
    for p in out.rglob("*"):
        if p.is_file() and p.suffix in {".jsonl", ".json", ".yaml", ".log", ".txt", ".md"} and p.name != "planted.txt":
            assert SECRET not in p.read_text(errors="replace"), p
