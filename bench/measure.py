"""Timing of the passage side in bench/gpu.py (dense and KPR): rates, the passage encoder path, the index stage."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.common import BusySampler, real_passages, run_cli, synchronize


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


def passage_path(options, passages: list) -> tuple[Rate, float]:
    """(PassageEncoderHandler.run_inference rate for the encoder of ``options``, mean tokens per passage)."""
    from encoders.loading import PassageEncoderHandler

    handler = PassageEncoderHandler(options)
    model = handler.load_model()
    mean_length = model.token_count(passages[:751]) / min(len(passages), 751)
    calls = in_calls(passages, max(1, int(handler.batch_weight // mean_length)))
    handler.run_inference(calls[0][:64], model)  # warm-up
    return timed(lambda: [handler.run_inference(call, model) for call in calls], len(passages), options.device), \
        mean_length


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
    with BusySampler(args.device) as busy:
        rate = timed(lambda: run_cli("index", "--output", target, "--encoder", encoder, "--corpus", str(corpus),
                                     *flags), passages, args.device)
    return rate, busy.describe()
