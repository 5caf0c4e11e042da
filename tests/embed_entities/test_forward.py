"""transforms/embed_entities/forward.py: the model's part encodes the input files as the inputs' pipeline writes
them and stops when the launcher says the inputs have ended (or failed); how followers share the files:
tests/common/test_follow.py."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest

from artifacts import fs, tables
from encoders.mask_encoder import MaskEncoder
from encoders.mask_inputs import MaskInput, PackedMaskInputs
from encoders.models import ModelSpec
from transforms.common.follow import FollowedFiles, InputsFailedError
from transforms.common.progress import ProgressSettings
from transforms.embed_entities.entity_vectors import MENTION_KEY, ModelFacts
from transforms.embed_entities.forward import FollowInputFiles, InputFiles, rows_to_encode
from transforms.embed_entities.gather import mention_keys, read_refs
from transforms.embed_entities.inputs import INPUT_PREFIX, inputs_table
from transforms.embed_entities.window_store import key_buckets, model_salt, read_bucket, store_files, window_keys

SALT = model_salt(["a model"])


def input_files(directory: Path, known: np.ndarray | None = None) -> InputFiles:
    """Where a follower meets the inputs' pipeline, with ``known`` keys (stored before; none by default)."""
    followed = FollowedFiles(str(directory / "inputs"), INPUT_PREFIX, str(directory / "inputs.list"),
                             str(directory / "ended.json"), followers=1)
    known_path = str(directory / "known.u64")  # as write_known_keys writes them: sorted raw uint64
    np.sort(np.zeros(0, np.uint64) if known is None else known).astype("<u8").tofile(known_path)
    return InputFiles(str(directory / "facts.json"), followed, known_path, str(directory / "pending"),
                      str(directory / "refs"))


def mention_inputs(first: int, count: int) -> tuple[np.ndarray, list[MaskInput]]:
    """Keys and [MASK] inputs of ``count`` made-up mentions of entities ``first``...: ids of various lengths."""
    keys = np.array([(entity_id, entity_id * 10, 0) for entity_id in range(first, first + count)], dtype=MENTION_KEY)
    inputs = [MaskInput(int(key["entity_id"]), (101, *range(2000, 2000 + 3 + key["entity_id"] % 7), 103, 102),
                        4 + int(key["entity_id"]) % 7) for key in keys]
    return keys, inputs


def write_input_file(files: InputFiles, name: str, keys: np.ndarray, inputs: list[MaskInput]) -> str:
    path = fs.join(files.followed.directory, f"{files.followed.share(0)}{name}.parquet")
    fs.write_bytes_atomic(path, tables.parquet_bytes(inputs_table(keys, PackedMaskInputs.of(inputs), SALT)))
    return path


def follow(files: InputFiles, spec: ModelSpec, max_tokens: int = 256) -> list:
    """The outputs of one follower; its progress lines (every 0.05 s at most) go to stderr."""
    progress = ProgressSettings("embed-entities", "mentions encoded", total=40, workers=1, interval=0)
    follower = FollowInputFiles(spec, -1, max_tokens, files, SALT, mentions=40, progress=progress)
    follower.setup()
    try:
        return list(follower.process((0, 1)))
    finally:
        follower.teardown()


def progress_counts(err: str) -> list[int]:
    """The counts of the progress lines written to stderr (``err``)."""
    return [int(line.split()[1].replace(",", "")) for line in err.splitlines() if line.startswith("[embed-entities] ")
            and " mentions encoded in " in line]


def test_a_follower_encodes_the_files_as_they_come_and_stops_when_the_inputs_have_ended(tmp_path, tiny_bert,
                                                                                        capsys):
    files, spec = input_files(tmp_path), ModelSpec(str(tiny_bert))
    batches = [mention_inputs(1 + 10 * part, 10) for part in range(3)]
    ended_at = []

    def inputs_pipeline() -> None:  # what PrepareMentions and the launcher do, slowly
        time.sleep(0.3)
        fs.write_json_atomic(files.facts, asdict(ModelFacts(32, 1.0, 2, store_bits=1)))
        written = []
        for part, (keys, inputs) in enumerate(batches):
            time.sleep(0.3)
            written.append(write_input_file(files, str(part), keys, inputs))
        time.sleep(0.3)
        ended_at.append(time.monotonic())
        fs.write_json_atomic(files.followed.ended, {"files": written})

    writer = threading.Thread(target=inputs_pipeline)
    writer.start()
    outputs = follow(files, spec)
    stopped_at = time.monotonic()
    writer.join()
    assert stopped_at >= ended_at[0]  # it waited for the inputs' end, not for a moment without new files
    counts = progress_counts(capsys.readouterr().err)
    assert counts == sorted(counts) and counts[-1] == 30, counts  # its lines count every mention
    parts = [output for output in outputs if not isinstance(output, beam.pvalue.TaggedOutput)]
    refs = read_refs([part for _, part in parts])
    assert all(key_buckets(read_refs([part])["window_key"], 1).tolist() == [bucket] * len(read_refs([part]))
               for bucket, part in parts)  # bucketed as the store, from the saved facts
    expected_keys = np.concatenate([keys for keys, _ in batches])
    assert sorted(mention_keys(refs).tolist()) == sorted(expected_keys.tolist())
    inputs = [item for _, batch in batches for item in batch]
    assert sorted(refs["window_key"].tolist()) == sorted(window_keys(SALT, PackedMaskInputs.of(inputs)).tolist())
    # every window stored (pending files, several: a kill loses little), with the encoder's vector
    stored = store_files([files.pending], SALT)
    assert len(stored) >= 2 and all(item.path.endswith(".arrow") for item in stored)  # Arrow IPC: see window_store
    store = {key: vector for bucket in (0, 1) for key, vector in zip(*read_bucket(stored, bucket, 1, 32), strict=True)}
    expected = MaskEncoder(spec, -1, 256).encode(inputs)
    found = np.array([store[key] for key in window_keys(SALT, PackedMaskInputs.of(inputs)).tolist()], np.float32)
    np.testing.assert_allclose(found, expected.astype(np.float16), rtol=1e-3, atol=1e-3)


