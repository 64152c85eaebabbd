"""Experiment tracking: TensorBoard and Weights & Biases, and the completions log.

``train.report_to`` names the trackers (``tensorboard``, ``wandb``; ``[]`` for none). Every
record written to ``metrics.jsonl`` goes to each tracker too, under the same keys (``reward_mean``,
``reward/<function>``, ``lr``, ``tokens_seen``, ``epoch``, ``eval_accuracy`` ...) at its ``step``;
non-numeric values (``eval_example``, ``skip_reason``) stay in the file only; NaN and inf go to W&B
as they are and are left out of TensorBoard (a gap at that step).

* TensorBoard: ``tensorboardX`` (or ``torch.utils.tensorboard`` when only ``tensorboard`` is
  installed) writes event files to ``RUN_DIR/tensorboard/`` (``tensorboard --logdir RUN_DIR``).
  A resumed run purges events after the checkpoint's step, as ``metrics.jsonl`` is truncated.
* Weights & Biases: ``wandb.init(project=$WANDB_PROJECT or "policyzoo", name=RUN_DIR's name,
  dir=RUN_DIR, config=the run's config)``; ``WANDB_MODE=offline`` logs without a network (sync later
  with ``wandb sync``). wandb is not installed by ``make``: ``pip install 'policyzoo[wandb]'``.

Completions: at the first and last step and every ``train.log_completions_every`` steps, one JSON line
per sampled row goes to
``RUN_DIR/completions.jsonl`` (``step``, ``prompt``, ``completion``, ``reward``, one ``reward/<label>`` key per
reward component, as in the metrics, ``advantage``, ``group``; under data parallel every rank's rows, gathered,
with ``rank``: group ids count per rank), and the same rows as a table to each
tracker (TensorBoard: a markdown table under the text tag ``completions``; W&B: a ``wandb.Table``).
Only rank 0 writes.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from policyzoo.engine import dist
from policyzoo.errors import UserError

TRACKERS = ("tensorboard", "wandb")
#: what installs each tracker: the extras of pyproject.toml's [project.optional-dependencies]
TRACK_EXTRA, WANDB_EXTRA = "policyzoo[track]", "policyzoo[wandb]"


class TrackerError(UserError):
    """A tracker named in ``train.report_to`` cannot be used (its package is missing)."""


def _tensorboard_writer_class():
    try:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    except ImportError:
        pass
    try:
        from torch.utils.tensorboard import SummaryWriter
        return SummaryWriter
    except ImportError:
        raise TrackerError("train.report_to: tensorboard", "neither tensorboardX nor tensorboard is installed "
                           "(policyzoo's `track` extra installs tensorboardX, ~90 kB)",
                           f"pip install '{TRACK_EXTRA}', or train.report_to=[] for no tracker") from None


def _wandb():
    try:
        import wandb
    except ImportError:
        raise TrackerError("train.report_to: wandb", "the wandb package is not installed (make does not "
                           "install it: it is about 20 MB with its dependencies)",
                           f"pip install wandb  (or: pip install '{WANDB_EXTRA}'), or remove wandb from "
                           "train.report_to") from None
    return wandb


def check_trackers(report_to: list[str]) -> None:
    """Raise :class:`TrackerError` now (before any model loads) for a tracker that cannot start."""
    for name in report_to:
        if name == "tensorboard":
            _tensorboard_writer_class()
        elif name == "wandb":
            _wandb()


def scalars(record: dict) -> dict[str, float]:
    """The record's numbers (bools as 0/1), without ``step`` and ``kind``; NaN and inf are kept."""
    out = {}
    for k, v in record.items():
        if k in ("step", "kind") or isinstance(v, str) or v is None:
            continue
        if isinstance(v, (bool, int, float)):
            out[k] = float(v)
    return out


