"""pipelines/refresh.py: how a previous run's recorded options are compared with this run's."""

from __future__ import annotations

import os

from artifacts.run import manifest
from artifacts.run.manifest import option_changes
from pipelines.refresh import fingerprint_changes


def test_option_changes_names_each_difference_and_ignores_the_previous_run():
    old = {"layer": -1, "model": "a", "previous": "/old", "dtype": "float32"}
    new = {"layer": 2, "model": "a", "previous": "/other", "window": 5, "dtype": "float32"}
    assert option_changes(old, new) == ["layer: -1 -> 2", "window: None -> 5"]
    assert option_changes(old, {**old, "previous_manifest_sha256": "x"}) == []
    # recorded only when not the default (runs from before the option keep their records): absent is the default
    assert option_changes({}, {"language": "it", "prepass": False}) == ["language: 'en' -> 'it'",
                                                                        "prepass: True -> False"]
    assert option_changes({"language": "en"}, {}) == []


def test_model_files_of_the_same_fingerprint_with_other_content_are_a_change(tmp_path):
    """A previous run's model replaced in place by other weights of the same sizes and times: its recorded content
    digest tells (it was reused as unchanged); a record without one (an older version's) goes by the fingerprint."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"old weights")
    pattern = str(model / "*")
    inputs = {"file:model": manifest.file_fingerprint(pattern), "content:model": manifest.content_digest(pattern)}
    record = manifest.StageRecord("embed_entities", {}, inputs, [])
    assert fingerprint_changes(record, {"model": pattern}) == []
    times = os.stat(model / "weights.bin")
    (model / "weights.bin").write_bytes(b"new weights")
    os.utime(model / "weights.bin", ns=(times.st_atime_ns, times.st_mtime_ns))
    assert manifest.file_fingerprint(pattern) == inputs["file:model"]
    assert fingerprint_changes(record, {"model": pattern}) == ["model"]
    older = manifest.StageRecord("embed_entities", {}, {"file:model": inputs["file:model"]}, [])
    assert fingerprint_changes(older, {"model": pattern}) == []
