"""Beam's worker processes and threads share our stderr: while a command runs, descriptor 2 goes through a
forwarder that leaves out their start-up lines and the tracebacks of an InputError (unless --verbose) and, once
Ctrl-C has arrived, everything.

Each worker of ``--direct_running_mode=multi_processing`` logs a few lines at start-up, before the log level
from the pipeline options applies, straight to the file descriptor it inherited. No option reaches that early, so
the parent routes descriptor 2 through a pipe for the run and forwards every line except exactly those.

Ctrl-C in a terminal reaches the whole process group: every worker process, and every thread of Beam's here that
loses its worker, prints a traceback as it stops (100 to 300 lines) while the command unwinds to its one line.
The forwarder learns of SIGINT the moment it is delivered here (``pipelines.launcher.interrupt.SigintWatch``), or sees
it pending before that (its own thread blocks SIGINT: on a busy machine a worker may print its traceback before the
thread that takes the signal here runs), and forwards nothing from then on; the command's own last line goes past
it (``ForwardedStderr.write_past``).

When the real stderr cannot be written (its reader gone: ``| head``, a ``tee`` that ended, a closed terminal), the
forwarder drops what comes and reads on: no process of the run gets EPIPE on its stderr, and the run goes on to its
end, its exit status as it ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from artifacts.errors import denied_in_text, mentions_input_error
from pipelines.launcher.disk_space import mentions_out_of_space
from pipelines.launcher.interrupt import SigintWatch

# Lines Beam's SDK worker prints while it starts (the second one because the first configured logging).
WORKER_START_UP_LINES = (
    b"apitools not found, and bigquery client libraries are not available",
    b"INFO:__main__:Logging handler created.",
)
OWN_ERROR = "error: "  # how the command's own one-line errors start
_TRACEBACK = b"Traceback (most recent call last):"
_LOG_RECORD = (b"ERROR:", b"WARNING:", b"CRITICAL:")  # a worker's log line, as Python's logging writes it
_LOGGED_TRACEBACK = b"Original traceback is"  # the SDK worker's log line before the traceback it logs
_CHAINED = (b"The above exception was the direct cause", b"During handling of the above exception")
_JOIN_TIMEOUT_S = 10.0
_READ_BYTES = 1 << 16


def optional_gcp_noise(record: logging.LogRecord) -> bool:
    """False for the warnings Beam logs when the optional GCP client libraries are absent (an extra here): on
    import, and when it asks Google's storage without credentials (a refusal's error line says why)."""
    message = record.getMessage()
    return "apitools not found" not in message and "google-auth library is not available" not in message


def leave_out_optional_gcp_warning() -> None:
    """This process's Beam import says nothing of the optional GCP libraries (a worker's start-up line of it is
    left out by the forwarder)."""
    for logger in (logging.getLogger(), logging.getLogger("apache_beam.internal.gcp.auth")):  # a filter of its own
        if optional_gcp_noise not in logger.filters:  # logger's: a record is filtered where it is logged
            logger.addFilter(optional_gcp_noise)


def said_in_one_line(text: str) -> bool:
    """Whether a log message carries an error the command line says in one line: an InputError, a full disk, a
    write refused."""
    return mentions_input_error(text) or mentions_out_of_space(text) or denied_in_text(text) is not None


def starts_worker_processes(beam_args: list[str]) -> bool:
    return any(arg.endswith("multi_processing") for arg in beam_args)


class OneLineErrorTracebacks:
    """Tracebacks of an error the command says in one line (``said_in_one_line``: an InputError, a full disk, a
    write refused) left out, any other passed whole. Beam's SDK worker prints a failed bundle's traceback to stderr
    whatever the log level (150 to 220 lines of a worker process for one bad stream). A traceback is held from its
    first line to the line after its last exception's (chained ones included), other lines meanwhile with it; a
    worker's log line naming such an error is left out, and any line naming an InputError."""

    def __init__(self) -> None:
        self._held: list[bytes] = []
        self._one_line_error = False

    def lines(self, line: bytes) -> list[bytes]:
        """What to write now, ``line`` read."""
        if line.startswith(OWN_ERROR.encode()):  # the command's own line, whatever it quotes: never held nor left out
            return [*self.ended(), line]
        if self._held:
            ends_before = (line[:1] not in (b"", b" ", b"\t") and not self._held[-1].strip()
                           and not line.startswith((_TRACEBACK, *_CHAINED)))
            if ends_before:
                return [*self.ended(), *self.lines(line)]
            self._held.append(line)
            self._one_line_error |= line[:1] not in (b" ", b"\t") and said_in_one_line(line.decode(errors="replace"))
            return []
        if line.startswith(_TRACEBACK) or line.endswith(_LOGGED_TRACEBACK):
            self._held = [line]
            return []
        text = line.decode(errors="replace")
        logged = line.startswith(_LOG_RECORD) and said_in_one_line(text)  # a worker's log record of such an error
        return [] if mentions_input_error(text) or logged else [line]

    def ended(self) -> list[bytes]:
        """The traceback held, unless it is one of an error said in one line; nothing is held after."""
        held, hidden = self._held, self._one_line_error
        self._held, self._one_line_error = [], False
        return [] if hidden else held


