"""What one core prepares a second for each GPU path, and how many cores one GPU needs to run at its ceiling.

The GPU's process only runs the model; its inputs are built by the other cores (embed-entities' inputs pipeline;
the index's encoders build theirs in each worker). This prints, pinned to ONE core (the process's affinity is set
before any tokenizer loads, so the fast tokenizer's thread pool has one thread too), the inputs built a second
on each path from the bundled sample and the real DPR passages:

- ``[MASK]`` mentions at 512 and 128 tokens: ``mask_inputs`` on the sample's windows (embed-entities' calls);
- DPR passages: the DPR encoder's ``TextInputs.passages`` (title and text as a pair, 256 tokens);
- KPR passages: ``KPRInputs.passages`` (the linker on title and text, then the pieces tokenized), with the
  sample's linker and its entities (their vectors are not read: only which entities have one);

then the cores an H100 and an H200 need at the ceilings measured on them (README "GPUs": BERT-base, bfloat16,
``--batch-tokens 65536``). Run on a quiet machine; figures are per core of this one.

    python -m bench.stand_in [--work DIR]
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# Sequences a second of a plain forward on one card (README "GPUs", measured 2026-11-26 and 2026-11-27).
CEILINGS = {"[MASK] mentions, 512 tokens": (4_000, 4_326), "[MASK] mentions, 128 tokens": (16_964, 18_498),
            "DPR passages": (14_625, 15_560), "KPR passages (linker included)": (14_625, 15_560)}
CARDS = ("H100", "H200")


def one_core() -> None:
    """This process (and the threads it starts from now on) on one core."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    os.environ["RAYON_NUM_THREADS"] = "1"


def rate(build: Callable[[Sequence], object], items: Sequence, per_call: int, seconds: float = 10.0) -> float:
    """Items a second of ``build`` over calls of ``per_call`` items, repeated for at least ``seconds``."""
    build(items[:per_call])  # warm-up: tries, vocabularies
    done, started = 0, time.perf_counter()
    while done == 0 or time.perf_counter() - started < seconds:
        for begin in range(0, len(items), per_call):
            build(items[begin:begin + per_call])
        done += len(items)
    return done / (time.perf_counter() - started)


def mention_rows(work: str, length: int) -> list[dict]:
    """The sample's mention windows as embed-entities cuts them at ``length`` tokens."""
    from artifacts import tables
    from bench.common import build_sample, mention_windows
    from transforms.embed_entities.inputs import mention_problem

    output = str(Path(work) / f"sample-{length}")
    build_sample(output, length)
    rows = mention_windows(output, tables.read_table(output, "mentions").to_pylist())
    return [row for row in rows if mention_problem(row) is None]


def known_entities(output: str, directory: str) -> str:
    """``directory``/entity_embeddings/ with every entity of ``output`` (zero vectors: KPR's inputs read only
    the ids); returns ``directory``."""
    import numpy as np
    import pyarrow as pa

    from artifacts import layout, schemas, tables

    ids = tables.read_table(output, layout.ENTITIES, ["entity_id"]).column("entity_id").to_numpy()
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(len(ids) * 4, dtype=np.float32)), 4)
    table = pa.table({"entity_id": ids, "title": [""] * len(ids), "qid": [None] * len(ids), "embedding": vectors,
                      "mention_count": np.ones(len(ids), dtype=np.int32)}, schema=schemas.entity_embeddings(4))
    tables.write_file(str(Path(directory) / layout.ENTITY_EMBEDDINGS / "part-00000-of-00001.parquet"), table)
    return directory


def prepared_rates(work: str, model: str) -> dict[str, float]:
    from artifacts import layout
    from bench.common import real_passages
    from bench.kpr import kpr_checkpoint
    from encoders.kpr import KPRInputs
    from encoders.mask_inputs import mask_inputs
    from encoders.models import load_tokenizer
    from encoders.retrievers import EncoderOptions, TextInputs
    from transforms.embed_entities.inputs import ROWS_PER_CALL

    tokenizer = load_tokenizer(model)
    rates = {}
    for length in (512, 128):
        rows = mention_rows(work, length)
        rates[f"[MASK] mentions, {length} tokens"] = rate(
            lambda chunk, length=length: mask_inputs(chunk, tokenizer, length), rows, ROWS_PER_CALL[1])
    passages = real_passages()
    dpr = TextInputs(EncoderOptions("dpr", model, max_length=256))
    rates["DPR passages"] = rate(dpr.passages, passages, 512)
    sample = str(Path(work) / "sample-128")
    known = known_entities(sample, str(Path(work) / "known-entities"))
    checkpoint = kpr_checkpoint(model, known, str(Path(work) / "kpr-checkpoint"))
    kpr = KPRInputs(EncoderOptions("kpr", checkpoint, max_length=256, linker=str(Path(sample) / layout.LINKER),
                                   entity_embeddings=str(Path(known) / layout.ENTITY_EMBEDDINGS)))
    rates["KPR passages (linker included)"] = rate(kpr.passages, passages, 512)
    return rates


def report(rates: dict[str, float]) -> None:
    print(f"{'path':<32} {'one core prepares':>18}" + "".join(f" {card + ' ceiling':>14} {'cores':>6}"
                                                             for card in CARDS))
    for path, prepared in rates.items():
        cells = "".join(f" {ceiling:>14,} {math.ceil(ceiling / prepared):>6}" for ceiling in CEILINGS[path])
        print(f"{path:<32} {prepared:>16,.0f}/s{cells}")
    print("cores: what one GPU needs beside the core of its own process to be fed at its ceiling")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, help="where the sample OUTs are built (default: a temporary directory)")
    args = parser.parse_args()
    one_core()
    from bench.paths import minilm_path

    print(f"one core of {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}; the packaged MiniLM's tokenizer "
          "(WordPiece, uncased: BERT-base's)")
    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)
        report(prepared_rates(str(args.work), minilm_path()))
    else:
        with tempfile.TemporaryDirectory(prefix="kpr-stand-in-") as work:
            report(prepared_rates(work, minilm_path()))


if __name__ == "__main__":
    main()
