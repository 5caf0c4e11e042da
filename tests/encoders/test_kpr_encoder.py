"""The KPR encoder: entity inputs from linker mentions, the fusion layer against the paper's formula computed by
hand, published parameter and config names, save/reload, and the whole chain on this project's own artifacts."""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time
import unicodedata
from dataclasses import replace
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from artifacts import fs, schemas, tables
from artifacts.errors import InputError
from artifacts.linker import EntityLinker, NameRow, build_kb_trie, write_linker
from artifacts.passages import Passage
from encoders.batching import token_budget_batches
from encoders.errors import MissingRunArtifactError
from encoders.kpr_checkpoint import from_bert, init_kpr_checkpoint, load_checkpoint
from encoders.kpr_config import KPRSettings, read_kpr_settings
from encoders.kpr_entities import EntityTable
from encoders.kpr_model import KPRModel
from encoders.loading import check_encoder_options, load_inputs, load_retriever
from encoders.retrievers import EncoderOptions, ReadyInputs
from pipelines.index import check_encoder
from pipelines.launcher.cli import main
from tests.builders import dpr_passages, mirrored, run_counting
from tests.conftest import DIRECT, copy_stages
from transforms.common.follow import FollowedFiles, RunFollowers, mark_ended
from transforms.common.progress import ProgressSettings
from transforms.common.worker_files import save_array
from transforms.index.forward import FollowPassageInputs, KeptPassages
from transforms.index.inputs import INPUT_PREFIX, PreparePassageInputs, inputs_table, passage_keys, table_inputs

ENTITY_DIM = 8
PUBLISHED_FUSION_NAMES = {
    "entity_fusion_layer.entity_embeddings.position_embeddings.weight",
    "entity_fusion_layer.entity_embeddings.dense.weight",
    "entity_fusion_layer.entity_embeddings.LayerNorm.weight", "entity_fusion_layer.entity_embeddings.LayerNorm.bias",
    *(f"entity_fusion_layer.entity_fusion_layer.{part}.{kind}" for part in ("query", "key", "value")
      for kind in ("weight", "bias")),
    "entity_fusion_layer.LayerNorm.weight", "entity_fusion_layer.LayerNorm.bias", "entity_fusion_layer.noop_embeddings",
}
# Dictionary names -> their candidates (key, title, link count); the names' doc counts are their link counts.
CAPITALS = {"paris": (("Q90", "Paris", 9),), "new york": (("Q60", "New York City", 6), ("New York (state)",
                                                                                       "New York (state)", 4)),
            "france": (("Q142", "France", 5),)}
KEYS = [key for candidates in CAPITALS.values() for key, _, _ in candidates]
# Names of the first passage of samples/psgs_w100_sample.tsv ("Erie Canal"), keys as on Wikidata.
ERIE_CANAL = {"erie canal": (("Q178", "Erie Canal", 5),), "lake erie": (("Q5492", "Lake Erie", 5),),
              "new york": (("Q60", "New York City", 6), ("Q1384", "New York (state)", 4)),
              "hudson river": (("Q3140", "Hudson River", 5),)}
CONFIG = {"max_mention_length": 100, "case_sensitive": False, "min_link_prob": 0.05, "min_prior_prob": 0.3,
          "min_link_count": 1}


def fusion_by_hand(model: KPRModel, cls: torch.Tensor, embeds: torch.Tensor, positions: list[list[int]]):
    """The paper's definition, written out for one text with the module's weights (not its forward)."""
    layer, settings = model.entity_fusion_layer, model.settings
    entities = layer.entity_embeddings
    inputs = [entities.dense.weight @ embed + entities.position_embeddings.weight[tokens].mean(dim=0)
              for embed, tokens in zip(embeds, positions, strict=True)]
    keys = torch.stack([layer.noop_embeddings[0, 0]] + [entities.LayerNorm(item) for item in inputs])
    attention = layer.entity_fusion_layer
    heads, size = attention.heads, attention.head_size
    query = (attention.query.weight @ cls + attention.query.bias).view(heads, size)
    key = (keys @ attention.key.weight.T + attention.key.bias).view(len(keys), heads, size)
    value = (keys @ attention.value.weight.T + attention.value.bias).view(len(keys), heads, size)
    output = []
    for head in range(heads):
        scores = key[:, head] @ query[head] / math.sqrt(size)
        if settings.entity_fusion_activation == "sigmoid":
            weights = torch.sigmoid(scores - math.log(len(keys)))
        else:
            weights = torch.softmax(scores, dim=0)
        output.append(weights @ value[:, head])
    fused = layer.LayerNorm(torch.cat(output) + cls)
    return fused / fused.norm() if settings.similarity_function == "cosine" else fused


