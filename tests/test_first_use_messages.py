"""Messages a new user meets on the light commands: the did-you-mean of a typo, the extra that installs a
tracker, and ``policyzoo plan`` checking its arguments before it prints anything (and counting GPUs in English)."""

import sys
import tomllib
from pathlib import Path

import pytest

from policyzoo import ConfigError, resolve_algorithm
from policyzoo.cli import main
from policyzoo.config_sections import TrainSettings
from policyzoo.errors import did_you_mean, edit_distance
from policyzoo.plan.placement import count

ROOT = Path(__file__).resolve().parents[1]


def test_edit_distance_by_hand():
    assert edit_distance("kitten", "sitting") == 3  # k->s, e->i, + g
    assert edit_distance("bse", "base") == 1  # insert a
    assert edit_distance("bse", "baseline") == 5  # insert a, then line
    assert edit_distance("gpro", "grpo") == 1  # swap p, r
    assert edit_distance("gpro", "gspo") == 2  # insert s, delete r
    assert edit_distance("", "abc") == 3 and edit_distance("abc", "abc") == 0


def test_did_you_mean_ranks_by_edit_distance_then_prefix():
    # kept: within one edit of the closest (bse: base 1, baseline 5; gpro: grpo 1, gmpo and gspo 2, ppo 2)
    assert did_you_mean("bse", ["baseline", "base", "clip"]) == " (did you mean 'base'?)"
    assert did_you_mean("gpro", ["gspo", "grpo", "gmpo", "ppo"]) == " (did you mean 'grpo' or 'gmpo' or 'gspo'?)"
    assert did_you_mean("GRPO", ["grpo", "dapo"]) == " (did you mean 'grpo'?)"  # case ignored; dapo is 2 away
    assert did_you_mean("x", ["a", "b"]) == ""  # one letter is no evidence
    assert did_you_mean("zzz", ["kl", "clip"]) == ""  # nothing close enough
    # a prefix wins a tie of distance: 'clip' and 'cli_x' are both 1 from 'cli'
    assert did_you_mean("cli", ["cli_x", "clip"]) == " (did you mean 'clip' or 'cli_x'?)"


def test_a_typo_of_base_in_a_hybrid_or_yaml_key_suggests_base(capsys):
    with pytest.raises(ConfigError) as e:
        resolve_algorithm({"base": "grpo", "bse": "dapo"})  # YAML `algorithm: {bse: dapo}`, algorithm.bse=dapo
    assert e.value.where == "algorithm.bse" and "did you mean 'base'?" in e.value.why
    assert "beside them: base, conventions" in e.value.fix
    assert main(["explain", "grpo+bse=dapo"]) == 2  # the entry form
    assert "did you mean 'base'?" in capsys.readouterr().err


def test_a_missing_tensorboard_names_the_extra_that_installs_it(monkeypatch):
    from policyzoo.engine.report.tracking import TrackerError, check_trackers

    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import of either raises ImportError
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(TrackerError) as e:
        check_trackers(["tensorboard"])
    assert e.value.fix == "pip install 'policyzoo[track]', or train.report_to=[] for no tracker"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("tensorboardX") for d in extras["track"])  # the extra named exists and installs it


def test_report_to_takes_one_name_as_trl_writes_it():
    assert TrainSettings(report_to="tensorboard").report_to == ["tensorboard"]
    assert TrainSettings(report_to="none").report_to == []
    assert TrainSettings(report_to=["wandb"]).report_to == ["wandb"]
    with pytest.raises(ValueError):
        TrainSettings(report_to="mlflow")


@pytest.mark.parametrize("args, where, hint", [
    (["--gpu", "h100"], "--gpu h100", "did you mean 'h100-80gb'?"),
    (["--gpus", "2", "--rollout-tp", "4"], "--rollout-tp 4", "groups of 4 of the 2 trainer GPUs share an engine"),
    (["--gpus", "1", "--gpu", "h100-80gb", "memory=80"], "--gpu h100-80gb memory=", "both give one GPU's memory"),
])
def test_plan_checks_its_arguments_before_printing_anything(capsys, args, where, hint):
    assert main(["plan", *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no table before the error
    assert f"error at {where}:" in err and hint in err


def test_plan_counts_one_gpu_in_the_singular(capsys):
    assert (count(1, "trainer GPU"), count(8, "trainer GPU"), count(0)) == ("1 trainer GPU", "8 trainer GPUs", "0 GPUs")
    assert main(["plan", "--gpus", "1", "--gpu", "h100-80gb"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "1 trainer GPU," in out and "1 trainer GPU colocated with TP 1 (ZeRO 0)" in out
    assert "1 trainer GPUs" not in out and "1 GPUs" not in out


def test_explain_without_a_name_asks_for_the_name_alone(capsys):
    with pytest.raises(SystemExit) as e:
        main(["explain"])
    assert e.value.code == 2  # argparse's own exit
    assert capsys.readouterr().err.strip().endswith("the following arguments are required: name")
