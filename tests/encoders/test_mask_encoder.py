"""encoders/mask_encoder.py: [MASK] inputs on real pages (the context windows of both conventions, counted by hand,
and link trails), the token budget split, the model checks made before any work, vectors independent of batching."""

from __future__ import annotations

import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from artifacts.errors import BelowMinimumError, InputError, SettingError
from encoders.mask_encoder import MaskEncoder, check_mask_model
from encoders.mask_inputs import MaskInput, PackedMaskInputs, TokenIds, context_split, mask_inputs, masked_ids
from encoders.models import ModelSpec
from encoders.retrievers import EncoderOptions
from pipelines.index import check_encoder
from pipelines.launcher.flags import worded
from transforms.common.mention_sampling import mention_ref, mention_window
from transforms.embed_entities.graph import EmbedConfig
from transforms.embed_entities.inputs import mention_problem
from transforms.parse.dump_reader import RawPage, SiteInfo, iter_pages, read_siteinfo
from transforms.parse.graph import classify_page
from transforms.parse.namespaces import Namespaces
from transforms.parse.wikitext import Link, ParsedText, WikitextOptions, wikitext_to_text

TITLES = ("Anarchism", "Algorithms (journal)")


@pytest.fixture(scope="module")
def siteinfo(single_stream_sample) -> SiteInfo:
    return read_siteinfo(str(single_stream_sample))


@pytest.fixture(scope="module")
def raw_pages(single_stream_sample, siteinfo) -> dict[str, RawPage]:
    return {page.title: page for page in iter_pages(str(single_stream_sample), siteinfo)
            if isinstance(page, RawPage) and page.title in TITLES}


@pytest.fixture(scope="module")
def pages(raw_pages, siteinfo) -> dict[str, ParsedText]:
    return {title: wikitext_to_text(page.text, title, siteinfo.namespaces) for title, page in raw_pages.items()}


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    return AutoTokenizer.from_pretrained(minilm_path)


def row(text: str, link: Link) -> dict:
    """A mention row as mentions/ stores it: the masked span is the link's own text (its trail is context)."""
    return {"entity_id": 1, "text": text, "start": link.start, "end": link.end - link.trail}


def link_with_anchor(parsed: ParsedText, anchor: str) -> Link:
    return next(link for link in parsed.links if parsed.text[link.start:link.end] == anchor)


def window(tokenizer, mention: dict, max_seq_length: int, rule: str) -> tuple[list[str], int]:
    [item] = mask_inputs([mention], tokenizer, max_seq_length, window=rule)
    return tokenizer.convert_ids_to_tokens(list(item.input_ids)), item.mask_position


def test_a_short_real_sentence_by_hand(pages, tokenizer):
    anarchism = pages["Anarchism"]
    first = anarchism.text[:anarchism.text.index(".") + 1]
    assert first == "Anarchism is a political philosophy that advocates self-governed societies based on voluntary " \
                    "institutions."
    mention = row(first, link_with_anchor(anarchism, "political philosophy"))
    # before: ana ##rch ##ism is a (5 tokens); after: that advocates self - governed societies ... (13 tokens).
    # 10 tokens leave 7 for context: reference 7 - 7 // 2 = 4 before and 3 after; centered 3 before, 4 after.
    assert window(tokenizer, mention, 10, "reference") == (
        ["[CLS]", "##rch", "##ism", "is", "a", "[MASK]", "that", "advocates", "self", "[SEP]"], 5)
    assert window(tokenizer, mention, 10, "centered") == (
        ["[CLS]", "##ism", "is", "a", "[MASK]", "that", "advocates", "self", "-", "[SEP]"], 4)
    # a side shorter than half the budget (after "voluntary institutions" only "." is left): the other side
    # takes the rest, 7 - 1 = 6 tokens, under both rules
    mention = {**mention, "start": first.index("voluntary"), "end": len(first) - 1}
    for rule in ("reference", "centered"):
        assert window(tokenizer, mention, 10, rule) == (
            ["[CLS]", "self", "-", "governed", "societies", "based", "on", "[MASK]", ".", "[SEP]"], 7)


