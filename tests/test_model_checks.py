"""The model's tokenizer and the sampling settings checked against the task before any model
loads: no chat template (error), a template that adds its own system turn (warning), extra
end-of-sequence ids in generation_config.json (merged, and the transformers rollout stops on
them), a temperature near 0 with G > 1 (warning, and during the run when no group has signal)."""

from __future__ import annotations

import json
import shutil

import pytest
from _engine_helpers import TINY_OVERRIDES, tiny_model

from policyzoo.engine.models import ModelError, resolve_model
from policyzoo.engine.run.checks import ZeroSignalWatch, sampling_warning, system_turn_warning
from policyzoo.run_config import load_config

# SmolLM2-135M-Instruct's chat template (tokenizer.chat_template of its GGUF, as shipped)
SMOLLM2_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                    "{% endif %}")


def _copy(tmp_path, template: str | None = "keep", eos=None):
    """The tiny model copied, with another chat template (None: none) or generation-config eos ids."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model(), folder)
    if template != "keep":
        (folder / "chat_template.jinja").unlink(missing_ok=True)
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        cfg.pop("chat_template", None)
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
        if template is not None:
            (folder / "chat_template.jinja").write_text(template)
    if eos is not None:
        gen = json.loads((folder / "generation_config.json").read_text())
        gen["eos_token_id"] = eos
        (folder / "generation_config.json").write_text(json.dumps(gen))
    return folder


def _prepare(tmp_path, model, *extra):
    from policyzoo.engine.run.session import prepare

    cfg = load_config(None, "grpo", [*TINY_OVERRIDES, f"model.path={model}", f"output_dir={tmp_path / 'run'}", *extra])
    return prepare(cfg, None).checked


def test_a_tokenizer_without_chat_template_is_refused_before_loading(tmp_path):
    model = _copy(tmp_path, template=None)
    with pytest.raises(ModelError) as e:
        _prepare(tmp_path, model)
    assert f"model.path ({model})" in e.value.where
    assert "no chat template" in e.value.why and "tokenizer.chat_template" in e.value.fix
    assert "data.prompt_format: plain" in e.value.fix
    assert not (tmp_path / "run").exists()


def test_a_model_without_chat_template_trains_on_plain_prompts(tmp_path):
    from _engine_helpers import metrics, run_train

    model = _copy(tmp_path, template=None)
    s = _prepare(tmp_path, model, "data.prompt_format=plain", "data.few_shot=1")
    # arithmetic, one solved example: system prompt, the example's question and answer, the question
    row = s.task.train_rows[0]
    ex = s.task.eval_rows[0]["prompt"].split("\n\n")[1]  # the example is shared by every row
    assert row["prompt"] == ("Solve the arithmetic problem. Reply with the result only, in the form 'Answer: <n>' "
                             f"where <n> is an integer.\n\n{ex}\n\n{row['question']}\n")
    assert ex.startswith("What is ") and "?\nAnswer: " in ex
    out = tmp_path / "run2"
    r = run_train(out, "engine.rollout=transformers", "engine.threads=1", "train.steps=1", "data.prompt_format=plain",
                  model=model)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [m["step"] for m in metrics(out)] == [1]


def test_a_template_that_adds_its_own_system_turn_is_reported(tmp_path):
    s = _prepare(tmp_path, _copy(tmp_path, SMOLLM2_TEMPLATE), 'data.system_prompt=""')
    assert s.task.train_rows[0]["prompt"][0]["role"] == "user"  # "" really gives no system message
    [w] = [w for w in s.warnings if not w.startswith("clip: ")]  # the clip at ratio 1: tests/test_equivalence.py
    assert "adds its own: '<|im_start|>system You are a helpful AI assistant named SmolLM" in w
    assert "an empty data.system_prompt would not remove it" in w
    # with a system message of the task's own (the arithmetic default) the template adds none
    assert [w for w in _prepare(tmp_path / "b", _copy(tmp_path / "b", SMOLLM2_TEMPLATE)).warnings
            if not w.startswith("clip: ")] == []
    # the tiny model's plain ChatML template never adds one
    assert system_turn_warning(resolve_model(str(tiny_model())).tokenizer, s.task.train_rows) is None


def test_generation_config_eos_ids_are_merged_and_stop_the_transformers_rollout(tmp_path):
    from policyzoo.engine.rollout.hf import HFRollout

    row = {"prompt": [{"role": "user", "content": "What is 2 + 3?"}], "answer": "5"}
    plain = HFRollout(resolve_model(str(tiny_model())), "float32")
    first = int(plain.greedy([row], 6).response_ids[0, 0])
    assert first != 2  # the tiny model's eos (<|im_end|>) is id 2; its first greedy token is another one
    assert int(plain.greedy([row], 6).response_mask.sum()) > 1

    info = resolve_model(str(_copy(tmp_path, eos=[2, first])))
    assert info.eos_token_ids == [2, first]  # config.json's 2, then generation_config's new id
    r = HFRollout(info, "float32").greedy([row], 6)
    assert r.response_ids[0, 0] == first and int(r.response_mask.sum()) == 1 and not bool(r.truncated[0])


def test_a_temperature_near_zero_with_groups_warns(tmp_path):
    assert "nothing is learned" in sampling_warning(0.01, 8)
    assert sampling_warning(1.0, 8) is None and sampling_warning(0.01, 1) is None
    s = _prepare(tmp_path, tiny_model(), "algorithm.sample.temperature=0.01")
    assert [w for w in s.warnings if "sampling temperature 0.01 with 8 samples" in w]


def test_zero_signal_for_three_steps_in_a_row_warns_once():
    watch = ZeroSignalWatch()
    fracs = [1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
    got = [watch.update({"zero_std_frac": f}) for f in fracs]
    # the run of 1.0 is broken at step 3; steps 4, 5, 6 are three in a row -> warned at step 6 only
    assert [i + 1 for i, w in enumerate(got) if w] == [6]
    assert "1.0 for 3 steps in a row" in got[5]


def test_a_run_at_temperature_near_zero_warns_at_start_and_when_no_group_has_signal(tmp_path):
    from _engine_helpers import metrics, run_train

    out = tmp_path / "run"
    r = run_train(out, "engine.rollout=transformers", "engine.threads=1", "train.steps=3",
                  "algorithm.sample.temperature=0.01")
    assert r.returncode == 0, r.stderr[-3000:]
    err = " ".join(r.stderr.split())
    assert "warning: sampling temperature 0.01 with 8 samples per prompt" in err
    # at T = 0.01 the 8 samples of a prompt coincide: every group has reward std 0 in all 3 steps,
    # the loss is 0 and the run says so after the third step
    assert [m["zero_std_frac"] for m in metrics(out)] == [1.0, 1.0, 1.0]
    assert "warning: step 3: zero_std_frac has been 1.0 for 3 steps in a row" in err