@pytest.mark.parametrize("activation", ["sigmoid", "softmax"])
def test_fusion_layer_is_the_papers_formula(tiny_bert, activation):
    settings = KPRSettings(entity_embedding_size=ENTITY_DIM, entity_fusion_activation=activation,
                           num_entity_fusion_attention_heads=2)
    model = from_bert(str(tiny_bert), settings, seed=3)
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    encoded = tokenizer(["the city of paris in france", "no entity here"], padding=True, return_tensors="pt")
    torch.manual_seed(5)
    embeds = torch.randn(2, 3, ENTITY_DIM)
    entity_ids = torch.tensor([[4, 6, 7], [0, 0, 0]])
    positions = torch.tensor([[[4, 0], [6, 0], [4, 6]], [[0, 0], [0, 0], [0, 0]]])
    with torch.inference_mode():
        vectors = model(encoded["input_ids"], encoded["attention_mask"], entity_ids, embeds, positions,
                        encoded["token_type_ids"])
        cls = model.bert(**encoded).last_hidden_state[:, 0]
        first = fusion_by_hand(model, cls[0], embeds[0], [[4], [6], [4, 6]])
        second = fusion_by_hand(model, cls[1], embeds[1, :0], [])  # only the no-op key
    torch.testing.assert_close(vectors[0], first, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(vectors[1], second, atol=1e-5, rtol=1e-4)
    assert abs(float(vectors[0].norm()) - 1.0) < 1e-5


def test_checkpoints_use_the_published_names_and_reload_identically(minilm_path, tmp_path):
    settings = KPRSettings(entity_embedding_size=ENTITY_DIM, num_entity_fusion_attention_heads=4,
                           similarity_function="dot", similarity_temperature=0.05)
    model = init_kpr_checkpoint(str(minilm_path), str(tmp_path / "kpr"), settings, seed=1)
    names = set(model.state_dict())
    assert {name for name in names if not name.startswith("bert.")} == PUBLISHED_FUSION_NAMES
    assert model.state_dict()["entity_fusion_layer.noop_embeddings"].shape == (1, 1, 384)
    assert "bias" not in str([name for name in names if ".dense." in name and "entity" in name])
    config = json.loads((tmp_path / "kpr" / "config.json").read_text())
    assert {key: config[key] for key in ("entity_embedding_size", "entity_fusion_activation",
                                         "num_entity_fusion_attention_heads", "use_entity_position_embeddings",
                                         "similarity_function", "similarity_temperature")} == {
        "entity_embedding_size": 8, "entity_fusion_activation": "sigmoid", "num_entity_fusion_attention_heads": 4,
        "use_entity_position_embeddings": True, "similarity_function": "dot", "similarity_temperature": 0.05}
    reloaded = load_checkpoint(str(tmp_path / "kpr"))
    bert = AutoModel.from_pretrained(minilm_path)
    torch.testing.assert_close(reloaded.bert.embeddings.word_embeddings.weight, bert.embeddings.word_embeddings.weight)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "kpr")
    encoded = tokenizer(["paris in france"], return_tensors="pt")
    args = (torch.tensor([[3, 1]]), torch.randn(1, 2, ENTITY_DIM), torch.tensor([[[1], [3]]]))
    with torch.inference_mode():
        torch.testing.assert_close(model(encoded["input_ids"], encoded["attention_mask"], *args),
                                   reloaded(encoded["input_ids"], encoded["attention_mask"], *args), atol=0, rtol=0)


def test_foreign_weights_are_refused_and_the_training_table_ignored(tiny_bert, tmp_path):
    settings = KPRSettings(entity_embedding_size=ENTITY_DIM, num_entity_fusion_attention_heads=2)
    init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"), settings)
    from safetensors.torch import load_file, save_file

    weights = load_file(tmp_path / "kpr" / "model.safetensors")
    save_file({**weights, "entity_fusion_layer.entity_embeddings.embeddings.weight": torch.zeros(5, ENTITY_DIM)},
              tmp_path / "kpr" / "model.safetensors")
    model = load_checkpoint(str(tmp_path / "kpr"))
    # a table of zero rows tells no norm: the word embeddings' mean norm, as train.py would give the table
    word_norm = float(model.bert.embeddings.word_embeddings.weight.norm(dim=1).mean())
    assert model.entity_norm == pytest.approx(word_norm) and word_norm > 0
    renamed = {name.replace("entity_fusion_layer.noop_embeddings", "fusion.noop"): value
               for name, value in weights.items()}
    save_file(renamed, tmp_path / "kpr" / "model.safetensors")
    with pytest.raises(InputError, match=r"does not hold KPR weights: missing \['entity_fusion_layer.noop_embed"):
        load_checkpoint(str(tmp_path / "kpr"))
    with pytest.raises(InputError, match="no entity_embedding_size"):
        read_kpr_settings(str(tiny_bert))


def test_fields_a_kpr_config_lacks_are_the_reference_configs_defaults(tiny_bert, tmp_path):
    """A config.json without the fusion fields reads as the reference's KPRConfig reads it (softmax, 12 heads, dot),
    not as the settings a checkpoint made here is given (it writes every field)."""
    init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"), KPRSettings(entity_embedding_size=ENTITY_DIM))
    assert read_kpr_settings(str(tmp_path / "kpr")) == KPRSettings(entity_embedding_size=ENTITY_DIM)
    config = json.loads((tmp_path / "kpr" / "config.json").read_text())
    for name in ("entity_fusion_activation", "num_entity_fusion_attention_heads", "similarity_function"):
        del config[name]
    (tmp_path / "kpr" / "config.json").write_text(json.dumps(config))
    assert read_kpr_settings(str(tmp_path / "kpr")) == KPRSettings(
        entity_embedding_size=ENTITY_DIM, entity_fusion_activation="softmax", num_entity_fusion_attention_heads=12,
        similarity_function="dot")


