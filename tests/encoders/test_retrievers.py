"""Dense retriever encoders: each kind against a hand computation with transformers, batching invariance,
DPR checkpoints, the RunInference handler, early errors."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from artifacts import tables
from artifacts.errors import InputError, SettingError
from artifacts.passages import Passage
from encoders.loading import check_encoder_options, load_inputs, load_retriever
from encoders.retrievers import (
    BGE_QUERY_PREFIX,
    EncoderOptions,
    ReadyInputs,
    TextInputs,
    dense_dim,
    passage_segments,
)
from pipelines.index import check_encoder
from tests.builders import dpr_passages
from transforms.index.inputs import inputs_table, passage_keys, table_inputs

QUERIES = ["who sings does he love me with reba", "where do the great lakes meet the ocean"]


def by_hand(model_path, firsts, seconds=None, pooling="cls", normalize=False, max_length=256,
            token_types=True) -> np.ndarray:
    """One text at a time, no batching: the vectors the encoders must reproduce (``token_types``: the tokenizer's
    fed, else none: all 0)."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModel.from_pretrained(model_path).eval()
    vectors = []
    for index, first in enumerate(firsts):
        encoded = tokenizer(first, None if seconds is None else seconds[index], truncation=True,
                            max_length=max_length, return_tensors="pt", return_token_type_ids=token_types)
        with torch.inference_mode():
            states = model(**encoded).last_hidden_state[0]
        vector = states[0] if pooling == "cls" else states.mean(dim=0)
        if normalize:
            vector = vector / vector.norm()
        vectors.append(vector.numpy())
    return np.array(vectors)


def test_passage_segments_per_title_mode():
    passages = [Passage(1, "Paris", "Paris is big."), Passage(2, "", "No title.")]
    assert passage_segments(passages, "pair") == (["Paris", ""], ["Paris is big.", "No title."])
    assert passage_segments(passages, "join") == (["Paris Paris is big.", "No title."], None)
    assert passage_segments(passages, "none", "passage: ") == (["passage: Paris is big.", "passage: No title."], None)


def test_kinds_resolve_to_their_documented_defaults():
    assert EncoderOptions("dpr", "m").resolved().similarity == "dot"
    bge = EncoderOptions("bge", "m").resolved()
    assert (bge.similarity, bge.title, bge.query_prefix) == ("cosine", "join", BGE_QUERY_PREFIX)
    mean = EncoderOptions("mean", "m", similarity="dot", query_prefix="q: ").resolved()
    assert (mean.similarity, mean.title, mean.query_prefix) == ("dot", "join", "q: ")
    assert EncoderOptions.from_json(bge.to_json()) == bge
    assert {kind: EncoderOptions(kind, "m").token_types for kind in ("dpr", "bge", "mean", "kpr")} == {
        "dpr": "zeros", "bge": "tokenizer", "mean": "tokenizer", "kpr": "zeros"}
    dpr = EncoderOptions("dpr", "m").resolved().to_json()
    assert dpr["token_types"] == "zeros" and EncoderOptions.from_json(dpr).token_types == "zeros"
    del dpr["token_types"]  # an index.json written before token types were recorded: the tokenizer's were fed
    assert EncoderOptions.from_json(dpr).token_types == "tokenizer"


def test_token_types_follow_each_familys_own_code(tiny_bert):
    """DPR's tensorizer feeds zero segment ids: no token types (all 0) for [CLS] title [SEP] text [SEP]; mean
    (sentence-transformers) feeds the tokenizer's, 1 for a pair's second segment."""
    passage = Passage(1, "Erie Canal", "The Erie Canal is a canal in New York.")
    vocabulary = AutoTokenizer.from_pretrained(tiny_bert).get_vocab()
    tokens = ["[CLS]", "erie", "canal", "[SEP]", "the", "erie", "canal", "is", "a", "canal", "in", "new", "york", ".",
              "[SEP]"]
    ids = [vocabulary[token] for token in tokens]
    assert TextInputs(EncoderOptions("dpr", str(tiny_bert))).passages([passage]) == [{"input_ids": ids, "cut": False}]
    assert TextInputs(EncoderOptions("mean", str(tiny_bert), title="pair")).passages([passage]) == [
        {"input_ids": ids, "token_type_ids": [0] * 4 + [1] * 11, "cut": False}]
    assert TextInputs(EncoderOptions("dpr", str(tiny_bert), max_length=8)).passages([passage]) == [
        {"input_ids": [*ids[:4], *ids[4:7], ids[-1]], "cut": True}]


