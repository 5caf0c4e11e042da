"""search and evaluate: DPR's has-answer rule, question files, accuracy tables, and the done-when check on the
751 real DPR passages with the packaged MiniLM."""

from __future__ import annotations

import ast
import bz2
import csv
import gzip
import json
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from artifacts.errors import InputError
from pipelines.evaluate import (
    answer_matcher,
    answer_tokens,
    first_hit_ranks,
    format_table,
    has_answer,
    parse_entity_question,
    parse_qas_row,
    read_questions,
    shown_names,
    top_k_accuracy,
)
from pipelines.launcher.cli import main
from pipelines.search import Retriever
from tests.builders import files_below, fill_with_files, stored_rows
from tests.conftest import DIRECT, PASSAGES, QUESTIONS, write_tiny_bert

NQ_5 = PASSAGES / "nq_dev_5q_from_haystack.qa.tsv"


def test_tokens_are_letter_digit_mark_runs_or_single_symbols():
    assert answer_tokens("July 5, 2018") == ["july", "5", ",", "2018"]
    assert answer_tokens("Ahärôn's (“prophet”)") == ["aha\u0308ro\u0302n", "'", "s", "(", "“", "prophet", "”", ")"]
    assert answer_tokens("  \t\n") == []


def test_has_answer_follows_dprs_token_rule():
    text = "It opened on July 5, 2018 in Japan; the Saint Lawrence River flows; Linda Davison sang."
    assert has_answer(["July 5 , 2018"], text)
    assert has_answer(["the Saint Lawrence River"], text)
    assert not has_answer(["the Saint Lawrence River"], 'the "Saint Lawrence River"')  # the quote is a token
    assert has_answer(["JAPAN"], text)
    assert not has_answer(["Linda Davis"], text)  # a token prefix is no match
    assert not has_answer(["July 6 , 2018", "Osaka"], text)
    assert has_answer(["Ahärôn"], "prophet (Aha\u0308ro\u0302n) spoke")  # composed vs decomposed accents
    assert not has_answer(["", "  "], text)  # empty answers match nothing
    # each token is lowered alone: "ΟΔΟΣ" ends in a final sigma, though the text lowered as a whole would not
    assert has_answer(["οδος"], "Η ΟΔΟΣ'Α") and has_answer(["ΟΔΟΣ"], "Η ΟΔΟΣ'Α")


def test_regex_answers_are_dprs_regex_match():
    """CuratedTREC's answers are patterns: searched uncased in the NFD-normalized passage, the pattern normalized
    too; one that is no regular expression matches nothing, and a question with only such answers is malformed."""
    text = "In 1637 Rene\u0301 DESCARTES published; sales reached $1.5 billion"
    assert answer_matcher(["Ren(e|é) Descartes"], "regex")(text)
    assert not answer_matcher(["Ren(e|é) Descartes"], "string")(text)
    assert answer_matcher(["René Descartes"], "regex")(text)  # composed in the pattern, decomposed in the text
    assert answer_matcher(["(unclosed", r"\$?1[.,]5 billion"], "regex")(text)
    assert not answer_matcher(["(unclosed", "1637 Paris"], "regex")(text)
    assert answer_matcher(["sales"], "string")(text) and not answer_matcher(["sale$"], "regex")(text)
    assert parse_qas_row(["who?", "['(unclosed']"], "regex") is None
    assert parse_qas_row(["who?", "['(unclosed']"]).answers == ("(unclosed",)  # a word, as a string answer
    assert parse_qas_row(["who?", "['(unclosed', 'Ren(e|é)']"], "regex").answers == ("(unclosed", "Ren(e|é)")


def test_a_regex_answer_that_matches_no_characters_is_no_answer():
    """DPR's regex match took a pattern that an empty text matches ('', 'a*') as found in every passage, and one
    that matches no characters (a word boundary) in nearly every one: a question of such answers scored 100%."""
    text = "Rene Descartes published in 1637"
    for pattern in ("", "x*", "^", "(?:)"):
        assert not answer_matcher([pattern], "regex")(text), pattern
        assert parse_qas_row(["who?", repr([pattern])], "regex") is None, pattern
    assert not answer_matcher([r"\b", "(?=Rene)"], "regex")(text)
    assert answer_matcher(["x*", r"16\d\d"], "regex")(text) and answer_matcher([r"\bDesc"], "regex")(text)


