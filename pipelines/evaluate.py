"""evaluate: top-k retrieval accuracy of the index under OUT with DPR's answer-matching rule, per question file.

A question counts as answered within k when one of its first k passages contains an answer: the passage text
and the answer are NFD-normalized, split into tokens (runs of letters, digits and marks, or single other
non-space characters), lower-cased, and the answer's tokens must appear as a contiguous run in the passage's
(DPR's ``has_answer`` with its SimpleTokenizer, "string" match; the title is not searched, as in DPR). With
``--match regex`` (CuratedTREC's answers are patterns) an answer is a regular expression, NFD-normalized, searched
in the NFD-normalized passage uncased (DPR's "regex" match).
"""

from __future__ import annotations

import argparse
import ast
import codecs
import csv
import json
import os
import sys
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import regex

from artifacts import fs
from artifacts.errors import InputError, first_line, on_one_line
from artifacts.names import has_lone_surrogate, shows_nothing
from pipelines.launcher.flags import DEFAULT_KS
from pipelines.search import Retriever
from transforms.index.passages import csv_fields

_FLAGS = regex.IGNORECASE | regex.UNICODE | regex.MULTILINE  # DPR's, for its tokens and its answer patterns
_TOKEN = regex.compile(r"[\p{L}\p{N}\p{M}]+|[^\p{Z}\p{C}]", flags=_FLAGS)


TSV_FORM = "question<TAB>['answer', ...] per line"
JSON_FORM = 'a JSON list of {"question": str, "answers": [str, ...]}'


@dataclass(frozen=True)
class Question:
    question: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class QuestionFile:
    path: str
    questions: list[Question]
    bad_lines: int


def answer_tokens(text: str) -> list[str]:
    """DPR SimpleTokenizer words, uncased, of NFD-normalized text."""
    return [token.lower() for token in _TOKEN.findall(unicodedata.normalize("NFD", text))]


def has_answer(answers: Sequence[str], text: str) -> bool:
    """Whether ``text`` contains one of ``answers`` as a contiguous run of tokens. Empty answers match nothing
    (DPR's own loop would let an empty answer match every passage)."""
    # a cheap filter first: a token of the text, lowered alone, is a substring of the whole text case-folded (not
    # lowered: "ΟΔΟΣ'Α" lowers to "οδοσ'α" as a whole, its token "ΟΔΟΣ" to "οδος" with a final sigma)
    folded = unicodedata.normalize("NFD", text).casefold()
    text_tokens: list[str] | None = None
    for answer in answers:
        wanted = answer_tokens(answer)
        if not wanted or wanted[0].casefold() not in folded:
            continue
        if text_tokens is None:
            text_tokens = answer_tokens(text)
        size = len(wanted)
        if any(text_tokens[start:start + size] == wanted for start in range(len(text_tokens) - size + 1)):
            return True
    return False


def answer_pattern(answer: str) -> regex.Pattern | None:
    """An answer of ``--match regex`` as DPR compiles it; None when it is no regular expression (DPR's matches
    nothing) or one that an empty text matches (``''``, ``a*``: DPR's matches every passage)."""
    try:
        pattern = regex.compile(unicodedata.normalize("NFD", answer), flags=_FLAGS)
    except (regex.error, RecursionError, MemoryError):
        return None
    return None if pattern.search("") is not None else pattern


def answer_matcher(answers: Sequence[str], match: str) -> Callable[[str], bool]:
    """Whether a passage's text holds one of ``answers``, by DPR's ``match`` type (the patterns compiled once)."""
    if match == "string":
        return lambda text: has_answer(answers, text)
    patterns = [pattern for pattern in map(answer_pattern, answers) if pattern is not None]

    def holds_a_pattern(text: str) -> bool:
        normalized = unicodedata.normalize("NFD", text)  # once a passage, not once a pattern
        # a match of no characters (a word boundary, a lookahead) is not the answer found
        return any(match.group() for pattern in patterns for match in pattern.finditer(normalized))
    return holds_a_pattern


