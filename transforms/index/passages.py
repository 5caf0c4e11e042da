"""Passage corpora: rows of DPR's ``psgs_w100.tsv`` and ~100-word passages cut from parsed articles.

Pure functions only. A passage id is an int64 everywhere (DPR's ids are integers; FAISS ids are int64), so the
id of a passage is also its FAISS id and needs no global renumbering.
"""

from __future__ import annotations

import csv
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass

from artifacts.ids import int64_of
from artifacts.names import shows_nothing
from artifacts.passages import Passage

DPR_HEADER = ("id", "text", "title")
# Passages cut from an article get the id page_id * PASSAGES_PER_PAGE + chunk: stable across dump refreshes
# as long as the article's text does not change, readable (page 12, chunk 3 -> 1200003) and int64-safe.
PASSAGES_PER_PAGE = 100_000
MAX_REPORTED_CHARS = 300  # of a bad row kept in its dead letter
# Characters of scripts written without spaces between words, each of which is a written unit of its own: CJK
# ideographs and kana. Each counts as a word of a passage, so that a Chinese or Japanese article is cut into passages
# as an English one is, not kept whole as one "word" (BERT's tokenizers give an ideograph a token of its own). Thai,
# Lao, Myanmar and Khmer are not among them: a code point there is no unit (a vowel written before its consonant, a
# stacked consonant), and their phrases are spaced.
_UNSPACED = "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f"
_UNSPACED_CHARACTER = re.compile(f"[{_UNSPACED}]")
_WORD = re.compile(f"[{_UNSPACED}]|[^\\s{_UNSPACED}]+")


@dataclass(frozen=True)
class BadRow:
    """A TSV line that is not a passage: ``reason`` is the counter name, ``detail`` says what is wrong."""

    reason: str
    detail: str
    line: str


def header_columns(header: str) -> tuple[int, int, int]:
    """Positions of id, text and title in a DPR header line (a byte order mark before it is no part of it);
    ValueError if the header is not a DPR one."""
    names = [name.strip().lower() for name in header.removeprefix("\ufeff").rstrip("\r\n").split("\t")]
    if sorted(names) != sorted(DPR_HEADER):
        raise ValueError(f"header {header.strip()[:100]!r} is not the DPR header 'id<TAB>text<TAB>title'")
    return names.index("id"), names.index("text"), names.index("title")


# csv's words for what a corpus line holds, and ours (the reader's advice, "open the file in universal-newline
# mode", is not the user's to follow)
_QUOTING_PROBLEMS = {
    "unexpected end of data": "a quoted field runs past the end of its line (a row is one line: a line break "
                              "inside quotes is not read as part of the field)",
    "new-line character seen in unquoted field": "a carriage return inside a field (a row is one line)",
}


def quoting_problem(error: csv.Error) -> str:
    """What is wrong with a line csv refused, in the corpus's terms."""
    return next((ours for theirs, ours in _QUOTING_PROBLEMS.items() if str(error).startswith(theirs)), str(error))


def csv_fields(line: str, **dialect: object) -> list[str]:
    """The fields of one line by csv's rules (``csv.Error`` when the dialect is strict and the line breaks it). csv
    refuses a field longer than its limit (128 KiB unless raised; one setting per process): no field is longer than
    its line, so the limit is raised to the line's length first."""
    if len(line) > csv.field_size_limit():
        csv.field_size_limit(len(line))
    return next(csv.reader([line], **dialect), [])


def parse_dpr_row(line: str, columns: tuple[int, int, int] = (0, 1, 2)) -> Passage | BadRow:
    """One line of a DPR passage file: tab-separated; a field with a quote is wrapped in quotes, inner quotes
    doubled (csv's ``excel-tab`` rules). Wrong column counts, broken quoting, bad ids and empty text are BadRows."""
    line = line.rstrip("\r\n")
    shown = line[:MAX_REPORTED_CHARS]
    try:
        fields = csv_fields(line, delimiter="\t", quotechar='"', doublequote=True, strict=True)
    except csv.Error as error:
        return BadRow("bad_quoting", quoting_problem(error), shown)
    if len(fields) != 3:
        return BadRow("wrong_column_count", f"{len(fields)} columns, expected 3", shown)
    raw_id, text, title = (fields[column] for column in columns)
    passage_id = parse_passage_id(raw_id)
    if passage_id is None:
        return BadRow("bad_ids", f"id {raw_id[:40]!r} is not an integer from 0 to 2^63 - 1", shown)
    if shows_nothing(text):  # as search refuses such a query: spaces, zero-width and control characters alone
        return BadRow("empty_texts", "the passage text is empty (nothing but spaces or invisible characters)", shown)
    return Passage(passage_id, title, text)


