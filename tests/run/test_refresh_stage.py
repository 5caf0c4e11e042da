"""Refreshes end to end: ``all --previous OLD_OUT`` on a newer dump (tests/dump_versions.py) equals a run of that
dump from scratch, reuses exactly what did not change, and refuses previous runs it cannot trust.

Every expected number is computed here from the rows the runs wrote, without pipelines/refresh.py."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from artifacts.faiss.storage import write_index
from artifacts.run import manifest
from artifacts.run.validation import validate_run
from pipelines import embed_entities as embed_entities_stage
from pipelines.launcher.cli import main
from tests.builders import all_command, record
from tests.builders import artifact_rows as rows
from tests.conftest import BUNDLED_SAMPLE, DIRECT, copy_stages, write_tiny_bert
from tests.run_fixtures import DumpRuns, run_all
from transforms.common.mention_sampling import CHARS_PER_TOKEN, context_window

ROW_ARTIFACTS = ("articles", "redirects", "entities", "dictionary/names", "mentions", "passages")
UPSTREAM = ("parse", "dictionary", "mentions")


@pytest.fixture(scope="module")
def runs(dump_runs: DumpRuns, refreshed_run: Path) -> tuple[Path, Path, Path]:
    """(old run, new run from scratch, new run refreshed from the old one): the shared session runs."""
    return dump_runs.old, dump_runs.new, refreshed_run


# --- reading what the runs wrote ---------------------------------------------------------------------------


def canonical(items: list[dict]) -> list[str]:
    return sorted(json.dumps(item, sort_keys=True, default=bytes.hex) for item in items)  # bytes: window_digest


def entity_keys(output: Path) -> dict[int, str]:
    return {row["entity_id"]: row["qid"] or row["title"] for row in rows(output, "entities")}


def samples_by_key(output: Path) -> dict[str, list[tuple]]:
    """Entity key -> its sampled mentions as the model sees them: (page, window cut from articles/, span in it)."""
    keys, samples = entity_keys(output), {}
    texts = {row["page_id"]: row["text"] for row in rows(output, "articles", ["page_id", "text"])}
    for row in rows(output, "mentions"):
        window = context_window(texts[row["page_id"]], row["start"], row["end"], 64 * CHARS_PER_TOKEN)
        samples.setdefault(keys[row["entity_id"]], []).append((row["page_id"], *window))
    return {key: sorted(sample) for key, sample in samples.items()}


def embeddings(output: Path) -> dict[int, tuple]:
    return {row["entity_id"]: (row["title"], row["qid"], row["mention_count"], np.asarray(row["embedding"]))
            for row in rows(output, "entity_embeddings")}


def passage_vectors(output: Path) -> dict[int, tuple]:
    """passage_id -> (shard, title, text, vector) from the index's vector tables."""
    found = {}
    for shard in sorted((output / "index" / "embeddings").iterdir()):
        for row in rows(shard.parent, shard.name):
            found[row["passage_id"]] = (shard.name, row["title"], row["text"], np.asarray(row["embedding"]))
    return found


def shard_ids(output: Path) -> dict[str, list[int]]:
    return {path.name: sorted(np.load(path).tolist()) for path in sorted((output / "index").glob("*.ids.npy"))}


def counters(output: Path, stage: str) -> dict[str, int]:
    return manifest.load(str(output))[stage].counters


# --- a refresh equals a run from scratch -------------------------------------------------------------------


def test_refreshed_rows_equal_a_run_from_scratch(runs):
    _, scratch, refreshed = runs
    for artifact in ROW_ARTIFACTS:
        assert canonical(rows(refreshed, artifact)) == canonical(rows(scratch, artifact)), artifact
    assert shard_ids(refreshed) == shard_ids(scratch)


