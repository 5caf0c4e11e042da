"""The entity linker runtime on a hand-built linker: trie-id stability, matching rules, thresholds, load errors,
loading from a remote store."""

from __future__ import annotations

import os
import random

import marisa_trie
import numpy as np
import pytest

from artifacts import linker as linker_module
from artifacts.errors import InputError
from artifacts.linker import EntityLinker, NameRow, build_kb_trie, write_linker
from tests.builders import mirrored

KEYS = ["Q90", "Q60", "New York (state)", "Q1384", "York", "Q42"]
CONFIG = {"max_mention_length": 100, "case_sensitive": False, "min_link_prob": 0.05, "min_prior_prob": 0.3,
          "min_link_count": 1}


def test_kb_trie_ids_depend_only_on_the_key_set():
    """entity_id = kb_id.trie key id + 1 everywhere, so the ids must not depend on insertion order or process."""
    expected = {key: build_kb_trie(KEYS)[key] for key in KEYS}
    assert sorted(expected.values()) == list(range(len(KEYS)))
    for seed in range(20):
        shuffled = KEYS[:]
        random.Random(seed).shuffle(shuffled)
        trie = build_kb_trie(shuffled)
        assert {key: trie[key] for key in KEYS} == expected
        assert {key: marisa_trie.Trie().frombytes(trie.tobytes())[key] for key in KEYS} == expected


@pytest.fixture()
def linker_dir(tmp_path):
    kb = build_kb_trie(KEYS)
    titles = [""] * len(KEYS)
    for key, title in zip(KEYS, ["Paris", "New York City", "New York (state)", "Lower Manhattan", "York",
                                 "Douglas Adams"], strict=True):
        titles[kb[key]] = title

    def eid(key: str) -> int:
        return kb[key] + 1

    rows = [
        NameRow("new york", eid("Q60"), 6, 10, 20),               # link_prob 0.5; commonness 0.6
        NameRow("new york", eid("New York (state)"), 4, 10, 20),  # commonness 0.4
        NameRow("new york city", eid("Q60"), 5, 5, 5),
        NameRow("york", eid("York"), 3, 3, 100),                  # link_prob 0.03: below the 0.05 default
        NameRow("paris", eid("Q90"), 9, 9, 9),
        NameRow("adams", eid("Q42"), 1, 1, 4),
    ]
    write_linker(str(tmp_path), rows, kb, titles, CONFIG)
    return tmp_path


def test_files_are_in_the_kpr_layout(linker_dir):
    data = np.load(linker_dir / "data.npy")
    offsets = np.load(linker_dir / "offsets.npy")
    names = marisa_trie.Trie().load(str(linker_dir / "name.trie"))
    assert data.dtype == np.uint32 and offsets.dtype == np.uint32 and data.shape == (6, 4)
    assert len(offsets) == len(names) + 1 == 6 and offsets[-1] == 6
    rows = data[offsets[names["new york"]]:offsets[names["new york"] + 1]]
    kb = marisa_trie.Trie().load(str(linker_dir / "kb_id.trie"))
    assert rows.tolist() == [[kb["Q60"], 6, 10, 20], [kb["New York (state)"], 4, 10, 20]]


def test_longest_name_at_token_starts_without_overlaps(linker_dir):
    linker = EntityLinker.load(str(linker_dir))
    text = "From New York City to PARIS, not Parisian; Adams."
    found = linker.detect(text)
    assert [(m.start, m.end, m.name) for m in found] == [(5, 18, "New York City"), (22, 27, "PARIS"),
                                                         (43, 48, "Adams")]
    assert [c.title for c in found[0].candidates] == ["New York City"]
    two = linker.detect("new york")[0].candidates
    assert [(c.title, c.key, c.link_count) for c in two] == [("New York City", "Q60", 6),
                                                               ("New York (state)", "New York (state)", 4)]
    assert (two[0].link_prob, two[0].commonness, two[1].commonness) == (0.5, 0.6, 0.4)
    assert linker.detect("York and york") == []  # its link_prob 0.03 is below the build's 0.05
    assert linker.detect("") == []
    assert linker.detect_batch(["Paris", "nothing here"]) == [linker.detect("Paris"), []]


