"""Config mistakes give one block (where / why / fix), never a stack trace."""

import subprocess
import sys

import pytest

from policyzoo import ConfigError, assemble
from policyzoo.assembly import Run, step_settings
from policyzoo.resolve import resolve_algorithm
from policyzoo.run_config import load_config

NO_PLUGINS = {"POLICYZOO_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": "/usr/bin"}


def _err(**kw) -> str:
    with pytest.raises(ConfigError) as e:
        cfg = load_config(**kw)
        Run(resolve_algorithm(cfg.algorithm))
    return str(e.value)


def test_misspelled_component_suggests_close_match():
    msg = _err(algo="grpo", overrides=["algorithm.clip.use=cispoo"])
    assert "algorithm.clip.use" in msg and "no clip component named 'cispoo'" in msg
    assert "did you mean 'cispo'" in msg and "fix:" in msg


def test_misspelled_algorithm_suggests_close_match():
    msg = _err(algo="grop")
    assert "no algorithm named 'grop'" in msg and "'grpo'" in msg


def test_unknown_config_key_lists_allowed_keys():
    msg = _err(algo="grpo", overrides=["train.lrr=1e-6"])
    assert "train.lrr" in msg and "unknown key 'lrr'" in msg and "did you mean 'lr'" in msg


def test_unknown_component_parameter():
    msg = _err(algo="dapo", overrides=["algorithm.clip.eps_hi=0.3"])
    assert "algorithm.clip" in msg and "unknown parameter 'eps_hi'" in msg and "'eps_high'" in msg


def test_out_of_range_parameter_names_the_valid_range():
    msg = _err(algo="grpo", overrides=["algorithm.clip.eps_low=1.5"])
    assert "algorithm.clip.eps_low" in msg and "1.5" in msg and "[0, 1)" in msg


def test_dual_clip_constant_must_exceed_one():
    msg = _err(algo="grpo", overrides=["algorithm.clip.dual_clip=0.9"])
    assert "dual_clip" in msg and "greater than 1" in msg


def test_sequence_ratio_with_token_sum_reduce_warns():
    with pytest.warns(UserWarning, match="sequence-level ratio") as w:
        assemble({"base": "gspo", "reduce": {"use": "token_sum_norm"}})
    assert "|y_i|" in str(w[0].message) and "seq_mean_token_mean" in str(w[0].message)


def test_group_baseline_with_one_sample_is_rejected():
    with pytest.raises(ConfigError) as e:
        assemble({"base": "grpo", "sample": {"n": 1}})
    assert "n" in str(e.value) and "fix:" in str(e.value)


def test_kl_can_be_removed_but_clip_cannot():
    assert assemble({"base": "grpo", "kl": None}).kl is None
    with pytest.raises(ConfigError):
        assemble({"base": "grpo", "clip": None})


def test_override_keeps_bundle_component_and_merges_params():
    run = assemble({"base": "dapo", "clip": {"eps_high": 0.3}})
    assert run.clip.name == "ppo_clip"
    assert (run.clip.params.eps_low, run.clip.params.eps_high) == (0.2, 0.3)


def test_step_settings_take_algorithm_defaults():
    cfg = load_config(algo="dapo")
    assert step_settings(cfg, assemble(cfg.algorithm)).max_sample_rounds == 3  # the filter's own budget
    cfg = load_config(algo="dapo", overrides=["train.max_sample_rounds=5"])
    assert step_settings(cfg, assemble(cfg.algorithm)).max_sample_rounds == 5


