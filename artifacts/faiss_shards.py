"""Sharded FAISS indexes under OUT/index/: training once on a sample, adding shard by shard, exact top-k merge.

Layout of ``index/``::

    index.json                      factory, metric, dim, counts, shard list, the encoder options
    trained.faiss                   the trained, empty index (every shard starts from it)
    shard-00003.faiss               one FAISS index per shard; FAISS ids are passage ids (int64, unique)
    shard-00003.ids.npy             the shard's id map: row (insertion order) -> passage id
    embeddings/shard-00003/*.parquet  passage_id, title, text, embedding: the vectors, and the passages'
                                    text for evaluation (a passage's shard is ``shard_of(passage_id)``)

Only inner-product metrics: ``dot`` and ``cosine`` (vectors already L2-normalized by the encoder).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from artifacts import fs
from artifacts.errors import InputError
from artifacts.passages import shard_of

INDEX_JSON = "index.json"
TRAINED_NAME = "trained.faiss"
EMBEDDINGS_DIR = "embeddings"
TRAIN_SAMPLE_DIR = "train_sample"
MAX_TRAIN_SAMPLE = 1_000_000  # vectors: the one global object of the index stage (3 GB at 768 float32)
EXACT_UP_TO = 100_000  # passages: below this the default index is exact
IVF_FLAT_UP_TO = 3_000_000  # passages: below this IVF without compression
IVF_SQ8_UP_TO = 50_000_000  # passages: below this 8-bit scalar quantization; above, product quantization
ADD_CHUNK = 65_536  # vectors per add() call
DEFAULT_NPROBE = 32  # IVF lists searched unless told: recall@10 ~0.98 for IVF-Flat/SQ8 in bench/index.py
DEFAULT_EF_SEARCH = 128
_IVF = re.compile(r"IVF(\d+)")


def shard_name(shard: int) -> str:
    return f"shard-{shard:05d}"


def embedding_schema(dim: int) -> pa.Schema:
    return pa.schema([("passage_id", pa.int64()), ("title", pa.string()), ("text", pa.string()),
                      ("embedding", pa.list_(pa.float32(), dim))])


def train_sample_schema(dim: int) -> pa.Schema:
    return pa.schema([("sample_key", pa.int64()), ("passage_id", pa.int64()),
                      ("embedding", pa.list_(pa.float32(), dim))])


def embedding_table(rows: Sequence[tuple[int, str, str, np.ndarray]], dim: int) -> pa.Table:
    """(passage_id, title, text, vector) rows as one Arrow table (vectors as one flat float32 buffer)."""
    vectors = np.asarray([row[3] for row in rows], dtype=np.float32).reshape(len(rows), dim)
    return pa.Table.from_arrays(
        [pa.array([row[0] for row in rows], pa.int64()), pa.array([row[1] for row in rows], pa.string()),
         pa.array([row[2] for row in rows], pa.string()), _vector_array(vectors, dim)],
        schema=embedding_schema(dim))


def train_sample_table(rows: Sequence[tuple[int, int, np.ndarray]], dim: int) -> pa.Table:
    vectors = np.asarray([row[2] for row in rows], dtype=np.float32).reshape(len(rows), dim)
    return pa.Table.from_arrays([pa.array([row[0] for row in rows], pa.int64()),
                                 pa.array([row[1] for row in rows], pa.int64()), _vector_array(vectors, dim)],
                                schema=train_sample_schema(dim))


def _vector_array(vectors: np.ndarray, dim: int) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), dim)


def table_vectors(table: pa.Table | pa.RecordBatch, column: str = "embedding") -> np.ndarray:
    values = table.column(column)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    dim = values.type.list_size
    return values.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(len(values), dim)


# --- choosing an index ---------------------------------------------------------------------------------------


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


def ivf_lists(factory: str) -> int | None:
    match = _IVF.search(factory)
    return int(match.group(1)) if match else None


def needs_training(factory: str, dim: int) -> bool:
    import faiss

    return not faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT).is_trained


def training_sample_size(factory: str, count: int, dim: int) -> int:
    """Vectors to train on: none for Flat/HNSW; 64 per IVF list (FAISS wants 39+), at most MAX_TRAIN_SAMPLE."""
    if not needs_training(factory, dim):
        return 0
    lists = ivf_lists(factory) or 0
    return min(count, MAX_TRAIN_SAMPLE, max(64 * lists, 65_536))


def check_factory(factory: str, count: int, dim: int) -> None:
    """A clear error for a factory string FAISS rejects or an IVF with more lists than vectors to train on."""
    import faiss

    try:
        faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as error:
        raise InputError(f"--index-factory {factory!r} is not a FAISS factory string for {dim} dims: "
                         f"{str(error).strip().splitlines()[-1]}") from error
    lists = ivf_lists(factory)
    if lists and lists > training_sample_size(factory, count, dim):
        raise InputError(f"--index-factory {factory}: {lists} IVF lists need at least {lists} training vectors, "
                         f"the corpus has {count} passages")


@dataclass(frozen=True)
class MemoryEstimate:
    index_bytes: int  # all shards together, in memory
    train_bytes: int  # the training sample
    bytes_per_vector: float

    def describe(self, shards: int) -> str:
        return (f"about {_human(self.index_bytes)} for the index ({_human(self.index_bytes / max(shards, 1))} per "
                f"shard, {self.bytes_per_vector:.0f} bytes per vector), {_human(self.train_bytes)} to train")


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
        if isinstance(plain, faiss.IndexHNSW):
            per_vector = plain.storage.sa_code_size() + plain.hnsw.nb_neighbors(0) * 4 * 1.1 + 8.0
        else:
            per_vector = plain.sa_code_size() + 8.0
    train = training_sample_size(factory, count, dim) * dim * 4
    return MemoryEstimate(int(per_vector * count + fixed), int(train), per_vector)


def _human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    raise AssertionError("unreachable")


# --- building ------------------------------------------------------------------------------------------------


def gpu_count() -> int:
    """GPUs FAISS can use: 0 with faiss-cpu or without a device."""
    import faiss

    return faiss.get_num_gpus() if hasattr(faiss, "StandardGpuResources") else 0


def new_index(factory: str, dim: int):
    """An empty index that takes passage ids: IVF indexes store ids; others get an IDMap."""
    import faiss

    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    try:
        faiss.extract_index_ivf(index)
        return index
    except RuntimeError:
        return faiss.index_factory(dim, "IDMap," + factory, faiss.METRIC_INNER_PRODUCT)


def train_index(factory: str, dim: int, sample: np.ndarray, use_gpu: bool = False):
    """The trained, empty index; k-means of IVF on every GPU when asked for and available."""
    import faiss

    index = new_index(factory, dim)
    if index.is_trained:
        return index
    if use_gpu and gpu_count():
        try:
            ivf = faiss.extract_index_ivf(index)
            ivf.clustering_index = faiss.index_cpu_to_all_gpus(faiss.IndexFlatL2(dim))
        except RuntimeError:
            pass  # not IVF: trains on the CPU
    index.train(np.ascontiguousarray(sample, dtype=np.float32))
    return index


def add_batches(index, batches: Iterable[tuple[np.ndarray, np.ndarray]], use_gpu: bool = False):
    """Add (ids, vectors) batches; on the GPUs when asked for, available and supported by the index type.
    Returns the index (a CPU index) and the ids in insertion order."""
    import faiss

    target = index
    if use_gpu and gpu_count():
        try:
            target = faiss.index_cpu_to_all_gpus(index)
        except RuntimeError:  # an index type faiss-gpu does not support: add on the CPU
            target = index
    added = []
    for ids, vectors in batches:
        target.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), np.ascontiguousarray(ids, np.int64))
        added.append(np.asarray(ids, dtype=np.int64))
    result = faiss.index_gpu_to_cpu(target) if target is not index else index
    return result, (np.concatenate(added) if added else np.zeros(0, dtype=np.int64))


def write_index(index, path: str) -> None:
    """Write a FAISS index to a local path or any Beam filesystem URL (through a local temporary file)."""
    import faiss

    with tempfile.TemporaryDirectory() as local:
        local_path = os.path.join(local, "index.faiss")
        faiss.write_index(index, local_path)
        upload(local_path, path)


def read_index(path: str, mmap: bool = True):
    """Read a FAISS index (memory-mapped where the type allows) from a local path or a Beam filesystem URL."""
    import faiss

    if not fs.exists(path):
        raise InputError(f"missing index file {path}: run `python run_pipeline.py index` again")
    if "://" in path:
        local = tempfile.mkdtemp(prefix="kpr-index-")
        local_path = os.path.join(local, os.path.basename(path))
        download(path, local_path)
        path = local_path
    flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
    try:
        return faiss.read_index(path, flags)
    except RuntimeError:
        pass  # some index types cannot be memory-mapped: read them whole
    try:
        return faiss.read_index(path)
    except RuntimeError as error:
        raise DamagedIndexError(path, _faiss_reason(error)) from error


class DamagedIndexError(InputError):
    """A FAISS file that exists but cannot be read (cut short, overwritten)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path} is damaged: {reason}")
        self.path, self.reason = path, reason


