"""index: a passage corpus encoded by a dense retriever into sharded FAISS indexes under OUT/index/.

Two Beam pipelines. The first reads the corpus (DPR's psgs_w100.tsv, or ~100-word passages cut from
OUT/articles), drops malformed rows and duplicate ids (counted, dead-lettered), encodes every passage through
RunInference and writes the vectors by shard (a hash of the passage id) with the passage ids, plus the
training sample (the passages with the smallest hash keys). Between the two, the index type and its memory are
decided from the exact count. The second trains the index once on the sample, then adds every shard in
parallel (FAISS ids = passage ids) and writes the shard files, their id maps and index.json.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.ml.inference.base import PredictionResult, RunInference

from artifacts import faiss_shards, fs, layout, schemas, tables
from artifacts.errors import InputError
from artifacts.passages import Passage, shard_of
from artifacts.run import manifest
from encoders.loading import PassageEncoderHandler, check_encoder_options
from encoders.models import model_files
from encoders.retrievers import KINDS, SIMILARITIES, TITLE_MODES, EncoderOptions, dense_dim
from pipelines import flags
from pipelines.refresh import RefreshConfig, fingerprint_changes, previous_options, reusable_previous
from pipelines.stage import StageContext, run_beam
from transforms.dead_letters import WriteDeadLetters, count, dead_letter
from transforms.dump_io import matching_files
from transforms.dump_reader import ARCHIVE_ERRORS, open_xml
from transforms.passages import (
    DUPLICATE_KEEPS,
    MAX_REPORTED_CHARS,
    BadRow,
    article_passages,
    decode_corpus_line,
    header_columns,
    parse_dpr_row,
    pick_duplicate,
    sample_key,
    too_many_chunks,
)
from transforms.refresh import SplitPassagesForRefresh, option_changes

PASSAGES_SCHEMA_FIELDS = ("passage_id", "title", "text")


def add_encoder_arguments(parser: argparse.ArgumentParser) -> None:
    """The encoder options (shared with search and evaluate, which may override the runtime ones)."""
    group = parser.add_argument_group("encoder")
    group.add_argument("--encoder", help="local directory or hub name of the passage encoder")
    group.add_argument("--encoder-type", choices=KINDS, default="dpr",
                       help="dpr: [CLS] title [SEP] text [SEP], CLS, dot; bge: CLS, cosine, query instruction; "
                       "mean: mean pooling, cosine; kpr: KPR checkpoint with entity fusion")
    group.add_argument("--query-encoder", help="a separate question encoder (default: --encoder)")
    group.add_argument("--similarity", choices=SIMILARITIES, help="override the encoder type's similarity")
    group.add_argument("--title-mode", choices=TITLE_MODES,
                       help="pair: title and text as a sentence pair; join: 'title text'; none: text only")
    group.add_argument("--query-prefix", help="text put before every query (bge: its instruction)")
    group.add_argument("--passage-prefix", default="", help="text put before every passage")
    group.add_argument("--max-length", type=int, default=256, help="tokens per passage or query")
    group.add_argument("--max-entities", type=int, default=128, help="kpr: entity inputs per text")


def encoder_options(args: argparse.Namespace) -> EncoderOptions:
    if not args.encoder:
        raise InputError("index needs --encoder NAME_OR_PATH (a dense retriever or a KPR checkpoint)")
    linker = entity_embeddings = ""
    if args.encoder_type == "kpr":
        linker = fs.join(args.output, layout.LINKER)
        entity_embeddings = fs.join(args.output, layout.ENTITY_EMBEDDINGS)
    return EncoderOptions(
        kind=args.encoder_type, model=str(args.encoder), query_model=args.query_encoder,
        similarity=args.similarity or "", title=args.title_mode or "", query_prefix=args.query_prefix,
        passage_prefix=args.passage_prefix, max_length=args.max_length, device=args.device, dtype=args.dtype,
        batch_tokens=args.batch_tokens, linker=linker, entity_embeddings=entity_embeddings,
        max_entities=args.max_entities)


# --- element functions ---------------------------------------------------------------------------------------


def corpus_lines(path: str) -> Iterator[tuple[str, int, bytes]]:
    """The lines after the header of one corpus file as bytes, with their line numbers. One worker reads a file
    from its start, so that dead letters and the duplicate rule know each row's file and line."""
    with open_xml(path) as handle:  # Python's own gzip/bz2 readers: a cut-short archive raises, Beam's ends quietly
        number = 1
        try:
            handle.readline()
            while raw := handle.readline():
                number += 1
                yield path, number, raw
        except ARCHIVE_ERRORS as error:
            raise InputError(f"{path}: truncated or corrupt archive after line {number}: "
                             f"{str(error).strip().splitlines()[0]}") from error


