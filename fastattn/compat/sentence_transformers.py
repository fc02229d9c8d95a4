"""sentence-transformers' ``SentenceTransformer`` over :class:`fastattn.SentenceEncoder`.

    from fastattn.compat.sentence_transformers import SentenceTransformer   # the only change
    model = SentenceTransformer("path/to/all-MiniLM-L6-v2", device="cpu")
    emb = model.encode(sentences, batch_size=32, normalize_embeddings=True)
    scores = model.similarity(emb, emb)

Semantics are sentence-transformers 6's ``SentenceTransformer.encode`` (its options, their
order and defaults, its return types); the vectors are :meth:`fastattn.SentenceEncoder.encode`'s
(:meth:`fastattn.EncoderModel.embed`: the folder's pooling, Dense and Normalize modules, then
truncate_dim, then ``normalize_embeddings``), equal to sentence-transformers' within float32
rounding. Also honoured: the folder's and the constructor's ``prompts`` /
``default_prompt_name`` and ``prompt_name`` / ``prompt`` per call, ``encode_query`` /
``encode_document``, ``precision`` (``quantize_embeddings``' int8 / uint8 ranges from the
call's own embeddings, binary / ubinary bit packing), ``output_value="token_embeddings"`` and
``None``, ``truncate_dim`` (constructor, attribute, call, ``truncate_embeddings()``),
``max_seq_length`` (read and set), ``similarity`` / ``similarity_pairwise`` with
``similarity_fn_name`` cosine, dot, euclidean, manhattan. A hub name loads the snapshot already
in the Hugging Face cache; nothing is ever downloaded.

torch is not needed. Where sentence-transformers returns torch tensors without being asked
(``convert_to_numpy=False``, token embeddings, ``output_value=None``, ``similarity``,
``tokenize``, ``device``), the result is a torch tensor when torch is importable, as there, and
the same values as NumPy arrays when it is not; ``convert_to_tensor=True`` asks for a tensor
and is a ValueError without torch.

Refused, each by a ValueError / TypeError naming it: devices other than the CPU, multi-process
encoding (``pool``, a list of devices, ``start_multi_process_pool``), ``modules=``,
``trust_remote_code=True`` on a folder with remote code, ``backend`` other than "torch",
``use_kernels`` / ``kernel_config``, non-empty ``model_kwargs`` / ``processor_kwargs`` /
``config_kwargs`` / ``processing_kwargs``, sentence pairs and non-text inputs, ``precision``
with ``output_value=None``; a method this class lacks (training, saving, the hub) is an
AttributeError that says so.
"""
import contextlib
import logging
import os
import sys

import numpy as np

from ..io.huggingface import read_json
from ..models.encoder import check_truncate_dim
from ..text import SentenceEncoder
from ..text.batching import pad_batch

__all__ = ["SentenceTransformer", "quantize_embeddings", "SIMILARITY_FN_NAMES"]

logger = logging.getLogger(__name__)

SIMILARITY_FN_NAMES = ("cosine", "dot", "euclidean", "manhattan")
PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
_DEFAULT_ORG = "sentence-transformers"       # the hub organisation of a bare model name
# the arguments of sentence-transformers' constructor that load the model in ways fastattn does
# not: non-empty is refused
_LOADING_KWARGS = ("model_kwargs", "processor_kwargs", "tokenizer_kwargs", "config_kwargs")