def _faiss_reason(error: RuntimeError) -> str:
    """The readable end of FAISS's 'Error in <C++ signature> at <file>:<line>: <reason>' message."""
    text = str(error).strip().splitlines()[0]
    if "read error" in text:
        return "the file ends before the index does (cut short?)"
    return text.rsplit(": ", 1)[-1]


def upload(local_path: str, path: str) -> None:
    with open(local_path, "rb") as source, FileSystems.create(
            path, compression_type=CompressionTypes.UNCOMPRESSED) as target:
        shutil.copyfileobj(source, target, 1 << 22)


def download(path: str, local_path: str) -> None:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as source, \
            open(local_path, "wb") as target:
        shutil.copyfileobj(source, target, 1 << 22)


def write_npy(path: str, array: np.ndarray) -> None:
    with tempfile.TemporaryDirectory() as local:
        local_path = os.path.join(local, "array.npy")
        np.save(local_path, array)
        upload(local_path, path)


def read_npy(path: str) -> np.ndarray:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        import io

        return np.load(io.BytesIO(handle.read()))


def iter_parquet_batches(files: Sequence[str], columns: list[str],
                         batch_size: int = ADD_CHUNK) -> Iterator[pa.RecordBatch]:
    for path in files:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            yield from pq.ParquetFile(handle).iter_batches(batch_size=batch_size, columns=columns)


