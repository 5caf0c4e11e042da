"""transforms/entity_maps.py and transforms/worker_files.py: the title map and the entity rows, written by one
worker and read back memory-mapped."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.builders import write_entities
from transforms.entity_maps import build_entity_rows, build_title_ids, load_entity_rows, load_title_ids, title_ids
from transforms.worker_files import load_array, save_array


def test_title_ids_give_each_title_its_entity_and_a_repeated_title_its_smallest_id():
    found = title_ids(["Paris", "Lyon", "Paris", "Nice"], np.array([7, 2, 3, 9]))
    assert (found.get("Paris"), found.get("Lyon"), found.get("Nice"), found.get("Rome")) == (3, 2, 9, None)
    assert found.max_entity_id == 9
    assert title_ids([], np.zeros(0, dtype=np.int32)).get("Paris") is None


def test_maps_written_by_a_worker_are_read_back_memory_mapped(tmp_path: Path):
    titles = ["Paris", "Lyon", "Nice", "Ō (letter)"]
    write_entities(tmp_path, titles, {"Nice": "Q33959"})
    files = sorted(str(path) for path in (tmp_path / "entities").glob("*.parquet"))
    loaded = load_title_ids(build_title_ids(files, str(tmp_path / "titles")))
    assert [loaded.get(title) for title in titles] == [1, 2, 3, 4]
    assert isinstance(loaded.entity_ids, np.memmap)
    rows = load_entity_rows(build_entity_rows(files, str(tmp_path / "rows")))
    assert rows.entity_ids.tolist() == [1, 2, 3, 4]
    assert rows.of_bucket(1, 2).to_pylist() == [{"entity_id": 1, "title": "Paris", "qid": None},
                                                {"entity_id": 3, "title": "Nice", "qid": "Q33959"}]


def test_arrays_are_saved_and_memory_mapped(tmp_path: Path):
    array = np.arange(10, dtype=np.int32)
    loaded = load_array(save_array(str(tmp_path / "deep" / "a.npy"), array))
    assert isinstance(loaded, np.memmap) and loaded.tolist() == array.tolist()
