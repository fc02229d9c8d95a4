"""CTranslate2 folders as a source format (fastattn/models/_ct2.py): what CTranslate2's own
converter writes for a Marian (with its SentencePiece tokenizer), BART and M2M100 model made
here, and for the real all-MiniLM-L6-v2, loads as the Hugging Face folder it came from.

References: the Hugging Face folder loaded by fastattn (the same weights, bit for bit in
float32), CTranslate2 itself on the converted folder (translate_batch, greedy; Encoder.
forward_batch), and the integers in model.bin (int8 folders keep them). The Whisper folders:
tests/audio/test_whisper_ct2.py."""
import json
import os
import shutil
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "text"))
sys.path.insert(0, os.path.join(HERE, "..", "generation"))
sys.path.insert(0, os.path.join(HERE, "..", "io"))
pytest.importorskip("torch")
pytest.importorskip("transformers")
ctranslate2 = pytest.importorskip("ctranslate2")

import fastattn  # noqa: E402
from ct2_checkpoints import convert, ct2_tokens, rows, sharpen  # noqa: E402
from ct2_files import model_bin, variables_of  # noqa: E402
from fastattn.io.ctranslate2 import ModelBin  # noqa: E402

FMIN = np.finfo(np.float32).min
MARIAN_FILES = ["source.spm", "target.spm", "vocab.json", "tokenizer_config.json"]


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    """A random Marian with its SentencePiece tokenizer (tests/text), decoding varied
    (sharpen), its pad rows zeros; and CTranslate2's float32, float16 and int8 conversions
    with the tokenizer files copied (--copy_files)."""
    pytest.importorskip("sentencepiece")
    from text_helpers import make_marian_folder
    root = tmp_path_factory.mktemp("ct2-marian")
    hf = str(root / "hf")
    os.makedirs(hf)
    vocab, _ = make_marian_folder(hf, generation={"forced_eos_token_id": None}, eos_bias=30,
                                  gain=0.7)
    pad = len(vocab) - 1
    sharpen(hf, pad=pad)
    out = {"hf": hf, "pad": pad, "eos": 0}
    for q in ("float32", "float16", "bfloat16", "int8", "int8_float16"):
        out[q] = convert(hf, str(root / q), q, copy_files=MARIAN_FILES)
    return out


@pytest.fixture(scope="module")
def sources(marian):
    from text_helpers import sentences
    tr = fastattn.Translator(marian["float32"])
    texts = sentences(0, 10)
    ids = tr.tokenizer.encode(texts, max_length=64)
    S = max(map(len, ids))
    mask = np.array([[1] * len(r) + [0] * (S - len(r)) for r in ids])
    ids = np.array([r + [marian["pad"]] * (S - len(r)) for r in ids])
    return texts, ids, mask


def _strip(out, eos):
    """generate's rows as CTranslate2 returns hypotheses: no start token, nothing from EOS on
    (the padding of finished rows)."""
    res = []
    for row in out.tolist():
        row = row[1:]
        res.append(row[:row.index(eos)] if eos in row else row)
    return res


def test_marian_is_the_hugging_face_model(marian):
    """The same parameters (the table positions are read from, sinusoids, included; the pad
    row put back, its logit at float32's minimum), the CTranslate2 decoding defaults."""
    ct = fastattn.Seq2SeqTransformer.from_pretrained(marian["float32"])
    hf = fastattn.Seq2SeqTransformer.from_pretrained(marian["hf"])
    a, b = ct.state_dict(), hf.state_dict()
    common = set(a) & set(b)
    assert set(b) - common == set() and len(common) > 40
    for k in common - {"final_logits_bias", "lm_head.weight"}:
        assert np.array_equal(a[k], b[k]), k
    # the pad's row of the output projection: not in the file (a zero row, a logit of FMIN)
    assert np.array_equal(a["lm_head.weight"][:-1], b["lm_head.weight"][:-1])
    assert np.array_equal(a["final_logits_bias"][:, :-1], b["final_logits_bias"][:, :-1])
    assert not a["lm_head.weight"][-1].any() and a["final_logits_bias"][0, -1] == FMIN
    from transformers import MarianMTModel
    table = MarianMTModel.from_pretrained(marian["hf"]).model.encoder.embed_positions.weight
    assert np.array_equal(a["model.encoder.embed_positions.weight"], table.detach().numpy())
    c = ct.config
    assert (c["model_type"], c["pad_token_id"], c["decoder_start_token_id"], c["eos_token_id"],
            c["vocab_size"]) == ("marian", marian["pad"], marian["pad"], 0, marian["pad"] + 1)
    for k in ("tie_word_embeddings", "share_encoder_decoder_embeddings", "scale_embedding",
              "activation_function", "layer_norm_eps", "normalize_before"):
        assert c[k] == hf.config[k], k
    assert ct.generation_config == {"num_beams": 2, "max_length": 64, "min_new_tokens": 1}


