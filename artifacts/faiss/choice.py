"""Choosing an index for a corpus: the default factory string by size, its training sample and its memory."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from artifacts.errors import InputError
from artifacts.fs import human_size

MAX_TRAIN_SAMPLE = 1_000_000  # vectors: the one global object of the index stage (3 GB at 768 float32)
KMEANS_POINTS_PER_CENTROID = 39  # FAISS's ClusteringParameters.min_points_per_centroid: it warns below
EXACT_UP_TO = 100_000  # passages: below this the default index is exact
IVF_FLAT_UP_TO = 3_000_000  # passages: below this IVF without compression
IVF_SQ8_UP_TO = 50_000_000  # passages: below this 8-bit scalar quantization; above, product quantization
_IVF = re.compile(r"IVF(\d+)")
_PQ = re.compile(r"\b(O?)PQ\d+(?:x(\d+))?")  # a product quantizer PQ<m>[x<nbits>] (8 bits unless told), or OPQ<m>
_QUANTIZER = re.compile(r"IVF\d+\(([^)]*)\)")  # an IVF's coarse quantizer given as a factory string of its own
# A count of zero where FAISS takes one: IVF lists, graph neighbours, sub-vectors, bits, output dimensions. FAISS
# builds such an index, then aborts the process (HNSW0: an assertion; PQ8x0: a division by zero) or finds nothing.
_ZERO_COUNT = re.compile(r"(?:IVF|HNSW|NSG|PCAW?R?|OPQ|PQ|PQ\d+x)0+(?!\d)")
_FAISS_LOCATION = re.compile(r"^Error in .*? at \S+:\d+: ")
_FAISS_ASSERTION = re.compile(r"^Error: '.*?' failed: ")
# Building a shard holds the worker's own memory and its float32 vectors once, streamed from its bucket files into
# the index: at most SHARD_GROWTH bytes a byte of vectors (1.01-1.06 measured: tests/index/test_index_memory.py,
# bench/scale.py) above WORKER_BASE_GB (0.58 GB measured in the one process of a local run, model loaded).
SHARD_GROWTH = 1.2
WORKER_BASE_GB = 1.0
MAX_SHARD_MEMORY_GB = 1e6  # --shard-memory-gb at most: a petabyte (inf made the bytes an integer of nothing)
DEFAULT_SHARD_MEMORY_GB = 8.0  # per worker building a shard: DPR's 21M x 768 -> 16 shards of 4 GB of vectors
MIN_BUCKETS_PER_SHARD = 8  # a bucket is sorted in memory while its shard is written: at most 1/8 of the shard
MAX_BUCKETS = 512  # a worker keeps one staged file open per bucket (and its buffer: artifacts/faiss/buckets.py)
MAX_SHARDS = MAX_BUCKETS  # a shard is a union of buckets
SHARDS_ARE = (f"a count of FAISS shards (each a union of hash buckets, of which a worker writes at most {MAX_BUCKETS} "
              "at once)")
GB = 1 << 30
DEFAULT_NPROBE = 32  # IVF lists searched unless told: recall@10 ~0.98 for IVF-Flat/SQ8 in bench/index.py
DEFAULT_EF_SEARCH = 128


class FactoryError(InputError):
    """A FAISS factory string that cannot index this corpus (rejected by FAISS, or too many IVF lists)."""

    def __init__(self, factory: str, problem: str) -> None:
        super().__init__(f"FAISS factory {factory!r}: {problem}")
        self.factory, self.problem = factory, problem


def _power_of_two(value: float) -> int:
    return 1 << max(4, round(math.log2(max(value, 16))))


def default_factory(count: int, dim: int) -> str:
    """Exact search for small corpora; IVF (about 4 sqrt(n) lists) for medium ones; with 8-bit scalar
    quantization for large ones (21M x 768 -> ``IVF16384,SQ8``, ~15 GiB: recall@10 ~0.98 at nprobe 32 in
    bench/index.py); with product quantization (dim/8 bytes per vector) beyond 50M passages."""
    if count <= EXACT_UP_TO:
        return "Flat"
    nlist = min(65_536, _power_of_two(4 * math.sqrt(count)))
    if count <= IVF_FLAT_UP_TO:
        return f"IVF{nlist},Flat"
    if count <= IVF_SQ8_UP_TO or dim % 8 or dim // 8 > 96:
        return f"IVF{nlist},SQ8"
    return f"IVF{nlist},PQ{dim // 8}"


def vector_bytes(count: int, dim: int) -> int:
    return count * dim * 4


def shards_for_memory(count: int, dim: int, memory_bytes: int) -> int:
    """The fewest shards, a power of two, such that building one fits in ``memory_bytes``: the worker's own
    WORKER_BASE_GB and its float32 vectors SHARD_GROWTH times."""
    room = memory_bytes - WORKER_BASE_GB * GB
    if room <= 0:
        raise ValueError(f"{memory_bytes} bytes leave no room for vectors beside a worker's own {WORKER_BASE_GB} GB")
    needed = max(1, math.ceil(vector_bytes(count, dim) * SHARD_GROWTH / room))
    return 1 << (needed - 1).bit_length()


def bucket_count(shards: int | None, estimated_count: int, dim: int, memory_bytes: int) -> int:
    """Hash buckets to encode into, decided before the count is known: MIN_BUCKETS_PER_SHARD per shard, of the
    ``shards`` asked for, else of the shards that twice the estimated count would need (a power of two: every
    power of two up to it divides it, so the shards chosen from the exact count are unions of buckets)."""
    if shards:
        return shards * max(1, min(MIN_BUCKETS_PER_SHARD, MAX_BUCKETS // shards))
    return min(MAX_BUCKETS, shards_for_memory(2 * estimated_count, dim, memory_bytes) * MIN_BUCKETS_PER_SHARD)


def chosen_shards(count: int, dim: int, memory_bytes: int, buckets: int) -> int:
    """The shards for the exact count within ``memory_bytes`` per shard; at most ``buckets`` (a power of two)."""
    return min(buckets, shards_for_memory(count, dim, memory_bytes))


def ivf_lists(factory: str) -> int | None:
    match = _IVF.search(factory)
    return int(match.group(1)) if match else None


def pq_centroids(factory: str) -> int | None:
    """The most centroids per sub-vector a product quantizer of the factory learns from the passages: 2**nbits of
    ``PQ<m>x<nbits>``, 256 of an OPQ rotation (trained with an 8-bit quantizer); None without one. One inside an
    IVF's coarse quantizer (``IVF1024(PQ16),Flat``) is not counted: it learns from the IVF's centroids."""
    quantizers = _PQ.findall(_QUANTIZER.sub("", factory))
    return max((1 << (8 if rotation else int(bits or 8)) for rotation, bits in quantizers), default=None)


def quantizer_problem(factory: str) -> str | None:
    """Why an IVF's coarse quantizer given as a factory string cannot be trained: a product quantizer in it learns
    its centroids from the IVF's lists' centroids, and needs at least as many lists as it has centroids."""
    match = _QUANTIZER.search(factory)
    centroids = pq_centroids(match.group(1)) if match else None
    lists = ivf_lists(factory) or 0
    if centroids and centroids > lists:
        return (f"its coarse quantizer's product quantizer learns {centroids} centroids per sub-vector from the "
                f"{lists} IVF lists' centroids: it needs at least {centroids} lists")
    return None


def thin_training(factory: str, count: int, dim: int) -> list[str]:
    """A line for each k-means of the factory (an IVF's lists, a product quantizer's centroids per sub-vector) that
    trains on fewer vectors than FAISS asks for (``KMEANS_POINTS_PER_CENTROID`` a centroid; FAISS's own warning is
    not shown: ``build.train_index``)."""
    sample = training_sample_size(factory, count, dim)
    kinds = (("IVF lists", ivf_lists(factory)), ("product quantizer centroids per sub-vector", pq_centroids(factory)))
    return [f"{factory}: its {centroids:,} {kind} are trained on {sample:,} vectors, fewer than the "
            f"{centroids * KMEANS_POINTS_PER_CENTROID:,} FAISS asks for ({KMEANS_POINTS_PER_CENTROID} each): some "
            "may be poor; fewer suit this corpus"
            for kind, centroids in kinds if centroids and 0 < sample < centroids * KMEANS_POINTS_PER_CENTROID]


def needs_training(factory: str, dim: int) -> bool:
    import faiss

    return not faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT).is_trained


def training_sample_size(factory: str, count: int, dim: int) -> int:
    """Vectors to train on: none for Flat/HNSW; 64 per IVF list (FAISS wants 39+), at most MAX_TRAIN_SAMPLE."""
    if not needs_training(factory, dim):
        return 0
    lists = ivf_lists(factory) or 0
    return min(count, MAX_TRAIN_SAMPLE, max(64 * lists, 65_536))


def faiss_reason(error: BaseException) -> str:
    """What a FAISS C++ error says, without its location (``Error in <signature> at <file>:<line>:``) and the
    failed assertion's source text."""
    text = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
    return _FAISS_ASSERTION.sub("", _FAISS_LOCATION.sub("", text))


