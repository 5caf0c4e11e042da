"""Where the benchmarks read the shared data: KPR_SHARED_DATA, as the tests read it; a file not there is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def sql_tables(shared_data: Path) -> subprocess.CompletedProcess:
    """``python -m bench.sql_tables --rows 50`` from elsewhere than the checkout's parent, with KPR_SHARED_DATA."""
    return subprocess.run([sys.executable, "-m", "bench.sql_tables", "--rows", "50"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "KPR_SHARED_DATA": str(shared_data)})


def test_a_benchmark_without_the_shared_data_says_so_in_one_line(tmp_path):
    run = sql_tables(tmp_path / "elsewhere")
    missing = tmp_path / "elsewhere/wikipedia/enwiki-20210701-mini/inputs/wikipedia-raw-20210701/pagetable"
    assert (run.returncode, run.stderr) == (1, f"error: {missing}/enwiki-20210701-page.sql.gz not found: the "
                                               "benchmark reads the shared data (../shared/data beside the checkout, "
                                               "or KPR_SHARED_DATA=DIR)\n")


def test_a_benchmark_reads_the_shared_data_kpr_shared_data_names(shared_data, tmp_path):
    """A copy of the one directory it reads, named by KPR_SHARED_DATA: the benchmark reads it, not ../shared/data
    (where it took the traceback of a file not found)."""
    mini = "wikipedia/enwiki-20210701-mini/inputs/wikipedia-raw-20210701"
    if not (shared_data / mini).is_dir():
        pytest.skip(f"{shared_data / mini} not found")
    (tmp_path / mini).parent.mkdir(parents=True)
    os.symlink(shared_data / mini, tmp_path / mini)
    read_from = subprocess.run([sys.executable, "-c", "from bench.paths import SHARED_DATA; print(SHARED_DATA)"],
                               cwd=REPO, capture_output=True, text=True, env={**os.environ, "KPR_SHARED_DATA":
                                                                              str(tmp_path)}).stdout.strip()
    run = sql_tables(tmp_path)
    assert read_from == str(tmp_path) and run.returncode == 0, run.stderr[-2000:]
    assert [line.split()[:3] for line in run.stdout.splitlines()] == [
        ["page", "50", "rows"], ["redirect", "50", "rows"], ["page_props", "50", "rows"]]
