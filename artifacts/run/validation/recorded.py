"""What the checks share: the recorded files of a run, which of them already failed, and problems tallied by kind."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from artifacts import fs
from artifacts.errors import InputError
from artifacts.run import manifest
from artifacts.tables import DamagedParquetError

MAX_EXAMPLES = 5  # example ids per kind of problem: 7M bad rows make one line, not 7M
VECTOR_COLUMN = "embedding"


@dataclass
class RecordedRun:
    """The files a run's manifest records, and which of them already failed a check."""

    output: str
    stages: dict[str, manifest.StageRecord]
    files: dict[str, manifest.OutputFile]  # path relative to OUT -> its record
    broken: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, output: str, stages: dict[str, manifest.StageRecord]) -> RecordedRun:
        return cls(output, stages, {item.path: item for record in stages.values() for item in record.outputs})

    def path(self, relative: str) -> str:
        return fs.join(self.output, relative)

    def artifact(self, prefix: str) -> list[str] | None:
        """The recorded files under ``prefix`` (relative, sorted); None when one of them already failed."""
        relatives = sorted(path for path in self.files if path.startswith(prefix))
        return None if self.broken.intersection(relatives) else relatives

    def rows(self, relatives: Iterable[str]) -> int:
        return sum(self.files[relative].rows or 0 for relative in relatives)


class Tally:
    """Problems counted by kind, with the first few examples."""

    def __init__(self) -> None:
        self._found: dict[str, tuple[int, list[str]]] = {}

    def add(self, kind: str, count: int, examples: Iterable[Any]) -> None:
        if count:
            seen, kept = self._found.get(kind, (0, []))
            kept += [str(example) for example in list(examples)[:MAX_EXAMPLES - len(kept)]]
            self._found[kind] = (seen + count, kept)

    def add_ids(self, kind: str, ids: np.ndarray) -> None:
        self.add(kind, len(ids), ids[:MAX_EXAMPLES].tolist())

    def messages(self) -> list[str]:
        return [f"{kind}: {count} ({', '.join(kept)}{', ...' if count > len(kept) else ''})"
                for kind, (count, kept) in self._found.items()]


def int_column(batch: pa.RecordBatch, name: str, null: int = 0) -> np.ndarray:
    """The column ``name`` of ``batch`` as int64, a null as ``null``."""
    return pc.fill_null(batch.column(name), null).to_numpy(zero_copy_only=False).astype(np.int64)


def message(error: BaseException) -> str:
    text = error.message if isinstance(error, InputError) else str(error)
    return text.strip().splitlines()[-1] if text.strip() else type(error).__name__


def guarded(relative: str, check: Callable[[], list[str] | None]) -> list[str]:
    """Run a check that reads the rows of ``relative``: a file whose footer reads but whose data pages do not is
    one problem, not a crash."""
    try:
        return check() or []
    except DamagedParquetError as error:  # what the readers of artifacts raise, naming the file and the command
        return [f"{relative}: rows cannot be read ({error.problem})"]
    except (pa.ArrowException, OSError) as error:
        return [f"{relative}: rows cannot be read ({message(error)})"]


def parquet_footer(path: str) -> tuple[int, pa.Schema]:
    """Row count and Arrow schema (with its key/value metadata) of one Parquet file, from its footer."""
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        parquet = pq.ParquetFile(handle)
        return parquet.metadata.num_rows, parquet.schema_arrow

