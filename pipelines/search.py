"""search: encode queries with the index's own encoder, search every shard, merge the top-k exactly."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from artifacts import fs, layout
from artifacts.errors import InputError, ModelError, RunStateError, on_one_line
from artifacts.faiss import info
from artifacts.faiss.files import INDEX_JSON
from artifacts.faiss.info import MissingIndexError
from artifacts.faiss.search import DamagedShardError, PassageLookup, ShardedIndex
from artifacts.faiss.storage import MissingIndexFileError
from artifacts.names import has_lone_surrogate, shows_nothing
from artifacts.run import manifest, verified
from encoders.loading import load_retriever
from encoders.models import model_files
from encoders.retrievers import CUT_COUNTER, DenseEncoder, EncoderOptions
from pipelines.index import PASSAGE_ROLE, QUERY_ROLE, check_encoder, index_inputs

# the recorded files search reads: the index's and the passage texts (a --verify hashes them all)
READ_BY_SEARCH = (f"{layout.INDEX}/", f"{layout.PASSAGES}/")


@dataclass(frozen=True)
class Hit:
    passage_id: int
    score: float
    title: str
    text: str


def recorded_index_files(output: str) -> frozenset[str]:
    """The index files the manifest of ``output`` records, unchanged since: a reader never sees files of an
    index stage that is running or was cut off (they are not recorded until it commits)."""
    record = manifest.load(output).get(layout.INDEX_STAGE)
    if record is None:
        what = "index recorded in its manifest (the index stage has not finished)" if fs.exists(
            manifest.manifest_path(output)) else "manifest.json (no stage has finished there, or it was removed)"
        raise RunStateError(output, f"{output} has no {what}", f"run `{index_command(output)}` first")
    problems = manifest.missing_or_changed(output, record)
    if problems:
        raise index_changed(output, problems[0])
    return frozenset(fs.join(output, item.path) for item in record.outputs)


def index_command(output: str) -> str:
    return f"python run_pipeline.py index --output {shlex.quote(output)} ..."


def warn_rebuilt_since(output: str) -> None:
    """A line for each stage the index read that ran again since: the index still answers from what that stage
    wrote before (said once the index is known to answer: a KPR index whose entities changed is refused)."""
    records = manifest.load(output)
    for upstream in manifest.rebuilt_since(records[layout.INDEX_STAGE], records):
        print(f"warning: {layout.command_of(upstream)} ran again after the index was built: the index answers from "
              f"what it wrote before (rerun `{index_command(output)}` to index the new outputs)", file=sys.stderr)


def index_changed(output: str, problem: str) -> RunStateError:
    return RunStateError(output, f"the index under {output} changed after it was recorded ({problem})",
                         f"rerun `python run_pipeline.py index --output {shlex.quote(output)} ... --force`")


def check_index_contents(output: str, shards: list[str], verify: bool = False) -> None:
    """The shards (paths relative to OUT) hold what the index stage wrote: their sha256, hashed when a shard is
    first opened and then remembered by size and modification time (``artifacts.run.verified``); with ``verify``
    every file of the index and the passages is hashed again, whatever was remembered."""
    wanted = set(shards)
    items = [item for item in manifest.load(output)[layout.INDEX_STAGE].outputs
             if item.path in wanted or (verify and item.path.startswith(READ_BY_SEARCH))]
    problem = verified.changed_content(output, items, trust_remembered=not verify)
    if problem:
        raise index_changed(output, problem)


def device_here(indexed: str) -> str:
    """The device questions are encoded on when no --device is given: the one the passages were, unless it is a GPU
    this machine lacks (an index built on a GPU machine, searched on a CPU one): then the CPU, said in a line."""
    if indexed.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print(f"warning: the passages were encoded on {indexed} and this machine has no CUDA device: the "
                  "questions are encoded on cpu (--device to choose)", file=sys.stderr)
            return "cpu"
    return indexed


def check_run_inputs(output: str, index: info.IndexInfo, options: EncoderOptions, verify: bool = False) -> None:
    """The run's artifacts the index was encoded with (a KPR encoder's linker and entity embeddings) are still
    those under ``output``: the manifest records the same digests as when the index was built, their files hold
    what it records (sizes; sha256 as for the shards, ``check_index_contents``), and no other file is among them
    (the query encoder reads every Parquet file of ``entity_embeddings/``)."""
    current = index_inputs(options, output) if index.inputs else {}
    recorded = [item for record in manifest.load(output).values() for item in record.outputs] if index.inputs else []
    for name, digest in sorted(index.inputs.items()):
        directory = f"{name.rstrip('/')}/"
        items = [item for item in recorded if item.path.startswith(directory)]
        if current.get(name) != digest or verified.changed_files(output, items, trust_remembered=not verify):
            raise InputError(f"{fs.join(output, name)} changed after the index was built from it: rerun "
                             f"`python run_pipeline.py index --output {shlex.quote(output)} --force ...`")
        listed = {item.path for item in items}
        found = (fs.relative(path, output) for path in fs.list_tree(fs.join(output, directory)))
        if strays := [relative for relative in found if relative not in listed]:
            raise InputError(f"{fs.join(output, strays[0])} is not recorded in the manifest of {output} and the "
                             f"query encoder would read it: remove it (`python run_pipeline.py validate --output "
                             f"{shlex.quote(output)}` lists every such file)")


def check_query_model(output: str, options: EncoderOptions) -> None:
    """The index's own query model (a local directory) holds the files the index was built with: a model retrained
    into the same directory would encode the queries of an index of the old one's vectors. Files of other sizes or
    times are compared by content (a copy of the same model is not another); as the stage records them, every file
    of the directory counts (a README edited too: the message says so)."""
    role, model = QUERY_ROLE if options.query_model else PASSAGE_ROLE, options.spec("query").name_or_path
    pattern = model_files({role: model}).get(role)
    inputs = manifest.load(output)[layout.INDEX_STAGE].inputs
    if pattern is None or inputs.get(f"file:{role}") == manifest.file_fingerprint(pattern):
        return
    recorded = inputs.get(f"{manifest.CONTENT}{role}")
    if recorded is not None and recorded != manifest.content_digest(pattern):
        raise InputError(f"the query encoder {model} holds other files than when the index under {output} was built "
                         "with it: other weights, config or tokenizer (or a file no model loads, such as its README) "
                         "would encode the queries of vectors they did not make; rerun "
                         f"`{index_command(output)}` (passage vectors of an unchanged passage model are reused), or "
                         f"search with --query-encoder {shlex.quote(model)} where it is the same model")


class Retriever:
    """The index under OUT and its query encoder, loaded once. What it reads is of the version of OUT it checked
    when loaded, or the command stops (``check_unchanged``): a stage that commits into OUT meanwhile, or a publish
    over it, replaces files as they are read."""

    def __init__(self, output: str, device: str | None = None, dtype: str | None = None,
                 query_model: str | None = None, nprobe: int | None = None, ef_search: int | None = None,
                 verify: bool = False) -> None:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # the weight-loading bar would garble the printed results
        self._manifest = manifest.manifest_sha256(output)  # before anything is read
        index_dir = fs.join(output, layout.INDEX)
        recorded = recorded_index_files(output)
        self.output = output
        try:
            self.index = ShardedIndex(index_dir, nprobe, ef_search)
        except MissingIndexError as error:
            raise InputError(f"{error.message}: run `python run_pipeline.py index` first") from error
        unrecorded = [shard["index"] for shard in self.index.info.shard_files
                      if fs.join(index_dir, shard["index"]) not in recorded]
        if unrecorded:
            raise InputError(f"{fs.join(index_dir, unrecorded[0])} is not recorded in the manifest of {output}: "
                             f"run `python run_pipeline.py validate --output {shlex.quote(output)}`")
        check_index_contents(output, [fs.join(layout.INDEX, shard["index"]) for shard in self.index.info.shard_files],
                             verify)
        indexed = EncoderOptions.from_json(self.index.info.encoder)
        options = indexed.with_runtime(device or device_here(indexed.device), dtype, query_model)
        check_run_inputs(output, self.index.info, options, verify)
        warn_rebuilt_since(output)
        options = options.located(output)
        try:
            check_encoder(options, roles=("query",))  # the passages' model need not be here
        except ModelError as error:
            if query_model:
                raise
            raise InputError(f"{error.message}: it is the query encoder {fs.join(index_dir, INDEX_JSON)} records; "
                             "where it is elsewhere (a copy of the run on another machine), name it with "
                             "--query-encoder") from error
        if not query_model:
            check_query_model(output, options)
        self.encoder: DenseEncoder = load_retriever(options, "query")
        if self.encoder.dim != self.index.info.dim:
            raise InputError(f"the query encoder {options.spec('query').name_or_path} gives {self.encoder.dim}-dim "
                             f"vectors but the index at {index_dir} has {self.index.info.dim} dims")
        self.passages = PassageLookup(index_dir, self.index.info, recorded)
        self.queries_cut = 0  # queries encoded so far whose tokens ran past --max-length (their ends not encoded)
        self.queries_unknown = 0  # queries encoded so far that hold no token the query encoder knows

    def encode(self, queries: list[str], batch_size: int = 256) -> np.ndarray:
        def count(name: str, value: int) -> None:
            if name == CUT_COUNTER:  # the texts cut at --max-length, as the inputs count them: queries here
                self.queries_cut += value

        tokenizer = self.encoder.tokenizer
        if tokenizer.unk_token_id is not None:
            self.queries_unknown += sum(bool(ids) and set(ids) == {tokenizer.unk_token_id} for ids in
                                        tokenizer(list(queries), add_special_tokens=False)["input_ids"])
        parts = [self.encoder.encode_queries(queries[start:start + batch_size], count)
                 for start in range(0, len(queries), batch_size)]
        return np.concatenate(parts) if parts else np.zeros((0, self.encoder.dim), np.float32)

    def warn_about_queries(self, queries: int) -> None:
        """A warning line when queries ran past the index's --max-length (only their starts were searched for), and
        one when queries held nothing but the tokenizer's unknown token (an emoji, a script its vocabulary lacks):
        two such queries of as many tokens encode alike."""
        if self.queries_unknown:
            print(f"warning: {self.queries_unknown:,} of {queries:,} queries hold no token the query encoder knows "
                  f"(every one is its unknown token {self.encoder.tokenizer.unk_token}): their hits are not about "
                  "them", file=sys.stderr)
        if self.queries_cut:
            options = self.encoder.options
            prefix = f" (its query prefix {options.query_prefix!r} included)" if options.query_prefix else ""
            print(f"warning: {self.queries_cut:,} of {queries:,} queries ran past the index's --max-length of "
                  f"{options.max_length} tokens{prefix}: their ends were not encoded", file=sys.stderr)

    def search_ids(self, queries: list[str], k: int, batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
        """(scores, passage ids) of shape (queries, k or the index's passage count, the smaller); missing places
        are (-inf, -1). The queries checked as the command line checks them (``check_queries``), k and
        ``batch_size`` 1 or more."""
        check_queries(queries)
        for name, value in (("k", k), ("batch_size", batch_size)):
            if not isinstance(value, int) or value < 1:
                raise InputError(f"{name} is {value!r}: give a whole number of 1 or more")
        vectors = self.encode(queries, batch_size)
        try:
            return self.index.search(vectors, k)
        except DamagedShardError as error:
            raise InputError(f"{error.message}; check the run with "
                             f"`python run_pipeline.py validate --output {shlex.quote(self.output)}`") from error
        except MissingIndexFileError as error:
            raise InputError(f"{error.message}: run `python run_pipeline.py index` again") from error

    def texts(self, ids: np.ndarray) -> dict[int, tuple[str, str]]:
        """Title and text of every passage id (>= 0) of ``ids``; an id the passages' files do not hold stops the
        command (OUT changed meanwhile, or is damaged)."""
        found = self.passages.get(ids.ravel())
        missing = sorted({int(passage_id) for passage_id in ids.ravel() if passage_id >= 0} - found.keys())
        if missing:
            self.check_unchanged()
            raise InputError(f"passage {missing[0]} is in the index under {self.output} but in none of its passages' "
                             f"files: check the run with `python run_pipeline.py validate --output "
                             f"{shlex.quote(self.output)}`")
        return found

    def check_unchanged(self) -> None:
        """An InputError when OUT's manifest is no longer the one the retriever checked when loaded: what was read
        may be of two versions of the index."""
        if manifest.manifest_sha256(self.output) != self._manifest:
            raise InputError(f"{self.output} changed while it was searched (a stage of it, or a publish into it, "
                             "committed meanwhile): the results could mix two versions; run the command again")

    def search(self, queries: list[str], k: int, batch_size: int = 256) -> list[list[Hit]]:
        scores, ids = self.search_ids(queries, k, batch_size)
        texts = self.texts(ids)
        self.check_unchanged()
        return [[Hit(int(passage_id), float(score), *texts[int(passage_id)])
                 for score, passage_id in zip(row_scores, row_ids, strict=True) if passage_id >= 0]
                for row_scores, row_ids in zip(scores, ids, strict=True)]


def format_hits(query: str, hits: list[Hit], width: int = 100) -> str:
    """A query's hits as a table with a header: rank, score, passage id, title and the start of the text (every
    cell ``on_one_line``: --json gives them as they are)."""
    lines = [f"query: {on_one_line(query)}", f"{'rank':>4}  {'score':>8}  {'passage id':>10}  title | text"]
    for rank, hit in enumerate(hits, 1):
        text = hit.text if len(hit.text) <= width else hit.text[:width - 3] + "..."
        lines.append(f"{rank:4d}  {hit.score:8.4f}  {hit.passage_id:>10}  "
                     f"{on_one_line(hit.title)} | {on_one_line(text)}")
    return "\n".join(lines)


def check_queries(queries: Sequence[str], what: str = "a query") -> None:
    """An InputError for a query that searches for nothing or is not text that can be encoded (``what`` names it);
    a TypeError for one string (its characters would be searched one by one)."""
    if isinstance(queries, str) or not all(isinstance(query, str) for query in queries):
        raise TypeError("queries must be a list of str (one string would be searched character by character): "
                        "give [query]")
    if any(shows_nothing(query) for query in queries):
        raise InputError(f"{what} is empty (nothing but spaces or invisible characters): give the text to search for")
    if any(has_lone_surrogate(query) for query in queries):
        raise InputError(f"{what} holds bytes that are not UTF-8 (a terminal or script of another encoding?): give "
                         "the query as UTF-8 text")


class SearchCommand:
    """search: the top-k passages of the index under OUT for each --query."""

    def main(self, args: argparse.Namespace, beam_args: list[str]) -> int:
        check_queries(args.query, "--query")  # before the model loads
        retriever = Retriever(args.output, args.device, args.dtype, args.query_encoder, args.nprobe, args.ef_search,
                              args.verify)
        for query, hits in zip(args.query, retriever.search(args.query, args.k, args.batch_size), strict=True):
            if args.json:
                print(json.dumps({"query": query, "hits": [asdict(hit) for hit in hits]}, ensure_ascii=False))
            else:
                print(format_hits(query, hits))
        sys.stdout.flush()
        retriever.warn_about_queries(len(args.query))
        return 0


COMMAND = SearchCommand()