def test_the_run_s_entity_vectors_are_fed_at_the_norm_the_checkpoint_was_trained_at(tiny_bert, tmp_path):
    """The reference's build_hf_model.py installs entity vectors L2-normalized and scaled to the norm of the
    checkpoint's own entity table (a train.py checkpoint's, or the entity_embeddings.npy a converted model ships):
    so the run's vectors count only by their direction, at that norm, whatever model embedded them."""
    from safetensors.torch import load_file, save_file

    write_entity_artifacts(tmp_path)
    init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"),
                        KPRSettings(entity_embedding_size=ENTITY_DIM, num_entity_fusion_attention_heads=2))
    table = torch.nn.functional.normalize(torch.randn(3000, ENTITY_DIM), dim=1) * 3.0
    table[0] = 0  # [PAD]
    weights = load_file(tmp_path / "kpr" / "model.safetensors")
    save_file({**weights, "entity_fusion_layer.entity_embeddings.embeddings.weight": table},
              tmp_path / "kpr" / "model.safetensors")
    assert load_checkpoint(str(tmp_path / "kpr")).entity_norm == pytest.approx(3.0)
    converted = tmp_path / "converted"
    shutil.copytree(tmp_path / "kpr", converted)
    save_file(weights, converted / "model.safetensors")
    np.save(converted / "entity_embeddings.npy", (table * 2.5 / 3.0).half().numpy())
    assert load_checkpoint(str(converted)).entity_norm == pytest.approx(2.5, rel=1e-3)
    (converted / "entity_embeddings.npy").write_bytes(b"not an array")
    with pytest.raises(InputError, match=r"entity_embeddings\.npy: not a readable \.npy table of entity vectors"):
        load_checkpoint(str(converted))
    np.save(converted / "entity_embeddings.npy", (table * 2.5 / 3.0).half().numpy())

    passages = linked_passages(6)
    encoded = load_retriever(kpr_options(tmp_path / "kpr", tmp_path, max_length=32)).encode_passages(passages)
    stretched = tmp_path / "stretched"
    shutil.copytree(tmp_path / "dictionary", stretched / "dictionary")
    rows = pq.read_table(tmp_path / "entity_embeddings" / "part-0.parquet").to_pylist()
    scaled = [{**row, "embedding": [value * 7.0 for value in row["embedding"]]} for row in rows]
    (stretched / "entity_embeddings").mkdir()
    pq.write_table(pa.Table.from_pylist(scaled, schema=schemas.entity_embeddings(ENTITY_DIM)),
                   stretched / "entity_embeddings" / "part-0.parquet")
    same = load_retriever(kpr_options(tmp_path / "kpr", stretched, max_length=32)).encode_passages(passages)
    np.testing.assert_allclose(same, encoded, atol=1e-6)
    model = load_checkpoint(str(tmp_path / "kpr"))
    ids = np.array(sorted(EntityTable(str(tmp_path / "entity_embeddings")).present.nonzero()[0]))
    fed = EntityTable(str(stretched / "entity_embeddings"), model.entity_norm).lookup(ids)
    np.testing.assert_allclose(np.linalg.norm(fed, axis=1), 3.0, rtol=1e-5)


