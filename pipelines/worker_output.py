"""Beam's worker processes share our stderr: their start-up lines are dropped there unless --verbose.

Each worker of ``--direct_running_mode=multi_processing`` logs a few lines at start-up, before the log level
from the pipeline options applies, straight to the file descriptor it inherited. No option reaches that early, so
the parent routes descriptor 2 through a pipe for the run and forwards every line except exactly those.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

# Lines Beam's SDK worker prints while it starts (the second one because the first configured logging).
WORKER_START_UP_LINES = (
    b"apitools not found, and bigquery client libraries are not available",
    b"INFO:__main__:Logging handler created.",
)
_JOIN_TIMEOUT_S = 10.0


def starts_worker_processes(beam_args: list[str]) -> bool:
    return any(arg.endswith("multi_processing") for arg in beam_args)


def forward_lines(source: int, target: int, dropped: tuple[bytes, ...]) -> None:
    """Copy lines from descriptor ``source`` to ``target`` until EOF, leaving out lines containing ``dropped``;
    closes both."""
    with os.fdopen(source, "rb") as pipe, os.fdopen(target, "wb", buffering=0) as out:
        for line in pipe:
            if not any(pattern in line for pattern in dropped):
                out.write(line)


@contextlib.contextmanager
def without_worker_start_up_lines(dropped: tuple[bytes, ...] = WORKER_START_UP_LINES) -> Iterator[None]:
    """Filter descriptor 2 (ours and every child's) while the block runs; everything else passes unchanged."""
    sys.stderr.flush()
    original = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    # The forwarder owns its own copy of the original descriptor: it may outlive the block by a lingering worker.
    forwarder = threading.Thread(target=forward_lines, args=(read_end, os.dup(original), dropped), daemon=True)
    forwarder.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)  # the pipe's last writer here; it reaches EOF once the workers have exited too
        forwarder.join(_JOIN_TIMEOUT_S)
        os.close(original)