def test_thresholds_at_load_time(linker_dir):
    assert [m.name for m in EntityLinker.load(str(linker_dir), min_link_prob=0.0).detect("York")] == ["York"]
    strict = EntityLinker.load(str(linker_dir), min_commonness=0.5, min_link_count=2)
    assert [c.title for c in strict.detect("new york")[0].candidates] == ["New York City"]
    assert strict.detect("Adams") == []  # one link only


def reference_detect(directory, text: str, min_link_prob: float, min_prior_prob: float,
                     min_link_count: int) -> list[tuple[int, int, list[str]]]:
    """(start, end, kb ids) of kembed's ``DictionaryEntityLinker.detect_mentions`` on our linker files, by its
    rules: at each token start not yet covered, the names that are prefixes there, longest first; the first that
    ends on a token end takes the span, and only its candidates that pass the thresholds are mentions."""
    import spacy

    names = marisa_trie.Trie().load(str(directory / "name.trie"))
    kb_ids = marisa_trie.Trie().load(str(directory / "kb_id.trie"))
    data, offsets = np.load(directory / "data.npy"), np.load(directory / "offsets.npy")
    tokens = spacy.blank("en").tokenizer(text)
    ends = {token.idx + len(token) for token in tokens}
    lowered, found, covered = text.lower(), [], 0
    for token in tokens:
        if token.idx < covered:
            continue
        for name in sorted(names.prefixes(lowered[token.idx:token.idx + CONFIG["max_mention_length"]]), key=len,
                           reverse=True):
            end = token.idx + len(name)
            if end not in ends:
                continue
            rows = data[offsets[names[name]]:offsets[names[name] + 1]]
            passing = [kb_ids.restore_key(int(kb)) for kb, links, total, docs in rows
                       if min(1.0, total / docs) >= min_link_prob and min(1.0, links / total) >= min_prior_prob
                       and links >= min_link_count]
            if passing:
                found.append((token.idx, end, passing))
            covered = end
            break
    return found


def spans(mentions) -> list[tuple[int, int, list[str]]]:
    return [(m.start, m.end, [c.key for c in sorted(m.candidates, key=lambda c: c.entity_id)]) for m in mentions]


def test_a_shorter_name_matches_where_the_longest_fails_unless_the_longest_blocks(linker_dir):
    """"new york city" has 5 links, "new york" -> Q60 has 6: with min_link_count 6 the longest name fails."""
    text = "New York City and new york."
    ours = EntityLinker.load(str(linker_dir), min_link_count=6)
    assert spans(ours.detect(text)) == [(0, 8, ["Q60"]), (18, 26, ["Q60"])]
    blocking = EntityLinker.load(str(linker_dir), min_link_count=6, longest_name_blocks=True)
    assert spans(blocking.detect(text)) == [(18, 26, ["Q60"])]  # "New York City" takes its span, no mention


def test_the_rules_find_different_names_after_a_failing_longest_name(tmp_path):
    """Neither rule finds a superset of the other: a shorter match lets a later name start inside the span
    that the longest name takes under the reference's rule."""
    keys = ["New York City", "New York", "City Hall", "Hall"]
    kb = build_kb_trie(keys)
    titles = [""] * len(keys)
    for key in keys:
        titles[kb[key]] = key
    write_linker(str(tmp_path), [NameRow("new york city", kb["New York City"] + 1, 1, 1, 1),
                                 *(NameRow(key.lower(), kb[key] + 1, 2, 2, 2) for key in keys[1:])], kb, titles, CONFIG)
    text = "New York City Hall"
    assert spans(EntityLinker.load(str(tmp_path), min_link_count=2).detect(text)) == [
        (0, 8, ["New York"]), (9, 18, ["City Hall"])]
    assert spans(EntityLinker.load(str(tmp_path), min_link_count=2, longest_name_blocks=True).detect(text)) == [
        (14, 18, ["Hall"])] == reference_detect(tmp_path, text, 0.05, 0.3, 2)


