"""Progress lines: count, rate and ETA every --progress-interval, whatever the batching, from worker processes too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from tests.conftest import BUNDLED_SAMPLE, MULTI_PROCESS, REPO
from transforms.common.progress import (
    LogProgress,
    ProgressMeter,
    ProgressSettings,
    ProgressTicker,
    format_duration,
    worker_count,
    write_stderr,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_gives_count_rate_and_the_eta_of_this_workers_share():
    clock = FakeClock()
    meter = ProgressMeter("embed-entities", "mentions", total=1000, workers=2, clock=clock)
    meter.start()
    clock.now += 30
    assert meter.line() == ("[embed-entities] 0 mentions in 30s (0.0/s), 1,000 in the stage over 2 worker(s): "
                            "ETA unknown")
    clock.now += 30
    meter.add(60)  # a batch of 60, after a minute of loading the model and reading
    assert meter.line() == ("[embed-entities] 60 mentions in 1m00s (1.0/s), 1,000 in the stage over 2 worker(s): "
                            "ETA 7m20s")
    clock.now += 30
    meter.add(60)  # the next batch took 30 s: the rate is the batches', not the start-up's
    assert meter.line() == ("[embed-entities] 120 mentions in 1m30s (2.0/s), 1,000 in the stage over 2 worker(s): "
                            "ETA 3m10s")
    clock.now += 30  # a batch under way: the rate falls, as it would over a slower batch
    assert meter.line().endswith("(1.0/s), 1,000 in the stage over 2 worker(s): ETA 6m20s")
    meter.start()  # a later bundle goes on counting from the first start
    assert meter.line().startswith("[embed-entities] 120 mentions in 2m00s ")
    unknown = ProgressMeter("index", "passages", clock=clock)
    unknown.add(4)
    clock.now += 2
    assert unknown.line() == "[index] 4 passages in 2s (2.0/s)"


def test_an_early_eta_is_not_shortened_by_the_first_batch():
    """The old meter started at the first item: a batch of 1,000 that took 100 s, then 10 s later a line said
    1,000 items in 10 s (100/s) and an ETA of 90 s for the 9,000 left, which take 900 s."""
    clock = FakeClock()
    meter = ProgressMeter("index", "passages", total=10_000, clock=clock)
    meter.start()
    clock.now += 100
    meter.add(1_000)
    clock.now += 10
    assert meter.line().endswith("ETA 16m30s")  # 9,000 at 1,000 per 110 s: the start-up counts until a 2nd batch
    clock.now += 90
    meter.add(1_000)
    assert meter.line().endswith("ETA 12m00s")  # 8,000 at 1,000 per 90 s


@pytest.mark.parametrize(("beam_args", "workers"), [
    (["--direct_num_workers=0", "--direct_running_mode=multi_processing"], os.cpu_count()),  # Beam: one per core
    (["--direct_num_workers=3", "--direct_running_mode=multi_threading"], 3),
    (["--direct_num_workers=2"], 1),  # in memory: Beam runs one, and warns
    (["--direct_num_workers=2", "--num_workers=5"], 5),
    ([], 1),
])
def test_the_workers_sharing_a_stage_are_those_beam_runs(beam_args, workers):
    assert worker_count(beam_args) == workers


class WritesSeen:
    """A stream that keeps each write apart."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_a_line_and_its_newline_are_one_write(monkeypatch):
    """The inputs' and the model's pipelines of a stage write their lines from two threads of one process: a line
    whose newline came in a write of its own could have the other thread's line between the two."""
    seen = WritesSeen()
    monkeypatch.setattr(sys, "stderr", seen)
    write_stderr("[index] 392 passages prepared in 0s")
    assert seen.writes == ["[index] 392 passages prepared in 0s\n"]


def test_durations_read_naturally():
    assert [format_duration(s) for s in (0.4, 42, 185, 3720, 90000)] == ["0s", "42s", "3m05s", "1h02m", "25h00m"]


