"""Page title normalization, as MediaWiki stores titles (first letter upper-cased, spaces not underscores), and
link targets read as MediaWiki reads them."""

from __future__ import annotations

import html
import re
import unicodedata
import urllib.parse

_SPACES = re.compile(r"[\s_]+")
_BIDI_MARKS = re.compile("[\u200e\u200f\u202a-\u202e]")
_GEORGIAN = re.compile("[\u10d0-\u10fa\u10fd-\u10ff]")
# MediaWiki's characters a title may not hold, and a lone surrogate (a byte of invalid UTF-8, read as such).
_NOT_IN_TITLES = re.compile(r"[<>\[\]{}|\x00-\x1f\x7f\ud800-\udfff]")
TITLE_MAX_BYTES = 255  # MediaWiki's longest title (in the article namespace), in UTF-8 bytes


def is_possible_title(title: str) -> bool:
    """Whether a page can have ``title``: no character MediaWiki refuses in titles, at most ``TITLE_MAX_BYTES``."""
    return not _NOT_IN_TITLES.search(title) and len(title.encode("utf-8", "surrogatepass")) <= TITLE_MAX_BYTES


def normalize_title(title: str, dotted_i: bool = False, first_letter: bool = True) -> str:
    """``' the_Foo  bar '`` -> ``'The Foo bar'``: bidirectional marks removed, ``_`` and whitespace runs -> one
    space, surrounding space stripped, first character upper-cased (MediaWiki's first-letter case rule,
    ``first_upper``; ``dotted_i``: a Turkic wiki's, where ``i`` is upper-cased to ``İ``; not with ``first_letter``
    False: a case-sensitive wiki's, where ``roma`` and ``Roma`` are two pages)."""
    if not title.isascii():
        title = _BIDI_MARKS.sub("", title)
    title = _SPACES.sub(" ", title).strip()
    return first_upper(title[:1], dotted_i) + title[1:] if first_letter else title


def first_upper(first: str, dotted_i: bool = False) -> str:
    """The first letter of a title as Wikimedia's wikis case it: upper case where that is one character, else
    title case where that is (``ᾀ`` -> ``ᾈ``), else as it is (``ß``, ``ﬁ``, ``ŉ``); a Georgian letter as it is (its
    upper case, Mtavruli, is not used in titles). ``dotted_i``: ``i`` -> ``İ``, as on the Turkish, Azerbaijani and
    Karakalpak wikis (their ``ı`` -> ``I`` is the default rule's)."""
    if dotted_i and first == "i":
        return "\u0130"
    if first.isascii():
        return first.upper()
    if _GEORGIAN.match(first):
        return first
    for cased in (first.upper(), first.title()):
        if len(cased) == 1:
            return cased
    return first


def percent_decoded(raw: str) -> str:
    """``raw`` with its ``%XX`` escapes decoded (``Caf%C3%A9`` -> ``Café``; ``100% (song)`` stays)."""
    return urllib.parse.unquote(raw, errors="replace") if "%" in raw else raw


def decode_target(raw: str) -> str:
    """A link's or redirect's target as written in wikitext, decoded as MediaWiki decodes it before it splits off a
    ``#fragment``: ``%XX`` escapes, then character references (``[[Guns N&#39; Roses]]``, ``[[AT&amp;T]]``), then
    Unicode NFC (as MediaWiki stores every title)."""
    raw = percent_decoded(raw)
    if "&" in raw:
        raw = html.unescape(raw)
    return raw if unicodedata.is_normalized("NFC", raw) else unicodedata.normalize("NFC", raw)
