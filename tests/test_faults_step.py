"""Non-finite log-probs and losses in the step (bandit test bed; the engine runs the same step).

Each fault must skip the whole update (weights, optimizer state and sampler untouched), report
``skipped = 1``, the reason, and the offending groups and prompts; the next clean step trains.
"""

import math

import pytest
import torch

from policyzoo.step import train_step
from policyzoo.testing.bandit import Bandit, bandit_run, step_settings

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _bandit():
    # 2 questions x 2 candidates of one token each; question 0: candidate 0 right; question 1:
    # candidate 1 right; uniform start, Adam lr 0.5 (any clean step moves theta)
    return Bandit([[1, 1], [1, 1]], scores=[[1.0, 0.0], [0.0, 1.0]], optimizer="adam", lr=0.5, seed=0)


def _poison(bandit, method: str, rows: list[int], value: float, calls: list[int]):
    """Make ``bandit.method`` return ``value`` in column 0 of ``rows`` on its ``calls``-th calls
    (counting from 0; grad-mode calls only for ``logprobs``)."""
    original = getattr(bandit, method)
    count = [0]

    def poisoned(rollout, **kw):
        out = original(rollout, **kw)
        if method == "logprobs" and not kw.get("grad"):
            return out
        lp = out[0] if isinstance(out, tuple) else out
        hit = count[0] in calls
        count[0] += 1
        if hit:
            lp = lp + torch.zeros_like(lp).index_put((torch.tensor(rows), torch.tensor([0] * len(rows))),
                                                     torch.tensor(value))
        return (lp, out[1]) if isinstance(out, tuple) else lp
    setattr(bandit, method, poisoned)


@pytest.mark.parametrize("method, value, reason", [
    ("logprobs", math.nan, "non-finite logprobs"),
    ("logprobs", -math.inf, "non-finite logprobs"),
    ("ref_logprobs", math.nan, "non-finite loss"),  # k3 KL in the loss turns NaN: the loss is NaN
])
def test_a_non_finite_value_skips_the_update_and_names_the_rows(catalog, method, value, reason):
    bandit = _bandit()
    run = bandit_run("grpo", catalog)  # GRPO: k3 KL in the loss (beta 0.04), so ref_logprobs enter the loss
    _poison(bandit, method, rows=[5], value=value, calls=[0])
    prompts = lambda: bandit.prompts(2)  # noqa: E731
    theta0, sampler0 = bandit.theta.detach().clone(), bandit.sampler_theta.clone()
    m = train_step(run, bandit, prompts, seed=0, settings=step_settings(run))
    assert m["skipped"] == 1 and m["skip_reason"] == reason
    # G = 8 samples per prompt: row 5 is sample 5 of the first prompt, group 0. A NaN log-prob is
    # caught per row; a NaN loss only for its micro-batch (one micro-batch: both groups).
    assert m["skip_groups"] == ([0] if method == "logprobs" else [0, 1])
    assert m["skip_prompts"][0].startswith("question ")
    assert torch.equal(bandit.theta.detach(), theta0) and torch.equal(bandit.sampler_theta, sampler0)
    assert len(bandit.opt.state) == 0 and bandit.theta.grad is None  # no Adam moment, no leftover grad
    assert "sync_max_change" not in m  # nothing pushed to the sampler
    m = train_step(run, bandit, prompts, seed=1, settings=step_settings(run))  # clean again: it trains
    assert m["skipped"] == 0 and not torch.equal(bandit.theta.detach(), theta0)
    assert torch.isfinite(bandit.theta).all()


