"""Apostrophe runs ('' italic, ''' bold) made unambiguous line by line, as MediaWiki reads them.

MediaWiki pairs quote runs within one line: a run of four is an apostrophe and a bold run, a run of more than
five is apostrophes and a bold-italic run; when a line has an odd number of both italic and bold runs, one bold
run is an apostrophe followed by an italic run (``The ''Star'''s performance`` reads "The Star's performance");
what is still open at the line's end closes there. mwparserfromhell pairs runs across the page instead, so
``''Star'''s`` came out as "Star'''s". This pass rewrites each line so that both readings agree: literal
apostrophes become ``&#39;``, and formatting, which shows no text, becomes ``&shy;`` (a soft hyphen, which the text
drops). MediaWiki reads links before quotes, so italics opened in one link's label and closed in another's style
both; for mwparserfromhell they were one element that broke both links. The soft hyphen still ends a link trail
where the run stood (``[[Foo]]''s``: no trail, as MediaWiki reads it). Bold runs stay when asked (the first bold
text of the lead may name the page itself).
Runs inside a template or ``<ref>`` that closes on the same line are not the line's formatting
(MediaWiki strips or expands those first, and the text drops them): they become ``&#39;`` too, so they cannot
pair with a run outside. Runs inside ``<nowiki>``, ``<math>`` and the like are left verbatim. A line where one
of these spans lines is left as it is.
"""

from __future__ import annotations

import re

from transforms.parse.wikitext_prepass import LITERAL_TAGS

_RUN = re.compile(r"'{2,}")
APOSTROPHE = "&#39;"
NO_TEXT = "&shy;"
# Elements on one line whose content is shown verbatim (or not at all) and whose runs mean nothing outside.
_VERBATIM = re.compile(rf"<({LITERAL_TAGS})\b[^>]*?(?:/>|>.*?</\1\s*>)", re.IGNORECASE)
# Elements on one line that the text drops: their runs are theirs alone.
_DROPPED = re.compile(r"<ref\b[^>]*/>|<ref\b[^>]*>.*?</ref\s*>", re.IGNORECASE)
# What is left of such elements spanning lines, or template parameters: the line is left as it is.
_UNSAFE = re.compile(rf"<\s*/?\s*({LITERAL_TAGS}|ref)\b|\{{\{{\{{|\}}\}}\}}", re.IGNORECASE)
_BRACES = re.compile(r"\{\{|\}\}")


def _bold_to_split(line: str, runs: list[list[int]]) -> int:
    """Which bold run becomes an apostrophe + italics (MediaWiki's preference: after a one-letter word, else
    after a longer word, else after a space)."""
    choices: dict[str, int] = {}
    for index, (start, _, kind) in enumerate(runs):
        if kind != 3:
            continue
        before = line[start - 1] if start >= 1 else " "
        before2 = line[start - 2] if start >= 2 else " "
        key = "space" if before == " " else ("single" if before2 == " " else "multi")
        choices.setdefault(key, index)
    return next(choices[key] for key in ("single", "multi", "space") if key in choices)


def _line_runs(line: str) -> list[list[int]]:
    """[start, literal apostrophes, formatting length (2, 3 or 5)] of each run of two or more apostrophes."""
    runs = []
    for match in _RUN.finditer(line):
        length = len(match.group(0))
        literal = 1 if length == 4 else max(0, length - 5)
        runs.append([match.start(), literal, length - literal])
    return runs


def _template_spans(line: str) -> list[tuple[int, int]] | None:
    """(start, end) of the templates that open and close on this line; None if one spans lines."""
    spans, depth, opened = [], 0, 0
    for match in _BRACES.finditer(line):
        if match.group(0) == "{{":
            opened = match.start() if depth == 0 else opened
            depth += 1
        elif depth == 0:
            return None
        else:
            depth -= 1
            if depth == 0:
                spans.append((opened, match.end()))
    return None if depth else spans


def _close_open_runs(runs: list[list[int]]) -> None:
    """Drop the formatting of the last italic and the last bold run when their count is odd: that run opens
    what the line's end closes, so it shows no text either way."""
    for part in (2, 3):
        carriers = [run for run in runs if run[2] in (part, 5)]
        if len(carriers) % 2:
            carriers[-1][2] -= part


def _blanked(line: str, spans: list[tuple[int, int]]) -> str:
    """``line`` with ``spans`` overwritten by spaces (offsets kept)."""
    for start, end in spans:
        line = line[:start] + " " * (end - start) + line[end:]
    return line


def _hidden_spans(line: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]] | None:
    """(dropped, verbatim) spans of the line's templates and refs, and of its verbatim elements;
    None when one of them opens or closes on another line."""
    verbatim = [match.span() for match in _VERBATIM.finditer(line)]
    masked = _blanked(line, verbatim)
    dropped = [match.span() for match in _DROPPED.finditer(masked)]
    masked = _blanked(masked, dropped)
    templates = _template_spans(masked)
    if templates is None or _UNSAFE.search(masked):
        return None
    return dropped + templates, verbatim


def _shown_run(literal: int, kind: int, keep_bold: bool) -> str:
    """What a run becomes: its literal apostrophes, then its bold (when kept) or nothing that shows."""
    bold = "'''" if keep_bold and kind in (3, 5) else ""
    return APOSTROPHE * literal + (bold or NO_TEXT)


def balance_line(line: str, keep_bold: bool = False) -> str:
    """One line with MediaWiki's reading of its apostrophe runs spelled out for mwparserfromhell."""
    hidden = _hidden_spans(line) if "''" in line else None
    if hidden is None:
        return line
    spans, verbatim = hidden
    runs = [run for run in _line_runs(line) if not any(start <= run[0] < end for start, end in verbatim)]
    # a run inside a template or ref (dropped from the text) is theirs: MediaWiki reads those first
    inside = [any(start <= run[0] < end for start, end in spans) for run in runs]
    for run, dropped in zip(runs, inside, strict=True):
        if dropped:
            run[1:] = [run[1] + run[2], 0]
    outside = [run for run, dropped in zip(runs, inside, strict=True) if not dropped]
    italics = sum(1 for run in outside if run[2] in (2, 5))
    bolds = sum(1 for run in outside if run[2] in (3, 5))
    if italics % 2 and bolds % 2 and any(run[2] == 3 for run in outside):
        outside[_bold_to_split(line, outside)][1:] = [1, 2]
    _close_open_runs(outside)
    pieces, position = [], 0
    for start, literal, kind in runs:
        pieces.append(line[position:start])
        pieces.append(_shown_run(literal, kind, keep_bold))
        position = _RUN.match(line, start).end()
    pieces.append(line[position:])
    return "".join(pieces)


def balance_quotes(wikitext: str, keep_bold: bool = False) -> str:
    """``wikitext`` with every line's apostrophe runs made unambiguous (see the module docstring); bold runs kept
    as bold with ``keep_bold``, else no formatting is left."""
    if "''" not in wikitext:
        return wikitext
    return "\n".join(balance_line(line, keep_bold) for line in wikitext.split("\n"))
