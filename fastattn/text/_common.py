"""What Translator and SentenceEncoder share: the folder's family, n_threads."""
import os

from .._validation import check_folder, check_n_threads  # noqa: F401 (check_folder: re-used)
from ..io import saved as _saved
from ..io.huggingface import read_json
from ..models import _ct2, registry


# what runs a model of each kind, for a folder given to the other class
_RUN_BY = {"seq2seq": "a translation model: use fastattn.Translator",
           "encoder": "an encoder: use fastattn.SentenceEncoder",
           "speech": "a speech model: use fastattn.WhisperModel"}


def model_family(folder, kind):
    """The registered family (:mod:`fastattn.models.registry`) of ``folder/config.json``'s
    model_type, which must be of `kind` ("seq2seq" for Translator, "encoder" for
    SentenceEncoder): FileNotFoundError / ValueError naming the file, the supported types and,
    for a model of the other kind, the class that runs it. A CTranslate2 folder: the family
    its spec reads as (:func:`fastattn.models._ct2.family`)."""
    if _ct2.is_ct2_folder(folder):
        found = _ct2.spec_kind(folder)
        if found != kind:
            raise ValueError(f"{os.path.join(folder, 'model.bin')} is {_RUN_BY[found]}")
        return _ct2.family(folder, kind)
    where = os.path.join(folder, "config.json")
    cfg = read_json(where, "model config", dict)
    mt = cfg.get("model_type")
    if mt is None and _saved.is_saved_folder(folder):
        # saved from a CTranslate2 folder: its config.json is CTranslate2's, the model's own
        # configuration is in fastattn_model.json
        meta = read_json(os.path.join(folder, _saved.MODEL_FILE), _saved.MODEL_FILE, dict)
        mt = (meta.get("config") or {}).get("model_type")
    if not isinstance(mt, str):
        raise ValueError(f"{where} has no model_type")
    family = registry.family(mt)
    if family is not None and family.kind == kind:
        return family
    if family is not None and kind == "encoder" and family.kind == "seq2seq":
        raise ValueError(f"{where}: model_type={mt!r} is a translation model: use "
                         "fastattn.Translator")
    what = "a translation model" if kind == "seq2seq" else "an encoder"
    hint = f" ({_RUN_BY[family.kind]})" if family is not None else ""
    raise ValueError(f"{where}: model_type={mt!r} is not {what} fastattn supports (supported: "
                     f"{', '.join(registry.model_types(kind))}){hint}")


def check_threads(n_threads):
    return None if n_threads is None else check_n_threads(n_threads, "n_threads")
