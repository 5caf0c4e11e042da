"""What the stages' counters mean: a readable label and a kind (processed, dropped by a filter, bad input)."""

from __future__ import annotations

from dataclasses import dataclass

PROCESSED = "processed"
DROPPED = "dropped"  # removed on purpose: a filter, a duplicate, a link to no entity
ERROR = "error"  # bad input: counted and written to OUT/errors/STAGE/

# Dead-letter kinds (the counter of a record written to OUT/errors/), from transforms/ and pipelines/.
_ERRORS: dict[str, str] = {
    "malformed_pages": "pages whose XML could not be read",
    "bad_streams": "corrupt bz2 streams skipped (--skip-bad-streams)",
    "bad_redirects": "redirect pages without a target",
    "parser_errors": "pages the wikitext parser could not convert",
    "redirect_cycles": "redirect chains that loop or exceed 64 hops",
    "sql_unparsable_statements": "SQL dump statements that could not be parsed",
    "empty_names": "anchors with empty text",
    "names_with_control_characters": "anchors with control characters",
    "bad_mention_spans": "mentions whose span lies outside their text",
    "empty_contexts": "mentions without any context around them",
    "non_finite_vectors": "vectors with NaN or inf (or a zero mean)",
    "bad_quoting": "passage lines with broken quoting",
    "wrong_column_count": "passage lines without 3 columns",
    "bad_ids": "passage lines whose id is not a non-negative integer",
    "empty_texts": "passages with empty text",
    "invalid_utf8": "passage lines that are not UTF-8",
    "too_long_articles": "articles with more words than passage ids per page allow",
}

# Bad input that another counter already counts (shown in the table, never added to the bad-input totals).
_DETAILS: dict[str, str] = {
    "pages_in_bad_streams": "pages inside the skipped bz2 streams",
}

_DROPPED: dict[str, str] = {
    "non_article_pages": "pages outside the article namespace",
    "empty_articles": "articles with no text left after markup removal",
    "duplicate_page_ids": "pages whose id was seen before (the latest revision is kept)",
    "redirects_to_missing_articles": "redirects whose target is not an article of the dump",
    "sql_redirects_skipped": "SQL redirect rows outside the article namespace or to other wikis",
    "sql_redirects_unknown_source": "SQL redirect rows whose source page is unknown",
    "red_link_targets": "link targets that are not articles (no entity without --include-red-links)",
    "red_links_not_entities": "links to targets that are not entities",
    "duplicate_entity_keys": "articles sharing an entity key with another one",
    "names_too_long": "anchors longer than --max-mention-length",
    "names_below_min_link_prob": "names below --min-link-prob",
    "pairs_below_min_commonness": "name-entity pairs below --min-commonness",
    "pairs_below_min_link_count": "name-entity pairs below --min-link-count",
    "pairs_to_non_entities": "name-entity pairs whose target is not an entity",
    "links_to_non_entities": "links whose target is not an entity",
    "entities_without_links": "entities no article links to (no mention to sample)",
    "sampled_pages_missing": "sampled mentions whose source page was not found",
    "entities_without_mentions": "entities without any mention to embed",
    "articles_without_text": "articles without text to cut into passages",
    "duplicate_ids": "passages whose id an earlier row has (the first row is kept, or the last with "
                     "--on-duplicate-id last)",
}

_PROCESSED: dict[str, str] = {
    "files_read": "dump files read",
    "streams_read": "bz2 streams read",
    "pages_read": "pages read",
    "redirect_pages": "redirect pages",
    "articles": "articles written",
    "articles_with_qid": "articles with a Wikidata QID",
    "links": "entity links in the articles",
    "links_via_redirect": "links resolved through a redirect",
    "red_links": "links to titles that are not articles of the dump",
    "redirects_resolved": "redirects resolved to their final target",
    "sql_rows_read": "SQL dump rows read",
    "sql_redirects": "redirects taken from the SQL dump",
    "entities_with_mentions": "entities with sampled mentions",
    "mentions_sampled": "mentions sampled",
    "mentions_embedded": "mentions embedded",
    "entities_embedded": "entities embedded",
    "passages_read": "passages read",
    "passages_with_nul_bytes": "passages whose NUL bytes were removed",
    "passages_encoded": "passages encoded",
    "passages_indexed": "passages in the index",
    "shards_built": "index shards built",
    "train_sample": "vectors the index was trained on",
}

_DROP_WORDS = ("below_", "without_", "missing", "duplicate", "skipped", "unknown", "non_", "not_", "too_long",
               "empty", "dropped")
_ERROR_WORDS = ("error", "bad_", "malformed", "unparsable", "invalid", "corrupt", "cycles", "failed")


@dataclass(frozen=True)
class CounterInfo:
    name: str
    label: str
    kind: str  # PROCESSED, DROPPED or ERROR
    detail: bool = False  # counted by another counter too: not added to totals


def describe_counter(name: str) -> CounterInfo:
    """The meaning of counter ``name``; unknown counters are classified by the words in their name."""
    if name in _DETAILS:
        return CounterInfo(name, _DETAILS[name], ERROR, detail=True)
    for kind, known in ((ERROR, _ERRORS), (DROPPED, _DROPPED), (PROCESSED, _PROCESSED)):
        if name in known:
            return CounterInfo(name, known[name], kind)
    label = name.replace("_", " ")
    if any(word in name for word in _ERROR_WORDS):
        return CounterInfo(name, label, ERROR)
    if any(word in name for word in _DROP_WORDS):
        return CounterInfo(name, label, DROPPED)
    return CounterInfo(name, label, PROCESSED)


def is_dead_lettered(name: str) -> bool:
    """Whether records counted by ``name`` are also written to OUT/errors/STAGE/."""
    return name in _ERRORS or name in {"empty_articles", "duplicate_ids"}


def is_bad_input(name: str) -> bool:
    """Whether counter ``name`` is added to the bad-input totals."""
    info = describe_counter(name)
    return info.kind == ERROR and not info.detail


def bad_input_summary(counters: dict[str, int]) -> str:
    """Bad input in words: records, and skipped streams with the pages they held ("2 streams (106 pages)"), so
    that a stream of ~100 pages does not read as one record."""
    records = sum(value for name, value in counters.items() if name != "bad_streams" and is_bad_input(name))
    streams = counters.get("bad_streams", 0)
    parts = [f"{records:,}"] if records or not streams else []
    if streams:
        pages = counters.get("pages_in_bad_streams", 0)
        parts.append(f"{streams:,} stream{'s' if streams != 1 else ''} ({pages:,} page{'s' if pages != 1 else ''})")
    return " + ".join(parts)
