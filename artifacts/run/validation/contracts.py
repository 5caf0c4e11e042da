"""The schema contract of each artifact: the columns its files must have and the allowed vector types."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from artifacts import faiss as faiss_shards
from artifacts import layout, schemas
from artifacts.run.validation.recorded import VECTOR_COLUMN


@dataclass(frozen=True)
class Contract:
    """The columns an artifact's files must have (more are allowed) and, for vectors, the allowed value types
    of the fixed-size ``embedding`` column (its size D comes from the file)."""

    columns: pa.Schema
    vector_types: tuple[pa.DataType, ...] = ()


def _without_vector(schema: pa.Schema) -> pa.Schema:
    return schema.remove(schema.get_field_index(VECTOR_COLUMN))


_ENTITY_VECTORS = Contract(_without_vector(schemas.entity_embeddings(1)), (pa.float32(), pa.float16()))
_MENTION_VECTORS = Contract(_without_vector(schemas.mention_vectors(1)), (pa.float16(),))
_PASSAGE_VECTORS = Contract(_without_vector(faiss_shards.embedding_schema(1)), (pa.float32(),))
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
