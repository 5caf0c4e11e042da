"""Mention sampling and [MASK] entity embeddings: determinism, batching invariance, normalization, a hand check."""

from __future__ import annotations

import json
import math
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from apache_beam.ml.inference.base import PredictionResult
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from transformers import AutoModel, AutoTokenizer

from artifacts import tables
from artifacts.errors import InputError
from encoders.mask_encoder import (
    MaskEncoder,
    MaskInput,
    TokenIds,
    check_mask_model,
    context_split,
    mask_inputs,
    masked_ids,
)
from encoders.models import ModelSpec, input_embedding_norm
from pipelines.cli import main
from tests.conftest import BUNDLED_SAMPLE, DIRECT, MULTI_PROCESS, copy_stages
from tests.test_dictionary import article, write_parsed
from transforms.embed_entities import finite_vector, norm_matched
from transforms.mention_sampling import (
    CHARS_PER_TOKEN,
    LinkRef,
    context_window,
    link_refs,
    mention_ref,
    mention_window,
    sample_key,
    window_digest,
)
from transforms.mention_windows import CutMentionWindows, windows_of_page
from transforms.mentions import count_and_bottom_k, ref_order, sample_of_entity

IDS = TokenIds(cls=101, sep=102, mask=103, pad=0)
LINKS = [("Paris", "Paris")] * 5


def test_sample_key_is_seeded_and_stable():
    assert sample_key(0, "Paris", 12, 0) == sample_key(0, "Paris", 12, 0)
    assert len({sample_key(0, "Paris", 12, 0), sample_key(1, "Paris", 12, 0), sample_key(0, "Paris", 12, 1),
                sample_key(0, "Paris", 13, 0), sample_key(0, "Lyon", 12, 0)}) == 5


def test_link_refs_number_each_entitys_links_per_page():
    row = article(9, "T", "Paris and Lyon and Paris", [("Paris", "Paris"), ("Lyon", "Lyon"), ("Paris", "Paris")])
    refs = list(link_refs(row, seed=3))
    assert [(target, ref.link_index) for target, ref in refs] == [("Paris", 0), ("Lyon", 1), ("Paris", 2)]
    assert refs[2][1].sample_key == sample_key(3, "Paris", 9, 1)


def test_context_window_cuts_at_spaces_and_keeps_the_span():
    text = "one two three FOUR five six seven"
    window, start, end = context_window(text, 14, 18, chars=6)
    assert (window, window[start:end]) == ("three FOUR five", "FOUR")
    assert context_window(text, 14, 18, chars=100) == (text, 14, 18)


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


def test_vectors_do_not_depend_on_batching(tiny_bert):
    rng = np.random.default_rng(0)
    inputs = [MaskInput(1, tuple([101, *rng.integers(1000, 2000, size=n).tolist(), 103, 102]), n + 1)
              for n in rng.integers(1, 60, size=40)]
    batched = MaskEncoder(ModelSpec(str(tiny_bert)), layer=-1, max_tokens=256).encode(inputs)
    one_by_one = MaskEncoder(ModelSpec(str(tiny_bert)), layer=-1, max_tokens=1).encode(inputs)
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-5, atol=1e-5)
    middle = MaskEncoder(ModelSpec(str(tiny_bert)), layer=1, max_tokens=256).encode(inputs)
    assert not np.allclose(middle, batched)


def test_non_finite_vectors_are_dead_lettered():
    nan = PredictionResult(MaskInput(5, (101, 103, 102), 1), np.array([np.nan, 1.0]))
    [record] = list(finite_vector(nan))
    assert record.value["kind"] == "non_finite_vectors" and record.value["entity_id"] == 5
    assert norm_matched(np.zeros(3), 2, 1.0) is None
    np.testing.assert_allclose(norm_matched(np.array([3.0, 4.0]), 2, 2.0), [1.2, 1.6])


CAPITALS = [
    article(1, "Paris", "Paris is the capital of France. It lies on the Seine.",
            [("France", "France"), ("Seine", "Seine")]),
    article(2, "France", "France is a country. Its capital is Paris, on the river Seine.",
            [("Paris", "Paris"), ("Seine", "Seine")]),
    article(3, "Seine", "The Seine flows through Paris in France. Paris grew on the Seine.",
            [("Paris", "Paris"), ("France", "France"), ("Paris", "Paris")]),
]