def test_marian_generate_equals_hf_and_ctranslate2(marian, sources):
    """Greedy: token for token the Hugging Face folder's (its pad banned, as OPUS-MT's
    generation config does) and CTranslate2's translate_batch on the folder."""
    _, ids, mask = sources
    pad, eos = marian["pad"], marian["eos"]
    ct = fastattn.Seq2SeqTransformer.from_pretrained(marian["float32"])
    hf = fastattn.Seq2SeqTransformer.from_pretrained(marian["hf"])
    kw = dict(attention_mask=mask, num_beams=1, max_new_tokens=30, min_new_tokens=0)
    got = ct.generate(ids, **kw)
    assert np.array_equal(got, hf.generate(ids, bad_words_ids=[[pad]], **kw))
    tokens, index = ct2_tokens(marian["float32"], rows(ids, mask))
    res = ctranslate2.Translator(marian["float32"], compute_type="float32").translate_batch(
        tokens, beam_size=1, max_decoding_length=30, min_decoding_length=0)
    theirs = [[index[t] for t in r.hypotheses[0]] for r in res]
    ours = _strip(got, eos)
    assert ours == theirs
    # decoding varies: tokens and lengths
    assert len({t for r in ours for t in r}) > 20 and len({len(r) for r in ours}) >= 3


def test_marian_translator(marian, sources):
    texts, _, _ = sources
    ct = fastattn.Translator(marian["float32"])
    hf = fastattn.Translator(marian["hf"])
    kw = dict(num_beams=1, max_new_tokens=30)
    got = ct.translate(texts, **kw)
    assert got == hf.translate(texts, bad_words_ids=[[marian["pad"]]], **kw)
    assert len(set(got)) == len(texts)


@pytest.mark.parametrize("storage", ["float16", "bfloat16"])
def test_marian_half_storage_is_float32_exactly(marian, storage):
    """float16 and bfloat16 folders: the float32 folder's values rounded as the converter
    rounds them (torch), widened back exactly."""
    import torch
    half = getattr(torch, storage)
    a = fastattn.Seq2SeqTransformer.from_pretrained(marian[storage]).state_dict()
    b = fastattn.Seq2SeqTransformer.from_pretrained(marian["float32"]).state_dict()
    assert set(a) == set(b)
    for k in b:
        got, want = a[k], b[k]
        if k == "final_logits_bias":               # the pad's logit is not in the file
            assert got[0, -1] == want[0, -1] == FMIN
            got, want = got[:, :-1], want[:, :-1]
        want = torch.from_numpy(np.array(want)).to(half).float().numpy()
        assert got.dtype == np.float32 and np.array_equal(got, want), k


