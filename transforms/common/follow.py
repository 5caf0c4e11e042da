"""Two pipelines of one stage run side by side: the first, on every core, writes ready files (the model's inputs)
and lists them; the second, one process per GPU, follows them: each of its followers takes the files written for
it (a writer gives each file to the follower it has given the fewest rows, and names it so) as they appear, until
the launcher writes that the first pipeline ended (with every file it listed) or failed. A file is written whole
(``fs.write_bytes_atomic``), so a follower never reads one half written."""

from __future__ import annotations

import contextlib
import random
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import apache_beam as beam
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindows

from artifacts import fs, tables
from artifacts.errors import InputError, first_line
from transforms.common.dead_letters import DEAD_LETTER_TAG

FILES_PER_STAGE = 400  # a stage's input files, at least (when it has the rows): a killed stage loses little in flight
MIN_FILE_ROWS = 256  # ... but an input file holds at least a forward batch's rows (the model batches within a file)
FOLLOW_POLL_S = 0.2  # a follower with nothing to take looks for new files this often

T = TypeVar("T")
Started = TypeVar("Started")
Finished = TypeVar("Finished")
_END = object()  # the end of an iterator (``FollowerClock.waited``)


@dataclass(frozen=True)
class FollowedFiles:
    """Where the two pipelines meet: ``directory`` (the files, named ``prefix``*``.parquet``), ``listing`` (the
    prefix of the text files the first pipeline lists them in), ``ended`` (the file the launcher writes once
    the first pipeline has ended: every file it listed, or why it failed) and ``followers`` (the processes that
    follow them: each file is written for one of them, ``share``)."""

    directory: str
    prefix: str
    listing: str
    ended: str
    followers: int
    files_per_step: int = 1  # present files a follower takes at once (``follow_steps``)

    def share(self, index: int) -> str:
        """The name prefix of the files written for follower ``index`` (ended by "-": follower 1's is not 11's)."""
        return f"{self.prefix}{index}-"

    def path_for(self, index: int) -> str:
        """A new file's path in follower ``index``'s share."""
        return fs.join(self.directory, f"{self.share(index)}{uuid.uuid4().hex}.parquet")


class InputsFailedError(InputError):
    """The pipeline that writes the followed files failed: the one that follows it stops (the first pipeline's
    error is the one the stage reports). An InputError, whose worker's traceback the command line does not show:
    it would say nothing that the first's error does not (a damaged corpus: twenty lines before its one)."""


