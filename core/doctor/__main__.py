"""``python -m policyzoo.doctor --gpu ...``: ``policyzoo doctor`` without the rest of the command line
(for a bare machine where only the trainer subset's packages are installed). Exit status as
``policyzoo doctor``: 0 pass, 1 a part failed or erred, 2 a usage error."""

from __future__ import annotations

import argparse
import sys

from policyzoo.errors import UserError

from .doctor_args import EPILOG, add_arguments
from .runner import cmd_doctor


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m policyzoo.doctor", epilog=EPILOG,
                                description="the GPU checks of policyzoo doctor, one markdown report")
    add_arguments(p)
    try:
        cmd_doctor(p.parse_args(argv), None)
    except UserError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
