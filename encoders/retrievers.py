"""Dense retriever encoders for queries and passages (loaded by kind, and run by Beam, in ``encoders/loading.py``).

The kind of encoder is an explicit option, never guessed from the model name:

- ``dpr``: ``[CLS] title [SEP] text [SEP]`` with every token type 0, the [CLS] vector (a Hugging Face DPR
  checkpoint's pooler output), dot product; queries as they are.
- ``bge``: "title text", the [CLS] vector L2-normalized (cosine); queries get an instruction prefix.
- ``mean``: "title text", the mean of the last layer over the real tokens (sentence-transformers' mean
  pooling), L2-normalized (cosine) unless ``--similarity dot``.
- ``kpr``: the entity-aware KPR encoder (``encoders/kpr.py``): [CLS] plus a context-entity fusion layer;
  ``[CLS] title [SEP] text [SEP]`` built as the reference builds it, every token type 0.

Token types follow each family's own code (``token_types``, recorded in index.json): ``zeros`` (no
``token_type_ids`` fed, so the model's default, all 0) for DPR, whose tensorizer feeds zero segment ids
(facebookresearch/DPR ``generate_dense_embeddings.py``, ``dpr/models/biencoder.py``), and for KPR, whose reference
code never makes token type ids (kembed ``data.py``); ``tokenizer`` (the tokenizer's own: 1 for a pair's second
segment) for bge and mean, as sentence-transformers passes them; a single sequence is all 0 either way.

Inputs are tokenized without padding and grouped by token budget (similar lengths together), so a batch pays
for its own longest item, not the corpus's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from artifacts import fs
from artifacts.errors import InputError, SettingError
from artifacts.passages import Passage
from encoders import batching
from encoders.kpr_config import read_kpr_settings
from encoders.models import (
    ModelSpec,
    check_reads_plain_text,
    check_vocabulary,
    load_encoder,
    load_tokenizer,
    model_config,
    model_token_ids,
    read_tokenizer,
)

if TYPE_CHECKING:  # the command line imports the options: no Arrow before it needs it
    import pyarrow as pa

KINDS = ("dpr", "bge", "mean", "kpr")
MIN_MAX_LENGTH = 8  # the fewest tokens --max-length may give a passage's or a query's input
SIMILARITIES = ("dot", "cosine")
TITLE_MODES = ("pair", "join", "none")
TOKEN_TYPES = ("zeros", "tokenizer")  # every token type 0 (none fed), or the tokenizer's own
# What index.json files and manifests from before ``token_types`` was recorded were built with.
LEGACY_TOKEN_TYPES = "tokenizer"
_CLS_KINDS = ("dpr", "bge")  # the passage vector is the [CLS] output
BGE_QUERY_PREFIX = "Represent this sentence for searching relevant passages: "


class KindDefaults(NamedTuple):
    similarity: str  # "": from the checkpoint's config (kpr)
    title: str
    query_prefix: str
    token_types: str  # the family's own convention


_DEFAULTS = {
    "dpr": KindDefaults("dot", "pair", "", "zeros"),
    "bge": KindDefaults("cosine", "join", BGE_QUERY_PREFIX, "tokenizer"),
    "mean": KindDefaults("cosine", "join", "", "tokenizer"),
    "kpr": KindDefaults("", "pair", "", "zeros"),
}


def recorded_encoder(value: dict[str, Any]) -> dict[str, Any]:
    """Recorded encoder options (index.json's ``encoder``, a manifest's) as this version reads them: a record
    without ``token_types`` was built with the tokenizer's own token types."""
    return {"token_types": LEGACY_TOKEN_TYPES, **value}