def shard_embedding_files(index_dir: str, shard: str) -> list[str]:
    return fs.list_files(fs.join(index_dir, EMBEDDINGS_DIR, shard), "*.parquet")


def build_shard(index_dir: str, shard: str, trained_path: str, use_gpu: bool = False) -> dict[str, Any]:
    """Add one shard's embeddings to a copy of the trained index; write its index file and id map."""
    files = shard_embedding_files(index_dir, shard)
    batches = ((batch.column(0).to_numpy(), table_vectors(batch))
               for batch in iter_parquet_batches(files, ["passage_id", "embedding"]))
    index, ids = add_batches(read_index(trained_path, mmap=False), batches, use_gpu)
    write_index(index, fs.join(index_dir, f"{shard}.faiss"))
    write_npy(fs.join(index_dir, f"{shard}.ids.npy"), ids)
    return {"name": shard, "index": f"{shard}.faiss", "ids": f"{shard}.ids.npy", "count": len(ids),
            "embeddings": f"{EMBEDDINGS_DIR}/{shard}"}


def read_train_sample(sample_dir: str, size: int) -> np.ndarray:
    """The ``size`` sample rows with the smallest keys, in key order (the same sample whatever the files)."""
    files = fs.list_files(sample_dir, "*.parquet")
    if not files or size == 0:
        return np.zeros((0, 0), dtype=np.float32)
    keys = np.concatenate([batch.column(0).to_numpy() for batch in iter_parquet_batches(files, ["sample_key"])])
    if len(keys) == 0:
        return np.zeros((0, 0), dtype=np.float32)
    threshold = np.partition(keys, min(size, len(keys)) - 1)[min(size, len(keys)) - 1]
    kept_keys, kept = [], []
    for batch in iter_parquet_batches(files, ["sample_key", "embedding"]):
        batch_keys = batch.column(0).to_numpy()
        chosen = batch_keys <= threshold
        kept_keys.append(batch_keys[chosen])
        kept.append(table_vectors(batch)[chosen])
    order = np.argsort(np.concatenate(kept_keys), kind="stable")
    return np.concatenate(kept)[order]


# --- index.json and search -----------------------------------------------------------------------------------


@dataclass
class IndexInfo:
    factory: str
    metric: str
    dim: int
    count: int
    shards: int  # how many shards passages were hashed into (some may be empty)
    shard_files: list[dict[str, Any]] = field(default_factory=list)
    encoder: dict[str, Any] = field(default_factory=dict)
    train_sample: int = 0
    format: int = 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> IndexInfo:
        known = set(cls.__dataclass_fields__)
        return cls(**{key: item for key, item in value.items() if key in known})


def load_index_info(index_dir: str) -> IndexInfo:
    path = fs.join(index_dir, INDEX_JSON)
    if not fs.exists(path):
        raise InputError(f"no index at {index_dir} ({INDEX_JSON} is missing): run `python run_pipeline.py index` first")
    return IndexInfo.from_json(fs.read_json(path))


