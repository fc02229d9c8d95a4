"""A trained Marian for the int8 accuracy figures: the random checkpoints of _checkpoints.py are
not trained (their output distributions are arbitrary and, sharpened to vary, chaotic: a small
perturbation of any kind changes the path), and no trained model can be downloaded here. This
script trains one with torch + transformers on a synthetic translation task, deterministically
(fixed seeds, one thread count), and writes it as transformers writes a MarianMTModel.

The task: source sentences of 6-40 made-up words drawn with Zipf frequencies from 1000 source
words; the target is each word's translation (a fixed dictionary into 1000 target words), a
quarter of the words ambiguous (a second translation in 30% of the examples, drawn at random, so
the trained model keeps real probability mass on two candidates), a word's translation changes
with the previous source word's class (agreement across positions), and the words are written in
reversed groups of three (reordering). As in OPUS-MT the <pad> embedding row (the decoder's start)
is zero: CTranslate2 starts the decoder from a zero vector. Token ids: </s> 0, <unk> 1, source words 2..1001, target
words 1002..2001, <pad> = vocab - 1 (4095); shared embeddings tied to the output layer, as
OPUS-MT.

    python bench/train_marian.py OUT_DIR [--layers 6] [--d-model 512] [--steps 1200]
"""
import argparse
import json
import os
import time

import numpy as np

V, NS, NT, PAD, EOS = 4096, 1000, 1000, 4095, 0


class Task:
    def __init__(self, seed=1234):
        r = np.random.default_rng(seed)
        self.map1 = r.permutation(NT)
        self.map2 = r.permutation(NT)                 # the agreement form
        self.alt = r.permutation(NT)                  # the second translation
        self.ambiguous = r.random(NS) < 0.25
        self.cls = r.random(NS) < 0.5                 # a source word's class
        p = 1.0 / np.arange(1, NS + 1) ** 1.0
        self.p = p / p.sum()

    def sample(self, r):
        n = int(r.integers(6, 41))
        src = r.choice(NS, size=n, p=self.p)
        tgt = np.where(np.r_[False, self.cls[src[:-1]]], self.map2[src], self.map1[src])
        flip = self.ambiguous[src] & (r.random(n) < 0.3)
        tgt = np.where(flip, self.alt[src], tgt)
        groups = [tgt[i:i + 3][::-1] for i in range(0, n, 3)]
        return src + 2, np.concatenate(groups) + 2 + NS

    def batch(self, r, b):
        pairs = [self.sample(r) for _ in range(b)]
        ls = max(len(s) for s, _ in pairs) + 1
        lt = max(len(t) for _, t in pairs) + 1
        src = np.full((b, ls), PAD); tgt = np.full((b, lt), -100); dec = np.full((b, lt), PAD)
        for i, (s, t) in enumerate(pairs):
            src[i, :len(s)] = s; src[i, len(s)] = EOS
            tgt[i, :len(t)] = t; tgt[i, len(t)] = EOS
            dec[i, 1:len(t) + 1] = t
        return src, dec, tgt


def config(d, layers, heads, ffn):
    return {
        "model_type": "marian", "architectures": ["MarianMTModel"], "vocab_size": V,
        "decoder_vocab_size": V, "d_model": d, "encoder_layers": layers,
        "decoder_layers": layers, "encoder_attention_heads": heads,
        "decoder_attention_heads": heads, "encoder_ffn_dim": ffn, "decoder_ffn_dim": ffn,
        "max_position_embeddings": 512, "activation_function": "swish", "scale_embedding": True,
        "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True,
        "pad_token_id": PAD, "eos_token_id": EOS, "decoder_start_token_id": PAD,
        "forced_eos_token_id": None, "dropout": 0.1, "attention_dropout": 0.0,
        "activation_dropout": 0.0, "init_std": 0.02, "is_encoder_decoder": True,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch
    from transformers import MarianConfig, MarianMTModel
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    d = args.d_model
    cfg = MarianConfig(**config(d, args.layers, d // 64, 4 * d))
    model = MarianMTModel(cfg)
    with torch.no_grad():       # OPUS-MT's <pad> row is zero: the decoder starts from a zero
        model.model.shared.weight[PAD] = 0      # embedding (CTranslate2 assumes it)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0)
    warm = max(1, args.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.05, (args.steps - s) / (args.steps - warm))))
    task, r = Task(), np.random.default_rng(0)
    lossf = torch.nn.CrossEntropyLoss(ignore_index=-100, label_smoothing=0.1)
    t0 = time.time()
    for step in range(args.steps):
        src, dec, tgt = (torch.from_numpy(a) for a in task.batch(r, args.batch))
        out = model(input_ids=src, attention_mask=(src != PAD).long(), decoder_input_ids=dec)
        loss = lossf(out.logits.reshape(-1, V), tgt.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.3f} {time.time() - t0:.0f} s", flush=True)
    model.eval()
    # padding_idx keeps the embedding's gradient off the <pad> row, but the output layer is
    # tied to it and the <pad> logit's gradient moves it (2026-12-05: max |row| 0.044 after
    # 1500 steps, and CTranslate2, starting from a zero vector, then decoded another model):
    # zeroed again before saving
    with torch.no_grad():
        model.model.shared.weight[PAD] = 0
    model.save_pretrained(args.out)
    # held-out accuracy of greedy decoding against the task's most likely translation
    r2 = np.random.default_rng(99)
    src, _, tgt = task.batch(r2, 64)
    with torch.no_grad():
        g = model.generate(torch.from_numpy(src), attention_mask=(torch.from_numpy(src) != PAD).long(),
                           max_new_tokens=48, num_beams=1, do_sample=False)
    g = g.numpy()[:, 1:]
    n = min(g.shape[1], tgt.shape[1])
    real = tgt[:, :n] != -100
    acc = float(((g[:, :n] == tgt[:, :n]) & real).sum() / real.sum())
    info = {"steps": args.steps, "final_loss": float(loss.item()), "heldout_token_match": acc,
            "seconds": round(time.time() - t0)}
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump(info, f, indent=1)
    print("saved", args.out, json.dumps(info))


if __name__ == "__main__":
    main()
