"""Benchmark a dump refresh: what a refresh recomputes and what it saves.

Builds two versions of one wiki (tests/dump_versions.py: the gensim sample, with articles edited, removed and
added between the two, real pywikibot revisions among them), runs `all` on the old one, then on the new one
from scratch and as a refresh with `--previous` (tiny random BERT, CPU, the settings of the tests), and prints:

- the share of entities and passages the refresh recomputed (measured, from the manifest's counters);
- the wall time of embed-entities, index and the whole run, from scratch vs refreshed (measured; small and on
  a shared CPU, so dominated by fixed costs: model loading, Beam start-up);
- projected GPU-hours saved per monthly English Wikipedia refresh: ESTIMATES from the assumptions printed with
  them (the GPU rates are FLOP counts at an assumed utilization, not measurements; the monthly change rate is an
  assumption, not a measured Wikipedia figure: pass --changed-share and the rates to project other cases).

    python -m bench.refresh [--work DIR]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.common import run_cli

ENTITIES = 7_000_000  # English Wikipedia entities (DESIGN.md)
LINKS = 150_000_000  # English Wikipedia links (DESIGN.md): sampled mentions are at most this many
PASSAGES = 21_015_324  # DPR psgs_w100 passages (DESIGN.md)
BERT_BASE_PARAMS = 85_000_000  # non-embedding parameters of BERT-base
H100_BF16_TFLOPS = 989.0  # dense peak
ASSUMED_UTILIZATION = 0.4  # assumed model FLOP utilization of the encoders on an H100 (an estimate)


@dataclass(frozen=True)
class Run:
    seconds: float
    stage_seconds: dict[str, float]
    counters: dict[str, dict[str, int]]


def run_all(dump: Path, output: Path, model: Path, *extra: str) -> Run:
    """`all` on ``dump`` with the settings of the tests (tests/builders.py), in this process."""
    from artifacts.run import manifest
    from tests.builders import ALL_OPTIONS

    seconds = run_cli("all", "--dump", str(dump), "--output", str(output), "--model", str(model), "--encoder",
                      str(model), *ALL_OPTIONS, "--no-report", *extra)
    records = manifest.load(str(output))
    return Run(seconds, {name: record.wall_time_s for name, record in records.items()},
               {name: record.counters for name, record in records.items()})


def bert_base_flops(tokens: int) -> float:
    """Forward FLOPs of BERT-base on one sequence: 2 x parameters x tokens + attention 4 x layers x seq^2 x hidden."""
    return 2 * BERT_BASE_PARAMS * tokens + 4 * 12 * tokens ** 2 * 768


def estimated_rate(tokens: int) -> float:
    """Sequences per second on one H100 at the assumed utilization (an estimate, not a measurement)."""
    return H100_BF16_TFLOPS * 1e12 * ASSUMED_UTILIZATION / bert_base_flops(tokens)


def shares(refreshed: Run) -> tuple[float, float]:
    embed, index = refreshed.counters["embed_entities"], refreshed.counters["index"]
    entity_share = embed["entities_recomputed"] / (embed["entities_recomputed"] + embed["entities_reused"])
    passage_share = index["passages_encoded"] / (index["passages_encoded"] + index["passages_reused"])
    return entity_share, passage_share


def article_change_share(changed_titles: int, new: Path) -> float:
    """Articles edited, removed or added between the two dumps, as a share of the new run's articles."""
    import pyarrow.parquet as pq

    articles = sum(pq.ParquetFile(path).metadata.num_rows for path in (new / "articles").glob("*.parquet"))
    return changed_titles / articles


def print_measured(scratch: Run, refreshed: Run, sample_share: float) -> None:
    embed, index = refreshed.counters["embed_entities"], refreshed.counters["index"]
    entity_share, passage_share = shares(refreshed)
    print(f"measured on the sample ({sample_share:.1%} of articles added, removed or edited):")
    print(f"  entities recomputed: {embed['entities_recomputed']:,} of "
          f"{embed['entities_recomputed'] + embed['entities_reused']:,} ({entity_share:.1%})")
    print(f"  passages encoded:    {index['passages_encoded']:,} of "
          f"{index['passages_encoded'] + index['passages_reused']:,} ({passage_share:.1%})")
    print("  wall time            from scratch   refreshed")
    for stage in ("embed_entities", "index"):
        print(f"  {stage:<20} {scratch.stage_seconds[stage]:>11.1f}s {refreshed.stage_seconds[stage]:>10.1f}s")
    print(f"  {'all (parse..index)':<20} {scratch.seconds:>11.1f}s {refreshed.seconds:>10.1f}s")


