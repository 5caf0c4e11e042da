"""encoders/context_tokens.py and mask_inputs' split rule: tokenizing only the characters a [MASK] input needs
keeps exactly the tokens that tokenizing whole sides keeps, for WordPiece, byte-level BPE and SentencePiece-style
tokenizers, on real pages of the bundled sample and on text built to break a careless cut; and the inputs that
embed-entities' CPU part writes for the model are exactly those."""

from __future__ import annotations

import itertools
from functools import partial

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from artifacts import tables
from encoders import models as encoder_models
from encoders.context_tokens import Side, context_sides, enough, shared_token_ids, tokenized_sides
from encoders.mask_inputs import MASK_WINDOWS, context_split, mask_inputs, masked_ids, special_ids, tokens_needed
from encoders.models import SavedTokenizer, model_token_ids, plain_token_ids, read_tokenizer, save_tokenizer
from tests.builders import run_counting
from tests.conftest import BUNDLED_SAMPLE
from transforms.common.dead_letters import DEAD_LETTER_TAG
from transforms.common.follow import FollowedFiles
from transforms.common.mention_sampling import context_window
from transforms.embed_entities.inputs import (
    INPUT_FILE_ROWS,
    INPUT_PREFIX,
    BuildMentionInputs,
    PrepareMentionInputs,
    table_inputs,
)
from transforms.embed_entities.window_store import model_salt
from transforms.parse.dump_reader import RawPage, iter_pages, read_siteinfo
from transforms.parse.wikitext import wikitext_to_text

LENGTHS = (512, 128, 24, 6)  # --max-seq-length: the budget is 3 less
CHARS_PER_TOKEN = 6  # the window the mentions stage cuts (transforms.common.mention_sampling.CHARS_PER_TOKEN)


@pytest.mark.parametrize("window", MASK_WINDOWS)
def test_the_split_rule_decides_exactly_whatever_the_unknown_rest(window):
    """Every budget up to 10, every true length of both sides, every partial count: when ``enough`` accepts the
    partial counts, ``context_split`` on them equals ``context_split`` on the true lengths."""
    for budget in range(1, 11):
        needed = partial(tokens_needed, budget)
        for left, right in itertools.product(range(budget + 3), repeat=2):
            expected = context_split(left, right, budget, window)
            for seen_left, seen_right in itertools.product(range(left + 1), range(right + 1)):
                sides = Side([0] * seen_left, seen_left == left), Side([0] * seen_right, seen_right == right)
                if enough(sides[0], sides[1], needed) and enough(sides[1], sides[0], needed):
                    assert context_split(seen_left, seen_right, budget, window) == expected, (budget, left, right)


