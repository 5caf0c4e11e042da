"""Beam's worker processes print start-up lines to the stderr they share with us: dropped unless --verbose."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from pipelines.worker_output import WORKER_START_UP_LINES, forward_lines
from tests.conftest import BUNDLED_SAMPLE, MULTI_PROCESS, REPO


def test_only_the_worker_start_up_lines_are_dropped():
    read_end, write_end = os.pipe()
    out_read, out_write = os.pipe()
    forwarder = threading.Thread(target=forward_lines, args=(read_end, out_write, WORKER_START_UP_LINES))
    forwarder.start()
    lines = [b"[parse] running\n",
             b"WARNING:root:apitools not found, and bigquery client libraries are not available despite ...\n",
             b"INFO:__main__:Logging handler created.\n",
             b"Traceback (most recent call last):\n",
             b"INFO:__main__:Logging handler created. and more\n",
             b"[parse] done in 1.0s"]
    os.write(write_end, b"".join(lines))
    os.close(write_end)
    forwarder.join(10)
    with os.fdopen(out_read, "rb") as forwarded:
        assert forwarded.read() == lines[0] + lines[3] + lines[5]


def test_a_multi_process_run_prints_only_our_lines(tmp_path):
    command = [sys.executable, "run_pipeline.py", "parse", "--dump", str(BUNDLED_SAMPLE),
               "--output", str(tmp_path / "out"), *MULTI_PROCESS]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == "[parse] running" and lines[1].startswith("[parse] done in ")
    assert "  articles: 106 rows" in lines
    assert all(line.startswith("  ") for line in lines[2:]), result.stderr