def test_refreshed_vectors_equal_a_run_from_scratch(runs):
    _, scratch, refreshed = runs
    expected, found = embeddings(scratch), embeddings(refreshed)
    assert sorted(found) == sorted(expected)
    for entity_id, (title, qid, mentions, vector) in expected.items():
        assert found[entity_id][:3] == (title, qid, mentions)
        np.testing.assert_allclose(found[entity_id][3], vector, rtol=1e-4, atol=1e-5)
    expected, found = passage_vectors(scratch), passage_vectors(refreshed)
    assert sorted(found) == sorted(expected)
    for passage_id, (shard, title, text, vector) in expected.items():
        assert found[passage_id][:3] == (shard, title, text)
        np.testing.assert_allclose(found[passage_id][3], vector, rtol=1e-4, atol=1e-5)


def test_refresh_reuses_exactly_the_unchanged_entities(runs):
    old, scratch, refreshed = runs
    old_samples, new_samples = samples_by_key(old), samples_by_key(scratch)
    old_keys = entity_keys(old)
    with_vector = {old_keys[entity_id] for entity_id in embeddings(old)}
    reused = sum(1 for key, sample in new_samples.items() if key in with_vector and old_samples.get(key) == sample)
    found = counters(refreshed, "embed_entities")
    assert (found["entities_reused"], found["entities_recomputed"]) == (reused, len(new_samples) - reused)
    assert 0 < len(new_samples) - reused < reused  # most entities are reused, some are not
    assert "entities_reused" not in counters(scratch, "embed_entities")


def test_refresh_reencodes_exactly_the_changed_passages(runs):
    old, _, refreshed = runs
    before = {passage_id: (title, text) for passage_id, (_, title, text, _) in passage_vectors(old).items()}
    passages = rows(refreshed, "passages")
    reused = sum(1 for row in passages if before.get(row["passage_id"]) == (row["title"], row["text"]))
    found = counters(refreshed, "index")
    assert (found["passages_reused"], found["passages_encoded"]) == (reused, len(passages) - reused)
    assert 0 < len(passages) - reused < reused


def expected_id_map(old: Path, new: Path) -> list[dict]:
    old_ids = {key: entity_id for entity_id, key in entity_keys(old).items()}
    new_ids = {key: entity_id for entity_id, key in entity_keys(new).items()}
    return [{"key": key, "old_entity_id": old_ids[key], "new_entity_id": new_ids[key]}
            for key in set(old_ids) & set(new_ids)]


def test_refresh_writes_the_old_to_new_entity_id_map(runs):
    old, _, refreshed = runs
    expected = expected_id_map(old, refreshed)
    assert canonical(rows(refreshed, "entity_id_map")) == canonical(expected)
    assert any(row["old_entity_id"] != row["new_entity_id"] for row in expected)  # ids did move


def test_refresh_records_the_previous_run(runs):
    old, _, refreshed = runs
    sha256 = hashlib.sha256((old / manifest.MANIFEST_NAME).read_bytes()).hexdigest()
    records = manifest.load(str(refreshed))
    for stage in ("embed_entities", "index"):
        assert records[stage].options["previous"] == str(old)
        assert records[stage].options["previous_manifest_sha256"] == sha256
    assert "previous" not in records["mentions"].options


# --- what is not reused ------------------------------------------------------------------------------------


def stderr_line(capsys: pytest.CaptureFixture, prefix: str) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, lines
    return lines[0]


def upstream_of(scratch: Path, destination: Path) -> Path:
    destination.mkdir()
    copy_stages(scratch, destination, UPSTREAM)
    return destination


def embed(output: Path, model: Path, previous: Path, *extra: str) -> int:
    return main(["embed-entities", "--output", str(output), "--model", str(model), "--max-seq-length", "64",
                 "--previous", str(previous), *extra, *DIRECT])


def entities_with_mentions(output: Path) -> int:
    return len({row["entity_id"] for row in rows(output, "mentions", ["entity_id"])})


def test_a_changed_option_recomputes_everything(runs, tiny_bert, tmp_path, capsys):
    old, scratch, _ = runs
    output = upstream_of(scratch, tmp_path / "out")
    assert embed(output, tiny_bert, old, "--layer", "1") == 0
    assert stderr_line(capsys, "[embed-entities] re") == (
        "[embed-entities] recomputing everything: it was built with other options (layer: -1 -> 1)")
    found = counters(output, "embed_entities")
    assert (found["entities_reused"], found["entities_recomputed"]) == (0, entities_with_mentions(output))
    # no vector is taken from the previous run, but its entity ids still map to this one's
    assert canonical(rows(output, "entity_id_map")) == canonical(expected_id_map(old, output))