def test_a_file_of_questions_without_an_answer_that_can_match_says_why(tmp_path):
    """The line was in the form the message asked for: what it lacked, an answer that can match, went unsaid."""
    path = tmp_path / "empty-answers.qa.tsv"
    path.write_text("who?\t['']\nwhat?\t['', '']\n")
    with pytest.raises(InputError) as string:
        read_questions(str(path))
    assert string.value.message == (f"question file {path}: no question in its 2 lines (expected question<TAB>"
                                    "['answer', ...] per line, an answer that holds a word)")
    with pytest.raises(InputError) as regex:
        read_questions(str(path), "regex")
    assert regex.value.message.endswith("per line, an answer that is a regular expression an empty text does not "
                                        "match)")


def test_question_rows_of_both_formats():
    assert parse_qas_row(["who?", "['a', \"b'c\"]"]).answers == ("a", "b'c")
    assert parse_qas_row(["who?", "('Reba',)"]).answers == ("Reba",)  # a tuple, which DPR's eval takes as a list
    assert parse_qas_row(["who?", "not a list"]) is None
    assert parse_qas_row(["who?", "[1, 2]"]) is None
    assert parse_qas_row(["who?"]) is None
    assert parse_qas_row(["who?", "[]"]) is None
    assert parse_entity_question({"question": "Where?", "answers": ["Here"]}).question == "Where?"
    assert parse_entity_question({"question": "Where?"}) is None
    assert parse_entity_question(["Where?", ["Here"]]) is None
    # a lone surrogate (a JSON escape) is no text a tokenizer takes: the question is skipped, not a traceback
    assert parse_entity_question(json.loads('{"question": "Where \\ud800 is it?", "answers": ["Here"]}')) is None
    assert parse_entity_question({"question": " \u200b", "answers": ["Here"]}) is None
    # answers without a word match no passage: counted as malformed, not scored as a miss
    assert parse_qas_row(["who?", "['', ' ', '\u200b']"]) is None
    assert parse_qas_row(["who?", "['', 'Reba']"]).answers == ("", "Reba")


@pytest.mark.usefixtures("shared_data")
def test_real_question_files_read_completely():
    nq = read_questions(str(NQ_5))
    assert [question.question for question in nq.questions][:2] == [
        "who sings does he love me with reba", "where do the great lakes meet the ocean"]
    assert [question.answers for question in nq.questions] == [
        ("Linda Davis",), ("the Saint Lawrence River",), ("July 5 , 2018",), ("Roy Raymond",), ("2002",)]
    entity = read_questions(str(QUESTIONS / "entityquestions-dev" / "P17.dev.json"))
    assert (len(entity.questions), entity.bad_lines) == (1000, 0)
    trivia = read_questions(str(QUESTIONS / "topics.dpr.trivia.dev.txt"))  # questions with \x85 inside
    assert (len(trivia.questions), trivia.bad_lines) == (8837, 0)


def test_ranks_accuracy_and_table():
    ranks = first_hit_ranks([["Paris"], ["Lyon"], ["Nice"]],
                            [["in Lyon", "Paris!"], ["Lyon is"], ["nothing", "here"]])
    assert ranks == [2, 1, None]
    assert top_k_accuracy(ranks, [1, 2, 5]) == {1: pytest.approx(1 / 3), 2: pytest.approx(2 / 3),
                                                5: pytest.approx(2 / 3)}
    assert top_k_accuracy([], [1]) == {1: 0.0}
    table = format_table([{"file": "a.tsv", "questions": 3, "accuracy": {1: 1 / 3, 20: 2 / 3}}], [1, 20])
    assert table.splitlines() == ["file   questions  top-1 %  top-20 %", "a.tsv          3    33.33     66.67"]
    # two files of one name are told apart by their directories, as far up as needed
    assert shown_names(["/data/nq/dev/q.tsv", "/data/tq/dev/q.tsv", "/data/p.tsv", "p.tsv", "/data/r.tsv"]) == [
        "nq/dev/q.tsv", "tq/dev/q.tsv", "data/p.tsv", "p.tsv", "r.tsv"]


