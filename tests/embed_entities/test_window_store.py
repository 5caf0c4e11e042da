"""transforms/embed_entities/window_store.py: a window's key changes exactly when the model's input does (a word
changed just inside the token budget changes it, one just outside does not), and with the model; store files keep
their rows by bucket of keys, read back bucket by bucket whatever the bucket bits they were written with."""

from __future__ import annotations

import numpy as np
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from artifacts import fs
from encoders.mask_inputs import PackedMaskInputs, mask_inputs
from encoders.models import load_tokenizer
from tests.builders import MirrorFileSystem, mirrored
from transforms.common.packed import found_in
from transforms.embed_entities import window_store
from transforms.embed_entities.window_store import (
    bucket_keys,
    group_bounds,
    key_buckets,
    load_known,
    model_salt,
    read_bucket,
    store_files,
    window_keys,
    write_known_keys,
    write_store_file,
)

WORDS = (
    "apple", "river", "house", "green", "music", "table", "winter", "stone", "paper", "light", "water", "horse",
    "city", "garden", "money", "field", "summer", "window", "doctor", "forest", "train", "bridge", "island",
    "mountain", "school", "letter", "market", "castle", "village", "ocean", "engine", "flower", "silver", "animal",
    "battle", "camera", "dinner", "energy", "family",
)
LENGTH = 16  # 13 tokens of context: the reference rule keeps 7 before the [MASK] and 6 after (both sides long)


def mention_row(left: list[str], mention: str, right: list[str]) -> dict:
    text = f"{' '.join(left)} {mention} {' '.join(right)}"
    start = len(" ".join(left)) + 1
    return {"entity_id": 1, "page_id": 5, "link_index": 0, "text": text, "start": start,
            "end": start + len(mention)}


def key_of(tokenizer, row: dict, salt: str) -> int:
    return int(window_keys(salt, PackedMaskInputs.of(mask_inputs([row], tokenizer, LENGTH)))[0])


def test_a_window_key_changes_exactly_when_the_models_input_does(tiny_bert):
    tokenizer = load_tokenizer(str(tiny_bert))
    assert all(len(tokenizer.tokenize(word)) == 1 for word in WORDS)  # one token a word: the budget in words
    left, right, salt = WORDS[:20], WORDS[20:], model_salt(["model"])
    original = key_of(tokenizer, mention_row(left, "Paris", right), salt)

    def changed(side: str, index: int) -> int:
        words = {"left": list(left), "right": list(right)}
        words[side][index] = "banana"
        return key_of(tokenizer, mention_row(words["left"], "Paris", words["right"]), salt)

    # kept: the 7 words before the mention (left[13:]) and the 6 after it (right[:6])
    assert changed("left", 13) != original and changed("right", 5) != original  # just inside the budget
    assert changed("left", 12) == original and changed("right", 6) == original  # just outside it
    assert changed("right", -1) == original
    # the mention itself is replaced by [MASK]: another anchor text is the same input
    assert key_of(tokenizer, mention_row(left, "the French capital", right), salt) == original
    # another model (or layer, dtype, model files) never shares a key
    assert key_of(tokenizer, mention_row(left, "Paris", right), model_salt(["other model"])) != original


@pytest.mark.parametrize("coarse, fine", [(".parquet", ".arrow"), (".arrow", ".parquet"), (".arrow", ".arrow")])
def test_store_files_are_read_bucket_by_bucket_whatever_their_bucket_bits_and_format(tmp_path, coarse, fine):
    rng = np.random.default_rng(3)
    keys = rng.integers(0, np.iinfo(np.uint64).max, 500, dtype=np.uint64)
    vectors = rng.normal(size=(500, 8)).astype(np.float32)
    salt = model_salt(["m"])
    write_store_file(str(tmp_path / f"coarse{coarse}"), keys[:300], vectors[:300], salt, bits=2)
    write_store_file(str(tmp_path / f"fine{fine}"), keys[200:], vectors[200:], salt, bits=5)  # 100 keys in both
    write_store_file(str(tmp_path / f"other{fine}"), keys[:10], vectors[:10], model_salt(["another"]), bits=2)
    (tmp_path / "notes.txt").write_text("not a store file")
    files = store_files([str(tmp_path)], salt)
    assert sorted(item.bits for item in files) == [2, 5]  # another model's file is not read
    seen = []
    for bucket in range(16):  # read as a store of 4 bits
        found, stored = read_bucket(files, bucket, 4, 8)
        assert (key_buckets(found, 4) == bucket).all() and list(found) == sorted(set(found.tolist()))
        where = {int(key): row for row, key in enumerate(keys.tolist())}
        np.testing.assert_allclose(stored.astype(np.float32), vectors[[where[int(key)] for key in found]],
                                   rtol=1e-3, atol=1e-3)  # float16
        seen += found.tolist()
        assert bucket_keys(files, bucket, 4).tolist() == found.tolist()
    assert sorted(seen) == sorted(keys.tolist())
    write_known_keys(files, str(tmp_path / "known.u64"))
    known = load_known(str(tmp_path / "known.u64"))
    assert known.tolist() == sorted(keys.tolist())
    present, _ = found_in(known, np.array([keys[7], keys[7] ^ np.uint64(1)], dtype=np.uint64))
    assert present.tolist() == [True, False]


