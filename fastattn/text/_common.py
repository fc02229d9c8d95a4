"""What Translator and SentenceEncoder share: the folder's model type, quantize, n_threads."""
import os

from .._quant import check_quantize as _check_quantize
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


def check_quantize(quantize):
    """The from_pretrained keywords for `quantize`: {} for None, {'quantize': 'int8'};
    ValueError naming `quantize` for anything else."""
    return {} if _check_quantize(quantize) is None else {"quantize": quantize}


def check_threads(n_threads):
    return None if n_threads is None else check_n_threads(n_threads, "n_threads")
