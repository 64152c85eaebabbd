"""Run by tests/test_env_engine.py in its own process (vLLM in-process mode patches globals):
multi-turn episodes of a scripted environment on the tiny model, with vLLM and with the
transformers fallback. Prints one JSON line with what the test asserts on."""

import json
import sys
import types

from policyzoo.engine.process import setup_process

setup_process(threads=None)

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from policyzoo import Env, Episode, Observation, assemble, hookimpl, use  # noqa: E402
from policyzoo.catalog import load_catalog  # noqa: E402
from policyzoo.config_sections import EngineSettings, ModelSettings, TrainSettings  # noqa: E402
from policyzoo.contract import StepBatch  # noqa: E402
from policyzoo.engine.lm_policy import LMPolicy  # noqa: E402
from policyzoo.engine.models import resolve_model  # noqa: E402
from policyzoo.engine.rollout.hf import HFRollout  # noqa: E402
from policyzoo.engine.rollout.vllm_engine import VLLMRollout  # noqa: E402
from policyzoo.engine.sync import WeightSync  # noqa: E402
from policyzoo.engine.trainer.deepspeed_trainer import Trainer  # noqa: E402
from policyzoo.engine.trainer.modeling import pack  # noqa: E402
from policyzoo.engine.trainer.prefix import token_logprobs  # noqa: E402
from policyzoo.step import StepSettings, micro_loss, prepare, step_totals, train_step  # noqa: E402
from policyzoo.step.episodes import run_episodes  # noqa: E402

ANSWERS = [[{"role": "tool", "content": "4"}], [{"role": "user", "content": "ok"}]]


class ScriptedEpisode(Episode):
    """Turn 1 -> a tool message "4" (per-turn reward 0.5), turn 2 -> a user message "ok", turn 3 -> done."""

    def __init__(self, row):
        super().__init__(row)
        self.seen = []

    def step(self, turn_text, turn_ids):
        self.seen.append(list(turn_ids))
        k = len(self.seen) - 1
        if k < len(ANSWERS):
            return Observation(messages=ANSWERS[k], reward=0.5 if k == 0 else None, tool_call=k == 0)
        return Observation(done=True)

    def reward(self):
        return float(sum(self.seen[0]) % 5)  # differs between samples: advantages are not all 0


class Scripted(Env):
    """A scripted environment for the engine tests. Source: none, a test fixture."""

    name = "scripted"

    def env(self, row):
        episode = ScriptedEpisode(row)
        EPISODES.append(episode)
        return episode


EPISODES: list = []
info = resolve_model(sys.argv[1])
hf = AutoModelForCausalLM.from_pretrained(str(info.path), dtype=torch.float32).eval()
rows = [{"prompt": [{"role": "user", "content": "1+1="}], "answer": "2"},
        {"prompt": [{"role": "user", "content": "What is 12 plus 30?"}], "answer": "42"}]
T = 0.7


class Recording(LMPolicy):
    def generate_tokens(self, contexts, max_tokens, temperature, seeds, top_p=1.0):
        CALLS.append({"contexts": [list(c) for c in contexts], "max_tokens": list(max_tokens)})
        return super().generate_tokens(contexts, max_tokens, temperature, seeds, top_p)


def trainer_logprobs(rollout, grad=False):
    ids, attn, pos, t = pack(rollout, info.pad_token_id, "cpu")
    with torch.set_grad_enabled(grad):
        logits = hf(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=t + 1).logits[:, :-1]
        return token_logprobs(logits, ids[:, -t:], rollout.temperature, False)[0]


def episodes(engine):
    EPISODES.clear()
    CALLS.clear()
    policy = Recording(engine, None, WeightSync(engine, None, check=False, tolerance=1.0, timeout_s=60.0, check_ids=[]))
    env = Scripted(max_turns=3, max_total_tokens=200)
    r = run_episodes(policy, env, rows, n=2, max_tokens=6, temperature=T, seed=3)
    seen = [e.seen for e in EPISODES]
    calls = [dict(c) for c in CALLS]
    again = run_episodes(policy, env, rows, n=2, max_tokens=6, temperature=T, seed=3)
    lp = trainer_logprobs(r)
    m = r.response_mask
    return r, {"ids": r.response_ids.tolist(), "mask": m.tolist(), "prompt_ids": r.prompt_ids, "seen": seen,
               "calls": calls, "lp_diff": float(((lp - r.rollout_logprobs).abs() * m).max()),
               "env_lp_zero": bool((r.rollout_logprobs[~m] == 0).all()),
               "turn_rewards": r.turn_rewards.tolist(), "env_rewards": r.env_rewards.tolist(),
               "turns": r.turns.tolist(), "stop": r.stop_reasons, "truncated": r.truncated.tolist(),
               "same_seed_same": torch.equal(r.response_ids, again.response_ids)}


CALLS: list = []
# as in a run: DeepSpeed first, then vLLM in the same process
trainer = Trainer(info, ModelSettings(), TrainSettings(lr=1e-3, weight_decay=0.0, grad_clip=1.0),
                  EngineSettings(zero_stage=0, critic_lr=1e-3),
                  need_ref=False, need_critic=False)
vllm_engine = VLLMRollout(info, "float32", max_model_len=512, seed=0)
r, out = episodes(vllm_engine)
# The loss of a step on the episodes (rloo without its KL: no reference model here): env tokens
# get no gradient, model tokens do.
plugin = types.SimpleNamespace(__name__="scripted_env",
                               register_components=hookimpl(lambda register: register(Scripted)))
catalog = load_catalog(autoload=False, extra=[plugin])
run = assemble({"base": "rloo", "kl": None, "sample": {"n": 2, "max_tokens": 6, "temperature": T},
                "env": {"use": "scripted", "max_turns": 3, "max_total_tokens": 200}},
               rewards=(use("env_reward"),), catalog=catalog)
batch, _ = prepare(run, StepBatch(r, r.env_rewards.clone()))
lp = trainer_logprobs(r, grad=True)
loss, _ = micro_loss(run, batch, lp, step_totals(batch))
(grad,) = torch.autograd.grad(loss, lp)
m = r.response_mask
out["grad_env_max"] = float(grad[~m].abs().max())
out["grad_model_nonzero"] = int((grad[m] != 0).sum())
out["model_tokens"] = int(m.sum())
# One training step on the episodes through the real path: DeepSpeed update, weight sync, sync check.
policy = LMPolicy(vllm_engine, trainer, WeightSync(vllm_engine, trainer, check=True, tolerance=1e-4, timeout_s=300.0,
                                                   check_ids=r.prompt_ids[0]))
step = train_step(run, policy, lambda: rows, seed=1, settings=StepSettings())
out["step"] = {k: v for k, v in step.items() if isinstance(v, (int, float))}
_, out["hf"] = episodes(HFRollout(info, "float32"))
print("RESULT " + json.dumps(out))
