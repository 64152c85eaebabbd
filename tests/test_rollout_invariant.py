"""One invariant for every rollout path: the text a reward reads is the decoding of the trained ids.

Checked on random tiny models (several seeds, a vocabulary larger than the tokenizer's whose extra
rows are scaled up so an unmasked sampler would draw them often), random stop strings, high
temperatures: on each row, ``completion == decode(trained ids)``, no trained id the tokenizer
cannot decode, an EOS only as the last trained token, the stop rule of
``policyzoo.engine.rollout.finish`` (the row ends at the token completing the first stop string),
and a row that ended on neither is truncated at ``max_tokens``. The transformers engine here (both
``generate`` and the episodes' ``generate_tokens``); vLLM in ``_invariant_probe.py`` (one run).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _engine_helpers import ROOT, engine_env

from policyzoo.engine.rollout.finish import finish, stop_cut

EXTRA = 32  # model rows beyond the tokenizer


def padded_vocab_model(folder: Path, seed: int) -> Path:
    """A tiny Llama whose vocabulary has EXTRA ids more than its tokenizer, their rows scaled x 30."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from policyzoo.testing.tiny import build_tiny_model

    build_tiny_model(folder, seed=seed)
    model = LlamaForCausalLM.from_pretrained(str(folder))
    n = len(AutoTokenizer.from_pretrained(str(folder)))
    model.resize_token_embeddings(n + EXTRA, mean_resizing=False)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        emb = model.get_input_embeddings().weight
        emb[n:] = 30 * torch.randn(EXTRA, emb.shape[1], generator=g) * emb[:n].std()
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


def check_row(tok, ids: list[int], text: str, eos: set[int], stop: list[str], max_tokens: int,
              finished: bool) -> None:
    """The invariant on one row (``ids``: the trained ids)."""
    assert text == tok.decode(ids, skip_special_tokens=True)
    assert all(0 <= t < len(tok) for t in ids), "an id the tokenizer cannot decode was sampled"
    assert not any(t in eos for t in ids[:-1]), "a token after the end of sequence is trained"
    holds = [s for s in stop if s in text]
    if holds:  # cut at the token that completes the first stop string: the prefix before it holds none
        assert not any(s in tok.decode(ids[:-1], skip_special_tokens=True) for s in stop)
        assert finished
    elif not (ids and ids[-1] in eos):
        assert not finished and len(ids) == max_tokens


class _Pieces:
    """A tokenizer whose ids decode to fixed pieces (one holds two characters)."""

    pieces = {0: "x", 1: "ab", 2: "c", 3: "<eos>"}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.pieces[i] for i in ids if not (skip_special_tokens and i == 3))


def test_finish_cuts_at_the_token_holding_the_stop_string_for_ids_and_text_alike():
    tok = _Pieces()
    # stop "a": token 1 ("ab") completes it; ids and text end there, the text with the "b" of that token
    assert finish(tok, [0, 1, 2, 2], {3}, ["a"], 8) == ([0, 1], "xab", True, False)
    assert stop_cut(tok, [0, 1, 2], ["bc"]) == 3  # "xabc": the string spans tokens 1 and 2
    # EOS first: the response ends at the EOS (kept, not in the text); what follows (padding) is dropped
    assert finish(tok, [0, 3, 3, 3], {3}, ["c"], 8) == ([0, 3], "x", True, False)
    # neither: truncated exactly at max_tokens, finished False
    assert finish(tok, [0, 2, 0], {3}, ["q"], 3) == ([0, 2, 0], "xcx", False, True)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from policyzoo.engine.models import resolve_model
    from policyzoo.engine.rollout.hf import HFRollout

    out = []
    for seed in (1, 2):
        folder = padded_vocab_model(tmp_path_factory.mktemp(f"padded{seed}"), seed)
        info = resolve_model(str(folder))
        assert info.vocab_size == len(info.tokenizer) + EXTRA and len(info.undecodable_ids) == EXTRA
        out.append(HFRollout(info, "float32"))
    return out


def test_unmasked_sampling_would_draw_undecodable_ids(engines):
    # the premise: without the mask these models sample ids >= len(tokenizer) (the test can fail)
    engine = engines[0]
    x = torch.tensor([engine.tokenizer("hello").input_ids])
    torch.manual_seed(0)
    out = engine.model.generate(x, attention_mask=torch.ones_like(x), do_sample=True, max_new_tokens=16,
                                num_return_sequences=4, pad_token_id=engine.info.pad_token_id, eos_token_id=[])
    assert bool((out[:, x.shape[1]:] >= len(engine.tokenizer)).any())


@pytest.mark.parametrize("seed", range(3))
def test_transformers_engine_keeps_the_invariant(engines, seed):
    rnd = random.Random(seed)
    engine = engines[seed % len(engines)]
    tok, eos = engine.tokenizer, set(engine.info.eos_token_ids)
    stop = rnd.sample([" ", "e", "a", "\n", "o", "é", "t"], 3)
    max_tokens = rnd.choice([6, 12, 20])
    rows = [{"prompt": rnd.choice(["2+2=", "hello there", "say a word"])} for _ in range(2)]
    r = engine.generate(rows, 4, max_tokens, rnd.choice([1.0, 1.5]), seed, stop=stop)
    for i in range(len(r)):
        ids = r.response_ids[i][r.response_mask[i]].tolist()
        check_row(tok, ids, r.completions[i], eos, stop, max_tokens, not bool(r.truncated[i]))
    gen = engine.generate_tokens([tok("hi").input_ids, tok("a b").input_ids], [max_tokens, 5], 1.5,
                                 [seed, seed + 1], stop=stop)
    for g, m in zip(gen, [max_tokens, 5]):
        check_row(tok, g.ids, g.text, eos, stop, m, g.stopped)


def test_vllm_engine_keeps_the_invariant(tmp_path):
    folder = padded_vocab_model(tmp_path / "padded", 3)
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "_invariant_probe.py"), str(folder)], env=engine_env(),
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    eos = set(res["eos"])
    assert len(res["rows"]) == 16 + 2
    for row in res["rows"]:
        check_row(tok, row["ids"], row["text"], eos, res["stop"], row["max_tokens"], row["finished"])
    assert any(any(s in row["text"] for s in res["stop"]) for row in res["rows"])  # the stop rule was exercised
