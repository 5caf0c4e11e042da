"""The parse and dictionary transforms in memory, on tiny hand-written dumps and articles; their configs and
recorded options."""

from __future__ import annotations

import gzip
import inspect
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from artifacts import names
from artifacts.counters import Counter
from artifacts.run import manifest
from pipelines import dictionary as dictionary_stage
from pipelines import parse as parse_stage
from pipelines.launcher import stage as stage_runner
from pipelines.launcher.cli import build_parser, main
from tests.builders import artifact_rows, run_counting
from tests.conftest import DIRECT
from transforms.dictionary import candidates, links
from transforms.dictionary import graph as dictionary
from transforms.dictionary.graph import BuildDictionary, DictionaryConfig
from transforms.dictionary.tables import ScoreDrops
from transforms.parse import dump_io, link_resolution, redirects
from transforms.parse import graph as parse
from transforms.parse.dump_reader import read_siteinfo
from transforms.parse.graph import ConvertPages, ParseConfig
from transforms.parse.redirects import RedirectCounts

DUMP = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10">
  <siteinfo><dbname>enwiki</dbname><namespaces><namespace key="0" /><namespace key="1">Talk</namespace></namespaces>
  </siteinfo>
  {pages}
</mediawiki>
"""
PAGES = [
    (1, 0, "Mercury", "Mercury is near [[venus]] and [[Morning star|the star]]."),
    (2, 0, "Venus", "Venus is a [[planet]]s."),
    (3, 0, "Morning star", "#REDIRECT [[Venus]]"),
    (4, 1, "Talk:Mercury", "chat"),
    (5, 0, "Stub", "{{stub}}"),
]
MERCURY = {"page_id": 1, "title": "Mercury", "text": "Mercury is near venus and the star.",
           "links": [{"start": 16, "end": 21, "target": "Venus", "trail": 0},
                     {"start": 26, "end": 34, "target": "Venus", "trail": 0}]}
VENUS = {"page_id": 2, "title": "Venus", "text": "Venus is a planets.",
         "links": [{"start": 11, "end": 18, "target": "Planet", "trail": 1}]}
STUB = {"page_id": 5, "title": "Stub", "text": "", "links": []}  # an article all the same (empty_articles)
SQL_TABLES = {
    "page_props": (["pp_page", "pp_propname", "pp_value", "pp_sortkey"],
                   "(1,'wikibase_item','Q308',NULL),(2,'page_image','Venus.jpg',NULL)"),
    "redirect": (["rd_from", "rd_namespace", "rd_title", "rd_interwiki", "rd_fragment"],
                 "(3,0,'Venus','',''),(6,0,'Mercury','',''),(7,0,'Venus','',''),(8,1,'Venus','','')"),
    "page": (["page_id", "page_namespace", "page_title"], "(6,0,'Evening_star'),(8,1,'Venus')"),
}


PAGES_XML = [f"<page><title>{title}</title><ns>{ns}</ns><id>{page_id}</id><revision><id>{page_id + 10}</id>"
             f"<text>{text}</text></revision></page>" for page_id, ns, title, text in PAGES]


def write_dump(directory: Path) -> str:
    pages = "\n  ".join(PAGES_XML)
    path = directory / "dump.xml"
    path.write_text(DUMP.format(pages=pages), encoding="utf-8")
    return str(path)


def write_sql(directory: Path, table: str) -> str:
    """A mysqldump file of ``table`` with the rows of SQL_TABLES."""
    path = directory / f"{table}.sql"
    path.write_text(write_sql_text(table, SQL_TABLES[table][1]), encoding="utf-8")
    return str(path)


def write_sql_text(table: str, values: str) -> str:
    """A mysqldump of ``table`` (the columns of SQL_TABLES) with the rows ``values``."""
    definition = ",\n".join(f"  `{column}` blob NOT NULL" for column in SQL_TABLES[table][0])
    return f"CREATE TABLE `{table}` (\n{definition}\n) ENGINE=InnoDB;\nINSERT INTO `{table}` VALUES {values};\n"


def assert_declared(counted: Mapping[str, int], declared: Mapping[str, Counter]) -> None:
    assert set(counted) <= set(declared), sorted(set(counted) - set(declared))


def parse_dump(tmp_path: Path, dump: str, *flags: str) -> tuple[list[dict], list[dict], list[dict], dict[str, int]]:
    """(articles, redirects, dead letters, counters) of the parse stage on ``dump`` with ``flags``."""
    output = tmp_path / "out"
    assert main(["parse", "--dump", dump, "--output", str(output), *flags, *DIRECT]) == 0
    dead = [json.loads(line) for path in sorted((output / "errors" / "parse").glob("*.jsonl"))
            for line in path.read_text(encoding="utf-8").splitlines()]
    counters = manifest.load(str(output))["parse"].counters
    assert_declared(counters, parse.COUNTERS)
    return artifact_rows(output, "articles"), artifact_rows(output, "redirects"), dead, counters


def test_convert_pages_stages_articles_with_their_title_records(tmp_path: Path):
    dump = write_dump(tmp_path)
    unresolved = {**MERCURY, "links": [{**MERCURY["links"][0]}, {**MERCURY["links"][1], "target": "Morning star"}]}

    def build(pipeline: beam.Pipeline) -> None:
        converted = pipeline | ConvertPages(ParseConfig(dumps=(dump,)), read_siteinfo(dump), {})
        staged = converted["articles"] | beam.Map(lambda row: {**row, "position": row["position"].split("#")[1]})
        assert_that(staged, equal_to([{**unresolved, "qid": None, "position": "0"},
                                      {**VENUS, "qid": None, "position": "1"},
                                      {**STUB, "qid": None, "position": "4"}]), label="Articles")
        records = converted["records"]["dump"] | beam.Map(lambda row: (row["kind"], row["title"], row["page_id"],
                                                                        row["target"]))
        assert_that(records, equal_to([("article", "Mercury", 1, None), ("article", "Venus", 2, None),
                                       ("redirect", "Morning star", None, "Venus"), ("article", "Stub", 5, None)]),
                    label="Records")
        assert_that(converted["dead_letters"], equal_to([]), label="DeadLetters")

    counters = run_counting(build)
    assert counters == {"files_read": 1, "pages_read": 5, "non_article_pages": 1, "redirect_pages": 1,
                        "empty_articles": 1}


def test_an_article_with_no_text_left_is_an_entity_that_links_resolve_to(tmp_path: Path):
    """A page of an infobox and templates (or a table alone) is an article all the same, as the paper's reference
    takes every linked title with a QID: it was dropped, the links to it red links, the entity and its QID lost."""
    pages = [(1, "Linker", "See [[tpl Only|the stub]] and [[File Only]]."), (2, "Tpl Only", "{{Infobox person}}"),
             (3, "File Only", "[[File:X.jpg|thumb|A caption]]\n[[Category:Stubs]]")]
    path = tmp_path / "dump.xml"
    xml = "".join(f"<page><title>{title}</title><ns>0</ns><id>{page_id}</id><revision><text>{text}</text>"
                  "</revision></page>" for page_id, title, text in pages)
    path.write_text(DUMP.format(pages=xml), encoding="utf-8")
    articles, _, dead, counters = parse_dump(tmp_path, str(path))
    assert sorted((row["page_id"], row["text"]) for row in articles) == [(1, "See the stub and File Only."), (2, ""),
                                                                         (3, "")]
    assert dead == [] and counters["empty_articles"] == 2 and "red_links" not in counters
    assert main(["dictionary", "--output", str(tmp_path / "out"), *DIRECT]) == 0
    entities = {row["title"]: row for row in artifact_rows(tmp_path / "out", "entities")}
    assert {title: (row["page_id"], row["link_count"]) for title, row in entities.items()} == {
        "File Only": (3, 1), "Tpl Only": (2, 1)}


def test_links_that_show_no_text_are_counted(tmp_path: Path):
    page = ("<page><title>Fruit</title><ns>0</ns><id>1</id><revision><id>2</id><text>An [[Apple| ]]s, "
            "[[Pear|{{lang|fr|Poire}}]] and a [[Plum]].\n[[Fig|*]]</text></revision></page>")
    path = tmp_path / "dump.xml"
    path.write_text(DUMP.format(pages=page), encoding="utf-8")
    articles, _, _, counters = parse_dump(tmp_path, str(path))
    assert [(row["text"], [link["target"] for link in row["links"]]) for row in articles] == [
        ("An s, and a Plum.", ["Plum"])]
    assert (counters["links"], counters["blank_links"]) == (1, 3)


def test_parse_dump_resolves_links_through_redirects_and_attaches_qids(tmp_path: Path):
    dump = write_dump(tmp_path)
    articles, redirects, dead, counters = parse_dump(tmp_path, dump, "--page-props-sql",
                                                     write_sql(tmp_path, "page_props"))
    assert sorted(articles, key=lambda row: row["page_id"]) == [{**MERCURY, "qid": "Q308"}, {**VENUS, "qid": None},
                                                                {**STUB, "qid": None}]
    assert redirects == [{"title": "Morning star", "target": "Venus"}]
    assert dead == []
    assert counters == {"files_read": 1, "pages_read": 5, "sql_rows_read": 2, "non_article_pages": 1,
                        "redirect_pages": 1, "empty_articles": 1, "articles": 3, "links": 3, "articles_with_qid": 1,
                        "redirects_resolved": 1, "links_via_redirect": 1, "red_links": 1}


def test_wikibase_items_that_are_not_item_ids_are_dead_lettered(tmp_path: Path):
    """A QID is an entity's key in every artifact and the export's vocabulary: a value with a line break or
    ``[PAD]`` (which the KPR reference's vocabulary reader mangles) gives the article no QID, counted."""
    dump = write_dump(tmp_path)
    sql = tmp_path / "page_props.sql"
    sql.write_text(write_sql_text("page_props", r"(1,'wikibase_item','Q308\r',NULL),(2,'wikibase_item','[PAD]',NULL),"
                                  r"(2,'wikibase_item','Q03',NULL)"), encoding="utf-8")
    articles, _, dead, counters = parse_dump(tmp_path, dump, "--page-props-sql", str(sql))
    assert [row["qid"] for row in articles] == [None, None, None]
    assert sorted((letter["kind"], letter["page_id"], letter["value"]) for letter in dead if "value" in letter) == [
        ("invalid_qids", 1, "Q308\r"), ("invalid_qids", 2, "Q03"), ("invalid_qids", 2, "[PAD]")]
    assert counters["invalid_qids"] == 3 and "articles_with_qid" not in counters


def test_parse_dump_takes_redirects_from_the_sql_tables(tmp_path: Path):
    """Row 3 repeats the dump's redirect; row 6 is named by the page table; 7 has no known source page; 8 is
    outside the article namespace."""
    dump = write_dump(tmp_path)
    articles, redirects, dead, counters = parse_dump(
        tmp_path, dump, "--redirects-sql", write_sql(tmp_path, "redirect"), "--page-sql", write_sql(tmp_path, "page"))
    assert sorted(articles, key=lambda row: row["page_id"]) == [{**MERCURY, "qid": None}, {**VENUS, "qid": None},
                                                                {**STUB, "qid": None}]
    assert sorted(redirects, key=lambda row: row["title"]) == [{"title": "Evening star", "target": "Mercury"},
                                                               {"title": "Morning star", "target": "Venus"}]
    assert dead == []
    assert {name: counters[name] for name in ("sql_rows_read", "sql_redirects", "sql_redirects_skipped",
                                              "sql_redirects_unknown_source", "redirects_resolved")} == {
        "sql_rows_read": 6, "sql_redirects": 2, "sql_redirects_skipped": 1, "sql_redirects_unknown_source": 1,
        "redirects_resolved": 2}


def test_an_sql_redirect_row_from_an_article_is_dropped_and_named(tmp_path: Path):
    """A redirect table of another date than the dump: its row from Venus (an article of the dump) to Mercury was
    kept, and Mercury's link through the redirect Morning star went on past Venus, to Mercury itself."""
    dump = write_dump(tmp_path)
    sql = tmp_path / "redirect.sql"
    sql.write_text(write_sql_text("redirect", "(2,0,'Mercury','','')"), encoding="utf-8")
    articles, redirects, dead, counters = parse_dump(tmp_path, dump, "--redirects-sql", str(sql))
    mercury = next(row for row in articles if row["title"] == "Mercury")
    assert [link["target"] for link in mercury["links"]] == ["Venus", "Venus"]
    assert redirects == [{"title": "Morning star", "target": "Venus"}]
    assert [(letter["kind"], letter["title"], letter["target"]) for letter in dead] == [
        ("sql_redirects_from_articles", "Venus", "Mercury")]
    assert counters["sql_redirects_from_articles"] == 1 and "sql_redirects" not in counters


def test_an_sql_redirect_from_a_dump_page_outside_the_article_namespace_is_none(tmp_path: Path):
    """Talk:Mercury (namespace 1 of the dump) named by a redirect row became the redirect "Talk:Mercury" -> Venus
    (a source that --page-sql names outside namespace 0 was already an unknown one)."""
    dump = write_dump(tmp_path)
    sql = tmp_path / "redirect.sql"
    sql.write_text(write_sql_text("redirect", "(4,0,'Venus','','')"), encoding="utf-8")
    _, redirects, _, counters = parse_dump(tmp_path, dump, "--redirects-sql", str(sql))
    assert redirects == [{"title": "Morning star", "target": "Venus"}]
    assert counters["sql_redirects_unknown_source"] == 1 and "sql_redirects" not in counters


def test_sql_tables_named_by_a_glob_are_recorded_file_by_file(tmp_path: Path, capsys):
    """A glob's files named one by one are the same inputs: the SQL tables' patterns were recorded as given (one
    fingerprint of a glob, one per file of a list), and the same files named either way ran parse again."""
    dump = write_dump(tmp_path)
    for number, row in enumerate(("(6,0,'Mercury','','')", "(7,0,'Venus','','')"), start=1):
        (tmp_path / f"redirect{number}.sql").write_text(write_sql_text("redirect", row), encoding="utf-8")
    run = ["parse", "--dump", dump, "--output", str(tmp_path / "out"), "--page-sql", write_sql(tmp_path, "page"),
           *DIRECT]
    assert main([*run, "--redirects-sql", str(tmp_path / "redirect?.sql")]) == 0
    record = manifest.load(str(tmp_path / "out"))["parse"]
    assert sorted(role for role in record.inputs if "redirects_sql" in role) == [
        "file:redirects_sql0", "file:redirects_sql1"]
    capsys.readouterr()
    assert main([*run, "--redirects-sql", str(tmp_path / "redirect1.sql"), str(tmp_path / "redirect2.sql")]) == 0
    assert "[parse] skipped: outputs complete, inputs and options unchanged" in capsys.readouterr().err


def test_sql_rows_of_no_use_are_dead_lettered_with_their_file_and_line(tmp_path: Path):
    """A NULL or text page id was an int() traceback, a NULL title a page or target named "None", a NUL in a title a
    KeyError of the title map after the whole first pass, bytes that are not UTF-8 a title with U+FFFD. Each such
    row is dead-lettered with where it is; the rows around it are read: a quoted integer is one (MySQL takes it),
    a redirect to Special: (namespace -1) is skipped as one to any other namespace."""
    dump = write_dump(tmp_path)
    redirect_sql = tmp_path / "redirect.sql"
    redirect_sql.write_bytes(write_sql_text("redirect", "('6','0','Mercury','',''),(NULL,0,'Venus','',''),"
                                            "('x',0,'Venus','',''),(6,0,NULL,'',''),(12,-1,'Random','','')").encode())
    page_sql = tmp_path / "page.sql"
    page_sql.write_bytes(write_sql_text("page", "(6,0,'Evening_star'),(9,0,NULL),(10,0,'Zero\\0_R'),"
                                        "(11,0,'Caf\xe9')").encode("latin-1"))
    articles, redirects, dead, counters = parse_dump(tmp_path, dump, "--redirects-sql", str(redirect_sql),
                                                     "--page-sql", str(page_sql))
    assert sorted(redirects, key=lambda row: row["title"]) == [{"title": "Evening star", "target": "Mercury"},
                                                               {"title": "Morning star", "target": "Venus"}]
    assert len(articles) == 3
    page_at, redirect_at = (f"{path}:{write_sql_text(path.stem, '').count(chr(10))}"  # their INSERT's line
                            for path in (page_sql, redirect_sql))
    assert sorted((letter["source"], letter["reason"]) for letter in dead) == [
        (page_at, "page_title is 'Caf\\\\xe9': no page can have it as a title"),
        (page_at, "page_title is 'Zero\\x00_R': no page can have it as a title"),
        (page_at, "page_title is None: no page can have it as a title"),
        (redirect_at, "rd_from is 'x': no page id"),
        (redirect_at, "rd_from is None: no page id"),
        (redirect_at, "rd_title is None: no page can have it as a title")]
    assert {letter["kind"] for letter in dead} == {"bad_sql_rows"}
    assert counters["bad_sql_rows"] == 6 and counters["sql_rows_read"] == 9 and counters["sql_redirects_skipped"] == 1


def test_a_stages_recorded_wall_time_holds_the_hashing_of_its_outputs(tmp_path: Path, monkeypatch):
    """The manifest's wall time (the report's) stopped before the outputs were hashed and recorded, which `all`'s
    table counts: two times for one stage, minutes apart at English Wikipedia's scale. Hashing here takes 1,000 s
    of a clock that the stage's timing reads."""
    skipped = {"s": 0.0}
    hash_outputs = stage_runner.described_outputs

    def slow_hashing(ctx: stage_runner.StageContext, artifacts: list[str]) -> list[manifest.OutputFile]:
        skipped["s"] += 1000.0
        return hash_outputs(ctx, artifacts)

    monkeypatch.setattr(stage_runner, "described_outputs", slow_hashing)
    clock = SimpleNamespace(**{**vars(time), "time": lambda: time.time() + skipped["s"]})
    monkeypatch.setattr(stage_runner, "time", clock)
    *_, counters = parse_dump(tmp_path, write_dump(tmp_path))
    assert counters["pages_read"] == len(PAGES)
    assert 1000 < manifest.load(str(tmp_path / "out"))["parse"].wall_time_s < 1100


def test_a_case_sensitive_wiki_keeps_the_case_of_its_titles(tmp_path: Path):
    """On a wiki whose <siteinfo> says case-sensitive (every Wiktionary, jbo.wikipedia), "roma" and "Roma" are two
    pages: each keeps its text, and links and redirects (of the dump and of the SQL tables) keep their case, where
    first-letter casing kept page 1's text under "Roma" and dead-lettered page 2 as its duplicate."""
    pages = [(1, 0, "roma", "Il nome comune: [[Roma]]."), (2, 0, "Roma", "La città: [[roma]] e [[élite]]."),
             (3, 0, "élite", "Un gruppo scelto."), (4, 0, "urbe", "#REDIRECT [[Roma]]")]
    dump = tmp_path / "itwiktionary.xml"
    dump.write_text(DUMP.replace("enwiki", "itwiktionary").replace(
        '<namespace key="0" />', '<case>case-sensitive</case><namespace key="0" case="case-sensitive" />').format(
        pages="\n".join(f"<page><title>{title}</title><ns>{ns}</ns><id>{page_id}</id><revision><id>{page_id}</id>"
                        f"<text>{text}</text></revision></page>" for page_id, ns, title, text in pages)),
        encoding="utf-8")
    sql = tmp_path / "redirect.sql"
    sql.write_text(write_sql_text("redirect", "(4,0,'Roma','',''),(5,0,'roma','','')"), encoding="utf-8")
    page = tmp_path / "page.sql"
    page.write_text(write_sql_text("page", "(5,0,'città_eterna')"), encoding="utf-8")
    articles, redirects, dead, _ = parse_dump(tmp_path, str(dump), "--redirects-sql", str(sql), "--page-sql", str(page))
    assert sorted((row["title"], row["text"], [link["target"] for link in row["links"]]) for row in articles) == [
        ("Roma", "La città: roma e élite.", ["roma", "élite"]), ("roma", "Il nome comune: Roma.", ["Roma"]),
        ("élite", "Un gruppo scelto.", [])]
    assert sorted((row["title"], row["target"]) for row in redirects) == [("città eterna", "roma"), ("urbe", "Roma")]
    assert dead == []


def test_an_sql_file_given_for_another_table_is_refused_in_one_line(tmp_path: Path, capsys):
    """Each table flag reads its table: another table's dump was a KeyError traceback (--redirects-sql, --page-sql)
    or no row at all and no word (--page-props-sql); a file of no table, zero rows."""
    dump = write_dump(tmp_path)
    not_sql = tmp_path / "notes.sql"
    not_sql.write_text("<html>not a table</html>\n")
    short = tmp_path / "short-redirect.sql"
    short.write_text(write_sql_text("redirect", "(3,0,'Venus','','')").replace("  `rd_title` blob NOT NULL,\n", "")
                     .replace("(3,0,'Venus','','')", "(3,0,'','')"))
    packed = tmp_path / "packed-redirect.sql"
    packed.write_bytes(gzip.compress(write_sql_text("redirect", "(3,0,'Venus','','')").encode()))
    cases = [("--redirects-sql", write_sql(tmp_path, "page_props"),
              "is a dump of the page_props table: --redirects-sql takes the redirect table"),
             ("--page-sql", write_sql(tmp_path, "redirect"),
              "is a dump of the redirect table: --page-sql takes the page table"),
             ("--page-props-sql", write_sql(tmp_path, "redirect"),
              "is a dump of the redirect table: --page-props-sql takes the page_props table"),
             ("--redirects-sql", str(not_sql), "(--redirects-sql) is no MySQL dump of a table: no CREATE TABLE at its "
              "start"),
             ("--redirects-sql", str(short), "(--redirects-sql): its redirect table has no column rd_title"),
             ("--redirects-sql", str(packed), "(--redirects-sql) is no MySQL dump of a table: its bytes are "
              "gzip-compressed: its name should end in .gz")]
    for flag, path, problem in cases:
        output = tmp_path / "out"
        assert main(["parse", "--dump", dump, flag, path, "--output", str(output), *DIRECT]) == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"error: {path} {problem}"
        assert not (output / "articles").exists()


def test_duplicate_pages_are_counted_dead_lettered_and_written_once(tmp_path: Path, capsys):
    """The same page twice (a page id and title repeated) and a second page with Venus's title. The summary on
    stderr counts the articles once, as the rows written, beside the duplicates (issue 21: a repeated page id
    counted ``articles: 5`` beside ``articles: 4 rows``)."""
    pages = "\n  ".join([PAGES_XML[0], PAGES_XML[0], PAGES_XML[1], PAGES_XML[1].replace("<id>2</id>", "<id>9</id>")])
    dump = tmp_path / "dump.xml"
    dump.write_text(DUMP.format(pages=pages), encoding="utf-8")
    articles, _, dead, counters = parse_dump(tmp_path, str(dump))
    assert sorted(row["page_id"] for row in articles) == [1, 2]
    assert sorted((letter["kind"], letter["page_id"]) for letter in dead) == [("duplicate_page_ids", 1),
                                                                             ("duplicate_titles", 9)]
    assert (counters["articles"], counters["duplicate_page_ids"], counters["duplicate_titles"]) == (2, 1, 1)
    summary = capsys.readouterr().err.splitlines()
    assert [line for line in summary if line.startswith(("  articles:", "  duplicate_"))] == [
        "  articles: 2 rows", "  duplicate_page_ids: 1", "  duplicate_titles: 1"]


def test_of_two_copies_of_a_page_the_first_in_the_dump_is_kept(tmp_path: Path):
    """Two copies of a page (its id and title) as the dump's 10th and 11th pages: the first is kept, as a
    multistream read of the same dump keeps it (positions are compared in dump order: "#9" before "#10")."""
    fillers = [f"<page><title>Filler {n}</title><ns>0</ns><id>{100 + n}</id><revision><id>{200 + n}</id>"
               f"<text>Filler {n}.</text></revision></page>" for n in range(9)]
    copies = [f"<page><title>Twin</title><ns>0</ns><id>50</id><revision><id>60</id><text>Twin {which} copy."
              "</text></revision></page>" for which in ("first", "second")]
    dump = tmp_path / "dump.xml"
    dump.write_text(DUMP.format(pages="\n  ".join(fillers + copies)), encoding="utf-8")
    articles, _, dead, _ = parse_dump(tmp_path, str(dump))
    assert [row["text"] for row in articles if row["title"] == "Twin"] == ["Twin first copy."]
    assert [(letter["kind"], letter["source"]) for letter in dead] == [("duplicate_page_ids", f"{dump}#10")]


def test_redirects_without_a_page_and_repeated_redirects_are_counted_not_articles(tmp_path: Path):
    """A redirect whose text names only a section or nothing, and a <redirect/> element whose title is empty and
    whose text names no page, are bad redirects (they became articles "REDIRECT #History"); a second redirect page
    of a title, and one with an article's title, are dead-lettered as duplicates (they were merged silently)."""
    odd = [(21, "To section", "#REDIRECT [[#History]]"), (22, "To nothing", "#REDIRECT [[]]"),
           (23, "Morning star", "#REDIRECT [[Mercury]]"), (24, "Venus", "#REDIRECT [[Mercury]]")]
    pages = [*PAGES_XML, *(f"<page><title>{title}</title><ns>0</ns><id>{page_id}</id><revision><text>{text}</text>"
                           "</revision></page>" for page_id, title, text in odd),
             '<page><title>Empty element</title><ns>0</ns><id>25</id><redirect title="" /><revision><text>Some text'
             "</text></revision></page>"]
    dump = tmp_path / "dump.xml"
    dump.write_text(DUMP.format(pages="\n  ".join(pages)), encoding="utf-8")
    articles, redirects, dead, counters = parse_dump(tmp_path, str(dump))
    assert sorted(row["title"] for row in articles) == ["Mercury", "Stub", "Venus"]
    assert redirects == [{"title": "Morning star", "target": "Mercury"}]  # of Venus and Mercury, the smallest
    assert sorted((letter["kind"], letter["title"]) for letter in dead) == [
        ("bad_redirects", "Empty element"), ("bad_redirects", "To nothing"), ("bad_redirects", "To section"),
        ("duplicate_redirects", "Morning star"), ("duplicate_redirects", "Venus")]
    assert (counters["redirect_pages"], counters["bad_redirects"], counters["duplicate_redirects"]) == (6, 3, 2)


def test_link_and_redirect_targets_are_decoded_and_redirects_out_of_the_articles_are_dropped(tmp_path: Path):
    """Character references and %XX escapes in a target are decoded before its #fragment is split off, and it is
    NFC (a link to [[Guns N&#39; Roses]] was no link, its redirect pointed at "Guns N&"); a redirect to another
    namespace or wiki is dead-lettered, not a title map entry whose target became an entity "Wikipedia:About"."""
    from xml.sax.saxutils import escape

    pages = [
        (31, "Fan", "[[Guns N&#39; Roses]], [[AT&amp;T]], [[Foo%20bar]], [[Ame\u0301lie]], [[GNR]], [[Project]]."),
        (32, "Project", "#REDIRECT [[Wikipedia:About]]"), (33, "Cat", "#REDIRECT [[Category:Planets]]"),
        (34, "Wikt", "#REDIRECT [[wikt:venus]]"), (35, "GNR", "#REDIRECT [[Guns N&#x27; Roses#History]]"),
        (36, "Guns N' Roses", "A band."), (37, "Colon", "#REDIRECT [[:en:Guns_N%27_Roses]]"),
    ]
    xml = [f"<page><title>{escape(title)}</title><ns>0</ns><id>{page_id}</id><revision><text>{escape(text)}</text>"
           "</revision></page>" for page_id, title, text in pages]
    dump = tmp_path / "dump.xml"
    dump.write_text(DUMP.format(pages="\n  ".join(xml)), encoding="utf-8")
    articles, redirects, dead, counters = parse_dump(tmp_path, str(dump))
    fan = next(row for row in articles if row["title"] == "Fan")
    assert [link["target"] for link in fan["links"]] == [
        "Guns N' Roses", "AT&T", "Foo bar", "Am\u00e9lie", "Guns N' Roses", "Project"]
    assert sorted((row["title"], row["target"]) for row in redirects) == [("Colon", "Guns N' Roses"),
                                                                          ("GNR", "Guns N' Roses")]
    assert sorted((letter["kind"], letter["title"]) for letter in dead) == [
        ("non_article_redirects", "Cat"), ("non_article_redirects", "Project"), ("non_article_redirects", "Wikt")]
    assert (counters["redirect_pages"], counters["non_article_redirects"], counters["red_links"]) == (5, 3, 4)


def test_dumps_of_two_wikis_are_refused(tmp_path: Path, capsys):
    """Only one <siteinfo> decides the namespaces of every file: a German dump read with the English one linked
    Datei:, Kategorie: and Vorlage: pages as entities."""
    english = write_dump(tmp_path)
    german = tmp_path / "dewiki.xml"
    german.write_text(DUMP.replace("enwiki", "dewiki").replace('"1">Talk', '"1">Diskussion').format(
        pages=PAGES_XML[0]), encoding="utf-8")
    assert main(["parse", "--dump", english, str(german), "--output", str(tmp_path / "out"), *DIRECT]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: {english} and {german} declare different namespaces in their <siteinfo> (wikis enwiki and dewiki): "
        "give the dump files of one wiki, all with their <siteinfo>")
    assert not (tmp_path / "out" / "articles").exists()
    newer = tmp_path / "enwiki-newer.xml"  # a namespace added between two dates of one wiki's dumps
    newer.write_text(DUMP.replace('"1">Talk', '"1">Talk</namespace><namespace key="1728">Event').format(
        pages=PAGES_XML[0]), encoding="utf-8")
    assert main(["parse", "--dump", english, str(newer), "--output", str(tmp_path / "out"), *DIRECT]) == 2
    assert "(both of enwiki: dumps of two dates?)" in capsys.readouterr().err.splitlines()[-1]
    for path in (Path(english), newer):  # two dumps that name no wiki may be of two wikis
        path.write_text(path.read_text(encoding="utf-8").replace("<dbname>enwiki</dbname>", ""), encoding="utf-8")
    assert main(["parse", "--dump", english, str(newer), "--output", str(tmp_path / "out"), *DIRECT]) == 2
    assert "(no <dbname> and no <dbname>: two wikis, or one's dumps of two dates?)" in capsys.readouterr().err
    assert main(["parse", "--dump", english, str(german), "--output", str(tmp_path / "out"), *DIRECT]) == 2
    assert "(no <dbname> and dewiki: two wikis, or one's dumps of two dates?)" in capsys.readouterr().err


def article(page_id: int, title: str, text: str, links: list[tuple[str, str]], qid: str | None = None) -> dict:
    """An articles/ row; each link is (anchor, target), the anchor's first occurrence in ``text``."""
    spans = [{"start": text.index(anchor), "end": text.index(anchor) + len(anchor), "target": target, "trail": 0}
             for anchor, target in links]
    return {"page_id": page_id, "title": title, "text": text, "links": spans, "qid": qid}


ARTICLES = [
    article(1, "Mercury (planet)", "Mercury is near Venus.\nVenus shines.", [("Venus", "Venus")], "Q308"),
    article(2, "Venus", "Venus is a planet and a Morning star.", [("planet", "Planet"), ("Morning star", "Venus")],
            "Q313"),
    article(3, "Earth", "Earth sees Venus and Mercury.", [("Venus", "Venus"), ("Mercury", "Mercury (planet)"),
                                                          ("", "Venus")]),
]
ENTITIES = [{"title": "Mercury (planet)", "page_id": 1, "qid": "Q308", "link_count": 1, "entity_id": 1},
            {"title": "Venus", "page_id": 2, "qid": "Q313", "link_count": 4, "entity_id": 2}]


def name_row(name: str, entity_id: int, links: int, total: int, docs: int) -> dict[str, Any]:
    return {"name": name, "entity_id": entity_id, "link_count": links, "total_link_count": total,
            "doc_count": docs, "link_prob": min(1.0, total / docs), "commonness": links / total}


def build_dictionary(config: DictionaryConfig, names: list[dict[str, Any]], work_dir: Path) -> dict[str, int]:
    def build(pipeline: beam.Pipeline) -> None:
        built = pipeline | BuildDictionary(config, lambda columns, unit: beam.Create(ARTICLES), str(work_dir), 4)
        rows = {kind: built[kind] | f"{kind}Rows" >> beam.FlatMap(lambda table: table.to_pylist())
                for kind in ("entities", "names")}
        assert_that(rows["entities"], equal_to(ENTITIES), label="Entities")
        assert_that(rows["names"], equal_to(names), label="Names")
        assert_that(built["dead_letters"], equal_to([{"kind": "empty_names", "reason": "unusable anchor text",
                                                      "page_id": 3, "anchor": ""}]), label="DeadLetters")

    counters = run_counting(build)
    assert_declared(counters, dictionary.COUNTERS)
    return counters


def test_build_dictionary_counts_names_once_per_paragraph(tmp_path):
    """"venus": 3 links (two anchors and the title of Venus) in 4 paragraphs; titles drop their "(...)"."""
    counters = build_dictionary(DictionaryConfig(), [
        name_row("venus", 2, 3, 3, 4), name_row("morning star", 2, 1, 1, 1), name_row("mercury", 1, 2, 2, 2)],
        tmp_path)
    assert counters == {"empty_names": 1, "red_link_targets": 1, "red_links_not_entities": 1,
                        "pairs_to_non_entities": 2}  # Planet has no article; "earth" and "planet" no entity


def test_build_dictionary_counts_per_page_and_filters_by_link_count(tmp_path):
    counters = build_dictionary(DictionaryConfig(doc_unit="page", min_link_count=2),
                                [name_row("venus", 2, 3, 3, 3), name_row("mercury", 1, 2, 2, 2)], tmp_path)
    assert counters["pairs_below_min_link_count"] == 1  # "morning star": one link


def test_configs_reject_what_the_flags_cannot_mean():
    with pytest.raises(ValueError, match="2 multistream indexes for 1 dumps"):
        ParseConfig(dumps=("a.xml.bz2",), dump_indexes=("a.txt.bz2", "b.txt.bz2"))
    with pytest.raises(ValueError, match="doc_unit must be one of"):
        DictionaryConfig(doc_unit="sentence")


def test_recorded_options_and_inputs_are_those_of_the_flags():
    args, _ = build_parser().parse_known_args([
        "parse", "--output", "out", "--dump", "a.xml.bz2", "b.xml.bz2", "--dump-index", "a.txt", "b.txt",
        "--page-props-sql", "pp.sql", "--keep-section-links", "--no-prepass"])
    stage, config = parse_stage.STAGE, parse_stage.STAGE.config(args)
    assert config.wikitext.use_prepass is False
    assert stage.options(config) == {"keep_section_links": True, "first_bold_as_link": False,
                                     "skip_bad_streams": False, "prepass": False}  # recorded only when off:
    assert "prepass" not in stage.options(parse_stage.STAGE.config(build_parser().parse_known_args(
        ["parse", "--output", "out", "--dump", "a.xml.bz2"])[0]))  # runs with the pre-pass keep their records
    # the bold rule recorded with the option (a run of an earlier version, which linked a bold anywhere in the lead,
    # parses again)
    bold = stage.options(parse_stage.STAGE.config(build_parser().parse_known_args(
        ["parse", "--output", "out", "--dump", "a.xml.bz2", "--first-bold-as-link"])[0]))
    assert (bold["first_bold_as_link"], bold["max_chars_before_bold"]) == (True, 50)
    # Fingerprinted by absolute path: the flags' relative paths are made absolute when parsed.
    assert stage.external_inputs(config) == {role: os.path.abspath(name) for role, name in (
        ("dump0", "a.xml.bz2"), ("dump1", "b.xml.bz2"), ("dump_index0", "a.txt"), ("dump_index1", "b.txt"),
        ("page_props_sql0", "pp.sql"))}
    args, _ = build_parser().parse_known_args(["dictionary", "--output", "out", "--min-commonness", "0.5",
                                               "--doc-unit", "page", "--case-sensitive"])
    config = dictionary_stage.STAGE.config(args)
    assert dictionary_stage.STAGE.options(config) == {
        "min_link_prob": 0.05, "min_commonness": 0.5, "min_link_count": 1, "max_mention_length": 100,
        "case_sensitive": True, "doc_unit": "page", "include_red_links": False}


def test_a_stage_with_a_bad_flag_stops_with_the_flag_named(tmp_path, capsys):
    output = str(tmp_path / "out")
    for argv, line in ((["--dump", "a.xml.bz2", "b.xml.bz2", "--dump-index", "a.txt"],
                        "error: --dump-index names 1 files for 2 dumps"),
                       ([], "error: parse needs --dump FILE [FILE ...]")):
        assert main(["parse", "--output", output, *argv]) == 2
        assert capsys.readouterr().err.splitlines() == [line]
    assert not (tmp_path / "out").exists()


def counted_names(*modules: ModuleType, counts: tuple[type, ...] = ()) -> set[str]:
    """The literal counter names of count(...), count_some(...) and dead_letter(...) calls in the source of
    ``modules``, and the fields of the ``counts`` dataclasses (counted by ``count_fields``)."""
    pattern = re.compile(r"\b(?:count|count_some|dead_letter)\(\s*\"([a-z_]+)\"")
    literal = {name for module in modules for name in pattern.findall(inspect.getsource(module))}
    return literal | {field.name for each in counts for field in fields(each)}


@pytest.mark.parametrize(("stage", "found"), [
    (parse_stage.STAGE, counted_names(parse, dump_io, redirects, link_resolution, counts=(RedirectCounts,))),
    # Anchor names are dead-lettered (or counted) under the problem names.name_problem returns.
    (dictionary_stage.STAGE, counted_names(links, candidates, counts=(ScoreDrops,))
     | set(re.findall(r'return "([a-z_]+)"', inspect.getsource(names.name_problem)))),
])
def test_a_stage_declares_exactly_the_counters_it_counts(stage, found: set[str]):
    assert found == set(stage.counters), sorted(found ^ set(stage.counters))


def test_outputs_past_the_launchers_share_are_described_by_the_workers(tmp_path: Path, monkeypatch):
    """The manifest's sizes, hashes and row counts are the same whether the launcher or a pipeline computes them."""
    dump = write_dump(tmp_path)
    by_launcher, by_workers = tmp_path / "launcher", tmp_path / "workers"
    assert main(["parse", "--dump", dump, "--output", str(by_launcher), *DIRECT]) == 0
    monkeypatch.setattr(stage_runner, "hashes_here", lambda ctx, paths: False)  # as a remote runner beyond the share
    assert main(["parse", "--dump", dump, "--output", str(by_workers), *DIRECT]) == 0
    outputs = [manifest.load(str(output))["parse"].outputs for output in (by_launcher, by_workers)]
    assert sorted(outputs[0], key=lambda item: item.path) == outputs[1]
    assert {item.path for item in outputs[1]} >= {"articles/part-00000-of-00001.parquet",
                                                  "redirects/part-00000-of-00001.parquet"}
    assert not (by_workers / ".staging" / "parse").exists()


def test_the_launcher_hashes_a_local_runs_outputs_whatever_their_size_and_a_remote_ones_up_to_its_share(
        tmp_path: Path, monkeypatch):
    output = tmp_path / "file.bin"
    output.write_bytes(b"x" * 100)
    local = stage_runner.StageContext(output=str(tmp_path), stage="parse", beam_args=tuple(DIRECT))
    remote = replace(local, beam_args=("--runner=DataflowRunner",))
    assert stage_runner.hashes_here(local, [str(output)]) and stage_runner.hashes_here(remote, [str(output)])
    monkeypatch.setattr(stage_runner, "LAUNCHER_HASH_BYTES", 99)
    assert stage_runner.hashes_here(local, [str(output)]) and not stage_runner.hashes_here(remote, [str(output)])


def test_article_positions_are_read_back_by_index_in_any_order(tmp_path: Path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from artifacts import schemas
    from transforms.parse.graph import article_positions, read_kind, title_record

    rows = [title_record("article" if index % 3 else "redirect", f"T{index}", index, position=f"f@{index}#0",
                         target=None if index % 3 else "T1") for index in range(300)]
    path = tmp_path / "records.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schemas.TITLE_RECORDS), path, row_group_size=17)
    articles = [row for row in rows if row["kind"] == "article"]
    assert read_kind([str(path)], "articles").column("title").to_pylist() == [row["title"] for row in articles]
    indices = np.array([150, 3, 199, 0, 77])
    assert article_positions([str(path)], indices).to_pylist() == [articles[index]["position"] for index in indices]
    assert article_positions([str(path)], np.array([], dtype=np.int64)).to_pylist() == []