@pytest.mark.parametrize(("checkpoint", "asked"), [("dot", "cosine"), ("cosine", "dot")])
def test_a_similarity_asked_over_the_checkpoints_is_the_one_its_vectors_have(tiny_bert, tmp_path, checkpoint, asked):
    """--similarity was recorded as the index's metric while the vectors kept the checkpoint's: a "cosine" index
    whose search scores were 32, or a "dot" one of unit vectors."""
    write_entity_artifacts(tmp_path)
    init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"), KPRSettings(
        entity_embedding_size=ENTITY_DIM, num_entity_fusion_attention_heads=2, similarity_function=checkpoint))
    passages = linked_passages(6)
    own, overridden = (load_retriever(kpr_options(tmp_path / "kpr", tmp_path, max_length=32, **extra)).encode_passages(
        passages) for extra in ({}, {"similarity": asked}))
    cosine, dot = (overridden, own) if asked == "cosine" else (own, overridden)
    np.testing.assert_allclose(np.linalg.norm(cosine, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(np.linalg.norm(dot, axis=1), 1.0, atol=1e-2)
    np.testing.assert_allclose(cosine, dot / np.linalg.norm(dot, axis=1, keepdims=True), atol=1e-5)


def write_entity_artifacts(output: Path, dim: int = ENTITY_DIM, names: dict = CAPITALS,
                           unembedded: tuple[str, ...] = ("New York (state)",)) -> dict[int, np.ndarray]:
    """OUT/dictionary/linker and OUT/entity_embeddings by hand: ``names`` (by default paris, new york with two
    candidates, france), an embedding for every entity but the keys ``unembedded`` (entities without mentions).
    Returns the vectors by entity id."""
    keys = [key for candidates in names.values() for key, _, _ in candidates]
    kb = build_kb_trie(keys)
    titles = [""] * len(keys)
    for key, title, _ in (candidate for candidates in names.values() for candidate in candidates):
        titles[kb[key]] = title
    eid = {key: kb[key] + 1 for key in keys}
    rows = [NameRow(name, eid[key], count, total, total) for name, candidates in names.items()
            for total in [sum(count for _, _, count in candidates)] for key, _, count in candidates]
    write_linker(str(output / "dictionary" / "linker"), rows, kb, titles, CONFIG)
    rng = np.random.default_rng(0)
    vectors = {eid[key]: rng.normal(size=dim).astype(np.float32) for key in keys if key not in unembedded}
    (output / "entity_embeddings").mkdir(parents=True)
    table = pa.Table.from_pylist([{"entity_id": entity_id, "title": "", "qid": None, "embedding": vector.tolist(),
                                   "mention_count": 1} for entity_id, vector in vectors.items()],
                                 schema=schemas.entity_embeddings(dim))
    pq.write_table(table, output / "entity_embeddings" / "part-0.parquet")
    return vectors


def entity_ids(output: Path, names: dict) -> dict[str, int]:
    """The entity id of each candidate title of ``names`` in OUT/dictionary/linker."""
    linker = EntityLinker.load(str(output / "dictionary" / "linker"))
    return {candidate.title: candidate.entity_id for name in names for mention in linker.detect(name)
            for candidate in mention.candidates}


def kpr_options(model: Path, output: Path, **extra) -> EncoderOptions:
    return EncoderOptions("kpr", str(model), linker=str(output / "dictionary" / "linker"),
                          entity_embeddings=str(output / "entity_embeddings"), **extra)


def test_entity_vectors_from_local_or_remote_files_leave_no_file_behind(tmp_path, system_temp):
    vectors = write_entity_artifacts(tmp_path)
    missing = next(entity_id for entity_id in range(1, len(KEYS) + 1) if entity_id not in vectors)
    ids = np.array([[*sorted(vectors), 0], [0, missing, max(vectors), 0]])
    expected = np.array([[vectors.get(entity_id, np.zeros(ENTITY_DIM)) for entity_id in row] for row in ids])
    for directory in (str(tmp_path / "entity_embeddings"), mirrored(tmp_path / "entity_embeddings")):
        table = EntityTable(directory)
        assert os.listdir(system_temp) == []
        assert table.lookup(ids).dtype == np.float32 and np.array_equal(table.lookup(ids), expected)
        assert [table.has(entity_id) for entity_id in range(len(KEYS) + 2)] == [
            entity_id in vectors for entity_id in range(len(KEYS) + 2)]


def test_a_kpr_encoder_on_remote_artifacts_encodes_as_on_local_ones(tiny_bert, tmp_path, system_temp):
    write_entity_artifacts(tmp_path)
    init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"),
                        KPRSettings(entity_embedding_size=ENTITY_DIM, num_entity_fusion_attention_heads=2))
    passages = linked_passages(12)
    local = load_retriever(kpr_options(tmp_path / "kpr", tmp_path, max_length=32)).encode_passages(passages)
    remote = EncoderOptions("kpr", str(tmp_path / "kpr"), linker=mirrored(tmp_path / "dictionary" / "linker"),
                            entity_embeddings=mirrored(tmp_path / "entity_embeddings"), max_length=32)
    assert np.array_equal(load_retriever(remote).encode_passages(passages), local)
    assert os.listdir(system_temp) == []


def test_kpr_encoder_links_the_text_and_fuses_its_entities(tiny_bert, tmp_path):
    vectors = write_entity_artifacts(tmp_path)
    settings = KPRSettings(entity_embedding_size=ENTITY_DIM, num_entity_fusion_attention_heads=2)
    model = init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"), settings)
    options = kpr_options(tmp_path / "kpr", tmp_path)
    check_encoder_options(options)
    encoder = load_retriever(options, "passage")
    passage = Passage(1, "Paris", "From new york to Paris and France.")
    [features] = encoder.inputs.features(["Paris"], [passage.text])
    [found] = encoder.linked_entities(["Paris"], [passage.text])
    linker = EntityLinker.load(str(tmp_path / "dictionary" / "linker"))
    ids = {candidate.title: candidate.entity_id for mention in linker.detect(passage.text + " new york")
           for candidate in mention.candidates}
    tokens = AutoTokenizer.from_pretrained(tmp_path / "kpr").convert_ids_to_tokens(features["input_ids"])
    assert tokens == ["[CLS]", "paris", "[SEP]", "from", "new", "york", "to", "paris", "and", "france", ".", "[SEP]"]
    # New York (state) has no embedding: skipped; the title's Paris comes first
    assert found.entity_ids == (ids["Paris"], ids["New York City"], ids["Paris"], ids["France"])
    assert found.positions == ((1,), (4, 5), (7,), (9,))
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "kpr")
    encoded = tokenizer("Paris", passage.text, return_tensors="pt")
    del encoded["token_type_ids"]  # KPR feeds none: every token type is 0, as in the reference
    assert "token_type_ids" not in features
    with torch.inference_mode():
        cls = model.bert(**encoded).last_hidden_state[0, 0]
        embeds = torch.tensor(np.array([vectors[entity_id] for entity_id in found.entity_ids]))
        # fed at the norm train.py gives the table of a checkpoint that has none: its word embeddings' mean norm
        trained_norm = model.bert.embeddings.word_embeddings.weight.norm(dim=1).mean()
        embeds = embeds / embeds.norm(dim=1, keepdim=True) * trained_norm
        expected = fusion_by_hand(model, cls, embeds, [list(tokens) for tokens in found.positions])
    np.testing.assert_allclose(encoder.encode_passages([passage])[0], expected.numpy(), atol=1e-5)
    query = load_retriever(options, "query").encode_queries(["new york"])[0]
    assert abs(float(np.linalg.norm(query)) - 1.0) < 1e-5


