"""The KPR encoder: entity inputs from linker mentions, the fusion layer against the paper's formula computed by
hand, published parameter and config names, save/reload, and the whole chain on this project's own artifacts."""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import threading
from functools import partial
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from apache_beam.ml.inference.base import RunInference
from apache_beam.testing.util import assert_that, equal_to
from transformers import AutoModel, AutoTokenizer

from artifacts import schemas, tables
from artifacts.errors import InputError
from artifacts.linker import Candidate, EntityLinker, Mention, NameRow, build_kb_trie, write_linker
from artifacts.passages import Passage
from encoders.batching import token_budget_batches
from encoders.errors import MissingRunArtifactError
from encoders.kpr_checkpoint import from_bert, init_kpr_checkpoint, load_checkpoint
from encoders.kpr_config import KPRSettings, read_kpr_settings
from encoders.kpr_entities import EntityTable, entity_inputs, mention_token_positions
from encoders.kpr_model import KPRModel
from encoders.loading import PassageEncoderHandler, check_encoder_options, load_retriever
from encoders.retrievers import EncoderOptions
from pipelines.cli import main
from pipelines.index import check_encoder
from tests.builders import mirrored, run_counting
from tests.conftest import BUNDLED_SAMPLE, DIRECT
from transforms.dead_letters import count

ENTITY_DIM = 8
PUBLISHED_FUSION_NAMES = {
    "entity_fusion_layer.entity_embeddings.position_embeddings.weight",
    "entity_fusion_layer.entity_embeddings.dense.weight",
    "entity_fusion_layer.entity_embeddings.LayerNorm.weight", "entity_fusion_layer.entity_embeddings.LayerNorm.bias",
    *(f"entity_fusion_layer.entity_fusion_layer.{part}.{kind}" for part in ("query", "key", "value")
      for kind in ("weight", "bias")),
    "entity_fusion_layer.LayerNorm.weight", "entity_fusion_layer.LayerNorm.bias", "entity_fusion_layer.noop_embeddings",
}
KEYS = ["Q90", "Q60", "New York (state)", "Q142"]
CONFIG = {"max_mention_length": 100, "case_sensitive": False, "min_link_prob": 0.05, "min_prior_prob": 0.3,
          "min_link_count": 1}


def candidate(entity_id: int) -> Candidate:
    return Candidate(entity_id, f"Q{entity_id}", f"E{entity_id}", 1.0, 1.0, 1)


def test_mention_tokens_are_the_overlapping_tokens_of_its_segment():
    offsets = [(0, 0), (0, 3), (4, 8), (8, 10), (0, 0), (0, 3), (0, 0)]
    sequence_ids = [None, 0, 0, 0, None, 1, None]
    assert mention_token_positions(4, 10, offsets, sequence_ids, 0) == (2, 3)
    assert mention_token_positions(5, 6, offsets, sequence_ids, 0) == (2,)
    assert mention_token_positions(0, 3, offsets, sequence_ids, 1) == (5,)
    assert mention_token_positions(11, 20, offsets, sequence_ids, 0) == ()


def test_entity_inputs_take_every_candidate_in_text_order():
    offsets = [(0, 0), (0, 5), (6, 10), (11, 16), (0, 0), (0, 4), (0, 0)]
    sequence_ids = [None, 0, 0, 0, None, 1, None]
    title = [Mention(0, 5, "Paris", (candidate(7), candidate(9)))]
    text = [Mention(0, 4, "York", (candidate(3), candidate(5))), Mention(20, 25, "Cut", (candidate(4),))]
    found, dropped = entity_inputs([title, text], offsets, sequence_ids, lambda entity_id: entity_id != 9, 10)
    assert (found.entity_ids, found.positions, dropped) == ((7, 3, 5), ((1,), (5,), (5,)), 0)
    found, dropped = entity_inputs([title, text], offsets, sequence_ids, lambda entity_id: True, 2)
    assert (found.entity_ids, dropped) == ((7, 9), 2)


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
    load_checkpoint(str(tmp_path / "kpr"))
    renamed = {name.replace("entity_fusion_layer.noop_embeddings", "fusion.noop"): value
               for name, value in weights.items()}
    save_file(renamed, tmp_path / "kpr" / "model.safetensors")
    with pytest.raises(InputError, match=r"does not hold KPR weights: missing \['entity_fusion_layer.noop_embed"):
        load_checkpoint(str(tmp_path / "kpr"))
    with pytest.raises(InputError, match="no entity_embedding_size"):
        read_kpr_settings(str(tiny_bert))


