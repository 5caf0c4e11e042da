"""FAISS shards: exact merging, sharded search == one index == brute force, training sample, sizes, lookups,
shards read from a remote store."""

from __future__ import annotations

import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from artifacts import faiss as shards
from artifacts.errors import InputError
from artifacts.faiss import buckets as buckets_module
from artifacts.faiss import build, choice
from artifacts.faiss.build import reserve
from artifacts.faiss.vectors import embedding_table
from artifacts.passages import sample_key, shard_of
from tests.builders import DIM, brute_force, clustered, mirrored, run_counting, write_index_dir


def test_merge_top_k_is_exact_with_ties_and_short_shards():
    scores = [np.array([[0.9, 0.5, 0.5]]), np.array([[0.7, 0.5, -np.inf]])]
    ids = [np.array([[4, 9, 2]]), np.array([[3, 1, -1]])]
    top_scores, top_ids = shards.merge_top_k(scores, ids, 4)
    assert top_ids.tolist() == [[4, 3, 1, 2]] and top_scores.tolist() == [[pytest.approx(0.9), pytest.approx(0.7),
                                                                           0.5, 0.5]]
    top_scores, top_ids = shards.merge_top_k([np.array([[0.3]])], [np.array([[7]])], 3)
    assert top_ids.tolist() == [[7, -1, -1]] and np.isneginf(top_scores[0, 1:]).all()


def test_tied_passages_are_found_by_smallest_id_whatever_the_shards_and_k(tmp_path):
    """40 copies of one passage under random ids: FAISS keeps the tied vectors it stored first, so the shards and k
    chose among them (and the top 3 was not the start of the top 6)."""
    vectors, ids = clustered(200), np.random.default_rng(3).permutation(np.arange(10, 10_000, dtype=np.int64))[:200]
    vectors[150:190] = vectors[150]
    expected = np.sort(ids[150:190])
    query = vectors[150:151]
    for count in (1, 3):
        index = shards.ShardedIndex(write_index_dir(tmp_path / str(count), vectors, ids, count))
        for k in (1, 3, 6, 39):
            assert index.search(query, k)[1][0].tolist() == expected[:k].tolist(), (count, k)


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


def test_ef_search_reaches_the_hnsw_coarse_quantizer_of_an_ivf_index(tmp_path):
    """``IVF…_HNSW…``: the lists probed are those an HNSW graph of the centroids finds, as deep as ``ef_search``
    says (it was left at FAISS's 16): searched more widely, the graph finds better lists, then the same."""
    vectors, ids = np.random.default_rng(4).normal(size=(3000, DIM)).astype(np.float32), np.arange(3000)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = vectors[:300]
    index_dir = write_index_dir(tmp_path, vectors, ids, 1, factory="IVF64_HNSW4,Flat")
    exact = brute_force(vectors, ids, queries, 10)[1]
    found = {ef: shards.ShardedIndex(index_dir, nprobe=2, ef_search=ef).search(queries, 10)[1] for ef in (1, 256, 1024)}
    recall = {ef: np.mean([len(set(a) & set(e)) for a, e in zip(ids_found, exact, strict=True)]) / 10
              for ef, ids_found in found.items()}
    assert recall[1] < recall[256] - 0.1
    assert found[256].tolist() == found[1024].tolist()


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


def staged_rows(count: int) -> list[tuple[int, str, str, np.ndarray]]:
    return [(passage_id * 3, f"T{passage_id}", f"text {passage_id}", vector)
            for passage_id, vector in enumerate(clustered(count))]


def stage(directory, rows, writers: int, buckets: int = 8) -> list[buckets_module.BucketFile]:
    """``rows`` staged by ``writers`` writers (as worker bundles would: each its share, in its order)."""
    records = []
    for writer_index in range(writers):
        writer = buckets_module.BucketWriter(str(directory), buckets, DIM)
        mine = rows[writer_index::writers][::-1 if writer_index % 2 else 1]
        for start in range(0, len(mine), 37):  # tables of a few rows, as a model process's steps
            writer.add_table(embedding_table(mine[start:start + 37], DIM))
        records += writer.close()
    return records


def test_training_sample_is_the_smallest_keys_whatever_the_files(tmp_path):
    rows = staged_rows(300)
    # the choice before the staged files: the rows with the smallest sample keys, in key order
    expected = np.array([row[3] for row in sorted(rows, key=lambda row: sample_key(row[0]))[:40]])
    for writers in (1, 3):
        records = stage(tmp_path / str(writers), rows, writers)
        sample = shards.read_train_sample([record.path for record in records], 40)
        np.testing.assert_array_equal(sample, expected)
    assert shards.read_train_sample([record.path for record in records], 0).shape == (0, 0)
    assert shards.read_train_sample([record.path for record in records], 1000).shape == (300, DIM)


