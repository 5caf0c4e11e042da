"""transforms/common/mention_sampling.py: seeded sample keys, per-page link numbering, context windows."""

from __future__ import annotations

from tests.builders import article
from transforms.common.mention_sampling import context_window, link_refs, sample_key


def test_sample_key_is_seeded_and_stable():
    assert sample_key(0, "Paris", 12, 0) == sample_key(0, "Paris", 12, 0)
    assert len({sample_key(0, "Paris", 12, 0), sample_key(1, "Paris", 12, 0), sample_key(0, "Paris", 12, 1),
                sample_key(0, "Paris", 13, 0), sample_key(0, "Lyon", 12, 0)}) == 5


def test_link_refs_number_each_entitys_links_per_page():
    row = article(9, "T", "Paris and Lyon and Paris", [("Paris", "Paris"), ("Lyon", "Lyon"), ("Paris", "Paris")])
    refs = list(link_refs(row, seed=3))
    assert [(target, ref.link_index) for target, ref in refs] == [("Paris", 0), ("Lyon", 1), ("Paris", 2)]
    assert refs[2][1].sample_key == sample_key(3, "Paris", 9, 1)


def test_context_window_cuts_at_spaces_and_keeps_the_span():
    text = "one two three FOUR five six seven"
    window, start, end = context_window(text, 14, 18, chars=6)
    assert (window, window[start:end]) == ("three FOUR five", "FOUR")
    assert context_window(text, 14, 18, chars=100) == (text, 14, 18)


def test_context_window_cuts_at_any_whitespace_and_inside_text_without_spaces():
    """A list item's line break is a word's end; text without spaces is cut where the count ends (the window
    moved to the one ASCII space beside the mention: Tokyo's context was nothing, a list item's the item alone)."""
    items = "* Paris (possibly)\n" + "\n".join(f"* item{index}" for index in range(60))
    window, start, end = context_window(items, 2, 7, chars=60)
    assert window == items[:items.index("\n* item6")] and window[start:end] == "Paris"  # 66 characters
    japanese = "日本の首都は" * 80 + " 東京。"
    window, start, end = context_window(japanese, 481, 483, chars=60)
    assert (window, start, end) == (japanese[421:], 60, 62) and window[start:end] == "東京"
    long_word = "y" * 120 + " Paris"  # a word longer than MAX_WORD_CHARS: cut inside
    assert context_window(long_word, 121, 126, chars=60) == (long_word[61:], 60, 65)


def test_sample_keys_of_an_entity_ignore_links_to_other_entities():
    before = article(7, "T", "Paris and Paris", [("Paris", "Paris"), ("Paris", "Paris")])
    after = article(7, "T", "Lyon, Paris and Paris", [("Lyon", "Lyon"), ("Paris", "Paris"), ("Paris", "Paris")])

    def paris_keys(row):
        return [ref.sample_key for target, ref in link_refs(row, seed=0) if target == "Paris"]

    assert paris_keys(before) == paris_keys(after)
    assert [ref.link_index for target, ref in link_refs(after, seed=0) if target == "Paris"] == [1, 2]
