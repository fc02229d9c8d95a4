"""Argos Translate packages for the tests, made here (no download): what
``argos-train`` writes -- an OpenNMT-py Transformer (pre-norm, ReLU, sinusoidal position
tables, one shared vocabulary) converted by CTranslate2 into ``model/``, the SentencePiece
model the text was cut with, ``metadata.json`` -- as a folder or zipped (``.argosmodel``).

The weights are random (unit scale, seeded), so the translations are nonsense; what the tests
compare is the pipeline: fastattn against argostranslate's own code and CTranslate2 on the same
package."""
import io
import json
import os
import zipfile

import numpy as np

EN = ["The library opens at nine in the morning and closes at six in the evening.",
      "Where is the train station?", "I would like a cup of coffee, please.",
      "Dr. Smith arrived on Monday; the meeting started at 10.30 a.m.",
      "How much does this cost? It is far too expensive!", "We walked along the river.",
      "The children are playing in the garden behind the old house.",
      "Thank you very much for your help yesterday.", "Das Wetter ist heute schön.",
      "Numbers like 3.14 and 2,718 stay as they are.", "She said: \"Come back soon.\""]


def train_sentencepiece(vocab_size=180, seed_text=EN):
    """A small unigram SentencePiece model (bytes) trained on `seed_text`."""
    import sentencepiece as spm
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(list(seed_text) * 20),
                                   model_writer=buf, vocab_size=vocab_size,
                                   character_coverage=1.0, model_type="unigram",
                                   hard_vocab_limit=False, minloglevel=2)
    return buf.getvalue()


def _vocabulary(sp_bytes):
    """OpenNMT-py's vocabulary of a SentencePiece model: its specials, then the pieces."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_proto=sp_bytes)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    return ["<unk>", "<blank>", "<s>", "</s>"] + [p for p in pieces
                                                  if p not in ("<unk>", "<s>", "</s>")]


def _sinusoids(n, d):
    """OpenNMT-py's position table (sin on the even columns, cos on the odd)."""
    pos = np.arange(n, dtype=np.float64)[:, None]
    div = np.exp(np.arange(0, d, 2, dtype=np.float64) * -(np.log(10000.0) / d))
    pe = np.zeros((n, d))
    pe[:, 0::2] = np.sin(pos * div)
    pe[:, 1::2] = np.cos(pos * div)
    return pe.astype(np.float32)


def make_model(out, sp_bytes, *, d=32, heads=4, ffn=64, layers=(2, 2), positions=320, seed=0,
               unk_bias=0.0, eos_bias=1.5, shared=True, tied=False, quantization=None):
    """CTranslate2's TransformerSpec as its OpenNMT-py converter fills it, random weights;
    `unk_bias`: added to the unknown token's logit (the tests want <unk> in outputs),
    `eos_bias` to the end token's."""
    from ctranslate2.specs import common_spec, transformer_spec
    rng = np.random.default_rng(seed)
    vocab = _vocabulary(sp_bytes)
    V = len(vocab)
    spec = transformer_spec.TransformerSpec.from_config(layers, heads,
                                                        activation=common_spec.Activation.RELU)
    spec.config.decoder_start_token = "<s>"

    def w(*shape, scale=None):
        s = 1.0 / np.sqrt(shape[-1]) if scale is None else scale
        return (rng.standard_normal(shape) * s).astype(np.float32)

    def norm(ln):
        ln.gamma = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
        ln.beta = (0.1 * rng.standard_normal(d)).astype(np.float32)

    def lin(sp, n_out, n_in, scale=None):
        sp.weight = w(n_out, n_in, scale=scale)
        sp.bias = (0.1 * rng.standard_normal(n_out)).astype(np.float32)

    emb = w(V, d, scale=1.0)
    spec.encoder.embeddings[0].weight = emb
    spec.decoder.embeddings.weight = emb if shared else w(V, d, scale=1.0)
    for side in (spec.encoder, spec.decoder):
        side.position_encodings.encodings = _sinusoids(positions, d)
        norm(side.layer_norm)
    for layer in spec.encoder.layer:
        lin(layer.self_attention.linear[0], 3 * d, d)
        lin(layer.self_attention.linear[1], d, d)
        norm(layer.self_attention.layer_norm)
        lin(layer.ffn.linear_0, ffn, d)
        lin(layer.ffn.linear_1, d, ffn)
        norm(layer.ffn.layer_norm)
    for layer in spec.decoder.layer:
        lin(layer.self_attention.linear[0], 3 * d, d)
        lin(layer.self_attention.linear[1], d, d)
        norm(layer.self_attention.layer_norm)
        # a sharp cross-attention that the output follows: translations that depend on the
        # source, alignments with a clear winner (replace_unknowns reads them)
        lin(layer.attention.linear[0], d, d, scale=3.0 / np.sqrt(d))
        lin(layer.attention.linear[1], 2 * d, d, scale=3.0 / np.sqrt(d))
        lin(layer.attention.linear[2], d, d, scale=4.0 / np.sqrt(d))
        norm(layer.attention.layer_norm)
        lin(layer.ffn.linear_0, ffn, d)
        lin(layer.ffn.linear_1, d, ffn)
        norm(layer.ffn.layer_norm)
    spec.decoder.projection.weight = spec.decoder.embeddings.weight if tied else w(V, d)
    bias = (0.5 * rng.standard_normal(V)).astype(np.float32)
    bias[0] += unk_bias
    bias[3] += eos_bias                  # </s>: translations of a few dozen tokens
    spec.decoder.projection.bias = bias
    spec.register_source_vocabulary(vocab)
    spec.register_target_vocabulary(vocab)
    spec.validate()
    spec.optimize(quantization=quantization)
    os.makedirs(out, exist_ok=True)
    spec.save(out)
    return out


def make_package(root, *, from_code="en", to_code="de", name=None, target_prefix="", seed=0,
                 sp_bytes=None, zipped=False, **model_kw):
    """An Argos Translate package folder under `root` (or its ``.argosmodel`` zip when
    `zipped`): metadata.json, sentencepiece.model, model/ (CTranslate2), README.md."""
    sp_bytes = train_sentencepiece() if sp_bytes is None else sp_bytes
    name = name or f"translate-{from_code}_{to_code}-1_0"
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    make_model(os.path.join(folder, "model"), sp_bytes, seed=seed, **model_kw)
    with open(os.path.join(folder, "sentencepiece.model"), "wb") as f:
        f.write(sp_bytes)
    meta = {"package_version": "1.0", "argos_version": "1.0", "from_code": from_code,
            "from_name": {"en": "English", "de": "German", "fr": "French"}.get(from_code,
                                                                               from_code),
            "to_code": to_code,
            "to_name": {"en": "English", "de": "German", "fr": "French"}.get(to_code, to_code),
            "links": []}
    if target_prefix:
        meta["target_prefix"] = target_prefix
    with open(os.path.join(folder, "metadata.json"), "w") as f:
        json.dump(meta, f, indent=2)
    with open(os.path.join(folder, "README.md"), "w") as f:
        f.write(f"# {name}\nA random test package.\n")
    if not zipped:
        return folder
    path = folder + ".argosmodel"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for base, _, files in os.walk(folder):
            for fn in sorted(files):
                full = os.path.join(base, fn)
                z.write(full, os.path.relpath(full, root))
    return path
