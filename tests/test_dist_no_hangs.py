"""No rank waits for another: 2 gloo ranks on the bandit, with a policy that behaves like ZeRO 3.

``Zero3Bandit`` all-reduces once per forward with gradient, once per backward and once in
``optimizer_step`` (as ZeRO 3 gathers weights per forward and reduces gradients per backward), sums
its totals over ranks and agrees on the skip flag, as the engine's policy does. Every case below
gave the ranks different work before the step agreed on it (a rank returning early, fewer
micro-batches, a micro-batch loop stopped early): one rank then waited in a collective the other
never entered. The process group's timeout (``timeout_s``, as ``engine.collective_timeout_s``) bounds
every wait, so a regression fails with a timeout error instead of hanging the suite.
"""

import time

import pytest
import torch

from policyzoo.engine import dist
from policyzoo.engine.dist import DistCollective
from policyzoo.step import train_step
from policyzoo.testing.bandit import Bandit, bandit_catalog, bandit_run, step_settings
from policyzoo.testing.ranks import on_ranks

ALWAYS, MIXED = 0, 1  # question 0: both candidates right (constant groups); 1: one right, one wrong
DAPO = {"base": "dapo", "sample": {"max_tokens": 32}, "reward": [{"use": "overlong_penalty", "cache": 8}]}
TIMEOUT_S = 20.0


class Zero3Bandit(Bandit):
    """The bandit with the collectives of a ZeRO-3 trainer (counted in ``calls``)."""

    collective = DistCollective()

    def __init__(self, *a, nan_at: int | None = None, **kw):
        super().__init__(*a, **kw)
        self.calls = {"forward": 0, "backward": 0}
        self.nan_at = nan_at  # 1-based forward with grad whose log-probs are NaN (this rank)

    def _gather_weights(self, what: str):
        self.calls[what] += 1
        torch.distributed.all_reduce(torch.ones(1))

    def logprobs(self, rollout, *, grad, entropy=False, entropy_grad=False):
        if grad:
            self._gather_weights("forward")
        lp, ent = super().logprobs(rollout, grad=grad, entropy=entropy, entropy_grad=entropy_grad)
        if grad and self.calls["forward"] == self.nan_at:
            lp = lp + float("nan")
        return lp, ent

    def backward(self, loss, value_loss=None):
        self._gather_weights("backward")
        super().backward(loss, value_loss)

    def optimizer_step(self, skip=False):
        return super().optimizer_step(skip=dist.any_rank(skip))

    def reduce_totals(self, totals):
        from policyzoo.engine.lm_policy import LMPolicy

        return LMPolicy.reduce_totals(self, totals)


def bandit(**kw):
    return Zero3Bandit([[3, 5], [3, 5]], [[True, True], [True, False]], optimizer="sgd", lr=0.1, **kw)


def stream(b, questions):
    rows = {q: {"prompt": f"question {q}", "question": q, "scores": b.scores[q].tolist()} for q in (0, 1)}
    return lambda: [dict(rows[q]) for q in questions]


def _one_rank_filters_everything(rank, world):
    # DAPO's dynamic sampling drops constant groups: rank 1 holds only ALWAYS prompts, so its 3
    # rounds keep nothing (train_on_fewer); rank 0 keeps its MIXED groups.
    run = bandit_run(DAPO, bandit_catalog())
    b = bandit()
    m = train_step(run, b, stream(b, [MIXED, MIXED] if rank == 0 else [ALWAYS, ALWAYS]), seed=0,
                   settings=step_settings(run))
    return m, b.calls, b.theta.detach().clone()


def _cases(rank, world):
    return {"filtered": _one_rank_filters_everything(rank, world), "uneven": _uneven_micro_batches(rank, world),
            "nan": _nan_on_rank_1(rank, world)}


@pytest.fixture(scope="module")
def two_ranks():
    """One pair of processes runs the three cases in turn (each one a hang before the step agreed)."""
    return on_ranks(_cases, timeout_s=TIMEOUT_S)


def test_a_rank_that_kept_no_row_skips_the_step_on_every_rank(two_ranks):
    (m0, calls0, theta0), (m1, calls1, theta1) = (r["filtered"] for r in two_ranks)
    assert m1["rows"] == 0 and m0["rows"] == 16  # 2 MIXED groups x G 8 kept on rank 0 only
    assert m0["skipped"] == m1["skipped"] == 1
    assert m0["skip_reason"] == m1["skip_reason"] == "no rows kept by the filters on rank 1"
    assert calls0 == calls1 == {"forward": 0, "backward": 0}  # neither rank entered the update
    torch.testing.assert_close(theta0, bandit().theta.detach())  # no weight moved
    torch.testing.assert_close(theta1, bandit().theta.detach())