def test_a_bucket_writer_holds_at_most_its_buffer_whatever_the_number_of_buckets(tmp_path, monkeypatch):
    monkeypatch.setattr(buckets_module, "BUFFERED_ROWS", 100)
    writer = buckets_module.BucketWriter(str(tmp_path), 50, DIM)  # 64 rows per row group: 50 x 64 > 100
    held = []
    rows = staged_rows(1000)
    for start in range(0, 1000, 7):
        writer.add_table(embedding_table(rows[start:start + 7], DIM))
        held.append(sum(table.num_rows for tables in writer._buffers.values() for table in tables))
    writer.add_table(embedding_table([], DIM))  # a step whose passages were all kept before: nothing staged
    records = writer.close()
    assert max(held) <= 100 and sum(record.rows for record in records) == 1000
    assert sorted(row for record in records for row in pq.read_table(record.path).column(0).to_pylist()) == [
        row[0] for row in staged_rows(1000)]


def test_shards_written_from_buckets_are_the_same_whatever_the_writers(tmp_path):
    rows = staged_rows(500)
    built = {}
    for writers in (1, 4):
        index_dir = tmp_path / f"index{writers}"
        records = stage(tmp_path / f"staged{writers}", rows, writers)
        shards.write_index(shards.train_index("Flat", DIM, np.zeros((0, DIM))), f"{index_dir}/trained.faiss")
        for shard, grouped in buckets_module.shard_buckets(records, 2).items():
            name = shards.shard_name(shard)
            for bucket, paths in grouped:
                buckets_module.write_shard_bucket(str(index_dir), name, bucket, paths, DIM)
            shards.add_shard_files(shards.read_index(f"{index_dir}/trained.faiss", mmap=False), str(index_dir), name)
        built[writers] = built_files(index_dir)
    assert built[1] == built[4]
    ids = {name: np.load(tmp_path / "index1" / name) for name in built[1] if str(name).endswith(".ids.npy")}
    assert sorted(np.concatenate(list(ids.values())).tolist()) == [row[0] for row in rows]
    assert all(shard_of(int(passage_id), 2) == int(str(name)[6:11]) for name, found in ids.items()
               for passage_id in found)


def built_files(index_dir) -> dict:
    return {path.relative_to(index_dir): path.read_bytes() for path in index_dir.rglob("*") if path.is_file()}


@pytest.mark.parametrize("factory", ["Flat", "IVF4,Flat"])
def test_a_shard_filled_in_place_is_the_shard_added_to_from_its_files(tmp_path, factory):
    """BuildShard fills a flat index in place from the staged files (any other type is added to from the shard's
    files): every file of the shard, index and id map included, is byte for byte what adding the shard's files in
    order to the trained index gives."""
    from transforms.index.graph import BuildShard

    rows = staged_rows(700)
    records = stage(tmp_path / "staged", rows, writers=3)
    trained = shards.train_index(factory, DIM, np.array([row[3] for row in rows]))
    built = {}
    for way in ("in place", "added"):
        index_dir = tmp_path / way
        shards.write_index(trained, f"{index_dir}/trained.faiss")
        for shard, grouped in buckets_module.shard_buckets(records, 2).items():
            name = shards.shard_name(shard)
            if way == "in place":
                spec = (name, tuple((bucket, tuple(paths)) for bucket, paths in grouped))
                [summary] = BuildShard(str(index_dir), DIM, False, factory).process(spec, f"{index_dir}/trained.faiss")
            else:
                for bucket, paths in grouped:
                    buckets_module.write_shard_bucket(str(index_dir), name, bucket, paths, DIM)
                trained = shards.read_index(f"{index_dir}/trained.faiss", mmap=False)
                summary = shards.add_shard_files(trained, str(index_dir), name)
            assert summary["count"] == sum(shard_of(row[0], 2) == shard for row in rows)
        built[way] = built_files(index_dir)
    assert built["in place"] == built["added"]
    assert len([name for name in built["added"] if str(name).endswith(".parquet")]) == 8