@dataclass(frozen=True)
class EncoderOptions:
    """Everything that decides the vectors (stored in index.json, so search encodes queries the same way).

    Empty strings / None mean "the kind's default"; ``resolved()`` fills them in.
    """

    kind: str
    model: str
    query_model: str | None = None  # a separate question encoder (DPR has two); default: ``model``
    similarity: str = ""
    title: str = ""
    query_prefix: str | None = None
    passage_prefix: str = ""
    max_length: int = 256
    device: str = "cpu"
    dtype: str = "float32"
    batch_tokens: int = 16384
    linker: str = ""  # kpr: dictionary/linker, relative to OUT (``located`` gives its path)
    entity_embeddings: str = ""  # kpr: entity_embeddings, relative to OUT
    max_entities: int = 128  # kpr: entity inputs per text (all candidates of every mention, in text order)
    token_types: str = ""  # "": the kind's own convention, set on construction (so every record names it)

    def __post_init__(self) -> None:
        if not self.token_types and self.kind in _DEFAULTS:
            object.__setattr__(self, "token_types", _DEFAULTS[self.kind].token_types)

    def resolved(self) -> EncoderOptions:
        defaults = _DEFAULTS[self.kind]
        similarity = defaults.similarity
        if self.kind == "kpr" and not self.similarity:
            similarity = read_kpr_settings(self.model).similarity_function
        return replace(self, similarity=self.similarity or similarity, title=self.title or defaults.title,
                       query_prefix=defaults.query_prefix if self.query_prefix is None else self.query_prefix)

    @property
    def feeds_token_types(self) -> bool:
        """Whether the model gets the tokenizer's token type ids (else none: every token type is 0)."""
        return self.token_types == "tokenizer"

    def spec(self, role: str) -> ModelSpec:
        path = self.query_model if role == "query" and self.query_model else self.model
        return ModelSpec(str(path), self.device, self.dtype)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> EncoderOptions:
        known = set(cls.__dataclass_fields__)
        return cls(**{key: item for key, item in recorded_encoder(value).items() if key in known})

    def located(self, output: str) -> EncoderOptions:
        """The run's artifacts the encoder reads (linker, entity embeddings), named relative to OUT, as paths
        under ``output``; absolute paths (older index.json files) stay as they are."""
        return replace(self, linker=fs.located(output, self.linker),
                       entity_embeddings=fs.located(output, self.entity_embeddings))

    def with_runtime(self, device: str | None = None, dtype: str | None = None,
                     query_model: str | None = None) -> EncoderOptions:
        """The same encoder on another device / dtype, or with another question encoder."""
        return replace(self, device=device or self.device, dtype=dtype or self.dtype,
                       query_model=query_model or self.query_model)


def check_tokenizer(spec: ModelSpec, kind: str) -> None:
    """Fail before any work starts: a tokenizer that reads plain English text as nothing or as [UNK] alone
    (``check_reads_plain_text``) or has tokens its model has no embedding of, or, for kinds whose vector is the
    [CLS] output, one without [CLS] and [SEP] (a GPT-style model)."""
    name_or_path = spec.name_or_path
    tokenizer = load_tokenizer(name_or_path)
    check_reads_plain_text(tokenizer, name_or_path, "encode passages")
    check_vocabulary(tokenizer, spec)
    missing = [name for name, token in (("[CLS]", tokenizer.cls_token_id), ("[SEP]", tokenizer.sep_token_id))
               if token is None]
    if kind in _CLS_KINDS and missing:
        raise SettingError("kind", kind, f"{{name}} {kind} needs a BERT-style model ([CLS] title [SEP] text [SEP], "
                                         f"the [CLS] vector): the tokenizer of {name_or_path} "
                                         f"({_model_type(name_or_path)}) has no {' or '.join(missing)}; "
                                         "try {name} mean")


def _model_type(name_or_path: str) -> str:
    """The model_type of config.json, for messages (``unknown`` when it cannot be read)."""
    from transformers import PretrainedConfig

    try:
        config, _ = PretrainedConfig.get_config_dict(os.path.expanduser(str(name_or_path)))
    except (OSError, ValueError):
        return "model type unknown"
    return f"model type {config.get('model_type', 'unknown')}"


def passage_segments(passages: Sequence[Passage], title_mode: str,
                     prefix: str = "") -> tuple[list[str], list[str] | None]:
    """Tokenizer inputs for passages: (first segments, second segments or None).

    ``pair``: title and text as a sentence pair (``[CLS] title [SEP] text [SEP]``, DPR, KPR); ``join``: "title text"
    as one sequence (BEIR's convention for single-sequence encoders); ``none``: the text alone.
    """
    if title_mode == "pair":
        return [prefix + passage.title for passage in passages], [passage.text for passage in passages]
    if title_mode == "join":
        return [prefix + " ".join(part for part in (passage.title, passage.text) if part) for passage in passages], None
    return [prefix + passage.text for passage in passages], None


