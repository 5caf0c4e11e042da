"""Loading BERT-family models and tokenizers from a hub name or a local directory, with clear errors.

A model's own code (the ``auto_map`` of its config.json or tokenizer_config.json, as the published KPR models
have) is never run nor asked about: every load passes ``trust_remote_code=False`` and uses transformers' own
classes for the model type; a model whose type transformers does not know and that names code of its own is a
one-line ``ModelError``.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from artifacts import fs
from artifacts.errors import ModelError, SettingError
from encoders import kpr_config

DTYPES = ("float32", "bfloat16", "float16")
STORED_DTYPES = ("float32", "float16")  # what vectors may be stored as (Parquet has no bfloat16)
CONFIG_FILE = "config.json"
# the files a tokenizer is read from (a fast tokenizer's, a WordPiece, BPE or SentencePiece vocabulary)
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")  # what every model directory has (save_pretrained writes it)
DEVICES = "cpu, cuda or cuda:N"  # what --device accepts (torch has more device types; the models run on these)
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
# Model types of this project's own checkpoints, which transformers does not know, by the type they extend.
EXTENDED_MODEL_TYPES = {kpr_config.MODEL_TYPE: kpr_config.BASE_MODEL_TYPE}


@dataclass(frozen=True)
class ModelSpec:
    """What to load and where to run it; small and picklable, so it travels to Beam workers."""

    name_or_path: str  # a local directory or a hub name such as bert-base-uncased
    device: str = "cpu"
    dtype: str = "float32"

    def torch_dtype(self):  # -> torch.dtype (torch imported lazily: the driver need not load it)
        import torch

        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[self.dtype]


def model_files(models: dict[str, str | None]) -> dict[str, str]:
    """File patterns of the models that are local directories, by role, so that a stage whose model files
    were replaced in place (same path, new weights) reruns; hub names are fingerprinted by name alone."""
    return {role: os.path.join(glob.escape(os.path.expanduser(str(name))), "*") for role, name in models.items()
            if name and os.path.isdir(os.path.expanduser(str(name)))}  # a directory named ``mini[v2]`` as it is


def check_model_spec(spec: ModelSpec, device_here: bool = True) -> None:
    """Fail before any work starts: unknown dtype or device name, missing local directory, CUDA asked for but
    absent (only when ``device_here``: the workers run on this machine; a remote worker checks its own device when
    it loads)."""
    if spec.dtype not in DTYPES:
        raise SettingError("dtype", spec.dtype, f"{{name}} {spec.dtype} is not one of {', '.join(DTYPES)}")
    check_device(spec.device)
    name = str(spec.name_or_path)
    if not check_local_model(name):
        check_hub_reachable(name)
    if device_here and spec.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise SettingError("device", spec.device,
                               f"{{name}} {spec.device} was asked for but no CUDA device is available")


def check_local_model(name: str, config: bool = True) -> bool:
    """A ``ModelError`` for a local path that is not a model's directory (missing: e.g. on workers that do not see
    the launcher's files; a file; see ``check_model_directory``, whose ``config`` it passes); whether ``name`` is a
    local directory (False: a hub name)."""
    # A hub name has at most one "/" ("bert-base-uncased", "org/model"); anything else is a local path.
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1
    if looks_local and not os.path.isdir(os.path.expanduser(name)):
        what = ("is a file: name the model's directory (save_pretrained's)" if os.path.exists(os.path.expanduser(name))
                else "does not exist")
        raise ModelError(name, f"model path {name} {what}")
    if not os.path.isdir(os.path.expanduser(name)):
        return False
    check_model_directory(name, config)
    return True


def check_model_directory(name: str, config: bool = True) -> None:
    """A ``ModelError`` for a local directory that lacks config.json (unless not ``config``: a tokenizer's alone)
    or every tokenizer file (transformers would load a tokenizer of its 5 special tokens from it, and every word
    would be [UNK])."""
    directory = os.path.expanduser(name)
    if config and not os.path.isfile(os.path.join(directory, CONFIG_FILE)):
        raise ModelError(name, f"{os.path.join(name, CONFIG_FILE)} does not exist: {name} is not a model directory "
                               "(save_pretrained writes config.json, the weights and the tokenizer files)")
    if not any(os.path.isfile(os.path.join(directory, file)) for file in TOKENIZER_FILES):
        raise ModelError(name, f"{name} has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...): save the "
                               "model's tokenizer there too (tokenizer.save_pretrained)")


def worker_device(device: str, worker: str | None = None, gpus: int | None = None) -> str:
    """The device of this worker process's model, made the process's current CUDA device. ``cuda`` on a machine
    with several GPUs spreads the worker processes over them: Beam numbers the processes it starts on a machine
    (``WORKER_ID``: worker_0, worker_1, ... over the launcher's life), and worker n takes GPU n mod the number of
    GPUs, so any run of consecutive workers is spread evenly. ``cuda:N``, ``cpu``, one GPU, or a process Beam did
    not number (a run in the launcher's own process): the device as given. ``worker`` and ``gpus`` default to
    this process's ``WORKER_ID`` and torch's count of the GPUs it sees."""
    if device != "cuda":
        return device
    import torch

    gpus = torch.cuda.device_count() if gpus is None else gpus
    number = re.search(r"\d+$", os.environ.get("WORKER_ID", "") if worker is None else worker)
    if gpus <= 1 or number is None:
        return device
    chosen = f"cuda:{int(number.group()) % gpus}"
    if torch.cuda.is_available():
        torch.cuda.set_device(chosen)  # pinned host memory and streams then belong to it, not to GPU 0
    return chosen


def model_processes(device: str) -> int | None:
    """How many processes of a local run should hold the model: one per GPU this machine has for ``cuda``, one
    for ``cuda:N``; None on the CPU (every worker process holds one)."""
    if not device.startswith("cuda"):
        return None
    if device != "cuda":
        return 1
    import torch

    return max(1, torch.cuda.device_count())


def check_device(device: str) -> None:
    """A ``SettingError`` for a device name the models cannot run on (checked wherever the workers run: it is a
    name, not this machine's hardware)."""
    if not _DEVICE.fullmatch(device):
        raise SettingError("device", device, f"{{name}} {device} is not a device: use {DEVICES}")


def check_hub_reachable(name: str, timeout_s: float = 3.0) -> None:
    """A hub model that is not in the local cache needs the hub: one line now instead of a minute of retries."""
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, CONFIG_FILE), str):
        return  # cached: loads offline too
    advice = "download it first or pass a local directory"
    if constants.HF_HUB_OFFLINE:
        raise ModelError(name, f"model {name!r} is not a local path and the hub is offline "
                         f"(HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '1')}): {advice}")
    if any(os.environ.get(variable) for variable in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY")):
        return  # reachable only through the proxy: let the hub client try
    import socket
    from urllib.parse import urlparse

    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout_s).close()
    except OSError as error:
        raise ModelError(name, f"model {name!r} is not a local path and the hub ({host}) is unreachable "
                         f"({_first_line(error)}): {advice}") from error


@dataclass(frozen=True)
class ModelKind:
    """What a model's config.json and tokenizer_config.json say about it, read without running any code."""

    model_type: str  # config.json's model_type ("" without a config.json)
    own_code: bool  # either file names code of the model's own (an ``auto_map``)

    @property
    def base_type(self) -> str:
        """The model type whose transformers classes load the model (a KPR checkpoint's: bert)."""
        return EXTENDED_MODEL_TYPES.get(self.model_type, self.model_type)


def model_kind(name_or_path: str) -> ModelKind:
    """The ``ModelKind`` of a model; a one-line ``ModelError`` when only the model's own code could load it (its
    type is unknown to transformers and to this project, and it names code of its own), code never run here."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    config = _json_file(name_or_path, CONFIG_FILE)
    kind = ModelKind(str(config.get("model_type", "")),
                     "auto_map" in config or "auto_map" in _json_file(name_or_path, "tokenizer_config.json"))
    if kind.own_code and kind.base_type and kind.base_type not in CONFIG_MAPPING_NAMES:
        raise ModelError(name_or_path, f"{name_or_path} (model type {kind.model_type}) needs its own code "
                                       "(auto_map), which this pipeline does not run")
    return kind


def _json_file(name_or_path: str, file_name: str) -> dict:
    """A JSON file of a model directory or of a hub model in the local cache ({} when there is none to read)."""
    path = _model_file(os.path.expanduser(str(name_or_path)), file_name)
    if path is None:
        return {}
    try:
        with open(path) as handle:
            value = json.load(handle)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _model_file(name_or_path: str, file_name: str) -> str | None:
    """The path of a model's file: in its directory, or in the hub cache (never downloaded); None if absent."""
    from huggingface_hub import try_to_load_from_cache

    if os.path.isdir(name_or_path):
        return os.path.join(name_or_path, file_name)
    try:
        cached = try_to_load_from_cache(name_or_path, file_name)
    except ValueError:  # not a hub name either
        return None
    return cached if isinstance(cached, str) else None


def tokenizer_choice(kind: ModelKind) -> dict[str, str]:
    """How ``AutoTokenizer`` picks the tokenizer class: from the files ({}), or, where they name code of the model's
    own or the type is one this project extends, transformers' own class for the (base) model type."""
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    chosen = kind.own_code or kind.base_type != kind.model_type
    return {"tokenizer_type": kind.base_type} if chosen and TOKENIZER_MAPPING_NAMES.get(kind.base_type) else {}


def load_tokenizer(name_or_path: str):
    """The fast tokenizer of a model (``from_pretrained``: a directory or a hub name, offline if configured),
    without the model's own code (``model_kind``)."""
    from transformers import AutoTokenizer

    check_local_model(str(name_or_path), config=False)  # transformers' words for a missing one ask for a repo id
    choice = tokenizer_choice(model_kind(name_or_path))
    try:
        tokenizer = AutoTokenizer.from_pretrained(os.path.expanduser(str(name_or_path)), trust_remote_code=False,
                                                  **choice)
    except (OSError, ValueError) as error:
        raise ModelError(name_or_path, f"cannot load a tokenizer from {name_or_path}: {_first_line(error)}") from error
    # Our callers tokenize whole windows and cut them to length themselves: transformers' "Token indices sequence
    # length is longer than the specified maximum" warning is expected here, so it is marked as already shown
    # (model_max_length, which truncation reads, stays as it is).
    tokenizer.deprecation_warnings["sequence-length-is-longer-than-the-specified-maximum"] = True
    return tokenizer


PLAIN_TEXT = "Aaron is a prophet, high priest, and the elder brother of Moses."


def check_reads_plain_text(tokenizer, name_or_path: str, use: str) -> None:
    """Fail before any work starts when the tokenizer yields no token for plain English text, or only its unknown
    token (a vocabulary of special tokens alone: transformers 5 saves one for ``BertTokenizerFast(vocab_file=...)``):
    every input would be empty, or [UNK] throughout. ``use`` says what it could not do, for the message."""
    ids = tokenizer(PLAIN_TEXT, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ModelError(name_or_path, f"the tokenizer of {name_or_path} yields no tokens for plain text "
                                       f"({PLAIN_TEXT!r}): it cannot {use}")
    if tokenizer.unk_token_id is not None and set(ids) == {tokenizer.unk_token_id}:
        raise ModelError(name_or_path, f"the tokenizer of {name_or_path} reads plain text ({PLAIN_TEXT!r}) as "
                                       f"{tokenizer.unk_token} alone (its vocabulary holds none of the words: were its "
                                       f"vocabulary files left out?): it cannot {use}")


TOKENIZER_FILE = "tokenizer.json"  # the stages' saved tokenizer, in their staging directory (``save_tokenizer``)
# What the input builders read of a tokenizer besides its backend (transformers' attribute names).
SPECIAL_IDS = ("cls_token_id", "sep_token_id", "mask_token_id", "pad_token_id", "bos_token_id", "eos_token_id")


@dataclass(frozen=True)
class SavedTokenizer:
    """A fast tokenizer as the input builders use it, read back from ``save_tokenizer``'s file with the ``tokenizers``
    library alone: its backend (the one transformers made, so the same ids) and the attributes they read. A worker
    that only builds model inputs then imports neither transformers nor the torch it brings with any tokenizer
    (~1.8 CPU s and ~210 MB of each worker process on this machine)."""

    backend_tokenizer: Any  # tokenizers.Tokenizer
    name_or_path: str
    model_input_names: tuple[str, ...]
    truncation_side: str
    cls_token_id: int | None
    sep_token_id: int | None
    mask_token_id: int | None
    pad_token_id: int | None
    bos_token_id: int | None
    eos_token_id: int | None
    is_fast: bool = True


def save_tokenizer(name_or_path: str, path: str) -> None:
    """Write the tokenizer of a model to ``path`` for ``read_tokenizer``: a fast one whole, a slow one (no backend
    to save) by name."""
    tokenizer = load_tokenizer(name_or_path)
    fields: dict[str, Any] = {"name_or_path": str(name_or_path)}
    if tokenizer.is_fast:
        fields |= {"backend": tokenizer.backend_tokenizer.to_str(), "truncation_side": tokenizer.truncation_side,
                   "model_input_names": list(tokenizer.model_input_names),
                   **{name: getattr(tokenizer, name) for name in SPECIAL_IDS}}
    fs.write_json_atomic(path, fields)


def read_tokenizer(path: str):
    """The tokenizer ``save_tokenizer`` wrote: a ``SavedTokenizer``, or a slow tokenizer loaded by transformers."""
    fields = fs.read_json(path)
    backend = fields.pop("backend", None)
    if backend is None:
        return load_tokenizer(fields["name_or_path"])
    from tokenizers import Tokenizer

    return SavedTokenizer(Tokenizer.from_str(backend), model_input_names=tuple(fields.pop("model_input_names")),
                          **fields)


def fast_backend(tokenizer, max_length: int | None = None):
    """A fast tokenizer's own backend, set to truncate at ``max_length`` (longest first, transformers'
    ``truncation=True``; None: not at all) and not to pad: transformers leaves its last call's settings there.
    Calling it directly skips transformers' conversion of every text's encoding to Python lists (a fifth to a
    third of the tokenizing time, held under the GIL); its ``encode_batch_fast`` also skips the character offsets
    (a sixth of the rest), which no caller here reads."""
    backend = tokenizer.backend_tokenizer
    if max_length is None:
        backend.no_truncation()
    else:
        backend.enable_truncation(max_length, strategy="longest_first", direction=tokenizer.truncation_side)
    backend.no_padding()
    return backend


def plain_token_ids(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """The token ids of each text, no special tokens."""
    if not tokenizer.is_fast:
        return tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    return [encoding.ids for encoding in fast_backend(tokenizer).encode_batch_fast(list(texts),
                                                                                   add_special_tokens=False)]


def model_token_ids(tokenizer, firsts: Sequence[str], seconds: Sequence[str] | None,
                    max_length: int) -> tuple[list[list[int]], list[list[int]] | None, list[bool]]:
    """(input ids, token type ids, whether it was cut) of each text, or of each pair (``seconds``), special tokens
    added and truncated to ``max_length`` as transformers' ``truncation=True`` does (types: None where a slow
    tokenizer makes none)."""
    pairs = None if seconds is None else list(seconds)
    if not tokenizer.is_fast:
        encoded = tokenizer(list(firsts), pairs, truncation=True, max_length=max_length)
        whole = tokenizer(list(firsts), pairs, verbose=False)["input_ids"]
        return encoded["input_ids"], encoded.get("token_type_ids"), [len(ids) > max_length for ids in whole]
    texts = list(firsts) if pairs is None else list(zip(firsts, pairs, strict=True))
    encoded = fast_backend(tokenizer, max_length).encode_batch_fast(texts, add_special_tokens=True)
    return ([encoding.ids for encoding in encoded], [encoding.type_ids for encoding in encoded],
            [bool(encoding.overflowing) for encoding in encoded])


def load_encoder(spec: ModelSpec):
    """The bare transformer (``AutoModel``) in eval mode on ``spec.device`` with ``spec.dtype`` weights."""
    from safetensors import SafetensorError
    from transformers import AutoModel

    model_kind(spec.name_or_path)
    try:
        model = AutoModel.from_pretrained(os.path.expanduser(str(spec.name_or_path)), dtype=spec.torch_dtype(),
                                          trust_remote_code=False)
    except (OSError, ValueError, SafetensorError) as error:  # SafetensorError: a weights file cut short or damaged
        raise weights_error(spec.name_or_path, error) from error
    except RuntimeError as error:  # transformers 5: weights whose shapes differ from the config's
        if "ignore_mismatched_sizes" not in str(error):
            raise
        raise ModelError(spec.name_or_path, f"cannot load a model from {spec.name_or_path}: the shapes of its weights "
                                            "differ from its config.json's (weights of another model, or an edited "
                                            "config)") from error
    return model.to(spec.device).eval()


def weights_error(name_or_path: str, error: BaseException) -> ModelError:
    return ModelError(name_or_path, f"cannot load a model from {name_or_path}: {_first_line(error)}")


def mean_input_embedding_norm(model) -> float:
    """Mean L2 norm of the rows of the model's input word-embedding matrix (computed in float32)."""
    weights = model.get_input_embeddings().weight.detach().float()
    return float(weights.norm(dim=1).mean())


def _first_line(error: BaseException) -> str:
    """The error's message as one line (transformers words some over several: the first alone stops mid-sentence)."""
    return " ".join(str(error).split()) or type(error).__name__


def input_embedding_norm(spec: ModelSpec) -> float:
    """The mean input word-embedding row norm, reading only that matrix where the weights allow it."""
    import glob

    directory = os.path.expanduser(str(spec.name_or_path))
    for path in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(path, framework="pt") as weights:
                names = [name for name in weights.keys() if name.endswith("word_embeddings.weight")]  # noqa: SIM118
                if names:
                    return float(weights.get_tensor(names[0]).float().norm(dim=1).mean())
        except (OSError, SafetensorError) as error:  # a weights file cut short or damaged
            raise weights_error(spec.name_or_path, error) from error
    return mean_input_embedding_norm(load_encoder(ModelSpec(spec.name_or_path)))


def model_config(spec: ModelSpec):
    """The model's transformers config (config.json only, no weights); a one-line error if it cannot be read."""
    from transformers import AutoConfig

    kind = model_kind(spec.name_or_path)
    try:
        return AutoConfig.from_pretrained(os.path.expanduser(str(spec.name_or_path)), trust_remote_code=False)
    except (OSError, ValueError) as error:
        if kind.model_type == kpr_config.MODEL_TYPE:  # transformers knows it not: "update Transformers"
            raise ModelError(spec.name_or_path, f"{spec.name_or_path} is a KPR checkpoint (model_type "
                             f"{kpr_config.MODEL_TYPE}): only `index --encoder-type kpr` encodes with one (and the "
                             "queries of an index built so)") from error
        raise config_error(spec, error) from error


def config_error(spec: ModelSpec, error: BaseException) -> ModelError:
    return ModelError(spec.name_or_path, f"cannot read the model config of {spec.name_or_path}: {_first_line(error)}")


# Text encoders whose positions start after the padding index, as RoBERTa's do (transformers'
# create_position_ids_from_input_ids): the first pad_token_id + 1 position embeddings are never an input's.
_POSITIONS_AFTER_PADDING = frozenset({"camembert", "data2vec-text", "ibert", "longformer", "luke", "mpnet", "xmod"})


def usable_positions(spec: ModelSpec) -> int:
    """Tokens one input may have: the position embeddings (``n_positions`` of GPT-style configs), less those that
    RoBERTa-style models skip. Read from config.json alone, so custom model types (KPR) work."""
    from transformers import PretrainedConfig

    try:
        config, _ = PretrainedConfig.get_config_dict(os.path.expanduser(str(spec.name_or_path)))
    except (OSError, ValueError) as error:
        raise config_error(spec, error) from error
    model_type = str(config.get("model_type", ""))
    after_padding = "roberta" in model_type or model_type in _POSITIONS_AFTER_PADDING
    pad = config.get("pad_token_id")
    skipped = (1 if pad is None else int(pad)) + 1 if after_padding else 0
    return int(config.get("max_position_embeddings") or config.get("n_positions") or 512) - skipped


def check_vocabulary(tokenizer: Any, spec: ModelSpec) -> None:
    """A ModelError unless the model of ``spec`` has a word embedding for every token of ``tokenizer`` (a
    directory put together from two models' files fails only inside the forward, after the inputs are built)."""
    vocab_size = getattr(model_config(spec), "vocab_size", None)
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise ModelError(spec.name_or_path, f"the tokenizer of {spec.name_or_path} has {len(tokenizer):,} tokens and "
                         f"its model {vocab_size:,} word embeddings: they are not one model's")


def hidden_size(spec: ModelSpec) -> int:
    return int(model_config(spec).hidden_size)


def save_random_bert(directory: str, vocabulary_of: str, seed: int = 0, extra_words: tuple[str, ...] = (),
                     **config: int) -> str:
    """A BERT with random weights and the WordPiece tokenizer of ``vocabulary_of`` (plus ``extra_words``) saved
    to ``directory``: the compute of a real model of that size (``config``: BertConfig sizes; none given means
    BERT-base) without downloading one, for benchmarks and tests."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    tokenizer = BertTokenizerFast.from_pretrained(vocabulary_of)
    if extra_words:
        tokenizer.add_tokens(list(extra_words))
    torch.manual_seed(seed)
    model = BertModel(BertConfig(vocab_size=len(tokenizer), **config)).eval()
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