@pytest.mark.parametrize("thresholds", [(0.05, 0.3, 1), (0.05, 0.3, 6), (0.0, 0.5, 1), (0.6, 0.0, 1), (0.0, 0.0, 0)])
def test_longest_name_blocks_links_as_the_reference_does(linker_dir, thresholds):
    texts = ["From New York City to PARIS, not Parisian; Adams.", "New York City and new york.", "York, new york city",
             "new york new york city york"]
    min_link_prob, min_commonness, min_link_count = thresholds
    linker = EntityLinker.load(str(linker_dir), min_link_prob, min_commonness, min_link_count, longest_name_blocks=True)
    for text in texts:
        expected = reference_detect(linker_dir, text, min_link_prob, min_commonness, min_link_count)
        assert spans(linker.detect(text)) == [(start, end, sorted(keys, key=lambda key: linker.kb_keys[key]))
                                              for start, end, keys in expected], text


def test_a_remote_linker_links_from_mappings_of_copies_already_removed(linker_dir, system_temp):
    text = "From New York City to PARIS, not Parisian; Adams. And new york."
    remote = EntityLinker.load(mirrored(linker_dir))
    assert os.listdir(system_temp) == []  # the copies are gone; every file stays mapped
    found = remote.detect(text)
    assert found == EntityLinker.load(str(linker_dir)).detect(text)
    assert [c.title for m in found for c in m.candidates] == ["New York City", "Paris", "Douglas Adams",
                                                              "New York City", "New York (state)"]


def test_incomplete_linker_is_an_input_error(linker_dir):
    (linker_dir / "data.npy").unlink()
    with pytest.raises(InputError, match=r"missing data\.npy"):
        EntityLinker.load(str(linker_dir))


def test_candidate_cache_is_bounded(tmp_path, monkeypatch):
    names = ["paris", "london", "rome", "berlin", "madrid"]
    kb = build_kb_trie([name.title() for name in names])
    titles = [""] * len(names)
    for name in names:
        titles[kb[name.title()]] = name.title()
    write_linker(str(tmp_path), [NameRow(name, kb[name.title()] + 1, 2, 2, 4) for name in names], kb, titles, CONFIG)
    monkeypatch.setattr(linker_module, "CANDIDATE_CACHE_SIZE", 2)
    linker = EntityLinker.load(str(tmp_path))
    first = [linker.detect(name.upper()) for name in names]
    assert len(linker._candidates_cache) <= 2
    assert [linker.detect(name.upper()) for name in names] == first
    assert [[c.title for c in mentions[0].candidates] for mentions in first] == [[name.title()] for name in names]


def test_a_name_with_a_dotted_capital_i_is_also_found_as_the_reference_lowers_it(tmp_path):
    """fold_case keeps "İ" (offsets stay); the KPR reference looks names up in ``text.lower()``, where it is "i̇": the
    name is stored under both spellings, with the same candidates, unless the second is a name already."""
    kb = build_kb_trie(["Q1", "Q2", "Q3"])
    titles = [""] * 3
    for key, title in (("Q1", "İzmir"), ("Q2", "İstanbul"), ("Q3", "Ankara")):
        titles[kb[key]] = title
    rows = [NameRow("İzmir", kb["Q1"] + 1, 5, 5, 5), NameRow("İstanbul", kb["Q2"] + 1, 4, 4, 4),
            NameRow("i̇stanbul", kb["Q3"] + 1, 1, 1, 1), NameRow("ankara", kb["Q3"] + 1, 3, 3, 3)]
    write_linker(str(tmp_path), rows, kb, titles, CONFIG)
    linker = EntityLinker(str(tmp_path))
    assert sorted(linker.names.keys()) == sorted(["İzmir", "i̇zmir", "İstanbul", "i̇stanbul", "ankara"])
    assert [candidate.key for candidate in linker.candidates("İzmir".lower())] == ["Q1"]
    assert [candidate.key for candidate in linker.candidates("İzmir")] == ["Q1"]
    assert [candidate.key for candidate in linker.candidates("İstanbul".lower())] == ["Q3"]  # the name's own
    text = "From İzmir to Ankara."
    assert [(mention.start, mention.end, mention.name) for mention in linker.detect(text)] == [
        (5, 10, "İzmir"), (14, 20, "Ankara")]