def write_entity_artifacts(output: Path, dim: int = ENTITY_DIM) -> dict[int, np.ndarray]:
    """OUT/dictionary/linker and OUT/entity_embeddings by hand: paris, new york (two candidates), france."""
    kb = build_kb_trie(KEYS)
    titles = [""] * len(KEYS)
    for key, title in zip(KEYS, ["Paris", "New York City", "New York (state)", "France"], strict=True):
        titles[kb[key]] = title
    eid = {key: kb[key] + 1 for key in KEYS}
    rows = [NameRow("paris", eid["Q90"], 9, 9, 9), NameRow("new york", eid["Q60"], 6, 10, 20),
            NameRow("new york", eid["New York (state)"], 4, 10, 20), NameRow("france", eid["Q142"], 5, 5, 5)]
    write_linker(str(output / "dictionary" / "linker"), rows, kb, titles, CONFIG)
    rng = np.random.default_rng(0)
    vectors = {entity_id: rng.normal(size=dim).astype(np.float32) for entity_id in eid.values()
               if entity_id != eid["New York (state)"]}  # an entity without embedding (no mentions)
    (output / "entity_embeddings").mkdir(parents=True)
    table = pa.Table.from_pylist([{"entity_id": entity_id, "title": "", "qid": None, "embedding": vector.tolist(),
                                   "mention_count": 1} for entity_id, vector in vectors.items()],
                                 schema=schemas.entity_embeddings(dim))
    pq.write_table(table, output / "entity_embeddings" / "part-0.parquet")
    return vectors


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
    with torch.inference_mode():
        cls = model.bert(**encoded).last_hidden_state[0, 0]
        embeds = torch.tensor(np.array([vectors[entity_id] for entity_id in found.entity_ids]))
        expected = fusion_by_hand(model, cls, embeds, [list(tokens) for tokens in found.positions])
    np.testing.assert_allclose(encoder.encode_passages([passage])[0], expected.numpy(), atol=1e-5)
    query = load_retriever(options, "query").encode_queries(["new york"])[0]
    assert abs(float(np.linalg.norm(query)) - 1.0) < 1e-5


def linked_passages(count: int) -> list[Passage]:
    """Passages of varied lengths naming Paris, New York and France (several entities each, some none)."""
    words = ["the", "river", "crosses", "old", "town", "near", "a", "bridge"]
    names = ["Paris", "new york", "France", "Paris and France", "New York"]
    return [Passage(index + 1, names[index % 4] if index % 3 else "", " ".join(
        [names[(index + part) % len(names)] if part % 3 == 0 else words[(index * part) % len(words)]
         for part in range(3 + (index * 7) % 29)])) for index in range(count)]


def mains_kpr_vectors(encoder, passages: list[Passage]) -> tuple[np.ndarray, int, int]:
    """main's KPR path (before inputs were built apart from the model): every text linked first, then batch by
    batch, tensors filled row by row, synchronous copies. Returns (vectors, entities fed, entities dropped over
    max)."""
    titles, texts = [passage.title for passage in passages], [passage.text for passage in passages]
    encoded = encoder.tokenizer(titles, texts, truncation=True, max_length=encoder.options.max_length,
                                return_offsets_mapping=True)
    mentions = [encoder.inputs.linker.detect_batch(titles), encoder.inputs.linker.detect_batch(texts)]
    found = [entity_inputs([mentions[0][index], mentions[1][index]], encoded["offset_mapping"][index],
                           encoded.sequence_ids(index), encoder.entities.has, encoder.options.max_entities)
             for index in range(len(passages))]
    vectors = np.zeros((len(passages), encoder.dim), dtype=np.float32)
    for batch in token_budget_batches([len(ids) for ids in encoded["input_ids"]], encoder.options.batch_tokens):
        longest = max(len(encoded["input_ids"][index]) for index in batch)
        entities = max(1, max(len(found[index][0].entity_ids) for index in batch))
        span = max([1] + [len(tokens) for index in batch for tokens in found[index][0].positions])
        tensors = {name: torch.zeros((len(batch), longest), dtype=torch.long)
                   for name in ("input_ids", "attention_mask", "token_type_ids")}
        ids = torch.zeros((len(batch), entities), dtype=torch.long)
        positions = torch.zeros((len(batch), entities, span), dtype=torch.long)
        for row, index in enumerate(batch):
            size = len(encoded["input_ids"][index])
            tensors["input_ids"][row, :size] = torch.tensor(encoded["input_ids"][index])
            tensors["token_type_ids"][row, :size] = torch.tensor(encoded["token_type_ids"][index])
            tensors["attention_mask"][row, :size] = 1
            ids[row, :len(found[index][0].entity_ids)] = torch.tensor(found[index][0].entity_ids, dtype=torch.long)
            for column, tokens in enumerate(found[index][0].positions):
                positions[row, column, :len(tokens)] = torch.tensor(tokens)
        embeds = torch.from_numpy(encoder.entities.lookup(ids.numpy()))
        with torch.inference_mode():
            vectors[batch] = encoder.model(entity_ids=ids, entity_embeds=embeds, entity_position_ids=positions,
                                           **tensors).numpy()
    return vectors, sum(len(item.entity_ids) for item, _ in found), sum(dropped for _, dropped in found)


