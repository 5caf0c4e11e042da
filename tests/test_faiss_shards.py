"""FAISS shards: exact merging, sharded search == one index == brute force, training sample, sizes, lookups,
shards read from a remote store."""

from __future__ import annotations

import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from artifacts import faiss as shards
from artifacts.errors import InputError
from artifacts.passages import shard_of
from tests.builders import DIM, brute_force, clustered, mirrored, write_index_dir
from transforms.passages import sample_key


def test_merge_top_k_is_exact_with_ties_and_short_shards():
    scores = [np.array([[0.9, 0.5, 0.5]]), np.array([[0.7, 0.5, -np.inf]])]
    ids = [np.array([[4, 9, 2]]), np.array([[3, 1, -1]])]
    top_scores, top_ids = shards.merge_top_k(scores, ids, 4)
    assert top_ids.tolist() == [[4, 3, 1, 2]] and top_scores.tolist() == [[pytest.approx(0.9), pytest.approx(0.7),
                                                                           0.5, 0.5]]
    top_scores, top_ids = shards.merge_top_k([np.array([[0.3]])], [np.array([[7]])], 3)
    assert top_ids.tolist() == [[7, -1, -1]] and np.isneginf(top_scores[0, 1:]).all()


def test_sharded_flat_search_equals_one_index_and_brute_force(tmp_path):
    vectors, ids = clustered(600), np.arange(1000, 1600, dtype=np.int64) * 7
    queries = clustered(25, seed=1)
    sharded = shards.ShardedIndex(write_index_dir(tmp_path / "four", vectors, ids, 4))
    single = shards.ShardedIndex(write_index_dir(tmp_path / "one", vectors, ids, 1))
    assert sum(item["count"] for item in sharded.info.shard_files) == 600
    four_scores, four_ids = sharded.search(queries, 10)
    one_scores, one_ids = single.search(queries, 10)
    exact_scores, exact_ids = brute_force(vectors, ids, queries, 10)
    assert four_ids.tolist() == one_ids.tolist() == exact_ids.tolist()
    np.testing.assert_allclose(four_scores, exact_scores, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(four_scores, one_scores)


def test_ivf_with_every_list_probed_is_exact_and_few_lists_recall_well(tmp_path):
    vectors, ids = clustered(2000), np.arange(2000, dtype=np.int64)
    queries = clustered(50, seed=2)
    index_dir = write_index_dir(tmp_path, vectors, ids, 3, factory="IVF16,Flat")
    exact_ids = brute_force(vectors, ids, queries, 10)[1]
    assert shards.ShardedIndex(index_dir, nprobe=16).search(queries, 10)[1].tolist() == exact_ids.tolist()
    approximate = shards.ShardedIndex(index_dir, nprobe=4).search(queries, 10)[1]
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approximate, exact_ids, strict=True)])
    assert recall >= 0.9


def test_id_maps_list_each_shards_passages_in_insertion_order(tmp_path):
    vectors, ids = clustered(100), np.arange(50, 150, dtype=np.int64)
    index_dir = write_index_dir(tmp_path, vectors, ids, 2)
    for item in shards.load_index_info(index_dir).shard_files:
        id_map = shards.read_npy(f"{index_dir}/{item['ids']}")
        stored = np.concatenate([pq.read_table(path).column("passage_id").to_numpy()
                                 for path in shards.shard_embedding_files(index_dir, item["name"])])
        assert id_map.tolist() == stored.tolist() and len(id_map) == item["count"]
        assert {shard_of(int(passage_id), 2) for passage_id in id_map} == {int(item["name"][-1])}


def test_passage_lookup_reads_the_texts_of_any_shard(tmp_path):
    vectors, ids = clustered(300), np.arange(300, dtype=np.int64) * 3
    index_dir = write_index_dir(tmp_path, vectors, ids, 3)
    lookup = shards.PassageLookup(index_dir, shards.load_index_info(index_dir))
    found = lookup.get([0, 3, 897, 4, -1, 3])
    assert found == {0: ("T0", "text of 0"), 3: ("T3", "text of 3"), 897: ("T897", "text of 897")}


