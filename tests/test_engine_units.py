"""Engine pieces that need no vLLM/DeepSpeed: packing, alignment, log-probs, seeds, checkpoints,
model-folder checks, the sync guard. Values are worked out by hand in the comments."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from _engine_helpers import make_rollout, tiny_model

from policyzoo.engine.models import ModelError, resolve_model
from policyzoo.engine.rollout.engine_base import build_rollout, request_seed
from policyzoo.engine.rundir import RunDir
from policyzoo.engine.sync import SyncError, WeightSync, run_with_timeout
from policyzoo.engine.trainer.modeling import pack
from policyzoo.engine.trainer.prefix import token_logprobs

EOS = PAD = 2  # as SmolLM2: the pad id is the end-of-sequence id


def test_masks_come_from_lengths_not_from_the_pad_id():
    # Three prompts, n = 1. Responses: [5, EOS] (stopped), [EOS] (stopped at once), [7, 8, 9] (hit
    # max_tokens = 3). T = 3. Masks must keep each EOS (it was generated) although EOS == PAD.
    r = build_rollout([[1], [1, 1], [1]], [[5, EOS], [EOS], [7, 8, 9]], [[-.1, -.2], [-.3], [-.4, -.5, -.6]],
                      [False, False, True], [{"a": 0}, {"a": 1}, {"a": 2}], ["p0", "p1", "p2"], ["c0", "c1", "c2"],
                      n=1, pad_id=PAD, temperature=0.7, max_tokens=3)
    assert r.response_ids.tolist() == [[5, EOS, PAD], [EOS, PAD, PAD], [7, 8, 9]]
    assert r.response_mask.tolist() == [[True, True, False], [True, False, False], [True, True, True]]
    assert torch.allclose(r.rollout_logprobs, torch.tensor([[-.1, -.2, 0], [-.3, 0, 0], [-.4, -.5, -.6]]))
    assert r.truncated.tolist() == [False, False, True]
    assert r.group_ids.tolist() == [0, 1, 2]


def test_groups_are_prompt_major_with_explicit_ids():
    # 2 prompts x n = 2: rows 0,1 answer prompt 0 and rows 2,3 prompt 1.
    r = build_rollout([[1, 3], [4]], [[5], [6], [7], [8]], [[0.0]] * 4, [False] * 4, [{"q": 0}, {"q": 1}],
                      ["a", "b"], ["w", "x", "y", "z"], n=2, pad_id=PAD, temperature=1.0, max_tokens=4)
    assert r.group_ids.tolist() == [0, 0, 1, 1]
    assert r.prompt_ids == [[1, 3], [1, 3], [4], [4]]
    assert [row["q"] for row in r.rows] == [0, 0, 1, 1] and r.prompts == ["a", "a", "b", "b"]


def test_sample_seeds_never_collide():
    # vLLM seeds sample j of a request with seed s as s + j, so request seeds must be >= n apart:
    # every (step seed, prompt i, sample j) below must get its own stream.
    n = 8
    seen = {request_seed(s, i, n) + j for s in range(50) for i in range(64) for j in range(n)}
    assert len(seen) == 50 * 64 * n


def _rollout(prompts, responses, temperature=1.0):
    return make_rollout(prompts, responses, temperature, PAD)


def test_pack_left_pads_prompts_so_responses_share_columns():
    # prompts [1,2,3] and [4]; responses [5,6] and [7]. Pmax = 3, T = 2:
    #   row 0: 1 2 3 | 5 6       attention 1 1 1 1 1   positions 0 1 2 3 4
    #   row 1: p p 4 | 7 p       attention 0 0 1 1 1   positions 0 0 0 1 2
    ids, attn, pos, t = pack(_rollout([[1, 2, 3], [4]], [[5, 6], [7]]), PAD, "cpu")
    assert t == 2
    assert ids.tolist() == [[1, 2, 3, 5, 6], [PAD, PAD, 4, 7, PAD]]
    assert attn.tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    assert pos.tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]]


def test_token_logprobs_divide_logits_by_the_temperature():
    # logits [0, ln 2]: at T = 1, p(token 1) = 2 / (1 + 2) = 2/3 -> ln(2/3) = -0.405465;
    # at T = 0.5 the logits are [0, 2 ln 2] = [0, ln 4]: p = 4/5 -> ln 0.8 = -0.223144.
    # Entropy at T = 1: -(1/3 ln 1/3 + 2/3 ln 2/3) = 0.366204 + 0.270310 = 0.636514.
    logits = torch.tensor([[[0.0, math.log(2.0)]]])
    lp1, ent1 = token_logprobs(logits, torch.tensor([[1]]), 1.0, True)
    lp05, _ = token_logprobs(logits, torch.tensor([[1]]), 0.5, False)
    assert lp1.item() == pytest.approx(-0.405465, abs=1e-6)
    assert lp05.item() == pytest.approx(-0.223144, abs=1e-6)
    assert ent1.item() == pytest.approx(0.636514, abs=1e-6)


def test_trainer_scores_token_t_from_position_t_minus_1_despite_padding():
    # The packed, left-padded batch (logits_to_keep = T + 1) must give each response token the
    # log-prob of an unpadded forward of that row alone, read at position (prompt length - 1 + t).
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model()), dtype=torch.float32).eval()
    roll = _rollout([[1, 40, 41, 42, 43], [1, 50]], [[60, 61, 62], [70, EOS]], temperature=0.7)
    ids, attn, pos, t = pack(roll, PAD, "cpu")
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=t + 1).logits[:, :-1]
        got, _ = token_logprobs(logits, ids[:, -t:], 0.7, False)
        for i, (p, r) in enumerate(zip(roll.prompt_ids, [[60, 61, 62], [70, EOS]])):
            full = torch.tensor([p + r])
            ref = (model(full).logits[0] / 0.7).log_softmax(-1)
            want = torch.tensor([ref[len(p) - 1 + k, tok].item() for k, tok in enumerate(r)])
            assert torch.allclose(got[i, :len(r)], want, atol=1e-5), (i, got[i], want)


class _FakeTrainer:
    def __init__(self, fail_on_call: int | None = None):
        self.calls, self.fail_on_call = 0, fail_on_call

    def save(self, folder, client_state):
        self.calls += 1
        (torch.save(torch.zeros(3), f"{folder}/weights.pt"))
        if self.calls == self.fail_on_call:
            raise KeyboardInterrupt("killed while writing")


def test_checkpoint_interrupted_while_writing_keeps_the_previous_one(tmp_path):
    rd = RunDir(tmp_path / "run")
    rd.create({"a": 1}, {"a": 1})
    trainer = _FakeTrainer(fail_on_call=2)
    rd.save_checkpoint(trainer, 2, {"step": 2, "batches": 2}, keep=2)
    with pytest.raises(KeyboardInterrupt):
        rd.save_checkpoint(trainer, 4, {"step": 4, "batches": 4}, keep=2)
    folder, state = rd.latest()
    assert folder.name == "step-000002" and state == {"step": 2, "batches": 2}
    assert (rd.ckpt / ".tmp-step-000004").exists()  # the half-written one stays under its temporary name
    rd.remove_partial()
    assert not (rd.ckpt / ".tmp-step-000004").exists()
    # keep = 2 prunes older complete checkpoints.
    for s in (6, 8):
        rd.save_checkpoint(_FakeTrainer(), s, {"step": s, "batches": s}, keep=2)
    assert sorted(p.name for p in rd.ckpt.iterdir() if p.is_dir()) == ["step-000006", "step-000008"]
    assert json.loads((rd.ckpt / "latest.json").read_text()) == {"step": 8, "path": "step-000008"}


def test_metrics_truncated_to_the_checkpoint_on_resume(tmp_path):
    rd = RunDir(tmp_path)
    rd.create({}, {})
    for s in range(1, 5):
        rd.log({"step": s, "x": s * 1.5, "nan": float("nan")})
    with open(rd.metrics_file, "a") as f:
        f.write('{"step": 5, "x"')  # a line cut by a kill
    rd.truncate_metrics(2)
    assert [r["step"] for r in rd.read_metrics()] == [1, 2]
    assert rd.read_metrics()[0]["nan"] is None  # JSON has no NaN: written as null


@pytest.mark.parametrize("case", ["missing", "file", "no_config", "no_weights", "not_causal", "remote_code"])
def test_bad_model_folders_are_clear_errors(tmp_path, case):
    folder = tmp_path / "m"
    if case == "file":
        folder.write_text("x")
    elif case != "missing":
        folder.mkdir()
        if case != "no_config":
            arch = "BertModel" if case == "not_causal" else "LlamaForCausalLM"
            cfg = {"architectures": [arch], **({"auto_map": {"AutoModel": "x.Y"}} if case == "remote_code" else {})}
            (folder / "config.json").write_text(json.dumps(cfg))
        if case not in ("no_config", "no_weights"):
            (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError) as e:
        resolve_model(str(folder))
    text = str(e.value)
    assert "model.path" in text and "fix:" in text
    expected = {"missing": "does not exist", "file": "is a file", "no_config": "no config.json",
                "no_weights": "no weights", "not_causal": "not a causal language model",
                "remote_code": "trust_remote_code"}[case]
    assert expected in text


def test_tiny_model_folder_resolves_with_eos_equal_pad():
    info = resolve_model(str(tiny_model()))
    assert info.pad_token_id == info.eos_token_ids[0] == info.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert info.max_context == 1024 and info.architecture == "LlamaForCausalLM"


def test_sync_guard_times_out_and_checks():
    with pytest.raises(SyncError, match="did not finish within 0.2 s"):
        run_with_timeout(lambda: time.sleep(3), 0.2, "pushing weights")

    class Engine:
        def __init__(self, shift, cached_shift=0.0):
            self.shift, self.cached_shift = shift, cached_shift

        def score(self, ids):  # prompt log-probs: vLLM reads no prefix cache for them
            return torch.tensor([-1.0, -2.0]) + self.shift

        def score_next(self, ids):  # next-token log-probs through the (possibly stale) cache
            return {7: -0.5 + self.cached_shift}

    class Trainer:
        def score_sequence(self, ids):
            return torch.tensor([-1.0, -2.0])

        def next_logprobs(self, ids):
            return torch.full((9,), -3.0).index_fill(0, torch.tensor([7]), -0.5)

    ok = WeightSync(Engine(5e-5), Trainer(), check=True, tolerance=1e-4, timeout_s=5, check_ids=[1, 2, 3])
    assert ok.check_now() == pytest.approx(5e-5, abs=1e-7)  # float32 rounding of -2 + 5e-5
    bad = WeightSync(Engine(0.3), Trainer(), check=True, tolerance=1e-4, timeout_s=5, check_ids=[1, 2, 3])
    with pytest.raises(SyncError, match="differ from the trainer's by up to 0.3"):
        bad.check_now()
    nan = WeightSync(Engine(float("nan")), Trainer(), check=True, tolerance=1e-4, timeout_s=5, check_ids=[1, 2, 3])
    with pytest.raises(SyncError):
        nan.check_now()
    # the prompt path agrees, the cached path is off by 0.2 nats (a stale prefix cache): it fails
    stale = WeightSync(Engine(0.0, 0.2), Trainer(), check=True, tolerance=1e-4, timeout_s=5, check_ids=[1, 2, 3])
    with pytest.raises(SyncError, match="differ from the trainer's by up to 0.2"):
        stale.check_now()
    stale_nan = WeightSync(Engine(0.0, float("nan")), Trainer(), check=True, tolerance=1e-4, timeout_s=5,
                           check_ids=[1, 2, 3])
    with pytest.raises(SyncError):
        stale_nan.check_now()
    # bf16-sized rounding: the prompt tokens off by 0.2 and 0.2, the cached token by 0 -> max 0.2, mean
    # (0.2 + 0.2 + 0) / 3 = 0.1333: within max 1.5 / mean 0.15; a push that left every token 0.2 off fails the mean
    rounding = WeightSync(Engine(0.2), Trainer(), check=True, tolerance=1.5, mean_tolerance=0.15, timeout_s=5,
                          check_ids=[1, 2, 3])
    assert rounding.check_now() == pytest.approx(0.2, abs=1e-6)
    assert rounding.last_mean_diff == pytest.approx(0.4 / 3, abs=1e-6)
    everywhere = WeightSync(Engine(0.2, 0.2), Trainer(), check=True, tolerance=1.5, mean_tolerance=0.15,
                            timeout_s=5, check_ids=[1, 2, 3])
    with pytest.raises(SyncError, match="mean 0.2.*of the mean 0.15"):
        everywhere.check_now()


def test_plot_draws_the_six_curves_to_a_png(tmp_path):
    from policyzoo.engine.report.plot import PANELS
    from policyzoo.engine.report.plot import main as plot
    from policyzoo.errors import UserError

    rd = RunDir(tmp_path)
    rd.create({}, {})
    rd.log({"step": 0, "kind": "eval", "eval_accuracy": 0.2})
    for s in (1, 2, 3):
        rd.log({"step": s, "kind": "train", "reward_mean": 0.1 * s, "kl_ref": 0.01 * s, "response_length_mean": 5.0,
                "response_length_max": 9.0, "clip_frac_low": 0.0, "clip_frac_high": 0.01, "entropy": 0.7,
                "zero_std_frac": 0.5})
    out = plot(str(tmp_path))
    assert out == tmp_path / "curves.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [title for title, _ in PANELS] == ["reward", "KL to reference", "response length (tokens)",
                                              "clip fraction", "entropy (nats/token)", "zero-std groups"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no training steps"):
        plot(str(tmp_path / "empty"))
    with pytest.raises(UserError, match="no such folder"):  # a typo in the path: not "no training steps"
        plot(str(tmp_path / "nothing"))
    with pytest.raises(UserError, match="not a folder"):
        plot(str(tmp_path / "curves.png"))


def test_vllm_thread_count_mismatch_is_a_config_error(monkeypatch):
    # vLLM's CPU attention crashes when torch's thread count differs from the OpenMP pool the
    # process started with; policyzoo refuses such a config before loading anything
    from policyzoo.engine.process import check_vllm_threads
    from policyzoo.errors import ConfigError

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    with pytest.raises(ConfigError, match="OMP_NUM_THREADS=1"):
        check_vllm_threads(1)
    check_vllm_threads(2)     # matches the pool
    check_vllm_threads(None)  # the default follows the pool
    monkeypatch.delenv("OMP_NUM_THREADS")
    from policyzoo.engine.process import cpu_count

    check_vllm_threads(cpu_count())
