"""A fast pre-pass that cuts templates, <ref>s and tables out of wikitext before the full parse, and the comments
that MediaWiki's preprocessor removes before anything else reads a page.

Most bytes of an article are markup the text drops anyway; cutting it with a plain scanner first roughly halves
the work of mwparserfromhell. The output must be what the full parse gives, so wherever the scanner cannot be
sure (unbalanced braces, {{{parameters}}}, verbatim tags whose content is literal text...) it gives up and the
page takes the full-parse path unchanged. A test compares both paths on every real sample page.
"""

from __future__ import annotations

import bisect
import re

from transforms.parse.namespaces import ENGLISH_TRAIL_LETTERS, trail_class

# Tags whose content is literal or opaque: braces inside them mean nothing, so the scanner leaves them whole.
_VERBATIM = re.compile(r"<\s*(nowiki|pre|math|chem|ce|source|syntaxhighlight|code|score|timeline|hiero|graph|"
                       r"includeonly|noinclude|onlyinclude|templatedata|imagemap|poem)\b", re.IGNORECASE)
# Transclusion control changes what the page's text is at all: such pages take the full parse.
_TRANSCLUSION = frozenset({"includeonly", "noinclude", "onlyinclude"})
_START = re.compile(r"\{\{|<ref\b|(?:(?<=\n)|^)[ \t]*\{\|", re.IGNORECASE)
_BRACES = re.compile(r"\{\{|\}\}")
_REF_OPEN_END = re.compile(r"[^<>]*?(/?)>")
_REF_CLOSE = re.compile(r"</ref\s*>", re.IGNORECASE)
_TABLE_MARK = re.compile(r"(?:(?<=\n)|^)[ \t]*(\{\||\|\})")
_BAD_NAME = re.compile(r"[\[\]{}<>]")
_MARKUP_CHARS = frozenset("'[]{}<>|")
# Tags whose content MediaWiki shows as it is (or not at all): "<!--" and apostrophes inside them mean nothing.
LITERAL_TAGS = r"nowiki|pre|math|chem|ce|source|syntaxhighlight|score|timeline|hiero|graph"
_COMMENT_OR_LITERAL = re.compile(rf"<!--|<\s*({LITERAL_TAGS})\b", re.IGNORECASE)
# Templates that stand for a character or a space, and what the text shows for them (a no-break space as a space):
# dropped, they would glue the words on either side ("1775{{ndash}}1783", "15{{nbsp}}September", "GQ{{'}}s"). Keyed
# by name as ``character_template`` finds it (its first letter in lower case); their parameters (a count of spaces)
# change nothing the text keeps. ``{{!}}`` is MediaWiki's magic word for "|".
CHARACTER_TEMPLATES = {
    "!": "|", "=": "=", "'": "'", "'s": "'s",
    **dict.fromkeys(("nbsp", "space", "spaces", "thinsp", "nnbsp"), " "),
    **dict.fromkeys(("ndash", "en dash", "endash", "\u2013"), "\u2013"),
    **dict.fromkeys(("mdash", "em dash", "emdash", "\u2014"), "\u2014"),
    **dict.fromkeys(("snd", "snds", "spnd", "sndash", "spaced ndash", "spaced en dash"), " \u2013 "),
    **dict.fromkeys(("mdashb", "spaced mdash", "spaced em dash"), " \u2014 "),
    **dict.fromkeys(("\u00b7", "dot", "middot"), " \u00b7 "),
    **dict.fromkeys(("\u2022", "bull", "bullet"), " \u2022 "),
}
_TEMPLATE_PREFIX = "template:"


def character_template(name: str) -> str | None:
    """What the template called ``name`` shows if it stands for a character or a space (``CHARACTER_TEMPLATES``),
    found as MediaWiki finds its page: underscores and runs of whitespace one space, a ``Template:`` prefix in any
    case, the first letter in either case."""
    name = " ".join(name.replace("_", " ").split())
    if name[:len(_TEMPLATE_PREFIX)].lower() == _TEMPLATE_PREFIX:
        name = name[len(_TEMPLATE_PREFIX):].lstrip()
    return CHARACTER_TEMPLATES.get(name[:1].lower() + name[1:])


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
    if token == "{|":
        return _table_end(text, match.start())
    return _ref_end(text, match.start())


def _glues_markup(before: str, after: str) -> bool:
    """Whether cutting what lies between would glue markup characters together, e.g. ``''`` out of ``'{{x}}'``."""
    return bool(before) and bool(after) and before[-1] in _MARKUP_CHARS and after[0] in _MARKUP_CHARS


def _element_end(text: str, opening: re.Match[str]) -> int | None:
    """Where the element whose tag name ``opening`` matched (group 1) ends: after its ``/>`` or its closing tag;
    None when its opening tag or the element is never closed."""
    opening_end = text.find(">", opening.end())
    if opening_end < 0:
        return None
    if text[opening_end - 1] == "/":
        return opening_end + 1
    closing = re.compile(rf"</\s*{opening.group(1)}\s*>", re.IGNORECASE).search(text, opening_end + 1)
    return None if closing is None else closing.end()


