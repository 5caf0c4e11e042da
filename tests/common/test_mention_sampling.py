"""transforms/common/mention_sampling.py: seeded sample keys, per-page link numbering, context windows."""

from __future__ import annotations

from transforms.common.mention_sampling import context_window, link_ordinals, sample_key


def test_sample_key_is_seeded_and_stable():
    assert sample_key(0, "Paris", 12, 0) == sample_key(0, "Paris", 12, 0)
    assert len({sample_key(0, "Paris", 12, 0), sample_key(1, "Paris", 12, 0), sample_key(0, "Paris", 12, 1),
                sample_key(0, "Paris", 13, 0), sample_key(0, "Lyon", 12, 0)}) == 5


def test_link_ordinals_number_each_entitys_links_per_page():
    assert list(link_ordinals(["Paris", "Lyon", "Paris"])) == [(0, "Paris", 0), (1, "Lyon", 0), (2, "Paris", 1)]


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
    def paris_links(targets: list[str]) -> list[tuple[int, int]]:
        return [(index, sample_key(0, target, 7, ordinal)) for index, target, ordinal in link_ordinals(targets)
                if target == "Paris"]

    before, after = paris_links(["Paris", "Paris"]), paris_links(["Lyon", "Paris", "Paris"])
    assert [key for _, key in before] == [key for _, key in after] and [index for index, _ in after] == [1, 2]
