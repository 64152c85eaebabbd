"""``policyzoo.from_trl``'s result (the config with its provenance) and TRL's evaluation keys."""

import pytest

pytest.importorskip("trl")

import policyzoo  # noqa: E402
from policyzoo.trl_port import TrlConfig, port_trl  # noqa: E402
from policyzoo.trl_port.train_keys import NO_EVAL  # noqa: E402


def test_from_trl_returns_the_config_with_its_provenance():
    cfg = policyzoo.from_trl({"learning_rate": 2e-6, "use_cpu": True, "num_generations": 4,
                              "per_device_train_batch_size": 8}, world_size=1)
    assert isinstance(cfg, TrlConfig) and isinstance(cfg, dict)
    # the dict is the config: 8 completions / 4 per prompt = 2 prompts per step; the learning rate as given
    assert cfg["train"]["lr"] == 2e-6 and cfg["train"]["prompts_per_step"] == 2
    assert type(cfg.config) is dict and cfg.config == dict(cfg)
    assert cfg.origins["train.lr"] == "learning_rate=2e-06"
    assert cfg.origins["train.seed"] == "seed=42 (default)"  # TRL's default seed
    assert list(cfg.ignored) == ["use_cpu"]
    assert any("use_vllm is false" in n and "0.49-0.65x" in n for n in cfg.notes)  # what generate costs
    assert cfg.trl_version == "1.16.0"
    report = cfg.report({"train.lr": "5e-6"})  # the dry run's from_trl section
    assert report["set"]["train.lr"] == "command line (train.lr) over TRL learning_rate=2e-06"
    assert report["ignored"] == cfg.ignored and report["notes"] == cfg.notes
    # the config is accepted where a dict was
    from policyzoo.api import build_config

    assert build_config(config=cfg).train.lr == 2e-6


def test_eval_strategy_no_turns_evaluation_off():
    port = port_trl({"eval_steps": 5, "per_device_eval_batch_size": 4, "num_generations_eval": 2})
    assert port.tree["data"]["eval_size"] == 0 and "eval" not in port.tree
    assert port.ignored == dict.fromkeys(("eval_steps", "per_device_eval_batch_size", "num_generations_eval"),
                                         NO_EVAL)
    assert port.origins["data.eval_size"] == "eval_strategy='no' (default)"


def test_eval_strategy_steps_evaluates_every_eval_steps():
    port = port_trl({"eval_strategy": "steps", "eval_steps": 5, "per_device_eval_batch_size": 4,
                     "num_generations_eval": 2, "temperature": 0.7})
    assert "eval_size" not in port.tree.get("data", {})  # policyzoo's held-out rows (data.eval_size)
    assert port.tree["train"]["eval_every"] == 5 and port.tree["eval"] == {"n": 2, "temperature": 0.7}
    assert "per_device_eval_batch_size" in port.ignored and "one call" in port.ignored["per_device_eval_batch_size"]
    assert "eval_steps" not in port.ignored
    assert any("every 5 steps, and also before the first step and after the last" in n for n in port.notes)


def test_model_as_a_section_like_train_and_data(tmp_path):
    # model="PATH" names the folder; model={...} is the model section, as train={...} and data={...} are theirs
    from policyzoo.api import build_config

    cfg = build_config("grpo", model={"path": "some/folder", "trust_remote_code": True}, output_dir=str(tmp_path / "r"))
    assert (cfg.model.path, cfg.model.trust_remote_code) == ("some/folder", True)
    assert build_config("grpo", model="other/folder", output_dir=str(tmp_path / "s")).model.path == "other/folder"