def test_yaml_file_errors(tmp_path):
    assert "config file not found" in _err(path=str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm: grpo\ntrain: {steps: -3}\n")
    msg = _err(path=str(bad))
    assert "train.steps" in msg and "-3" in msg


@pytest.mark.parametrize("override", ["algorithm.clip.use=cispoo", "train.lrr=1", "algorithm.clip.eps_low=2"])
def test_cli_prints_one_block_and_exits_2(override):
    out = subprocess.run([sys.executable, "-m", "policyzoo.cli", "train", "--algo", "grpo", "--dry-run", override],
                         capture_output=True, text=True, env=NO_PLUGINS)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and out.stderr.startswith("error at ")
    assert "fix:" in out.stderr


def test_cli_dry_run_shows_where_each_slot_came_from():
    out = subprocess.run([sys.executable, "-m", "policyzoo.cli", "train", "--algo", "grpo", "--dry-run",
                          "algorithm.clip.use=cispo", "algorithm.clip.eps_high=5.0"],
                         capture_output=True, text=True, env=NO_PLUGINS)
    assert out.returncode == 0, out.stderr
    assert "from: override" in out.stdout and "from: grpo default" in out.stdout
    assert "use: cispo" in out.stdout


def test_duplicate_yaml_key_is_an_error(tmp_path):
    f = tmp_path / "dup.yaml"
    f.write_text("algorithm:\n  base: grpo\n  clip: {use: cispo}\n  clip: {use: ppo_clip}\n")
    msg = _err(path=str(f))
    assert "'clip' is written twice" in msg


def test_algo_flag_sets_the_base_and_keeps_file_overrides(tmp_path):
    f = tmp_path / "hybrid.yaml"
    f.write_text("algorithm:\n  base: grpo\n  clip: {use: cispo, eps_high: 5.0}\n")
    run = Run(resolve_algorithm(load_config(str(f), algo="gspo").algorithm))
    assert run.bundle.parent == "gspo" and run.clip.name == "cispo" and run.ratio.name == "sequence"


def test_slot_overrides_without_a_base_modify_the_default_algorithm():
    run = Run(resolve_algorithm(load_config(overrides=["algorithm.clip.use=cispo"]).algorithm))
    assert run.bundle.parent == "grpo" and run.clip.name == "cispo" and run.kl.name == "k3"


def test_an_empty_reward_list_is_rejected():
    from policyzoo.assembly import reward_uses

    with pytest.raises(ConfigError, match="nothing would be learned"):
        reward_uses(load_config(algo="grpo", overrides=["rewards=[]"]), default=[])


def test_missing_required_parameter_is_named():
    from policyzoo import use

    with pytest.raises(ConfigError) as e:
        assemble("grpo", rewards=(use("function"),))
    assert "rewards[0].function" in str(e.value) and "required parameter 'function' is missing" in str(e.value)


def test_hybrid_names_list_the_changes_as_an_entry_writes_them():
    from policyzoo import use

    grpo = resolve_algorithm("grpo")
    assert grpo.replace(clip=use("cispo")).name == "grpo+clip=cispo"
    # a parameter changed on the same component is named as `compare --algos` writes it (tests/test_entry_names.py)
    assert resolve_algorithm({"base": "grpo", "clip": {"eps_high": 0.28}}).name == "grpo+clip.eps_high=0.28"
    assert resolve_algorithm({"base": "grpo", "clip": {"eps_high": 0.2}}).name == "grpo"  # grpo's own value
    hybrid = resolve_algorithm({"base": "grpo", "filter": [{"use": "drop_truncated"}]})
    assert hybrid.name == "grpo+filter=drop_truncated"


def test_dry_run_output_loads_back_as_the_same_run(tmp_path):
    env = {"POLICYZOO_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": "/usr/bin"}
    args = [sys.executable, "-m", "policyzoo.cli", "train", "--algo", "dapo", "--dry-run",
            "algorithm.clip.use=cispo", "algorithm.sample.n=4"]
    first = subprocess.run(args, capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stderr
    (tmp_path / "resolved.yaml").write_text(first.stdout)
    again = subprocess.run([sys.executable, "-m", "policyzoo.cli", "train", "--config", str(tmp_path / "resolved.yaml"),
                            "--dry-run"], capture_output=True, text=True, env=env)
    assert again.returncode == 0, again.stderr
    import yaml

    a, b = yaml.safe_load(first.stdout), yaml.safe_load(again.stdout)
    assert a["rewards"] == b["rewards"] == [{"use": "answer_match", "weight": 1.0}]
    for slot, entry in a["algorithm"]["slots"].items():  # every component and parameter survives
        assert entry["components"] == b["algorithm"]["slots"][slot]["components"], slot
    assert b["algorithm"]["slots"]["reward"]["components"][0]["use"] == "overlong_penalty"  # extras not doubled
    assert len(b["algorithm"]["slots"]["reward"]["components"]) == 1


def test_bf16_at_zero_stage_0_is_refused_at_config_time():
    msg = _err(algo="grpo", overrides=["model.dtype=bfloat16"])
    assert "engine.zero_stage >= 1" in msg and "fix: set engine.zero_stage=1" in msg
    assert load_config(algo="grpo", overrides=["model.dtype=bfloat16", "engine.zero_stage=1"]).engine.zero_stage == 1


def test_cli_reports_an_unusable_output_path_without_traceback(tmp_path):
    out = subprocess.run([sys.executable, "-m", "policyzoo.cli", "plot", str(tmp_path), "--output",
                          str(tmp_path / "no" / "such" / "x.png")], capture_output=True, text=True,
                         env={"POLICYZOO_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": "/usr/bin"})
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.startswith("error at ")


def test_cli_dry_run_of_slot_overrides_without_algo():
    out = subprocess.run([sys.executable, "-m", "policyzoo.cli", "train", "--dry-run", "algorithm.clip.use=cispo"],
                         capture_output=True, text=True, env=NO_PLUGINS)
    assert out.returncode == 0, out.stderr
    assert "name: grpo+clip=cispo" in out.stdout and "base: grpo" in out.stdout


def test_a_non_boolean_for_a_switch_says_to_give_true_or_false():
    msg = _err(path=None, algo="grpo", overrides=["engine.share_prompt=abc"])
    assert "engine.share_prompt" in msg and "'abc'" in msg and "give engine.share_prompt true or false" in msg


def test_a_name_in_the_wrong_case_is_suggested():
    msg = _err(path=None, algo="GRPO")
    assert "did you mean 'grpo'" in msg


@pytest.mark.parametrize("text", ["", "# only a comment\n", "{}\n"])
def test_an_empty_config_file_is_refused_not_a_default_run(tmp_path, text):
    f = tmp_path / "empty.yaml"
    f.write_text(text)
    msg = _err(path=str(f))
    assert f"error at {f}:" in msg and "holds no settings" in msg and "--algo" in msg
    env = {"POLICYZOO_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": "/usr/bin"}
    out = subprocess.run([sys.executable, "-m", "policyzoo.cli", "train", "--config", str(f), "--dry-run"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "holds no settings" in out.stderr and "Traceback" not in out.stderr


def test_overrides_may_follow_options_and_bad_yaml_is_an_error_block(capsys):
    import yaml as _yaml

    from policyzoo.cli import main

    # argparse alone stops taking key=value after an option: both overrides must arrive
    assert main(["train", "--algo", "grpo", "train.steps=3", "--dry-run", "train.lr=1e-5"]) == 0
    view = _yaml.safe_load(capsys.readouterr().out)
    assert view["train"]["steps"] == 3 and view["train"]["lr"] == 1e-5
    assert main(["train", "--algo", "grpo", "algorithm.clip={use: cispo", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error at algorithm.clip:") and "is not valid YAML" in err and "Traceback" not in err


@pytest.mark.parametrize("override", ["train.steps=true", "train.max_tokens_per_micro_batch=true", "train.lr=false",
                                      "engine.threads=true", "engine.kv_cache_gb=true"])
def test_a_boolean_where_a_number_belongs_is_an_error(override):
    with pytest.raises(ConfigError) as e:  # pydantic's lax mode took true as 1
        load_config(None, "grpo", [override])
    assert e.value.where == override.split("=")[0] and "boolean" in str(e.value)


def test_a_value_of_the_wrong_type_says_how_to_fix_it_not_only_what_the_key_is():
    msg = _err(path=None, algo="grpo", overrides=["train.steps=abc"])
    assert "train.steps" in msg and "'abc'" in msg
    assert "fix: give train.steps a valid value (optimizer steps" in msg and "`policyzoo config`" in msg


def test_unquoted_text_with_a_colon_gets_the_quoting_fix():
    # the shell passes data.system_prompt=Answer: a number as one word when quoted '...'; YAML then reads
    # "Answer: a number" as the mapping {Answer: a number}, not the string
    with pytest.raises(ConfigError) as e:
        load_config(None, "grpo", ["data.system_prompt=Answer: a number"])
    assert e.value.where == "data.system_prompt" and "Input should be a valid string" in e.value.why
    assert e.value.fix == ("values are read as YAML, so text with ': ' in it is a mapping: quote it, e.g. "
                           "'data.system_prompt=\"Answer: a number\"'")
    assert load_config(None, "grpo", ['data.system_prompt="Answer: a number"']).data.system_prompt == \
        "Answer: a number"


def test_critic_lr_is_ten_times_train_lr_when_null_else_its_own_value():
    from policyzoo.config_sections import critic_lr

    c = load_config(algo="grpo", overrides=["train.lr=3e-6"])
    # engine.critic_lr null: 10 x train.lr = 10 x 3e-6 = 3e-5
    assert critic_lr(c.engine, c.train) == pytest.approx(3e-5, rel=1e-12)
    c = load_config(algo="grpo", overrides=["train.lr=3e-6", "engine.critic_lr=1e-4"])
    assert critic_lr(c.engine, c.train) == 1e-4  # set: taken as written, train.lr plays no part


def test_an_override_of_data_use_replaces_the_name_a_saved_config_writes(tmp_path):
    # a run's config.yaml writes the dataset as data.name; compare and `train --resume` pass the user's
    # overrides again, spelled data.use: the override wins, under either spelling, and nothing is left twice
    saved = tmp_path / "config.yaml"
    saved.write_text("data:\n  name: arithmetic\n  few_shot: 2\n")
    assert load_config(str(saved), None, ["data.use=gsm8k"]).data.name == "gsm8k"
    assert load_config(str(saved), None, []).data.name == "arithmetic"
    saved.write_text("data:\n  use: arithmetic\n")
    assert load_config(str(saved), None, ["data.name=gsm8k"]).data.name == "gsm8k"
    # both spellings written in one file by hand are still refused: which one was meant is unknown
    saved.write_text("data:\n  use: arithmetic\n  name: gsm8k\n")
    with pytest.raises(ConfigError):
        load_config(str(saved), None, [])
