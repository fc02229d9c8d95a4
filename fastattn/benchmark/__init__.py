"""The engine behind `fastattn bench`: fastattn side by side with its peers, on one machine.

Design:
- Systems: fastattn; the NumPy formula (max-subtracted softmax(q @ k^T * scale) @ v, NumPy's BLAS
  limited to the same thread budget with threadpoolctl); PyTorch's scaled_dot_product_attention
  (torch.set_num_threads, inference_mode); ONNX Runtime on the CPU provider (intra_op_num_threads):
  its fused com.microsoft MultiHeadAttention and a plain MatMul/Softmax/MatMul graph, both called
  through IOBinding on preallocated buffers so no copy is timed. A system that is not installed is
  skipped with the reason, never an error.
- Every system gets the same random inputs, laid out the way it wants them (done before timing).
  Outputs are compared with the NumPy formula (or fastattn's when the formula is skipped).
- One shape at a time. Each system is warmed up, then run once for its memory (process peak RSS
  above the level just before the call: /proc/self/clear_refs + VmHWM on Linux, tracemalloc for the
  NumPy formula elsewhere), then timed in interleaved rounds A, B, C, A, B, C, ... with a 0.15 s
  sleep between systems: on few cores, worker threads of one library keep spinning ~0.1 s after a
  call and would steal a core from the next. A sample times `inner` back-to-back calls when one call
  is short; we report the median and the minimum of the samples.
- GFLOP/s counts 2 * B*H * (E + Ev) per allowed (query, key) pair: 4*B*H*L*S*E without a mask,
  L(L+1)/2 pairs instead of L*S with the causal mask (about half).
- "% peak" is a share of NumPy's GEMM rate measured at start-up on one thread times the thread count
  (SGEMM for float32, DGEMM for float64): a measured stand-in for, and slightly under, the FMA limit.
- Memory is estimated before anything is allocated: a shape whose inputs and outputs would not fit
  is refused; the systems that materialise the (L, S) score matrix are skipped when it would not fit
  (and, with --quick, when it would be big or slow), with the estimate in the message.

Layout:
- _systems: the systems (fastattn and its peers) and the NumPy formula.
- _measure: the run's settings, shapes and their sizes, the plan made before allocating, peak
  memory, the GEMM peak, and the per-case loop (warm-up, interleaved samples, output check).
- _report: the environment (also `fastattn info`), the progress bar, the tables and the --plot.
- _cli: the argparse types and options, and run_bench (options in, report out).
- _models, _model_child, _checkpoints: `fastattn bench --models` (also the default run, after the
  kernel table): a base-size Marian's generation and a MiniLM-shaped encoder on random checkpoints
  written here with NumPy, against transformers, CTranslate2 and ONNX Runtime, one child process
  per system (see _models' docstring).
"""
from ._cli import add_arguments, parse_shape, run_bench
from ._measure import Shape, allowed_pairs, flop_count
from ._report import environment, format_environment
from ._systems import SYSTEMS, numpy_attention

__all__ = [
    "add_arguments",
    "run_bench",
    "environment",
    "format_environment",
    "SYSTEMS",
    "Shape",
    "parse_shape",
    "allowed_pairs",
    "flop_count",
    "numpy_attention",
]