def test_qas_lines_are_read_as_dprs_reader_reads_them_and_json_by_its_extension_in_any_case(tmp_path):
    """An id column after the answers (DPR's reader takes the first two fields) made every line malformed; text
    after a closing quote (DPR's csv is not strict) cost the line; a .JSON file was read as a qas file."""
    qas = tmp_path / "nq.qa.tsv"
    qas.write_text("who sings\t['Reba']\tq-1\n\"Weird Al\" sings what\t['parodies']\n")
    assert [(question.question, question.answers) for question in read_questions(str(qas)).questions] == [
        ("who sings", ("Reba",)), ("Weird Al sings what", ("parodies",))]
    upper = tmp_path / "P800.dev.JSON"
    upper.write_text(json.dumps([{"question": "Who wrote Hamlet?", "answers": ["Shakespeare"]}]))
    assert [question.question for question in read_questions(str(upper)).questions] == ["Who wrote Hamlet?"]


def test_a_question_longer_than_csvs_field_limit_is_a_question(tmp_path):
    """csv refuses a field over its limit (128 KiB unless raised, one setting per process): such a line was counted
    malformed, or not, by whether an earlier read in the process had raised the limit."""
    question = "which of these " + "words " * 30_000 + "is the last?"
    qas = tmp_path / "long.qa.tsv"
    qas.write_text(f"{question}\t['last']\nwho sings\t['Reba']\n")
    previous = csv.field_size_limit(131_072)  # csv's default, as in a fresh process
    try:
        assert [item.question for item in read_questions(str(qas)).questions] == [question, "who sings"]
    finally:
        csv.field_size_limit(previous)


@pytest.mark.usefixtures("shared_data")
def test_question_files_compressed_are_read_as_they_are_and_a_damaged_archive_is_one_line(tmp_path):
    """A .gz or .bz2 question file was read as its compressed bytes: "no question in its 47 lines (expected
    question<TAB>[...])", even of a .json.gz file."""
    entity = QUESTIONS / "entityquestions-dev" / "P17.dev.json"
    for path, compress in ((tmp_path / "nq.qa.tsv.gz", gzip.compress), (tmp_path / "nq.qa.tsv.bz2", bz2.compress),
                           (tmp_path / "P17.dev.json.gz", gzip.compress),
                           (tmp_path / "P17.dev.JSON.GZ", gzip.compress)):  # suffixes in any case
        plain = entity if ".json" in path.name.lower() else NQ_5
        path.write_bytes(compress(plain.read_bytes()))
        assert read_questions(str(path)) == replace(read_questions(str(plain)), path=str(path))
    cut = tmp_path / "cut.qa.tsv.gz"
    cut.write_bytes(gzip.compress(NQ_5.read_bytes())[:40])
    with pytest.raises(InputError, match=r"file .*cut.qa.tsv.gz cannot be decompressed: Compressed file ended"):
        read_questions(str(cut))


@pytest.mark.usefixtures("shared_data")
def test_a_question_file_compressed_or_in_utf16_under_a_plain_name_says_so(tmp_path):
    """Read as text, every line was malformed: "no question in its 3 lines (expected question<TAB>[...])"."""
    text = NQ_5.read_text(encoding="utf-8")
    for encoded, said in ((gzip.compress(text.encode()), "gzip-compressed bytes: name it .gz"),
                          (bz2.compress(text.encode()), "bzip2-compressed bytes: name it .bz2"),
                          (text.encode("utf-16"), r"UTF-16 text \(a byte order mark says so\): save it as UTF-8")):
        path = tmp_path / "nq.qa.tsv"
        path.write_bytes(encoded)
        with pytest.raises(InputError, match=rf"question file {re.escape(str(path))} holds {said}"):
            read_questions(str(path))
    path.write_text("BZh9 is a question\t['answer']\n", encoding="utf-8")  # a plain text that starts alike
    assert [question.question for question in read_questions(str(path)).questions] == ["BZh9 is a question"]


