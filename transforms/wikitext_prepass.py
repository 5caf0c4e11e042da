"""A fast pre-pass that cuts templates, <ref>s, comments and tables out of wikitext before the full parse.

Most bytes of an article are markup the text drops anyway; cutting it with a plain scanner first roughly halves
the work of mwparserfromhell. The output must be what the full parse gives, so wherever the scanner cannot be
sure (unbalanced braces, {{{parameters}}}, verbatim tags whose content is literal text...) it gives up and the
page takes the full-parse path unchanged. A test compares both paths on every real sample page.
"""

from __future__ import annotations

import itertools
import re

# Tags whose content is literal or opaque: braces inside them mean nothing, so the scanner would be unsure.
_VERBATIM = re.compile(r"<\s*(?:nowiki|pre|math|chem|ce|source|syntaxhighlight|code|score|timeline|hiero|graph|"
                       r"includeonly|noinclude|onlyinclude|templatedata|imagemap|poem)\b", re.IGNORECASE)
_START = re.compile(r"\{\{|<ref\b|<!--|(?:(?<=\n)|^)[ \t]*\{\|", re.IGNORECASE)
_BRACES = re.compile(r"\{\{|\}\}")
_REF_OPEN_END = re.compile(r"[^<>]*?(/?)>")
_REF_CLOSE = re.compile(r"</ref\s*>", re.IGNORECASE)
_TABLE_MARK = re.compile(r"(?:(?<=\n)|^)[ \t]*(\{\||\|\})")
_BAD_NAME = re.compile(r"[\[\]{}<>]")
_MARKUP_CHARS = frozenset("'[]{}<>|")


class Unsure(Exception):
    """The scanner cannot promise the full parse's result for this page."""


def _odd_brace_run(text: str, start: int) -> bool:
    """Whether the run of equal braces that begins at ``start`` has odd length (``}}}}`` is fine, ``}}}`` not)."""
    brace = text[start]
    if start and text[start - 1] == brace:
        return False  # inside a run already checked at its first brace
    end = start
    while end < len(text) and text[end] == brace:
        end += 1
    return (end - start) % 2 == 1


def _template_end(text: str, start: int) -> int:
    """End of the balanced template opening at ``start``."""
    if text.startswith("{", start + 2) or (start and text[start - 1] == "{"):
        raise Unsure("{{{parameter}}}")
    if text.startswith("[[", max(start - 2, 0)) and start >= 2:
        raise Unsure("template in a link title")
    depth = 0
    for match in _BRACES.finditer(text, start):
        token = match.group(0)
        if _odd_brace_run(text, match.start()):
            raise Unsure("an odd run of braces ({{{parameter}}} or stray brace)")
        depth += 1 if token == "{{" else -1
        if depth == 0:
            name = text[start + 2:match.start()].split("|", 1)[0]
            if not name.strip() or "\n" in name.strip() or _BAD_NAME.search(name):
                raise Unsure("not a valid template name")
            return match.end()
    raise Unsure("unclosed template")


def _ref_end(text: str, start: int) -> int:
    opening = _REF_OPEN_END.match(text, start + 4)
    if opening is None:
        raise Unsure("unclosed <ref")
    if opening.group(1):
        return opening.end()
    closing = _REF_CLOSE.search(text, opening.end())
    if closing is None:
        raise Unsure("<ref> without </ref>")
    return closing.end()


def _comment_end(text: str, start: int) -> int:
    end = text.find("-->", start + 4)
    if end < 0:
        raise Unsure("unclosed comment")
    return end + 3


def _table_end(text: str, start: int) -> int:
    depth = 0
    for match in _TABLE_MARK.finditer(text, start):
        depth += 1 if match.group(1) == "{|" else -1
        if depth == 0:
            return match.end()
    raise Unsure("unclosed table")


def _end_of(text: str, match: re.Match[str]) -> int:
    token = match.group(0).lstrip(" \t")
    if token == "{{":
        return _template_end(text, match.start())
    if token == "<!--":
        return _comment_end(text, match.start())
    if token == "{|":
        return _table_end(text, match.start())
    return _ref_end(text, match.start())


def _glues_markup(kept: list[str]) -> bool:
    """Whether cutting glued markup characters together, e.g. ``''`` out of ``'{{x}}'``."""
    return any(before[-1:] in _MARKUP_CHARS and after[:1] in _MARKUP_CHARS and before and after
               for before, after in itertools.pairwise(kept))


def strip_dropped_markup(wikitext: str) -> str | None:
    """``wikitext`` without its top-level templates, refs, comments and tables; None when unsure."""
    if _VERBATIM.search(wikitext):
        return None
    kept: list[str] = []
    position = 0
    try:
        while (match := _START.search(wikitext, position)) is not None:
            start = match.start() + len(match.group(0)) - len(match.group(0).lstrip(" \t"))
            if start > position or not kept:
                kept.append(wikitext[position:start])
            position = _end_of(wikitext, match)
    except Unsure:
        return None
    kept.append(wikitext[position:])
    return None if _glues_markup(kept) else "".join(kept)
