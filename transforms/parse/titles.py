"""Page title normalization, as MediaWiki stores titles (first letter upper-cased, spaces not underscores), and
link targets read as MediaWiki reads them."""

from __future__ import annotations

import html
import re
import unicodedata
import urllib.parse

_SPACES = re.compile(r"[\s_]+")


def normalize_title(title: str) -> str:
    """``' the_Foo  bar '`` -> ``'The Foo bar'``: ``_`` and whitespace runs -> one space, surrounding space
    stripped, first character upper-cased (MediaWiki's default first-letter case rule)."""
    title = _SPACES.sub(" ", title).strip()
    return title[:1].upper() + title[1:]


def decode_target(raw: str) -> str:
    """A link's or redirect's target as written in wikitext, decoded as MediaWiki decodes it before it splits off a
    ``#fragment``: ``%XX`` escapes, then character references (``[[Guns N&#39; Roses]]``, ``[[AT&amp;T]]``), then
    Unicode NFC (as MediaWiki stores every title)."""
    if "%" in raw:
        raw = urllib.parse.unquote(raw, errors="replace")
    if "&" in raw:
        raw = html.unescape(raw)
    return raw if unicodedata.is_normalized("NFC", raw) else unicodedata.normalize("NFC", raw)
