"""Recall@k of the FAISS index under OUT/index against exact search over the stored passage vectors.

Queries are stored passage vectors picked by a seed-free hash of their passage id. The exact neighbours come
from brute force (inner product, the index's metric) over the stored vectors, streamed batch by batch. Above
``max_exact`` vectors only the first ``max_exact`` stored vectors (shard by shard, in file order; shards are
hash partitions, so this is an unbiased subset) are searched exactly, and FAISS is restricted to the same
passages with an ID selector (or, where an index type's search takes none, by removing the others from the shard
read): the recall of the index's quantization and probing on that subset.

Ties count as hits: a returned passage is right when its exact score reaches the k-th exact score (duplicate
passages have equal vectors, and any of them is a correct answer).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass

import numpy as np

from artifacts import faiss as faiss_shards
from artifacts import fs
from artifacts.errors import InputError
from artifacts.run.report.stats import splitmix64

QUERIES = 200
K = 10
MAX_EXACT = 200_000
_TOLERANCE = 1e-5


@dataclass(frozen=True)
class RecallResult:
    k: int
    queries: int
    recall: float
    exact_vectors: int  # vectors searched exactly
    total_vectors: int
    subset: bool  # True: measured on the first ``exact_vectors`` stored vectors only
    search_settings: str  # e.g. "nprobe 32"
    seconds: float


def stored_files(index_dir: str, info: faiss_shards.IndexInfo,
                 only: Collection[str] | None = None) -> dict[str, list[str]]:
    """The stored vector files of each shard, in shard order; with ``only``, just those of them (the files the
    manifest records: a stray file in a shard's folder is never read)."""
    return {shard["name"]: [path for path in faiss_shards.shard_embedding_files(index_dir, shard["name"])
                            if only is None or path in only] for shard in info.shard_files}


def _stored_vectors(stored: dict[str, list[str]], limit: int) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(shard name, passage ids, vectors) batches of the first ``limit`` stored vectors, shard by shard."""
    from artifacts import tables  # pyarrow and Beam: not imported with this module's defaults (the command line)

    left = limit
    for shard, files in stored.items():
        for batch in tables.iter_file_batches(files, ["passage_id", "embedding"], 16384):
            if left <= 0:
                return
            batch = batch.slice(0, left)
            left -= batch.num_rows
            yield shard, batch.column(0).to_numpy(), faiss_shards.table_vectors(batch)


def _pick_queries(stored: dict[str, list[str]], info: faiss_shards.IndexInfo, limit: int,
                  count: int) -> tuple[np.ndarray, int, dict[str, np.ndarray]]:
    """The ``count`` vectors with the smallest id hashes, how many vectors were seen, the ids seen per shard."""
    keys = np.zeros(0, np.uint64)
    vectors = np.zeros((0, info.dim), np.float32)
    seen = 0
    ids_by_shard: dict[str, list[np.ndarray]] = {}
    for shard, ids, batch_vectors in _stored_vectors(stored, limit):
        seen += len(ids)
        ids_by_shard.setdefault(shard, []).append(ids)
        keys = np.concatenate([keys, splitmix64(ids)])
        vectors = np.concatenate([vectors, batch_vectors])
        order = np.argsort(keys, kind="stable")[:count]
        keys, vectors = keys[order], vectors[order]
    return vectors, seen, {shard: np.concatenate(parts) for shard, parts in ids_by_shard.items()}


def _search_settings(info: faiss_shards.IndexInfo) -> str:
    if lists := faiss_shards.ivf_lists(info.factory):
        quantizer = f", efSearch {faiss_shards.DEFAULT_EF_SEARCH}" if "HNSW" in info.factory else ""
        return f"nprobe {min(faiss_shards.DEFAULT_NPROBE, lists)} of {lists:,} lists{quantizer}"
    if "HNSW" in info.factory:
        return f"efSearch {faiss_shards.DEFAULT_EF_SEARCH}"
    return "exhaustive"


def _selector_parameters(index, selector):
    """Search parameters that restrict ``index`` to ``selector`` with the search breadth ``search`` uses by default
    (``set_search_parameters``): ``nprobe`` lists, ``efSearch`` in an HNSW graph or coarse quantizer."""
    import faiss

    try:
        ivf = faiss.extract_index_ivf(index)
    except RuntimeError:
        ivf = None
    if ivf is not None:
        graph = isinstance(faiss.downcast_index(ivf.quantizer), faiss.IndexHNSW)
        return faiss.SearchParametersIVF(sel=selector, nprobe=faiss_shards.DEFAULT_NPROBE, quantizer_params=(
            faiss.SearchParametersHNSW(efSearch=faiss_shards.DEFAULT_EF_SEARCH) if graph else None))
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    if isinstance(inner, faiss.IndexHNSW):
        return faiss.SearchParametersHNSW(sel=selector, efSearch=faiss_shards.DEFAULT_EF_SEARCH)
    return faiss.SearchParameters(sel=selector)


def _search_subset(index_dir: str, info: faiss_shards.IndexInfo, queries: np.ndarray, k: int,
                   ids_by_shard: dict[str, np.ndarray]) -> np.ndarray:
    """FAISS top-k ids restricted to the given passages of each shard (the shards are searched one by one)."""
    best = (np.full((len(queries), k), -np.inf, np.float32), np.full((len(queries), k), -1, np.int64))
    for shard in info.shard_files:
        allowed = ids_by_shard.get(shard["name"])
        if allowed is None or not len(allowed):
            continue
        index = faiss_shards.read_index(fs.join(index_dir, shard["index"]))
        scores, ids = _search_part(index, allowed, queries, k, info)
        best = faiss_shards.merge_top_k([best[0], scores], [best[1], ids], k)
    return best[1]


def _search_part(index, allowed: np.ndarray, queries: np.ndarray, k: int,
                 info: faiss_shards.IndexInfo) -> tuple[np.ndarray, np.ndarray]:
    """``index`` searched among the ``allowed`` passages only: through an ID selector where its search takes one,
    else with every other passage removed from it (a product quantizer's, whose search takes none); an InputError
    where FAISS does neither (a refined index)."""
    import faiss

    selector = faiss.IDSelectorBatch(np.ascontiguousarray(allowed, dtype=np.int64))
    try:
        return index.search(queries, k, params=_selector_parameters(index, selector))
    except RuntimeError:
        pass  # e.g. "invalid search params": this index type's search takes no selector
    try:
        index.remove_ids(faiss.IDSelectorNot(selector))
    except RuntimeError as error:
        raise InputError(f"FAISS searches no part of a {info.factory} index ({faiss_shards.faiss_reason(error)}): "
                         f"report --max-exact {info.count} measures its recall on all its passages") from error
    faiss_shards.set_search_parameters(index, faiss_shards.DEFAULT_NPROBE, faiss_shards.DEFAULT_EF_SEARCH)
    return index.search(queries, k)


def _exact_scores(stored: dict[str, list[str]], limit: int, queries: np.ndarray, k: int,
                  returned: np.ndarray) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Per query the k-th best exact score, and the exact scores of the returned passages (id -> per query)."""
    top = np.full((len(queries), k), -np.inf, np.float32)
    wanted = np.unique(returned[returned >= 0])
    scores_of: dict[int, np.ndarray] = {}
    for _, ids, vectors in _stored_vectors(stored, limit):
        scores = queries @ vectors.T  # (queries, batch)
        joined = np.concatenate([top, scores], axis=1)
        top = -np.partition(-joined, k - 1, axis=1)[:, :k]
        for column in np.nonzero(np.isin(ids, wanted))[0]:
            scores_of[int(ids[column])] = scores[:, column]
    return top.min(axis=1), scores_of


def index_recall(index_dir: str, queries: int = QUERIES, k: int = K, max_exact: int = MAX_EXACT,
                 files: Collection[str] | None = None) -> RecallResult:
    """Recall@k of the index at ``index_dir`` on ``queries`` stored passage vectors (see the module doc); with
    ``files``, only those stored vector files are read."""
    started = time.time()
    info = faiss_shards.load_index_info(index_dir)
    stored = stored_files(index_dir, info, files)
    limit = min(info.count, max_exact)
    query_vectors, seen, ids_by_shard = _pick_queries(stored, info, limit, queries)
    depth = min(k, seen)
    subset = seen < info.count
    if subset:
        returned = _search_subset(index_dir, info, query_vectors, depth, ids_by_shard)
    else:
        returned = faiss_shards.ShardedIndex(index_dir).search(query_vectors, depth)[1]
    kth, scores_of = _exact_scores(stored, limit, query_vectors, depth, returned)
    hits = 0
    for query, row in enumerate(returned):
        threshold = kth[query] - _TOLERANCE * max(1.0, abs(float(kth[query])))
        hits += sum(1 for passage_id in row
                    if int(passage_id) in scores_of and scores_of[int(passage_id)][query] >= threshold)
    recall = hits / (len(returned) * depth) if len(returned) and depth else 0.0
    return RecallResult(k=depth, queries=len(query_vectors), recall=recall, exact_vectors=seen,
                        total_vectors=info.count, subset=subset, search_settings=_search_settings(info),
                        seconds=time.time() - started)