def test_a_completed_refresh_stays_complete_once_its_previous_run_is_deleted(runs, tiny_bert, tmp_path, capsys):
    """OLD_OUT may be deleted: the same command again recomputed everything and dropped entity_id_map/."""
    old, scratch, _ = runs
    previous = tmp_path / "previous"
    shutil.copytree(old, previous)
    output = upstream_of(scratch, tmp_path / "out")
    assert embed(output, tiny_bert, previous) == 0
    before = counters(output, "embed_entities")
    id_map = rows(output, "entity_id_map")
    assert before["entities_reused"] > 0 and id_map
    shutil.rmtree(previous)
    capsys.readouterr()
    assert embed(output, tiny_bert, previous) == 0
    assert stderr_line(capsys, "[embed-entities] skipped") == (
        "[embed-entities] skipped: outputs complete, inputs and options unchanged")
    assert (counters(output, "embed_entities"), rows(output, "entity_id_map")) == (before, id_map)


def test_a_rerun_of_a_refresh_whose_previous_run_is_gone_reuses_its_own_work(runs, tiny_bert, tmp_path, capsys):
    """OLD_OUT deleted, the refresh rerun with --force (another --shards): the index encoded every passage again
    though the index OUT holds lends them all, and --require-reuse refused; embed-entities said it recomputed
    everything while it reused every window of its own store, and committed no entity id map (the refresh's
    was gone for good) and counted every entity recomputed."""
    old, scratch, _ = runs
    previous = tmp_path / "previous"
    shutil.copytree(old, previous)
    output = upstream_of(scratch, tmp_path / "out")
    assert embed(output, tiny_bert, previous) == 0
    refreshed = counters(output, "embed_entities")
    id_map = rows(output, "entity_id_map")
    assert id_map and refreshed["entities_reused"] > 0
    digest = manifest.load(str(output))["embed_entities"].options["previous_manifest_sha256"]
    index = ["index", "--output", str(output), "--encoder", str(tiny_bert), "--encoder-type", "mean",
             "--max-length", "64", "--previous", str(previous), *DIRECT]
    assert main([*index, "--shards", "2"]) == 0
    shutil.rmtree(previous)
    capsys.readouterr()
    assert embed(output, tiny_bert, previous, "--force", "--require-reuse") == 0
    err = capsys.readouterr().err
    assert (f"[embed-entities] not reusing {previous} ({previous} has no manifest.json): reusing the windows of this "
            "OUT's mention_vectors/ where nothing changed\n") in err
    assert (f"[embed-entities] keeping the entity id map of the refresh from {previous} this OUT holds (that run "
            "can be read no more; OUT's entities are those it mapped)\n") in err
    rerun = counters(output, "embed_entities")
    assert rerun["mentions_encoded"] == 0
    assert [rerun[name] for name in ("entities_reused", "entities_recomputed")] == [
        refreshed[name] for name in ("entities_reused", "entities_recomputed")]
    assert rows(output, "entity_id_map") == id_map
    assert validate_run(str(output)) == []
    # the run it derives from is still named by its digest (was "(gone)": diff against a copy of it found none)
    assert manifest.load(str(output))["embed_entities"].options["previous_manifest_sha256"] == digest != "(gone)"
    # another model: every vector made anew, the map kept (it is made of the entities alone), no entity reused
    assert embed(output, write_tiny_bert(tmp_path / "other-bert", seed=1), previous, "--force") == 0
    other = counters(output, "embed_entities")
    assert (other["entities_reused"], other["entities_recomputed"]) == (0, rerun["entities_reused"]
                                                                        + rerun["entities_recomputed"])
    assert rows(output, "entity_id_map") == id_map
    capsys.readouterr()
    assert main([*index, "--shards", "1", "--force", "--require-reuse"]) == 0
    assert stderr_line(capsys, "[index] not reusing") == (
        f"[index] not reusing {previous} ({previous} has no manifest.json): reusing the vectors of the index this "
        "OUT holds where nothing changed")
    found = counters(output, "index")
    assert (found["passages_encoded"], found["passages_reused"]) == (0, len(rows(output, "passages")))
    assert len(shard_ids(output)) == 1


