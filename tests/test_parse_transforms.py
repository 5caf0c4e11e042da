"""The parse and dictionary transforms in memory, on tiny hand-written dumps and articles; their configs and
recorded options."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from artifacts import names
from artifacts.counters import Counter
from artifacts.errors import InputError
from pipelines import dictionary as dictionary_stage
from pipelines import parse as parse_stage
from pipelines.cli import build_parser
from tests.builders import run_counting
from transforms import dictionary, dump_io, link_resolution, parse, redirects
from transforms.dictionary import BuildDictionary, DictionaryConfig
from transforms.dump_reader import read_siteinfo
from transforms.parse import ParseConfig, ParseDump

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
STUB_DEAD_LETTER = {"kind": "empty_articles", "reason": "no text left after markup removal", "page_id": 5,
                    "title": "Stub"}
SQL_TABLES = {
    "page_props": (["pp_page", "pp_propname", "pp_value", "pp_sortkey"],
                   "(1,'wikibase_item','Q308',NULL),(2,'page_image','Venus.jpg',NULL)"),
    "redirect": (["rd_from", "rd_namespace", "rd_title", "rd_interwiki", "rd_fragment"],
                 "(3,0,'Venus','',''),(6,0,'Mercury','',''),(7,0,'Venus','',''),(8,1,'Venus','','')"),
    "page": (["page_id", "page_namespace", "page_title"], "(6,0,'Evening_star'),(8,1,'Venus')"),
}


def write_dump(directory: Path) -> str:
    pages = "\n  ".join(f"<page><title>{title}</title><ns>{ns}</ns><id>{page_id}</id><revision><id>{page_id + 10}"
                        f"</id><text>{text}</text></revision></page>" for page_id, ns, title, text in PAGES)
    path = directory / "dump.xml"
    path.write_text(DUMP.format(pages=pages), encoding="utf-8")
    return str(path)


def write_sql(directory: Path, table: str) -> str:
    """A mysqldump file of ``table`` with the rows of SQL_TABLES."""
    columns, values = SQL_TABLES[table]
    definition = ",\n".join(f"  `{column}` blob NOT NULL" for column in columns)
    path = directory / f"{table}.sql"
    path.write_text(f"CREATE TABLE `{table}` (\n{definition}\n) ENGINE=InnoDB;\n"
                    f"INSERT INTO `{table}` VALUES {values};\n", encoding="utf-8")
    return str(path)


def assert_declared(counted: Mapping[str, int], declared: Mapping[str, Counter]) -> None:
    assert set(counted) <= set(declared), sorted(set(counted) - set(declared))


def parse_dump(config: ParseConfig, dump: str, articles: list[dict[str, Any]], redirects: list[dict[str, Any]],
               dead_letters: list[dict[str, Any]]) -> dict[str, int]:
    def build(pipeline: beam.Pipeline) -> None:
        parsed = pipeline | ParseDump(config, read_siteinfo(dump), {})
        assert_that(parsed["articles"], equal_to(articles), label="Articles")
        assert_that(parsed["redirects"], equal_to(redirects), label="Redirects")
        assert_that(parsed["dead_letters"], equal_to(dead_letters), label="DeadLetters")

    counters = run_counting(build)
    assert_declared(counters, parse.COUNTERS)
    return counters


def test_parse_dump_resolves_links_through_redirects_and_attaches_qids(tmp_path: Path):
    dump = write_dump(tmp_path)
    config = ParseConfig(dumps=(dump,), page_props_sql=(write_sql(tmp_path, "page_props"),))
    counters = parse_dump(config, dump, [{**MERCURY, "qid": "Q308"}, {**VENUS, "qid": None}],
                          [{"title": "Morning star", "target": "Venus"}], [STUB_DEAD_LETTER])
    assert counters == {"files_read": 1, "pages_read": 5, "sql_rows_read": 2, "non_article_pages": 1,
                        "redirect_pages": 1, "empty_articles": 1, "articles": 2, "links": 3, "articles_with_qid": 1,
                        "redirects_resolved": 1, "links_via_redirect": 1, "red_links": 1}


def test_parse_dump_takes_redirects_from_the_sql_tables(tmp_path: Path):
    """Row 3 repeats the dump's redirect; row 6 is named by the page table; 7 has no known source page; 8 is
    outside the article namespace."""
    dump = write_dump(tmp_path)
    config = ParseConfig(dumps=(dump,), redirects_sql=(write_sql(tmp_path, "redirect"),),
                         page_sql=(write_sql(tmp_path, "page"),))
    redirects = [{"title": "Morning star", "target": "Venus"}, {"title": "Evening star", "target": "Mercury"}]
    counters = parse_dump(config, dump, [{**MERCURY, "qid": None}, {**VENUS, "qid": None}], redirects,
                          [STUB_DEAD_LETTER])
    assert {name: counters[name] for name in ("sql_rows_read", "sql_redirects", "sql_redirects_skipped",
                                              "sql_redirects_unknown_source", "redirects_resolved")} == {
        "sql_rows_read": 6, "sql_redirects": 2, "sql_redirects_skipped": 1, "sql_redirects_unknown_source": 1,
        "redirects_resolved": 2}


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
                                     "skip_bad_streams": False}
    assert stage.external_inputs(config) == {"dump0": "a.xml.bz2", "dump1": "b.xml.bz2", "dump_index0": "a.txt",
                                             "dump_index1": "b.txt", "page_props_sql0": "pp.sql"}
    args, _ = build_parser().parse_known_args(["dictionary", "--output", "out", "--min-commonness", "0.5",
                                               "--doc-unit", "page", "--case-sensitive"])
    config = dictionary_stage.STAGE.config(args)
    assert dictionary_stage.STAGE.options(config) == {
        "min_link_prob": 0.05, "min_commonness": 0.5, "min_link_count": 1, "max_mention_length": 100,
        "case_sensitive": True, "doc_unit": "page", "include_red_links": False}


def test_a_stage_with_a_bad_flag_stops_with_the_flag_named():
    with pytest.raises(InputError, match=r"--dump-index names 1 files for 2 dumps"):
        parse_stage.STAGE.config(build_parser().parse_known_args(
            ["parse", "--output", "out", "--dump", "a.xml.bz2", "b.xml.bz2", "--dump-index", "a.txt"])[0])
    with pytest.raises(InputError, match=r"parse needs --dump FILE"):
        parse_stage.STAGE.config(build_parser().parse_known_args(["parse", "--output", "out"])[0])


def counted_names(*modules: ModuleType) -> set[str]:
    """The literal counter names of count(...) and dead_letter(...) calls in the source of ``modules``."""
    pattern = re.compile(r"\b(?:count|dead_letter)\(\s*\"([a-z_]+)\"")
    return {name for module in modules for name in pattern.findall(inspect.getsource(module))}


@pytest.mark.parametrize(("stage", "found"), [
    (parse_stage.STAGE, counted_names(parse, dump_io, redirects, link_resolution)),
    # Anchor names are dead-lettered (or counted) under the problem names.name_problem returns.
    (dictionary_stage.STAGE, counted_names(dictionary) | set(re.findall(r'return "([a-z_]+)"',
                                                                        inspect.getsource(names.name_problem)))),
])
def test_a_stage_declares_exactly_the_counters_it_counts(stage, found: set[str]):
    assert found == set(stage.counters), sorted(found ^ set(stage.counters))
