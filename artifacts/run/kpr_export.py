"""export-kpr: a validated run's entity resources in the layout KPR's training code loads.

``DIR/entity_vocab.tsv``: ``[PAD]\\t0``, then ``key\\tindex`` per entity in entity_id order (key = QID where
known, else title; index = entity_id). ``DIR/entity_embeddings.npy``: float16 (N + 1, D), row 0 and the rows of
entities without an embedding zero, row i = entity i. ``DIR/embeddings.pt``: the same rows as one float32 tensor
(``torch.save``), the file the reference's ``train.py`` and ``build_hf_model.py`` load from their
``--entity_embedding_dir``, looking each key of ``--entity_vocab_file`` up in that directory's
``entity_vocab.tsv`` (here the same file, so DIR is both). ``DIR/entity_linker/``: the run's linker files. All
use one index order (``kb_id.trie[key] + 1 == index``), checked while writing.

Only the files the manifest records are read. Everything is written under ``DIR/.export-staging/`` first, then
renamed into place with the vocabulary moved out first and in last: an export directory with ``entity_vocab.tsv``
is complete. ``DIR/.kpr-export.json`` records the files written; a later export replaces or removes only those,
and refuses (before writing anything) when a file it did not write is in the way. DIR may not overlap the run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

import marisa_trie
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from artifacts import faiss as faiss_shards
from artifacts import fs, layout, schemas, tables
from artifacts.errors import InputError, refuse_without_room
from artifacts.linker import EntityLinker
from artifacts.run import lock, manifest, owned
from artifacts.run.publish import copy_file
from artifacts.run.validation import parquet_footer, require_valid

VOCAB_FILE = "entity_vocab.tsv"
EMBEDDINGS_FILE = "entity_embeddings.npy"
TENSOR_FILE = "embeddings.pt"  # the reference's training and model building read DIR/embeddings.pt
LINKER_DIR = "entity_linker"
STAGING_DIR = ".export-staging"
RECORD_FILE = ".kpr-export.json"  # the files an export wrote into DIR (artifacts.run.owned)
WRITER = "export-kpr"
PAD = "[PAD]"
NPY_HEADER_BYTES = 128  # a .npy header of a 2-D array: padded to 64 bytes, 128 in practice
TORCH_SAVE_BYTES = 4096  # at most, beside the tensor's bytes: torch.save's zip entries, pickle and alignment
REQUIRED_STAGES = (layout.DICTIONARY_STAGE, layout.EMBED_ENTITIES_STAGE)
_VOCAB_CHUNK = 65_536
# A key entity_vocab.tsv can hold: the reference reads it as text lines (\r ends one too) split at tabs
_VOCAB_KEY = re.compile(r"[^\t\n\r]+")
_HALF_CHUNK_ROWS = 65_536  # rows converted to float16 at a time (65k x 768 float32: 200 MB)


class MissingStagesError(InputError):
    """The run has not completed the stages an export needs."""

    def __init__(self, output: str, missing: list[str]) -> None:
        stages = " or ".join(map(layout.command_of, missing))
        super().__init__(f"{output} has no completed {stages} stage: an export needs the entity linker and the entity "
                         "embeddings")
        self.output = output
        self.missing = tuple(missing)


class OverlappingExportError(InputError):
    """The export directory is the run itself, or one lies inside the other."""

    def __init__(self, output: str, directory: str) -> None:
        super().__init__(f"{directory} overlaps the run {output}: export to a place outside the run")
        self.output = output
        self.directory = directory

    def __reduce__(self):
        return type(self), (self.output, self.directory)


@dataclass(frozen=True)
class ExportSummary:
    directory: str
    entities: int
    dim: int
    without_embeddings: int  # entities whose row is zero
    # the rows the reference's build_hf_model.py scales every entity vector to the norm of, that are zero: 1 (of a
    # model it built before) and N (of a model train.py made), ascending
    zero_scale_rows: tuple[int, ...]
    language: str  # of the linker's tokenizer (--language): the reference's linker tokenizes English


def check_exportable(output: str) -> None:
    """Refuse a run without the dictionary or the entity embeddings, or one that does not validate."""
    missing = [name for name in REQUIRED_STAGES if name not in manifest.load(output)]
    if missing:
        raise MissingStagesError(output, missing)
    require_valid(output, with_kept_work=False)  # the export reads no kept work


def export_kpr(output: str, directory: str, free_bytes: int | None = None) -> ExportSummary:
    """Write the KPR files of the run under ``output`` into ``directory``, replacing an earlier export there;
    refuses (before writing) a ``directory`` overlapping the run, holding a file in the way that no export
    wrote, or on a filesystem with less than the export's size free (``free_bytes``, where known: the earlier
    export is replaced only once the new one is written)."""
    if fs.overlaps(output, directory):
        raise OverlappingExportError(output, directory)
    check_exportable(output)
    linker = fs.join(output, layout.LINKER)
    linker_files = manifest.recorded_files(output, layout.LINKER, suffix="")
    planned = [VOCAB_FILE, EMBEDDINGS_FILE, TENSOR_FILE,
               *(f"{LINKER_DIR}/{fs.relative(path, linker)}" for path in linker_files)]
    earlier = owned.require_owned(directory, RECORD_FILE, planned, [LINKER_DIR, STAGING_DIR], WRITER)
    keys = entity_keys(output)
    if not len(keys):
        raise InputError(f"{output} has no entity (no link of its articles reached an article): nothing to export")
    refuse_without_room(directory, free_bytes, lambda: export_bytes(output, keys, linker_files))  # before the lock
    with lock.hold(directory, WRITER):  # makes DIR; another export into it meanwhile is refused
        # again: an export that ended meanwhile changed DIR
        earlier = owned.require_owned(directory, RECORD_FILE, planned, [LINKER_DIR, STAGING_DIR], WRITER)
        return write_export(output, directory, keys, linker_files, planned, earlier)


def write_export(output: str, directory: str, keys: pa.StringArray, linker_files: list[str], planned: list[str],
                 earlier: frozenset[str]) -> ExportSummary:
    """``export_kpr``'s writing, under the lock on ``directory``: the ``planned`` files (relative to it), in place of
    the ``earlier`` export's."""
    linker = fs.join(output, layout.LINKER)
    staging = fs.join(directory, STAGING_DIR)
    # recorded before it is made: a killed export's staging directory is its own to remove
    owned.save_record(directory, RECORD_FILE, [*earlier, f"{STAGING_DIR}/"])
    fs.delete_tree(staging)  # a killed export's leftovers
    fs.mkdirs(staging)
    try:
        loaded = EntityLinker.load(linker)
        write_vocab(fs.join(staging, VOCAB_FILE), keys, loaded.kb_keys)
        dim, without, zero_scale_rows = write_embeddings(output, staging, keys)
        for path in linker_files:
            copy_file(path, fs.join(staging, LINKER_DIR, fs.relative(path, linker)))
        # a killed move still owns its files
        owned.save_record(directory, RECORD_FILE, [*earlier, f"{STAGING_DIR}/", *planned])
        move_into_place(staging, directory, earlier)
    finally:
        fs.delete_tree(staging)
    owned.save_record(directory, RECORD_FILE, planned)
    return ExportSummary(directory, len(keys), dim, without, zero_scale_rows, loaded.rules.language)