def parsed_row(source: str, number: int, raw: bytes, columns: tuple[int, int, int] = (0, 1, 2)) -> Iterator[Any]:
    """One corpus line -> ((file, line), Passage), or a dead letter naming the file and line."""
    where = {"source": source, "line_number": number}
    try:
        line, had_nul = decode_corpus_line(raw)
    except UnicodeDecodeError as error:
        yield dead_letter("invalid_utf8", f"not UTF-8 at byte {error.start}: {error.reason}", **where,
                          line=raw.rstrip(b"\r\n")[:MAX_REPORTED_CHARS].decode("utf-8", errors="replace"))
        return
    if had_nul:
        count("passages_with_nul_bytes")  # cleaned, not dropped: the NULs are removed from the row
    row = parse_dpr_row(line, columns)
    if isinstance(row, BadRow):
        yield dead_letter(row.reason, row.detail, **where, line=row.line)
        return
    count("passages_read")
    yield (source, number), row


def cut_article(article: dict[str, Any], words_per_passage: int) -> Iterator[Any]:
    text = article["text"] or ""
    if not text.strip():
        count("articles_without_text")
        return
    if too_many_chunks(text, words_per_passage):
        yield dead_letter("too_long_articles", "more words than passage ids per page allow",
                          page_id=article["page_id"], title=article["title"])
    passages = article_passages(article["page_id"], article["title"], text, words_per_passage)
    count("passages_read", len(passages))
    for passage in passages:  # ids are unique by construction: the position only matches the corpus rows'
        yield ("", 0), passage


def unique_passage(passage_id: int, rows: list[tuple[tuple[str, int], Passage]], keep: str = "first"
                   ) -> Iterator[Any]:
    ((kept_source, kept_line), kept), others = pick_duplicate(list(rows), keep)
    for (source, number), other in others:
        yield dead_letter("duplicate_ids", f"line {kept_line} of {kept_source} has this id (the {keep} row is kept)",
                          passage_id=passage_id, source=source, line_number=number, title=other.title,
                          text=other.text[:MAX_REPORTED_CHARS])
    yield kept


def encoded_row(result: PredictionResult, shards: int) -> Iterator[Any]:
    passage, vector = result.example, np.asarray(result.inference, dtype=np.float32)
    if not np.all(np.isfinite(vector)):
        yield dead_letter("non_finite_vectors", "the encoder returned NaN or inf", passage_id=passage.passage_id)
        return
    count("passages_encoded")
    yield shard_of(passage.passage_id, shards), (passage.passage_id, passage.title, passage.text, vector)


def under_threshold(keyed: tuple[int, Any], threshold: int | None) -> bool:
    return threshold is not None and sample_key(keyed[1][0]) <= threshold


def sample_row(keyed: tuple[int, tuple]) -> tuple[int, int, np.ndarray]:
    passage_id, vector = keyed[1][0], keyed[1][3]
    return sample_key(passage_id), passage_id, vector


def largest_or_none(keys: list[int]) -> int | None:
    return max(keys) if keys else None


class WriteVectorTables(beam.PTransform):
    """Rows -> Arrow tables of a few thousand rows -> Parquet files under ``prefix``."""

    def __init__(self, prefix: str, to_table, schema) -> None:
        super().__init__()
        self._prefix, self._to_table, self._schema = prefix, to_table, schema

    def expand(self, rows: beam.PCollection) -> beam.pvalue.PDone:
        return (rows
                | "Batch" >> beam.BatchElements(min_batch_size=64, max_batch_size=4096)
                | "ToTable" >> beam.Map(self._to_table)
                | "WriteParquet" >> beam.io.parquetio.WriteToParquetBatched(
                    self._prefix, self._schema, file_name_suffix=".parquet", codec=schemas.PARQUET_CODEC))