def test_only_an_empty_flat_index_under_an_id_map_is_filled_in_place():
    vectors = clustered(50)
    room = shards.flat_rows(shards.new_index("Flat", DIM), 50)
    assert room is not None and room[0].shape == (50, DIM) and room[1].shape == (50,)
    for factory in ("IVF4,Flat", "HNSW8,Flat", "SQ8", "IDMap2,Flat"):
        assert shards.flat_rows(shards.train_index(factory, DIM, vectors), 50) is None, factory
    added = shards.new_index("Flat", DIM)
    added.add_with_ids(vectors[:5], np.arange(5))
    assert shards.flat_rows(added, 45) is None  # not empty: its rows come first


@pytest.mark.parametrize("factory", ["Flat", "IVF4,Flat"])
def test_passages_staged_twice_are_indexed_once(tmp_path, factory):
    """An input file written twice (a cluster retries a bundle of the inputs' job after a follower took the failed
    attempt's file) stages its passages twice, from two followers: each shard is byte for byte the shard of the
    passages staged once, filled in place or added to, and the repeats are counted."""
    from transforms.index.graph import BuildShard

    rows = staged_rows(300)
    trained = shards.train_index(factory, DIM, np.array([row[3] for row in rows]))
    built, counted = {}, {}
    for times in ("once", "twice"):
        records = stage(tmp_path / f"staged-{times}", rows, writers=2)
        if times == "twice":
            records += stage(tmp_path / "staged-again", rows[40:100], writers=1)
        index_dir = tmp_path / times
        shards.write_index(trained, f"{index_dir}/trained.faiss")
        specs = [(shards.shard_name(shard), tuple((bucket, tuple(paths)) for bucket, paths in grouped))
                 for shard, grouped in buckets_module.shard_buckets(records, 2).items()]
        build = BuildShard(str(index_dir), DIM, False, factory)
        counted[times] = run_counting(lambda pipeline, specs=specs, build=build, index_dir=index_dir: (
            pipeline | beam.Create(specs) | beam.ParDo(build, f"{index_dir}/trained.faiss")))
        built[times] = built_files(index_dir)
    assert built["twice"] == built["once"]
    assert counted == {"once": {"shards_built": 2, "passages_indexed": 300},
                       "twice": {"shards_built": 2, "passages_indexed": 300, "passages_staged_twice": 60}}


def test_a_flat_index_is_allocated_once_for_the_vectors_it_will_hold():
    import faiss

    vectors = clustered(1000)
    index = shards.new_index("Flat", DIM)
    reserve(index, 1000)
    inner = faiss.downcast_index(index.index)
    codes = inner.codes.data()
    index.add_with_ids(vectors[:10], np.arange(10))
    index.add_with_ids(vectors[10:], np.arange(10, 1000))
    assert int(inner.codes.data()) == int(codes)  # never moved: no copy while growing
    np.testing.assert_array_equal(inner.reconstruct_n(0, 1000), vectors)


def test_the_number_of_shards_comes_from_the_memory_budget():
    gb = choice.GB
    assert choice.shards_for_memory(21_015_324, 768, 8 * gb) == 16  # 64.5 GB of vectors x 1.2 / (8 - 1) GiB = 10.3
    assert choice.shards_for_memory(21_015_324, 768, 100 * gb) == 1
    assert choice.shards_for_memory(751, 384, 8 * gb) == 1
    assert choice.shards_for_memory(1_000_000, 1024, 2 * gb) == 8  # 4.1 GB x 1.2 / 1 GiB = 4.6 -> a power of two
    assert choice.shards_for_memory(1_000_000, 1024, 4 * gb) == 2  # 4.1 GB x 1.2 / 3 GiB = 1.5
    with pytest.raises(ValueError, match="no room for vectors"):
        choice.shards_for_memory(751, 384, gb)
    assert choice.bucket_count(3, 21_015_324, 768, 8 * gb) == 24
    assert choice.bucket_count(100, 21_015_324, 768, 8 * gb) == 500  # at most MAX_BUCKETS open files per writer
    assert choice.bucket_count(1000, 21_015_324, 768, 8 * gb) == 1000
    assert choice.bucket_count(None, 21_015_324, 768, 8 * gb) == 256  # twice the estimate: 32 shards x 8
    assert choice.bucket_count(None, 751, 384, 8 * gb) == 8
    assert choice.chosen_shards(21_015_324, 768, 8 * gb, 256) == 16
    assert choice.chosen_shards(21_015_324, 768, 8 * gb, 8) == 8  # never more shards than buckets


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
    with pytest.raises(InputError, match="learns 256 centroids per sub-vector and needs at least 256 training"):
        shards.check_factory("IVF2,PQ4", 200, DIM)
    with pytest.raises(InputError, match="learns 1024 centroids"):
        shards.check_factory("PQ4x10", 1000, DIM)
    shards.check_factory("HNSW8,Flat", 10, DIM)
    shards.check_factory("IVF2,PQ4x4", 20, DIM)
    with pytest.raises(InputError, match="learns 256 centroids"):
        shards.check_factory("OPQ4,IVF2,PQ4x4", 20, DIM)  # the rotation is trained with an 8-bit quantizer


