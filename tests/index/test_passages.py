"""Passage corpora: DPR psgs_w100 rows with their quoting, ~100-word passages cut from articles, shard hashing."""

from __future__ import annotations

from collections import Counter

import pytest

from artifacts.passages import Passage, sample_key, shard_of
from tests.builders import format_dpr_row
from tests.conftest import PASSAGES
from transforms.index.passages import (
    PASSAGES_PER_PAGE,
    BadRow,
    article_passages,
    corpus_row,
    decode_corpus_line,
    header_columns,
    parse_dpr_row,
    passage_id_of,
    too_many_chunks,
    word_chunks,
)

HEAD2 = PASSAGES / "psgs_w100_head2_as_quoted_in_readme.tsv"
SUBSET = PASSAGES / "psgs_w100_subset_from_haystack_nqdev.tsv"


def real_lines(path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


@pytest.mark.usefixtures("shared_data")
def test_the_real_quoted_rows_unquote_and_format_back_identically():
    header, *lines = real_lines(HEAD2)
    assert header_columns(header) == (0, 1, 2)
    first, second = (parse_dpr_row(line) for line in lines)
    assert (first.passage_id, first.title, second.passage_id, second.title) == (1, "Aaron", 2, "Aaron")
    assert first.text.startswith('Aaron Aaron ( or ; "Ahärôn") is a prophet, high priest')
    assert first.text.endswith("Part of the Law (Torah) that Moses received from")
    assert 'as Moses\' "prophet" (Exodus 4:10-17; 7:1)' in second.text
    assert [format_dpr_row(row) for row in (first, second)] == lines


@pytest.mark.usefixtures("shared_data")
def test_all_751_real_rows_are_100_word_passages_that_round_trip():
    header, *lines = real_lines(SUBSET)
    columns = header_columns(header)
    rows = [parse_dpr_row(line, columns) for line in lines]
    assert len(rows) == 751 and all(isinstance(row, Passage) for row in rows)
    assert {len(row.text.split()) for row in rows} == {100}
    assert len({row.passage_id for row in rows}) == 751
    assert [format_dpr_row(row) for row in rows] == lines
    assert rows[0] == Passage(128529, "Erie Canal", rows[0].text) and rows[0].text.startswith("elevation of . Lake")


@pytest.mark.parametrize(("line", "reason"), [
    ('3\t"unclosed\tT', "bad_quoting"),
    ('4\t"a"b\tT', "bad_quoting"),
    ("5\tonly two", "wrong_column_count"),
    ("6\tx\ty\tz", "wrong_column_count"),
    ("", "wrong_column_count"),
    ("x7\ttext\tT", "bad_ids"),
    ("-7\ttext\tT", "bad_ids"),
    ("12345678901234567890\ttext\tT", "bad_ids"),
    ("9223372036854775808\ttext\tT", "bad_ids"),  # 2^63: past int64
    ("\u0663\ttext\tT", "bad_ids"),  # an Arabic-Indic digit
    ("8\t   \tT", "empty_texts"),
    ('9\t""\tT', "empty_texts"),
    ("10\t\u200b\u200b\tT", "empty_texts"),  # zero-width spaces: indexed as a title alone, the text tokenized to none
    ("11\t\x01\ufeff \tT", "empty_texts"),
])
def test_malformed_rows_say_why(line, reason):
    row = parse_dpr_row(line)
    assert isinstance(row, BadRow) and row.reason == reason and row.line == line


@pytest.mark.parametrize(("line", "detail"), [
    ('3\t"unclosed\tT', "a quoted field runs past the end of its line (a row is one line: a line break inside "
                        "quotes is not read as part of the field)"),
    ("4\ttext\rmore\tT", "a carriage return inside a field (a row is one line)"),  # was csv's "universal-newline"
    ('4\t"a"b\tT', "'\t' expected after '\"'"),
])
def test_broken_quoting_says_what_is_wrong_with_the_line(line, detail):
    assert parse_dpr_row(line) == BadRow("bad_quoting", detail, line)


def test_ids_are_every_int64():
    """An id is any non-negative int64 in ASCII digits, of any length: leading zeros are allowed."""
    for raw, value in (("9223372036854775807", 2**63 - 1), ("1000000000000000000", 10**18),
                       ("0000000000000000042", 42), ("0" * 40 + "7", 7)):
        assert parse_dpr_row(f"{raw}\ttext\tT") == Passage(value, "T", "text")


def test_rows_with_inner_quotes_and_reordered_headers():
    assert parse_dpr_row('1\t"say ""hi"" now"\t"The ""Q"""') == Passage(1, 'The "Q"', 'say "hi" now')
    assert parse_dpr_row("2\tHe said \"hi\" there\tT") == Passage(2, "T", 'He said "hi" there')
    columns = header_columns("title\tid\ttext\n")
    assert columns == (1, 2, 0)
    assert header_columns("\ufeffid\ttext\ttitle\r\n") == (0, 1, 2)  # a file saved with a byte order mark
    assert parse_dpr_row("Paris\t17\tParis is a city.", columns) == Passage(17, "Paris", "Paris is a city.")
    with pytest.raises(ValueError, match="not the DPR header"):
        header_columns("id\ttext\n")


def test_articles_are_cut_into_word_chunks_with_stable_ids():
    text = " ".join(f"w{index}" for index in range(7)) + "\n\n  "
    assert list(word_chunks(text, 3)) == ["w0 w1 w2", "w3 w4 w5", "w6"]
    assert article_passages(12, "Twelve", text, 3) == [
        Passage(1200000, "Twelve", "w0 w1 w2"), Passage(1200001, "Twelve", "w3 w4 w5"),
        Passage(1200002, "Twelve", "w6")]
    assert article_passages(12, "Twelve", "  \n ", 3) == []
    assert article_passages(3, "T", "a\tb\nc  d", 100) == [Passage(300000, "T", "a b c d")]
    with pytest.raises(ValueError):
        passage_id_of(1, PASSAGES_PER_PAGE)
    assert not too_many_chunks("a b", 1) and too_many_chunks("a " * (PASSAGES_PER_PAGE + 1), 1)


def test_characters_of_scripts_written_without_spaces_are_words_of_their_own():
    """A Japanese article was one "word", so one passage of which the encoder read only the start; each ideograph
    or kana (with a combining voicing mark) now counts as a word, and a chunk is the text as written. A Thai or Khmer
    code point is no unit (a chunk would end inside a syllable): their words stay the spaced ones."""
    assert list(word_chunks("東京は日本の首都。 Tokyo (東京, Tōkyō) is big.", 4)) == [
        "東京は日", "本の首都", "。 Tokyo (東", "京, Tōkyō) is", "big."]
    assert list(word_chunks("か\u3099がみ", 2)) == ["か\u3099が", "み"]
    assert list(word_chunks("ที่นี่ คือ ខ្មែរ abc", 2)) == ["ที่นี่ คือ", "ខ្មែរ abc"]
    japanese = "東京都は日本の首都である。" * 40
    assert [len(passage.text) for passage in article_passages(5, "東京都", japanese, 100)] == [100] * 5 + [20]
    assert "".join(passage.text for passage in article_passages(5, "東京都", japanese, 100)) == japanese
    assert too_many_chunks("東" * (PASSAGES_PER_PAGE + 1), 1)


@pytest.mark.parametrize(("raw", "expected"), [
    (b"1\ttext\tT\n", ("1\ttext\tT\n", False)),
    (b"1\tte\x00xt\x00\tT\n", ("1\ttext\tT\n", True)),
    ("1\tcaf\u00e9\tT".encode(), ("1\tcaf\u00e9\tT", False)),
])
def test_corpus_lines_are_decoded_without_nul_bytes(raw, expected):
    assert decode_corpus_line(raw) == expected


def test_a_corpus_line_that_is_not_utf8_raises():
    with pytest.raises(UnicodeDecodeError):
        decode_corpus_line(b"1\tcaf\xe9\tT\n")


def test_corpus_rows_from_bytes_say_why_they_are_not_passages():
    assert corpus_row(b"1\tte\x00xt\tT\n") == (Passage(1, "T", "text"), True)
    assert corpus_row(b"T\t2\ttext\n", (1, 2, 0)) == (Passage(2, "T", "text"), False)
    bad, had_nul = corpus_row(b"3\tcaf\xe9\tT\r\n")
    assert bad == BadRow("invalid_utf8", "not UTF-8 at byte 5: invalid continuation byte", "3\tcaf\ufffd\tT")
    assert not had_nul
    assert corpus_row(b"x\ttext\tT\n")[0].reason == "bad_ids"


@pytest.mark.usefixtures("shared_data")
def test_shards_are_stable_and_balanced_on_real_ids():
    _, *lines = real_lines(SUBSET)
    ids = [parse_dpr_row(line).passage_id for line in lines]
    counts = Counter(shard_of(passage_id, 4) for passage_id in ids)
    assert set(counts) == {0, 1, 2, 3} and max(counts.values()) - min(counts.values()) < 60
    assert [shard_of(passage_id, 4) for passage_id in ids] == [shard_of(passage_id, 4) for passage_id in ids]
    assert all(shard_of(passage_id, 1) == 0 for passage_id in ids)
    keys = [sample_key(passage_id) for passage_id in ids]
    assert len(set(keys)) == 751 and all(0 <= key < 2**63 for key in keys)


def test_a_passage_of_a_megabyte_is_a_passage_not_bad_quoting():
    """csv's field size limit (128 KiB) is not a limit of the corpus format."""
    text = 'He said "hello" ' + "word " * 200_000
    line = format_dpr_row(Passage(7, "A long page", text))
    assert len(line) > 1_000_000
    assert parse_dpr_row(line) == Passage(7, "A long page", text)
