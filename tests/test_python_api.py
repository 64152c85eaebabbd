"""The Python API on the tiny model: `policyzoo.train` with a lambda reward and a datasets.Dataset,
and `policyzoo.Trainer` step by step with a TRL-style conversational reward on prompt-only chat data;
the run directory's TensorBoard events and completions.jsonl read back.

Each run is a child Python process (vLLM and DeepSpeed hold process-wide state), whose script is
the user's code; the assertions read what it left in the run directory.
"""

import json
import math
import re
import struct
import subprocess
import sys
import textwrap
from collections import defaultdict

from _engine_helpers import metrics, run_bounded, tiny_model


def run_script(code: str, prelude: str = "", timeout: int = 600, logs=None) -> subprocess.CompletedProcess:
    return run_bounded([sys.executable, "-c", prelude + textwrap.dedent(code)], timeout, logs=logs)


def read_events(folder) -> dict[str, list[tuple[int, float]]]:
    """Scalars of every TensorBoard event file in ``folder``: ``{tag: [(step, value)]}``. An event file
    is a TFRecord stream: length (u64), its CRC (u32), an Event protobuf, the data's CRC (u32)."""
    from tensorboardX.proto import event_pb2

    out = defaultdict(list)
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
            pos += 12 + n + 4
            for v in event.summary.value:
                if v.HasField("simple_value"):
                    out[v.tag].append((event.step, v.simple_value))
    return out