def export_bytes(output: str, keys: pa.StringArray, linker_files: list[str]) -> int:
    """About the most an export of ``keys`` holds on disk while it runs: the vocabulary, the float16 array, the
    float32 tensor and its float32 scratch rows (removed at the end), and the linker's files."""
    count = len(keys)
    vocab = len(f"{PAD}\t0\n") + (pc.sum(pc.binary_length(keys)).as_py() or 0) + digits_of_1_to(count) + 2 * count
    rows = (count + 1) * embeddings_dim(manifest.recorded_files(output, layout.ENTITY_EMBEDDINGS))
    arrays = (NPY_HEADER_BYTES + rows * np.dtype(np.float16).itemsize) + (TORCH_SAVE_BYTES + rows * 4)
    return vocab + arrays + scratch_bytes(rows) + sum(fs.size(path) for path in linker_files)


def scratch_bytes(values: int) -> int:
    """The float32 scratch rows ``write_embeddings`` fills before it writes both outputs."""
    return NPY_HEADER_BYTES + values * np.dtype(np.float32).itemsize


def digits_of_1_to(count: int) -> int:
    """How many decimal digits the numbers 1..``count`` have in all."""
    return sum(digits * (min(count, 10**digits - 1) - 10**(digits - 1) + 1)
               for digits in range(1, len(str(count)) + 1)) if count > 0 else 0


