"""Row builders and small OUT directories shared by the test files (test files import from here, never from
each other): hand-made articles, a parsed OUT, the stage options of the small full runs, a FAISS index dir, local
files seen as a remote store."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline

from artifacts import faiss as shards
from artifacts import layout, schemas, tables
from artifacts.passages import Passage, shard_of
from artifacts.run import manifest
from bench.object_store import MirrorFileSystem, mirrored  # noqa: F401 (the tests import them from here)
from tests.conftest import BUNDLED_PASSAGES, BUNDLED_SAMPLE, DIRECT, REPO, copy_stages, stage_options
from transforms.common.dead_letters import COUNTER_NAMESPACE
from transforms.embed_entities.mention_windows import REF
from transforms.index.passages import parse_dpr_row

# --- articles and a parsed OUT ----------------------------------------------------------------------------------


def first_row_group_columns(source) -> dict[str, pq.ColumnChunkMetaData]:
    """The column chunks of a Parquet file's first row group (``source``: a path or a file-like), by top-level
    column name: how each column was written (encodings, statistics)."""
    group = pq.ParquetFile(source).metadata.row_group(0)
    return {group.column(i).path_in_schema.split(".")[0]: group.column(i) for i in range(group.num_columns)}


def ref_rows(refs: list[dict]) -> np.ndarray:
    """The ``REF`` rows (embed-entities' packed refs) of ``mentions/`` rows given as dicts."""
    return np.array([tuple(ref[name] for name in REF.names) for ref in refs], dtype=REF)


def format_dpr_row(passage: Passage) -> str:
    """The DPR file line of a passage (the inverse of ``parse_dpr_row``: fields with a quote, tab or line break
    quoted, inner quotes doubled)."""
    return "\t".join(quoted_field(field) for field in (str(passage.passage_id), passage.text, passage.title))


def quoted_field(field: str) -> str:
    if any(character in field for character in '"\t\n\r'):
        return '"' + field.replace('"', '""') + '"'
    return field


def article(page_id: int, title: str, text: str, links: list[tuple[str, str]], qid: str | None = None) -> dict:
    """An article row whose links are given as (anchor, target); anchors are found in order in the text."""
    rows, position = [], 0
    for anchor, target in links:
        start = text.index(anchor, position)
        rows.append({"start": start, "end": start + len(anchor), "target": target})
        position = start + len(anchor)
    return {"page_id": page_id, "title": title, "text": text, "links": rows, "qid": qid}


def write_parsed(output: Path, articles: list[dict], options: dict | None = None) -> None:
    """An OUT as the parse stage leaves it: articles/ and its manifest record (of parse's ``options``)."""
    (output / "articles").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(articles, schema=schemas.ARTICLES), output / "articles" / "part-0.parquet")
    record = manifest.StageRecord(stage="parse", options=options or {}, inputs={},
                                  outputs=manifest.describe_outputs(str(output), ["articles"]))
    manifest.save(str(output), {"parse": record})


CAPITALS = [
    article(1, "Paris", "Paris is the capital of France. It lies on the Seine.",
            [("France", "France"), ("Seine", "Seine")]),
    article(2, "France", "France is a country. Its capital is Paris, on the river Seine.",
            [("Paris", "Paris"), ("Seine", "Seine")]),
    article(3, "Seine", "The Seine flows through Paris in France. Paris grew on the Seine.",
            [("Paris", "Paris"), ("France", "France"), ("Paris", "Paris")]),
]

def article_texts(output: Path) -> dict[int, str]:
    return {row["page_id"]: row["text"] for row in tables.read_table(str(output), "articles", ["page_id", "text"])
            .to_pylist()}


def write_entities(output: Path, titles: list[str], qids: dict[str, str] | None = None) -> None:
    """entities/ of ``titles`` (entity ids 1..N in order; page ids 100 + id) without a manifest record."""
    rows = [{"entity_id": entity_id, "title": title, "page_id": 100 + entity_id, "qid": (qids or {}).get(title),
             "link_count": 0} for entity_id, title in enumerate(titles, start=1)]
    (output / "entities").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schemas.ENTITIES), output / "entities" / "part-0.parquet")


# --- full runs with small settings ------------------------------------------------------------------------------

# The stage options of conftest's ``full_run`` as one `all` command line.
ALL_OPTIONS = ["--include-red-links", "--max-mentions", "4", "--max-seq-length", "64", "--encoder-type", "mean",
               "--max-length", "64", "--shards", "2"]


def record(out: Path, relative: str) -> None:
    """Record the current size, sha256 and rows of one output file in the manifest (as if a stage wrote it)."""
    stages = manifest.load(str(out))
    for stage in stages.values():
        stage.outputs = [manifest.describe_file(str(out), str(out / relative)) if item.path == relative else item
                         for item in stage.outputs]
    manifest.save(str(out), stages)


