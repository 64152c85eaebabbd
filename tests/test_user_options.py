"""What a TRL user expects around the engine, without loading a model: learning-rate schedules,
every config key described, CSV / eval_path / prompt-only data, long prompts, trackers, the
completions table, progress lines and the quiet start-up."""

import io
import json
import math
import sys
import warnings

import pytest
import torch
from rich.console import Console

from policyzoo.contract import Rollout, StepBatch
from policyzoo.data import fit_prompt_lengths, load_task
from policyzoo.errors import DataError, UserError
from policyzoo.run_config import Config, config_keys, load_config


def test_lr_schedules_warm_up_without_a_zero_step_then_follow_transformers_shapes():
    from policyzoo.engine.trainer.modeling import lr_schedule

    def factors(name, warmup, total, k):
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = lr_schedule(name, warmup, total)(opt)
        out = []
        for _ in range(k):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    # warm-up 2 of 10: (k + 1) / 3 = 1/3, 2/3 (never 0: the first update trains), then 1 at step 2
    const = factors("constant", 2, 10, 4)
    assert all(math.isclose(a, b) for a, b in zip(const, [1 / 3, 2 / 3, 1.0, 1.0]))
    lin = factors("linear", 2, 10, 10)  # after warm-up: 1 - (k - 2) / 8; step 6: 0.5; last step 9: 1/8
    assert math.isclose(lin[2], 1.0) and math.isclose(lin[6], 0.5) and math.isclose(lin[9], 1 / 8)
    cos = factors("cosine", 2, 10, 7)  # step 6: progress (6 - 2) / 8 = 0.5 -> 0.5 * (1 + cos(pi / 2)) = 0.5
    assert math.isclose(cos[6], 0.5) and math.isclose(cos[4], 0.5 * (1 + math.cos(math.pi * 2 / 8)))
    assert factors("constant", 0, 5, 3) == [1.0, 1.0, 1.0]  # the default: no change to the lr
    assert min(factors("linear", 3, 4, 4)) > 0  # warm-up 1/4, 2/4, 3/4, then the last step 1 - 0/1 = 1


def test_optimizer_settings_reach_deepspeed():
    from policyzoo.engine.trainer.dsconfig import ds_config

    cfg = ds_config(0, 1e-5, 0.1, 0.5, "float32", betas=(0.8, 0.95), eps=1e-6)
    assert cfg["optimizer"]["params"]["betas"] == [0.8, 0.95] and cfg["optimizer"]["params"]["eps"] == 1e-6
    assert cfg["gradient_clipping"] == 0.5 and cfg["optimizer"]["params"]["weight_decay"] == 0.1
    c = load_config(None, "grpo", ["train.adam_beta2=0.95", "train.lr_scheduler_type=cosine", "train.warmup_ratio=0.1"])
    assert (c.train.adam_beta2, c.train.lr_scheduler_type, c.train.warmup_ratio) == (0.95, "cosine", 0.1)


def test_every_config_key_has_a_description_and_is_listed(capsys):
    from policyzoo.cli import main

    keys = config_keys()
    assert all(desc for _, _, desc in keys), [k for k, _, d in keys if not d]
    names = [k for k, _, _ in keys]
    for key in ("train.report_to", "train.log_completions_every", "train.lr_scheduler_type", "train.adam_epsilon",
                "data.eval_path", "data.on_long_prompt", "output_dir"):
        assert key in names
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert "train.warmup_steps = 0" in out and "data.on_long_prompt = drop" in out
    assert "  algorithm.conventions = policyzoo " in out and "policyzoo | trl | verl" in out  # core/conventions.py
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0 and "train.report_to = [tensorboard]" in capsys.readouterr().out
    sections = [f.annotation for f in Config.model_fields.values()]
    # one line per field of every section, plus algorithm.conventions (no field of its own: inside algorithm)
    assert len(out.splitlines()) == len(keys) == sum(len(getattr(a, "model_fields", [0])) for a in sections) + 1


