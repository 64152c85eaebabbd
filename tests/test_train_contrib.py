"""The contrib plugin distributions (pip-installed, found through their entry points) train two
steps on the tiny model through the real engine, alone and inside a hybrid with a zoo bundle."""

from __future__ import annotations

import json
import math

import pytest
from _engine_helpers import metrics, run_train

CASES = {
    "sapo bundle": ("sapo", []),
    "grpo with sapo's clip": (None, ["algorithm.clip.use=sapo"]),
    "rloo with geometric-mean TIS": ("rloo", ["algorithm.ratio.use=geo_tis"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_contrib_component_trains_two_steps(tmp_path, case):
    algo, extra = CASES[case]
    out = tmp_path / "run"
    proc = run_train(out, "train.steps=2", "algorithm.sample.n=4", *extra, algo=algo)
    assert proc.returncode == 0, proc.stderr[-4000:]
    train = metrics(out)
    assert [r["step"] for r in train] == [1, 2]
    assert all(math.isfinite(r["loss"]) and r["skipped"] == 0 for r in train)
    resolved = (out / "resolved.yaml").read_text()
    plugin = "policyzoo-sapo" if "sapo" in case else "policyzoo-tis"
    assert plugin in resolved  # the slot's source is the plugin distribution
    assert any(p["distribution"] == plugin for p in json.loads((out / "plugins.json").read_text()))
