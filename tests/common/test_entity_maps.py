"""transforms/common/entity_maps.py and transforms/common/worker_files.py: the title map, the entity rows and
arrays, written by one worker and read back memory-mapped."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from artifacts.trie_map import load_trie_map
from tests.builders import write_entities
from transforms.common.entity_maps import build_entity_rows, build_title_ids, load_entity_rows
from transforms.common.worker_files import load_array, save_array


def test_maps_written_by_a_worker_are_read_back_memory_mapped(tmp_path: Path):
    titles = ["Paris", "Lyon", "Nice", "Ō (letter)"]
    write_entities(tmp_path, titles, {"Nice": "Q33959"})
    files = sorted(str(path) for path in (tmp_path / "entities").glob("*.parquet"))
    loaded = load_trie_map(build_title_ids(files, str(tmp_path / "titles")))
    assert [loaded.get(title) for title in titles] == [1, 2, 3, 4]
    assert isinstance(loaded.values, np.memmap) and loaded.get("Rome") is None
    rows = load_entity_rows(build_entity_rows(files, str(tmp_path / "rows")))
    assert rows.entity_ids.tolist() == [1, 2, 3, 4]
    assert rows.of_bucket(1, 2).to_pylist() == [{"entity_id": 1, "title": "Paris", "qid": None},
                                                {"entity_id": 3, "title": "Nice", "qid": "Q33959"}]


def test_arrays_are_saved_and_memory_mapped(tmp_path: Path):
    array = np.arange(10, dtype=np.int32)
    loaded = load_array(save_array(str(tmp_path / "deep" / "a.npy"), array))
    assert isinstance(loaded, np.memmap) and loaded.tolist() == array.tolist()
