"""Path and model flags: a relative local path means the same file wherever the workers run (made absolute when the
flags are parsed); URLs and hub names stay as they are."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.launcher import flags
from pipelines.launcher.cli import build_parser, command_parser


@pytest.fixture()
def launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory of the launcher, with a model directory in it."""
    (tmp_path / "models" / "bert").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def parsed(argv: list[str]):
    return build_parser().parse_known_args(argv)[0]


def test_relative_paths_of_every_stage_are_made_absolute(launcher: Path):
    args = parsed(["all", "--dump", "dumps/a.xml.bz2", "dumps/b.xml.bz2", "--dump-index", "i.txt.bz2", "i2.txt.bz2",
                   "--redirects-sql", "r.sql.gz", "--page-sql", "p.sql.gz", "--page-props-sql", "pp.sql.gz",
                   "--output", "out/run", "--previous", "../old", "--model", "models/bert",
                   "--encoder", "./models/bert", "--query-encoder", "models/bert", "--corpus", "passages/psgs_*.tsv"])
    assert args.dump == [str(launcher / "dumps/a.xml.bz2"), str(launcher / "dumps/b.xml.bz2")]
    assert args.dump_index == [str(launcher / "i.txt.bz2"), str(launcher / "i2.txt.bz2")]
    assert (args.redirects_sql, args.page_sql, args.page_props_sql) == (
        [str(launcher / "r.sql.gz")], [str(launcher / "p.sql.gz")], [str(launcher / "pp.sql.gz")])
    assert (args.output, args.previous) == (str(launcher / "out/run"), str(launcher.parent / "old"))
    assert args.model == args.encoder == args.query_encoder == str(launcher / "models" / "bert")
    assert args.corpus == str(launcher / "passages" / "psgs_*.tsv")  # a glob stays a glob


def test_a_home_directory_is_this_users(launcher: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HOME", str(launcher))
    args = parsed(["embed-entities", "--output", "~/out", "--model", "~/models/bert"])
    assert (args.output, args.model) == (str(launcher / "out"), str(launcher / "models" / "bert"))
    # the commands that read a run too (they said "no such directory"), and evaluate's report (it was written in
    # a directory named "~" under the working directory)
    for argv in (["validate", "--output=~/out"], ["report", "--output=~/out", "--previous=~/old"],
                 ["diff", "--old=~/old", "--new=~/out"], ["publish", "--output=~/out", "--to=~/pub"],
                 ["evaluate", "--output=~/out", "--questions=~/q.tsv", "--report=~/r.json"]):
        args = vars(parsed(argv))
        assert [args[flag] for flag in ("output", "previous", "old", "new", "to", "report") if args.get(flag)] == [
            str(launcher / value.partition("~/")[2]) for value in argv[1:] if "--questions" not in value], argv
        assert args.get("questions") in (None, [str(launcher / "q.tsv")])


def test_a_file_url_is_the_local_path_it_names(launcher: Path):
    """Beam has no filesystem for file:// (every command refused it as a URL no filesystem reads)."""
    args = parsed(["all", "--dump", f"file://{launcher}/a.xml.bz2", "--output", f"file://{launcher}/out"])
    assert (args.dump, args.output) == ([str(launcher / "a.xml.bz2")], str(launcher / "out"))
    assert parsed(["validate", "--output", f"file://{launcher}/out"]).output == str(launcher / "out")
    model = parsed(["embed-entities", "--output", "out", "--model", f"file://{launcher}/models/bert"]).model
    assert model == str(launcher / "models" / "bert")  # a model directory too (it was "does not exist")


def test_urls_and_hub_names_stay_as_they_are(launcher: Path):
    args = parsed(["all", "--dump", "gs://bucket/enwiki.xml.bz2", "--output", "s3://bucket/run",
                   "--model", "bert-base-uncased", "--encoder", "facebook/dpr-ctx_encoder-single-nq-base"])
    assert (args.dump, args.output) == (["gs://bucket/enwiki.xml.bz2"], "s3://bucket/run")
    assert (args.model, args.encoder) == ("bert-base-uncased", "facebook/dpr-ctx_encoder-single-nq-base")


@pytest.mark.parametrize("command", ["export-kpr", "publish"])
def test_a_relative_destination_is_made_absolute(launcher: Path, command: str):
    assert parsed([command, "--output", "gs://bucket/run", "--to", "exports/kpr"]).to == str(launcher / "exports/kpr")


def test_the_local_paths_a_command_was_given_are_listed_with_their_flags(launcher: Path):
    parser = build_parser()
    args = parser.parse_known_args(["index", "--output", "out", "--encoder", "models/bert", "--corpus",
                                    "gs://bucket/psgs_w100.tsv"])[0]
    assert flags.local_paths(command_parser(parser, "index"), args) == [
        ("--output", str(launcher / "out")), ("--encoder", str(launcher / "models" / "bert"))]
    hub = parser.parse_known_args(["embed-entities", "--output", "gs://bucket/run", "--model", "bert-base-uncased"])[0]
    assert flags.local_paths(command_parser(parser, "embed-entities"), hub) == []


def test_a_list_flag_given_twice_takes_the_values_of_both(launcher: Path):
    """``--dump A --dump B`` read only B, ``-k 1 -k 5`` only top-5: the later flag replaced the earlier's values."""
    args = parsed(["all", "--dump", "a.xml.bz2", "--dump", "b.xml.bz2", "c.xml.bz2", "--page-sql", "p1.sql",
                   "--page-sql", "p2.sql", "--force", "parse", "--force", "index", "--output", "out"])
    assert args.dump == [str(launcher / name) for name in ("a.xml.bz2", "b.xml.bz2", "c.xml.bz2")]
    assert args.page_sql == [str(launcher / "p1.sql"), str(launcher / "p2.sql")]
    assert args.force == ["parse", "index"]
    assert (parsed(["all", "--force", "--output", "out"]).force, parsed(["all", "--output", "out"]).force) == ([], None)
    args = parsed(["evaluate", "--output", "out", "--questions", "a.json", "--questions", "b.csv",
                   "-k", "1", "-k", "5"])
    assert (args.questions, args.ks) == (["a.json", "b.csv"], [1, 5])
    assert parsed(["evaluate", "--output", "out", "--questions", "a.json"]).ks is None  # DEFAULT_KS