def mention_change_share(old: Path, new: Path) -> float:
    """Share of the new run's mention rows (entity key, page, span, window) that the old run did not have."""
    import pyarrow.parquet as pq

    def keyed(output: Path) -> set[tuple]:
        entities = {row["entity_id"]: row["qid"] or row["title"] for path in (output / "entities").glob("*.parquet")
                    for row in pq.read_table(path).to_pylist()}
        return {(entities[row["entity_id"]], row["page_id"], row["start"], row["end"], row["window_digest"])
                for path in (output / "mentions").glob("*.parquet") for row in pq.read_table(path).to_pylist()}

    before, after = keyed(old), keyed(new)
    return len(after - before) / len(after)


def print_projection(entity_share: float, passage_share: float, mention_share: float, sample_share: float,
                     args: argparse.Namespace) -> None:
    mentions = min(LINKS, ENTITIES * 128)
    scale = args.changed_share / sample_share
    per_entity = mentions / ENTITIES
    # An entity is recomputed when any of its sampled mentions changed: with ~21 mentions per entity in full
    # Wikipedia (1.1 in the sample) this is far more than the sample's entity share.
    entity_share = 1 - (1 - min(1.0, mention_share * scale)) ** per_entity
    entity_hours = mentions / args.mention_rate / 3600
    passage_hours = PASSAGES / args.passage_rate / 3600
    print("projected per monthly English Wikipedia refresh (ESTIMATES):")
    print(f"  assumed: {mentions:,} sampled mentions (upper bound: every one of ~150M links sampled once, "
          f"7M entities x cap 128), {PASSAGES:,} passages, BERT-base on one H100 at {args.mention_rate:,.0f} "
          f"mentions/s (512 tokens) and {args.passage_rate:,.0f} passages/s (256 tokens): FLOP counts at "
          f"{ASSUMED_UTILIZATION:.0%} of the bf16 peak, not measured")
    print(f"  assumed: {args.changed_share:.0%} of articles change per month (an assumption, not a measured "
          f"Wikipedia figure); changed mentions and passages scale with it from the sample's {mention_share:.1%} of "
          f"mentions and {passage_share:.1%} of passages at {sample_share:.1%}; an entity is recomputed when any "
          f"of its {per_entity:.0f} sampled mentions (mean, assumed) changed: {entity_share:.1%} of entities, "
          f"{min(1.0, passage_share * scale):.1%} of passages")
    entity_saved = entity_hours * (1 - entity_share)
    passage_saved = passage_hours * (1 - min(1.0, passage_share * scale))
    print(f"  from scratch: {entity_hours:.1f} GPU-h entities + {passage_hours:.1f} GPU-h passages")
    print(f"  saved by a refresh: {entity_saved:.1f} + {passage_saved:.1f} = {entity_saved + passage_saved:.1f} "
          "GPU-h (estimate)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", help="directory for the dumps and runs (default: a temporary one)")
    parser.add_argument("--changed-share", type=float, default=0.12,
                        help="assumed share of articles changed per month (default %(default)s)")
    parser.add_argument("--mention-rate", type=float, default=estimated_rate(512), help="mentions/s per GPU")
    parser.add_argument("--passage-rate", type=float, default=estimated_rate(256), help="passages/s per GPU")
    args = parser.parse_args()
    from tests.conftest import write_tiny_bert
    from tests.dump_versions import write_dump_versions

    with tempfile.TemporaryDirectory() as temporary:
        root = Path(args.work or temporary)
        for previous in ("old", "scratch", "refreshed"):  # timings are of full runs, never resumed ones
            shutil.rmtree(root / previous, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
        dumps, model = write_dump_versions(root / "dumps"), write_tiny_bert(root / "tiny-bert")
        old = root / "old"
        run_all(dumps.old, old, model)
        scratch = run_all(dumps.new, root / "scratch", model)
        refreshed = run_all(dumps.new, root / "refreshed", model, "--previous", str(old))
        mention_share = mention_change_share(old, root / "refreshed")
        changed = len(dumps.edited) + len(dumps.removed) + len(dumps.added)
        sample_share = article_change_share(changed, root / "refreshed")
    print_measured(scratch, refreshed, sample_share)
    print(f"  mention rows changed or new: {mention_share:.1%}")
    print_projection(*shares(refreshed), mention_share, sample_share, args)


if __name__ == "__main__":
    main()
