"""Progress a person can follow on long stages: a line with count, rate and ETA every ``interval`` seconds.

Beam's own counters show progress in a runner's UI (Dataflow, Flink) but only reach the driver at the end of a
local run, so each worker also writes a line every ``interval`` seconds about what it has done. A timer thread
writes it, not the elements passing by: a step after a batched model sees its elements a batch at a time, and a
batch may take longer than the interval. The lines go to the process's stderr: the launcher's, which Beam's local
worker processes inherit (their log records go to the runner's log service, not to the user), and a remote
worker's log.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam

MIN_TICK_S = 0.05  # the timer's shortest wait (an interval of 0: a line as often as that)


def format_duration(seconds: float) -> str:
    """``seconds`` as ``1h02m``, ``3m05s`` or ``42s``."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


@dataclass
class ProgressMeter:
    """Items done by one worker since it started on them, and the line that says so.

    ``total`` is the stage's whole count (None if unknown) and ``workers`` how many workers share it, so the
    ETA is this worker's share left at this worker's rate. The rate is measured from the first line that saw
    items done, not from the first item: a step after a batched model gets a whole batch at once, and counting
    that batch without the time it took made early ETAs several times too short; the start-up before it (model
    loading, reading) is left out too. Until a later line sees more items, it is the rate since the start.
    """

    stage: str
    unit: str
    total: int | None = None
    workers: int = 1
    clock: Callable[[], float] = time.monotonic
    done: int = 0
    started: float = field(default=-1.0)
    base: tuple[float, int] | None = None  # (time, items done) at the first line that saw items done

    def start(self) -> None:
        """Start the clock (once: a later bundle of the same worker goes on counting)."""
        if self.started < 0:
            self.started = self.clock()

    def add(self, items: int = 1) -> None:
        self.start()
        self.done += items

    def rate(self, now: float) -> float:
        """Items a second: since the first line that saw items done, when more came since; else since the start."""
        if self.base is not None and self.done > self.base[1] and now > self.base[0]:
            return (self.done - self.base[1]) / (now - self.base[0])
        return self.done / max(now - self.started, 1e-9)

    def line(self) -> str:
        now = self.clock()
        if self.base is None and self.done:
            self.base = (now, self.done)
        elapsed = max(now - self.started, 1e-9)
        rate = self.rate(now)
        text = f"[{self.stage}] {self.done:,} {self.unit} in {format_duration(elapsed)} ({rate:,.1f}/s)"
        if self.total:
            share = self.total / max(self.workers, 1)
            left = max(share - self.done, 0.0)
            eta = format_duration(left / rate) if rate > 0 else "unknown"
            text += f", {self.total:,} in the stage over {self.workers} worker(s): ETA {eta}"
        return text


class ProgressTicker:
    """Writes ``meter.line()`` every ``interval`` seconds while it is active (between ``resume`` and ``pause``: a
    bundle being processed), from a daemon thread of its own, and at ``pause`` when a line is due (a bundle's last
    count): at most one line an interval, none for a step shorter than one. ``write`` takes the line."""

    def __init__(self, meter: ProgressMeter, interval: float, write: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._meter, self._interval, self._write, self._clock = meter, interval, write, clock
        self._tick = max(interval, MIN_TICK_S)  # the thread's wait; an interval of 0 writes at every bundle's end
        self._last_line: float | None = None  # the start counts as a line: the first is due an interval later
        self._lock = threading.Lock()
        self._active = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"progress-{meter.stage}", daemon=True)
        self._thread.start()

    def resume(self) -> None:
        self._meter.start()
        if self._last_line is None:
            self._last_line = self._clock()
        self._active.set()

    def pause(self) -> None:
        self._active.clear()
        self._write_if_due()

    def _write_if_due(self) -> None:
        with self._lock:
            now = self._clock()
            if self._last_line is not None and now - self._last_line >= self._interval:
                self._last_line = now
                self._write(self._meter.line())

    def stop(self) -> None:
        self._stopped.set()
        self._active.set()  # wakes a thread waiting to become active, so that it sees the stop
        self._thread.join()

    def _run(self) -> None:
        while self._active.wait() and not self._stopped.wait(self._tick):
            if self._active.is_set():
                self._write_if_due()


