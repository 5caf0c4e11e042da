"""The dictionary stage and the entity linker: hand-made articles, the kwnlp golden counts, the gensim sample."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import marisa_trie
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from artifacts import tables
from artifacts.errors import InputError
from artifacts.linker import LINKER_FILES, EntityLinker
from artifacts.names import NameRules, find_names, fold_case, title_name, token_bounds
from artifacts.run import manifest
from artifacts.trie_map import build_trie_map
from pipelines.dictionary import checked_language
from pipelines.launcher.cli import main
from tests.builders import article, write_parsed
from tests.conftest import DIRECT, MINI, MULTI_PROCESS, PASSAGES, REPO, copy_stages
from transforms.dictionary import graph as dictionary
from transforms.dictionary.graph import DictionaryConfig
from transforms.dictionary.links import anchor_names
from transforms.dictionary.tables import (
    DOC_COUNTS,
    NAME_CANDIDATES,
    PAIRS,
    TARGETS,
    docs_of,
    entity_candidates,
    entity_table,
    name_candidates,
    score_names,
)

RULES = NameRules()


PLANETS = [
    article(1, "Mercury (planet)", "Mercury is a planet.\nMercury orbits the Sun.", [("Sun", "Sun")], "Q308"),
    article(2, "Mercury (element)", "Mercury is an element. See Mercury the planet.",
            [("Mercury", "Mercury (planet)")]),
    article(3, "Sun", "The Sun is a star.\nMercury is close to it. Mercury too.",
            [("Mercury", "Mercury (planet)"), ("Mercury", "Mercury (element)")], "Q525"),
]


def test_title_names_and_case_folding():
    assert title_name("Mercury (planet)") == "Mercury"
    assert title_name("Mercury") == "Mercury"
    # the trailing parenthetical with its parentheses balanced, as the KPR reference strips " (...)" to the end
    assert (title_name("Foo (bar (baz))"), title_name("A (b) c (d)"), title_name("Foo (a) b)")) == (
        "Foo", "A (b) c", "Foo (a) b)")
    assert (title_name("(planet)"), title_name("Foo(bar)"), title_name("Foo  (bar)")) == ("(planet)", "Foo(bar)", "Foo")
    assert fold_case("İstanbul Straße") == "İstanbul straße"  # length kept: offsets stay valid
    # beside an "İ" each word is still lowered as a name is: ΟΔΟΣ ends in a final sigma
    assert fold_case("İzmir ΟΔΟΣ ΟΔΟΣΙ") == "İzmir οδος οδοσι" and fold_case("ΟΔΟΣ") == "οδος"


def test_anchor_names_count_titles_and_skip_bad_names():
    row = article(7, "Foo (bar)", "Go to Baz now", [("Baz", "Baz")])
    row["links"].append({"start": 0, "end": 0, "target": "Empty"})
    pairs = list(anchor_names(row, RULES, row["links"]))
    assert [pair for pair in pairs if isinstance(pair, tuple)] == [("baz", "Baz"), ("foo", "Foo (bar)")]
    dead = [pair for pair in pairs if not isinstance(pair, tuple)]
    assert len(dead) == 1 and dead[0].value["kind"] == "empty_names"


def scored(candidates: list[tuple[str, int, int]], docs: list[int], config: DictionaryConfig,
           other_links: dict[str, int] | None = None):
    """score_names of (name, entity_id, link_count) rows; ``other_links``: a name's anchors to no entity."""
    totals = Counter(other_links or {})
    for name, _, link_count in candidates:
        totals[name] += link_count
    table = pa.Table.from_pylist([dict(zip(NAME_CANDIDATES.names, (*row, totals[row[0]]), strict=True))
                                  for row in candidates], schema=NAME_CANDIDATES)
    rows, drops = score_names(table, np.array(docs), config.thresholds)
    return rows.to_pylist(), drops


