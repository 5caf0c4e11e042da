"""The dictionary-based entity linker: its files (the KPR reference layout) and its runtime (no Beam needed).

Layout of ``dictionary/linker/``: ``name.trie`` (marisa Trie of names), ``kb_id.trie`` (marisa Trie of entity
keys: QIDs where known, else titles; entity_id = key id + 1), ``data.npy`` (uint32 rows kb_index, link_count,
total_link_count, doc_count, grouped by name id), ``offsets.npy`` (uint32 row ranges per name id, names + 1),
``config.json``, plus ``titles.bin``/``title_offsets.npy`` (entity titles in kb order, for readable output).
A case-folded name with "İ" is also in ``name.trie`` as the reference lowers it (``with_reference_spellings``).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import marisa_trie
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from artifacts import fs
from artifacts.errors import InputError, first_line
from artifacts.names import DEFAULT_LANGUAGE, DOTTED_CAPITAL_I, NameRules, TokenSpans, find_names, fold_case
from artifacts.trie_map import iter_strings, string_array, trie_key_ids

LINKER_FILES = ("name.trie", "kb_id.trie", "data.npy", "offsets.npy", "config.json", "titles.bin",
                "title_offsets.npy")
# Candidate tuples kept per linker: a worker linking millions of passages meets millions of distinct names, so
# the cache is emptied when full (memory per worker stays bounded; frequent names come back at once).
CANDIDATE_CACHE_SIZE = 1 << 17


@dataclass(frozen=True)
class Candidate:
    entity_id: int
    key: str
    title: str
    link_prob: float
    commonness: float
    link_count: int


@dataclass(frozen=True)
class Mention:
    start: int
    end: int
    name: str
    candidates: tuple[Candidate, ...]


@dataclass(frozen=True)
class NameRow:
    """One kept (name, entity) pair of the dictionary."""

    name: str
    entity_id: int
    link_count: int
    total_link_count: int
    doc_count: int


def build_kb_trie(keys: Iterable[str]) -> marisa_trie.Trie:
    """The entity key trie; ``entity_id = trie[key] + 1`` (marisa ids depend only on the key set)."""
    return marisa_trie.Trie(keys)


def write_linker(directory: str, rows: Sequence[NameRow], kb_keys: marisa_trie.Trie, titles: Sequence[str],
                 config: dict) -> None:
    """Write the linker files for ``rows``; ``titles[i]`` is the title of kb index i."""
    counts = np.array([(row.entity_id, row.link_count, row.total_link_count, row.doc_count) for row in rows],
                      dtype=np.int64).reshape(len(rows), 4)
    write_linker_columns(directory, [row.name for row in rows], counts, kb_keys, titles, config)


def utf8_concatenated(strings: pa.Array | pa.ChunkedArray) -> tuple[bytes, np.ndarray]:
    """(the UTF-8 bytes of ``strings`` one after the other, the offset of each and of the end): Arrow's own
    buffers, no Python string made."""
    array = strings.combine_chunks() if isinstance(strings, pa.ChunkedArray) else strings
    array = array.cast(pa.large_string())
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset:array.offset + len(array) + 1]
    data = array.buffers()[2]
    return (data.to_pybytes()[offsets[0]:offsets[-1]] if data is not None else b""), \
        (offsets - offsets[0]).astype(np.uint64)


def write_linker_columns(directory: str, names: pa.Array | pa.ChunkedArray | Sequence[str], counts: np.ndarray,
                         kb_keys: marisa_trie.Trie, titles: pa.Array | pa.ChunkedArray | Sequence[str],
                         config: dict) -> None:
    """Write the linker files from columns: ``names[i]`` and ``counts[i]`` = (entity_id, link_count,
    total_link_count, doc_count) of pair i. Arrays, not per-row objects, so millions of pairs stay small."""
    names = string_array(names)
    if not config["case_sensitive"]:
        names, counts = with_reference_spellings(names, counts)
    trie = marisa_trie.Trie(iter_strings(names))
    name_ids = trie_key_ids(trie, names, np.uint32)
    data = counts.astype(np.uint32, copy=False).reshape(len(names), 4)
    data[:, 0] -= 1  # entity_id -> kb_index
    # By name id, then most linked first, then by entity: the same bytes whatever order the rows came in.
    order = np.lexsort((data[:, 0], np.iinfo(np.uint32).max - data[:, 1], name_ids))
    data = data[order]
    offsets = np.zeros(len(trie) + 1, dtype=np.uint32)
    np.cumsum(np.bincount(name_ids, minlength=len(trie)), out=offsets[1:])
    encoded, title_offsets = utf8_concatenated(string_array(titles))
    with tempfile.TemporaryDirectory() as local:
        trie.save(os.path.join(local, "name.trie"))
        kb_keys.save(os.path.join(local, "kb_id.trie"))
        np.save(os.path.join(local, "data.npy"), data)
        np.save(os.path.join(local, "offsets.npy"), offsets)
        np.save(os.path.join(local, "title_offsets.npy"), title_offsets)
        with open(os.path.join(local, "titles.bin"), "wb") as handle:
            handle.write(encoded)
        with open(os.path.join(local, "config.json"), "w") as handle:
            json.dump(config, handle, indent=2, sort_keys=True)
        for name in LINKER_FILES:
            fs.upload(os.path.join(local, name), fs.join(directory, name))


def with_reference_spellings(names: pa.Array | pa.ChunkedArray,
                             counts: np.ndarray) -> tuple[pa.ChunkedArray, np.ndarray]:
    """``names`` and their ``counts`` with a copy of each row whose name holds "İ" under ``str.lower()``'s spelling
    ("i̇", two characters), unless a name is spelled so already: the KPR reference looks names up in
    ``text.lower()``, and ``fold_case`` keeps "İ" one character so that offsets stay (this linker never meets the
    copy; an exported linker holds the spellings the reference's builder stores)."""
    names = pa.chunked_array([names]) if isinstance(names, pa.Array) else names
    if len(names) == 0:  # pyarrow 25's indices_nonzero crashes the process on the no-chunk array it would get
        return names, counts
    rows = pc.indices_nonzero(pc.match_substring(names, DOTTED_CAPITAL_I))
    spellings = [name.lower() for name in names.take(rows).to_pylist()]
    lowered = pa.array(spellings, names.type)
    # the few lowered spellings are looked for among the names (a set of them all would take GBs at 20M names)
    present = set(names.filter(pc.is_in(names, value_set=lowered)).to_pylist())
    new = np.array([spelling not in present for spelling in spellings], dtype=bool)
    if not new.any():
        return names, counts
    return (pa.chunked_array([*names.chunks, lowered.filter(new)], names.type),
            np.concatenate([counts, counts[np.asarray(rows)[new]]]))


CONFIG_KEYS = ("min_link_prob", "min_prior_prob", "min_link_count", "case_sensitive", "max_mention_length")


def read_config(directory: str) -> dict:
    """A linker's ``config.json``, with the keys the linker reads; a one-line ``InputError`` when it is damaged."""
    path = os.path.join(directory, "config.json")
    with damaged_file_error(directory, "config.json"), open(path, "rb") as handle:
        config = json.loads(handle.read())
    missing = [key for key in CONFIG_KEYS if not isinstance(config, dict) or key not in config]
    if missing:
        raise InputError(f"{path} is damaged (no {missing[0]}): restore it from a copy of the run, or rerun the "
                         "dictionary stage")
    return config


@contextlib.contextmanager
def damaged_file_error(directory: str, what: str) -> Iterator[None]:
    """A one-line ``InputError`` for linker files (``what``) that cannot be read as what they should be."""
    try:
        yield
    except (ValueError, OSError, RuntimeError, EOFError) as error:  # JSON and text decoding errors are ValueErrors
        raise InputError(f"{directory} is a damaged linker ({what} cannot be read: {first_line(error)}): restore it "
                         "from a copy of the run, or rerun the dictionary stage") from error


def threshold(name: str, built: float, given: float | None, count: bool = False) -> float:
    """A threshold of ``load``: the build's (``built``) unless ``given``; a given one must be a probability (a
    count: a whole number of at least 0). One below the build's finds nothing more: the pairs below it were left out
    of the files."""
    if given is None:
        return built
    if count:
        valid = isinstance(given, (int, np.integer)) and not isinstance(given, bool) and given >= 0
    else:
        valid = isinstance(given, (int, float, np.number)) and not isinstance(given, bool) and 0.0 <= given <= 1.0
    if not valid:
        raise InputError(f"{name}={given!r}: give " + ("a whole number of at least 0" if count else
                                                       "a probability, from 0 to 1"))
    return given


def _download(path: str, local: str) -> None:
    """Copy the linker files of a Beam filesystem URL ``path`` into the local directory ``local``, chunk by
    chunk (the name trie and the arrays reach hundreds of MB at full scale)."""
    for name in LINKER_FILES:
        with open(os.path.join(local, name), "wb") as handle:
            handle.writelines(fs.iter_chunks(fs.join(path, name)))


class EntityLinker:
    """Finds dictionary names in text: the longest name at each token start, no overlaps, all candidates.

    With thresholds stricter than the build's, a name none of whose candidates passes is skipped and a shorter
    name at the same start can match. ``longest_name_blocks`` takes the reference's rule instead
    (kembed's ``DictionaryEntityLinker``): the longest name takes its span whatever its candidates, and a span
    without a passing candidate gives no mention. With the build's thresholds the two agree.
    """

    def __init__(self, directory: str, min_link_prob: float | None = None, min_commonness: float | None = None,
                 min_link_count: int | None = None, longest_name_blocks: bool = False) -> None:
        missing = [name for name in LINKER_FILES if not os.path.exists(os.path.join(directory, name))]
        if missing:
            raise InputError(f"{directory} is not a complete linker (missing {', '.join(missing)}): "
                             "run the dictionary stage first")
        self.config = read_config(directory)
        self.min_link_prob = threshold("min_link_prob", self.config["min_link_prob"], min_link_prob)
        self.min_commonness = threshold("min_commonness", self.config["min_prior_prob"], min_commonness)
        self.min_link_count = threshold("min_link_count", self.config["min_link_count"], min_link_count, count=True)
        self.longest_name_blocks = longest_name_blocks
        self.rules = NameRules(case_sensitive=self.config["case_sensitive"],
                               max_length=self.config["max_mention_length"],
                               language=self.config.get("language", DEFAULT_LANGUAGE))  # not in earlier linkers
        with damaged_file_error(directory, "the tries"):
            self.names = marisa_trie.Trie().mmap(os.path.join(directory, "name.trie"))
            self.kb_keys = marisa_trie.Trie().mmap(os.path.join(directory, "kb_id.trie"))
        with damaged_file_error(directory, "the arrays"):
            self.data = np.load(os.path.join(directory, "data.npy"), mmap_mode="r")
            self.offsets = np.load(os.path.join(directory, "offsets.npy"), mmap_mode="r")
            self.title_offsets = np.load(os.path.join(directory, "title_offsets.npy"), mmap_mode="r")
        self.titles = np.memmap(os.path.join(directory, "titles.bin"), dtype=np.uint8, mode="r") \
            if os.path.getsize(os.path.join(directory, "titles.bin")) else np.zeros(0, dtype=np.uint8)
        if (problem := self._inconsistency()) is not None:
            raise InputError(f"{directory} is a damaged linker ({problem}): restore it from a copy of the run, or "
                             "rerun the dictionary stage")
        self._candidates_cache: dict[str, tuple[Candidate, ...]] = {}

    def _inconsistency(self) -> str | None:
        """Why the loaded files cannot be one linker's (shapes and sizes that do not fit one another), or None."""
        if self.data.ndim != 2 or self.data.shape[1] != 4 or self.offsets.ndim != 1 \
                or self.title_offsets.ndim != 1:
            return "data.npy, offsets.npy or title_offsets.npy has another shape"
        if len(self.offsets) != len(self.names) + 1 or (len(self.offsets) and self.offsets[-1] != len(self.data)):
            return "offsets.npy does not fit name.trie and data.npy"
        if len(self.title_offsets) != len(self.kb_keys) + 1 or self.title_offsets[-1] != len(self.titles):
            return "title_offsets.npy does not fit kb_id.trie and titles.bin"
        return None  # sizes only: reading data.npy's rows would map hundreds of MB into every worker that loads it

    @classmethod
    def load(cls, path: str, min_link_prob: float | None = None, min_commonness: float | None = None,
             min_link_count: int | None = None, longest_name_blocks: bool = False) -> EntityLinker:
        """Load ``OUT/dictionary/linker`` (local or any Beam filesystem URL); thresholds default to the build's.
        Local files are memory-mapped where they are; remote ones are copied to a temporary directory, mapped,
        and the copy removed at once (the mappings stay valid after their files are unlinked, on POSIX)."""
        if "://" not in path:
            return cls(path, min_link_prob, min_commonness, min_link_count, longest_name_blocks)
        with tempfile.TemporaryDirectory(prefix="kpr-linker-") as local:
            _download(path, local)
            return cls(local, min_link_prob, min_commonness, min_link_count, longest_name_blocks)

    @cached_property
    def _token_spans(self) -> TokenSpans:
        """The tokenizer of the language the linker was built with (made at the first ``detect``)."""
        try:
            return TokenSpans(self.rules.language)
        except InputError as error:
            raise InputError(f"the linker was built with --language {self.rules.language}: {error.message}") from None

    def title(self, kb_index: int) -> str:
        start, end = int(self.title_offsets[kb_index]), int(self.title_offsets[kb_index + 1])
        return bytes(self.titles[start:end]).decode("utf-8")

    def candidates(self, name: str) -> tuple[Candidate, ...]:
        """The candidates of a dictionary name (as written: "Aristotle"; case-folded here as ``detect`` folds a
        text, unless the dictionary is case-sensitive) that pass the thresholds, most common first (empty if
        none)."""
        return self._folded_candidates(name if self.rules.case_sensitive else fold_case(name))

    def _folded_candidates(self, name: str) -> tuple[Candidate, ...]:
        cached = self._candidates_cache.get(name)
        if cached is not None:
            return cached
        name_id = self.names.get(name)
        found: list[Candidate] = []
        if name_id is not None:
            for kb_index, link_count, total, doc_count in self.data[self.offsets[name_id]:self.offsets[name_id + 1]]:
                link_prob = min(1.0, float(total) / float(doc_count)) if doc_count else 1.0
                commonness = float(link_count) / float(total) if total else 0.0
                if link_prob < self.min_link_prob or commonness < self.min_commonness:
                    continue
                if link_count < self.min_link_count:
                    continue
                found.append(Candidate(int(kb_index) + 1, self.kb_keys.restore_key(int(kb_index)),
                                       self.title(int(kb_index)), link_prob, commonness, int(link_count)))
        result = tuple(sorted(found, key=lambda candidate: (-candidate.commonness, candidate.entity_id)))
        if len(self._candidates_cache) >= CANDIDATE_CACHE_SIZE:
            self._candidates_cache.clear()
        self._candidates_cache[name] = result
        return result

    @cached_property
    def _linkable(self) -> bytes:
        """Per name id: whether any candidate passes the thresholds (vectorized once, at first use)."""
        link_count, total, doc_count = (self.data[:, column].astype(np.float64) for column in (1, 2, 3))
        link_prob = np.minimum(1.0, np.divide(total, doc_count, out=np.ones_like(total), where=doc_count > 0))
        commonness = np.divide(link_count, total, out=np.zeros_like(total), where=total > 0)
        passing = ((link_prob >= self.min_link_prob) & (commonness >= self.min_commonness)
                   & (link_count >= self.min_link_count))
        name_of_row = np.repeat(np.arange(len(self.offsets) - 1), np.diff(self.offsets.astype(np.int64)))
        linkable = np.zeros(len(self.offsets) - 1, dtype=bool)
        linkable[name_of_row[passing]] = True
        return linkable.tobytes()  # indexing bytes is far cheaper than indexing a numpy array

    def _linkable_prefixes(self, text: str) -> list[str]:
        linkable = self._linkable
        return [name for name, name_id in self.names.iter_prefixes_with_ids(text) if linkable[name_id]]

    @cached_property
    def _prefix_finder(self):
        """The trie's own prefix search when every name may take a span (the longest name blocks it, or every
        name passes the thresholds: the build's defaults); else only the names with a passing candidate."""
        return self.names.prefixes if self.longest_name_blocks or all(self._linkable) else self._linkable_prefixes

    def detect(self, text: str) -> list[Mention]:
        """Mentions of dictionary names in ``text`` with every candidate entity that passes the thresholds; a
        ``ValueError`` for a text with a lone surrogate (a JSON "\\ud800" escape), which no tokenizer takes."""
        try:
            bounds = self._token_spans.bounds(text)
        except UnicodeEncodeError:  # its offset counts from the start of the piece spaCy was tokenizing
            at = next(index for index, character in enumerate(text) if "\ud800" <= character <= "\udfff")
            raise ValueError(f"a text with a lone surrogate ({text[at]!r} at {at}) cannot be linked: it is no "
                             "Unicode text a tokenizer takes") from None
        folded = text if self.rules.case_sensitive else fold_case(text)
        found = (Mention(match.start, match.end, text[match.start:match.end], self._folded_candidates(match.name))
                 for match in find_names(folded, bounds, self._prefix_finder, self.rules.max_length,
                                         longest_only=True))
        return [mention for mention in found if mention.candidates]  # a blocked span without one: no mention

    def detect_batch(self, texts: Sequence[str]) -> list[list[Mention]]:
        return [self.detect(text) for text in texts]
