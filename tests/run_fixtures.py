"""Session fixtures that several test modules read: runs built once per pytest session (``built_once``: the
first xdist worker that asks builds, the others wait and read).

Registered in conftest (``pytest_plugins``). Tests must not change these OUTs: copy one (``shutil.copytree``) first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pipelines.launcher.cli import main
from tests.builders import all_command
from tests.conftest import DIRECT, PASSAGES, built_once, xdist_worker_number
from tests.dump_versions import DumpVersions, write_dump_versions


@dataclass(frozen=True)
class DumpRuns:
    """Two dumps of one wiki (tests/dump_versions.py) and a full `all` run of each, from scratch."""

    versions: DumpVersions
    old: Path
    new: Path


def run_all(dump: Path, output: Path, model: Path, *extra: str) -> Path:
    """``all --no-report`` on ``dump`` with the small settings of conftest's ``full_run``."""
    assert main(all_command(output, model, "--no-report", *extra, dump=dump)) == 0
    return output


@pytest.fixture(scope="session")
def dump_runs(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> DumpRuns:
    """The two runs are built apart, odd xdist workers starting with the new one: two workers that ask at once
    build one each (a run takes ~15 s) instead of one waiting for both."""
    versions = write_dump_versions(built_once(tmp_path_factory, "dump-versions", write_dump_versions), write=False)
    dumps = {"old": versions.old, "new": versions.new}
    runs = {}
    for name in reversed(dumps) if xdist_worker_number() % 2 else dumps:
        def build(root: Path, name: str = name) -> None:
            run_all(dumps[name], root / name, tiny_bert)

        runs[name] = built_once(tmp_path_factory, f"dump-run-{name}", build) / name
    return DumpRuns(versions, runs["old"], runs["new"])


@pytest.fixture(scope="session")
def refreshed_run(dump_runs: DumpRuns, tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> Path:
    """`all` on the new dump as a refresh of the old run (``--previous``)."""
    def build(root: Path) -> None:
        run_all(dump_runs.versions.new, root / "out", tiny_bert, "--previous", str(dump_runs.old))

    return built_once(tmp_path_factory, "refreshed", build) / "out"


@pytest.fixture(scope="session")
def minilm_index(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path, shared_data: Path) -> Path:
    """OUT with the 751 real passages of ../shared/data indexed by MiniLM (mean pooling, cosine) in 3 shards."""
    subset = PASSAGES / "psgs_w100_subset_from_haystack_nqdev.tsv"

    def build(output: Path) -> None:
        assert main(["index", "--output", str(output), "--encoder", str(minilm_path), "--encoder-type", "mean",
                     "--corpus", str(subset), "--shards", "3", *DIRECT]) == 0

    return built_once(tmp_path_factory, "minilm-index", build)
