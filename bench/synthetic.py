"""Synthetic multistream dumps shaped like English Wikipedia, deterministic from a seed.

What a stage's output grows with grows here as in English Wikipedia, per article (``Shape``, enwiki's figures as
defaults): ~1.5 redirects (a tenth of those after an article's first point at the one before: ~5% of redirects are
chains of two), so ~2.5 titles; ~24 links
whose targets are drawn by heavy-tailed in-link weights (Pareto, alpha 1.2: a few articles get thousands of links,
most a handful; capped at 128 a sample keeps about 60% of the links, as 80-112M of enwiki's 150M), a tenth of the
links to an article written through one of its redirects, ~10% red links; so ~1 linked entity and ~3 anchor names
(its title's name, its redirects' names, one alias) per article; 0.5 pages outside the article namespace. Bodies
are real sentences of the bundled sample with an infobox, references, sections and categories around them, and a
third of the linked names repeated as plain text (so link probabilities are below 1): ~7 KB of XML per article.

The dump is a ``…-multistream.xml.bz2`` with its ``…-multistream-index.txt.bz2`` (stream 0: header and siteinfo,
then streams of ``PAGES_PER_STREAM`` pages, the last stream: the footer), and ``dump.json`` beside them holds the
shape and ``Counts``: what was generated, which parse must count exactly.

    python -m bench.synthetic --articles 10000 --out DIR      # writes DIR/… and prints the counts
"""

from __future__ import annotations

import argparse
import bz2
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from bench.paths import SAMPLE

PAGES_PER_STREAM = 100
DUMP_NAME, INDEX_NAME = "synthetic-multistream.xml.bz2", "synthetic-multistream-index.txt.bz2"
_DESCRIPTION = "dump.json"  # written last: a dump directory with it is complete
_PAGE = re.compile(rb"  <page>.*?</page>\n", re.S)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_WORD = re.compile(r"[A-Za-z]{3,12}")
# Characters a sentence may hold: no markup survives in it, so every generated link is exactly one link.
_PLAIN = re.compile(r"[A-Za-z0-9 ,.;()%$\-\u2013\u2014\"]+")
QUALIFIERS = ("film", "band", "album", "river", "novel", "politician", "company", "song", "village", "footballer")
NON_ARTICLE_NAMESPACES = ("Wikipedia", "Template", "Category", "File")


@dataclass(frozen=True)
class Shape:
    """The dump to generate: ``articles`` and, per article, what English Wikipedia has (see the module doc)."""

    articles: int
    seed: int = 0
    redirects_per_article: float = 1.5
    chained_redirect_share: float = 0.1  # of an article's redirects after its first
    links_per_article: float = 24.0
    red_link_share: float = 0.1
    red_targets_per_article: float = 0.3
    via_redirect_share: float = 0.1  # of all links (drawn among those whose target has a redirect)
    in_link_alpha: float = 1.2
    unlinked_repeat_share: float = 0.3
    non_article_pages_per_article: float = 0.5
    sentences_per_article: float = 34.0

    def __post_init__(self) -> None:
        if self.articles < 1:
            raise ValueError(f"articles must be at least 1, got {self.articles}")


@dataclass(frozen=True)
class Counts:
    """What a generated dump holds; parse's counters of the same names must equal them."""

    pages_read: int = 0
    articles: int = 0
    redirect_pages: int = 0
    chained_redirects: int = 0
    non_article_pages: int = 0
    links: int = 0
    links_via_redirect: int = 0
    red_links: int = 0
    titles: int = 0  # article and redirect titles: what parse's title map holds
    linked_articles: int = 0  # distinct articles some link points to
    red_targets: int = 0  # distinct red-link targets
    anchor_names: int = 0  # distinct case-folded anchor texts and article title names
    xml_bytes: int = 0


@dataclass(frozen=True)
class SyntheticDump:
    """A written synthetic dump: its files, its shape and what it holds."""

    dump: Path
    index: Path
    shape: Shape
    counts: Counts = field(default_factory=Counts)

    @property
    def xml_bytes(self) -> int:
        return self.counts.xml_bytes

    @property
    def articles(self) -> int:
        return self.shape.articles


# --- what the text is made of ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Material:
    """The bundled sample's header (siteinfo), footer, plain sentences and title words."""

    header: bytes
    footer: bytes
    sentences: tuple[str, ...]
    words: tuple[str, ...]


