"""The family registry (fastattn/models/registry.py): every family once, the interface each
kind needs, and the model classes, fastattn.text and `fastattn convert` reading it."""
import ast
import json
import os

import pytest

import fastattn
from fastattn.models import convert, registry
from fastattn.models.family import KINDS, Entry, Family

SEQ2SEQ = ("marian", "bart", "mbart", "pegasus", "m2m_100", "t5", "mt5")
ENCODERS = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "mpnet", "modernbert")
SPEECH = ("whisper",)
ALL = SEQ2SEQ + ENCODERS + SPEECH
# the smallest config.json each family reads (defaults for the rest)
SMALL = dict(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
             encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=24,
             decoder_ffn_dim=24, max_position_embeddings=32, pad_token_id=1, eos_token_id=2,
             decoder_start_token_id=2, bos_token_id=0)
RAW = {t: SMALL for t in SEQ2SEQ}
RAW["t5"] = RAW["mt5"] = dict(vocab_size=40, d_model=16, d_kv=4, d_ff=24, num_layers=2,
                              num_heads=4, relative_attention_num_buckets=8,
                              relative_attention_max_distance=20)
RAW["pegasus"] = {k: v for k, v in SMALL.items() if k != "bos_token_id"}
RAW["whisper"] = dict(vocab_size=40, num_mel_bins=8, d_model=16, encoder_layers=1,
                      decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                      encoder_ffn_dim=24, decoder_ffn_dim=24, max_source_positions=10,
                      max_target_positions=16, pad_token_id=30, bos_token_id=30,
                      eos_token_id=30, decoder_start_token_id=31)
FAMILY_MODULES = {"bart.py", "marian.py", "t5.py", "bert.py", "mpnet.py", "modernbert.py",
                  "whisper.py", "registry.py", "family.py"}
# a kind's model class (the families' specs are its keywords, but the encoder's)
CLASSES = {"seq2seq": fastattn.Seq2SeqTransformer, "speech": fastattn.WhisperModel}
ROOT = os.path.dirname(fastattn.__file__)


def test_the_registered_model_types():
    assert registry.model_types("seq2seq") == SEQ2SEQ
    assert registry.model_types("encoder") == ENCODERS
    assert registry.model_types("speech") == SPEECH
    with pytest.raises(ValueError, match="kind must be one of"):
        registry.model_types("decoder")


def test_each_family_once_with_its_kinds_interface():
    seen = set()
    for fam in registry.FAMILIES:
        assert isinstance(fam, Family) and fam.kind in KINDS and fam.title
        assert fam.model_types and not seen & set(fam.model_types)
        seen |= set(fam.model_types)
        for mt in fam.model_types:
            assert registry.family(mt) is fam and registry.family(mt, fam.kind) is fam
            other = next(k for k in KINDS if k != fam.kind)
            assert registry.family(mt, other) is None
        if fam.kind in CLASSES:
            assert callable(fam.state_dict) and callable(fam.untie)
        if fam.kind == "seq2seq":
            assert hasattr(fam, "tokenizer") and hasattr(fam, "spm_tokenizer")
        elif fam.kind == "encoder":
            assert fam.anchor and fam.layer_prefix
    assert registry.family("gpt2") is None and registry.family(None) is None
    assert registry.family(["bert"]) is None