def article_texts(output: Path) -> dict[int, str]:
    return {row["page_id"]: row["text"] for row in tables.read_table(str(output), "articles", ["page_id", "text"])
            .to_pylist()}


def mention_windows(output: Path) -> list[dict]:
    """The mention rows embed-entities encodes: each ref's window cut from its article (no Beam)."""
    texts, chars = article_texts(output), 512 * CHARS_PER_TOKEN  # the mentions stage's default --max-seq-length
    return [mention_window(ref, texts[ref["page_id"]], chars)
            for ref in tables.read_table(str(output), "mentions").to_pylist()]


def build_embeddings(output: Path, model: Path, *extra: str) -> None:
    write_parsed(output, CAPITALS)
    assert main(["dictionary", "--output", str(output), *DIRECT]) == 0
    assert main(["mentions", "--output", str(output), "--max-mentions", "2", *DIRECT]) == 0
    assert main(["embed-entities", "--output", str(output), "--model", str(model), "--max-seq-length", "64",
                 *extra, *DIRECT]) == 0


def test_embed_entities_hand_checked(minilm_path, tmp_path):
    build_embeddings(tmp_path, minilm_path)
    mentions = mention_windows(tmp_path)
    per_entity = {}
    for row in mentions:
        per_entity.setdefault(row["entity_id"], []).append(row)
    assert {len(rows) for rows in per_entity.values()} <= {1, 2}
    embeddings = {row["entity_id"]: row for row in tables.read_table(str(tmp_path), "entity_embeddings").to_pylist()}
    metadata = tables.file_metadata(tables.parquet_files(str(tmp_path), "entity_embeddings")[0])
    model = AutoModel.from_pretrained(minilm_path).eval()
    expected_norm = float(model.get_input_embeddings().weight.detach().norm(dim=1).mean())
    assert float(metadata["target_norm"]) == pytest.approx(expected_norm, rel=1e-6)
    assert metadata["layer"] == "-1" and metadata["model"] == str(minilm_path)

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    for entity_id, rows in per_entity.items():
        vectors = []
        for row in rows:  # by hand: the mention replaced by [MASK], the last layer at that position
            text = row["text"][:row["start"]] + tokenizer.mask_token + row["text"][row["end"]:]
            encoded = tokenizer(text, return_tensors="pt")
            with torch.inference_mode():
                states = model(**encoded).last_hidden_state[0]
            position = encoded["input_ids"][0].tolist().index(tokenizer.mask_token_id)
            vectors.append(states[position].numpy())
        mean = np.mean(vectors, axis=0)
        expected = mean / np.linalg.norm(mean) * expected_norm
        stored = np.array(embeddings[entity_id]["embedding"])
        np.testing.assert_allclose(stored, expected, rtol=1e-4, atol=1e-5)
        assert embeddings[entity_id]["mention_count"] == len(rows)
        assert math.isclose(float(np.linalg.norm(stored)), expected_norm, rel_tol=1e-5)


def test_float16_output_and_bfloat16_compute(tiny_bert, tmp_path):
    build_embeddings(tmp_path, tiny_bert, "--dtype", "bfloat16", "--embedding-dtype", "float16")
    path = tables.parquet_files(str(tmp_path), "entity_embeddings")[0]
    table = pq.read_table(path)
    assert table.schema.field("embedding").type == pa.list_(pa.float16(), 32)
    norms = np.linalg.norm(np.array(table.column("embedding").to_pylist(), dtype=np.float32), axis=1)
    np.testing.assert_allclose(norms, input_embedding_norm(ModelSpec(str(tiny_bert))), rtol=2e-3)


