"""CTranslate2 folders for the tests: random checkpoints of tests/models and tests/text written
by transformers, then converted by CTranslate2's own converter (TransformersConverter, what
``ct2-transformers-converter`` runs)."""
import json
import os

import numpy as np


def sharpen(folder, pad=None, eos=None, head=4.0, bias=0.1, eos_bias=0.0):
    """Rewrite a random checkpoint so that greedy decoding varies (tests/PEERS: random models
    decode one token over and over): the untied output head x `head`, the final logits bias x
    `bias` (+ `eos_bias` on EOS), and the pad rows of the token tables zeros, as OPUS-MT's are
    (CTranslate2 drops Marian's pad and starts the decoder from a zero embedding)."""
    from safetensors.numpy import load_file, save_file
    path = os.path.join(folder, "model.safetensors")
    sd = load_file(path)
    for k, v in sd.items():
        if pad is not None and ("embed_tokens" in k or k == "model.shared.weight"):
            v[pad] = 0
        if k == "lm_head.weight":
            v *= head
        if k == "final_logits_bias":
            v *= bias
            if eos is not None:
                v[0, eos] += eos_bias
    save_file(sd, path, metadata={"format": "pt"})


def convert(hf, out, quantization, copy_files=None, tokens=None):
    """CTranslate2's conversion of `hf` to `out`. `tokens` ({id: token} of the special ids):
    for a folder without a tokenizer, the vocabulary the converter asks for is t<id> but
    those."""
    import ctranslate2
    from ctranslate2.converters import TransformersConverter
    if tokens is None:
        TransformersConverter(hf, copy_files=copy_files).convert(out, quantization=quantization,
                                                                 force=True)
        return out
    with open(os.path.join(hf, "config.json")) as f:
        V = json.load(f)["vocab_size"]
    vocab = {f"t{i}": i for i in range(V)}
    for i, t in tokens.items():
        del vocab[f"t{i}"]
        vocab[t] = i
    inverse = {i: t for t, i in vocab.items()}

    class Tokenizer:                   # what the converter reads of a tokenizer
        eos_token, unk_token, bos_token, pad_token = "</s>", "<unk>", "<s>", "<pad>"
        special_tokens_map = {}
        unk_token_id = vocab["<unk>"]

        def get_vocab(self):
            return dict(vocab)

        def convert_ids_to_tokens(self, i):
            return inverse[i]

    class Converter(TransformersConverter):
        def load_tokenizer(self, *args, **kwargs):
            return Tokenizer()

    Converter(hf).convert(out, quantization=quantization, force=True)
    assert ctranslate2.contains_model(out)
    return out


def ct2_tokens(folder, ids, name="shared_vocabulary"):
    """Token ids as the folder's vocabulary strings (CTranslate2's input)."""
    with open(os.path.join(folder, name + ".json")) as f:
        vocab = json.load(f)
    return [[vocab[int(t)] for t in row] for row in ids], {t: i for i, t in enumerate(vocab)}


def rows(ids, mask):
    return [list(np.asarray(r)[np.asarray(m).astype(bool)]) for r, m in zip(ids, mask)]