def dense_dim(options: EncoderOptions) -> int:
    """The vector size of an encoder, from its config (no weights loaded)."""
    if options.kind == "kpr":
        path = os.path.expanduser(str(options.model))
        try:
            with open(os.path.join(path, "config.json")) as handle:
                return int(json.load(handle)["hidden_size"])
        except (OSError, ValueError, KeyError) as error:
            raise InputError(f"cannot read the model config of {options.model}: {error}") from error
    return vector_size(model_config(ModelSpec(str(options.model))), options.kind)


def vector_size(config: Any, kind: str) -> int:
    """The vector size of a dense model of ``config`` encoding as ``kind``: a Hugging Face DPR checkpoint's [CLS]
    (its pooler output) has its projection_dim where it has one; a mean over its hidden states, their size."""
    projection = 0 if kind == "mean" else getattr(config, "projection_dim", 0) or 0
    return int(projection or config.hidden_size)


def pool(hidden, attention_mask, pooling: str):
    """[CLS] vector or the mean over real tokens (in float32; for [CLS] only its row converted, not every token's)."""
    if pooling == "cls":
        return hidden[:, 0].float()
    hidden = hidden.float()
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


def load_dense_model(spec: ModelSpec):
    """The bare transformer, or a Hugging Face DPR encoder whose pooler output is the vector.

    ``AutoModel`` maps every DPR checkpoint to the question encoder class, which would silently drop a
    context encoder's weights; the class named in the checkpoint's config is used instead.
    """
    config = model_config(spec)
    if getattr(config, "model_type", "") != "dpr":
        return load_encoder(spec)
    import transformers

    architecture = (config.architectures or ["DPRQuestionEncoder"])[0]
    if architecture not in ("DPRContextEncoder", "DPRQuestionEncoder"):
        raise InputError(f"{spec.name_or_path}: a DPR checkpoint of class {architecture} is not an encoder")
    model = getattr(transformers, architecture).from_pretrained(os.path.expanduser(spec.name_or_path),
                                                               dtype=spec.torch_dtype())
    return model.to(spec.device).eval()


# count(name, value): how the inputs of a batch are counted (e.g. KPR's entity inputs) by the pipeline.
CountFn = Callable[[str, int], None]
CUT_COUNTER = "passages_cut"  # the texts whose tokens ran past --max-length (``TextInputs.count``)


class TextInputs:
    """What an encoder's model reads, built from texts on the CPU (token ids; KPR adds entity inputs). It loads
    no model (``DenseEncoder`` holds one beside its model)."""

    def __init__(self, options: EncoderOptions, role: str = "passage", tokenizer: str = "") -> None:
        """``tokenizer``: the role's tokenizer saved by ``models.save_tokenizer`` (else loaded by transformers)."""
        self.options = options.resolved()
        self.role = role
        name = self.options.spec(role).name_or_path
        self.tokenizer = read_tokenizer(tokenizer) if tokenizer else load_tokenizer(name)

    def passages(self, passages: Sequence[Passage]) -> list[dict[str, Any]]:
        """The model inputs of each passage (title and text as ``options.title`` says)."""
        return self.features(*passage_segments(passages, self.options.title, self.options.passage_prefix))

    def queries(self, queries: Sequence[str]) -> list[dict[str, Any]]:
        return self.features([self.options.query_prefix + query for query in queries], None)

    def features(self, firsts: list[str], seconds: list[str] | None) -> list[dict[str, Any]]:
        """One dict of model inputs per text: ``input_ids``, and ``token_type_ids`` where the encoder feeds the
        tokenizer's (``options.token_types``) and the tokenizer makes them."""
        ids, types, cut = model_token_ids(self.tokenizer, firsts, seconds, self.options.max_length)
        if self.options.feeds_token_types and "token_type_ids" in self.tokenizer.model_input_names and types:
            return [{"input_ids": item, "token_type_ids": kinds, "cut": was_cut}
                    for item, kinds, was_cut in zip(ids, types, cut, strict=True)]
        return [{"input_ids": item, "cut": was_cut} for item, was_cut in zip(ids, cut, strict=True)]

    def count(self, features: Sequence[dict[str, Any]], count: CountFn) -> None:
        """Count what ``features`` hold for the pipeline's counters: the texts cut at ``max_length`` (``cut``)."""
        cut = sum(item["cut"] for item in features)
        if cut:
            count(CUT_COUNTER, cut)

    def token_count(self, passages: Sequence[Passage]) -> int:
        """Tokens the model reads for these passages (after truncation), for throughput figures."""
        firsts, seconds = passage_segments(passages, self.options.title, self.options.passage_prefix)
        return sum(len(ids) for ids in model_token_ids(self.tokenizer, firsts, seconds, self.options.max_length)[0])


