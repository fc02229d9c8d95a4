"""Translation folders of every seq2seq family for the text tests: a random checkpoint
(tests/models/seq2seq_checkpoints.py: unit-scale weights, untied heads, an EOS bias) and the
tokenizer transformers' own class builds from a model trained here (SentencePiece, or a
byte-level BPE for BART) and saves with save_pretrained.

What each folder holds after save_pretrained (transformers 5): tokenizer.json +
tokenizer_config.json for BART, mBART, mBART-50, NLLB, Pegasus and T5; vocab.json +
sentencepiece.bpe.model + tokenizer_config.json for M2M100 (a slow tokenizer in transformers).
"""
import io
import json
import os
import random
import shutil
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "models"))

WORDS = ("the cat and dog ran over a hill was not here ka to mi ren su la po ne gi ba une "
         "maison été très grand über schön café naïve ß").split()
FAMILIES = ["bart", "mbart", "mbart50", "m2m_100", "nllb", "pegasus", "t5"]
MODEL_TYPE = {"mbart50": "mbart", "nllb": "m2m_100"}
# checkpoint seeds whose greedy translations of sentences(5, 30) vary (>= 16 distinct strings;
# some seeds decode nearly everything to "" or to one repeated piece)
SEEDS = {"mbart": 3, "mbart50": 1, "m2m_100": 1, "nllb": 3}


def corpus(seed=0, n=500):
    r = random.Random(seed)
    return [" ".join(r.choice(WORDS) for _ in range(r.randint(1, 12))) +
            r.choice(["", ".", "!", " ?", ",", "'s"]) for _ in range(n)]


def sentences(seed, n, lo=1, hi=14):
    r = random.Random(seed)
    return [" ".join(r.choice(WORDS) for _ in range(r.randint(lo, hi))) + r.choice(["", ".", " ?"])
            for _ in range(n)]


def train_spm(model_type, vocab_size, **kw):
    import sentencepiece as spm
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus()), model_writer=out,
                                   vocab_size=vocab_size, model_type=model_type, minloglevel=2,
                                   character_coverage=0.995, hard_vocab_limit=False, **kw)
    return out.getvalue()


def _quiet(fn, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*a, **kw)


def build_tokenizer(family, folder, hub_like=False, spm_only=False):
    """Write `family`'s tokenizer files into `folder` as transformers saves them; returns the
    transformers tokenizer (loaded back from `folder`). ``spm_only``: as an older published
    folder, the SentencePiece model (spiece.model / sentencepiece.bpe.model) written beside
    tokenizer_config.json and no tokenizer.json (T5, Pegasus, mBART, mBART-50, NLLB)."""
    import transformers as T
    raw = tempfile.mkdtemp(prefix=f"fa-{family}-raw-")
    try:
        if family == "bart":
            from tokenizers import ByteLevelBPETokenizer
            bpe = ByteLevelBPETokenizer()
            bpe.train_from_iterator(corpus(), vocab_size=320, min_frequency=2, show_progress=False,
                                    special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
            bpe.save_model(raw)
            tok = _quiet(T.BartTokenizer.from_pretrained, raw)
        elif family in ("mbart", "mbart50"):
            with open(os.path.join(raw, "sentencepiece.bpe.model"), "wb") as f:
                f.write(train_spm("unigram", 120))
            cls = T.MBartTokenizer if family == "mbart" else T.MBart50Tokenizer
            tok = _quiet(cls.from_pretrained, raw)
        elif family == "nllb":
            from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES
            with open(os.path.join(raw, "sentencepiece.bpe.model"), "wb") as f:
                f.write(train_spm("bpe", 120))
            tok = _quiet(T.NllbTokenizer.from_pretrained, raw,
                         extra_special_tokens=list(FAIRSEQ_LANGUAGE_CODES))
        elif family in ("t5", "pegasus"):
            with open(os.path.join(raw, "spiece.model"), "wb") as f:
                f.write(train_spm("unigram", 120, pad_id=0, eos_id=1, unk_id=2, bos_id=-1))
            cls = T.T5Tokenizer if family == "t5" else T.PegasusTokenizer
            tok = _quiet(cls.from_pretrained, raw)
        elif family == "m2m_100":
            import sentencepiece as spm
            blob = train_spm("bpe", 100)
            with open(os.path.join(raw, "sentencepiece.bpe.model"), "wb") as f:
                f.write(blob)
            proc = spm.SentencePieceProcessor(model_proto=blob)
            vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
            pieces = [proc.IdToPiece(i) for i in range(proc.GetPieceSize())
                      if not (proc.IsControl(i) or proc.IsUnknown(i))]
            for p in pieces[:-3]:             # three pieces left out: they encode to <unk>
                vocab.setdefault(p, len(vocab))
            with open(os.path.join(raw, "vocab.json"), "w", encoding="utf-8") as f:
                json.dump(vocab, f, ensure_ascii=False)
            tok = _quiet(T.M2M100Tokenizer.from_pretrained, raw)
        else:
            raise ValueError(family)
        _quiet(tok.save_pretrained, folder)
        if spm_only:
            for name in ("spiece.model", "sentencepiece.bpe.model"):
                if os.path.isfile(os.path.join(raw, name)):
                    shutil.copyfile(os.path.join(raw, name), os.path.join(folder, name))
            os.remove(os.path.join(folder, "tokenizer.json"))
    finally:
        shutil.rmtree(raw, ignore_errors=True)
    if hub_like and family == "m2m_100":
        # as the published M2M100 folders: the language tokens listed as special tokens
        path = os.path.join(folder, "tokenizer_config.json")
        cfg = json.load(open(path, encoding="utf-8"))
        cfg["additional_special_tokens"] = [f"__{c}__" for c in tok.lang_code_to_token]
        cfg.pop("extra_special_tokens", None)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False, indent=1)
    return hf_tokenizer(folder)


def hf_tokenizer(folder):
    from transformers import AutoTokenizer
    return _quiet(AutoTokenizer.from_pretrained, folder)


def top_id(tok):
    """The largest id the transformers tokenizer can write."""
    ids = list(tok.get_vocab().values())
    for attr in ("lang_code_to_id",):
        ids += list(getattr(tok, attr, {}).values())
    return max(ids)


def make_folder(family, folder, seed=None, spm_only=False):
    """A complete folder: tokenizer files and a random checkpoint of its vocabulary. Returns
    (transformers tokenizer, torch model)."""
    from seq2seq_checkpoints import make_checkpoint
    tok = build_tokenizer(family, folder, spm_only=spm_only)
    mt = MODEL_TYPE.get(family, family)
    seed = SEEDS.get(family, 0) if seed is None else seed
    kw = dict(vocab_size=top_id(tok) + 1, tied=False, seed=seed)
    if mt == "t5":
        kw["feed_forward_proj"] = "gated-gelu"
    model = make_checkpoint(folder, mt, **kw)
    return hf_tokenizer(folder), model