def test_score_names_scores_and_filters():
    config = DictionaryConfig(min_link_prob=0.05, min_commonness=0.3, min_link_count=2)
    rows, drops = scored([("mercury", 2, 1), ("rare", 5, 1), ("mercury", 1, 3), ("venus", 3, 1), ("venus", 4, 9)],
                         [4, 100, 4, 0, 0], config)
    assert rows == [{"name": "mercury", "entity_id": 1, "link_count": 3, "total_link_count": 4, "doc_count": 4,
                     "link_prob": 1.0, "commonness": 0.75},
                    {"name": "venus", "entity_id": 4, "link_count": 9, "total_link_count": 10, "doc_count": 1,
                     "link_prob": 1.0, "commonness": 0.8999999761581421}]  # float32; no paragraph counts as one
    # "rare": 1 link in 100 paragraphs; mercury -> 2 and venus -> 3: a quarter and a tenth of their name's links
    assert (drops.names_below_min_link_prob, drops.pairs_below_min_commonness,
            drops.pairs_below_min_link_count) == (1, 2, 0)
    assert scored([("venus", 3, 1), ("venus", 4, 2)], [3, 3], config)[1].pairs_below_min_link_count == 1
    # links to no entity count in the name's total: commonness 3/8 and 2/8 (one pair kept, not both), link_prob 8/3
    rows, drops = scored([("venus", 3, 3), ("venus", 4, 2)], [3, 3], config, {"venus": 3})
    assert [(row["entity_id"], row["total_link_count"], row["commonness"]) for row in rows] == [(3, 8, 0.375)]
    assert drops.pairs_below_min_commonness == 1


def targets_table(pages: list[tuple[str, int, str | None]], links: dict[str, int]) -> pa.Table:
    rows = [{"title": title, "page_id": page_id, "qid": qid, "inbound": 0} for title, page_id, qid in pages]
    rows += [{"title": title, "page_id": None, "qid": None, "inbound": inbound} for title, inbound in links.items()]
    return pa.Table.from_pylist(rows, schema=TARGETS)


def test_entity_candidates_and_keys():
    """Pages without links are no entities; a title with two pages keeps the smaller page_id; red links count
    unless included; two articles with one QID keep the smaller title; entity_id = kb trie id + 1."""
    targets = targets_table([("Sun", 3, "Q525"), ("Sun", 2, None), ("Moon", 4, None), ("Sol", 5, "Q525"),
                             ("Luna", 6, "")], {"Sun": 2, "Sol": 1, "Luna": 1, "Nowhere": 3, "Void": 1})
    candidates, red = entity_candidates(targets, include_red_links=False)
    assert candidates.to_pylist() == [
        {"title": "Luna", "page_id": 6, "qid": "", "link_count": 1},
        {"title": "Sol", "page_id": 5, "qid": "Q525", "link_count": 1},
        {"title": "Sun", "page_id": 2, "qid": None, "link_count": 2}]
    assert (red.targets, red.links) == (2, 4)
    with_red, red = entity_candidates(targets, include_red_links=True)
    assert (with_red.num_rows, red.targets) == (5, 0)
    assert with_red.filter(pc.equal(with_red.column("title"), "Void")).to_pylist() == [
        {"title": "Void", "page_id": None, "qid": None, "link_count": 1}]
    duplicated = pa.concat_tables([candidates, pa.Table.from_pylist(
        [{"title": "Helios", "page_id": 9, "qid": "Q525", "link_count": 7}], schema=candidates.schema)])
    entities, left_out = entity_table(duplicated)
    kb = marisa_trie.Trie(["Luna", "Q525", "Sun"])
    # Helios and Sol share Q525: Helios, the smaller title, stays; Sol is left out, saying for which entity
    assert left_out.select(["title", "page_id", "key", "entity_title", "link_count"]).to_pylist() == [
        {"title": "Sol", "page_id": 5, "key": "Q525", "entity_title": "Helios", "link_count": 1}]
    assert sorted(entities.to_pylist(), key=lambda row: row["title"]) == [
        {"entity_id": kb["Q525"] + 1, "title": "Helios", "page_id": 9, "qid": "Q525", "link_count": 7},
        {"entity_id": kb["Luna"] + 1, "title": "Luna", "page_id": 6, "qid": "", "link_count": 1},
        {"entity_id": kb["Sun"] + 1, "title": "Sun", "page_id": 2, "qid": None, "link_count": 2}]


