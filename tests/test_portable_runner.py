"""The stages on Beam's portable runner (the job API every distributed runner speaks: Dataflow, Flink, Spark):
the graph is submitted as a protobuf, every element crosses gRPC to an SDK worker, and nothing may rely on the
launcher's memory. The rows must equal those of the local runner."""

from __future__ import annotations

from pathlib import Path

from artifacts import tables
from pipelines.cli import main
from tests.conftest import BUNDLED_SAMPLE, DIRECT

# The embedded job service with a loopback SDK worker: the portable path, without a cluster.
PORTABLE = ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"]
STAGES = (["parse", "--dump", str(BUNDLED_SAMPLE)], ["dictionary", "--include-red-links"],
          ["mentions", "--max-mentions", "2", "--max-seq-length", "32"])


def rows(output: Path, artifact: str) -> list[tuple]:
    return sorted(tuple(map(repr, row.values())) for row in tables.read_table(str(output), artifact).to_pylist())


def test_the_stages_give_the_same_rows_on_the_portable_runner(tmp_path: Path):
    local, portable = tmp_path / "local", tmp_path / "portable"
    for stage, *flags in STAGES:
        assert main([stage, "--output", str(local), *flags, *DIRECT]) == 0
        assert main([stage, "--output", str(portable), *flags, *PORTABLE]) == 0
    for artifact in ("articles", "redirects", "entities", "dictionary/names", "mentions"):
        assert rows(local, artifact) == rows(portable, artifact), artifact
    linker = "dictionary/linker/name.trie"
    assert (local / linker).read_bytes() == (portable / linker).read_bytes()
