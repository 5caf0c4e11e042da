"""Wikitext -> plain text with hyperlinks (mwparserfromhell), as DESIGN.md defines the text.

Templates, <ref>, tables, comments and invisible tags are dropped; link text stays in place; every link
keeps exact offsets: ``text[link.start:link.end]`` is its anchor text.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import mwparserfromhell
from mwparserfromhell.nodes import (
    Argument,
    Comment,
    ExternalLink,
    Heading,
    HTMLEntity,
    Tag,
    Template,
    Text,
    Wikilink,
)
from mwparserfromhell.wikicode import Wikicode

from artifacts.names import shows_nothing
from transforms.parse.namespaces import CATEGORY, FILE, Namespaces
from transforms.parse.titles import decode_target, is_possible_title, percent_decoded
from transforms.parse.wikitext_prepass import (
    Unsure,
    character_template,
    span_around,
    strip_comments,
    strip_dropped_markup,
    verbatim_spans,
)
from transforms.parse.wikitext_quotes import balance_quotes

# Tags whose content a reader never sees as article prose.
_INVISIBLE_TAGS = frozenset({
    "ref", "references", "table", "gallery", "math", "chem", "ce", "timeline", "imagemap", "score", "graph",
    "mapframe", "maplink", "templatedata", "templatestyles", "includeonly", "syntaxhighlight",
    "source", "hiero", "inputbox", "categorytree", "section", "indicator", "style", "script", "poem-hidden",
})
# Characters that only steer how text is drawn (a soft hyphen, direction marks and embeddings, a zero-width no-break
# space): no reader sees them, and left in they split a name from its occurrences (``Tel Aviv\u200e``). Zero-width
# (non-)joiners and spaces stay: they change how a word is written or where it may break.
_INVISIBLE_FORMAT = dict.fromkeys([0x00AD, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0xFEFF])
_LINE_BREAK_TAGS = frozenset({"br", "p", "li", "dd", "dt", "tr"})
# Tags that only change how their content looks: a page is parsed again without them when they are mis-nested with
# a link (``_markup_left``), since their content is shown either way.
_FORMATTING_TAG = re.compile(r"</?(?:small|big|span|font|sub|sup|u|s|del|ins|strike|em|strong|tt|abbr|mark|i|b)"
                             r"\b[^<>]*>", re.IGNORECASE)
# Block tags that a template opens or closes for the page (``{{col-begin}}`` ... ``</div>``): left unpaired in the
# page's own text, where mwparserfromhell reads them as text, MediaWiki's HTML parser shows nothing of them.
_UNPAIRED_BLOCK_TAG = re.compile(r"</?(?:div|center|blockquote)\b[^<>]*>", re.IGNORECASE)
_BRACKET_OR_TAG = re.compile(r"\[\[|\]\]|" + _FORMATTING_TAG.pattern, re.IGNORECASE)
# Interwiki prefixes that are not language codes (language codes are matched by pattern), those of the shape of
# one included (``[[doi:10.1000/1|a paper]]`` and ``[[hdl:...]]`` show their label; ``[[de:Foo]]`` shows nothing).
_INTERWIKI = frozenset({
    "wikt", "wiktionary", "commons", "c", "meta", "m", "s", "wikisource", "q", "wikiquote", "n", "wikinews",
    "b", "wikibooks", "v", "wikiversity", "voy", "wikivoyage", "species", "d", "wikidata", "mw", "w",
    "wikipedia", "foundation", "wmf", "phab", "outreach", "incubator", "mediawikiwiki", "wikimedia",
    "doi", "hdl", "rfc", "irc", "rt", "arxiv", "pmid", "jstor", "imdbtitle", "imdbname", "gerrit", "ticket",
})
_INDENTED_TABLE = re.compile(r"^:+[ \t]*(?=\{\|)", re.MULTILINE)
# The Wikipedias' codes (Wikimedia's site matrix, 2026, closed wikis included) of two letters, with a subtag, or
# not shaped like one: such a prefix in any case is a language link, as MediaWiki reads interwiki prefixes
# ("[[EN:Rome]]", "[[zh-classical:...]]"). Not those of three letters: a newer wiki's code was an older dump's title
# prefix (enwiki's "MOS:HEAD", Mossi's "mos").
_EDITION_CODES = """
aa ab af ak am an ar as av ay az ba bat-smg be be-tarask be-x-old bg bh bi bm bn bo br bs ca cbk-zam ce ch co cr cs cu
cv cy da de dv dz ee el en eo es et eu fa ff fi fiu-vro fj fo fr fy ga gd gl gn gu gv ha he hi ho hr ht hu hy hz ia id
ie ig ii ik io is it iu ja jv ka kg ki kj kk kl km kn ko kr ks ku kv kw ky la lb lg li ln lo lt lv map-bms mg mh mi mk
ml mn mr ms mt my na nb nds-nl ne ng nl nn no nr nv ny oc om or os pa pi pl ps pt qu rm rn ro roa-rup roa-tara ru rw sa
sc sd se sg sh si simple sk sl sm sn so sq sr ss st su sv sw ta te tg th ti tk tl tn to tr ts tt tw ty ug uk ur uz ve vi
vo wa wo xh yi yo za zh zh-classical zh-min-nan zh-yue zu
"""
_LANGUAGE_EDITIONS = frozenset(_EDITION_CODES.split())
_LANGUAGE_CODE = re.compile(r"^[a-z]{2,3}(-[a-z0-9]{1,8})*$")  # also be-x-old, zh-min-nan, roa-tara
_REDIRECT = re.compile(
    r"^\s*#\s*(?:redirect|rinvia|rinvio|rimando|weiterleitung|redirection|redirección|redireccion|doorverwijzing|"
    r"перенаправление|перенапр|yönlendirme|yönlendir|patrz|przekieruj|重定向|転送|リダイレクト)\s*:?\s*\[\[([^\]|]*)",
    re.IGNORECASE,
)
_NO_PAGE_CHARACTER = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")  # XML's non-characters
# Behaviour switches (``__NOTOC__``, ``__notoc__``): MediaWiki removes them from the page's text; also the local
# names of __NOTOC__ on the Russian, German, French and Turkish wikis and of __NOTOC__, __TOC__ and __FORCETOC__ on
# the Italian ones (Messages*.php). No other ``__WORD__`` (C's ``__FILE__`` shows as written).
_BEHAVIOUR_SWITCH = re.compile(
    r"__(?:NOTOC|FORCETOC|TOC|NOEDITSECTION|NEWSECTIONLINK|NONEWSECTIONLINK|NOGALLERY|HIDDENCAT|"
    r"EXPECTUNUSEDCATEGORY|NOCONTENTCONVERT|NOCC|NOTITLECONVERT|NOTC|INDEX|NOINDEX|STATICREDIRECT|DISAMBIG|"
    r"NOGLOBAL|EXPECTUNUSEDTEMPLATE|ARCHIVEDTALK|NOTALK|"
    r"БЕЗ_ОГЛАВЛЕНИЯ|БЕЗ_ОГЛ|KEIN_INHALTSVERZEICHNIS|KEININHALTSVERZEICHNIS|AUCUNSOMMAIRE|AUCUNETDM|"
    r"İÇİNDEKİLERYOK|NOINDICE|INDICE|FORZAINDICE)__", re.IGNORECASE)
_MAX_DEPTH = 60
# The parser's time grows with the square of the markup left open (~1 s at 4,000 braces of unclosed "{{x|"; 20,000
# took minutes): a page with more unclosed braces and brackets than this is no article, it is damage.
MAX_UNCLOSED = 4_000
# HTML tags left open cost the same (4 s at 4,000 unclosed "<small>", 16 s at 8,000); elements that never close
# (``<br>``) cost nothing.
_TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9]*)\b[^<>]*?(/?)>")
_VOID_TAGS = frozenset({"br", "hr", "wbr", "img", "meta", "link", "col", "area", "base", "input", "source", "track",
                        "param", "embed", "references"})


class WikitextError(Exception):
    """A page that cannot be converted (the parser failed or the markup nests absurdly deep)."""


@dataclass(frozen=True)
class Link:
    start: int
    end: int
    target: str  # normalized title, not yet redirect-resolved
    trail: int = 0  # characters of link trail ("s" of [[lichen]]s) at the anchor's end, outside the link's own text


@dataclass(frozen=True)
class ParsedText:
    text: str
    links: tuple[Link, ...]
    blank_links: int = 0  # entity links that show no text (``[[Apple| ]]``, ``[[Apple|{{lang|fr|Pomme}}]]``)


# --first-bold-as-link: the first bold of the lead links to the page when fewer characters than this, newlines aside,
# come before it (the paper's reference preprocessing, its max_chars_before_bold_text)
MAX_CHARS_BEFORE_BOLD = 50


@dataclass(frozen=True)
class WikitextOptions:
    keep_section_links: bool = False
    first_bold_as_link: bool = False
    use_prepass: bool = True


@dataclass
class _Builder:
    """Text pieces and the links among them, before whitespace is tidied."""

    pieces: list[str] = field(default_factory=list)
    length: int = 0
    links: list[Link] = field(default_factory=list)
    blank_links: int = 0
    bold_linked: bool = False
    in_lead: bool = True

    def add(self, text: str) -> None:
        if not text.isascii():
            text = text.translate(_INVISIBLE_FORMAT)
        if text:
            self.pieces.append(text)
            self.length += len(text)

    def add_link(self, anchor: str, target: str, trail: str = "") -> None:
        anchor = anchor.strip()
        if not anchor:
            self.add(trail)
            return
        start = self.length
        self.add(anchor + trail)
        self.links.append(Link(start, self.length, target, len(trail)))


def redirect_target_from_text(wikitext: str) -> str | None:
    """The target of ``#REDIRECT [[Target#section]]``, decoded (``decode_target``), its fragment split off (also
    common localized magic words; "" for a redirect without a page: ``[[#section]]``, ``[[]]``), else None."""
    match = _REDIRECT.match(wikitext)
    if match is None:
        return None
    return decode_target(match.group(1)).split("#", 1)[0].strip()


def redirect_article(target: str, namespaces: Namespaces) -> str | None:
    """The article a redirect's target (decoded, its fragment split off) names, as a link to it would: None for a
    page outside the article namespace or on another wiki (``Wikipedia:About``, ``Category:X``, ``wikt:x``)."""
    return classify_link(target, namespaces, WikitextOptions()).target


def is_language_link(prefix: str) -> bool:
    """True if ``[[prefix:Title]]`` links to another language's edition (shown beside the article, not in it): a
    code of ``_LANGUAGE_EDITIONS`` in any case, or a lower-case prefix shaped like one."""
    stripped = prefix.strip()
    if stripped.lower() in _INTERWIKI:
        return False
    return stripped.lower() in _LANGUAGE_EDITIONS or bool(_LANGUAGE_CODE.match(stripped))


def is_interwiki(prefix: str) -> bool:
    return prefix.strip().lower() in _INTERWIKI or is_language_link(prefix)


@dataclass(frozen=True)
class _LinkRole:
    """How a [[...]] renders: ``drop`` (nothing shown), else its shown text and entity target (or None)."""

    drop: bool
    target: str | None


def classify_link(title: str, namespaces: Namespaces, options: WikitextOptions) -> _LinkRole:
    """What a wikilink's target (decoded: ``decode_target``) is: an entity link, a shown non-entity link, or
    something not shown at all."""
    title = title.strip()
    leading_colon = title.startswith(":")
    title = title.lstrip(":").strip()
    prefix, separator, rest = title.partition(":")
    if separator:
        namespace = namespaces.lookup(prefix)
        if namespace is None and namespaces.points_here(prefix):
            # [[:en:God|Godt]] on enwiki is a plain link to God: classify the rest as if colon-escaped
            return classify_link(":" + rest, namespaces, options)
        if namespace in (FILE, CATEGORY):
            return _LinkRole(drop=not leading_colon, target=None)
        if namespace is not None and namespace != 0:  # Media: a link to the file itself, shown as its label or title
            return _LinkRole(drop=False, target=None)
        if namespace is None and is_interwiki(prefix):
            return _LinkRole(drop=not leading_colon and is_language_link(prefix), target=None)
    page, hash_sign, section = title.partition("#")
    # a link to a section is no entity link (but with --keep-section-links); [[Paris#]] names no section
    if hash_sign and (not page.strip() or (section.strip() and not options.keep_section_links)):
        return _LinkRole(drop=False, target=None)
    target = namespaces.title(page)
    if not is_possible_title(target):
        return _LinkRole(drop=False, target=None)  # no page has such a title: MediaWiki shows the markup
    return _LinkRole(drop=False, target=target or None)


def _is_pipe_word(node: object) -> bool:
    """Whether ``node`` is ``{{!}}``, MediaWiki's magic word for a literal "|" (a link's pipe: ``[[Foo{{!}}bar]]``)."""
    return isinstance(node, Template) and not node.params and str(node.name).strip() == "!"


def _split_at_pipe_word(node: Wikilink) -> tuple[list[object], Wikicode | None]:
    """A link's title and label (None: the title shows), ``{{!}}`` in a title taken for the pipe it expands to."""
    if node.text is not None:
        return node.title.nodes, node.text
    nodes = node.title.nodes
    for index, part in enumerate(nodes):
        if _is_pipe_word(part):
            return nodes[:index], Wikicode(nodes[index + 1:])
    return nodes, None


def _character(entity: HTMLEntity) -> str:
    """What a character reference shows: its character (a no-break space as a space), or the reference as written
    when it names no character a page may hold (``&#55357;``, half of a UTF-16 pair), as MediaWiki shows it."""
    character = entity.normalize()
    return str(entity) if _NO_PAGE_CHARACTER.fullmatch(character) else character.replace("\xa0", " ")


class _Converter:
    def __init__(self, title: str, namespaces: Namespaces, options: WikitextOptions) -> None:
        self.title = title
        self.namespaces = namespaces
        self.options = options
        self.out = _Builder()

    def render_plain(self, code: Wikicode | None, depth: int) -> str:
        """The visible text of a piece of markup with no links recorded (for link labels and headings)."""
        if code is None:
            return ""
        inner = _Converter(self.title, self.namespaces, self.options)
        inner.out.in_lead = False
        inner.out.bold_linked = True
        inner.walk(code, depth + 1)
        return "".join(inner.out.pieces)

    def walk(self, code: Wikicode, depth: int = 0) -> None:
        if depth > _MAX_DEPTH:
            raise WikitextError(f"markup nested deeper than {_MAX_DEPTH} levels")
        nodes = code.nodes
        index = 0
        while index < len(nodes):
            node = nodes[index]
            if isinstance(node, Wikilink):
                after = index + 1
                trail = ""
                if after < len(nodes) and isinstance(nodes[after], Text):
                    match = self.namespaces.link_trail.match(str(nodes[after].value))
                    if match:
                        trail = match.group(0)
                consumed = self.wikilink(node, trail, depth)
                if consumed and trail:
                    self.out.add(str(nodes[after].value)[len(trail):])
                    index = after
            else:
                self.node(node, depth)
            index += 1

    def wikilink(self, node: Wikilink, trail: str, depth: int) -> bool:
        """Render a wikilink; True if it took the link trail (letters glued to ``]]``) into its anchor."""
        title_nodes, label = _split_at_pipe_word(node)
        # templates in the title are no part of it but for a character's (comments went first)
        title = "".join(str(part) if not isinstance(part, Template) else character_template(str(part.name)) or ""
                        for part in title_nodes)
        role = classify_link(decode_target(title), self.namespaces, self.options)
        if role.drop:
            return False
        if label is not None and label.filter_wikilinks(recursive=False):
            # MediaWiki makes no link of one that holds a link: "[[Foo|a " shows as text, then the inner link
            self.out.add(f"[[{node.title}|")
            self.walk(label, depth + 1)
            self.out.add("]]")
            return False
        # one line: a label's line break (``[[Foo|a<br/>b]]``) is a space, so the whole label stays the anchor
        shown = " ".join(self.render_plain(label if label is not None else node.title, depth).split("\n"))
        # a label of zero-width spaces shows nothing (an ASCII label needs no look at each letter: strip() is enough)
        shown = "" if not shown.isascii() and shows_nothing(shown) else shown.strip()
        if label is None:  # the title as its text, its %XX escapes decoded as MediaWiki shows it
            shown = percent_decoded(shown.lstrip(":").strip())
        if role.target is None:
            self.out.add(shown)
            return False
        self.out.blank_links += not shown
        self.out.add_link(shown, role.target, trail)
        return True

    def node(self, node: object, depth: int) -> None:
        out = self.out
        if isinstance(node, Text):
            value = str(node.value)
            out.add(_UNPAIRED_BLOCK_TAG.sub("", value) if "<" in value else value)
        elif isinstance(node, Template) and (character := character_template(str(node.name))) is not None:
            out.add(character)
        elif isinstance(node, (Template, Argument, Comment)):
            return
        elif isinstance(node, HTMLEntity):
            out.add(_character(node))
        elif isinstance(node, Heading):  # a line of its own, its links kept (tidy strips the line)
            out.in_lead = False
            out.add("\n")
            self.walk(node.title, depth + 1)
            out.add("\n")
        elif isinstance(node, ExternalLink):
            if node.title is not None:
                out.add(self.render_plain(node.title, depth).strip())
        elif isinstance(node, Tag):
            self.tag(node, depth)
        else:
            out.add(str(node))

    def tag(self, node: Tag, depth: int) -> None:
        out = self.out
        name = str(node.tag).strip().lower()
        if name in _INVISIBLE_TAGS:
            return
        if name in _LINE_BREAK_TAGS and (node.self_closing or node.wiki_markup):
            out.add("\n")
        if node.self_closing or node.contents is None:
            return
        if name == "nowiki":
            out.add(str(node.contents))
            return
        if name == "b" and self.options.first_bold_as_link and out.in_lead and not out.bold_linked:
            out.bold_linked = True
            # the page's name opens its lead: a bold further in is another term (the paper's reference, ditto)
            near_start = out.length - sum(piece.count("\n") for piece in out.pieces) < MAX_CHARS_BEFORE_BOLD
            if near_start and not node.contents.filter_wikilinks():  # a bold holding links keeps them (no self-link)
                out.add_link(self.render_plain(node.contents, depth), self.title)
                return
        self.walk(node.contents, depth + 1)


# A line of nothing but list/indent markup (what is left of ":{{template}}"): no text.
_BARE_LIST_MARKUP = re.compile(r"^[:*#;]+$")
_SPACE_RUN = re.compile(r" {2,}")
# Whitespace but newlines and spaces (no-break and other Unicode spaces, U+2028, tabs): one space each, as &nbsp;
# renders, so that the text matches the anchor names taken from it (their whitespace runs are one space).
_OTHER_SPACE = re.compile(r"[^\S\n ]")


def _squeeze(line: str) -> tuple[str, list[int], list[int]]:
    """``line`` with runs of spaces made one space, and how offsets move: (text, run ends, chars removed by then)."""
    ends: list[int] = []
    removed: list[int] = []
    total = 0
    for match in _SPACE_RUN.finditer(line):
        total += len(match.group(0)) - 1
        ends.append(match.end())
        removed.append(total)
    return (_SPACE_RUN.sub(" ", line), ends, removed) if ends else (line, ends, removed)


def _moved(offset: int, ends: list[int], removed: list[int]) -> int:
    """Where ``offset`` of a line lands after ``_squeeze`` (inside a run it lands on the run's one space)."""
    slot = bisect.bisect_right(ends, offset) - 1
    return offset - (removed[slot] if slot >= 0 else 0)


def tidy(raw: str, links: list[Link]) -> ParsedText:
    """Strip every line, drop empty ones, make other whitespace than newlines a space and runs of spaces one
    space; links move with their text."""
    raw = _OTHER_SPACE.sub(" ", raw)  # one character for one: the links' offsets stay
    spans: list[tuple[int, int, int, list[int], list[int]]] = []  # old start, old end, new start, squeeze map
    kept: list[str] = []
    position = new_length = 0
    for line in raw.split("\n"):
        stripped = line.strip()
        if stripped and not _BARE_LIST_MARKUP.match(stripped):
            start = position + len(line) - len(line.lstrip())
            new_length += 1 if kept else 0
            squeezed, ends, removed = _squeeze(stripped)
            spans.append((start, start + len(stripped), new_length, ends, removed))
            kept.append(squeezed)
            new_length += len(squeezed)
        position += len(line) + 1
    content_starts = [span[0] for span in spans]
    moved: list[Link] = []
    for link in links:
        slot = bisect.bisect_right(content_starts, link.start) - 1
        if slot < 0 or link.start >= spans[slot][1]:
            slot += 1  # the anchor starts in the blank margin before a line
        if slot >= len(spans):
            continue
        old_start, old_end, new_start, ends, removed = spans[slot]
        start, end = max(link.start, old_start) - old_start, min(link.end, old_end) - old_start
        if end > start:
            trail = link.trail if link.end <= old_end else 0  # a trail is letters: squeezing leaves it whole
            moved.append(Link(new_start + _moved(start, ends, removed), new_start + _moved(end, ends, removed),
                              link.target, trail))
    return ParsedText("\n".join(kept), tuple(moved))


def left_open(steps: Iterable[int]) -> int:
    """How many openers (+1) no later closer (-1) closes: a closer before any opener closes nothing, so ``}} {{``
    leaves one open (a difference of counts would say none)."""
    depth = lowest = 0
    for step in steps:
        depth += step
        lowest = min(lowest, depth)
    return depth - lowest


def unclosed_markup(wikitext: str) -> int:
    """How many ``{`` and ``[`` a text leaves open (0 without reading the text when it has too few of them for
    MAX_UNCLOSED to matter)."""
    if wikitext.count("{") + wikitext.count("[") <= MAX_UNCLOSED:
        return 0
    return sum(left_open(1 if match.group(0) == opener else -1 for match in re.finditer(pattern, wikitext))
               for opener, pattern in (("{", r"[{}]"), ("[", r"[\[\]]")))


def unclosed_tags(wikitext: str) -> int:
    """How many HTML tags a text leaves open, of every name (0 without reading the text when it has too few ``<``
    for MAX_UNCLOSED to matter)."""
    if wikitext.count("<") <= MAX_UNCLOSED:
        return 0
    steps: dict[str, list[int]] = {}
    for closing, name, self_closing in _TAG.findall(wikitext):
        name = name.lower()
        if not self_closing and name not in _VOID_TAGS:
            steps.setdefault(name, []).append(-1 if closing else 1)
    return sum(left_open(each) for each in steps.values())


def _converted(wikitext: str, title: str, namespaces: Namespaces, options: WikitextOptions) -> _Converter:
    converter = _Converter(title, namespaces, options)
    converter.walk(mwparserfromhell.parse(wikitext))
    return converter


def _markup_left(text: str, wikitext: str) -> bool:
    """Whether the text holds markup the parser could not read because of formatting tags: a tag (MediaWiki shows
    none, a stray ``</small>`` neither), or link brackets where a tag stands in a link (``_tag_in_link``; not
    where the page only shows brackets, ``<nowiki>[[</nowiki>``)."""
    return bool(_FORMATTING_TAG.search(text)) or ("[[" in text and _tag_in_link(wikitext))


def _tag_in_link(wikitext: str) -> bool:
    """Whether a formatting tag stands between a link's ``[[`` and its ``]]`` (links nested in a file's caption
    counted; brackets and tags inside verbatim elements, ``<nowiki>]]</nowiki>``, are no link's): one that may
    straddle the link."""
    try:
        spans = verbatim_spans(wikitext)
    except Unsure:
        return True  # where a verbatim element ends is not known: parse again
    starts = [start for start, _ in spans]
    depth = 0
    for match in _BRACKET_OR_TAG.finditer(wikitext):
        if spans and span_around(spans, starts, match.start()) is not None:
            continue
        token = match.group()
        if token == "[[":
            depth += 1
        elif token == "]]":
            depth = max(0, depth - 1)
        elif depth:
            return True
    return False


def wikitext_to_text(wikitext: str, title: str, namespaces: Namespaces,
                     options: WikitextOptions = WikitextOptions()) -> ParsedText:
    """Plain text and links of an article's wikitext.

    With ``options.use_prepass`` the markup the text drops is cut by a fast scanner first (see
    transforms/parse/wikitext_prepass.py); the page falls back to the full parse wherever the scanner is unsure.
    """
    # MediaWiki renders an indented table (":{|") as a table: unindent it so that both paths see (and drop) one
    wikitext = _BEHAVIOUR_SWITCH.sub("", _INDENTED_TABLE.sub("", strip_comments(wikitext)))
    if options.use_prepass:
        wikitext = strip_dropped_markup(wikitext, namespaces.trail_letters) or wikitext
    if (unclosed := unclosed_markup(wikitext)) > MAX_UNCLOSED:
        raise WikitextError(f"{unclosed:,} braces and brackets left open (more than {MAX_UNCLOSED:,}: the parser "
                            "would take minutes)")
    if (unclosed := unclosed_tags(wikitext)) > MAX_UNCLOSED:
        raise WikitextError(f"{unclosed:,} HTML tags left open (more than {MAX_UNCLOSED:,}: the parser would take "
                            "minutes)")
    try:
        # apostrophe runs read line by line as MediaWiki does (mwparserfromhell pairs them across lines)
        wikitext = balance_quotes(wikitext, keep_bold=options.first_bold_as_link)
        converter = _converted(wikitext, title, namespaces, options)
        text = "".join(converter.out.pieces)
        if _markup_left(text, wikitext):
            # a formatting tag closed inside a link's brackets or opened in them (``[[B|big <small>b]]</small>``):
            # MediaWiki links it all the same, mwparserfromhell leaves the link as text; without the tags it parses
            converter = _converted(_FORMATTING_TAG.sub("", wikitext), title, namespaces, options)
            text = "".join(converter.out.pieces)
    except RecursionError as error:
        raise WikitextError("markup nested too deeply for the parser") from error
    except WikitextError:
        raise
    except Exception as error:  # mwparserfromhell raises assorted internal errors on broken markup
        raise WikitextError(f"parser failed: {type(error).__name__}: {error}") from error
    parsed = tidy(text, converter.out.links)  # a line of list markup only is no text
    return replace(parsed, blank_links=converter.out.blank_links + len(converter.out.links) - len(parsed.links))