def parse_passage_id(raw: str) -> int | None:
    return int64_of(raw.strip())


def text_words(text: str) -> list[str]:
    """The words of ``text``, as passages count them: its whitespace-separated words, where each character of a
    script written without spaces (``_UNSPACED``) is a word of its own (``unspaced_words``)."""
    return unspaced_words(text) if _UNSPACED_CHARACTER.search(text) else text.split()


def unspaced_words(text: str) -> list[str]:
    """``text_words`` of a text with characters of a script written without spaces: each word but those that follow
    the last one directly keeps the one space before it (``" 東京"``), so that ``"".join`` of a run of them is the
    text as written, spaces made one."""
    words: list[str] = []
    end = 0
    for match in _WORD.finditer(text):
        word = match.group()
        if words and match.start() == end and unicodedata.category(word[0]).startswith("M"):
            words[-1] += word  # a combining mark stays with its character (the kana voicing mark, U+3099)
        else:
            words.append(word if match.start() == end or not words else " " + word)
        end = match.end()
    return words


def word_chunks(text: str, words_per_passage: int) -> Iterator[str]:
    """Non-overlapping chunks of ``words_per_passage`` words (``text_words``; the last may be shorter), words
    joined by one space, as DPR cut Wikipedia into ``psgs_w100``; characters of a script written without spaces
    are words of their own, joined as written."""
    if words_per_passage < 1:
        raise ValueError(f"words_per_passage must be positive, got {words_per_passage}")
    spaced = not _UNSPACED_CHARACTER.search(text)
    words = text.split() if spaced else unspaced_words(text)
    for start in range(0, len(words), words_per_passage):
        chunk = words[start:start + words_per_passage]
        yield " ".join(chunk) if spaced else "".join(chunk).lstrip(" ")


def passage_id_of(page_id: int, chunk_index: int) -> int:
    if not 0 <= chunk_index < PASSAGES_PER_PAGE:
        raise ValueError(f"chunk {chunk_index} of page {page_id} is beyond {PASSAGES_PER_PAGE} passages per page")
    return page_id * PASSAGES_PER_PAGE + chunk_index


def article_passages(page_id: int, title: str, text: str, words_per_passage: int = 100) -> list[Passage]:
    """An article's passages with stable ids (at most PASSAGES_PER_PAGE; callers check ``too_many``)."""
    chunks = list(word_chunks(text, words_per_passage))
    return [Passage(passage_id_of(page_id, index), title, chunk)
            for index, chunk in enumerate(chunks[:PASSAGES_PER_PAGE])]


def too_many_chunks(text: str, words_per_passage: int) -> bool:
    return len(text_words(text)) > PASSAGES_PER_PAGE * words_per_passage


DUPLICATE_KEEPS = ("first", "last")


def decode_corpus_line(raw: bytes) -> tuple[str, bool]:
    """A corpus line as text without NUL bytes (which no tokenizer or reader downstream expects), and whether
    it had any; UnicodeDecodeError if it is not UTF-8."""
    line = raw.decode("utf-8")
    return (line.replace("\x00", ""), True) if "\x00" in line else (line, False)


def corpus_row(raw: bytes, columns: tuple[int, int, int] = (0, 1, 2)) -> tuple[Passage | BadRow, bool]:
    """One corpus line as bytes -> the passage, or a BadRow saying why it is not one (``invalid_utf8`` too), and
    whether NUL bytes were removed from it."""
    try:
        line, had_nul = decode_corpus_line(raw)
    except UnicodeDecodeError as error:
        shown = raw.rstrip(b"\r\n")[:MAX_REPORTED_CHARS].decode("utf-8", errors="replace")
        return BadRow("invalid_utf8", f"not UTF-8 at byte {error.start}: {error.reason}", shown), False
    return parse_dpr_row(line, columns), had_nul