def test_mean_pooling_matches_sentence_transformers_on_real_passages(minilm_path):
    passages = dpr_passages(count=6)
    encoder = load_retriever(EncoderOptions("mean", str(minilm_path)))
    expected = by_hand(minilm_path, [f"{p.title} {p.text}" for p in passages], pooling="mean", normalize=True)
    np.testing.assert_allclose(encoder.encode_passages(passages), expected, atol=2e-5)
    np.testing.assert_allclose(encoder.encode_queries(QUERIES),
                               by_hand(minilm_path, QUERIES, pooling="mean", normalize=True), atol=2e-5)
    assert encoder.dim == dense_dim(encoder.options) == 384


def test_dpr_kind_is_the_cls_of_title_text_pairs_with_dot_product(tiny_bert):
    passages = dpr_passages(count=5)
    encoder = load_retriever(EncoderOptions("dpr", str(tiny_bert)))
    expected = by_hand(tiny_bert, [p.title for p in passages], [p.text for p in passages], token_types=False)
    vectors = encoder.encode_passages(passages)
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    assert not np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    small = load_retriever(EncoderOptions("dpr", str(tiny_bert), batch_tokens=200))
    np.testing.assert_allclose(small.encode_passages(passages), vectors, atol=1e-5)


def test_bge_kind_normalizes_cls_and_prefixes_queries(tiny_bert):
    encoder = load_retriever(EncoderOptions("bge", str(tiny_bert), max_length=32))
    expected = by_hand(tiny_bert, [BGE_QUERY_PREFIX + query for query in QUERIES], normalize=True, max_length=32)
    np.testing.assert_allclose(encoder.encode_queries(QUERIES), expected, atol=1e-5)


def test_bfloat16_weights_stay_close_to_float32(tiny_bert):
    passages = [Passage(1, "Lake Erie", "Lake Erie is the fourth-largest lake of the Great Lakes.")]
    full = load_retriever(EncoderOptions("mean", str(tiny_bert))).encode_passages(passages)
    half = load_retriever(EncoderOptions("mean", str(tiny_bert), dtype="bfloat16")).encode_passages(passages)
    assert half.dtype == np.float32
    assert float(full[0] @ half[0]) > 0.99


def test_hugging_face_dpr_context_encoders_load_as_context_encoders(tiny_bert, tmp_path):
    from transformers import BertConfig, BertModel, DPRConfig, DPRContextEncoder

    config = DPRConfig(vocab_size=AutoTokenizer.from_pretrained(tiny_bert).vocab_size, hidden_size=32,
                       num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, projection_dim=16)
    torch.manual_seed(1)
    model = DPRContextEncoder(config).eval()
    model.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(tmp_path)
    encoder = load_retriever(EncoderOptions("dpr", str(tmp_path)))
    assert type(encoder.model).__name__ == "DPRContextEncoder"
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    passage = Passage(3, "Reba", "Reba McEntire sang it with Linda Davis.")
    encoded = tokenizer(passage.title, passage.text, return_tensors="pt", return_token_type_ids=False)
    with torch.inference_mode():  # DPR's own code feeds zero segment ids
        expected = model(**encoded).pooler_output[0].numpy()
    np.testing.assert_allclose(encoder.encode_passages([passage])[0], expected, atol=1e-5)
    assert encoder.dim == len(expected) == 16  # projected
    # --encoder-type mean pools its BERT's last hidden states, of their size (it took the pooler output, [CLS])
    bert = tmp_path / "bert"
    plain = BertModel(BertConfig(**{**config.to_dict(), "model_type": "bert"}), add_pooling_layer=False)
    plain.load_state_dict(model.ctx_encoder.bert_model.state_dict())
    plain.save_pretrained(bert)
    tokenizer.save_pretrained(bert)
    mean = load_retriever(EncoderOptions("mean", str(tmp_path)))
    assert mean.dim == dense_dim(EncoderOptions("mean", str(tmp_path))) == 32
    np.testing.assert_allclose(mean.encode_passages([passage]),
                               load_retriever(EncoderOptions("mean", str(bert))).encode_passages([passage]), atol=1e-5)


