"""Resuming with a changed config: checks made before any model loads (ZeRO stage, ranks, the
keys that differ), a changed learning rate reaching the restored optimizer, and a changed P
continuing the row stream where it stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _engine_helpers import ROOT, TINY_OVERRIDES, engine_env, tiny_model, train_cmd

from policyzoo.data import rows_at
from policyzoo.engine.rundir import ResumeError, RunDir
from policyzoo.run_config import load_config


def _config(out, *extra):
    return load_config(None, "grpo", [f"model.path={tiny_model()}", *TINY_OVERRIDES, f"output_dir={out}", *extra])


def _prepare(config, resume=None, force=False):
    from policyzoo.engine.run.session import prepare

    return prepare(config, str(resume) if resume else None, force).checked


@pytest.fixture(scope="module")
def fingerprint(tmp_path_factory):
    """The fingerprint of the tiny run's config (a fresh prepare: nothing is loaded but the tokenizer)."""
    return _prepare(_config(tmp_path_factory.mktemp("fresh") / "run")).fingerprint


def _checkpoint(tmp_path, fingerprint, config=None, **state):
    """A run directory whose latest checkpoint (step 2) records ``state``; config.yaml is ``config``'s,
    else the tiny run's."""
    rd = RunDir(tmp_path / "run")
    rd.create((config or _config(rd.path)).model_dump(), {})
    (rd.ckpt / "step-000002").mkdir()
    (rd.ckpt / "step-000002" / "state.json").write_text(json.dumps(
        {"step": 2, "batches": 2, "fingerprint": fingerprint, **state}))
    (rd.ckpt / "latest.json").write_text(json.dumps({"step": 2, "path": "step-000002"}))
    return rd.path


def test_another_zero_stage_or_rank_count_is_refused_before_loading(tmp_path, fingerprint):
    run = _checkpoint(tmp_path, fingerprint, zero_stage=2, world_size=1)
    with pytest.raises(ResumeError) as e:
        _prepare(_config(run, "train.steps=5", "engine.zero_stage=0"), run)
    assert "written at ZeRO stage 2 and engine.zero_stage is 0" in str(e.value)
    assert "engine.zero_stage=1 or 2" in e.value.fix
    with pytest.raises(ResumeError, match="written at ZeRO stage 2 and engine.zero_stage is 3"):
        _prepare(_config(run, "train.steps=5", "engine.zero_stage=3"), run)
    # stages 1 and 2 share one checkpoint layout (DeepSpeed 0.19 loads either at the other)
    assert _prepare(_config(run, "train.steps=5", "engine.zero_stage=1"), run).resume_from.name == "step-000002"
    # a user DeepSpeed config's stage wins over engine.zero_stage, here and in what checkpoints record
    with pytest.raises(ResumeError) as e:
        _prepare(_config(run, "train.steps=5", "engine.zero_stage=2",
                         "engine.deepspeed={zero_optimization: {stage: 0}}"), run)
    assert "engine.deepspeed.zero_optimization.stage is 0" in str(e.value)
    assert "engine.deepspeed.zero_optimization.stage=1 or 2" in e.value.fix
    from policyzoo.engine.run.resume import checkpoint_state

    state = checkpoint_state(2, 16, 2, {}, _config(run, "engine.deepspeed={zero_optimization: {stage: 1}}"), 1)
    assert state["zero_stage"] == 1  # not engine.zero_stage's default 0

    run = _checkpoint(tmp_path / "b", fingerprint, zero_stage=2, world_size=2)
    with pytest.raises(ResumeError) as e:  # this process is one rank
        _prepare(_config(run, "train.steps=5", "engine.zero_stage=2"), run)
    assert "written by 2 data-parallel rank(s) at ZeRO stage 2" in str(e.value) and "has 1" in str(e.value)
    assert "launch 2 rank(s)" in e.value.fix

    run = _checkpoint(tmp_path / "c", fingerprint, zero_stage=0, world_size=2)  # stage 0: any rank count
    assert _prepare(_config(run, "train.steps=5"), run).resume_from.name == "step-000002"


