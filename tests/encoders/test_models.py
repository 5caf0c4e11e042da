"""Loading models and tokenizers without their own code: a config.json or tokenizer_config.json with an
``auto_map`` (as the published KPR models have) never makes transformers ask "Do you wish to run the custom code?"
in a terminal; what only that code could load is one line."""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from artifacts.errors import ModelError
from encoders.kpr_checkpoint import init_kpr_checkpoint
from encoders.kpr_config import KPRSettings
from encoders.loading import check_encoder_options
from encoders.mask_encoder import check_mask_model
from encoders.models import ModelSpec, load_tokenizer, model_config, usable_positions
from encoders.retrievers import EncoderOptions
from tests.conftest import REPO

# What the published models name: modules of their own, absent here (they would never be run anyway).
CONFIG_AUTO_MAP = {"AutoConfig": "configuration_kpr.KPRConfigForBert", "AutoModel": "modeling_kpr.KPRModelForBert"}
TOKENIZER_AUTO_MAP = {"AutoTokenizer": ["tokenization_kpr.KPRBertTokenizer", None]}

# Run in a child whose stdin is a terminal, where transformers' prompt would wait for an answer.
LOADS = """
import json, sys
from encoders.kpr_checkpoint import load_checkpoint
from encoders.models import ModelSpec, load_encoder, load_tokenizer
bert, kpr = sys.argv[1:]
print(json.dumps({"bert": load_tokenizer(bert)("Erie Canal")["input_ids"],
                  "model": type(load_encoder(ModelSpec(bert))).__name__,
                  "kpr": load_tokenizer(kpr)("Erie Canal")["input_ids"],
                  "kpr_model": type(load_checkpoint(kpr)).__name__}))
"""


def with_auto_maps(directory: Path, model_type: str | None = None) -> Path:
    """``directory``'s config.json and tokenizer_config.json naming code of their own (and ``model_type``)."""
    config = json.loads((directory / "config.json").read_text())
    config["auto_map"] = CONFIG_AUTO_MAP
    config["model_type"] = model_type or config["model_type"]
    (directory / "config.json").write_text(json.dumps(config))
    tokenizer = json.loads((directory / "tokenizer_config.json").read_text())
    tokenizer.update(auto_map=TOKENIZER_AUTO_MAP, tokenizer_class="KPRBertTokenizer")
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return directory


def test_models_naming_their_own_code_load_without_it_and_without_a_prompt(tiny_bert, tmp_path):
    """A BERT and a KPR checkpoint whose files name code of their own load with transformers' BERT tokenizer and
    weights, in a terminal, without asking anything."""
    bert = with_auto_maps(Path(shutil.copytree(tiny_bert, tmp_path / "bert")))
    init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"), KPRSettings(entity_embedding_size=8))
    kpr = with_auto_maps(tmp_path / "kpr")
    terminal, child_side = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-c", LOADS, str(bert), str(kpr)], stdin=child_side,
                              capture_output=True, text=True, timeout=120, cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        os.close(child_side)
        os.close(terminal)
    assert "[y/N]" not in done.stdout + done.stderr
    assert done.returncode == 0, done.stderr
    vocabulary = AutoTokenizer.from_pretrained(tiny_bert).get_vocab()
    ids = [vocabulary[token] for token in ("[CLS]", "erie", "canal", "[SEP]")]
    assert json.loads(done.stdout.splitlines()[-1]) == {"bert": ids, "model": "BertModel", "kpr": ids,
                                                        "kpr_model": "KPRModel"}


def test_a_kpr_checkpoint_read_as_a_dense_encoder_says_it_is_one(tiny_bert, tmp_path):
    """The default --encoder-type is dpr: a KPR checkpoint given without --encoder-type kpr was transformers'
    "does not recognize this architecture ... pip install --upgrade transformers" (or its custom code's)."""
    init_kpr_checkpoint(str(tiny_bert), str(tmp_path / "kpr"), KPRSettings(entity_embedding_size=8))
    shutil.copytree(tmp_path / "kpr", tmp_path / "published")
    for kpr in (tmp_path / "kpr", with_auto_maps(tmp_path / "published")):
        with pytest.raises(ModelError) as refused:
            model_config(ModelSpec(str(kpr)))
        assert refused.value.message == (f"{kpr} is a KPR checkpoint (model_type kpr-bert): only `index "
                                         "--encoder-type kpr` encodes with one (and the queries of an index built so)")