def as_pattern(answer: str) -> str:
    """A string answer as a CuratedTREC-style pattern that finds what it finds: its words, any spaces between."""
    return r"\b" + r"\s*".join(map(re.escape, answer.split())) + r"\b"


def test_evaluate_answers_the_5_nq_dev_questions_on_the_751_real_passages(minilm_index, tmp_path, capsys):
    """The done-when check: MiniLM (mean pooling, cosine), Flat index in 3 shards, DPR's has-answer rule."""
    report = tmp_path / "report.json"
    assert main(["evaluate", "--output", str(minilm_index), "--questions", str(NQ_5), "-k", "1", "5", "20",
                 "--report", str(report)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "file                            questions  top-1 %  top-5 %  top-20 %",
        "nq_dev_5q_from_haystack.qa.tsv          5    60.00   100.00    100.00"]
    # the report's accuracy a fraction, as DPR's scripts give it (the table is in percent, and says so)
    assert json.loads(report.read_text())["files"][0]["accuracy"] == {"1": 0.6, "5": 1.0, "20": 1.0}
    # CuratedTREC's way: the answers as patterns, the rest as it was
    patterns = tmp_path / "trec.qa.tsv"
    rows = [line.split("\t") for line in NQ_5.read_text().splitlines()]
    patterns.write_text("".join(f"{question}\t{[as_pattern(answer) for answer in ast.literal_eval(answers)]}\n"
                                for question, answers in rows))
    assert main(["evaluate", "--output", str(minilm_index), "--questions", str(patterns), "-k", "1", "5", "20",
                 "--match", "regex", "--report", str(report)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[1:] == ["5", "60.00", "100.00", "100.00"]
    assert json.loads(report.read_text())["match"] == "regex"


@pytest.mark.parametrize("target", ["sample", "."])
def test_a_report_path_that_names_a_directory_is_refused_before_searching(minilm_index, tmp_path, monkeypatch,
                                                                          capsys, target):
    """The directory and every file in it stay (it was once deleted and replaced by the JSON file)."""
    before = fill_with_files(tmp_path / "sample")
    monkeypatch.chdir(tmp_path / "sample" if target == "." else tmp_path)
    assert main(["evaluate", "--output", str(minilm_index), "--questions", str(NQ_5), "--report", target]) == 2
    assert capsys.readouterr() == ("", f"error: --report {target} is a directory: name the JSON file to write (the "
                                       "directory is left as it is)\n")
    assert files_below(tmp_path / "sample") == before


@pytest.mark.parametrize(("target", "line"), [
    ("new/", "error: --report new/ names a directory (it ends with /): name the JSON file to write, e.g. "
             "new/evaluation.json"),
    ("file/results.json", "error: --report's directory file is not a directory")])
def test_a_report_path_that_cannot_be_written_is_refused_before_searching(minilm_index, tmp_path, monkeypatch,
                                                                          capsys, target, line):
    (tmp_path / "file").write_text("a file")
    monkeypatch.chdir(tmp_path)
    assert main(["evaluate", "--output", str(minilm_index), "--questions", str(NQ_5), "--report", target]) == 2
    assert capsys.readouterr() == ("", f"{line}\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file"]


def test_a_report_inside_the_run_or_over_a_question_file_is_refused_before_searching(minilm_index, tmp_path,
                                                                                       capsys):
    """It once replaced the run's manifest.json (every later command refused the run) or the questions it read."""
    questions = tmp_path / "mine.tsv"
    questions.write_bytes(NQ_5.read_bytes())
    manifest_bytes = (minilm_index / "manifest.json").read_bytes()
    for target in (minilm_index / "manifest.json", minilm_index / "index" / "eval.json", minilm_index):
        assert main(["evaluate", "--output", str(minilm_index), "--questions", str(questions),
                     "--report", str(target)]) == 2
        assert capsys.readouterr() == ("", f"error: --report {target} is inside --output {minilm_index}: evaluate "
                                           "writes nothing in the run (a file there would fail its validation and "
                                           "publish), name a file outside it\n")
    assert main(["evaluate", "--output", str(minilm_index), "--questions", str(NQ_5), str(questions),
                 "--report", f"{tmp_path}/./mine.tsv"]) == 2
    assert capsys.readouterr().err.startswith(f"error: --report {tmp_path}/./mine.tsv is one of the --questions files")
    assert ((minilm_index / "manifest.json").read_bytes(), questions.read_bytes()) == (manifest_bytes,
                                                                                       NQ_5.read_bytes())
    assert not (minilm_index / "index" / "eval.json").exists()


def test_an_entity_questions_file_may_start_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "P17.dev.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps([{"question": "Which country is Lyon in?",
                                                     "answers": ["France"]}]).encode())
    parsed = read_questions(str(path))
    assert ([(question.question, question.answers) for question in parsed.questions], parsed.bad_lines) == (
        [("Which country is Lyon in?", ("France",))], 0)