def test_name_candidates_attach_entity_ids_by_target():
    title_ids = build_trie_map(["Sun", "Moon"], np.array([7, 9], dtype=np.int32))
    pairs = pa.Table.from_pylist([{"name": "sun", "target": "Sun", "count": 4},
                                  {"name": "sun", "target": "Sunny", "count": 1},
                                  {"name": "moon", "target": "Moon", "count": 2}], schema=PAIRS)
    candidates, not_entities = name_candidates(pairs, title_ids)
    # the name's total counts its anchors to any target: "sun" -> Sunny (no entity: a red link) too
    assert candidates.to_pylist() == [{"name": "sun", "entity_id": 7, "link_count": 4, "total_link_count": 5},
                                      {"name": "moon", "entity_id": 9, "link_count": 2, "total_link_count": 2}]
    assert not_entities == 1
    assert docs_of(np.array([5, 1, 3]), pa.Table.from_pylist(
        [{"name_id": 3, "docs": 30}, {"name_id": 1, "docs": 10}], schema=DOC_COUNTS)).tolist() == [0, 10, 30]
    assert docs_of(np.array([5]), None).tolist() == [0]


def test_find_names_on_token_boundaries():
    trie = marisa_trie.Trie(["new york", "new york city", "york", "ne"])
    text = "in new york city, newer york"
    tokens = token_bounds([(match.start(), match.end()) for match in re.finditer(r"\w+|[^\w\s]", text)])
    longest = [(m.start, m.end, m.name) for m in find_names(text, tokens, trie.prefixes, 100, longest_only=True)]
    assert longest == [(3, 16, "new york city"), (24, 28, "york")]
    every = sorted(m.name for m in find_names(text, tokens, trie.prefixes, 100, longest_only=False))
    assert every == ["new york", "new york city", "york", "york"]


def run_dictionary(output: Path, *extra: str, beam: list[str] = DIRECT) -> manifest.StageRecord:
    assert main(["dictionary", "--output", str(output), *extra, *beam]) == 0
    return manifest.load(str(output))["dictionary"]


def test_stage_on_hand_made_articles(tmp_path):
    write_parsed(tmp_path, PLANETS)
    record = run_dictionary(tmp_path)
    entities = {row["title"]: row for row in tables.read_table(str(tmp_path), "entities").to_pylist()}
    assert {title: (row["qid"], row["page_id"], row["link_count"]) for title, row in entities.items()} == {
        "Mercury (planet)": ("Q308", 1, 2), "Mercury (element)": (None, 2, 1), "Sun": ("Q525", 3, 1)}
    keys = marisa_trie.Trie(["Q308", "Q525", "Mercury (element)"])
    assert {row["entity_id"] for row in entities.values()} == {1, 2, 3}
    assert entities["Sun"]["entity_id"] == keys["Q525"] + 1
    names = {(row["name"], row["entity_id"]): row
             for row in tables.read_table(str(tmp_path), "dictionary/names").to_pylist()}
    planet, element, sun = (entities[title]["entity_id"] for title in ("Mercury (planet)", "Mercury (element)", "Sun"))
    # "mercury": 2 anchors + the planet's title -> planet (3); 1 anchor + the element's title -> element (2).
    # Paragraphs with the token "mercury": 2 in article 1, 1 in article 2, 1 in article 3 -> 4.
    assert names[("mercury", planet)] | {} == {"name": "mercury", "entity_id": planet, "link_count": 3,
                                              "total_link_count": 5, "doc_count": 4, "link_prob": 1.0,
                                              "commonness": pytest.approx(0.6)}
    assert names[("mercury", element)]["commonness"] == pytest.approx(0.4)
    # "sun": 1 anchor + the title; paragraphs with "sun": article 1's second, article 3's first.
    assert (names[("sun", sun)]["link_count"], names[("sun", sun)]["doc_count"]) == (2, 2)
    assert record.counters.get("names_below_min_link_prob", 0) == 0

    linker = EntityLinker.load(str(tmp_path / "dictionary" / "linker"))
    mentions = linker.detect("Mercury and the Sun.")
    assert [(m.start, m.end, m.name) for m in mentions] == [(0, 7, "Mercury"), (16, 19, "Sun")]
    assert [(c.title, c.key, c.commonness) for c in mentions[0].candidates] == [
        ("Mercury (planet)", "Q308", pytest.approx(0.6)),
        ("Mercury (element)", "Mercury (element)", pytest.approx(0.4))]
    strict = EntityLinker.load(str(tmp_path / "dictionary" / "linker"), min_commonness=0.5)
    assert [c.title for c in strict.detect("Mercury")[0].candidates] == ["Mercury (planet)"]


