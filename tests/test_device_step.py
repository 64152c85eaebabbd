"""The training step stays on the trainer's device (issue 46, item 3).

The hot path -- score the log-probs of a batch (reference without grad, policy with grad and entropy),
the advantages and the loss through the grpo bundle's components, backward -- runs here with the tiny
model's architecture and the batch on the ``meta`` device. A meta tensor has a shape and no data, so any
host copy inside the path fails the test: ``.cpu()``, ``.item()``, ``.tolist()``, ``float()``/``bool()`` of
a tensor raise, and a host tensor made without a device (``torch.zeros(k)``) raises when an op mixes it
with a meta one. Logging stays outside: the path returns device tensors, and
:func:`policyzoo.step.metrics.to_host` copies a step's metrics to the host at once.

The model runs with eager attention: transformers' sdpa mask builder itself reads the padding mask on
the host to decide whether it may skip the mask (``_ignore_causal_mask_sdpa``), a copy in transformers,
not in policyzoo.
"""

from __future__ import annotations

import pytest
import torch
from _engine_helpers import ROOT, tiny_model

import policyzoo
from policyzoo.contract import Rollout, StepBatch
from policyzoo.engine.trainer import checkpoint_io
from policyzoo.engine.trainer.logprob import ACCELERATOR_CHUNK_BYTES, CHUNK_BYTES, _chunks
from policyzoo.engine.trainer.scoring import Scoring, budget_rows, score_logprobs
from policyzoo.step import micro_loss, prepare
from policyzoo.step.loss import step_totals
from policyzoo.step.metrics import step_means, to_host

META = torch.device("meta")