def test_a_qas_file_of_old_mac_line_ends_is_read_as_dpr_reads_it(tmp_path):
    """A lone CR ends a line, as in DPR's reader (a text-mode file): the file was one malformed line; CRLF and LF
    as before, and \x85 or U+2028 inside a question still end nothing."""
    path = tmp_path / "mac.qa.tsv"
    path.write_bytes("who sings?\t['Reba']\r\rwho\x85 wrote\u2028Hamlet?\t['Shakespeare']\r\n"
                     "what is 2\t['two']\r".encode())
    parsed = read_questions(str(path))
    assert ([(question.question, question.answers) for question in parsed.questions], parsed.bad_lines) == (
        [("who sings?", ("Reba",)), ("who\x85 wrote\u2028Hamlet?", ("Shakespeare",)), ("what is 2", ("two",))], 0)


def test_a_qas_file_may_start_with_a_byte_order_mark_and_json_nested_too_deeply_is_one_line(tmp_path):
    path = tmp_path / "nq.qa.tsv"
    path.write_bytes(b"\xef\xbb\xbfwho sings?\t['Reba']\n")
    assert [question.question for question in read_questions(str(path)).questions] == ["who sings?"]
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match=r"^KPR-INPUT-ERROR: .*deep\.json: its JSON is nested too deeply to read"):
        read_questions(str(deep))


def test_a_report_file_is_replaced(minilm_index, tmp_path):
    report = tmp_path / "results.json"
    report.write_text("an earlier report")
    assert main(["evaluate", "--output", str(minilm_index), "--questions", str(NQ_5), "-k", "1",
                 "--report", str(report)]) == 0
    assert json.loads(report.read_text())["k"] == [1]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["results.json"]


def test_evaluate_ranks_match_brute_force_over_the_stored_vectors(minilm_index):
    retriever = Retriever(str(minilm_index))
    questions = read_questions(str(NQ_5)).questions
    rows = stored_rows(minilm_index)
    ids = np.array(sorted(rows))
    vectors = np.array([rows[passage_id]["embedding"] for passage_id in ids], dtype=np.float64)
    queries = retriever.encode([question.question for question in questions]).astype(np.float64)
    top = ids[np.argsort(-(queries @ vectors.T), axis=1, kind="stable")[:, :20]]
    texts = [[rows[int(passage_id)]["text"] for passage_id in row] for row in top]
    assert first_hit_ranks([question.answers for question in questions], texts) == [1, 1, 2, 1, 3]
    assert retriever.search_ids([question.question for question in questions], 20)[1].tolist() == top.tolist()


@pytest.mark.parametrize(("queries", "k", "batch_size", "error", "message"), [
    ("Greek philosopher", 2, 256, TypeError, r"^queries must be a list of str \(one string would be searched "),
    ([b"Greek philosopher"], 2, 256, TypeError, "^queries must be a list of str"),
    (["Greek", " \u200b "], 2, 256, InputError, r"a query is empty \(nothing but spaces or invisible characters\)"),
    (["abc \ud800"], 2, 256, InputError, "a query holds bytes that are not UTF-8"),
    (["Greek"], 0, 256, InputError, "k is 0: give a whole number of 1 or more$"),
    (["Greek"], -3, 256, InputError, "k is -3: give"),
    (["Greek"], 2, 0, InputError, "batch_size is 0: give")])