def entity_key_column(batch: pa.RecordBatch) -> pa.Array:
    """The KPR entity key of each row (``schemas.entity_keys``)."""
    return schemas.entity_keys(batch.column("qid"), batch.column("title"))


def entity_keys(output: str) -> pa.StringArray:
    """Entity keys in entity_id order (``keys[i]`` is entity i + 1's); ids must be exactly 1..N.
    Arrow strings, not Python objects: 7M keys take about 100 MB."""
    ids, keys = [], []
    for batch in manifest.recorded_batches(output, layout.ENTITIES, ["entity_id", "title", "qid"]):
        ids.append(batch.column("entity_id").to_numpy(zero_copy_only=False).astype(np.int64))
        keys.append(entity_key_column(batch))
    all_ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    order = np.argsort(all_ids, kind="stable")
    if not np.array_equal(all_ids[order], np.arange(1, len(all_ids) + 1)):
        raise InputError(f"{output}/entities: entity ids are not exactly 1..{len(all_ids)}")
    return pa.chunked_array(keys, pa.string()).combine_chunks().take(pa.array(order))


def vocab_lines(keys: list[str], first_index: int, kb_keys: marisa_trie.Trie) -> Iterator[str]:
    for index, key in enumerate(keys, first_index):
        if kb_keys.get(key, -1) + 1 != index:
            raise InputError(f"entity {index} ({key!r}) is id {kb_keys.get(key)} in kb_id.trie, not {index - 1}: "
                             "the linker and entities/ disagree")
        if key == PAD or not _VOCAB_KEY.fullmatch(key):
            raise InputError(f"entity {index}: key {key!r} is {PAD} or has a tab or line break, which "
                             "entity_vocab.tsv cannot hold")
        yield f"{key}\t{index}\n"


def write_vocab(path: str, keys: pa.StringArray, kb_keys: marisa_trie.Trie) -> None:
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.write(f"{PAD}\t0\n".encode())
        for start in range(0, len(keys), _VOCAB_CHUNK):
            chunk = keys.slice(start, _VOCAB_CHUNK).to_pylist()
            handle.write("".join(vocab_lines(chunk, start + 1, kb_keys)).encode("utf-8"))


def embeddings_dim(files: list[str]) -> int:
    _, schema = parquet_footer(files[0])
    return schema.field("embedding").type.list_size


def write_embeddings(output: str, staging: str, keys: pa.StringArray) -> tuple[int, int, tuple[int, ...]]:
    """Write the (N + 1, D) rows into ``staging`` twice, as ``entity_embeddings.npy`` (float16) and as
    ``embeddings.pt`` (float32); returns D, the number of entities without an embedding, and which of rows 1 and N
    are among them."""
    files = manifest.recorded_files(output, layout.ENTITY_EMBEDDINGS)
    dim = embeddings_dim(files)
    with (fs.local_target(fs.join(staging, TENSOR_FILE)) as tensor_path,
          fs.local_target(fs.join(staging, EMBEDDINGS_FILE)) as half_path,
          scratch_rows(f"{tensor_path}.float32", (len(keys) + 1, dim)) as vectors):
        filled = fill_rows(files, vectors, keys)
        zero_scale_rows = tuple(row for row in sorted({1, len(keys)} - {0}) if not vectors[row].any())
        save_tensor(vectors, tensor_path)
        save_float16(vectors, half_path)
    return dim, len(keys) - filled, zero_scale_rows