def test_csv_file_eval_path_and_prompt_only_data(tmp_path):
    (tmp_path / "train.csv").write_text("question,answer\n" + "".join(f"What is {i} + 1?,{i + 1}\n" for i in range(8)))
    (tmp_path / "held.jsonl").write_text("".join(json.dumps({"question": f"{i}+2?", "answer": i + 2}) + "\n"
                                                 for i in range(3)))
    task = load_task({"path": str(tmp_path / "train.csv"), "prompt_column": "question",
                      "eval_path": str(tmp_path / "held.jsonl")})
    # all 8 CSV rows train (nothing held out of them), the 3 rows of eval_path are held out
    assert len(task.train_rows) == 8 and [r["answer"] for r in task.eval_rows] == ["2", "3", "4"]
    assert {r["answer"] for r in task.train_rows} == {str(i + 1) for i in range(8)} and task.missing_answer is None
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"hi {i}"}]}) + "\n"
                                                 for i in range(10)))
    task = load_task({"path": str(tmp_path / "chat.jsonl"), "eval_size": 0.2})  # 0.2 x 10 = 2 held out
    assert (len(task.train_rows), len(task.eval_rows)) == (8, 2)
    assert all("answer" not in r for r in task.train_rows) and "no column 'answer'" in task.missing_answer.why


def test_prompt_only_data_with_a_reward_that_needs_answers_stops_before_any_model(tmp_path):
    from policyzoo.engine.run.session import prepare

    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": f"Say {i}"}) + "\n" for i in range(10)))
    config = load_config(None, "grpo", [f"data.path={tmp_path / 'p.jsonl'}", "rewards=[math_verify]",
                                        "model.path=/nonexistent"])
    with pytest.raises(DataError) as e:  # the model path is never looked at: the data check comes first
        prepare(config, None)
    assert "no column 'answer'" in e.value.why and "math_verify compares completions with it" in e.value.why
    assert "reward_model" in e.value.fix


def test_long_prompts_dropped_or_refused():
    rows = [{"prompt": "a" * n} for n in (3, 9, 5, 12)]
    origins = [f"d.jsonl, row {i}" for i in range(4)]
    kept, counts, where, dropped = fit_prompt_lengths(rows, len, 8, "data", "drop", origins)
    assert [r["prompt"] for r in kept] == ["aaa", "aaaaa"] and counts == [3, 5] and dropped == 2
    assert where == ["d.jsonl, row 0", "d.jsonl, row 2"]
    with pytest.raises(DataError) as e:
        fit_prompt_lengths(rows, len, 8, "data", "error", origins)
    assert e.value.where == "d.jsonl, row 1" and "9 tokens" in e.value.why


def test_a_missing_tracker_is_a_clear_error_before_training(monkeypatch):
    from policyzoo.engine.report.tracking import TrackerError, check_trackers

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if wandb were not installed
    with pytest.raises(TrackerError) as e:
        check_trackers(["tensorboard", "wandb"])
    assert "wandb" in e.value.where and "pip install wandb" in e.value.fix and isinstance(e.value, UserError)
    check_trackers(["tensorboard"])  # tensorboardX comes with the `track` extra


def test_completion_rows_carry_each_reward_and_the_row_advantage():
    from policyzoo.engine.report.tracking import completion_rows

    mask = torch.tensor([[True, True, False], [True, False, False]])
    r = Rollout(prompt_ids=[[1], [1]], response_ids=torch.zeros(2, 3, dtype=torch.long), response_mask=mask,
                rollout_logprobs=torch.zeros(2, 3), group_ids=torch.tensor([4, 4]),
                truncated=torch.zeros(2, dtype=torch.bool), prompts=["p", "p"], completions=["ab", "c"])
    adv = torch.tensor([[0.7, 0.7, 9.0], [-0.7, 9.0, 9.0]])  # 9.0 on padding must not count
    parts = torch.tensor([[1.0, 0.5], [0.0, 0.5]])  # [B, K]: reward components f, g
    rows = completion_rows(StepBatch(r, torch.tensor([1.5, 0.5]), advantages=adv, reward_components=parts), ["f", "g"])
    assert rows == [{"prompt": "p", "completion": "ab", "reward": 1.5, "reward/f": 1.0, "reward/g": 0.5,
                     "advantage": pytest.approx(0.7), "group": 4},
                    {"prompt": "p", "completion": "c", "reward": 0.5, "reward/f": 0.0, "reward/g": 0.5,
                     "advantage": pytest.approx(-0.7), "group": 4}]


