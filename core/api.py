"""The Python API, twin of ``policyzoo train``: :func:`train` for a whole run, :class:`Trainer` step by step.

::

    import policyzoo
    from datasets import Dataset

    ds = Dataset.from_list([{"prompt": "What is 2 + 3?", "answer": "5"}, ...])
    summary = policyzoo.train(algo="grpo", model="path/to/hf-model", dataset=ds,
                              rewards=[lambda completions, **kw: [float("5" in c) for c in completions]],
                              output_dir="runs/g1", train={"steps": 20, "lr": 5e-6}, **{"algorithm.sample.n": 4})

    with policyzoo.Trainer(algo="grpo", model=..., dataset="train.csv", rewards=["math_verify"]) as t:
        for _ in range(10):
            metrics = t.step()
        t.evaluate(); t.save()

Arguments map onto the config (``policyzoo config`` lists every key): ``algo`` -> ``algorithm`` (a name, an
entry such as ``"grpo+clip=cispo"``, a mapping, or a :class:`~policyzoo.contract.Bundle`, read as its ``.name``),
``model`` -> ``model.path`` (a dict: the ``model`` section), ``dataset`` -> ``data.path``,
``eval_dataset`` -> ``data.eval_path``,
``output_dir``; ``config`` a YAML file or a dict to start from; every other keyword is a config key,
dotted (``**{"train.lr": 1e-5}``) or a section (``train={"lr": 1e-5}``, merged into it).

* ``dataset`` / ``eval_dataset``: a path (file or folder, as ``data.path``), a ``datasets.Dataset``
  or ``DatasetDict``, or a list of dicts. An in-memory data set is saved into the run directory
  (``RUN_DIR/dataset``, ``RUN_DIR/eval_dataset`` with ``save_to_disk``) and the config points there, so
  the run directory is complete and ``policyzoo train --resume`` can continue it.
* ``rewards``: a list (or one) of reward callables with TRL's signature (see the ``function`` reward),
  component names (``"math_verify"``) or ``{"use": NAME, **params}`` dicts. A callable is registered
  for this process under ``policyzoo.api:REWARDS.<its name>`` (a lambda: ``lambda_<i>``), which
  is what ``config.yaml`` records; a run resumed from the command line needs the same name importable,
  so resume such runs from Python with the same callables.

Errors are :class:`~policyzoo.errors.UserError` subclasses (a bad key, a missing file, ...), raised
before any model loads where the CLI would print them.
"""

from __future__ import annotations

import copy
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .compare.entries import entry_of
from .errors import ConfigError, UserError
from .run_config import _set_dotted, load_config, validate


