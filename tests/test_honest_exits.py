"""Honest names and exits: Ctrl-C is no error, completions of a short run, Hub ids from the local
cache (a fake cache folder laid out like the Hub's: models--ORG--NAME/refs/main, snapshots/REV)."""

from __future__ import annotations

import shutil

import pytest
from _engine_helpers import parser_with, tiny_model

from policyzoo.cli import main
from policyzoo.engine.models import ModelError, resolve_model
from policyzoo.engine.run.loop import logs_completions
from policyzoo.errors import Interrupted


def test_ctrl_c_exits_130_with_its_own_message_and_the_resume_command(monkeypatch, capsys):
    import policyzoo.cli as cli

    def stopped(args, out):
        raise Interrupted("step 3", "stopped by Ctrl-C; checkpoint of step 3 saved in runs/x/checkpoints/step-000003",
                          "policyzoo train --resume runs/x")
    monkeypatch.setattr(cli, "cmd_zoo", stopped)
    monkeypatch.setattr(cli, "build_parser", parser_with(stopped))
    assert main(["zoo"]) == 130  # the shell's code for SIGINT, not 2 (a user's mistake)
    err = capsys.readouterr().err
    assert " ".join(err.split()) == ("stopped at step 3: stopped by Ctrl-C; checkpoint of step 3 saved in "
                                     "runs/x/checkpoints/step-000003 to continue: policyzoo train --resume runs/x")



@pytest.mark.parametrize("steps, every, logged", [
    (3, 10, [1, 3]),          # a short run: its first and last step
    (25, 10, [1, 10, 20, 25]),
    (20, 10, [1, 10, 20]),
    (5, 1, [1, 2, 3, 4, 5]),
    (5, 0, []),               # 0: never
])
def test_completions_are_logged_at_the_first_and_last_step(steps, every, logged):
    assert [s for s in range(1, steps + 1) if logs_completions(s, steps, every)] == logged


def _fake_hub(cache, repo="TinyOrg/tiny-llama", rev="0123456789abcdef0123456789abcdef01234567"):
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(rev)
    shutil.copytree(tiny_model(), folder / "snapshots" / rev)
    return folder / "snapshots" / rev


def test_a_hub_id_in_the_local_cache_resolves_to_its_snapshot(tmp_path, monkeypatch):
    snap = _fake_hub(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # no folder TinyOrg/tiny-llama here
    info = resolve_model("TinyOrg/tiny-llama")
    assert info.path == snap and info.architecture == "LlamaForCausalLM"


def test_a_hub_id_not_in_the_cache_fails_before_load_saying_how_to_fetch_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelError) as e:
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    text = " ".join(str(e.value).split())
    assert "as a Hugging Face Hub id it is not in the local Hub cache" in text and "(HF_HUB_OFFLINE is set)" in text
    assert "hf download HuggingFaceTB/SmolLM2-135M-Instruct" in text
    with pytest.raises(ModelError) as e:  # a path that is no Hub id keeps the folder message
        resolve_model(str(tmp_path / "a" / "b" / "c"))
    assert "does not exist" in str(e.value)


def test_the_dry_run_accepts_a_cached_hub_id_and_refuses_an_uncached_one(tmp_path, monkeypatch, capsys):
    _fake_hub(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    base = ["train", "--algo", "grpo", "--dry-run", "--output-dir", str(tmp_path / "run"),
            "algorithm.sample.max_tokens=12", "train.prompts_per_step=2", "data.limit=16"]
    assert main([*base, "model.path=TinyOrg/tiny-llama"]) == 0
    assert main([*base, "model.path=TinyOrg/not-cached"]) == 2
    assert "not in the local Hub cache" in " ".join(capsys.readouterr().err.split())


def test_multi_turn_episodes_count_their_prompt_tokens(monkeypatch):
    from types import SimpleNamespace

    import policyzoo.engine.lm_policy as policy_mod
    import policyzoo.step.episodes as episodes_mod

    # 2 episodes of prompts of 5 and 3 tokens: 8 prompt tokens (was 0: tokens_seen undercounted)
    monkeypatch.setattr(episodes_mod, "run_episodes",
                        lambda *a, **k: SimpleNamespace(prompt_ids=[[1] * 5, [2] * 3]))
    p = policy_mod.LMPolicy.__new__(policy_mod.LMPolicy)
    p.stats = {"tokens": 0, "seconds": 0.0}
    p.run_episodes(None, [{}], 2, 8, 1.0, 0)
    p.run_episodes(None, [{}], 2, 8, 1.0, 0)
    assert p.stats["prompt_tokens"] == 16
