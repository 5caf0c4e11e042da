"""Audit of issue 3: the linker's candidate cache stays bounded, and answers the same after it is emptied."""

from __future__ import annotations

from artifacts import linker as linker_module
from artifacts.linker import EntityLinker, NameRow, build_kb_trie, write_linker

CONFIG = {"max_mention_length": 100, "case_sensitive": False, "min_link_prob": 0.05, "min_prior_prob": 0.3,
          "min_link_count": 1}


def test_candidate_cache_is_bounded(tmp_path, monkeypatch):
    names = ["paris", "london", "rome", "berlin", "madrid"]
    kb = build_kb_trie([name.title() for name in names])
    titles = [""] * len(names)
    for name in names:
        titles[kb[name.title()]] = name.title()
    write_linker(str(tmp_path), [NameRow(name, kb[name.title()] + 1, 2, 2, 4) for name in names], kb, titles, CONFIG)
    monkeypatch.setattr(linker_module, "CANDIDATE_CACHE_SIZE", 2)
    linker = EntityLinker.load(str(tmp_path))
    first = [linker.detect(name.upper()) for name in names]
    assert len(linker._candidates_cache) <= 2
    assert [linker.detect(name.upper()) for name in names] == first
    assert [[c.title for c in mentions[0].candidates] for mentions in first] == [[name.title()] for name in names]
