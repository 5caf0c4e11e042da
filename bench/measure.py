"""Timing of the passage side in bench/gpu.py (dense and KPR): rates, the passage encoder path, the index stage."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.common import BusySampler, phase_lines, real_passages, run_cli_logged, synchronize


@dataclass(frozen=True)
class Rate:
    items: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.items / self.seconds


def timed(run: Callable[[], object], items: int, device: str) -> Rate:
    synchronize(device)
    started = time.perf_counter()
    run()
    synchronize(device)
    return Rate(items, time.perf_counter() - started)


def in_calls(items: list, per_call: int) -> list[list]:
    return [items[begin:begin + per_call] for begin in range(0, len(items), per_call)]


def passage_paths(options, passages: list) -> tuple[Rate, Rate, float, list[str]]:
    """The index's two paths for the encoder of ``options``: the model inputs built from passages (tokenizing, a
    KPR encoder's linking; in this one process, as every core builds them) and the forward on ready inputs (as the
    GPU's process runs it, on files of ``INPUT_FILE_ROWS``); the mean tokens per passage; and what one file's
    forward spent its time on (``busiest_ops``)."""
    from encoders.batching import HostBuffers
    from encoders.loading import load_inputs, load_retriever
    from transforms.index.inputs import INPUT_FILE_ROWS, PASSAGES_PER_CALL, inputs_table, table_inputs

    inputs, model = load_inputs(options), load_retriever(options)
    mean_length = model.token_count(passages[:751]) / min(len(passages), 751)
    built: list = []
    rate = timed(lambda: [built.extend(inputs.passages(call)) for call in in_calls(passages, PASSAGES_PER_CALL[1])],
                 len(passages), "cpu")
    files = [table_inputs(inputs_table(part_passages, part, "")) for part_passages, part in
             zip(in_calls(passages, INPUT_FILE_ROWS), in_calls(built, INPUT_FILE_ROWS), strict=True)]
    model.encode_ready(files[0][1], list(range(min(64, len(passages)))))  # warm-up
    buffers = HostBuffers()  # the arrays the stage's steps come back into
    forward = timed(lambda: [model.encode_ready(ready, None, buffers.take(len(ready), model.dim))
                             for _, ready in files], len(passages), options.device)
    return rate, forward, mean_length, busiest_ops(lambda: model.encode_ready(files[0][1]), options.device)


def busiest_ops(run: Callable[[], object], device: str, count: int = 6) -> list[str]:
    """Lines naming what took the most of one ``run``'s device time (on a GPU its kernels: which attention kernel a
    forward runs, say; on a CPU the ops' own CPU time), from torch's profiler, busiest first."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as profiler:
        run()
        synchronize(device)
    events = profiler.key_averages()

    def spent(event) -> float:
        return event.self_device_time_total if cuda else event.self_cpu_time_total

    total = sum(spent(event) for event in events) or 1.0
    return [f"{spent(event) / total:6.1%} {event.count:7,} calls  {event.key[:110]}"
            for event in sorted(events, key=spent, reverse=True)[:count]]


def write_corpus(path: Path, count: int) -> None:
    """The real passages repeated to ``count`` rows, each copy with new ids (a DPR TSV)."""
    import csv

    base = real_passages()
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", quotechar='"', doublequote=True, lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        for index in range(count):
            passage = base[index % len(base)]
            writer.writerow([index + 1, passage.text, passage.title])


def index_stage(args, encoder: str, corpus: Path, passages: int, target: str, *extra: str) -> tuple[Rate, str]:
    """(rate, GPU busy share) of the index stage on ``corpus`` into ``target``, Flat; ``extra``: more flags
    (``--encoder-type kpr``; default dpr)."""
    flags = ["--device", args.device, "--dtype", args.dtype, "--batch-tokens", str(args.batch_tokens),
             "--index-factory", "Flat", *args.beam, *extra]
    return timed_stage(args.device, passages, "index", "--output", target, "--encoder", encoder, "--corpus",
                       str(corpus), *flags)


def timed_stage(device: str, items: int, *argv: str) -> tuple[Rate, str]:
    """(rate, GPU busy share) of a GPU stage's command ``argv`` on ``items``; the busy share is followed by the
    stage's own lines on where its time went (its model processes' parts, its pipelines' ends)."""
    logs: list[str] = []
    with BusySampler(device) as busy:
        rate = timed(lambda: logs.append(run_cli_logged(*argv)[1]), items, device)
    return rate, "\n    ".join([busy.describe(), *phase_lines(logs[0])])