def test_windows_stored_before_are_not_encoded_again(tmp_path, tiny_bert, capsys, monkeypatch):
    keys, inputs = mention_inputs(1, 12)
    window = window_keys(SALT, PackedMaskInputs.of(inputs))
    files = input_files(tmp_path, known=np.sort(window[:5]))
    fs.write_json_atomic(files.facts, asdict(ModelFacts(32, 1.0, 1, store_bits=0)))
    written = write_input_file(files, "0", keys, inputs)
    fs.write_json_atomic(files.followed.ended, {"files": [written]})
    forward = MaskEncoder._forward_host

    def slow_forward(encoder: MaskEncoder, host: tuple):
        time.sleep(0.2)  # several progress lines a batch
        return forward(encoder, host)

    monkeypatch.setattr(MaskEncoder, "_forward_host", slow_forward)
    outputs = follow(files, ModelSpec(str(tiny_bert)), max_tokens=16)  # a forward batch a window
    parts = [output for output in outputs if not isinstance(output, beam.pvalue.TaggedOutput)]
    assert sorted(read_refs([part for _, part in parts])["window_key"].tolist()) == sorted(window.tolist())
    stored, _ = read_bucket(store_files([files.pending], SALT), 0, 0, 32)
    # only the windows not stored before were encoded, each once (the made-up inputs repeat every 7 entities)
    assert stored.tolist() == sorted(set(window.tolist()) - set(window[:5].tolist()))
    # the progress lines count the step's mentions as its batches run (here a window of one mention a batch),
    # those stored before (10) first: not only once a step, which would go from 10 (or 0) to 12
    reused = int(np.isin(window, window[:5]).sum())
    counts = progress_counts(capsys.readouterr().err)
    assert reused == 10 and counts == sorted(counts) and set(range(reused, 13)) <= set(counts), counts


def test_each_window_not_stored_is_encoded_once_for_the_mentions_of_its_window():
    keys = np.array([7, 3, 7, 9, 3, 7], np.uint64)
    rows, weights = rows_to_encode(np.zeros(0, np.uint64), keys)  # nothing stored: the first row of each window
    assert (rows.tolist(), weights.tolist()) == ([0, 1, 3], [3, 2, 1])
    rows, weights = rows_to_encode(np.array([3, 7], np.uint64), keys)  # sorted known keys
    assert (rows.tolist(), weights.tolist()) == ([3], [1])
    rows, weights = rows_to_encode(np.array([3, 7, 9], np.uint64), keys)
    assert (rows.tolist(), weights.tolist()) == ([], [])


def test_a_failed_inputs_pipeline_stops_the_followers(tmp_path, tiny_bert):
    files, spec = input_files(tmp_path), ModelSpec(str(tiny_bert))
    fs.write_json_atomic(files.followed.ended, {"failed": "no space left on device"})
    with pytest.raises(InputsFailedError, match="no space left on device"):
        follow(files, spec)  # still waiting for the model's facts when it learns of the failure
    fs.write_json_atomic(files.facts, asdict(ModelFacts(32, 1.0, 1, store_bits=0)))
    with pytest.raises(InputsFailedError, match="no space left on device"):
        follow(files, spec)


def test_a_model_error_stops_the_thread_reading_ahead_before_it_reaches_the_caller(tmp_path, tiny_bert,
                                                                                  monkeypatch):
    files = input_files(tmp_path)
    fs.write_json_atomic(files.facts, asdict(ModelFacts(32, 1.0, 1, store_bits=0)))
    written = [write_input_file(files, str(part), *mention_inputs(1 + 10 * part, 10)) for part in range(4)]
    fs.write_json_atomic(files.followed.ended, {"files": written})

    def failing(encoder: MaskEncoder, host: tuple):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(MaskEncoder, "_forward_host", failing)
    with pytest.raises(RuntimeError, match="illegal memory access") as raised:
        follow(files, ModelSpec(str(tiny_bert)))
    # the error's traceback (which holds the follower's frames) is still alive here, as a runner holds it while it
    # logs and retries: the thread that read the next steps ahead has been stopped all the same
    assert raised.tb is not None
    assert [thread.name for thread in threading.enumerate() if thread.name == "prefetch"] == []