def answerable(answer: str, match: str) -> bool:
    """Whether ``answer`` can match a passage: it holds a word (``has_answer`` matches no empty answer), or with
    ``--match regex`` it is a regular expression that an empty text does not match (``answer_pattern``)."""
    return bool(answer_tokens(answer)) if match == "string" else answer_pattern(answer) is not None


def checked_question(question: object, answers: object, match: str = "string") -> Question | None:
    """A question with its answers; None unless the question is text that shows something and that a tokenizer
    can take (no lone surrogate, as a JSON "\\ud800" escape or a qas file's answer literal can hold) and the
    answers a list (or a qas file's tuple, which DPR's reader takes too) of strings of which one at least can match
    (``answerable``: a question with none could never be answered)."""
    if not isinstance(question, str) or shows_nothing(question) or has_lone_surrogate(question):
        return None
    if not isinstance(answers, (list, tuple)) or not all(isinstance(answer, str) for answer in answers):
        return None
    if not any(answerable(answer, match) for answer in answers):
        return None
    return Question(question, tuple(answers))


def parse_qas_row(fields: list[str], match: str = "string") -> Question | None:
    """One row of a DPR qas file: question<TAB>['answer', ...] (a Python list literal, or a tuple); further fields
    (an id column) are ignored, as DPR's reader does."""
    if len(fields) < 2:
        return None
    try:
        answers = ast.literal_eval(fields[1])
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return checked_question(fields[0], answers, match)


def parse_entity_question(item: object, match: str = "string") -> Question | None:
    """One EntityQuestions item: {"question": str, "answers": [str, ...]}."""
    return checked_question(item.get("question"), item.get("answers"), match) if isinstance(item, dict) else None


def parse_qas_line(line: bytes, match: str = "string") -> Question | None:
    """A question of one line of a qas file, read by DPR's csv rules (not strict: text after a closing quote is
    kept, ``"who sings" with reba``); None when the line is no UTF-8 or no question. A quote that does not close
    ends with its line: it cannot take the lines after it (each is a question of its own)."""
    try:
        fields = csv_fields(line.decode("utf-8"), delimiter="\t")
    except (UnicodeDecodeError, csv.Error):
        return None
    return parse_qas_row(fields, match)


def question_suffix(directory: str) -> str:
    """The suffix of the question files a directory holds (``.tsv``, ``.csv`` as DPR's ``nq-test.qa.csv``, or
    ``.json``: the one most of its files have)."""
    names = [os.path.basename(path).lower() for path in fs.list_files(directory, "*")]
    counts = {suffix: sum(name.endswith(suffix) for name in names)
              for suffix in (f"{kind}{compression}" for compression in ("", ".gz", ".bz2")
                             for kind in (".tsv", ".csv", ".json"))}
    return max(counts, key=counts.__getitem__)  # .tsv on a tie


def is_json(path: str) -> bool:
    """Whether a question file is an EntityQuestions JSON file (by its extension, in any case: ``P800.dev.JSON``,
    before a compression's: ``P800.dev.json.gz``)."""
    return path.lower().removesuffix(".gz").removesuffix(".bz2").endswith(".json")  # as fs.open_decompressed