def _int8_sources(d, n_enc, n_dec):
    """fastattn.nn name of each linear weight -> its model.bin variables (row blocks)."""
    out = {"lm_head.weight": ["decoder/projection/weight"]}
    for side, n in (("encoder", n_enc), ("decoder", n_dec)):
        for i in range(n):
            p, s = f"{side}.layers.{i}", f"{side}/layer_{i}"
            out[f"{p}.self_attn.in_proj_weight"] = [f"{s}/self_attention/linear_0/weight"]
            out[f"{p}.self_attn.out_proj.weight"] = [f"{s}/self_attention/linear_1/weight"]
            out[f"{p}.linear1.weight"] = [f"{s}/ffn/linear_0/weight"]
            out[f"{p}.linear2.weight"] = [f"{s}/ffn/linear_1/weight"]
            if side == "decoder":
                out[f"{p}.multihead_attn.in_proj_weight"] = [f"{s}/attention/linear_0/weight",
                                                             f"{s}/attention/linear_1/weight"]
                out[f"{p}.multihead_attn.out_proj.weight"] = [f"{s}/attention/linear_2/weight"]
    return out


def _check_int8(model, folder, sources, tables):
    """Every int8 weight of `model` holds the folder's integers, scale 1 / the file's scale;
    `tables`: (parameter owner, variable) of the token tables (Int8Rows)."""
    b = ModelBin(os.path.join(folder, "model.bin"))
    ck = b.checkpoint()
    params = {}
    for lname, layer in model._layers.items():
        for n, arr, _, _ in layer._named_params():
            params[f"{lname}.{n}"] = arr
    for name, variables in sources.items():
        w = params[name]
        assert isinstance(w, fastattn._quant.Int8Weight), name
        q = np.concatenate([ck.read(v) for v in variables])
        s = np.concatenate([ck.read(b.scale_of(v)) for v in variables])
        n = q.shape[0]
        assert np.array_equal(w.int8()[:n], q.reshape(n, -1)), name
        assert np.array_equal(w.scale[:n], (np.float32(1) / s).astype(np.float32)), name
        assert not w.int8()[n:].any()                     # Marian's pad row
    for owner, var in tables:
        t = owner._params["weight"]
        assert isinstance(t, fastattn._quant.Int8Rows)
        n = b.shape(var)[0]
        assert np.array_equal(t.q[:n], ck.read(var)) and not t.q[n:].any()
    return len(sources)


def test_marian_int8_keeps_its_integers(marian, sources):
    m = fastattn.Seq2SeqTransformer.from_pretrained(marian["int8"])
    assert m.quantize == "int8"                 # quantize=None: the folder's int8
    srcs = _int8_sources(m.d_model, 2, 2)
    assert not m.config["share_encoder_decoder_embeddings"]   # transformers untied the copies
    assert _check_int8(m, marian["int8"], srcs,
                       [(m.encoder_embed, "encoder/embeddings_0/weight"),
                        (m.decoder_embed, "decoder/embeddings/weight")]) == 21
    # CTranslate2 rounds w * (127 / max|w|), fastattn w / (max|w| / 127): the same integers
    # but for ties, so the folder's int8 model is fastattn's own int8 model of the float32
    # folder, but for a rare integer and scales within a float32 rounding
    own = fastattn.Seq2SeqTransformer.from_pretrained(marian["float32"], quantize="int8")
    same = total = 0
    for lname, layer in m._layers.items():
        theirs = {n: a for n, a, _, _ in own._layers[lname]._named_params()}
        for n, w, _, _ in layer._named_params():
            if isinstance(w, fastattn._quant.Int8Weight):
                same += (w.int8() == theirs[n].int8()).sum()
                total += w.N * w.K
                assert np.allclose(w.scale, theirs[n].scale, rtol=1e-6, atol=0)
    assert total > 40000 and same >= total - 5
    _, ids, mask = sources
    mine, theirs = m.encode(ids, mask), own.encode(ids, mask)
    assert np.linalg.norm(mine - theirs) <= 1e-5 * np.linalg.norm(theirs)
    kw = dict(attention_mask=mask, num_beams=1, max_new_tokens=30)
    out = m.generate(ids, **kw)
    with pytest.raises(ValueError, match="dtype=float64: .* holds int8 weights"):
        fastattn.Seq2SeqTransformer.from_pretrained(marian["int8"], dtype=np.float64)
    again = fastattn.Seq2SeqTransformer.from_pretrained(marian["int8"], quantize="int8")
    assert np.array_equal(again.generate(ids, **kw), out)
    # int8_float16: the same integers, the other parameters in float16
    m16 = fastattn.Seq2SeqTransformer.from_pretrained(marian["int8_float16"])
    assert _check_int8(m16, marian["int8_float16"], srcs,
                       [(m16.encoder_embed, "encoder/embeddings_0/weight"),
                        (m16.decoder_embed, "decoder/embeddings/weight")]) == 21
    a, b = m16.state_dict(), m.state_dict()
    for k in ("model.encoder.layers.0.fc1.bias", "model.decoder.layers.1.final_layer_norm.weight"):
        assert np.array_equal(a[k], b[k].astype(np.float16).astype(np.float32)), k


