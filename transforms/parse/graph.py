"""parse: dump pages (+ optional SQL tables) -> articles with resolved links, redirects and dead letters, in two
passes: ``ConvertPages`` converts each page in the worker that read it (staged article rows and title records),
then ``ResolveStagedArticles`` builds the title map once from the records and resolves every staged article's
links against it where the article lies. Article text never goes through a shuffle."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from artifacts import fs, schemas, tables
from artifacts.counters import declare, dropped, error, processed
from artifacts.title_map import write_title_map
from transforms.common.dead_letters import DEAD_LETTER_TAG, count, count_fields, count_some, dead_letter
from transforms.common.parquet_rows import ReadParquetRows
from transforms.parse import dump_io, link_resolution, redirects
from transforms.parse.dump_io import ReadDumpPages, ReadSqlRows
from transforms.parse.dump_reader import RawPage, SiteInfo
from transforms.parse.link_resolution import ResolveArticles
from transforms.parse.namespaces import ARTICLE
from transforms.parse.redirects import TitleRecords, build_title_map
from transforms.parse.sql_dump import SqlRow
from transforms.parse.titles import is_possible_title, normalize_title
from transforms.parse.wikitext import (
    WikitextError,
    WikitextOptions,
    redirect_article,
    redirect_target_from_text,
    wikitext_to_text,
)

RECORD_TAG = "record"
# Title record kinds (schemas.TITLE_RECORDS): what the title map is built from.
ARTICLE_RECORD, REDIRECT_RECORD, PAGE_RECORD = "article", "redirect", "page"
SQL_REDIRECT_RECORD, QID_RECORD = "sql_redirect", "qid"
_QID = re.compile(r"Q[1-9][0-9]*", re.ASCII)
_INTEGER = re.compile(r"[-+]?[0-9]+", re.ASCII)

_OWN_COUNTERS = declare(
    dropped("non_article_pages", "pages outside the article namespace"),
    processed("redirect_pages", "redirect pages"),
    error("bad_redirects", "redirect pages without a target"),
    dropped("non_article_redirects", "redirect pages to a page outside the article namespace or on another wiki "
            "(links to them are red links)", dead_lettered=True),
    error("parser_errors", "pages the wikitext parser could not convert"),
    processed("empty_articles", "articles with no text left after markup removal (kept: entities that links "
              "resolve to, with no passage or mention of their own)"),
    dropped("blank_links", "entity links that show no text (`[[Apple| ]]`, a label of templates only): no mention"),
    dropped("sql_redirects_skipped", "SQL redirect rows outside the article namespace or to other wikis"),
    error("invalid_qids", "page_props `wikibase_item` values that are not a Wikidata item id (Q and digits): the "
          "article keeps no QID"),
    error("bad_sql_rows", "SQL table rows whose page id, namespace or title is none (NULL, text that is no integer, "
          "a character no title holds, bytes that are not UTF-8)"),
)
# Every counter of the parse stage: its own and those of the readers and resolvers it composes.
COUNTERS = declare(*_OWN_COUNTERS.values(), *dump_io.COUNTERS.values(), *redirects.COUNTERS.values(),
                   *link_resolution.COUNTERS.values())


@dataclass(frozen=True)
class ParseConfig:
    """What the parse stage reads and how: the dump file(s), the multistream index of each (``dump_indexes``,
    in dump order; empty: found beside the dump), the optional SQL table dumps, and the wikitext options; the
    dictionary's ``--language`` where the same command runs it (``all``: then a dump of another language is noted
    only when the dictionary tokenizes English), else None."""

    dumps: tuple[str, ...]
    dump_indexes: tuple[str, ...] = ()
    redirects_sql: tuple[str, ...] = ()
    page_sql: tuple[str, ...] = ()
    page_props_sql: tuple[str, ...] = ()
    skip_bad_streams: bool = False
    wikitext: WikitextOptions = field(default_factory=WikitextOptions)
    dictionary_language: str | None = None

    def __post_init__(self) -> None:
        if not self.dumps:
            raise ValueError("parse needs at least one dump")
        if self.dump_indexes and len(self.dump_indexes) != len(self.dumps):
            raise ValueError(f"{len(self.dump_indexes)} multistream indexes for {len(self.dumps)} dumps")


def title_record(kind: str, title: str | None = None, page_id: int | None = None, target: str | None = None,
                 position: str | None = None) -> dict[str, Any]:
    """A row of schemas.TITLE_RECORDS."""
    return {"kind": kind, "position": position, "title": title, "page_id": page_id, "target": target}


def classify_page(page: RawPage, siteinfo: SiteInfo, options: WikitextOptions,
                  page_titles: bool = False) -> Iterator[Any]:
    """One dump page -> a staged article row (links not yet resolved) and its title record, a redirect's title
    record, a dead letter, or nothing counted. ``page_titles``: also a title record of every article-namespace
    page (SQL redirect rows name their source by page id; a Category: page named by one is no article redirect)."""
    title = siteinfo.namespaces.title(page.title)
    if page.namespace != ARTICLE:
        count("non_article_pages")
        return
    if page_titles:
        yield beam.pvalue.TaggedOutput(RECORD_TAG, title_record(PAGE_RECORD, title, page.page_id))
    # <redirect/> without a title (schema 0.3) or none at all: the target is read from the text
    raw_target = page.redirect or redirect_target_from_text(page.text)
    if raw_target is not None or page.redirect is not None:
        count("redirect_pages")
        named = (raw_target or "").split("#", 1)[0]
        target = redirect_article(named, siteinfo.namespaces)
        if not siteinfo.namespaces.title(named.lstrip(":")):
            yield dead_letter("bad_redirects", "redirect without a target", page_id=page.page_id, title=title)
        elif target is None:
            yield dead_letter("non_article_redirects", f"redirect to {named.strip()!r}, outside the article "
                              "namespace or on another wiki", page_id=page.page_id, title=title)
        else:
            yield beam.pvalue.TaggedOutput(RECORD_TAG, title_record(REDIRECT_RECORD, title, target=target))
        return
    try:
        parsed = wikitext_to_text(page.text, title, siteinfo.namespaces, options)
    except WikitextError as problem:
        yield dead_letter("parser_errors", str(problem), page_id=page.page_id, title=title, source=page.source)
        return
    if not parsed.text.strip():  # an infobox and a table, a page of templates: still an article, linked to
        count("empty_articles")
    count_some("blank_links", parsed.blank_links)
    yield beam.pvalue.TaggedOutput(RECORD_TAG, title_record(ARTICLE_RECORD, title, page.page_id,
                                                            position=page.position))
    yield {
        "page_id": page.page_id,
        "title": title,
        "text": parsed.text,
        "links": [{"start": link.start, "end": link.end, "target": link.target, "trail": link.trail}
                  for link in parsed.links],
        "qid": None,
        "position": page.position,
    }


def stored_title(title: str) -> str:
    """A title of the page or redirect table: as MediaWiki stored it, ``_`` for spaces; its first letter's case is
    already the wiki's (upper-casing it would merge two pages of a case-sensitive wiki)."""
    return normalize_title(title, first_letter=False)


