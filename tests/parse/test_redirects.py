"""Redirect chains, cycles, duplicate pages and link resolution: the title map built from title records (pure, no
Beam), written, loaded back and used on articles."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa

from artifacts.counters import PROCESSED
from artifacts.title_map import Resolution, TitleMap, write_title_map
from tests.builders import mirrored
from tests.conftest import REPO
from transforms.parse.link_resolution import final_article, resolve_links
from transforms.parse.redirects import COUNTERS, TitleRecords, build_title_map, dump_order, jump


def records(articles: list[tuple[str, int]], redirects: list[tuple[str, str]],
            pages: list[tuple[int, str]] = (), sql_redirects: list[tuple[int, str]] = (),
            qids: list[tuple[int, str]] = ()) -> TitleRecords:
    """Title records; an article's position is its title and id."""
    positions = pa.array([f"{title}#{page_id}" for title, page_id in articles], pa.string())
    return TitleRecords(
        articles=pa.table({"title": [title for title, _ in articles],
                           "page_id": pa.array([page_id for _, page_id in articles], pa.int64())}),
        positions_of=lambda indices: positions.take(pa.array(indices, pa.int64())),
        redirects=pa.table({"title": pa.array([t for t, _ in redirects], pa.string()),
                            "target": pa.array([t for _, t in redirects], pa.string())}),
        pages=pa.table({"page_id": pa.array([p for p, _ in pages], pa.int64()),
                        "title": pa.array([t for _, t in pages], pa.string())}),
        sql_redirects=pa.table({"page_id": pa.array([p for p, _ in sql_redirects], pa.int64()),
                                "target": pa.array([t for _, t in sql_redirects], pa.string())}),
        qids=pa.table({"page_id": pa.array([p for p, _ in qids], pa.int64()),
                       "qid": pa.array([q for _, q in qids], pa.string())}))


def loaded(build, directory: Path) -> TitleMap:
    write_title_map(str(directory), build.trie, build.arrays, build.dropped)
    return TitleMap.load(str(directory))


def rows(table: pa.Table) -> list[tuple]:
    return sorted(zip(*(table.column(name).to_pylist() for name in table.column_names), strict=True))


def test_jump_follows_each_key_2_to_the_rounds_hops():
    successor = np.array([1, 2, 3, 4, 4, 5])  # 0 -> 1 -> 2 -> 3 -> 4 (4 and 5 are no redirects)
    assert jump(successor, rounds=1).tolist() == [2, 3, 4, 4, 4, 5]
    assert jump(successor, rounds=2).tolist() == [4, 4, 4, 4, 4, 5]


def test_chains_are_followed_and_cycles_dropped(tmp_path: Path):
    pairs = [("A", "B"), ("B", "C"), ("C", "D"), ("D", "Article"), ("Loop1", "Loop2"), ("Loop2", "Loop1"),
             ("Self", "Self"), ("IntoLoop", "Loop1"), ("Red", "Missing"), ("Dup", "Article"), ("Dup", "Zeta")]
    build = build_title_map(records([("Article", 1), ("Zeta", 2)], pairs))
    assert rows(build.redirects) == sorted([("A", "Article"), ("B", "Article"), ("C", "Article"),
                                            ("D", "Article"), ("Red", "Missing"), ("Dup", "Article")])
    assert [title for title, _ in build.cycles] == ["IntoLoop", "Loop1", "Loop2", "Self"]
    assert build.duplicate_redirects == [("Dup", "Zeta", "another redirect page has this title")]  # not silent
    assert (build.counts.redirects_resolved, build.counts.redirects_to_missing_articles) == (6, 1)
    # ("Red", "Missing") is one of the rows written: the report lists it as processed, not as dropped by design
    assert COUNTERS["redirects_to_missing_articles"].kind == PROCESSED
    titles = loaded(build, tmp_path)
    assert titles.resolve("A") == titles.resolve("C") == Resolution("Article", True, False)
    assert titles.resolve("Red") == Resolution("Missing", True, True)
    assert titles.resolve("Article") == Resolution("Article", False, False)
    # A redirect in a cycle, and a title nobody names, are red links to themselves.
    assert titles.resolve("Loop1") == Resolution("Loop1", False, True)
    assert titles.resolve("Nowhere") == Resolution("Nowhere", False, True)


def test_a_chain_longer_than_the_jump_rounds_is_dropped():
    chain = [(f"R{i}", f"R{i + 1}") for i in range(10)] + [("R10", "End")]
    build = build_title_map(records([("End", 1)], chain), rounds=2)
    # 2 rounds follow 4 hops: R7..R10 reach End, R0..R6 are still on a redirect and counted as loops.
    assert sorted(build.redirects.column("title").to_pylist()) == ["R10", "R7", "R8", "R9"]
    assert sorted(title for title, _ in build.cycles) == [f"R{i}" for i in range(7)]


