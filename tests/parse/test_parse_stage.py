"""The parse stage end to end on the real dumps in ../shared/data (exact expectations for hand-checked pages)."""

from __future__ import annotations

import bz2
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from artifacts import tables
from artifacts.run import manifest
from pipelines.launcher.cli import main
from pipelines.parse import language_note
from tests.conftest import BUNDLED_INDEX, BUNDLED_SAMPLE, DIRECT, MINI, MULTI_PROCESS, REPO, WIKIPEDIA
from transforms.parse.dump_reader import SiteInfo
from transforms.parse.namespaces import Namespaces


def parse(output: Path, dumps: list[Path], *extra: str, beam: list[str] = DIRECT) -> manifest.StageRecord:
    argv = ["parse", "--output", str(output), "--dump", *map(str, dumps), *extra, *beam]
    assert main(argv) == 0
    return manifest.load(str(output))["parse"]


def articles_by_title(output: Path) -> dict[str, dict]:
    return {row["title"]: row for row in tables.read_table(str(output), "articles").to_pylist()}


def sorted_rows(output: Path, name: str, key: str) -> list[dict]:
    return sorted(tables.read_table(str(output), name).to_pylist(), key=lambda row: row[key])


def anchors(article: dict) -> list[tuple[str, str]]:
    return [(article["text"][link["start"]:link["end"]], link["target"]) for link in article["links"]]


@pytest.fixture(scope="module")
def gensim_run(tmp_path_factory, single_stream_sample) -> tuple[Path, manifest.StageRecord]:
    output = tmp_path_factory.mktemp("gensim")
    return output, parse(output, [single_stream_sample])


def test_gensim_sample_counts(gensim_run):
    output, record = gensim_run
    counters = record.counters
    # 206 pages: 205 in ns 0 (106 articles, 99 redirects) and 1 in ns 4 (a redirect too).
    assert counters["pages_read"] == 206
    assert counters["redirect_pages"] == 99
    assert counters["non_article_pages"] == 1
    assert counters["articles"] == tables.read_table(str(output), "articles").num_rows == 106
    assert record.counters["links"] == sum(len(row["links"]) for row in articles_by_title(output).values())


def test_every_link_offset_is_its_anchor(gensim_run):
    output, _ = gensim_run
    for article in articles_by_title(output).values():
        for link in article["links"]:
            assert 0 <= link["start"] < link["end"] <= len(article["text"])
            assert article["text"][link["start"]:link["end"]].strip()


def test_albedo_hand_checked(gensim_run):
    output, _ = gensim_run
    albedo = articles_by_title(output)["Albedo"]
    assert albedo["page_id"] == 39
    assert "{{" not in albedo["text"] and "[[" not in albedo["text"] and "File:" not in albedo["text"]
    found = anchors(albedo)
    assert ("Latin", "Latin") in found
    assert ("diffuse reflectivity", "Diffuse reflection") in found
    assert ("dimensionless", "Dimensionless number") in found


def test_redirects_resolved_in_links(gensim_run):
    output, _ = gensim_run
    redirects = {row["title"]: row["target"] for row in sorted_rows(output, "redirects", "title")}
    assert redirects["AccessibleComputing"] == "Computer accessibility"
    articles = articles_by_title(output)
    targets = {link["target"] for article in articles.values() for link in article["links"]}
    # No link points at a redirect title any more: every one was resolved to its final target.
    assert not targets & set(redirects)


def test_multistream_equals_single_stream(gensim_run, tmp_path):
    output, _ = gensim_run
    multistream = tmp_path / "multistream"
    record = parse(multistream, [BUNDLED_SAMPLE])
    assert record.options == manifest.load(str(output))["parse"].options
    assert sorted_rows(multistream, "articles", "page_id") == sorted_rows(output, "articles", "page_id")
    assert sorted_rows(multistream, "redirects", "title") == sorted_rows(output, "redirects", "title")


def test_two_worker_processes_give_the_same_rows(gensim_run, tmp_path):
    output, _ = gensim_run
    parallel = tmp_path / "parallel"
    parse(parallel, [BUNDLED_SAMPLE], beam=MULTI_PROCESS)
    assert sorted_rows(parallel, "articles", "page_id") == sorted_rows(output, "articles", "page_id")


@pytest.mark.usefixtures("shared_data")
def test_small_sample_redirect(tmp_path):
    parse(tmp_path, [WIKIPEDIA / "enwiki-pages-articles-sample.xml.bz2"])
    assert sorted_rows(tmp_path, "redirects", "title") == [
        {"title": "AccessibleComputing", "target": "Computer accessibility"}]
    assert sorted(articles_by_title(tmp_path)) == ["Accessibility", "Computer accessibility"]


@pytest.mark.usefixtures("shared_data")
def test_mini_set_parts_sql_redirects_and_qids(tmp_path):
    """The part files named by a glob the shell does not expand (quoted, or of a Beam filesystem: --dump took no
    glob, its pattern was 'No such file'), read as the files it matches, in path order."""
    raw = MINI / "inputs" / "wikipedia-raw-20210701"
    record = parse(tmp_path, [raw / "articlesdump" / "enwiki-20210701-pages-articles*.bz2"],
                   "--redirects-sql", str(next((raw / "redirecttable").glob("*.sql.gz"))),
                   "--page-sql", str(next((raw / "pagetable").glob("*.sql.gz"))),
                   "--page-props-sql", str(next((raw / "pagepropstable").glob("*.sql.gz"))))
    articles = articles_by_title(tmp_path)
    assert len(articles) == 10
    assert sorted(role for role in record.inputs if role.startswith("file:dump")) == [f"file:dump{n}" for n in range(4)]
    qids = {title: row["qid"] for title, row in articles.items() if row["qid"]}
    assert qids == {"Gandalf": "Q177499", "Boromir": "Q219504", "Samwise Gamgee": "Q219473",
                    "Character (arts)": "Q95074", "Literary element": "Q6647660"}
    assert record.counters["articles_with_qid"] == 5
    # The mini page table lists only the 10 articles, so no redirect row can be named: all are counted.
    assert record.counters["sql_redirects_unknown_source"] + record.counters["sql_redirects_skipped"] == 138