def forward_lines(source: int, target: int, dropped: tuple[bytes, ...], sigint: SigintWatch | None = None,
                  hide_one_line_errors: bool = False) -> None:
    """Copy lines from descriptor ``source`` to ``target`` until EOF, leaving out lines containing ``dropped``,
    with ``hide_one_line_errors`` the tracebacks of errors said in one line (``OneLineErrorTracebacks``), and every
    line read once ``sigint`` has seen SIGINT (asked after each read, before anything is written: what was written
    after the signal is read after it); closes both descriptors. With ``sigint``, meant to run in a thread of its
    own, which it makes block SIGINT (the main thread still takes the signal; here it shows as pending until then)."""
    if sigint is not None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})

    def quiet() -> bool:
        return sigint is not None and sigint.sigint_arrived()

    tracebacks = OneLineErrorTracebacks() if hide_one_line_errors else None

    def shown(lines: list[bytes]) -> list[bytes]:
        kept = [line for line in lines if not _contains_any(line, dropped)]
        return kept if tracebacks is None else [out for line in kept for out in tracebacks.lines(line)]

    pending, writable = b"", True
    with os.fdopen(source, "rb", buffering=0) as pipe, os.fdopen(target, "wb", buffering=0) as out:
        while chunk := pipe.read(_READ_BYTES):
            if quiet() or not writable:
                continue  # read on to EOF: the writers never block on a full pipe or get EPIPE
            *lines, pending = (pending + chunk).split(b"\n")
            writable = written(out, b"".join(line + b"\n" for line in shown(lines)))
        last = [*shown([pending] if pending else []), *(tracebacks.ended() if tracebacks else [])]
        if last and writable and not quiet():
            written(out, b"\n".join(last))


def written(out: BinaryIO, data: bytes) -> bool:
    """``data`` written to ``out``; False when it cannot be: its reader is gone (``| head``, a ``tee`` that ended,
    a closed terminal). The forwarder then drops the rest and the run goes on: a process of the run that got EPIPE
    on its stderr would fail where it prints, and Beam's SDK worker, whose handler of a failed bundle prints the
    traceback to stderr before it answers, would then never answer: the run would hang."""
    try:
        out.write(data)
    except OSError:
        return False
    return True


def _contains_any(line: bytes, patterns: tuple[bytes, ...]) -> bool:
    return any(pattern in line for pattern in patterns)


@dataclass(frozen=True)
class ForwardedStderr:
    """The real stderr while descriptor 2 goes through the forwarder, and what the forwarder knows of Ctrl-C."""

    original: int
    sigint: SigintWatch | None

    def write_past(self, line: str) -> None:
        """``line`` on the real stderr at once, past the forwarder (which forwards nothing after Ctrl-C)."""
        sys.stderr.flush()
        with contextlib.suppress(OSError):  # its reader gone: the line has nowhere to go
            os.write(self.original, f"{line}\n".encode())

    def interrupted(self) -> bool:
        return self.sigint is not None and self.sigint.sigint_arrived()


@contextlib.contextmanager
def forwarded_stderr(dropped: tuple[bytes, ...] = WORKER_START_UP_LINES, sigint: SigintWatch | None = None,
                     hide_one_line_errors: bool = False) -> Iterator[ForwardedStderr]:
    """Filter descriptor 2 (ours and every child's) while the block runs: lines containing ``dropped`` left out,
    with ``hide_one_line_errors`` the tracebacks of errors said in one line, and, once ``sigint`` has seen SIGINT,
    every line. Everything else passes unchanged. After Ctrl-C the block ends without waiting for the forwarder."""
    sys.stderr.flush()
    original = os.dup(2)
    stderr = ForwardedStderr(original, sigint)
    read_end, write_end = os.pipe()
    # The forwarder owns its own copy of the original descriptor: it may outlive the block by a lingering worker.
    forwarder = threading.Thread(target=forward_lines, name="stderr-forwarder", daemon=True,
                                 args=(read_end, os.dup(original), dropped, sigint, hide_one_line_errors))
    forwarder.start()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield stderr
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)  # the pipe's last writer here; it reaches EOF once the workers have exited too
        if not stderr.interrupted():
            forwarder.join(_JOIN_TIMEOUT_S)
        os.close(original)
