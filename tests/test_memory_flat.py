"""Memory bounded by what a stage outputs: parse, dictionary and mentions run as child processes on two synthetic
dumps (``bench/synthetic.py``) shaped so that names and sampled mentions grow fast for the time the stages take: 4
times English Wikipedia's links per article, their targets spread more evenly (so that ~80% of them are sampled, not
~60%) and ~20 times its redirects (each a name). The peak RSS of each stage's process tree may grow by at most the
stage's bound per output unit, plus a fixed allowance for noise. Before the bounds held, mentions grew by ~70 MB
from 1,000 to 4,000 articles of another shape (217k more sampled mentions: ~320 B each, its bottom-k state in one
grouping) and the dictionary by ~42 MB (41k more names, ~1 KB each): ~50 and ~45 MB at this test's growth, where
its bounds allow ~36 MB each."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from artifacts.run import manifest
from bench.memory import run_measured
from bench.synthetic import Shape, SyntheticDump, synthetic_dump
from tests.conftest import DIRECT, REPO

pytestmark = pytest.mark.long  # minutes: started first (conftest)
SMALL, LARGE = 1_000, 3_000  # articles
# Per article: ~78 sampled mentions and ~22 names (English Wikipedia: 24 links, 1.5 redirects, in-link alpha 1.2).
LINKS, REDIRECTS, IN_LINK_ALPHA = 96.0, 32.0, 2.5
# Bytes of peak RSS a stage may add per output unit (issue 26): mentions per sampled mention, dictionary per name.
BOUNDS = {"dictionary": ("names", 150.0), "mentions": ("mentions", 40.0)}
# What the peak of a stage varies between runs and sizes whatever the output (start-up, bounded buffers filling):
# seen up to +24 MB here, and the dictionary +27 MB once in CI (325 -> 352 MB, the suite's other tests beside it;
# +13 to +16 MB in three runs alone), below what holding the output added (the old mentions +69 MB, dictionary +42).
NOISE_MB = 30
STAGES = (("parse", ()), ("dictionary", ()), ("mentions", ("--max-mentions", "128")))


def run_stages(dump: SyntheticDump, output: Path, logs: Path) -> dict[str, float]:
    """Each stage as a child process on ``dump``: the peak RSS (MB) of its process tree."""
    peaks = {}
    for stage, flags in STAGES:
        extra = ("--dump", str(dump.dump)) if stage == "parse" else ()
        command = [sys.executable, str(REPO / "run_pipeline.py"), stage, "--output", str(output), *extra, *flags,
                   *DIRECT]
        measured = run_measured(command, logs / f"{stage}.log", env={**os.environ, "HF_HUB_OFFLINE": "1"},
                                cwd=REPO)
        assert measured.returncode == 0, (logs / f"{stage}.log").read_text()[-2000:]
        peaks[stage] = measured.peak_rss_bytes / 1e6
    return peaks


def output_units(output: Path) -> dict[str, int]:
    """Names (dictionary rows) and sampled mentions a run wrote, from its manifest."""
    records = manifest.load(str(output))
    rows = {name: sum(item.rows or 0 for item in record.outputs if item.path.endswith(".parquet")
                      and item.path.startswith(artifact + "/"))
            for name, record, artifact in (("names", records["dictionary"], "dictionary/names"),
                                           ("mentions", records["mentions"], "mentions"))}
    return rows


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[dict[str, float], dict[str, int]]]:
    root = tmp_path_factory.mktemp("memory")
    found = {}
    for articles in (SMALL, LARGE):
        dump = synthetic_dump(Shape(articles, links_per_article=LINKS, redirects_per_article=REDIRECTS,
                                    in_link_alpha=IN_LINK_ALPHA),
                              root / f"dump{articles}")
        (root / f"logs{articles}").mkdir()
        peaks = run_stages(dump, root / f"out{articles}", root / f"logs{articles}")
        found[articles] = peaks, output_units(root / f"out{articles}")
    return found


@pytest.mark.parametrize("stage", sorted(BOUNDS))
def test_peak_memory_grows_at_most_by_its_bound_per_output_unit(stage: str, measured: dict) -> None:
    (small_peaks, small_units), (large_peaks, large_units) = measured[SMALL], measured[LARGE]
    unit, bound = BOUNDS[stage]
    more = large_units[unit] - small_units[unit]
    assert more > 40_000  # the output really grew
    allowed = bound * more / 1e6 + NOISE_MB
    growth = large_peaks[stage] - small_peaks[stage]
    assert growth <= allowed, (f"{stage}: peak RSS {small_peaks[stage]:.0f} MB with {small_units[unit]:,} {unit}, "
                               f"{large_peaks[stage]:.0f} MB with {large_units[unit]:,}: +{growth:.0f} MB, at most "
                               f"+{allowed:.0f} MB allowed ({bound:.0f} B per {unit[:-1]} + {NOISE_MB} MB)")