class ReadPassages(beam.PTransform):
    """The corpus (DPR TSV files, or articles cut into passages) as unique passages; tagged ``dead_letter``:
    malformed rows (invalid UTF-8 included) and duplicate ids, each with its file and line. Of rows sharing an
    id, the first in file and line order is kept (``keep="last"``: the last)."""

    def __init__(self, corpus: str | None, columns: tuple[int, int, int] | None, output: str,
                 words_per_passage: int, keep: str = "first") -> None:
        super().__init__()
        self._corpus, self._columns = corpus, columns
        self._output, self._words, self._keep = output, words_per_passage, keep

    def expand(self, pipeline: beam.Pipeline) -> tuple[beam.PCollection, beam.PCollection]:
        if self._columns is not None:
            rows = (pipeline
                    | "CorpusPattern" >> beam.Create([self._corpus])
                    | "CorpusFiles" >> beam.FlatMap(matching_files)
                    | "SpreadFiles" >> beam.Reshuffle()
                    | "ReadCorpus" >> beam.FlatMap(corpus_lines)
                    | "SpreadLines" >> beam.Reshuffle()
                    | "ParseRows" >> beam.FlatMapTuple(parsed_row, self._columns).with_outputs(
                        "dead_letter", main="passages"))
        else:
            rows = (pipeline
                    | "ReadArticles" >> beam.io.ReadFromParquet(tables.parquet_pattern(self._output, layout.ARTICLES),
                                                                columns=["page_id", "title", "text"])
                    | "CutPassages" >> beam.FlatMap(cut_article, self._words).with_outputs(
                        "dead_letter", main="passages"))
        unique = (rows.passages
                  | "ById" >> beam.MapTuple(lambda position, passage: (passage.passage_id, (position, passage)))
                  | "GroupById" >> beam.GroupByKey()
                  | "DropDuplicateIds" >> beam.FlatMapTuple(unique_passage, self._keep).with_outputs(
                      "dead_letter", main="passages"))
        dead = (rows.dead_letter, unique.dead_letter) | "DeadLetters" >> beam.Flatten()
        return unique.passages, dead


class WriteShards(beam.PTransform):
    """(shard, row) -> ``embeddings/shard-NNNNN/*.parquet`` per shard."""

    def __init__(self, index_dir: str, shards: int, dim: int) -> None:
        super().__init__()
        self._index_dir, self._shards, self._dim = index_dir, shards, dim

    def expand(self, rows: beam.PCollection) -> None:
        dim = self._dim
        by_shard = rows | "SplitShards" >> beam.Partition(lambda keyed, shards: keyed[0], self._shards)
        for shard, rows_of_shard in enumerate(by_shard):
            name = faiss_shards.shard_name(shard)
            _ = (rows_of_shard | f"{name}Rows" >> beam.Map(lambda keyed: keyed[1])
                 | f"Write{name}" >> WriteVectorTables(
                     fs.join(self._index_dir, faiss_shards.EMBEDDINGS_DIR, name, "part"),
                     lambda batch: faiss_shards.embedding_table(batch, dim), faiss_shards.embedding_schema(dim)))


class WriteTrainingSample(beam.PTransform):
    """The rows with the MAX_TRAIN_SAMPLE smallest sample keys -> ``train_sample/*.parquet`` (two passes: the
    keys alone find the threshold, then the rows under it are written)."""

    def __init__(self, index_dir: str, dim: int) -> None:
        super().__init__()
        self._index_dir, self._dim = index_dir, dim

    def expand(self, rows: beam.PCollection) -> None:
        dim = self._dim
        threshold = (rows | "SampleKeys" >> beam.Map(lambda keyed: sample_key(keyed[1][0]))
                     | "SmallestKeys" >> beam.combiners.Top.Smallest(faiss_shards.MAX_TRAIN_SAMPLE)
                     | "Threshold" >> beam.Map(largest_or_none))
        _ = (rows
             | "InSample" >> beam.Filter(under_threshold, beam.pvalue.AsSingleton(threshold))
             | "SampleRows" >> beam.Map(sample_row)
             | "WriteSample" >> WriteVectorTables(
                 fs.join(self._index_dir, faiss_shards.TRAIN_SAMPLE_DIR, "part"),
                 lambda batch: faiss_shards.train_sample_table(batch, dim), faiss_shards.train_sample_schema(dim)))