def test_a_config_mismatch_names_every_key_that_differs(tmp_path, fingerprint):
    run = _checkpoint(tmp_path, fingerprint, zero_stage=0, world_size=1)
    cfg = _config(run, "train.steps=5", "data.seed=3", "algorithm.clip.eps_high=0.3")
    with pytest.raises(ResumeError) as e:
        _prepare(cfg, run)
    msg = str(e.value)
    assert "these keys differ (checkpoint -> now):" in msg
    assert "  data.seed: 0 -> 3" in msg  # the data section's seed: default 0, now 3
    assert "algorithm.clip.components[0].eps_high: 0.2 -> 0.3" in msg  # grpo: ppo_clip eps_high 0.2
    assert "rewards" not in msg and "model." not in msg  # the keys that did not change are not listed
    # --force-resume loads anyway and prints the same list
    assert _prepare(cfg, run, force=True).resume_from.name == "step-000002"


BF16 = "engine.rollout_dtype=bfloat16"


def test_a_changed_rollout_dtype_names_the_correction_it_added_and_the_way_out(tmp_path, fingerprint):
    # a run sampled in float32 (model.dtype), resumed sampling in bfloat16: the config adds algorithm.ratio tis
    run = _checkpoint(tmp_path, fingerprint, zero_stage=0, world_size=1)
    with pytest.raises(ResumeError) as e:
        _prepare(_config(run, "train.steps=5", BF16), run)
    msg = " ".join(str(e.value).split())
    assert 'algorithm.ratio.components[0].use: "token" -> "tis"' in msg
    assert ("algorithm.ratio was added by engine.rollout_correction=tis because engine.rollout_dtype (bfloat16) "
            "differs from model.dtype (float32)") in msg
    assert e.value.fix.startswith("engine.rollout_correction=null keeps the checkpoint's algorithm")
    assert "--force-resume" in e.value.fix
    # the way out resumes; another changed key too: the general fix, then the correction's
    assert _prepare(_config(run, "train.steps=5", BF16, "engine.rollout_correction=null"), run).resume_from
    with pytest.raises(ResumeError) as e:
        _prepare(_config(run, "train.steps=5", BF16, "data.seed=3"), run)
    fix = e.value.fix
    assert fix.startswith("resume with the run's own config") and "engine.rollout_correction=null" in fix
    # the algorithm's own ratio is the user's: no line about the correction
    with pytest.raises(ResumeError) as e:
        _prepare(_config(run, "train.steps=5", "algorithm.ratio.use=tis"), run)
    assert "engine.rollout_correction" not in str(e.value) + e.value.fix


def test_a_bf16_sampled_run_resumed_in_fp32_keeps_its_correction_and_says_so(tmp_path):
    from policyzoo.engine.run.preload import preload
    from policyzoo.engine.run.resume import checkpoint_state

    bf16 = _config(tmp_path / "fresh" / "run", BF16)
    assert checkpoint_state(2, 4, 2, {}, bf16, 1)["rollout_dtype"] == "bfloat16"
    fp = _prepare(bf16).fingerprint
    # as `--resume RUN_DIR engine.rollout_dtype=float32` loads the run's config.yaml: tis is in the algorithm
    resumed = _config(tmp_path / "x", "train.steps=5", "algorithm.ratio.use=tis", "engine.rollout_dtype=float32")
    for name, recorded in (("new", {"rollout_dtype": "bfloat16"}), ("old", {})):  # old: config.yaml says bf16
        run = _checkpoint(tmp_path / name, fp, bf16, zero_stage=0, world_size=1, **recorded)
        lines = preload(resumed, str(run), dry_run=True).resume_lines
        note = " ".join(" ".join(lines).split())
        assert "the checkpoint sampled in bfloat16 with algorithm.ratio tis" in note, lines
        assert "sampling in float32 now, the checkpoint's algorithm is kept, so tis stays on" in note
    # sampling on in bfloat16: nothing to say
    kept = _config(tmp_path / "y", "train.steps=5", "algorithm.ratio.use=tis", BF16)
    assert not any("rollout_correction" in x for x in preload(kept, str(run), dry_run=True).resume_lines)


