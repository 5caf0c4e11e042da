"""OUT on an object store (``mirror://``: no directories, as on GCS and S3, where a "directory" is a prefix that
exists() does not see): a stage finds the files it wrote below a prefix, and a rerun replaces an artifact's files
instead of adding to them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from artifacts import layout
from artifacts.run.validation import validate_run
from pipelines.launcher.cli import main
from tests.builders import mirrored, stage_command
from tests.conftest import copy_stages

EVERY_STAGE = (layout.PARSE_STAGE, layout.DICTIONARY_STAGE, layout.MENTIONS_STAGE, layout.EMBED_ENTITIES_STAGE,
               layout.INDEX_STAGE)


def remote_command(command: str, output: Path, model: Path, *extra: str) -> list[str]:
    """``stage_command`` with OUT ``output`` seen through ``mirror://``."""
    arguments = stage_command(command, output, model, *extra)
    arguments[arguments.index("--output") + 1] = mirrored(output)
    return arguments


def embeddings(output: Path) -> dict[int, np.ndarray]:
    table = pq.read_table(output / layout.ENTITY_EMBEDDINGS)
    return dict(zip(table.column("entity_id").to_pylist(), table.column("embedding").to_numpy(), strict=True))


@pytest.mark.long
def test_stages_rerun_on_an_object_store_out_as_on_a_disk(full_run: Path, tiny_bert: Path, tmp_path: Path) -> None:
    """embed-entities encodes each window into its store below OUT and reads it back: every entity gets its
    vector (none found, every one was left without); an index rerun in one shard where there were two leaves no
    shard of the old build behind, and the run validates."""
    local = tmp_path / "out"
    copy_stages(full_run, local, EVERY_STAGE)
    assert main(remote_command("embed-entities", local, tiny_bert, "--force")) == 0
    expected, found = embeddings(full_run), embeddings(local)
    assert sorted(found) == sorted(expected) and len(found) > 40
    assert all(np.allclose(found[entity], expected[entity], atol=1e-5) for entity in expected)
    arguments = remote_command("index", local, tiny_bert)
    arguments[arguments.index("--shards") + 1] = "1"
    assert main(arguments) == 0
    assert sorted(path.name for path in (local / layout.INDEX).iterdir() if path.name.startswith("shard-")) == [
        "shard-00000.faiss", "shard-00000.ids.npy"]
    assert validate_run(mirrored(local)) == []
