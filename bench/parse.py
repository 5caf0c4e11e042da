"""Benchmark the whole parse stage: uncompressed-XML MB/s and pages/s per worker.

Runs the parse stage (in this process) on the gensim enwiki sample, then on a larger enwiki-shaped synthetic
multistream dump (``bench/synthetic.py``: a steady-state figure), with 1 and 2 worker processes.

    python -m bench.parse [--articles 10000] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import bz2
import tempfile
from pathlib import Path

from bench.common import run_cli
from bench.paths import GENSIM
from bench.synthetic import Shape, split_dump, synthetic_dump


def run_parse(dump: Path, output: Path, workers: int) -> float:
    beam = ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"] if workers > 1 else []
    return run_cli("parse", "--dump", str(dump), "--output", str(output), "--force", *beam)


def report(label: str, size: int, pages: int, seconds: float, workers: int) -> None:
    mb = size / 1e6
    print(f"{label:<44} workers={workers}  {seconds:7.1f} s  {mb / seconds:6.2f} MB/s "
          f"({mb / seconds / workers:5.2f} MB/s per worker)  {pages / seconds:7.1f} pages/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--articles", type=int, default=10_000, help="articles of the synthetic dump")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    xml = bz2.decompress(GENSIM.read_bytes())
    pages = split_dump(xml)[1]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for workers in args.workers:
            seconds = run_parse(GENSIM, directory / f"sample-{workers}", workers)
            report("gensim sample (single bz2 stream, 6.1 MB)", len(xml), len(pages), seconds, workers)
        dump = synthetic_dump(Shape(args.articles), directory / "dump")
        for workers in args.workers:
            seconds = run_parse(dump.dump, directory / f"synthetic-{workers}", workers)
            report(f"synthetic multistream, {args.articles:,} articles ({dump.xml_bytes / 1e6:.0f} MB)",
                   dump.xml_bytes, dump.counts.pages_read, seconds, workers)


if __name__ == "__main__":
    main()