def test_a_long_real_page_cut_on_both_sides(pages, tokenizer):
    anarchism = pages["Anarchism"]
    link = anarchism.links[len(anarchism.links) // 2]
    mention = row(anarchism.text, link)
    before = tokenizer.tokenize(anarchism.text[:link.start])
    after = tokenizer.tokenize(anarchism.text[link.end - link.trail:])
    assert len(before) > 255 and len(after) > 255
    tokens, position = window(tokenizer, mention, 512, "reference")
    assert (len(tokens), position) == (512, 256)  # [CLS], 255 before, [MASK], 254 after, [SEP]
    assert tokens[1:256] == before[-255:] and tokens[257:511] == after[:254]
    tokens, position = window(tokenizer, mention, 512, "centered")
    assert (len(tokens), position) == (512, 255)  # [CLS], 254 before, [MASK], 255 after, [SEP]
    assert tokens[1:255] == before[-254:] and tokens[256:511] == after[:255]


def test_a_page_shorter_than_the_budget_keeps_everything_and_its_link_trail(pages, tokenizer):
    journal = pages["Algorithms (journal)"]
    link = link_with_anchor(journal, "algorithms")  # [[algorithm]]s: the link's own text, then the trail "s"
    assert (link.target, link.trail) == ("Algorithm", 1)
    assert journal.text[link.start - 15:link.end + 1] == "experiments on algorithms."
    before = tokenizer.tokenize(journal.text[:link.start])
    after = tokenizer.tokenize(journal.text[link.end - 1:])
    assert after[:2] == ["s", "."] and len(before) + len(after) < 509
    for rule in ("reference", "centered"):
        tokens, position = window(tokenizer, row(journal.text, link), 512, rule)
        assert tokens == ["[CLS]", *before, "[MASK]", *after, "[SEP]"] and position == len(before) + 1


def test_a_real_link_trail_stays_context_from_parse_to_mask(raw_pages, siteinfo, tokenizer):
    """Anarchism's [[strikebreaker]]s: the article's anchor keeps "s", the [MASK] replaces only "strikebreaker"."""
    page = raw_pages["Anarchism"]
    converted = classify_page(page, siteinfo, WikitextOptions())
    [article] = [item for item in converted if isinstance(item, dict)]  # the staged row; not its title record
    index = next(i for i, link in enumerate(article["links"]) if link["target"] == "Strikebreaker")
    link = article["links"][index]
    assert (article["text"][link["start"]:link["end"]], link["trail"]) == ("strikebreakers", 1)
    ref = mention_ref(1, article, index, 2000)  # the mentions/ row of that link
    assert article["text"][ref["start"]:ref["end"]] == "strikebreaker"  # the stored span excludes the trail
    mention = mention_window(ref, article["text"], 2000)  # the window embed-entities cuts
    assert mention["text"][mention["start"]:mention["end"]] == "strikebreaker"
    [item] = mask_inputs([mention], tokenizer, 512)
    tokens = tokenizer.convert_ids_to_tokens(list(item.input_ids))
    assert tokens[item.mask_position - 2:item.mask_position + 3] == ["out", "when", "[MASK]", "s", "attempted"]


def test_a_trail_never_leaves_a_mention_without_text_of_its_own():
    # a link showing no text of its own is no link: its trail is plain text, so no mention masks a trail alone
    parsed = wikitext_to_text("[[Foo|]]s and [[lichen]]s", "Page", Namespaces.english_defaults())
    assert (parsed.text, parsed.links) == ("s and lichens", (Link(6, 13, "Lichen", 1),))
    mention = {"entity_id": 1, "page_id": 2, "text": "lichens", "start": 0, "end": 6}
    assert mention_problem(mention) is None  # the trail "s" is context enough
    assert mention_problem({**mention, "end": 7}) == "empty_contexts"  # the whole anchor masked: nothing left
    assert mention_problem({**mention, "end": 0}) == "bad_mention_spans"  # a trail as long as the anchor


# --- token windows, the model checks, batching ---------------------------------------------------------------

IDS = TokenIds(cls=101, sep=102, mask=103, pad=0)


def test_masked_ids_reference_window_puts_the_odd_token_before_the_mask():
    left, right = list(range(1, 11)), list(range(21, 31))  # budget 10 - 3 = 7, half 3
    assert masked_ids(left, right, IDS, 10) == ([101, 7, 8, 9, 10, 103, 21, 22, 23, 102], 5)
    assert masked_ids(left, right, IDS, 10, "centered") == ([101, 8, 9, 10, 103, 21, 22, 23, 24, 102], 4)
    assert masked_ids([1], right, IDS, 10) == ([101, 1, 103, 21, 22, 23, 24, 25, 26, 102], 2)
    assert masked_ids(left, [21], IDS, 10) == ([101, 5, 6, 7, 8, 9, 10, 103, 21, 102], 7)
    # a left side of exactly half: the reference keeps 3 + 3 and leaves the seventh slot unused
    assert masked_ids([1, 2, 3], right, IDS, 10) == ([101, 1, 2, 3, 103, 21, 22, 23, 102], 4)
    assert masked_ids([1, 2, 3], right, IDS, 10, "centered") == ([101, 1, 2, 3, 103, 21, 22, 23, 24, 102], 4)
    assert masked_ids([], [], IDS, 9) == ([101, 103, 102], 1)


def test_context_split_of_the_512_token_budget():
    assert context_split(1000, 1000, 509) == (255, 254)
    assert context_split(1000, 1000, 509, "centered") == (254, 255)
    assert context_split(100, 1000, 509) == (100, 409)
    assert context_split(1000, 100, 509) == (409, 100)
    assert context_split(100, 200, 509) == (100, 200)  # a page shorter than the budget is kept whole


# The Autism page of the gensim sample: "* An excess of [[neuron]]s that causes local overconnectivity in key brain
# regions." (the list item's "* " is list markup). WordPiece ids of the uncased vocabulary, looked up by hand.
AUTISM_LINE = "An excess of neurons that causes local overconnectivity in key brain regions."


def test_mask_inputs_on_a_real_sentence_both_conventions(tiny_bert):
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    row = {"entity_id": 9, "text": AUTISM_LINE, "start": 13, "end": 19}  # "neuron", the trail "s" is context
    [wide] = mask_inputs([row], tokenizer, 32)
    assert tokenizer.convert_ids_to_tokens(list(wide.input_ids)) == [
        "[CLS]", "an", "excess", "of", "[MASK]", "s", "that", "causes", "local", "over", "##con", "##ne",
        "##ct", "##ivity", "in", "key", "brain", "regions", ".", "[SEP]"]
    # max_seq_length 8: budget 5, both sides cut; the reference keeps 3 before and 2 after, centered 2 and 3
    [reference] = mask_inputs([row], tokenizer, 8)
    [centered] = mask_inputs([row], tokenizer, 8, "centered")
    assert list(reference.input_ids) == [101, 2019, 9987, 1997, 103, 1055, 2008, 102]
    assert reference.mask_position == 4
    assert list(centered.input_ids) == [101, 9987, 1997, 103, 1055, 2008, 5320, 102]
    assert centered.mask_position == 3


def test_mask_inputs_replace_the_mention_with_one_mask(tiny_bert):
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    [item] = mask_inputs([{"entity_id": 4, "text": "the city of Paris is big", "start": 12, "end": 17}], tokenizer, 32)
    assert tokenizer.convert_ids_to_tokens(list(item.input_ids)) == [
        "[CLS]", "the", "city", "of", "[MASK]", "is", "big", "[SEP]"]
    assert item.mask_position == 4 and item.entity_id == 4


def test_a_model_without_mask_fails_before_any_work(tiny_bert, tmp_path):
    config = json.loads((tiny_bert / "tokenizer_config.json").read_text())
    config["mask_token"] = None
    broken = tmp_path / "no-mask"
    broken.mkdir()
    for path in tiny_bert.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    (broken / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=r"no \[MASK\] token"):
        check_mask_model(ModelSpec(str(broken)))
    with pytest.raises(InputError, match="does not exist"):
        check_mask_model(ModelSpec(str(tmp_path / "nowhere" / "model")))
    with pytest.raises(InputError, match=f"model path {broken / 'config.json'} is a file: name the model's directory"):
        check_mask_model(ModelSpec(str(broken / "config.json")))  # said not to exist


def copy_model(source, destination, **config_changes):
    """A copy of a model directory with ``config_changes`` made to its files (file name -> {key: value})."""
    destination.mkdir()
    for path in source.iterdir():
        (destination / path.name).write_bytes(path.read_bytes())
    for name, changes in config_changes.items():
        path = destination / f"{name}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return destination


@pytest.mark.parametrize(("changes", "message"), [
    ({"tokenizer_config": {"cls_token": None, "bos_token": None}}, r"has no \[CLS\] \(or a BOS\) token"),
    ({"tokenizer_config": {"sep_token": None, "eos_token": None}}, r"has no \[SEP\] \(or an EOS\) token"),
    ({"config": {"vocab_size": 1000}}, r"has 30,\d{3} tokens and its model 1,000 word embeddings"),
])
def test_a_tokenizer_that_does_not_fit_the_model_fails_before_any_work(tiny_bert, tmp_path, changes, message):
    """Without [CLS] or [SEP] the inputs' workers failed on None ids; with more tokens than word embeddings the
    model raised an IndexError in its worker."""
    with pytest.raises(InputError, match=message):
        check_mask_model(ModelSpec(str(copy_model(tiny_bert, tmp_path / "broken", **changes))))


def test_word_embeddings_without_a_norm_fail_before_any_work(tiny_bert, tmp_path):
    """All-zero (or NaN) word embeddings give no norm to match: every vector would be refused by validate later."""
    import torch
    from transformers import AutoModel

    from transforms.embed_entities.graph import model_facts

    model = AutoModel.from_pretrained(tiny_bert)
    for fill, shown in ((0.0, "0.0"), (float("nan"), "nan")):
        with torch.no_grad():
            model.get_input_embeddings().weight.fill_(fill)
        broken = copy_model(tiny_bert, tmp_path / f"filled-{shown}")
        model.save_pretrained(broken)
        with pytest.raises(InputError, match=f"have a mean norm of {shown}: entity vectors are scaled to it"):
            model_facts(EmbedConfig(str(broken), max_seq_length=32), 10)


def test_vectors_do_not_depend_on_batching(tiny_bert):
    rng = np.random.default_rng(0)
    inputs = [MaskInput(1, tuple([101, *rng.integers(1000, 2000, size=n).tolist(), 103, 102]), n + 1)
              for n in rng.integers(1, 60, size=40)]
    batched = MaskEncoder(ModelSpec(str(tiny_bert)), layer=-1, max_tokens=256).encode(inputs)
    one_by_one = MaskEncoder(ModelSpec(str(tiny_bert)), layer=-1, max_tokens=1).encode(inputs)
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-5, atol=1e-5)
    middle = MaskEncoder(ModelSpec(str(tiny_bert)), layer=1, max_tokens=256).encode(inputs)
    assert not np.allclose(middle, batched)