def test_mentions_are_the_same_for_one_and_two_workers(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["parse", "--output", str(one), "--dump", str(BUNDLED_SAMPLE), *DIRECT]) == 0
    assert main(["dictionary", "--output", str(one), "--include-red-links", *DIRECT]) == 0
    copy_stages(one, two, ("parse", "dictionary"))
    assert main(["mentions", "--output", str(one), "--max-mentions", "3", *DIRECT]) == 0
    assert main(["mentions", "--output", str(two), "--max-mentions", "3", *MULTI_PROCESS]) == 0

    def rows(output: Path) -> list[tuple]:
        return sorted(tuple(row.values()) for row in tables.read_table(str(output), "mentions").to_pylist())

    assert rows(one) == rows(two)
    mentions, texts = tables.read_table(str(one), "mentions").to_pylist(), article_texts(one)
    assert all(texts[row["page_id"]][row["start"]:row["end"]].strip() for row in mentions)
    per_entity: dict[int, int] = {}
    for row in mentions:
        per_entity[row["entity_id"]] = per_entity.get(row["entity_id"], 0) + 1
    assert max(per_entity.values()) == 3
    assert set(per_entity) == set(tables.read_table(str(one), "entities").column("entity_id").to_pylist())


def test_bottom_k_keeps_the_smallest_keys(tmp_path):
    pages = [article(page, f"P{page}", "Paris " * 3, [("Paris", "Paris")] * 3) for page in range(1, 5)]
    pages.append(article(9, "Paris", "Paris.", []))
    write_parsed(tmp_path, pages)
    assert main(["dictionary", "--output", str(tmp_path), *DIRECT]) == 0
    assert main(["mentions", "--output", str(tmp_path), "--max-mentions", "4", "--seed", "7", *DIRECT]) == 0
    keys = sorted((sample_key(7, "Paris", page, ordinal), page) for page in range(1, 5) for ordinal in range(3))
    chosen = sorted(row["page_id"] for row in tables.read_table(str(tmp_path), "mentions").to_pylist())
    assert chosen == sorted(page for _, page in keys[:4])


def test_bottom_k_combines_before_the_join_and_counts_every_link():
    refs = [LinkRef(sample_key=(index * 7919) % 1000, page_id=index, link_index=0) for index in range(1000)]
    with TestPipeline(runner="DirectRunner") as pipeline:
        combined = (pipeline | beam.Create([("Paris", ref) for ref in refs] + [("Nowhere", refs[0])])
                    | beam.CombinePerKey(count_and_bottom_k(5)))
        expected = sorted(refs, key=ref_order)[:5]
        assert_that(combined, equal_to([("Paris", (1000, expected)), ("Nowhere", (1, [refs[0]]))]))
    joined = {"entity_id": [], "sample": [(1000, expected)]}
    assert list(sample_of_entity("Red link", joined)) == []
    assert list(sample_of_entity("Paris", {"entity_id": [7], "sample": [(1000, expected)]})) == [(7, expected)]


def test_a_link_trail_stays_outside_the_mask_from_parse_to_model_input(tiny_bert):
    from tests.conftest import GENSIM_SAMPLE
    from transforms.dump_reader import iter_pages, read_siteinfo
    from transforms.parse import classify_page
    from transforms.wikitext import WikitextOptions

    siteinfo = read_siteinfo(str(GENSIM_SAMPLE))
    page = next(page for page in iter_pages(str(GENSIM_SAMPLE), siteinfo) if getattr(page, "title", "") == "Autism")
    [article] = list(classify_page(page, siteinfo, WikitextOptions()))
    index = next(i for i, link in enumerate(article["links"]) if link["target"] == "Neuron")
    link = article["links"][index]
    # the anchor keeps the trail (the dictionary's name), the trail length is recorded beside it
    assert (article["text"][link["start"]:link["end"]], link["trail"]) == ("neurons", 1)
    ref = mention_ref(9, article, index, 30)
    assert (ref["page_id"], ref["link_index"], article["text"][ref["start"]:ref["end"]]) == (page.page_id, index,
                                                                                           "neuron")
    row = mention_window(ref, article["text"], 30)
    assert row["text"][row["start"]:row["end"]] == "neuron" and row["text"][row["end"]:].startswith("s that")
    assert ref["window_digest"] == window_digest(row["text"], row["start"], row["end"])
    [item] = mask_inputs([row], AutoTokenizer.from_pretrained(tiny_bert), 512)
    tokens = AutoTokenizer.from_pretrained(tiny_bert).convert_ids_to_tokens(list(item.input_ids))
    assert tokens[item.mask_position - 3:item.mask_position + 4] == ["an", "excess", "of", "[MASK]", "s", "that",
                                                                     "causes"]