class RecordedModel:
    """A model that records the inputs of each forward pass."""

    def __init__(self, model) -> None:
        self.model, self.calls = model, []

    def __call__(self, **inputs):
        self.calls.append(inputs)
        return self.model(**inputs)


# The tokens of the "Erie Canal" passage (samples/psgs_w100_sample.tsv, first row) as the reference builds them:
# [CLS] title [SEP] text, the text's first 17 tokens ("elevation of . Lake Erie has a mean surface elevation of .
# Erie Canal The Erie Canal is ...", lowercased by the uncased vocabulary).
ERIE_TOKENS = ["[CLS]", "erie", "canal", "[SEP]", "elevation", "of", ".", "lake", "erie", "has", "a", "mean",
               "surface", "elevation", "of", ".", "erie", "canal", "the", "erie", "canal"]


@pytest.mark.parametrize("max_length", [22, 21])
def test_the_index_stage_feeds_a_real_titled_passage_as_the_reference_does(tiny_bert, tmp_path, max_length):
    """The index stage's two parts (the inputs built by a CPU worker and written to a file, the file read back and
    encoded by the model's process), in the default title mode (pair), give the model [CLS] title [SEP] text [SEP]
    cut to max_length, no token types (all 0), and the entities of every linked mention (title first) at their
    token positions. The text's second "Erie Canal" is at 19, 20: with max_length 22 it ends right before the
    final [SEP] (19 + 2 <= 22 - 1) and is kept; with 21 it runs past max_length - 1 and is dropped."""
    [passage] = dpr_passages(count=1)
    vectors = write_entity_artifacts(tmp_path, names=ERIE_CANAL, unembedded=())
    init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"),
                        KPRSettings(entity_embedding_size=ENTITY_DIM, num_entity_fusion_attention_heads=2))
    options = kpr_options(tmp_path / "kpr", tmp_path, max_length=max_length)
    keys, ready = through_an_input_file([passage], load_inputs(options).passages([passage]))
    assert keys.tolist() == passage_keys(SALT, [passage]).tolist()
    encoder = load_retriever(options)
    encoder.model = RecordedModel(encoder.model)
    [result] = encoder.encode_ready(ready)
    [fed] = encoder.model.calls
    vocabulary = AutoTokenizer.from_pretrained(tiny_bert).get_vocab()
    assert set(fed) == {"input_ids", "attention_mask", "entity_ids", "entity_embeds", "entity_position_ids"}
    tokens = [*ERIE_TOKENS[:max_length - 1], "[SEP]"]
    assert fed["input_ids"].tolist() == [[vocabulary[token] for token in tokens]]
    assert fed["attention_mask"].tolist() == [[1] * max_length]
    ids = entity_ids(tmp_path, ERIE_CANAL)
    canal, lake = ids["Erie Canal"], ids["Lake Erie"]
    kept = [(canal, [1, 2]), (lake, [7, 8]), (canal, [16, 17])] + ([(canal, [19, 20])] if max_length == 22 else [])
    assert fed["entity_ids"].tolist() == [[entity_id for entity_id, _ in kept]]
    assert fed["entity_position_ids"].tolist() == [[positions for _, positions in kept]]
    norm = encoder.model.model.entity_norm  # the checkpoint's (here its word embeddings' mean norm)
    np.testing.assert_allclose(fed["entity_embeds"][0].numpy(), [vectors[entity_id] / np.linalg.norm(
        vectors[entity_id]) * norm for entity_id, _ in kept], rtol=1e-6)
    np.testing.assert_allclose(result, encoder.encode_passages([passage])[0], rtol=0, atol=1e-6)


def test_a_kpr_query_is_cls_query_sep_with_its_entities(tiny_bert, tmp_path):
    """A query, as the reference encodes it: no title, [CLS] query [SEP], no token types, its linked entities."""
    write_entity_artifacts(tmp_path, names=ERIE_CANAL, unembedded=("Q1384",))
    init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"),
                        KPRSettings(entity_embedding_size=ENTITY_DIM, num_entity_fusion_attention_heads=2))
    encoder = load_retriever(kpr_options(tmp_path / "kpr", tmp_path), "query")
    [features] = encoder.inputs.queries(["where does the erie canal meet new york?"])
    tokens = ["[CLS]", "where", "does", "the", "erie", "canal", "meet", "new", "york", "?", "[SEP]"]
    vocabulary = AutoTokenizer.from_pretrained(tiny_bert).get_vocab()
    ids = entity_ids(tmp_path, ERIE_CANAL)
    assert features["input_ids"] == [vocabulary[token] for token in tokens]
    assert "token_type_ids" not in features
    # New York (state) has no embedding: only New York City of the two candidates
    assert features["entity_ids"] == (ids["Erie Canal"], ids["New York City"])
    assert features["entity_positions"] == ((4, 5), (7, 8))