def test_the_python_api_checks_its_queries_as_the_command_line_does(minilm_index, queries, k, batch_size, error,
                                                                     message):
    """Retriever searched one string's characters as 17 queries, an empty query for passages of nothing, and gave
    numpy's or the tokenizer's errors for a negative k or a lone surrogate."""
    retriever = Retriever(str(minilm_index))
    with pytest.raises(error, match=message):
        retriever.search(queries, k, batch_size)
    assert [len(hits) for hits in retriever.search(["Greek philosopher", "Aristotle"], 2)] == [2, 2]


def test_a_run_that_changes_while_it_is_searched_gives_no_results(minilm_index, tmp_path, monkeypatch):
    """An index stage (or a publish) that commits into OUT while it is searched replaces files as they are read:
    the results mixed two versions, with passages of empty text, exit 0. A passage without text is an error."""
    output = Path(shutil.copytree(minilm_index, tmp_path / "out"))
    retriever = Retriever(str(output))
    query = ["who sings does he love me with reba"]
    assert retriever.search(query, 3)[0][0].title == "Does He Love You"
    monkeypatch.setattr(retriever.passages, "get", lambda _ids: {})  # the passages' files of another version
    missing = r"^KPR-INPUT-ERROR: passage \d+ is in the index under .* but in none of its passages' files"
    with pytest.raises(InputError, match=missing):
        retriever.search(query, 3)
    monkeypatch.undo()
    committed = output / "manifest.json"
    committed.write_text(committed.read_text() + "\n")  # a commit into OUT meanwhile
    with pytest.raises(InputError, match=f"^KPR-INPUT-ERROR: {output} changed while it was searched"):
        retriever.search(query, 3)


