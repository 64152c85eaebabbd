"""Build the travel bundle of ``policyzoo doctor --gpu --trainer-only`` into ``.build/gpu-bundle`` (ignored by
git): what a bare GPU machine with only torch, transformers, accelerate, peft and pytest lacks, under 64 MiB.

    make gpu-bundle          # = python bench/gpu_bundle.py; then carry .build/gpu-bundle to the machine

* ``wheels/``: pydantic, pydantic-core, hjson, pluggy, rich, httpx and the other small requirements of DeepSpeed and
  policyzoo (:data:`DOWNLOADED`; ``pip download``, the versions installed here) and DeepSpeed and policyzoo built
  here as pure-Python wheels (``pip wheel``, ``DS_BUILD_OPS=0``). The binary wheels (pydantic-core, msgpack,
  psutil) are for this machine's Python unless ``--python-version`` names the check machine's: the GPU machines
  lent here run Python 3.12 while this one runs 3.11, and a cp311 pydantic-core does not install on 3.12
  (``python bench/gpu_bundle.py --python-version 3.12``). ``--with-trl`` adds TRL, datasets and their two
  requirements a torch image lacks (dill, multiprocess), for the doctor's ``trl_step`` part. On the machine::

      pip install --no-index --no-deps --target /tmp/site .build/gpu-bundle/wheels/*.whl
      PYTHONPATH=/tmp/site python -m policyzoo.doctor --gpu   # --trainer-only, or --device cpu on CPU

No model travels: the doctor builds its tiny model in place (``policyzoo.doctor.parts``).
Exits 1 when the bundle is 64 MiB or more.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / ".build" / "gpu-bundle"
LIMIT = 64 * 2**20
#: binary or pure wheels fetched as installed here: pydantic and its core, hjson, and the small
#: requirements of DeepSpeed and policyzoo that a machine with torch + transformers may lack
DOWNLOADED = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "hjson", "einops", "msgpack",
              "ninja", "py-cpuinfo", "psutil", "pluggy", "rich", "markdown-it-py", "mdurl", "pygments",
              # the engine imports httpx at start (the server rollout's client), a bare machine has none
              "httpx", "httpcore", "h11", "anyio", "idna", "certifi",
              # the default tracker writes TensorBoard event files
              "tensorboardX")
#: TRL's GRPOTrainer for the doctor's trl_step part (``--with-trl``): the version the agreement tests read
TRL = ("trl==1.16.0", "datasets", "dill", "multiprocess")
#: the platform tags a manylinux binary wheel may carry for an x86-64 GPU machine (pip matches each exactly)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")


def _pin(name: str) -> str:
    """``name==version`` as installed here (a pin already written is kept); a name not installed here unpinned."""
    if "==" in name:
        return name
    try:
        return f"{name}=={md.version(name)}"
    except md.PackageNotFoundError:
        return name


def build(out: Path = OUT, python_version: str | None = None, with_trl: bool = False) -> int:
    """Write the wheels into ``out/wheels`` for ``python_version`` ("3.12"; None: this interpreter's); returns
    the bundle's size in bytes. Raises ``subprocess.CalledProcessError`` when pip finds no wheel."""
    shutil.rmtree(out, ignore_errors=True)
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "-q"]
    pins = [_pin(d) for d in DOWNLOADED + (TRL if with_trl else ())]
    target = []
    if python_version:
        target = ["--python-version", python_version, "--implementation", "cp"]
        target += [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", *target, "-d", str(wheels), *pins],
                   check=True)
    env = dict(os.environ, DS_BUILD_OPS="0")
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    f"deepspeed=={md.version('deepspeed')}"], check=True, env=env)
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)], check=True)
    return sum(f.stat().st_size for f in out.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python-version", help="the check machine's Python, e.g. 3.12 (default: this one's)")
    ap.add_argument("--with-trl", action="store_true", help="add TRL and datasets for the trl_step part")
    args = ap.parse_args(argv)
    size = build(python_version=args.python_version, with_trl=args.with_trl)
    for f in sorted(OUT.rglob("*")):
        if f.is_file():
            print(f"{f.stat().st_size / 2**20:8.2f} MiB  {f.relative_to(OUT)}")
    print(f"bundle: {size / 2**20:.1f} MiB in {OUT} (limit 64 MiB)")
    return 0 if size < LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