class Tracker:
    """The trackers of one run (rank 0 only; other ranks hold an inactive one)."""

    def __init__(self, run_dir: Path, report_to: list[str], config: dict, resume_step: int | None = None):
        self.run_dir = Path(run_dir)
        self.active = dist.rank() == 0
        self.tb = self.wandb = None
        self.completions_file = self.run_dir / "completions.jsonl"
        if not self.active:
            return
        if resume_step is not None:
            self._truncate_completions(resume_step)
        if "tensorboard" in report_to:
            writer = _tensorboard_writer_class()
            self.tb = writer(log_dir=str(self.run_dir / "tensorboard"),
                             purge_step=None if resume_step is None else resume_step + 1)
        if "wandb" in report_to:
            wandb = _wandb()
            self.wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "policyzoo"), name=self.run_dir.name,
                                    dir=str(self.run_dir), config=config, resume="allow",
                                    id=os.environ.get("WANDB_RUN_ID"))

    def log(self, record: dict) -> None:
        """Every number of a ``metrics.jsonl`` record, at ``record["step"]``."""
        if not self.active:
            return
        step, values = int(record.get("step", 0)), scalars(record)
        if self.tb is not None:
            for k, v in values.items():  # NaN/inf (a skipped step's loss, a metric with no rows): a gap in the
                if math.isfinite(v):      # chart (metrics.jsonl keeps null), not TensorBoard's NaN warning
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(values, step=step)

    def log_completions(self, step: int, rows: list[dict]) -> None:
        """Append ``rows`` (see the module docstring) to ``completions.jsonl`` and the trackers."""
        if not self.active or not rows:
            return
        with open(self.completions_file, "a") as f:
            for row in rows:
                f.write(json.dumps({"step": step, **{k: _clean(v) for k, v in row.items()}}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        columns = list(rows[0])
        if self.tb is not None:
            head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
            body = "".join("| " + " | ".join(_cell(r.get(c)) for c in columns) + " |\n" for r in rows)
            self.tb.add_text("completions", head + body, step)
            self.tb.flush()
        if self.wandb is not None:
            import wandb

            table = wandb.Table(columns=["step", *columns], data=[[step, *(r.get(c) for c in columns)] for r in rows])
            self.wandb.log({"completions": table}, step=step)

    def _truncate_completions(self, step: int) -> None:
        """Keep the rows of steps <= ``step`` (a resumed run starts after its checkpoint)."""
        if not self.completions_file.is_file():
            return
        keep = []
        for line in self.completions_file.read_text().splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    keep.append(line + "\n")
            except json.JSONDecodeError:  # a line cut by a kill
                break
        tmp = self.completions_file.with_name(".completions.jsonl.tmp")
        tmp.write_text("".join(keep))
        os.replace(tmp, self.completions_file)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def completion_rows(batch, labels: list[str]) -> list[dict]:
    """One dict per row of a prepared :class:`~policyzoo.contract.StepBatch`: ``prompt`` (the text
    the model saw), ``completion``, ``reward`` (the weighted sum), ``reward/<label>`` for each
    reward component's own unweighted score (``batch.reward_components[:, k]`` under ``labels[k]``),
    ``advantage`` (the row's mean advantage over its response tokens, which is the advantage itself
    for outcome rewards; NaN for an empty response) and ``group``; rows sampled ahead
    (``engine.overlap``, ``engine.max_staleness``) add ``policy_lag`` (their staleness, optimizer
    steps) and, when known, ``policy_version`` (the weight pushes that had sampled them)."""
    r, parts = batch.rollout, batch.reward_components
    mask = r.response_mask.float()
    if batch.advantages is None:
        adv = [math.nan] * len(r)
    else:
        adv_t = batch.advantages if batch.advantages.dim() == 2 else batch.advantages[:, None].expand_as(mask)
        n = mask.sum(-1)
        adv = [(float((adv_t[i] * mask[i]).sum() / n[i]) if n[i] > 0 else math.nan) for i in range(len(r))]
    out = []
    for i in range(len(r)):
        row = {"prompt": r.prompts[i] if i < len(r.prompts) else "",
               "completion": r.completions[i] if i < len(r.completions) else "",
               "reward": float(batch.rewards[i])}
        if parts is not None:
            row.update({f"reward/{label}": float(parts[i, k]) for k, label in enumerate(labels)})
        row.update(advantage=adv[i], group=int(r.group_ids[i]))
        for key in ("policy_version", "policy_lag"):  # sampled ahead: which weights, how many steps stale
            if getattr(r, key, None) is not None:
                row[key] = int(getattr(r, key)[i])
        out.append(row)
    return out


def _clean(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _cell(v) -> str:
    text = f"{v:.4g}" if isinstance(v, float) else str(v)
    return text.replace("|", "\\|").replace("\n", "<br>")
