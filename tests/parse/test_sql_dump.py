"""Reading MediaWiki SQL table dumps: the real page, page_props and redirect tables of the enwiki-20210701 mini set."""

from __future__ import annotations

import bz2
import gzip
import lzma
import re
from pathlib import Path

import pytest

from artifacts.errors import InputError
from artifacts.fs import misnamed_compression
from tests.conftest import MINI
from transforms.parse.sql_dump import iter_sql_rows, table_definition, unescape

RAW = MINI / "inputs" / "wikipedia-raw-20210701"
PAGE_TABLE = RAW / "pagetable" / "enwiki-20210701-page.sql.gz"
PAGE_PROPS_TABLE = RAW / "pagepropstable" / "enwiki-20210701-page_props.sql.gz"
REDIRECT_TABLE = RAW / "redirecttable" / "enwiki-20210701-redirect.sql.gz"


def rows_of(path: Path, *needed: str) -> list[dict]:
    return [row.values for row in iter_sql_rows(str(path), needed=needed)]


@pytest.mark.usefixtures("shared_data")
def test_redirect_table():
    redirects = rows_of(REDIRECT_TABLE)
    assert len(redirects) == 138
    assert redirects[0] == {"rd_from": 10583, "rd_namespace": 0, "rd_title": "Frodo_Baggins", "rd_interwiki": "",
                            "rd_fragment": ""}
    with_fragment = [row for row in redirects if row["rd_fragment"]]
    assert len(with_fragment) == 34
    assert with_fragment[0] == {"rd_from": 421338, "rd_namespace": 0, "rd_title": "Gandalf", "rd_interwiki": "",
                                "rd_fragment": "The White Council"}


@pytest.mark.usefixtures("shared_data")
def test_page_props_wikidata_items():
    props = rows_of(PAGE_PROPS_TABLE)
    assert len(props) == 14
    assert {row["pp_page"]: row["pp_value"] for row in props if row["pp_propname"] == "wikibase_item"} == {
        53221: "Q177499", 61599: "Q219504", 62320: "Q219473", 76749: "Q95074", 450998: "Q6647660"}
    assert props[1] == {"pp_page": 53221, "pp_propname": "wikibase-shortdesc",
                        "pp_value": "Fictional character created by J. R. R. Tolkien", "pp_sortkey": None}


@pytest.mark.usefixtures("shared_data")
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


@pytest.mark.usefixtures("shared_data")
def test_plain_sql_file_reads_the_same(tmp_path):
    plain = tmp_path / "page.sql"
    plain.write_bytes(gzip.decompress(PAGE_TABLE.read_bytes()))
    assert rows_of(plain) == rows_of(PAGE_TABLE)


HEADER = ("-- MySQL dump\nCREATE TABLE `redirect` (\n  `rd_from` int,\n  `rd_namespace` int,\n"
          "  `rd_title` varbinary(255)\n) ENGINE=InnoDB;\n")


def dump_file(tmp_path: Path, body: str, name: str = "redirect.sql", header: str = HEADER) -> Path:
    path = tmp_path / name
    path.write_bytes((header + body).encode("utf-8", "surrogateescape"))
    return path


def rows_and_lines(path: Path) -> list[tuple[int, dict]]:
    return [(row.line, row.values) for row in iter_sql_rows(str(path), "redirect", ("rd_from", "rd_title"))]


def test_value_syntax(tmp_path):
    """Escapes, quotes doubled, charset introducers, hex literals (--hex-blob), NULL in any case, numbers: every
    value of MySQL's syntax that mysqldump, --hex-blob and other tools write."""
    path = dump_file(tmp_path, r"""INSERT INTO `redirect` VALUES (1,0,'it\'s \'\''),(2,-0,'a\\b\n\0'),"""
                               r"""(3,+1,'O''Neil'),(4,1e1,_binary 'Bin'),(5,2.5,_utf8mb4'Café'),"""
                               r"""(6,NULL,X'436166C3A9'),(7,null,0x4E554C),(8, 3 ,  'x,y)' ),""" +
                               f"(9,{'9' * 4400},'More digits than Python converts');\n")
    assert [values for _, values in rows_and_lines(path)] == [
        {"rd_from": 1, "rd_namespace": 0, "rd_title": "it's ''"},
        {"rd_from": 2, "rd_namespace": 0, "rd_title": "a\\b\n\0"},
        {"rd_from": 3, "rd_namespace": 1, "rd_title": "O'Neil"},
        {"rd_from": 4, "rd_namespace": 10.0, "rd_title": "Bin"},
        {"rd_from": 5, "rd_namespace": 2.5, "rd_title": "Café"},
        {"rd_from": 6, "rd_namespace": None, "rd_title": "Café"},
        {"rd_from": 7, "rd_namespace": None, "rd_title": "NUL"},
        {"rd_from": 8, "rd_namespace": 3, "rd_title": "x,y)"},
        {"rd_from": 9, "rd_namespace": float("inf"), "rd_title": "More digits than Python converts"}]
    assert unescape(r"\%\_") == "%_"  # unknown escapes keep the character