class BuildShard(beam.DoFn):
    """One shard: the trained index, the shard's vectors added in chunks, the shard file and its id map."""

    def __init__(self, index_dir: str, use_gpu: bool) -> None:
        self._index_dir = index_dir
        self._use_gpu = use_gpu

    def process(self, shard: str, trained_path: str) -> Iterator[dict[str, Any]]:
        summary = faiss_shards.build_shard(self._index_dir, shard, trained_path, self._use_gpu)
        count("shards_built")
        yield summary


def train_once(_: Any, index_dir: str, factory: str, dim: int, sample_size: int, use_gpu: bool) -> str:
    """Train the index on the sample (in a worker) and write trained.faiss; returns its path."""
    sample = faiss_shards.read_train_sample(fs.join(index_dir, faiss_shards.TRAIN_SAMPLE_DIR), sample_size)
    index = faiss_shards.train_index(factory, dim, sample.reshape(-1, dim), use_gpu)
    path = fs.join(index_dir, faiss_shards.TRAINED_NAME)
    faiss_shards.write_index(index, path)
    return path


def write_index_json(summaries: list[dict[str, Any]], index_dir: str, info: dict[str, Any]) -> None:
    shard_files = sorted(summaries, key=lambda item: item["name"])
    info = {**info, "shard_files": shard_files, "count": sum(item["count"] for item in shard_files)}
    fs.write_json_atomic(fs.join(index_dir, faiss_shards.INDEX_JSON), faiss_shards.IndexInfo(**info).to_json())


# --- the stage -----------------------------------------------------------------------------------------------


def check_corpus(pattern: str) -> tuple[int, int, int]:
    """Every file of the corpus exists and starts with the DPR header; returns the column positions."""
    matches = FileSystems.match([pattern])[0].metadata_list
    if not matches:
        raise InputError(f"corpus {pattern} not found")
    columns = None
    for match in sorted(matches, key=lambda item: item.path):
        with FileSystems.open(match.path, compression_type=CompressionTypes.AUTO) as handle:
            header = handle.readline().decode("utf-8", errors="replace")
        try:
            found = header_columns(header)
        except ValueError as error:
            raise InputError(f"{match.path}: {error}") from error
        if columns is not None and found != columns:
            raise InputError(f"{match.path}: its header orders the columns differently from the other files")
        columns = found
    return columns