def sample_material(source: Path = SAMPLE) -> Material:
    """Sentences of the sample's articles as the project converts them, and the words titles are made of."""
    from transforms.parse.dump_reader import RawPage, iter_pages, read_siteinfo
    from transforms.parse.wikitext import wikitext_to_text

    xml = bz2.decompress(source.read_bytes())
    first, last = xml.index(b"  <page>"), xml.rindex(b"</page>\n") + len(b"</page>\n")
    siteinfo = read_siteinfo(str(source))
    sentences: set[str] = set()
    for page in iter_pages(str(source), siteinfo):
        if isinstance(page, RawPage) and page.namespace == 0 and page.redirect is None:
            text = wikitext_to_text(page.text, page.title, siteinfo.namespaces).text
            sentences.update(piece for line in text.splitlines() for piece in _SENTENCE_END.split(line)
                             if 40 <= len(piece) <= 240 and _PLAIN.fullmatch(piece))
    ordered = tuple(sorted(sentences))
    words = tuple(sorted({word.lower() for sentence in ordered for word in _WORD.findall(sentence)}))
    return Material(xml[:first], xml[last:], ordered, words)


def draw_titles(rng: np.random.Generator, words: Sequence[str], count: int, taken: set[str]) -> list[str]:
    """``count`` new Title Case titles of 1-3 words (8% with a ``(qualifier)``), none in ``taken`` (updated)."""
    titles: list[str] = []
    while len(titles) < count:
        need = count - len(titles)
        lengths = rng.choice([1, 2, 3], size=need, p=[0.2, 0.55, 0.25])
        picks = rng.integers(0, len(words), size=(need, 3))
        qualified = rng.random(need) < 0.08
        qualifiers = rng.integers(0, len(QUALIFIERS), size=need)
        for row in range(need):
            title = " ".join(words[index].capitalize() for index in picks[row, :lengths[row]])
            if qualified[row]:
                title += f" ({QUALIFIERS[qualifiers[row]]})"
            if title not in taken:
                taken.add(title)
                titles.append(title)
    return titles


def title_name(title: str) -> str:
    """The name a title gives its links: minus a trailing ``(qualifier)``."""
    return title.split(" (", 1)[0]


# --- the link graph -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Graph:
    """Every title and link of a dump: ``redirects[a]``: the redirect titles of article a; ``redirect_target``:
    redirect title -> the title it points to; ``links[a]``: (target written, anchor) of article a's links."""

    titles: list[str]
    aliases: list[str]
    redirects: list[list[str]]
    redirect_target: dict[str, str]
    red_titles: list[str]
    links: list[list[tuple[str, str]]]
    counts: Counts


def in_link_weights(rng: np.random.Generator, count: int, alpha: float) -> np.ndarray:
    """Heavy-tailed weights (Pareto): the probability of being a link's target, normalized."""
    weights = rng.pareto(alpha, count) + 1.0
    return weights / weights.sum()


def link_graph(shape: Shape, words: Sequence[str]) -> Graph:
    """Titles, redirects, aliases and links of a dump of ``shape``, from its seed."""
    rng = np.random.default_rng(shape.seed)
    taken: set[str] = set()
    n = shape.articles
    titles = draw_titles(rng, words, n, taken)
    redirect_counts = rng.poisson(shape.redirects_per_article, n)
    redirect_titles = draw_titles(rng, words, int(redirect_counts.sum()), taken)
    aliases = draw_titles(rng, words, n, taken)
    red_titles = draw_titles(rng, words, max(1, round(shape.red_targets_per_article * n)), taken)
    redirects, redirect_target, chained = [], {}, 0
    starts = np.r_[0, np.cumsum(redirect_counts)]
    chain = rng.random(len(redirect_titles)) < shape.chained_redirect_share
    for article in range(n):
        own = redirect_titles[starts[article]:starts[article + 1]]
        for position, redirect in enumerate(own):
            to_redirect = position > 0 and chain[starts[article] + position]
            redirect_target[redirect] = own[position - 1] if to_redirect else titles[article]
            chained += int(to_redirect)
        redirects.append(own)

    link_counts = rng.poisson(shape.links_per_article, n)
    total = int(link_counts.sum())
    targets = rng.choice(n, size=total, p=in_link_weights(rng, n, shape.in_link_alpha))
    red_targets = rng.choice(len(red_titles), size=total, p=in_link_weights(rng, len(red_titles),
                                                                             shape.in_link_alpha))
    is_red = rng.random(total) < shape.red_link_share
    # the links that can be written through a redirect (not red, their target has one) take the share of all links:
    # drawn at the share among all, they came to ~7% (a fifth of the targets, hubs among them, have no redirect),
    # and a dump of a few hundred articles anywhere from 2% to 7% by its hubs
    reachable = int((~is_red & (redirect_counts[targets] > 0)).sum())
    via = rng.random(total) < shape.via_redirect_share * total / max(reachable, 1)
    choice = rng.random(total)
    links: list[list[tuple[str, str]]] = []
    names = {title_name(title).lower() for title in titles}
    via_count, linked, red_used = 0, set(), set()
    link_starts = np.r_[0, np.cumsum(link_counts)]
    for article in range(n):
        own = []
        for index in range(link_starts[article], link_starts[article + 1]):
            if is_red[index]:
                red = red_titles[red_targets[index]]
                red_used.add(red)
                own.append((red, red))
                continue
            target = int(targets[index])
            linked.add(target)
            if via[index] and redirects[target]:
                written = redirects[target][int(choice[index] * len(redirects[target]))]
                via_count += 1
                own.append((written, title_name(written)))
                continue
            anchors = [title_name(title) for title in (titles[target], aliases[target], *redirects[target])]
            anchor = anchors[0] if choice[index] < 0.5 else anchors[1 + int((choice[index] - 0.5) * 2 *
                                                                              (len(anchors) - 1))]
            own.append((titles[target], anchor))
        names.update(anchor.lower() for _, anchor in own)
        links.append(own)
    counts = Counts(articles=n, redirect_pages=len(redirect_titles), chained_redirects=chained, links=total,
                    links_via_redirect=via_count, red_links=int(is_red.sum()), titles=n + len(redirect_titles),
                    linked_articles=len(linked), red_targets=len(red_used), anchor_names=len(names))
    return Graph(titles, aliases, redirects, redirect_target, red_titles, links, counts)


