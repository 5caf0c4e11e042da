"""diff and the report's changes section on full runs of two dumps of one wiki (tests/dump_versions.py).

Every expected number is computed here, independently of artifacts/run/diff: page sets from the dumps' XML, and
plain Python dicts and sets of the rows each run wrote."""

from __future__ import annotations

import bz2
import gzip
import html
import json
import re
import shutil
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from artifacts.run import lock, manifest
from pipelines.launcher.cli import main
from tests.builders import artifact_rows as rows
from tests.conftest import BUNDLED_PASSAGES, DIRECT
from tests.dump_versions import DumpVersions
from tests.run_fixtures import DumpRuns

Runs = tuple[DumpVersions, Path, Path]

@pytest.fixture(scope="module")
def runs(dump_runs: DumpRuns) -> Runs:
    """(the two dumps, a full run of the old one, a full run of the new one): the shared session runs."""
    return dump_runs.versions, dump_runs.old, dump_runs.new


# --- expectations, computed without artifacts/run/diff -----------------------------------------------------------


def open_dump(path: Path):
    opener = {".bz2": bz2.open, ".gz": gzip.open}.get(path.suffix, open)
    return opener(path, "rb")


def dump_articles(paths: list[Path]) -> dict[int, str]:
    """page id -> title of the dump files' main-namespace pages that are not redirects."""
    articles: dict[int, str] = {}
    for path in paths:
        with open_dump(path) as handle:
            for _, element in ElementTree.iterparse(handle):
                if re.sub(r"\{.*\}", "", element.tag) != "page":
                    continue
                fields = {re.sub(r"\{.*\}", "", child.tag): child for child in element}
                if fields["ns"].text == "0" and "redirect" not in fields:
                    articles[int(fields["id"].text)] = fields["title"].text
                element.clear()
    return articles


def counts(old: dict, new: dict, changed_key: str | None) -> dict[str, int]:
    both = old.keys() & new.keys()
    result = {"old": len(old), "new": len(new), "added": len(new.keys() - old.keys()),
              "removed": len(old.keys() - new.keys())}
    if changed_key:
        result[changed_key] = sum(old[key] != new[key] for key in both)
    return result


def entity_keys(out: Path) -> dict[int, str]:
    return {row["entity_id"]: (f"qid:{row['qid']}" if row["qid"] else f"title:{row['title']}")
            for row in rows(out, "entities", ["entity_id", "title", "qid"])}


def name_tops(out: Path) -> dict[str, frozenset[str]]:
    keys = entity_keys(out)
    candidates: dict[str, list[tuple[float, str]]] = {}
    for row in rows(out, "dictionary/names", ["name", "entity_id", "commonness"]):
        candidates.setdefault(row["name"], []).append((row["commonness"], keys[row["entity_id"]]))
    return {name: frozenset(key for value, key in pairs if value == max(v for v, _ in pairs))
            for name, pairs in candidates.items()}


def entity_vectors(out: Path) -> dict[str, np.ndarray]:
    keys = entity_keys(out)
    return {keys[row["entity_id"]]: np.asarray(row["embedding"], np.float64)
            for row in rows(out, "entity_embeddings", ["entity_id", "embedding"])}


def cosine_histogram(old: dict[str, np.ndarray], new: dict[str, np.ndarray]) -> dict[str, int]:
    histogram = {"[0.9999, 1]": 0, "[0.999, 0.9999)": 0, "[0.99, 0.999)": 0, "[0.9, 0.99)": 0, "< 0.9": 0}
    for key in old.keys() & new.keys():
        cosine = old[key] @ new[key] / (np.linalg.norm(old[key]) * np.linalg.norm(new[key]))
        label = ("[0.9999, 1]" if cosine >= 0.9999 else "[0.999, 0.9999)" if cosine >= 0.999
                 else "[0.99, 0.999)" if cosine >= 0.99 else "[0.9, 0.99)" if cosine >= 0.9 else "< 0.9")
        histogram[label] += 1
    return histogram