class _Registry:
    """Callables given to :func:`train`, by name (``policyzoo.api:REWARDS.<name>`` imports them)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise UserError(f"reward: function policyzoo.api:REWARDS.{name}", "this reward was a Python callable "
                        "given to policyzoo.train / policyzoo.Trainer, and exists only in that Python process",
                        "continue the run from Python with the same callable: policyzoo.Trainer(..., "
                        "resume=RUN_DIR, rewards=[...]), or use a 'package.module:function' path")


REWARDS = _Registry()


def reward_entry(reward: Any, index: int) -> Any:
    """A ``rewards:`` config entry for a callable (registered, see the module docstring), a name or a dict."""
    if isinstance(reward, (str, dict)):
        return reward
    if not callable(reward):
        raise ConfigError(f"rewards[{index}]", f"expected a callable, a component name or a dict, got "
                          f"{type(reward).__name__}", "pass e.g. rewards=[my_reward_fn, 'math_verify']")
    name = getattr(reward, "__name__", "") or type(reward).__name__
    name = f"lambda_{index}" if name == "<lambda>" else re.sub(r"\W", "_", name)
    if not re.match(r"[A-Za-z_]", name):
        name = f"reward_{name}"
    vars(REWARDS)[name] = reward
    return {"use": "function", "function": f"policyzoo.api:REWARDS.{name}"}


def _merge(tree: dict, key: str, value: Any) -> None:
    """Set ``key`` (dotted) to ``value``; a dict merges into the section already there (an algorithm
    name becomes ``{base: name}`` first, so ``algo="dapo", algorithm={"sample": {"n": 4}}`` keeps dapo)."""
    if isinstance(value, dict) and "." not in key:
        if key == "algorithm" and isinstance(tree.get(key), str):
            tree[key] = {"base": tree[key]}
        if isinstance(tree.get(key), dict):
            for k, v in value.items():
                _merge(tree[key], k, v)
            return
    _set_dotted(tree, key, copy.deepcopy(value))


def _dataset_path(ds: Any, folder: Path, where: str) -> str:
    """A path for ``data.path``: as given, or an in-memory data set saved to ``folder``."""
    if isinstance(ds, (str, Path)):
        return str(ds)
    try:
        import datasets
    except ImportError:
        raise UserError(where, "an in-memory data set needs the `datasets` package",
                        "pip install datasets, or pass a file path") from None
    if isinstance(ds, list):
        ds = datasets.Dataset.from_list(ds)
    if not isinstance(ds, (datasets.Dataset, datasets.DatasetDict)):
        raise ConfigError(where, f"expected a path, a datasets.Dataset / DatasetDict or a list of dicts, got "
                          f"{type(ds).__name__}", "pass e.g. dataset=Dataset.from_list([...]) or 'train.jsonl'")
    if folder.exists():
        shutil.rmtree(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    ds.save_to_disk(str(folder))
    return str(folder)


def build_config(algo: str | dict | None = None, model: str | dict | None = None, dataset: Any = None,
                 rewards: Any = None, output_dir: str | None = None, eval_dataset: Any = None,
                 config: str | dict | None = None, resume: str | None = None, **overrides: Any):
    """The validated :class:`~policyzoo.run_config.Config` the arguments describe (see the module docstring);
    in-memory data sets are saved into the run directory first."""
    algo = entry_of(algo, "policyzoo.train(algo=...)")  # a Bundle: its name (a run records a name)
    if resume and config is None and algo is None:
        from policyzoo.engine.run.train import config_from_run_dir

        base = config_from_run_dir(resume).model_dump()
    elif isinstance(config, dict):
        base = copy.deepcopy(config)
    else:
        base = load_config(config).model_dump(exclude_unset=True) if config else {}
    tree: dict = base
    if algo is not None:
        tree["algorithm"] = algo
    run_dir = Path(resume or output_dir or tree.get("output_dir") or
                   f"runs/{algo if isinstance(algo, str) else 'run'}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}")
    tree["output_dir"] = str(run_dir)
    if not resume and (run_dir / "config.yaml").exists() and (dataset is not None or eval_dataset is not None):
        from policyzoo.engine.rundir import ResumeError  # checked before a data set is saved over the run's own

        raise ResumeError(str(run_dir), "this run directory already holds a run",
                          "pass resume=RUN_DIR to continue it, or choose another output_dir")
    for key, value in overrides.items():
        _merge(tree, key, value)
    if isinstance(model, dict):  # the model section, as train={...} and data={...} are theirs
        _merge(tree, "model", model)
    elif model is not None:
        _merge(tree, "model.path", str(model))
    if dataset is not None:
        _merge(tree, "data.path", _dataset_path(dataset, run_dir / "dataset", "dataset"))
    if eval_dataset is not None:
        _merge(tree, "data.eval_path", _dataset_path(eval_dataset, run_dir / "eval_dataset", "eval_dataset"))
    if rewards is not None:
        items = rewards if isinstance(rewards, (list, tuple)) else [rewards]
        tree["rewards"] = [reward_entry(r, i) for i, r in enumerate(items)]
    return validate(tree, where="policyzoo.train")


class Trainer:
    """A run driven step by step, on the same engine as ``policyzoo train``.

    ``Trainer(...)`` takes :func:`train`'s arguments, runs every check and loads the models
    (DeepSpeed, then the rollout engine). Then: :meth:`step` (one training step -> its metrics
    record), :meth:`evaluate` (held-out greedy accuracy -> the eval record), :meth:`save` (a
    checkpoint -> its folder), :meth:`train` (the remaining steps up to ``train.steps``, then
    export and summary -> the summary dict), :meth:`close` (export, ``summary.json`` and close the
    trackers, if :meth:`train` did not). ``run_dir`` is the run directory, ``global_step`` the steps
    done, ``loop`` the engine's :class:`~policyzoo.engine.run.loop.RunLoop` (its ``part``: the run's parts)."""

    def __init__(self, algo: str | dict | None = None, model: str | dict | None = None, dataset: Any = None,
                 rewards: Any = None, output_dir: str | None = None, *, eval_dataset: Any = None,
                 config: str | dict | None = None, resume: str | None = None, force_resume: bool = False,
                 verbose: bool = False, **overrides: Any):
        from policyzoo.engine.run.train import open_run

        cfg = build_config(algo, model, dataset, rewards, output_dir, eval_dataset, config, resume, **overrides)
        self.loop = open_run(cfg, resume=resume, force_resume=force_resume, verbose=verbose)
        self.config = cfg
        self.summary: dict | None = None

    @property
    def run_dir(self) -> Path:
        return self.loop.part.rundir.path

    @property
    def global_step(self) -> int:
        return self.loop.state["step"]

    def step(self) -> dict:
        return self.loop.step()

    def evaluate(self) -> dict:
        return self.loop.evaluate()

    def save(self) -> Path:
        return self.loop.save()

    def train(self) -> dict:
        self.summary = self.loop.train()
        return self.summary

    def close(self) -> dict:
        if self.summary is None:
            self.summary = self.loop.finish()
        return self.summary

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.loop.part.tracker.close()


def train(algo: str | dict | None = "grpo", model: str | dict | None = None, dataset: Any = None,
          rewards: Any = None, output_dir: str | None = None, *, eval_dataset: Any = None,
          config: str | dict | None = None, resume: str | None = None, force_resume: bool = False,
          verbose: bool = False, **overrides: Any) -> dict:
    """Train to ``train.steps`` and return the run summary (``summary.json``: held-out accuracy
    before/after, steps, ``tokens_seen``, ``run_dir`` ...). Same arguments as :class:`Trainer`."""
    if resume and config is None and algo == "grpo":
        algo = None  # a resumed run keeps its own algorithm unless one is named
    return Trainer(algo, model, dataset, rewards, output_dir, eval_dataset=eval_dataset, config=config,
                   resume=resume, force_resume=force_resume, verbose=verbose, **overrides).train()

