"""``policyzoo compare``'s arguments and entry (the sub-command of :mod:`policyzoo.cli`)."""

from __future__ import annotations

import argparse

from rich.console import Console

from .api import compare

EPILOG = """two forms:
  policyzoo compare --algos grpo,dr_grpo,grpo+clip=cispo --seeds 3 --output-dir runs/cmp [key=value ...]
      one `policyzoo train` run per (algorithm, seed) in runs/cmp/ALGO/seedS (finished runs are skipped,
      interrupted ones resumed), then the table; --print-commands prints the train commands instead
  policyzoo compare runs/cmp [more folders or globs] [--baseline grpo] [--allow-mixed]
      the table of runs that exist
an entry of --algos is a zoo name with slot changes joined by '+': grpo+clip=cispo is
`--algo grpo algorithm.clip.use=cispo`, grpo+clip.eps_high=0.28 sets a parameter (docs/compare.md)"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    p.add_argument("--algos", help="comma-separated entries: zoo names or hybrids (grpo+clip=cispo)")
    p.add_argument("--seeds", help="with --algos: a count (3: seeds 0, 1, 2) or a list (0,5,7); default 3")
    p.add_argument("--output-dir", help="where the runs go (with --algos) and where compare.md/.json/.png are "
                   "written (default: the one folder given, the folder holding it when it is one run's own, else "
                   "the folder holding the runs compared)")
    p.add_argument("--parallel", type=int, help="with --algos: runs at once (default 1), each with cores // N "
                   "threads")
    p.add_argument("--print-commands", action="store_true", help="with --algos: print one `policyzoo train` line per "
                   "run still to do (for your own scheduler) and exit")
    p.add_argument("--export", action="store_true", help="with --algos: keep each run's final/ save_pretrained "
                   "export (default: none; and no checkpoint is kept once a run is finished)")
    p.add_argument("--baseline", help="the algorithm the paired differences are taken against (default: the first)")
    p.add_argument("--allow-mixed", action="store_true", help="compare runs whose settings differ in more than "
                   "the algorithm and the seed (the keys are listed with the table)")
    p.add_argument("--allow-equal", action="store_true", help="with --algos: run entries that give the same gradient "
                   "at these settings (refused by default; docs/compare.md)")
    p.add_argument("overrides", nargs="*", metavar="RUN_DIR | key=value",
                   help="run folders or globs to aggregate; with --algos: train overrides")


def main(args: argparse.Namespace, out: Console) -> None:
    common = dict(output_dir=args.output_dir, baseline=args.baseline, allow_mixed=args.allow_mixed, console=out,
                  seeds=args.seeds, parallel=1 if args.parallel is None else args.parallel,
                  print_commands=args.print_commands,  # without --algos the last five are refused, not ignored
                  export=args.export, allow_equal=args.allow_equal)
    if args.algos is None:
        compare(args.overrides or None, **common)
    else:
        compare(algos=args.algos, overrides=args.overrides, **common)
