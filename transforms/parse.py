"""parse: dump pages (+ optional SQL tables) -> articles with resolved links, redirects and dead letters."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam

from artifacts.counters import declare, dropped, error, processed
from transforms import dump_io, link_resolution, redirects
from transforms.dead_letters import count, dead_letter
from transforms.dump_io import ReadDumpPages, ReadSqlRows
from transforms.dump_reader import RawPage, SiteInfo
from transforms.link_resolution import ResolveLinks, apply_resolution
from transforms.namespaces import ARTICLE
from transforms.redirects import ResolveRedirects
from transforms.titles import normalize_title
from transforms.wikitext import WikitextError, WikitextOptions, redirect_target_from_text, wikitext_to_text

REDIRECT_TAG = "redirect"

_OWN_COUNTERS = declare(
    dropped("non_article_pages", "pages outside the article namespace"),
    processed("redirect_pages", "redirect pages"),
    error("bad_redirects", "redirect pages without a target"),
    error("parser_errors", "pages the wikitext parser could not convert"),
    dropped("empty_articles", "articles with no text left after markup removal", dead_lettered=True),
    processed("articles", "articles written"),
    processed("links", "entity links in the articles"),
    dropped("duplicate_page_ids", "pages whose id was seen before (the latest revision is kept)"),
    processed("articles_with_qid", "articles with a Wikidata QID"),
    dropped("sql_redirects_skipped", "SQL redirect rows outside the article namespace or to other wikis"),
    dropped("sql_redirects_unknown_source", "SQL redirect rows whose source page is unknown"),
    processed("sql_redirects", "redirects taken from the SQL dump"),
)
# Every counter of the parse stage: its own and those of the readers and resolvers it composes.
COUNTERS = declare(*_OWN_COUNTERS.values(), *dump_io.COUNTERS.values(), *redirects.COUNTERS.values(),
                   *link_resolution.COUNTERS.values())


@dataclass(frozen=True)
class ParseConfig:
    """What the parse stage reads and how: the dump file(s), the multistream index of each (``dump_indexes``,
    in dump order; empty: found beside the dump), the optional SQL table dumps, and the wikitext options."""

    dumps: tuple[str, ...]
    dump_indexes: tuple[str, ...] = ()
    redirects_sql: tuple[str, ...] = ()
    page_sql: tuple[str, ...] = ()
    page_props_sql: tuple[str, ...] = ()
    skip_bad_streams: bool = False
    wikitext: WikitextOptions = field(default_factory=WikitextOptions)

    def __post_init__(self) -> None:
        if not self.dumps:
            raise ValueError("parse needs at least one dump")
        if self.dump_indexes and len(self.dump_indexes) != len(self.dumps):
            raise ValueError(f"{len(self.dump_indexes)} multistream indexes for {len(self.dumps)} dumps")


def classify_page(page: RawPage, siteinfo: SiteInfo, options: WikitextOptions) -> Iterator[Any]:
    """One dump page -> an article dict, a tagged (title, target) redirect pair, a dead letter, or nothing counted."""
    if page.namespace != ARTICLE:
        count("non_article_pages")
        return
    title = normalize_title(page.title)
    raw_target = page.redirect if page.redirect is not None else redirect_target_from_text(page.text)
    if raw_target is not None:
        count("redirect_pages")
        target = normalize_title(raw_target.split("#", 1)[0])
        if target:
            yield beam.pvalue.TaggedOutput(REDIRECT_TAG, (title, target))
        else:
            yield dead_letter("bad_redirects", "redirect without a target", page_id=page.page_id, title=title)
        return
    try:
        parsed = wikitext_to_text(page.text, title, siteinfo.namespaces, options)
    except WikitextError as problem:
        yield dead_letter("parser_errors", str(problem), page_id=page.page_id, title=title, source=page.source)
        return
    if not parsed.text.strip():
        yield dead_letter("empty_articles", "no text left after markup removal", page_id=page.page_id, title=title)
        return
    count("articles")
    count("links", len(parsed.links))
    yield {
        "page_id": page.page_id,
        "title": title,
        "text": parsed.text,
        "links": [{"start": link.start, "end": link.end, "target": link.target, "trail": link.trail}
                  for link in parsed.links],
    }


def assemble_article(page_id: int, joined: dict[str, list[Any]]) -> Iterator[dict[str, Any]]:
    """The final article row: resolved links and the page's Wikidata QID (if the page_props dump had one)."""
    articles = sorted(joined["article"], key=lambda article: article["title"])
    if not articles:
        return  # page_props / links of a page that is not an article of this dump
    if len(articles) > 1:
        count("duplicate_page_ids", len(articles) - 1)
    qids = sorted(joined["qid"])
    if qids:
        count("articles_with_qid")
    yield {**apply_resolution(articles[0], list(joined["links"])), "qid": qids[0] if qids else None}


def sql_redirect_pair(row: dict[str, Any]) -> Iterator[tuple[int, str]]:
    """(rd_from page id, normalized target) for an article-namespace, same-wiki row of the redirect table."""
    if int(row.get("rd_namespace") or 0) != ARTICLE or (row.get("rd_interwiki") or ""):
        count("sql_redirects_skipped")
        return
    target = normalize_title(str(row["rd_title"]))
    if target:
        yield int(row["rd_from"]), target


