"""Bad input on the command line, run in-process: each case gives its exact one-line message and exit code
(issue 14, part B: not a dump, a multistream dump without its index, bad encoders, empty queries, damaged
shards; issue 21: index factories, corpora and question files that give nothing, a changed shard, a full disk),
and a stage run leaves nothing in the system temp directory."""

from __future__ import annotations

import bz2
import errno
import gzip
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from artifacts import fs, layout
from artifacts.errors import NoRoomError, refuse_without_room
from artifacts.run import manifest
from artifacts.run.kpr_export import TORCH_SAVE_BYTES, entity_keys, export_bytes, export_kpr, scratch_bytes
from artifacts.run.publish import publish_run
from artifacts.run.verified import CACHE_ENV
from pipelines.launcher import disk_space
from pipelines.launcher.cli import main
from pipelines.launcher.disk_space import mount_point, out_of_space
from pipelines.launcher.stage import private_tempdir
from tests.builders import stage_command
from tests.conftest import BUNDLED_INDEX, BUNDLED_SAMPLE, DIRECT, copy_stages
from transforms.parse.multistream import has_several_bz2_streams, looks_multistream

CORPUS = "id\ttext\ttitle\n1\tAaron is a prophet and high priest\tAaron\n2\tMoses led the people\tMoses\n"
SHARD = "index/shard-00000.faiss"
NO_HEADER_LINE = "1\tAaron is a prophet\tAaron"  # a corpus row where the header should be
QAS_FORM = "question<TAB>['answer', ...] per line, an answer that holds a word"
SITEINFO = ('<siteinfo><sitename>Wikipedia</sitename><dbname>enwiki</dbname><namespaces>'
            '<namespace key="0" case="first-letter" /><namespace key="1" case="first-letter">Talk</namespace>'
            '</namespaces></siteinfo>')
TALK_ONLY_DUMP = ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10">' + SITEINFO +
                  '<page><title>Talk:Pear</title><ns>1</ns><id>7</id><revision><id>70</id>'
                  '<text xml:space="preserve">Is a pear a fruit?</text></revision></page></mediawiki>')


def write_gpt2_like(directory: Path) -> Path:
    """A tiny GPT-2 with a byte-level BPE tokenizer: no [CLS], no [SEP]."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2Model, PreTrainedTokenizerFast

    vocab = {"<|endoftext|>": 0, **{chr(code): index + 1 for index, code in enumerate(range(32, 127))}}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>",
                            bos_token="<|endoftext|>").save_pretrained(directory)
    GPT2Model(GPT2Config(vocab_size=len(vocab), n_embd=32, n_layer=1, n_head=2, n_positions=512, bos_token_id=0,
                         eos_token_id=0)).save_pretrained(directory)
    return directory


def write_tokenless_bert(directory: Path, keep_text: bool = False) -> Path:
    """A tiny BERT with [CLS] and [SEP] whose tokenizer normalizes every character away: no token for any text
    (``keep_text``: whose vocabulary holds no word, every word is [UNK])."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    if not keep_text:
        tokenizer.normalizer = normalizers.Replace(Regex(r"[\s\S]"), "")
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]").save_pretrained(directory)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=128)).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def bad_encoders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad-encoders")
    return {"gpt2": write_gpt2_like(root / "gpt2"), "tokenless": write_tokenless_bert(root / "tokenless"),
            "unknowing": write_tokenless_bert(root / "unknowing", keep_text=True)}