def test_packed_inputs_give_the_vectors_of_the_inputs_themselves(pages, tiny_bert):
    """The model part encodes inputs as the CPU part packs them (flat ids and offsets, padded with numpy): the
    vectors of encoding each input alone, in their order."""
    anarchism = pages["Anarchism"]
    rows = [{**row(anarchism.text, link), "entity_id": index} for index, link in enumerate(anarchism.links[:60])]
    encoder = MaskEncoder(ModelSpec(str(tiny_bert)), layer=-1, max_tokens=1024)
    inputs = mask_inputs(rows, encoder.tokenizer, 64)
    packed = PackedMaskInputs.joined([PackedMaskInputs.of(inputs[:25]), PackedMaskInputs.of(inputs[25:])])
    assert [tuple(packed.ids[start:end]) for start, end in zip(packed.offsets, packed.offsets[1:], strict=False)] == [
        item.input_ids for item in inputs]
    alone = np.concatenate([encoder.encode_packed(PackedMaskInputs.of([item])) for item in inputs])
    np.testing.assert_allclose(encoder.encode_packed(packed), alone, rtol=1e-5, atol=1e-5)


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
    messages = {2: "--max-seq-length must be at least 5, got 2: [CLS], [MASK], [SEP] and a token of context on each "
                   "side of the mention (without context every entity gets the same vector)",
                513: f"--max-seq-length 513: {tiny_bert} takes 5 to 512 tokens ([CLS], [MASK], [SEP] and the context)"}
    for length, message in messages.items():
        with pytest.raises(SettingError) as raised:
            check_mask_model(spec, -1, length)
        assert (raised.value.setting, raised.value.value) == ("max_seq_length", length)
        assert worded(raised.value).message == message


def test_a_batch_token_budget_below_one_is_refused_on_the_driver(tiny_bert):
    with pytest.raises(BelowMinimumError) as raised:
        EmbedConfig(str(tiny_bert), batch_tokens=0)
    assert worded(raised.value).message == "--batch-tokens must be at least 1, got 0"
    with pytest.raises(InputError, match="--batch-tokens must be at least 1, got 0"):
        check_encoder(EncoderOptions("mean", str(tiny_bert), batch_tokens=0))