def counted_in(counted: list, name: str, value: int) -> None:
    counted.append((name, value, threading.current_thread()))


def test_kpr_vectors_are_mains_exactly_and_counted_where_the_passages_are(tiny_bert, tmp_path):
    """The library path and the RunInference handler (its own inputs in the worker, as with a model shared by
    the worker processes, or the model's) give main's vectors exactly; the handler counts the entity inputs in
    its own thread (Beam counts only there), and a pickled handler carries no loaded inputs."""
    write_entity_artifacts(tmp_path)
    init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"),
                        KPRSettings(entity_embedding_size=ENTITY_DIM, num_entity_fusion_attention_heads=2))
    options = kpr_options(tmp_path / "kpr", tmp_path, max_length=32, batch_tokens=160, max_entities=6)
    encoder = load_retriever(options, "passage")
    passages = linked_passages(40)
    expected, entities, dropped = mains_kpr_vectors(encoder, passages)
    assert expected.shape == (40, 32) and entities > 40 and dropped > 0
    assert np.array_equal(encoder.encode_passages(passages), expected)
    for share in (True, False):
        counted: list[tuple[str, int, threading.Thread]] = []
        handler = PassageEncoderHandler(options, share_model=share, count=partial(counted_in, counted))
        model = handler.load_model()
        results = handler.run_inference(passages, model)
        assert np.array_equal(np.array([result.inference for result in results]), expected)
        assert (handler.inputs_for(model) is model.inputs) is not share  # shared: the worker's own inputs
        assert {thread for _, _, thread in counted} == {threading.main_thread()}
        assert sum(value for name, value, _ in counted if name == "kpr_entities") == entities
        assert sum(value for name, value, _ in counted if name == "kpr_entities_over_max") == dropped
    handler = PassageEncoderHandler(options, share_model=True)
    assert handler.inputs_for(model) is not None and pickle.loads(pickle.dumps(handler))._inputs is None
    one_by_one = np.concatenate([encoder.encode_passages([passage]) for passage in passages])
    np.testing.assert_allclose(expected, one_by_one, rtol=0, atol=1e-5)  # batching and order change nothing else


def test_a_model_shared_by_the_workers_encodes_and_the_counters_still_count(tiny_bert, tmp_path):
    """RunInference with the model in Beam's shared-model process (the CUDA default): the worker links and
    counts, the shared model only encodes; vectors and counters as without sharing."""
    write_entity_artifacts(tmp_path)
    init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"),
                        KPRSettings(entity_embedding_size=ENTITY_DIM, num_entity_fusion_attention_heads=2))
    options = kpr_options(tmp_path / "kpr", tmp_path, max_length=32, batch_tokens=160, max_entities=6)
    passages = linked_passages(24)
    encoder = load_retriever(options, "passage")
    expected, entities, dropped = mains_kpr_vectors(encoder, passages)
    by_id = {passage.passage_id: vector.tolist() for passage, vector in zip(passages, expected, strict=True)}

    def build(pipeline: beam.Pipeline) -> None:
        vectors = (pipeline | beam.Create(passages)
                   | RunInference(PassageEncoderHandler(options, share_model=True, count=count))
                   | beam.Map(lambda result: (result.example.passage_id, result.inference.tolist())))
        assert_that(vectors, equal_to(list(by_id.items())))

    assert run_counting(build) == {"kpr_entities": entities, "kpr_entities_over_max": dropped}


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
def test_kpr_runs_end_to_end_on_this_projects_own_linker_and_entity_embeddings(tiny_bert, tmp_path, system_temp):
    """parse -> dictionary -> mentions -> embed-entities -> index with KPR on the bundled sample, then search; the
    system temp directory is as empty afterwards as before."""
    output = tmp_path / "out"
    assert main(["parse", "--dump", str(BUNDLED_SAMPLE), "--output", str(output), *DIRECT]) == 0
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
    encoded = AutoTokenizer.from_pretrained(tmp_path / "kpr")(row["title"], row["text"], truncation=True,
                                                                max_length=128, return_tensors="pt")
    with torch.inference_mode():
        cls = model.bert(**encoded).last_hidden_state[0, 0]
        embeds = torch.tensor([table[entity_id] for entity_id in features.entity_ids])
        expected = fusion_by_hand(model, cls, embeds, [list(tokens) for tokens in features.positions])
        without = fusion_by_hand(model, cls, embeds[:0], [])
    np.testing.assert_allclose(stored[row["passage_id"]]["embedding"], expected.numpy(), atol=1e-5)
    assert not np.allclose(expected.numpy(), without.numpy(), atol=1e-3)
    assert main(["search", "--output", str(output), "--query", row["title"], "-k", "3"]) == 0
    assert os.listdir(system_temp) == []