def read_questions(path: str, match: str = "string") -> QuestionFile:
    """A DPR qas file (TSV) or an EntityQuestions JSON file (a list, ``is_json``), either as it is or compressed
    (``.gz``, ``.bz2``, as ``fs.open_decompressed`` reads them); a question none of
    whose answers can match by ``match`` is malformed."""
    if not fs.exists(path):
        raise InputError(f"question file {path} not found")
    if fs.is_directory(path):
        raise InputError(f"question file {path} is a directory: name the files in it (e.g. --questions "
                         f"{path}/*{question_suffix(path)})")
    try:
        with fs.open_decompressed(path) as handle:  # a file that cannot be opened: one line
            raw = handle.read()
    except fs.ARCHIVE_ERRORS as error:
        raise InputError(f"question file {path} cannot be decompressed: {first_line(error)}") from error
    raw = raw.removeprefix(codecs.BOM_UTF8)  # a byte order mark first is no error (Windows editors)
    if (kind := foreign_encoding(raw)) is not None:  # else every line malformed: "no question in its N lines"
        raise InputError(f"question file {path} holds {kind}")
    if not raw.strip():
        raise InputError(f"question file {path} is empty")
    if is_json(path):
        try:
            items = json.loads(raw.decode("utf-8"))
        except ValueError as error:  # UnicodeDecodeError included
            raise InputError(f"{path} is not JSON: {error}") from error
        except RecursionError as error:
            raise InputError(f"{path}: its JSON is nested too deeply to read (expected {JSON_FORM})") from error
        if not isinstance(items, list):
            raise InputError(f"{path}: expected a JSON list of {{question, answers}} objects")
        parsed = [parse_entity_question(item, match) for item in items]
    else:
        # lines end as in DPR's reader (a file opened as text): bytes.splitlines ends them at "\n", "\r\n" or a lone
        # "\r" (old Mac files) alone, not at \x85 or \u2028 as str.splitlines would; a blank line holds nothing to count
        parsed = [parse_qas_line(line, match) for line in raw.splitlines() if line.strip()]
    questions = [question for question in parsed if question is not None]
    if not questions:
        raise InputError(no_question_message(path, len(parsed), match))
    return QuestionFile(path, questions, len(parsed) - len(questions))


def foreign_encoding(raw: bytes) -> str | None:
    """What ``raw`` (a question file's bytes, as read) holds if it is compressed or UTF-16 text, and what to do,
    else None."""
    kind, suffix = fs.compression_of(raw[:10])
    if suffix:  # xz, which nothing here reads, is no question file either way
        return f"{kind}-compressed bytes: name it {suffix} (it is read as its name says)"
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "UTF-16 text (a byte order mark says so): save it as UTF-8"
    return None


def no_question_message(path: str, records: int, match: str = "string") -> str:
    """Why a question file gave no question: none of its ``records`` lines (JSON items) is in the expected form
    with an answer that can match (``answerable``)."""
    expected, unit = (JSON_FORM, "item") if is_json(path) else (TSV_FORM, "line")
    if not records:
        return f"question file {path} holds no question (expected {expected})"
    plural = "s" if records > 1 else ""
    answer = "an answer that holds a word" if match == "string" else \
        "an answer that is a regular expression an empty text does not match"
    return f"question file {path}: no question in its {records} {unit}{plural} (expected {expected}, {answer})"


def first_hit_ranks(answer_lists: Sequence[Sequence[str]], retrieved: Sequence[Sequence[str]],
                    match: str = "string") -> list[int | None]:
    """Per question, the 1-based rank of the first retrieved text containing an answer by DPR's ``match`` type
    (None: no hit)."""
    ranks: list[int | None] = []
    for answers, texts in zip(answer_lists, retrieved, strict=True):
        holds_answer = answer_matcher(answers, match)
        ranks.append(next((rank for rank, text in enumerate(texts, 1) if holds_answer(text)), None))
    return ranks


def top_k_accuracy(ranks: Sequence[int | None], ks: Sequence[int]) -> dict[int, float]:
    """The fraction of questions with a hit within the first k, for each k (0 to 1, as DPR's own scripts give it)."""
    total = len(ranks)
    return {k: (sum(1 for rank in ranks if rank is not None and rank <= k) / total if total else 0.0) for k in ks}


def shown_names(paths: Sequence[str]) -> list[str]:
    """Each path by its fewest last components that tell it from the other paths: its file name, unless another
    file of that name is among them (``qa/q.tsv`` and ``qb/q.tsv``)."""
    parts = [path.split("/") for path in paths]
    names = []
    for mine in parts:
        depth = 1
        while depth < len(mine) and sum(other[-depth:] == mine[-depth:] for other in parts) > 1:
            depth += 1
        names.append("/".join(mine[-depth:]))
    return names