def test_bold_self_links_are_no_anchors_nor_inbound_links(tmp_path):
    """parse --first-bold-as-link links each article's first bold to the article, for mentions to sample: the
    dictionary counted those as anchors and inbound links ("mercury" took one more link to each page that opens with
    it), where the paper's reference counts neither. Without the option a link to the page itself is a link."""
    bold = [article(1, "Mercury (planet)", "Mercury is a planet.\nMercury orbits the Sun.",
                    [("Mercury", "Mercury (planet)"), ("Sun", "Sun")], "Q308"),
            article(2, "Mercury (element)", "Mercury is an element. See Mercury the planet.",
                    [("Mercury", "Mercury (element)"), ("Mercury", "Mercury (planet)")]),
            PLANETS[2]]
    runs = {"plain": (PLANETS, {}), "bold": (bold, {"first_bold_as_link": True}), "self": (bold, {})}
    tables_of = {}
    for name, (articles, options) in runs.items():
        write_parsed(tmp_path / name, articles, options)
        record = run_dictionary(tmp_path / name)  # recorded: a run of an earlier version, which counted them, reruns
        assert record.options.get("bold_self_links") is (True if options else None)
        tables_of[name] = [tables.read_table(str(tmp_path / name), artifact).to_pylist()
                           for artifact in ("entities", "dictionary/names")]
    assert tables_of["bold"] == tables_of["plain"]
    link_counts = {row["title"]: row["link_count"] for row in tables_of["self"][0]}
    assert link_counts == {"Mercury (planet)": 3, "Mercury (element)": 2, "Sun": 1}


def test_an_article_left_out_for_another_ones_qid_is_dead_lettered(tmp_path):
    """Two articles with one QID: the smaller title is the entity, and the other, with the links to it, went
    without a word but a counter (its links counted among those to no entity)."""
    write_parsed(tmp_path, [*PLANETS, article(4, "The planet Mercury", "Another page of Q308.", [], "Q308"),
                            article(5, "Notes", "The planet Mercury, again The planet Mercury.",
                                    [("The planet Mercury", "The planet Mercury")] * 2)])
    record = run_dictionary(tmp_path)
    assert record.counters["duplicate_entity_keys"] == 1
    letters = [json.loads(line) for path in sorted((tmp_path / "errors" / "dictionary").rglob("*")) if path.is_file()
               for line in path.read_text().splitlines()]
    assert [(letter["kind"], letter["title"], letter["page_id"], letter["key"], letter["entity_title"],
             letter["links"]) for letter in letters] == [
        ("duplicate_entity_keys", "The planet Mercury", 4, "Q308", "Mercury (planet)", 2)]


