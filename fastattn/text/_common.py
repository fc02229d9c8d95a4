"""What Translator and SentenceEncoder share: the folder's model type, quantize, n_threads."""
import inspect
import os

from .._validation import check_folder, check_n_threads  # noqa: F401 (check_folder: re-used)
from ..io.huggingface import read_json
from ..models.bert import SUPPORTED_MODEL_TYPES

ENCODER_TYPES = SUPPORTED_MODEL_TYPES          # what EncoderModel reads
# what Seq2SeqTransformer reads (m2m_100 covers NLLB)
TRANSLATION_TYPES = ("marian", "bart", "mbart", "pegasus", "m2m_100", "t5", "mt5")


def model_type(folder, where=None):
    """config.json's model_type (FileNotFoundError / ValueError naming the file)."""
    cfg = read_json(os.path.join(folder, "config.json"), "model config", dict)
    mt = cfg.get("model_type")
    if not isinstance(mt, str):
        raise ValueError(f"{os.path.join(folder, 'config.json')} has no model_type")
    return mt


def check_quantize(quantize, loader):
    """Keywords for `loader` (a from_pretrained): {} for None; {'quantize': 'int8'} when the
    loader takes it; otherwise a ValueError saying int8 is not available yet."""
    if quantize is None:
        return {}
    if quantize != "int8":
        raise ValueError(f"quantize must be None or 'int8', got {quantize!r}")
    try:
        takes = "quantize" in inspect.signature(loader).parameters
    except (TypeError, ValueError):      # pragma: no cover - builtins
        takes = False
    if takes:
        return {"quantize": quantize}
    raise ValueError("quantize='int8' is not available yet in this fastattn version (int8 "
                     "weights are coming); use quantize=None for float32")


def check_threads(n_threads):
    return None if n_threads is None else check_n_threads(n_threads, "n_threads")