def test_a_fault_in_the_second_micro_batch_discards_the_first_ones_gradient(catalog):
    bandit = _bandit()
    run = bandit_run("grpo", catalog)
    # two micro-batches of 8 rows; the second grad-mode call (micro-batch 2) has a NaN in its row 1
    _poison(bandit, "logprobs", rows=[1], value=math.nan, calls=[1])
    theta0 = bandit.theta.detach().clone()
    m = train_step(run, bandit, lambda: bandit.prompts(2), seed=0, settings=step_settings(run, micro_batches=2))
    # micro-batch 2 = rows 8-15 = the second prompt's group 1
    assert m["skipped"] == 1 and m["skip_reason"] == "non-finite logprobs" and m["skip_groups"] == [1]
    assert torch.equal(bandit.theta.detach(), theta0) and bandit.theta.grad is None


def test_non_finite_weights_are_never_written_over_the_last_checkpoint(tmp_path):
    from types import SimpleNamespace

    from policyzoo.engine.run.resume import write_checkpoint
    from policyzoo.engine.rundir import RunDir
    from policyzoo.errors import TrainingError

    class Trainer:  # finite at step 2, NaN at step 4
        finite, saved = True, []

        def weights_finite(self):
            return self.finite

        def save(self, folder, client_state):
            self.saved.append(client_state["policyzoo"]["step"])

        def schedule_state(self):
            return {}

    from policyzoo.run_config import load_config

    session = SimpleNamespace(trainer=Trainer(), rundir=RunDir(tmp_path), fingerprint={},
                              config=load_config(None, "grpo", ["engine.keep_checkpoints=2"]),
                              run=SimpleNamespace(state_dict=dict))
    session.rundir.ckpt.mkdir(parents=True)
    write_checkpoint(session, 2, 2, rows=8)
    session.trainer.finite = False
    with pytest.raises(TrainingError, match="NaN or inf.*last complete checkpoint: .*step-000002"):
        write_checkpoint(session, 4, 4, rows=8)
    assert session.trainer.saved == [2]
    assert session.rundir.latest()[1]["step"] == 2
    assert [p.name for p in session.rundir.ckpt.iterdir() if p.is_dir()] == ["step-000002"]


def test_a_raising_reward_component_is_named(catalog):
    import types

    from pydantic import Field

    from policyzoo import use
    from policyzoo.assembly import assemble
    from policyzoo.catalog import load_catalog
    from policyzoo.contract import Reward, hookimpl
    from policyzoo.errors import ComponentError

    class Boom(Reward):
        name = "boom"

        class Params(Reward.Params):
            weight: float = Field(1.0, description="weight")

        @hookimpl
        def reward(self, rollout):
            raise RuntimeError("scorer crashed")

    plugin = types.SimpleNamespace(__name__="boom_plugin",
                                   register_components=hookimpl(lambda register: register(Boom)))
    import policyzoo.testing.bandit as bandit_mod
    cat = load_catalog(autoload=False, extra=[bandit_mod, plugin])
    run = assemble("grpo", rewards=(use("bandit_correct"), use("boom")), catalog=cat)
    bandit = _bandit()
    msg = r"(?s)reward component boom\(weight=1.0\).*raised RuntimeError: scorer crashed"
    with pytest.raises(ComponentError, match=msg):
        train_step(run, bandit, lambda: bandit.prompts(2), seed=0, settings=step_settings(run))
    assert len(bandit.opt.state) == 0  # nothing was trained


def test_prompt_excerpts_show_the_rows_own_question_not_the_shared_system_prompt():
    from _engine_helpers import make_rollout

    r = make_rollout([[1, 2], [1, 3]], [[4], [5]])
    system = {"role": "system", "content": "Solve the arithmetic problem. Reply with the result only."}
    shot = [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "Answer: 2"}]
    r.rows = [{"prompt": [system, *shot, {"role": "user", "content": "What is 23 + 45?"}]}, {"prompt": "plain text"}]
    r.prompts = ["<|im_start|>system\nSolve the arithmetic problem...", "plain text"]
    assert r.prompt_excerpt(0) == "What is 23 + 45?"  # the last user message, not the system prompt or shot
    assert r.prompt_excerpt(0, 7) == "What is"
    assert r.prompt_excerpt(1) == "plain text"  # no chat messages: the prompt text
