"""``bench/results/summary.json``: the headline numbers, each with how and when it was taken.

Every benchmark script that produces a headline number calls :func:`record` (one writer for all).
An entry::

    "step_ratio_gsm8k_128": {
      "value": 0.58,                       # the number
      "command": "python bench/step_vs_trl.py --steps 5 ...",   # exactly what produced it
      "load_before": [0.12, 0.30, 0.41],   # os.getloadavg() (1, 5, 15 min) when the script started
      "load_after": [1.98, 1.75, 1.02],    # ... and when it recorded
      "cpus": 2, "date": "2026-12-01T11:02:03Z", "commit": "abc1234", "detail": {...}
    }

A number taken while the 1-minute load average before the run exceeded the machine's cores is
marked ``"loaded": true``: other work shared the cores and timings are pessimistic. Paths inside the
repository are written relative to it (``bench/results/x``, ``.venv/bin/policyzoo``), in the command and
in every string of the detail, so an entry reads the same on any machine (:func:`relative`). The file is
rewritten atomically (temporary file + rename), keeping the other entries.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = ROOT / "bench" / "results" / "summary.json"
#: the 1-, 5- and 15-minute load averages when this module was imported (the script's start)
LOAD_AT_START = list(os.getloadavg())


def relative(value, root: Path = ROOT):
    """``value`` with every path under ``root`` written relative to it: in a string (``/repo/bench/x`` ->
    ``bench/x``, ``/repo`` alone -> ``.``), and recursively in lists and dicts; anything else unchanged."""
    if isinstance(value, str):  # the root itself, then "/" or the end of the path (not /repo-other)
        return re.sub(re.escape(str(root)) + r"(/|(?![\w.-]))", lambda m: "" if m.group(1) else ".", value)
    if isinstance(value, list):
        return [relative(v, root) for v in value]
    if isinstance(value, dict):
        return {k: relative(v, root) for k, v in value.items()}
    return value


def command(argv: list[str] | None = None) -> str:
    """The command line that ran this script, with the paths inside the repository relative to it."""
    script = Path(sys.argv[0]).resolve()
    return relative(shlex.join(["python", str(script), *(sys.argv[1:] if argv is None else argv)]))


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def entry(value, argv: list[str] | None = None, detail: dict | None = None) -> dict:
    cpus = os.cpu_count() or 1
    return {"value": value, "command": command(argv), "load_before": [round(x, 2) for x in LOAD_AT_START],
            "load_after": [round(x, 2) for x in os.getloadavg()], "loaded": LOAD_AT_START[0] > cpus, "cpus": cpus,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": _commit(),
            "detail": relative(detail or {})}


def add_detail(keys: list[str], extra: dict, path: Path = SUMMARY) -> None:
    """Merge ``extra`` into the ``detail`` of each entry of ``keys`` that exists (e.g. the machine's
    rates around a part of ``bench/headline.py --only``); the rest of each entry is kept."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.is_file() else {}
    for key in keys:
        if key in data:
            data[key]["detail"] = {**data[key].get("detail", {}), **relative(extra)}
    _write(data, path)


def record(key: str, value, argv: list[str] | None = None, detail: dict | None = None,
           path: Path = SUMMARY) -> dict:
    """Set ``key`` in the summary file to ``value`` with its command, load and date; returns the
    entry. Other keys are kept; the write is atomic."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[key] = entry(value, argv, detail)
    _write(data, path)
    print(f"summary: {key} = {value} -> {path}", flush=True)
    return data[key]


def _write(data: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".summary-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
