"""Page title normalization, as MediaWiki stores titles (first letter upper-cased, spaces not underscores)."""

from __future__ import annotations

import html
import re

_SPACES = re.compile(r"[\s_]+")


def normalize_title(title: str) -> str:
    """``' the_Foo  bar '`` -> ``'The Foo bar'``: entities decoded, ``_`` and whitespace runs -> one space,
    surrounding space stripped, first character upper-cased (MediaWiki's default first-letter case rule)."""
    if "&" in title:
        title = html.unescape(title)
    title = _SPACES.sub(" ", title).strip()
    return title[:1].upper() + title[1:]

