"""The systems `fastattn bench` compares: fastattn and its peers, each behind the same small
interface (unavailable, version, prepare -> Prepared), and the NumPy formula itself."""
import math

import numpy as np

# ---------------------------------------------------------------------------------------------
# names (--systems), in the order of the report's columns and lines, and their labels

SYSTEMS = ("fastattn", "numpy", "torch", "ort-mha", "ort-graph")
LABELS = {
    "fastattn": "fastattn",
    "numpy": "NumPy formula",
    "torch": "PyTorch SDPA",
    "ort-mha": "ORT MultiHeadAttention",
    "ort-graph": "ORT MatMul/Softmax graph",
}


# ---------------------------------------------------------------------------------------------
# the systems. prepare(q, k, v, causal) -> Prepared; inputs are (B, H, L|S, E), C-contiguous.

class Prepared:
    """run(): one timed call; fetch(): the last output as (B, H, L, Ev); memory_run: for the memory
    measurement when it must differ from run (ONNX Runtime's arena would hide the working set)."""

    def __init__(self, run, fetch, memory_run=None):
        self.run = run
        self.fetch = fetch
        self.memory_run = memory_run or run


class FastAttn:
    name = "fastattn"
    materialises_scores = False

    def __init__(self, threads):
        self.threads = threads

    def unavailable(self, dtype):
        return None

    def version(self):
        from .._version import __version__
        return __version__

    def prepare(self, q, k, v, causal):
        from ..functional import scaled_dot_product_attention as sdpa
        last = [None]
        threads = self.threads

        def run():
            last[0] = sdpa(q, k, v, is_causal=causal, n_threads=threads)

        return Prepared(run, lambda: last[0])


def numpy_attention(q, k, v, scale, forbid=None):
    """The NumPy formula, as lean as NumPy allows: one (B, H, L, S) score buffer, updated in place.

    forbid: optional (L, S) bool, True where a query may not attend (the causal upper triangle).
    """
    s = np.matmul(q, k.swapaxes(-1, -2))  # (B, H, L, S): what the fused kernel never stores
    s *= scale
    if forbid is not None:
        np.copyto(s, -np.inf, where=forbid)
    s -= s.max(axis=-1, keepdims=True)  # subtract the row max only for numerical stability
    np.exp(s, out=s)
    denom = s.sum(axis=-1, keepdims=True)
    out = np.matmul(s, v)
    out /= denom
    return out


class NumpyFormula:
    name = "numpy"
    materialises_scores = True
    score_copies = 1

    def __init__(self, threads):
        self.threads = threads

    def unavailable(self, dtype):
        return None

    def version(self):
        return np.__version__

    def prepare(self, q, k, v, causal):
        L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
        scale = q.dtype.type(1.0 / math.sqrt(E))
        forbid = np.triu(np.ones((L, S), dtype=bool), k=1) if causal else None
        last = [None]

        def run():
            last[0] = numpy_attention(q, k, v, scale, forbid)

        return Prepared(run, lambda: last[0])


class TorchSDPA:
    name = "torch"
    materialises_scores = False

    def __init__(self, threads):
        self.threads = threads
        try:
            import torch
        except ImportError:
            self.torch = None
        else:
            self.torch = torch
            torch.set_num_threads(threads)

    def unavailable(self, dtype):
        if self.torch is None:
            return "PyTorch is not installed (pip install torch)"
        return None

    def version(self):
        return self.torch.__version__

    def prepare(self, q, k, v, causal):
        torch = self.torch
        sdpa = torch.nn.functional.scaled_dot_product_attention
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))  # shares the NumPy buffers
        last = [None]

        def run():
            with torch.inference_mode():
                last[0] = sdpa(tq, tk, tv, is_causal=causal)

        return Prepared(run, lambda: last[0].numpy())


class _OnnxRuntime:
    """Shared by the two ONNX Runtime systems: sessions on the CPU provider, IOBinding."""

    materialises_scores = False

    def __init__(self, threads):
        self.threads = threads
        try:
            import onnxruntime
        except ImportError:
            self.ort = None
        else:
            self.ort = onnxruntime
        try:
            import onnx
        except ImportError:
            self.onnx = None
        else:
            self.onnx = onnx

    def unavailable(self, dtype):
        if self.ort is None:
            return "ONNX Runtime is not installed (pip install onnxruntime)"
        if self.onnx is None:
            return "the onnx package, needed to build the graph, is not installed (pip install onnx)"
        return None

    def version(self):
        return self.ort.__version__

    def _session(self, model, arena=True):
        opts = self.ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = self.ort.ExecutionMode.ORT_SEQUENTIAL
        opts.enable_cpu_mem_arena = arena
        opts.log_severity_level = 3
        return self.ort.InferenceSession(model.SerializeToString(), opts,
                                         providers=["CPUExecutionProvider"])

    def _bound(self, session, inputs, out):
        binding = session.io_binding()
        for name, arr in inputs.items():
            binding.bind_cpu_input(name, arr)
        binding.bind_output("out", "cpu", 0, out.dtype, list(out.shape), out.ctypes.data)
        keep = (session, binding, inputs, out)  # ONNX Runtime holds raw pointers into these

        def run():
            keep[0].run_with_iobinding(keep[1])

        return run

    def _tensor_type(self, dtype):
        TensorProto = self.onnx.TensorProto
        return TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE

    def _model(self, nodes, inputs, outputs, initializers=()):
        h = self.onnx.helper
        graph = h.make_graph(nodes, "attention", inputs, outputs, initializer=list(initializers))
        return h.make_model(graph, opset_imports=[h.make_opsetid("", 17),
                                                  h.make_opsetid("com.microsoft", 1)])