@pytest.mark.usefixtures("shared_data")
def test_italian_namespaces_from_siteinfo(tmp_path, capsys):
    parse(tmp_path, [WIKIPEDIA / "itwiki-sample.xml.gz"])
    for article in articles_by_title(tmp_path).values():
        for link in article["links"]:
            assert not link["target"].startswith(("Categoria:", "File:", "Immagine:")), link
    assert ("note: the dump is itwiki's: the dictionary stage finds names on spaCy's English token boundaries; give "
            "it --language it\n") in capsys.readouterr().err


ENGLISH_BOUNDARIES = "the dictionary stage finds names on spaCy's English token boundaries; "


@pytest.mark.parametrize(("dbname", "base", "dictionary_language", "note"), [
    ("itwiki", None, None, "itwiki's: " + ENGLISH_BOUNDARIES + "give it --language it"),
    (None, "https://de.wikipedia.org/wiki/Hauptseite", None,
     "dewiki's: " + ENGLISH_BOUNDARIES + "give it --language de"),
    ("nowiki", None, None, "nowiki's: " + ENGLISH_BOUNDARIES + "give it --language nb"),  # spaCy's Norwegian code
    ("zh_yuewiki", None, None, "zh_yuewiki's: " + ENGLISH_BOUNDARIES + "give it --language zh"),
    ("itwiki", None, "en", "itwiki's: " + ENGLISH_BOUNDARIES + "give it --language it"),  # `all` on English ones
    ("itwiki", None, "eng", "itwiki's: " + ENGLISH_BOUNDARIES + "give it --language it"),  # spaCy's English too
    ("itwiki", None, "it", None), ("enwiki", None, None, None), ("simplewiki", None, None, None),
    ("commonswiki", None, None, None), ("wikidatawiki", None, None, None), (None, None, None, None)])
def test_a_dump_of_another_language_says_which_language_the_dictionary_can_take(dbname, base, dictionary_language,
                                                                                 note):
    said = language_note(SiteInfo(dbname, base, "0.11", Namespaces()), dictionary_language)
    assert said == (None if note is None else f"note: the dump is {note}")


def test_a_dump_of_a_language_spacy_cannot_tokenize_here_says_why():
    if importlib.util.find_spec("sudachipy") is not None:  # no dependency of ours
        pytest.skip("SudachiPy is installed here")
    said = language_note(SiteInfo("jawiki", None, "0.11", Namespaces()))
    assert said.startswith("note: the dump is jawiki's: " + ENGLISH_BOUNDARIES + "spaCy makes no tokenizer of 'ja' "
                           "here (Japanese support requires SudachiPy")
    assert said.endswith("; --language xx takes its language-neutral rules")


@pytest.mark.usefixtures("shared_data")
def test_second_run_is_skipped(tmp_path, capsys):
    dump = [WIKIPEDIA / "enwiki-pages-articles-sample.xml.bz2"]
    first = parse(tmp_path, dump)
    capsys.readouterr()
    second = parse(tmp_path, dump)
    assert "skipped" in capsys.readouterr().err
    assert second.finished_at == first.finished_at


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "run_pipeline.py"), *argv, "--runner=DirectRunner"],
                          capture_output=True, text=True, cwd=REPO)


def test_missing_dump_is_a_one_line_error(tmp_path):
    result = run_cli("parse", "--dump", str(tmp_path / "nope.xml.bz2"), "--output", str(tmp_path / "out"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "nope.xml.bz2" in result.stderr and "Traceback" not in result.stderr
    result = run_cli("parse", "--dump", str(tmp_path / "nope*.xml.bz2"), "--output", str(tmp_path / "out"))
    assert (result.returncode, result.stderr.strip().splitlines()[-1]) == (
        2, f"error: no file matches {tmp_path / 'nope*.xml.bz2'}")


def test_truncated_bz2_is_a_one_line_error(tmp_path, single_stream_sample):
    truncated = tmp_path / "truncated.xml.bz2"
    data = single_stream_sample.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    result = run_cli("parse", "--dump", str(truncated), "--output", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "truncated.xml.bz2" in result.stderr


def test_corrupt_stream_stops_or_is_skipped_on_request(tmp_path):
    dump, index = tmp_path / "dump-multistream.xml.bz2", tmp_path / "dump-multistream-index.txt.bz2"
    shutil.copy(BUNDLED_INDEX, index)
    data = bytearray(BUNDLED_SAMPLE.read_bytes())
    lines = bz2.decompress(index.read_bytes()).decode().splitlines()
    offsets = sorted({int(line.split(":", 1)[0]) for line in lines if line})
    middle = offsets[1] + 500
    data[middle:middle + 64] = bytes(64)
    dump.write_bytes(bytes(data))
    result = run_cli("parse", "--dump", str(dump), "--output", str(tmp_path / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert str(offsets[1]) in result.stderr
    skipped = run_cli("parse", "--dump", str(dump), "--output", str(tmp_path / "out2"), "--skip-bad-streams")
    assert skipped.returncode == 0, skipped.stderr
    record = manifest.load(str(tmp_path / "out2"))["parse"]
    assert record.counters["bad_streams"] == 1
    assert any(str(offsets[1]) in path.read_text() for path in (tmp_path / "out2" / "errors" / "parse").glob("*"))
