"""Benchmark monthly refreshes: how much of a refresh's GPU work is redone, against how much of its input changed.

An enwiki-shaped dump (bench/synthetic.py) is run through every stage; then, for each share of edited articles
(5%, 20%, 40% by default), a "next month" dump is made from it by the edit model below and run with
``--previous`` the first run. Printed per share: the share of the new run's sampled mention windows that changed
(page and ``window_digest``: the text around the mention, which covers more than the model's input) and of its
passages (id, title and text), and the share of mention and passage forwards the refresh redid (its manifest's
``mentions_encoded`` of ``mentions_embedded``, ``passages_encoded`` of encoded and reused); then the GPU hours of
a monthly English Wikipedia refresh at those shares and the H200 ceilings measured (README "GPUs").

The edit model (every figure an option): a share of articles edited, each with 1-3 local edits at random places —
a sentence inserted, replaced or deleted, about a third of them adding or removing a link —, new articles (0.2%),
deleted articles (0.05%) and redirects pointed elsewhere (0.1%). These are assumptions in the order of what
Wikipedia's statistics report (~5-6M edits a month to ~6.7M articles, most pages untouched in a month, most edits
small), not a fit to them. The runs use the packaged MiniLM's tokenizer and the no-op model of the benchmarks
(bench/no_op_model): what a refresh redoes depends on the inputs, not on the vectors.

    python -m bench.refresh [--articles 1000] [--shares 0.05 0.2 0.4] [--work DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from artifacts.run import manifest
from bench.paths import minilm_path
from bench.synthetic import (
    Material,
    Page,
    Shape,
    link_graph,
    pages,
    sample_material,
    synthetic_dump,
    write_multistream,
)

REPO = Path(__file__).resolve().parents[1]
NO_OP_MODEL = REPO / "bench" / "no_op_model"
MENTIONS, PASSAGES = 112_000_000, 21_015_324  # English Wikipedia's sampled mentions, DPR's passages (README)
H200_MENTIONS_512, H200_DPR_PASSAGES = 4_326.0, 15_560.0  # forwards a second at the ceiling (README "GPUs")
_SENTENCE = re.compile(r"(?<=[.!?]) (?=[A-Z])")


@dataclass(frozen=True)
class EditModel:
    """A month of edits: ``edited`` (share of articles), ``edits`` (fewest, most per edited article),
    ``link_share`` (of edits adding or removing a link), ``new``, ``deleted`` (shares of articles) and
    ``redirects`` (share of redirects pointed elsewhere)."""

    edited: float = 0.2
    edits: tuple[int, int] = (1, 3)
    link_share: float = 1 / 3
    new: float = 0.002
    deleted: float = 0.0005
    redirects: float = 0.001
    seed: int = 1


def edited_text(rng: np.random.Generator, text: str, edits: int, model: EditModel, material: Material,
                titles: Sequence[str]) -> str:
    """``text`` with ``edits`` local edits in its paragraphs (lines of sentences, not infobox or headings)."""
    lines = text.split("\n")
    body = [at for at, line in enumerate(lines) if line and line[0] not in "{|}=[" and "." in line]
    for _ in range(edits):
        at = body[int(rng.integers(len(body)))]
        sentences = _SENTENCE.split(lines[at])
        where, kind = int(rng.integers(len(sentences))), rng.choice(["insert", "replace", "delete"])
        new = material.sentences[int(rng.integers(len(material.sentences)))]
        if rng.random() < model.link_share:
            if kind == "delete":  # a sentence with a link, where there is one
                linked = [index for index, sentence in enumerate(sentences) if "[[" in sentence]
                where = linked[int(rng.integers(len(linked)))] if linked else where
            else:
                words = new.split(" ")
                words.insert(int(rng.integers(len(words))), f"[[{titles[int(rng.integers(len(titles)))]}]]")
                new = " ".join(words)
        if kind == "insert":
            sentences.insert(where, new)
        elif kind == "replace":
            sentences[where] = new
        elif len(sentences) > 1:
            del sentences[where]
        lines[at] = " ".join(sentences)
    return "\n".join(lines)


def next_month(base: list[Page], model: EditModel, material: Material) -> tuple[list[Page], int]:
    """The pages a month later, and how many articles were edited, added or deleted."""
    rng = np.random.default_rng(model.seed)
    articles = [page for page in base if page.namespace == 0 and page.redirect is None]
    titles = [page.title for page in articles]
    changed, found = 0, []
    for page in base:
        if page.namespace == 0 and page.redirect is None:
            if rng.random() < model.deleted:
                changed += 1
                continue
            if rng.random() < model.edited:
                edits = int(rng.integers(model.edits[0], model.edits[1] + 1))
                page = Page(page.page_id, page.title, 0, edited_text(rng, page.text, edits, model, material, titles),
                            None)
                changed += 1
        elif page.redirect is not None and rng.random() < model.redirects:
            target = titles[int(rng.integers(len(titles)))]
            page = Page(page.page_id, page.title, 0, f"#REDIRECT [[{target}]]", target)
        found.append(page)
    next_id = max(page.page_id for page in base) + 1
    for number in range(round(model.new * len(articles))):
        source = articles[int(rng.integers(len(articles)))]
        found.append(Page(next_id + number, f"{source.title} (new {number})", 0, source.text, None))
        changed += 1
    return found, changed


def run_stages(dump: Path, output: Path, *refresh: str) -> dict[str, manifest.StageRecord]:
    """parse to index on ``dump`` with the no-op model (child processes; ``refresh``: the GPU stages' extra
    flags), the manifest's records."""
    model = minilm_path()
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(NO_OP_MODEL), str(REPO)]),
                   "HF_HUB_OFFLINE": "1"}
    stages = [["parse", "--dump", str(dump)], ["dictionary"], ["mentions"],
              ["embed-entities", "--model", model, *refresh],
              ["index", "--encoder", model, "--encoder-type", "mean", "--max-length", "256", *refresh]]
    for stage in stages:
        command = [sys.executable, str(REPO / "run_pipeline.py"), *stage, "--output", str(output),
                   "--runner=DirectRunner"]
        finished = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
        if finished.returncode != 0:
            raise SystemExit(f"`{' '.join(command)}` failed:\n{finished.stderr[-3000:]}")
    return manifest.load(str(output))