def test_progress_prints_one_line_per_step_without_a_terminal():
    from policyzoo.engine.report.progress import eta, progress_bar

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=60, soft_wrap=True)
    with progress_bar(console, 10, 4) as bar:
        bar.advance({"reward_mean": 0.123456, "response_length_mean": 11.6, "rollout_tokens_per_s": 950.2,
                     "time_step": 2.0}, accuracy=0.254)
    line = buf.getvalue().strip()
    assert line.startswith("step 5/10  reward 0.123  accuracy 0.25  len 12  950 tok/s  2.0 s/step  ETA ")
    assert "\n" not in line
    assert eta(2.5, 5) == "0:00:12" and eta(100.0, 37) == "1:01:40"  # 12.5 s -> 12 (half to even), 3700 s
    buf.truncate(0)
    buf.seek(0)
    with progress_bar(console, 10, 5) as bar:  # the latest evaluation, named for what it is, with its step
        bar.advance({"reward_mean": 0.5}, -0.24, "held-out reward", 5)
        bar.advance({"reward_mean": 0.6}, -0.24, "held-out reward", 5)  # the same evaluation: not repeated
        bar.advance({"reward_mean": 0.7}, 0.31, "held-out reward", 7)  # a new one
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("step 6/10  reward 0.5  held-out reward -0.24 (last eval, step 5)  len 0")
    assert lines[1].startswith("step 7/10  reward 0.6  len 0") and "held-out" not in lines[1]
    assert lines[2].startswith("step 8/10  reward 0.7  held-out reward 0.31 (last eval, step 7)  len 0")


def test_the_held_out_value_is_called_accuracy_only_for_one_correctness_reward():
    from policyzoo.engine.report.progress import eval_metric_name
    from policyzoo.plugins.reward import AnswerMatch, Function

    assert eval_metric_name([AnswerMatch()]) == "accuracy"
    assert eval_metric_name([AnswerMatch(weight=2.0)]) == "held-out reward"  # 0 or 2: not a fraction right
    assert eval_metric_name([AnswerMatch(), AnswerMatch()]) == "held-out reward"
    assert eval_metric_name([Function(function="policyzoo.testing.tiny:spread_reward")]) == "held-out reward"


def test_library_noise_is_silenced_unless_verbose(monkeypatch):
    from policyzoo.engine.process import quiet_libraries

    monkeypatch.setattr(warnings, "filters", list(warnings.filters))
    quiet_libraries(verbose=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        quiet_libraries(verbose=False)
        warnings.warn("torch.distributed.reduce_op is deprecated, please use ReduceOp", FutureWarning)
        warnings.warn("Triton is installed, but doesn't include CPU backend", UserWarning)
        warnings.warn("something the user should see", UserWarning)
    assert [str(w.message) for w in seen] == ["something the user should see"]


def test_sampling_options_reach_the_engine_only_when_set():
    from policyzoo.errors import ConfigError
    from policyzoo.plugins.sample import Group
    from policyzoo.testing.bandit import Bandit

    class Recording(Bandit):  # the bandit test bed with an engine's sampling keywords, recorded
        sampling_options = frozenset({"top_k", "min_p", "repetition_penalty", "stop"})

        def generate(self, prompts, n, max_tokens, temperature, seed, top_k=0, min_p=0.0, repetition_penalty=1.0,
                     stop=()):
            self.seen = dict(top_k=top_k, min_p=min_p, repetition_penalty=repetition_penalty, stop=stop)
            return super().generate(prompts, n, max_tokens, temperature, seed)

    bandit, prompts = Recording([[1, 2, 3]], [[True, False, False]]), [{"question": 0, "prompt": "q0"}]
    group = Group(n=2, top_k=5, min_p=0.1, repetition_penalty=1.2, stop=["\n"])
    group.sample(policy=bandit, prompts=prompts, seed=0, env=None)
    assert bandit.seen == {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2, "stop": ["\n"]}
    Group(n=2).sample(policy=bandit, prompts=prompts, seed=0, env=None)  # "off" values are not passed at all
    assert bandit.seen == {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "stop": ()}
    with pytest.raises(ConfigError) as e:  # an engine without the keyword: refused, never ignored
        Group(n=2, min_p=0.1).sample(policy=Bandit([[1, 2, 3]], [[True, False, False]]), prompts=prompts, seed=0,
                                     env=None)
    assert "min_p" in e.value.where and "takes no min_p" in e.value.why