def test_diff_of_published_copies_says_what_the_refresh_reused(runs, tmp_path, capsys):
    """A copy is published without the kept work, so its manifest is not the one the refresh read: diff of two
    copies said "reused n/a (not refreshed from the old run)" (publish records the run it copied)."""
    old, _, refreshed = runs
    copies = [tmp_path / "old-copy", tmp_path / "new-copy"]
    for run, copy in zip((old, refreshed), copies, strict=True):
        assert main(["publish", "--output", str(run), "--to", str(copy)]) == 0
    capsys.readouterr()
    assert main(["diff", "--old", str(copies[0]), "--new", str(copies[1]), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert (found["entity_vectors"]["reused"], found["passages"]["reused"]) == (
        counters(refreshed, "embed_entities")["entities_reused"], counters(refreshed, "index")["passages_reused"])
    assert found["passages"]["reused"] > 0


def test_another_embedding_dtype_reuses_the_windows(runs, tiny_bert, tmp_path):
    """--embedding-dtype stores the entity vectors, not the windows' (float16 whatever it is): a refresh refused
    the previous run's windows and encoded them all again."""
    old, scratch, refreshed = runs
    output = upstream_of(scratch, tmp_path / "out")
    assert embed(output, tiny_bert, old, "--embedding-dtype", "float16", "--require-reuse") == 0
    found, expected = counters(output, "embed_entities"), counters(refreshed, "embed_entities")
    assert (found["mentions_encoded"], found["entities_reused"]) == (expected["mentions_encoded"],
                                                                     expected["entities_reused"])
    vectors, reference = embeddings(output), embeddings(refreshed)
    assert vectors.keys() == reference.keys()
    assert all(np.allclose(vectors[key][3], reference[key][3], rtol=1e-3, atol=1e-3) for key in vectors)


def test_an_own_store_of_other_window_options_does_not_satisfy_require_reuse(runs, tiny_bert, tmp_path, capsys):
    """OLD_OUT refused for another --max-seq-length: OUT's own store, cut with the old one, lends next to nothing,
    and --require-reuse passed (every window encoded again, exit 0)."""
    old, _, refreshed = runs
    output = tmp_path / "out"
    shutil.copytree(refreshed, output)
    assert embed(output, tiny_bert, old, "--max-seq-length", "32", "--require-reuse") == 2
    assert stderr_line(capsys, "error:") == (
        "error: cannot reuse the previous run: it was built with other options (max_seq_length: 64 -> 32)")


def test_all_with_require_reuse_stays_complete_once_its_previous_run_is_deleted(dump_runs, tiny_bert, tmp_path,
                                                                               capsys):
    """The README: once a refresh has completed, OLD_OUT may be deleted. With --require-reuse the same command
    stopped before its first stage: "cannot reuse the previous run: OLD has no manifest.json"."""
    previous = tmp_path / "previous"
    shutil.copytree(dump_runs.old, previous)
    output = run_all(dump_runs.versions.new, tmp_path / "out", tiny_bert, "--previous", str(previous),
                     "--require-reuse")
    shutil.rmtree(previous)
    capsys.readouterr()
    assert main(all_command(output, tiny_bert, "--no-report", "--previous", str(previous), "--require-reuse",
                            dump=dump_runs.versions.new)) == 0
    assert [line for line in capsys.readouterr().err.splitlines() if "skipped: " in line] == [
        f"[{command}] skipped: outputs complete, inputs and options unchanged"
        for command in ("parse", "dictionary", "mentions", "embed-entities", "index")]


def test_a_previous_run_that_changes_while_it_is_read_commits_nothing(runs, tiny_bert, tmp_path, capsys,
                                                                         monkeypatch):
    """A stage of OLD_OUT committed while the refresh read it (its vectors replaced under it: the refresh found
    none of them and committed zero entity vectors, exit 0): nothing is committed, one line; run again, it reuses."""
    old, scratch, _ = runs
    previous = tmp_path / "previous"
    shutil.copytree(old, previous)
    output = upstream_of(scratch, tmp_path / "out")
    run_stage = embed_entities_stage.STAGE.run

    def run_while_previous_commits(ctx, config):
        counters_found = run_stage(ctx, config)
        committed = previous / "manifest.json"
        committed.write_text(committed.read_text() + "\n")  # another manifest, as a commit of OLD_OUT writes
        return counters_found

    monkeypatch.setattr(embed_entities_stage.STAGE, "run", run_while_previous_commits)
    assert embed(output, tiny_bert, previous) == 2
    assert stderr_line(capsys, "error:") == (
        f"error: --previous {previous} changed while embed-entities read it (a stage of it committed meanwhile): what "
        f"was taken from it could mix two versions, so nothing was committed; run the same command again once "
        f"nothing writes {previous}")
    assert "embed_entities" not in manifest.load(str(output))
    monkeypatch.undo()
    assert embed(output, tiny_bert, previous) == 0
    assert counters(output, "embed_entities")["entities_reused"] > 0


def test_a_corrupt_previous_run_is_refused(runs, tiny_bert, tmp_path, capsys):
    old, scratch, _ = runs
    corrupt = tmp_path / "corrupt"
    shutil.copytree(old, corrupt)
    target = sorted((corrupt / "entity_embeddings").glob("*.parquet"))[0]
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    reason = (f"{corrupt} does not validate (entity_embeddings/{target.name}: sha256 differs from the manifest)")
    output = upstream_of(scratch, tmp_path / "out")
    assert embed(output, tiny_bert, corrupt, "--require-reuse") == 2
    assert stderr_line(capsys, "error:") == f"error: cannot reuse the previous run: {reason}"
    assert embed(output, tiny_bert, corrupt) == 0
    assert stderr_line(capsys, "[embed-entities] re") == f"[embed-entities] recomputing everything: {reason}"
    found = counters(output, "embed_entities")
    assert (found["entities_reused"], found["entities_recomputed"]) == (0, entities_with_mentions(output))


def test_a_run_is_not_its_own_previous_run(runs, tiny_bert, tmp_path, capsys):
    """--previous OUT with OUT itself never settled: each commit changed the manifest the next run compared."""
    _, scratch, _ = runs
    output = upstream_of(scratch, tmp_path / "out")
    for spelled in (output, output / ".." / output.name, f"{output}/"):  # made absolute as the flag is parsed
        assert embed(output, tiny_bert, spelled) == 2
        assert stderr_line(capsys, "error:") == (
            f"error: --previous {output} is this run's own --output: a refresh takes vectors from another run "
            "(name the earlier run's OUT, or leave --previous out: a rerun reuses its own work)")


def test_an_incomplete_previous_run_is_refused(runs, tiny_bert, tmp_path, capsys):
    old, scratch, _ = runs
    partial = tmp_path / "partial"
    partial.mkdir()
    copy_stages(old, partial, UPSTREAM)
    output = upstream_of(scratch, tmp_path / "out")
    assert embed(output, tiny_bert, partial, "--require-reuse") == 2
    assert stderr_line(capsys, "error:") == (
        f"error: cannot reuse the previous run: {partial} is incomplete (no 'embed-entities' stage)")
    # `all` says so before its first stage, not after parse, dictionary and mentions have run
    fresh = tmp_path / "fresh"
    assert main(["all", "--dump", str(BUNDLED_SAMPLE), "--output", str(fresh), "--model", str(tiny_bert), "--encoder",
                 str(tiny_bert), "--encoder-type", "mean", "--previous", str(partial), "--require-reuse",
                 *DIRECT]) == 2
    assert stderr_line(capsys, "error:") == (
        f"error: cannot reuse the previous run: {partial} is incomplete (no 'embed-entities' stage)")
    assert not (fresh / "articles").exists()


@pytest.mark.parametrize("case", ["published without mention vectors", "another --max-seq-length"])
def test_all_refuses_what_a_stage_would_refuse_before_its_first_stage(runs, tiny_bert, tmp_path, capsys, case):
    """A previous run that kept no mention vectors, or one of other window options: embed-entities refuses it
    under --require-reuse, and `all` said so only after parse, dictionary and mentions had run."""
    old, _, _ = runs
    previous, extra, reason = old, ("--max-seq-length", "32"), (
        "it was built with other options (max_seq_length: 64 -> 32; mentions' max_seq_length: 64 -> 32)")
    if case == "published without mention vectors":
        previous, extra, reason = tmp_path / "published", (), (
            "it kept no mention vectors (built with --no-mention-vectors, published without --with-mention-vectors, "
            "or by an older version)")
        shutil.copytree(old, previous, ignore=shutil.ignore_patterns("mention_vectors"))
    fresh = tmp_path / "fresh"
    assert main(all_command(fresh, tiny_bert, "--previous", str(previous), "--require-reuse", *extra)) == 2
    assert stderr_line(capsys, "error:") == f"error: cannot reuse the previous run: {reason}"
    assert not (fresh / "articles").exists()


def test_an_encoder_option_named_at_its_default_is_the_same_encoder(runs, tiny_bert, tmp_path, capsys):
    """The previous run left --similarity and --title-mode at a mean encoder's defaults; naming them reuses."""
    old, scratch, refreshed = runs
    output = upstream_of(scratch, tmp_path / "out")
    assert main(["index", "--output", str(output), "--encoder", str(tiny_bert), "--encoder-type", "mean",
                 "--max-length", "64", "--shards", "2", "--similarity", "cosine", "--title-mode", "join",
                 "--previous", str(old), "--require-reuse", *DIRECT]) == 0
    assert counters(output, "index")["passages_reused"] == counters(refreshed, "index")["passages_reused"] > 0


def test_options_of_the_queries_alone_keep_the_passage_vectors(runs, tiny_bert, tmp_path, capsys):
    """Another --query-encoder or --query-prefix changes no passage vector: a refresh reuses them (it recomputed
    every passage, and --require-reuse refused), and so does a rerun in place."""
    old, scratch, refreshed = runs
    output = upstream_of(scratch, tmp_path / "out")
    query_encoder = write_tiny_bert(tmp_path / "query-bert", seed=1)
    index = ["index", "--output", str(output), "--encoder", str(tiny_bert), "--encoder-type", "mean",
             "--max-length", "64", "--shards", "2", *DIRECT]
    assert main([*index, "--query-encoder", str(query_encoder), "--query-prefix", "query: ",
                 "--previous", str(old), "--require-reuse"]) == 0
    assert counters(output, "index")["passages_reused"] == counters(refreshed, "index")["passages_reused"] > 0
    capsys.readouterr()
    assert main([*index, "--query-prefix", "question: "]) == 0
    assert stderr_line(capsys, "[index] reusing") == (
        "[index] reusing the vectors of the index this OUT holds where nothing changed")
    found = counters(output, "index")
    assert (found["passages_reused"], found["passages_encoded"]) == (len(rows(output, "passages")), 0)


def test_a_rerun_of_a_refresh_takes_what_its_previous_run_lacks_from_its_own_index(runs, tiny_bert, tmp_path,
                                                                                  capsys):
    """A completed refresh run again with another --shards while OLD_OUT is there: the passages unchanged since
    OLD_OUT take its vectors, the new and changed ones those of the index OUT holds (they were encoded again), as
    does its IVF quantizer (OLD_OUT's is Flat's: it was trained again), and every vector is the one the refresh
    committed. An index there whose embeddings changed lends nothing, said in a line; one that lost its FAISS files
    (built from the embeddings) still lends every vector: every passage was encoded again; a trained quantizer
    changed since is trained again."""
    import faiss

    old, scratch, refreshed = runs
    output = upstream_of(scratch, tmp_path / "out")
    index = ["index", "--output", str(output), "--encoder", str(tiny_bert), "--encoder-type", "mean",
             "--max-length", "64", "--previous", str(old), "--index-factory", "IVF2,Flat", *DIRECT]
    assert main([*index, "--shards", "2"]) == 0
    assert counters(output, "index")["passages_encoded"] == counters(refreshed, "index")["passages_encoded"] > 0
    committed, trained = passage_vectors(output), (output / "index" / "trained.faiss").read_bytes()
    capsys.readouterr()
    assert main([*index, "--shards", "3"]) == 0
    err = capsys.readouterr().err
    assert (f"[index] and the vectors of the index this OUT holds (of this encoder) where those of {old} do not "
            "serve") in err.splitlines()
    assert f"[index] reusing the trained quantizer of {output} (IVF2,Flat x 32)" in err.splitlines()
    assert (output / "index" / "trained.faiss").read_bytes() == trained
    found = counters(output, "index")
    assert (found["passages_reused"], found["passages_encoded"]) == (len(committed), 0)
    rerun = passage_vectors(output)
    assert sorted(rerun) == sorted(committed)
    for passage_id, (_, title, text, vector) in committed.items():
        assert rerun[passage_id][1:3] == (title, text)
        np.testing.assert_array_equal(rerun[passage_id][3], vector)
    (output / "index" / "trained.faiss").write_bytes(b"")
    (output / "index" / "shard-00000.faiss").unlink()
    assert main([*index, "--shards", "2"]) == 0
    assert stderr_line(capsys, "[index] training the quantizer again:") == (
        f"[index] training the quantizer again: {old} has Flat x 32, this one needs IVF2,Flat x 32; {output} has a "
        f"trained.faiss that does not load with faiss ({output / 'index' / 'trained.faiss'} is damaged: the file "
        "ends before the index does (cut short?))")
    found = counters(output, "index")
    assert (found["passages_reused"], found["passages_encoded"]) == (len(committed), 0)
    assert validate_run(str(output)) == []
    centroids = faiss.read_index(str(output / "index" / "trained.faiss"))  # others of the same shape and size
    faiss.downcast_index(centroids).quantizer.reset()
    faiss.downcast_index(centroids).quantizer.add(np.full((2, 32), 100.0, "float32"))
    faiss.write_index(centroids, str(output / "index" / "trained.faiss"))
    assert main([*index, "--shards", "2"]) == 0
    assert stderr_line(capsys, "[index] training the quantizer again:").endswith(
        f"{output} has a trained.faiss other than it recorded (index/trained.faiss: its sha256 differs from the "
        "manifest's)")
    trained = faiss.read_index(str(output / "index" / "trained.faiss"))
    assert np.abs(faiss.downcast_index(trained).quantizer.reconstruct_n(0, 2)).max() < 100
    embeddings = sorted((output / "index" / "embeddings").rglob("*.parquet"))[0]
    size = embeddings.stat().st_size
    embeddings.write_bytes(embeddings.read_bytes()[:100])
    assert main([*index, "--shards", "2"]) == 0
    assert stderr_line(capsys, "[index] the index this OUT holds") == (
        f"[index] the index this OUT holds lends no vector ({embeddings.relative_to(output)}: 100 bytes, manifest "
        f"says {size})")


def test_a_trained_quantizer_of_another_shape_is_trained_again(runs, tiny_bert, tmp_path, capsys):
    """A lender's trained.faiss of another shape than its index.json says (recorded so: validate took it for
    sound) is passed over in a line, and the quantizer trained again: every shard failed on it (a traceback)."""
    import faiss

    old, scratch, _ = runs
    output = upstream_of(scratch, tmp_path / "out")
    index = ["index", "--output", str(output), "--encoder", str(tiny_bert), "--encoder-type", "mean",
             "--max-length", "64", "--previous", str(old), "--index-factory", "IVF2,Flat", *DIRECT]
    assert main([*index, "--shards", "2"]) == 0
    write_index(faiss.IndexFlatIP(8), str(output / "index" / "trained.faiss"))
    record(output, "index/trained.faiss")
    capsys.readouterr()
    assert main([*index, "--shards", "3"]) == 0
    assert stderr_line(capsys, "[index] training the quantizer again") == (
        f"[index] training the quantizer again: {old} has Flat x 32, this one needs IVF2,Flat x 32; {output} has a "
        "trained.faiss that is an IndexFlatIP of 8 dims where IVF2,Flat x 32 makes an IndexIVFFlat of 32")
    assert validate_run(str(output)) == []


def test_mention_vectors_stored_under_an_earlier_versions_keys_are_said_to_be(runs, tiny_bert, tmp_path, capsys):
    """A local model's windows keyed by its files' paths and times (before 2026-12-07): "it kept no mention vectors",
    where it kept them all."""
    old, scratch, _ = runs
    earlier = Path(shutil.copytree(old, tmp_path / "earlier"))
    for path in sorted((earlier / "mention_vectors").glob("*.parquet")):
        table = pq.read_table(path)
        pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"kpr_store_salt": b"0" * 32}), path)
        record(earlier, f"mention_vectors/{path.name}")
    output = upstream_of(scratch, tmp_path / "out")
    assert embed(output, tiny_bert, earlier, "--require-reuse") == 2
    assert stderr_line(capsys, "error:") == (
        "error: cannot reuse the previous run: it stored its mention vectors under the keys an earlier version gave a "
        "local model (by its files' paths and times, before 2026-12-07), which this one does not read")


