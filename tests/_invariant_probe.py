"""Run by tests/test_rollout_invariant.py in its own process (vLLM in-process mode patches globals).

Samples with vLLM from the model folder given (vocabulary larger than the tokenizer's) with stop
strings, single-turn (``generate``) and multi-turn (``generate_tokens``); prints one JSON line of
the rows (trained ids, text, finished, max_tokens), the stop strings and the EOS ids."""

import json
import sys

from policyzoo.engine.process import setup_process

setup_process(threads=None)

from policyzoo.engine.models import resolve_model  # noqa: E402
from policyzoo.engine.rollout.vllm_engine import VLLMRollout  # noqa: E402

info = resolve_model(sys.argv[1])
engine = VLLMRollout(info, "float32", max_model_len=256, seed=0)
STOP = [" ", "e", "a", "o"]
rows = [{"prompt": "2+2="}, {"prompt": "hello there"}]
r = engine.generate(rows, n=8, max_tokens=16, temperature=1.5, seed=5, stop=STOP)
out = [{"ids": r.response_ids[i][r.response_mask[i]].tolist(), "text": r.completions[i], "max_tokens": 16,
        "finished": not bool(r.truncated[i])} for i in range(len(r))]
tok = info.tokenizer
gen = engine.generate_tokens([tok("hi").input_ids, tok("a b").input_ids], [16, 5], 1.5, [1, 2], stop=STOP)
out += [{"ids": g.ids, "text": g.text, "max_tokens": m, "finished": g.stopped} for g, m in zip(gen, [16, 5])]
print(json.dumps({"rows": out, "stop": STOP, "eos": list(info.eos_token_ids)}))
