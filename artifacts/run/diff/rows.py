"""Each artifact of a run streamed batch by batch into keyed digests (``keyed.Keyed``), bounded memory.

What a row's digest covers decides what counts as "changed": an article's title, text and links; a redirect's
target; a passage's title and text; a dictionary name's top candidates (see ``names``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from artifacts import layout
from artifacts.faiss.files import EMBEDDINGS_DIR
from artifacts.run import manifest
from artifacts.run.diff.keyed import DIGEST_DTYPE, Keyed, concatenate, key_hash, row_digest

BATCH = 65_536
ARTICLE_BATCH = 4_096  # articles become Python strings and link dicts one batch at a time: ~100 MB
NO_KEY = np.iinfo(np.int64).min  # entity ids that no entity row has


def _keyed(output: str, artifact: str, columns: list[str],
           key_of: Callable[[pa.RecordBatch], np.ndarray],
           fields_of: Callable[[dict[str, list]], Iterator[list[str]]], batch_size: int = BATCH) -> Keyed:
    parts = []
    for batch in manifest.recorded_batches(output, artifact, columns, batch_size):
        values = {name: batch.column(name).to_pylist() for name in columns}
        digests = np.fromiter((row_digest(fields) for fields in fields_of(values)), DIGEST_DTYPE, batch.num_rows)
        parts.append((key_of(batch), digests))
    return concatenate(parts)


def _int_keys(column: str) -> Callable[[pa.RecordBatch], np.ndarray]:
    return lambda batch: batch.column(column).to_numpy(zero_copy_only=False).astype(np.int64)


def _hashed_keys(column: str) -> Callable[[pa.RecordBatch], np.ndarray]:
    return lambda batch: np.fromiter((key_hash(value) for value in batch.column(column).to_pylist()), np.int64,
                                     batch.num_rows)


def _link_field(link: dict) -> str:
    return f"{link['start']}:{link['end']}:{link['target']}"


def _article_fields(values: dict[str, list]) -> Iterator[list[str]]:
    for title, text, links in zip(values["title"], values["text"], values["links"], strict=True):
        yield [title, text, *(_link_field(link) for link in links or ())]


def articles(output: str) -> Keyed:
    """Articles by page id; the digest covers title, text and links."""
    return _keyed(output, layout.ARTICLES, ["page_id", "title", "text", "links"], _int_keys("page_id"),
                  _article_fields, ARTICLE_BATCH)


def redirects(output: str) -> Keyed:
    """Redirects by title; the digest is the (final) target."""
    return _keyed(output, layout.REDIRECTS, ["title", "target"], _hashed_keys("title"),
                  lambda values: ([target] for target in values["target"]))


# What the index stage stored of every passage it indexed (id, title, text, vector), from a DPR corpus or cut from
# the articles alike (passages/ holds only the latter).
INDEXED_PASSAGES = f"{layout.INDEX}/{EMBEDDINGS_DIR}"


def passages(output: str) -> Keyed:
    """The indexed passages by id; the digest covers title and text."""
    return _keyed(output, INDEXED_PASSAGES, ["passage_id", "title", "text"], _int_keys("passage_id"),
                  lambda values: ([title, text] for title, text in zip(values["title"], values["text"], strict=True)))


def entity_key(qid: str | None, title: str) -> str:
    """What identifies an entity across dumps: its Wikidata QID, else its title."""
    return f"qid:{qid}" if qid else f"title:{title}"


@dataclass(frozen=True)
class Entities:
    """A run's entities by key hash, and ``key_of_id[entity_id]``: the key hash of each id (``NO_KEY``: none)."""

    keyed: Keyed
    key_of_id: np.ndarray


@dataclass(frozen=True)
class EntityRows:
    """A run's entity ids with the key hashes of their titles and of their QIDs (``NO_KEY``: none)."""

    ids: np.ndarray
    titles: np.ndarray
    qids: np.ndarray


def entity_rows(output: str) -> EntityRows:
    ids, titles, qids = [], [], []
    for batch in manifest.recorded_batches(output, layout.ENTITIES, ["entity_id", "title", "qid"], BATCH):
        ids.append(batch.column("entity_id").to_numpy(zero_copy_only=False).astype(np.int64))
        titles.append(np.fromiter((key_hash(entity_key(None, title)) for title in batch.column("title").to_pylist()),
                                  np.int64, batch.num_rows))
        qids.append(np.fromiter((key_hash(entity_key(qid, "")) if qid else NO_KEY
                                 for qid in batch.column("qid").to_pylist()), np.int64, batch.num_rows))
    return EntityRows(*(np.concatenate(parts) if parts else np.empty(0, np.int64) for parts in (ids, titles, qids)))


