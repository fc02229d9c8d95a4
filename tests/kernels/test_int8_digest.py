"""The int8 models give the same bits on every CPU: bench/tools/output_digest.py's INT8 part (int8
linear layers, nn.Transformer, a Marian-layout Seq2SeqTransformer encoding, scoring and
decoding, BERT / RoBERTa, a Whisper-layout model) against the value recorded when it was
written, under every FASTATTN_ISA cap this CPU can run, in fresh processes, with 1 and 3 threads.
The same test runs on emulated AArch64 (ci/test_aarch64.sh), so one recorded value ties x86-64's
kernel sets and AArch64's neon / dotprod / i8mm variants together.

A change that alters int8 results on purpose updates INT8_DIGEST here and says why in its commit
(the value is the same on every machine, so it is recorded once)."""
import os
import subprocess
import sys

import pytest

from fastattn._kernels import _simd

INT8_DIGEST = "6e4cdf4166f8ed1a"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "bench", "tools", "output_digest.py")


def _digest(cap, threads):
    env = dict(os.environ, FASTATTN_DIGEST_INSTALLED="1")
    env.pop("FASTATTN_ISA", None)
    if cap is not None:
        env["FASTATTN_ISA"] = cap
    out = subprocess.run([sys.executable, SCRIPT, "--int8", "--threads", str(threads)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.endswith("INT8 (26 calls)"), last
    return last.split()[0]


# the lowest, a middle and the highest cap: every int8 variant and float kernel set in between
# is covered by tests/kernels/test_int8_gemm.py and test_portable_attention.py in-process
_CAPS = _simd.valid_caps()
CAPS = sorted({_CAPS[0], _CAPS[len(_CAPS) // 2], None}, key=lambda c: (c is None, str(c)))


@pytest.mark.parametrize("cap", CAPS, ids=lambda c: c or "uncapped")
def test_int8_digest_is_the_recorded_one(cap):
    assert _digest(cap, 3 if cap is None else 1) == INT8_DIGEST
