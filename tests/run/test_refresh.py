"""pipelines/refresh.py: how a previous run's recorded options are compared with this run's."""

from __future__ import annotations

from pipelines.refresh import option_changes


def test_option_changes_names_each_difference_and_ignores_the_previous_run():
    old = {"layer": -1, "model": "a", "previous": "/old", "dtype": "float32"}
    new = {"layer": 2, "model": "a", "previous": "/other", "window": 5, "dtype": "float32"}
    assert option_changes(old, new) == ["layer: -1 -> 2", "window: None -> 5"]
    assert option_changes(old, {**old, "previous_manifest_sha256": "x"}) == []