def expected_diff(old: Path, new: Path) -> dict:
    articles = [{row["page_id"]: (row["title"], row["text"], row["links"])
                 for row in rows(out, "articles", ["page_id", "title", "text", "links"])} for out in (old, new)]
    redirects = [{row["title"]: row["target"] for row in rows(out, "redirects", ["title", "target"])}
                 for out in (old, new)]
    entities = [dict.fromkeys(entity_keys(out).values()) for out in (old, new)]
    passages = [{row["passage_id"]: (row["title"], row["text"])
                 for row in rows(out, "passages", ["passage_id", "title", "text"])} for out in (old, new)]
    vectors = [entity_vectors(out) for out in (old, new)]
    encoded = manifest.load(str(new))["index"].counters["passages_encoded"]
    return {
        "old": str(old), "new": str(new),
        "articles": counts(*articles, "changed"),
        "redirects": counts(*redirects, "retargeted"),
        "entities": counts(*entities, None),
        "names": counts(name_tops(old), name_tops(new), "top_candidate_changed"),
        # built without --previous: every vector computed (entities_embedded), none reused from OLD
        "entity_vectors": {"reused": None, "recomputed": len(vectors[1]),
                           "old_dim": len(next(iter(vectors[0].values()))),
                           "new_dim": len(next(iter(vectors[1].values()))),
                           "matched": len(vectors[0].keys() & vectors[1].keys()),
                           "cosine_histogram": cosine_histogram(*vectors)},
        "passages": counts(*passages, "changed") | {"reused": None, "encoded": encoded,
                                                    "old_source": "passages of 100 words cut from articles/",
                                                    "new_source": "passages of 100 words cut from articles/"},
        "stale": [],
        "options": [],
    }


# --- tests ---------------------------------------------------------------------------------------------------


def test_articles_follow_the_dumps(runs: Runs) -> None:
    versions, old, new = runs
    for dump, out in ((versions.old, old), (versions.new, new)):
        assert {row["page_id"]: row["title"] for row in rows(out, "articles", ["page_id", "title"])} == \
            dump_articles([dump])