def test_candidates_of_a_name_as_written_are_those_detect_finds(linker_dir):
    """``candidates`` looked the name up as given: "New York" (a mention's name as written) had none."""
    linker = EntityLinker.load(str(linker_dir))
    assert linker.candidates("New York") == linker.candidates("new york") == linker.detect("New York")[0].candidates
    assert [candidate.title for candidate in linker.candidates("NEW YORK")] == ["New York City", "New York (state)"]


def truncate(path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


DAMAGES = {
    "data.npy cut": (lambda d: truncate(d / "data.npy", 140), "the arrays cannot be read"),
    "garbage name.trie": (lambda d: (d / "name.trie").write_bytes(b"not a trie"), "the tries cannot be read"),
    "empty config.json": (lambda d: (d / "config.json").write_text(""), "config.json cannot be read"),
    "config.json without a key": (lambda d: (d / "config.json").write_text('{"case_sensitive": false}'),
                                  "config.json is damaged (no min_link_prob)"),
    "titles.bin cut": (lambda d: truncate(d / "titles.bin", 10),
                       "title_offsets.npy does not fit kb_id.trie and titles.bin"),
    "another offsets.npy": (lambda d: np.save(d / "offsets.npy", np.array([0, 1, 2], np.uint32)),
                            "offsets.npy does not fit name.trie and data.npy"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_linker_is_one_input_error_naming_it(linker_dir, damage):
    """Each was a raw exception of its library (mmap length, MARISA_FORMAT_ERROR, JSONDecodeError, KeyError, an
    IndexError at the first detect), and a cut titles.bin loaded and gave every candidate an empty title."""
    change, expected = DAMAGES[damage]
    change(linker_dir)
    with pytest.raises(InputError) as raised:
        EntityLinker.load(str(linker_dir))
    assert expected in raised.value.message and raised.value.message.endswith(
        "restore it from a copy of the run, or rerun the dictionary stage")


@pytest.mark.parametrize(("given", "expected"), [
    ({"min_commonness": "0.5"}, "min_commonness='0.5': give a probability, from 0 to 1"),
    ({"min_link_prob": float("nan")}, "min_link_prob=nan: give a probability, from 0 to 1"),
    ({"min_commonness": 2.0}, "min_commonness=2.0: give a probability, from 0 to 1"),
    ({"min_link_count": -1}, "min_link_count=-1: give a whole number of at least 0"),
    ({"min_link_count": 1.5}, "min_link_count=1.5: give a whole number of at least 0")])
def test_thresholds_that_are_no_probability_or_count_are_refused_at_load(linker_dir, given, expected):
    """A string failed at the first detect with numpy's UFuncTypeError; nan or 2.0 loaded and linked nothing."""
    with pytest.raises(InputError) as raised:
        EntityLinker.load(str(linker_dir), **given)
    assert raised.value.message == expected


def test_a_text_with_a_lone_surrogate_is_a_value_error(linker_dir):
    """spaCy's UnicodeEncodeError from deep inside its string store."""
    with pytest.raises(ValueError, match=r"^a text with a lone surrogate \('\\ud800' at 5\) cannot be linked"):
        EntityLinker.load(str(linker_dir)).detect("Paris\ud800 New York")
    with pytest.raises(ValueError, match=r"^a text with a lone surrogate \('\\udc80' at 10\) cannot be linked"):
        EntityLinker.load(str(linker_dir)).detect("Paris New \udc80York")  # spaCy counts from the piece's start