@pytest.mark.parametrize("model_type", ["bart", "m2m_100"])
def test_bart_family_folders(tmp_path, model_type):
    """BART (post-norm, embedding LayerNorm, learned positions offset by 2) and M2M100
    (pre-norm, sinusoids counted from the pad id): CTranslate2's conversion decodes as the
    Hugging Face folder and as CTranslate2."""
    from seq2seq_checkpoints import IDS, make_checkpoint, padded_sources
    ids = IDS[model_type]
    hf = str(tmp_path / "hf")
    extra = {"normalize_before": False} if model_type == "bart" else {}
    make_checkpoint(hf, model_type, tied=False, forced_eos_token_id=None, **extra)
    sharpen(hf)
    tokens = {ids["pad_token_id"]: "<pad>", ids["eos_token_id"]: "</s>",
              ids["bos_token_id"]: "<s>", 3: "<unk>"}
    ct2 = convert(hf, str(tmp_path / "ct2"), "float32", tokens=tokens)
    a = fastattn.Seq2SeqTransformer.from_pretrained(ct2)
    b = fastattn.Seq2SeqTransformer.from_pretrained(hf)
    assert a.config["model_type"] == model_type
    src, mask = padded_sources(model_type, np.random.default_rng(0), [9, 7, 5, 9, 4, 8])
    kw = dict(attention_mask=mask, num_beams=1, max_new_tokens=20, min_new_tokens=3)
    got = a.generate(src, **kw)
    assert np.array_equal(got, b.generate(src, **kw))
    toks, index = ct2_tokens(ct2, rows(src, mask))
    res = ctranslate2.Translator(ct2, compute_type="float32").translate_batch(
        toks, beam_size=1, max_decoding_length=20, min_decoding_length=3)
    ours = _strip(got, ids["eos_token_id"])
    assert ours == [[index[t] for t in r.hypotheses[0]] for r in res]
    assert len({t for r in ours for t in r}) > 6


# -- encoders --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def minilm_ct2(minilm, tmp_path_factory):
    """CTranslate2's float32 and int8 conversions of all-MiniLM-L6-v2, tokenizer.json copied
    by the converter and the sentence-transformers files beside it (what a user copies)."""
    root = tmp_path_factory.mktemp("ct2-minilm")
    out = {}
    for q in ("float32", "int8"):
        folder = convert(minilm, str(root / q), q, copy_files=["tokenizer.json"])
        for name in ("modules.json", "sentence_bert_config.json", "tokenizer_config.json",
                     "special_tokens_map.json"):
            shutil.copy(os.path.join(minilm, name), folder)
        shutil.copytree(os.path.join(minilm, "1_Pooling"), os.path.join(folder, "1_Pooling"))
        out[q] = folder
    return out


SENTENCES = ["A man is eating food.", "A man is riding a horse on a sunny beach today.",
             "fastattn reads CTranslate2 folders", "x"]