def test_the_split_rule_asks_no_more_than_it_must():
    """One token fewer than ``tokens_needed`` can change the split (reference window), for every budget and
    every length of a whole other side: the rule is tight, so slices stay short."""
    for budget in range(2, 12):
        for other in (None, *range(budget + 2)):
            need = tokens_needed(budget, other)
            changed = [context_split(need - 1, other if other is not None else more, budget)
                       != context_split(true, other if other is not None else more, budget)
                       for true in range(need, budget + 2) for more in range(budget // 2, budget + 2)]
            assert any(changed), (budget, other)


def article_texts(count: int) -> list[tuple[str, list[tuple[int, int]]]]:
    """(text, link spans) of the first ``count`` articles of the bundled sample with at least 20 links."""
    siteinfo = read_siteinfo(str(BUNDLED_SAMPLE))
    found = []
    for page in iter_pages(str(BUNDLED_SAMPLE), siteinfo):
        if isinstance(page, RawPage) and page.namespace == 0 and not page.text.lower().startswith("#redirect"):
            parsed = wikitext_to_text(page.text, page.title, siteinfo.namespaces)
            if len(parsed.links) >= 20:
                found.append((parsed.text, [(link.start, link.end - link.trail) for link in parsed.links]))
        if len(found) == count:
            return found
    raise AssertionError("the bundled sample has too few linked articles")


@pytest.fixture(scope="module")
def real_mentions() -> dict[int, list[dict]]:
    """Mention rows of the sample (every 3rd link of 8 articles) with the windows embed-entities cuts, per
    --max-seq-length."""
    rows = {length: [] for length in LENGTHS}
    for text, spans in article_texts(8):
        for start, end in spans[::3]:
            for length in LENGTHS:
                window, begin, finish = context_window(text, start, end, length * CHARS_PER_TOKEN)
                rows[length].append({"entity_id": len(rows[length]), "text": window, "start": begin,
                                     "end": finish})
    return rows


def whole_side_inputs(rows: list[dict], tokenizer, max_seq_length: int, window: str) -> list[tuple[list, int]]:
    """What [MASK] inputs are by definition: both whole sides tokenized, then cut by masked_ids."""
    ids = special_ids(tokenizer)
    result = []
    for row in rows:
        left = tokenizer(row["text"][:row["start"]].rstrip(), add_special_tokens=False)["input_ids"]
        right = tokenizer(row["text"][row["end"]:], add_special_tokens=False)["input_ids"]
        result.append(masked_ids(left, right, ids, max_seq_length, window))
    return result


class RecordingTokenizer:
    """A tokenizer that records how many characters it was given, itself or through its fast backend."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.characters = 0

    def __call__(self, texts, *pairs, **kwargs):
        self.characters += sum(len(text) for text in texts)
        return self._tokenizer(texts, *pairs, **kwargs)

    @property
    def backend_tokenizer(self):
        return RecordingBackend(self._tokenizer.backend_tokenizer, self)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


class RecordingBackend:
    """A fast tokenizer's backend whose ``encode_batch_fast`` (the only batch call the encoders make) adds its
    texts' characters to ``recording``."""

    def __init__(self, backend, recording: RecordingTokenizer) -> None:
        self._backend = backend
        self._recording = recording

    def encode_batch_fast(self, texts, **kwargs):
        self._recording.characters += sum(len(text) for text in texts)
        return self._backend.encode_batch_fast(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self._backend, name)


def assert_as_whole_sides(rows: list[dict], tokenizer, length: int, window: str = "reference") -> float:
    """mask_inputs equals tokenizing whole sides; returns the share of the sides' characters it tokenized."""
    recording = RecordingTokenizer(tokenizer)
    got = [(list(item.input_ids), item.mask_position) for item in mask_inputs(rows, recording, length, window)]
    assert got == whole_side_inputs(rows, tokenizer, length, window)
    whole = sum(len(row["text"][:row["start"]].rstrip()) + len(row["text"]) - row["end"] for row in rows)
    return recording.characters / whole


@pytest.mark.parametrize("window", MASK_WINDOWS)
def test_wordpiece_inputs_equal_whole_sides_at_a_fraction_of_the_characters(real_mentions, minilm_path, window):
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    shares = {length: assert_as_whole_sides(real_mentions[length], tokenizer, length, window) for length in LENGTHS}
    assert len(real_mentions[512]) > 100
    # About half of a window is what the budget needs (0.53 at both lengths when every side is tokenized apart);
    # at 512 tokens the sides of nearby mentions share most sentences, each tokenized once (0.18).
    assert shares[512] < 0.3 and shares[128] < 0.65, shares


class WithoutOffsets(RecordingTokenizer):
    """A tokenizer without character offsets (a slow, pure-Python one)."""

    is_fast = False


def test_a_tokenizer_without_offsets_tokenizes_whole_sides(real_mentions, minilm_path):
    slow = WithoutOffsets(AutoTokenizer.from_pretrained(minilm_path))
    assert assert_as_whole_sides(real_mentions[128][:40], slow, 128) == pytest.approx(1.0)


def trained(model, trainer, pre_tokenizer, decoder, texts: list[str]) -> PreTrainedTokenizerFast:
    backend = Tokenizer(model)
    backend.normalizer = normalizers.NFKC()
    backend.pre_tokenizer = pre_tokenizer
    backend.decoder = decoder
    backend.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, cls_token="<s>", sep_token="</s>",
                                   mask_token="<mask>", pad_token="<pad>", unk_token="<unk>")


@pytest.fixture(scope="module")
def other_tokenizers() -> dict[str, PreTrainedTokenizerFast]:
    """A byte-level BPE (RoBERTa-style, a space belongs to the next word's token) and a Unigram with Metaspace
    (SentencePiece-style), both trained here on the sample's text."""
    texts = [text for text, _ in article_texts(8)]
    specials = ["<s>", "</s>", "<mask>", "<pad>", "<unk>"]
    return {
        "byte-level BPE": trained(models.BPE(), trainers.BpeTrainer(vocab_size=800, special_tokens=specials),
                                  pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel(), texts),
        "unigram": trained(models.Unigram(), trainers.UnigramTrainer(vocab_size=800, special_tokens=specials,
                                                                     unk_token="<unk>"),
                           pre_tokenizers.Metaspace(), decoders.Metaspace(), texts),
    }


@pytest.mark.parametrize("kind", ["byte-level BPE", "unigram"])
def test_other_tokenizer_families_equal_whole_sides(real_mentions, other_tokenizers, kind):
    for length in (512, 24):
        assert assert_as_whole_sides(real_mentions[length][:120], other_tokenizers[kind], length) < 0.75


def test_text_made_to_break_a_careless_cut(minilm_path, other_tokenizers):
    """Control characters that Python calls whitespace but tokenizers delete (a word made of two), no whitespace
    at all, double spaces and tabs, accents, CJK: still equal to whole sides."""
    words = ["alpha\x1fbeta", "éclair", "東京都", "x" * 40, "gamma  delta", "tab\tbed", "new\nline", "42,000",
             "end.", "U.S.", "stop. \tthen", "dots...", "。"]
    texts = [" ".join(words[(index + shift) % len(words)] for index in range(300)) for shift in range(4)]
    texts += ["alpha\x1fbeta " * 600, "y" * 5000]
    rows = [{"entity_id": index, "text": text, "start": len(text) // 2 + shift, "end": len(text) // 2 + shift + 3}
            for index, text in enumerate(texts) for shift in range(12)]  # slices cut at every offset of a word
    for tokenizer in (AutoTokenizer.from_pretrained(minilm_path), *other_tokenizers.values()):
        for length in (512, 24):
            assert_as_whole_sides(rows, tokenizer, length)


def test_sentences_shared_by_texts_are_tokenized_once_and_give_each_texts_own_tokens(minilm_path, other_tokenizers):
    """shared_token_ids equals tokenizing each text apart, for every family, wherever the texts start and end
    (through sentence breaks, double spaces, tabs, a full stop ending a text), and reads each shared sentence once."""
    sentences = ["Paris is the capital of France.", "It lies on the Seine.  Its mayor, e.g. Anne, is elected.",
                 "U.S. troops\tarrived. \tThen 東京都 éclair.", "alpha\x1fbeta... gamma."]
    article = " ".join(sentences * 6)
    texts = [article[start:start + width] for start in range(0, 300, 7) for width in (40, 120, 400)]
    for tokenizer in (AutoTokenizer.from_pretrained(minilm_path), *other_tokenizers.values()):
        recording = RecordingTokenizer(tokenizer)
        assert shared_token_ids(recording, texts) == plain_token_ids(tokenizer, texts)
        assert recording.characters < sum(len(text) for text in texts) / 3


def test_a_slice_keeps_a_suffix_or_prefix_of_the_whole_sides_tokens(minilm_path, other_tokenizers):
    """The invariant itself: a left slice's kept tokens end the whole left side's tokens, a right slice's begin
    the whole right side's, wherever the slice cuts (every offset through the tricky words)."""
    text = " ".join(["alpha\x1fbeta", "éclair", "東京都", "gamma  delta", "tab\tbed", "42,000"] * 20)
    for tokenizer in (AutoTokenizer.from_pretrained(minilm_path), *other_tokenizers.values()):
        whole = tokenizer(text, add_special_tokens=False)["input_ids"]
        limits = list(range(20, 140))
        lefts = tokenized_sides(tokenizer, [text] * len(limits), limits, [True] * len(limits))
        rights = tokenized_sides(tokenizer, [text] * len(limits), limits, [False] * len(limits))
        for left, right in zip(lefts, rights, strict=True):
            assert not left.whole and whole[len(whole) - len(left.ids):] == left.ids and left.ids
            assert not right.whole and whole[:len(right.ids)] == right.ids and right.ids


def test_no_rows_no_tokenizer_call(minilm_path):
    recording = RecordingTokenizer(AutoTokenizer.from_pretrained(minilm_path))
    assert mask_inputs([], recording, 128) == [] and recording.characters == 0
    assert context_sides(recording, [], [], partial(tokens_needed, 10)) == []


def test_plain_token_ids_are_the_tokenizers_own_even_after_a_truncating_call(minilm_path, other_tokenizers):
    """The fast backend's ids equal transformers' call, also when an earlier call left the backend truncating
    (transformers keeps its truncation and padding settings on the backend between calls); a slow tokenizer is
    called as it is."""
    texts = ["alpha beta gamma delta " * 8, "éclair 東京都 tab\tbed", "", "42,000 new\nline"]
    tokenizers = (AutoTokenizer.from_pretrained(minilm_path), *other_tokenizers.values())
    for tokenizer in (*tokenizers, WithoutOffsets(tokenizers[0])):
        expected = tokenizer(texts, add_special_tokens=False)["input_ids"]
        assert max(len(ids) for ids in expected) > 8
        tokenizer(texts, truncation=True, max_length=8, padding=True)
        assert plain_token_ids(tokenizer, texts) == expected
        assert max(len(ids) for ids in tokenizer(texts, truncation=True, max_length=8)["input_ids"]) == 8


def test_model_token_ids_are_transformers_truncated_inputs_whatever_the_call_before(minilm_path, other_tokenizers):
    """Texts and pairs, special tokens added and truncated longest first: transformers' own ids and token
    types, also after a call that set no truncation or another length; and which texts were cut."""
    firsts = ["Paris", "alpha beta gamma delta " * 8, "éclair", ""]
    seconds = ["the capital of France " * 9, "short", "東京都 tab\tbed " * 5, "42,000"]
    tokenizers = (AutoTokenizer.from_pretrained(minilm_path), *other_tokenizers.values())
    for tokenizer in (*tokenizers, WithoutOffsets(tokenizers[0])):
        for pair in (None, seconds):
            tokenizer(firsts, add_special_tokens=False)
            expected = tokenizer(firsts, pair, truncation=True, max_length=16)
            tokenizer(firsts, truncation=True, max_length=5, padding=True)
            ids, types, cut = model_token_ids(tokenizer, firsts, pair, 16)
            assert ids == expected["input_ids"] and max(len(item) for item in ids) == 16
            assert types == expected.get("token_type_ids", types)
            assert cut == [len(whole) > 16 for whole in tokenizer(firsts, pair)["input_ids"]] and 0 < sum(cut) < 4


def prepared_inputs(rows: list[dict], model: str, length: int, directory,
                    tokenizer: str = "") -> list[tuple[tuple[int, ...], int]]:
    """(token ids, [MASK] position) of ``rows`` as embed-entities' CPU part writes them for the model (a pipeline
    with its real files; ``tokenizer``: the saved tokenizer its workers read), by entity id."""
    keyed = [{**row, "page_id": 1, "link_index": row["entity_id"]} for row in rows]
    pipeline = TestPipeline(runner="DirectRunner")
    files = FollowedFiles(str(directory), INPUT_PREFIX, str(directory) + ".list", str(directory) + ".ended", 1)
    build = BuildMentionInputs(model, length, "reference", model_salt([str(model)]), files, INPUT_FILE_ROWS, tokenizer)
    _ = pipeline | beam.Create(keyed) | PrepareMentionInputs(build)
    pipeline.run().wait_until_finish()
    found = {}
    for path in sorted(directory.iterdir()):
        keys, packed = table_inputs(tables.read_file(str(path)))
        for index, entity_id in enumerate(keys["entity_id"].tolist()):
            ids = packed.ids[packed.offsets[index]:packed.offsets[index + 1]]
            found[entity_id] = (tuple(ids.tolist()), int(packed.positions[index]))
    return [found[row["entity_id"]] for row in rows]


@pytest.mark.parametrize("kind", ["WordPiece", "byte-level BPE", "unigram"])
def test_the_inputs_the_cpu_part_writes_are_todays_ids_for_every_family(real_mentions, minilm_path,
                                                                         other_tokenizers, kind, tmp_path):
    """embed-entities' model inputs, built by the part that every core runs and read back from its files by the
    part that holds the GPU, are exactly ``mask_inputs``' ids (the window rule, trails, cut words)."""
    if kind == "WordPiece":
        model = minilm_path
    else:
        model = str(tmp_path / "tokenizer")
        other_tokenizers[kind].save_pretrained(model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    saved = str(tmp_path / "saved-tokenizer.json")
    save_tokenizer(model, saved)  # what the stage's launcher writes for its workers
    for length in (512, 24):
        rows = real_mentions[length][:150]
        expected = [(item.input_ids, item.mask_position) for item in mask_inputs(rows, tokenizer, length)]
        assert prepared_inputs(rows, model, length, tmp_path / f"inputs-{length}") == expected
        assert prepared_inputs(rows, model, length, tmp_path / f"saved-{length}", saved) == expected


def test_a_context_the_tokenizer_keeps_nothing_of_is_an_empty_context(minilm_path, tmp_path):
    """Zero-width and control characters pass ``str.strip()`` and the tokenizer drops them: the input would be
    [CLS] [MASK] [SEP], one vector for every such entity. Dead-lettered and counted as an empty context."""
    rows = [{"entity_id": 1, "text": "\u200bParis\u200d", "start": 1, "end": 6},
            {"entity_id": 2, "text": "Tokyo \u200c\x7f", "start": 0, "end": 5},
            {"entity_id": 3, "text": "\u200bin Rome", "start": 4, "end": 8}]
    keyed = [{**row, "page_id": 1, "link_index": row["entity_id"]} for row in rows]
    files = FollowedFiles(str(tmp_path), INPUT_PREFIX, f"{tmp_path}.list", f"{tmp_path}.ended", 1)
    build = BuildMentionInputs(str(minilm_path), 16, "reference", model_salt([str(minilm_path)]), files,
                               INPUT_FILE_ROWS)

    def prepare(pipeline: beam.Pipeline) -> None:
        dead = (pipeline | beam.Create(keyed) | PrepareMentionInputs(build))[DEAD_LETTER_TAG]
        assert_that(dead, equal_to([{"kind": "empty_contexts", "reason": "mention cannot be embedded", "entity_id": 1,
                                     "page_id": 1, "start": 1, "end": 6},
                                    {"kind": "empty_contexts", "reason": "mention cannot be embedded", "entity_id": 2,
                                     "page_id": 1, "start": 0, "end": 5}]))

    assert run_counting(prepare) == {"mentions_embedded": 1, "empty_contexts": 2}
    written = [table_inputs(tables.read_file(str(path)))[0]["entity_id"].tolist() for path in tmp_path.iterdir()]
    assert written == [[3]]


def family_models(minilm_path, other_tokenizers, directory) -> dict[str, str]:
    """A model directory of each tokenizer family: WordPiece, byte-level BPE, Unigram with Metaspace."""
    found = {"WordPiece": str(minilm_path)}
    for kind, tokenizer in other_tokenizers.items():
        found[kind] = str(directory / kind.replace(" ", "-"))
        tokenizer.save_pretrained(found[kind])
    return found


def test_a_saved_tokenizer_gives_transformers_ids_for_every_family(real_mentions, minilm_path, other_tokenizers,
                                                                   tmp_path):
    """What a worker reads back without transformers gives the ids, token types, special ids and [MASK] inputs
    of the tokenizer transformers loads, texts and pairs, truncated and not."""
    firsts = ["Paris", "alpha beta gamma delta " * 8, "éclair", "", "U.S. troops\tarrived. 東京都"]
    seconds = ["the capital of France " * 9, "short", "東京都 tab\tbed " * 5, "42,000", "alpha\x1fbeta"]
    for kind, model in family_models(minilm_path, other_tokenizers, tmp_path).items():
        save_tokenizer(model, str(tmp_path / f"{kind}.json"))
        saved, loaded = read_tokenizer(str(tmp_path / f"{kind}.json")), AutoTokenizer.from_pretrained(model)
        assert isinstance(saved, SavedTokenizer), kind
        assert special_ids(saved) == special_ids(loaded) and saved.model_input_names == tuple(loaded.model_input_names)
        texts = firsts + seconds
        assert plain_token_ids(saved, texts) == loaded(texts, add_special_tokens=False)["input_ids"]
        for pair in (None, seconds):
            expected = loaded(firsts, pair, truncation=True, max_length=16)
            ids, types, _ = model_token_ids(saved, firsts, pair, 16)
            assert ids == expected["input_ids"] and types == expected.get("token_type_ids", types), kind
        rows = real_mentions[128][:60]
        assert mask_inputs(rows, saved, 128) == mask_inputs(rows, loaded, 128), kind


def test_a_tokenizer_without_a_backend_is_saved_by_name_and_loaded_by_transformers(minilm_path, tmp_path,
                                                                                  monkeypatch):
    slow = WithoutOffsets(AutoTokenizer.from_pretrained(minilm_path))
    with monkeypatch.context() as patched:
        patched.setattr(encoder_models, "load_tokenizer", lambda name: slow)
        save_tokenizer(str(minilm_path), str(tmp_path / "slow.json"))
    read = read_tokenizer(str(tmp_path / "slow.json"))
    assert not isinstance(read, SavedTokenizer) and read.name_or_path == str(minilm_path)
    assert plain_token_ids(read, ["Erie Canal"]) == plain_token_ids(slow, ["Erie Canal"])