def test_the_ticker_writes_every_interval_while_active_and_nothing_while_paused():
    lines: list[str] = []
    written = threading.Condition()

    def write(line: str) -> None:
        with written:
            lines.append(line)
            written.notify_all()

    meter = ProgressMeter("parse", "pages")
    ticker = ProgressTicker(meter, 0.05, write)
    time.sleep(0.2)
    assert lines == [], "nothing before the first bundle"
    ticker.resume()
    meter.add(3)
    with written:
        assert written.wait_for(lambda: len(lines) >= 3, timeout=10)
    ticker.pause()
    time.sleep(0.1)  # a tick already under way may still write
    paused = len(lines)
    time.sleep(0.3)
    assert len(lines) == paused
    ticker.resume()
    with written:
        assert written.wait_for(lambda: len(lines) > paused, timeout=10)
    ticker.stop()
    stopped = len(lines)
    time.sleep(0.2)
    assert len(lines) == stopped and all(line.startswith("[parse] 3 pages in ") for line in lines)


def test_a_bundle_ends_with_its_line_when_one_is_due_and_a_short_step_writes_none():
    clock = FakeClock()
    lines: list[str] = []
    meter = ProgressMeter("mentions", "articles", clock=clock)
    ticker = ProgressTicker(meter, 30, lines.append, clock)

    def bundle(items: int, seconds: float) -> None:
        ticker.resume()
        meter.add(items)
        clock.now += seconds
        ticker.pause()

    bundle(2, 10)
    assert lines == [], "a step shorter than the interval writes nothing"
    bundle(3, 25)  # 35 s since the start: its end is due
    bundle(4, 1)  # 1 s after the last line: not due
    ticker.stop()
    assert lines == ["[mentions] 5 articles in 35s (0.1/s)"]


def test_an_interval_of_0_writes_at_every_bundles_end():
    clock = FakeClock()
    lines: list[str] = []
    meter = ProgressMeter("embed-entities", "mentions", clock=clock)
    ticker = ProgressTicker(meter, 0, lines.append, clock)
    for items in (6, 2):
        ticker.resume()
        meter.add(items)
        clock.now += 0.01  # shorter than the timer's shortest wait
        ticker.pause()
    ticker.stop()
    assert [line.split(" in ")[0] for line in lines] == ["[embed-entities] 6 mentions", "[embed-entities] 8 mentions"]


def slow(element: int) -> int:
    time.sleep(0.6)  # a batch that takes longer than the interval
    return element


def test_lines_come_every_interval_while_a_slow_step_holds_the_elements(capsys):
    with TestPipeline(runner="DirectRunner") as pipeline:
        output = (pipeline | beam.Create([0, 1, 2]) | beam.Map(slow)
                  | LogProgress(ProgressSettings("parse", "pages", total=3, workers=1, interval=0.1)))
        assert_that(output, equal_to([0, 1, 2]))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[parse] ")]
    counts = [int(re.match(r"\[parse\] (\d+) pages in ", line).group(1)) for line in lines]
    assert len(lines) >= 10, lines  # ~1.8 s of slow steps at 0.1 s
    assert counts == sorted(counts) and counts.count(0) >= 3, "lines while the first element was held"
    assert all(line.endswith(("ETA unknown",)) or " ETA " in line for line in lines)


def test_worker_processes_write_their_lines_too(tmp_path: Path):
    """Two local worker processes (multi_processing): each one's lines reach the command's stderr."""
    command = [sys.executable, "run_pipeline.py", "parse", "--dump", str(BUNDLED_SAMPLE), "--output",
               str(tmp_path / "out"), "--progress-interval", "0.2", *MULTI_PROCESS]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("[parse] ") and " in " in line
             and "/s)" in line]
    assert any(" pages in " in line and "over 2 worker(s)" in line for line in lines), result.stderr
