"""Reading MediaWiki SQL table dumps: the real page, page_props and redirect tables of the enwiki-20210701 mini set."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from artifacts.errors import InputError
from tests.conftest import MINI
from transforms.parse.sql_dump import SqlSyntaxError, iter_sql_rows, parse_values, unescape

pytestmark = pytest.mark.usefixtures("shared_data")
RAW = MINI / "inputs" / "wikipedia-raw-20210701"
PAGE_TABLE = RAW / "pagetable" / "enwiki-20210701-page.sql.gz"
PAGE_PROPS_TABLE = RAW / "pagepropstable" / "enwiki-20210701-page_props.sql.gz"
REDIRECT_TABLE = RAW / "redirecttable" / "enwiki-20210701-redirect.sql.gz"


def rows_of(path: Path) -> list[dict]:
    return list(iter_sql_rows(str(path)))


def test_redirect_table():
    redirects = rows_of(REDIRECT_TABLE)
    assert len(redirects) == 138
    assert redirects[0] == {"rd_from": 10583, "rd_namespace": 0, "rd_title": "Frodo_Baggins", "rd_interwiki": "",
                            "rd_fragment": ""}
    with_fragment = [row for row in redirects if row["rd_fragment"]]
    assert len(with_fragment) == 34
    assert with_fragment[0] == {"rd_from": 421338, "rd_namespace": 0, "rd_title": "Gandalf", "rd_interwiki": "",
                                "rd_fragment": "The White Council"}


def test_page_props_wikidata_items():
    props = rows_of(PAGE_PROPS_TABLE)
    assert len(props) == 14
    assert {row["pp_page"]: row["pp_value"] for row in props if row["pp_propname"] == "wikibase_item"} == {
        53221: "Q177499", 61599: "Q219504", 62320: "Q219473", 76749: "Q95074", 450998: "Q6647660"}
    assert props[1] == {"pp_page": 53221, "pp_propname": "wikibase-shortdesc",
                        "pp_value": "Fictional character created by J. R. R. Tolkien", "pp_sortkey": None}


def test_page_table_with_several_inserts_on_one_line():
    pages = rows_of(PAGE_TABLE)
    assert [(row["page_id"], row["page_title"]) for row in pages] == [
        (53221, "Gandalf"), (61599, "Boromir"), (62320, "Samwise_Gamgee"), (76749, "Character_(arts)"),
        (450998, "Literary_element"), (20599055, "Gimli_(Middle-earth)"), (21920404, "Merry_Brandybuck"),
        (21920479, "Pippin_Took"), (23140032, "Frodo_Baggins"), (23140382, "Legolas")]
    assert pages[0] == {
        "page_id": 53221, "page_namespace": 0, "page_title": "Gandalf", "page_restrictions": "",
        "page_is_redirect": 0, "page_is_new": 0, "page_random": 0.49214563843993997,
        "page_touched": "20210629135708", "page_links_updated": "20210629135919", "page_latest": 1028931505,
        "page_len": 55754, "page_content_model": "wikitext", "page_lang": None}


def test_plain_sql_file_reads_the_same(tmp_path):
    plain = tmp_path / "page.sql"
    plain.write_bytes(gzip.decompress(PAGE_TABLE.read_bytes()))
    assert rows_of(plain) == rows_of(PAGE_TABLE)


def test_value_syntax():
    statement = r"""(1,'it\'s','a\\b',NULL,-2.5),(2,'x,y)','l1\nl2\t\"q\"\0', 3e2 );"""
    assert list(parse_values(statement, 0)) == [
        [1, "it's", "a\\b", None, -2.5], [2, "x,y)", 'l1\nl2\t"q"\0', 300.0]]
    assert unescape(r"\%\_") == "%_"  # unknown escapes keep the character
    with pytest.raises(SqlSyntaxError):
        list(parse_values("(1,'unterminated)", 0))


def with_extra_line(tmp_path: Path, source: Path, extra: str) -> tuple[Path, int]:
    """A copy of a real dump with ``extra`` inserted before its first INSERT line."""
    lines = gzip.decompress(source.read_bytes()).decode("utf-8").splitlines(keepends=True)
    first_insert = next(number for number, line in enumerate(lines) if line.startswith("INSERT INTO"))
    path = tmp_path / source.name
    path.write_bytes(gzip.compress("".join([*lines[:first_insert], extra, *lines[first_insert:]]).encode()))
    return path, first_insert + 1


def test_unparsable_statement_raises_or_is_reported_and_skipped(tmp_path):
    path, line = with_extra_line(tmp_path, PAGE_PROPS_TABLE, "INSERT INTO `page_props` VALUES (1,'a',oops,2);\n")
    with pytest.raises(InputError, match=rf"page_props\.sql\.gz: line {line}: unparsable value"):
        list(iter_sql_rows(str(path)))
    reported: list[tuple[int, str]] = []
    rows = list(iter_sql_rows(str(path), on_bad_statement=lambda number, reason: reported.append((number, reason))))
    assert rows == rows_of(PAGE_PROPS_TABLE)
    assert [number for number, _ in reported] == [line]
    path, line = with_extra_line(tmp_path, PAGE_PROPS_TABLE, "INSERT INTO `page_props` VALUES (1,'a','b',2,3);\n")
    with pytest.raises(InputError, match=rf"line {line}: a row of 5 values for 4 columns"):
        list(iter_sql_rows(str(path)))


def test_truncated_and_missing_sql_dumps(tmp_path):
    data = REDIRECT_TABLE.read_bytes()
    cut = tmp_path / "redirect.sql.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"redirect\.sql\.gz: truncated or corrupt archive"):
        list(iter_sql_rows(str(cut)))
    with pytest.raises(InputError, match=r"cannot open .*nothing\.sql\.gz"):
        list(iter_sql_rows(str(tmp_path / "nothing.sql.gz")))
