"""Benchmark passage encoding and the FAISS index.

Prints: encoder throughput (passages/s, tokens/s) on the 751 real DPR passages with the packaged MiniLM and a
BERT-base-sized model (random weights: same compute as DPR's encoder; bf16 on a GPU), the index stage's wall time
on those passages, FAISS train/add/search times, memory (estimated and measured) and recall@k of approximate
indexes against exact search on clustered 768-dim vectors, and on a GPU the projection for DPR's 21M x 768.
The machine may be shared: figures are noisy.

    python -m bench.index [--vectors 100000] [--bert-passages 128]
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

import numpy as np

from bench.common import random_bert_base as bert_base
from bench.common import real_passages, run_cli
from bench.paths import PASSAGES, minilm_path

DPR_PASSAGES = 21_015_324


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def encode_rate(options, passages, repeats: int = 1) -> tuple[float, float]:
    """(passages/s, tokens/s) of encode_passages after one warm-up batch."""
    import torch

    from encoders.loading import load_retriever

    encoder = load_retriever(options)
    encoder.encode_passages(passages[:16])
    tokens = encoder.token_count(passages) * repeats
    if options.device.startswith("cuda"):
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        encoder.encode_passages(passages)
    if options.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return len(passages) * repeats / seconds, tokens / seconds


def bench_encoders(args, gpu: bool) -> float | None:
    from encoders.retrievers import EncoderOptions

    passages = real_passages()
    print(f"encoding the {len(passages)} real DPR passages (title + text, max 256 tokens)")
    rate, tokens = encode_rate(EncoderOptions("mean", minilm_path()), passages)
    print(f"  MiniLM-L6 (384d) cpu float32: {rate:8.1f} passages/s {tokens:10.0f} tokens/s")
    gpu_rate = None
    with tempfile.TemporaryDirectory() as directory:
        base = bert_base(directory)
        few = passages[:args.bert_passages]
        rate, tokens = encode_rate(EncoderOptions("dpr", base, batch_tokens=8192), few)
        print(f"  BERT-base (768d) cpu float32: {rate:8.1f} passages/s {tokens:10.0f} tokens/s "
              f"({len(few)} passages)")
        if gpu:
            for dtype in ("float32", "bfloat16"):
                options = EncoderOptions("dpr", base, device="cuda", dtype=dtype, batch_tokens=args.gpu_batch_tokens)
                rate, tokens = encode_rate(options, passages, repeats=args.gpu_repeats)
                print(f"  BERT-base (768d) cuda {dtype:8}: {rate:8.1f} passages/s {tokens:10.0f} tokens/s "
                      f"({len(passages) * args.gpu_repeats} passages)")
                gpu_rate = rate
    return gpu_rate


def bench_stage() -> None:
    with tempfile.TemporaryDirectory() as output:
        seconds = run_cli("index", "--output", output, "--encoder", minilm_path(), "--encoder-type", "mean",
                          "--corpus", str(PASSAGES), "--shards", "3")
        print(f"index stage, 751 passages, MiniLM, 3 shards: {seconds:6.1f} s "
              "(the command in this process: 2 Beam pipelines, 1 DirectRunner worker)")


def clustered(count: int, dim: int, clusters: int, seed: int, latent: int = 48) -> np.ndarray:
    """Unit vectors from a Gaussian mixture in a low-dimensional space mapped linearly to ``dim`` dims, plus a
    little isotropic noise: like sentence embeddings, neighbours are meaningfully closer than the rest (pure
    high-dimensional noise would make every in-cluster neighbour equally near and recall meaningless)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, latent))
    points = centres[rng.integers(0, clusters, count)] + 0.5 * rng.normal(size=(count, latent))
    mapping = np.random.default_rng(12345).normal(size=(latent, dim)) / np.sqrt(latent)
    vectors = (points @ mapping + 0.05 * rng.normal(size=(count, dim))).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found, exact, strict=True)]))


def probe_recall(index, factory: str, nprobe: int | None, queries: np.ndarray, exact: np.ndarray, k: int) -> str:
    """Recall@k against exact search and ms per query at one probe setting."""
    from artifacts.faiss import search

    search.set_search_parameters(index, nprobe, 128 if "HNSW" in factory else None)
    started = time.perf_counter()
    found = index.search(queries, k)[1]
    seconds = time.perf_counter() - started
    label = f"nprobe {nprobe}" if nprobe else "efSearch 128" if "HNSW" in factory else "exact"
    return f"{label}: recall {recall(found, exact):.3f} ({seconds * 1000 / len(queries):.2f} ms/q)"