def check_factory_string(factory: str, dim: int) -> None:
    """A ``FactoryError`` for a factory string FAISS cannot parse or cannot build for ``dim`` dimensions: building
    it empty costs nothing, so this runs before any vector is computed."""
    import faiss

    try:
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as error:
        reason = faiss_reason(error)
        problem = ("not a FAISS factory string" if "could not parse" in reason else
                   f"does not fit {dim} dimensions" if "dimension" in reason else
                   "FAISS builds no index of it for inner-product search")  # LSH: METRIC_L2 only
        raise FactoryError(factory, f"{problem} ({reason})") from error
    zero = _ZERO_COUNT.search(factory)
    if zero:
        raise FactoryError(factory, f"{zero.group(0)}: a count of 0 (lists, neighbours, sub-vectors, bits or "
                                    "dimensions) makes no index that finds anything")
    if any("NSG" in type(part).__name__ for part in _parts(index)):
        raise FactoryError(factory, "an NSG graph is built once, from all its vectors, where a shard is added to in "
                                    "batches (FAISS: no incremental addition): HNSW<M>,Flat is a graph that takes them")
    problem = quantizer_problem(factory)
    if problem:
        raise FactoryError(factory, problem)


def _parts(index) -> list:
    """``index`` and the indexes it wraps (an id map's, a transform's, a refinement's base), as their own types;
    views of objects ``index`` owns (the caller keeps it referenced)."""
    import faiss

    parts = [faiss.downcast_index(index)]
    for attribute in ("index", "base_index"):
        inner = getattr(parts[0], attribute, None)
        if isinstance(inner, faiss.Index):
            parts += _parts(inner)
    return parts


