"""The commands of the command line: what each is called and says, an example, the flags it takes and the module
that runs it. Declared without importing that module (Beam, torch, pyarrow), so that ``--help`` and every error
about arguments come before anything heavy is imported; ``implementation`` is imported once they are checked."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from artifacts import fs, layout
from artifacts.errors import InputError
from artifacts.faiss.choice import (
    DEFAULT_EF_SEARCH,
    DEFAULT_NPROBE,
    DEFAULT_SHARD_MEMORY_GB,
    MAX_SHARD_MEMORY_GB,
    MAX_SHARDS,
    SHARD_GROWTH,
    SHARDS_ARE,
    WORKER_BASE_GB,
)
from artifacts.names import DEFAULT_LANGUAGE, DOC_UNITS
from artifacts.run.report.recall import MAX_EXACT, QUERIES
from encoders.mask_inputs import MASK_WINDOWS
from encoders.models import DTYPES, STORED_DTYPES
from encoders.retrievers import KINDS, MIN_MAX_LENGTH, SIMILARITIES, TITLE_MODES
from pipelines.launcher.flags import (
    DEFAULT_KS,
    DEVICE,
    OUTPUT,
    PROGRESS,
    REFRESH,
    RUNTIME,
    SEQUENCE,
    FlagGroup,
    GivenOnce,
    at_least,
    local_path,
    more_than,
    name_or_path,
    path_or_url,
    probability,
    whole_between,
)
from transforms.index.passages import DUPLICATE_KEEPS

SAMPLE_DUMP = "samples/enwiki-sample-pages-articles-multistream.xml.bz2"


@dataclass(frozen=True)
class Command:
    """One command: ``summary`` (its --help and the command list), ``example`` (the end of its --help),
    ``groups`` (its flags), ``required`` ((flag destination, the line when it is missing)), ``checks`` (rules
    between flags, an ``InputError`` when one is broken), ``input_checks`` (those that list input files: run once
    Beam's filesystems have the run's options, its credentials), ``implementation`` ("module:attribute": a stage,
    run with resume and commit, or a command with ``main``)."""

    name: str
    summary: str
    example: str
    implementation: str
    groups: tuple[FlagGroup, ...]
    required: tuple[tuple[str, str], ...] = ()
    checks: tuple[Callable[[argparse.Namespace], None], ...] = ()
    input_checks: tuple[Callable[[argparse.Namespace], None], ...] = ()

    def check(self, args: argparse.Namespace) -> None:
        """The flags it cannot run without, then the rules between flags (before anything heavy is imported)."""
        for dest, line in self.required:
            if not getattr(args, dest):
                raise InputError(line)
        for check in self.checks:
            check(args)

    def check_inputs(self, args: argparse.Namespace) -> None:
        """The rules on the input files the flags name (globs listed), once Beam's filesystems are configured."""
        for check in self.input_checks:
            check(args)


def dump_files(args: argparse.Namespace) -> None:
    """The globs of --dump, --dump-index and the SQL tables as the files they match, in path order: one quoted, or
    on a Beam filesystem (``gs://bucket/enwiki-*-pages-articles-multistream[0-9]*.bz2``), which no shell lists.
    Recorded file by file, a glob and its files named one by one are the same inputs."""
    for dest in ("dump", "dump_index", "redirects_sql", "page_sql", "page_props_sql"):
        if getattr(args, dest, None):
            setattr(args, dest, [path for pattern in getattr(args, dest) for path in fs.expand_glob(pattern)])


def named_once(flag: str, paths: list[str]) -> None:
    """Each file a flag names named once: one file under two names (a link) is named twice too."""
    files = [fs.same_file_key(path) for path in paths]
    repeated = list(dict.fromkeys(path for path, file in zip(paths, files, strict=True) if files.count(file) > 1))
    if repeated:
        raise InputError(f"{flag} names {repeated[0]} more than once" if paths.count(repeated[0]) > 1 else
                         f"{flag} names one file twice: {' and '.join(repeated)}")


