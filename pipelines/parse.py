"""parse: Wikipedia dump(s) -> articles/ (text + resolved links) and redirects/ (final targets)."""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import apache_beam as beam

from artifacts import fs, layout, schemas, tables
from artifacts.errors import InputError
from artifacts.names import DEFAULT_LANGUAGE, NoTokenizerError, spacy_code
from artifacts.run import manifest
from pipelines.dictionary import checked_language
from pipelines.launcher.stage import StageContext, run_beam
from transforms.common.dead_letters import WriteDeadLetters
from transforms.common.parquet_rows import write_parquet_rows
from transforms.parse.dump_reader import SiteInfo, read_siteinfo, wiki_language
from transforms.parse.graph import (
    COUNTERS,
    SQL_COLUMNS,
    SQL_TABLES,
    ConvertPages,
    ParseConfig,
    ResolveStagedArticles,
)
from transforms.parse.multistream import find_multistream_index, looks_multistream
from transforms.parse.sql_dump import table_definition
from transforms.parse.wikitext import MAX_CHARS_BEFORE_BOLD, WikitextOptions

# Intermediates under OUT/.staging/parse/ (removed when the stage commits).
STAGED_ARTICLES = "staged_articles"
TITLE_RECORDS = "title_records"
TITLE_MAP = "title_map"


def index_paths_for(config: ParseConfig) -> dict[str, str]:
    """The multistream index of each dump: given by --dump-index (in dump order) or found beside the dump."""
    if config.dump_indexes:
        return dict(zip(config.dumps, config.dump_indexes, strict=True))
    found = {dump: find_multistream_index(dump) for dump in config.dumps}
    for dump in [dump for dump, index in found.items() if not index and looks_multistream(dump)]:
        print(f"warning: {dump}: multistream dump without its index beside it: read as one stream by one worker "
              "(no parallel read); name the index with --dump-index FILE", file=sys.stderr)
    return {dump: index for dump, index in found.items() if index}


class ParseStage:
    """Parse Wikipedia dump(s) into articles with resolved links, and redirects."""

    name = layout.PARSE_STAGE
    outputs = layout.STAGE_OUTPUTS[layout.PARSE_STAGE]
    counters = COUNTERS

    def config(self, args: argparse.Namespace) -> ParseConfig:
        wikitext = WikitextOptions(keep_section_links=args.keep_section_links,
                                   first_bold_as_link=args.first_bold_as_link, use_prepass=not args.no_prepass)
        return ParseConfig(dumps=tuple(args.dump), dump_indexes=tuple(args.dump_index or ()),
                           redirects_sql=tuple(args.redirects_sql or ()), page_sql=tuple(args.page_sql or ()),
                           page_props_sql=tuple(args.page_props_sql or ()),
                           skip_bad_streams=args.skip_bad_streams, wikitext=wikitext,
                           dictionary_language=getattr(args, "language", None))  # `all` has the dictionary's

    def upstream(self, config: ParseConfig) -> tuple[str, ...]:
        return ()

    def options(self, config: ParseConfig) -> dict[str, Any]:
        """The options that change the articles; ``prepass`` only when off (the text can differ where the pre-pass
        repairs markup), so that runs with the pre-pass keep their records."""
        return {"keep_section_links": config.wikitext.keep_section_links,
                "first_bold_as_link": config.wikitext.first_bold_as_link, "skip_bad_streams": config.skip_bad_streams,
                **manifest.unless_default("prepass", config.wikitext.use_prepass),
                # with the option on, its rule (an earlier version linked a bold anywhere in the lead)
                **({"max_chars_before_bold": MAX_CHARS_BEFORE_BOLD} if config.wikitext.first_bold_as_link else {})}

    def external_inputs(self, config: ParseConfig) -> dict[str, str]:
        roles = {"dump": config.dumps, "dump_index": config.dump_indexes, "redirects_sql": config.redirects_sql,
                 "page_sql": config.page_sql, "page_props_sql": config.page_props_sql}  # recorded as role + number
        return {f"{role}{number}": path for role, paths in roles.items() for number, path in enumerate(paths)}

    def content_inputs(self, config: ParseConfig) -> dict[str, str]:
        return {}  # dumps: tens of GB, fingerprinted by paths, sizes and times

    def run(self, ctx: StageContext, config: ParseConfig) -> dict[str, int]:
        siteinfos = [read_siteinfo(dump) for dump in config.dumps]  # each file must be a MediaWiki export
        check_one_wiki(config.dumps, siteinfos)
        check_sql_tables(config)
        if (note := language_note(siteinfos[0], config.dictionary_language)) is not None:
            print(note, file=sys.stderr)
        index_paths = index_paths_for(config)
        staged = ctx.staged(STAGED_ARTICLES)
        records = ctx.staged(TITLE_RECORDS)

        def convert(pipeline: beam.Pipeline) -> None:
            converted = pipeline | "ConvertPages" >> ConvertPages(
                config, siteinfos[0], index_paths, lambda total: ctx.progress("pages", total))
            _ = converted["articles"] | "WriteStagedArticles" >> write_parquet_rows(fs.join(staged, "part"),
                                                                             schemas.STAGED_ARTICLES)
            for source, rows in converted["records"].items():
                _ = rows | f"Write{source}TitleRecords" >> write_parquet_rows(fs.join(records, source),
                                                                         schemas.TITLE_RECORDS)
            _ = converted["dead_letters"] | "WriteDeadLetters" >> WriteDeadLetters(ctx.errors_prefix("pages"))

        def resolve(pipeline: beam.Pipeline) -> None:
            resolved = pipeline | "ResolveStagedArticles" >> ResolveStagedArticles(
                fs.list_files(staged, "*.parquet"), records, ctx.staged(TITLE_MAP),
                fs.join(ctx.staged(layout.REDIRECTS), "part-00000-of-00001.parquet"),
                ctx.progress("articles", tables.total_rows(ctx.staging_root, STAGED_ARTICLES)))
            _ = resolved["articles"] | "WriteArticles" >> write_parquet_rows(ctx.staged_prefix(layout.ARTICLES),
                                                                        schemas.ARTICLES)
            _ = resolved["dead_letters"] | "WriteDeadLetters" >> WriteDeadLetters(ctx.errors_prefix("articles"))

        totals = collections.Counter(run_beam(ctx, convert))
        if not tables.total_rows(ctx.staging_root, STAGED_ARTICLES):
            raise InputError(no_article_message(config, totals, ctx.staged_errors))
        totals.update(run_beam(ctx, resolve))
        return dict(sorted(totals.items()))