def _torch():
    """torch, or None where it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def _need_torch(option):
    torch = _torch()
    if torch is None:
        raise ValueError(f"{option} returns a torch tensor, and torch is not installed: use "
                         "convert_to_numpy=True (the default) or pip install torch")
    return torch


def _tensor(array):
    """A torch tensor of `array` (sharing its memory) where torch is importable, else it."""
    torch = _torch()
    return array if torch is None else torch.from_numpy(array)


def _check_device(device, name="device"):
    """None or the CPU (a str or a torch.device); anything else names `name`."""
    if device is None:
        return
    text = str(device)
    if isinstance(device, list):
        raise ValueError(f"{name}={device!r}: a list of devices is sentence-transformers' "
                         "multi-process encoding; fastattn encodes in one process with OpenMP "
                         "threads (n_threads=)")
    if text not in ("cpu", "cpu:0"):
        raise ValueError(f"{name}={text!r} is not supported: fastattn computes on the CPU "
                         "only (device='cpu' or None)")


def _hub_cache(cache_folder):
    if cache_folder is not None:
        return os.fspath(cache_folder)
    for var in ("SENTENCE_TRANSFORMERS_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return os.environ[var]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface")
    return os.path.join(home, "hub")


def _cached_snapshot(name, cache, revision):
    """The folder of `name`'s snapshot (at `revision`, default main) in the Hugging Face cache
    `cache`, or None."""
    repo = os.path.join(cache, "models--" + name.replace("/", "--"))
    ref = os.path.join(repo, "refs", revision or "main")
    commit = revision
    if os.path.isfile(ref):
        with open(ref, encoding="utf-8") as f:
            commit = f.read().strip()
    folder = os.path.join(repo, "snapshots", commit) if commit else None
    return folder if folder and os.path.isdir(folder) else None


def resolve_folder(model_name_or_path, cache_folder=None, revision=None):
    """The local folder of `model_name_or_path`: itself, or a hub name's snapshot in the
    Hugging Face cache (a bare name is looked up under sentence-transformers/ first, as
    sentence-transformers does); ValueError naming it otherwise: fastattn downloads nothing."""
    if model_name_or_path is None:
        raise ValueError("model_name_or_path is required: a local model folder (building a "
                         "model from modules= is not supported)")
    if not isinstance(model_name_or_path, (str, os.PathLike)):
        raise TypeError(f"model_name_or_path must be a str or os.PathLike, got "
                        f"{type(model_name_or_path).__name__}")
    path = os.fspath(model_name_or_path)
    if os.path.isdir(path):
        return path
    if os.path.exists(path):
        raise ValueError(f"model_name_or_path={path!r} is a file, not a model folder")
    cache = _hub_cache(cache_folder)
    names = [path] if "/" in path else [f"{_DEFAULT_ORG}/{path}", path]
    if path.count("/") <= 1 and not path.startswith((".", os.sep)):
        for name in names:
            folder = _cached_snapshot(name, cache, revision)
            if folder is not None:
                return folder
    raise ValueError(f"model_name_or_path={path!r} is not a local folder and no snapshot of "
                     f"{' or '.join(names)} is in the Hugging Face cache {cache}: fastattn "
                     "downloads nothing. Download the model once (huggingface-cli download "
                     f"{names[0]}, or sentence-transformers' SentenceTransformer(name).save("
                     "folder)) and pass its folder")


def _check_remote_code(folder, trust_remote_code):
    """trust_remote_code=True runs a folder's own modeling code in sentence-transformers: a
    folder with such code (config.json's auto_map) is refused; without it the flag changes
    nothing."""
    if not trust_remote_code:
        return
    where = os.path.join(folder, "config.json")
    cfg = read_json(where, "model config", dict) if os.path.isfile(where) else {}
    if cfg.get("auto_map"):
        raise ValueError(f"trust_remote_code=True: {where} names its own modeling code "
                         f"(auto_map {sorted(cfg['auto_map'])}), which fastattn does not run")


def _st_config(folder):
    """config_sentence_transformers.json (validated by SentenceEncoder's loading), or {}."""
    where = os.path.join(folder, "config_sentence_transformers.json")
    return read_json(where, "sentence-transformers config", dict) if os.path.isfile(where) \
        else {}


# -- quantization -------------------------------------------------------------------------------

def _ranges(embeddings, precision):
    if embeddings.ndim == 1 or embeddings.shape[0] == 1:
        raise ValueError(f"precision={precision!r}: cannot compute {precision} quantization "
                         "ranges from a single embedding (the ranges come from the embeddings "
                         "of the call)")
    return np.vstack((embeddings.min(axis=0), embeddings.max(axis=0)))


def quantize_embeddings(embeddings, precision, ranges=None, calibration_embeddings=None):
    """sentence-transformers' ``quantize_embeddings`` in NumPy: float embeddings (an array, or
    a list of (tokens, dim) arrays sharing one calibration) to `precision`.

    int8 / uint8: each dimension's [min, max] (from `ranges` (2, dim), else
    `calibration_embeddings`, else the embeddings themselves) cut into 256 buckets; int8 is
    uint8 - 128. binary / ubinary: the bits ``x > 0`` packed 8 to a byte (binary: - 128, as
    int8). float32: a float32 copy.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not supported; supported: "
                         f"{', '.join(PRECISIONS)}")
    if isinstance(embeddings, list):
        if not embeddings:
            return []
        mats = [np.asarray(e) for e in embeddings]
        if mats[0].ndim == 2:
            if precision.endswith("int8") and ranges is None:
                data = np.concatenate(mats) if calibration_embeddings is None else \
                    np.asarray(calibration_embeddings)
                if len(data):
                    ranges = _ranges(data, precision)
            return [quantize_embeddings(m, precision, ranges, calibration_embeddings)
                    for m in mats]
        embeddings = np.array(mats)
    embeddings = np.asarray(embeddings)
    if embeddings.dtype.kind != "f":
        raise TypeError(f"embeddings to quantize must be floats, got {embeddings.dtype}")
    if embeddings.ndim == 2 and embeddings.shape[0] == 0:
        width = embeddings.shape[1] if precision.endswith("int8") else \
            (embeddings.shape[1] + 7) // 8
        if precision != "float32":
            return np.zeros((0, width), np.int8 if precision in ("int8", "binary") else np.uint8)
    if precision == "float32":
        return embeddings.astype(np.float32)
    if precision.endswith("int8"):
        if ranges is None:
            ranges = _ranges(embeddings if calibration_embeddings is None
                             else np.asarray(calibration_embeddings), precision)
        ranges = np.asarray(ranges).astype(np.float32, copy=False)
        starts = ranges[0, :]
        steps = (ranges[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        buckets = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
        return buckets.astype(np.uint8) if precision == "uint8" else \
            (buckets - 128).astype(np.int8)
    bits = np.packbits(embeddings > 0, axis=-1)
    return bits if precision == "ubinary" else (bits - 128).astype(np.int8)


# -- similarity ---------------------------------------------------------------------------------

def _matrix(x, name, batch=True):
    """Embeddings (an array, a torch tensor, a list of either) as a float ndarray; 1-D is one
    row when `batch`."""
    if hasattr(x, "detach"):                    # a torch tensor
        x = x.detach().cpu().numpy()
    elif isinstance(x, (list, tuple)):
        x = np.stack([e.detach().cpu().numpy() if hasattr(e, "detach") else np.asarray(e)
                      for e in x]) if x and not np.isscalar(x[0]) else np.asarray(x)
    x = np.asarray(x)
    if x.ndim > 2 or x.ndim == 0:
        raise ValueError(f"{name} must be one embedding or a matrix of them, got shape "
                         f"{x.shape}")
    if x.dtype.kind != "f":
        raise TypeError(f"{name} must hold float embeddings, got {x.dtype} (quantized "
                        "embeddings are not compared by similarity())")
    if x.dtype.itemsize < 4:
        x = x.astype(np.float32)
    return x[None, :] if batch and x.ndim == 1 else x


def _unit(x):
    """Rows over their L2 norms, as torch.nn.functional.normalize (eps 1e-12)."""
    norms = np.sqrt(np.square(x).sum(axis=-1, keepdims=True))
    return x / np.maximum(norms, np.asarray(1e-12, x.dtype))


def _distance(a, b, p):
    """(N, M) p-norm distances (p 1 or 2) by differences, a few rows of `a` at a time."""
    out = np.empty((a.shape[0], b.shape[0]), np.result_type(a, b))
    step = max(1, (1 << 24) // max(1, b.size))
    for i in range(0, a.shape[0], step):
        diff = np.abs(a[i:i + step, None, :] - b[None, :, :])
        out[i:i + step] = diff.sum(-1) if p == 1 else np.sqrt(np.square(diff).sum(-1))
    return out


def _similarity(name, a, b):
    a, b = _matrix(a, "embeddings1"), _matrix(b, "embeddings2")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"embeddings1 has {a.shape[1]} dimensions, embeddings2 {b.shape[1]}")
    if name == "cosine":
        return _unit(a) @ _unit(b).T
    if name == "dot":
        return a @ b.T
    return -_distance(a, b, 2 if name == "euclidean" else 1)


def _similarity_pairwise(name, a, b):
    a, b = _matrix(a, "embeddings1", False), _matrix(b, "embeddings2", False)
    if a.shape != b.shape:
        raise ValueError(f"embeddings1 {a.shape} and embeddings2 {b.shape} must have one shape")
    if name == "cosine":
        a, b = _unit(a), _unit(b)
    if name in ("cosine", "dot"):
        return (a * b).sum(axis=-1)
    diff = np.abs(a - b)
    return -(diff.sum(axis=-1) if name == "manhattan" else np.sqrt(np.square(diff).sum(-1)))


def _result(x):
    """A similarity result as sentence-transformers gives it (a torch tensor, where torch is
    importable)."""
    return _tensor(np.asarray(x))


# -- the model ----------------------------------------------------------------------------------

def _inputs_argument(inputs, kwargs):
    """`inputs`, or ``sentences=`` (its name before sentence-transformers 6) popped from
    kwargs."""
    if "sentences" in kwargs:
        if inputs is not None:
            raise TypeError("give inputs or sentences, not both")
        inputs = kwargs.pop("sentences")
    return inputs


def _batch_types():
    """The types encode takes as a batch: list, tuple and, where the datasets package is in
    use, its Column (as sentence-transformers)."""
    types = (list, tuple)
    datasets = sys.modules.get("datasets")
    column = getattr(datasets, "Column", None) if datasets is not None else None
    return types + (column,) if isinstance(column, type) else types


class SentenceTransformer:
    """sentence-transformers' ``SentenceTransformer`` for inference, over
    :class:`fastattn.SentenceEncoder` (its ``encoder`` attribute).

    Parameters
    ----------
    model_name_or_path : str or os.PathLike
        A sentence-transformers or plain BERT-family model folder (what
        :class:`fastattn.SentenceEncoder` reads), or a hub name whose snapshot is in the Hugging
        Face cache (``cache_folder``, else ``SENTENCE_TRANSFORMERS_HOME`` / ``HF_HUB_CACHE`` /
        ``HF_HOME``): nothing is downloaded.
    device : None or "cpu"
    prompts, default_prompt_name, truncate_dim, similarity_fn_name : as sentence-transformers
        (the constructor's values before the folder's config_sentence_transformers.json).
    cache_folder, revision : where a hub name's snapshot is looked up.
    quantize, n_threads : fastattn's (:class:`fastattn.SentenceEncoder`).

    The other arguments of sentence-transformers' constructor are accepted with the values
    that change nothing for a local folder (local_files_only, token, use_auth_token and
    model_card_data change nothing at all: nothing is downloaded or saved), else refused by
    name (see the module docstring).
    """

    _default_prompts = {"query": None, "document": None}

    def __init__(self, model_name_or_path=None, *, modules=None, device=None, prompts=None,
                 default_prompt_name=None, cache_folder=None, trust_remote_code=False,
                 revision=None, local_files_only=False, token=None, use_auth_token=None,
                 model_kwargs=None, processor_kwargs=None, tokenizer_kwargs=None,
                 config_kwargs=None, use_kernels=False, kernel_config=None,
                 model_card_data=None, backend="torch", similarity_fn_name=None,
                 truncate_dim=None, quantize=None, n_threads=None):
        if modules is not None:
            raise ValueError("modules= is not supported: fastattn loads a saved model folder "
                             "(model_name_or_path)")
        _check_device(device)
        if backend != "torch":
            raise ValueError(f"backend={backend!r} is not supported: fastattn computes the "
                             "folder's model.safetensors with its own kernels (leave "
                             "backend='torch')")
        if use_kernels or kernel_config is not None:
            raise ValueError("use_kernels / kernel_config are not supported: fastattn runs its "
                             "own kernels")
        given = dict(zip(_LOADING_KWARGS, (model_kwargs, processor_kwargs, tokenizer_kwargs,
                                           config_kwargs)))
        for name, value in given.items():
            if value:
                raise ValueError(f"{name}={value!r} is not supported (fastattn loads the "
                                 "folder as it is: float32, or quantize='int8')")
        folder = resolve_folder(model_name_or_path, cache_folder, revision)
        _check_remote_code(folder, trust_remote_code)
        self.encoder = SentenceEncoder(folder, quantize=quantize, n_threads=n_threads)
        self.model_name_or_path = folder
        config = _st_config(folder)
        self.prompts = dict(self._default_prompts)
        if prompts is not None:
            if not isinstance(prompts, dict):
                raise TypeError(f"prompts must be a dict of name -> prompt, got "
                                f"{type(prompts).__name__}")
            self.prompts.update(prompts)
        for name, text in (config.get("prompts") or {}).items():
            if self.prompts.get(name) is None:
                self.prompts[name] = text
        for name, text in self.prompts.items():
            if text is None:
                self.prompts[name] = ""
            elif not isinstance(text, str):
                raise TypeError(f"prompts[{name!r}] must be a str, got {type(text).__name__}")
        if default_prompt_name is None:
            default_prompt_name = config.get("default_prompt_name")
        if default_prompt_name is not None and default_prompt_name not in self.prompts:
            raise ValueError(f"default_prompt_name={default_prompt_name!r} is not among the "
                             f"prompts {list(self.prompts)}")
        self.default_prompt_name = default_prompt_name
        self.truncate_dim = check_truncate_dim(truncate_dim) if truncate_dim is not None \
            else self.encoder.model.truncate_dim
        self._similarity_fn_name = None
        self.similarity_fn_name = similarity_fn_name
        if similarity_fn_name is None and config.get("similarity_fn_name") in \
                SIMILARITY_FN_NAMES:
            self.similarity_fn_name = config["similarity_fn_name"]

    def __repr__(self):
        return (f"SentenceTransformer({self.model_name_or_path!r}, "
                f"encoder={self.encoder!r})")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"fastattn.compat.sentence_transformers.SentenceTransformer has no {name!r}: it "
            "covers loading a model folder and inference (encode, encode_query, "
            "encode_document, similarity, tokenize ...), not sentence-transformers' training, "
            "saving, hub or multi-process API")

    # -- attributes -----------------------------------------------------------------------------

    @property
    def device(self):
        """The CPU (a torch.device where torch is importable, else "cpu")."""
        torch = _torch()
        return "cpu" if torch is None else torch.device("cpu")

    @property
    def tokenizer(self):
        """The folder's tokenizer: fastattn's :class:`fastattn.text.JsonTokenizer` (encode /
        decode), not a transformers tokenizer."""
        return self.encoder.tokenizer

    @property
    def max_seq_length(self):
        """Tokens kept per input, special tokens included; set it to truncate elsewhere (at
        most the model's position table)."""
        return self.encoder.max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value):
        top = self.encoder.model.config.max_tokens
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"max_seq_length must be an int, got {value!r}")
        if not 1 <= value <= top:
            raise ValueError(f"max_seq_length={value} must be in [1, {top}] (this model's "
                             "position table)")
        self.encoder.max_seq_length = int(value)

    def get_max_seq_length(self):
        return self.max_seq_length

    def get_embedding_dimension(self):
        """The size of encode's vectors (after the model's truncate_dim)."""
        return self.encoder.model.output_dim(self.truncate_dim)

    get_sentence_embedding_dimension = get_embedding_dimension

    @contextlib.contextmanager
    def truncate_embeddings(self, truncate_dim):
        """Within the block, encode truncates to `truncate_dim` (None: not at all)."""
        before = self.truncate_dim
        self.truncate_dim = check_truncate_dim(truncate_dim)
        try:
            yield
        finally:
            self.truncate_dim = before

    truncate_sentence_embeddings = truncate_embeddings

    @property
    def similarity_fn_name(self):
        """The similarity() function: "cosine" (the default), "dot", "euclidean",
        "manhattan"."""
        if self._similarity_fn_name is None:
            self._similarity_fn_name = "cosine"
        return self._similarity_fn_name

    @similarity_fn_name.setter
    def similarity_fn_name(self, value):
        value = getattr(value, "value", value)            # a SimilarityFunction member
        if value is not None and value not in SIMILARITY_FN_NAMES:
            raise ValueError(f"similarity_fn_name={value!r} is not supported; supported: "
                             f"{', '.join(SIMILARITY_FN_NAMES)}")
        self._similarity_fn_name = value

    def similarity(self, embeddings1, embeddings2):
        """(N, M) scores of every row of embeddings1 against every row of embeddings2 by
        similarity_fn_name (euclidean and manhattan: minus the distance)."""
        return _result(_similarity(self.similarity_fn_name, embeddings1, embeddings2))

    def similarity_pairwise(self, embeddings1, embeddings2):
        """(N,) scores of embeddings1[i] against embeddings2[i]."""
        return _result(_similarity_pairwise(self.similarity_fn_name, embeddings1,
                                            embeddings2))

    def to(self, device):
        _check_device(device)
        return self

    def cpu(self):
        return self

    def eval(self):
        return self

    # -- inputs ---------------------------------------------------------------------------------

    def is_singular_input(self, inputs):
        """True for one input (a str), False for a batch (a list, a tuple, an array of str, a
        datasets Column)."""
        if isinstance(inputs, _batch_types()):
            return False
        return not (isinstance(inputs, np.ndarray) and inputs.ndim >= 1 and
                    inputs.dtype.kind in "UO")

    def _texts(self, inputs):
        """(single, list of str) of encode's inputs; TypeError naming what is not a text."""
        single = self.is_singular_input(inputs)
        items = [inputs] if single else list(inputs)
        for i, item in enumerate(items):
            if isinstance(item, str):
                items[i] = str(item)               # (a NumPy str_ as a str)
                continue
            where = "inputs" if single else f"inputs[{i}]"
            if isinstance(item, (tuple, list)):
                raise TypeError(f"{where} is a {type(item).__name__}: sentence pairs are not "
                                "supported (one str per input)")
            raise TypeError(f"{where} must be a str (text only), got {type(item).__name__}")
        return single, items

    def _resolve_prompt(self, prompt, prompt_name):
        """The prompt text for a call ("" for none), as sentence-transformers resolves it."""
        if prompt is None:
            if prompt_name is not None:
                if prompt_name not in self.prompts:
                    raise ValueError(f"prompt_name={prompt_name!r} is not among the prompts "
                                     f"{list(self.prompts)}")
                prompt = self.prompts[prompt_name]
            elif self.default_prompt_name is not None:
                prompt = self.prompts.get(self.default_prompt_name)
        elif prompt_name is not None:
            logger.warning("encode got both prompt and prompt_name: prompt_name=%r is ignored, "
                           "prompt is used", prompt_name)
        if prompt is not None and not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str or None, got {type(prompt).__name__}")
        return prompt or ""

    # -- encode ---------------------------------------------------------------------------------

    def encode(self, inputs=None, prompt_name=None, prompt=None, batch_size=32,
               show_progress_bar=None, output_value="sentence_embedding", precision="float32",
               convert_to_numpy=True, convert_to_tensor=False, device=None,
               normalize_embeddings=False, truncate_dim=None, pool=None, chunk_size=None,
               **kwargs):
        """Embeddings of `inputs` (a str: one; a list / tuple / array of str: a batch), as
        sentence-transformers' ``encode``: float32 (N, dim) by default, (dim,) for one str;
        see the module docstring for the options. ``chunk_size`` (multi-process only) and
        ``task`` (a Router's, which fastattn's folders do not have) change nothing."""
        inputs = _inputs_argument(inputs, kwargs)
        kwargs.pop("task", None)
        if kwargs:
            raise ValueError(f"encode() got keyword arguments this model does not use: "
                             f"{sorted(kwargs)}" + ("; processing_kwargs (per-call tokenizer "
                                                    "settings) is not supported"
                                                    if "processing_kwargs" in kwargs else ""))
        if pool is not None:
            raise ValueError("pool= is sentence-transformers' multi-process encoding; fastattn "
                             "encodes in one process with OpenMP threads (n_threads=)")
        _check_device(device)
        if precision is not None and precision not in PRECISIONS:
            raise ValueError(f"precision={precision!r} is not supported; supported: "
                             f"{', '.join(PRECISIONS)}")
        if output_value not in ("sentence_embedding", "token_embeddings", None):
            raise ValueError(f"output_value={output_value!r} is not supported; supported: "
                             "'sentence_embedding', 'token_embeddings', None")
        if convert_to_tensor:
            convert_to_numpy = False
        if output_value != "sentence_embedding":
            convert_to_tensor = convert_to_numpy = False
        if show_progress_bar is None:
            show_progress_bar = logger.getEffectiveLevel() in (logging.INFO, logging.DEBUG)
        if convert_to_tensor:
            torch = _need_torch("convert_to_tensor=True")
        single, texts = self._texts(inputs)
        prompt = self._resolve_prompt(prompt, prompt_name)
        keep = self.truncate_dim if truncate_dim is None else check_truncate_dim(truncate_dim)
        quantized = precision not in (None, "float32")
        if output_value is None:
            if quantized:
                raise ValueError(f"precision={precision!r} applies to sentence or token "
                                 "embeddings, not to output_value=None")
            out = self._features(texts, prompt, batch_size, keep)
            return out[0] if single else out
        if output_value == "token_embeddings":
            out = self.encoder.token_embeddings(texts, batch_size=batch_size, prompt=prompt)
            if quantized and out:
                out = quantize_embeddings(out, precision)
            else:
                out = [_tensor(m) for m in out]
            return out[0] if single else out
        emb = self.encoder.encode(texts, batch_size=batch_size, prompt=prompt,
                                  normalize_embeddings=bool(normalize_embeddings),
                                  show_progress_bar=bool(show_progress_bar), truncate_dim=keep)
        if quantized and len(emb):
            emb = quantize_embeddings(emb, precision)
        if convert_to_tensor:
            out = torch.as_tensor(emb) if len(emb) else torch.tensor([])
        elif convert_to_numpy:
            out = emb if len(emb) else np.array([])
        else:
            out = [_tensor(row) for row in emb]
        return out[0] if single else out

    def encode_query(self, inputs=None, prompt_name=None, prompt=None, **kwargs):
        """encode with the "query" prompt unless a prompt is given."""
        inputs = _inputs_argument(inputs, kwargs)
        if prompt_name is None and prompt is None and "query" in self.prompts:
            prompt_name = "query"
        return self.encode(inputs=inputs, prompt_name=prompt_name, prompt=prompt, task="query",
                           **kwargs)

    def encode_document(self, inputs=None, prompt_name=None, prompt=None, **kwargs):
        """encode with the first of the "document", "passage", "corpus" prompts unless a
        prompt is given."""
        inputs = _inputs_argument(inputs, kwargs)
        if prompt_name is None and prompt is None:
            prompt_name = next((n for n in ("document", "passage", "corpus")
                                if n in self.prompts), None)
        return self.encode(inputs=inputs, prompt_name=prompt_name, prompt=prompt,
                           task="document", **kwargs)

    def get_model_kwargs(self):
        """The extra keyword arguments encode passes to the modules: none."""
        return []

    # -- features -------------------------------------------------------------------------------

    def _input_names(self):
        """The tokenizer outputs sentence-transformers passes on: tokenizer_config.json's
        model_input_names, else token_type_ids where the model has token types."""
        cfg = getattr(self.encoder.tokenizer, "_cfg", {}) or {}
        names = cfg.get("model_input_names")
        if isinstance(names, list):
            return [n for n in ("input_ids", "token_type_ids", "attention_mask") if n in names]
        if self.encoder.model.config.type_vocab_size > 1:
            return ["input_ids", "token_type_ids", "attention_mask"]
        return ["input_ids", "attention_mask"]

    def _padded(self, ids, types):
        """The padded int64 features of token id lists, by name, and the mask."""
        batch, mask = pad_batch(ids, self.encoder.tokenizer.pad_id)
        tt, _ = pad_batch(types, 0)
        arrays = {"input_ids": np.asarray(batch, np.int64),
                  "token_type_ids": np.asarray(tt, np.int64),
                  "attention_mask": np.asarray(mask, np.int64)}
        return {n: arrays[n] for n in self._input_names()}, batch, mask, tt

    def tokenize(self, texts):
        """The padded features of `texts` (no prompt), as sentence-transformers'
        ``tokenize``: input_ids, token_type_ids (where the model uses them), attention_mask
        (tensors where torch is importable), modality."""
        _, texts = self._texts(texts)
        ids, types = self.encoder.tokenize(texts, "")
        features = self._padded(ids, types)[0] if ids else {}
        out = {n: _tensor(a) for n, a in features.items()}
        out["modality"] = "text"
        return out

    def _prompt_length(self, prompt):
        """The prompt's tokens without a trailing special token (sentence-transformers'
        prompt_length)."""
        ids = self.encoder.tokenize([prompt], "")[0][0]
        return len(ids) - (bool(ids) and ids[-1] in self.encoder.tokenizer.special_ids)

    def _features(self, texts, prompt, batch_size, truncate_dim):
        """output_value=None: per input, a dict of its batch's features (padded to the batch
        as sentence-transformers batches: by characters, longest first), token and sentence
        embeddings."""
        enc = self.encoder
        ids, types = enc.tokenize(texts, prompt)
        sentence = enc.embed_ids(ids, types, batch_size=batch_size, truncate_dim=truncate_dim)
        order = np.argsort([-len(t) for t in texts])
        prompt_length = self._prompt_length(prompt) if prompt else None
        out = [None] * len(texts)
        from threadpoolctl import threadpool_limits
        with threadpool_limits(limits=enc.n_threads) if enc.n_threads else \
                contextlib.nullcontext():
            for start in range(0, len(order), batch_size):
                idx = [int(i) for i in order[start:start + batch_size]]
                features, batch, mask, tt = self._padded([ids[i] for i in idx],
                                                         [types[i] for i in idx])
                has_types = "token_type_ids" in features and bool(np.any(tt))
                hidden = enc.model(batch, mask, tt if has_types else None)
                for row, i in enumerate(idx):
                    item = {n: _tensor(a[row]) for n, a in features.items()}
                    item["modality"] = "text"
                    if prompt_length is not None:
                        item["prompt_length"] = prompt_length
                    item["token_embeddings"] = _tensor(np.ascontiguousarray(hidden[row]))
                    item["sentence_embedding"] = _tensor(sentence[i])
                    out[i] = item
        return out
