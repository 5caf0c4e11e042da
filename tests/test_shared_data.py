"""A clone without ../shared/data: which tests read it (CI runs them once more with it hidden), and the real data
samples/ ships in its place."""

from __future__ import annotations

from tests.builders import dpr_passages
from tests.conftest import BUNDLED_PASSAGES, BUNDLED_SAMPLE, PASSAGES, WIKIPEDIA, names_shared_path


def itwiki_path():
    return WIKIPEDIA / "itwiki-sample.xml.gz"


def calls_a_reader_of_shared_data():
    return [itwiki_path() for _ in range(1)]


def test_code_that_names_a_shared_path_is_found_through_the_functions_it_calls():
    assert names_shared_path(itwiki_path, set())
    assert names_shared_path(calls_a_reader_of_shared_data, set())  # in a comprehension, through a helper
    assert names_shared_path(lambda: PASSAGES.exists(), set())
    assert not names_shared_path(lambda: BUNDLED_SAMPLE.exists(), set())
    assert not names_shared_path(dpr_passages, set())  # reads samples/ by default


def test_the_bundled_passages_are_the_first_rows_of_the_shared_subset(shared_data):
    subset = shared_data / "passages" / "psgs_w100_subset_from_haystack_nqdev.tsv"
    bundled = BUNDLED_PASSAGES.read_text(encoding="utf-8").splitlines()
    assert len(bundled) == 151 and bundled == subset.read_text(encoding="utf-8").splitlines()[:151]
    assert len({passage.passage_id for passage in dpr_passages()}) == 150
