"""The files one GRPO training step and one weight sync run through, measured rather than listed by hand.

``policyzoo train --algo grpo`` runs 2 steps on the embedded default model (vLLM samples, DeepSpeed trains,
``engine.sync_check`` on) in this process, with a profile hook (``sys.setprofile``, and ``threading.setprofile``
for threads started meanwhile) on during step 2's ``train_step`` and, inside it, the weight sync
(``WeightSync.sync``). Every Python function called from the project's own source (``core/``, ``plugins/``,
``zoo/``) names its file; the files are printed in the order each was first entered, with that first function.
Step 2, not step 1: the first step also runs what is done once (compiling, first-call caches). On a tree from
before ``core/engine/sync/`` the sync measured is ``LMPolicy.sync``, so an older checkout gives its own counts.

    python bench/step_path.py                            # print both lists
    python bench/step_path.py --write docs/architecture.md   # and replace them between the page's markers

The markers are ``<!-- step-path:NAME -->`` and ``<!-- end step-path:NAME -->`` (NAME: ``step``, ``sync``);
``tests/test_docs.py`` checks that every file the page lists there exists.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = tuple(str(ROOT / d) + os.sep for d in ("core", "plugins", "zoo"))


class Recorder:
    """The project files whose functions were called while it was on, with the first function of each."""

    def __init__(self):
        self.files: dict[str, str] = {}
        self.active = False

    def see(self, frame) -> None:
        path = frame.f_code.co_filename
        if self.active and path.startswith(SOURCES):
            rel = os.path.relpath(path, ROOT)
            self.files.setdefault(rel, getattr(frame.f_code, "co_qualname", frame.f_code.co_name))

    @contextlib.contextmanager
    def on(self):
        self.active = True
        try:
            yield
        finally:
            self.active = False


STEP, SYNC = Recorder(), Recorder()


def _hook(frame, event, arg):
    if event == "call":
        STEP.see(frame)
        SYNC.see(frame)


def record(output_dir: str) -> None:
    """Run 2 steps with the recorders wrapped around step 2 and its weight sync."""
    import policyzoo.engine.run.loop as loop_module
    from policyzoo.cli import main

    try:
        from policyzoo.engine.sync import WeightSync
    except ImportError:  # a tree from before the sync room (the sync was LMPolicy.sync): the same measure there
        from policyzoo.engine.policy import LMPolicy as WeightSync

    step_fn, sync_fn, calls = loop_module.train_step, WeightSync.sync, {"n": 0}

    def train_step(*a, **k):
        calls["n"] += 1
        if calls["n"] != 2:
            return step_fn(*a, **k)
        sys.setprofile(_hook)
        threading.setprofile(_hook)
        try:
            with STEP.on():
                return step_fn(*a, **k)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)

    def sync(self, *a, **k):
        if not STEP.active:
            return sync_fn(self, *a, **k)
        with SYNC.on():
            return sync_fn(self, *a, **k)

    loop_module.train_step, WeightSync.sync = train_step, sync
    code = main(["train", "--algo", "grpo", "--output-dir", output_dir, "train.steps=2", "data.eval_size=4",
                 "engine.sync_check=true", "train.export_final=false", "train.report_to=[]"])
    if code != 0 or calls["n"] < 2 or not SYNC.files:
        raise SystemExit(f"the run did not take 2 steps with a weight sync (exit {code}, {calls['n']} step(s))")


def block(rec: Recorder, what: str) -> str:
    """The markdown list of one recorder's files (first-call order) with their first function."""
    lines = [f"{len(rec.files)} files {what} (measured: `python bench/step_path.py`):", ""]
    lines += [f"{i}. `{path}` (`{fn}`)" for i, (path, fn) in enumerate(rec.files.items(), 1)]
    return "\n".join(lines)


def write(page: Path, blocks: dict[str, str]) -> None:
    """Replace each ``<!-- step-path:NAME -->`` ... ``<!-- end step-path:NAME -->`` of ``page``."""
    text = page.read_text()
    for name, body in blocks.items():
        pattern = re.compile(rf"(<!-- step-path:{name} -->\n).*?(\n<!-- end step-path:{name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{page}: no <!-- step-path:{name} --> ... <!-- end step-path:{name} --> markers")
        text = pattern.sub(lambda m: m.group(1) + body + m.group(2), text)
    page.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", type=Path, help="the page whose step-path blocks are replaced")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        record(str(Path(tmp) / "run"))
    blocks = {"step": block(STEP, "entered during step 2's `train_step`, its weight sync included"),
              "sync": block(SYNC, "entered during one weight sync (`WeightSync.sync`)")}
    for body in blocks.values():
        print(body, end="\n\n")
    if args.write:
        write(args.write, blocks)
        print(f"written: {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
