"""Build the travel bundle of ``bench/gpu_check.py`` into ``.build/gpu-bundle`` (ignored by git):
what the single-GPU check machine lacks, under 64 MiB.

    python bench/gpu_bundle.py          # then carry .build/gpu-bundle with the working tree

* ``wheels/``: pydantic, pydantic-core, hjson and the small requirements of DeepSpeed and policyzoo
  (:data:`DOWNLOADED`; ``pip download``, the versions installed here, for this machine's Python and
  platform: the check machine must match them) and DeepSpeed and policyzoo built here as pure-Python
  wheels (``pip wheel``, ``DS_BUILD_OPS=0``); installed there with
  ``pip install --no-index --find-links wheels deepspeed policyzoo``;
* ``tokenizer/``: the default model's tokenizer files (no weights: the check builds random-init
  models from ``bench/gpu_models/*.json``, and the default's GGUF alone is 98 MB);
* ``configs/``: those model configs.

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
#: binary or pure wheels fetched as installed here: pydantic and its core, hjson, and the small
#: requirements of DeepSpeed and policyzoo that a machine with torch + transformers may lack
DOWNLOADED = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "hjson", "einops", "msgpack",
              "ninja", "py-cpuinfo", "psutil", "pluggy", "rich", "markdown-it-py", "mdurl", "pygments")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "chat_template.jinja")


def main() -> int:
    from policyzoo.engine.models import default_model_path

    shutil.rmtree(OUT, ignore_errors=True)
    wheels, tok, cfgs = OUT / "wheels", OUT / "tokenizer", OUT / "configs"
    for d in (wheels, tok, cfgs):
        d.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "-q"]
    pins = [f"{d}=={md.version(d)}" for d in DOWNLOADED]
    subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", "-d", str(wheels), *pins], check=True)
    env = dict(os.environ, DS_BUILD_OPS="0")
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    f"deepspeed=={md.version('deepspeed')}"], check=True, env=env)
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)], check=True)
    src = default_model_path()
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, tok / name)
    for f in (ROOT / "bench" / "gpu_models").glob("*.json"):
        shutil.copy(f, cfgs / f.name)
    size = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    for f in sorted(OUT.rglob("*")):
        if f.is_file():
            print(f"{f.stat().st_size / 2**20:8.2f} MiB  {f.relative_to(OUT)}")
    print(f"bundle: {size / 2**20:.1f} MiB in {OUT} (limit 64 MiB)")
    return 0 if size < 64 * 2**20 else 1


if __name__ == "__main__":
    sys.exit(main())
