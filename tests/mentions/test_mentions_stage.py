"""The mentions stage end to end: bottom-k samples, one and two workers, the refs it stores and the windows cut
from them at embed time."""

from __future__ import annotations

from pathlib import Path

from artifacts import tables
from pipelines.launcher.cli import main
from tests.builders import article, article_texts, ref_rows, write_parsed
from tests.conftest import DIRECT, MULTI_PROCESS, copy_stages
from transforms.common.mention_sampling import CHARS_PER_TOKEN, context_window, sample_key, window_digest
from transforms.embed_entities.mention_windows import shard_windows


def test_mentions_are_the_same_for_one_and_two_workers(tmp_path, full_run):
    one, two = tmp_path / "one", tmp_path / "two"
    for output in (one, two):  # the bundled sample parsed, every link target an entity (--include-red-links)
        copy_stages(full_run, output, ("parse", "dictionary"))
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


def test_windows_cut_at_embed_time_are_todays_mention_rows(tmp_path, full_run):
    """Every mention of the bundled sample (default options, every link target an entity): the refs stored, the
    windows cut from articles/ at embed time are exactly the rows the mentions stage stored before (same model
    input, same vectors)."""
    copy_stages(full_run, tmp_path, ("parse", "dictionary"))
    assert main(["mentions", "--output", str(tmp_path), *DIRECT]) == 0
    refs = tables.read_table(str(tmp_path), "mentions").to_pylist()
    articles = {row["page_id"]: row for row in tables.read_table(str(tmp_path), "articles").to_pylist()}
    chars = 512 * CHARS_PER_TOKEN
    expected = todays_mention_rows(articles, refs, chars)
    assert len(expected) > 20_000 and any(article["text"] != row["text"] for row in expected
                                          for article in [articles[row["page_id"]]])  # windows really cut
    assert all(ref["window_digest"] == window_digest(row["text"], row["start"], row["end"])
               for ref, row in zip(refs, expected, strict=True))
    texts = {page_id: article["text"] for page_id, article in articles.items()}
    found = [{name: value for name, value in row.items() if name != "link_index"}  # what CutMentionWindows cuts
             for row in shard_windows(ref_rows(refs), texts, chars)]
    key = lambda row: (row["entity_id"], row["page_id"], row["start"])  # noqa: E731
    assert sorted(found, key=key) == sorted(expected, key=key)
