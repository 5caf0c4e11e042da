"""The KPR encoder path in bench/gpu.py (issue 10): the linker alone on the CPU, the KPR passage path and the index
stage with ``--encoder-type kpr``, against the ceiling of the dense passages (same model, dtype and mean length:
KPR tokenizes title and text as a pair, like DPR). The KPR checkpoint is the bench's model with random fusion
weights; the linker and entity embeddings are an OUT's own (dictionary/linker, entity_embeddings/)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from bench.measure import Rate, index_stage, passage_paths, timed


@dataclass(frozen=True)
class DenseRun:
    """What the dense passage lines measured, reused by the KPR lines: the timed passages, the corpus file the
    index stage read, its mean length in tokens and the ceiling there."""

    passages: list
    corpus: Path
    mean_length: float
    ceiling: Rate


def kpr_checkpoint(model_path: str, output: str, directory: str) -> str:
    """A KPR checkpoint of ``model_path`` (random fusion weights) sized for the entity embeddings of ``output``."""
    import pyarrow.parquet as pq

    from artifacts import layout
    from encoders.kpr_checkpoint import init_kpr_checkpoint
    from encoders.kpr_config import KPRSettings
    from encoders.kpr_entities import embedding_files

    schema = pq.read_schema(embedding_files(str(Path(output) / layout.ENTITY_EMBEDDINGS))[0])
    dim = schema.field("embedding").type.list_size
    init_kpr_checkpoint(model_path, directory, KPRSettings(entity_embedding_size=dim))
    return directory


def linker_rate(linker_path: str, passages: list) -> Rate:
    """Passages/s of the linker alone (title and text, one CPU thread): what each worker process adds to a
    dense encoder's inputs (the workers link in parallel, each beside its own model)."""
    from artifacts.linker import EntityLinker

    linker = EntityLinker.load(linker_path)
    linker.detect_batch([passage.text for passage in passages[:16]])  # warm-up: tries, tokenizer
    titles, texts = [passage.title for passage in passages], [passage.text for passage in passages]
    return timed(lambda: (linker.detect_batch(titles), linker.detect_batch(texts)), len(passages), "cpu")


def report_kpr(args, options, model_path: str, output: str, dense: DenseRun) -> None:
    """Print the KPR lines; ``options``: the dense passage path's encoder options (runtime flags), ``output``: an
    OUT with dictionary/linker and entity_embeddings/ (the index stage writes its index there)."""
    from artifacts import layout

    checkpoint = kpr_checkpoint(model_path, output, str(Path(dense.corpus).parent / "kpr-checkpoint"))
    kpr = replace(options, kind="kpr", model=checkpoint, linker=layout.LINKER,
                  entity_embeddings=layout.ENTITY_EMBEDDINGS).located(output)
    linker = linker_rate(kpr.linker, dense.passages)
    inputs, path, _, _ = passage_paths(kpr, dense.passages)
    stage, busy = index_stage(args, checkpoint, dense.corpus, args.passages, output, "--encoder-type", "kpr")
    top = dense.ceiling.per_second
    print(f"kpr passages at {dense.mean_length:.0f} tokens (mean): ceiling {top:,.1f} seq/s | linker alone "
          f"{linker.per_second:,.1f} passages/s (1 CPU thread) | KPR inputs built {inputs.per_second:,.1f}/s (one "
          f"process) | KPR forward path {path.per_second:,.1f}/s "
          f"({path.items:,}) | index stage --encoder-type kpr {stage.per_second:,.1f}/s ({stage.items:,} passages, "
          f"Flat, {stage.seconds:.1f} s, model load included)")
    print(f"  ratios: path/ceiling {path.per_second / top:.0%}, stage/ceiling {stage.per_second / top:.0%}, "
          f"stage/encoder {stage.per_second / path.per_second:.2f}, linker/ceiling {linker.per_second / top:.2f}x; "
          f"GPU busy during the stage: {busy}")
