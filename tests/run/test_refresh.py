"""pipelines/refresh.py: how a previous run's recorded options are compared with this run's."""

from __future__ import annotations

import os
import shutil

from artifacts.run import manifest
from artifacts.run.manifest import option_changes
from pipelines.embed_entities import window_salt
from pipelines.refresh import fingerprint_changes, model_identity, moved_model_option
from transforms.embed_entities.graph import EmbedConfig
from transforms.embed_entities.window_store import model_salt


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
    assert fingerprint_changes(older, {}) == ["model"]  # local then, a hub name now


def test_a_model_copied_elsewhere_is_the_same_model_where_the_record_holds_its_content(tmp_path):
    """Its files touched or at another path: no change by content; an older version's record, which holds no
    content digest, goes by the fingerprint (paths, sizes, times)."""
    model, moved = tmp_path / "model", tmp_path / "moved"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"weights")
    shutil.copytree(model, moved, copy_function=shutil.copyfile)
    os.utime(moved / "weights.bin", (1, 1))
    old, new = str(model / "*"), str(moved / "*")
    record = manifest.StageRecord("embed_entities", {"model": str(model)}, {
        "file:model": manifest.file_fingerprint(old), "content:model": manifest.content_digest(old)}, [])
    older = manifest.StageRecord("embed_entities", record.options, {"file:model": record.inputs["file:model"]}, [])
    assert (fingerprint_changes(record, {"model": new}), fingerprint_changes(older, {"model": new})) == ([], ["model"])
    assert model_identity(str(moved)) == model_identity(str(model)) == f"content:{record.inputs['content:model']}"
    assert model_identity("bert-base-uncased") == "bert-base-uncased"
    current = {"model": str(moved), "layer": -1}
    assert moved_model_option(record, record.options, current, "model", []) == {"model": str(moved)}
    for refused in ((record, ["model"]), (older, [])):  # another model's files; no digest to tell
        assert moved_model_option(refused[0], record.options, current, "model", refused[1]) == record.options


def test_a_hub_model_keeps_the_window_keys_of_earlier_versions(tmp_path):
    """Windows were keyed by the model's name and its local files' fingerprints (none for a hub name): a hub model's
    stores keep their salt; a local model's is its files' content, wherever they lie."""
    hub = EmbedConfig(model="bert-base-uncased", layer=-2, dtype="bfloat16")
    assert window_salt(hub) == model_salt(["bert-base-uncased", {}, -2, "bfloat16"])  # as before 2026-12-07
    model, moved = tmp_path / "model", tmp_path / "moved"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"weights")
    shutil.copytree(model, moved, copy_function=shutil.copyfile)
    assert window_salt(EmbedConfig(model=str(model))) == window_salt(EmbedConfig(model=str(moved))) != window_salt(
        EmbedConfig(model=str(model), layer=-2))
