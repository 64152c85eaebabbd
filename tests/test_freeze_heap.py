"""``freeze_heap`` (start-up): live objects leave the garbage collector's scans; reference counting still
frees them; ``collect`` frees the dead cycles first. Run in a child process (the freeze is process-wide)."""

import subprocess
import sys

CHILD = r"""
import gc, weakref
from policyzoo.engine.run.startup import freeze_heap

class Node:
    pass

def dead_cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a  # unreachable once this returns: only a cyclic collection frees it
    return weakref.ref(a)

gc.disable()  # no automatic collection between the steps below
gc.collect()
base = gc.get_freeze_count()
frozen_dead = dead_cycle()
freeze_heap()
gc.collect()
# the cycle's 2 nodes and their 2 attribute dicts (at least) were frozen; a full collection skips them
print(gc.get_freeze_count() - base >= 2, frozen_dead() is not None)
collected = dead_cycle()
freeze_heap(collect=True)
print(collected() is None)
x = Node()
plain = weakref.ref(x)
freeze_heap()
del x  # its last reference: freed by reference counting although frozen
print(plain() is None)
"""


def test_freeze_heap_semantics():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=120)
    lines = out.stdout.split("\n")
    assert lines[0] == "True True", "a frozen dead cycle must stay (out of the collector's reach)"
    assert lines[1] == "True", "collect=True must free the dead cycle before freezing"
    assert lines[2] == "True", "a frozen object must still be freed when its last reference goes"
