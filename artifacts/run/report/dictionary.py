"""The report's figures of ``dictionary/names``: candidates per name, link probability and commonness histograms,
and the most ambiguous names, streamed in two passes with bounded memory."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from artifacts import layout
from artifacts.run import manifest
from artifacts.run.report.gather import BATCH, entity_titles
from artifacts.run.report.stats import Histogram, ValueCounts

UNIT_BINS = np.linspace(0.0, 1.0, 51)  # link probability and commonness: 2% bins


@dataclass(frozen=True)
class Candidate:
    entity_id: int
    title: str
    link_count: int
    commonness: float


@dataclass(frozen=True)
class AmbiguousName:
    name: str
    total_link_count: int
    doc_count: int
    link_prob: float
    candidates: list[Candidate]  # most common first


@dataclass
class DictionaryStats:
    pairs: int
    names: int
    candidates_per_name: np.ndarray  # [c] = names with c candidate entities
    link_prob: Histogram  # one count per name
    commonness: Histogram  # one count per (name, entity) pair
    ambiguous: list[AmbiguousName]

    @property
    def ambiguous_names(self) -> int:
        return int(self.candidates_per_name[2:].sum())


class _MostAmbiguous:
    """The ``k`` names with the best keys (most candidates, then most links, then name) and all their rows.

    A name's rows may be spread over batches and files; its key is the same on every row, so a name that is
    turned away once (or evicted) can never come back, and memory stays at ``k`` names.
    """

    def __init__(self, k: int) -> None:
        self.k = k
        self.keys: dict[str, tuple[int, int, str]] = {}
        self.rows: dict[str, list[tuple[int, int, float, int, float]]] = {}

    def worst(self) -> tuple[int, int, str] | None:
        return max(self.keys.values()) if len(self.keys) == self.k else None

    def offer(self, key: tuple[int, int, str], row: tuple[int, int, float, int, float]) -> None:
        name = key[2]
        if name not in self.keys:
            worst = self.worst()
            if worst is not None:
                if key >= worst:
                    return
                del self.keys[worst[2]], self.rows[worst[2]]
            self.keys[name], self.rows[name] = key, []
        self.rows[name].append(row)


def _name_hashes(batch: pa.RecordBatch) -> np.ndarray:
    # Python's string hash: stable within this process, which is all the grouping below needs
    names = batch.column("name").to_pylist()
    return np.fromiter((hash(name) for name in names), dtype=np.int64, count=len(names))


@dataclass
class _Candidates:
    """Pass 1: the candidates (rows) of every name, by a 64-bit hash of the name, and the commonness histogram."""

    pairs: int
    hashes: np.ndarray  # sorted name hashes
    counts: np.ndarray  # candidates of each
    commonness: Histogram

    def of(self, batch: pa.RecordBatch) -> np.ndarray:
        """The candidate count of each row's name."""
        return self.counts[np.searchsorted(self.hashes, _name_hashes(batch))]

    def threshold(self, top: int) -> int:
        """The least candidate count a name among the ``top`` most ambiguous ones can have (at least 2)."""
        if len(self.counts) < top:
            return 2
        return max(2, int(np.partition(self.counts, len(self.counts) - top)[len(self.counts) - top]))


def _count_candidates(output: str, batch_size: int) -> _Candidates:
    per_name = ValueCounts()
    commonness = Histogram(UNIT_BINS)
    pairs = 0
    for batch in manifest.recorded_batches(output, layout.NAMES, ["name", "commonness"], batch_size):
        pairs += batch.num_rows
        per_name.add(_name_hashes(batch))
        commonness.add(batch.column("commonness").to_numpy(zero_copy_only=False))
    hashes, counts = per_name.result()
    return _Candidates(pairs, hashes, counts, commonness)


_PASS2_COLUMNS = ["name", "entity_id", "link_count", "total_link_count", "doc_count", "link_prob", "commonness"]


def _offer_rows(chosen: _MostAmbiguous, batch: pa.RecordBatch, row_candidates: np.ndarray,
                values: dict[str, np.ndarray], threshold: int) -> None:
    """Offer the rows of ``batch`` that may belong to one of the most ambiguous names."""
    keep = row_candidates >= threshold
    worst = chosen.worst()
    if worst is not None:  # cheap vectorized pre-filter: rows that cannot beat the worst kept name
        keep &= (-row_candidates < worst[0]) | ((-row_candidates == worst[0]) &
                                                 (-values["total_link_count"] <= worst[1]))
    rows = np.nonzero(keep)[0]
    names = batch.column("name").take(pa.array(rows)).to_pylist() if len(rows) else []
    for row, name in zip(rows.tolist(), names, strict=True):
        key = (-int(row_candidates[row]), -int(values["total_link_count"][row]), name)
        chosen.offer(key, (int(values["entity_id"][row]), int(values["link_count"][row]),
                           float(values["commonness"][row]), int(values["doc_count"][row]),
                           float(values["link_prob"][row])))


def dictionary_stats(output: str, top: int = 20, batch_size: int = BATCH) -> DictionaryStats:
    """Histograms of ``dictionary/names`` and its most ambiguous names, in two streaming passes.

    Pass 1 counts the rows (candidates) of every name by a 64-bit hash of the name (numpy arrays, one entry per
    name, no Python objects) and takes the commonness histogram. Pass 2 looks each row's candidate count up,
    weights the link probability histogram to one count per name, and keeps the rows of the ``top`` names
    with the most candidates (ties: more links first, then by name).
    """
    candidates = _count_candidates(output, batch_size)
    threshold = candidates.threshold(top)
    link_prob = Histogram(UNIT_BINS)
    chosen = _MostAmbiguous(top)
    for batch in manifest.recorded_batches(output, layout.NAMES, _PASS2_COLUMNS, batch_size):
        row_candidates = candidates.of(batch)
        values = {column: batch.column(column).to_numpy(zero_copy_only=False) for column in _PASS2_COLUMNS[1:]}
        link_prob.add(values["link_prob"], weights=1.0 / row_candidates)
        _offer_rows(chosen, batch, row_candidates, values, threshold)
    per_name = np.bincount(candidates.counts) if len(candidates.counts) else np.zeros(1, np.int64)
    return DictionaryStats(candidates.pairs, len(candidates.hashes), per_name, link_prob, candidates.commonness,
                           _ambiguous_names(output, chosen))


def _ambiguous_names(output: str, chosen: _MostAmbiguous) -> list[AmbiguousName]:
    titles = entity_titles(output, {row[0] for rows in chosen.rows.values() for row in rows})
    result = []
    for key in sorted(chosen.keys.values()):
        rows = chosen.rows[key[2]]
        candidates = sorted((Candidate(entity_id, titles.get(entity_id, f"#{entity_id}"), link_count, common)
                             for entity_id, link_count, common, _, _ in rows),
                            key=lambda candidate: (-candidate.commonness, -candidate.link_count,
                                                   candidate.entity_id))
        result.append(AmbiguousName(key[2], -key[1], rows[0][3], rows[0][4], candidates))
    return result


