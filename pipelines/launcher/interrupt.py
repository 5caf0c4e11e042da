"""Ctrl-C (and SIGTERM, taken as Ctrl-C): how a command learns of it (``watching_sigint``), the worker processes
it ends after it (``ending_processes_after``), and the one line it prints and its exit status. No import beyond the
standard library: the entry point prints the line when Ctrl-C comes while Python is still importing the pipeline's
libraries."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a command that Ctrl-C ended
# The signals that stop a command as Ctrl-C does: SIGTERM is what a batch scheduler (or `kill`) sends.
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
# Beam re-raises an exception raised inside a step as one of its type (a RuntimeError for Ctrl-C) whose message
# names the step, and logs it first.
INTERRUPTED_STEP = "KeyboardInterrupt [while running"
# How long the processes a command started, and a pipeline it runs in a thread beside another, get to stop on their
# own after Ctrl-C (Beam's workers take about 1 s).
CTRL_C_GRACE_S = 3.0
_POLL_S = 0.2


def interrupted_line(command: str | None, resumable: bool = True) -> str:
    """The line for Ctrl-C during ``command`` (a stage's command-line name; None: before any stage ran), of a
    command that keeps its work (``resumable``) or not (one that reads runs: it has nothing to resume)."""
    during = f" during {command}" if command else ""
    return f"interrupted{during}; rerun the same command to resume" if resumable else f"interrupted{during}"


class SigintWatch:
    """Whether SIGINT (or SIGTERM) has come: its number through the read end of a ``signal.set_wakeup_fd`` pipe
    (the C-level handler writes it the moment the signal is delivered, to whichever thread), or, asked from a thread
    that blocks SIGINT, the signal pending, not yet delivered (a busy machine may run worker processes that react to
    the same Ctrl-C before it schedules the thread that takes the signal here). Once it has come, it stays so."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._arrived = False
        self._lock = threading.Lock()  # several threads ask

    def sigint_arrived(self) -> bool:
        with self._lock:
            while not self._arrived and self._fd >= 0:
                try:
                    numbers = os.read(self._fd, 64)
                except BlockingIOError:
                    break
                if not numbers:
                    break
                self._arrived = bool(STOP_SIGNALS.intersection(numbers))
            # sigpending() lists only the pending signals that the calling thread blocks.
            self._arrived = self._arrived or bool(STOP_SIGNALS & signal.sigpending())
            return self._arrived

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


@contextlib.contextmanager
def watching_sigint() -> Iterator[SigintWatch | None]:
    """A ``SigintWatch`` on a wakeup pipe installed with ``signal.set_wakeup_fd`` for the block (the previous
    wakeup descriptor back afterwards); None outside the main thread, where that cannot be set."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    watch = SigintWatch(read_end)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    on_term = signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM raises KeyboardInterrupt too
    try:
        yield watch
    finally:
        signal.signal(signal.SIGTERM, on_term)
        signal.set_wakeup_fd(previous)
        os.close(write_end)
        watch.close()


def descendants(pid: int) -> list[int]:
    """The processes below ``pid``: its children, theirs and so on, read from /proc (none where there is none)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):
            text = stat.read_text()
            parent = int(text[text.rindex(")") + 2:].split()[1])
            children.setdefault(parent, []).append(int(stat.parent.name))
    found, pending = [], list(children.get(pid, []))
    while pending:
        child = pending.pop()
        found.append(child)
        pending += children.get(child, [])
    return found


@contextlib.contextmanager
def ending_processes_after(sigint: SigintWatch | None, grace_s: float = CTRL_C_GRACE_S) -> Iterator[None]:
    """While the block runs: ``grace_s`` seconds after SIGINT has come, kill every process this one started that
    is still running, and any it starts later, until the block ends. Beam starts a worker process now and then:
    one started just after Ctrl-C never gets it, and Beam, as it stops, waits for that worker for ever."""
    if sigint is None:
        yield
        return
    done = threading.Event()
    reaper = threading.Thread(target=_end_processes_after, args=(sigint, grace_s, done), name="ctrl-c-reaper",
                              daemon=True)
    reaper.start()
    try:
        yield
    finally:
        done.set()
        reaper.join()


def _end_processes_after(sigint: SigintWatch, grace_s: float, done: threading.Event) -> None:
    while not sigint.sigint_arrived():
        if done.wait(_POLL_S):
            return
    if done.wait(grace_s):
        return
    while True:
        kill_descendants()
        if done.wait(_POLL_S):
            return


def kill_descendants() -> None:
    """Kill every process this one started, and theirs, that is still running."""
    for pid in descendants(os.getpid()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def exit_with_descendants(code: int) -> NoReturn:
    """End this process at once with ``code``, and every process it started that is still running. After Ctrl-C:
    Beam's threads would print tracebacks or hold up a normal exit, and its workers are being stopped anyway (one
    it started as Ctrl-C came never got it)."""
    sys.stdout.flush()
    kill_descendants()
    os._exit(code)
