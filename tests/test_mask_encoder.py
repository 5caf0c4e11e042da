"""[MASK] inputs on real pages: the context windows of both conventions, counted by hand, and link trails."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from encoders.mask_encoder import mask_inputs
from tests.conftest import GENSIM_SAMPLE
from transforms.dump_reader import RawPage, iter_pages, read_siteinfo
from transforms.embed_entities import mention_problem
from transforms.mention_sampling import mention_window
from transforms.mentions import mention_refs
from transforms.namespaces import Namespaces
from transforms.parse import classify_page
from transforms.wikitext import Link, ParsedText, WikitextOptions, wikitext_to_text

TITLES = ("Anarchism", "Algorithms (journal)")


@pytest.fixture(scope="module")
def raw_pages(shared_data) -> dict[str, RawPage]:
    siteinfo = read_siteinfo(str(GENSIM_SAMPLE))
    return {page.title: page for page in iter_pages(str(GENSIM_SAMPLE), siteinfo)
            if isinstance(page, RawPage) and page.title in TITLES}


@pytest.fixture(scope="module")
def pages(raw_pages) -> dict[str, ParsedText]:
    namespaces = read_siteinfo(str(GENSIM_SAMPLE)).namespaces
    return {title: wikitext_to_text(page.text, title, namespaces) for title, page in raw_pages.items()}


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


def test_a_real_link_trail_stays_context_from_parse_to_mask(raw_pages, tokenizer):
    """Anarchism's [[strikebreaker]]s: the article's anchor keeps "s", the [MASK] replaces only "strikebreaker"."""
    page = raw_pages["Anarchism"]
    [article] = list(classify_page(page, read_siteinfo(str(GENSIM_SAMPLE)), WikitextOptions()))
    index = next(i for i, link in enumerate(article["links"]) if link["target"] == "Strikebreaker")
    link = article["links"][index]
    assert (article["text"][link["start"]:link["end"]], link["trail"]) == ("strikebreakers", 1)
    [ref] = mention_refs(page.page_id, {"article": [article], "sampled": [(1, index)]}, 2000)
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