@pytest.mark.parametrize("kind, title", [("mean", "pair"), ("dpr", "")])
def test_inputs_built_elsewhere_and_read_back_from_a_file_give_the_same_vectors(tiny_bert, kind, title):
    """The index's split: a CPU worker builds the inputs (token types too, where the encoder feeds them) and writes
    them to a file; the model's process reads them back and encodes them: the library's vectors."""
    options = EncoderOptions(kind, str(tiny_bert), title=title, max_length=64, batch_tokens=50)
    passages = [Passage(1, "A", "alpha beta"), Passage(2, "B", "gamma delta " * 20), Passage(3, "", "epsilon")]
    features = load_inputs(options).passages(passages)
    assert ("token_type_ids" in features[0]) == (kind == "mean")  # a pair: the tokenizer's types, 1 after [SEP]
    table = pq.read_table(pa.BufferReader(tables.parquet_bytes(inputs_table(passages, features, "ab12"))))
    keys, ready = table_inputs(table)
    assert keys.tolist() == passage_keys("ab12", passages).tolist() and len(ready) == len(passages)
    assert table.select(["passage_id", "title", "text"]).to_pylist() == [passage.to_row() for passage in passages]
    ids, offsets = ready.input_ids.values, ready.input_ids.offsets
    assert [ids[start:stop].tolist() for start, stop in pairwise(offsets)] == [item["input_ids"] for item in features]
    assert (ready.token_type_ids is not None) == (kind == "mean")
    assert ready.entity_ids is None and ready.entity_positions is None
    encoder = load_retriever(options)
    library = encoder.encode_passages(passages)
    np.testing.assert_allclose(encoder.encode_ready(ready), library, rtol=0, atol=1e-6)
    # a subset of them (those not kept by an earlier run), in the order asked for
    np.testing.assert_allclose(encoder.encode_ready(ready, np.array([2, 0])), library[[2, 0]], rtol=0, atol=1e-6)


def test_ready_inputs_are_batched_over_the_whole_step_not_in_tokenizing_chunks(tiny_bert):
    """The model's process batches a step of ready inputs by token budget over all of its rows at once: the
    fullest batches and the least padding (in chunks, as while tokenizing, a chunk's last batch ran part-full)."""
    options = EncoderOptions("dpr", str(tiny_bert), max_length=64, batch_tokens=128)
    passages = [Passage(index, "", " ".join(["word"] * (3 + index % 7))) for index in range(1, 25)]
    ready = ReadyInputs.of_features(load_inputs(options).passages(passages))
    encoder = load_retriever(options)
    ran: list[list[int]] = []
    vectors = encoder.queue_ready(ready, on_batch=ran.append).collect()
    lengths = ready.input_ids.lengths.tolist()
    padded = [len(batch) * max(lengths[row] for row in batch) for batch in ran]
    assert sorted(row for batch in ran for row in batch) == list(range(len(passages)))
    assert max(padded) <= 128 and sum(lengths) == 213
    assert len(ran) == 2 and sum(padded) == 246  # in chunks of 4 and 16 rows: 4 forwards, 257 padded tokens
    np.testing.assert_allclose(vectors, encoder.encode_passages(passages), rtol=0, atol=1e-6)


def test_bad_encoder_options_fail_before_any_work(tiny_bert, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        check_encoder_options(EncoderOptions("dpr", str(tmp_path / "no" / "model")))
    with pytest.raises(SettingError) as library:  # the library names the option's field, the command line its flag
        check_encoder_options(EncoderOptions("colbert", str(tiny_bert)))
    assert (library.value.setting, library.value.value, library.value.message) == (
        "kind", "colbert", "kind 'colbert' is not one of dpr, bge, mean, kpr")
    with pytest.raises(InputError) as worded:
        check_encoder(EncoderOptions("colbert", str(tiny_bert)))
    assert worded.value.message == "--encoder-type 'colbert' is not one of dpr, bge, mean, kpr"
    with pytest.raises(SettingError) as library:
        check_encoder_options(EncoderOptions("dpr", str(tiny_bert), max_length=2))
    assert library.value.message == "max_length 2 is too small (at least 8 tokens)"
    with pytest.raises(InputError) as worded:
        check_encoder(EncoderOptions("dpr", str(tiny_bert), max_length=2))
    assert worded.value.message == "--max-length 2 is too small (at least 8 tokens)"
    with pytest.raises(InputError, match="does not exist"):
        check_encoder_options(EncoderOptions("dpr", str(tiny_bert), query_model=str(tmp_path / "q" / "x")))
