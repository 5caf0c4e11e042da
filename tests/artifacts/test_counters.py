"""Every counter a stage counts is declared by a stage of the pipeline: the report reads the declarations (label,
kind) instead of guessing from the name, so an undeclared counter would show as a plain processed count."""

from __future__ import annotations

import ast

import pytest

from artifacts.counters import Counter, declare, dropped, error, processed
from pipelines.run_all import declared_counters
from tests.conftest import REPO

COUNTING_LAYERS = ("pipelines", "transforms", "encoders")
COUNTING_CALLS = {"count", "count_some", "dead_letter"}


def counting_function(call: ast.Call) -> str | None:
    """``count`` / ``count_some`` / ``dead_letter`` called by name or through the ``dead_letters`` module (not
    ``str.count``)."""
    function = call.func
    if isinstance(function, ast.Name):
        return function.id
    if isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name) \
            and function.value.id == "dead_letters":
        return function.attr
    return None


def counted_names(source: str) -> set[str]:
    """The literal counter names passed to ``count(...)`` / ``dead_letter(...)``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.args and counting_function(node) in COUNTING_CALLS:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.add(first.value)
    return found


def counted_in_repository() -> dict[str, list[str]]:
    """Counter name -> the modules that count it."""
    where: dict[str, list[str]] = {}
    for layer in COUNTING_LAYERS:
        for path in sorted((REPO / layer).rglob("*.py")):
            for name in counted_names(path.read_text(encoding="utf-8")):
                where.setdefault(name, []).append(str(path.relative_to(REPO)))
    return where


def test_the_scan_finds_literal_counter_names_only() -> None:
    source = '''
count("rows_read")
count("rows", len(rows))
yield dead_letter("bad_rows", "why", line=1)
dead_letters.count("dotted")
title.count("/")
count(name)
Metrics.counter("ns", "not_ours")
something_else("nope")
'''
    assert counted_names(source) == {"rows_read", "rows", "bad_rows", "dotted"}


def test_the_scan_sees_the_counters_of_the_converted_stage() -> None:
    counted = counted_in_repository()
    assert {"entities_with_mentions", "mentions_sampled", "links_to_non_entities"} <= set(counted)
    assert counted["mentions_sampled"] == ["transforms/mentions/graph.py"]


def test_every_counted_name_is_declared_by_a_stage() -> None:
    declared = {name for counters in declared_counters().values() for name in counters}
    undeclared = {name: modules for name, modules in counted_in_repository().items() if name not in declared}
    assert undeclared == {}


def test_declared_counters_are_each_stages_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name two stages count keeps each stage's declaration (the report showed the first stage's label for
    both)."""
    class Stage:
        def __init__(self, name: str, counters: dict[str, Counter]) -> None:
            self.name, self.counters = name, counters

    first = declare(processed("rows", "rows read"), error("bad_rows", "rows that do not parse"))
    second = declare(processed("rows", "rows read again"), dropped("short_rows", "rows too short"))
    monkeypatch.setattr("pipelines.run_all.PIPELINE", (("a", Stage("a_stage", first)), ("b", Stage("b_stage", second))))
    assert declared_counters() == {"a_stage": first, "b_stage": second}
