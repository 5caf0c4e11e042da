"""How fast parse reads the SQL tables (``--page-sql``, ``--redirects-sql``, ``--page-props-sql``): one worker reads
each file, so a table's rows a CPU second decide how long its worker runs (English Wikipedia's page table: ~60M rows).

Writes ROWS rows of each table as Wikimedia's mysqldump writes them (the mini set's headers; INSERT statements of
~1 MB; rows shaped as English Wikipedia's: all 13 columns of the page table, titles with quotes and backslashes
now and then, a ``wikibase_item`` and two other properties a page) to .sql.gz files in a temporary directory, then
reads each with ``transforms.parse.sql_dump.iter_sql_rows`` as parse does and prints the rows read a CPU second.

    python -m bench.sql_tables [--rows 1000000]
"""

from __future__ import annotations

import argparse
import gzip
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.paths import SHARED_DATA, shared_file
from transforms.parse.sql_dump import iter_sql_rows

TABLES = SHARED_DATA / "wikipedia" / "enwiki-20210701-mini" / "inputs" / "wikipedia-raw-20210701"
HEADERS = {"page": "pagetable/enwiki-20210701-page.sql.gz", "redirect": "redirecttable/enwiki-20210701-redirect.sql.gz",
           "page_props": "pagepropstable/enwiki-20210701-page_props.sql.gz"}
STATEMENT_BYTES = 1_000_000


def title(number: int) -> str:
    """A title as the tables store it (``_`` for spaces), with a quote or a backslash escaped now and then."""
    return f"Page_{number}" + ("_O\\'Brien" if number % 17 == 0 else "_back\\\\slash" if number % 101 == 0 else "")


def page_row(number: int) -> str:
    return (f"({number},{number % 4 * 2},'{title(number)}','',{int(number % 5 == 0)},0,0.{number * 7919 % 10**9},"
            f"'20210629135708','20210629135919',{1028931505 + number},{100 + number % 5000},'wikitext',NULL)")


def redirect_row(number: int) -> str:
    return f"({number},0,'{title(number * 3)}','','{'Section' if number % 7 == 0 else ''}')"


def page_props_row(number: int) -> str:
    page, kind = divmod(number, 3)
    value = [f"Q{page * 7 + 1}", f"Short description of page {page}", f"Image_{page}.jpg"][kind]
    name = ["wikibase_item", "wikibase-shortdesc", "page_image_free"][kind]
    return f"({page + 1},'{name}','{value}',NULL)"


ROWS: dict[str, Callable[[int], str]] = {"page": page_row, "redirect": redirect_row, "page_props": page_props_row}


def statements(table: str, rows: int) -> Iterator[str]:
    """The INSERT lines of ``rows`` rows of ``table``, ~1 MB each."""
    batch, size = [], 0
    for number in range(1, rows + 1):
        batch.append(ROWS[table](number))
        size += len(batch[-1])
        if size > STATEMENT_BYTES or number == rows:
            yield f"INSERT INTO `{table}` VALUES {','.join(batch)};\n"
            batch, size = [], 0


def write_table(table: str, rows: int, directory: Path) -> Path:
    """The mini set's dump of ``table`` with its rows replaced by ``rows`` synthetic ones."""
    text = gzip.decompress((TABLES / HEADERS[table]).read_bytes()).decode()
    start = text.index("INSERT INTO")
    path = directory / f"{table}.sql.gz"
    with gzip.open(path, "wt", compresslevel=1) as out:
        out.write(text[:start])
        out.writelines(statements(table, rows))
        out.write(text[text.index("/*!40000 ALTER TABLE", start):])
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of each table")
    args = parser.parse_args()
    for header in HEADERS.values():  # the mini set's tables: their headers are the files' own
        shared_file(TABLES / header)
    with tempfile.TemporaryDirectory() as work:
        for table in ROWS:
            path = write_table(table, args.rows, Path(work))
            started = time.process_time()
            read = sum(1 for _ in iter_sql_rows(str(path), table))
            seconds = time.process_time() - started
            print(f"{table:<11} {read:>11,} rows {path.stat().st_size / 1e6:7.1f} MB gzip  {seconds:6.1f} CPU s  "
                  f"{read / seconds:9,.0f} rows a CPU second", flush=True)


if __name__ == "__main__":
    main()