def _model(device: torch.device):
    """The tiny model of ``policyzoo.testing.tiny`` (its config) built on ``device`` with eager attention."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(tiny_model()))
    config._attn_implementation = "eager"
    with device:
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return model.eval(), config


def _rollout(vocab: int) -> Rollout:
    """2 prompts (3 and 2 tokens) x 2 samples, 4 response tokens, rows of 3, 1, 4 and 2 real tokens."""
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    ids = torch.randint(1, vocab, (4, 4), generator=torch.Generator().manual_seed(0))
    return Rollout(prompt_ids=[[5, 6, 7], [5, 6, 7], [8, 9], [8, 9]], response_ids=ids, response_mask=mask,
                   rollout_logprobs=torch.where(mask, -1.0, 0.0), group_ids=torch.tensor([0, 0, 1, 1]),
                   truncated=torch.zeros(4, dtype=torch.bool), temperature=0.7)


def hot_path(run, model, rollout: Rollout, rewards: torch.Tensor, device: torch.device, share: bool, pad_id: int):
    """The step's device part: reference log-probs (no grad), advantages, the policy's log-probs and
    entropy (grad), the loss, backward. Returns the loss and the metrics, as the step has them."""
    r, rw = rollout.to(device), rewards.to(device)
    with torch.no_grad():
        ref = score_logprobs(model, r, pad_id, device, False, share)[0]
    batch, adv_metrics = prepare(run, StepBatch(r, rw, ref_logprobs=ref))
    lp, ent = score_logprobs(model, r, pad_id, device, True, share)
    loss, sums = micro_loss(run, batch, lp, step_totals(batch), ent)
    loss.backward()
    return loss, adv_metrics, sums


@pytest.mark.parametrize("share", [False, True], ids=["per-row", "shared-prompt"])
def test_the_step_hot_path_makes_no_host_copy(share):
    model, config = _model(META)
    run = policyzoo.assemble("grpo")
    loss, adv_metrics, sums = hot_path(run, model, _rollout(config.vocab_size), torch.tensor([1.0, 0.0, 0.0, 1.0]),
                                       META, share, config.pad_token_id)
    # everything the path produced is still on the device: the loss, each metric, each gradient
    assert loss.device == META and loss.shape == ()
    assert {k: v.device for k, v in adv_metrics.items() if isinstance(v, torch.Tensor)} == {
        "kl_ref": META, "kl_ref_row_mean": META, "advantage_mean": META}
    assert all(x.device == META for pair in sums.values() for x in pair if isinstance(x, torch.Tensor))
    assert {"ratio_mean", "entropy", "kl_loss", "clip_frac_low"} <= set(sums)
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.device == META for g in grads)
    # logging is outside the path: its one copy to the host is what a meta tensor refuses
    with pytest.raises(NotImplementedError, match="meta"):
        to_host(adv_metrics)


def test_a_host_copy_in_the_hot_path_fails_the_meta_test(monkeypatch):
    """The net works: the scoring of before this change (its result copied to the host with ``.cpu()``)
    makes the same path fail on meta tensors."""
    from policyzoo.engine.trainer import scoring

    real = scoring.score_logprobs

    def copied(*args, **kw):
        lp, ent = real(*args, **kw)
        return lp.cpu(), (None if ent is None else ent.cpu())

    model, config = _model(META)
    monkeypatch.setitem(globals(), "score_logprobs", copied)
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        hot_path(policyzoo.assemble("grpo"), model, _rollout(config.vocab_size), torch.ones(4), META, False,
                 config.pad_token_id)
    monkeypatch.setattr(scoring, "score_logprobs", copied)
    s = Scoring()
    s.pad_id, s.device, s.autocast, s.share_prompt = config.pad_token_id, META, False, False
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        s._logprobs(model, _rollout(config.vocab_size).to(META), False)


def test_a_host_tensor_made_without_a_device_fails_on_meta():
    """The other way a step leaves the device: a tensor created on the host and mixed in."""
    lp = torch.zeros(2, 3, device=META)
    with pytest.raises(RuntimeError, match="device"):
        torch.where(lp < 0, lp, torch.zeros(2, 3))


def test_rollout_to_keeps_a_host_mask_for_planning():
    r = _rollout(50).to(META)
    assert r.response_ids.device == META and r.response_mask.device == META
    # the lengths the length groups and token budgets plan from: 3, 1, 4, 2 real tokens (host, exact)
    assert r.mask_on_host().sum(-1).tolist() == [3, 1, 4, 2]
    half = r.select(torch.tensor([False, True, True, False]))
    assert half.mask_on_host().sum(-1).tolist() == [1, 4] and half.response_mask.device == META
    moved = StepBatch(_rollout(50), torch.zeros(4), advantages=torch.zeros(4, 4)).to(META)
    assert (moved.rewards.device, moved.advantages.device, moved.rollout.group_ids.device) == (META, META, META)
    assert moved.old_logprobs is None and moved.rollout.prompt_ids == [[5, 6, 7], [5, 6, 7], [8, 9], [8, 9]]


def test_step_metrics_reach_the_host_in_one_copy(monkeypatch):
    copies = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: copies.append(self.shape) or real(self))
    sums = {"a": torch.tensor(3.0, dtype=torch.float64), "b": torch.tensor(0.0, dtype=torch.float64), "loss": 0.75}
    counts = {"a": torch.tensor(4.0, dtype=torch.float64), "b": torch.tensor(0.0, dtype=torch.float64), "loss": 0.5}
    means = step_means(sums, counts)
    host = to_host({**means, "skipped": 0, "reason": "x"})
    # a: 3 / 4 = 0.75; b: count 0 -> 0.0; loss: 0.75 / 0.5 = 1.5 (numbers stay numbers)
    assert host == {"a": 0.75, "b": 0.0, "loss": 1.5, "skipped": 0, "reason": "x"}
    assert copies == [torch.Size([2])]  # one stacked copy for the two tensor metrics
    with pytest.raises(ValueError, match="not one number"):
        to_host({"v": torch.zeros(2)})


def test_scoring_chunks_follow_a_memory_budget():
    # 4 bytes x (t + 1) positions x vocab a row:
    # t = 1023, V = 152,064: 4 x 1024 x 152,064 = 622,854,144 B > 1 GiB / 2 -> 1 row
    assert budget_rows(1023, 152_064, 16) == 1
    # t = 127, V = 49,152: 4 x 128 x 49,152 = 25,165,824 B; 2^30 // that = 42 rows, capped at 16
    assert budget_rows(127, 49_152, 16) == 16
    # t = 127, V = 152,064: 77,856,768 B a row; 2^30 // that = 13 rows
    assert budget_rows(127, 152_064, 16) == 13
    # the log-prob chunks: 2^24 // (4 x 152,064) = 27 rows on the CPU; 2^28 // (4 x 152,064) = 441 on a GPU
    assert CHUNK_BYTES // (4 * 152_064) == 27 and ACCELERATOR_CHUNK_BYTES // (4 * 152_064) == 441
    assert list(_chunks(60, 152_064, torch.device("cpu")))[:2] == [(0, 27), (27, 54)]
    assert list(_chunks(600, 152_064, torch.device("cuda"))) == [(0, 441), (441, 600)]


def test_the_sync_checks_forward_keeps_one_position():
    model, _ = _model(torch.device("cpu"))
    seen = []
    model.lm_head.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    s = Scoring()
    s.engine, s.device = model, torch.device("cpu")
    ids = [5, 6, 7, 8, 9, 10]
    got = s.next_logprobs(ids)
    assert seen == [(1, 1, model.config.hidden_size)]  # the LM head saw one position, not 6
    with torch.no_grad():
        full = model(input_ids=torch.tensor([ids])).logits[0, -1].log_softmax(-1)
    torch.testing.assert_close(got, full, rtol=0, atol=1e-5)


class _Exporter(checkpoint_io.TrainerIO):
    """A trainer's export with two weights and a recorder of what it copied."""

    def __init__(self, stage: int):
        self.stage, self.lora, self.gathered, self.saved = stage, False, [], None
        w = {"a": torch.ones(2), "b": torch.zeros(3)}
        exporter = self

        class Module:
            def save_pretrained(self, folder, state_dict, safe_serialization):
                exporter.saved = state_dict

        class Engine:
            module = Module()

        class Tok:
            def save_pretrained(self, folder):
                pass

        self.engine, self.info = Engine(), type("Info", (), {"tokenizer": Tok()})()
        self._w = w

    def full_weights(self, streamed=None):
        import contextlib

        exporter = self

        @contextlib.contextmanager
        def cm():
            def walk():
                for n, t in exporter._w.items():
                    exporter.gathered.append(n)  # a gather every rank takes part in
                    yield n, t
            yield walk()
        return cm()