class BadSqlRow(ValueError):
    """A row of an SQL table whose value of a column read is of no use (why: the message)."""


def sql_integer(row: dict[str, Any], column: str, what: str, smallest: int | None = None) -> int:
    """The integer in ``column`` of ``row`` (written as a number or, as MySQL takes it too, a quoted one; at least
    ``smallest``), else BadSqlRow saying it is no ``what``."""
    value = row.get(column)
    number = int(value) if isinstance(value, str) and _INTEGER.fullmatch(value) else value
    if type(number) is not int or (smallest is not None and number < smallest):
        raise BadSqlRow(f"{column} is {printable(value)!r}: no {what}")
    return number


def sql_title(row: dict[str, Any], column: str) -> str:
    """The title in ``column`` of ``row`` as stored, ``_`` for spaces; BadSqlRow unless a page can have it."""
    value = row.get(column)
    title = stored_title(value) if isinstance(value, str) and is_possible_title(value) else ""
    if not title:
        raise BadSqlRow(f"{column} is {printable(value)!r}: no page can have it as a title")
    return title


def printable(value: Any) -> Any:
    """``value`` as a dead letter holds it: a byte of text that is not UTF-8 as ``\\xe9``."""
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace") if isinstance(value, str) \
        else value


def sql_records(row: SqlRow, to_record: Callable[[dict[str, Any]], Iterator[Any]]) -> Iterator[Any]:
    """The records ``to_record`` makes of an SQL table's row; a row with a value of no use dead-lettered with its
    file and line."""
    try:
        yield from to_record(row.values)
    except BadSqlRow as problem:
        yield dead_letter("bad_sql_rows", str(problem), source=f"{row.path}:{row.line}",
                          row={column: printable(value) for column, value in row.values.items()})


