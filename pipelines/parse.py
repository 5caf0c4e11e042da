"""parse: Wikipedia dump(s) -> articles/ (text + resolved links) and redirects/ (final targets)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam

from artifacts import layout, schemas
from artifacts.errors import InputError
from pipelines.stage import StageContext, run_beam
from transforms.dead_letters import WriteDeadLetters, count, dead_letter
from transforms.dump_io import ReadDumpPages, ReadSqlRows
from transforms.dump_reader import RawPage, SiteInfo, find_multistream_index, looks_multistream, read_siteinfo
from transforms.link_resolution import ResolveLinks, apply_resolution
from transforms.namespaces import ARTICLE
from transforms.redirects import ResolveRedirects
from transforms.titles import normalize_title
from transforms.wikitext import WikitextError, WikitextOptions, redirect_target_from_text, wikitext_to_text

REDIRECT_TAG = "redirect"


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
    except WikitextError as error:
        yield dead_letter("parser_errors", str(error), page_id=page.page_id, title=title, source=page.source)
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


class ParseDump(beam.PTransform):
    """Dump pages (+ optional SQL tables) -> articles, redirects and dead letters."""

    def __init__(self, args: argparse.Namespace, siteinfo: SiteInfo, index_paths: dict[str, str],
                 progress: Callable[[int | None], beam.PTransform] | None = None) -> None:
        super().__init__()
        self._args = args
        self._siteinfo = siteinfo
        self._index_paths = index_paths
        self._progress = progress

    def expand(self, pipeline: beam.Pipeline) -> dict[str, beam.PCollection]:
        args = self._args
        read = pipeline | "ReadDumpPages" >> ReadDumpPages(
            list(args.dump), self._siteinfo, self._index_paths, args.skip_bad_streams, self._progress)
        options = wikitext_options(args)
        classified = read["pages"] | "ClassifyAndConvertPages" >> beam.FlatMap(
            classify_page, self._siteinfo, options).with_outputs(REDIRECT_TAG, "dead_letter", main="articles")
        articles = classified.articles
        pairs = classified[REDIRECT_TAG]
        if args.redirects_sql:
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
        redirects = resolved["redirects"] | "RedirectRows" >> beam.Map(
            lambda row: {"title": row["title"], "target": row["target"]})
        dead_letters = (read["dead_letters"], classified.dead_letter, resolved["dead_letters"]) | (
            "AllDeadLetters" >> beam.Flatten())
        return {"articles": final, "redirects": redirects, "dead_letters": dead_letters}

    def _sql_redirect_pairs(self, pipeline: beam.Pipeline, pages: beam.PCollection) -> beam.PCollection:
        args = self._args
        targets = (pipeline | "ReadRedirectTable" >> ReadSqlRows(args.redirects_sql, "redirect")
                   | "RedirectRowPairs" >> beam.FlatMap(sql_redirect_pair))
        dump_titles = pages | "DumpPageTitles" >> beam.Map(lambda page: (page.page_id, normalize_title(page.title)))
        if args.page_sql:
            sql_titles = (pipeline | "ReadPageTable" >> ReadSqlRows(args.page_sql, "page")
                          | "PageTitlePairs" >> beam.FlatMap(page_title_pair))
            dump_titles = (dump_titles, sql_titles) | "AllPageTitles" >> beam.Flatten()
        return ({"title": dump_titles, "target": targets} | "JoinRedirectSources" >> beam.CoGroupByKey()
                | "NameRedirectSources" >> beam.FlatMapTuple(name_redirect_sources))

    def _qids(self, pipeline: beam.Pipeline) -> beam.PCollection:
        if not self._args.page_props_sql:
            return pipeline | "NoPageProps" >> beam.Create([])
        return (pipeline | "ReadPagePropsTable" >> ReadSqlRows(self._args.page_props_sql, "page_props")
                | "QidPairs" >> beam.FlatMap(qid_pair))


def wikitext_options(args: argparse.Namespace) -> WikitextOptions:
    return WikitextOptions(keep_section_links=args.keep_section_links, first_bold_as_link=args.first_bold_as_link,
                           use_prepass=not args.no_prepass)


def index_paths_for(args: argparse.Namespace) -> dict[str, str]:
    """The multistream index of each dump: given by --dump-index (in dump order) or found beside the dump."""
    if args.dump_index:
        if len(args.dump_index) != len(args.dump):
            raise InputError(f"--dump-index names {len(args.dump_index)} files for {len(args.dump)} dumps")
        return dict(zip(args.dump, args.dump_index, strict=True))
    found = {dump: find_multistream_index(dump) for dump in args.dump}
    for dump in [dump for dump, index in found.items() if not index and looks_multistream(dump)]:
        print(f"warning: {dump}: multistream dump without its index beside it: read as one stream by one worker "
              "(no parallel read); name the index with --dump-index FILE", file=sys.stderr)
    return {dump: index for dump, index in found.items() if index}


class ParseStage:
    """Parse Wikipedia dump(s) into articles with resolved links, and redirects."""

    name = layout.PARSE_STAGE
    outputs = (layout.ARTICLES, layout.REDIRECTS)
    flag_groups = ()

    def config(self, args: argparse.Namespace) -> argparse.Namespace:
        return args  # transitional: the flags themselves until this stage has its frozen config

    def upstream(self, args: argparse.Namespace) -> tuple[str, ...]:
        return ()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("parse")
        group.add_argument("--dump", nargs="+", help="dump file(s): .xml, .xml.bz2, .xml.gz, multistream or parts")
        group.add_argument("--dump-index", nargs="+", default=None,
                           help="multistream index file(s), one per dump (default: found beside the dump)")
        group.add_argument("--redirects-sql", nargs="+", default=None, help="redirect table dump(s) (.sql[.gz])")
        group.add_argument("--page-sql", nargs="+", default=None,
                           help="page table dump(s): names the source pages of --redirects-sql rows")
        group.add_argument("--page-props-sql", nargs="+", default=None,
                           help="page_props table dump(s): wikibase_item gives each article its Wikidata QID")
        group.add_argument("--skip-bad-streams", action="store_true",
                           help="count and skip a corrupt multistream stream instead of stopping")
        group.add_argument("--keep-section-links", action="store_true",
                           help="keep [[Page#Section]] links as links to Page")
        group.add_argument("--first-bold-as-link", action="store_true",
                           help="the first bold text of the lead links to the page itself")
        group.add_argument("--no-prepass", action="store_true",
                           help="parse the full wikitext without the fast markup-removal pre-pass")

    def options(self, args: argparse.Namespace) -> dict[str, Any]:
        return {"keep_section_links": args.keep_section_links, "first_bold_as_link": args.first_bold_as_link,
                "skip_bad_streams": args.skip_bad_streams}

    def external_inputs(self, args: argparse.Namespace) -> dict[str, str]:
        require_dumps(args)
        inputs: dict[str, str] = {}
        for role in ("dump", "dump_index", "redirects_sql", "page_sql", "page_props_sql"):
            for number, path in enumerate(getattr(args, role) or []):
                inputs[f"{role}{number}"] = path
        return inputs

    def run(self, ctx: StageContext, args: argparse.Namespace) -> dict[str, int]:
        require_dumps(args)
        siteinfos = [read_siteinfo(dump) for dump in args.dump]  # each file must be a MediaWiki export
        siteinfo = siteinfos[0]
        index_paths = index_paths_for(args)

        def build(pipeline: beam.Pipeline) -> None:
            parsed = pipeline | "ParseDump" >> ParseDump(
                args, siteinfo, index_paths, lambda total: ctx.progress("pages", total))
            _ = parsed["articles"] | "WriteArticles" >> beam.io.WriteToParquet(
                ctx.staged_prefix(layout.ARTICLES), schemas.ARTICLES, file_name_suffix=".parquet",
                codec=schemas.PARQUET_CODEC)
            _ = parsed["redirects"] | "WriteRedirects" >> beam.io.WriteToParquet(
                ctx.staged_prefix(layout.REDIRECTS), schemas.REDIRECTS, file_name_suffix=".parquet",
                codec=schemas.PARQUET_CODEC)
            _ = parsed["dead_letters"] | "WriteDeadLetters" >> WriteDeadLetters(ctx.errors_prefix("pages"))

        return run_beam(ctx, build)


def require_dumps(args: argparse.Namespace) -> None:
    if not args.dump:
        raise InputError("parse needs --dump FILE [FILE ...]")


STAGE = ParseStage()
