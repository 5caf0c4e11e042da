"""The encoders' fast path (numpy batches, prefetch thread, one copy back) gives the vectors of a plain forward
pass; token-weighted element batches; zstd Parquet outputs that read back unchanged."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from artifacts import schemas, tables
from encoders.batching import (
    HostBuffers,
    PackedLists,
    PackedListsOfLists,
    in_row_order,
    prefetched,
    queue_forwards,
    to_host,
    token_budget_batches,
)
from encoders.mask_encoder import MaskEncoder
from encoders.mask_inputs import MaskInput, mask_inputs
from encoders.models import ModelSpec
from encoders.retrievers import DenseEncoder, EncoderOptions, passage_segments
from pipelines.launcher.cli import main
from tests.builders import CAPITALS, dpr_passages, write_parsed
from tests.conftest import DIRECT


def mention_rows(count: int) -> list[dict]:
    """Real passage texts with the 6th word as the mention (both sides have context)."""
    rows = []
    for passage in dpr_passages(count=count):
        words = passage.text.split(" ")
        start = len(" ".join(words[:5])) + 1
        rows.append({"entity_id": passage.passage_id, "page_id": 1, "text": passage.text, "start": start,
                     "end": start + len(words[5])})
    return rows


def main_batched_mask_vectors(encoder: MaskEncoder, inputs: list[MaskInput]) -> np.ndarray:
    """main's [MASK] forward (69ab6fb): the same token-budget batches, collated row by row with torch."""
    vectors = np.zeros((len(inputs), encoder.model.config.hidden_size), dtype=np.float32)
    for batch in token_budget_batches([len(item.input_ids) for item in inputs], encoder.max_tokens):
        items = [inputs[index] for index in batch]
        longest = max(len(item.input_ids) for item in items)
        ids = torch.full((len(items), longest), encoder.pad_id, dtype=torch.long)
        attention = torch.zeros((len(items), longest), dtype=torch.long)
        for row, item in enumerate(items):
            ids[row, :len(item.input_ids)] = torch.tensor(item.input_ids)
            attention[row, :len(item.input_ids)] = 1
        with torch.inference_mode():
            states = encoder.model(input_ids=ids, attention_mask=attention).last_hidden_state
        vectors[batch] = states[torch.arange(len(items)), [item.mask_position for item in items]].float().numpy()
    return vectors


def one_by_one_mask_vectors(encoder: MaskEncoder, inputs: list[MaskInput]) -> np.ndarray:
    with torch.inference_mode():
        return np.stack([encoder.model(input_ids=torch.tensor([item.input_ids])).last_hidden_state[
            0, item.mask_position].numpy() for item in inputs])


@pytest.fixture(scope="module")
def minilm_mask_encoder(minilm_path) -> MaskEncoder:
    return MaskEncoder(ModelSpec(str(minilm_path)), layer=-1, max_tokens=2048)


def test_mask_vectors_are_mains_exactly_and_a_plain_forward_pass(minilm_mask_encoder):
    inputs = mask_inputs(mention_rows(40), minilm_mask_encoder.tokenizer, 128)
    assert len({len(item.input_ids) for item in inputs}) > 10  # several lengths: padding inside the batches
    vectors = minilm_mask_encoder.encode(inputs)
    assert vectors.dtype == np.float32 and vectors.shape == (40, 384)
    assert np.array_equal(vectors, main_batched_mask_vectors(minilm_mask_encoder, inputs))
    np.testing.assert_allclose(vectors, one_by_one_mask_vectors(minilm_mask_encoder, inputs), rtol=0, atol=1e-5)


def main_batched_passage_vectors(encoder: DenseEncoder, passages: list) -> np.ndarray:
    """main's passage forward (69ab6fb) for a DPR encoder: the same batches, collated row by row with torch, no
    token types (all 0, as DPR feeds them), [CLS] vector."""
    firsts, seconds = passage_segments(passages, encoder.options.title)
    encoded = encoder.tokenizer(firsts, seconds, truncation=True, max_length=encoder.options.max_length)
    vectors = np.zeros((len(passages), encoder.dim), dtype=np.float32)
    for batch in token_budget_batches([len(ids) for ids in encoded["input_ids"]], encoder.options.batch_tokens):
        longest = max(len(encoded["input_ids"][index]) for index in batch)
        tensors = {name: torch.zeros((len(batch), longest), dtype=torch.long)
                   for name in ("input_ids", "attention_mask")}
        for row, index in enumerate(batch):
            size = len(encoded["input_ids"][index])
            tensors["input_ids"][row, :size] = torch.tensor(encoded["input_ids"][index])
            tensors["attention_mask"][row, :size] = 1
        with torch.inference_mode():
            vectors[batch] = encoder.model(**tensors).last_hidden_state[:, 0].float().numpy()
    return vectors