def sql_redirect_record(row: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The title record of an article-namespace, same-wiki row of the redirect table (rd_from page id, target)."""
    if sql_integer(row, "rd_namespace", "namespace") != ARTICLE or (row.get("rd_interwiki") or ""):
        count("sql_redirects_skipped")
        return
    yield title_record(SQL_REDIRECT_RECORD, page_id=sql_integer(row, "rd_from", "page id", 1),
                       target=sql_title(row, "rd_title"))


def page_title_record(row: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The title record (page id, title) of a row of the page table, article namespace only."""
    if sql_integer(row, "page_namespace", "namespace") == ARTICLE:
        yield title_record(PAGE_RECORD, sql_title(row, "page_title"), sql_integer(row, "page_id", "page id", 1))


def qid_record(row: dict[str, Any]) -> Iterator[Any]:
    """The title record (page id, QID) of a ``wikibase_item`` row of the page_props table; a value that is not an
    item id is dead-lettered (a QID is an entity's key in every artifact: ``Q43\\r`` or ``[PAD]`` would break the
    export's vocabulary)."""
    if row.get("pp_propname") == "wikibase_item" and row.get("pp_value"):
        page_id, value = sql_integer(row, "pp_page", "page id", 1), printable(str(row["pp_value"]))
        if _QID.fullmatch(value):
            yield title_record(QID_RECORD, page_id=page_id, target=value)
        else:
            yield dead_letter("invalid_qids", "wikibase_item is not a Wikidata item id", page_id=page_id,
                              value=value)


SQL_TABLES = (("redirects_sql", "redirect", sql_redirect_record), ("page_sql", "page", page_title_record),
              ("page_props_sql", "page_props", qid_record))
# The columns each table's records are made of.
SQL_COLUMNS = {"redirect": ("rd_from", "rd_namespace", "rd_title"), "page": ("page_id", "page_namespace", "page_title"),
               "page_props": ("pp_page", "pp_propname", "pp_value")}


class ConvertPages(beam.PTransform):
    """Pass 1 of parse. Dump pages (+ optional SQL tables) -> ``articles`` (staged article rows, links not yet
    resolved), ``records`` (title records by source: ``dump`` and one per SQL table given) and ``dead_letters``.

    Pages are converted in the worker that read them; nothing of them but titles and ids leaves it.
    ``index_paths``: the multistream index of each dump that has one (read by streams, in parallel);
    ``progress``: a pass-through step given the page total, when known.
    """

    def __init__(self, config: ParseConfig, siteinfo: SiteInfo, index_paths: dict[str, str],
                 progress: Callable[[int | None], beam.PTransform] | None = None) -> None:
        super().__init__()
        self._config = config
        self._siteinfo = siteinfo
        self._index_paths = index_paths
        self._progress = progress

    def expand(self, pipeline: beam.Pipeline) -> dict[str, Any]:
        config = self._config
        read = pipeline | "ReadDumpPages" >> ReadDumpPages(
            list(config.dumps), self._siteinfo, self._index_paths, config.skip_bad_streams, self._progress)
        classified = read["pages"] | "ClassifyAndConvertPages" >> beam.FlatMap(
            classify_page, self._siteinfo, config.wikitext, bool(config.redirects_sql)).with_outputs(
            RECORD_TAG, DEAD_LETTER_TAG, main="articles")
        records = {"dump": classified[RECORD_TAG]}
        sql_dead_letters = []
        for option, table, to_record in SQL_TABLES:
            paths = getattr(config, option)
            if paths:
                converted = (pipeline | f"Read{table}Table" >> ReadSqlRows(list(paths), table, SQL_COLUMNS[table])
                             | f"{table}Records" >> beam.FlatMap(sql_records, to_record).with_outputs(
                                 DEAD_LETTER_TAG, main="records"))
                records[table] = converted.records
                sql_dead_letters.append(converted[DEAD_LETTER_TAG])
        dead_letters = ((read["dead_letters"], classified[DEAD_LETTER_TAG], *sql_dead_letters)
                        | "AllDeadLetters" >> beam.Flatten())
        return {"articles": classified.articles, "records": records, "dead_letters": dead_letters}


# Title records read at a time (their columns of one kind kept).
RECORD_BATCH_ROWS = 1 << 14
# What each kind of title record contributes to TitleRecords: (record kind, {record column: field}).
RECORD_FIELDS = {
    "articles": (ARTICLE_RECORD, {"title": "title", "page_id": "page_id"}),
    "redirects": (REDIRECT_RECORD, {"title": "title", "target": "target"}),
    "pages": (PAGE_RECORD, {"page_id": "page_id", "title": "title"}),
    "sql_redirects": (SQL_REDIRECT_RECORD, {"page_id": "page_id", "target": "target"}),
    "qids": (QID_RECORD, {"page_id": "page_id", "target": "qid"}),
}


def record_batches(files: list[str], kind: str, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """The ``columns`` of the title records of ``kind`` in ``files``, a batch at a time (only they are read)."""
    for batch in tables.iter_file_batches(files, ["kind", *columns], batch_size=RECORD_BATCH_ROWS):
        chosen = batch.filter(pc.equal(batch.column("kind"), kind))
        if chosen.num_rows:
            yield chosen.select(columns)


def read_kind(files: list[str], name: str) -> pa.Table:
    """The records of one field of TitleRecords, its columns renamed."""
    kind, columns = RECORD_FIELDS[name]
    schema = pa.schema([schemas.TITLE_RECORDS.field(column).with_name(field) for column, field in columns.items()])
    return pa.Table.from_batches([batch.rename_columns(list(columns.values()))
                                  for batch in record_batches(files, kind, list(columns))], schema)


def article_positions(files: list[str], indices: np.ndarray) -> pa.Array:
    """The positions of the article records at ``indices`` (in the order ``read_kind`` reads them), read again
    from ``files``: only the few the title map drops or ties are ever asked for."""
    order = np.argsort(indices, kind="stable")
    wanted, found, seen = np.asarray(indices)[order], [], 0
    for batch in record_batches(files, ARTICLE_RECORD, ["position"]):
        low, high = np.searchsorted(wanted, [seen, seen + batch.num_rows])
        found.append(batch.column(0).take(pa.array(wanted[low:high] - seen)))
        seen += batch.num_rows
        if high == len(wanted):
            break
    positions = pa.concat_arrays(found) if found else pa.array([], pa.string())
    return positions.take(pa.array(np.argsort(order)))


def read_records(records_dir: str) -> TitleRecords:
    """The title records written under ``records_dir``, by kind (each kind's columns read a batch at a time; the
    articles' positions left in the files until asked for)."""
    files = fs.list_files(records_dir, "*.parquet")
    return TitleRecords(positions_of=partial(article_positions, files),
                        **{name: read_kind(files, name) for name in RECORD_FIELDS})


def build_title_map_once(_: Any, records_dir: str, map_dir: str, redirects_file: str) -> Iterator[Any]:
    """The title map built from the records (in one worker), written under ``map_dir``; the resolved redirects
    written to ``redirects_file``; the cycles dead-lettered. Yields ``map_dir`` once everything is written."""
    build = build_title_map(read_records(records_dir))
    write_title_map(map_dir, build.trie, build.arrays, build.dropped)
    tables.write_file(redirects_file, build.redirects, schemas.REDIRECTS)
    count_fields(build.counts)
    for title, target in build.cycles:
        yield dead_letter("redirect_cycles", "redirect chain loops or is longer than 64 hops", title=title,
                          target=target)
    for title, target, why in build.duplicate_redirects:
        yield dead_letter("duplicate_redirects", f"redirect page dropped: {why}", title=title, target=target)
    for title, target in build.sql_redirects_from_articles:
        yield dead_letter("sql_redirects_from_articles", "redirect row of --redirects-sql dropped: an article of the "
                          "dump has its title", title=title, target=target)
    yield map_dir


class ResolveStagedArticles(beam.PTransform):
    """Pass 2 of parse. The title map built once from the title records under ``records_dir`` (the resolved
    redirects written to ``redirects_file`` on the way), then every staged article (``staged``: its files) read
    where it lies and its links resolved against the map -> ``articles`` and ``dead_letters``."""

    def __init__(self, staged: list[str], records_dir: str, map_dir: str, redirects_file: str,
                 progress: beam.PTransform | None = None) -> None:
        super().__init__()
        self._staged, self._records_dir, self._map_dir = staged, records_dir, map_dir
        self._redirects_file, self._progress = redirects_file, progress

    def expand(self, pipeline: beam.Pipeline) -> dict[str, beam.PCollection]:
        built = (pipeline | "Once" >> beam.Create([None])
                 | "BuildTitleMap" >> beam.FlatMap(build_title_map_once, self._records_dir, self._map_dir,
                                                   self._redirects_file).with_outputs(DEAD_LETTER_TAG, main="map"))
        staged = pipeline | "ReadStagedArticles" >> ReadParquetRows(self._staged)
        if self._progress is not None:
            staged = staged | "Progress" >> self._progress
        resolved = staged | "ResolveLinks" >> beam.ParDo(
            ResolveArticles(), beam.pvalue.AsSingleton(built.map)).with_outputs(DEAD_LETTER_TAG, main="articles")
        dead_letters = (built[DEAD_LETTER_TAG], resolved[DEAD_LETTER_TAG]) | "AllDeadLetters" >> beam.Flatten()
        return {"articles": resolved.articles, "dead_letters": dead_letters}
