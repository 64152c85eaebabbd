"""Example parameters and call context for components the contract suite cannot build from
defaults alone (a user function path, a reward-model folder) or cannot call without an engine
(``sample`` components get the tabular bandit as their policy)."""

from __future__ import annotations

from pathlib import Path

from .bandit import Bandit


def example_reward(prompts, completions, **columns):
    """A user reward for the contract suite: completion length in characters / 100 (TRL-style
    signature). Source: none, a test fixture."""
    return [len(c) / 100 for c in completions]


def tiny_reward_model(workdir: Path) -> dict:
    """Write a 1-layer Llama sequence-classification model and a word-level tokenizer into
    ``workdir/reward_model`` (random weights, ~50 kB) and return ``reward_model`` parameters."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

    path = Path(workdir) / "reward_model"
    if not (path / "config.json").exists():
        words = ["[PAD]", "[UNK]", "[EOS]", "What", "is", "The", "answer", "+", "?", "."]
        tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                       eos_token="[EOS]")
        fast.save_pretrained(path)
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=1, num_key_value_heads=1, num_labels=1, pad_token_id=0,
                          max_position_embeddings=64)
        LlamaForSequenceClassification(cfg).save_pretrained(path)
    return {"path": str(path), "max_length": 32}


_SERVER: dict = {}


def scoring_server() -> str:
    """``http://127.0.0.1:PORT`` of a small real HTTP server in this process (a daemon thread, bound to
    127.0.0.1 only, shut down at exit), for the remote rewards in the contract suite: ``POST .../score``
    answers ``{"rewards": [len(completion) / 100, ...]}`` (``remote_reward``'s protocol) and ``POST
    .../chat/completions`` a chat completion whose text rates responses 1 to 64 at 5 each (``1: 5``
    ... ``64: 5``; ``llm_judge`` reads its last number, ``group_judge`` one line per response)."""
    if "url" in _SERVER:
        return _SERVER["url"]
    import atexit
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the http.server name
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path.endswith("/score"):
                reply = {"rewards": [len(str(c)) / 100 for c in body.get("completions", [])]}
            else:
                text = "\n".join(f"{k}: 5" for k in range(1, 65))
                reply = {"choices": [{"message": {"role": "assistant", "content": text}}]}
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, name="policyzoo-contract-server", daemon=True).start()
    atexit.register(server.shutdown)
    _SERVER["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    return _SERVER["url"]


#: (slot, name) -> callable(workdir) -> parameters, for built-ins that need them.
EXAMPLES = {
    ("reward", "function"): lambda workdir: {"function": "policyzoo.testing.examples:example_reward"},
    ("reward", "reward_model"): tiny_reward_model,
    ("reward", "remote_reward"): lambda workdir: {"url": f"{scoring_server()}/score", "retries": 0, "timeout": 10},
    ("reward", "llm_judge"): lambda workdir: {"base_url": f"{scoring_server()}/v1", "model": "judge", "retries": 0,
                                              "timeout": 10},
    ("reward", "group_judge"): lambda workdir: {"base_url": f"{scoring_server()}/v1", "model": "judge", "retries": 0,
                                                "timeout": 10},
}


#: the data row an ``env`` component is reset from in the contract suite
ENV_ROW = {"prompt": [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "What is 1 + 2?"}],
           "answer": "3"}


def context(slot: str):
    """``(policy, prompts)`` for a slot's call: a small bandit and 2 prompt rows for ``sample``;
    for ``env`` no policy and :data:`ENV_ROW`."""
    if slot == "env":
        return None, [dict(ENV_ROW)]
    if slot != "sample":
        return None, None
    bandit = Bandit([[2, 3, 4], [1, 5, 2]], [[True, False, False], [False, True, False]], seed=0)
    return bandit, bandit.prompts(2)