def write_stderr(line: str) -> None:
    """``line`` and its newline in one write: ``print`` writes them apart, and a line of the thread running the
    model's pipeline came between another thread's line and its newline (two lines glued, then an empty one)."""
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


@dataclass(frozen=True)
class ProgressSettings:
    """What a worker's progress lines say (``stage``, ``unit``, the stage's ``total`` and the ``workers`` that
    share it: ``ProgressMeter``) and how often (every ``interval`` seconds)."""

    stage: str
    unit: str
    total: int | None
    workers: int
    interval: float


class ProgressLog:
    """A worker's count of ``settings.unit`` done and its ticker: a line on stderr every interval while ``active``
    (what a DoFn opens in ``setup`` and stops in ``teardown``). ``add`` may be called wherever the work is done: a step
    that runs a model counts each forward batch as it goes, not only the step's output."""

    def __init__(self, settings: ProgressSettings) -> None:
        self._meter = ProgressMeter(settings.stage, settings.unit, settings.total, settings.workers)
        self._ticker = ProgressTicker(self._meter, settings.interval, write_stderr)

    def add(self, items: int) -> None:
        self._meter.add(items)

    def resume(self) -> None:
        """Lines every interval from now (a bundle or a follower at work)."""
        self._ticker.resume()

    def pause(self) -> None:
        """No lines until ``resume``, after one now if it is due."""
        self._ticker.pause()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """``resume``, then ``pause`` at the end, however it ends."""
        self.resume()
        try:
            yield
        finally:
            self.pause()

    def stop(self) -> None:
        self._ticker.stop()


class _LogProgress(beam.DoFn):
    def __init__(self, settings: ProgressSettings, weight: Callable[[Any], int] | None = None) -> None:
        self._settings, self._weight = settings, weight

    def setup(self) -> None:
        self._log = ProgressLog(self._settings)

    def start_bundle(self) -> None:
        self._log.resume()

    def process(self, element: Any) -> Iterator[Any]:
        self._log.add(1 if self._weight is None else self._weight(element))
        yield element

    def finish_bundle(self) -> None:
        self._log.pause()

    def teardown(self) -> None:
        self._log.stop()


class LogProgress(beam.PTransform):
    """Pass elements through unchanged, writing this worker's count, rate and ETA every ``settings.interval``
    seconds; an element counts ``weight(element)`` items (1 without a weight).

    (The stages' own counters, e.g. ``pages_read`` or ``mentions_embedded``, count the same items for the
    runner's UI and the manifest.)"""

    def __init__(self, settings: ProgressSettings, weight: Callable[[Any], int] | None = None) -> None:
        super().__init__()
        self._do_fn = _LogProgress(settings, weight)

    def expand(self, elements: beam.PCollection) -> beam.PCollection:
        return elements | "CountAndLog" >> beam.ParDo(self._do_fn)


def direct_workers(beam_args: Sequence[str]) -> int:
    """How many workers Beam's direct runner runs: ``--direct_num_workers`` (0: one per core) in its
    multi_processing and multi_threading modes; one in memory, whatever the number (Beam warns so)."""
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

    direct = PipelineOptions(list(beam_args)).view_as(DirectOptions)
    if direct.direct_running_mode not in ("multi_processing", "multi_threading"):
        return 1
    return int(direct.direct_num_workers or 0) or os.cpu_count() or 1


def worker_count(beam_args: Sequence[str]) -> int:
    """How many workers share a stage, from the Beam options (``--direct_num_workers``, ``--num_workers``)."""
    from apache_beam.options.pipeline_options import PipelineOptions, WorkerOptions

    options = PipelineOptions(list(beam_args)).view_as(WorkerOptions)
    remote = options.max_num_workers or options.num_workers or 0
    return max(direct_workers(beam_args), int(remote), 1)
