"""A killed GPU stage starts where it stopped: a real embed-entities or index run is stopped once it has kept its
first encoded files (mention windows, passages): embed-entities by Ctrl-C's SIGINT with one worker, or one of its two
model processes by SIGKILL (as the kernel's out-of-memory killer does); the index's whole process group by SIGKILL
with two workers (its Ctrl-C, while it prepares passages, is test_cli_errors' `all` case). It is rerun with one
worker (what was kept is found by its content, whatever the worker count): the rerun encodes at most the work left
unkept plus 5% of the stage's total, ends with the artifacts of an uninterrupted run (``full_run``'s), and
validates. The forward is the real model's, paced by the benchmarks' stand-in GPU so that the encoding has a middle
to stop it in (bench/no_op_model: ``KPR_STAND_IN`` with ``KPR_PACED_REAL``).

A model process keeps what it encoded a step at a time (one model call: up to 8,192 mentions or 4,096 passages, all
the files of its share that are present), so these small stages keep their work in a few large files, whose times
vary: a kill once half or 90% was kept came after all of it was kept in 3 of the 4 cases tried (2026-12-01). The
first kept files of embed-entities come while there is work left (a step holds at most 8,192 of its 21,704 mentions,
and a model process's next step waits for the card); the index's 4,606 passages may be kept in one file or two."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from artifacts import layout, tables
from artifacts.run import lock, manifest
from pipelines.launcher.cli import main
from pipelines.launcher.interrupt import descendants
from tests.builders import signal_when, stage_command
from tests.conftest import DIRECT, MULTI_PROCESS, REPO, copy_stages, stage_options

pytestmark = pytest.mark.long  # minutes: started first (conftest)
STAND_IN = REPO / "bench" / "no_op_model"
ENCODING_S = 8.0  # how long the paced forward takes for everything the stage encodes


def stage_args(command: str, output: Path, model: Path) -> list[str]:
    return [command, "--output", str(output), *stage_options(model)[command]]


def kept_rows(output: Path, stage: str) -> int:
    """What a running stage has kept so far (its kept files, each written whole)."""
    kept = output / layout.STAGING / f"{stage}{layout.KEPT}"
    return sum(map(file_rows, [*kept.glob("*.parquet"), *kept.glob("*.arrow")])) if kept.exists() else 0


def file_rows(path: Path) -> int:
    """Rows of a Parquet file, or of an Arrow IPC file (embed-entities' pending files)."""
    if path.suffix == ".arrow":
        reader = ipc.open_file(path)
        return sum(reader.get_batch(batch).num_rows for batch in range(reader.num_record_batches))
    return pq.ParquetFile(path).metadata.num_rows


def paced_environment(total: int, clock_directory: Path) -> dict[str, str]:
    """This environment with the forward paced to ``ENCODING_S`` for ``total`` inputs of up to 64 tokens (the
    stand-in's clock in ``clock_directory``)."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(STAND_IN), str(REPO)]),
                   "KPR_STAND_IN": f"{total * 64 / ENCODING_S}:{clock_directory / 'gpu-clock'}",
                   "KPR_PACED_REAL": "1"}
    return {name: value for name, value in environment.items() if not name.startswith("COV_CORE")}


def stopped_and_rerun(command: str, output: Path, model: Path, workers: int, total: int,
                      sig: signal.Signals) -> tuple[int, dict[str, int]]:
    """The stage ``command``, paced for its ``total`` inputs, its process group sent ``sig`` once it has kept
    some; then rerun to the end with one worker: (what was kept, the rerun's counters)."""
    stage = command.replace("-", "_")
    stopped = signal_when([*stage_args(command, output, model), *(DIRECT if workers == 1 else MULTI_PROCESS)],
                          lambda _: kept_rows(output, stage) > 0, sig,
                          environment=paced_environment(total, output.parent))
    assert stopped.left_running == []
    if sig == signal.SIGINT:
        assert stopped.returncode == 130, stopped.stderr[-3000:]
        lines = [*stopped.before, *stopped.after]
        assert lines[-1] == f"interrupted during {command}; rerun the same command to resume", stopped.stderr
        assert all(line.startswith(f"[{command}] ") for line in lines[:-1]), stopped.stderr  # its own lines only
        assert not (output / lock.LOCK_NAME).exists(), "the lock is released on Ctrl-C"
    else:
        assert stopped.returncode == -sig, stopped.stderr[-3000:]
    assert stage not in manifest.load(str(output))
    kept = kept_rows(output, stage)
    assert main([*stage_args(command, output, model), *DIRECT]) == 0
    return kept, manifest.load(str(output))[stage].counters


def model_worker_processes(launcher: int) -> list[int]:
    """The worker processes under ``launcher`` that hold the model (torch loaded: the inputs' workers import
    neither torch nor transformers)."""
    found = []
    for pid in descendants(launcher):
        with contextlib.suppress(OSError):
            process = Path("/proc") / str(pid)
            worker = b"sdk_worker_main" in (process / "cmdline").read_bytes()
            if worker and "libtorch" in (process / "maps").read_text():
                found.append(pid)
    return found


def entity_vectors(output: Path) -> dict[int, np.ndarray]:
    rows = tables.read_table(str(output), layout.ENTITY_EMBEDDINGS, ["entity_id", "embedding"]).to_pylist()
    return {row["entity_id"]: np.array(row["embedding"], dtype=np.float64) for row in rows}


def least_cosine(found: dict[int, np.ndarray], expected: dict[int, np.ndarray]) -> float:
    """The smallest cosine between the vectors of the same key in ``found`` and ``expected``."""
    return min(found[key] @ expected[key] / np.linalg.norm(found[key]) / np.linalg.norm(expected[key])
               for key in expected)


def assert_entities_resumed(output: Path, full_run: Path, stored: int, counters: dict[str, int]) -> None:
    """The rerun of embed-entities in ``output`` (its ``counters``) encoded at most what was not ``stored`` (+5%)
    and ended with ``full_run``'s artifacts, nothing kept for another rerun."""
    mentions = tables.total_rows(str(output), layout.MENTIONS)
    encoded, reused = counters["mentions_encoded"], counters["mentions_reused"]
    assert encoded + reused == counters["mentions_embedded"]
    print(f"{mentions} mentions, {stored} windows stored when stopped; the rerun encoded {encoded}, reused {reused}")
    assert encoded <= mentions - stored + 0.05 * mentions, (encoded, stored, mentions)
    assert reused >= stored
    expected, found = entity_vectors(full_run), entity_vectors(output)
    assert sorted(found) == sorted(expected)
    assert least_cosine(found, expected) >= 0.99999
    assert tables.total_rows(str(output), layout.MENTION_VECTORS) == tables.total_rows(
        str(full_run), layout.MENTION_VECTORS)
    assert kept_rows(output, layout.EMBED_ENTITIES_STAGE) == 0
    assert main(["validate", "--output", str(output)]) == 0


def test_embed_entities_stopped_by_ctrl_c_encodes_only_what_it_had_not_stored(full_run, tiny_bert, tmp_path):
    output = tmp_path / "out"
    copy_stages(full_run, output, (layout.PARSE_STAGE, layout.DICTIONARY_STAGE, layout.MENTIONS_STAGE))
    mentions = tables.total_rows(str(output), layout.MENTIONS)
    stored, counters = stopped_and_rerun("embed-entities", output, tiny_bert, 1, mentions, signal.SIGINT)
    assert 0 < stored < mentions  # stopped in the middle: some work kept, some not
    assert_entities_resumed(output, full_run, stored, counters)


def test_a_model_process_killed_mid_stage_is_one_line_and_the_rerun_resumes(full_run, tiny_bert, tmp_path):
    """One of two model processes killed (as the kernel's out-of-memory killer does) while the stage encodes:
    Beam's runner raised "Channel closed prematurely" up to the command line, after its threads' tracebacks; now
    one line, exit 2, and the rerun encodes only what was not stored (the other model process may have finished
    its share meanwhile)."""
    output = tmp_path / "out"
    copy_stages(full_run, output, (layout.PARSE_STAGE, layout.DICTIONARY_STAGE, layout.MENTIONS_STAGE))
    total = tables.total_rows(str(output), layout.MENTIONS)
    arguments = [*stage_args("embed-entities", output, tiny_bert), "--model-workers", "2", *MULTI_PROCESS]
    process = subprocess.Popen([sys.executable, str(REPO / "run_pipeline.py"), *arguments],
                               env=paced_environment(total, tmp_path), cwd=REPO, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while kept_rows(output, layout.EMBED_ENTITIES_STAGE) < 0.3 * total:
            assert process.poll() is None, process.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "the run stored too little in 180 s"
            time.sleep(0.05)
        model = model_worker_processes(process.pid)
        assert len(model) == 2, model
        os.kill(model[0], signal.SIGKILL)
        _, stderr = process.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 2, stderr[-3000:]
    assert stderr.rstrip().splitlines()[-1] == (
        "error: embed-entities: a worker process was killed (SIGKILL: by the kernel's out-of-memory killer when "
        "dmesg says so) in the middle of its work; rerun the same command to resume")
    assert "Traceback" not in stderr and "Exception in thread" not in stderr  # Beam's threads' ~140 lines held
    stored = kept_rows(output, layout.EMBED_ENTITIES_STAGE)
    assert main([*stage_args("embed-entities", output, tiny_bert), *DIRECT]) == 0
    assert_entities_resumed(output, full_run, stored, manifest.load(str(output))[layout.EMBED_ENTITIES_STAGE].counters)


def passage_vectors(output: Path) -> dict[int, np.ndarray]:
    found = {}
    for path in sorted((output / layout.INDEX / "embeddings").rglob("*.parquet")):
        table = pq.read_table(path, columns=["passage_id", "embedding"])
        found.update(zip(table.column("passage_id").to_pylist(), np.array(table.column("embedding").to_pylist()),
                         strict=True))
    return found


def test_a_killed_index_encodes_only_the_passages_it_had_not_kept(full_run, tiny_bert, tmp_path):
    output = tmp_path / "out"
    copy_stages(full_run, output, (layout.PARSE_STAGE, layout.DICTIONARY_STAGE, layout.MENTIONS_STAGE,
                                   layout.EMBED_ENTITIES_STAGE))
    passages = manifest.load(str(full_run))[layout.INDEX_STAGE].counters["passages_indexed"]
    kept, counters = stopped_and_rerun("index", output, tiny_bert, 2, passages, signal.SIGKILL)
    encoded, reused = counters["passages_encoded"], counters["passages_reused"]
    print(f"{passages} passages, {kept} kept when stopped; the rerun encoded {encoded}, reused {reused}")
    assert (encoded + reused, counters["passages_indexed"]) == (passages, passages)
    assert kept > 0 and reused >= kept and encoded <= passages - kept + 0.05 * passages
    expected, found = passage_vectors(full_run), passage_vectors(output)
    assert sorted(found) == sorted(expected)
    assert max(float(np.abs(found[key] - expected[key]).max()) for key in expected) < 1e-4
    assert kept_rows(output, layout.INDEX_STAGE) == 0
    assert main(["validate", "--output", str(output)]) == 0


def test_a_stage_found_complete_removes_what_a_run_killed_after_its_record_left(full_run, tiny_bert, tmp_path):
    """A run killed between writing its record and removing its staging directory and kept work (which can hold a
    stage's every encoded passage) left them for good: the rerun found the stage complete and did nothing."""
    out = tmp_path / "out"
    copy_stages(full_run, out, tuple(manifest.load(str(full_run))))
    finished = manifest.finished_time(manifest.load(str(out))[layout.INDEX_STAGE])
    staging, kept = out / ".staging" / "index", out / ".staging" / f"index{layout.KEPT}"
    for directory in (staging / "work", kept):
        directory.mkdir(parents=True)
        (directory / "part.parquet").write_bytes(b"left")
        os.utime(directory / "part.parquet", (finished - 5, finished - 5))
    assert main(stage_command("index", out, tiny_bert)) == 0
    assert not staging.exists() and not kept.exists()
    # kept work written since the record (a later run of other options, killed) is left for that run's rerun
    kept.mkdir(parents=True)
    (kept / "part.parquet").write_bytes(b"kept")
    os.utime(kept / "part.parquet", (finished + 60, finished + 60))
    assert main(stage_command("index", out, tiny_bert)) == 0
    assert (kept / "part.parquet").read_bytes() == b"kept"