@pytest.mark.parametrize("stage", [0, 3])
def test_export_copies_the_weights_on_rank_0_only(monkeypatch, stage):
    for r in (0, 1):
        monkeypatch.setattr(checkpoint_io, "rank", lambda r=r: r)
        e = _Exporter(stage)
        e.export("unused")
        if r == 0:  # rank 0 copies both weights and writes them
            assert sorted(e.saved) == ["a", "b"] and e.saved["a"].tolist() == [1.0, 1.0]
        else:  # another rank writes nothing; at ZeRO 3 it walks every gather without keeping a copy
            assert e.saved is None
            assert e.gathered == (["a", "b"] if stage == 3 else [])


def test_shared_prompt_filler_calls_change_no_value_and_no_gradient():
    """At ZeRO 3 on several ranks the ranks agree on the model calls of shared-prompt scoring (each call
    gathers every layer with all ranks); a rank with fewer length groups adds filler calls."""
    from policyzoo.engine.trainer.prefix import model_calls, shared_prompt_logprobs

    model, config = _model(torch.device("cpu"))
    r = _rollout(config.vocab_size)
    # extents 3, 1, 4, 2: overhead 0 -> one group per distinct length, 3 of them wider than 1 token, + the
    # prompt pass = 4 calls; the default overhead (128 positions a call) -> one group padded to 4 -> 2 calls
    assert model_calls(r, overhead=0) == 4 and model_calls(r) == 2
    calls = []
    model.register_forward_pre_hook(lambda m, a, kw: calls.append(1), with_kwargs=True)

    def run(n):
        model.zero_grad()
        lp, _ = shared_prompt_logprobs(model, r, config.pad_token_id, torch.device("cpu"), False, calls=n)
        lp.sum().backward()
        return lp.detach(), [p.grad.clone() for p in model.parameters()]

    calls.clear()
    lp, grads = run(None)
    assert len(calls) == 2
    calls.clear()
    lp5, grads5 = run(5)
    assert len(calls) == 5  # 2 real calls and 3 fillers
    assert torch.equal(lp, lp5) and all(torch.equal(a, b) for a, b in zip(grads, grads5))  # bit for bit


@pytest.mark.engine_group
def test_zero3_on_two_ranks_shared_prompt_calls_agree_and_scoring_gathers_once_a_pass():
    import json
    import subprocess
    import sys

    from _engine_helpers import engine_env

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           str(ROOT / "tests" / "_share_zero3_probe.py"), str(tiny_model())]
    env = engine_env()
    env.pop("RANK", None)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))[7:])
    # rank 0: a 200-token row and seven 2-token rows split in 2 groups (7 x 1 + 128 + 199 + 128 < 8 x 199 + 128)
    # -> 3 calls; rank 1: eight 3-token rows, 1 group -> 2 calls; rank 1 adds a filler call
    assert out["partitioned"] and out["share_prompt"] is True and out["calls"] == [3, 2]
    assert out["no_grad_diff"] <= 1e-4 and out["grad_diff"] <= 1e-4  # fp32 forwards of other shapes
    assert out["skipped"] == 0
    assert out["check"] == [[None, True], [None, True]]
    assert out["one_rank_fails"] == [[True, False], [True, False]]  # the check agreed over the ranks
    # a no-grad pass of 4 chunks (2 rows each): one whole-model gather and no per-module fetch, against
    # a fetch per module and forward without it (counted, > 0), with bit-identical log-probs; training after
    assert out["pass_gathers"]["once"] == {"whole": 1, "module": 0}
    assert out["pass_gathers"]["per_layer"]["whole"] == 0 and out["pass_gathers"]["per_layer"]["module"] > 0
    assert out["pass_equal"] and out["skipped_after"] == 0