def test_train_with_a_lambda_reward_and_a_datasets_dataset(tmp_path):
    out = tmp_path / "run"
    r = run_script(f"""
        import json, policyzoo
        from datasets import Dataset

        ds = Dataset.from_list([{{"prompt": f"Say {{i}}", "answer": str(i)}} for i in range(20)])
        summary = policyzoo.train(
            algo="grpo", model={str(tiny_model())!r}, dataset=ds, output_dir={str(out)!r},
            rewards=[lambda completion_ids, **kw: [float(len(x)) for x in completion_ids],
                     lambda trainer_state, completions, **kw: [float(trainer_state.global_step)] * len(completions)],
            train={{"steps": 2, "prompts_per_step": 2, "lr": 1e-3, "log_completions_every": 2}},
            **{{"algorithm.sample.max_tokens": 12, "data.eval_size": 4, "engine.sync_check": True}})
        print("SUMMARY", json.dumps(summary))
    """, logs=tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    summary = json.loads(r.stdout.split("SUMMARY ", 1)[1])
    assert summary["steps"] == 2 and summary["run_dir"] == str(out)
    m = metrics(out)
    assert [x["step"] for x in m] == [1, 2]
    for x in m:
        # reward lambda_0 is each row's token count, so its mean is the mean response length
        assert math.isclose(x["reward/lambda_0"], x["response_length_mean"], rel_tol=1e-6)
        # lambda_1 returns trainer_state.global_step: the steps done before this one
        assert x["reward/lambda_1"] == x["step"] - 1
        # 20 rows, 4 held out -> 16 training rows; 2 prompts per step -> epoch = 2 x step / 16
        assert math.isclose(x["epoch"], 2 * x["step"] / 16)
        assert x["lr"] == 1e-3  # constant schedule, no warm-up
    assert m[1]["tokens_seen"] == m[0]["tokens_seen"] + m[1]["rollout_tokens"] + m[1]["prompt_tokens"]
    # the data set was saved into the run directory, and config.yaml points there
    assert (out / "dataset" / "dataset_info.json").is_file()
    assert f"path: {out / 'dataset'}" in (out / "config.yaml").read_text()
    # log_completions_every=2 logs step 2, and the first step is always logged too (so a short run
    # has some): P x G = 2 x 8 rows a step
    rows = [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 32 and [sum(x["step"] == s for x in rows) for s in (1, 2)] == [16, 16]
    assert all(x["reward/lambda_1"] == x["step"] - 1 for x in rows)
    assert all(math.isclose(x["reward"], x["reward/lambda_0"] + x["reward/lambda_1"]) for x in rows)  # weights 1
    by_group = defaultdict(list)
    for x in rows:
        by_group[x["group"]].append(x)
    assert sorted(len(g) for g in by_group.values()) == [8, 8, 8, 8]  # 2 groups a step
    for g in by_group.values():  # GRPO: (r - mean) / (sample std + 1e-6), 0 for a constant group
        rs = [x["reward"] for x in g]
        mean = sum(rs) / 8
        std = math.sqrt(sum((v - mean) ** 2 for v in rs) / 7)
        for x in g:
            want = 0.0 if std <= 1e-6 else (x["reward"] - mean) / (std + 1e-6)
            assert math.isclose(x["advantage"], want, rel_tol=1e-4, abs_tol=1e-5)


# TRL's documented conversational example (huggingface.co/docs/trl, GRPOTrainer "Using a custom
# reward function"), written out by hand: the number of distinct letters of each completion.
TRL_CONVERSATIONAL = '''
def reward_num_unique_letters(completions, **kwargs):
    """Reward function that rewards completions with more unique letters."""
    completion_contents = [completion[0]["content"] for completion in completions]
    return [float(len(set(content))) for content in completion_contents]
'''


def test_trainer_step_by_step_with_a_trl_conversational_reward(tmp_path):
    out, data = tmp_path / "run", tmp_path / "chat.jsonl"
    with open(data, "w") as f:  # prompt-only chat data: no answer column
        for i in range(16):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"Tell me about {i}"}]}) + "\n")
    r = run_script(f"""
        import json, policyzoo

        with policyzoo.Trainer("grpo", model={str(tiny_model())!r}, dataset={str(data)!r},
                               rewards=[reward_num_unique_letters], output_dir={str(out)!r},
                               train={{"steps": 2, "prompts_per_step": 2, "lr": 1e-3, "log_completions_every": 1,
                                      "lr_scheduler_type": "linear", "warmup_steps": 1}},
                               data={{"eval_size": 4}},
                               algorithm={{"sample": {{"max_tokens": 12, "top_k": 50, "min_p": 0.01,
                                                      "repetition_penalty": 1.1,
                                                      "stop": ["z"]}}}}) as t:
            a, b = t.step(), t.step()
            ev = t.evaluate()
            ckpt = t.save()
            print("RESULT", json.dumps({{"steps": [a["step"], b["step"]], "eval_rows": ev["eval_rows"],
                                         "ckpt": str(ckpt), "global_step": t.global_step}}))
    """, prelude=TRL_CONVERSATIONAL, logs=tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout.split("RESULT ", 1)[1])
    assert res["steps"] == [1, 2] and res["global_step"] == 2 and res["eval_rows"] == 4
    assert res["ckpt"].endswith("checkpoints/step-000002") and (out / "checkpoints" / "step-000002").is_dir()
    assert (out / "summary.json").is_file() and (out / "final").is_dir()  # close() on leaving the block
    # step by step, evaluations happen when asked: one, at step 2, which close() reuses
    assert [x["step"] for x in metrics(out, "eval")] == [2]
    m = metrics(out)
    # linear schedule, 1 warm-up step of 2: warm-up factor (k + 1) / (W + 1) = 1/2 at optimizer step
    # k = 0 (never 0: a real update at lr 0 is a wasted step), then (2 - 1) / (2 - 1) = 1
    assert [x["lr"] for x in m] == [5e-4, 1e-3]
    rows = [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]
    assert [sum(x["step"] == s for x in rows) for s in (1, 2)] == [16, 16]  # P x G = 2 x 8 per step
    for x in rows:  # the conversational function saw the completion text as an assistant message
        assert x["reward/reward_num_unique_letters"] == len(set(x["completion"]))
        assert "z" not in x["completion"][:-1]  # stop string "z" ends the response (kept at its end)
    for x in m:
        step_rows = [y["reward/reward_num_unique_letters"] for y in rows if y["step"] == x["step"]]
        assert math.isclose(x["reward/reward_num_unique_letters"], sum(step_rows) / 16, rel_tol=1e-6)
    # TensorBoard: every number of metrics.jsonl under the same key at the same step (float32)
    events = read_events(out / "tensorboard")
    for rec in m + metrics(out, "eval"):
        for key, value in rec.items():
            if key in ("step", "kind") or isinstance(value, str) or value is None:
                continue
            tag = re.sub(r"[^-/\w.]", "_", key)  # TensorBoard's tag rule: eval_pass@1 is shown as eval_pass_1
            (logged,) = [v for step, v in events[tag] if step == rec["step"]]
            assert math.isclose(logged, float(value), rel_tol=1e-6, abs_tol=1e-6), key
    assert {"reward_mean", "reward/reward_num_unique_letters", "lr", "tokens_seen", "epoch",
            "eval_accuracy"} <= set(events)