@pytest.mark.parametrize("model_type", ALL)
def test_config_readers_and_name_maps(model_type):
    """Each family reads a config.json of its type into its model class's spec, and maps
    names to (checkpoint, network, rows, shape, part) entries of the network's parameters."""
    fam = registry.family(model_type)
    raw = dict(RAW.get(model_type, {}), model_type=model_type)
    if fam.kind == "encoder":
        raw.update(vocab_size=40, hidden_size=16, num_attention_heads=4, num_hidden_layers=2,
                   intermediate_size=24, dim=16, n_heads=4, n_layers=2, hidden_dim=24,
                   pad_token_id=1)
        if model_type == "distilbert":
            raw = {k: v for k, v in raw.items() if k not in ("hidden_size", "num_attention_heads",
                                                             "num_hidden_layers",
                                                             "intermediate_size")}
    spec = fam.read_config(raw, "config.json")
    entries = fam.name_map(spec)
    assert entries and all(isinstance(e, Entry) for e in entries)
    if fam.kind in CLASSES:
        gen = spec.pop("generation_config")
        assert isinstance(gen, dict)
        m = CLASSES[fam.kind](**spec)                  # the spec is the class's keywords
        assert m.config["model_type"] == model_type and m._family is fam
        assert list(m.state_dict()) == [e.checkpoint for e in entries]
    else:
        assert spec.model_type == model_type
        model = fastattn.EncoderModel(spec)
        for e in entries:                              # every entry is a parameter of the net
            model._array(e.network)


def test_unknown_model_type_messages():
    with pytest.raises(ValueError, match=r"model_type must be one of \['bart', 'm2m_100', "):
        fastattn.Seq2SeqTransformer(model_type="bert")
    with pytest.raises(ValueError, match=r"got 'whisper' .*load it with fastattn.WhisperModel"):
        fastattn.Seq2SeqTransformer(model_type="whisper")


@pytest.mark.parametrize("model_type,cls", [(t, "Seq2SeqTransformer") for t in SEQ2SEQ] +
                         [(t, "EncoderModel") for t in ENCODERS] + [("gpt2", "EncoderModel")] +
                         [(t, "WhisperModel") for t in SPEECH])
def test_convert_takes_the_model_class_from_the_registry(tmp_path, model_type, cls):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    assert convert.model_class(tmp_path).__name__ == cls


def test_text_reads_the_registry(tmp_path):
    from fastattn.text._common import model_family
    for mt in ALL:
        (tmp_path / "config.json").write_text(json.dumps({"model_type": mt}))
        kind = registry.family(mt).kind
        if kind != "speech":                           # (no text class runs a speech model)
            assert model_family(str(tmp_path), kind) is registry.family(mt)
        for other in ("seq2seq", "encoder"):
            if other != kind:
                with pytest.raises(ValueError, match=f"model_type='{mt}' is"):
                    model_family(str(tmp_path), other)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    for other in ("seq2seq", "encoder"):
        with pytest.raises(ValueError, match="a speech model: use fastattn.WhisperModel"):
            model_family(str(tmp_path), other)


def _modules():
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                yield os.path.join(folder, f)


def test_nothing_else_branches_on_model_type():
    """Outside the family modules and the registry, no comparison looks at a model_type and no
    table lists registered model types (a copy of the registry)."""
    registered = set(ALL)
    found = []
    for path in _modules():
        rel = os.path.relpath(path, ROOT)
        if os.path.dirname(rel) == "models" and os.path.basename(rel) in FAMILY_MODULES:
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and "model_type" in ast.unparse(node):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                items = node.keys if isinstance(node, ast.Dict) else node.elts
                names = {e.value for e in items if isinstance(e, ast.Constant)} & registered
                if len(names) > 2:
                    found.append(f"{rel}:{node.lineno}: a table of model types {sorted(names)}")
    assert not found, "\n".join(found)


def test_seq2seq_keywords_are_its_signature():
    """_seq2seq_spec.KEYWORDS (what the keywords check reads, what a model's config holds) is
    Seq2SeqTransformer's architecture keywords, in its signature's order."""
    import inspect
    from fastattn.models import _seq2seq_spec
    names = [p.name for p in inspect.signature(fastattn.Seq2SeqTransformer).parameters.values()
             if p.kind is p.POSITIONAL_OR_KEYWORD and p.name != "generation_config"]
    assert tuple(names) == _seq2seq_spec.KEYWORDS
    m = fastattn.Seq2SeqTransformer(vocab_size=20, d_model=8, encoder_layers=1, decoder_layers=1,
                                    encoder_attention_heads=2, decoder_attention_heads=2,
                                    encoder_ffn_dim=8, decoder_ffn_dim=8)
    assert set(m.config) == set(_seq2seq_spec.KEYWORDS)
