"""KPR model inputs against the reference's rules (kembed utils/preprocessing.py and data.py), written out by hand:
segments tokenized in pieces cut at the mentions, [CLS] prefix title [SEP] text [SEP] cut to max_length, entity
positions, and entities whose mention runs past max_length - 1 dropped."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from artifacts.linker import Candidate, Mention
from encoders.kpr_inputs import (
    EntitySpan,
    LinkedMention,
    Segment,
    joined_segment,
    kpr_sequence,
    linked_mentions,
    mention_bounds,
    pair_token_types,
    text_pieces,
)

CLS, SEP = 101, 102


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    return AutoTokenizer.from_pretrained(minilm_path)


def candidate(entity_id: int) -> Candidate:
    return Candidate(entity_id, f"Q{entity_id}", f"E{entity_id}", 1.0, 1.0, 1)


def test_mentions_keep_the_candidates_with_an_embedding_in_the_linkers_order():
    mentions = [Mention(0, 4, "york", (candidate(3), candidate(9), candidate(5))),
                Mention(6, 9, "cut", (candidate(9),))]
    assert linked_mentions(mentions, lambda entity_id: entity_id != 9) == [LinkedMention(0, 4, (3, 5))]


def test_a_segment_is_tokenized_in_pieces_cut_at_its_mentions(tokenizer):
    """Whole, "10km" is 10 ##km; the reference tokenizes "a 10", "km", " race near ", "Paris" apart: 10 km."""
    text = "a 10km race near Paris"
    mentions = [LinkedMention(4, 6, (7, 8)), LinkedMention(17, 22, (4,))]
    bounds = mention_bounds(mentions)
    assert bounds == [4, 6, 17, 22]
    pieces = text_pieces(text, bounds)
    assert pieces == ["a 10", "km", " race near ", "Paris", ""]
    segment = joined_segment(tokenizer(pieces, add_special_tokens=False)["input_ids"], bounds, mentions)
    vocab = tokenizer.get_vocab()
    assert segment.ids == tuple(vocab[token] for token in ["a", "10", "km", "race", "near", "paris"])
    assert segment.entities == (EntitySpan(7, 2, 3), EntitySpan(8, 2, 3), EntitySpan(4, 5, 6))
    assert text_pieces("no mention", []) == ["no mention"]


TITLE = Segment((11, 12), (EntitySpan(5, 0, 2),))
TEXT = Segment(tuple(range(21, 31)), (EntitySpan(6, 0, 1), EntitySpan(7, 6, 8), EntitySpan(8, 7, 9)))


def test_a_titled_sequence_is_cls_prefix_title_sep_text_sep_cut_to_max_length():
    """content = [99] 11 12 [SEP] 21..30 (14 tokens), cut to max_length - 2 = 12: 21..28 are kept. Reference
    positions are content index + 1 ([CLS]); an entity is kept when position + length <= max_length - 1 = 13."""
    sequence = kpr_sequence([TITLE, TEXT], [99], CLS, SEP, max_length=14, max_entities=10)
    assert sequence.input_ids == (CLS, 99, 11, 12, SEP, 21, 22, 23, 24, 25, 26, 27, 28, SEP)
    # 5: title tokens at 2, 3; 6: text token 0 at 5; 7: text tokens 6, 7 at 11, 12 (11 + 2 = 13: kept, its last
    # token is the last one kept); 8: text tokens 7, 8 at 12, 13 (12 + 2 = 14 > 13: its second token is cut)
    assert sequence.entities.entity_ids == (5, 6, 7)
    assert sequence.entities.positions == ((2, 3), (5,), (11, 12))
    assert (sequence.truncated, sequence.over_max, sequence.cut) == (1, 0, True)
    assert pair_token_types(sequence) == [0] * 5 + [1] * 9
    # 14 tokens of content fit max_length 16 exactly: nothing is cut
    assert not kpr_sequence([TITLE, TEXT], [99], CLS, SEP, max_length=16, max_entities=10).cut


def test_an_uncut_sequence_keeps_every_entity_and_max_entities_caps_them_in_order():
    sequence = kpr_sequence([TITLE, TEXT], [], CLS, SEP, max_length=64, max_entities=3)
    assert sequence.input_ids == (CLS, 11, 12, SEP, *range(21, 31), SEP)
    assert sequence.entities.entity_ids == (5, 6, 7)
    assert sequence.entities.positions == ((1, 2), (4,), (10, 11))
    assert (sequence.truncated, sequence.over_max, sequence.cut) == (0, 1, False)


def test_a_query_is_one_segment_between_cls_and_sep():
    query = kpr_sequence([TEXT], [], CLS, SEP, max_length=6, max_entities=10)
    assert query.input_ids == (CLS, 21, 22, 23, 24, SEP)
    assert (query.entities.entity_ids, query.entities.positions, query.truncated) == ((6,), ((1,),), 2)
    assert pair_token_types(query) == [0] * 6