def check_factory(factory: str, count: int, dim: int) -> None:
    """A ``FactoryError`` for a factory string FAISS rejects, or whose k-means has more centroids than vectors to
    train on: an IVF's lists, a product quantizer's 2**nbits centroids per sub-vector."""
    check_factory_string(factory, dim)
    sample = training_sample_size(factory, count, dim)
    lists = ivf_lists(factory)
    if lists and lists > sample:
        raise FactoryError(factory, f"{lists} IVF lists need at least {lists} training vectors, "
                                    f"the corpus has {count} passages")
    centroids = pq_centroids(factory)
    if centroids and centroids > sample:
        raise FactoryError(factory, f"its product quantizer learns {centroids} centroids per sub-vector and needs at "
                                    f"least {centroids} training vectors, the corpus has {count} passages (fewer "
                                    "bits, e.g. PQ<m>x4, or Flat/SQ8 suit a small corpus)")


@dataclass(frozen=True)
class MemoryEstimate:
    index_bytes: int  # all shards together, in memory
    train_bytes: int  # the training sample
    bytes_per_vector: float

    def describe(self, shards: int) -> str:
        per_shard = human_size(self.index_bytes / max(shards, 1))
        return (f"about {human_size(self.index_bytes)} for the index ({per_shard} per shard, "
                f"{self.bytes_per_vector:.0f} bytes per vector), {human_size(self.train_bytes)} to train")


def code_size(index, dim: int) -> float:
    """Bytes a vector takes in ``index``; for a type FAISS gives no code size for (a transform first, NSG), the
    vector as it is: the most a code takes."""
    try:
        return float(index.sa_code_size())
    except RuntimeError:
        return dim * 4.0


def memory_estimate(factory: str, count: int, dim: int) -> MemoryEstimate:
    """What the index will take in memory: codes + ids (+ HNSW links) per vector, plus the coarse centroids."""
    import faiss

    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    fixed = 0
    try:
        ivf = faiss.extract_index_ivf(index)
        per_vector = ivf.code_size + 8.0
        fixed = ivf.nlist * dim * 4
    except RuntimeError:
        plain = faiss.downcast_index(index)
        if isinstance(plain, faiss.IndexIDMap):
            plain = faiss.downcast_index(plain.index)
        if isinstance(plain, faiss.IndexHNSW):
            per_vector = code_size(plain.storage, dim) + plain.hnsw.nb_neighbors(0) * 4 * 1.1 + 8.0
        else:
            per_vector = code_size(plain, dim) + 8.0
    train = training_sample_size(factory, count, dim) * dim * 4
    return MemoryEstimate(int(per_vector * count + fixed), int(train), per_vector)