class IndexStage:
    """Encode a passage corpus with a dense retriever and build sharded FAISS indexes."""

    name = layout.INDEX_STAGE
    outputs = (layout.INDEX, layout.PASSAGES)
    flag_groups = (flags.RUNTIME, flags.REFRESH)

    def config(self, args: argparse.Namespace) -> argparse.Namespace:
        return args  # transitional: the flags themselves until this stage has its frozen config

    def upstream(self, args: argparse.Namespace) -> tuple[str, ...]:
        """Passages cut from the dump read parse's articles; a KPR encoder reads the linker and embeddings."""
        stages = () if args.corpus else (layout.PARSE_STAGE,)
        return stages + ((layout.DICTIONARY_STAGE, layout.EMBED_ENTITIES_STAGE) if args.encoder_type == "kpr" else ())

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_encoder_arguments(parser)
        group = parser.add_argument_group("index")
        group.add_argument("--corpus", help="DPR passage file(s) (psgs_w100.tsv; a path or glob, .gz allowed); "
                           "default: passages cut from OUT/articles")
        group.add_argument("--words-per-passage", type=int, default=100, help="without --corpus: words per passage")
        group.add_argument("--on-duplicate-id", choices=DUPLICATE_KEEPS, default="first",
                           help="of corpus rows sharing an id, keep the first or the last (file and line order); "
                           "the others are dead-lettered")
        group.add_argument("--shards", type=int, default=1, help="FAISS shards (passages hashed by id)")
        group.add_argument("--index-factory", help="FAISS factory string (default: chosen by corpus size)")
        group.add_argument("--no-faiss-gpu", action="store_true", help="train and add on the CPU even with a GPU")

    def options(self, args: argparse.Namespace) -> dict[str, Any]:
        encoder = encoder_options(args).to_json()
        for runtime in ("device", "batch_tokens", "linker", "entity_embeddings"):
            encoder.pop(runtime)
        return {"encoder": encoder, "corpus": args.corpus, "words_per_passage": args.words_per_passage,
                "on_duplicate_id": args.on_duplicate_id, "shards": args.shards, "index_factory": args.index_factory,
                **previous_options(RefreshConfig.from_args(args))}

    def external_inputs(self, args: argparse.Namespace) -> dict[str, str]:
        inputs = {"corpus": args.corpus} if args.corpus else {}
        return {**inputs, **model_files({"encoder": args.encoder, "query_encoder": args.query_encoder})}

    def run(self, ctx: StageContext, args: argparse.Namespace) -> dict[str, int]:
        if args.shards < 1:
            raise InputError(f"--shards must be at least 1, got {args.shards}")
        if args.words_per_passage < 1:
            raise InputError(f"--words-per-passage must be at least 1, got {args.words_per_passage}")
        options = encoder_options(args)
        check_encoder_options(options)
        options = options.resolved()
        dim = dense_dim(options)
        columns = check_corpus(args.corpus) if args.corpus else None
        if columns is None and not fs.list_files(tables.artifact_dir(args.output, layout.ARTICLES), "*.parquet"):
            raise InputError(f"no --corpus and no articles under {args.output}: "
                             "run `python run_pipeline.py parse` first or pass --corpus psgs_w100.tsv")
        index_dir = ctx.staged(layout.INDEX)
        previous = reusable_previous(RefreshConfig.from_args(args), self.name, (layout.INDEX_STAGE,),
                                     lambda old: incompatibility(old, args, options))
        counters = run_beam(ctx, lambda pipeline: self._encode(pipeline, ctx, args, options, dim, columns, previous))
        counters = {**counters, **self._build(ctx, args, options, dim, index_dir, previous)}
        return {"passages_reused": 0, "passages_encoded": 0, **counters} if args.previous else counters

    def _encode(self, pipeline: beam.Pipeline, ctx: StageContext, args: argparse.Namespace,
                options: EncoderOptions, dim: int, columns: tuple[int, int, int] | None,
                previous: str | None = None) -> None:
        index_dir = ctx.staged(layout.INDEX)
        passages, dead = pipeline | "ReadPassages" >> ReadPassages(args.corpus, columns, args.output,
                                                                   args.words_per_passage, args.on_duplicate_id)
        if columns is None:
            _ = (passages | "PassageRows" >> beam.Map(Passage.to_row)
                 | "WritePassages" >> beam.io.WriteToParquet(
                     ctx.staged_prefix(layout.PASSAGES), _passages_schema(), file_name_suffix=".parquet",
                     codec=schemas.PARQUET_CODEC))

        passages, reused = split_for_refresh(passages, previous, args.shards)
        encoded = (passages
                   | "Encode" >> RunInference(PassageEncoderHandler(options, count=count))
                   | "Progress" >> ctx.progress("passages")
                   | "KeepFinite" >> beam.FlatMap(encoded_row, args.shards).with_outputs("dead_letter", main="rows"))
        rows = encoded.rows if reused is None else (encoded.rows, reused) | "WithReused" >> beam.Flatten()
        _ = rows | "WriteShards" >> WriteShards(index_dir, args.shards, dim)
        _ = ((dead, encoded.dead_letter) | "AllDeadLetters" >> beam.Flatten()
             | "WriteDeadLetters" >> WriteDeadLetters(ctx.errors_prefix("passages")))
        if not args.index_factory or faiss_shards.needs_training(args.index_factory, dim):
            _ = rows | "TrainingSample" >> WriteTrainingSample(index_dir, dim)

    def _build(self, ctx: StageContext, args: argparse.Namespace, options: EncoderOptions, dim: int,
               index_dir: str, previous: str | None = None) -> dict[str, int]:
        shards = [faiss_shards.shard_name(shard) for shard in range(args.shards)
                  if faiss_shards.shard_embedding_files(index_dir, faiss_shards.shard_name(shard))]
        total = sum(tables.parquet_row_count(path) for shard in shards
                    for path in faiss_shards.shard_embedding_files(index_dir, shard))
        if total == 0:
            raise InputError(f"no passage of {args.corpus or 'OUT/articles'} could be encoded: "
                             f"see {fs.join(args.output, 'errors', self.name)}")
        factory = args.index_factory or faiss_shards.default_factory(total, dim)
        faiss_shards.check_factory(factory, total, dim)
        sample_size = faiss_shards.training_sample_size(factory, total, dim)
        estimate = faiss_shards.memory_estimate(factory, total, dim)
        print(f"[{self.name}] {total:,} passages x {dim} dims, {len(shards)} shard(s): {factory}, "
              f"{estimate.describe(len(shards))}", file=sys.stderr)
        info = {"factory": factory, "metric": options.similarity, "dim": dim, "count": total, "shards": args.shards,
                "encoder": options.to_json(), "train_sample": sample_size}
        use_gpu = not args.no_faiss_gpu
        reused_trained = previous_quantizer(previous, index_dir, factory, dim) if sample_size else None

        def build(pipeline: beam.Pipeline) -> None:
            trained = (pipeline | "Once" >> beam.Create([None])
                       | "Train" >> beam.Map(train_once, index_dir, factory, dim, sample_size, use_gpu)
                       ) if reused_trained is None else pipeline | "ReusedTrained" >> beam.Create([reused_trained])
            summaries = (pipeline | "Shards" >> beam.Create(shards)
                         | "Spread" >> beam.Reshuffle()
                         | "BuildShards" >> beam.ParDo(BuildShard(index_dir, use_gpu),
                                                       beam.pvalue.AsSingleton(trained)))
            _ = (summaries | "AllShards" >> beam.combiners.ToList()
                 | "WriteIndexJson" >> beam.Map(write_index_json, index_dir, info))

        counters = run_beam(ctx, build)
        fs.delete_tree(fs.join(index_dir, faiss_shards.TRAIN_SAMPLE_DIR))
        return {**counters, "passages_indexed": total, "train_sample": sample_size}


