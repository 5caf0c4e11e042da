"""The pure parts of ``diff``: keyed set arithmetic, the top-candidate digest of names, the cosine bins."""

from __future__ import annotations

import numpy as np

from artifacts.run.diff.keyed import Change, Keyed, compare, key_hash, row_digest
from artifacts.run.diff.rows import NO_KEY, EntityRows, entity_key, entity_keys, top_candidates
from artifacts.run.diff.vectors import COSINE_BINS, cosine_bins, cosines


def keyed(rows: dict[int, str]) -> Keyed:
    return Keyed.of(list(rows), [row_digest([value]) for value in rows.values()])


def test_compare_counts_added_removed_changed() -> None:
    old = keyed({1: "a", 2: "b", 3: "c", 4: "d"})
    new = keyed({5: "e", 4: "d", 3: "C", 2: "b", 6: "f", 7: "g"})
    change = compare(old, new)
    assert change == Change(old=4, new=6, added=3, removed=1, changed=1)
    assert change.unchanged == 2
    assert compare(new, new) == Change(6, 6, 0, 0, 0)
    assert compare(keyed({}), new) == Change(0, 6, 6, 0, 0)


def test_row_digest_separates_fields() -> None:
    assert row_digest(["ab", "c"]) != row_digest(["a", "bc"])
    assert len(row_digest(["x"])) == 16
    assert key_hash("Paris") == key_hash("Paris") != key_hash("paris")


def test_entity_key_prefers_the_qid() -> None:
    assert entity_key("Q90", "Paris") == entity_key("Q90", "Paris, France") == "qid:Q90"
    assert entity_key(None, "Paris") == entity_key("", "Paris") == "title:Paris"


def entity_rows(pairs: list[tuple[str, str | None]]) -> EntityRows:
    """(title, QID or None) rows with ids 1, 2, ..."""
    return EntityRows(np.arange(1, len(pairs) + 1, dtype=np.int64),
                      np.array([key_hash(entity_key(None, title)) for title, _ in pairs], np.int64),
                      np.array([key_hash(entity_key(qid, "")) if qid else NO_KEY for _, qid in pairs], np.int64))


def test_an_entity_that_gained_its_qid_is_the_same_entity() -> None:
    """A title with no QID in one run takes the QID the other run gives it (page props added, or the article got
    its Wikidata item since), unless another entity of its run has that QID (then that one is the match)."""
    old = entity_rows([("A", None), ("B", "Q2"), ("C", None), ("E", "Q3"), ("G", None)])
    new = entity_rows([("A", "Q1"), ("B renamed", "Q2"), ("C", "Q3"), ("F", None), ("G", None)])
    old_keys, new_keys = entity_keys(old, new), entity_keys(new, old)
    assert compare(Keyed.of(old_keys, [b""] * 5), Keyed.of(new_keys, [b""] * 5)) == Change(5, 5, 1, 1, 0)
    assert old_keys[0] == new_keys[0] == key_hash("qid:Q1")
    assert old_keys[2] == key_hash("title:C") and old_keys[3] == new_keys[2] == key_hash("qid:Q3")
    assert old_keys[4] == new_keys[4] == key_hash("title:G")
    assert (entity_keys(old, entity_rows([])) == np.where(old.qids != NO_KEY, old.qids, old.titles)).all()


def tops(pairs: list[tuple[str, float, str]]) -> dict[int, bytes]:
    """name -> top-candidate digest for (name, commonness, entity key) rows."""
    result = top_candidates(np.array([key_hash(name) for name, _, _ in pairs], np.int64),
                            np.array([value for _, value, _ in pairs], np.float32),
                            np.array([key_hash(key) for _, _, key in pairs], np.int64))
    return dict(zip(result.keys.tolist(), result.digests.tolist(), strict=True))


def test_top_candidate_ties_compare_as_a_set() -> None:
    old = tops([("paris", 0.5, "A"), ("paris", 0.5, "B"), ("rome", 0.6, "A"), ("rome", 0.4, "B"),
                ("nice", 0.5, "A"), ("nice", 0.5, "B"), ("lyon", 1.0, "L")])
    new = tops([("paris", 0.5, "B"), ("paris", 0.5, "A"),  # same tie, other order: unchanged
                ("rome", 0.4, "A"), ("rome", 0.6, "B"),  # the top moved: changed
                ("nice", 0.6, "A"), ("nice", 0.4, "B"),  # a tie resolved: changed
                ("lyon", 0.9, "L"), ("lyon", 0.1, "M")])  # same top, lower commonness: unchanged
    changed = {name for name in ("paris", "rome", "nice", "lyon") if old[key_hash(name)] != new[key_hash(name)]}
    assert changed == {"rome", "nice"}


def test_cosine_bins_edges() -> None:
    values = np.array([1.0000001, 1.0, 0.9999, 0.99989, 0.999, 0.995, 0.9, 0.8999, -1.0])
    assert dict(zip(COSINE_BINS, cosine_bins(values).tolist(), strict=True)) == {
        "[0.9999, 1]": 3, "[0.999, 0.9999)": 2, "[0.99, 0.999)": 1, "[0.9, 0.99)": 1, "< 0.9": 2}


def test_cosines_row_wise() -> None:
    old = np.array([[1, 0], [1, 1], [0, 0], [3, 4]], np.float32)
    new = np.array([[2, 0], [1, -1], [1, 0], [-3, -4]], np.float32)
    assert np.allclose(cosines(old, new), [1.0, 0.0, 0.0, -1.0])
