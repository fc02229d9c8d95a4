"""A row's result does not depend on the padding its batch gives it: a sequence alone and the
same sequence padded to a longer batch length give the same bits at its real positions, on
either side of the attention kernel's 16-row threshold (at most 16 query rows read K and V in
place; full-sequence passes never take that path)."""
import numpy as np
import pytest

import fastattn
from encoder_checkpoints import padded_batch, write_numpy_bert


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,S", [(5, 16), (7, 40), (16, 17), (13, 130)])
def test_encoder_rows_alone_equal_padded(tmp_path, dtype, n, S):
    write_numpy_bert(tmp_path, seed=2, max_position_embeddings=160)
    enc = fastattn.EncoderModel.from_pretrained(tmp_path, dtype=dtype)
    ids, mask = padded_batch(np.random.default_rng(0), 60, [n, S], S)
    batch_h = enc(ids, attention_mask=mask)
    batch_e = enc.embed(ids, attention_mask=mask)
    alone_h = enc(ids[:1, :n])
    np.testing.assert_array_equal(batch_h[0, :n], alone_h[0])
    np.testing.assert_array_equal(batch_e[0], enc.embed(ids[:1, :n])[0])


@pytest.mark.parametrize("n,S", [(6, 12), (9, 33)])
def test_seq2seq_encoder_and_logits_alone_equal_padded(n, S):
    m = fastattn.Seq2SeqTransformer(vocab_size=50, d_model=32, encoder_layers=2,
                                    decoder_layers=2, encoder_attention_heads=4,
                                    decoder_attention_heads=4, encoder_ffn_dim=48,
                                    decoder_ffn_dim=48, max_position_embeddings=64, seed=1)
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 48, size=(2, S))
    mask = np.ones_like(ids)
    mask[0, n:] = 0
    ids[0, n:] = m.pad_id
    np.testing.assert_array_equal(m.encode(ids, mask)[0, :n], m.encode(ids[:1, :n])[0])
    dec = rng.integers(1, 48, size=(2, 5))
    np.testing.assert_array_equal(m.logits(ids, dec, mask)[0], m.logits(ids[:1, :n], dec[:1])[0])


def test_nn_encoder_with_key_padding_mask():
    layer = fastattn.TransformerEncoderLayer(32, 4, 48, seed=0)
    enc = fastattn.TransformerEncoder(layer, 2)
    x = np.random.default_rng(2).standard_normal((2, 30, 32)).astype(np.float32)
    pad = np.zeros((2, 30), bool)
    pad[0, 9:] = True
    np.testing.assert_array_equal(enc(x, src_key_padding_mask=pad)[0, :9], enc(x[:1, :9])[0])
