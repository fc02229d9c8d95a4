"""sentence-transformers folders with Dense modules, written by sentence-transformers itself
(``SentenceTransformer(modules=...).save``) around a small random BERT with all-MiniLM-L6-v2's
tokenizer: the folders SentenceEncoder, ``fastattn embed`` and ``/v1/embeddings`` are compared
on (tests/text, tests/cli, tests/serve).

Each case: the Pooling mode(s), then Dense modules (out_features, torch activation class,
Dense keyword arguments) or "Dropout", and the model's Normalize, truncate_dim and default
prompt.
"""
import os
import shutil

HIDDEN = 32
MAX_SEQ_LENGTH = 40

CASES = {
    "tanh_normalize": dict(pooling="mean", dense=[(24, "Tanh", {})], normalize=True),
    "gelu": dict(pooling="mean", dense=[(16, "GELU", {})]),
    "stacked": dict(pooling="mean", dense=[(24, "ReLU", {}), (12, "Sigmoid", {"bias": False})],
                    normalize=True),
    # a pooling_mode list out of the flags' order, residuals (identity and projected), Dropout
    "residual": dict(pooling=("mean", "cls"), dense=[(64, "Identity", {"use_residual": True}),
                                                     "Dropout",
                                                     (20, "SiLU", {"use_residual": True})]),
    "more_activations": dict(pooling="max", dense=[(24, "LeakyReLU", {}), (24, "ELU", {}),
                                                   (16, "Softplus", {}), (16, "Mish", {})],
                             normalize=True),
    "truncated": dict(pooling="mean", dense=[(24, "Tanh", {})], normalize=True,
                      truncate_dim=10),
    "prompt": dict(pooling="mean", dense=[(16, "Hardswish", {})], prompt="query: "),
}

SENTENCES = [
    "A man is eating food.", "A man is eating a piece of bread.", "", "x",
    "The girl is carrying a baby.", "Ünïcödé àccents, café and 中文字符 mixed in.",
    "don't stop-believing, ok?", " ".join(["a very long text"] * 30),   # past MAX_SEQ_LENGTH
    "Two men pushed carts through the woods.", "A woman is playing violin.",
]


def write_base(path, minilm, seed=0):
    """A random BertModel (save_pretrained) with all-MiniLM-L6-v2's tokenizer files."""
    import torch
    import transformers
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=HIDDEN, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64,
                                  max_position_embeddings=64)
    torch.manual_seed(seed)
    transformers.BertModel(cfg, add_pooling_layer=False).save_pretrained(path)
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(os.path.join(minilm, f), path)
    return path


def st_modules():
    """sentence-transformers' module classes (their home since its 6.0, else the old one)."""
    try:
        from sentence_transformers.sentence_transformer import modules
    except ImportError:
        from sentence_transformers import models as modules
    return modules


def write_case(path, base, case, seed=1):
    """Save the folder of `case` (a CASES value) around the model folder `base`; returns the
    SentenceTransformer that saved it."""
    import torch
    from sentence_transformers import SentenceTransformer
    models = st_modules()
    torch.manual_seed(seed)
    pooling = case["pooling"]
    mods = [models.Transformer(base, max_seq_length=MAX_SEQ_LENGTH),
            models.Pooling(HIDDEN, pooling_mode=pooling)]
    width = HIDDEN * (1 if isinstance(pooling, str) else len(pooling))
    for spec in case["dense"]:
        if spec == "Dropout":
            mods.append(models.Dropout(0.1))
            continue
        out, act, kw = spec
        mods.append(models.Dense(width, out, activation_function=getattr(torch.nn, act)(), **kw))
        width = out
    if case.get("normalize"):
        mods.append(models.Normalize())
    prompt = case.get("prompt")
    st = SentenceTransformer(modules=mods, device="cpu", truncate_dim=case.get("truncate_dim"),
                             prompts={"query": prompt} if prompt else None,
                             default_prompt_name="query" if prompt else None)
    st.save(path)
    return st


def write_all(root, minilm):
    """{case name: folder} for every case, under `root`."""
    base = write_base(os.path.join(root, "base"), minilm)
    out = {}
    for name, case in CASES.items():
        out[name] = os.path.join(root, name)
        write_case(out[name], base, case)
    return out