@dataclass(frozen=True)
class ReadyInputs:
    """The model inputs of many texts, packed (``batching.PackedLists``: padded with numpy, never turned into
    Python lists when read from a table): the token id sequences, and a KPR encoder's entities and their token
    positions. ``token_type_ids`` is None where the encoder does not feed them, the entities where it links none."""

    input_ids: batching.PackedLists
    token_type_ids: batching.PackedLists | None
    entity_ids: batching.PackedLists | None = None
    entity_positions: batching.PackedListsOfLists | None = None

    @classmethod
    def of_features(cls, features: Sequence[dict[str, Any]]) -> ReadyInputs:
        """From ``TextInputs.passages``' (or ``queries``') dicts."""
        def column(name: str) -> list | None:
            return [item[name] for item in features] if features and name in features[0] else None

        types, entity_ids, positions = column("token_type_ids"), column("entity_ids"), column("entity_positions")
        return cls(batching.PackedLists.of(column("input_ids") or []),
                   batching.PackedLists.of(types, np.int8) if types is not None else None,
                   batching.PackedLists.of(entity_ids, np.int64) if entity_ids is not None else None,
                   batching.PackedListsOfLists.of(positions) if positions is not None else None)

    @classmethod
    def of_table(cls, table: pa.Table) -> ReadyInputs:
        """From a table of their columns (``schemas.PASSAGE_INPUTS``: what the inputs' pipeline writes; a column
        that is all null is one the encoder does not make)."""
        def present(name: str) -> pa.ChunkedArray | None:
            column = table.column(name)
            return column if column.null_count < table.num_rows else None

        types, entity_ids, positions = present("token_type_ids"), present("entity_ids"), present("entity_positions")
        return cls(batching.PackedLists.of_column(table.column("input_ids")),
                   batching.PackedLists.of_column(types) if types is not None else None,
                   batching.PackedLists.of_column(entity_ids) if entity_ids is not None else None,
                   batching.PackedListsOfLists.of_column(positions) if positions is not None else None)

    def __len__(self) -> int:
        return len(self.input_ids.offsets) - 1


