"""The weight sync's room (core/engine/sync.py): one direction, trainer -> rollout, and the run's parts as one
frozen object (core/engine/run/session.py). No model: a fake ``vllm.LLM`` under vLLM's sleeper."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _engine_helpers import stand_in_part
from rich.console import Console

from policyzoo.engine.run import loop as loop_mod
from policyzoo.engine.run.loop import RunLoop
from policyzoo.engine.rundir import RunDir
from policyzoo.engine.sync import Sleeper, WeightSync, cached_prefix
from policyzoo.run_config import load_config

ROOT = Path(__file__).resolve().parents[1]


class _LLM:
    def __init__(self, calls):
        self.calls = calls

    def sleep(self, level):
        self.calls.append(f"sleep({level})")

    def wake_up(self, tags):
        self.calls.append(f"wake({tags[0]})")


def _sync(level: int):
    calls: list[str] = []

    class Rollout:  # as VLLMRollout.load_weights: the weights woken, then written
        sleeper = Sleeper(_LLM(calls), level, release=lambda: calls.append("empty_cache"))

        def load_weights(self, weights):
            self.sleeper.for_push()
            calls.append(f"push({len(list(weights))})")

    class Trainer:
        @contextlib.contextmanager
        def full_weights(self):
            yield [("w", torch.zeros(1)), ("b", torch.zeros(1))]

    return WeightSync(Rollout(), Trainer(), check=False, tolerance=1e-3, timeout_s=5, check_ids=[1, 2]), calls


@pytest.mark.parametrize("level,pushed", [(2, True), (1, False), (0, False)])
def test_before_sampling_pushes_only_a_level_2_engine_that_dropped_its_weights(level, pushed):
    sync, calls = _sync(level)
    sync.before_sampling()  # awake since start: nothing to do at any level
    assert calls == []
    sync.for_training()  # the trainer ran; the update was skipped, so no sync followed
    sync.before_sampling()
    slept = [f"sleep({level})"] if level else []
    # level 2 dropped the weights: the allocator's cache released, the weights mapped, then both pushed
    assert calls == slept + (["empty_cache", "wake(weights)", "push(2)"] if pushed else [])


def test_an_evaluation_after_a_skipped_update_pushes_the_dropped_weights_first(tmp_path, monkeypatch):
    sync, calls = _sync(2)
    pre = SimpleNamespace(rundir=RunDir(tmp_path / "run"), state={"step": 3, "tokens_seen": 0, "batches": 3},
                          run=SimpleNamespace(reward=(), env=None), model=SimpleNamespace(path=tmp_path),
                          task=SimpleNamespace(eval_rows=[{"prompt": "x"}], train_rows=[]), task_rewards_n=0,
                          prompt_counts={})
    part = stand_in_part(load_config(None, "grpo", []), Console(file=open(tmp_path / "c.txt", "w")), pre,
                         policy=SimpleNamespace(weight_sync=sync, stats={}))
    monkeypatch.setattr(loop_mod, "evaluate_held_out", lambda *a, **k: calls.append("evaluate") or {})
    sync.for_training()
    RunLoop(part).evaluate()
    assert calls == ["sleep(2)", "empty_cache", "wake(weights)", "push(2)", "evaluate"]


def test_the_check_prefix_repeats_the_sequence_up_to_the_context_less_one():
    # 3 ids repeated to 10 - 1 = 9 tokens: 1 2 3 1 2 3 1 2 3
    assert cached_prefix([1, 2, 3], 10) == [1, 2, 3, 1, 2, 3, 1, 2, 3]
    assert cached_prefix([1, 2, 3], 5) == [1, 2, 3, 1]  # 4 tokens


#: what the rollout engines may take from the sync module: vLLM's side of it (sleep/wake, the CPU kernels a reload
#: leaves stale), nothing that pushes, gathers or checks
ROLLOUT_MAY_IMPORT = {"Sleeper", "refresh_cpu_kernels", "stale_gemm_modules"}


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, and every ``module:name`` it takes from a module."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = ("." * node.level) + (node.module or "")
            out.add(module)
            out.update(f"{module}:{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def _reaches_back(module: str) -> bool:
    """An import by a rollout file that reaches the policy or the push/check half of the sync."""
    if module.endswith(("engine.lm_policy", "engine.policy")):
        return True
    base, _, name = module.partition(":")
    return base.endswith("engine.sync") and name not in ROLLOUT_MAY_IMPORT and name != ""


def test_the_sync_is_one_direction_no_rollout_file_reaches_the_policy_or_the_push():
    rollout_files = sorted((ROOT / "core" / "engine" / "rollout").rglob("*.py"))
    reach = {f.relative_to(ROOT).as_posix(): sorted(m for m in _imports(f) if _reaches_back(m)) for f in rollout_files}
    assert {f: m for f, m in reach.items() if m} == {}
    # the check is not empty: vllm_engine.py does take vLLM's side of the sync, and would be caught taking the push
    taken = {m for m in _imports(ROOT / "core/engine/rollout/vllm_engine.py") if m.startswith("policyzoo.engine.sync:")}
    assert taken == {"policyzoo.engine.sync:Sleeper", "policyzoo.engine.sync:refresh_cpu_kernels"}
    assert _reaches_back("policyzoo.engine.sync:WeightSync") and _reaches_back("policyzoo.engine.lm_policy")
    # the sleeper holds no way back into the trainer (it was given a push callback before)
    assert set(vars(Sleeper(_LLM([]), 2))) == {"llm", "level", "release", "weights_awake", "kv_awake"}


def test_the_run_part_is_frozen(tmp_path):
    pre = SimpleNamespace(rundir=RunDir(tmp_path / "run"), state={"step": 0}, run=None, model=None, task_rewards_n=0,
                          prompt_counts={})
    part = stand_in_part(load_config(None, "grpo", []), Console(file=open(tmp_path / "c.txt", "w")), pre)
    with pytest.raises(dataclasses.FrozenInstanceError):
        part.trainer = object()
    part.state["step"] = 1  # the counters are the one mutable part
    assert pre.state == {"step": 1}