def keyed_rows(output: Path, artifact: str, columns: list[str]) -> set[tuple]:
    import pyarrow.parquet as pq

    return {tuple(row.values()) for path in sorted((output / artifact).glob("*.parquet"))
            for row in pq.read_table(path, columns=columns).to_pylist()}


def changed_share(old: Path, new: Path, artifact: str, columns: list[str]) -> float:
    """Share of the new run's rows of ``artifact`` (by ``columns``) that the old run did not have."""
    before, after = keyed_rows(old, artifact, columns), keyed_rows(new, artifact, columns)
    return len(after - before) / len(after)


@dataclass(frozen=True)
class Refresh:
    share: float
    articles_changed: int
    windows_changed: float
    mentions_redone: float
    passages_changed: float
    passages_redone: float


def measured(old: Path, new: Path, records: dict[str, manifest.StageRecord], share: float, changed: int) -> Refresh:
    embed, index = records["embed_entities"].counters, records["index"].counters
    return Refresh(share, changed,
                   changed_share(old, new, "mentions", ["page_id", "window_digest"]),
                   embed["mentions_encoded"] / embed["mentions_embedded"],
                   changed_share(old, new, "passages", ["passage_id", "title", "text"]),
                   index["passages_encoded"] / (index["passages_encoded"] + index["passages_reused"]))


def print_results(results: list[Refresh], articles: int, scratch: dict[str, manifest.StageRecord]) -> None:
    embed = scratch["embed_entities"].counters
    print(f"{articles:,} articles, {embed['mentions_embedded']:,} sampled mentions (512 tokens), "
          f"{scratch['index'].counters['passages_encoded']:,} passages; a refresh per edited share:")
    print("  edited  articles changed  windows changed  mention forwards redone  ratio  passages changed  "
          "passage forwards redone  ratio")
    for item in results:
        print(f"  {item.share:>6.0%}  {item.articles_changed:>16,}  {item.windows_changed:>15.1%}  "
              f"{item.mentions_redone:>23.1%}  {item.mentions_redone / item.windows_changed:>5.2f}  "
              f"{item.passages_changed:>16.1%}  {item.passages_redone:>23.1%}  "
              f"{item.passages_redone / item.passages_changed:>5.2f}")
    print(f"projected monthly English Wikipedia refresh on one H200 at its ceilings ({H200_MENTIONS_512:,.0f} "
          f"mentions/s at 512 tokens, {H200_DPR_PASSAGES:,.0f} DPR passages/s), {MENTIONS / 1e6:.0f}M mentions and "
          f"{PASSAGES / 1e6:.0f}M passages, at the shares measured here (from scratch: "
          f"{MENTIONS / H200_MENTIONS_512 / 3600:.1f} h + {PASSAGES / H200_DPR_PASSAGES / 3600:.2f} h):")
    for item in results:
        mentions = item.mentions_redone * MENTIONS / H200_MENTIONS_512 / 3600
        passages = item.passages_redone * PASSAGES / H200_DPR_PASSAGES / 3600
        print(f"  {item.share:>4.0%} of articles edited: {mentions:.1f} h of mentions + {passages:.2f} h of passages")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--articles", type=int, default=1000)
    parser.add_argument("--shares", type=float, nargs="+", default=[0.05, 0.2, 0.4], help="edited article shares")
    parser.add_argument("--edits", type=int, nargs=2, default=[1, 3], help="fewest and most edits per article")
    parser.add_argument("--link-share", type=float, default=1 / 3)
    parser.add_argument("--new", type=float, default=0.002)
    parser.add_argument("--deleted", type=float, default=0.0005)
    parser.add_argument("--redirects", type=float, default=0.001)
    parser.add_argument("--work", type=Path, help="directory for dumps and runs (default: a temporary one)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as temporary:
        root = args.work or Path(temporary)
        material = sample_material()
        shape = Shape(args.articles)
        base_dump = synthetic_dump(shape, root / "dump-0", material)
        base = list(pages(shape, link_graph(shape, material.words), material))
        old = root / "run-0"
        shutil.rmtree(old, ignore_errors=True)
        scratch = run_stages(base_dump.dump, old)
        results = []
        for share in args.shares:
            model = EditModel(share, tuple(args.edits), args.link_share, args.new, args.deleted, args.redirects)
            edited, changed = next_month(base, model, material)
            directory = root / f"dump-{share:g}"
            directory.mkdir(parents=True, exist_ok=True)
            write_multistream(material.header, (page.xml() for page in edited), material.footer, directory)
            new = root / f"run-{share:g}"
            shutil.rmtree(new, ignore_errors=True)
            records = run_stages(directory / base_dump.dump.name, new, "--previous", str(old))
            results.append(measured(old, new, records, share, changed))
    print_results(results, args.articles, scratch)


if __name__ == "__main__":
    main()