class OrtMHA(_OnnxRuntime):
    """com.microsoft MultiHeadAttention: query (B, L, H*E); key/value (B, S, H*E), or (B, H, S, E)
    for decode (L == 1), where that layout is ONNX Runtime's fast path; output (B, L, H*E)."""

    name = "ort-mha"

    def unavailable(self, dtype):
        why = super().unavailable(dtype)
        if why is None and dtype != np.float32:
            why = "MultiHeadAttention has no float64 CPU kernel"
        return why

    def prepare(self, q, k, v, causal):
        h = self.onnx.helper
        B, H, L, E = q.shape
        S = k.shape[2]
        if causal and L != S:
            raise _Skip("its causal mask is aligned differently from fastattn's when L != S")
        ttype = self._tensor_type(q.dtype)
        kv4d = L == 1
        q3 = np.ascontiguousarray(q.transpose(0, 2, 1, 3).reshape(B, L, H * E))
        if kv4d:
            k_in, v_in = k, v
        else:
            k_in = np.ascontiguousarray(k.transpose(0, 2, 1, 3).reshape(B, S, H * E))
            v_in = np.ascontiguousarray(v.transpose(0, 2, 1, 3).reshape(B, S, H * E))
        out = np.empty((B, L, H * E), dtype=q.dtype)
        node = h.make_node("MultiHeadAttention", ["q", "k", "v"], ["out"], domain="com.microsoft",
                           num_heads=H, unidirectional=int(causal))
        model = self._model(
            [node],
            [h.make_tensor_value_info("q", ttype, list(q3.shape)),
             h.make_tensor_value_info("k", ttype, list(k_in.shape)),
             h.make_tensor_value_info("v", ttype, list(v_in.shape))],
            [h.make_tensor_value_info("out", ttype, list(out.shape))])
        inputs = {"q": q3, "k": k_in, "v": v_in}
        run = self._bound(self._session(model), inputs, out)
        memory_run = self._bound(self._session(model, arena=False), inputs, np.empty_like(out))
        memory_run()  # its warm-up: the memory call then sees the working set, not code pages
        return Prepared(run, lambda: out.reshape(B, L, H, E).transpose(0, 2, 1, 3), memory_run)


class OrtGraph(_OnnxRuntime):
    """The formula as a plain ONNX graph on (B, H, L, E): MatMul, Mul, [Add causal bias], Softmax,
    MatMul. ONNX Runtime materialises the (B, H, L, S) scores (and the probabilities)."""

    name = "ort-graph"
    materialises_scores = True
    score_copies = 2

    def prepare(self, q, k, v, causal):
        h = self.onnx.helper
        B, H, L, E = q.shape
        S = k.shape[2]
        ttype = self._tensor_type(q.dtype)
        scale = h.make_tensor("scale", ttype, [], [1.0 / math.sqrt(E)])
        nodes = [
            h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
            h.make_node("MatMul", ["q", "kt"], ["qk"]),
            h.make_node("Mul", ["qk", "scale"], ["scores"]),
        ]
        inputs = {"q": q, "k": k, "v": v}
        infos = [h.make_tensor_value_info(n, ttype, list(a.shape)) for n, a in inputs.items()]
        if causal:
            bias = np.zeros((L, S), dtype=q.dtype)
            bias[np.triu(np.ones((L, S), dtype=bool), k=1)] = -np.inf
            inputs["bias"] = bias
            infos.append(h.make_tensor_value_info("bias", ttype, [L, S]))
            nodes.append(h.make_node("Add", ["scores", "bias"], ["masked"]))
        nodes += [
            h.make_node("Softmax", ["masked" if causal else "scores"], ["p"], axis=-1),
            h.make_node("MatMul", ["p", "v"], ["out"]),
        ]
        out = np.empty((B, H, L, E), dtype=q.dtype)
        model = self._model(nodes, infos, [h.make_tensor_value_info("out", ttype, list(out.shape))],
                            [scale])
        run = self._bound(self._session(model), inputs, out)
        memory_run = self._bound(self._session(model, arena=False), inputs, np.empty_like(out))
        memory_run()
        return Prepared(run, lambda: out, memory_run)


SYSTEM_CLASSES = {"fastattn": FastAttn, "numpy": NumpyFormula, "torch": TorchSDPA,
                  "ort-mha": OrtMHA, "ort-graph": OrtGraph}


class _Skip(Exception):
    """A system cannot run this case; the message says why."""