def test_names_spelled_with_zero_width_joiners_are_kept_and_found(tmp_path):
    """Persian writes compounds with a zero-width non-joiner (U+200C) and emoji sequences join with U+200D: such a
    name is kept and linked; a zero-width space (U+200B) still makes a name bad."""
    zwnj, zwj, zwsp = "\u200c", "\u200d", "\u200b"
    languages, family = f"زبان{zwnj}های ایرانی", f"👨{zwj}👩{zwj}👧"
    write_parsed(tmp_path, [
        article(1, languages, f"{languages} و زبان فارسی", []),
        article(2, "Family", f"A {family} here and a bad{zwsp}name.",
                [(family, "Family"), (f"bad{zwsp}name", "Family")]),
        article(3, "Other", f"{languages} again.", [(languages, languages)]),
    ])
    record = run_dictionary(tmp_path, "--min-link-prob", "0")
    names = {row["name"] for row in tables.read_table(str(tmp_path), "dictionary/names").to_pylist()}
    assert {languages, family} <= names and f"bad{zwsp}name" not in names
    assert record.counters["names_with_control_characters"] == 1
    linker = EntityLinker.load(str(tmp_path / "dictionary" / "linker"))
    text = f"Of {languages} and {family}."
    assert [(text[m.start:m.end], m.candidates[0].title) for m in linker.detect(text)] == [
        (languages, languages), (family, "Family")]


ELISIONS = [  # Italian writes an article or preposition elided onto its word: l'Argento, dell'Argento
    article(1, "Argento", "L'Argento è un metallo.\nIl simbolo dell'Argento è Ag.", []),
    article(2, "Metallo", "Un metallo come l'Argento.\nL'Argento conduce.\nArgento e oro.",
            [("Argento", "Argento"), ("Argento", "Argento")]),
]


def test_language_finds_names_on_its_token_boundaries(tmp_path):
    """English token boundaries keep an elision one token with its word: "argento" was counted in one paragraph
    of five; with --language it in all five, recorded in the options (English: not, as before the option) and in
    the linker, which finds it after an elision."""
    english, italian = tmp_path / "en", tmp_path / "it"
    for output in (english, italian):
        write_parsed(output, ELISIONS)
    records = run_dictionary(english), run_dictionary(italian, "--language", "it")
    doc_counts = [{row["name"]: row["doc_count"] for row in tables.read_table(str(output), "dictionary/names")
                   .to_pylist()} for output in (english, italian)]
    assert (doc_counts[0]["argento"], doc_counts[1]["argento"]) == (1, 5)
    assert "language" not in records[0].options and records[1].options["language"] == "it"
    linkers = [EntityLinker.load(str(output / "dictionary" / "linker")) for output in (english, italian)]
    assert [linker.rules.language for linker in linkers] == ["en", "it"]
    assert [json.loads((output / "dictionary" / "linker" / "config.json").read_text()).get("language")
            for output in (english, italian)] == [None, "it"]  # an English linker: the file of before the option
    text = "Il prezzo dell'Argento."
    assert [[text[m.start:m.end] for m in linker.detect(text)] for linker in linkers] == [[], ["Argento"]]
    # another spelling of a code is spaCy's own code: the same tokenizer, the same record (nothing runs again)
    assert run_dictionary(english, "--language", "eng").finished_at == records[0].finished_at
    assert run_dictionary(italian, "--language", "ita").finished_at == records[1].finished_at
    assert checked_language("no") == "nb"  # a Wikipedia's code (nowiki) that spaCy knows by another


def test_a_linker_of_an_unknown_or_earlier_language_setting(tmp_path):
    """A linker written before --language (no key) tokenizes English; one whose language spaCy cannot tokenize
    here is one InputError at its first detect."""
    write_parsed(tmp_path, ELISIONS)
    run_dictionary(tmp_path, "--language", "it")
    config_path = tmp_path / "dictionary" / "linker" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({key: value for key, value in config.items() if key != "language"}))
    earlier = EntityLinker.load(str(config_path.parent))
    assert earlier.rules.language == "en" and earlier.detect("dell'Argento") == []
    config_path.write_text(json.dumps({**config, "language": "qq"}))
    with pytest.raises(InputError) as raised:
        EntityLinker.load(str(config_path.parent)).detect("Argento")
    assert raised.value.message.startswith("the linker was built with --language qq: spaCy makes no tokenizer of the "
                                           "language 'qq' here (")