def test_queries_cut_at_the_index_s_max_length_are_said_to_be(minilm_index, tmp_path, capsys):
    """Passages cut at --max-length are counted (passages_cut); a query cut so was searched for by its start alone,
    without a word (two queries of one start had the same hits and scores)."""
    long = "who sang " + "and then " * 200 + "with reba"
    assert main(["search", "--output", str(minilm_index), "--query", long, "--query", "who sings", "-k", "1"]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == (
        "warning: 1 of 2 queries ran past the index's --max-length of 256 tokens: their ends were not encoded")
    questions = tmp_path / "long.qa.tsv"
    questions.write_text(f"{long}\t['Reba']\n{long} too\t['Reba']\nwho sings\t['Reba']\n")
    assert main(["evaluate", "--output", str(minilm_index), "--questions", str(questions), "-k", "1"]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == (
        "warning: 2 of 3 queries ran past the index's --max-length of 256 tokens: their ends were not encoded")
    assert main(["search", "--output", str(minilm_index), "--query", "who sings", "-k", "1"]) == 0
    assert "ran past" not in capsys.readouterr().err


def test_queries_of_unknown_tokens_alone_are_said_to_be(minilm_index, capsys):
    """An emoji or a script the vocabulary lacks is [UNK] alone to MiniLM: every such query had the same confident
    hits, without a word."""
    queries = ["\U0001f989", "\u1230\u120b\u121d", "owl \U0001f989"]  # [UNK], [UNK], owl [UNK]
    assert main(["search", "--output", str(minilm_index), *[f"--query={query}" for query in queries], "-k", "1",
                 "--json"]) == 0
    found = capsys.readouterr()
    hits = [json.loads(line)["hits"][0] for line in found.out.splitlines()]
    assert hits[0] == hits[1] != hits[2]
    assert found.err.splitlines()[-1] == (
        "warning: 2 of 3 queries hold no token the query encoder knows (every one is its unknown token [UNK]): their "
        "hits are not about them")
    assert main(["search", "--output", str(minilm_index), "--query", "owl \U0001f989", "-k", "1"]) == 0
    assert "unknown token" not in capsys.readouterr().err


def test_search_prints_the_best_passages(minilm_index, capsys):
    assert main(["search", "--output", str(minilm_index), "--query", "who sings does he love me with reba",
                 "--query", "who was the creator of victoria 's secret", "-k", "2", "--json"]) == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [result["query"] for result in results] == ["who sings does he love me with reba",
                                                       "who was the creator of victoria 's secret"]
    first = results[0]["hits"][0]
    assert (first["passage_id"], first["title"]) == (11828866, "Does He Love You")
    assert has_answer(["Linda Davis"], first["text"])
    assert all(len(result["hits"]) == 2 and result["hits"][0]["score"] >= result["hits"][1]["score"]
               for result in results)
    assert main(["search", "--output", str(minilm_index), "--query", "great lakes ocean", "-k", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["query: great lakes ocean", "rank     score  passage id  title | text"]
    rank, score, passage_id, title_and_text = lines[2].split(maxsplit=3)
    row = stored_rows(minilm_index)[int(passage_id)]
    assert rank == "1" and title_and_text.startswith(f"{row['title']} | {row['text'][:20]}")
    assert float(score) > 0 and lines[2].index(score) + len(score) == lines[1].index("score") + len("score")
    huge = "99999999999999999999"  # it sized the result arrays: a traceback, or all the memory there is
    assert main(["search", "--output", str(minilm_index), "--query", "great lakes ocean", "-k", huge, "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert sorted(hit["passage_id"] for hit in hits) == sorted(stored_rows(minilm_index))  # each passage, once


def test_the_tables_keep_each_cell_on_its_line(tiny_bert, tmp_path, capsys):
    """A tab in a passage (a quoted DPR field), a line break in a query or a question file's name: the tables show
    them escaped, where a query could print a row of its own; --json gives them as they are."""
    (tmp_path / "c.tsv").write_text('id\ttext\ttitle\n7\t"lakes\tand rivers"\tA\u2028B\n', encoding="utf-8")
    assert main(["index", "--output", str(tmp_path / "out"), "--encoder", str(tiny_bert), "--encoder-type", "mean",
                 "--corpus", str(tmp_path / "c.tsv"), *DIRECT]) == 0
    query = "lakes\n   1    9.0000           1  forged | row"
    capsys.readouterr()
    assert main(["search", "--output", str(tmp_path / "out"), "--query", query, "-k", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "query: lakes\\n   1    9.0000           1  forged | row" and len(lines) == 3
    assert lines[2].endswith("  7  A\\u2028B | lakes\\tand rivers")
    assert main(["search", "--output", str(tmp_path / "out"), "--query", query, "-k", "1", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert (found["query"], found["hits"][0]["title"], found["hits"][0]["text"]) == (query, "A\u2028B",
                                                                                     "lakes\tand rivers")
    questions = tmp_path / "two\nlines.tsv"
    questions.write_text('lakes\t["rivers"]\n', encoding="utf-8")
    assert main(["evaluate", "--output", str(tmp_path / "out"), "--questions", str(questions), "-k", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("two\\nlines.tsv  ")


def test_a_query_model_retrained_in_place_is_refused_and_a_copy_of_it_is_not(tiny_bert, tmp_path, capsys):
    """Weights saved over the index's model encoded the queries of an index of the old vectors: wrong passages,
    without a word. New times on the same files, or the model named with --query-encoder, still search."""
    model, out = tmp_path / "model", tmp_path / "out"
    shutil.copytree(tiny_bert, model)
    (tmp_path / "c.tsv").write_text("id\ttext\ttitle\n1\tlakes and rivers\tA\n2\tthe ocean\tB\n", encoding="utf-8")
    assert main(["index", "--output", str(out), "--encoder", str(model), "--encoder-type", "mean",
                 "--corpus", str(tmp_path / "c.tsv"), *DIRECT]) == 0
    search = ["search", "--output", str(out), "--query", "lakes", "-k", "1", "--json"]
    assert main(search) == 0
    found = capsys.readouterr().out
    for path in model.iterdir():  # a copy: other times, the same bytes
        os.utime(path, (1e9, 1e9))
    assert main(search) == 0 and capsys.readouterr().out == found
    write_tiny_bert(model, seed=1)
    assert main(search) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: the query encoder {model} holds other files than when the index under {out} "
                            "was built with it: other weights, config or tokenizer") and error.count("\n") == 1
    assert main([*search, "--query-encoder", str(model)]) == 0


def test_entity_questions_and_malformed_lines(minilm_index, tmp_path, capsys):
    items = json.loads((QUESTIONS / "entityquestions-dev" / "P17.dev.json").read_text())[:10]
    # a lone surrogate, which json.dumps escapes as \ud800: the tokenizer would stop the whole evaluation
    (tmp_path / "P17.dev.json").write_text(json.dumps([{"question": "Where is \ud800?", "answers": ["x"]}, *items]))
    # a quote that does not close took every line after it; bytes that are no UTF-8 were replaced and scored
    (tmp_path / "bad.qa.tsv").write_bytes(
        b"who sings does he love me with reba\t['Linda Davis']\nno answers here\n"
        b"\"a question that starts with a quote\t['x']\nwho is Pl\xffato\t['Pl\xffato']\r\n"
        b"where do the great lakes meet the ocean\t['the Saint Lawrence River']\r\n"
        b"\n \r\n\xe2\x80\x8b\t['x']\n")  # blank lines hold nothing to count; a zero-width question is malformed
    assert main(["evaluate", "--output", str(minilm_index), "--questions", str(tmp_path / "P17.dev.json"),
                 str(tmp_path / "bad.qa.tsv"), "-k", "1", "20"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["file          questions  top-1 %  top-20 %",
                                         "P17.dev.json         10     0.00     20.00",
                                         "bad.qa.tsv            2   100.00    100.00"]
    assert "bad.qa.tsv: 4 malformed question(s) skipped" in captured.err
    assert "P17.dev.json: 1 malformed question(s) skipped" in captured.err


def test_files_of_one_name_are_told_apart_in_the_warnings_and_the_report(minilm_index, tmp_path, capsys):
    """The table named them by their directories, the malformed-lines warning and the report's "file" by the
    file name alone."""
    for directory, bad in (("nq", 1), ("tq", 0)):
        (tmp_path / directory).mkdir()
        (tmp_path / directory / "q.tsv").write_bytes(NQ_5.read_bytes() + b"no answers here\n" * bad)
    report = tmp_path / "report.json"
    assert main(["evaluate", "--output", str(minilm_index), "--questions", str(tmp_path / "nq" / "q.tsv"),
                 str(tmp_path / "tq" / "q.tsv"), "-k", "1", "--report", str(report)]) == 0
    captured = capsys.readouterr()
    assert [line.split()[0] for line in captured.out.splitlines()[1:]] == ["nq/q.tsv", "tq/q.tsv"]
    assert captured.err.splitlines()[-1] == "nq/q.tsv: 1 malformed question(s) skipped"
    assert [row["file"] for row in json.loads(report.read_text())["files"]] == ["nq/q.tsv", "tq/q.tsv"]


def test_an_index_encoded_on_a_gpu_is_searched_on_the_cpu_of_a_machine_without_one(minilm_index, tmp_path, capsys):
    """index.json records --device cuda: search without --device refused ("--device cuda was asked for"), though no
    --device was typed; the questions are encoded on the CPU now, said in a line, with the same answers."""
    import torch

    from artifacts.run import manifest

    output = Path(shutil.copytree(minilm_index, tmp_path / "out"))
    info_path = output / "index" / "index.json"
    info = json.loads(info_path.read_text())
    info["encoder"]["device"] = "cuda"
    info_path.write_text(json.dumps(info))
    records = manifest.load(str(output))
    records["index"].outputs = [manifest.describe_file(str(output), str(info_path)) if item.path == "index/index.json"
                                else item for item in records["index"].outputs]
    manifest.save(str(output), records)
    query = ["--query", "who sings does he love me with reba", "-k", "3", "--json"]
    assert main(["search", "--output", str(minilm_index), *query]) == 0
    expected = capsys.readouterr().out
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: False)
        assert main(["search", "--output", str(output), *query]) == 0
    captured = capsys.readouterr()
    assert captured.out == expected
    assert captured.err == ("warning: the passages were encoded on cuda and this machine has no CUDA device: the "
                            "questions are encoded on cpu (--device to choose)\n")