@pytest.fixture(scope="module")
def small_index(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> Path:
    """OUT with a two-passage index of one shard (copy it before changing anything)."""
    root = tmp_path_factory.mktemp("small-index")
    (root / "corpus.tsv").write_text(CORPUS, encoding="utf-8")
    output = root / "out"
    assert main(["index", "--output", str(output), "--encoder", str(tiny_bert), "--encoder-type", "mean",
                 "--corpus", str(root / "corpus.tsv"), "--max-length", "32", *DIRECT]) == 0
    return output


@pytest.fixture(scope="module")
def damaged_index(tmp_path_factory: pytest.TempPathFactory, small_index: Path) -> Path:
    """``small_index`` whose only shard file has its header overwritten, and recorded so (a shard damaged before
    the manifest recorded it): its size and sha256 match the manifest, and FAISS is the one to find the damage."""
    output = Path(shutil.copytree(small_index, tmp_path_factory.mktemp("damaged") / "out"))
    shard = output / "index" / "shard-00000.faiss"
    shard.write_bytes(b"XXXX" + shard.read_bytes()[4:])
    stages = manifest.load(str(output))
    stages["index"].outputs = [manifest.describe_file(str(output), str(shard)) if item.path == SHARD else item
                               for item in stages["index"].outputs]
    manifest.save(str(output), stages)
    return output


@dataclass(frozen=True)
class Case:
    """``argv(tmp, models)`` -> (command line, the exact last stderr line)."""

    name: str
    argv: Callable[[Path, dict[str, Path]], tuple[list[str], str]]


def _not_a_dump(tmp: Path, _models: dict[str, Path]) -> tuple[list[str], str]:
    path = tmp / "books.xml"
    path.write_text('<?xml version="1.0"?>\n<!-- a catalog -->\n<catalog><book id="1"><title>T</title></book>'
                    "</catalog>\n")
    return (["parse", "--dump", str(path), "--output", str(tmp / "out")],
            f"error: {path} is not a MediaWiki XML export dump: its root element is <catalog>, not <mediawiki>")


def _not_xml(tmp: Path, _models: dict[str, Path]) -> tuple[list[str], str]:
    path = tmp / "notes.xml"
    path.write_text("just some notes, no markup\n")
    return (["parse", "--dump", str(path), "--output", str(tmp / "out")],
            f"error: {path} is not a MediaWiki XML export dump: it does not start with XML")


def _index_as_dump(tmp: Path, _models: dict[str, Path]) -> tuple[list[str], str]:
    return (["parse", "--dump", str(BUNDLED_INDEX), "--output", str(tmp / "out")],
            f"error: {BUNDLED_INDEX} is not a MediaWiki XML export dump: it is a multistream index "
            "('offset:page_id:title' lines): give it as --dump-index")


def _second_part_not_a_dump(tmp: Path, _models: dict[str, Path]) -> tuple[list[str], str]:
    path = tmp / "part2.xml"
    path.write_text("<html><body>a saved web page</body></html>")
    return (["parse", "--dump", str(BUNDLED_SAMPLE), str(path), "--output", str(tmp / "out")],
            f"error: {path} is not a MediaWiki XML export dump: its root element is <html>, not <mediawiki>")


def _index_command(tmp: Path, encoder: Path, kind: str) -> list[str]:
    (tmp / "corpus.tsv").write_text(CORPUS, encoding="utf-8")
    return ["index", "--output", str(tmp / "out"), "--encoder", str(encoder), "--encoder-type", kind,
            "--corpus", str(tmp / "corpus.tsv"), "--max-length", "32"]


def _no_cls_message(path: Path, kind: str) -> str:
    return (f"error: --encoder-type {kind} needs a BERT-style model ([CLS] title [SEP] text [SEP], the [CLS] vector): "
            f"the tokenizer of {path} (model type gpt2) has no [CLS] or [SEP]; try --encoder-type mean")


def _gpt2_as_dpr(tmp: Path, models: dict[str, Path]) -> tuple[list[str], str]:
    return _index_command(tmp, models["gpt2"], "dpr"), _no_cls_message(models["gpt2"], "dpr")


def _gpt2_as_bge(tmp: Path, models: dict[str, Path]) -> tuple[list[str], str]:
    return _index_command(tmp, models["gpt2"], "bge"), _no_cls_message(models["gpt2"], "bge")


def _tokenless(tmp: Path, models: dict[str, Path]) -> tuple[list[str], str]:
    return (_index_command(tmp, models["tokenless"], "mean"),
            f"error: the tokenizer of {models['tokenless']} yields no tokens for plain text ('Aaron is a prophet, "
            "high priest, and the elder brother of Moses.'): it cannot encode passages")


def _unknowing(command: str) -> Callable[[Path, dict[str, Path]], tuple[list[str], str]]:
    """A tokenizer that reads every word as [UNK]: every input was [UNK] throughout, without a word."""
    def case(tmp: Path, models: dict[str, Path]) -> tuple[list[str], str]:
        unknowing, use = models["unknowing"], "encode passages"
        argv = _index_command(tmp, unknowing, "mean")
        if command == "all":
            argv, use = ["all", "--dump", str(BUNDLED_SAMPLE), "--output", str(tmp / "out"), "--model", str(unknowing),
                         "--encoder", str(models["tiny"]), "--encoder-type", "mean"], "encode the mentions' contexts"
        return argv, (f"error: the tokenizer of {unknowing} reads plain text ('Aaron is a prophet, high priest, and "
                      "the elder brother of Moses.') as [UNK] alone (its vocabulary holds none of the words: were its "
                      f"vocabulary files left out?): it cannot {use}")
    return case


def _without_config(tmp: Path, models: dict[str, Path]) -> Path:
    """The tiny BERT's directory without its config.json (weights and tokenizer files still there)."""
    directory = Path(shutil.copytree(models["tiny"], tmp / "no-config"))
    (directory / "config.json").unlink()
    return directory


def _no_config_message(directory: Path) -> str:
    return (f"error: {directory / 'config.json'} does not exist: {directory} is not a model directory "
            "(save_pretrained writes config.json, the weights and the tokenizer files)")


def _encoder_without_config(tmp: Path, models: dict[str, Path]) -> tuple[list[str], str]:
    directory = _without_config(tmp, models)
    return _index_command(tmp, directory, "mean"), _no_config_message(directory)


def _encoder_without_tokenizer(tmp: Path, models: dict[str, Path]) -> tuple[list[str], str]:
    directory = tmp / "no-tokenizer"
    directory.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(models["tiny"] / name, directory / name)
    return (_index_command(tmp, directory, "mean"),
            f"error: {directory} has no tokenizer files (tokenizer.json, vocab.txt, ...): save the model's tokenizer "
            "there too (tokenizer.save_pretrained)")


def _truncated_weights(tmp: Path, models: dict[str, Path]) -> Path:
    """The tiny BERT's directory with its weights file cut to 1,000 bytes (a copy that ran out of disk)."""
    directory = Path(shutil.copytree(models["tiny"], tmp / "truncated-weights"))
    with open(directory / "model.safetensors", "r+b") as weights:
        weights.truncate(1000)
    return directory


def _encoder_with_truncated_weights(tmp: Path, models: dict[str, Path]) -> tuple[list[str], str]:
    directory = _truncated_weights(tmp, models)
    return (_index_command(tmp, directory, "mean"),
            f"error: cannot load a model from {directory}: Error while deserializing header: invalid header length")


def _encoder_whose_weights_do_not_fit_its_config(tmp: Path, models: dict[str, Path]) -> tuple[list[str], str]:
    """transformers 5 raises a RuntimeError for weights of other shapes: it was a traceback in the model process."""
    directory = Path(shutil.copytree(models["tiny"], tmp / "edited-config"))
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 7}))
    return (_index_command(tmp, directory, "mean"),
            f"error: cannot load a model from {directory}: the shapes of its weights differ from its config.json's "
            "(weights of another model, or an edited config)")


