"""Entity names: normalizing anchor texts, and finding dictionary names in text on the token boundaries of spaCy's
blank tokenizer of a language."""

from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from artifacts.errors import InputError

if TYPE_CHECKING:
    import numpy as np

DOC_UNITS = ("paragraph", "page")  # what doc_count counts a name once in
DEFAULT_LANGUAGE = "en"  # the spaCy language whose token boundaries names are found on (the reference's)

_SPACES = re.compile(r"\s+")
DOTTED_CAPITAL_I = "\u0130"  # lower-cased to "i" and a combining dot: two characters


@dataclass(frozen=True)
class NameRules:
    """How anchor texts become dictionary names (picklable: it travels to workers)."""

    case_sensitive: bool = False
    max_length: int = 100
    language: str = DEFAULT_LANGUAGE


def title_name(title: str) -> str:
    """The name an article title contributes: minus a trailing `` (...)`` (``Mercury (planet)`` -> ``Mercury``),
    its parentheses balanced (``Foo (bar (baz))`` -> ``Foo``, ``A (b) c (d)`` -> ``A (b) c``); a title that is
    nothing but one stays whole."""
    if not title.endswith(")"):
        return title
    depth = 0
    for position in range(len(title) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(title[position], 0)
        if depth == 0:
            name = title[:position]
            return name.rstrip() if name[-1:].isspace() and name.strip() else title
    return title


# Format characters that spell a word: the zero-width non-joiner and joiner (Persian compounds, Indic conjuncts,
# emoji sequences). MediaWiki keeps them in titles; a name holding one is kept.
_SPELLING_FORMAT = frozenset("\u200c\u200d")


def has_control_characters(text: str) -> bool:
    """Whether ``text`` holds a control or an invisible format character (a zero-width space, a word joiner), other
    than those that spell a word (``_SPELLING_FORMAT``)."""
    return any(unicodedata.category(char) in ("Cc", "Cf") and char not in _SPELLING_FORMAT for char in text)


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate, which no UTF-8 carries: a JSON ``"\\ud800"`` escape, or a byte of a
    command-line argument that was no UTF-8 (Python keeps each as one)."""
    return any("\ud800" <= char <= "\udfff" for char in text)


def shows_nothing(text: str) -> bool:
    """Whether ``text`` has no visible character: only whitespace, control and format characters (a zero-width space,
    a byte order mark)."""
    return all(char.isspace() or unicodedata.category(char) in ("Cc", "Cf") for char in text)


def fold_case(text: str) -> str:
    """Lower-case ``text`` without changing its length, so offsets into it stay offsets into the original: "İ", the
    one character whose lower case is two, stays; the pieces between are lowered whole (a final sigma stays final,
    as in a name lowered alone)."""
    lowered = text.lower()
    if len(lowered) == len(text):
        return lowered
    return DOTTED_CAPITAL_I.join(piece.lower() for piece in text.split(DOTTED_CAPITAL_I))


def name_problem(name: str, rules: NameRules) -> str | None:
    """Why ``name`` (already normalized) cannot be a dictionary name, or None."""
    if not name:
        return "empty_names"
    if has_control_characters(name):
        return "names_with_control_characters"
    if len(name) > rules.max_length:
        return "names_too_long"
    return None


def normalize_name(text: str, rules: NameRules) -> str:
    """Anchor text -> dictionary name: whitespace runs made one space, stripped, case-folded unless case-sensitive."""
    name = _SPACES.sub(" ", text).strip()
    return name if rules.case_sensitive else fold_case(name)


def paragraphs(text: str, per_page: bool) -> list[str]:
    """The units a name is counted once in: newline-separated paragraphs, or the whole page."""
    if per_page:
        return [text]
    return [paragraph for paragraph in text.split("\n") if paragraph.strip()]


@dataclass(frozen=True)
class Match:
    start: int
    end: int
    name: str


# Words spaCy's vocabulary may hold before the tokenizer is made anew (~370 bytes each, ~75 MB): it keeps every
# distinct word it has seen, gigabytes over a Wikipedia dump. (spaCy's memory zones bound it too, but they create
# every word anew in every text: 4 times the CPU.)
MAX_VOCABULARY = 200_000
# Whitespace-separated pieces of text whose tokens spaCy's tokenizer keeps (its own cache: a pointer a token, made
# anew with the vocabulary). spaCy keeps 10,000 by default, which a few hundred passages of Wikipedia fill: every
# later piece is cut by its prefix, suffix and infix rules again, 5 times the time of a kept one.
CACHED_PIECES = 1 << 17


class TokenBounds(NamedTuple):
    """Where a text's tokens start (in order) and end."""

    starts: list[int]
    ends: set[int]


class TokenSpans:
    """Text -> (start, end) character offsets of its tokens by spaCy's blank tokenizer of ``language`` (English
    unless told), in bounded memory."""

    def __init__(self, language: str = DEFAULT_LANGUAGE, max_vocabulary: int = MAX_VOCABULARY) -> None:
        self._language, self._max_vocabulary = language, max_vocabulary
        self._nlp = self._blank()

    def _blank(self):
        nlp = blank_language(self._language)
        nlp.tokenizer.max_cache_size = CACHED_PIECES
        return nlp

    def _offsets(self, text: str) -> np.ndarray:
        """(start, length) of each token, one row a token."""
        from spacy.attrs import IDX, LENGTH

        if len(self._nlp.vocab) > self._max_vocabulary:
            self._nlp = self._blank()
        return self._nlp.tokenizer(text).to_array([IDX, LENGTH]).reshape(-1, 2)

    def __call__(self, text: str) -> list[tuple[int, int]]:
        return [(start, start + length) for start, length in self._offsets(text).tolist()]

    def bounds(self, text: str) -> TokenBounds:
        """The tokens' starts and ends, built with numpy (what ``find_names`` reads)."""
        offsets = self._offsets(text)
        return TokenBounds(offsets[:, 0].tolist(), set((offsets[:, 0] + offsets[:, 1]).tolist()))


class NoTokenizerError(InputError):
    """spaCy makes no tokenizer of ``language`` here, for the reason ``why`` (its error's first line)."""

    def __init__(self, language: str, why: str) -> None:
        self.language, self.why = language, why
        super().__init__(f"spaCy makes no tokenizer of the language {language!r} here ({why}): names need a code "
                         "spaCy knows (en, it, de, fr, zh; xx: language-neutral rules ...), with the package its "
                         "tokenizer needs installed")

    def __reduce__(self):
        return type(self), (self.language, self.why)


def blank_language(language: str):
    """spaCy's blank pipeline of ``language`` (a spaCy code: "en", "it", "zh"), or an ``InputError`` saying why
    there is none here: a code spaCy does not know, or a language whose tokenizer needs a package not installed
    (Japanese: SudachiPy; Korean: mecab-ko; Thai: PyThaiNLP; Vietnamese: pyvi)."""
    try:
        return spacy_without_torch().blank(language)
    # a spacy.lang module that is no language (``char_classes``) has no ``__all__``: an AttributeError
    except (ImportError, ValueError, AttributeError, IndexError) as error:
        why = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise NoTokenizerError(language, why) from None


# Wikipedia language codes that spaCy knows by another code (Norwegian Bokmål)
SPACY_CODES = {"no": "nb"}


def spacy_code(wiki_language: str) -> str:
    """spaCy's code of a Wikipedia's language where spaCy makes a tokenizer of it here (``no``: ``nb``; ``zh_yue``:
    ``zh``), else the ``NoTokenizerError`` of the code itself."""
    codes = dict.fromkeys(SPACY_CODES.get(code, code) for code in (wiki_language, re.split("[_-]", wiki_language)[0]))
    problems = []
    for code in codes:
        try:
            return blank_language(code).lang
        except NoTokenizerError as problem:
            problems.append(problem)
    raise problems[0]


def spacy_without_torch():
    """spaCy, imported without torch where torch is not loaded yet. Its ML library (thinc) imports torch whenever
    it can, for a tokenizer that needs none of it: 180 MB in every dictionary worker with torch's CPU build, ~550 MB
    with a CUDA build (the dictionary stage held 831 MB instead of 459 on a GPU server)."""
    if "torch" in sys.modules or "spacy" in sys.modules:
        import spacy

        return spacy
    sys.modules["torch"] = None  # `import torch` raises ImportError while spaCy and thinc load
    try:
        import spacy
    finally:
        del sys.modules["torch"]
    return spacy


def token_bounds(tokens: Sequence[tuple[int, int]]) -> TokenBounds:
    """The ``TokenBounds`` of (start, end) spans."""
    return TokenBounds([start for start, _ in tokens], {end for _, end in tokens})


def find_names(folded: str, bounds: TokenBounds, prefixes, max_length: int, longest_only: bool) -> Iterator[Match]:
    """Dictionary names in ``folded`` text that start at a token start and end at a token end.

    ``prefixes(text)`` returns the dictionary names that are prefixes of ``text``, shortest first (a marisa-trie
    method, or the same filtered).
    With ``longest_only`` the longest name at each token start is taken and matches never overlap (the
    linker); otherwise every name at every token start is reported (document counting).
    """
    starts, ends = bounds
    covered_until = -1  # stays -1 unless longest_only
    for start in starts:
        if start < covered_until:
            continue
        names = prefixes(folded[start:start + max_length])
        if not names:  # most tokens start no name
            continue
        if longest_only:  # the longest name ending on a token end: names come shortest first (a trie's order)
            for name in reversed(names):
                if start + len(name) in ends:
                    covered_until = start + len(name)
                    yield Match(start, covered_until, name)
                    break
        else:
            for name in names:
                if start + len(name) in ends:
                    yield Match(start, start + len(name), name)