def test_a_copy_published_without_mention_vectors_says_so(runs, tiny_bert, tmp_path, capsys):
    old, scratch, _ = runs
    published = tmp_path / "published"
    assert main(["publish", "--output", str(old), "--to", str(published)]) == 0
    output = upstream_of(scratch, tmp_path / "out")
    assert embed(output, tiny_bert, published, "--require-reuse") == 2
    assert stderr_line(capsys, "error:") == (
        "error: cannot reuse the previous run: it kept no mention vectors (built with --no-mention-vectors, "
        "published without --with-mention-vectors, or by an older version)")


def test_a_previous_run_of_the_same_model_at_another_path_is_reused(runs, tiny_bert, tmp_path):
    """A model is the content of its files: copied elsewhere with new times (a new machine, a new download), it
    lends the previous run's windows and passages as the old path did, where it recomputed everything."""
    old, scratch, refreshed = runs
    moved = tmp_path / "moved-bert"
    shutil.copytree(tiny_bert, moved, copy_function=shutil.copyfile)  # new modification times
    assert manifest.file_fingerprint(f"{moved}/*") != manifest.file_fingerprint(f"{tiny_bert}/*")
    output = upstream_of(scratch, tmp_path / "out")
    assert embed(output, moved, old, "--require-reuse") == 0
    assert main(["index", "--output", str(output), "--encoder", str(moved), "--encoder-type", "mean",
                 "--max-length", "64", "--shards", "2", "--previous", str(old), "--require-reuse", *DIRECT]) == 0
    for stage, names in (("embed_entities", ("mentions_encoded", "mentions_reused", "entities_reused")),
                         ("index", ("passages_encoded", "passages_reused"))):
        found, expected = counters(output, stage), counters(refreshed, stage)
        assert [found[name] for name in names] == [expected[name] for name in names]
    assert counters(output, "index")["passages_reused"] > 0


def test_a_previous_run_of_another_model_is_not_reused(runs, tiny_bert, tmp_path, capsys):
    old, scratch, _ = runs
    other = write_tiny_bert(tmp_path / "other-bert", seed=1)
    output = upstream_of(scratch, tmp_path / "out")
    assert embed(output, other, old, "--require-reuse") == 2
    assert stderr_line(capsys, "error:") == (
        f"error: cannot reuse the previous run: it was built with other options (model: '{tiny_bert}' -> "
        f"'{other}'; model: model files changed)")
    assert main(["index", "--output", str(output), "--encoder", str(other), "--encoder-type", "mean",
                 "--max-length", "64", "--shards", "2", "--previous", str(old), *DIRECT]) == 0
    assert stderr_line(capsys, "[index] re") == (
        f"[index] recomputing everything: it was built with another encoder (model: '{tiny_bert}' -> "
        f"'{other}'; encoder: model files changed)")
    found = counters(output, "index")
    assert (found["passages_reused"], found["passages_encoded"]) == (0, len(rows(output, "passages")))
