"""Shared helpers of the benchmarks: pipeline commands run in-process, sample outputs, model builders."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from bench.paths import PASSAGES, SAMPLE, minilm_path, shared_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
RANDOM_BERT_BASE = "random-bert-base"


def run_cli(*argv: str) -> float:
    """One pipeline command in this process through `pipelines.launcher.cli.main` (DirectRunner), its chatter kept
    unless it fails; returns its wall time in seconds."""
    return run_cli_logged(*argv)[0]


def run_cli_logged(*argv: str) -> tuple[float, str]:
    """``run_cli``, and what the command wrote to stderr."""
    from pipelines.launcher.cli import main

    captured = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stderr(captured):
        code = main([*argv, "--runner=DirectRunner"])
    if code != 0:
        sys.stderr.write(captured.getvalue())
        raise SystemExit(f"`{' '.join(argv)}` failed with exit code {code}")
    return time.perf_counter() - started, captured.getvalue()


PHASE_MARKS = ("model process", "inputs' pipeline ended")  # a GPU stage's lines on where its time went


def phase_lines(log: str) -> list[str]:
    """A GPU stage's lines on where its time went (its model processes' and its pipelines' ends), from its log."""
    return [line for line in log.splitlines() if any(mark in line for mark in PHASE_MARKS)]


def build_sample(output: str, max_seq_length: int) -> float:
    """parse + dictionary + mentions of the bundled sample into ``output`` (resumed if already there)."""
    started = time.perf_counter()
    run_cli("parse", "--dump", str(SAMPLE), "--output", output)
    run_cli("dictionary", "--output", output, "--include-red-links")
    run_cli("mentions", "--output", output, "--max-seq-length", str(max_seq_length))
    return time.perf_counter() - started


def random_bert_base(directory: str) -> str:
    """A BERT-base-sized BertModel with random weights and the MiniLM's uncased vocabulary (nothing downloaded)."""
    from encoders.models import save_random_bert

    return save_random_bert(directory, minilm_path())


def chosen_model(name: str, work: str) -> str:
    """The model a benchmark's --model names: 'minilm' (packaged), RANDOM_BERT_BASE (built under ``work``) or a
    path."""
    if name == "minilm":
        return minilm_path()
    if name == RANDOM_BERT_BASE:
        return random_bert_base(str(Path(work) / RANDOM_BERT_BASE))
    return name


def row_count(output: str, name: str) -> int:
    """Rows of artifact ``name`` from the Parquet footers."""
    from artifacts import tables

    return sum(tables.parquet_row_count(path) for path in tables.parquet_files(output, name))


def mean_mentions_per_entity(output: str) -> float:
    """Sampled mentions per entity with at least one, from the mentions stage's counters (or its rows)."""
    from artifacts import tables
    from artifacts.run import manifest

    record = manifest.load(output).get("mentions")
    counters = record.counters if record else {}
    if counters.get("entities_with_mentions"):
        return counters["mentions_sampled"] / counters["entities_with_mentions"]
    ids = tables.read_table(output, "mentions", ["entity_id"]).column("entity_id")
    return len(ids) / max(len(ids.unique()), 1)


def non_embedding_parameters(model) -> int:
    """Parameters used per token: all but the embedding tables (and BERT's pooler, used once per sequence)."""
    skipped = set()
    for name in ("embeddings", "pooler"):
        module = getattr(model, name, None)
        if module is not None:
            skipped |= {id(parameter) for parameter in module.parameters()}
    if not skipped:
        skipped = {id(model.get_input_embeddings().weight)}
    return sum(parameter.numel() for parameter in model.parameters() if id(parameter) not in skipped)


def sequence_flops(length: int, parameters: int, layers: int, hidden: int) -> float:
    """Forward FLOPs of one sequence: the dense matmuls plus attention scores and their weighted sum."""
    return 2.0 * parameters * length + 4.0 * layers * length * length * hidden


def synchronize(device: str) -> None:
    """Wait for queued GPU work, so that the clock measures work done, not work launched."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def subset_output(source: str, target: str, limit: int) -> int:
    """An OUT with ``source``'s parse, dictionary and mentions records but only ``limit`` mentions (0: all)."""
    import pyarrow.parquet as pq

    from artifacts import schemas, tables
    from artifacts.run import manifest

    records = manifest.load(source)
    for name in ("parse", "dictionary"):  # the stage checks what it reads against the records
        for item in records[name].outputs:
            (Path(target) / item.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(source) / item.path, Path(target) / item.path)
    table = tables.read_table(source, "mentions")
    table = table.sort_by([("entity_id", "ascending"), ("page_id", "ascending"), ("start", "ascending")])
    if limit:
        table = table.slice(0, limit)
    (Path(target) / "mentions").mkdir()
    pq.write_table(table, Path(target) / "mentions" / "part-00000-of-00001.parquet",
                   compression=schemas.PARQUET_CODEC)
    records["mentions"].outputs = manifest.describe_outputs(target, ["mentions"])
    manifest.save(target, {name: records[name] for name in ("parse", "dictionary", "mentions")})
    return table.num_rows


def mention_windows(output: str, refs: list[dict]) -> list[dict]:
    """The mention rows embed-entities encodes for ``refs`` (mentions/ rows): windows cut from articles/."""
    from artifacts import tables
    from artifacts.run import manifest
    from transforms.common.mention_sampling import CHARS_PER_TOKEN, mention_window

    pages = {ref["page_id"] for ref in refs}
    texts = {row["page_id"]: row["text"] for batch in tables.iter_batches(output, "articles", ["page_id", "text"])
             for row in batch.to_pylist() if row["page_id"] in pages}
    chars = manifest.load(output)["mentions"].options["max_seq_length"] * CHARS_PER_TOKEN
    return [mention_window(ref, texts[ref["page_id"]], chars) for ref in refs]


def real_passages() -> list:
    from transforms.index.passages import parse_dpr_row

    return [parse_dpr_row(line) for line in shared_file(PASSAGES).read_text(encoding="utf-8").splitlines()[1:]]


class BusySampler:
    """Mean GPU utilization (nvidia-smi's figure, %) sampled in a thread while a stage runs; None on the CPU."""

    def __init__(self, device: str, every: float = 0.2) -> None:
        self._device, self._every = device, every
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> float | None:
        import torch

        try:
            return float(torch.cuda.utilization(torch.device(self._device)))
        except Exception:  # no pynvml: ask nvidia-smi
            import subprocess

            output = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                                    capture_output=True, text=True, check=False).stdout.split()
            return float(output[0]) if output else None

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            value = self._sample()
            if value is not None:
                self._samples.append(value)

    def __enter__(self) -> BusySampler:
        if self._device.startswith("cuda"):
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def describe(self) -> str:
        if not self._samples:
            return "n/a"
        busy = sum(value >= 80 for value in self._samples) / len(self._samples)
        return f"mean {sum(self._samples) / len(self._samples):.0f}%, >= 80% in {busy:.0%} of samples"


def forget_kept_work(output: Path | str, stage: str) -> None:
    """Remove what an earlier run of ``stage`` kept for reuse (embed-entities' committed window store, a killed
    run's kept vectors), so that a measured run encodes everything, as a first run does."""
    from artifacts import layout
    from artifacts.run import manifest

    name = stage.replace("-", "_")
    kept = [artifact for artifact in layout.STAGE_OUTPUTS[name] if artifact in manifest.KEPT_ARTIFACTS]
    output = Path(output)
    for path in [*(output / artifact for artifact in kept), output / layout.STAGING / f"{name}{layout.KEPT}"]:
        shutil.rmtree(path, ignore_errors=True)
