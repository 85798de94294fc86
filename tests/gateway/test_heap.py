"""The start-up heap's freeze, in a process of its own (a freeze would hide the test
process's own objects from its collector): a frozen cycle outlives its last reference until
the heap is thawed, and a refreeze frees it and freezes what is still alive."""

from __future__ import annotations

import subprocess
import sys

from tests.e2e.gateway_proc import ROOT

SCRIPT = """
import gc, weakref
from gateway.core.heap import freeze_startup_heap, refreeze, thaw

class Node:
    pass

start = gc.get_freeze_count()  # not always 0: an interpreter may freeze some itself
thaw(); refreeze()  # a process whose start-up froze nothing is left alone
assert gc.get_freeze_count() == start
kept, let_go = Node(), Node()
kept.me, let_go.me = kept, let_go  # cycles: only the collector frees them
ref = weakref.ref(let_go)
freeze_startup_heap()
frozen = gc.get_freeze_count()
assert frozen > start + 1000, frozen
del let_go
gc.collect()
assert ref() is not None, "a frozen cycle was collected"
thaw()
assert gc.get_freeze_count() == 0
refreeze()
assert ref() is None, "the thawed cycle was not collected"
assert gc.get_freeze_count() > 1000 and kept.me is kept
print("ok")
"""


def test_a_thawed_heap_frees_what_was_let_go_and_freezes_the_rest() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