def merge_top_k(scores: Sequence[np.ndarray], ids: Sequence[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The exact top-k of several shards' top-k lists (rows = queries): highest score first, ties by smaller
    id; id -1 (a shard with fewer than k vectors) never wins. Missing places are (-inf, -1)."""
    all_scores = np.concatenate([np.asarray(part, dtype=np.float32) for part in scores], axis=1)
    all_ids = np.concatenate([np.asarray(part, dtype=np.int64) for part in ids], axis=1)
    all_scores = np.where(all_ids < 0, -np.inf, all_scores)
    order = np.lexsort((all_ids, -all_scores), axis=1)[:, :k]
    top_scores = np.take_along_axis(all_scores, order, axis=1)
    top_ids = np.where(np.isfinite(top_scores), np.take_along_axis(all_ids, order, axis=1), -1)
    if top_ids.shape[1] < k:
        padding = k - top_ids.shape[1]
        top_scores = np.pad(top_scores, ((0, 0), (0, padding)), constant_values=-np.inf)
        top_ids = np.pad(top_ids, ((0, 0), (0, padding)), constant_values=-1)
    return top_scores, top_ids


def set_search_parameters(index, nprobe: int | None, ef_search: int | None) -> None:
    import faiss

    if nprobe:
        with contextlib.suppress(RuntimeError):  # not an IVF index: nothing to set
            faiss.extract_index_ivf(index).nprobe = nprobe
    if ef_search:
        inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
        if isinstance(inner, faiss.IndexHNSW):
            inner.hnsw.efSearch = ef_search


class ShardedIndex:
    """Search every shard of ``OUT/index`` one after the other (one shard in memory at a time) and merge."""

    def __init__(self, index_dir: str, nprobe: int | None = None, ef_search: int | None = None) -> None:
        self.directory = index_dir
        self.info = load_index_info(index_dir)
        self.nprobe = nprobe or DEFAULT_NPROBE
        self.ef_search = ef_search or DEFAULT_EF_SEARCH

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.info.dim:
            raise InputError(f"query vectors have {queries.shape[-1]} dimensions but the index at "
                             f"{self.directory} has {self.info.dim}: search with the encoder that built it")
        best = (np.full((len(queries), k), -np.inf, np.float32), np.full((len(queries), k), -1, np.int64))
        for shard in self.info.shard_files:
            index = self._read_shard(shard)
            set_search_parameters(index, self.nprobe, self.ef_search)
            scores, ids = index.search(queries, k)
            best = merge_top_k([best[0], scores], [best[1], ids], k)
        return best


    def _read_shard(self, shard: dict[str, Any]):
        try:
            return read_index(fs.join(self.directory, shard["index"]))
        except DamagedIndexError as error:
            output = self.directory.rstrip("/").rsplit("/", 1)[0]
            raise InputError(f"index shard {shard['name']} ({error.path}) is damaged: {error.reason}; check the run "
                             f"with `python run_pipeline.py validate --output {output}`") from error


class PassageLookup:
    """Title and text of passages by id, from the shards' embedding files (only the row groups needed)."""

    def __init__(self, index_dir: str, info: IndexInfo, files: frozenset[str] | None = None) -> None:
        self.directory = index_dir
        self.info = info
        self.files = files  # when given, only these embedding files are read (those the manifest records)
        self._ids: dict[str, list[tuple[str, np.ndarray]]] = {}  # shard -> [(file, passage ids)]

    def _shard_ids(self, shard: str) -> list[tuple[str, np.ndarray]]:
        if shard not in self._ids:
            self._ids[shard] = [(path, np.concatenate(
                [batch.column(0).to_numpy() for batch in iter_parquet_batches([path], ["passage_id"])]
                or [np.zeros(0, np.int64)])) for path in shard_embedding_files(self.directory, shard)
                if self.files is None or path in self.files]
        return self._ids[shard]

    def get(self, passage_ids: Iterable[int]) -> dict[int, tuple[str, str]]:
        wanted: dict[str, set[int]] = {}
        for passage_id in {int(value) for value in passage_ids if value >= 0}:
            wanted.setdefault(shard_name(shard_of(passage_id, self.info.shards)), set()).add(passage_id)
        found: dict[int, tuple[str, str]] = {}
        for shard, ids in sorted(wanted.items()):
            targets = np.array(sorted(ids), dtype=np.int64)
            for path, file_ids in self._shard_ids(shard):
                rows = np.nonzero(np.isin(file_ids, targets))[0]
                if len(rows):
                    found.update(_read_rows(path, rows))
        return found


def _read_rows(path: str, rows: np.ndarray) -> dict[int, tuple[str, str]]:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        parquet = pq.ParquetFile(handle)
        starts = np.cumsum([0] + [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)])
        groups = sorted({int(np.searchsorted(starts, row, side="right") - 1) for row in rows})
        result = {}
        for group in groups:
            table = parquet.read_row_group(group, columns=["passage_id", "title", "text"])
            local = rows[(rows >= starts[group]) & (rows < starts[group + 1])] - starts[group]
            picked = table.take(pa.array(local)).to_pylist()
            result.update({row["passage_id"]: (row["title"], row["text"]) for row in picked})
        return result