def stage_command(command: str, output: Path, model: Path, *extra: str) -> list[str]:
    """The stage ``command`` (e.g. ``embed-entities``) as conftest's ``full_run`` runs it, with ``extra``."""
    return [command, "--output", str(output), *stage_options(model)[command], *extra, *DIRECT]


def all_command(output: Path, model: Path, *extra: str, dump: Path = BUNDLED_SAMPLE) -> list[str]:
    """`all` on ``dump`` (default: the bundled sample) with the small settings, ``model`` for both encoders."""
    return ["all", "--dump", str(dump), "--output", str(output), "--model", str(model),
            "--encoder", str(model), *ALL_OPTIONS, *extra, *DIRECT]


@dataclass(frozen=True)
class SignalledRun:
    """A command started as from a terminal and signalled once it was ready (``signal_when``)."""

    command: list[str]
    environment: dict[str, str]
    returncode: int
    before: list[str]  # its stderr lines read before the signal was sent
    after: list[str]  # its stderr lines read after (some may have been written before)
    left_running: list[str]  # processes of its process group still running once it had exited

    @property
    def stderr(self) -> str:
        return "".join(f"{line}\n" for line in [*self.before, *self.after])

    def rerun(self) -> subprocess.CompletedProcess:
        return subprocess.run(self.command, cwd=REPO, env=self.environment, capture_output=True, text=True,
                              timeout=600)