# --- pages ----------------------------------------------------------------------------------------------------


def wikilink(target: str, anchor: str) -> str:
    return f"[[{target}]]" if target == anchor else f"[[{target}|{anchor}]]"


def article_text(rng: np.random.Generator, title: str, links: Sequence[tuple[str, str]], material: Material,
                 shape: Shape) -> str:
    """An article's wikitext: infobox, bold title, paragraphs of real sentences carrying its links (and plain
    repeats of some of their names) between their words, sections, references and categories."""
    words, sentences = material.words, material.sentences
    count = max(2, int(rng.poisson(shape.sentences_per_article)))
    body = [sentences[int(index)].split(" ") for index in rng.integers(0, len(sentences), count)]
    repeated = [anchor for (_, anchor), repeat in zip(links, rng.random(len(links)) < shape.unlinked_repeat_share,
                                                      strict=True) if repeat]
    pieces = [wikilink(target, anchor) for target, anchor in links] + repeated
    for piece, at, where in zip(pieces, rng.integers(0, count, len(pieces)), rng.random(len(pieces)), strict=True):
        tokens = body[at]
        tokens.insert(int(where * len(tokens)), piece)
    text = [" ".join(tokens) for tokens in body]
    for at in np.flatnonzero(rng.random(count) < 0.25):
        text[at] += (f"<ref>{{{{cite web |title={words[int(rng.integers(0, len(words)))].capitalize()} "
                     f"|url=https://example.org/{int(rng.integers(0, 1 << 30))} |access-date=2020-01-01}}}}</ref>")
    heading = rng.integers(0, len(words), count)
    lines = ["{{Infobox thing", f"| name = {title}", f"| type = {words[int(heading[0])]}",
             f"| founded = {1800 + count}", "}}", f"'''{title}''' {text[0]}"]
    for start in range(1, count, 4):
        if start % 12 == 1 and start > 1:
            lines.append(f"\n== {words[int(heading[start])].capitalize()} ==")
        lines.append(" ".join(text[start:start + 4]))
    lines += ["\n== References ==", "{{Reflist}}", "",
              *(f"[[Category:{words[int(index)].capitalize()}]]" for index in heading[-2:])]
    return "\n".join(lines)


def page_xml(page_id: int, title: str, namespace: int, text: str, redirect: str | None = None) -> bytes:
    """One ``<page>`` of the export format (0.10)."""
    redirect_tag = f"    <redirect title={quoteattr(redirect)} />\n" if redirect is not None else ""
    return (f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{namespace}</ns>\n    <id>{page_id}</id>\n"
            f"{redirect_tag}    <revision>\n      <id>{page_id + 100_000_000}</id>\n"
            f"      <timestamp>2026-11-01T00:00:00Z</timestamp>\n      <model>wikitext</model>\n"
            f"      <format>text/x-wiki</format>\n      <text xml:space=\"preserve\">{escape(text)}</text>\n"
            f"    </revision>\n  </page>\n").encode()


