"""Token spans for name matching: spaCy's blank English boundaries, without a vocabulary that grows with the text."""

from __future__ import annotations

import spacy
from spacy.attrs import IDX, LENGTH

from artifacts.names import TokenSpans


def test_spans_are_spacy_blank_english_tokens():
    text = "Mercury (planet) isn't Hg; see e.g. U.S.-based, 3.5km."
    doc = spacy.blank("en").tokenizer(text)
    expected = [(start, start + length) for start, length in doc.to_array([IDX, LENGTH]).tolist()]
    assert TokenSpans()(text) == expected
    assert [text[start:end] for start, end in expected][:4] == ["Mercury", "(", "planet", ")"]


def test_the_vocabulary_stays_within_its_bound_whatever_the_words():
    spans = TokenSpans(max_vocabulary=2_000)
    sizes = []
    for index in range(3_000):
        word = f"word{index}x"
        assert spans(f"{word} and zq{index}y.")[0] == (0, len(word))
        sizes.append(len(spans._nlp.vocab))
    assert max(sizes) <= 2_000 + 4  # made anew past the bound (a text adds at most its own words)
    assert max(sizes) > 1_900  # and not before: the cache of repeated words is kept until then