def test_an_article_wins_over_a_redirect_of_the_same_title(tmp_path: Path):
    """A stale SQL redirect row whose source is still an article (the table and the dump are of other dates) is
    dropped and named: links to the article stay on it, and so do links through a redirect to it (they went on
    along the stale row, to Venus)."""
    build = build_title_map(records([("Mercury", 1), ("Venus", 2)], [("Quicksilver", "Mercury")],
                                    pages=[(1, "Mercury"), (9, "Hesperus")],
                                    sql_redirects=[(1, "Venus"), (9, "Venus"), (7, "Venus")]))
    assert rows(build.redirects) == [("Hesperus", "Venus"), ("Quicksilver", "Mercury")]
    assert build.sql_redirects_from_articles == [("Mercury", "Venus")]
    assert (build.counts.sql_redirects, build.counts.sql_redirects_unknown_source) == (1, 1)
    titles = loaded(build, tmp_path)
    assert titles.resolve("Mercury").target == "Mercury"
    assert titles.resolve("Quicksilver").target == "Mercury"
    assert titles.resolve("Hesperus").target == "Venus"


def test_the_dumps_duplicate_redirect_pages_are_dropped_and_named(tmp_path: Path):
    """A redirect page with an article's title, and one of two redirect pages of a title, each said; a redirect the
    SQL table repeats or contradicts is no duplicate page (the dump's smallest target decides, as before)."""
    build = build_title_map(records([("Venus", 2), ("Mercury", 1)],
                                    [("Venus", "Mercury"), ("Gamma", "Venus"), ("Gamma", "Mercury"),
                                     ("Hesperus", "Venus")], pages=[(9, "Hesperus")], sql_redirects=[(9, "Mercury")]))
    assert sorted(build.duplicate_redirects) == [("Gamma", "Venus", "another redirect page has this title"),
                                                 ("Venus", "Mercury", "an article has this title")]
    assert rows(build.redirects) == [("Gamma", "Mercury"), ("Hesperus", "Mercury")]
    titles = loaded(build, tmp_path)
    assert titles.resolve("Venus") == Resolution("Venus", False, False)


def test_duplicate_pages_keep_the_smallest_title_of_an_id_then_the_smallest_id_of_a_title(tmp_path: Path):
    build = build_title_map(records([("B", 5), ("A", 5), ("A", 5), ("C", 9), ("C", 3)], []))
    assert rows(build.dropped) == [("A#5", "duplicate_page_ids"), ("B#5", "duplicate_page_ids"),
                                   ("C#9", "duplicate_titles")]
    titles = loaded(build, tmp_path)
    assert titles.dropped_as("A#5") == "duplicate_page_ids" and titles.dropped_as("C#3") is None
    # The title of a dropped duplicate id is no article: a link to it is red.
    assert titles.resolve("B").red and not titles.resolve("A").red


def test_qids_attach_to_the_kept_articles(tmp_path: Path):
    build = build_title_map(records([("Mercury", 1), ("Venus", 2)], [("Morning star", "Venus")],
                                    qids=[(1, "Q308"), (1, "Q9"), (44, "Q1")]))
    titles = loaded(build, tmp_path)
    assert (titles.qid("Mercury"), titles.qid("Venus"), titles.qid("Morning star")) == ("Q308", None, None)


def test_sql_redirect_sources_are_their_page_ids_smallest_title(tmp_path: Path):
    build = build_title_map(records([("Venus", 2)], [], pages=[(9, "Vesper"), (9, "Hesperus"), (7, "Lucifer"),
                                                                (9, "Hesperus")],
                                    sql_redirects=[(7, "Venus"), (5, "Venus"), (9, "Venus"), (7, "Venus")]))
    assert rows(build.redirects) == [("Hesperus", "Venus"), ("Lucifer", "Venus")]
    assert (build.counts.sql_redirects, build.counts.sql_redirects_unknown_source) == (3, 1)


# Run in a process of its own: Arrow keeps what it freed for the next call, which would hide a second one's growth.
PEAK_GROWTH = """
import sys
from pathlib import Path
import numpy as np
import pyarrow as pa
from transforms.parse.redirects import smallest_by_page_id

def status(field):
    return int(Path("/proc/self/status").read_text().split(field + ":")[1].split()[0])

count = 1_000_000
ids = np.r_[np.arange(count // 2), np.arange(count // 2)[::-1]]
pages = pa.table({"page_id": ids, "title": [f"Title {i:08d} {j % 2}" for j, i in enumerate(ids.tolist())]})
wanted = pa.chunked_array([np.r_[np.arange(0, count, 2), -1]])
Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from the RSS now
before = status("VmRSS")
titles = smallest_by_page_id(pages, "title", wanted).to_pylist()
print((status("VmHWM") - before) / 1024, titles[:2], titles[count // 4], titles[-1])
"""


