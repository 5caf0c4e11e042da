"""The GPU stages against what the hardware can do (issue 10), in one run.

Prints: the ceiling (a plain transformers BertModel forward over fixed-shape batches of random ids: no tokenization,
no padding, no copies back; same weights, dtype and length) at 512 and 128 tokens for mentions and at the real
passages' mean length; the [MASK] paths and the passage paths (DPR kind), each as the stage splits it: the inputs
built in one process, as every core builds them, and the forward on ready inputs, as the GPU's process runs it; each
stage end to end (embed-entities on the bundled sample's mentions, or those of ``--mentions-out``, index on the 751
real DPR passages repeated with new ids; model load included); the ratios; the GPU busy share during the stages;
what one step of each forward on ready inputs spent its device time on (torch's profiler: the busiest kernels, which
attention kernel among them); projected hours for 7M entities and 21M passages; the KPR encoder (bench/kpr.py: the
same model with random fusion weights, the first embed-entities OUT's own linker and entity embeddings) on the same
passages: the linker alone (one CPU thread), the KPR paths and the index stage with --encoder-type kpr, against the
passages' ceiling; bytes per row of every artifact and the projection for English Wikipedia.

CPU (the packaged MiniLM; counts large enough that Beam start-up and model load do not dominate, about 10
minutes on 2 cores; the stage / encoder ratio is the figure that matters here):

    python -m bench.gpu --mentions 1024 --passages 2048

H100 / H200 (a bare CUDA machine with PyTorch and no registry): build the kit here with ``bench/gpu_kit.sh`` (Beam,
spaCy, FAISS and the rest for its Python 3.12, packed within the 64 MiB that travels, the tokenizer-only MiniLM that
random-bert-base takes its vocabulary from, the real DPR passages; ``KIT_CHECK_PYTHON=`` a Python 3.12 here runs
the CPU stages on it before it travels), carry what it names, and run there
``bash bench/gpu_run.sh gpu``: it unpacks the kit and runs

    python3 -m bench.gpu --device cuda --dtype bfloat16 --model random-bert-base --batch-tokens 65536 \\
      --beam=--direct_running_mode=multi_processing --beam=--direct_num_workers=16

(every core building the inputs, --model-workers one per GPU). The sample's mentions are too few for the [MASK]
stage's start to weigh little: ``bash bench/gpu_run.sh mask`` measures it on a synthetic dump's (``bench.scale
--articles 40000 --workers 16 --stages parse dictionary mentions --max-seq-length 512``, ~500,000 mentions) with
``--mentions-out OUT --paths mentions --lengths 512 --mentions 200000``, then ``--lengths 128 --mentions 0`` (0: every
mention, in that OUT itself). ``bash bench/gpu_run.sh workers`` measures parse, dictionary and mentions at 4, 8 and 16
workers on that dump and on one a quarter its size.

Each stage prints where its time went (its model process: waiting for inputs, model, writing behind; when each of
its two pipelines ended): printed under the stage's line.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.common import (
    RANDOM_BERT_BASE,
    build_sample,
    chosen_model,
    forget_kept_work,
    mean_mentions_per_entity,
    mention_windows,
    real_passages,
    row_count,
    subset_output,
    synchronize,
)
from bench.kpr import DenseRun, report_kpr
from bench.measure import (
    Rate,
    busiest_ops,
    in_calls,
    index_stage,
    passage_paths,
    timed,
    timed_stage,
    write_corpus,
)
from bench.paths import PASSAGES

ENTITIES = 7_000_000
MENTION_CAP = 128
DPR_PASSAGES = 21_015_324
WIKIPEDIA_ROWS = {  # English Wikipedia, for the storage projection (DESIGN.md and the issue)
    "articles": 6_700_000, "entities": 7_000_000, "mentions": 112_000_000, "entity_embeddings": 7_000_000,
    "passages": DPR_PASSAGES, "index": DPR_PASSAGES,
}


def ceiling(model_path: str, device: str, dtype: str, length: int, batch_tokens: int, seconds: float) -> Rate:
    """Sequences/s of a bare BertModel forward over fixed-shape random ids (the fastest the model can go)."""
    import torch
    from transformers import BertModel

    from encoders.models import ModelSpec

    model = BertModel.from_pretrained(model_path, dtype=ModelSpec(model_path, device, dtype).torch_dtype())
    model = model.to(device).eval()
    rows = max(1, batch_tokens // length)
    ids = torch.randint(1000, model.config.vocab_size, (rows, length), device=device)
    with torch.inference_mode():
        model(input_ids=ids)  # warm-up: kernels, allocator
        synchronize(device)
        runs, started = 0, time.perf_counter()
        while runs < 2 or time.perf_counter() - started < seconds:
            model(input_ids=ids)
            runs += 1
            if runs % 4 == 0:
                synchronize(device)
        synchronize(device)
    return Rate(rows * runs, time.perf_counter() - started)


def mask_paths(args, model_path: str, rows: list[dict], length: int) -> tuple[Rate, Rate, list[str]]:
    """The stage's two [MASK] paths: the inputs built from mention rows (``mask_inputs`` in the stage's calls of
    up to 512 rows, as every core runs it, here in this one process) and the forward on ready inputs
    (``MaskEncoder.encode_packed`` on the model's part of up to 8,192 inputs, as the GPU's process runs it); and what
    one part's forward spent its time on (``busiest_ops``)."""
    from encoders.batching import HostBuffers
    from encoders.mask_encoder import MaskEncoder
    from encoders.mask_inputs import PackedMaskInputs, mask_inputs
    from encoders.models import ModelSpec
    from transforms.embed_entities.inputs import INPUT_FILE_ROWS, ROWS_PER_CALL

    encoder = MaskEncoder(ModelSpec(model_path, args.device, args.dtype), -1, args.batch_tokens)
    calls = in_calls(rows, ROWS_PER_CALL[1])
    built: list = []
    inputs = timed(lambda: [built.extend(mask_inputs(call, encoder.tokenizer, length)) for call in calls], len(rows),
                   "cpu")
    parts = [PackedMaskInputs.of(part) for part in in_calls(built, INPUT_FILE_ROWS)]
    encoder.encode_packed(PackedMaskInputs.of(built[:max(1, args.batch_tokens // length)]))  # warm-up
    buffers, dim = HostBuffers(), encoder.model.config.hidden_size  # the arrays the stage's steps come back into
    forward = timed(lambda: [encoder.encode_packed(part, buffers.take(len(part), dim)) for part in parts], len(rows),
                    args.device)
    return inputs, forward, busiest_ops(lambda: encoder.encode_packed(parts[0]), args.device)


def print_busiest(ops: list[str]) -> None:
    """``busiest_ops``' lines under a path's figures."""
    print("  one step of the forward on ready inputs, busiest first (share of its device time, calls, op or kernel):")
    for line in ops:
        print(f"    {line}")


def passage_options(args, model_path: str):
    from encoders.retrievers import EncoderOptions

    return EncoderOptions("dpr", model_path, device=args.device, dtype=args.dtype, batch_tokens=args.batch_tokens)


def embed_stage(args, model_path: str, sample: str, work: str, length: int) -> tuple[Rate, str, str]:
    """embed-entities end to end on ``args.mentions`` of the sample's mentions (0: all, in the sample's own OUT,
    its mentions files as the mentions stage wrote them)."""
    if args.mentions:
        target = str(Path(work) / f"embed-{length}")
        mentions = subset_output(sample, target, args.mentions)
    else:
        target, mentions = sample, row_count(sample, "mentions")
        forget_kept_work(target, "embed-entities")  # a window stored by an earlier run here is not encoded again
    flags = ["--device", args.device, "--dtype", args.dtype, "--batch-tokens", str(args.batch_tokens),
             "--max-seq-length", str(length), "--force", *args.beam]
    rate, busy = timed_stage(args.device, mentions, "embed-entities", "--output", target, "--model", model_path,
                             *flags)
    return rate, busy, target


def artifact_sizes(output: str) -> dict[str, tuple[int, int]]:
    """(bytes, rows) of every Parquet artifact under ``output`` (directories holding *.parquet)."""
    from artifacts import tables

    sizes = {}
    for folder in sorted({path.parent for path in Path(output).rglob("*.parquet")}):
        name = str(folder.relative_to(output))
        if name.startswith((".", "_")) or "/." in name:
            continue
        files = sorted(folder.glob("*.parquet"))
        sizes[name] = (sum(path.stat().st_size for path in files),
                       sum(tables.parquet_row_count(str(path)) for path in files))
    return sizes


def stored_windows_size(sample: str, work: str) -> tuple[int, int]:
    """(bytes, rows) of the sample's mentions as they were stored before the windows were cut at embed time:
    each row with its own context window (entity_id, page_id, text, start, end), zstd Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from artifacts import schemas, tables

    rows = mention_windows(sample, tables.read_table(sample, "mentions").to_pylist())
    schema = pa.schema([("entity_id", pa.int32()), ("page_id", pa.int64()), ("text", pa.string()),
                        ("start", pa.int32()), ("end", pa.int32())])
    path = Path(work) / "mentions-with-windows.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, compression=schemas.PARQUET_CODEC)
    return path.stat().st_size, len(rows)


def storage_line(name: str, size: int, rows: int) -> str:
    per_row = size / max(rows, 1)
    key = name.split("/")[-1] if name.split("/")[-1] in WIKIPEDIA_ROWS else name.split("/")[0].split(" ")[0]
    scale = WIKIPEDIA_ROWS.get(key)
    projected = f"{scale / 1e6:,.1f}M rows -> {per_row * scale / 1e9:,.1f} GB" if scale else "-"
    return f"  {name:<32} {rows:>9,} rows {size / 1e6:9.2f} MB {per_row:9.1f} B/row   {projected}"


def print_storage(outputs: list[str], measured: dict[str, tuple[int, int]],
                  windows: tuple[int, int] | None) -> None:
    """Bytes per row of every artifact of each OUT and the Wikipedia projection; ``measured``: (bytes, rows) of
    artifacts as each run wrote them, by "artifact (which run)" (an OUT's own copy of such an artifact, which a
    later run may have replaced, is left out); ``windows``: (bytes, rows) of the mentions had they stored their
    context windows (as before)."""
    print("storage (zstd Parquet): bytes per row; projection for English Wikipedia")
    for output in outputs:
        for name, (size, rows) in artifact_sizes(output).items():
            if not any(label.startswith(f"{name} (") for label in measured):
                print(storage_line(name, size, rows))
    for label, (size, rows) in measured.items():
        print(storage_line(label, size, rows))
    if windows:
        print(storage_line("mentions (with windows)", *windows) + "   (as stored before windows were cut at embed "
                                                                   "time)")


def report_mentions(args, model_path: str, sample: str, work: str,
                    mean_mentions: float) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """Print the mentions' lines; returns (each length's embed-entities OUT, each length's entity_embeddings
    (bytes, rows) as its run wrote them: with --mentions 0 every length writes the sample's own OUT)."""
    from artifacts import tables
    from encoders.models import ModelSpec, usable_positions

    rows = tables.read_table(sample, "mentions").to_pylist()
    rows = mention_windows(sample, rows[:args.path_mentions])
    outputs, stored = [], {}
    lengths = [length for length in args.lengths if length <= usable_positions(ModelSpec(model_path))]
    for length in lengths:
        top = ceiling(model_path, args.device, args.dtype, length, args.batch_tokens, args.ceiling_seconds)
        inputs, path, ops = mask_paths(args, model_path, rows, length)
        stage, busy, target = embed_stage(args, model_path, sample, work, length)
        outputs.append(target)
        stored[f"entity_embeddings ({length} tokens)"] = artifact_sizes(target)["entity_embeddings"]
        print(f"mentions at {length} tokens: ceiling {top.per_second:,.1f} seq/s | [MASK] inputs built "
              f"{inputs.per_second:,.1f}/s (one process) | [MASK] forward path {path.per_second:,.1f}/s "
              f"({len(rows):,}) | embed-entities stage {stage.per_second:,.1f}/s "
              f"({stage.items:,} mentions, {stage.seconds:.1f} s, model load included)")
        print(f"  ratios: path/ceiling {path.per_second / top.per_second:.0%}, stage/ceiling "
              f"{stage.per_second / top.per_second:.0%}, stage/encoder {stage.per_second / path.per_second:.2f}; "
              f"GPU busy during the stage: {busy}")
        print_busiest(ops)
        print(f"  projection at the stage rate: {ENTITIES / 1e6:.0f}M entities x {mean_mentions:.2f} mentions "
              f"(sample mean) = {ENTITIES * mean_mentions / stage.per_second / 3600:,.1f} h; x {MENTION_CAP} (cap) = "
              f"{ENTITIES * MENTION_CAP / stage.per_second / 3600:,.1f} h")
    return outputs, stored


def report_passages(args, model_path: str, work: str) -> tuple[str, DenseRun]:
    """Print the dense passage lines; returns (the index stage's OUT, what the KPR lines reuse)."""
    import math

    passages = real_passages()
    timed_passages = [passages[index % len(passages)] for index in range(args.passages)]
    inputs, path, mean_length, ops = passage_paths(passage_options(args, model_path), timed_passages)
    top = ceiling(model_path, args.device, args.dtype, math.ceil(mean_length), args.batch_tokens,
                  args.ceiling_seconds)
    corpus, target = Path(work) / "corpus.tsv", str(Path(work) / "index-out")
    write_corpus(corpus, args.passages)
    stage, busy = index_stage(args, model_path, corpus, args.passages, target, "--encoder-type", "dpr")
    print(f"passages at {mean_length:.0f} tokens (mean): ceiling {top.per_second:,.1f} seq/s | inputs built "
          f"{inputs.per_second:,.1f}/s (one process) | forward path {path.per_second:,.1f}/s ({path.items:,}) | "
          f"index stage {stage.per_second:,.1f}/s "
          f"({stage.items:,} passages, Flat, {stage.seconds:.1f} s, model load included)")
    print(f"  ratios: path/ceiling {path.per_second / top.per_second:.0%}, stage/ceiling "
          f"{stage.per_second / top.per_second:.0%}, stage/encoder {stage.per_second / path.per_second:.2f}; "
          f"GPU busy during the stage: {busy}")
    print_busiest(ops)
    print(f"  projection at the stage rate: {DPR_PASSAGES / 1e6:.0f}M passages = "
          f"{DPR_PASSAGES / stage.per_second / 3600:,.2f} h")
    return target, DenseRun(timed_passages, corpus, mean_length, top)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: float32 on cpu, "
                                                      "bfloat16 on cuda)")
    parser.add_argument("--model", default=None, help=f"'minilm', '{RANDOM_BERT_BASE}' or a path (default: minilm "
                                                      f"on cpu, {RANDOM_BERT_BASE} on cuda)")
    parser.add_argument("--mentions", type=int, default=None, help="mentions (0: all of the sample's; default: "
                                                                   "256 on cpu, all on cuda)")
    parser.add_argument("--passages", type=int, default=None, help="passages (default: 512 on cpu, 100000 on cuda)")
    parser.add_argument("--batch-tokens", type=int, default=None, help="padded tokens per forward pass (default: "
                                                                       "16384 on cpu, 65536 on cuda)")
    parser.add_argument("--ceiling-seconds", type=float, default=None, help="time per ceiling (default 3 cpu, 10 gpu)")
    parser.add_argument("--work", help="where the sample OUT is built (kept and resumed; default: a temp dir)")
    parser.add_argument("--mentions-out", help="the mentions of this OUT (e.g. bench.scale's, of a synthetic dump) "
                        "instead of the bundled sample's")
    parser.add_argument("--path-mentions", type=int, default=20_000, help="mentions of the [MASK] paths' lines")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 128], help="the mentions' token lengths")
    parser.add_argument("--paths", nargs="+", choices=("mentions", "passages"), default=["mentions", "passages"],
                        help="what to measure: the [MASK] mentions; the DPR and KPR passages")
    parser.add_argument("--beam", action="append", default=[], help="an extra Beam option for the stages, e.g. "
                        "--beam=--direct_running_mode=multi_processing --beam=--direct_num_workers=4")
    args = parser.parse_args()
    if min(args.lengths) < 1 or (args.batch_tokens is not None and args.batch_tokens < 1):
        parser.error("--lengths and --batch-tokens take numbers of tokens of 1 or more")
    gpu = args.device.startswith("cuda")
    defaults = {"dtype": "bfloat16" if gpu else "float32", "model": RANDOM_BERT_BASE if gpu else "minilm",
                "mentions": 0 if gpu else 256, "passages": 100_000 if gpu else 512,
                "batch_tokens": 65536 if gpu else 16384, "ceiling_seconds": 10.0 if gpu else 3.0}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main() -> None:
    import os

    from pipelines.launcher.cli import configure_logging

    args = parse_args()
    configure_logging(False, [])  # as each stage run here does; first, so no weight-loading progress bars either
    import torch
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    print(f"torch {torch.__version__}, {gpu}, {args.device} {args.dtype}, --batch-tokens {args.batch_tokens}, "
          f"{os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f}), passages from {PASSAGES}")
    with tempfile.TemporaryDirectory() as directory:
        sample = args.mentions_out or args.work or str(Path(directory) / "sample")
        seconds = 0.0 if args.mentions_out else build_sample(sample, 512)
        mean = mean_mentions_per_entity(sample)
        model_path = chosen_model(args.model, directory)
        print(f"sample OUT (parse, dictionary, mentions) in {seconds:.1f} s: {row_count(sample, 'mentions'):,} "
              f"mentions, {mean:.2f} per entity; model {args.model}")
        embedded, stored, listed = [], {}, [sample]
        if "mentions" in args.paths:
            embedded, stored = report_mentions(args, model_path, sample, directory, mean)
        if "passages" in args.paths:
            target, dense = report_passages(args, model_path, directory)
            if embedded:  # the KPR lines take the first embed-entities OUT's linker and entity embeddings
                report_kpr(args, passage_options(args, model_path), model_path, embedded[0], dense)
            listed.append(target)
        windows = None if args.mentions_out else stored_windows_size(sample, directory)
        print_storage(listed, stored, windows)


if __name__ == "__main__":
    main()
