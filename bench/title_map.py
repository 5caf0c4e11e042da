"""Memory of parse's title map build (the one worker step that holds every title), with and without the SQL tables.

Each run builds the title map alone (``transforms.parse.redirects.build_title_map``) in a child process from
synthetic title records: ARTICLES articles, 1.5 redirect pages an article, PAGES page records (the dump's
article-namespace pages and the rows of ``--page-sql``, which name the sources of SQL redirects) of which a share
is the source of an SQL redirect row (a new title each: more than English Wikipedia's, whose SQL redirects mostly
repeat the dump's redirect pages), and QIDS ``wikibase_item`` rows (one a page id, the first ARTICLES those of the
articles). It prints the peak RSS the records take and the peak the build adds over them (Linux: VmHWM, reset
before the build), and the CPU seconds of the build.

    python -m bench.title_map --articles 400000 --pages 0 2000000 6000000 --qids 0 6000000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

REDIRECTS_PER_ARTICLE = 1.5


def status_mb(field: str) -> float:
    """A field of /proc/self/status (VmRSS, VmHWM) in MB."""
    return int(Path("/proc/self/status").read_text().split(f"{field}:")[1].split()[0]) / 1024


def numbered(prefix: str, count: int, start: int = 0) -> pa.Array:
    """``prefix`` + 0, 1, ... as an Arrow string array, built in Arrow (a Python list of millions of strings would
    leave freed memory that the build then reuses unseen)."""
    return pc.binary_join_element_wise(prefix, pc.cast(pa.array(np.arange(start, start + count)), pa.string()), "")


def title_records(articles: int, pages: int, sql_share: float, qids: int):
    """Synthetic title records (``TitleRecords``)."""
    from transforms.parse.redirects import TitleRecords

    random = np.random.default_rng(0)
    titles = numbered("Article title ", articles)
    redirects = int(articles * REDIRECTS_PER_ARTICLE)
    page_ids = np.arange(pages, dtype=np.int64) + 10**9
    sources = page_ids[:int(pages * sql_share)]
    return TitleRecords(
        articles=pa.table({"title": titles, "page_id": np.arange(articles, dtype=np.int64)}),
        positions_of=lambda indices: pa.array([""] * len(indices), pa.string()),
        redirects=pa.table({"title": numbered("Redirect title ", redirects),
                            "target": titles.take(pa.array(random.integers(0, articles, redirects)))}),
        pages=pa.table({"page_id": page_ids, "title": numbered("Page title ", pages)}),
        sql_redirects=pa.table({"page_id": sources,
                                "target": titles.take(pa.array(random.integers(0, articles, len(sources))))}),
        qids=pa.table({"page_id": np.arange(qids, dtype=np.int64), "qid": numbered("Q", qids, 1)}))


def measure(articles: int, pages: int, sql_share: float, qids: int) -> dict[str, float]:
    """In this process: the records' RSS, the build's peak growth over it, its CPU seconds."""
    import gc

    from transforms.parse.redirects import build_title_map

    start = status_mb("VmRSS")
    records = title_records(articles, pages, sql_share, qids)
    gc.collect()
    held = status_mb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM starts again from the RSS now
    cpu = time.process_time()
    build_title_map(records)
    return {"records_mb": held - start, "build_adds_mb": status_mb("VmHWM") - held,
            "build_cpu_s": time.process_time() - cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--articles", type=int, default=400_000)
    parser.add_argument("--pages", type=int, nargs="+", default=[0, 2_000_000, 6_000_000])
    parser.add_argument("--sql-share", type=float, default=0.0, help="page records that are an SQL redirect's source")
    parser.add_argument("--qids", type=int, nargs="+", default=[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.articles, args.pages[0], args.sql_share, args.qids[0])))
        return
    print(f"{'articles':>9} {'pages':>10} {'sql redirects':>13} {'qids':>10} {'records MB':>10} "
          f"{'build adds MB':>13} {'CPU s':>6}")
    for pages in args.pages:
        for qids in args.qids:
            command = [sys.executable, "-m", "bench.title_map", "--child", "--articles", str(args.articles),
                       "--pages", str(pages), "--sql-share", str(args.sql_share), "--qids", str(qids)]
            result = json.loads(subprocess.run(command, capture_output=True, text=True, check=True,
                                               cwd=Path(__file__).resolve().parents[1]).stdout)
            print(f"{args.articles:>9,} {pages:>10,} {int(pages * args.sql_share):>13,} {qids:>10,} "
                  f"{result['records_mb']:>10.0f} {result['build_adds_mb']:>13.0f} {result['build_cpu_s']:>6.1f}")


if __name__ == "__main__":
    main()
