"""Progress a person can follow on long stages: a Beam counter plus a periodic log line with rate and ETA.

Beam's own counters show progress in a runner's UI (Dataflow, Flink) but only reach the driver at the end of a
local run, so each worker also logs one line every ``interval`` seconds about what it has done.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam

LOGGER_NAME = "kpr.progress"
DEFAULT_INTERVAL_S = 30.0


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
    """Items done by one worker; ``add`` returns a progress line when ``interval`` seconds have passed.

    ``total`` is the stage's whole count (None if unknown) and ``workers`` how many workers share it, so the
    ETA is this worker's share left at this worker's pace.
    """

    stage: str
    unit: str
    total: int | None = None
    workers: int = 1
    interval: float = DEFAULT_INTERVAL_S
    clock: Callable[[], float] = time.monotonic
    done: int = 0
    started: float = field(default=-1.0)
    last_line: float = field(default=-1.0)

    def add(self, items: int = 1) -> str | None:
        now = self.clock()
        if self.started < 0:
            self.started = self.last_line = now
        self.done += items
        if now - self.last_line < self.interval:
            return None
        self.last_line = now
        return self.line(now)

    def line(self, now: float) -> str:
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        text = f"[{self.stage}] {self.done:,} {self.unit} in {format_duration(elapsed)} ({rate:,.1f}/s)"
        if self.total:
            share = self.total / max(self.workers, 1)
            left = max(share - self.done, 0.0)
            eta = format_duration(left / rate) if rate > 0 else "unknown"
            text += f", {self.total:,} in the stage over {self.workers} worker(s): ETA {eta}"
        return text


class _LogProgress(beam.DoFn):
    def __init__(self, stage: str, unit: str, total: int | None, workers: int, interval: float) -> None:
        self._settings = (stage, unit, total, workers, interval)

    def setup(self) -> None:
        stage, unit, total, workers, interval = self._settings
        self._meter = ProgressMeter(stage, unit, total, workers, interval)
        self._logger = logging.getLogger(LOGGER_NAME)

    def process(self, element: Any) -> Iterator[Any]:
        line = self._meter.add()
        if line is not None:
            self._logger.info(line)
        yield element


class LogProgress(beam.PTransform):
    """Pass elements through unchanged, logging this worker's count, rate and ETA every ``interval`` seconds.

    (The stages' own counters, e.g. ``pages_read`` or ``mentions_embedded``, count the same items for the
    runner's UI and the manifest.)"""

    def __init__(self, stage: str, unit: str, total: int | None = None, workers: int = 1,
                 interval: float = DEFAULT_INTERVAL_S) -> None:
        super().__init__()
        self._do_fn = _LogProgress(stage, unit, total, workers, interval)

    def expand(self, elements: beam.PCollection) -> beam.PCollection:
        return elements | "CountAndLog" >> beam.ParDo(self._do_fn)


def worker_count(beam_args: tuple[str, ...] | list[str]) -> int:
    """How many workers share a stage, from the Beam options (``--direct_num_workers``, ``--num_workers``)."""
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, WorkerOptions

    options = PipelineOptions(list(beam_args))
    direct = options.view_as(DirectOptions).direct_num_workers or 0
    remote = options.view_as(WorkerOptions).max_num_workers or options.view_as(WorkerOptions).num_workers or 0
    return max(int(direct), int(remote), 1)
