"""Build the travel bundle of ``policyzoo doctor --gpu --trainer-only`` into ``.build/gpu-bundle`` (ignored by
git): what a bare GPU machine with only torch, transformers, accelerate, peft and pytest lacks, under 64 MiB.

    make gpu-bundle          # = python bench/gpu_bundle.py; then carry .build/gpu-bundle to the machine

* ``wheels/``: pydantic, pydantic-core, hjson, pluggy, rich, httpx and the other small requirements of DeepSpeed and
  policyzoo (:data:`DOWNLOADED`; ``pip download``, the versions installed here, for this machine's Python and
  platform: the check machine must match them) and DeepSpeed and policyzoo built here as pure-Python
  wheels (``pip wheel``, ``DS_BUILD_OPS=0``). On the machine::

      pip install --no-index --find-links .build/gpu-bundle/wheels deepspeed 'policyzoo[remote]'
      policyzoo doctor --gpu --trainer-only            # or --device cpu: the same parts on CPU

No model travels: the doctor builds its tiny model in place (``policyzoo.doctor.models``).
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
              "httpx", "httpcore", "h11", "anyio", "idna", "certifi")


def build(out: Path = OUT) -> int:
    """Write the wheels into ``out/wheels``; returns the bundle's size in bytes."""
    shutil.rmtree(out, ignore_errors=True)
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "-q"]
    pins = [f"{d}=={md.version(d)}" for d in DOWNLOADED]
    subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", "-d", str(wheels), *pins], check=True)
    env = dict(os.environ, DS_BUILD_OPS="0")
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    f"deepspeed=={md.version('deepspeed')}"], check=True, env=env)
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)], check=True)
    return sum(f.stat().st_size for f in out.rglob("*") if f.is_file())


def main() -> int:
    size = build()
    for f in sorted(OUT.rglob("*")):
        if f.is_file():
            print(f"{f.stat().st_size / 2**20:8.2f} MiB  {f.relative_to(OUT)}")
    print(f"bundle: {size / 2**20:.1f} MiB in {OUT} (limit 64 MiB)")
    return 0 if size < LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