def test_a_buckets_rows_are_cut_into_row_groups_of_equal_size_within_the_bucket():
    buckets = np.array([0] * 10 + [3] * 4 + [7])
    assert group_bounds(buckets, 4) == [(0, 3), (3, 6), (6, 10), (10, 14), (14, 15)]
    assert group_bounds(buckets, 100) == [(0, 10), (10, 14), (14, 15)]
    assert group_bounds(np.zeros(0, dtype=np.int64), 4) == []


def group_rows(path) -> list[int]:
    """Rows of each row group of a Parquet file, or of each record batch of an Arrow IPC file."""
    if path.suffix == ".arrow":
        reader = ipc.open_file(path)
        return [reader.get_batch(batch).num_rows for batch in range(reader.num_record_batches)]
    metadata = pq.ParquetFile(path).metadata
    return [metadata.row_group(group).num_rows for group in range(metadata.num_row_groups)]


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_a_large_bucket_is_written_in_several_row_groups_and_read_back_whole(tmp_path, monkeypatch, suffix):
    rng = np.random.default_rng(5)
    keys = rng.integers(0, np.iinfo(np.uint64).max, 1000, dtype=np.uint64)
    vectors = rng.normal(size=(1000, 8)).astype(np.float32)
    salt = model_salt(["m"])
    write_store_file(str(tmp_path / f"whole{suffix}"), keys, vectors, salt, bits=2)
    monkeypatch.setattr(window_store, "ROW_GROUP_BYTES", 16 * 50)  # 50 rows of 8 float16 values
    (tmp_path / "cut").mkdir()
    write_store_file(str(tmp_path / "cut" / f"cut{suffix}"), keys, vectors, salt, bits=2)
    groups = group_rows(tmp_path / "cut" / f"cut{suffix}")
    assert max(groups) <= 50 and sum(groups) == 1000 and len(groups) > 4 * 5
    assert sorted(tmp_path.iterdir()) == [tmp_path / "cut", tmp_path / f"whole{suffix}"]  # no temporary left
    whole, cut = store_files([str(tmp_path)], salt), store_files([str(tmp_path / "cut")], salt)
    assert len(whole[0].buckets) == 4 and len(cut[0].buckets) == len(groups)
    for bucket in range(8):  # read as a store of 3 bits
        expected_keys, expected = read_bucket(whole, bucket, 3, 8)
        found, stored = read_bucket(cut, bucket, 3, 8)
        assert found.tolist() == expected_keys.tolist() and len(found) > 0
        np.testing.assert_array_equal(stored, expected)


def test_a_pending_files_bucket_read_from_an_object_store_fetches_its_own_bytes(tmp_path):
    """The gather reads one bucket of each of hundreds of pending files: from an object store it fetches about the
    bucket's bytes (~68 KB here; at least 256 KB a request), not the 16 MB Beam's reader fetches at each read
    outside its buffer."""
    rng = np.random.default_rng(6)
    keys = rng.integers(0, np.iinfo(np.uint64).max, 64 * 500, dtype=np.uint64)
    vectors = rng.normal(size=(len(keys), 64)).astype(np.float32)
    salt = model_salt(["m"])
    write_store_file(str(tmp_path / "pending.arrow"), keys, vectors, salt, bits=6)
    [remote] = store_files([mirrored(tmp_path)], salt)
    MirrorFileSystem.log.clear()
    found, stored = read_bucket([remote], 10, 6, 64)
    expected_keys, expected = read_bucket(store_files([str(tmp_path)], salt), 10, 6, 64)
    assert found.tolist() == expected_keys.tolist() and len(found) > 400
    np.testing.assert_array_equal(stored, expected)
    assert sum(MirrorFileSystem.log.fetched) < fs.RANGE_READ_BYTES + len(found) * (8 + 64 * 2) + 20_000


def test_a_buckets_pending_files_are_read_several_at_a_time_from_an_object_store(tmp_path):
    rng = np.random.default_rng(7)
    salt = model_salt(["m"])
    for index in range(24):  # the follower's pending files, each with keys of every bucket
        keys = rng.integers(0, np.iinfo(np.uint64).max, 64, dtype=np.uint64)
        write_store_file(str(tmp_path / f"pending-{index}.arrow"), keys, rng.normal(size=(64, 4)), salt, bits=2)
    local, remote = store_files([str(tmp_path)], salt), store_files([mirrored(tmp_path)], salt)
    MirrorFileSystem.log.clear(delay=0.01)
    for bucket in range(4):
        expected_keys, expected = read_bucket(local, bucket, 2, 4)
        found, stored = read_bucket(remote, bucket, 2, 4)
        assert found.tolist() == expected_keys.tolist() and len(found) > 24 * 8
        np.testing.assert_array_equal(stored, expected)
        assert bucket_keys(remote, bucket, 2).tolist() == found.tolist()
    assert MirrorFileSystem.log.most_at_once > 4


def test_no_known_keys_is_an_empty_array(tmp_path):
    write_known_keys([], str(tmp_path / "known.u64"))
    assert load_known(str(tmp_path / "known.u64")).tolist() == []
