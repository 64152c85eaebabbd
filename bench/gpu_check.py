"""``policyzoo doctor --gpu`` under its former name (issue 20, item 8; the logic is in ``policyzoo.doctor``).

    python bench/gpu_check.py --trainer-only --out bench/results/gpu_check   # policyzoo doctor --gpu --trainer-only
    python bench/gpu_check.py --dry-run                                       # the plan and its time bound

Every argument goes to ``policyzoo doctor --gpu`` unchanged; docs/distributed.md ("On GPUs") has the commands.
"""

from __future__ import annotations

import sys

from policyzoo.cli import main

if __name__ == "__main__":
    sys.exit(main(["doctor", "--gpu", *sys.argv[1:]]))