def page_title_pair(row: dict[str, Any]) -> Iterator[tuple[int, str]]:
    """(page id, title) from a row of the page table, article namespace only."""
    if int(row.get("page_namespace") or 0) == ARTICLE:
        yield int(row["page_id"]), normalize_title(str(row["page_title"]))


def qid_pair(row: dict[str, Any]) -> Iterator[tuple[int, str]]:
    """(page id, QID) from a ``wikibase_item`` row of the page_props table."""
    if row.get("pp_propname") == "wikibase_item" and row.get("pp_value"):
        yield int(row["pp_page"]), str(row["pp_value"])


def name_redirect_sources(page_id: int, joined: dict[str, list[Any]]) -> Iterator[tuple[str, str]]:
    """Redirect-table rows named by their source page title (from the page table or the dump)."""
    titles = sorted(set(joined["title"]))
    if not titles:
        count("sql_redirects_unknown_source", len(joined["target"]))
        return
    for target in joined["target"]:
        count("sql_redirects")
        yield titles[0], target


def redirect_row(row: dict[str, Any]) -> dict[str, Any]:
    """A resolved redirect as a row of redirects/ (without ``target_exists``)."""
    return {"title": row["title"], "target": row["target"]}


class ParseDump(beam.PTransform):
    """Dump pages (+ optional SQL tables) -> {"articles", "redirects", "dead_letters"}.

    ``index_paths``: the multistream index of each dump that has one (read by streams, in parallel);
    ``progress``: a pass-through step given the page total, when known.
    """

    def __init__(self, config: ParseConfig, siteinfo: SiteInfo, index_paths: dict[str, str],
                 progress: Callable[[int | None], beam.PTransform] | None = None) -> None:
        super().__init__()
        self._config = config
        self._siteinfo = siteinfo
        self._index_paths = index_paths
        self._progress = progress

    def expand(self, pipeline: beam.Pipeline) -> dict[str, beam.PCollection]:
        config = self._config
        read = pipeline | "ReadDumpPages" >> ReadDumpPages(
            list(config.dumps), self._siteinfo, self._index_paths, config.skip_bad_streams, self._progress)
        classified = read["pages"] | "ClassifyAndConvertPages" >> beam.FlatMap(
            classify_page, self._siteinfo, config.wikitext).with_outputs(REDIRECT_TAG, "dead_letter", main="articles")
        articles = classified.articles
        pairs = classified[REDIRECT_TAG]
        if config.redirects_sql:
            pairs = (pairs, self._sql_redirect_pairs(pipeline, read["pages"])) | "AllRedirectPairs" >> beam.Flatten()
        titles = articles | "ArticleTitles" >> beam.Map(lambda article: article["title"])
        resolved = {"pairs": pairs, "article_titles": titles} | "ResolveRedirects" >> ResolveRedirects()
        links = {"articles": articles, "redirects": resolved["redirects"]} | "ResolveLinks" >> ResolveLinks()
        joined = {
            "article": articles | "KeyArticlesById" >> beam.Map(lambda article: (article["page_id"], article)),
            "links": links,
            "qid": self._qids(pipeline),
        }
        final = joined | "JoinArticleParts" >> beam.CoGroupByKey() | "AssembleArticles" >> beam.FlatMapTuple(
            assemble_article)
        redirect_rows = resolved["redirects"] | "RedirectRows" >> beam.Map(redirect_row)
        dead_letters = (read["dead_letters"], classified.dead_letter, resolved["dead_letters"]) | (
            "AllDeadLetters" >> beam.Flatten())
        return {"articles": final, "redirects": redirect_rows, "dead_letters": dead_letters}

    def _sql_redirect_pairs(self, pipeline: beam.Pipeline, pages: beam.PCollection) -> beam.PCollection:
        config = self._config
        targets = (pipeline | "ReadRedirectTable" >> ReadSqlRows(list(config.redirects_sql), "redirect")
                   | "RedirectRowPairs" >> beam.FlatMap(sql_redirect_pair))
        dump_titles = pages | "DumpPageTitles" >> beam.Map(lambda page: (page.page_id, normalize_title(page.title)))
        if config.page_sql:
            sql_titles = (pipeline | "ReadPageTable" >> ReadSqlRows(list(config.page_sql), "page")
                          | "PageTitlePairs" >> beam.FlatMap(page_title_pair))
            dump_titles = (dump_titles, sql_titles) | "AllPageTitles" >> beam.Flatten()
        return ({"title": dump_titles, "target": targets} | "JoinRedirectSources" >> beam.CoGroupByKey()
                | "NameRedirectSources" >> beam.FlatMapTuple(name_redirect_sources))

    def _qids(self, pipeline: beam.Pipeline) -> beam.PCollection:
        if not self._config.page_props_sql:
            return pipeline | "NoPageProps" >> beam.Create([])
        return (pipeline | "ReadPagePropsTable" >> ReadSqlRows(list(self._config.page_props_sql), "page_props")
                | "QidPairs" >> beam.FlatMap(qid_pair))
