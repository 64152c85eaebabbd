"""``policyzoo`` command line: zoo, components, plugins, explain, config, train, plan, serve, data, compare, plot.

A user's mistake (any :class:`~policyzoo.errors.UserError`) prints one block and exits with 2.
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from policyzoo.contract.ground import SLOTS

from .catalog import get_catalog
from .errors import Interrupted, UserError


def _first_line(obj) -> str:
    return ((obj.__doc__ or "").strip().splitlines() or [""])[0]


def _fmt(u) -> str:
    if u is None:
        return "-"
    if isinstance(u, tuple):
        return ", ".join(_fmt(x) for x in u) or "-"
    args = ", ".join(f"{k}={v}" for k, v in u.params.items())
    return f"{u.name}({args})" if args else u.name


def _names(u) -> str:
    if u is None or u == ():
        return "-"
    return ", ".join(x.name for x in u) if isinstance(u, tuple) else u.name


def cmd_zoo(args, out: Console) -> None:
    """One row per bundle, component names per slot (``explain NAME`` shows the parameters)."""
    cat = get_catalog()
    table = Table(title="policyzoo algorithms (parameters: policyzoo explain NAME)")
    for col in ["name", "from", *SLOTS]:
        table.add_column(col, overflow="fold")
    for name, (bundle, src) in sorted(cat.bundles.items()):
        table.add_row(name, src.dist, *[_names(getattr(bundle, s)) for s in SLOTS])
    out.print(table)


def cmd_components(args, out: Console) -> None:
    cat = get_catalog()
    table = Table(title="policyzoo components")
    for col in ("slot", "name", "source", "summary"):
        table.add_column(col)
    for slot in SLOTS:
        if args.slot and slot != args.slot:
            continue
        for name, (cls, src) in sorted(cat.components[slot].items()):
            table.add_row(slot, name, f"{src.dist} {src.version}", _first_line(cls))
    out.print(table)


def cmd_plugins(args, out: Console) -> None:
    """Every plugin distribution; broken ones (import or registration failed) are listed with their
    error instead of stopping the command (a run refuses them; ``POLICYZOO_PLUGINS`` leaves them out)."""
    from .catalog import load_catalog

    cat = load_catalog(keep_broken=True)
    table = Table(title="plugin distributions")
    for col in ("distribution", "version", "module", "hooks", "components", "bundles"):
        table.add_column(col)
    for p in cat.plugins:
        table.add_row(p.dist, p.version, p.module, ", ".join(p.hooks), ", ".join(p.components) or "-",
                      ", ".join(p.bundles) or "-")
    out.print(table)
    if cat.broken:
        bad = Table(title="broken plugin distributions (a run refuses them: fix or uninstall them, or set "
                    "POLICYZOO_PLUGINS to the distributions you need)")
        for col in ("distribution", "version", "entry point", "error"):
            bad.add_column(col, overflow="fold")
        for b in cat.broken:
            bad.add_row(b.dist, b.version, b.entry_point, b.error)
        out.print(bad)


def cmd_explain(args, out: Console) -> None:
    cat = get_catalog()
    bundle = cat.bundle(args.name, "explain")
    out.print(f"[bold]{bundle.name}[/bold]: {bundle.summary}")
    out.print(f"paper: {bundle.paper}")
    if bundle.parent:
        out.print(f"parent: {bundle.parent} (slots marked 'inherited' come from it unchanged)")
    for slot in SLOTS:
        uses = getattr(bundle, slot)
        uses = uses if isinstance(uses, tuple) else (() if uses is None else (uses,))
        origin = f"   (inherited from {bundle.parent})" if slot in bundle.inherited else ""
        if not uses and slot == "reward":
            out.print(f"  {slot:9s} -  (no extras: the task's reward comes from `rewards:` or the data task's "
                      f"default){origin}", markup=False)
        elif not uses:
            out.print(f"  {slot:9s} -  (absent){origin}", markup=False)
        for u in uses:
            cls = cat.component(slot, u.name)
            params = cls(**u.params).params.model_dump()
            out.print(f"  {slot:9s} {u.name}  [{cat.components[slot][u.name][1]}]{origin}", markup=False)
            for k, v in params.items():
                mark = "" if k in u.params else "   (component default)"
                out.print(f"              {k} = {v!r}{mark}", markup=False)


def cmd_train(args, out: Console) -> None:
    from .config import load_config

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
        import yaml

        from policyzoo.engine.run.preload import preload

        pre = preload(config, args.resume, args.force_resume, dry_run=True)
        resolved = pre.resolved
        if port is not None:  # where each key came from: the TRL config, its defaults, or the command line
            given = dict(item.split("=", 1) for item in overrides if "=" in item)
            resolved = {**resolved, "from_trl": port.report(given)}
        out.print(yaml.safe_dump(resolved, sort_keys=False))
        err = Console(stderr=True, soft_wrap=True)
        for line in pre.resume_lines:
            err.print(line, markup=False, highlight=False)
        for line in pre.notes:
            err.print(line, markup=False, highlight=False)
        for w in pre.warnings:
            err.print(f"warning: {w}", markup=False, highlight=False, style="yellow")
        err.print(f"dry run: every check before loading weights passed (model {pre.model.path}, "
                  f"{len(pre.task.train_rows)} training and {len(pre.task.eval_rows)} held-out rows, "
                  f"run directory {pre.rundir.path})", markup=False, highlight=False)
        return
    from policyzoo.engine.run.train import main as train_main

    train_main(config, resume=args.resume, force_resume=args.force_resume, verbose=args.verbose)


def cmd_serve(args, out: Console) -> None:
    from policyzoo.engine.run.serve import main as serve_main

    args.vllm_args = [a for a in args.vllm_args if a != "--"]
    serve_main(args)


def cmd_plan(args, out: Console) -> None:
    """Tokens, FLOPs and memory of one step (``policyzoo.plan``), and with ``--from-run`` the
    measured time split of a run next to the FLOP split."""
    from .plan import GiB, PlanError, measured_split

    sizes, model, prompt, overrides, budget = [], None, None, [], None
    for item in args.items:
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
        from .config import load_config

        config = load_config(args.config, args.algo, overrides)
    from .plan.table import print_plan

    print_plan(out, config, model or config.model.path, sizes, prompt, budget, split, args.from_run, args.gpus,
               args.rollout_tp, args.rollout, args.gpu, args.shape)


def cmd_compare(args, out: Console) -> None:
    """Algorithms x seeds: make the runs (``--algos``) or aggregate run directories (``policyzoo.compare``)."""
    from .compare.cli import main as compare_main

    compare_main(args, out)


def cmd_plot(args, out: Console) -> None:
    from policyzoo.engine.report.plot import main as plot_main

    plot_main(args.run_dir, args.output)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="policyzoo", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("zoo", help="algorithm bundles and their slot tables").set_defaults(fn=cmd_zoo)
    c = sub.add_parser("components", help="every component in the catalog, with its source")
    c.add_argument("--slot", choices=list(SLOTS))
    c.set_defaults(fn=cmd_components)
    sub.add_parser("plugins", help="plugin distributions, their hooks and components").set_defaults(fn=cmd_plugins)
    e = sub.add_parser("explain", help="a bundle's slots and every default")
    e.add_argument("name")
    e.set_defaults(fn=cmd_explain)
    from .config import config_help

    cfg = sub.add_parser("config", help="every config key with its default and description")
    cfg.set_defaults(fn=lambda args, out: print(config_help()))
    t = sub.add_parser("train", help="post-train a model (vLLM rollout, DeepSpeed training)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="held-out value (eval_accuracy): the mean over the held-out rows of the task's "
                       "summed reward of one greedy completion per row; shown as 'accuracy' when the task's reward "
                       "is one 0/1 correctness check (answer_match, math_verify), else as 'held-out reward'.\n\n"
                       "config keys (set with key=value; algorithm slot parameters: policyzoo explain NAME):\n"
                       + config_help())
    t.add_argument("--algo", help="a zoo name, e.g. grpo")
    t.add_argument("--config", help="a YAML config file")
    t.add_argument("--trl-config", metavar="FILE", help="a TRL GRPOConfig as YAML, ported key by key (TRL's "
                   "defaults for keys it does not give; key=value overrides win; --dry-run shows each key's source)")
    t.add_argument("--output-dir", help="the run directory (default runs/<algo>-<time>)")
    t.add_argument("--max-steps", type=int)
    t.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last complete checkpoint")
    t.add_argument("--force-resume", action="store_true",
                   help="with --resume: load the checkpoint even if its algorithm, reward, model or data "
                   "config differs")
    t.add_argument("--dry-run", action="store_true", help="run every check the real run makes before loading "
                   "weights (config, plugins, data and the columns the rewards need, model folder and tokenizer, "
                   "prompt lengths, trackers, DeepSpeed config, run directory, checkpoint), print the resolved "
                   "config and exit; nothing is written")
    t.add_argument("--verbose", action="store_true", help="show library logs and warnings that are silenced by "
                   "default (Triton, deprecated reduce_op, NUMA binding, info logs)")
    t.add_argument("overrides", nargs="*", metavar="key=value")
    t.set_defaults(fn=cmd_train)
    pn = sub.add_parser("plan", help="tokens, FLOPs and memory of one step, from a model's config.json")
    pn.add_argument("--algo", help="a zoo name (default grpo)")
    pn.add_argument("--config", help="a YAML config file")
    pn.add_argument("--from-run", metavar="RUN_DIR", help="plan a finished run and show its measured time split")
    pn.add_argument("--gpus", type=int, help="trainer GPUs (data-parallel ranks): print the model state per GPU")
    pn.add_argument("--rollout-tp", type=int, help="GPUs one vLLM engine is sharded over "
                    "(engine.vllm_tensor_parallel_size)")
    pn.add_argument("--rollout", choices=["colocated", "server"], help="vLLM on the trainer's GPUs or on a server's")
    pn.add_argument("--gpu", help="the GPU whose memory the verdict judges (h100-80gb, a100-80gb, h200-141gb, ...; "
                    "default with --gpus: h100-80gb)")
    pn.add_argument("--shape", help="a known model shape instead of model=PATH (qwen2.5-1.5b, qwen2.5-7b, "
                    "llama-3.1-8b, llama-3.1-70b)")
    pn.add_argument("items", nargs="*", metavar="P G L | model=PATH | prompt=N | memory=GiB | key=value")
    pn.set_defaults(fn=cmd_plan)
    sv = sub.add_parser("serve", help="vLLM's OpenAI server as a rollout server for engine.rollout=server")
    sv.add_argument("--model", help="model folder or Hub id in the local cache (default: the embedded default)")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind; other than loopback only with a shared "
                    "secret (--token-file or POLICYZOO_SERVER_TOKEN)")
    sv.add_argument("--token-file", metavar="FILE", help="a file only you can read (chmod 600) holding the shared "
                    "secret; every route then needs Authorization: Bearer <secret> (or set POLICYZOO_SERVER_TOKEN)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--tensor-parallel-size", type=int, default=1)
    sv.add_argument("--dtype", default="float32", help="as the trainer's model.dtype (engine.rollout_dtype)")
    sv.add_argument("--max-model-len", type=int)
    sv.add_argument("--seed", type=int, default=0)
    sv.add_argument("--served-model-name")
    sv.add_argument("--weight-transfer", help="vLLM weight-transfer backend (default: nccl on CUDA, "
                    "policyzoo_gloo on CPU)")
    sv.add_argument("--kv-cache-gb", type=float, default=1.0, help="CPU only: vLLM's KV cache, GiB")
    sv.add_argument("vllm_args", nargs=argparse.REMAINDER, help="after --: arguments passed to vLLM unchanged")
    sv.set_defaults(fn=cmd_serve)
    from policyzoo.data.gym import cmd_data

    dt = sub.add_parser("data", help="the task names of a generated data source (data.use=reasoning_gym)")
    dt.add_argument("source", choices=["reasoning_gym"])
    dt.set_defaults(fn=cmd_data)
    from .compare.cli import add_arguments as compare_arguments

    cp = sub.add_parser("compare", help="algorithms x seeds on one task: run them, or aggregate run directories, "
                        "into one table with 95%% intervals and one plot")
    compare_arguments(cp)
    cp.set_defaults(fn=cmd_compare)
    pl = sub.add_parser("plot", help="draw a run's curves to a PNG")
    pl.add_argument("run_dir")
    pl.add_argument("--output", help="PNG path (default RUN_DIR/curves.png)")
    pl.set_defaults(fn=cmd_plot)
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
    try:
        args.fn(args, out)
    except UserError as e:
        Console(stderr=True).print(str(e), markup=False, highlight=False)
        return 130 if isinstance(e, Interrupted) else 2  # Ctrl-C after a saved checkpoint
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        # a path the user gave (an --output PNG, a folder) that cannot be used
        Console(stderr=True).print(UserError(str(e.filename), e.strerror or str(e), "check the path").render(),
                                   markup=False, highlight=False)
        return 2
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted", markup=False)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
