"""What a command prints on stderr: our own lines as they are (no level or logger name in front), and none of the
warnings Beam's batch-size estimator provokes from numpy, unless --verbose; after Ctrl-C, only its last line.

Everything here is scoped to one command (context managers that undo what they did): ``main`` runs in-process in
tests and embedding programs, which keep their own logging and warning settings.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import signal
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from numpy.exceptions import RankWarning

from pipelines.launcher.environment import environment_variable
from pipelines.launcher.interrupt import SigintWatch
from pipelines.launcher.worker_output import (
    WORKER_START_UP_LINES,
    ForwardedStderr,
    forwarded_stderr,
    starts_worker_processes,
)

OWN_LOGGER = "kpr"  # ours and its children (kpr.report)
# Beam's warnings that say nothing about our data or flags: (message prefix, category, module that raises it).
# beam.BatchElements (ours, where the model inputs of embed-entities and index are built) fits batch time against
# batch size over the few sizes it has tried: numpy then warns from its module about a division by zero in the
# outlier test (Cook's distance), its 0 * inf, or a poorly conditioned fit. A glob that escapes a path's "[" as "[[]"
# becomes a regex Python warns may read otherwise one day; it matches the path now.
BATCH_SIZE_ESTIMATOR_MODULE = "apache_beam.transforms.util"
IGNORED_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    ("divide by zero encountered", RuntimeWarning, BATCH_SIZE_ESTIMATOR_MODULE),
    ("invalid value encountered", RuntimeWarning, BATCH_SIZE_ESTIMATOR_MODULE),
    ("Polyfit may be poorly conditioned", RankWarning, BATCH_SIZE_ESTIMATOR_MODULE),
    ("Possible nested set", FutureWarning, "apache_beam.io.filesystem"),
)
# Beam's local worker processes get the RuntimeWarning filters through PYTHONWARNINGS, but numpy sets RankWarning to
# "always" when imported, after those filters apply: that warning is dropped from the workers' stderr instead (its
# line and the source line Python prints under it).
WORKER_NOISE = (*WORKER_START_UP_LINES, b"RankWarning: Polyfit may be poorly conditioned",
                b"np.polyfit(xs, ys, 1, w=weight)")
# Beam builds the sdist of --setup_file (the project shipped to workers elsewhere) with `python -m build`, whose
# progress lines reach our stderr before each pipeline runs.
SDIST_BUILD_LINES = (b"* Getting build dependencies for sdist...", b"* Building sdist...")
OUTPUT_CLOSED_EXIT = 128 + signal.SIGPIPE  # the status of a process that SIGPIPE ended, as a shell shows it


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is at each record (a redirect made after the handler still applies)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr


class PlainFormatter(logging.Formatter):
    """The message alone; ``warning: message`` from WARNING up (as our printed warnings read)."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        return message if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {message}"


@contextlib.contextmanager
def plain_own_lines(logger_name: str = OWN_LOGGER) -> Iterator[None]:
    """Records of ``logger_name`` and its children printed by a handler of their own as plain lines, instead of
    through the root logger's handler (whose format names level and logger)."""
    logger = logging.getLogger(logger_name)
    handler = _CurrentStderrHandler()
    handler.setFormatter(PlainFormatter())
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def warnings_option(ignored: tuple[tuple[str, type[Warning], str], ...]) -> str:
    """The entries of ``ignored`` with a builtin category as ``PYTHONWARNINGS`` entries (for the Python processes a
    run starts: Beam's local workers; a category there is looked up at start-up, before numpy could be imported)."""
    return ",".join(f"ignore:{message}:{category.__name__}:{module}" for message, category, module in ignored
                    if category.__module__ == "builtins")


@contextlib.contextmanager
def without_beams_idle_warnings(ignored: tuple[tuple[str, type[Warning], str], ...] = IGNORED_WARNINGS
                                ) -> Iterator[None]:
    """Ignore exactly the warnings ``ignored`` (message prefix, category, module that raises it), in this process
    and in the worker processes the block starts; the filters and ``PYTHONWARNINGS`` are restored on exit."""
    with warnings.catch_warnings(), appended_to_environment("PYTHONWARNINGS", warnings_option(ignored)):
        for message, category, module in ignored:
            warnings.filterwarnings("ignore", message=re.escape(message), category=category,
                                    module=re.escape(module) + "$")
        yield


def appended_to_environment(name: str, entries: str) -> contextlib.AbstractContextManager[None]:
    """``entries`` appended to the comma-separated environment variable ``name`` (later entries win) for the block;
    the previous value (or none) back on exit."""
    previous = os.environ.get(name)
    return environment_variable(name, f"{previous},{entries}" if previous else entries)


@contextlib.contextmanager
def own_lines_only(verbose: bool, beam_args: list[str], sigint: SigintWatch | None = None
                   ) -> Iterator[ForwardedStderr]:
    """While a command runs, without --verbose: our log lines plain; Beam's idle warnings (``IGNORED_WARNINGS``),
    its worker processes' start-up lines (WORKER_NOISE) and the tracebacks they print of an InputError, and the
    progress lines of the sdist built for workers elsewhere left out. With --verbose everything shows as it comes.
    Either way, once ``sigint`` has seen Ctrl-C nothing that Beam's threads and worker processes print shows: the
    command's last line goes past that (``ForwardedStderr.write_past``)."""
    with contextlib.ExitStack() as stack:
        if not verbose:
            stack.enter_context(plain_own_lines())
            stack.enter_context(without_beams_idle_warnings())
        workers = WORKER_NOISE if starts_worker_processes(beam_args) else ()
        noise = () if verbose else (*SDIST_BUILD_LINES, *workers)
        yield stack.enter_context(forwarded_stderr(noise, sigint, hide_one_line_errors=not verbose))


def output_closed(error: BrokenPipeError) -> int:
    """A command whose stdout lost its reader (``search ... | head``) stops there: OUTPUT_CLOSED_EXIT, and stdout
    pointed at /dev/null so that nothing raises again as the interpreter flushes it at exit. Any other broken pipe
    is raised on."""
    if not reader_gone(sys.__stdout__):
        raise error
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.__stdout__.fileno())
    os.close(devnull)
    return OUTPUT_CLOSED_EXIT


def reader_gone(stream: Any) -> bool:
    """Whether ``stream`` is a pipe or socket that nothing reads any more (its descriptor polls as an error)."""
    try:
        descriptor = stream.fileno()
    except (AttributeError, OSError, ValueError):  # None, closed, or not backed by a descriptor
        return False
    poller = select.poll()
    poller.register(descriptor, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))
