"""The cross-section rules (policyzoo.rules): docs/config-rules.md lists exactly the rules the module
defines, with their keys and error text; the config rules fail at load_config, the run rules in order."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from policyzoo import rules
from policyzoo.errors import ConfigError
from policyzoo.run_config import load_config

DOC = Path(__file__).resolve().parents[1] / "docs" / "config-rules.md"


def _table() -> dict[str, tuple[tuple[str, ...], str]]:
    """``{rule: (keys, error text)}`` of the table's rows (``| `name` | `k1`, `k2` | raised by | text |``)."""
    out = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"^\| `([a-z0-9_]+)` \| (.+?) \| .+? \| (.+) \|$", line)
        if m:
            assert m.group(1) not in out, f"{m.group(1)} is listed twice"
            out[m.group(1)] = (tuple(re.findall(r"`([^`]+)`", m.group(2))), m.group(3))
    return out


def test_the_table_lists_exactly_the_rules_of_the_module():
    table = _table()
    assert set(table) == set(rules.RULES)
    for name, rule in rules.RULES.items():
        assert table[name] == (rule.keys, rule.text), name


def test_a_config_rule_fails_at_load_config_with_its_reason_and_fix():
    with pytest.raises(ConfigError) as e:
        load_config(None, "grpo", ["train.autocast=true", "model.dtype=bfloat16"])
    assert e.value.why == "train.autocast computes in bf16 over fp32 weights, but model.dtype is already bfloat16"
    assert e.value.fix == "set model.dtype=float32, or train.autocast=false"


HEAD = "engine.fp32_lm_head=true"


@pytest.mark.parametrize("extra, why, fix", [
    (["engine.rollout=transformers", "engine.rollout_dtype=bfloat16"],
     "engine.fp32_lm_head asks the colocated vLLM engine for fp32 logits, but engine.rollout is transformers",
     "set engine.rollout=vllm, or drop engine.fp32_lm_head"),
    (["model.dtype=bfloat16", "engine.zero_stage=1", "engine.rollout_dtype=bfloat16"],
     "engine.fp32_lm_head computes the sampler's logits in fp32 as an fp32 trainer does, but model.dtype is bfloat16",
     "drop engine.fp32_lm_head, or set model.dtype=float32"),
    ([], "engine.fp32_lm_head computes vLLM's logits in fp32 over bf16 weights, but engine.rollout_dtype is float32 "
     "(its logits are fp32 already)", "set engine.rollout_dtype=bfloat16 (or auto: bf16 where the CPU has bf16 "
     "instructions), or drop engine.fp32_lm_head"),
    (["engine.rollout_dtype=float32"], "engine.fp32_lm_head computes vLLM's logits in fp32 over bf16 weights",
     "set engine.rollout_dtype=bfloat16"),
    # auto decides the dtype by the CPU only for an fp32 trainer's own vLLM engine: elsewhere it is refused too
    (["engine.rollout_dtype=auto", "engine.rollout=transformers"], "engine.fp32_lm_head asks the colocated vLLM",
     "set engine.rollout=vllm"),
])
def test_an_fp32_head_that_would_do_nothing_is_refused(extra, why, fix):
    with pytest.raises(ConfigError) as e:
        load_config(None, "grpo", [HEAD, *extra])
    assert e.value.why.startswith(why) and e.value.fix.startswith(fix)


def test_an_fp32_head_with_auto_runs_on_every_cpu(monkeypatch):
    assert load_config(None, "grpo", [HEAD, "engine.rollout_dtype=bfloat16"]).engine.fp32_lm_head  # its use
    monkeypatch.setenv("POLICYZOO_NATIVE_BF16", "0")  # auto chooses float32 here: not refused (a console note)
    assert load_config(None, "grpo", [HEAD, "engine.rollout_dtype=auto"]).engine.rollout_dtype == "float32"


def _config(overlap="none", staleness=0, teacher=None):
    return SimpleNamespace(engine=SimpleNamespace(overlap=overlap, max_staleness=staleness),
                           model=SimpleNamespace(teacher=teacher))


def _run(env=None, kl=None, terms=()):
    named = lambda n: None if n is None else SimpleNamespace(name=n)  # noqa: E731
    return SimpleNamespace(env=named(env), kl=named(kl),
                           term=[SimpleNamespace(name=t, needs_ref=t == "distill") for t in terms])


@pytest.mark.parametrize("config,run,where,start", [
    # overlap and an env: the overlap rule comes first even with a staleness bound too
    (_config("one_step", 1), _run(env="calculator"), "engine.overlap", "one_step sampling ahead"),
    (_config("one_step", 2), _run(), "engine.max_staleness", "engine.overlap=one_step and engine.max_staleness=2"),
    (_config("none", 1), _run(env="calculator"), "engine.max_staleness", "asynchronous sampling"),
])
def test_run_rules_raise_at_their_first_key_in_order(config, run, where, start):
    with pytest.raises(ConfigError) as e:
        rules.check_run(config, run)
    assert e.value.where == where
    assert e.value.why.startswith(start)


def test_run_rules_pass_a_synchronous_run_and_the_teacher_rules_are_apart():
    rules.check_run(_config(), _run(env="calculator", terms=["distill"]))  # the teacher rule is check_teacher's
    with pytest.raises(ConfigError) as e:
        rules.check_teacher_keys(_config(), _run(terms=["distill"]))
    assert (e.value.where, e.value.why.split(",")[0]) == ("algorithm.term", "the term 'distill' distils from a teacher")
    with pytest.raises(ConfigError) as e:
        rules.check_teacher_keys(_config(teacher="/t"), _run(kl="k3", terms=["distill"]))
    assert e.value.where == "model.teacher" and "the kl component 'k3'" in e.value.why
    rules.check_teacher_keys(_config(teacher="/t"), _run(terms=["distill"]))  # a teacher, its reader, no kl


def test_tensor_parallel_rules_raise_in_order_with_k_in_the_text():
    engine = SimpleNamespace(vllm_tensor_parallel_size=2, overlap="none", max_staleness=1, parallel_start=False)
    with pytest.raises(ConfigError) as e:  # staleness and an env both break a rule: staleness is checked first
        rules.check_tensor_parallel_keys(engine, env=True, resamples=False)
    assert e.value.where == "engine.vllm_tensor_parallel_size"
    assert e.value.why.startswith("2: every rank of a group must call the shared engine the same number of times, "
                                  "but engine.max_staleness >= 1 samples in a thread")
    assert e.value.fix == "set engine.max_staleness=0 (or use the rollout server for asynchronous training)"
    with pytest.raises(ConfigError) as e:
        rules.check_tensor_parallel_keys(SimpleNamespace(**{**vars(engine), "max_staleness": 0}), False, True)
    assert e.value.fix == "set engine.vllm_tensor_parallel_size=1, or use a filter without resample"
    rules.check_tensor_parallel_keys(SimpleNamespace(**{**vars(engine), "max_staleness": 0}), False, False)
