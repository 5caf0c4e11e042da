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


def test_distinct_words_do_not_stay_in_the_vocabulary():
    spans = TokenSpans()
    before = len(spans._nlp.vocab.strings)
    for index in range(2000):
        word = f"word{index}x"
        assert spans(f"{word} and zq{index}y.")[0] == (0, len(word))
    plain = spacy.blank("en").tokenizer
    plain_before = len(plain.vocab.strings)
    for index in range(2000):
        plain(f"word{index}x and zq{index}y.")
    assert len(spans._nlp.vocab.strings) - before < 50  # freed at the end of each text
    assert len(plain.vocab.strings) - plain_before >= 4000  # what a bare tokenizer keeps