def test_the_smallest_title_of_each_page_id_is_found_in_numbers_not_in_a_hash_aggregation():
    """Arrow's group_by(page_id).min(title) and join held ~170 bytes a row: with --redirects-sql and --page-sql the
    title map's one worker took ~6 GB more for English Wikipedia's ~38M page records than the ~4 GB the README
    gives it. Sorted in numpy, ~35 bytes a row."""
    result = subprocess.run([sys.executable, "-c", PEAK_GROWTH], capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    growth, titles = result.stdout.split(" ", 1)
    assert titles.strip() == "['Title 00000000 0', 'Title 00000002 0'] None None"  # ids past the pages': none
    assert float(growth) < 80, growth  # MB for a million page rows: ~170 before


def test_links_are_resolved_in_order_and_counted(tmp_path: Path):
    titles = loaded(build_title_map(records([("Article", 1)], [("A", "Article"), ("R", "Gone")])), tmp_path)
    links = [{"start": 0, "end": 1, "target": "A", "trail": 0}, {"start": 2, "end": 3, "target": "Article", "trail": 0},
             {"start": 4, "end": 5, "target": "Nope", "trail": 1}, {"start": 6, "end": 7, "target": "R", "trail": 0}]
    resolved, via, red = resolve_links(links, titles)
    assert [link["target"] for link in resolved] == ["Article", "Article", "Nope", "Gone"]
    assert [(link["start"], link["trail"]) for link in resolved] == [(0, 0), (2, 0), (4, 1), (6, 0)]
    assert (via, red) == (2, 2)


def test_a_duplicate_page_is_dead_lettered_not_written(tmp_path: Path):
    titles = loaded(build_title_map(records([("T", 1), ("T", 2)], [])), tmp_path)
    raw = {"page_id": 2, "title": "T", "text": "t", "links": [], "qid": None, "position": "T#2"}
    [letter] = list(final_article(raw, titles))
    assert letter.value["kind"] == "duplicate_titles" and letter.value["page_id"] == 2
    [row] = list(final_article({**raw, "page_id": 1, "position": "T#1"}, titles))
    assert row == {"page_id": 1, "title": "T", "text": "t", "links": [], "qid": None}


def test_a_remote_title_map_is_read_through_copies_that_are_removed(tmp_path: Path, monkeypatch):
    build = build_title_map(records([("Article", 1)], [("A", "Article")]))
    write_title_map(mirrored(tmp_path / "map"), build.trie, build.arrays, build.dropped)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    titles = TitleMap.load(mirrored(tmp_path / "map"))
    assert titles.resolve("A").target == "Article" and len(titles) == 2
    assert list(scratch.iterdir()) == []  # each copy removed once mapped


def test_positions_are_read_only_for_pages_sharing_an_id_and_break_ties_in_dump_order():
    positions = pa.array(["p#9", "p#1", "p#10", "p#2", "p#3"], pa.string())
    asked: list[int] = []

    def positions_of(indices) -> pa.Array:
        asked.extend(int(index) for index in indices)
        return positions.take(pa.array(indices, pa.int64()))

    empty = records([], [])
    build = build_title_map(TitleRecords(
        articles=pa.table({"title": ["A", "B", "A", "C", "D"], "page_id": pa.array([1, 2, 1, 2, 3], pa.int64())}),
        positions_of=positions_of, redirects=empty.redirects, pages=empty.pages,
        sql_redirects=empty.sql_redirects, qids=empty.qids))
    # of the two copies of (1, "A") the first in the dump ("p#9" before "p#10") is kept
    assert rows(build.dropped) == [("p#10", "duplicate_page_ids"), ("p#2", "duplicate_page_ids")]
    assert set(asked) == {0, 1, 2, 3}  # never the page that shares nothing


def test_dump_order_compares_numbers_as_numbers_in_either_layout():
    whole = ["d.xml.bz2#10", "d.xml.bz2#9", "d.xml.bz2#100"]
    streams = ["m.xml.bz2@1624#0", "m.xml.bz2@998#12", "m.xml.bz2@1624#10", "m.xml.bz2@1624#2"]
    parts = ["a-articles10.xml-p9p20.bz2#0", "a-articles2.xml-p3p8.bz2#5", "a-articles1.xml-p1p2.bz2#7"]
    assert sorted(whole, key=dump_order) == ["d.xml.bz2#9", "d.xml.bz2#10", "d.xml.bz2#100"]
    assert sorted(streams, key=dump_order) == ["m.xml.bz2@998#12", "m.xml.bz2@1624#0", "m.xml.bz2@1624#2",
                                               "m.xml.bz2@1624#10"]
    assert sorted(parts, key=dump_order) == ["a-articles1.xml-p1p2.bz2#7", "a-articles2.xml-p3p8.bz2#5",
                                             "a-articles10.xml-p9p20.bz2#0"]
