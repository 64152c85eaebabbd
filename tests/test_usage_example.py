"""docs/usage.md's Python example runs as pasted, at tiny size: the ```python block is read from the page and
run in a fresh process in an empty folder. Only its size changes: the tiny model is passed to both
calls (the default model's steps take minutes here) and the step counts shrink; each edit must match
exactly once, so a change of the page that this test no longer follows fails it instead of passing
untested."""

from __future__ import annotations

import json
import subprocess
import sys

from _engine_helpers import ROOT, engine_env, tiny_model


def usage_python_block() -> str:
    text = (ROOT / "docs" / "usage.md").read_text()
    return text.split("```python\n", 1)[1].split("```", 1)[0]


def test_usage_python_example_runs_as_pasted(tmp_path):
    code, tiny = usage_python_block(), str(tiny_model())
    for old, new in (('"steps": 20', '"steps": 2'), ("range(10)", "range(2)"),
                     ('policyzoo.train(algo="grpo",', f'policyzoo.train(algo="grpo", model={tiny!r},'),
                     ('policyzoo.Trainer(algo="grpo",', f'policyzoo.Trainer(algo="grpo", model={tiny!r},')):
        assert code.count(old) == 1, f"docs/usage.md's example no longer has {old!r}: update this test's edits"
        code = code.replace(old, new)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=engine_env(), capture_output=True,
                          text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # the first example: 200 rows, 20% (40) held out; three rewards summed -> "held-out reward"
    summary = json.loads((tmp_path / "runs" / "py1" / "summary.json").read_text())
    assert summary["eval_metric"] == "held-out reward" and proc.stdout.startswith("held-out reward ")
    # the second: the CSV it writes itself, 2 steps, a checkpoint, final/ exported on leaving the block
    assert (tmp_path / "train.csv").read_text().count("\n") == 201  # header + 200 rows
    assert (tmp_path / "runs" / "py2" / "final" / "config.json").is_file()
    steps = [json.loads(x) for x in (tmp_path / "runs" / "py2" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r.get("kind") == "train"] == [1, 2]