# wikis named like a language's (``commonswiki``) that are none, or English (``simplewiki``)
NO_LANGUAGE_WIKIS = frozenset({"commons", "meta", "species", "wikidata", "mediawiki", "incubator", "outreach",
                               "sources", "foundation", "test", "test2", "simple"})


def language_note(siteinfo: SiteInfo, dictionary_language: str | None = None) -> str | None:
    """A note for a dump of a wiki in another language than English while the dictionary tokenizes English (by
    default, or ``dictionary_language`` of `all`): an Italian elision ``l'Argento`` hides the name "argento". It
    names spaCy's code of the wiki's language (``nowiki``: ``nb``), or why spaCy has no tokenizer of it here."""
    language = wiki_language(siteinfo.dbname, siteinfo.base_url)
    if language in (None, DEFAULT_LANGUAGE, *NO_LANGUAGE_WIKIS) or (
            dictionary_language is not None and checked_language(dictionary_language) != DEFAULT_LANGUAGE):
        return None
    try:
        advice = f"give it --language {spacy_code(language)}"
    except NoTokenizerError as error:
        advice = (f"spaCy makes no tokenizer of {error.language!r} here ({error.why}); --language xx takes its "
                  "language-neutral rules")
    return (f"note: the dump is {siteinfo.dbname or language + 'wiki'}'s: the dictionary stage finds names on spaCy's "
            f"English token boundaries; {advice}")


def check_sql_tables(config: ParseConfig) -> None:
    """An InputError unless every file given for an SQL table is a dump of that table with the columns read from
    it (the redirect table given as --page-props-sql would be read as no row at all)."""
    for option, table, _ in SQL_TABLES:
        flag = "--" + option.replace("_", "-")
        for path in (found for pattern in getattr(config, option) for found in fs.matching_files(pattern)):
            definition = table_definition(path)
            if definition is None:
                raise InputError(f"{path} ({flag}) is no MySQL dump of a table: "
                                 f"{fs.misnamed_compression(path) or 'no CREATE TABLE at its start'}")
            name, columns = definition
            if name != table:
                raise InputError(f"{path} is a dump of the {name} table: {flag} takes the {table} table")
            missing = [column for column in SQL_COLUMNS[table] if column not in columns]
            if missing:
                raise InputError(f"{path} ({flag}): its {table} table has no column {', '.join(missing)}")


def check_one_wiki(dumps: Sequence[str], siteinfos: Sequence[SiteInfo]) -> None:
    """An InputError unless every dump declares the namespaces of the first: its names decide which pages and
    links are articles, and one set is used for all the files."""
    for dump, siteinfo in zip(dumps[1:], siteinfos[1:], strict=True):
        if siteinfo.namespaces != siteinfos[0].namespaces:
            first, other = siteinfos[0].dbname, siteinfo.dbname
            if first is not None and first == other:
                wikis = f"both of {first}: dumps of two dates?"
            elif first is not None and other is not None:
                wikis = f"wikis {first} and {other}"
            else:  # a <siteinfo> without <dbname> (an export of schema 0.3 has none) names no wiki
                wikis = (f"{first or 'no <dbname>'} and {other or 'no <dbname>'}: two wikis, or one's dumps of two "
                         "dates?")
            raise InputError(f"{dumps[0]} and {dump} declare different namespaces in their <siteinfo> ({wikis}): give "
                             "the dump files of one wiki, all with their <siteinfo>")


def no_article_message(config: ParseConfig, counters: Mapping[str, int], dead_letters: str) -> str:
    """Why a dump gave no article, from what converting it counted (nothing is committed: the next stage would
    have nothing to read)."""
    parts = [f"{label}: {counters.get(name, 0):,}" for name, label in
             (("redirect_pages", "redirects"), ("non_article_pages", "outside the article namespace"))]
    dropped = sum(counters.get(name, 0) for name, counter in COUNTERS.items() if counter.dead_lettered)
    if dropped:
        parts.append(f"dead-lettered: {dropped:,}, see {dead_letters}")
    return (f"no article in {', '.join(config.dumps)}: {counters.get('pages_read', 0):,} pages read, none an "
            f"article ({', '.join(parts)}); give a dump with articles (namespace 0)")


STAGE = ParseStage()
