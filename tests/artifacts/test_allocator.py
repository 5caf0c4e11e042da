"""``allocator.blocks_from_the_heap``: inside, a 2 MB buffer allocated, written and freed again and again is
faulted in once; outside, in a process started with the command line's fixed 1 MB mmap threshold, every time
(mapped anew); afterwards the process is as it was, and a process on glibc's own threshold is left to it. Measured
by page faults in a child process started with each environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from artifacts import allocator
from tests.conftest import REPO

COUNT_FAULTS = """
import json, resource
import numpy as np
from artifacts import allocator

def faults(times=40):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(times):
        block = np.ones(2 << 17)  # 2 MB, every page written
        del block
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

faults()  # glibc's own threshold rises at the first free of a mapped block: the same state in every measure
outside = faults()
with allocator.blocks_from_the_heap():
    inside = faults()
after = faults()
print(json.dumps({"outside": outside, "inside": inside, "after": after}))
"""
PAGES = (2 << 20) // 4096  # what writing one 2 MB buffer faults in when its pages are new


def page_faults(fixed_threshold: bool) -> dict[str, int]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    if fixed_threshold:
        env[allocator.FIXED_THRESHOLD] = str(1 << 20)  # as run_pipeline.MALLOC_SETTINGS sets it
    done = subprocess.run([sys.executable, "-c", COUNT_FAULTS], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(allocator.glibc() is None, reason="glibc's allocator only")
def test_inside_the_block_a_freed_buffer_is_used_again_and_afterwards_the_process_is_as_before() -> None:
    counted = page_faults(fixed_threshold=True)
    assert counted["outside"] >= 30 * PAGES  # mapped and faulted in anew each time
    assert counted["inside"] <= 3 * PAGES  # from the heap: faulted in once
    assert counted["after"] >= 30 * PAGES  # the fixed 1 MB threshold again


@pytest.mark.skipif(allocator.glibc() is None, reason="glibc's allocator only")
def test_a_process_on_glibcs_own_threshold_is_left_to_it() -> None:
    counted = page_faults(fixed_threshold=False)
    # glibc raised its threshold at the first free: from the heap everywhere, and still after the block (a
    # threshold set and then put back would stay fixed at its value, each 2 MB buffer mapped anew)
    assert max(counted.values()) <= 3 * PAGES