def rows_per_file(total: int, most: int) -> int:
    """Rows an input file holds when a stage has about ``total``: ``most``, or fewer so that there are
    ``FILES_PER_STAGE`` files (what a follower has in flight when the stage is killed is encoded again), but not
    fewer than ``MIN_FILE_ROWS`` (smaller files would make smaller forward batches)."""
    return min(most, max(MIN_FILE_ROWS, total // FILES_PER_STAGE))


def files_per_step(rows_per_file: int, most: int) -> int:
    """Files of ``rows_per_file`` rows a follower may take at once so that one step (one model call, after which
    the GPU waits for its vectors to come back) holds up to ``most`` rows, as one file of a large stage does."""
    return max(1, most // max(rows_per_file, 1))


def listed(prefix: str) -> list[str]:
    """The lines of the text files a pipeline listed under ``prefix`` (``beam.io.WriteToText``), in file order."""
    directory, name = prefix.rsplit("/", 1)
    return [line for path in fs.list_files(directory, f"{name}*")
            for line in fs.read_bytes(path).decode("utf-8").splitlines() if line]


def mark_ended(files: FollowedFiles, error: BaseException | None) -> None:
    """Tell the followers that the first pipeline has ended: every file it listed, or why it failed
    (``error``). Called by the launcher."""
    if error is not None:
        fs.write_json_atomic(files.ended, {"failed": first_line(error)})
    else:
        fs.write_json_atomic(files.ended, {"files": listed(files.listing)})


def ended_files(files: FollowedFiles) -> list[str] | None:
    """Every file of a first pipeline that has ended, None while it runs; an ``InputsFailedError`` if it failed."""
    if not fs.exists(files.ended):
        return None
    ended = fs.read_json(files.ended)
    if "failed" in ended:
        raise InputsFailedError(ended["failed"])
    return list(ended["files"])


@dataclass
class Shares:
    """The rows one writer has ``given`` each follower; its next file goes to the follower given the fewest, ties
    in ``order`` (drawn for each writer: the writers' first files spread), so that the followers' shares of one
    writer's rows differ by a file's rows at most, whatever the files' sizes (a bundle's last file is small)."""

    given: list[int]
    order: list[int]

    @classmethod
    def drawn(cls, followers: int) -> Shares:
        return cls([0] * followers, random.sample(range(followers), followers))

    def give(self, rows: int) -> int:
        """The follower a file of ``rows`` rows is written for."""
        follower = min(self.order, key=self.given.__getitem__)
        self.given[follower] += rows
        return follower


def follow_steps(files: FollowedFiles, index: int, followers: int) -> Iterator[list[str]]:
    """The paths of the files follower ``index`` of ``followers`` takes, each once, as they appear, in steps: the
    files of its share present when it looks, up to ``files.files_per_step`` a step (never waiting for more: a
    follower ahead of its inputs takes one at a time); ends once the first pipeline has ended and every one of its
    files was given (raises ``InputsFailedError`` if it failed, at the next step: the files of one look can be a
    large backlog where the inputs run ahead of the model)."""
    if files.followers != followers:
        raise ValueError(f"follower {index} of {followers}: the files were written for {files.followers}")
    share = files.share(index)
    done: set[str] = set()
    while True:
        ended = ended_files(files)
        present = ended if ended is not None else fs.list_files(files.directory, f"{share}*.parquet")
        mine = [path for path in present if fs.basename(path).startswith(share) and fs.basename(path) not in done]
        for begin in range(0, len(mine), files.files_per_step):
            if begin and ended is None:
                ended_files(files)  # raises once the first pipeline has failed
            step = mine[begin:begin + files.files_per_step]
            yield step
            done.update(fs.basename(path) for path in step)
        if ended is not None and not mine:
            return
        if not mine:
            time.sleep(FOLLOW_POLL_S)


def wait_for(path: str, files: FollowedFiles) -> None:
    """Wait until ``path`` exists (written by the first pipeline before its files); a first pipeline that failed
    before writing it ends the wait with its ``InputsFailedError``."""
    while not fs.exists(path):
        ended_files(files)
        time.sleep(FOLLOW_POLL_S)


def one_step_ahead(steps: Iterable[T], start: Callable[[T], Started],
                   finish: Callable[[Started], Finished]) -> Iterator[Finished]:
    """``finish(start(step))`` of each step, handed on only once the next step has started: when the next step is
    there, the last one is finished (``finish``: its vectors copied back, which waits for its forward passes), the
    next one started (``start``: its forward passes queued on the device), and then the last one is handed on, so
    that what the caller does with it (checks, counters, writing) overlaps the device's work on the next instead of
    leaving the device idle between steps. Finishing before starting the next keeps the copy back from waiting for
    the next step's work (a CUDA stream runs in order). Only what ``start`` returns is held, not the step."""
    held: list[Started] = []
    for step in steps:
        finished = [finish(held.pop())] if held else []
        held.append(start(step))
        yield from finished
    if held:
        yield finish(held.pop())


@dataclass
class FollowerClock:
    """Where a follower's time goes, by part (``timing``); its one-line summary (``line``) is written when it ends,
    so that a GPU that is not kept busy says why: waiting for inputs (the inputs' pipeline is the limit), the
    model (padding, the forward, the copy back: the GPU), writing behind (the disk)."""

    started: float = field(default_factory=time.perf_counter)
    seconds: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def timing(self, part: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - began

    def waited(self, part: str, items: Iterable[T]) -> Iterator[T]:
        """``items``, the time spent waiting for each counted as ``part``."""
        iterator = iter(items)
        while True:
            with self.timing(part):
                item = next(iterator, _END)
            if item is _END:
                return
            yield item

    def line(self, stage: str, follower: str, done: str) -> str:
        total = time.perf_counter() - self.started
        parts = [f"{part} {seconds:.1f}s ({seconds / total:.0%})" for part, seconds in self.seconds.items()]
        other = max(0.0, total - sum(self.seconds.values()))
        return f"[{stage}] model process {follower}: {done} in {total:.1f}s: {', '.join(parts)}, other {other:.1f}s"

    def write(self, stage: str, follower: str, done: str) -> None:
        print(self.line(stage, follower, done), file=sys.stderr, flush=True)


class WriteFollowedFiles(beam.DoFn):
    """Batches of elements -> the paths of the files ``files`` their tables (``table``, a subclass's) are written
    to: a file of each ``rows_per_file`` rows (a batch cut where a file ends), and one of the rest at the end of a
    bundle, each one row group, written whole, for the follower this writer has given the fewest rows
    (``Shares``). Nothing goes through a shuffle."""

    def __init__(self, files: FollowedFiles, rows_per_file: int) -> None:
        self._files, self._rows_per_file = files, rows_per_file

    def setup(self) -> None:
        self._shares = Shares.drawn(self._files.followers)  # this writer's, across its bundles

    def table(self, batch: Any) -> pa.Table:
        raise NotImplementedError

    def start_bundle(self) -> None:
        self._tables: list[pa.Table] = []
        self._rows = 0

    def process(self, batch: Any) -> Iterator[str]:
        table = self.table(batch)
        self._tables.append(table)
        self._rows += table.num_rows
        while self._rows >= self._rows_per_file:
            yield self._flush(self._rows_per_file)

    def finish_bundle(self) -> Iterator[Any]:
        if self._rows:
            yield GlobalWindows.windowed_value(self._flush(self._rows))

    def _flush(self, rows: int) -> str:
        """The first ``rows`` rows held written as a file (its path); the others held for the next."""
        held = pa.concat_tables(self._tables)
        table, rest = held.slice(0, rows).combine_chunks(), held.slice(rows)
        self._tables, self._rows = ([rest] if rest.num_rows else []), rest.num_rows
        path = self._files.path_for(self._shares.give(table.num_rows))
        fs.write_bytes_atomic(path, tables.parquet_bytes(table))  # seen whole or not at all
        return path


class RunFollowers(beam.PTransform):
    """A pipeline's root -> the outputs of ``follower`` (a DoFn of (index, followers) that follows the first
    pipeline's files, ``follow_steps``) run as ``followers`` followers (the files' ``followers``), one per process that
    holds the model: {``main``: its main output, "dead_letter": its dead letters}."""

    def __init__(self, follower: beam.DoFn, followers: int, main: str) -> None:
        super().__init__()
        self._follower, self._followers, self._main = follower, followers, main

    def expand(self, pipeline: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        followers = [(index, self._followers) for index in range(self._followers)]
        outputs = (pipeline | "Followers" >> beam.Create(followers) | "Spread" >> beam.Reshuffle()
                   | "Follow" >> beam.ParDo(self._follower).with_outputs(DEAD_LETTER_TAG, main=self._main))
        return {self._main: outputs[self._main], DEAD_LETTER_TAG: outputs[DEAD_LETTER_TAG]}
