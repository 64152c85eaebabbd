"""One rank of the doctor's ``ranks`` part, started by torchrun on every GPU:
``python -m torch.distributed.run --nproc_per_node N -m policyzoo.doctor.rank_probe FOLDER``.

Each rank takes its device the engine's way (:func:`policyzoo.engine.device.local_device`,
``set_thread_device``), joins a NCCL
group, all-reduces ``rank + 1`` on that device (the sum over N ranks is N (N + 1) / 2) and writes
``FOLDER/rank<R>.json``: ``rank``, ``local_rank``, ``device`` (the current CUDA index) and ``all_reduce``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from policyzoo.engine.device import local_device, set_thread_device


def main(folder: str) -> int:
    dev = local_device()
    set_thread_device()  # the engine's own call, checked below against LOCAL_RANK
    dist.init_process_group("nccl", device_id=dev)
    rank, local_rank = dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))
    x = torch.tensor([float(rank + 1)], device=dev)
    dist.all_reduce(x)
    record = {"rank": rank, "local_rank": local_rank, "device": torch.cuda.current_device(),
              "tensor_device": x.device.index, "all_reduce": float(x.item())}
    Path(folder, f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
