"""transforms/common/follow.py: a writer gives each file to the follower it has given the fewest rows, each follower
takes every file of its share once as it appears, and they stop only once the launcher says the first pipeline has
ended, or as soon as it says it failed."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from artifacts import fs, tables
from transforms.common.follow import (
    FollowedFiles,
    FollowerClock,
    InputsFailedError,
    Shares,
    WriteFollowedFiles,
    files_per_step,
    follow_steps,
    mark_ended,
    one_step_ahead,
    wait_for,
)


def followed_paths(files: FollowedFiles, index: int, followers: int) -> list[str]:
    """Every path follower ``index`` takes, its steps joined."""
    return [path for step in follow_steps(files, index, followers) for path in step]


def followed(directory: Path, followers: int = 1) -> FollowedFiles:
    return FollowedFiles(str(directory / "inputs"), "inputs-", str(directory / "inputs.list"),
                         str(directory / "ended.json"), followers)


def write_file(files: FollowedFiles, name: str, follower: int = 0) -> str:
    path = fs.join(files.directory, f"{files.share(follower)}{name}.parquet")
    fs.write_bytes_atomic(path, name.encode())
    return path


class WriteNumbers(WriteFollowedFiles):
    def table(self, batch: list[int]) -> pa.Table:
        return pa.table({"n": batch})


def written_rows(writer: WriteFollowedFiles, bundles: list[list[int]]) -> list[str]:
    """The files ``writer`` writes for ``bundles`` of batches of that many rows (a worker's bundles, in order)."""
    paths: list[str] = []
    writer.setup()
    for bundle in bundles:
        writer.start_bundle()
        for rows in bundle:
            paths.extend(writer.process(list(range(rows))))
        paths.extend(value.value for value in writer.finish_bundle())
    return paths


def list_files(files: FollowedFiles, paths: list[str]) -> None:
    """What the first pipeline's WriteToText writes (two shards of the listing)."""
    half = len(paths) // 2
    fs.write_bytes_atomic(f"{files.listing}-00000-of-00002", "".join(f"{path}\n" for path in paths[:half]).encode())
    fs.write_bytes_atomic(f"{files.listing}-00001-of-00002", "".join(f"{path}\n" for path in paths[half:]).encode())


def test_followers_take_their_share_as_the_files_come_and_stop_after_the_end(tmp_path):
    files = followed(tmp_path, followers=3)
    written: list[str] = []
    ended_at: list[float] = []

    def first_pipeline() -> None:
        for part in range(12):
            time.sleep(0.05)
            written.append(write_file(files, f"f{part}", follower=part % 3 if part < 9 else 1))
        list_files(files, written)
        time.sleep(0.5)  # no new file for a while: the followers must not stop
        ended_at.append(time.monotonic())
        mark_ended(files, None)

    writer = threading.Thread(target=first_pipeline)
    writer.start()
    taken: list[list[str]] = [[] for _ in range(3)]
    readers = [threading.Thread(target=lambda index=index: taken[index].extend(followed_paths(files, index, 3)))
               for index in range(3)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    stopped_at = time.monotonic()
    writer.join()
    assert stopped_at >= ended_at[0]
    assert sorted(path for share in taken for path in share) == sorted(written)  # each file once, none missed
    assert [len(share) for share in taken] == [3, 6, 3]  # each the files written for it ("1-" is not "11-")
    assert all(fs.basename(path).startswith(f"inputs-{index}-") for index, share in enumerate(taken) for path in share)
    with pytest.raises(ValueError, match="written for 3"):
        next(follow_steps(files, 0, 2))


def test_a_writer_gives_each_file_to_the_follower_it_has_given_the_fewest_rows():
    shares = Shares([0, 0, 0], order=[2, 0, 1])
    assert [shares.give(rows) for rows in (500, 300, 300, 34, 256, 506)] == [2, 0, 1, 0, 1, 0]  # ties: 0 before 1
    assert shares.given == [840, 556, 500]
    drawn = [Shares.drawn(8).give(256) for _ in range(200)]  # each writer's first file: anywhere
    assert len(set(drawn)) == 8


def test_the_files_a_writer_writes_share_its_rows_within_a_files_rows(tmp_path):
    """A file of each 256 rows (batches cut where a file ends, the rest of a bundle a small file), in order; the
    followers' shares of one writer's rows differ by 256 rows at most."""
    files = followed(tmp_path, followers=4)
    bundles = [[250, 250, 9], [120, 250, 600, 250, 34], [250] * 9, [7], [250, 40, 250, 250]]
    paths = written_rows(WriteNumbers(files, rows_per_file=256), bundles)
    written = [tables.read_file(path).column("n").to_pylist() for path in paths]
    assert [len(numbers) for numbers in written] == [256, 253, 256, 256, 256, 256, 230] + [256] * 8 + [202, 7,
                                                                                            256, 256, 256, 22]
    assert written[0] == list(range(250)) + list(range(6)) and written[1] == list(range(6, 250)) + list(range(9))
    rows = [sum(len(numbers) for path, numbers in zip(paths, written, strict=True)
                if fs.basename(path).startswith(files.share(index))) for index in range(4)]
    assert sum(rows) == sum(map(sum, bundles)) and max(rows) - min(rows) <= 256, rows


def test_a_listed_file_is_taken_even_when_the_end_comes_before_the_follower_saw_it(tmp_path):
    files = followed(tmp_path)
    written = [write_file(files, f"f{part}") for part in range(4)]
    list_files(files, written)
    mark_ended(files, None)
    assert sorted(followed_paths(files, 0, 1)) == sorted(written)


def test_a_failed_first_pipeline_stops_the_followers_and_their_wait(tmp_path):
    files = followed(tmp_path)
    write_file(files, "f0")
    mark_ended(files, OSError("no space left on device\nmore detail"))
    with pytest.raises(InputsFailedError) as failed:
        list(follow_steps(files, 0, 1))
    assert failed.value.message == "no space left on device"
    with pytest.raises(InputsFailedError, match="no space left on device"):
        wait_for(str(tmp_path / "facts.json"), files)


def test_a_first_pipeline_that_fails_stops_its_followers_at_their_next_step(tmp_path):
    """A follower took every step of the files it had listed before it looked for the end again: a failure the
    inputs' pipeline said 9 s into the stage came 101 s later, after 6,400 more passages encoded (probe BT)."""
    files = FollowedFiles(**{**followed(tmp_path).__dict__, "files_per_step": 1})
    for part in range(3):  # the inputs ahead of the model: three steps present at its first look
        write_file(files, f"f{part}")
    steps = follow_steps(files, 0, 1)
    next(steps)
    mark_ended(files, RuntimeError("articles/part-0.parquet cannot be read as Parquet"))
    with pytest.raises(InputsFailedError, match="cannot be read as Parquet"):
        next(steps)


def test_a_follower_clock_splits_its_time_into_waiting_for_items_the_parts_timed_and_the_rest():
    clock = FollowerClock()

    def slow_items():
        for item in range(3):
            time.sleep(0.05)  # the inputs are not ready yet
            yield item

    taken = []
    for item in clock.waited("waiting for inputs", slow_items()):
        taken.append(item)
        with clock.timing("model"):
            time.sleep(0.02)
        time.sleep(0.03)  # neither: "other"
    assert taken == [0, 1, 2]
    assert 0.15 <= clock.seconds["waiting for inputs"] < 0.3
    assert 0.06 <= clock.seconds["model"] < 0.15
    line = clock.line("embed-entities", "1 of 2", "3 windows encoded")
    assert line.startswith("[embed-entities] model process 1 of 2: 3 windows encoded in ")
    assert "waiting for inputs 0." in line and "model 0." in line
    other = float(line.rsplit("other ", 1)[1].rstrip("s"))
    assert 0.08 <= other < 0.2


def test_a_follower_takes_the_files_present_in_steps_of_at_most_files_per_step(tmp_path):
    files = FollowedFiles(**{**followed(tmp_path).__dict__, "files_per_step": 3})
    written = [write_file(files, f"{part:02d}") for part in range(7)]  # all present at the first look
    list_files(files, written)
    mark_ended(files, None)
    steps = list(follow_steps(files, 0, 1))
    assert [len(step) for step in steps] == [3, 3, 1]
    assert sorted(path for step in steps for path in step) == sorted(written)


def test_a_step_holds_about_as_many_rows_as_the_largest_input_file():
    assert files_per_step(500, 8192) == 16 and files_per_step(8192, 8192) == 1
    assert files_per_step(5000, 4096) == 1 and files_per_step(0, 4096) == 4096


def test_a_step_is_handed_on_once_the_next_one_has_started_and_its_own_work_finished_before():
    """``one_step_ahead``: a step's work finished (its vectors copied back) before the next step's starts (on one
    CUDA stream the copy would otherwise wait for the next step), and handed on only after that start, so that the
    caller's work on it overlaps the device's on the next; the last finished at the end."""
    events: list[str] = []

    def steps():
        for name in "abc":
            events.append(f"{name} read")
            yield name

    def start(step: str) -> str:
        events.append(f"{step} started")
        return step.upper()

    def finish(started: str) -> str:
        events.append(f"{started.lower()} finished")
        return started * 2

    for finished in one_step_ahead(steps(), start, finish):
        events.append(f"{finished[0].lower()} handed on as {finished}")
    assert events == ["a read", "a started",
                      "b read", "a finished", "b started", "a handed on as AA",
                      "c read", "b finished", "c started", "b handed on as BB",
                      "c finished", "c handed on as CC"]
    assert list(one_step_ahead([], start, finish)) == []