@contextlib.contextmanager
def scratch_rows(path: str, shape: tuple[int, int]) -> Iterator[np.ndarray]:
    """A zeroed float32 array memory-mapped from the local file ``path``, removed when the block ends (7M x 768
    float32 is 21 GB: rows arrive in any order, and neither output can be written before all have)."""
    try:
        yield allocated_memmap(path, np.float32, shape)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def allocated_memmap(path: str, dtype: type, shape: tuple[int, ...]) -> np.memmap:
    """A new .npy file at the local ``path`` memory-mapped, its blocks allocated first: a disk that cannot hold it (or
    ``ulimit -f``) is an ``OSError`` here, one line, where writing into a map of a sparse file is a SIGBUS that ends
    the process without a word."""
    array = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    if not hasattr(os, "posix_fallocate"):  # macOS: as sparse as before
        return array
    with open(path, "r+b") as handle:
        try:
            os.posix_fallocate(handle.fileno(), 0, os.fstat(handle.fileno()).st_size)
        except OSError as error:
            if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a filesystem that allocates no blocks ahead
                raise
    return array


def fill_rows(files: list[str], vectors: np.ndarray, keys: pa.StringArray) -> int:
    """Set row i of ``vectors`` to entity i's embedding; returns how many entities have one (the other rows and
    row 0 stay as they are: zero)."""
    filled = np.zeros(len(vectors), dtype=bool)
    for batch in tables.iter_file_batches(files, ["entity_id", "title", "qid", "embedding"]):
        ids = batch.column("entity_id").to_numpy(zero_copy_only=False).astype(np.int64)
        check_embedding_keys(batch, ids, keys)
        vectors[ids] = faiss_shards.table_vectors(batch)
        filled[ids] = True
    return int(np.count_nonzero(filled[1:]))


def save_tensor(vectors: np.ndarray, path: str) -> None:
    """``torch.save`` of ``vectors`` as one float32 tensor, as the reference's entity embedding script saves
    ``embeddings.pt`` (loads with ``weights_only=True``). The tensor shares the memory map: nothing is copied.
    The file's bytes differ from export to export (torch writes a random serialization id), its values do not."""
    import torch  # only an export needs torch, and importing it takes seconds

    # through a file object of Python's: a write that fails (a full disk, ulimit -f) is its OSError, the context of
    # torch's RuntimeError ("unexpected pos"), which names no errno of its own
    with open(path, "wb") as handle:
        torch.save(torch.from_numpy(vectors), handle)


def save_float16(vectors: np.ndarray, path: str) -> None:
    """Write ``vectors`` as a float16 .npy, a chunk of rows at a time (the whole array never is in memory)."""
    half = allocated_memmap(path, np.float16, vectors.shape)
    for start in range(0, len(vectors), _HALF_CHUNK_ROWS):
        half[start:start + _HALF_CHUNK_ROWS] = vectors[start:start + _HALF_CHUNK_ROWS]
    half.flush()
    del half


def check_embedding_keys(batch: pa.RecordBatch, ids: np.ndarray, keys: pa.StringArray) -> None:
    """Each embedding row's key (QID, else title) is its entity's key: the rows land where the vocab says."""
    same = pc.equal(keys.take(pa.array(ids - 1)), entity_key_column(batch))
    if not pc.all(same).as_py():
        row = int(np.flatnonzero(~same.to_numpy(zero_copy_only=False))[0])
        raise InputError(f"entity_embeddings: entity {ids[row]} has key {entity_key_column(batch)[row]}, "
                         f"entities/ says {keys[int(ids[row]) - 1]}")


def move_into_place(staging: str, directory: str, earlier: frozenset[str]) -> None:
    """Replace the export in ``directory`` by the staged one, file by file (a rename replaces a file): the
    vocabulary goes first out and last in; of the ``earlier`` export's files, those not staged are removed."""
    staged = sorted(fs.relative(path, staging) for path in fs.list_tree(staging))
    if VOCAB_FILE in earlier:
        fs.delete_file(fs.join(directory, VOCAB_FILE))  # out first: the directory no longer looks complete
    owned.remove_stale(directory, earlier, staged)
    for relative in sorted(staged, key=lambda name: name == VOCAB_FILE):
        target = fs.join(directory, relative)
        fs.ensure_parent(target)
        FileSystems.rename([fs.join(staging, relative)], [target])
