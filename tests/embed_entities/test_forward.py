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
from transforms.embed_entities.entity_vectors import MENTION_KEY, ModelFacts, read_mention_vectors
from transforms.embed_entities.forward import ENCODED_TAG, FollowInputFiles, InputFiles
from transforms.embed_entities.inputs import INPUT_PREFIX, inputs_table


def input_files(directory: Path) -> InputFiles:
    followed = FollowedFiles(str(directory / "inputs"), INPUT_PREFIX, str(directory / "inputs.list"),
                             str(directory / "ended.json"))
    return InputFiles(str(directory / "facts.json"), followed, str(directory / "parts"))


def mention_inputs(first: int, count: int) -> tuple[np.ndarray, list[MaskInput]]:
    """Keys and [MASK] inputs of ``count`` made-up mentions of entities ``first``...: ids of various lengths."""
    keys = np.array([(entity_id, entity_id * 10, 0) for entity_id in range(first, first + count)], dtype=MENTION_KEY)
    inputs = [MaskInput(int(key["entity_id"]), (101, *range(2000, 2000 + 3 + key["entity_id"] % 7), 103, 102),
                        4 + int(key["entity_id"]) % 7) for key in keys]
    return keys, inputs


def write_input_file(files: InputFiles, name: str, keys: np.ndarray, inputs: list[MaskInput]) -> str:
    path = fs.join(files.followed.directory, f"{INPUT_PREFIX}{name}.parquet")
    fs.write_bytes_atomic(path, tables.parquet_bytes(inputs_table(keys, PackedMaskInputs.of(inputs))))
    return path


def follow(files: InputFiles, spec: ModelSpec, index: int = 0, followers: int = 1) -> list:
    follower = FollowInputFiles(spec, -1, 256, files)
    follower.setup()
    return list(follower.process((index, followers)))


def test_a_follower_encodes_the_files_as_they_come_and_stops_when_the_inputs_have_ended(tmp_path, tiny_bert):
    files, spec = input_files(tmp_path), ModelSpec(str(tiny_bert))
    batches = [mention_inputs(1 + 10 * part, 10) for part in range(3)]
    ended_at = []

    def inputs_pipeline() -> None:  # what PrepareMentions and the launcher do, slowly
        time.sleep(0.3)
        fs.write_json_atomic(files.facts, asdict(ModelFacts(32, 1.0, 2)))
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
    encoded = [output.value for output in outputs if isinstance(output, beam.pvalue.TaggedOutput)
               and output.tag == ENCODED_TAG]
    assert sorted(encoded) == [10, 10, 10]
    parts = [output for output in outputs if not isinstance(output, beam.pvalue.TaggedOutput)]
    assert sorted({bucket for bucket, _ in parts}) == [0, 1]  # buckets of entity ids, from the saved facts
    keys, vectors = read_mention_vectors([part for _, part in parts], 32)
    expected_keys = np.concatenate([keys for keys, _ in batches])
    assert keys.tolist() == expected_keys.tolist()
    expected = MaskEncoder(spec, -1, 256).encode([item for _, inputs in batches for item in inputs])
    np.testing.assert_allclose(vectors, expected, rtol=1e-5, atol=1e-5)


def test_a_failed_inputs_pipeline_stops_the_followers(tmp_path, tiny_bert):
    files, spec = input_files(tmp_path), ModelSpec(str(tiny_bert))
    fs.write_json_atomic(files.followed.ended, {"failed": "no space left on device"})
    with pytest.raises(InputsFailedError, match="no space left on device"):
        follow(files, spec)  # still waiting for the model's facts when it learns of the failure
    fs.write_json_atomic(files.facts, asdict(ModelFacts(32, 1.0, 1)))
    with pytest.raises(InputsFailedError, match="no space left on device"):
        follow(files, spec)