def test_a_model_only_its_own_code_could_load_is_one_line(tiny_bert, tmp_path):
    unknown = with_auto_maps(Path(shutil.copytree(tiny_bert, tmp_path / "unknown")), model_type="alien-bert")
    with pytest.raises(ModelError) as refused:
        load_tokenizer(str(unknown))
    assert refused.value.message == (f"{unknown} (model type alien-bert) needs its own code (auto_map), which this "
                                     "pipeline does not run")


def test_a_tokenizer_from_a_path_this_process_does_not_see_is_named_as_missing(tiny_bert, tmp_path):
    """On a cluster's workers, which see none of the launcher's files, the index's inputs load the encoder's
    tokenizer by its path: transformers' own words for a missing one ask for a hub repo id."""
    missing, empty = tmp_path / "models" / "encoder", tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelError) as error:
        load_tokenizer(str(missing))
    assert error.value.message == f"model path {missing} does not exist"
    with pytest.raises(ModelError) as error:
        load_tokenizer(str(empty))
    assert error.value.message.startswith(f"{empty} has no tokenizer files (")
    assert load_tokenizer(str(tiny_bert))("Erie Canal")["input_ids"][0] == load_tokenizer(str(tiny_bert)).cls_token_id


@pytest.mark.parametrize(("config", "usable"), [
    ({"model_type": "bert", "max_position_embeddings": 512}, 512),
    ({"model_type": "roberta", "max_position_embeddings": 514, "pad_token_id": 1}, 512),
    ({"model_type": "mpnet", "max_position_embeddings": 514, "pad_token_id": 1}, 512),  # was 514
    ({"model_type": "longformer", "max_position_embeddings": 4098, "pad_token_id": 1}, 4096),  # was 4098
    ({"model_type": "gpt2", "n_positions": 128}, 128),  # was 512, the default
    ({"model_type": "roberta", "max_position_embeddings": 20, "pad_token_id": 0}, 19),  # was 18
])
def test_the_tokens_an_input_may_have_are_those_the_models_positions_take(config, usable, tmp_path):
    """An MPNet's or a GPT-2's limit was one the model does not take: the length was accepted, every input
    built, then the forward failed (IndexError: index out of range, a Beam traceback)."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert usable_positions(ModelSpec(str(tmp_path))) == usable


def test_a_tokenizer_with_tokens_its_model_has_no_embedding_of_is_refused_by_index_and_embed_entities(tiny_bert,
                                                                                                      tmp_path):
    """A directory put together from two models' files: embed-entities refused it, index built every input, then
    failed in the forward (IndexError: index out of range, a Beam traceback)."""
    mixed = tmp_path / "mixed"
    shutil.copytree(tiny_bert, mixed)
    config = json.loads((mixed / "config.json").read_text())
    (mixed / "config.json").write_text(json.dumps({**config, "vocab_size": 3000}))
    expected = rf"the tokenizer of {mixed} has {len(load_tokenizer(str(tiny_bert))):,} tokens and its model 3,000 " \
               "word embeddings: they are not one model's"
    with pytest.raises(ModelError, match=expected):
        check_mask_model(ModelSpec(str(mixed)))
    with pytest.raises(ModelError, match=expected):
        check_encoder_options(EncoderOptions("mean", str(mixed), max_length=64))
    check_encoder_options(EncoderOptions("mean", str(tiny_bert), max_length=64))


def test_a_model_directory_whose_name_reads_as_a_glob_is_fingerprinted(tiny_bert, tmp_path):
    """``mini[v2]/*`` read as ``miniv/*``, ``mini2/*``: no file, fingerprint 'missing' before and after its weights
    changed, so a stage kept the vectors of the old weights."""
    from artifacts.run import manifest
    from encoders.models import model_files

    model = tmp_path / "mini[v2]"
    shutil.copytree(tiny_bert, model)
    pattern = model_files({"model": str(model)})["model"]
    before = (manifest.file_fingerprint(pattern), manifest.content_digest(pattern))
    assert "missing" not in before
    weights = next(path for path in model.iterdir() if path.suffix in (".safetensors", ".bin"))
    weights.write_bytes(weights.read_bytes() + b"\0" * 16)
    assert manifest.file_fingerprint(pattern) != before[0] and manifest.content_digest(pattern) != before[1]