class DenseEncoder:
    """A loaded retriever (one model: the passage or the question side; ``loading.load_retriever``).
    ``encode_passages`` / ``encode_queries`` give float32 rows in input order."""

    def __init__(self, options: EncoderOptions, role: str = "passage") -> None:
        import torch

        self.options = options.resolved()
        self.role = role
        self.inputs = self._load_inputs()
        self.tokenizer = self.inputs.tokenizer
        self.model = self._load_model(self.options.spec(role))
        self.dim = self._dim()
        self._torch = torch

    def _load_inputs(self) -> TextInputs:
        return TextInputs(self.options, self.role)

    def _load_model(self, spec: ModelSpec):
        return load_dense_model(spec)

    def _dim(self) -> int:
        return vector_size(self.model.config, self.options.kind)

    def encode_passages(self, passages: Sequence[Passage], count: CountFn | None = None) -> np.ndarray:
        """float32 rows of ``passages``, in order; what their inputs hold (KPR's entity inputs) goes to ``count``
        in the caller's thread, where Beam's counters count."""
        return self._encode(passages, self.inputs.passages, count)

    def encode_queries(self, queries: Sequence[str], count: CountFn | None = None) -> np.ndarray:
        return self._encode(queries, self.inputs.queries, count)

    def encode_ready(self, ready: ReadyInputs, rows: Sequence[int] | np.ndarray | None = None,
                     out: np.ndarray | None = None) -> np.ndarray:
        """float32 rows of ready model inputs (built by another process; ``rows``: those of them to encode, all
        when None), in order (into ``out`` when given)."""
        return self.queue_ready(ready, rows).collect(out)

    def queue_ready(self, ready: ReadyInputs, rows: Sequence[int] | np.ndarray | None = None,
                    on_batch: Callable[[list[int]], None] | None = None) -> batching.QueuedForwards:
        """The forward passes of ready model inputs (``rows`` of them, all when None), queued (their vectors
        collected later, in order): batched by token budget over all of them at once (their lengths are known: no
        chunks to tokenize, so the fullest batches and the least padding), padded from the packed sequences and run
        here; ``on_batch`` gets each batch (positions in ``rows``) as it is run."""
        rows = np.arange(len(ready)) if rows is None else np.asarray(rows, dtype=np.int64)
        batches = batching.token_budget_batches(ready.input_ids.lengths[rows].tolist(), self.options.batch_tokens)
        prepared = ((batch, self._host_inputs(ready, rows[batch])) for batch in batches)
        return batching.queue_forwards(len(rows), self.dim, prepared,
                                       lambda host: self._forward_inputs(self._device_inputs(host)), on_batch)

    def token_count(self, passages: Sequence[Passage]) -> int:
        return self.inputs.token_count(passages)

    def _encode(self, items: Sequence[Any], build: Callable[[Sequence[Any]], list[dict[str, Any]]],
                count: CountFn | None) -> np.ndarray:
        """float32 rows of ``items``, in order: their model inputs built (``build``: tokenizing, and KPR's linking),
        what they hold counted (``count``, unless None) in this thread, where counters count, then encoded as the
        model's process encodes ready inputs (``encode_ready``: one batching rule, so the same vectors)."""
        features = build(items)
        if count is not None:
            self.inputs.count(features, count)
        return self.encode_ready(ReadyInputs.of_features(features))

    def _host_inputs(self, ready: ReadyInputs, rows: np.ndarray) -> Any:
        """Padded CPU tensors of the inputs ``rows`` (one batch), built with numpy (pinned when bound for CUDA), in
        the prefetch thread."""
        ids, attention = ready.input_ids.padded(rows, self.tokenizer.pad_token_id or 0)
        arrays = {"input_ids": ids, "attention_mask": attention}
        if ready.token_type_ids is not None:
            arrays["token_type_ids"] = ready.token_type_ids.padded(rows, 0)[0]
        return {name: batching.host_tensor(array, self.options.device) for name, array in arrays.items()}

    def _device_inputs(self, host: Any) -> dict[str, Any]:
        """The inputs of one batch on the device (in the caller's thread, as the batch's forward pass starts)."""
        return {name: batching.to_device(tensor, self.options.device) for name, tensor in host.items()}

    def _forward_inputs(self, inputs: dict[str, Any]):
        """The vectors of one batch of device inputs, left on the device (float32 after pooling)."""
        torch = self._torch
        pooling = "mean" if self.options.kind == "mean" else "cls"
        # a Hugging Face DPR encoder's [CLS] is its pooler output (projected where it has a projection_dim); its
        # mean pools the last hidden states of its BERT (ctx_encoder.bert_model, question_encoder.bert_model)
        dpr = getattr(self.model.config, "model_type", "") == "dpr"
        with torch.inference_mode():
            if dpr and pooling == "cls":
                vectors = self.model(**inputs).pooler_output.float()
            else:
                model = getattr(self.model, self.model.base_model_prefix).bert_model if dpr else self.model
                vectors = pool(model(**inputs).last_hidden_state, inputs["attention_mask"], pooling)
            if self.options.similarity == "cosine":
                vectors = torch.nn.functional.normalize(vectors, p=2, dim=-1)
        return vectors