def test_minilm_is_the_hugging_face_model(minilm, minilm_ct2):
    ct = fastattn.SentenceEncoder(minilm_ct2["float32"])
    hf = fastattn.SentenceEncoder(minilm)
    assert np.array_equal(ct.encode(SENTENCES), hf.encode(SENTENCES))
    assert ct.normalize and ct.max_seq_length == hf.max_seq_length == 256
    ids, types = ct.tokenize(SENTENCES)
    S = max(map(len, ids))
    batch = np.array([r + [0] * (S - len(r)) for r in ids])
    mask = np.array([[1] * len(r) + [0] * (S - len(r)) for r in ids])
    ours = ct.model(batch, mask)
    out = ctranslate2.Encoder(minilm_ct2["float32"], compute_type="float32").forward_batch(
        [list(r) for r in ids])
    theirs = np.array(out.last_hidden_state)
    for i, r in enumerate(ids):
        assert np.abs(ours[i, :len(r)] - theirs[i, :len(r)]).max() < 2e-5


def test_minilm_int8_keeps_its_integers(minilm, minilm_ct2):
    enc = fastattn.SentenceEncoder(minilm_ct2["int8"])
    m = enc.model
    assert m.quantize == "int8"
    b = ModelBin(os.path.join(minilm_ct2["int8"], "model.bin"))
    ck = b.checkpoint()
    for i, layer in enumerate(m.layers):
        s = f"encoder/layer_{i}"
        for p, var in (("self_attn.in_proj_weight", "self_attention/linear_0"),
                       ("self_attn.out_proj.weight", "self_attention/linear_1"),
                       ("linear1.weight", "ffn/linear_0"), ("linear2.weight", "ffn/linear_1")):
            w = dict((n, a) for n, a, _, _ in layer._named_params())[p]
            assert isinstance(w, fastattn._quant.Int8Weight)
            assert np.array_equal(w.int8(), ck.read(f"{s}/{var}/weight"))
            assert np.array_equal(w.scale[:w.N], np.float32(1) / ck.read(f"{s}/{var}/weight_scale"))
    table = m.embeddings._params["weight"]
    assert np.array_equal(table.q, ck.read("encoder/embeddings_0/weight"))
    # the token types, int8 in the file, computed in float: w_q / scale
    tt = m.embeddings._params["token_type_weight"]
    assert np.array_equal(tt, ck.read("encoder/embeddings_1/weight").astype(np.float32) /
                          ck.read("encoder/embeddings_1/weight_scale")[:, None])
    f32 = fastattn.SentenceEncoder(minilm).encode(SENTENCES)
    cos = (enc.encode(SENTENCES) * f32).sum(axis=1)
    assert cos.min() > 0.98


# -- what is refused -------------------------------------------------------------------------------

def _copy(folder, tmp_path, name="copy"):
    dst = str(tmp_path / name)
    shutil.copytree(folder, dst)
    return dst


def _rewrite(folder, change=None, add=()):
    """Rewrite folder/model.bin with `change(name, array) -> array` and variables `add`."""
    path = os.path.join(folder, "model.bin")
    variables, aliases = variables_of(path)
    b = ModelBin(path)
    if change is not None:
        variables = [(n, change(n, a), k) for n, a, k in variables]
    with open(path, "wb") as f:
        f.write(model_bin(variables + list(add), aliases, spec=b.spec, revision=b.revision))


def test_other_kinds_name_their_class(marian, minilm_ct2):
    with pytest.raises(ValueError, match="holds a TransformerEncoderSpec: load it with "
                                         "fastattn.EncoderModel"):
        fastattn.Seq2SeqTransformer.from_pretrained(minilm_ct2["float32"])
    with pytest.raises(ValueError, match="holds a TransformerSpec: load it with "
                                         "fastattn.Seq2SeqTransformer"):
        fastattn.WhisperModel.from_pretrained(marian["float32"])
    with pytest.raises(ValueError, match="holds a TransformerSpec: load it with "
                                         "fastattn.Seq2SeqTransformer"):
        fastattn.EncoderModel.from_pretrained(marian["float32"])
    with pytest.raises(ValueError, match="model.bin is an encoder: use fastattn.SentenceEncoder"):
        fastattn.Translator(minilm_ct2["float32"])
    with pytest.raises(ValueError, match="model.bin is a translation model: use "
                                         "fastattn.Translator"):
        fastattn.SentenceEncoder(marian["float32"])