def test_passage_vectors_are_mains_exactly_and_a_plain_forward_pass(minilm_path):
    encoder = DenseEncoder(EncoderOptions("dpr", str(minilm_path), max_length=96, batch_tokens=1024))
    passages = dpr_passages(count=60)
    vectors = encoder.encode_passages(passages)
    assert np.array_equal(vectors, main_batched_passage_vectors(encoder, passages))
    with torch.inference_mode():
        one_by_one = np.stack([encoder.model(**encoder.tokenizer(
            passage.title, passage.text, truncation=True, max_length=96, return_tensors="pt",
            return_token_type_ids=False)).last_hidden_state[0, 0].numpy() for passage in passages])
    np.testing.assert_allclose(vectors, one_by_one, rtol=0, atol=1e-5)


def test_packed_sequences_are_padded_with_numpy_from_lists_and_from_an_arrow_column():
    sequences = [(9,), (5, 6, 7), (8,), (), (4, 4)]
    from_lists = PackedLists.of(sequences)
    # a sliced chunk of a chunked column: its offsets do not start at 0 and its values hold rows outside the slice
    column = pa.chunked_array([pa.array([[1, 2]], pa.list_(pa.int32())),
                               pa.array([list(item) for item in sequences], pa.list_(pa.int32())).slice(1)])
    from_column = PackedLists.of_column(column.chunks[1])
    assert from_lists.lengths.tolist() == [1, 3, 1, 0, 2] and from_column.lengths.tolist() == [3, 1, 0, 2]
    ids, attention = from_lists.padded(np.array([1, 2, 3]), pad=1)
    assert ids.tolist() == [[5, 6, 7], [8, 1, 1], [1, 1, 1]] and ids.dtype == np.int64
    assert attention.tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]
    assert np.array_equal(from_column.padded(np.array([0, 1, 2]), pad=1)[0], ids)
    assert PackedLists.of_column(column).lengths.tolist() == [2, 3, 1, 0, 2]


def test_packed_sequences_of_sequences_pad_as_the_kpr_model_reads_its_entities():
    """Entities' token positions (a list of lists per text) from Python lists and from a sliced Arrow column: the
    rows asked for, in their order, zero-padded to the most entities and the longest entity among them, at least
    1 x 1 (a batch of texts without entities still gives the model one padding entity of one position)."""
    texts = [((1, 2),), ((3,), (4, 5, 6)), (), ((7,),), ((8, 9),)]
    from_lists = PackedListsOfLists.of(texts)
    column = pa.chunked_array([pa.array([[[5]]], pa.list_(pa.list_(pa.int32()))),
                               pa.array([[list(entity) for entity in text] for text in texts],
                                        pa.list_(pa.list_(pa.int32()))).slice(1)])
    from_column = PackedListsOfLists.of_column(column.chunks[1])
    expected = [[[3, 0, 0], [4, 5, 6]], [[0, 0, 0], [0, 0, 0]], [[8, 9, 0], [0, 0, 0]], [[1, 2, 0], [0, 0, 0]]]
    padded = from_lists.padded(np.array([1, 2, 4, 0]))
    assert padded.dtype == np.int64 and padded.tolist() == expected
    assert from_column.padded(np.array([0, 1, 3])).tolist() == [expected[0], expected[1], expected[2]]
    assert from_lists.padded(np.array([2])).tolist() == [[[0]]] and from_lists.padded(np.array([3])).tolist() == [[[7]]]
    assert PackedListsOfLists.of_column(column).padded(np.array([0, 4])).tolist() == [[[5, 0]], [[8, 9]]]
    entities = PackedLists.of([[11], [12, 13], [], [14], [15]])  # their entity ids: as wide as the positions
    assert entities.padded(np.array([2]), 0, 1)[0].tolist() == [[0]]
    assert entities.padded(np.array([1, 2, 4, 0]), 0, 1)[0].tolist() == [[12, 13], [0, 0], [15, 0], [11, 0]]


def test_prefetch_keeps_order_and_runs_ahead_in_another_thread():
    threads = []

    def items():
        for value in range(10):
            threads.append(threading.current_thread())
            yield value

    assert list(prefetched(items(), depth=3)) == list(range(10))
    assert all(thread is not threading.main_thread() for thread in threads)


def test_an_error_in_the_prefetch_thread_reaches_the_consumer_without_hanging():
    def failing():
        yield 1
        yield 2
        raise ValueError("bad batch 3")

    seen = []
    started = time.monotonic()
    with pytest.raises(ValueError, match="bad batch 3"):
        for value in prefetched(failing(), depth=1):
            seen.append(value)
    assert seen == [1, 2] and time.monotonic() - started < 5


def test_a_consumer_that_stops_early_stops_the_producer():
    produced = []

    def endless():
        value = 0
        while True:
            produced.append(value)
            yield value
            value += 1

    before = threading.active_count()
    iterator = prefetched(endless(), depth=2)
    assert [next(iterator) for _ in range(3)] == [0, 1, 2]
    iterator.close()  # joins the producer thread
    assert threading.active_count() == before and len(produced) <= 3 + 2 + 1


