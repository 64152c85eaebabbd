"""``policyzoo`` command line: zoo, components, plugins, explain, config, train, plan, serve, data, compare, plot,
doctor.

A user's mistake (any :class:`~policyzoo.errors.UserError`) prints one block and exits with 2; a run
stopped by a signal exits with 128 + its number (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import argparse
import signal
import sys

from rich.console import Console

from .cli_catalog import cmd_components, cmd_explain, cmd_plugins, cmd_zoo
from .contract.ground import SLOTS
from .errors import Interrupted, UserError
from .run_args import plan_arguments, serve_arguments, train_arguments

__all__ = ["build_parser", "main", "cmd_train", "cmd_serve", "cmd_plan", "cmd_compare", "cmd_plot", "cmd_doctor"]


def cmd_train(args, out: Console) -> None:
    from .run_config import load_config

    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    if args.max_steps is not None:
        overrides.append(f"train.steps={args.max_steps}")
    port = None
    if args.trl_config:
        from .errors import ConfigError
        from .trl_port import port_trl

        if args.config or args.algo:
            raise ConfigError("--trl-config", "a TRL config sets the whole algorithm and training keys, so it "
                              "cannot be combined with --config or --algo", "drop --config/--algo; change single "
                              "keys with key=value overrides (they win over the TRL config)")
        port = port_trl(args.trl_config)
        config = load_config(None, None, overrides, tree=port.tree)
    elif args.resume and not (args.config or args.algo):
        from policyzoo.engine.run.train import config_from_run_dir

        config = config_from_run_dir(args.resume, overrides)
    else:
        config = load_config(args.config, args.algo, overrides)
    if args.dry_run:  # the checks a real run makes before its weights load, and nothing else
        _dry_run(args, config, port, overrides, out)
        return
    from policyzoo.engine.run.train import main as train_main

    train_main(config, resume=args.resume, force_resume=args.force_resume, verbose=args.verbose)


def _dry_run(args, config, port, overrides: list[str], out: Console) -> None:
    """``train --dry-run``: the resolved config (and with ``--trl-config`` each key's source) on ``out``;
    resume lines, notes, warnings and the one-line verdict on stderr."""
    import yaml

    from policyzoo.engine.run.gpu_profile import console_lines
    from policyzoo.engine.run.preload import preload
    from policyzoo.native_bf16 import rollout_dtype_notes

    pre = preload(config, args.resume, args.force_resume, dry_run=True)
    resolved = pre.resolved
    if port is not None:  # where each key came from: the TRL config, its defaults, or the command line
        given = dict(item.split("=", 1) for item in overrides if "=" in item)
        resolved = {**resolved, "from_trl": port.report(given)}
    out.print(yaml.safe_dump(resolved, sort_keys=False), markup=False, highlight=False, soft_wrap=True)  # YAML
    err = Console(stderr=True, soft_wrap=True)
    for line in pre.resume_lines:
        err.print(line, markup=False, highlight=False)
    for line in rollout_dtype_notes(config) + console_lines(pre) + pre.notes + [f"note: {n}" for n in pre.inert_notes]:
        err.print(line, markup=False, highlight=False)
    for w in pre.warnings:
        err.print(f"warning: {w}", markup=False, highlight=False, style="yellow")
    err.print(f"dry run: every check before loading weights passed (model {pre.model.path}, "
              f"{len(pre.task.train_rows)} training and {len(pre.task.eval_rows)} held-out rows, "
              f"run directory {pre.rundir.path})", markup=False, highlight=False)


def cmd_serve(args, out: Console) -> None:
    from policyzoo.engine.run.serve import main as serve_main

    args.vllm_args = [a for a in args.vllm_args if a != "--"]
    serve_main(args)


def _plan_items(items: list[str]) -> tuple[list[int], str | None, int | None, list[str], float | None]:
    """``policyzoo plan``'s items as ``(sizes P G L, model path, prompt tokens, key=value overrides,
    memory budget in bytes)``; raises :class:`~policyzoo.plan.PlanError` on an item not understood."""
    from .plan import GiB, PlanError

    sizes, model, prompt, overrides, budget = [], None, None, [], None
    for item in items:
        key, eq, value = item.partition("=")
        if not eq and item.lstrip("-").isdigit():
            sizes.append(int(item))
        elif key == "model":
            model = value or None
        elif key == "memory":
            try:
                budget = float(value) * GiB
            except ValueError:
                raise PlanError(item, "memory= takes one GPU's (or rank's) memory in GiB", "e.g. memory=80") from None
        elif key == "prompt":
            if not value.isdigit() or int(value) < 1:
                raise PlanError(item, "prompt= takes the prompt's tokens per row, an integer >= 1", "e.g. prompt=150")
            prompt = int(value)
        elif eq:
            overrides.append(item)
        else:
            raise PlanError(item, "not understood", "give P G L as three integers, model=PATH, prompt=N, memory=GiB "
                            "or key=value")
    return sizes, model, prompt, overrides, budget


def cmd_plan(args, out: Console) -> None:
    """Tokens, FLOPs and memory of one step (``policyzoo.plan``), and with ``--from-run`` the
    measured time split of a run next to the FLOP split."""
    from .plan import PlanError, measured_split

    sizes, model, prompt, overrides, budget = _plan_items(args.items)
    for flag, value in (("--gpus", args.gpus), ("--rollout-tp", args.rollout_tp)):
        if value is not None and value < 1:
            raise PlanError(f"{flag} {value}", f"{flag} takes a GPU count >= 1", f"e.g. {flag} 8")
    if len(sizes) not in (0, 3) or any(x < 1 for x in sizes):
        raise PlanError(" ".join(map(str, sizes)), "give P G L together, each >= 1", "e.g. policyzoo plan 2 4 128")
    split = None
    if args.from_run:
        from policyzoo.engine.run.train import config_from_run_dir
        from policyzoo.engine.rundir import RunDir

        config = config_from_run_dir(args.from_run, overrides)
        split = measured_split(RunDir(args.from_run).read_metrics())
    else:
        from .run_config import load_config

        config = load_config(args.config, args.algo, overrides)
    from .plan.table import print_plan

    print_plan(out, config, model or config.model.path, sizes, prompt, budget, split, args.from_run, args.gpus,
               args.rollout_tp, args.rollout, args.gpu, args.shape)


def cmd_compare(args, out: Console) -> None:
    """Algorithms x seeds: make the runs (``--algos``) or aggregate run directories (``policyzoo.compare``)."""
    from .compare.compare_args import main as compare_main

    compare_main(args, out)


def cmd_plot(args, out: Console) -> None:
    from policyzoo.engine.report.plot import main as plot_main

    plot_main(args.run_dir, args.output)


def cmd_doctor(args, out: Console) -> None:
    """``policyzoo doctor --gpu``: the GPU checks and their report (``policyzoo.doctor``)."""
    from .doctor.runner import cmd_doctor as doctor

    doctor(args, out)


def _commands() -> list[tuple]:
    """Every sub-command in ``--help``'s order: ``(name, help, adds its arguments or None, runs it)``. Adding
    one is a module of its own (its arguments argparse only, its command loading what it runs) and one row
    here. Built at each call, so that a command patched on this module is the one registered."""
    from policyzoo.data.gym import cmd_data

    from .compare.compare_args import add_arguments as compare_arguments
    from .doctor.doctor_args import add_arguments as doctor_arguments
    from .run_config import config_help

    return [
        ("zoo", "algorithm bundles and their slot tables", None, cmd_zoo),
        ("components", "every component in the catalog, with its source",
         lambda c: c.add_argument("--slot", choices=list(SLOTS), help="only this slot's components"), cmd_components),
        ("plugins", "plugin distributions, their hooks and components", None, cmd_plugins),
        ("explain", "a bundle's slots and every default, and the slots inert at the run's settings", _explain_arguments,
         cmd_explain),
        ("config", "every config key with its default and description", None,
         lambda args, out: print(config_help())),
        ("train", "post-train a model (vLLM rollout, DeepSpeed training)", train_arguments, cmd_train),
        ("plan", "tokens, FLOPs and memory of one step, from a model's config.json", plan_arguments, cmd_plan),
        ("serve", "vLLM's OpenAI server as a rollout server for engine.rollout=server", serve_arguments, cmd_serve),
        ("data", "the task names of a generated data source (data.use=reasoning_gym)",
         lambda dt: dt.add_argument("source", choices=["reasoning_gym"]), cmd_data),
        ("compare", "algorithms x seeds on one task: run them, or aggregate run directories, into one table with "
         "95%% intervals and one plot", compare_arguments, cmd_compare),
        ("plot", "draw a run's curves to a PNG", _plot_arguments, cmd_plot),
        ("doctor", "the GPU checks on this node, one markdown report for an issue (--gpu; --dry-run: the plan)",
         doctor_arguments, cmd_doctor),
    ]


def _explain_arguments(e: argparse.ArgumentParser) -> None:
    e.add_argument("name", help="a zoo name or a hybrid entry (grpo, grpo+clip=cispo, grpo+clip.eps_high=0.28)")
    e.add_argument("overrides", nargs="*", default=[], metavar="key=value",  # default: not named as required
                   help="the run's settings (train.updates_per_batch=4, algorithm.clip.use=cispo): the gradient "
                   "probe's regime")


def _plot_arguments(pl: argparse.ArgumentParser) -> None:
    pl.add_argument("run_dir")
    pl.add_argument("--output", help="PNG path (default RUN_DIR/curves.png)")


def build_parser() -> argparse.ArgumentParser:
    """The ``policyzoo`` parser: one sub-parser per row of :func:`_commands`, its ``fn`` the command."""
    p = argparse.ArgumentParser(prog="policyzoo", description=" ".join(__doc__.split("\n\n")[0].split()))
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_, add_arguments, fn in _commands():
        sp = sub.add_parser(name, help=help_)
        if add_arguments is not None:
            add_arguments(sp)
        sp.set_defaults(fn=fn)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # `train --algo grpo x=1 --dry-run y=2`: argparse stops taking key=value after an option
        if getattr(args, "overrides", None) is not None and all("=" in x and not x.startswith("-") for x in extra):
            args.overrides = [*args.overrides, *extra]
        else:
            parser.parse_args(argv)  # argparse's own message and exit 2
    out = Console() if sys.stdout.isatty() else Console(width=200)
    err = Console(stderr=True, soft_wrap=True)  # no line breaks inside a path: the terminal wraps, copies stay whole
    try:
        args.fn(args, out)
    except UserError as e:
        err.print(str(e), markup=False, highlight=False)
        return e.exit_code if isinstance(e, Interrupted) else 2  # 130 / 143: stopped by SIGINT / SIGTERM
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        # a path the user gave (an --output PNG, a folder) that cannot be used
        err.print(UserError(str(e.filename), e.strerror or str(e), "check the path").render(),
                  markup=False, highlight=False)
        return 2
    except KeyboardInterrupt as e:  # a second Ctrl-C, or one before a command's own handling
        signum = getattr(e, "signum", signal.SIGINT)  # policyzoo.engine.run.interrupts.SignalReceived's
        err.print(f"interrupted ({signal.Signals(signum).name})", markup=False)
        return 128 + signum
    return 0


if __name__ == "__main__":
    sys.exit(main())