def test_a_kpr_text_with_decomposed_accents_links_as_the_composed_one(tiny_bert, tmp_path):
    """A query typed in NFD (``o`` + U+0300, as some keyboards and systems give it) gets the entities and ids of the
    same text composed, as Wikipedia stores it and so the linker's names: it linked none."""
    write_entity_artifacts(tmp_path, names={"niccolò copernico": (("Q619", "Niccolò Copernico", 5),),
                                            "ātman": (("Q207", "Ātman", 3),)}, unembedded=())
    init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"),
                        KPRSettings(entity_embedding_size=ENTITY_DIM, num_entity_fusion_attention_heads=2))
    inputs = load_inputs(kpr_options(tmp_path / "kpr", tmp_path), "query")
    composed, decomposed = inputs.queries([unicodedata.normalize(form, "Niccolò Copernico e Ātman") for form in
                                           ("NFC", "NFD")])
    assert len(composed["entity_ids"]) == 2 and decomposed == composed


def linked_passages(count: int) -> list[Passage]:
    """Passages of varied lengths naming Paris, New York and France (several entities each, some none)."""
    words = ["the", "river", "crosses", "old", "town", "near", "a", "bridge"]
    names = ["Paris", "new york", "France", "Paris and France", "New York"]
    return [Passage(index + 1, names[index % 4] if index % 3 else "", " ".join(
        [names[(index + part) % len(names)] if part % 3 == 0 else words[(index * part) % len(words)]
         for part in range(3 + (index * 7) % 29)])) for index in range(count)]


def mains_kpr_vectors(encoder, passages: list[Passage]) -> tuple[np.ndarray, dict[str, int]]:
    """main's KPR encoding (before inputs were built apart from the model) on the encoder's own inputs, batched
    as the model's process batches a step (by token budget over all of them at once): tensors filled row by row
    (no token types: all 0), synchronous copies. Returns (vectors, the entity counters of those inputs that are not
    0)."""
    found = encoder.inputs.passages(passages)
    vectors = np.zeros((len(passages), encoder.dim), dtype=np.float32)
    batches = token_budget_batches([len(item["input_ids"]) for item in found], encoder.options.batch_tokens)
    for batch in batches:
        longest = max(len(found[index]["input_ids"]) for index in batch)
        entities = max(1, max(len(found[index]["entity_ids"]) for index in batch))
        span = max([1] + [len(tokens) for index in batch for tokens in found[index]["entity_positions"]])
        tensors = {name: torch.zeros((len(batch), longest), dtype=torch.long)
                   for name in ("input_ids", "attention_mask")}
        ids = torch.zeros((len(batch), entities), dtype=torch.long)
        positions = torch.zeros((len(batch), entities, span), dtype=torch.long)
        for row, index in enumerate(batch):
            size = len(found[index]["input_ids"])
            tensors["input_ids"][row, :size] = torch.tensor(found[index]["input_ids"])
            tensors["attention_mask"][row, :size] = 1
            ids[row, :len(found[index]["entity_ids"])] = torch.tensor(found[index]["entity_ids"], dtype=torch.long)
            for column, tokens in enumerate(found[index]["entity_positions"]):
                positions[row, column, :len(tokens)] = torch.tensor(tokens)
        embeds = torch.from_numpy(encoder.entities.lookup(ids.numpy()))
        with torch.inference_mode():
            vectors[batch] = encoder.model(entity_ids=ids, entity_embeds=embeds, entity_position_ids=positions,
                                           **tensors).numpy()
    counted = {name: sum(len(item["entity_ids"]) if key == "entity_ids" else item[key] for item in found)
               for name, key in (("kpr_entities", "entity_ids"), ("kpr_entities_truncated", "entities_truncated"),
                                 ("kpr_entities_over_max", "entities_over_max"), ("passages_cut", "cut"))}
    return vectors, {name: value for name, value in counted.items() if value}


SALT = "00"  # the encoder's part of the passages' keys in these tests


def through_an_input_file(passages: list[Passage], features: list[dict]) -> tuple[np.ndarray, ReadyInputs]:
    """Passages' keys and their model inputs as the index's model part reads them back from an input file."""
    return table_inputs(pq.read_table(pa.BufferReader(tables.parquet_bytes(inputs_table(passages, features, SALT)))))


def test_kpr_vectors_are_mains_exactly_through_the_stages_input_files(tiny_bert, tmp_path):
    """The library path and the index stage's split (inputs built and counted where the passages are, written to
    a file, read back and encoded by the model's process) give main's vectors exactly, and count what main counts."""
    write_entity_artifacts(tmp_path)
    init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"),
                        KPRSettings(entity_embedding_size=ENTITY_DIM, num_entity_fusion_attention_heads=2))
    options = kpr_options(tmp_path / "kpr", tmp_path, max_length=32, batch_tokens=160, max_entities=6)
    encoder = load_retriever(options, "passage")
    passages = linked_passages(40)
    expected, counts = mains_kpr_vectors(encoder, passages)
    assert expected.shape == (40, 32) and counts["kpr_entities"] > 40
    assert counts["kpr_entities_truncated"] > 0 and counts["kpr_entities_over_max"] > 0
    assert np.array_equal(encoder.encode_passages(passages), expected)
    inputs, counted = load_inputs(options), {}
    features = inputs.passages(passages)
    inputs.count(features, lambda name, value=1: counted.update({name: counted.get(name, 0) + value}))
    assert counted == counts
    keys, ready = through_an_input_file(passages, features)
    assert keys.tolist() == passage_keys(SALT, passages).tolist()
    assert np.array_equal(encoder.encode_ready(ready), expected)
    one_by_one = np.concatenate([encoder.encode_passages([passage]) for passage in passages])
    np.testing.assert_allclose(expected, one_by_one, rtol=0, atol=1e-5)  # batching and order change nothing else