def one_index_per_dump(args: argparse.Namespace) -> None:
    """Each dump named once (its pages would be each other's duplicates, all dropped), and an index for each."""
    named_once("--dump", args.dump)
    if args.dump_index and len(args.dump_index) != len(args.dump):
        raise InputError(f"--dump-index names {len(args.dump_index)} files for {len(args.dump)} dumps")


def each_question_file_once(args: argparse.Namespace) -> None:
    """evaluate's question files each named once (one named twice was searched and scored twice)."""
    named_once("--questions", args.questions)


# The flags that name input files a stage reads more than once (a dump's head, then its pages; a corpus's lines
# counted, then read).
INPUT_FILE_FLAGS = ("dump", "dump_index", "redirects_sql", "page_sql", "page_props_sql", "corpus")


def input_files(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """(flag, path) of every input file the flags name."""
    for dest in INPUT_FILE_FLAGS:
        values = getattr(args, dest, None) or []
        for path in values if isinstance(values, list) else [values]:
            yield f"--{dest.replace('_', '-')}", path


def existing_input_files(args: argparse.Namespace) -> None:
    """Every input file there, a file, and every glob matching one, before OUT is touched: a mistyped one made an
    empty OUT and printed "[index] running" before its error; a URL whose filesystem lacks its client library is
    said here too, once Beam's filesystems have the run's options."""
    for flag, path in input_files(args):
        if not fs.is_glob(path) and not fs.exists(path):
            raise InputError(f"{flag} {path}: no such file")
        fs.matching_files(path)  # a glob that matches nothing, a directory: a line of its own


def regular_input_files(args: argparse.Namespace) -> None:
    """Every local input file a regular file: a pipe (``--dump /dev/stdin`` fed by one) or a FIFO is read once
    only, so its second reading found nothing (no article) or waited forever."""
    for flag, path in input_files(args):
        if "://" not in path and os.path.exists(path) and not (os.path.isfile(path) or os.path.isdir(path)):
            raise InputError(f"{flag} {path} is not a regular file (a pipe, a FIFO or a device): it is read more than "
                             "once; save it to a file and name that")


# parse's and all's, once globs can be listed
DUMP_CHECKS = (dump_files, one_index_per_dump, existing_input_files, regular_input_files)


def dump_flags(args: argparse.Namespace) -> None:
    """``DUMP_CHECKS`` before anything heavy is imported, where no value may be a glob (one is listed later)."""
    if not any(fs.has_glob_characters(path) for dest in ("dump", "dump_index") for path in getattr(args, dest) or ()):
        one_index_per_dump(args)
        regular_input_files(args)


def _parse(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--dump", nargs="+", action="extend", type=local_path,
                       help="dump file(s): .xml, .xml.bz2, .xml.gz, multistream or parts")
    group.add_argument("--dump-index", nargs="+", action="extend", type=local_path,
                       help="multistream index file(s), one per dump (default: found beside the dump)")
    group.add_argument("--redirects-sql", nargs="+", action="extend", type=local_path,
                       help="redirect table dump(s) (.sql[.gz])")
    group.add_argument("--page-sql", nargs="+", action="extend", type=local_path,
                       help="page table dump(s): names the source pages of --redirects-sql rows")
    group.add_argument("--page-props-sql", nargs="+", action="extend", type=local_path,
                       help="page_props table dump(s): wikibase_item gives each article its Wikidata QID")
    group.add_argument("--skip-bad-streams", action="store_true",
                       help="count and skip a corrupt multistream stream instead of stopping")
    group.add_argument("--keep-section-links", action="store_true", help="keep [[Page#Section]] links as links to Page")
    group.add_argument("--first-bold-as-link", action="store_true",
                       help="the first bold text of the lead links to the page itself")
    group.add_argument("--no-prepass", action="store_true",
                       help="parse the full wikitext without the fast markup-removal pre-pass")


def _dictionary(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--min-link-prob", type=probability("min_link_prob"), default=0.05,
                       help="keep a name if link_prob >= this")
    group.add_argument("--min-commonness", type=probability("min_commonness"), default=0.3,
                       help="keep a candidate if commonness >= this")
    group.add_argument("--min-link-count", type=at_least("min_link_count", 0), default=1,
                       help="keep a candidate with this many links")
    group.add_argument("--max-mention-length", type=at_least("max_mention_length", 1), default=100,
                       help="longest name, in characters")
    group.add_argument("--case-sensitive", action="store_true", help="names keep their case")
    group.add_argument("--doc-unit", choices=DOC_UNITS, default="paragraph",
                       help="doc_count counts a name once per paragraph or once per page")
    group.add_argument("--include-red-links", action="store_true",
                       help="every link target is an entity, also those with no article in the dump")
    group.add_argument("--language", default=DEFAULT_LANGUAGE, metavar="CODE",
                       help="names are found on the token boundaries of spaCy's blank tokenizer of this language "
                            "(it, de, fr, zh ...; xx: language-neutral rules); recorded in the linker")


def _mentions(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--max-mentions", type=at_least("max_mentions", 1), default=128,
                       help="mentions sampled per entity")
    group.add_argument("--seed", type=int, default=0, help="seed of the sampling hash")


def _embed_entities(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--model", type=name_or_path,
                       help="local directory or hub name of a BERT-family model with [MASK]")
    group.add_argument("--layer", type=int, default=-1, help="hidden layer whose [MASK] output is used")
    group.add_argument("--embedding-dtype", choices=STORED_DTYPES, default="float32",
                       help="value type of the stored vectors")
    group.add_argument("--mask-window", choices=MASK_WINDOWS, default="reference",
                       help="context split around [MASK]: the paper's (larger half before) or centered")
    group.add_argument("--no-mention-vectors", dest="keep_mention_vectors", action="store_false",
                       help="do not keep the mention windows' vectors (mention_vectors/, ~1.5 KB a mention at 768 "
                       "dimensions): a later refresh of this run encodes every mention again")


def _encoder(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--encoder", type=name_or_path, help="local directory or hub name of the passage encoder")
    group.add_argument("--encoder-type", choices=KINDS, default="dpr",
                       help="dpr: [CLS] title [SEP] text [SEP], CLS, dot; bge: CLS, cosine, query instruction; "
                       "mean: mean pooling, cosine; kpr: KPR checkpoint with entity fusion")
    group.add_argument("--query-encoder", type=name_or_path, help="a separate question encoder (default: --encoder)")
    group.add_argument("--similarity", choices=SIMILARITIES,
                       help="override the encoder type's similarity (default: dot for dpr, cosine for bge and mean, "
                       "the checkpoint's for kpr)")
    group.add_argument("--title-mode", choices=TITLE_MODES,
                       help="pair: title and text as a sentence pair; join: 'title text'; none: text only "
                       "(default: pair for dpr and kpr, join for bge and mean)")
    group.add_argument("--query-prefix", help="text put before every query (default: bge's instruction for bge, "
                       "none for the others)")
    group.add_argument("--passage-prefix", default="", help="text put before every passage")
    group.add_argument("--max-length", type=at_least("max_length", MIN_MAX_LENGTH), default=256,
                       help="tokens per passage or query")
    group.add_argument("--max-entities", type=at_least("max_entities", 0), default=128,
                       help="kpr: entity inputs per text")


def _index(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--corpus", type=local_path, action=GivenOnce,
                       help="DPR passage file(s) (psgs_w100.tsv; one path or glob, .gz allowed); "
                       "default: passages cut from OUT/articles")
    group.add_argument("--words-per-passage", type=at_least("words_per_passage", 1), default=100,
                       help="without --corpus: words per passage")
    group.add_argument("--on-duplicate-id", choices=DUPLICATE_KEEPS, default="first",
                       help="of corpus rows sharing an id, keep the first or the last (file and line order); "
                       "the others are dead-lettered")
    group.add_argument("--shards", type=whole_between("shards", 1, MAX_SHARDS, SHARDS_ARE),
                       help="FAISS shards (passages hashed by id); default: the fewest (a power of two) such "
                       "that building one takes at most --shard-memory-gb")
    room = more_than("shard_memory_gb", WORKER_BASE_GB, MAX_SHARD_MEMORY_GB,
                     "a worker's own memory before any vector, in GB")
    group.add_argument("--shard-memory-gb", type=room, default=DEFAULT_SHARD_MEMORY_GB,
                       help=f"memory one worker may take to build a shard: its own {WORKER_BASE_GB:g} GB and its "
                       f"float32 vectors {SHARD_GROWTH} times (default %(default)s; DPR's 21M x 768 -> 16 shards)")
    group.add_argument("--index-factory", help="FAISS factory string (default: chosen by corpus size)")
    group.add_argument("--no-faiss-gpu", action="store_true", help="train and add on the CPU even with a GPU")


def _stage_force(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--force", action="store_true", help="rerun even if the outputs are up to date")


def _all(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--force", nargs="*", action="extend", choices=tuple(layout.STAGE_COMMANDS.values()),
                       metavar="STAGE",
                       help="rerun these stages even if up to date (no name: every stage); stages downstream rerun "
                       "when what they read changed")
    group.add_argument("--no-report", action="store_true", help="skip the HTML report at the end")


def _search(group: argparse._ArgumentGroup) -> None:
    """Options shared by search and evaluate: where the index is and how to run the query encoder."""
    group.add_argument("--output", required=True, type=path_or_url, help="OUT: the directory the index stage wrote")
    group.add_argument("--nprobe", type=at_least("nprobe", 1), help=f"IVF lists visited per query (default "
                       f"{DEFAULT_NPROBE})")
    group.add_argument("--ef-search", type=at_least("ef_search", 1),
                       help=f"HNSW search breadth (default {DEFAULT_EF_SEARCH})")
    group.add_argument("--device", type=DEVICE, help="run the query encoder on cpu, cuda or cuda:N (default: as "
                       "indexed)")
    group.add_argument("--dtype", choices=DTYPES, help="query encoder weights (default: as indexed)")
    group.add_argument("--query-encoder", help="a separate question encoder (default: the index's)")
    group.add_argument("--batch-size", type=at_least("batch_size", 1), default=256, help="queries encoded per call")
    group.add_argument("--verify", action="store_true",
                       help="hash every file of the index and the passages against the manifest before searching "
                       "(without it, a shard that matched once is trusted while its size and modification time are "
                       "unchanged)")


def _query(group: argparse._ArgumentGroup) -> None:
    group.add_argument("-k", type=at_least("k", 1), default=20, help="passages per query")
    group.add_argument("--query", action="append", required=True, help="a query (repeat for several)")
    group.add_argument("--json", action="store_true", help="print JSON lines instead of a table")


def _questions(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--questions", nargs="+", action="extend", required=True, type=path_or_url,
                       help="DPR qas files (question<TAB>['answer', ...]) or EntityQuestions *.json files")
    group.add_argument("-k", dest="ks", type=at_least("k", 1), nargs="+", action="extend",
                       help="accuracy within the first k passages, for each k (default "
                       f"{' '.join(map(str, DEFAULT_KS))})")
    group.add_argument("--report", metavar="FILE", type=path_or_url,
                       help="also write the results as JSON to this file (replaced whole; never a directory)")
    group.add_argument("--match", choices=("string", "regex"), default="string",
                       help="DPR's answer matching: string (the answer's words in a row, uncased: NQ, TriviaQA, "
                       "WebQuestions, EntityQuestions) or regex (each answer a regular expression: CuratedTREC)")


def _validate(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--output", required=True, type=path_or_url, help="OUT: local path or Beam filesystem URL")


def _export(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--output", required=True, type=path_or_url,
                       help="OUT: the run to export (local path or Beam URL)")
    group.add_argument("--to", required=True, metavar="DIR", type=local_path,
                       help="export directory (local path or Beam URL)")


def _publish(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--output", required=True, type=path_or_url,
                       help="OUT: the run to publish (local path or Beam URL)")
    group.add_argument("--to", required=True, metavar="DEST", type=local_path,
                       help="destination (local path or Beam URL)")
    group.add_argument("--latest", action="store_true",
                       help="for DEST = ROOT/NAME: after the manifest, point ROOT/LATEST at NAME (a JSON file with "
                       "the name and the manifest's sha256, replaced atomically)")
    group.add_argument("--with-mention-vectors", action="store_true",
                       help="also copy mention_vectors/ (embed-entities' window vectors, ~1.5 KB a mention at 768 "
                       "dimensions), so that a refresh of the published run reuses them")


def _report(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--output", required=True, type=path_or_url, help="OUT: the directory the stages wrote")
    group.add_argument("--recall-queries", type=at_least("recall_queries", 1), default=QUERIES,
                       help="stored passage vectors used as queries to measure the index's recall")
    group.add_argument("--max-exact", type=at_least("max_exact", 1), default=MAX_EXACT,
                       help="at most this many stored vectors are searched exactly for the recall")
    group.add_argument("--previous", metavar="OLD_OUT", type=path_or_url,
                       help="compare with this earlier run (default: the previous run OUT's manifest records, if it "
                       "was built with --previous)")


def _diff(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--old", required=True, metavar="OLD_OUT", type=path_or_url, help="the earlier run")
    group.add_argument("--new", required=True, metavar="NEW_OUT", type=path_or_url, help="the later run")
    group.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


PARSE = FlagGroup("parse", _parse)
DICTIONARY = FlagGroup("dictionary", _dictionary)
MENTIONS = FlagGroup("mentions", _mentions)
EMBED_ENTITIES = FlagGroup("embed-entities", _embed_entities)
ENCODER = FlagGroup("encoder", _encoder)
INDEX = FlagGroup("index", _index)
SEARCH = FlagGroup("index to search", _search)
STAGE_FORCE = FlagGroup("rerun", _stage_force)

# the flags each stage reads, in pipeline order (`all` takes them all, each group once)
STAGE_GROUPS: dict[str, tuple[FlagGroup, ...]] = {
    "parse": (PARSE,),
    "dictionary": (DICTIONARY,),
    "mentions": (SEQUENCE, MENTIONS),
    "embed-entities": (RUNTIME, SEQUENCE, REFRESH, EMBED_ENTITIES),
    "index": (RUNTIME, REFRESH, ENCODER, INDEX),
}
DUMP = ("dump", "parse needs --dump FILE [FILE ...]")
MODEL = ("model", "embed-entities needs --model NAME_OR_PATH (a BERT-family model with [MASK])")
ENCODER_NEEDED = ("encoder", "index needs --encoder NAME_OR_PATH (a dense retriever or a KPR checkpoint)")


def _stage(name: str, summary: str, example: str, implementation: str,
           required: tuple[tuple[str, str], ...] = ()) -> Command:
    checks = {"parse": (dump_flags,)}
    input_checks = {"parse": DUMP_CHECKS, "index": (existing_input_files, regular_input_files)}
    return Command(name, summary, example, implementation, (OUTPUT, PROGRESS, *STAGE_GROUPS[name], STAGE_FORCE),
                   required, checks.get(name, ()), input_checks.get(name, ()))


COMMANDS: dict[str, Command] = {command.name: command for command in (
    _stage("parse", "Parse Wikipedia dump(s) into articles with resolved links, and redirects.",
           f"run_pipeline.py parse --dump {SAMPLE_DUMP} --output out/s", "pipelines.parse:STAGE", (DUMP,)),
    _stage("dictionary", "Build the anchor dictionary, the entity vocabulary and the entity linker from parsed "
           "articles.", "run_pipeline.py dictionary --output out/s", "pipelines.dictionary:STAGE"),
    _stage("mentions", "Sample up to --max-mentions linked passages per entity, deterministically.",
           "run_pipeline.py mentions --output out/s --max-mentions 32", "pipelines.mentions:STAGE"),
    _stage("embed-entities", "Embed every entity from its sampled mentions with a BERT-family model ([MASK] in "
           "place of the mention).", "run_pipeline.py embed-entities --output out/s --model bert-base-uncased",
           "pipelines.embed_entities:STAGE", (MODEL,)),
    _stage("index", "Encode a passage corpus with a dense retriever and build sharded FAISS indexes.",
           "run_pipeline.py index --output out/s --encoder facebook/dpr-ctx_encoder-single-nq-base",
           "pipelines.index:STAGE", (ENCODER_NEEDED,)),
    Command("search", "the top-k passages of the index under OUT for each --query.",
            "run_pipeline.py search --output out/s --query 'who taught Alexander the Great' -k 5",
            "pipelines.search:COMMAND", (SEARCH, FlagGroup("search", _query))),
    Command("evaluate", "top-k retrieval accuracy (DPR's has-answer rule) for DPR qas and EntityQuestions files.",
            "run_pipeline.py evaluate --output out/s --questions nq-test.qa.csv", "pipelines.evaluate:COMMAND",
            (SEARCH, FlagGroup("evaluate", _questions)),
            input_checks=(each_question_file_once,)),
    Command("all", "Run every stage (parse -> dictionary -> mentions -> embed-entities -> index), then validate "
            "and report.", f"run_pipeline.py all --dump {SAMPLE_DUMP} --output out/s --model bert-base-uncased "
            "--encoder sentence-transformers/all-MiniLM-L6-v2 --encoder-type mean", "pipelines.run_all:COMMAND",
            (OUTPUT, PROGRESS, *(group for groups in STAGE_GROUPS.values() for group in groups),
             FlagGroup("all", _all)),
            (DUMP, ("model", "all needs --model NAME_OR_PATH for embed-entities (a BERT-family model with [MASK])"),
             ENCODER_NEEDED), (dump_flags,), DUMP_CHECKS),
    Command("validate", "check every artifact under OUT against the manifest, its schema and the other artifacts.",
            "run_pipeline.py validate --output out/s", "pipelines.validate:COMMAND",
            (FlagGroup("validate", _validate),)),
    Command("export-kpr", "write entity_vocab.tsv, entity_embeddings.npy, embeddings.pt and entity_linker/ for "
            "KPR into --to DIR.", "run_pipeline.py export-kpr --output out/s --to kpr-resources/",
            "pipelines.export_kpr:COMMAND", (FlagGroup("export", _export),)),
    Command("publish", "copy a validated run (every manifest file and report/) to DEST, manifest.json written "
            "last.", "run_pipeline.py publish --output out/s --to gs://bucket/runs/s --latest",
            "pipelines.publish:COMMAND", (FlagGroup("publish", _publish),)),
    Command("report", "write OUT/report/index.html: per stage wall time, rows read and written, drops and errors, "
            "entity, dictionary and embedding distributions, and the index's recall against exact search.",
            "run_pipeline.py report --output out/s", "pipelines.report:COMMAND", (FlagGroup("report", _report),)),
    Command("diff", "articles, redirects, entities, names and passages added/removed/changed between two runs, "
            "entity vectors and passages reused vs recomputed, and how far the entity vectors moved (cosine "
            "histogram).", "run_pipeline.py diff --old runs/enwiki-20261001 --new runs/enwiki-20261101",
            "pipelines.diff:COMMAND", (FlagGroup("diff", _diff),)),
)}