def format_table(rows: list[dict], ks: Sequence[int]) -> str:
    names = [on_one_line(row["file"]) for row in rows]
    name_width = max([len("file")] + [len(name) for name in names])
    labels = [f"top-{k} %" for k in ks]  # the table in percent, as papers give it
    widths = [max(7, len(label)) for label in labels]
    header = f"{'file':<{name_width}}  {'questions':>9}  " + "  ".join(
        f"{label:>{width}}" for label, width in zip(labels, widths, strict=True))
    lines = [header]
    for name, row in zip(names, rows, strict=True):
        scores = "  ".join(f"{100 * row['accuracy'][k]:{width}.2f}" for k, width in zip(ks, widths, strict=True))
        lines.append(f"{name:<{name_width}}  {row['questions']:>9}  {scores}")
    return "\n".join(lines)


def evaluate_file(retriever: Retriever, questions: QuestionFile, ks: Sequence[int], batch_size: int,
                  match: str = "string", chunk: int = 2048) -> dict:
    """Search in chunks of questions (bounded memory for the retrieved texts) and score them."""
    ranks: list[int | None] = []
    depth = max(ks)
    for start in range(0, len(questions.questions), chunk):
        part = questions.questions[start:start + chunk]
        _, ids = retriever.search_ids([question.question for question in part], depth, batch_size)
        texts = retriever.texts(ids)
        retrieved = [[texts[int(passage_id)][1] for passage_id in row if passage_id >= 0] for row in ids]
        ranks.extend(first_hit_ranks([question.answers for question in part], retrieved, match))
    return {"path": questions.path, "questions": len(ranks),
            "bad_lines": questions.bad_lines, "accuracy": top_k_accuracy(ranks, ks)}


def check_report_target(path: str, output: str, questions: list[str]) -> None:
    """--report names a file that can be written, checked before the search (the write itself refuses a directory
    too): not a directory, nor a name ending in a separator, in a directory that is or can be created; neither in
    the run (evaluate writes nothing there: it would replace the run's files or fail its validation) nor a question
    file."""
    if fs.overlaps(path, output):
        raise InputError(f"--report {path} is inside --output {output}: evaluate writes nothing in the run (a file "
                         "there would fail its validation and publish), name a file outside it")
    if any(fs.resolved(path) == fs.resolved(question) for question in questions):
        raise InputError(f"--report {path} is one of the --questions files: name another file (it would be "
                         "replaced by the results)")
    if fs.is_directory(path):
        raise InputError(f"--report {path} is a directory: name the JSON file to write (the directory is left as it "
                         "is)")
    if path.endswith(("/", os.sep)):
        raise InputError(f"--report {path} names a directory (it ends with /): name the JSON file to write, e.g. "
                         f"{path}evaluation.json")
    fs.require_writable_directory(os.path.dirname(path) or ".", "--report's directory")


class EvaluateCommand:
    """evaluate: top-k retrieval accuracy (DPR's has-answer rule) for DPR qas and EntityQuestions files."""

    def main(self, args: argparse.Namespace, beam_args: list[str]) -> int:
        ks = sorted(set(args.ks or DEFAULT_KS))
        if args.report:
            check_report_target(args.report, args.output, args.questions)
        files = [read_questions(path, args.match) for path in args.questions]
        retriever = Retriever(args.output, args.device, args.dtype, args.query_encoder, args.nprobe, args.ef_search,
                              args.verify)
        rows = [{"file": name, **evaluate_file(retriever, questions, ks, args.batch_size, args.match)}
                for name, questions in zip(shown_names(args.questions), files, strict=True)]
        retriever.check_unchanged()
        print(format_table(rows, ks))
        retriever.warn_about_queries(sum(len(questions.questions) for questions in files))
        for row in rows:
            if row["bad_lines"]:
                print(f"{row['file']}: {row['bad_lines']} malformed question(s) skipped", file=sys.stderr)
        if args.report:
            fs.write_json_atomic(args.report, {"k": ks, "match": args.match, "files": rows})
        return 0


COMMAND = EvaluateCommand()
