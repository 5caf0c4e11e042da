"""Benchmark the [MASK] entity encoder and the embed-entities stage.

Builds real mentions from the bundled sample dump (parse, dictionary --include-red-links, mentions, run through
`pipelines.launcher.cli.main` into a temporary or --work directory), or reads an existing OUT (--output). Then prints:

- the encoder itself, on --limit mentions at each --max-seq-length: the inputs built (``mask_inputs``, what every
  core runs), then ``MaskEncoder.encode_packed`` on files' worth of ready inputs (token-budget batches inside,
  exactly the model's part of the stage): mentions/s, real (non-pad) tokens/s, padded tokens/s, padding efficiency,
  achieved model TFLOP/s and, on a GPU (or with --peak-tflops), model FLOP utilization, counted on real and on
  padded tokens: 2 x non-embedding parameters x tokens + attention 4 x layers x seq^2 x hidden per sequence;
- the projected hours for 7M entities x the sample's mean sampled mentions per entity, the full 128 cap, and
  an upper bound from ~150M links in English Wikipedia (every link sampled at most once);
- the whole embed-entities stage end to end (process-local DirectRunner, model load included) on
  --stage-limit mentions of the sample: wall time and mentions/s.

`--model random-bert-base` builds a BERT-base-sized model with random weights (BertConfig() sizes, the packaged
MiniLM's uncased vocabulary, so [MASK] exists) in a temporary directory: same compute as bert-base-uncased.
No timing assertions; the machine may be shared, so figures are noisy.

    python -m bench.embed_entities                                   # CPU, the packaged MiniLM
    python -m bench.embed_entities --model random-bert-base --device cuda --dtype bfloat16 --batch-tokens 65536
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    RANDOM_BERT_BASE,
    build_sample,
    chosen_model,
    mean_mentions_per_entity,
    mention_windows,
    non_embedding_parameters,
    row_count,
    run_cli,
    sequence_flops,
    subset_output,
    synchronize,
)

ENTITIES = 7_000_000  # English Wikipedia entities (DESIGN.md)
LINKS = 150_000_000  # English Wikipedia links: no entity can be sampled more mentions than links point to it
MENTION_CAP = 128
H100_BF16_DENSE_TFLOPS = 989.0
REFERENCE_CPU_RATE = 4.0  # mentions/s of the paper's reference scripts with the MiniLM at 512 tokens, this machine


@dataclass(frozen=True)
class Timing:
    """One timed pass of the encoder over a set of mentions."""

    mentions: int
    seconds: float
    real_tokens: int
    padded_tokens: int
    real_flops: float
    padded_flops: float


def mention_pool(output: str, limit: int) -> list[dict[str, Any]]:
    """``limit`` mention rows spread evenly over (up to 20 x limit) rows of OUT/mentions, in key order."""
    from artifacts import tables

    rows: list[dict[str, Any]] = []
    for batch in tables.iter_batches(output, "mentions"):
        rows.extend(batch.to_pylist())
        if len(rows) >= 20 * limit:
            break
    rows.sort(key=lambda row: (row["entity_id"], row["page_id"], row["start"]))
    step = max(len(rows) // max(limit, 1), 1)
    return mention_windows(output, rows[::step][:limit])


def time_encoder(encoder, inputs: Sequence, device: str) -> Timing:
    """``encoder.encode_packed`` over parts of up to ``INPUT_FILE_ROWS`` inputs, as the model's part of the stage
    encodes each file of ready inputs."""
    from encoders.batching import HostBuffers, token_budget_batches
    from encoders.mask_inputs import PackedMaskInputs
    from transforms.embed_entities.inputs import INPUT_FILE_ROWS

    parts = [inputs[begin:begin + INPUT_FILE_ROWS] for begin in range(0, len(inputs), INPUT_FILE_ROWS)]
    config = encoder.model.config
    parameters = non_embedding_parameters(encoder.model)
    real_tokens = padded_tokens = 0
    real_flops = padded_flops = 0.0
    for part in parts:
        lengths = [len(item.input_ids) for item in part]
        real_tokens += sum(lengths)
        real_flops += sum(sequence_flops(n, parameters, config.num_hidden_layers, config.hidden_size)
                          for n in lengths)
        for batch in token_budget_batches(lengths, encoder.max_tokens):  # the batches encode_packed runs
            longest = max(lengths[index] for index in batch)
            padded_tokens += len(batch) * longest
            padded_flops += len(batch) * sequence_flops(longest, parameters, config.num_hidden_layers,
                                                        config.hidden_size)
    packed = [PackedMaskInputs.of(part) for part in parts]
    buffers = HostBuffers()  # the arrays the stage's steps come back into
    synchronize(device)
    started = time.perf_counter()
    for part in packed:
        encoder.encode_packed(part, buffers.take(len(part), config.hidden_size))
    synchronize(device)
    return Timing(len(inputs), time.perf_counter() - started, real_tokens, padded_tokens, real_flops, padded_flops)


def report(label: str, timing: Timing, peak_tflops: float | None) -> None:
    seconds = timing.seconds
    print(f"  {label}: {timing.mentions / seconds:8.1f} mentions/s  {timing.real_tokens / seconds:9.0f} real tokens/s  "
          f"{timing.padded_tokens / seconds:9.0f} padded tokens/s  padding efficiency "
          f"{timing.real_tokens / timing.padded_tokens:.1%}  ({timing.mentions} mentions, "
          f"{timing.real_tokens / timing.mentions:.0f} tokens/mention, {seconds:.1f} s)")
    real, padded = timing.real_flops / seconds / 1e12, timing.padded_flops / seconds / 1e12
    line = f"    model TFLOP/s: {real:.2f} on real tokens, {padded:.2f} on padded tokens"
    if peak_tflops:
        line += (f"; model FLOP utilization of {peak_tflops:g} TFLOP/s: {real / peak_tflops:.1%} (real), "
                 f"{padded / peak_tflops:.1%} (padded)")
    print(line)


def project(rate: float, mean_mentions: float) -> None:
    print(f"    projection at {rate:.1f} mentions/s on one device: "
          f"{ENTITIES / 1e6:.0f}M entities x {mean_mentions:.2f} (the sample's mean) = "
          f"{ENTITIES * mean_mentions / rate / 3600:,.1f} h; "
          f"x {MENTION_CAP} (the cap) = {ENTITIES * MENTION_CAP / rate / 3600:,.0f} h; "
          f"at most {LINKS / 1e6:.0f}M mentions (every link once) = {LINKS / rate / 3600:,.0f} h")


def bench_encoder(args, model_path: str, output: str, peak_tflops: float | None, mean_mentions: float) -> None:
    from encoders.mask_encoder import MaskEncoder, check_mask_model
    from encoders.mask_inputs import mask_inputs
    from encoders.models import ModelSpec, load_tokenizer
    from transforms.embed_entities.inputs import mention_problem

    spec = ModelSpec(model_path, args.device, args.dtype)
    check_mask_model(spec, args.layer, max(args.max_seq_length))
    tokenizer = load_tokenizer(model_path)
    started = time.perf_counter()
    encoder = MaskEncoder(spec, args.layer, args.batch_tokens)
    print(f"model {args.model} loaded in {time.perf_counter() - started:.1f} s: "
          f"{non_embedding_parameters(encoder.model) / 1e6:.1f}M non-embedding parameters, "
          f"{encoder.model.config.num_hidden_layers} layers, hidden {encoder.model.config.hidden_size}; "
          f"{args.device} {args.dtype}, --batch-tokens {args.batch_tokens}")
    rows = [row for row in mention_pool(output, args.limit) if mention_problem(row) is None]  # as the stage does
    warmup = args.warmup if args.warmup is not None else (
        args.batch_tokens // max(args.max_seq_length) if args.device.startswith("cuda") else 8)
    for max_seq_length in args.max_seq_length:
        started = time.perf_counter()
        inputs = mask_inputs(rows, tokenizer, max_seq_length)
        tokenize = time.perf_counter() - started
        print(f"--max-seq-length {max_seq_length}: inputs built {len(rows) / tokenize:,.0f} mentions/s "
              "(mask_inputs, one process)")
        encoder.encode(inputs[:warmup])  # first-call costs (allocations, kernels) untimed
        timing = time_encoder(encoder, inputs, args.device)
        report("encoder (MaskEncoder.encode_packed on ready inputs)", timing, peak_tflops)
        project(timing.mentions / timing.seconds, mean_mentions)
        if args.device == "cpu" and max_seq_length == 512 and args.model == "minilm":
            print(f"    the paper's reference scripts: ~{REFERENCE_CPU_RATE:g} mentions/s here, this encoder "
                  f"{timing.mentions / timing.seconds / REFERENCE_CPU_RATE:.1f}x that")


def bench_stage(args, model_path: str, output: str) -> None:
    from artifacts.run import manifest

    with tempfile.TemporaryDirectory() as directory:
        target = str(Path(directory) / "out")
        mentions = subset_output(output, target, args.stage_limit)
        for max_seq_length in args.max_seq_length:
            seconds = run_cli("embed-entities", "--output", target, "--model", model_path, "--device", args.device,
                              "--dtype", args.dtype, "--max-seq-length", str(max_seq_length), "--batch-tokens",
                              str(args.batch_tokens), "--force")
            entities = row_count(target, "entity_embeddings")
            stage_seconds = manifest.load(target)["embed_entities"].wall_time_s
            print(f"embed-entities stage, --max-seq-length {max_seq_length}, {mentions:,} mentions -> "
                  f"{entities:,} entities: {seconds:.1f} s ({mentions / seconds:.1f} mentions/s end to end; "
                  f"stage {stage_seconds:.1f} s incl. graph, model load and 1 DirectRunner worker)")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm",
                        help=f"'minilm' (the packaged all-MiniLM-L6-v2), '{RANDOM_BERT_BASE}', or a model path")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    parser.add_argument("--layer", type=int, default=-1)
    parser.add_argument("--max-seq-length", type=int, nargs="+", default=[512, 128])
    parser.add_argument("--batch-tokens", type=int, default=16384, help="padded tokens per forward pass")
    parser.add_argument("--limit", type=int, default=None,
                        help="mentions the encoder is timed on (default: 64 on cpu, 16384 on cuda)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="mentions run once, untimed, before timing (default: 8 on cpu, one full call on cuda)")
    parser.add_argument("--stage-limit", type=int, default=None,
                        help="mentions the embed-entities stage runs on (0: all; default: 64 on cpu, all on cuda)")
    parser.add_argument("--skip-stage", action="store_true", help="do not time the embed-entities stage")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help=f"peak dense TFLOP/s for FLOP utilization (default on cuda: {H100_BF16_DENSE_TFLOPS:g},"
                             " H100 SXM bf16)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--output", help="an existing local OUT with mentions (nothing is rerun or written there)")
    source.add_argument("--work", help="where to build the sample's OUT (kept and resumed; default: a temp dir)")
    args = parser.parse_args()
    gpu_run = args.device.startswith("cuda")
    args.limit = args.limit if args.limit is not None else (16384 if gpu_run else 64)
    args.stage_limit = args.stage_limit if args.stage_limit is not None else (0 if gpu_run else 64)
    return args


def main() -> None:
    args = parse_args()
    gpu_run = args.device.startswith("cuda")
    import torch
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()  # long contexts are tokenized whole, then cut: no length warnings
    peak = args.peak_tflops or (H100_BF16_DENSE_TFLOPS if gpu_run else None)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    print(f"torch {torch.__version__}, {gpu}, {torch.get_num_threads()} CPU threads of {os.cpu_count()} CPUs "
          f"(shared machine: figures are noisy; load average {os.getloadavg()[0]:.1f})")
    with tempfile.TemporaryDirectory() as directory:
        output = args.output or args.work or str(Path(directory) / "sample")
        if not args.output:
            seconds = build_sample(output, max(args.max_seq_length))
            print(f"sample OUT built (parse, dictionary --include-red-links, mentions) in {seconds:.1f} s: {output}")
        mean_mentions = mean_mentions_per_entity(output)
        print(f"{row_count(output, 'mentions'):,} mentions, {mean_mentions:.2f} per entity on average")
        model = chosen_model(args.model, directory)
        bench_encoder(args, model, output, peak, mean_mentions)
        if not args.skip_stage:
            bench_stage(args, model, output)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
