"""Audit of issue 4: an entity's sample survives changes to other entities' links; a --layer or --max-seq-length
the model cannot take fails before any work; embed-entities gives the same vectors with one and two workers."""

from __future__ import annotations

import numpy as np
import pytest

from artifacts import tables
from artifacts.errors import BelowMinimumError, InputError, SettingError
from encoders.mask_encoder import MaskEncoderHandler, check_mask_model
from encoders.models import ModelSpec
from encoders.retrievers import EncoderOptions
from pipelines.cli import main
from pipelines.flags import worded
from pipelines.index import check_encoder
from tests.conftest import MULTI_PROCESS, copy_stages
from tests.test_dictionary import article
from tests.test_mentions_embeddings import build_embeddings
from transforms.mention_sampling import link_refs


def test_sample_keys_of_an_entity_ignore_links_to_other_entities():
    before = article(7, "T", "Paris and Paris", [("Paris", "Paris"), ("Paris", "Paris")])
    after = article(7, "T", "Lyon, Paris and Paris", [("Lyon", "Lyon"), ("Paris", "Paris"), ("Paris", "Paris")])

    def paris_keys(row):
        return [ref.sample_key for target, ref in link_refs(row, seed=0) if target == "Paris"]

    assert paris_keys(before) == paris_keys(after)
    assert [ref.link_index for target, ref in link_refs(after, seed=0) if target == "Paris"] == [1, 2]


def test_entity_embeddings_are_the_same_for_one_and_two_workers(tiny_bert, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    build_embeddings(one, tiny_bert)  # one DirectRunner worker
    copy_stages(one, two, ("parse", "dictionary", "mentions"))
    assert main(["embed-entities", "--output", str(two), "--model", str(tiny_bert), "--max-seq-length", "64",
                 *MULTI_PROCESS]) == 0

    def rows(output):
        return sorted(tables.read_table(str(output), "entity_embeddings").to_pylist(), key=lambda r: r["entity_id"])

    first, second = rows(one), rows(two)
    assert [(r["entity_id"], r["title"], r["mention_count"]) for r in first] == [
        (r["entity_id"], r["title"], r["mention_count"]) for r in second]
    assert len(first) >= 3
    np.testing.assert_allclose([r["embedding"] for r in first], [r["embedding"] for r in second],
                               rtol=1e-5, atol=1e-6)


def test_layer_and_sequence_length_are_checked_before_any_work(tiny_bert):
    spec = ModelSpec(str(tiny_bert))  # 2 layers, 512 positions
    for layer in (-3, -1, 0, 2):
        check_mask_model(spec, layer, 512)
    for layer in (-4, 3):
        with pytest.raises(SettingError) as raised:
            check_mask_model(spec, layer)
        assert (raised.value.setting, raised.value.value) == ("layer", layer)
        assert worded(raised.value).message == (
            f"--layer {layer}: {tiny_bert} has 2 layers (hidden states -3..2; -1 is the last layer)")
    for length in (2, 513):
        with pytest.raises(SettingError) as raised:
            check_mask_model(spec, -1, length)
        assert (raised.value.setting, raised.value.value) == ("max_seq_length", length)
        assert worded(raised.value).message == (
            f"--max-seq-length {length}: {tiny_bert} takes 3 to 512 tokens ([CLS], [MASK], [SEP] and the context)")


def test_a_batch_token_budget_below_one_is_refused_on_the_driver(tiny_bert):
    with pytest.raises(BelowMinimumError) as raised:
        MaskEncoderHandler(ModelSpec(str(tiny_bert)), max_tokens=0)
    assert worded(raised.value).message == "--batch-tokens must be at least 1, got 0"
    with pytest.raises(InputError, match="--batch-tokens must be at least 1, got 0"):
        check_encoder(EncoderOptions("mean", str(tiny_bert), batch_tokens=0))


def test_a_passage_length_beyond_the_position_embeddings_is_refused_on_the_driver(tiny_bert, tmp_path, capsys):
    check_encoder(EncoderOptions("mean", str(tiny_bert), max_length=512))
    with pytest.raises(InputError, match=r"--max-length 513: .* takes at most 512 tokens"):
        check_encoder(EncoderOptions("mean", str(tiny_bert), max_length=513))
    argv = ["index", "--output", str(tmp_path), "--encoder", str(tiny_bert), "--max-length", "1024",
            "--corpus", str(tmp_path / "any.tsv"), "--runner=DirectRunner"]
    assert main(argv) == 2
    assert "--max-length 1024" in capsys.readouterr().err