def _all_model_without_config(tmp: Path, models: dict[str, Path]) -> tuple[list[str], str]:
    directory = _without_config(tmp, models)
    return (["all", "--dump", str(BUNDLED_SAMPLE), "--output", str(tmp / "out"), "--model", str(directory),
             "--encoder", str(models["tiny"]), "--encoder-type", "mean"], _no_config_message(directory))


def _all_with_gpt2(tmp: Path, models: dict[str, Path]) -> tuple[list[str], str]:
    return (["all", "--dump", str(BUNDLED_SAMPLE), "--output", str(tmp / "out"), "--model", str(models["tiny"]),
             "--encoder", str(models["gpt2"])], _no_cls_message(models["gpt2"], "dpr"))


def _truncated_gzip_corpus(tmp: Path, _models: dict[str, Path]) -> tuple[list[str], str]:
    rows = "".join(f"{number}\tword {number} of the passage\tT{number}\n" for number in range(1, 3001))
    data = gzip.compress(("id\ttext\ttitle\n" + rows).encode())
    path = tmp / "corpus.tsv.gz"
    path.write_bytes(data[: len(data) // 2])
    complete_lines = zlib.decompressobj(wbits=31).decompress(data[: len(data) // 2]).count(b"\n")
    return (["index", "--output", str(tmp / "out"), "--encoder", str(_models["tiny"]), "--encoder-type", "mean",
             "--corpus", str(path), "--max-length", "32"],
            f"error: {path}: truncated or corrupt archive after line {complete_lines}: "
            "Compressed file ended before the end-of-stream marker was reached")


def _corrupt_corpus(name: str, content: bytes,
                    problem: str) -> Callable[[Path, dict[str, Path]], tuple[list[str], str]]:
    """A corpus whose archive breaks before its header's end: `all` checks the header before its first stage."""
    def case(tmp: Path, models: dict[str, Path]) -> tuple[list[str], str]:
        path = tmp / name
        path.write_bytes(content)
        return (["all", "--dump", str(BUNDLED_SAMPLE), "--output", str(tmp / "out"), "--model", str(models["tiny"]),
                 "--encoder", str(models["tiny"]), "--encoder-type", "mean", "--corpus", str(path)],
                f"error: {path}: truncated or corrupt archive before its header's end: {problem}")
    return case


def _empty_query(tmp: Path, _models: dict[str, Path]) -> tuple[list[str], str]:
    return (["search", "--output", str(tmp / "out"), "--query", "pears", "--query", ""],
            "error: --query is empty (nothing but spaces or invisible characters): give the text to search for")


def _blank_query(tmp: Path, _models: dict[str, Path]) -> tuple[list[str], str]:
    return (["search", "--output", str(tmp / "out"), "--query", " \t\u200b\ufeff\x01 "],
            "error: --query is empty (nothing but spaces or invisible characters): give the text to search for")


def _factory_message(factory: str, problem: str) -> str:
    return f"error: --index-factory {factory!r}: {problem}"


def _unknown_factory(tmp: Path, models: dict[str, Path]) -> tuple[list[str], str]:
    return ([*_index_command(tmp, models["tiny"], "mean"), "--index-factory", "Bogus"],
            _factory_message("Bogus", "not a FAISS factory string (could not parse index string Bogus)"))


def _factory_of_another_dimension(tmp: Path, models: dict[str, Path]) -> tuple[list[str], str]:
    """PQ7 cannot cut the tiny BERT's 32 dimensions into 7 parts."""
    return ([*_index_command(tmp, models["tiny"], "mean"), "--index-factory", "IVF4,PQ7"],
            _factory_message("IVF4,PQ7", "does not fit 32 dimensions (The dimension of the vector (d) should be a "
                                         "multiple of the number of subquantizers (M))"))


def _all_with_unknown_factory(tmp: Path, models: dict[str, Path]) -> tuple[list[str], str]:
    return (["all", "--dump", str(BUNDLED_SAMPLE), "--output", str(tmp / "out"), "--model", str(models["tiny"]),
             "--encoder", str(models["tiny"]), "--encoder-type", "mean", "--index-factory", "Bogus"],
            _factory_message("Bogus", "not a FAISS factory string (could not parse index string Bogus)"))


def _all_with_corpus_without_header(tmp: Path, models: dict[str, Path]) -> tuple[list[str], str]:
    corpus = tmp / "corpus.tsv"
    corpus.write_text(f"{NO_HEADER_LINE}\n", encoding="utf-8")
    return (["all", "--dump", str(BUNDLED_SAMPLE), "--output", str(tmp / "out"), "--model", str(models["tiny"]),
             "--encoder", str(models["tiny"]), "--encoder-type", "mean", "--corpus", str(corpus)],
            f"error: {corpus}: header {NO_HEADER_LINE!r} is not the DPR header "
            "'id<TAB>text<TAB>title'")


def _header_only_corpus(tmp: Path, models: dict[str, Path]) -> tuple[list[str], str]:
    argv = _index_command(tmp, models["tiny"], "mean")
    (tmp / "corpus.tsv").write_text("id\ttext\ttitle\n", encoding="utf-8")
    return argv, f"error: corpus {tmp / 'corpus.tsv'} has a header only: no passage to index"


def _questions(name: str, content: bytes | str) -> Callable[[Path, dict[str, Path]], tuple[list[str], str]]:
    """evaluate on a question file ``name`` holding ``content``; the message is the one for such a file."""

    def argv(tmp: Path, _models: dict[str, Path]) -> tuple[list[str], str]:
        path = tmp / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        return ["evaluate", "--output", str(tmp / "out"), "--questions", str(path)], QUESTION_MESSAGES[name](path)

    return argv


def _questions_directory(tmp: Path, _models: dict[str, Path]) -> tuple[list[str], str]:
    (tmp / "questions").mkdir()
    return (["evaluate", "--output", str(tmp / "out"), "--questions", str(tmp / "questions")],
            f"error: question file {tmp / 'questions'} is a directory: name the files in it (e.g. --questions "
            f"{tmp / 'questions'}/*.tsv)")


def _json_questions_directory(tmp: Path, _models: dict[str, Path]) -> tuple[list[str], str]:
    """A directory of EntityQuestions files: the example names them (it named *.tsv, which matched none)."""
    (tmp / "eq").mkdir()
    for name in ("P17.dev.json", "P19.dev.json", "README.txt"):
        (tmp / "eq" / name).write_text("[]")
    return (["evaluate", "--output", str(tmp / "out"), "--questions", str(tmp / "eq")],
            f"error: question file {tmp / 'eq'} is a directory: name the files in it (e.g. --questions "
            f"{tmp / 'eq'}/*.json)")


def _dpr_questions_directory(tmp: Path, _models: dict[str, Path]) -> tuple[list[str], str]:
    """A directory of DPR's qas files, named ``*.qa.csv``: the example names them (it named *.tsv)."""
    (tmp / "qas").mkdir()
    for name in ("nq-test.qa.csv", "trivia-test.qa.csv"):
        (tmp / "qas" / name).write_text("who?\t['x']\n")
    return (["evaluate", "--output", str(tmp / "out"), "--questions", str(tmp / "qas")],
            f"error: question file {tmp / 'qas'} is a directory: name the files in it (e.g. --questions "
            f"{tmp / 'qas'}/*.csv)")


def _compressed_questions_directory(tmp: Path, _models: dict[str, Path]) -> tuple[list[str], str]:
    """A directory of compressed EntityQuestions files, which evaluate reads: the example names them (it named *.tsv,
    which matched none)."""
    (tmp / "eq").mkdir()
    for name in ("P17.dev.json.bz2", "P19.dev.json.bz2"):
        (tmp / "eq" / name).write_bytes(bz2.compress(b"[]"))
    return (["evaluate", "--output", str(tmp / "out"), "--questions", str(tmp / "eq")],
            f"error: question file {tmp / 'eq'} is a directory: name the files in it (e.g. --questions "
            f"{tmp / 'eq'}/*.json.bz2)")


QUESTION_MESSAGES: dict[str, Callable[[Path], str]] = {
    "empty.tsv": lambda path: f"error: question file {path} is empty",
    "commas.csv": lambda path: f"error: question file {path}: no question in its 2 lines (expected {QAS_FORM})",
    "no-tabs.tsv": lambda path: f"error: question file {path}: no question in its 2 lines (expected {QAS_FORM})",
    "binary.tsv": lambda path: f"error: question file {path}: no question in its 2 lines (expected {QAS_FORM})",
    "wrong-keys.json": lambda path: f"error: question file {path}: no question in its 1 item (expected a JSON list "
                                    'of {"question": str, "answers": [str, ...]}, an answer that holds a word)',
}
QUESTION_FILES = {
    "empty.tsv": "",
    "commas.csv": "who wrote Hamlet,\"['Shakespeare']\"\nwho led the people,\"['Moses']\"\n",
    "no-tabs.tsv": "who wrote Hamlet\nwho led the people\n",
    "binary.tsv": b"\x00\x01\xff\xfe\x89PNG\n\x1a\x00\x02\x03\n",
    "wrong-keys.json": '[{"q": "who led the people", "a": ["Moses"]}]',
}


CASES = [Case("xml-that-is-not-a-dump", _not_a_dump), Case("text-that-is-not-xml", _not_xml),
         Case("second-dump-not-a-dump", _second_part_not_a_dump), Case("index-as-dump", _index_as_dump),
         Case("gpt2-as-dpr", _gpt2_as_dpr),
         Case("gpt2-as-bge", _gpt2_as_bge), Case("tokenizer-without-tokens", _tokenless),
         Case("tokenizer-of-unknown-words", _unknowing("index")),
         Case("all-preflight-tokenizer-of-unknown-words", _unknowing("all")),
         Case("all-preflight-gpt2-as-dpr", _all_with_gpt2), Case("truncated-gzip-corpus", _truncated_gzip_corpus),
         Case("no-gzip-corpus", _corrupt_corpus("corpus.tsv.gz", b"id\ttext\ttitle\n", "Not a gzipped file (b'id')")),
         Case("no-bz2-corpus", _corrupt_corpus("corpus.tsv.bz2", b"id\ttext\ttitle\n", "Invalid data stream")),
         Case("cut-bz2-corpus", _corrupt_corpus("corpus.tsv.bz2", bz2.compress(b"id\ttext\ttitle\n")[:30],
                                                "Compressed file ended before the end-of-stream marker was reached")),
         Case("empty-query", _empty_query),
         Case("blank-query", _blank_query),
         # issue 21
         Case("unknown-index-factory", _unknown_factory),
         Case("index-factory-of-another-dimension", _factory_of_another_dimension),
         Case("all-preflight-unknown-index-factory", _all_with_unknown_factory),
         Case("all-preflight-corpus-without-header", _all_with_corpus_without_header),
         Case("header-only-corpus", _header_only_corpus),
         # issue 28
         Case("encoder-without-config-json", _encoder_without_config),
         Case("encoder-without-tokenizer-files", _encoder_without_tokenizer),
         Case("encoder-with-truncated-weights", _encoder_with_truncated_weights),
         Case("encoder-whose-weights-do-not-fit-its-config", _encoder_whose_weights_do_not_fit_its_config),
         Case("all-preflight-model-without-config-json", _all_model_without_config),
         *(Case(f"questions-{name}", _questions(name, content)) for name, content in QUESTION_FILES.items()),
         Case("questions-directory", _questions_directory),
         Case("json-questions-directory", _json_questions_directory),
         Case("dpr-questions-directory", _dpr_questions_directory),
         Case("compressed-questions-directory", _compressed_questions_directory)]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_bad_input_is_one_line_and_exit_2_before_any_work(case: Case, tmp_path: Path, bad_encoders, tiny_bert,
                                                          capsys: pytest.CaptureFixture[str],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    argv, expected = case.argv(tmp_path, {**bad_encoders, "tiny": tiny_bert})
    (tmp_path / "out").mkdir(exist_ok=True)  # an OUT nothing has run in (one that is not there is refused first)
    assert main([*argv, *DIRECT]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == expected
    assert "Traceback" not in "\n".join(err)
    # what the command line's log filters let through to stderr (they filter pytest's handlers too): a worker's
    # traceback of the model's pipeline, stopped by the inputs' failure, came before the corpus's one line
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []
    assert not (tmp_path / "out" / "manifest.json").exists()  # refused before any stage ran


def test_search_on_a_damaged_shard_names_it_and_suggests_validate(damaged_index: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "--output", str(damaged_index), "--query", "pears"]) == 2
    shard = damaged_index / "index" / "shard-00000.faiss"
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: index shard shard-00000 ({shard}) is damaged: Index type 0x58585858 (\"XXXX\") not recognized; "
        f"check the run with `python run_pipeline.py validate --output {damaged_index}`"]


def test_search_on_a_cut_short_shard_names_it_and_the_command_to_rebuild(damaged_index: Path, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A shard whose size differs from the manifest's is caught before FAISS reads it."""
    output = tmp_path / "out"
    shutil.copytree(damaged_index, output)
    shard = output / "index" / "shard-00000.faiss"
    recorded = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[: recorded // 2])
    assert main(["search", "--output", str(output), "--query", "pears"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: the index under {output} changed after it was recorded (index/shard-00000.faiss: "
        f"{recorded // 2} bytes, manifest says {recorded}): rerun `python run_pipeline.py index --output {output} "
        "... --force`"]


def test_multistream_without_its_index_is_read_with_one_warning(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    dump = tmp_path / "enwiki-copy-pages-articles-multistream.xml.bz2"
    shutil.copy(BUNDLED_SAMPLE, dump)
    assert main(["parse", "--dump", str(dump), "--output", str(tmp_path / "out"), *DIRECT]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: {dump}: multistream dump without its index beside it: read as one stream by "
                        "one worker (no parallel read); name the index with --dump-index FILE"]
    record = manifest.load(str(tmp_path / "out"))["parse"]
    assert (record.counters["files_read"], record.counters["pages_read"]) == (1, 206)


def test_multistream_is_told_by_its_name_or_by_its_streams(tmp_path: Path, single_stream_sample: Path) -> None:
    renamed = tmp_path / "dump.xml.bz2"
    shutil.copy(BUNDLED_SAMPLE, renamed)
    assert has_several_bz2_streams(str(renamed)) and looks_multistream(str(renamed))
    assert not has_several_bz2_streams(str(single_stream_sample))
    assert not looks_multistream(str(single_stream_sample))
    xml = bz2.decompress(BUNDLED_SAMPLE.read_bytes())  # cut in streams anywhere (pbzip2): no multistream dump
    cut_anywhere = tmp_path / "parallel.xml.bz2"
    cut_anywhere.write_bytes(b"".join(bz2.compress(xml[start:start + 100_000])
                                      for start in range(0, len(xml), 100_000)))
    assert not looks_multistream(str(cut_anywhere))
    named = tmp_path / "x-multistream.xml.bz2"
    shutil.copy(single_stream_sample, named)
    assert looks_multistream(str(named)) and not looks_multistream(str(tmp_path / "x.xml"))


def test_an_export_without_articles_is_one_line_and_leaves_no_temp_dirs(tmp_path: Path, system_temp: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A MediaWiki export whose pages are all outside ns 0 or redirects parses to 0 articles: one line saying what
    it held, exit 2, nothing committed (the next stage would have nothing to read); and the Beam run leaves nothing
    (no beam-temp*) in the system temp directory."""
    dump = tmp_path / "talk-only.xml"
    redirect = ('<page><title>Pyrus</title><ns>0</ns><id>8</id><redirect title="Pear" /><revision><id>80</id>'
                '<text xml:space="preserve">#REDIRECT [[Pear]]</text></revision></page></mediawiki>')
    dump.write_text(TALK_ONLY_DUMP.replace("</mediawiki>", redirect), encoding="utf-8")
    assert main(["parse", "--dump", str(dump), "--output", str(tmp_path / "out"), *DIRECT]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "[parse] running", f"error: no article in {dump}: 2 pages read, none an article (redirects: 1, outside the "
                           "article namespace: 1); give a dump with articles (namespace 0)"]
    assert not (tmp_path / "out" / "manifest.json").exists() and not (tmp_path / "out" / "articles").exists()
    assert sorted(path.name for path in system_temp.iterdir()) == []


def test_a_beam_run_and_its_worker_processes_get_a_private_temp_dir_removed_afterwards(system_temp: Path) -> None:
    """What Beam's worker processes leave in their temp directory (lock files, torch's caches) goes with the
    run's private one."""
    worker = [sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"]
    with private_tempdir() as root:
        started = subprocess.run(worker, capture_output=True, text=True, check=True).stdout.strip()
        assert tempfile.gettempdir() == started == root and Path(root).parent == system_temp
        (Path(root) / "left-by-a-worker.lock").touch()
    assert os.listdir(system_temp) == []
    assert os.environ["TMPDIR"] == tempfile.gettempdir() == str(system_temp)


def test_the_temp_dirs_of_commands_killed_outright_are_removed_by_the_next(system_temp: Path) -> None:
    """SIGKILL leaves a command's private temp dir (nothing runs its cleanup): the next command removes those whose
    pid runs no process, and leaves a live command's."""
    finished = subprocess.Popen(["true"])
    finished.wait()
    host = socket.gethostname()
    dead = system_temp / f"kpr-run-{finished.pid}@{host}-abc"
    live = system_temp / f"kpr-run-{os.getppid()}@{host}-def"
    elsewhere = system_temp / f"kpr-run-{finished.pid}@another-host-ghi"  # a temp dir shared with another host
    for directory in (dead, live, elsewhere):
        directory.mkdir()
        (directory / "left.lock").touch()
    with private_tempdir() as root:
        assert Path(root).name.startswith(f"kpr-run-{os.getpid()}@{host}-")
        assert not dead.exists() and live.exists() and elsewhere.exists()
    assert sorted(os.listdir(system_temp)) == sorted([live.name, elsewhere.name])


def test_a_bad_index_factory_is_refused_before_any_passage_is_encoded(tmp_path: Path, tiny_bert: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*_index_command(tmp_path, tiny_bert, "mean"), "--index-factory", "PQ7", *DIRECT]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: --index-factory 'PQ7': does not fit")
    output = tmp_path / "out"
    assert [path for path in output.rglob("*") if path.is_file()] == []  # nothing encoded, nothing staged


def test_a_corpus_of_bad_rows_names_where_its_dead_letters_are(tmp_path: Path, tiny_bert: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The stage did not commit: its dead letters are still staged, and the message says so."""
    argv = _index_command(tmp_path, tiny_bert, "mean")
    (tmp_path / "corpus.tsv").write_text("id\ttext\ttitle\nx\tAaron\tAaron\n2\tMoses\n", encoding="utf-8")
    assert main([*argv, *DIRECT]) == 2
    staged = tmp_path / "out" / ".staging" / "index" / "errors" / "index"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: no passage of {tmp_path / 'corpus.tsv'} could be indexed: 2 dead-lettered, see {staged}")
    letters = [json.loads(line) for path in staged.iterdir() for line in path.read_text().splitlines()]
    assert sorted((letter["kind"], letter["line_number"]) for letter in letters) == [("bad_ids", 2),
                                                                                     ("wrong_column_count", 3)]
    assert not (tmp_path / "out" / "errors").exists()


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_search_refuses_a_shard_whose_content_changed(small_index: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Same size, one byte changed inside: FAISS would read it and answer; the sha256 tells."""
    output = Path(shutil.copytree(small_index, tmp_path / "out"))
    flip_a_byte(output / SHARD)
    assert main(["search", "--output", str(output), "--query", "pears"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: the index under {output} changed after it was recorded ({SHARD}: its sha256 differs from the "
        f"manifest's): rerun `python run_pipeline.py index --output {output} ... --force`"]


def test_a_verified_shard_is_not_hashed_again_until_it_changes(small_index: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "verified.json"))
    output = Path(shutil.copytree(small_index, tmp_path / "out"))
    hashed: list[str] = []
    real_sha256 = fs.sha256

    def recorded(path: str) -> str:
        """The index's files hashed (OUT's small manifest is hashed by every search: did it change meanwhile?)"""
        if not path.endswith("manifest.json"):
            hashed.append(path)
        return real_sha256(path)

    monkeypatch.setattr(fs, "sha256", recorded)
    search = ["search", "--output", str(output), "--query", "Moses", "-k", "1"]
    assert main(search) == 0 and main(search) == 0
    assert hashed == [str(output / SHARD)]  # the second search trusts the first one's check
    shard = output / SHARD
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))  # touched: checked again
    assert main(search) == 0
    assert hashed == [str(output / SHARD)] * 2
    flip_a_byte(shard)
    assert main(search) == 2
    assert "index/shard-00000.faiss: its sha256 differs" in capsys.readouterr().err


def test_verify_catches_a_changed_byte_that_kept_size_and_modification_time(small_index: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """What the default trusts (a shard hashed once, while its size and modification time stay) and what --verify
    adds: every file search reads is hashed again, the passages too."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "verified.json"))
    output = Path(shutil.copytree(small_index, tmp_path / "out"))
    search = ["search", "--output", str(output), "--query", "Moses", "-k", "1"]
    assert main(search) == 0
    stored = next((output / "index" / "embeddings").rglob("*.parquet")).relative_to(output)
    for relative in (SHARD, str(stored)):
        changed = output / relative
        stamp = changed.stat()
        flip_a_byte(changed)
        os.utime(changed, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
        capsys.readouterr()
        if relative == SHARD:
            assert main(search) == 0, "the default trusts the remembered check"
        for command in (search, ["evaluate", "--output", str(output), "--questions", str(tmp_path / "q.tsv")]):
            (tmp_path / "q.tsv").write_text("who was Moses\t['Moses']\n", encoding="utf-8")
            capsys.readouterr()
            assert main([*command, "--verify"]) == 2
            assert capsys.readouterr().err.splitlines() == [
                f"error: the index under {output} changed after it was recorded ({relative}: its sha256 differs "
                f"from the manifest's): rerun `python run_pipeline.py index --output {output} ... --force`"]
        flip_a_byte(changed)  # back as it was
        os.utime(changed, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert main([*search, "--verify"]) == 0


SIZE = r"\d+(\.\d)? [KMGT]?B"
NO_ROOM = {  # what the stage did, what it needs
    errno.ENOSPC: ("ran out of disk space", rf"more than the {SIZE} that were free when it started"),
    errno.EDQUOT: ("ran out of this user's disk quota", "more room than it was given"),
    errno.EFBIG: (r"wrote a file past the size limit \(ulimit -f, or the filesystem's largest file\)",
                  "more room than it was given")}


@pytest.mark.parametrize("code", NO_ROOM)
def test_a_full_disk_is_one_line_leaves_no_staged_files_and_a_rerun_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], code: int) -> None:
    """The dictionary stage's Parquet writes fail as on a full filesystem (ENOSPC), a user's quota used up (EDQUOT)
    or past ``ulimit -f`` (EFBIG): one line, exit 2, nothing staged left; parse's committed outputs stay and the
    rerun with space runs only the dictionary. EDQUOT and EFBIG were ~300 lines of tracebacks and exit 1."""
    output = tmp_path / "out"
    parse = ["parse", "--dump", str(BUNDLED_SAMPLE), "--output", str(output), *DIRECT]
    dictionary = ["dictionary", "--output", str(output), "--include-red-links", *DIRECT]
    assert main(parse) == 0

    def full(*_args, **_kwargs) -> None:
        raise OSError(code, os.strerror(code))

    with monkeypatch.context() as patch:
        patch.setattr(pq.ParquetWriter, "write_table", full)
        assert main(dictionary) == 2
    err = capsys.readouterr().err.strip().splitlines()
    did, needs = NO_ROOM[code]
    assert re.fullmatch(
        rf"error: dictionary {did} on {re.escape(mount_point(str(output)))} \(the filesystem of "
        rf"{re.escape(str(output))}\) after writing {SIZE}; it needs {needs}\. Its staged files were removed: free "
        r"some space \(or give another --output\) and rerun the same "
        r"command to resume", err[-1]), err[-1]
    assert "Traceback" not in "\n".join(err)
    assert not (output / ".staging" / "dictionary").exists()
    assert sorted(manifest.load(str(output))) == ["parse"]
    assert main(dictionary) == 0
    assert sorted(manifest.load(str(output))) == ["dictionary", "parse"]


def test_out_of_space_is_told_by_errno_or_by_beams_rewording() -> None:
    assert out_of_space(OSError(errno.ENOSPC, "No space left on device"))
    reworded = OSError("[Errno 28] No space left on device [while running 'WriteArticles/Write/WriteImpl']")
    assert out_of_space(reworded) and not out_of_space(RuntimeError("step failed"))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as error:
            raise RuntimeError("a step failed") from error
    except RuntimeError as wrapped:
        assert out_of_space(wrapped)
    assert not out_of_space(OSError(errno.EACCES, "Permission denied"))
    assert out_of_space(OSError(errno.EDQUOT, "Disk quota exceeded")) == errno.EDQUOT
    assert out_of_space(RuntimeError("OSError: [Errno 27] File too large [while running 'Write']")) == errno.EFBIG


def test_a_gpu_out_of_memory_is_one_line_naming_what_to_lower(
        tmp_path: Path, full_run: Path, tiny_bert: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """torch's OutOfMemoryError from a forward pass (as CUDA raises it; here a CPU run made to raise it): one line,
    exit 2, no traceback; nothing recorded for the stage, and the rerun runs."""
    import torch

    from encoders.mask_encoder import MaskEncoder

    output = tmp_path / "out"
    copy_stages(full_run, output, ("parse", "dictionary", "mentions"))
    # windows of 16 tokens, not full_run's 64: the rerun embeds every mention, in half the time
    command = ["embed-entities", "--output", str(output), "--model", str(tiny_bert), "--max-seq-length", "16", *DIRECT]

    def out_of_memory(*_args, **_kwargs) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)")

    with monkeypatch.context() as patch:
        patch.setattr(MaskEncoder, "_forward_host", out_of_memory)
        assert main(command) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("error: embed-entities: the GPU ran out of memory: lower --batch-tokens, or start fewer worker "
                       "processes on each GPU (each loads its own model and holds its own batches)")
    assert "Traceback" not in "\n".join(err)
    assert sorted(manifest.load(str(output))) == ["dictionary", "mentions", "parse"]
    assert main(command) == 0

# --- too little free space, known before writing ------------------------------------------------------------

SMALL = disk_space.Space("/mnt/small", 64 << 10)
SIZE = r"\d+(\.\d)? [KMGT]?B"


@pytest.fixture()
def small_filesystem(monkeypatch: pytest.MonkeyPatch) -> disk_space.Space:
    """Every destination on a filesystem with 64 KB free, as the commands ask for it (``disk_space.space_of``)."""
    monkeypatch.setattr(disk_space, "space_of", lambda path: SMALL)
    return SMALL


def no_room_line(command: str, destination: Path, flag: str, purpose: str, need: str = SIZE) -> str:
    return (rf"error: {command} needs about {need} on /mnt/small \(the filesystem of {re.escape(str(destination))}\) "
            rf"{purpose}, and 64\.0 KB is free: free some space \(or give another {flag}\) and rerun the same command")


def test_an_index_that_will_not_fit_is_refused_before_it_is_built(
        full_run: Path, tiny_bert: Path, tmp_path: Path, small_filesystem: disk_space.Space,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Once the passages are encoded and counted (the index's size is printed), before the build."""
    output = tmp_path / "out"
    output.mkdir()
    copy_stages(full_run, output, ("parse", "dictionary", "mentions", "embed_entities"))
    assert main(stage_command("index", output, tiny_bert)) == 2
    err = capsys.readouterr().err.splitlines()
    planned = re.fullmatch(r"\[index\] 4,606 passages x 32 dims, 2 shard\(s\): Flat, about (.+) for the index \(.*",
                           err[-2])
    assert planned, err
    purpose = rf"to build the index \({re.escape(planned.group(1))} of index files, {SIZE} of shard vectors\)"
    assert re.fullmatch(no_room_line("index", output, "--output", purpose), err[-1]), err[-1]
    assert sorted(manifest.load(str(output))) == ["dictionary", "embed_entities", "mentions", "parse"]
    staged = output / ".staging" / "index"
    assert [path.name for path in staged.rglob("*.faiss")] == [], "nothing was built"
    assert not (staged / "index").exists() and not (output / "index").exists()


@pytest.mark.parametrize(("command", "purpose"), [("publish", "to copy the run"),
                                                  ("export-kpr", "to write the export")])
def test_a_publish_or_export_that_will_not_fit_is_refused_before_writing(
        command: str, purpose: str, full_run: Path, tmp_path: Path, small_filesystem: disk_space.Space,
        capsys: pytest.CaptureFixture[str]) -> None:
    destination = tmp_path / "to"
    assert main([command, "--output", str(full_run), "--to", str(destination)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert re.fullmatch(no_room_line(command, destination, "--to", purpose), err[-1]), err[-1]
    assert list(destination.rglob("*")) == []


def test_publish_needs_room_for_the_files_it_copies_less_those_it_replaces(full_run: Path, tmp_path: Path) -> None:
    destination = str(tmp_path / "published")
    recorded = sum(item.bytes for record in manifest.load(str(full_run)).values() for item in record.outputs
                   if not manifest.is_kept_work(item.path))  # mention_vectors/ is not published unless asked
    with pytest.raises(NoRoomError) as refused:
        publish_run(str(full_run), destination, free_bytes=recorded - 1)
    assert (refused.value.need, refused.value.free) == (recorded, recorded - 1)
    assert not os.path.exists(destination)
    publish_run(str(full_run), destination, free_bytes=recorded)
    publish_run(str(full_run), destination, free_bytes=0)  # again: every file replaces its earlier copy


def test_an_export_needs_about_what_it_writes_and_its_scratch(full_run: Path, tmp_path: Path) -> None:
    directory = tmp_path / "kpr"
    linker_files = manifest.recorded_files(str(full_run), layout.LINKER, suffix="")
    need = export_bytes(str(full_run), entity_keys(str(full_run)), linker_files)
    export_kpr(str(full_run), str(directory), free_bytes=need)
    written = sum(path.stat().st_size for path in directory.rglob("*") if path.is_file() and
                  path.name != ".kpr-export.json")
    scratch = scratch_bytes(np.load(directory / "entity_embeddings.npy", mmap_mode="r").size)
    assert written + scratch <= need <= written + scratch + TORCH_SAVE_BYTES


def test_free_space_is_not_checked_where_it_is_not_known() -> None:
    """A bucket's free space is not known: nothing is refused, and the need is not even computed."""
    def need() -> int:
        raise AssertionError("the need was computed")

    refuse_without_room("gs://bucket/kpr", None, need)
    remote = disk_space.space_of("gs://bucket/out")
    assert remote == disk_space.Space("gs://bucket", None)
    disk_space.require_room("index", "gs://bucket/out", "--output", 1 << 60, "to build the index", remote)


def test_a_disk_that_other_writers_filled_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The disk filled by another job on it while the stage wrote next to nothing: the line said the stage needs
    more than all that was free when it started (36 MB, for a stage that writes well under one)."""
    output = tmp_path / "out"
    assert main(["parse", "--dump", str(BUNDLED_SAMPLE), "--output", str(output), *DIRECT]) == 0
    free = iter([36_000_000, 0])  # when the stage starts; when it meets the full disk
    real = disk_space.space_of
    monkeypatch.setattr(disk_space, "space_of", lambda path: replace(real(path), free=next(free)))

    def full(*_args, **_kwargs) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    assert main(["dictionary", "--output", str(output), *DIRECT]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    said = re.search(rf"after writing ({SIZE}); other writers took ({SIZE}) of the 34\.3 MB that were free when "
                     r"it started\. Its staged files were removed", line)
    assert said is not None, line


def test_kept_work_from_before_the_stage_started_is_not_what_it_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Kept work an earlier run left (2 MB) counted as written by this one, which hid the 2.9 MB other writers took."""
    staging, kept = tmp_path / "out" / ".staging" / "index", tmp_path / "out" / ".staging" / "index.kept"
    staging.mkdir(parents=True)
    kept.mkdir()
    (staging / "part").write_bytes(b"x" * 1000)
    (kept / "earlier").write_bytes(b"x" * 2_000_000)
    monkeypatch.setattr(disk_space, "space_of", lambda path: disk_space.Space("/", 0))
    error = disk_space.disk_full_error("index", str(tmp_path / "out"), str(staging), str(kept),
                                       disk_space.Space("/", 3_001_000), kept_at_start=2_000_000)
    assert "after writing 1000 B; other writers took 2.9 MB of the 2.9 MB that were free when it started" in \
        error.message, error.message
    assert not staging.exists() and (kept / "earlier").exists()