def test_a_changed_lr_is_reported_and_the_row_stream_continues(tmp_path, fingerprint):
    # a checkpoint of the current format: 4 rows drawn (2 steps of P = 2), trained at lr 1e-3
    run = _checkpoint(tmp_path, fingerprint, rows=4, zero_stage=0, world_size=1,
                      train={"lr": 1e-3, "weight_decay": 0.0, "prompts_per_step": 2})
    s = _prepare(_config(run, "train.steps=5", "train.lr=2e-3", "train.prompts_per_step=4"), run)
    assert s.rows_drawn == 4
    assert s.resume_notes == ["resume: train.lr 0.001 -> 0.002 since the checkpoint: the restored optimizer uses "
                              "the new value (its Adam moments are kept)"]
    # an older checkpoint counts batches only: 2 batches x P = 2 (config.yaml of the run) = 4 rows, not 2 x 4
    run = _checkpoint(tmp_path / "old", fingerprint)
    s = _prepare(_config(run, "train.steps=5", "train.prompts_per_step=4"), run)
    assert s.rows_drawn == 4 and s.resume_notes == []


def test_drawing_by_row_position_visits_each_row_once_per_epoch_whatever_p():
    rows = [{"i": i} for i in range(8)]

    def drawn(sizes):
        pos, out = 0, []
        for p in sizes:
            out += [r["i"] for r in rows_at(rows, 0, pos, p)]
            pos += p
        return out
    # P = 2 for two steps, then P = 4 (a resume with another P): 2 + 2 + 4 = 8 rows, one epoch
    assert sorted(drawn([2, 2, 4])) == list(range(8))
    # P = 4, then 2 + 2: again each row once
    assert sorted(drawn([4, 2, 2])) == list(range(8))
    # and the order is the uninterrupted one at P = 1
    assert drawn([2, 2, 4]) == drawn([1] * 8) == drawn([4, 2, 2])


SCRIPT = r'''
import json, sys, tempfile
from policyzoo.engine.process import setup_process
setup_process(1, 0.1)
from policyzoo.engine.models import resolve_model
from policyzoo.engine.trainer.deepspeed_trainer import Trainer
from policyzoo.config_sections import EngineSettings, ModelSettings, TrainSettings
info = resolve_model(sys.argv[1])
folder = tempfile.mkdtemp()

def trainer(lr, stage=int(sys.argv[3])):
    return Trainer(info, ModelSettings(), TrainSettings(lr=lr, weight_decay=0.0, grad_clip=1e6),
                   EngineSettings(zero_stage=stage, critic_lr=lr),
                   need_ref=False, need_critic=False)

def weight(tr):
    return dict(tr.engine.module.named_parameters())["model.norm.weight"]

first = trainer(1e-3, int(sys.argv[2]))
first.backward(3.0 * weight(first).sum())
first.step()
first.save(folder, client_state={})
deltas = {}
for name, lr, apply in (("old", 1e-3, True), ("new_unapplied", 2e-3, False), ("new", 2e-3, True)):
    tr = trainer(lr)
    tr.load(folder)
    if apply:
        tr.set_optimizer(lr=lr, weight_decay=0.0, critic_lr=lr)
    w = weight(tr)
    before = w.detach().clone()
    tr.backward(w.sum())
    tr.step()
    deltas[name] = (w.detach() - before).tolist()
print("@@" + json.dumps(deltas))
'''


