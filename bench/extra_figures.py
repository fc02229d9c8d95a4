"""Extra figures for the closing notes: float64 vs NumPy, thread scaling, per-call overhead,
peak memory at L = S = 16384, largest error vs the references."""
import sys, time, numpy as np, fastattn
sys.path.insert(0, "/work/main/tests")
from reference import sdpa_ref
from threadpoolctl import threadpool_info
print("BLAS:", [(i["internal_api"], i.get("architecture"), i["num_threads"]) for i in threadpool_info()])
rng = np.random.default_rng(0)
def med(f, n=7, warm=2):
    for _ in range(warm): f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    return np.median(ts), min(ts)
def numpy_formula(q, k, v):
    s = q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(q.shape[-1]))
    s -= s.max(-1, keepdims=True); np.exp(s, out=s); s /= s.sum(-1, keepdims=True)
    return s @ v
# float64 vs NumPy at 1x8x2048x64
q, k, v = (rng.standard_normal((1, 8, 2048, 64)) for _ in range(3))
a = med(lambda: fastattn.scaled_dot_product_attention(q, k, v)); time.sleep(0.3)
b = med(lambda: numpy_formula(q, k, v))
print(f"float64 1x8x2048x64: fastattn {a[0]*1e3:.1f} ms, NumPy formula {b[0]*1e3:.1f} ms -> {b[0]/a[0]:.2f}x (medians)")
# thread scaling float32 1x8x2048x64
q, k, v = (rng.standard_normal((1, 8, 2048, 64), dtype=np.float32) for _ in range(3))
t1 = med(lambda: fastattn.scaled_dot_product_attention(q, k, v, n_threads=1)); time.sleep(0.3)
t2 = med(lambda: fastattn.scaled_dot_product_attention(q, k, v, n_threads=2))
fl = 4 * 8 * 2048 * 2048 * 64
print(f"scaling 1x8x2048x64 f32: 1 thread {t1[0]*1e3:.1f} ms ({fl/t1[0]/1e9:.0f} GFLOP/s), 2 threads {t2[0]*1e3:.1f} ms ({fl/t2[0]/1e9:.0f} GFLOP/s) -> {t1[0]/t2[0]:.2f}x (min-based {t1[1]/t2[1]:.2f}x)")
# per-call overhead
q, k, v = (rng.standard_normal((1, 1, 16, 16), dtype=np.float32) for _ in range(3))
f = lambda: fastattn.scaled_dot_product_attention(q, k, v)
for _ in range(3000): f()
ts = []
for _ in range(30):
    t0 = time.perf_counter()
    for _ in range(1000): f()
    ts.append((time.perf_counter() - t0) / 1000)
print(f"per-call time 1x1x16x16x16 f32 (whole call): median {np.median(ts)*1e6:.1f} us, min {min(ts)*1e6:.1f} us")
# errors vs references
errs = {}
for dt in (np.float32, np.float64):
    worst = 0
    for (L, S, causal, mask) in [(300, 257, True, False), (64, 4100, False, True), (5, 5000, True, True), (513, 129, False, True)]:
        q = rng.standard_normal((2, 3, L, 64)).astype(dt); k = rng.standard_normal((2, 3, S, 64)).astype(dt); v = rng.standard_normal((2, 3, S, 48)).astype(dt)
        m = (rng.random((L, S)) > 0.3) if mask else None
        o = fastattn.scaled_dot_product_attention(q, k, v, m, is_causal=causal)
        r, _ = sdpa_ref(q, k, v, m, is_causal=causal)
        worst = max(worst, float(np.abs(o - r).max()))
    errs[np.dtype(dt).name] = worst
print("largest abs error vs float64 reference:", errs)
try:
    import torch
    torch.set_num_threads(2)
    q, k, v = (rng.standard_normal((2, 8, 333, 64), dtype=np.float32) for _ in range(3))
    m = rng.random((2, 1, 333, 333)) > 0.3
    o = fastattn.scaled_dot_product_attention(q, k, v, m)
    t = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), attn_mask=torch.from_numpy(m)).numpy()
    print("max abs diff vs torch SDPA (2x8x333x333x64, bool mask, f32):", float(np.abs(o - t).max()))
except ImportError:
    pass
# peak memory at L = S = 16384
def reset_peak():
    with open("/proc/self/clear_refs", "w") as fh: fh.write("5")
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key): return int(line.split()[1]) * 1024
q, k, v = (rng.standard_normal((1, 8, 16384, 64), dtype=np.float32) for _ in range(3))
fastattn._kernels._attention.release_workspace()
base = status("VmRSS:"); reset_peak()
t0 = time.perf_counter(); o = fastattn.scaled_dot_product_attention(q, k, v); dt_ = time.perf_counter() - t0
peak = status("VmHWM:")
print(f"L=S=16384, 8 heads, E=64, f32: {dt_:.2f} s; peak RSS above the inputs {(peak-base)/2**20:.1f} MiB "
      f"= output {o.nbytes/2**20:.1f} MiB + extra {(peak-base-o.nbytes)/2**20:.1f} MiB "
      f"(NumPy formula would need {8*16384*16384*4/2**30:.0f} GiB for the scores)")