def bench_faiss(args, gpu: bool) -> dict[str, float]:
    import faiss

    from artifacts.faiss import build, choice

    dim, count, k = 768, args.vectors, 10
    vectors = clustered(count, dim, clusters=max(count // 200, 50), seed=0)
    queries = clustered(200, dim, clusters=max(count // 200, 50), seed=1)
    ids = np.arange(count, dtype=np.int64)
    flat = faiss.IndexFlatIP(dim)
    flat.add(vectors)
    started = time.perf_counter()
    exact = flat.search(queries, k)[1]
    exact_seconds = time.perf_counter() - started
    nlist = choice._power_of_two(4 * np.sqrt(count))
    print(f"FAISS on {count:,} clustered unit vectors x {dim} (200 queries; exact search {exact_seconds * 1000:.0f} "
          f"ms), recall@{k} against exact search; faiss GPUs: {build.gpu_count()}")
    rates = {}
    for factory, probes in (("Flat", [None]), (f"IVF{nlist},Flat", [1, 8, 32]),
                            (f"IVF{nlist},PQ96", [8, 32]), (f"IVF{nlist},SQ8", [8, 32]), ("HNSW32,Flat", [None])):
        sample = vectors[:choice.training_sample_size(factory, count, dim)]
        started = time.perf_counter()
        index = build.train_index(factory, dim, sample, use_gpu=gpu)
        train = time.perf_counter() - started
        started = time.perf_counter()
        index, _ = build.add_batches(index, ((ids[i:i + 65536], vectors[i:i + 65536])
                                              for i in range(0, count, 65536)), use_gpu=gpu)
        add = time.perf_counter() - started
        rates[factory.split(",")[-1]] = count / add
        measured = faiss.serialize_index(index).nbytes
        estimate = choice.memory_estimate(factory, count, dim).index_bytes
        line = (f"  {factory:<18} train {train:6.2f} s ({len(sample):,} vectors)  add {add:6.2f} s "
                f"({count / add:9.0f}/s)  size {measured / 2**20:7.1f} MiB (estimated {estimate / 2**20:7.1f})")
        results = [probe_recall(index, factory, nprobe, queries, exact, k) for nprobe in probes]
        print(line + "  " + "; ".join(results))
    print(f"  peak resident memory of this process: {rss_mb():.0f} MiB")
    return rates


def project(gpu_rate: float | None, add_rates: dict[str, float]) -> None:
    from artifacts.faiss import choice

    factory = choice.default_factory(DPR_PASSAGES, 768)
    estimate = choice.memory_estimate(factory, DPR_PASSAGES, 768)
    print(f"projection for DPR's {DPR_PASSAGES:,} passages x 768: default factory {factory}, "
          f"{estimate.describe(16)}")
    if gpu_rate:
        print(f"  encoding at the measured {gpu_rate:,.0f} passages/s on one GPU: "
              f"{DPR_PASSAGES / gpu_rate / 60:.0f} minutes (target: >= 10,000 passages/s, ~35 minutes)")
    add_rate = add_rates.get(factory.split(",")[-1])
    if add_rate:
        print(f"  adding at the measured {add_rate:,.0f} vectors/s: {DPR_PASSAGES / add_rate / 60:.1f} minutes "
              "in one process (divided by the number of shards built in parallel)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vectors", type=int, default=100_000, help="clustered vectors for the FAISS part")
    parser.add_argument("--bert-passages", type=int, default=128, help="passages for BERT-base on the CPU")
    parser.add_argument("--gpu-repeats", type=int, default=20, help="passes over the 751 passages on a GPU")
    parser.add_argument("--gpu-batch-tokens", type=int, default=131072, help="padded tokens per GPU batch")
    parser.add_argument("--skip-stage", action="store_true", help="do not time the index stage")
    parser.add_argument("--faiss-only", action="store_true", help="only the FAISS part")
    args = parser.parse_args()
    import torch

    gpu = torch.cuda.is_available()
    print(f"torch {torch.__version__}, {'GPU: ' + torch.cuda.get_device_name(0) if gpu else 'no GPU'}, "
          f"{os.cpu_count()} CPUs (shared: figures are noisy)")
    gpu_rate = None if args.faiss_only else bench_encoders(args, gpu)
    if not (args.skip_stage or args.faiss_only):
        bench_stage()
    rates = bench_faiss(args, gpu)
    if gpu:
        project(gpu_rate, rates)
    else:
        project(None, {})


if __name__ == "__main__":
    main()