# ZeRO 0: the torch optimizer itself; 2: DeepSpeed's ZeRO wrapper around it; 1 -> 2: a checkpoint of
# stage 1 resumed at stage 2 (one layout, see policyzoo.engine.run.resume.LAYOUT) continues exactly
@pytest.mark.parametrize("saved, loaded", [(0, 0), (2, 2), (1, 2)])
def test_a_changed_lr_reaches_the_restored_optimizer(saved, loaded):
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model()), str(saved), str(loaded)], env=engine_env(),
                       capture_output=True, text=True, timeout=900)
    lines = [x for x in r.stdout.splitlines() if x.startswith("@@")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    d = json.loads(lines[-1][2:])
    # AdamW, second step, gradient 3 then 1 on each weight of the final norm (weight decay 0):
    # m = 0.9 * 0.3 + 0.1 * 1 = 0.37, v = 0.999 * 0.009 + 0.001 * 1 = 0.009991,
    # m_hat = 0.37 / 0.19 = 1.947368, v_hat = 0.009991 / 0.001999 = 4.998000,
    # update = lr * 1.947368 / sqrt(4.998000) = lr * 0.871063
    assert all(abs(x + 0.871063e-3) < 1e-7 for x in d["old"])
    assert all(abs(x + 2 * 0.871063e-3) < 2e-7 for x in d["new"])
    # without set_optimizer the loaded state keeps the checkpoint's lr (what a resume did before)
    assert d["new_unapplied"] == d["old"]


def record_questions(prompts, completions, question=None, **_):
    """spread_reward, and the distinct questions of each training batch (more rows than the 4
    held-out ones) appended as one JSON line to $RECORD_QUESTIONS."""
    if len(completions) > 4:
        with open(os.environ["RECORD_QUESTIONS"], "a") as f:
            f.write(json.dumps(sorted(set(question))) + "\n")
    return [len(set(c)) / (len(c) + 1) for c in completions]


def test_a_resume_with_another_p_and_lr_visits_each_row_once_and_exports_checkpoints(tmp_path):
    out, record = tmp_path / "run", tmp_path / "questions.jsonl"
    env = {**engine_env(), "RECORD_QUESTIONS": str(record),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    reward = 'rewards=[{use: function, function: "test_resume_changes:record_questions"}]'
    common = ["engine.rollout=transformers", "engine.threads=1", "data.limit=8", reward]
    r = subprocess.run(train_cmd(out, *common, "train.steps=2", "train.export_every=1"), env=env,
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    # export_every 1: the step-1 checkpoint carries a save_pretrained export that transformers loads
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(str(out / "checkpoints" / "step-000001" / "hf")) is not None
    r = subprocess.run([sys.executable, "-m", "policyzoo.cli", "train", "--resume", str(out), "train.steps=3",
                        "train.prompts_per_step=4", "train.lr=2e-3"], env=env, capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "train.lr 0.001 -> 0.002 since the checkpoint" in " ".join(r.stderr.split())
    batches = [json.loads(x) for x in record.read_text().splitlines()]
    # steps 1-2 draw 2 rows each, step 3 (after the resume) 4: 8 rows, the whole epoch of the 8
    # training rows, each exactly once (drawing batch 2 of P = 4 would have skipped rows 4-7)
    assert [len(b) for b in batches] == [2, 2, 4]
    assert len({q for b in batches for q in b}) == 8


def test_config_diff_lists_changed_added_and_removed_keys():
    from policyzoo.engine.run.resume import config_diff

    old = {"data": {"seed": 0, "limit": None}, "rewards": [{"use": "a", "weight": 1.0}]}
    new = {"data": {"seed": 3, "limit": None}, "rewards": [{"use": "a", "weight": 1.0}, {"use": "b"}],
           "model": {"betas": (0.9, 0.999)}}
    assert config_diff({**old, "model": {"betas": [0.9, 0.999]}}, new) == [
        'data.seed: 0 -> 3', 'rewards[1].use: (absent) -> "b"']  # a tuple equals the list JSON stored
    assert config_diff(new, new) == []