def codecs(path: str) -> set[str]:
    metadata = pq.ParquetFile(path).metadata
    return {metadata.row_group(group).column(column).compression
            for group in range(metadata.num_row_groups) for column in range(metadata.num_columns)}


def test_every_parquet_output_is_zstd_and_reads_back(tiny_bert, tmp_path: Path):
    write_parsed(tmp_path, CAPITALS)
    assert main(["dictionary", "--output", str(tmp_path), *DIRECT]) == 0
    assert main(["mentions", "--output", str(tmp_path), "--max-mentions", "2", *DIRECT]) == 0
    assert main(["embed-entities", "--output", str(tmp_path), "--model", str(tiny_bert), "--max-seq-length", "32",
                 *DIRECT]) == 0
    assert schemas.PARQUET_CODEC == "zstd"
    for name in ("entities", "dictionary/names", "mentions", "entity_embeddings"):
        files = tables.parquet_files(str(tmp_path), name)
        assert {codec for path in files for codec in codecs(path)} == {"ZSTD"}, name
    assert tables.total_rows(str(tmp_path), "entities") == 3
    assert sorted(tables.read_table(str(tmp_path), "entities", ["title"]).column("title").to_pylist()) == [
        "France", "Paris", "Seine"]
    assert tables.read_table(str(tmp_path), "mentions").num_rows == tables.total_rows(str(tmp_path), "mentions") == 6
    assert main(["validate", "--output", str(tmp_path)]) == 0



def batch_results(batches: list[list[int]]):
    """What ``queue_forwards`` gets: each batch's rows, and a forward whose result rows are (row, -row)."""
    prepared = [(batch, torch.tensor([[row, -row] for row in batch], dtype=torch.bfloat16)) for batch in batches]
    return prepared, lambda host: host


def test_results_come_back_in_row_order_whatever_the_batches_order():
    batches = [[4, 0], [3], [1, 5, 2]]  # as token_budget_batches sorts rows by length
    prepared, forward = batch_results(batches)
    vectors = queue_forwards(6, 2, prepared, forward).collect()
    assert vectors.dtype == np.float32
    assert vectors.tolist() == [[row, -row] for row in range(6)]
    # the device's way (joined and put in order where the results are) gives the same rows
    order = np.array([row for batch in batches for row in batch])
    on_device = in_row_order([host for _, host in prepared], order).float().numpy()
    assert np.array_equal(on_device, vectors)
    assert to_host([host for _, host in prepared]).tolist() == [[row, -row] for row in [4, 0, 3, 1, 5, 2]]


@pytest.mark.parametrize("batches", [[[0, 2]], [[0, 1], [1, 2]], [[0, 1, 2, 3]]])
def test_batches_that_miss_or_repeat_a_row_are_an_error(batches: list[list[int]]):
    prepared, forward = batch_results(batches)
    with pytest.raises(ValueError, match="not each of the 3 rows once"):
        queue_forwards(3, 2, prepared, forward)


def test_host_buffers_are_taken_in_turn_and_grow_to_the_largest_step():
    buffers = HostBuffers(2)
    first, second = buffers.take(3, 2), buffers.take(5, 2)
    assert first.shape == (3, 2) and second.shape == (5, 2) and not np.shares_memory(first, second)
    third = buffers.take(2, 2)  # the first's array again: a step's vectors last until the step after next
    assert np.shares_memory(first, third) and third.shape == (2, 2)
    assert not np.shares_memory(buffers.take(6, 2), second)  # grown: a new array


def test_vectors_copied_back_into_a_given_array_are_in_row_order():
    batches = [[2, 0], [1]]
    prepared, forward = batch_results(batches)
    out = np.full((3, 2), np.nan, dtype=np.float32)
    vectors = queue_forwards(3, 2, prepared, forward).collect(out)
    assert vectors is out and out.tolist() == [[0, 0], [1, -1], [2, -2]]
    again = np.full((3, 2), np.nan, dtype=np.float32)  # results as they come, into the array
    assert to_host([host for _, host in prepared], out=again) is again
    assert again.tolist() == [[2, -2], [0, 0], [1, -1]]


def test_queued_forwards_run_every_batch_and_come_back_only_when_collected():
    batches = [[1, 2], [0]]
    prepared, forward = batch_results(batches)
    ran: list[list[int]] = []

    def counted(host):
        ran.append([int(row) for row in host[:, 0].tolist()])
        return forward(host)

    told: list[tuple[list[int], int]] = []  # each batch's rows as told, and how many forwards had run by then
    queued = queue_forwards(3, 2, prepared, counted, lambda batch: told.append((batch, len(ran))))
    assert ran == [[1, 2], [0]] and queued.rows.tolist() == [1, 2, 0]
    assert told == [([1, 2], 1), ([0], 2)]  # a batch is told once its forward has run, before the next one
    assert queued.results[0].dtype == torch.bfloat16  # as the model left them, not yet copied back
    assert queued.collect().tolist() == [[0, 0], [1, -1], [2, -2]]
    assert queue_forwards(0, 2, [], counted).collect().shape == (0, 2)