def test_diff_json_has_every_number(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    versions, old, new = runs
    assert main(["diff", "--old", str(old), "--new", str(new), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result == expected_diff(old, new)
    old_pages, new_pages = dump_articles([versions.old]), dump_articles([versions.new])
    assert result["articles"]["added"] == len(new_pages.keys() - old_pages.keys()) > 0
    assert result["articles"]["removed"] == len(old_pages.keys() - new_pages.keys()) > 0
    assert result["redirects"]["added"] > 0 and result["redirects"]["removed"] > 0  # Pyrus; Çullu, Agdam
    for part, key in (("articles", "changed"), ("entities", "added"), ("entities", "removed"),
                      ("names", "top_candidate_changed"), ("passages", "added"), ("passages", "removed"),
                      ("passages", "changed")):
        assert result[part][key] > 0, (part, key)
    assert result["entity_vectors"]["cosine_histogram"]["< 0.9"] + \
        result["entity_vectors"]["cosine_histogram"]["[0.9, 0.99)"] < result["entity_vectors"]["matched"]


def test_diff_of_a_run_with_its_copy(runs: Runs, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A copy compares equal in every part; the run itself is refused (paths mixed up, not a comparison)."""
    new = runs[2]
    assert main(["diff", "--old", str(new), "--new", f"{new}/", "--json"]) == 2
    assert capsys.readouterr() == ("", f"error: {new} and {new}/ are the same run: nothing to compare (name two "
                                       "runs)\n")
    assert main(["report", "--output", str(new), "--previous", f"{new}/."]) == 2
    assert capsys.readouterr().err == (f"error: --previous {new}/. is this run's own --output: name the run to compare "
                                       "it with (or leave --previous out: a refresh is compared with the run it read)"
                                       "\n")
    copy = Path(shutil.copytree(new, tmp_path / "copy"))
    assert main(["diff", "--old", str(copy), "--new", str(new), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    for part in ("articles", "redirects", "entities", "names", "passages"):
        assert result[part]["old"] == result[part]["new"] > 0
        assert all(result[part][key] == 0 for key in result[part]
                   if key not in ("old", "new", "encoded", "reused", "old_source", "new_source"))
    embedded = len(entity_vectors(new))
    assert result["entity_vectors"]["matched"] == embedded
    assert result["entity_vectors"]["cosine_histogram"] == {"[0.9999, 1]": embedded, "[0.999, 0.9999)": 0,
                                                            "[0.99, 0.999)": 0, "[0.9, 0.99)": 0, "< 0.9": 0}


def test_diff_text_table(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    old, new = runs[1], runs[2]
    expected = expected_diff(old, new)
    assert main(["diff", "--old", str(old), "--new", str(new)]) == 0
    lines = capsys.readouterr().out.splitlines()
    articles = expected["articles"]
    assert [line.split() for line in lines if line.startswith("articles ")] == [
        ["articles", *(f"{articles[key]:,}" for key in ("old", "new", "added", "removed", "changed")), "(changed)"]]
    names = expected["names"]
    assert f"{names['top_candidate_changed']:>10,}  (top candidate changed)" in lines[7]
    embedded = expected["entity_vectors"]["recomputed"]
    assert f"entity vectors: recomputed {embedded:,}, reused n/a (not refreshed from the old run)" in lines
    encoded = expected["passages"]["encoded"]
    assert f"passages: encoded {encoded:,}, reused n/a (not refreshed from the old run)" in lines
    matched = expected["entity_vectors"]["matched"]
    assert f"entity vectors in both runs (matched by QID, else title): {matched:,}; cosine old vs new:" in lines


def test_vector_passes_add_up(runs: Runs) -> None:
    """Holding the old vectors a bucket at a time (several passes) gives the one-pass histogram."""
    from artifacts.run.diff import rows as diff_rows
    from artifacts.run.diff.vectors import vector_movement

    old, new = runs[1], runs[2]
    old_entities, new_entities = diff_rows.matched_entities(str(old), str(new))
    vector_bytes = sum(len(v) * 4 for v in entity_vectors(old).values())
    one_pass = vector_movement(str(old), old_entities, str(new), new_entities)
    three_passes = vector_movement(str(old), old_entities, str(new), new_entities, budget=vector_bytes // 3 + 1)
    assert three_passes == one_pass
    assert one_pass.matched == expected_diff(old, new)["entity_vectors"]["matched"]


def test_bad_runs_are_one_line_errors(runs: Runs, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    new = runs[2]
    assert main(["diff", "--old", str(tmp_path / "missing"), "--new", str(new)]) == 2
    assert capsys.readouterr().err == f"error: --old {tmp_path / 'missing'}: no such directory\n"
    (tmp_path / "missing").mkdir()
    assert main(["diff", "--old", str(tmp_path / "missing"), "--new", str(new)]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'missing'} is not a run: it has no manifest.json\n"

    broken = Path(shutil.copytree(new, tmp_path / "broken"))
    (broken / "manifest.json").write_text("{not json")
    assert main(["diff", "--old", str(new), "--new", str(broken)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {broken / 'manifest.json'} is damaged: it is not JSON (")

    incomplete = Path(shutil.copytree(new, tmp_path / "incomplete"))
    victims = sorted((incomplete / "redirects").glob("*.parquet"))
    victims[0].unlink()
    assert main(["diff", "--old", str(new), "--new", str(incomplete), "--json"]) == 2
    assert capsys.readouterr() == ("", f"error: {incomplete} is incomplete (redirects/{victims[0].name}: missing, "
                                       "written by its 'parse' stage): restore the file, or rerun `python "
                                       f"run_pipeline.py parse --output {incomplete} --force ...`\n")

    (tmp_path / "empty").mkdir()
    manifest.save(str(tmp_path / "empty"), {})
    assert main(["diff", "--old", str(tmp_path / "empty"), "--new", str(new)]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'empty'} is not a run: its manifest.json records no stage\n"

    (tmp_path / "folder" / "manifest.json").mkdir(parents=True)
    for command in (["diff", "--old", str(new), "--new"], ["report", "--output"]):
        assert main([*command, str(tmp_path / "folder")]) == 2  # report: a traceback from hashing it
        assert capsys.readouterr().err.startswith(f"error: {tmp_path / 'folder' / 'manifest.json'} is damaged: it is "
                                                  "a directory;")


def test_runs_being_written_are_said_to_be(runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """diff and report read what a run had committed while a stage writes into it (its lock held by another
    process): they say so, where they went on as if the run were complete."""
    old, new = runs[1], Path(shutil.copytree(runs[2], tmp_path / "new"))
    with lock.hold(str(new), "python run_pipeline.py index"):
        holder = lock.read(str(new))
        with mock.patch.object(lock.LockInfo, "mine", lambda info: False):  # another process's
            assert main(["diff", "--old", str(old), "--new", str(new)]) == 0
            assert main(["report", "--output", str(new), "--recall-queries", "2"]) == 0
    writing = (f"note: {new} is being written by pid {holder.pid} on {holder.host} (command python run_pipeline.py "
               f"index, since {holder.started}): ")
    assert capsys.readouterr().err.splitlines() == [
        f"{writing}this comparison shows the stages it had committed when it was read",
        f"{writing}the report shows the stages it had committed when it was read"]
    assert main(["diff", "--old", str(old), "--new", str(new)]) == 0
    assert capsys.readouterr().err == ""


def test_ctrl_c_of_a_reader_says_nothing_of_resuming(runs: Runs, capfd: pytest.CaptureFixture[str]) -> None:
    """diff keeps no work: Ctrl-C said "rerun the same command to resume" (the line goes past the forwarder)."""
    with mock.patch("pipelines.diff.diff_runs", side_effect=KeyboardInterrupt):
        assert main(["diff", "--old", str(runs[1]), "--new", str(runs[2])]) == 130
    assert capfd.readouterr().err.splitlines() == ["interrupted"]


def test_runs_built_with_other_options_are_said_to_be(runs: Runs, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Another --min-commonness (or encoder option, or --language: English is recorded by no key): the names that
    differ came of it, not of the dumps, and nothing said so; nor did the report's section."""
    new = Path(shutil.copytree(runs[2], tmp_path / "new"))
    records = manifest.load(str(new))
    records["dictionary"].options.update(min_commonness=0.5, language="it")
    records["index"].options["encoder"]["max_length"] = 32
    manifest.save(str(new), records)
    expected = ["dictionary: language: 'en' -> 'it'; min_commonness: 0.3 -> 0.5", "index: encoder.max_length: 64 -> 32"]
    assert main(["diff", "--old", str(runs[2]), "--new", str(new), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["options"] == expected
    assert captured.err.splitlines() == [f"note: built with other options: {line}" for line in expected]
    assert main(["report", "--output", str(new), "--previous", str(runs[2]), "--recall-queries", "5"]) == 0
    page = html.unescape((new / "report" / "index.html").read_text())
    section = page[page.index('id="changes"'):page.index('id="changes-table"')]
    assert re.findall(r'<p class="warn">Built with other options: (.*?)</p>', section) == expected


def test_a_model_is_compared_by_its_files_content_as_the_stages_reuse_it(runs: Runs, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The model copied elsewhere (every vector reused) was said to be another option; other weights at the same
    path (none reused) were not said at all."""
    new = Path(shutil.copytree(runs[2], tmp_path / "new"))
    records = manifest.load(str(new))
    assert {"content:model", "content:encoder"} <= {*records["embed_entities"].inputs, *records["index"].inputs}
    records["embed_entities"].options["model"] = str(tmp_path / "copy-of-the-model")
    records["index"].inputs["content:encoder"] = "0" * 64
    manifest.save(str(new), records)
    assert main(["diff", "--old", str(runs[2]), "--new", str(new), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["options"] == ["index: encoder: model files changed"]


def test_only_parts_both_runs_have(runs: Runs, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from tests.conftest import copy_stages

    old, new = runs[1], runs[2]
    parsed = tmp_path / "parsed"
    parsed.mkdir()
    copy_stages(old, parsed, ("parse",))
    assert main(["diff", "--old", str(parsed), "--new", str(new), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["articles"] == expected_diff(old, new)["articles"]
    assert [part for part, value in result.items() if value is None] == [
        "entities", "names", "entity_vectors", "passages"]
    assert main(["diff", "--old", str(parsed), "--new", str(new)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert "entities           not compared: its stage has not run in both" in text
    assert "entity vectors     not compared: embed-entities has not run in both" in text


# --- the report's section ------------------------------------------------------------------------------------


def changes_rows(out: Path) -> dict[str, list[str]]:
    """The report's changes table: label -> the cells' text."""
    page = (out / "report" / "index.html").read_text()
    table = re.search(r'<table id="changes-table">.*?<tbody>(.*?)</tbody>', page).group(1)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table)]
    return {row[0]: [re.sub(r"<[^>]+>", "", cell).strip() for cell in row[1:]] for row in cells}


def cosine_rows(out: Path) -> dict[str, str]:
    page = (out / "report" / "index.html").read_text()
    table = re.search(r'<table id="vector-cosines">.*?<tbody>(.*?)</tbody>', page).group(1)
    return {html_label.replace("&lt;", "<"): value
            for html_label, value in re.findall(r'<tr><td>(.*?)</td><td class="num">(.*?)</td></tr>', table)}


def test_report_section_with_previous(runs: Runs, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    old, new = runs[1], Path(shutil.copytree(runs[2], tmp_path / "new"))
    expected = expected_diff(old, new)
    assert main(["report", "--output", str(new), "--previous", str(old), "--recall-queries", "5"]) == 0
    table = changes_rows(new)
    a, n = expected["articles"], expected["names"]
    assert table["articles"] == [f"{a[key]:,}" for key in ("old", "new", "added", "removed")] + [
        f"{a['changed']:,} changed"]
    assert table["dictionary names"][-1] == f"{n['top_candidate_changed']:,} top candidate changed"
    assert table["entities"] == [f"{expected['entities'][key]:,}" for key in ("old", "new", "added", "removed")] + [
        "—"]
    assert cosine_rows(new) == {label: f"{count:,}" for label, count in
                                expected["entity_vectors"]["cosine_histogram"].items()}
    page = (new / "report" / "index.html").read_text()
    assert f"encoded {expected['passages']['encoded']:,} · reused n/a (not refreshed from the old run)" in page
    assert page.index('id="changes"') < page.index('id="timings"')

    assert main(["report", "--output", str(new), "--previous", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'nothing'} is not a run: it has no manifest.json\n"


def test_report_section_from_the_manifest(runs: Runs, tmp_path: Path) -> None:
    from artifacts.run.report.changes import PREVIOUS_INPUT, PREVIOUS_OPTION

    old, new = runs[1], Path(shutil.copytree(runs[2], tmp_path / "new"))
    assert main(["report", "--output", str(new), "--recall-queries", "5"]) == 0
    assert 'id="changes"' not in (new / "report" / "index.html").read_text()  # built from scratch

    records = manifest.load(str(new))
    # as a refresh with --previous records it: the old run's manifest as an input of embed-entities and index
    records["embed_entities"].inputs[f"{PREVIOUS_INPUT}{old}"] = "fingerprint"
    manifest.save(str(new), records)
    assert main(["report", "--output", str(new), "--recall-queries", "5"]) == 0
    page = (new / "report" / "index.html").read_text()
    assert f"previous run <code>{old}</code>" in page
    assert changes_rows(new)["redirects"][:2] == [f"{expected_diff(old, new)['redirects'][key]:,}"
                                                  for key in ("old", "new")]

    del records["embed_entities"].inputs[f"{PREVIOUS_INPUT}{old}"]
    records["index"].options[PREVIOUS_OPTION] = str(tmp_path / "gone")  # or as an option; since deleted
    manifest.save(str(new), records)
    assert main(["report", "--output", str(new), "--recall-queries", "5"]) == 0
    page = (new / "report" / "index.html").read_text()
    assert (f'<p class="warn">Could not compare: the run this one was refreshed from, {tmp_path / "gone"}, is gone (no '
            "such directory now); report --previous OLD_OUT compares with another run</p>" in page)


def test_a_run_whose_later_stages_are_stale_is_said_to_be(runs: Runs, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """parse ran again (other articles) and the stages after it did not: diff compared their parts as if current
    ("passages changed 0" beside "articles changed 102") and the report said nothing. Both now name each stage to
    rerun."""
    import pyarrow.parquet as pq

    old, new = runs[1], Path(shutil.copytree(runs[2], tmp_path / "new"))
    articles = sorted((new / "articles").glob("*.parquet"))[0]
    pq.write_table(pq.read_table(articles).slice(1), articles)
    records = manifest.load(str(new))
    relative = str(articles.relative_to(new))
    records["parse"].outputs = [manifest.describe_file(str(new), str(articles)) if item.path == relative else item
                                for item in records["parse"].outputs]
    manifest.save(str(new), records)
    stale = [f"manifest.json: stage {stage} was built from other parse outputs than the recorded ones: rerun {stage}"
             for stage in ("dictionary", "mentions", "embed-entities", "index")]  # in the pipeline's order
    assert main(["diff", "--old", str(old), "--new", str(new), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["stale"] == [f"{new}: {problem}" for problem in stale]
    assert [line for line in captured.err.splitlines() if line.startswith("warning: ")] == [
        f"warning: {new}: {problem}" for problem in stale]
    assert main(["report", "--output", str(new), "--recall-queries", "5"]) == 0
    page = (new / "report" / "index.html").read_text()
    warnings = "".join(f'<p class="warn">{problem}</p>' for problem in stale)
    assert page.count('id="stale"') == 1 and f'<section id="stale">{warnings}</section>' in page  # one id a page
    assert page.index('id="stale"') < page.index('id="timings"')
    old = Path(shutil.copytree(old, tmp_path / "old"))  # the shared run stays as it is
    assert main(["report", "--output", str(old), "--previous", str(new), "--recall-queries", "5"]) == 0
    page = (old / "report" / "index.html").read_text()
    assert 'id="stale"' not in page  # this run is as built: only its changes since the previous run warn
    changes = page[page.index('<section id="changes">'):]
    assert changes[changes.index("</p>") + 4:].startswith("".join(f'<p class="warn">{new}: {problem}</p>'
                                                                  for problem in stale))


def test_vectors_of_another_dimension_are_not_compared(runs: Runs, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A run whose entities were embedded by a model of another width: the vectors are said to be not comparable,
    every other part is still compared (in the text, the JSON and the report)."""
    from tests.conftest import write_tiny_bert

    old, new = runs[2], Path(shutil.copytree(runs[2], tmp_path / "wider"))
    wider = write_tiny_bert(tmp_path / "bert-48", hidden_size=48)
    assert main(["embed-entities", "--output", str(new), "--model", str(wider), "--max-seq-length", "64",
                 *DIRECT]) == 0
    capsys.readouterr()
    assert main(["diff", "--old", str(old), "--new", str(new)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert ("entity vectors not compared: the old run's vectors have 32 dimensions, the new run's 48 (another "
            "model)") in lines
    articles = f"{len(rows(old, 'articles', ['page_id'])):,}"
    assert [line.split()[1:3] for line in lines if line.startswith("articles ")] == [[articles, articles]]
    assert main(["diff", "--old", str(old), "--new", str(new), "--json"]) == 0
    vectors = json.loads(capsys.readouterr().out)["entity_vectors"]
    assert (vectors["old_dim"], vectors["new_dim"], vectors["matched"], vectors["cosine_histogram"]) == (
        32, 48, None, None)
    assert main(["report", "--output", str(new), "--previous", str(old), "--recall-queries", "5"]) == 0
    page = (new / "report" / "index.html").read_text()
    assert "the old run&#x27;s vectors have 32 dimensions, the new run&#x27;s 48" in page
    assert changes_rows(new)["entities"][:2] == [f"{len(entity_keys(old)):,}"] * 2


def test_a_recorded_previous_run_replaced_since_is_not_compared(runs: Runs, tmp_path: Path) -> None:
    """The report of a refresh compares with the previous run it recorded only while the manifest at that path is
    the one the refresh read: another run written there since is said to be so, not diffed as if it were."""
    from artifacts import fs

    previous = Path(shutil.copytree(runs[1], tmp_path / "previous"))
    new = Path(shutil.copytree(runs[2], tmp_path / "new"))
    records = manifest.load(str(new))
    records["embed_entities"].options.update({  # as pipelines/refresh.py records --previous
        "previous": str(previous), "previous_manifest_sha256": fs.sha256(manifest.manifest_path(str(previous)))})
    manifest.save(str(new), records)
    assert main(["report", "--output", str(new), "--recall-queries", "5"]) == 0
    expected = expected_diff(runs[1], new)
    assert changes_rows(new)["articles"][:2] == [f"{expected['articles'][key]:,}" for key in ("old", "new")]

    shutil.rmtree(previous)
    shutil.copytree(runs[2], previous)  # another run at the same path
    assert main(["report", "--output", str(new), "--recall-queries", "5"]) == 0
    page = (new / "report" / "index.html").read_text()
    assert (f'<p class="warn">Could not compare: the run at {previous} has changed since this run was refreshed '
            "from it") in page
    assert 'id="changes-table"' not in page
    assert main(["report", "--output", str(new), "--previous", str(previous), "--recall-queries", "5"]) == 0
    assert changes_rows(new)["articles"][2:] == ["0", "0", "0 changed"]


def corpus_file(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join([BUNDLED_PASSAGES.read_text(encoding="utf-8").splitlines()[0], *rows]) + "\n",
                    encoding="utf-8")
    return path


def test_runs_built_from_a_dpr_corpus_are_compared_by_their_indexed_passages(tiny_bert: Path, tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]
                                                                            ) -> None:
    """The DPR setup: index --corpus, then a refresh of a newer corpus (--previous). diff compares the passages the
    index holds (a corpus run writes no passages/), and the refreshed run's report has its changes section."""
    lines = BUNDLED_PASSAGES.read_text(encoding="utf-8").splitlines()[1:]
    edited = lines[60].split("\t")
    newer = [*lines[50:60], "\t".join([edited[0], "A passage rewritten in the newer corpus.", edited[2]]),
             *lines[61:150]]
    corpora = corpus_file(tmp_path / "old.tsv", lines[:100]), corpus_file(tmp_path / "new.tsv", newer)
    old, new = tmp_path / "old", tmp_path / "new"
    index = ["index", "--encoder", str(tiny_bert), "--encoder-type", "mean", "--max-length", "32", *DIRECT]
    assert main([*index, "--output", str(old), "--corpus", str(corpora[0])]) == 0
    assert main([*index, "--output", str(new), "--corpus", str(corpora[1]), "--previous", str(old)]) == 0
    capsys.readouterr()

    assert main(["diff", "--old", str(old), "--new", str(new), "--json"]) == 0
    passages = json.loads(capsys.readouterr().out)["passages"]
    assert passages == {"old": 100, "new": 100, "added": 50, "removed": 50, "changed": 1, "reused": 49,
                        "encoded": 51, "old_source": f"the corpus {corpora[0]}",
                        "new_source": f"the corpus {corpora[1]}"}
    copy = shutil.copytree(old, tmp_path / "old-copy")  # the run the refresh read, elsewhere: its reuse
    new_copy = shutil.copytree(new, tmp_path / "new-copy")
    for other, reused in ((copy, 49), (new_copy, None)):  # not that run: what new took from old is not its reuse of it
        assert main(["diff", "--old", str(other), "--new", str(new), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["passages"]["reused"] == reused, other
    assert main(["diff", "--old", str(copy), "--new", str(old)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert re.split(r"\s{2,}", next(line for line in table if line.startswith("passages "))) == [
        "passages", "100", "100", "0", "0", "0", "(changed)"]
    assert table[-1] == (f"passages: the indexed ones, matched by id, title and text compared; old: the corpus "
                         f"{corpora[0]}; new: the corpus {corpora[0]}")

    assert main(["report", "--output", str(new), "--recall-queries", "5"]) == 0
    assert changes_rows(new)["passages"] == ["100", "100", "50", "50", "1 changed"]
    assert "encoded 51 · reused 49" in (new / "report" / "index.html").read_text()

    shutil.rmtree(old)
    shutil.copytree(new, old)  # another run where the one the refresh read was: its reuse of that one is not known
    assert main(["diff", "--old", str(old), "--new", str(new)]) == 0
    assert ("passages: encoded 51, reused n/a (refreshed from the old run's path when it held another run: its "
            "manifest.json has changed since)") in capsys.readouterr().out.splitlines()
