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
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from tests.conftest import BUNDLED_SAMPLE, MULTI_PROCESS, REPO
from transforms.progress import LogProgress, ProgressMeter, ProgressTicker, format_duration


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_gives_count_rate_and_the_eta_of_this_workers_share_at_its_own_rate():
    clock = FakeClock()
    meter = ProgressMeter("embed-entities", "mentions", total=1000, workers=2, clock=clock)
    meter.start()  # the clock runs from the start: loading the model counts in the rate
    clock.now += 20
    meter.add(40)
    clock.now += 10
    meter.add(20)
    assert meter.line() == ("[embed-entities] 60 mentions in 30s (2.0/s), 1,000 in the stage over 2 worker(s): "
                            "ETA 3m40s")
    meter.start()  # a later bundle goes on counting from the first start
    clock.now += 10
    assert meter.line().startswith("[embed-entities] 60 mentions in 40s (1.5/s)")
    unknown = ProgressMeter("index", "passages", clock=clock)
    unknown.add(4)
    clock.now += 2
    assert unknown.line() == "[index] 4 passages in 2s (2.0/s)"
    stuck = ProgressMeter("index", "passages", total=10, clock=clock)
    stuck.start()
    assert stuck.line().endswith("ETA unknown")


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


def slow(element: int) -> int:
    time.sleep(0.6)  # a batch that takes longer than the interval
    return element


def test_lines_come_every_interval_while_a_slow_step_holds_the_elements(capsys):
    with TestPipeline(runner="DirectRunner") as pipeline:
        output = (pipeline | beam.Create([0, 1, 2]) | beam.Map(slow)
                  | LogProgress("parse", "pages", total=3, workers=1, interval=0.1))
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
    assert any(" articles in " in line for line in lines), result.stderr
