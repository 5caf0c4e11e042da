"""Token spans for name matching: spaCy's blank boundaries of a language, without a vocabulary that grows with the
text."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import spacy
from spacy.attrs import IDX, LENGTH

from artifacts.errors import InputError
from artifacts.names import CACHED_PIECES, TokenSpans, token_bounds
from tests.conftest import REPO


def test_spans_are_spacy_blank_english_tokens():
    text = "Mercury (planet) isn't Hg; see e.g. U.S.-based, 3.5km."
    doc = spacy.blank("en").tokenizer(text)
    expected = [(start, start + length) for start, length in doc.to_array([IDX, LENGTH]).tolist()]
    assert TokenSpans()(text) == expected
    assert [text[start:end] for start, end in expected][:4] == ["Mercury", "(", "planet", ")"]
    assert TokenSpans().bounds(text) == token_bounds(expected)  # what find_names reads, built with numpy
    assert TokenSpans().bounds("") == ([], set()) and TokenSpans()("") == []


def test_spans_of_another_language_are_its_blank_tokens():
    """Italian parts an elided article from its word; Chinese cuts a text into characters (no spaces to part)."""
    italian = "Il simbolo dell'Argento e l'oro."
    assert [italian[start:end] for start, end in TokenSpans("it")(italian)] == [
        "Il", "simbolo", "dell'", "Argento", "e", "l'", "oro", "."]
    assert [italian[start:end] for start, end in TokenSpans()(italian)][2] == "dell'Argento"
    chinese = "北京是首都。"
    assert TokenSpans("zh")(chinese) == [(index, index + 1) for index in range(len(chinese))]


@pytest.mark.parametrize(("language", "why"), [("qq", "[E048] Can't import language qq"),
                                               ("ja", "Japanese support requires SudachiPy"),
                                               ("char_classes", "module 'spacy.lang.char_classes' has no attribute")])
def test_a_language_without_a_tokenizer_here_is_one_input_error(language, why):
    """An unknown code, a language whose tokenizer needs a package that is not installed, a module of spaCy's
    languages that is none (an AttributeError was a traceback)."""
    if language == "ja" and importlib.util.find_spec("sudachipy") is not None:  # no dependency of ours
        pytest.skip("SudachiPy is installed here")
    with pytest.raises(InputError) as raised:
        TokenSpans(language)
    assert raised.value.message.startswith(f"spaCy makes no tokenizer of the language {language!r} here ({why}")


def test_the_vocabulary_stays_within_its_bound_whatever_the_words():
    spans = TokenSpans(max_vocabulary=2_000)
    sizes = []
    for index in range(3_000):
        word = f"word{index}x"
        assert spans(f"{word} and zq{index}y.")[0] == (0, len(word))
        sizes.append(len(spans._nlp.vocab))
    assert max(sizes) <= 2_000 + 4  # made anew past the bound (a text adds at most its own words)
    assert max(sizes) > 1_900  # and not before: the cache of repeated words is kept until then
    # made anew, it still keeps the tokens of CACHED_PIECES pieces (spaCy's default, 10,000, is full within a few
    # hundred passages of Wikipedia, and every later piece is cut by its affix rules again)
    assert spans._nlp.tokenizer.max_cache_size == CACHED_PIECES > 10_000


def test_the_tokenizer_loads_without_torch_and_torch_still_loads_after():
    # thinc (spaCy's ML library) imports torch when it can: 180 MB (CPU build) to ~550 MB (CUDA) per dictionary
    # worker for a tokenizer. A fresh interpreter, as a worker process is.
    script = (
        "import sys\n"
        "from artifacts.names import TokenSpans\n"
        "assert TokenSpans()('Mercury (planet)') == [(0, 7), (8, 9), (9, 15), (15, 16)]\n"
        "print('torch' in sys.modules)\n"
        "import torch\n"
        "print(torch.ones(2).sum().item())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.split() == ["False", "2.0"]