def test_the_index_pipelines_encode_and_count_as_the_library(tiny_bert, tmp_path, capsys, monkeypatch):
    """The inputs' pipeline links, counts and writes input files; the model's pipeline, with two followers, encodes
    them and stages every passage's row once, with the library's vector. A follower's progress lines count the
    passages kept before when their step starts, then the others as their forward batches run."""
    write_entity_artifacts(tmp_path)
    init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"),
                        KPRSettings(entity_embedding_size=ENTITY_DIM, num_entity_fusion_attention_heads=2))
    options = kpr_options(tmp_path / "kpr", tmp_path, max_length=32, batch_tokens=160, max_entities=6)
    passages = linked_passages(24)
    expected, counts = mains_kpr_vectors(load_retriever(options, "passage"), passages)
    files = FollowedFiles(str(tmp_path / "inputs"), INPUT_PREFIX, str(tmp_path / "inputs.list"),
                          str(tmp_path / "ended"), followers=2)

    def prepare(pipeline: beam.Pipeline) -> None:
        _ = (pipeline | beam.Create(passages) | PreparePassageInputs(options, files, SALT)
             | beam.io.WriteToText(files.listing))

    assert run_counting(prepare) == counts
    mark_ended(files, None)
    staged = str(tmp_path / "staged")
    kept = KeptPassages(str(tmp_path / "kept"), save_array(str(tmp_path / "known.npy"), np.zeros(0, np.uint64)),
                        str(tmp_path / "reused"), SALT)
    progress = ProgressSettings("index", "passages", total=24, workers=2, interval=3600)
    follower = FollowPassageInputs(options, files, staged, 4, 32, kept, progress)
    encoded = run_counting(lambda pipeline: pipeline | RunFollowers(follower, 2, "records"))
    assert encoded == {"passages_encoded": 24}
    kept_rows = pa.concat_tables([pq.read_table(path) for path in (tmp_path / "kept").glob("*.parquet")])
    by_key = dict(zip(kept_rows.column("passage_id").to_pylist(), kept_rows.column("passage_key").to_pylist(),
                      strict=True))  # each passage kept once, under the key its inputs were built with
    assert by_key == dict(zip([passage.passage_id for passage in passages], passage_keys(SALT, passages).tolist(),
                              strict=True)) and kept_rows.num_rows == 24
    rows = pa.concat_tables([pq.read_table(path) for path in sorted(Path(staged).rglob("*.parquet"))])
    by_id = dict(zip(rows.column("passage_id").to_pylist(), rows.column("embedding").to_pylist(), strict=True))
    assert sorted(by_id) == [passage.passage_id for passage in passages]
    np.testing.assert_array_equal([by_id[passage.passage_id] for passage in passages], expected)

    again = replace(kept, known=save_array(str(tmp_path / "known-10.npy"), np.sort(passage_keys(SALT, passages[:10]))),
                    reused=str(tmp_path / "reused-again"))
    retriever = type(load_retriever(options, "passage"))
    forward = retriever._forward_inputs

    def slow_forward(encoder, inputs):
        time.sleep(0.2)  # several progress lines a batch
        return forward(encoder, inputs)

    monkeypatch.setattr(retriever, "_forward_inputs", slow_forward)
    capsys.readouterr()
    alone = replace(files, followers=1, ended=str(tmp_path / "ended-alone"))  # the same inputs, for one follower
    fs.write_json_atomic(alone.ended, {"files": [str(path.rename(path.with_name(alone.share(0) + path.name)))
                                                 for path in Path(files.directory).glob("*.parquet")]})
    follower = FollowPassageInputs(options, alone, str(tmp_path / "staged-again"), 4, 32, again,
                                   ProgressSettings("index", "passages", total=24, workers=1, interval=0))
    follower.setup()
    try:
        list(follower.process((0, 1)))
    finally:
        follower.teardown()
    counts = [int(line.split()[1]) for line in capsys.readouterr().err.splitlines()
              if line.startswith("[index] ") and " passages in " in line]
    steps = len(list(Path(files.directory).glob("*.parquet")))  # one file a step (files_per_step)
    assert counts == sorted(counts) and counts[-1] == 24 and 10 in counts, counts
    assert len(set(counts) - {0}) > steps + 1, (steps, counts)  # a step's batches counted one by one


def test_kpr_needs_its_linker_and_matching_entity_sizes(tiny_bert, tmp_path):
    write_entity_artifacts(tmp_path, dim=6)
    init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"), KPRSettings(entity_embedding_size=ENTITY_DIM))
    with pytest.raises(InputError, match=r"have 6 dimensions but .* expects entity_embedding_size 8"):
        check_encoder_options(kpr_options(tmp_path / "kpr", tmp_path))
    shutil.rmtree(tmp_path / "dictionary")
    with pytest.raises(MissingRunArtifactError, match="needs the dictionary stage's linker") as missing:
        check_encoder_options(kpr_options(tmp_path / "kpr", tmp_path))
    assert missing.value.stage == "dictionary"
    with pytest.raises(InputError) as worded:  # the command line says which command writes it
        check_encoder(kpr_options(tmp_path / "kpr", tmp_path))
    linker = tmp_path / "dictionary" / "linker"
    assert worded.value.message == ("the KPR encoder needs the dictionary stage's linker, not found at "
                                    f"{str(linker)!r}: run `python run_pipeline.py dictionary` first")


