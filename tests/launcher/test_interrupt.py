"""Ctrl-C: its line, and the processes a command started that are still running a moment after it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.launcher.interrupt import SigintWatch, descendants, ending_processes_after, interrupted_line
from tests.builders import process_of
from tests.conftest import REPO

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_the_line_names_the_stage_when_one_ran():
    assert interrupted_line("embed-entities") == "interrupted during embed-entities; rerun the same command to resume"
    assert interrupted_line(None) == "interrupted; rerun the same command to resume"


@pytest.fixture()
def watch() -> Iterator[tuple[SigintWatch, int]]:
    """A SigintWatch and the write end of its pipe (where ``signal.set_wakeup_fd`` writes signal numbers)."""
    read_end, write_end = os.pipe()
    sigint = SigintWatch(read_end)
    yield sigint, write_end
    sigint.close()
    os.close(write_end)


def test_a_child_and_its_own_child_are_descendants():
    shell = subprocess.Popen(["sh", "-c", f"{SLEEPER[0]} -c 'import time; time.sleep(60)'; true"])
    try:
        deadline = time.monotonic() + 10
        while len(descendants(shell.pid)) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        grandchildren = descendants(shell.pid)
        assert len(grandchildren) == 1
        assert set(descendants(os.getpid())) >= {shell.pid, *grandchildren}
    finally:
        for pid in [*descendants(shell.pid), shell.pid]:
            os.kill(pid, signal.SIGKILL)
        shell.wait(10)


def test_after_sigint_and_the_grace_every_process_started_is_killed_even_one_started_later(watch):
    """Beam may start a worker just after Ctrl-C (which it never gets): it is ended too."""
    sigint, wakeup = watch
    with ending_processes_after(sigint, grace_s=0.3):
        running = subprocess.Popen(SLEEPER)
        os.write(wakeup, bytes([signal.SIGINT]))
        assert running.wait(10) == -signal.SIGKILL
        started_later = subprocess.Popen(SLEEPER)
        assert started_later.wait(10) == -signal.SIGKILL


def test_without_sigint_or_after_the_block_nothing_is_killed(watch):
    sigint, wakeup = watch
    os.write(wakeup, bytes([signal.SIGCHLD]))  # another signal with a Python handler
    with ending_processes_after(sigint, grace_s=0.1):
        child = subprocess.Popen(SLEEPER)
        time.sleep(0.5)
    os.write(wakeup, bytes([signal.SIGINT]))
    time.sleep(0.3)
    try:
        assert child.poll() is None
    finally:
        child.kill()
        child.wait(10)


def test_exit_with_descendants_ends_the_process_and_every_one_it_started():
    code = ("import subprocess, sys; from pipelines.launcher.interrupt import exit_with_descendants; "
            f"child = subprocess.Popen({SLEEPER!r}); print(child.pid, flush=True); exit_with_descendants(130)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 130, result.stderr
    child = int(result.stdout)
    deadline = time.monotonic() + 10
    while process_of(Path(f"/proc/{child}/stat"))[1] is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process_of(Path(f"/proc/{child}/stat"))[1] is None, "still running"