def _uneven_micro_batches(rank, world):
    # one sampling round: rank 0 keeps 2 MIXED groups (16 rows), rank 1 1 group (8 rows). With 16
    # micro-batches rank 0 runs 16 of one row, rank 1 8 of one row plus 8 padding ones.
    run = bandit_run(DAPO, bandit_catalog())
    out = []
    for micro in (16, 1):
        b = bandit()
        theta = b.theta.detach().clone()
        m = train_step(run, b, stream(b, [MIXED, MIXED] if rank == 0 else [ALWAYS, MIXED]), seed=0,
                       settings=step_settings(run, max_sample_rounds=1, micro_batches=micro))
        out.append((m, dict(b.calls), b.theta.detach() - theta))
    return out


def test_ranks_with_fewer_rows_run_padding_micro_batches_of_zero_gradient(two_ranks):
    r0, r1 = (r["uneven"] for r in two_ranks)
    (m0, calls0, _), (m1, calls1, _) = r0[0], r1[0]
    assert (m0["rows"], m1["rows"]) == (16, 8)
    assert m0["skipped"] == m1["skipped"] == 0
    assert calls0 == calls1 == {"forward": 16, "backward": 16}  # the same ZeRO-3 gathers on both ranks
    assert (m0["micro_batches"], m1["micro_batches"]) == (16, 8)  # real ones: rank 1 ran 8 padding more
    for r in (r0, r1):  # the padding changed nothing: the update equals the one-micro-batch update
        d16, d1 = r[0][2], r[1][2]
        assert float(d1.abs().max()) > 1e-3
        torch.testing.assert_close(d16, d1, rtol=1e-6, atol=1e-7)
        assert r[0][0]["loss"] == pytest.approx(r[1][0]["loss"], rel=1e-6, abs=1e-8)


def _nan_on_rank_1(rank, world):
    # 2 micro-batches each; rank 1's first forward gives NaN log-probs. Every rank stops at the same
    # micro-batch, before its backward, and skips the optimizer step.
    run = bandit_run(DAPO, bandit_catalog())
    b = bandit(nan_at=1 if rank == 1 else None)
    theta = b.theta.detach().clone()
    m = train_step(run, b, stream(b, [MIXED, MIXED]), seed=0,
                   settings=step_settings(run, max_sample_rounds=1, micro_batches=2))
    return m, b.calls, b.theta.detach() - theta


def test_a_fault_on_one_rank_stops_every_rank_at_the_same_micro_batch(two_ranks):
    (m0, calls0, d0), (m1, calls1, d1) = (r["nan"] for r in two_ranks)
    assert m0["skipped"] == m1["skipped"] == 1
    assert m1["skip_reason"] == "non-finite logprobs" and m1["skip_groups"]  # rank 1 names its rows
    assert m0["skip_reason"] == "non-finite log-probs or loss on rank 1"
    assert calls0 == calls1 == {"forward": 1, "backward": 0}
    assert float(d0.abs().max()) == float(d1.abs().max()) == 0.0


def _slow_rank_1(rank, world, marker):
    run = bandit_run(DAPO, bandit_catalog())
    b = bandit()
    prompts = stream(b, [MIXED, MIXED])

    def slow():  # rank 1 samples until rank 0 has given up waiting (a stuck engine, a slow reward)
        deadline = time.monotonic() + 120
        while rank == 1 and not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        return prompts()
    try:
        train_step(run, b, slow, seed=0, settings=step_settings(run, max_sample_rounds=1))
    except dist.CollectiveTimeout as e:
        return type(e).__name__, str(e)
    finally:
        if rank == 0:
            marker.touch()
    return "finished", ""


def test_a_wait_past_the_timeout_is_an_error_naming_the_rank_and_the_phase(tmp_path):
    (kind0, msg0), (kind1, msg1) = on_ranks(_slow_rank_1, tmp_path / "rank0-gave-up", timeout_s=2.0)
    assert kind0 == "CollectiveTimeout"
    assert "error at rank 0 of 2, agreeing on the rows kept (after sampling):" in msg0
    assert "engine.collective_timeout_s = 2 s" in msg0 and "--resume" in msg0
    # rank 1 arrives only after rank 0 gave up: its collective fails too, naming its own rank
    assert kind1 == "CollectiveTimeout" and "rank 1 of 2, agreeing on the rows kept" in msg1
