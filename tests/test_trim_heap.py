"""``trim_heap`` (engine.trim_memory): freed C-heap memory goes back to the OS."""

import subprocess
import sys

CHILD = r"""
import torch
from policyzoo.engine.run.startup import rss_gib, trim_heap

# Free one 16 MiB block first: glibc then raises its mmap threshold to 16 MiB, so the 4 MiB
# blocks below come from the heap; small blocks kept alive between them stop the freed ones from
# merging into the heap's top (which free() itself would trim), as a step's live tensors do.
big = torch.empty(4 << 20)
big.fill_(1.0)
del big
base = rss_gib()
xs, pins = [], []
for _ in range(256):  # 256 x 4 MiB = 1 GiB, pages touched
    xs.append(torch.ones(1 << 20))
    pins.append(torch.ones(64))
del xs
kept = rss_gib() - base
trim_heap()
after = rss_gib() - base
print(f"{kept:.3f} {after:.3f}")
"""


def test_trim_returns_freed_heap_memory():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    kept, after = map(float, out.stdout.split())
    assert kept > 0.5, f"the freed 1 GiB was not kept resident ({kept:.3f} GiB): the test premise failed"
    assert after < 0.25, f"{after:.3f} GiB still resident after trim_heap"
