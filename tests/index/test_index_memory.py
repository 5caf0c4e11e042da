"""Building a shard holds its vectors once: the peak memory of the step that builds one shard (its buckets sorted
into the shard's files, then its vectors streamed into the index: a flat one filled in place from the staged files,
an IVF one added to from the shard's files) grows by at most SHARD_GROWTH bytes a byte of the shard's float32
vectors, measured in a child process (its own peak) at two sizes, with the allocator settings that the command line
gives every worker process.

Each size is built RUNS times, the sizes in turn, and its lowest peak kept: a run's peak can sit tens of MB above the
build's own at random (in CI once, 2026-12-03, Flat: 350 -> 526 MiB, 1.22; run after run here 297-317 -> 452-472 MiB,
0.98-1.10, alone, beside other tests or on a loaded machine), while a build that held more would do so in every run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from artifacts.faiss import buckets, build, choice, storage
from artifacts.faiss.vectors import embedding_table
from run_pipeline import ARROW_MEMORY_POOL, MALLOC_SETTINGS
from tests.conftest import REPO

DIM = 768
SIZES = (16_384, 65_536)  # 48 and 192 MiB of vectors: far above the allocator's noise
# Buckets of at least 4,096 rows at both sizes: the row groups read back then have their full size (what a shard
# of a real corpus reads), so the transient of reading one is the same at both sizes.
BUCKETS = 4
RUNS = 2

BUILD_ONE_SHARD = """
import json, os, sys
from bench.memory import high_water_rss
from transforms.index.graph import BuildShard
index_dir, dim, spec, trained, factory = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), *sys.argv[4:6]
name, shard_buckets = spec
shard = (name, tuple((bucket, tuple(paths)) for bucket, paths in shard_buckets))
[summary] = BuildShard(index_dir, dim, False, factory).process(shard, trained)
# this process's own peak (ru_maxrss would start at the parent's)
print(json.dumps({"count": summary["count"], "peak": high_water_rss(os.getpid())}))
"""


def staged_shard(directory: Path, rows: int, factory: str) -> tuple[list, str, str]:
    """``rows`` random vectors staged in BUCKETS bucket files as the encoding writes them, and the trained index;
    returns the one shard's (name, buckets) spec, the trained index's path and its factory."""
    writer = buckets.BucketWriter(str(directory / "staged"), BUCKETS, DIM)
    vectors = np.random.default_rng(rows).standard_normal((rows, DIM), dtype=np.float32)
    for start in range(0, rows, 4096):  # as a model process stages them: a step's rows at a time
        writer.add_table(embedding_table([(passage_id, "title", "text", vectors[passage_id])
                                          for passage_id in range(start, min(rows, start + 4096))], DIM))
    [shard_buckets] = buckets.shard_buckets(writer.close(), 1).values()
    trained = str(directory / "trained.faiss")
    storage.write_index(build.train_index(factory, DIM, vectors[:4096]), trained)
    return ["shard-00000", shard_buckets], trained, factory


def peak_building(directory: Path, rows: int, run: int, staged: tuple[list, str, str]) -> int:
    """The peak RSS (bytes) of a fresh process that builds the staged shard of ``rows`` vectors (``staged_shard``
    in ``directory``) into ``directory``/index-RUN."""
    spec, trained, factory = staged
    index_dir = directory / f"index-{run}"
    index_dir.mkdir()
    allocator = {ARROW_MEMORY_POOL[0]: ARROW_MEMORY_POOL[1],
                 **{variable: str(value) for variable, _, value in MALLOC_SETTINGS}}
    done = subprocess.run([sys.executable, "-c", BUILD_ONE_SHARD, str(index_dir), str(DIM), json.dumps(spec), trained,
                           factory],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **allocator}, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["count"] == rows
    return result["peak"]


@pytest.mark.parametrize("factory", ["Flat", "IVF64,Flat"])
def test_building_a_shard_holds_its_vectors_once(tmp_path: Path, factory: str) -> None:
    shards = {rows: staged_shard(tmp_path / str(rows), rows, factory) for rows in SIZES}
    peaks = [{rows: peak_building(tmp_path / str(rows), rows, run, shards[rows]) for rows in SIZES}
             for run in range(RUNS)]
    small, large = (min(run[rows] for run in peaks) for rows in SIZES)
    more_vectors = choice.vector_bytes(SIZES[1], DIM) - choice.vector_bytes(SIZES[0], DIM)
    growth = (large - small) / more_vectors
    print(f"{factory}: peak {small / 2**20:.0f} -> {large / 2**20:.0f} MiB, {growth:.2f} bytes a byte of vectors")
    assert growth <= choice.SHARD_GROWTH