def test_factories_faiss_would_refuse_only_as_it_builds_are_refused_up_front():
    """An NSG graph takes its vectors in one call (the shard's first batch was a 175-line traceback), a PQ in an
    IVF's coarse quantizer learns from the lists' centroids (the same), LSH is L2 only (said "does not fit 16
    dimensions")."""
    for factory in ("NSG8", "IDMap,NSG8,Flat", "PCA8,NSG8,Flat", "NSG8,Flat,RFlat"):  # wrapped, transformed, refined
        with pytest.raises(InputError, match=f"FAISS factory '{factory}': an NSG graph is built once, from all its"):
            shards.check_factory(factory, 1000, DIM)
    for factory, zero in (("HNSW0", "HNSW0"), ("PQ4x0", "PQ4x0"), ("IVF0,Flat", "IVF0"), ("IVF4_HNSW0,Flat", "HNSW0")):
        with pytest.raises(InputError, match=f"'{factory}': {zero}: a count of 0"):  # HNSW0, PQ4x0 aborted Python
            shards.check_factory(factory, 1000, DIM)
    shards.check_factory("IVF10,PQ4x10", 2000, DIM)
    with pytest.raises(InputError, match=r"'IVF16\(PQ4\),Flat': its coarse quantizer's product quantizer learns 256 "
                                         "centroids per sub-vector from the 16 IVF lists' centroids: it needs at "
                                         "least 256 lists"):
        shards.check_factory("IVF16(PQ4),Flat", 1000, DIM)
    assert (choice.pq_centroids("IVF256(PQ4),Flat"), choice.pq_centroids("IVF256(PQ4),PQ4x4")) == (None, 16)
    with pytest.raises(InputError, match=r"'LSH': FAISS builds no index of it for inner-product search \(.*L2"):
        shards.check_factory("LSH", 1000, DIM)


def test_what_faiss_refuses_as_it_trains_or_adds_stops_in_one_line(tmp_path):
    """Past the checks: FAISS's refusal to train (an IVF of more lists than vectors) or to add (an NSG graph of
    fewer than 100 vectors) is a FactoryError naming the factory, not a C++ assertion's traceback."""
    with pytest.raises(InputError, match=r"^KPR-INPUT-ERROR: FAISS factory 'IVF16,Flat': FAISS could not train it: "
                                         r"Number of training points \(8\) should be at least"):
        shards.train_index("IVF16,Flat", DIM, clustered(8))
    rows = staged_rows(50)
    records = stage(tmp_path / "staged", rows, writers=1)
    [(shard, grouped)] = buckets_module.shard_buckets(records, 1).items()
    name = shards.shard_name(shard)
    for bucket, paths in grouped:
        buckets_module.write_shard_bucket(str(tmp_path / "index"), name, bucket, paths, DIM)
    with pytest.raises(InputError, match=r"^KPR-INPUT-ERROR: FAISS factory 'NSG8': FAISS could not add the passages "
                                         "of shard-00000 to it: .*graph"):
        shards.add_shard_files(shards.new_index("NSG8", DIM), str(tmp_path / "index"), name, factory="NSG8")


def test_k_means_on_fewer_vectors_than_faiss_asks_for_is_said_once_in_our_words(capfd):
    """FAISS warns on stderr (from C++) when a k-means has fewer than 39 vectors a centroid; the stage says it in
    its own line before it starts, and FAISS's own lines are not shown. Other lines written meanwhile still are."""
    assert choice.thin_training("IVF16,Flat", 2_000, DIM) == []  # 125 a list
    assert choice.thin_training("IVF128,Flat", 4_605, DIM) == [
        "IVF128,Flat: its 128 IVF lists are trained on 4,605 vectors, fewer than the 4,992 FAISS asks for (39 each): "
        "some may be poor; fewer suit this corpus"]
    assert [line.split(": its ")[1].split(" are")[0] for line in choice.thin_training("IVF64,PQ4x8", 2_000, DIM)] == [
        "64 IVF lists", "256 product quantizer centroids per sub-vector"]
    assert choice.thin_training("HNSW8,Flat", 10, DIM) == choice.thin_training("Flat", 10, DIM) == []
    capfd.readouterr()
    trained = shards.train_index("IVF8,Flat", DIM, clustered(100))  # 12.5 vectors a list
    assert trained.is_trained and "WARNING clustering" not in capfd.readouterr().err
    with build.kmeans_warnings_dropped():
        os.write(2, b"WARNING clustering 5 points to 2 centroids: please provide at least 78 training points\n")
        os.write(2, b"something else\n")
    assert capfd.readouterr().err == "something else\n"


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