@pytest.mark.parametrize("factory", ["Flat", "IVF16,Flat", "HNSW8,Flat"])
def test_remote_shards_search_from_copies_already_removed(factory, tmp_path, system_temp):
    """Memory-mapped (Flat, IVF) or read whole (HNSW), a remote shard's local copy is gone once it is read."""
    vectors, ids = clustered(800), np.arange(800, dtype=np.int64)
    queries = clustered(20, seed=3)
    index_dir = write_index_dir(tmp_path / "index", vectors, ids, 2, factory=factory)
    shard = shards.read_index(mirrored(f"{index_dir}/{shards.load_index_info(index_dir).shard_files[0]['index']}"))
    assert os.listdir(system_temp) == [] and shard.ntotal > 0
    remote = shards.ShardedIndex(mirrored(index_dir), nprobe=16).search(queries, 10)
    local = shards.ShardedIndex(index_dir, nprobe=16).search(queries, 10)
    assert remote[1].tolist() == local[1].tolist() and os.listdir(system_temp) == []
    np.testing.assert_array_equal(remote[0], local[0])
    assert shard.search(queries, 3)[0].shape == (20, 3)  # still readable after its file went


def test_training_sample_is_the_smallest_keys_whatever_the_files(tmp_path):
    vectors = clustered(40)
    rows = [(sample_key(passage_id), passage_id, vector) for passage_id, vector in enumerate(vectors)]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    pq.write_table(shards.train_sample_table(rows, DIM), tmp_path / "a" / "all.parquet")
    for part in range(3):
        pq.write_table(shards.train_sample_table(rows[part::3][::-1], DIM), tmp_path / "b" / f"p{part}.parquet")
    expected = np.array([vector for _, _, vector in sorted(rows, key=lambda row: row[0])[:15]])
    np.testing.assert_array_equal(shards.read_train_sample(str(tmp_path / "a"), 15), expected)
    np.testing.assert_array_equal(shards.read_train_sample(str(tmp_path / "b"), 15), expected)


def test_default_factory_and_memory_by_corpus_size():
    assert shards.default_factory(751, 384) == "Flat"
    assert shards.default_factory(1_000_000, 768) == "IVF4096,Flat"
    assert shards.default_factory(21_015_324, 768) == "IVF16384,SQ8"
    assert shards.default_factory(100_000_000, 768) == "IVF32768,PQ96"
    assert shards.default_factory(100_000_000, 100) == "IVF32768,SQ8"
    flat = shards.memory_estimate("Flat", 751, 384)
    assert (flat.index_bytes, flat.train_bytes) == (751 * (384 * 4 + 8), 0)
    dpr = shards.memory_estimate("IVF16384,PQ96", 21_015_324, 768)
    assert dpr.index_bytes == 21_015_324 * (96 + 8) + 16384 * 768 * 4
    assert dpr.train_bytes == shards.MAX_TRAIN_SAMPLE * 768 * 4
    assert shards.training_sample_size("IVF16,Flat", 2000, DIM) == 2000
    assert shards.training_sample_size("IVF1024,Flat", 10**7, DIM) == 65_536
    assert shards.training_sample_size("HNSW32,Flat", 10**7, DIM) == 0


def test_bad_factories_are_one_line_errors():
    with pytest.raises(InputError, match="not a FAISS factory string"):
        shards.check_factory("IVFxyz,Nope", 100, DIM)
    with pytest.raises(InputError, match="1024 IVF lists need at least 1024 training vectors"):
        shards.check_factory("IVF1024,Flat", 500, DIM)
    shards.check_factory("HNSW8,Flat", 10, DIM)


def test_dimension_mismatch_and_missing_index(tmp_path):
    vectors, ids = clustered(30), np.arange(30, dtype=np.int64)
    index = shards.ShardedIndex(write_index_dir(tmp_path / "x", vectors, ids, 1))
    with pytest.raises(InputError, match=r"query vectors have 8 dimensions but the index .* has 16"):
        index.search(np.zeros((1, 8), np.float32), 3)
    with pytest.raises(InputError, match=r"index\.json is missing"):
        shards.ShardedIndex(str(tmp_path / "nowhere"))


def test_gpu_requests_fall_back_to_the_cpu_without_faiss_gpu():
    assert shards.gpu_count() == 0
    vectors = clustered(500)
    on_cpu = shards.train_index("IVF8,Flat", DIM, vectors)
    asked_gpu = shards.train_index("IVF8,Flat", DIM, vectors, use_gpu=True)
    index, added = shards.add_batches(asked_gpu, [(np.arange(500), vectors)], use_gpu=True)
    assert index.ntotal == 500 and added.tolist() == list(range(500))
    import faiss

    centroids = [faiss.extract_index_ivf(index).quantizer.reconstruct_n(0, 8) for index in (on_cpu, asked_gpu)]
    np.testing.assert_array_equal(*centroids)