def entity_keys(run: EntityRows, other: EntityRows) -> np.ndarray:
    """The key hash of each entity of ``run``: its QID, else the QID of the entity of the same title in ``other``
    (it gained or lost its QID between the dumps, or one run was parsed without page props: the same entity)
    unless ``run`` has an entity of that QID, else its title."""
    keys = np.where(run.qids != NO_KEY, run.qids, run.titles)
    known = other.qids != NO_KEY
    other_titles, other_qids = other.titles[known], other.qids[known]
    order = np.argsort(other_titles, kind="stable")
    other_titles, other_qids = other_titles[order], other_qids[order]
    lacking = np.flatnonzero(run.qids == NO_KEY)
    at = np.minimum(np.searchsorted(other_titles, run.titles[lacking]), max(len(other_titles) - 1, 0))
    found = (other_titles[at] == run.titles[lacking]) if len(other_titles) else np.zeros(len(lacking), bool)
    adopted = other_qids[at[found]]
    free = ~np.isin(adopted, run.qids)
    keys[lacking[found][free]] = adopted[free]
    return keys


def _entities(run: EntityRows, keys: np.ndarray) -> Entities:
    key_of_id = np.full(int(run.ids.max(initial=0)) + 1, NO_KEY, np.int64)
    key_of_id[run.ids] = keys
    return Entities(Keyed.of(keys, np.zeros(len(keys), DIGEST_DTYPE)), key_of_id)


def matched_entities(old: str, new: str) -> tuple[Entities, Entities]:
    """Both runs' entities, keyed so that an entity of both has the same key in each (``entity_keys``)."""
    old_rows, new_rows = entity_rows(old), entity_rows(new)
    return _entities(old_rows, entity_keys(old_rows, new_rows)), _entities(new_rows, entity_keys(new_rows, old_rows))


def keys_of_ids(entity_ids: np.ndarray, key_of_id: np.ndarray) -> np.ndarray:
    """The key hashes of entity ids (``NO_KEY`` for ids the entity table lacks)."""
    known = (entity_ids >= 0) & (entity_ids < len(key_of_id))
    keys = np.full(len(entity_ids), NO_KEY, np.int64)
    keys[known] = key_of_id[entity_ids[known]]
    return keys


def names(output: str, known: Entities) -> Keyed:
    """Dictionary names by name; the digest identifies the name's top candidates: the entity keys with the
    highest commonness (all of them when tied, so ties compare as a set and no order has to be picked).

    Holds three numbers per name-entity pair (20 bytes: 400 MB for 20M pairs)."""
    name_keys, commonness, candidates = [], [], []
    for batch in manifest.recorded_batches(output, layout.NAMES, ["name", "entity_id", "commonness"], BATCH):
        name_keys.append(_hashed_keys("name")(batch))
        commonness.append(batch.column("commonness").to_numpy(zero_copy_only=False).astype(np.float32))
        entity_ids = batch.column("entity_id").to_numpy(zero_copy_only=False).astype(np.int64)
        candidates.append(keys_of_ids(entity_ids, known.key_of_id))
    if not name_keys:
        return concatenate([])
    return top_candidates(np.concatenate(name_keys), np.concatenate(commonness), np.concatenate(candidates))


def top_candidates(name_keys: np.ndarray, commonness: np.ndarray, candidates: np.ndarray) -> Keyed:
    """Per name key, a digest of the set of candidate keys with the name's highest commonness."""
    order = np.lexsort((-commonness, name_keys))
    name_keys, commonness, candidates = name_keys[order], commonness[order], candidates[order]
    starts = np.flatnonzero(np.r_[True, name_keys[1:] != name_keys[:-1]])
    best = np.repeat(commonness[starts], np.diff(np.r_[starts, len(name_keys)]))
    # a sum of key hashes (mod 2^64) does not depend on the order of tied candidates
    tops = np.where(commonness == best, candidates.view(np.uint64), np.uint64(0))
    sums = np.add.reduceat(tops, starts) if len(starts) else np.empty(0, np.uint64)
    padded = np.zeros((len(starts), 2), np.uint64)
    padded[:, 0] = sums
    return Keyed(name_keys[starts], padded.view(DIGEST_DTYPE).ravel())
