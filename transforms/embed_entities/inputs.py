"""embed-entities' first part, run by every core: the sampled mentions' windows turned into the model's inputs
([MASK] token ids, ``encoders.mask_inputs``) and written as packed files for the part that holds the GPU.

A worker tokenizes the rows it is given (chunks of one article bucket's windows, in page order, so that nearby
mentions share their sentences' tokens) and buffers their inputs; every ``INPUT_FILE_ROWS`` it writes one Parquet
file (one row group) under the stage's scratch directory and emits its path (``follow.WriteFollowedFiles``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from artifacts import schemas
from artifacts.counters import declare, error, processed
from encoders.batching import PackedLists
from encoders.mask_inputs import SPECIAL_TOKENS, MaskInput, PackedMaskInputs, mask_inputs
from encoders.models import load_tokenizer, read_tokenizer
from transforms.common.dead_letters import DEAD_LETTER_TAG, count, dead_letter
from transforms.common.follow import FollowedFiles, WriteFollowedFiles
from transforms.common.per_worker import PerProcess
from transforms.embed_entities.entity_vectors import MENTION_KEY
from transforms.embed_entities.window_store import window_keys

# A mention's keys as the model's part reads them: which mention (``MENTION_KEY``) and its window's key.
WINDOW_REF = np.dtype([*MENTION_KEY.descr, ("window_key", "<u8")])

COUNTERS = declare(
    processed("mentions_embedded", "mentions given to the model, encoded or reused (a non-finite vector's among them)"),
    error("bad_mention_spans", "mentions whose span lies outside their text"),
    error("empty_contexts", "mentions without any context around them (none at all, or none the tokenizer keeps: "
          "zero-width or control characters only)"),
)

INPUT_PREFIX = "inputs-"  # the input files' names: a follower of the model's part looks for these
INPUT_FILE_ROWS = 8192  # mentions a worker buffers before writing a file (~16 MB of ids at 512 tokens), at most
ROWS_PER_CALL = (64, 512)  # mention rows a tokenizer call takes (Beam's BatchElements bounds)


def mention_problem(row: dict[str, Any]) -> str | None:
    """Why a mention row cannot be embedded, or None."""
    text, start, end = row["text"], row["start"], row["end"]
    if not 0 <= start < end <= len(text):
        return "bad_mention_spans"
    if not (text[:start].strip() or text[end:].strip()):
        return "empty_contexts"
    return None


def cannot_embed(problem: str, row: dict[str, Any]) -> beam.pvalue.TaggedOutput:
    return dead_letter(problem, "mention cannot be embedded", entity_id=row["entity_id"], page_id=row["page_id"],
                       start=row["start"], end=row["end"])


def embeddable(rows: list[dict[str, Any]]) -> Iterator[Any]:
    """The list of mention rows whose text the model can take (one element); the others dead-lettered."""
    good = []
    for row in rows:
        problem = mention_problem(row)
        if problem is None:
            good.append(row)
        else:
            yield cannot_embed(problem, row)
    if good:
        yield good


def mention_keys(rows: Sequence[dict[str, Any]]) -> np.ndarray:
    """The ``MENTION_KEY`` rows (entity, page, link) of mention rows."""
    return np.array([(row["entity_id"], row["page_id"], row["link_index"]) for row in rows], dtype=MENTION_KEY)


def inputs_table(keys: np.ndarray, packed: PackedMaskInputs, salt: str) -> pa.Table:
    """Mentions' keys and their ready inputs, each with its ``window_key`` under the model of ``salt``, as a
    ``schemas.MENTION_INPUTS`` table."""
    ids = pa.ListArray.from_arrays(pa.array(packed.offsets.astype(np.int32)), pa.array(packed.ids, pa.int32()))
    return pa.table({"entity_id": keys["entity_id"], "page_id": keys["page_id"], "link_index": keys["link_index"],
                     "window_key": window_keys(salt, packed), "mask_position": packed.positions, "input_ids": ids},
                    schema=schemas.MENTION_INPUTS)


def table_inputs(table: pa.Table | pa.RecordBatch) -> tuple[np.ndarray, PackedMaskInputs]:
    """The keys (``WINDOW_REF``) and packed inputs of a ``schemas.MENTION_INPUTS`` table (the inverse of
    ``inputs_table``)."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    keys = np.empty(table.num_rows, dtype=WINDOW_REF)
    for name in WINDOW_REF.names:
        keys[name] = table.column(name).to_numpy()
    ids = PackedLists.of_column(table.column("input_ids"))
    packed = PackedMaskInputs(ids.values, ids.offsets, table.column("mask_position").to_numpy().astype(np.int32))
    return keys, packed


class BuildMentionInputs(WriteFollowedFiles):
    """Lists of mention rows -> paths of the Parquet files their inputs were written to (``files``).
    ``tokenizer``: the model's tokenizer saved by ``models.save_tokenizer`` ("": loaded by transformers in each
    worker)."""

    def __init__(self, model: str, max_seq_length: int, window: str, salt: str, files: FollowedFiles,
                 rows_per_file: int, tokenizer: str = "") -> None:
        super().__init__(files, rows_per_file)
        self._max_seq_length, self._window, self._salt = max_seq_length, window, salt
        self._source = tokenizer or model
        self._tokenizers = PerProcess(read_tokenizer if tokenizer else load_tokenizer)

    def setup(self) -> None:
        super().setup()
        self._tokenizer = self._tokenizers.get(self._source)

    def process(self, rows: list[dict[str, Any]]) -> Iterator[Any]:
        """The rows' inputs, held for the files; a row whose context the tokenizer keeps nothing of (zero-width or
        control characters only) is dead-lettered as an empty context: its input would be ``[CLS] [MASK] [SEP]``,
        the same for every entity."""
        inputs = mask_inputs(rows, self._tokenizer, self._max_seq_length, self._window)
        kept = []
        for row, item in zip(rows, inputs, strict=True):
            if len(item.input_ids) > SPECIAL_TOKENS:
                kept.append((row, item))
            else:
                yield cannot_embed("empty_contexts", row)
        if kept:
            count("mentions_embedded", len(kept))
            yield from super().process(kept)

    def table(self, kept: list[tuple[dict[str, Any], MaskInput]]) -> pa.Table:
        return inputs_table(mention_keys([row for row, _ in kept]), PackedMaskInputs.of([item for _, item in kept]),
                            self._salt)


class PrepareMentionInputs(beam.PTransform):
    """Mention rows (entity_id, page_id, link_index, text, start, end) -> the paths of the files holding their
    model inputs (main output ``files``); rows that cannot be embedded go to ``dead_letter``."""

    def __init__(self, build: BuildMentionInputs, progress: beam.PTransform | None = None) -> None:
        super().__init__()
        self._build = build
        self._progress = progress

    def expand(self, mentions: beam.PCollection) -> dict[str, beam.PCollection]:
        if self._progress is not None:
            mentions = mentions | "Progress" >> self._progress
        chunks = (mentions
                  | "BatchMentions" >> beam.BatchElements(min_batch_size=ROWS_PER_CALL[0],
                                                          max_batch_size=ROWS_PER_CALL[1])
                  | "Embeddable" >> beam.FlatMap(embeddable).with_outputs(DEAD_LETTER_TAG, main="rows"))
        built = chunks.rows | "BuildInputs" >> beam.ParDo(self._build).with_outputs(DEAD_LETTER_TAG, main="files")
        dead_letters = (chunks[DEAD_LETTER_TAG], built[DEAD_LETTER_TAG]) | "AllDeadLetters" >> beam.Flatten()
        return {"files": built.files, DEAD_LETTER_TAG: dead_letters}
