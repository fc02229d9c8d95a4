"""The input layer of every model: token embeddings (+ positions) (+ token types), scaled, normed.

``x = LayerNorm(scale * token[ids] + token_type[types] + position[pos])``, each part optional:

- Marian: ``sqrt(d) * token[ids] + sinusoid[t0 + t]`` (a fixed table, no norm);
- BERT: ``LayerNorm(token[ids] + token_type[types] + position[pos])`` with learned positions,
  computed in one C pass (the rows gathered, summed in that order and normalised:
  ``_kernels/_embedding.pyx``'s ``embed_layer_norm``).
"""
import numpy as np

from .._kernels import _embedding as _emb
from .._quant import Int8Rows
from .._threads import _effective_n_threads
from .._validation import check_dtype, check_eps, check_positive_int, check_real
from ._module import _init_for, _Module
from .norm import LayerNorm, _portable_layer_norm

__all__ = ["Embedding"]


class Embedding(_Module):
    """Token (+ position) (+ token type) embeddings, times `scale`, then an optional LayerNorm.

    Parameters
    ----------
    num_embeddings, embedding_dim : int
        Vocabulary size and d_model; parameter ``weight`` (num_embeddings, embedding_dim).
    positions : None, "learned" or ndarray (n_positions, embedding_dim)
        No positions, a learned table (parameter ``position_weight`` of ``max_positions`` rows),
        or a fixed table (sinusoids: not a parameter).
    type_vocab_size : int
        Token-type rows (parameter ``token_type_weight``); 0 for none.
    scale : float
        Multiplies the token embeddings (Marian: sqrt(d_model)).
    layer_norm_eps : float, optional
        A LayerNorm (child ``norm``) over the sum; None for none.
    """

    # quantize_('int8') stores the token table as int8 rows (Int8Rows): as accurate as the
    # float table on the real all-MiniLM-L6-v2 (docs/int8.md) and a quarter of its memory
    _EMBED_PARAMS = ("weight",)

    def __init__(self, num_embeddings, embedding_dim, *, positions=None, max_positions=None,
                 type_vocab_size=0, scale=1.0, layer_norm_eps=None, norm_bias=True,
                 dtype=np.float32, seed=None, _init=None):
        V = check_positive_int(num_embeddings, "num_embeddings")
        d = check_positive_int(embedding_dim, "embedding_dim")
        dtype = check_dtype(dtype)
        init = _init_for(seed, dtype, _init)
        self.num_embeddings, self.embedding_dim = V, d
        self.scale = dtype.type(check_real(scale, "scale"))
        self._params = {"weight": init.xavier((V, d))}
        self.position_table = None
        if isinstance(positions, str) and positions == "learned":
            P = check_positive_int(max_positions, "max_positions")
            self._params["position_weight"] = init.xavier((P, d))
        elif positions is not None:
            table = np.asarray(positions)
            if table.ndim != 2 or table.shape[1] != d:
                raise ValueError(f"positions must be 'learned', None or a (n, {d}) table, got "
                                 f"shape {table.shape}")
            self.position_table = np.ascontiguousarray(table, dtype=dtype)
        if type_vocab_size:
            self._params["token_type_weight"] = init.xavier(
                (check_positive_int(type_vocab_size, "type_vocab_size"), d))
        self._children = {}
        self.norm = None
        if layer_norm_eps is not None:
            self.norm = LayerNorm(d, check_eps(layer_norm_eps, "layer_norm_eps"),
                                  bias=norm_bias, dtype=dtype, _init=init)
            self._children["norm"] = self.norm
        self._config = {"num_embeddings": V, "embedding_dim": d,
                        "positions": "learned" if "position_weight" in self._params else None,
                        "max_positions": max_positions, "type_vocab_size": int(type_vocab_size),
                        "scale": float(self.scale), "layer_norm_eps": layer_norm_eps,
                        "dtype": dtype.name}

    @property
    def weight(self):
        return self._params["weight"]

    def _positions(self):
        """The position table (n, d): the learned parameter or the fixed table (or None)."""
        return self._params.get("position_weight", self.position_table)

    def _forward(self, ids, start=0, position_ids=None, token_type_ids=None, keep=None,
                 n_threads=None):
        """ids (B, T) int -> (B*T, d) (or the rows `keep` of it, flat indices).

        Positions: rows ``start .. start + T - 1`` of the table for every sequence, or
        `position_ids` (B, T) (RoBERTa counts them past the padding). token_type_ids (B, T) or
        None. The caller has checked every id against its table.
        """
        B, T = ids.shape
        d = self.embedding_dim
        table = self._positions()
        types = self._params.get("token_type_weight")
        weight = self._params["weight"]
        if isinstance(weight, Int8Rows):
            # int8 rows: the rows looked up are dequantized first (each on its own), then
            # everything below runs on them as on a float table, ids becoming row numbers
            weight = weight.take(np.ascontiguousarray(ids.reshape(-1), dtype=np.intp))
            ids = np.arange(B * T, dtype=np.intp).reshape(B, T)
        if self.norm is not None and self.scale == 1 and table is not None:
            # one C pass: gather, sum in a fixed order, normalise (needs flat position ids)
            pos = np.broadcast_to(np.arange(start, start + T)[None, :] if position_ids is None
                                  else position_ids, (B, T)).reshape(-1)
            flat = ids.reshape(-1)
            tt = None if token_type_ids is None or types is None else token_type_ids.reshape(-1)
            if keep is not None:
                flat, pos = flat[keep], pos[keep]
                tt = None if tt is None else tt[keep]
            flat, pos = (np.ascontiguousarray(a, dtype=np.intp) for a in (flat, pos))
            if tt is not None:
                tt = np.ascontiguousarray(tt, dtype=np.intp)
            if self.quantize == "int8" and self.dtype == np.float32:
                # an int8 model: the same sums in the same order, then the int8 layers'
                # LayerNorm (the same bits on every CPU: docs/int8.md)
                x = np.take(weight, flat, axis=0)
                if types is not None:
                    x += np.take(types, np.zeros_like(flat) if tt is None else tt, axis=0)
                return _portable_layer_norm(x, np.take(table, pos, axis=0),
                                            self.norm._params["weight"],
                                            self.norm._params.get("bias"), self.norm.eps,
                                            n_threads)
            y = np.empty((flat.shape[0], d), dtype=self.dtype)
            _emb.embed_layer_norm(weight, flat, types, tt, table, pos,
                                self.norm._params["weight"], self.norm._params.get("bias"),
                                self.norm.eps, y, _effective_n_threads(n_threads))
            return y
        x = np.take(weight, ids.reshape(-1), axis=0)                       # (B*T, d)
        if self.scale != 1:
            x *= self.scale
        if types is not None and token_type_ids is not None:
            x += np.take(types, token_type_ids.reshape(-1), axis=0)
        if table is not None:
            if position_ids is None:
                x.reshape(B, T, d)[...] += table[start:start + T]
            else:
                x += np.take(table, np.broadcast_to(position_ids, (B, T)).reshape(-1), axis=0)
        if keep is not None:
            x = x[keep]
        if self.norm is not None:
            x = self.norm._forward(x, n_threads=n_threads)
        return x