def test_a_language_spacy_cannot_tokenize_is_refused_before_any_work(tmp_path, capsys):
    write_parsed(tmp_path, ELISIONS)
    assert main(["dictionary", "--output", str(tmp_path), "--language", "qq", *DIRECT]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: --language qq: spaCy makes no tokenizer of the language 'qq' here (") \
        and error.count("\n") == 1
    assert "dictionary" not in manifest.load(str(tmp_path)) and not (tmp_path / "dictionary").exists()


@pytest.mark.parametrize("extra", [[], ["--min-link-count", "1000000"]], ids=["no-links", "none-kept"])
def test_a_dictionary_where_no_name_is_kept_is_written_empty(tmp_path, extra):
    """Articles that no link joins, or thresholds that keep no name: an empty dictionary and a linker that finds
    nothing (run in a process of its own: it used to die of a segmentation fault, exit 139, without a word)."""
    unlinked = [article(1, "Paris", "Paris is a city.", []), article(2, "Seine", "The Seine is a river.", [])]
    write_parsed(tmp_path, unlinked if not extra else PLANETS)
    result = subprocess.run([sys.executable, "run_pipeline.py", "dictionary", "--output", str(tmp_path), *extra,
                             "--progress-interval", "0", *DIRECT], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert tables.read_table(str(tmp_path), "dictionary/names").num_rows == 0
    assert EntityLinker.load(str(tmp_path / "dictionary" / "linker")).detect("Paris and the Seine.") == []


def test_missing_articles_say_which_stage_to_run(tmp_path, capsys):
    assert main(["dictionary", "--output", str(tmp_path), *DIRECT]) == 2
    assert "run `python run_pipeline.py parse" in capsys.readouterr().err


@pytest.mark.usefixtures("shared_data")
@pytest.mark.parametrize("redirect_tables", [False, True], ids=["dump-only", "with-redirect-and-page-sql"])
def test_kwnlp_golden_anchor_target_counts(tmp_path, redirect_tables):
    """Our link counts equal kwnlp's anchor-target-counts.csv for the enwiki-20210701 mini set.

    Rules aligned: case-sensitive names and no filters (kwnlp counts raw anchors); kwnlp counts only links,
    while our link_count also counts each article's title (minus " (...)") once, which we subtract here;
    kwnlp keeps only targets among the dump's 10 articles, as our entities do without --include-red-links.
    kwnlp resolves redirects through the SQL redirect table; on this set our counts equal the golden ones
    both with that table (and the page table naming its sources) and without it.
    """
    raw = MINI / "inputs" / "wikipedia-raw-20210701"
    tables_sql = {flag: str(next((raw / folder).glob("*.sql.gz"))) for flag, folder in (
        ("--page-props-sql", "pagepropstable"), ("--redirects-sql", "redirecttable"), ("--page-sql", "pagetable"))}
    if not redirect_tables:
        tables_sql = {"--page-props-sql": tables_sql["--page-props-sql"]}
    argv = ["parse", "--output", str(tmp_path), "--dump", *map(str, sorted((raw / "articlesdump").glob("*.bz2"))),
            *(part for pair in tables_sql.items() for part in pair), *DIRECT]
    assert main(argv) == 0
    run_dictionary(tmp_path, "--case-sensitive", "--min-link-prob", "0", "--min-commonness", "0")
    entities = {row["entity_id"]: row for row in tables.read_table(str(tmp_path), "entities").to_pylist()}
    ours = {}
    for row in tables.read_table(str(tmp_path), "dictionary/names").to_pylist():
        entity = entities[row["entity_id"]]
        links_only = row["link_count"] - (row["name"] == title_name(entity["title"]))
        if links_only:
            ours[(row["name"], entity["page_id"])] = links_only
    golden_file = next((MINI / "outputs" / "wikipedia-derived-20210701" / "anchor-target-counts").glob("*.csv"))
    with golden_file.open() as handle:
        golden = {(row["anchor_text"], int(row["target_page_id"])): int(row["count"]) for row in csv.DictReader(handle)}
    assert len(golden) == 13
    assert ours == golden


@pytest.fixture(scope="module")
def gensim_dictionary(tmp_path_factory, single_stream_sample) -> Path:
    output = tmp_path_factory.mktemp("gensim-dictionary")
    assert main(["parse", "--output", str(output), "--dump", str(single_stream_sample), *DIRECT]) == 0
    run_dictionary(output, "--include-red-links")
    return output


def test_gensim_hand_checked_names(gensim_dictionary):
    """link_count and doc_count of a few names, recounted here by plain regexes over the articles.

    (spaCy splits 'Pseudo-Aristotle' but not a word glued to a leading dash, '-Aristotle' or '—Aristotle'.)
    """
    articles = tables.read_table(str(gensim_dictionary), "articles").to_pylist()
    entities = {row["entity_id"]: row["title"]
                for row in tables.read_table(str(gensim_dictionary), "entities").to_pylist()}
    names = {(row["name"], entities[row["entity_id"]]): row
             for row in tables.read_table(str(gensim_dictionary), "dictionary/names").to_pylist()}
    for name, title in (("aristotle", "Aristotle"), ("plato", "Plato"), ("abraham lincoln", "Abraham Lincoln")):
        anchors = sum(1 for a in articles for link in a["links"]
                      if a["text"][link["start"]:link["end"]].lower() == name and link["target"] == title)
        titles = sum(1 for a in articles if title_name(a["title"]).lower() == name)
        docs = sum(1 for a in articles for paragraph in a["text"].split("\n")
                   if re.search(rf"(?<![\w—])(?<!(?<!\w)-){name}(?!\w)", paragraph.lower()))
        row = names[(name, title)]
        assert (row["link_count"], row["doc_count"]) == (anchors + titles, docs), name
        assert row["link_prob"] == pytest.approx(min(1.0, row["total_link_count"] / docs))


def test_same_rows_and_linker_with_two_worker_processes_and_more_buckets(gensim_dictionary, tmp_path, monkeypatch):
    """Neither the worker count nor the bucket count (4 for the sample by default; 64 here) changes a result."""
    monkeypatch.setattr(dictionary, "MIN_BUCKETS", 64)
    copy_stages(gensim_dictionary, tmp_path, ("parse",))
    run_dictionary(tmp_path, "--include-red-links", beam=MULTI_PROCESS)
    for name, key in (("entities", "entity_id"), ("dictionary/names", "name")):
        ours = sorted(tables.read_table(str(tmp_path), name).to_pylist(), key=lambda row: (row[key], str(row)))
        theirs = sorted(tables.read_table(str(gensim_dictionary), name).to_pylist(),
                        key=lambda row: (row[key], str(row)))
        assert ours == theirs
    for name in LINKER_FILES:
        linker = Path("dictionary", "linker", name)
        assert (tmp_path / linker).read_bytes() == (gensim_dictionary / linker).read_bytes(), name


@pytest.mark.usefixtures("shared_data")
def test_linker_on_real_passages(gensim_dictionary):
    linker = EntityLinker.load(str(gensim_dictionary / "dictionary" / "linker"))
    with (PASSAGES / "psgs_w100_subset_from_haystack_nqdev.tsv").open() as handle:
        texts = [row[1] for row in csv.reader(handle, delimiter="\t")][1:50]
    mentions = linker.detect_batch(texts)
    assert sum(map(len, mentions)) > 100
    for text, found in zip(texts, mentions, strict=True):
        previous = 0
        for mention in found:
            assert mention.start >= previous and text[mention.start:mention.end] == mention.name
            assert mention.candidates and all(c.commonness >= 0.3 and c.link_prob >= 0.05 for c in mention.candidates)
            previous = mention.end