def verbatim_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of every top-level verbatim element (``<math>...</math>``, ``<nowiki/>``...), in order."""
    spans: list[tuple[int, int]] = []
    position = 0
    while (match := _VERBATIM.search(text, position)) is not None:
        name = match.group(1).lower()
        if name in _TRANSCLUSION:
            raise Unsure(f"<{name}>")
        end = _element_end(text, match)
        if end is None:
            raise Unsure(f"<{name}> left open")
        spans.append((match.start(), end))
        position = end
    return spans


def span_around(spans: list[tuple[int, int]], starts: list[int], position: int) -> tuple[int, int] | None:
    """The verbatim span that contains ``position``, if any."""
    index = bisect.bisect_right(starts, position) - 1
    return spans[index] if index >= 0 and position < spans[index][1] else None


def _makes_a_trail(before: str, after: str, letters: str) -> bool:
    """Whether cutting would make the letters after a link its trail where MediaWiki's are not: a ref or template
    between ``[[a]]`` and ``b``, or between ``[[a]]s`` and ``b``, stops the trail (``letters``: those of a trail)."""
    letter = trail_class(letters)
    return bool(re.search(rf"\]\]{letter}*\Z", before)) and bool(re.match(letter, after))


def _join_cuts(wikitext: str, kept: list[str], cuts: list[tuple[int, int]], letters: str) -> str:
    """``kept[0] cuts[0]? kept[1] ...``: each cut dropped unless dropping it would glue markup together or make a
    link trail; such a cut stays in place for the full parse to read (only that spot, not the whole page, takes
    the slow path)."""
    pieces = [kept[0]]
    for (start, end), after in zip(cuts, kept[1:], strict=True):
        kept_in_place = _glues_markup(pieces[-1], after) or _makes_a_trail(pieces[-1], after, letters)
        pieces.append(wikitext[start:end] if kept_in_place else "")
        pieces.append(after)
    return "".join(pieces)


def strip_comments(wikitext: str) -> str:
    """``wikitext`` without its comments, as MediaWiki's preprocessor removes them before templates, links or
    headings are read: a comment that never closes runs to the page's end; ``<!--`` inside a literal element
    (``<nowiki>``, ``<pre>``, ``<math>``...) is that element's text."""
    if "<!--" not in wikitext:
        return wikitext
    kept: list[str] = []
    position = search_from = 0
    while (match := _COMMENT_OR_LITERAL.search(wikitext, search_from)) is not None:
        if match.group(0) != "<!--":  # a literal element: left open, MediaWiki shows its tag as text and reads on
            search_from = _element_end(wikitext, match) or match.end()
            continue
        kept.append(wikitext[position:match.start()])
        end = wikitext.find("-->", match.end())
        position = search_from = len(wikitext) if end < 0 else end + 3
    kept.append(wikitext[position:])
    return "".join(kept)


def strip_dropped_markup(wikitext: str, trail_letters: str = ENGLISH_TRAIL_LETTERS) -> str | None:
    """``wikitext`` (its comments stripped first: ``strip_comments``) without its top-level templates, refs and
    tables; None when unsure. Verbatim elements are left whole (the full parse reads them); a cut that would reach
    into one makes it unsure; nor is a cut that would join a link and the letters after it (``trail_letters``)."""
    kept: list[str] = []
    cuts: list[tuple[int, int]] = []  # cuts[i] lies between kept[i] and kept[i + 1]; adjacent cuts are one
    position = search_from = 0  # end of the last cut; where the next cut may start
    try:
        spans = verbatim_spans(wikitext)
        starts = [start for start, _ in spans]
        while (match := _START.search(wikitext, search_from)) is not None:
            span = span_around(spans, starts, match.start())
            if span is not None:
                search_from = span[1]
                continue
            start = match.start() + len(match.group(0)) - len(match.group(0).lstrip(" \t"))
            end = _end_of(wikitext, match)
            if wikitext.startswith("{{", start) and character_template(wikitext[start + 2:end - 2].split("|")[0]):
                search_from = end  # ``{{nbsp}}``, ``{{!}}`` (a link's pipe in ``[[Foo{{!}}bar]]``): the full parse
                continue
            if bisect.bisect_left(starts, start) != bisect.bisect_left(starts, end):
                raise Unsure("a cut would reach into a verbatim element")
            if start > position or not kept:
                kept.append(wikitext[position:start])
                cuts.append((start, end))
            else:
                cuts[-1] = (cuts[-1][0], end)
            position = search_from = end
    except Unsure:
        return None
    kept.append(wikitext[position:])
    return _join_cuts(wikitext, kept, cuts, trail_letters)