def todays_mention_rows(articles: dict[int, dict], refs: list[dict], chars: int) -> list[dict]:
    """The mention rows as the mentions stage stored them before windows moved to embed time (its code, inline):
    the window cut around the sampled link's own text, trail excluded."""
    rows = []
    for ref in refs:
        article = articles[ref["page_id"]]
        link = article["links"][ref["link_index"]]
        text, start, end = context_window(article["text"], link["start"], link["end"] - (link["trail"] or 0), chars)
        rows.append({"entity_id": ref["entity_id"], "page_id": ref["page_id"], "text": text, "start": start,
                     "end": end})
    return rows


def test_windows_cut_at_embed_time_are_todays_mention_rows(tmp_path):
    """Every mention of the bundled sample (default options): the refs stored, the windows cut from articles/ at
    embed time are exactly the rows the mentions stage stored before (same model input, same vectors)."""
    assert main(["parse", "--output", str(tmp_path), "--dump", str(BUNDLED_SAMPLE), *DIRECT]) == 0
    assert main(["dictionary", "--output", str(tmp_path), "--include-red-links", *DIRECT]) == 0
    assert main(["mentions", "--output", str(tmp_path), *DIRECT]) == 0
    refs = tables.read_table(str(tmp_path), "mentions").to_pylist()
    articles = {row["page_id"]: row for row in tables.read_table(str(tmp_path), "articles").to_pylist()}
    chars = 512 * CHARS_PER_TOKEN
    expected = todays_mention_rows(articles, refs, chars)
    assert len(expected) > 20_000 and any(article["text"] != row["text"] for row in expected
                                          for article in [articles[row["page_id"]]])  # windows really cut
    assert all(ref["window_digest"] == window_digest(row["text"], row["start"], row["end"])
               for ref, row in zip(refs, expected, strict=True))
    by_page: dict[int, list[dict]] = {}
    for ref in refs:  # what CutMentionWindows's join hands windows_of_page (the join itself: the test below)
        by_page.setdefault(ref["page_id"], []).append(ref)
    found = [row for page_id, page_refs in by_page.items()
             for row in windows_of_page(page_id, {"refs": page_refs, "text": [articles[page_id]["text"]]}, chars)]
    key = lambda row: (row["entity_id"], row["page_id"], row["start"])  # noqa: E731
    assert sorted(found, key=key) == sorted(expected, key=key)


def test_refs_of_a_missing_page_are_dead_lettered():
    ref = {"entity_id": 3, "page_id": 8, "link_index": 1, "start": 4, "end": 9, "window_digest": b"x" * 16}
    with TestPipeline(runner="DirectRunner") as pipeline:
        cut = ({"refs": pipeline | "Refs" >> beam.Create([ref, {**ref, "page_id": 5}]),
                "articles": pipeline | "Articles" >> beam.Create([{"page_id": 5, "text": "see Paris here"}])}
               | CutMentionWindows(100))
        assert_that(cut.mentions, equal_to([{"entity_id": 3, "page_id": 5, "text": "see Paris here", "start": 4,
                                             "end": 9}]), label="Mentions")
        assert_that(cut.dead_letter, equal_to([{"kind": "mention_pages_missing", "entity_id": 3, "page_id": 8,
                                                "link_index": 1,
                                                "reason": "the page of a sampled mention is not in articles/"}]),
                    label="DeadLetters")


def test_mentions_with_stored_windows_ask_for_a_rerun(tmp_path):
    """An OUT whose mentions/ an older version wrote (windows stored as text): a one-line error, not a traceback."""
    from pipelines.embed_entities import context_chars

    (tmp_path / "mentions").mkdir()
    old = pa.table({"entity_id": pa.array([1], pa.int32()), "page_id": pa.array([5], pa.int64()),
                    "text": ["see Paris here"], "start": pa.array([4], pa.int32()), "end": pa.array([9], pa.int32())})
    pq.write_table(old, tmp_path / "mentions" / "part-0.parquet")
    with pytest.raises(InputError, match=r"mentions has no link_index, window_digest column .*run mentions again"):
        context_chars(str(tmp_path))
