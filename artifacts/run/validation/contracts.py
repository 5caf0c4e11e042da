"""The schema contract of each artifact: the columns its files must have and the allowed vector types."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

from artifacts import faiss as faiss_shards
from artifacts import layout, schemas
from artifacts.run.validation.recorded import MAX_EXAMPLES, VECTOR_COLUMN


@dataclass(frozen=True)
class Contract:
    """The columns an artifact's files must have (more are allowed) and, for vectors, the allowed value types
    of the fixed-size ``embedding`` column (its size D comes from the file); ``in_parts``: its files are named
    ``part-i-of-N`` and all N are written (Beam's sinks, and embed-entities' file of every bucket)."""

    columns: pa.Schema
    vector_types: tuple[pa.DataType, ...] = ()
    in_parts: bool = True


def _without_vector(schema: pa.Schema) -> pa.Schema:
    return schema.remove(schema.get_field_index(VECTOR_COLUMN))


_ENTITY_VECTORS = Contract(_without_vector(schemas.entity_embeddings(1)), (pa.float32(), pa.float16()))
# a store of buckets with mentions (the others write no file), a shard's files of its buckets (bucket-NNNNN)
_MENTION_VECTORS = Contract(_without_vector(schemas.mention_vectors(1)), (pa.float16(),), in_parts=False)
_PASSAGE_VECTORS = Contract(_without_vector(faiss_shards.embedding_schema(1)), (pa.float32(),), in_parts=False)
# artifact directory ("NAME/") -> the contract of its files
CONTRACTS: dict[str, Contract] = {
    f"{layout.ARTICLES}/": Contract(schemas.ARTICLES),
    f"{layout.REDIRECTS}/": Contract(schemas.REDIRECTS),
    f"{layout.ENTITIES}/": Contract(schemas.ENTITIES),
    f"{layout.NAMES}/": Contract(schemas.NAMES),
    f"{layout.MENTIONS}/": Contract(schemas.MENTIONS),
    f"{layout.ENTITY_ID_MAP}/": Contract(schemas.ENTITY_ID_MAP),
    f"{layout.ENTITY_EMBEDDINGS}/": _ENTITY_VECTORS,
    f"{layout.MENTION_VECTORS}/": _MENTION_VECTORS,
    f"{layout.INDEX}/{faiss_shards.EMBEDDINGS_DIR}/": _PASSAGE_VECTORS,
    f"{layout.PASSAGES}/": Contract(schemas.PASSAGES),
}


PART_NAME = re.compile(r"part-(\d+)-of-(\d+)\.parquet")


def missing_parts(directory: str, relatives: list[str]) -> list[str]:
    """How the recorded files ``relatives`` of an artifact written ``in_parts`` are not all N parts of one write."""
    names = [relative[len(directory):] for relative in relatives]
    found = [PART_NAME.fullmatch(name) for name in names]
    totals = sorted({int(match[2]) for match in found if match})
    if len(totals) > 1:
        return [f"{directory}: parts of {' and '.join(map(str, totals))}-part writes (a stale write mixed in?)"]
    if not totals:
        return []
    numbers = {int(match[1]) for match in found if match}
    missing = [f"part-{number:05d}-of-{totals[0]:05d}.parquet" for number in range(totals[0]) if number not in numbers]
    if not missing:
        return []
    shown = ", ".join(missing[:MAX_EXAMPLES]) + (", ..." if len(missing) > MAX_EXAMPLES else "")
    return [f"{directory}: {len(missing)} of its {totals[0]} parts are not in the manifest ({shown})"]


def contract_problems(relative: str, schema: pa.Schema) -> list[str]:
    """How a file's schema breaks the contract of its artifact (none for artifacts without one)."""
    contract = next((item for prefix, item in CONTRACTS.items() if relative.startswith(prefix)), None)
    if contract is None:
        return []
    problems = [column_problem(schema, expected) for expected in contract.columns]
    if contract.vector_types:
        problems.append(vector_problem(schema, contract.vector_types))
    return [problem for problem in problems if problem]


def column_problem(schema: pa.Schema, expected: pa.Field) -> str | None:
    if expected.name not in schema.names:
        return f"column {expected.name} is missing"
    actual = schema.field(expected.name).type
    if actual.equals(expected.type):
        return None
    return f"column {expected.name} is {actual}, the contract says {expected.type}"


def vector_problem(schema: pa.Schema, value_types: tuple[pa.DataType, ...]) -> str | None:
    if VECTOR_COLUMN not in schema.names:
        return f"column {VECTOR_COLUMN} is missing"
    actual = schema.field(VECTOR_COLUMN).type
    if pa.types.is_fixed_size_list(actual) and actual.value_type in value_types and actual.list_size > 0:
        return None
    allowed = " or ".join(str(value_type) for value_type in value_types)
    return f"column {VECTOR_COLUMN} is {actual}, the contract says fixed_size_list<{allowed}>[D]"
