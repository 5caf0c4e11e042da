"""The dictionary's second pass over the articles: in which paragraphs (or pages) each candidate name occurs, on
spaCy token boundaries, counted per name id (the name's key id in the name trie, memory-mapped once per worker
process) and sent on as Arrow tables per name bucket."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from artifacts.names import NameRules, TokenBounds, TokenSpans, find_names, fold_case, paragraphs
from artifacts.trie_map import TrieMap, load_trie_map
from transforms.common.per_worker import PerProcess
from transforms.common.spill import GatheringDoFn
from transforms.dictionary.tables import doc_count_tables

BATCH_NAME_IDS = 1 << 20  # name occurrences a worker gathers before counting them into per-bucket tables


def name_ids_in(text: str, token_bounds: Callable[[str], TokenBounds], names: TrieMap, rules: NameRules,
                per_page: bool) -> list[int]:
    """The id of every name of ``names`` occurring on token boundaries, once per paragraph (or page) it occurs in."""
    found: list[int] = []
    for unit in paragraphs(text, per_page):
        folded = unit if rules.case_sensitive else fold_case(unit)
        matches = find_names(folded, token_bounds(unit), names.keys.prefixes, rules.max_length,
                             longest_only=False)
        found.extend(names.keys[name] for name in {match.name for match in matches})
    return found


class CountNameDocs(GatheringDoFn):
    """Articles -> (name bucket, table of paragraph counts per name id), summed over batches of occurrences."""

    def __init__(self, rules: NameRules, per_page: bool, batch_ids: int = BATCH_NAME_IDS) -> None:
        self._rules, self._per_page, self._batch_ids = rules, per_page, batch_ids
        self._maps = PerProcess(load_trie_map)

    def setup(self) -> None:
        self._token_spans = TokenSpans(self._rules.language)

    def start_bundle(self) -> None:
        self._ids = array("q")

    def process(self, article: dict[str, Any], names_dir: str) -> Iterator[tuple[int, pa.Table]]:
        self._names = self._maps.get(names_dir)  # kept: Shared frees what nothing refers to
        self._ids.extend(name_ids_in(article["text"], self._token_spans.bounds, self._names, self._rules,
                                     self._per_page))
        if len(self._ids) >= self._batch_ids:
            yield from self._flush()

    def _flush(self) -> list[tuple[int, pa.Table]]:
        ids, self._ids = np.frombuffer(self._ids, dtype=np.int64), array("q")
        return doc_count_tables(ids, self._names.values) if len(ids) else []