@pytest.mark.usefixtures("shared_data")
def test_kpr_runs_end_to_end_on_this_projects_own_linker_and_entity_embeddings(tiny_bert, full_run, tmp_path,
                                                                              system_temp):
    """parse (``full_run``'s) -> dictionary -> mentions -> embed-entities -> index with KPR on the bundled sample,
    then search; the system temp directory is as empty afterwards as before."""
    output = tmp_path / "out"
    copy_stages(full_run, output, ("parse",))
    assert main(["dictionary", "--output", str(output), *DIRECT]) == 0
    assert main(["mentions", "--output", str(output), "--max-mentions", "2", *DIRECT]) == 0
    assert main(["embed-entities", "--output", str(output), "--model", str(tiny_bert), "--max-seq-length", "64",
                 *DIRECT]) == 0
    settings = KPRSettings(entity_embedding_size=32, num_entity_fusion_attention_heads=2)
    model = init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"), settings)
    assert main(["index", "--output", str(output), "--encoder", str(tmp_path / "kpr"), "--encoder-type", "kpr",
                 "--words-per-passage", "400", "--max-length", "128", "--shards", "2", *DIRECT]) == 0
    passages = tables.read_table(str(output), "passages").to_pylist()
    info = json.loads((output / "index" / "index.json").read_text())
    assert info["count"] == len(passages) and info["dim"] == 32 and info["metric"] == "cosine"
    stored = {row["passage_id"]: row for path in sorted((output / "index" / "embeddings").rglob("*.parquet"))
              for row in pq.read_table(path).to_pylist()}
    assert set(stored) == {row["passage_id"] for row in passages}

    encoder = load_retriever(kpr_options(tmp_path / "kpr", output, max_length=128))
    entity_ids = set(tables.read_table(str(output), "entity_embeddings", ["entity_id"]).column(0).to_pylist())
    found = encoder.linked_entities([row["title"] for row in passages], [row["text"] for row in passages])
    linked = [row for row, item in zip(passages, found, strict=True) if len(set(item.entity_ids)) >= 2]
    assert len(linked) >= 10, "the sample's own linker finds entities with embeddings in its passages"
    row = min(linked, key=lambda item: item["passage_id"])
    [features] = encoder.linked_entities([row["title"]], [row["text"]])
    assert set(features.entity_ids) <= entity_ids
    table = {item["entity_id"]: item["embedding"] for item in
             tables.read_table(str(output), "entity_embeddings").to_pylist()}
    [item] = encoder.inputs.features([row["title"]], [row["text"]])
    # the ids as the reference builds them (tests/encoders/test_kpr_inputs.py), token types 0
    with torch.inference_mode():
        cls = model.bert(input_ids=torch.tensor([item["input_ids"]])).last_hidden_state[0, 0]
        embeds = torch.tensor([table[entity_id] for entity_id in features.entity_ids])
        expected = fusion_by_hand(model, cls, embeds, [list(tokens) for tokens in features.positions])
        without = fusion_by_hand(model, cls, embeds[:0], [])
    np.testing.assert_allclose(stored[row["passage_id"]]["embedding"], expected.numpy(), atol=1e-5)
    assert not np.allclose(expected.numpy(), without.numpy(), atol=1e-3)
    assert main(["search", "--output", str(output), "--query", row["title"], "-k", "3"]) == 0
    assert os.listdir(system_temp) == []


def test_a_model_error_in_the_index_follower_stops_the_thread_reading_ahead(tiny_bert, tmp_path, monkeypatch):
    write_entity_artifacts(tmp_path)
    init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"),
                        KPRSettings(entity_embedding_size=ENTITY_DIM, num_entity_fusion_attention_heads=2))
    options = kpr_options(tmp_path / "kpr", tmp_path, max_length=32, batch_tokens=160, max_entities=6)
    files = FollowedFiles(str(tmp_path / "inputs"), INPUT_PREFIX, str(tmp_path / "inputs.list"),
                          str(tmp_path / "ended"), followers=1)
    run_counting(lambda pipeline: (pipeline | beam.Create(linked_passages(24))
                                   | PreparePassageInputs(options, files, SALT, rows_per_file=4)
                                   | beam.io.WriteToText(files.listing)))
    mark_ended(files, None)
    kept = KeptPassages(str(tmp_path / "kept"), save_array(str(tmp_path / "known.npy"), np.zeros(0, np.uint64)),
                        str(tmp_path / "reused"), SALT)

    def failing(encoder, inputs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(type(load_retriever(options, "passage")), "_forward_inputs", failing)
    follower = FollowPassageInputs(options, files, str(tmp_path / "staged"), 4, 32, kept,
                                   ProgressSettings("index", "passages", total=24, workers=1, interval=3600))
    follower.setup()
    try:
        with pytest.raises(RuntimeError, match="illegal memory access") as raised:
            list(follower.process((0, 1)))
    finally:
        follower.teardown()
    assert len(list(Path(files.directory).glob("*.parquet"))) > 2  # steps left to read ahead when the model failed
    # the traceback (holding the follower's frames) is alive, as a runner holds it: the reading thread has stopped
    assert raised.tb is not None
    assert [thread.name for thread in threading.enumerate() if thread.name == "prefetch"] == []