def test_options_fastattn_lacks_are_refused(marian, tmp_path):
    load = fastattn.Seq2SeqTransformer.from_pretrained
    d = _copy(marian["float32"], tmp_path, "extra")
    _rewrite(d, add=[("encoder/layer_0/self_attention/relative_position_keys",
                      np.zeros((5, 8), np.float32))])
    with pytest.raises(ValueError, match="variable 'encoder/layer_0/self_attention/"
                                         "relative_position_keys' is not read by fastattn"):
        load(d)
    d = _copy(marian["float32"], tmp_path, "alibi")
    _rewrite(d, lambda n, a: np.int8(1) if n == "decoder/alibi" else a)
    with pytest.raises(ValueError, match=r"model.bin: decoder/alibi=1 is not supported"):
        load(d)
    d = _copy(marian["float32"], tmp_path, "act")
    _rewrite(d, lambda n, a: np.int8(4) if n.endswith("/activation") else a)
    with pytest.raises(ValueError, match="encoder/activation=4: the activation GELUSigmoid is "
                                         "not supported"):
        load(d)
    d = _copy(marian["float32"], tmp_path, "window")
    _rewrite(d, add=[("decoder/sliding_window", np.int32(4))])
    with pytest.raises(ValueError, match="variable 'decoder/sliding_window' is not read"):
        load(d)
    d = _copy(marian["float32"], tmp_path, "config")
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["quantization_type"] = 1
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    with pytest.raises(ValueError, match="config.json: field 'quantization_type' is not "
                                         "supported"):
        load(d)
    d = _copy(marian["float32"], tmp_path, "vocab")
    voc = json.load(open(os.path.join(d, "shared_vocabulary.json")))
    json.dump(voc[:-3], open(os.path.join(d, "shared_vocabulary.json"), "w"))
    with pytest.raises(ValueError, match=r"shared_vocabulary has \d+ tokens, the embedding "
                                         r"\d+ rows"):
        load(d)
    d = _copy(marian["float32"], tmp_path, "novocab")
    os.remove(os.path.join(d, "shared_vocabulary.json"))
    with pytest.raises(FileNotFoundError, match="no shared_vocabulary.json"):
        load(d)
    d = _copy(marian["float32"], tmp_path, "cut")
    raw = open(os.path.join(d, "model.bin"), "rb").read()
    open(os.path.join(d, "model.bin"), "wb").write(raw[:len(raw) // 2])
    with pytest.raises(ValueError, match="model.bin: variable .* the file is truncated"):
        fastattn.Translator(d)


def test_convert(marian, minilm_ct2, tmp_path):
    """``fastattn convert`` of a CTranslate2 translation folder: a fastattn folder a
    Translator loads (the same translations); an encoder folder is refused (not yet)."""
    from fastattn.models.convert import convert
    out = str(tmp_path / "fa")
    assert convert(marian["float32"], out, "int8") == "Seq2SeqTransformer"
    texts = ["poka gine sune baren", "laßto ba ren gi,"]
    assert fastattn.Translator(out).translate(texts) == \
        fastattn.Translator(marian["float32"], quantize="int8").translate(texts)
    with pytest.raises(ValueError, match="is a CTranslate2 encoder folder: converting it is not "
                                         "supported yet"):
        convert(minilm_ct2["float32"], str(tmp_path / "enc"), None)
    # nor is save_pretrained of an encoder loaded from it: refused before anything is written
    model = fastattn.EncoderModel.from_pretrained(minilm_ct2["float32"])
    with pytest.raises(ValueError, match="is a CTranslate2 encoder folder: saving a model"):
        model.save_pretrained(str(tmp_path / "saved"))
    assert not (tmp_path / "saved").exists()
    with pytest.raises(ValueError, match=r"quantize='bfloat16': .* holds int8 weights"):
        fastattn.EncoderModel.from_pretrained(minilm_ct2["int8"], quantize="bfloat16")