# --- refresh (--previous): vectors of unchanged passages come from the previous run ---------------------------


def incompatibility(old: dict[str, manifest.StageRecord], args: argparse.Namespace,
                    options: EncoderOptions) -> str | None:
    """Why the previous run's passage vectors differ from what this encoder computes (None: they do not)."""
    if options.kind == "kpr":
        return "KPR passage vectors depend on this run's entity embeddings"
    changes = option_changes(old[layout.INDEX_STAGE].options.get("encoder", {}), STAGE.options(args)["encoder"])
    changes += [f"{role}: model files changed" for role in
                fingerprint_changes(old[layout.INDEX_STAGE], STAGE.external_inputs(args))]
    return f"it was built with another encoder ({'; '.join(changes)})" if changes else None


def reused_row(row: dict[str, Any], shards: int) -> tuple[int, tuple[int, str, str, np.ndarray]]:
    vector = np.asarray(row["embedding"], dtype=np.float32)
    return shard_of(row["passage_id"], shards), (row["passage_id"], row["title"], row["text"], vector)


def split_for_refresh(passages: beam.PCollection, previous: str | None,
                      shards: int) -> tuple[beam.PCollection, beam.PCollection | None]:
    """(passages to encode, reused (shard, row) pairs or None)."""
    if previous is None:
        return passages, None
    pattern = fs.join(previous, layout.INDEX, faiss_shards.EMBEDDINGS_DIR, "*", "*.parquet")
    old = passages.pipeline | "ReadOldVectors" >> beam.io.ReadFromParquet(pattern)
    split = {"passages": passages, "old_vectors": old} | "SplitForRefresh" >> SplitPassagesForRefresh()
    return split["encode"], split["reused"] | "ReusedRows" >> beam.Map(reused_row, shards)


def previous_quantizer(previous: str | None, index_dir: str, factory: str, dim: int) -> str | None:
    """The previous run's trained index copied into ``index_dir`` when its factory and dimension agree;
    None (and a line saying why the quantizer is trained again) otherwise."""
    if previous is None:
        return None
    info = faiss_shards.load_index_info(fs.join(previous, layout.INDEX))
    source = fs.join(previous, layout.INDEX, faiss_shards.TRAINED_NAME)
    if (info.factory, info.dim) != (factory, dim) or not fs.exists(source):
        print(f"[index] training the quantizer again: the previous run has {info.factory} x {info.dim}, "
              f"this one needs {factory} x {dim}", file=sys.stderr)
        return None
    path = fs.join(index_dir, faiss_shards.TRAINED_NAME)
    FileSystems.copy([source], [path])
    print(f"[index] reusing the trained quantizer of {previous} ({factory} x {dim})", file=sys.stderr)
    return path


def _passages_schema():
    import pyarrow as pa

    return pa.schema([("passage_id", pa.int64()), ("title", pa.string()), ("text", pa.string())])


STAGE = IndexStage()
