"""``trim_heap`` (engine.trim_memory): freed C-heap memory goes back to the OS."""

import subprocess
import sys

CHILD = r"""
import torch
from policyzoo.engine.run.startup import rss_gib, trim_heap

# A step's activations come and go in pieces of a few MiB that glibc serves from its heap once its
# adaptive thresholds have grown, and free() gives back only what sits above the heap's trim
# threshold. Both thresholds are set here (mmap 16 MiB: M_MMAP_THRESHOLD = -3; trim 2 GiB:
# M_TRIM_THRESHOLD = -1), because the adaptive ones depend on what the imports left free, so the
# premise held in some processes and not in others: the 4 MiB blocks below come from the heap and
# stay resident when freed, until trim_heap returns them. Small blocks between them stand for a
# step's live tensors.
import ctypes
libc = ctypes.CDLL("libc.so.6")
libc.mallopt(-3, 16 << 20)
libc.mallopt(-1, (1 << 31) - 1)
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
