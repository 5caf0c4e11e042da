"""Benchmark the whole parse stage: uncompressed-XML MB/s and pages/s per worker.

Runs the parse stage (in this process) on the gensim enwiki sample, then on a larger synthetic multistream dump made by
repeating its pages with new ids and titles (a steady-state figure), with 1 and 2 worker processes.

    python -m bench.parse [--repeat 8] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import bz2
import re
import tempfile
from pathlib import Path

from bench.common import run_cli
from bench.paths import GENSIM

PAGES_PER_STREAM = 100
_PAGE = re.compile(rb"  <page>.*?</page>\n", re.S)


def split_dump(xml: bytes) -> tuple[bytes, list[bytes], bytes]:
    """(header up to the first page, pages, footer)."""
    pages = _PAGE.findall(xml)
    first = xml.index(pages[0])
    last = xml.rindex(pages[-1]) + len(pages[-1])
    return xml[:first], pages, xml[last:]


def renumbered(page: bytes, copy: int) -> bytes:
    """A copy of a page with a new page id and a distinct title (links inside stay as they were)."""
    if copy == 0:
        return page
    page = re.sub(rb"<id>(\d+)</id>", lambda m: b"<id>%d</id>" % (int(m.group(1)) + copy * 10_000_000), page,
                  count=1)
    return re.sub(rb"<title>(.*?)</title>", lambda m: b"<title>%s (copy %d)</title>" % (m.group(1), copy), page,
                  count=1)


def write_multistream(header: bytes, pages: list[bytes], footer: bytes, directory: Path) -> tuple[Path, Path, int]:
    """A multistream .xml.bz2 + index of ``pages``; returns the paths and the uncompressed size."""
    dump, index = directory / "synthetic-multistream.xml.bz2", directory / "synthetic-multistream-index.txt.bz2"
    offset, lines, size = 0, [], 0
    with dump.open("wb") as out:
        for chunk in [header, *[b"".join(pages[i:i + PAGES_PER_STREAM])
                                for i in range(0, len(pages), PAGES_PER_STREAM)], footer]:
            if chunk.lstrip().startswith(b"<page>"):
                for page in _PAGE.findall(chunk):
                    page_id = re.search(rb"<id>(\d+)</id>", page).group(1).decode()
                    title = re.search(rb"<title>(.*?)</title>", page).group(1).decode()
                    lines.append(f"{offset}:{page_id}:{title}")
            compressed = bz2.compress(chunk)
            out.write(compressed)
            offset += len(compressed)
            size += len(chunk)
    index.write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))
    return dump, index, size


def run_parse(dump: Path, output: Path, workers: int) -> float:
    beam = ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"] if workers > 1 else []
    return run_cli("parse", "--dump", str(dump), "--output", str(output), "--force", *beam)


def report(label: str, size: int, pages: int, seconds: float, workers: int) -> None:
    mb = size / 1e6
    print(f"{label:<44} workers={workers}  {seconds:7.1f} s  {mb / seconds:6.2f} MB/s "
          f"({mb / seconds / workers:5.2f} MB/s per worker)  {pages / seconds:7.1f} pages/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=8, help="copies of the sample in the synthetic dump")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    xml = bz2.decompress(GENSIM.read_bytes())
    header, pages, footer = split_dump(xml)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for workers in args.workers:
            seconds = run_parse(GENSIM, directory / f"sample-{workers}", workers)
            report("gensim sample (single bz2 stream, 6.1 MB)", len(xml), len(pages), seconds, workers)
        copies = [renumbered(page, copy) for copy in range(args.repeat) for page in pages]
        dump, _index, size = write_multistream(header, copies, footer, directory)
        for workers in args.workers:
            seconds = run_parse(dump, directory / f"synthetic-{workers}", workers)
            report(f"synthetic multistream x{args.repeat} ({size / 1e6:.0f} MB)", size, len(copies), seconds, workers)


if __name__ == "__main__":
    main()