def default_interrupt() -> None:
    """SIGINT's default disposition, in a child before it runs (Ctrl-C in a terminal)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signal_when(arguments: list[str], ready: Callable[[list[str]], bool], signal_number: int,
                timeout_s: float = 300, environment: dict[str, str] | None = None) -> SignalledRun:
    """Run `run_pipeline.py arguments` as from a terminal, in a process group of its own (in ``environment``; by
    default this one's with PYTHONPATH at the checkout), and send the whole group ``signal_number`` (as Ctrl-C or a
    kill does) once ``ready`` says so of the stderr lines read so far (asked as they come and every 20 ms). Not
    signalled if it ends first."""
    command = [sys.executable, str(REPO / "run_pipeline.py"), *arguments]
    environment = environment or {**os.environ, "PYTHONPATH": str(REPO)}
    # As from a terminal: Python turns SIGINT into KeyboardInterrupt only if the parent did not ignore it, and a
    # test runner's worker process may ignore it.
    process = subprocess.Popen(command, cwd=REPO, env=environment, start_new_session=True,
                               preexec_fn=default_interrupt, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    lines: list[str] = []

    def read() -> None:
        for line in process.stderr:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    while process.poll() is None and not ready(list(lines)) and time.monotonic() < deadline:
        time.sleep(0.02)
    read_before = len(lines)
    with contextlib.suppress(ProcessLookupError):  # it may have ended meanwhile
        os.killpg(process.pid, signal_number)
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:  # killed, not left to the rest of the suite
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise AssertionError(f"still running 120 s after signal {signal_number}; its stderr before the signal:\n"
                             + "\n".join(lines[:read_before])) from None
    reader.join(timeout=60)  # to EOF: when every process that shares its stderr (Beam's workers) has exited
    process.stderr.close()
    return SignalledRun(command, environment, process.returncode, lines[:read_before], lines[read_before:],
                        running_in_group(process.pid))


def running_in_group(group: int, wait_s: float = 10.0) -> list[str]:
    """The processes of process group ``group`` still running after up to ``wait_s`` seconds (``pid (name)``)."""
    deadline = time.monotonic() + wait_s
    while True:
        running = [name for name, process_group in map(process_of, Path("/proc").glob("[0-9]*/stat"))
                   if process_group == group]
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.1)


def process_of(stat: Path) -> tuple[str, int | None]:
    """(``pid (name)``, process group) of the process whose /proc/PID/stat is ``stat``; no group once it has
    exited (a zombie too: its parent's exit left it to init, which reaps it in its own time)."""
    try:
        text = stat.read_text()
    except OSError:
        return stat.parent.name, None
    name_end = text.rindex(")")
    state, _, process_group = text[name_end + 2:].split()[:3]
    return text[:name_end + 1], None if state == "Z" else int(process_group)


def signal_all_in_embed_entities(full_run: Path, model: Path, output: Path, signal_number: int) -> SignalledRun:
    """OUT starts with the first three stages of ``full_run``, so that `all` gets to embed-entities at once; the
    whole process group gets ``signal_number`` (as Ctrl-C or a kill would) as soon as that stage stages files."""
    output.mkdir()
    copy_stages(full_run, output, ("parse", "dictionary", "mentions"))
    staging = output / layout.STAGING / "embed_entities"
    return signal_when(all_command(output, model, "--no-report"), lambda _: staging.exists(), signal_number)


def artifact_rows(output: Path, artifact: str, columns: list[str] | None = None) -> list[dict]:
    """Every row of ``output/artifact/*.parquet``, file by file in name order."""
    return [row for path in sorted((output / artifact).glob("*.parquet"))
            for row in pq.read_table(path, columns=columns).to_pylist()]


def dpr_passages(corpus: Path = BUNDLED_PASSAGES, count: int | None = None) -> list[Passage]:
    """The first ``count`` passages (all without it) of a real DPR ``psgs_w100`` file: samples/' 150 by default."""
    lines = corpus.read_text(encoding="utf-8").splitlines()[1:]
    assert count is None or count <= len(lines), f"{corpus} has {len(lines)} passages"
    return [parse_dpr_row(line) for line in lines[:count]]


def stored_rows(output: Path) -> dict[int, dict]:
    """Every row of index/embeddings/*, by passage id, with the shard directory it is in."""
    rows = {}
    for path in sorted((output / "index" / "embeddings").rglob("*.parquet")):
        for row in pq.read_table(path).to_pylist():
            rows[row["passage_id"]] = {**row, "shard": path.parent.name}
    return rows


# --- vectors and a FAISS index directory ------------------------------------------------------------------------

DIM = 16


def clustered(count: int, dim: int = DIM, clusters: int = 20, seed: int = 0) -> np.ndarray:
    """Unit vectors around random centres: what real embeddings look like to an IVF index."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dim))
    vectors = centres[rng.integers(0, clusters, count)] + 0.3 * rng.normal(size=(count, dim))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def brute_force(vectors: np.ndarray, ids: np.ndarray, queries: np.ndarray, k: int):
    scores = queries @ vectors.T
    order = np.lexsort((np.broadcast_to(ids, scores.shape), -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, axis=1), ids[order]


def write_index_dir(directory, vectors: np.ndarray, ids: np.ndarray, shard_count: int, factory: str = "Flat",
                    files_per_shard: int = 2):
    """An OUT/index as the index stage leaves it, built with the stage's own functions."""
    index_dir = str(directory)
    rows = [(int(passage_id), f"T{passage_id}", f"text of {passage_id}", vector)
            for passage_id, vector in zip(ids, vectors, strict=True)]
    for shard in range(shard_count):
        mine = [row for row in rows if shard_of(row[0], shard_count) == shard]
        folder = directory / shards.EMBEDDINGS_DIR / shards.shard_name(shard)
        folder.mkdir(parents=True)
        for part in range(files_per_shard):
            pq.write_table(shards.embedding_table(mine[part::files_per_shard], DIM), folder / f"part-{part}.parquet")
    sample = shards.train_index(factory, DIM, vectors)
    shards.write_index(sample, f"{index_dir}/{shards.TRAINED_NAME}")
    trained = f"{index_dir}/{shards.TRAINED_NAME}"
    summaries = [shards.add_shard_files(shards.read_index(trained, mmap=False), index_dir, shards.shard_name(shard))
                 for shard in range(shard_count)]
    info = shards.IndexInfo(factory=factory, metric="cosine", dim=DIM, count=len(ids), shards=shard_count,
                            shard_files=summaries)
    (directory / shards.INDEX_JSON).write_text(json.dumps(info.to_json()))
    return index_dir


def run_counting(build: Callable[[beam.Pipeline], None]) -> dict[str, int]:
    """Run the pipeline ``build`` makes (its assert_that checks included); the counters it counted."""
    pipeline = TestPipeline(argv=DIRECT)
    build(pipeline)
    result = pipeline.run()
    result.wait_until_finish()
    totals: dict[str, int] = {}
    for counter in result.metrics().query(MetricsFilter().with_namespace(COUNTER_NAMESPACE))["counters"]:
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + counter.committed
    return totals


# --- a directory of the user's own files ------------------------------------------------------------------------


def fill_with_files(directory: Path, names: tuple[str, ...] = ("notes.txt", "data/a.csv", "data/deep/b.bin")
                    ) -> dict[str, bytes]:
    """Put files of the user's own below ``directory`` (created if needed); returns what ``files_below`` gives."""
    for index, name in enumerate(names):
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"the user's own file {index}: {name}\n".encode())
    return files_below(directory)


def files_below(directory: Path) -> dict[str, bytes]:
    """Every file below ``directory`` (relative path -> content), to check that none was touched."""
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file()}


# --- a local port -----------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port of localhost that nothing listens on (free when asked: a service can take it, a client is
    refused)."""
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]
