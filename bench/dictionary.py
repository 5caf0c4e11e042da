"""Benchmark the dictionary stage and the entity linker.

Prints: the stage's build time on the gensim sample (parse done first, not timed), linker load time, resident
memory, linker throughput on the 751 real DPR passages (first pass, with spaCy's vocabulary cold, and warm),
and the sizes (names, pairs, entities, trie and array bytes) to project full Wikipedia.

    python -m bench.dictionary
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import statistics
import tempfile
import time

from artifacts.names import spacy_without_torch
from bench.common import run_cli
from bench.paths import GENSIM, PASSAGES, shared_file


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warm-passes", type=int, default=5,
                        help="warm passes over the passages (the machine may be shared: median and best shown)")
    args = parser.parse_args()
    from artifacts import tables
    from artifacts.linker import EntityLinker

    with tempfile.TemporaryDirectory() as output:
        run_cli("parse", "--dump", str(shared_file(GENSIM)), "--output", output)
        for extra in ([], ["--include-red-links"]):
            seconds = run_cli("dictionary", "--output", output, "--force", *extra)
            print(f"dictionary stage on the gensim sample {' '.join(extra) or '(articles only)':<22} {seconds:6.1f} s "
                  "(the command in this process: graph, 1 DirectRunner worker)")
        linker_dir = os.path.join(output, "dictionary", "linker")
        names = tables.read_table(output, "dictionary/names", ["name"]).column("name").to_pylist()
        entities = tables.read_table(output, "entities", ["entity_id"]).num_rows
        sizes = {name: os.path.getsize(os.path.join(linker_dir, name)) for name in sorted(os.listdir(linker_dir))}
        print(f"sizes: {len(set(names)):,} names, {len(names):,} (name, entity) pairs, {entities:,} entities; "
              + ", ".join(f"{name} {size / 1024:.0f} KiB" for name, size in sizes.items()))
        print(f"  per pair: {sum(sizes.values()) / max(len(names), 1):.0f} bytes of linker files "
              f"(name.trie {sizes['name.trie'] / max(len(set(names)), 1):.1f} B/name, "
              f"kb_id.trie {sizes['kb_id.trie'] / max(entities, 1):.1f} B/entity, data.npy 16 B/pair)")

        before = rss_mb()
        started = time.perf_counter()
        linker = EntityLinker.load(linker_dir)
        linker.detect("warm up the tokenizer")
        print(f"linker load: {time.perf_counter() - started:.3f} s (incl. spaCy tokenizer), "
              f"resident memory +{rss_mb() - before:.0f} MB")
        with shared_file(PASSAGES).open() as handle:
            texts = [row[1] for row in csv.reader(handle, delimiter="\t")][1:]
        rate, found = linker_rate(linker, texts)
        print(f"linker on {len(texts)} DPR passages, cold (new words enter spaCy's vocabulary): {rate:,.0f} "
              f"passages/s, {sum(map(len, found)) / len(texts):.1f} mentions/passage")
        passes = max(args.warm_passes, 1)
        rates = sorted(linker_rate(linker, texts)[0] for _ in range(passes))
        print(f"linker on {len(texts)} DPR passages, warm: median {statistics.median(rates):,.0f}, best "
              f"{rates[-1]:,.0f} passages/s over {len(rates)} passes")
        shipped = spacy_without_torch().blank("en").tokenizer
        for name, tokenizer in (("spaCy's blank English tokenizer as shipped", shipped),
                                ("the linker's own tokenizer alone", linker._token_spans._nlp.tokenizer)):
            tokenized = statistics.median(tokenizer_rate(tokenizer, texts) for _ in range(passes))
            print(f"{name}: median {tokenized:,.0f} passages/s; the linker at "
                  f"{statistics.median(rates) / tokenized:.0%} of it")


def tokenizer_rate(tokenizer, texts: list[str]) -> float:
    """Passages/s of one pass of a spaCy tokenizer over ``texts`` (after one pass to warm it)."""
    for text in texts:
        tokenizer(text)
    started = time.perf_counter()
    for text in texts:
        tokenizer(text)
    return len(texts) / (time.perf_counter() - started)


def linker_rate(linker, texts: list[str]) -> tuple[float, list]:
    """Passages/s of one pass of ``linker.detect_batch`` over ``texts``, and what it found."""
    started = time.perf_counter()
    found = linker.detect_batch(texts)
    return len(texts) / (time.perf_counter() - started), found


if __name__ == "__main__":
    main()