def test_insert_forms_of_every_tool(tmp_path):
    """Column lists (--complete-insert, in another order), any case, IGNORE, REPLACE, rows on lines of their own
    (phpMyAdmin), several statements on a line, comments between: each row read, with its line. All but the first
    form were read as no row at all, without a word."""
    body = ("/*!40000 ALTER TABLE `redirect` DISABLE KEYS */;\n"
            "INSERT INTO `redirect` (`rd_title`, `rd_from`, `rd_namespace`) VALUES ('Listed',1,0);\n"
            "insert into redirect values (2,0,'Lower');\n"
            "INSERT IGNORE INTO `redirect` VALUES (3,0,'Ignore');\n"
            "REPLACE INTO `redirect` VALUES (4,0,'Replace');\n"
            "INSERT INTO `redirect` VALUES\n(5,0,'Own line'),\n(6,0,'Next line')\n;\n"
            "INSERT INTO `redirect` VALUES (7,0,'One');INSERT INTO `redirect` VALUES (8,0,'Two');\r\n"
            "LOCK TABLES `redirect` WRITE;INSERT INTO `redirect` VALUES (9,0,'After a lock');\n"
            "SET autocommit=0; insert into redirect values (10,0,'After a set');\n"
            "-- Dump completed\n")
    assert [(line, values["rd_from"], values["rd_title"]) for line, values in
            rows_and_lines(dump_file(tmp_path, body))] == [
        (8, 1, "Listed"), (9, 2, "Lower"), (10, 3, "Ignore"), (11, 4, "Replace"), (13, 5, "Own line"),
        (14, 6, "Next line"), (16, 7, "One"), (16, 8, "Two"), (17, 9, "After a lock"), (18, 10, "After a set")]


@pytest.mark.parametrize(("body", "problem"), [
    ("INSERT INTO `redirect` VALUES (1,0,'a'),(2,0,2e);\n", r"line 7: unparsable value at character 46: '2e\);"),
    ("INSERT INTO `redirect` VALUES (1,0,'a',4);\n", "line 7: a row of 4 values for 3 columns"),
    ("INSERT INTO `redirect` VALUES (1,0,'a') (2,0,'b');\n",
     "line 7: expected ',' or ';' after a row at character 41"),
    ("INSERT INTO `page` VALUES (1,0,'a');\n", "line 7: rows of the page table in a dump read as the redirect table"),
    ("INSERT INTO `redirect` (`rd_from`, `rd_namespace`) VALUES (1,0);\n",
     "line 7: an INSERT into redirect without the column rd_title"),
    ("INSERT INTO enwiki.redirect VALUES (1,0,'a');\n", "line 7: an INSERT of a form this reader does not know"),
    ("INSERT INTO `redirect` VALUES (1,0,'a'),(2,0,'b", r"line 7: the file ends inside a row \(cut short\?\)"),
    ("INSERT INTO `redirect` VALUES (1,0,'a'),\n(2,0,'b')",
     r"line 8: the file ends inside an INSERT statement \(cut short\?\)"),
])
def test_a_statement_that_cannot_be_read_stops_the_read_at_its_line(tmp_path, body, problem):
    """Was: the statement skipped whole and only counted (a bad value lost ~10,000 rows of a real dump), a number
    such as ``2e`` a ValueError traceback, another table's rows a KeyError, a plain file cut inside a statement
    read as complete."""
    path = dump_file(tmp_path, body)
    with pytest.raises(InputError) as raised:
        rows_and_lines(path)
    assert re.match(rf"{re.escape(str(path))}: {problem}", raised.value.message), raised.value.message


def test_a_compressed_file_misnamed_is_told_apart(tmp_path):
    """A dump, its index or a table compressed otherwise than its name says: the reader's error said nothing of why
    ("truncated or corrupt archive: Invalid data stream")."""
    plain = dump_file(tmp_path, "INSERT INTO `redirect` VALUES (1,0,'a');\n")
    content = plain.read_bytes()
    files = {"redirect.sql": content, "packed.sql": gzip.compress(content), "packed.sql.gz": gzip.compress(content),
             "gzip.sql.bz2": gzip.compress(content), "bzip2.sql.GZ": bz2.compress(content), "plain.sql.bz2": content,
             "packed.sql.xz": lzma.compress(content), "xz.sql.gz": lzma.compress(content)}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    assert {name: misnamed_compression(str(tmp_path / name)) for name in files} == {
        "redirect.sql": None, "packed.sql": "its bytes are gzip-compressed: its name should end in .gz",
        "packed.sql.gz": None, "gzip.sql.bz2": "its bytes are gzip-compressed: its name should end in .gz",
        "bzip2.sql.GZ": "its bytes are bzip2-compressed: its name should end in .bz2",
        "plain.sql.bz2": "its bytes are not compressed: its name should not end in .bz2",
        **dict.fromkeys(("packed.sql.xz", "xz.sql.gz"), "its bytes are xz-compressed, which is not read: decompress "
                        "it, or compress it as .bz2 or .gz")}


def test_a_create_table_if_not_exists_names_its_table(tmp_path):
    """``CREATE TABLE IF NOT EXISTS`` (mysqldump --add-drop-table off, other tools): was "no CREATE TABLE at its
    start"."""
    path = dump_file(tmp_path, "INSERT INTO `redirect` VALUES (1,0,'a');\n",
                     header=HEADER.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS"))
    assert table_definition(str(path)) == ("redirect", ("rd_from", "rd_namespace", "rd_title"))
    assert rows_and_lines(path) == [(7, {"rd_from": 1, "rd_namespace": 0, "rd_title": "a"})]


@pytest.mark.usefixtures("shared_data")
def test_truncated_and_missing_sql_dumps(tmp_path):
    data = REDIRECT_TABLE.read_bytes()
    cut = tmp_path / "redirect.sql.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"redirect\.sql\.gz: truncated or corrupt archive"):
        list(iter_sql_rows(str(cut)))
    with pytest.raises(InputError, match=r"cannot open .*nothing\.sql\.gz"):
        list(iter_sql_rows(str(tmp_path / "nothing.sql.gz")))