@dataclass(frozen=True)
class Page:
    """One page of the dump, before it is written (``xml``)."""

    page_id: int
    title: str
    namespace: int
    text: str
    redirect: str | None = None

    def xml(self) -> bytes:
        return page_xml(self.page_id, self.title, self.namespace, self.text, self.redirect)


def pages(shape: Shape, graph: Graph, material: Material) -> Iterator[Page]:
    """Every page in page-id order: each article, then its redirects, then its share of non-article pages."""
    rng = np.random.default_rng([shape.seed, 1])
    non_article = rng.poisson(shape.non_article_pages_per_article, shape.articles)
    page_id = 10
    for article, title in enumerate(graph.titles):
        yield Page(page_id, title, 0, article_text(rng, title, graph.links[article], material, shape))
        page_id += 1
        for redirect in graph.redirects[article]:
            target = graph.redirect_target[redirect]
            yield Page(page_id, redirect, 0, f"#REDIRECT [[{target}]]\n\n{{{{R from alternative name}}}}", target)
            page_id += 1
        for extra in range(int(non_article[article])):
            prefix = NON_ARTICLE_NAMESPACES[(article + extra) % len(NON_ARTICLE_NAMESPACES)]
            namespace = {"Wikipedia": 4, "Template": 10, "Category": 14, "File": 6}[prefix]
            yield Page(page_id, f"{prefix}:{title} {extra}", namespace, f"About [[{title}]].")
            page_id += 1


# --- files ----------------------------------------------------------------------------------------------------


def write_multistream(header: bytes, pages: Iterable[bytes], footer: bytes, directory: Path) -> tuple[int, int]:
    """A multistream .xml.bz2 + index of ``pages`` in ``directory``; returns (pages, uncompressed bytes)."""
    lines: list[str] = []
    offset = size = count = 0
    with (directory / DUMP_NAME).open("wb") as out:
        def stream(chunk: bytes) -> None:
            nonlocal offset, size
            compressed = bz2.compress(chunk, 9)
            out.write(compressed)
            offset += len(compressed)
            size += len(chunk)

        stream(header)
        batch: list[bytes] = []
        for page in pages:
            page_id = re.search(rb"<id>(\d+)</id>", page).group(1).decode()
            title = re.search(rb"<title>(.*?)</title>", page).group(1).decode()
            lines.append(f"{offset}:{page_id}:{title}")
            batch.append(page)
            count += 1
            if len(batch) == PAGES_PER_STREAM:
                stream(b"".join(batch))
                batch = []
        if batch:
            stream(b"".join(batch))
        stream(footer)
    (directory / INDEX_NAME).write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))
    return count, size


def split_dump(xml: bytes) -> tuple[bytes, list[bytes], bytes]:
    """(header up to the first page, pages, footer) of a whole dump's XML."""
    found = _PAGE.findall(xml)
    first = xml.index(found[0])
    last = xml.rindex(found[-1]) + len(found[-1])
    return xml[:first], found, xml[last:]


def synthetic_dump(shape: Shape, directory: Path, material: Material | None = None) -> SyntheticDump:
    """The dump of ``shape`` in ``directory``, generated unless already complete there (same shape)."""
    described = directory / _DESCRIPTION
    if described.exists():
        saved = json.loads(described.read_text())
        if saved["shape"] == asdict(shape):
            return SyntheticDump(directory / DUMP_NAME, directory / INDEX_NAME, shape, Counts(**saved["counts"]))
        described.unlink()
    directory.mkdir(parents=True, exist_ok=True)
    material = material or sample_material()
    graph = link_graph(shape, material.words)
    count, size = write_multistream(material.header, (page.xml() for page in pages(shape, graph, material)),
                                    material.footer, directory)
    non_article = count - graph.counts.articles - graph.counts.redirect_pages
    counts = Counts(**{**asdict(graph.counts), "pages_read": count, "non_article_pages": non_article,
                       "xml_bytes": size})
    described.write_text(json.dumps({"shape": asdict(shape), "counts": asdict(counts)}, indent=1))
    return SyntheticDump(directory / DUMP_NAME, directory / INDEX_NAME, shape, counts)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--articles", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="directory of the dump (reused when complete)")
    args = parser.parse_args(argv)
    dump = synthetic_dump(Shape(args.articles, args.seed), args.out)
    print(json.dumps({"dump": str(dump.dump), "index": str(dump.index), **asdict(dump.counts)}, indent=1))


if __name__ == "__main__":
    main()
