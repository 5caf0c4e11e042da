"""Arrow schemas of the artifacts under OUT (the column names are a contract, see DESIGN.md)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

# Compression of every Parquet artifact (Beam's default is none): zstd shrinks the text-heavy mentions and
# articles several times over and reads back faster than the disk delivers the uncompressed bytes.
PARQUET_CODEC = "zstd"


def writer_options(schema: pa.Schema) -> dict[str, list[str]]:
    """How a Parquet writer should write ``schema``'s columns: all but vectors (fixed-size lists of floats)
    dictionary-encoded and with statistics. A vector's values rarely repeat: the writer would hash every value until
    the dictionary's page limit, then write them plain anyway (~40% of the time of writing a table of encoded
    passages); and no reader asks a vector column's minimum, which costs nearly half the writing of float16 ones."""
    scalars = [field.name for field in schema if not is_vector(field)]
    return {"use_dictionary": scalars, "write_statistics": scalars}


def is_vector(field: pa.Field) -> bool:
    """A vector column: a fixed-size list of floats."""
    return pa.types.is_fixed_size_list(field.type) and pa.types.is_floating(field.type.value_type)


def scratch_compression(schema: pa.Schema) -> dict[str, str]:
    """Per-column compression of a file that a stage writes and reads back itself, not an artifact (the index's
    kept and staged rows): zstd but for vectors, stored plain. zstd saves ~8% of a real model's float32 vectors for
    three times the CPU of writing them (100,000 x 384 with their passages' text: 0.60 s against 0.20, reading 0.28
    against 0.18)."""
    return {field.name: "none" if is_vector(field) else PARQUET_CODEC for field in schema}


# trail: characters of link trail at the anchor's end ("s" of [[lichen]]s): the anchor is text[start:end],
# the link's own text (what embed-entities masks) is text[start:end - trail].
LINK = pa.struct([("start", pa.int32()), ("end", pa.int32()), ("target", pa.string()), ("trail", pa.int32())])

ARTICLES = pa.schema(
    [
        ("page_id", pa.int64()),
        ("title", pa.string()),
        ("text", pa.string()),
        ("links", pa.list_(LINK)),
        ("qid", pa.string()),
    ]
)

REDIRECTS = pa.schema([("title", pa.string()), ("target", pa.string())])

ENTITIES = pa.schema(
    [
        ("entity_id", pa.int32()),
        ("title", pa.string()),
        ("page_id", pa.int64()),
        ("qid", pa.string()),
        ("link_count", pa.int64()),
    ]
)


def entity_keys(qid: pa.Array | pa.ChunkedArray, title: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """The KPR entity key of each ``ENTITIES`` row: its Wikidata QID where known (not null, not empty), else its
    title (the keys of ``kb_id.trie``, whose ids the entity ids are)."""
    return pc.if_else(pc.fill_null(pc.not_equal(qid, ""), False), qid, title)


NAMES = pa.schema(
    [
        ("name", pa.string()),
        ("entity_id", pa.int32()),
        ("link_count", pa.int64()),
        ("total_link_count", pa.int64()),
        ("doc_count", pa.int64()),
        ("link_prob", pa.float32()),
        ("commonness", pa.float32()),
    ]
)

# mentions/: references, not text (150M context windows would repeat the articles ~100 times): the mention is
# articles/ text[start:end] of page_id (link link_index without its trail); embed-entities cuts the context window
# around it again; window_digest (blake2b-128 of the window and the span in it) lets a refresh compare samples.
MENTIONS = pa.schema(
    [
        ("entity_id", pa.int32()),
        ("page_id", pa.int64()),
        ("link_index", pa.int32()),
        ("start", pa.int32()),
        ("end", pa.int32()),
        ("window_digest", pa.binary(16)),
    ]
)

# the index's model inputs, between the part that builds them (every core) and the part that holds the GPU: scratch
# files of the stage, one row a passage (its row in the index too) and what the encoder's model reads: token ids,
# token types where the encoder feeds them, and a KPR encoder's entities and their token positions.
PASSAGE_INPUTS = pa.schema(
    [
        ("passage_id", pa.int64()),
        ("title", pa.string()),
        ("text", pa.string()),
        ("passage_key", pa.uint64()),  # transforms.index.inputs.passage_keys: what a rerun finds kept
        ("input_ids", pa.list_(pa.int32())),
        ("token_type_ids", pa.list_(pa.int8())),
        ("entity_ids", pa.list_(pa.int64())),
        ("entity_positions", pa.list_(pa.list_(pa.int32()))),
    ]
)

# embed-entities' model inputs, between the part that builds them (every core) and the part that holds the GPU:
# scratch files of the stage (removed at its commit), one row a mention, its [MASK] token ids.
MENTION_INPUTS = pa.schema(
    [
        ("entity_id", pa.int32()),
        ("page_id", pa.int64()),
        ("link_index", pa.int32()),
        ("window_key", pa.uint64()),
        ("mask_position", pa.int32()),
        ("input_ids", pa.list_(pa.int32())),
    ]
)


def entity_embeddings(dim: int, value_type: pa.DataType | None = None) -> pa.Schema:
    """Schema of ``entity_embeddings/`` for vectors of ``dim`` values (float32 unless ``value_type``)."""
    return pa.schema(
        [
            ("entity_id", pa.int32()),
            ("title", pa.string()),
            ("qid", pa.string()),
            ("embedding", pa.list_(value_type or pa.float32(), dim)),
            ("mention_count", pa.int32()),
        ]
    )

# mention_vectors/: embed-entities' store of [MASK] vectors, one a distinct model input, keyed by a digest of the
# input and the model (transforms/embed_entities/window_store.py); float16.
def mention_vectors(dim: int) -> pa.Schema:
    """Schema of ``mention_vectors/`` for vectors of ``dim`` values."""
    return pa.schema([("window_key", pa.uint64()), ("embedding", pa.list_(pa.float16(), dim))])


# entity_id_map/: a refresh's old -> new entity ids of the entities in both runs (by key: QID, else title).
ENTITY_ID_MAP = pa.schema([("key", pa.string()), ("old_entity_id", pa.int32()), ("new_entity_id", pa.int32())])

PASSAGES = pa.schema([("passage_id", pa.int64()), ("title", pa.string()), ("text", pa.string())])

# Intermediates of the parse stage (under OUT/.staging/parse/, never committed). Staged articles: articles/ rows
# before their links are resolved, with the position the page was read at (file or stream, and its number there).
STAGED_ARTICLES = ARTICLES.append(pa.field("position", pa.string()))
# Title records: what the title map is built from, one row per article page, redirect page, page title (for SQL
# redirects), SQL redirect row or QID; ``kind`` says which, the other columns are null where they do not apply.
TITLE_RECORDS = pa.schema([("kind", pa.string()), ("position", pa.string()), ("title", pa.string()),
                           ("page_id", pa.int64()), ("target", pa.string())])