def column_codecs(path: str) -> dict[str, str]:
    """Each column's compression in the first row group of the Parquet file ``path``."""
    metadata = pq.ParquetFile(path).metadata.row_group(0)
    return {metadata.column(index).path_in_schema.split(".")[0]: metadata.column(index).compression
            for index in range(metadata.num_columns)}


def test_rows_read_back_by_the_stage_store_vectors_plain_and_the_shard_files_compress_them(tmp_path):
    """The staged and kept rows (scratch, read back once) keep their vectors without compression and the rest in
    zstd; the shard's files, an artifact, are zstd throughout; every row the same after both."""
    from transforms.index.forward import KeptPassages, keep_rows, kept_files

    rows = staged_rows(200)
    records = stage(tmp_path / "staged", rows, writers=1, buckets=2)
    kept = KeptPassages(str(tmp_path / "kept"), "", "", "")
    keep_rows(kept, np.arange(200, dtype=np.uint64), embedding_table(rows, DIM))
    plain = {"passage_id": "ZSTD", "title": "ZSTD", "text": "ZSTD", "embedding": "UNCOMPRESSED"}
    assert column_codecs(records[0].path) == {**plain, buckets_module.SAMPLE_KEY: "ZSTD"}
    assert column_codecs(kept_files(kept.directory)[0]) == {**plain, "passage_key": "ZSTD"}
    for record in records:
        buckets_module.write_shard_bucket(str(tmp_path / "index"), "shard-00000", record.bucket, [record.path], DIM)
    written = sorted((tmp_path / "index").rglob("*.parquet"))
    assert {codec for path in written for codec in column_codecs(str(path)).values()} == {"ZSTD"}
    read = pa.concat_tables(pq.read_table(path) for path in written)
    assert sorted(read.column("passage_id").to_pylist()) == [row[0] for row in rows]
    by_id = {row[0]: row[3] for row in rows}
    for passage_id, vector in zip(read.column("passage_id").to_pylist(), read.column("embedding").to_pylist(),
                                  strict=True):
        np.testing.assert_array_equal(vector, by_id[passage_id])


@pytest.mark.parametrize("factory", ["IDMap,Flat", "IVF4,Flat", "IVF4,SQ8", "IDMap,HNSW8"])
def test_the_ids_an_index_stores_are_read_back_from_its_file(factory: str, tmp_path) -> None:
    """What validate compares with a shard's id map: an IDMap's ids, an IVF index's inverted lists' (read
    from a memory-mapped file too)."""
    import faiss

    rng = np.random.default_rng(0)
    vectors, ids = rng.random((300, 8), dtype=np.float32), rng.choice(10**12, size=300, replace=False).astype(np.int64)
    index = faiss.index_factory(8, factory, faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add_with_ids(vectors, ids)
    shards.write_index(index, str(tmp_path / "shard.faiss"))
    stored = shards.stored_ids(shards.read_index(str(tmp_path / "shard.faiss")))
    assert np.array_equal(np.sort(stored), np.sort(ids))
    assert shards.stored_ids(faiss.IndexFlatIP(8)) is None


def test_an_hnsw_index_returns_k_passages_whatever_its_ef_search(tmp_path):
    """FAISS's HNSW search returns at most efSearch vectors: -k 20 --ef-search 1 returned 6 passages (evaluate's
    top-20 fell from 80% to 60% without a word)."""
    vectors, ids = clustered(150), np.arange(150, dtype=np.int64)
    index_dir = write_index_dir(tmp_path, vectors, ids, 1, factory="HNSW4,Flat")
    for ef in (1, 2, 128):
        found = shards.ShardedIndex(index_dir, ef_search=ef).search(vectors[:5], 20)[1]
        assert (found >= 0).sum(axis=1).tolist() == [20] * 5, ef
    assert shards.searches_a_graph("IDMap,HNSW8") and not shards.searches_a_graph("IVF64_HNSW4,Flat")
