#!/usr/bin/env python3
"""scripts/stress: what `app --production` does under soak, chaos, signal storms, overload and
slow clients, and a bounded fuzz. Stdlib only (asyncio clients). Loopback only; every scenario
is bounded in time and in connections, and every server is stopped before the next starts.

Prints one table (and writes it, with every number, to bench/stress.json and bench/stress.md).
"""
import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
APP = os.path.join(ROOT, "target", "release", "app")
FIX = os.path.join(ROOT, "tests", "fixtures")
TMP = os.path.join(ROOT, "bench", "tmp")
MLP = json.dumps({"inputs": [[1.0, 2.0, 3.0, 4.0]]}).encode()


def slow_body(n):
    return json.dumps({"inputs": [[n]]}).encode()


def log(msg):
    print(f"[stress {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------- server


class Server:
    """`app --production` in its own process group, JSON logs read for its events."""

    def __init__(self, model, args, shape=None, name="stress", app=None):
        os.makedirs(TMP, exist_ok=True)
        self.meta = os.path.join(TMP, f"{name}.json")
        doc = {"name": name, "model": os.path.join(FIX, model), "version": "0"}
        if shape:
            doc["input"] = {"shape": shape}
        self.doc = doc
        self.write_meta()
        env = dict(os.environ, VRAMFORK_LOG="info,vramfork::master=debug", VRAMFORK_LOG_FORMAT="json")
        for k in list(env):
            if k.startswith("VRAMFORK_") and k not in ("VRAMFORK_LOG", "VRAMFORK_LOG_FORMAT"):
                del env[k]
        self.proc = subprocess.Popen(
            [app or APP, "--production", "--metadata", self.meta, "--port", "0"] + args,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True,
            start_new_session=True)
        self.events = []
        self.port = None
        self._reader = None

    def write_meta(self):
        with open(self.meta, "w") as f:
            json.dump(self.doc, f)

    async def start(self, workers):
        loop = asyncio.get_running_loop()
        self._reader = loop.run_in_executor(None, self._read)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.port and self.pool_settled(workers):
                return self
            await asyncio.sleep(0.05)
        raise RuntimeError("server did not start")

    def _read(self):
        for line in self.proc.stderr:
            try:
                v = json.loads(line)
            except ValueError:
                continue
            f = v.get("fields", {})
            ev = f.get("event")
            if not ev or not (v.get("target") == "app" or v.get("target", "").startswith("vramfork::master")):
                continue
            f["_t"] = time.time()
            self.events.append(f)
            if ev == "listening":
                self.port = int(f["addr"].rsplit(":", 1)[1])

    def last(self, name):
        for e in reversed(self.events):
            if e.get("event") == name:
                return e
        return None

    def pool_settled(self, n):
        p = self.last("pool")
        return p and p["workers"] == n and p["ready"] == n and p["booting"] == 0 and p["retiring"] == 0

    def count(self, name, pred=lambda e: True):
        return sum(1 for e in self.events if e.get("event") == name and pred(e))

    def max_pool(self):
        return max((e["ready"] + e["booting"] + e["retiring"] for e in self.events if e.get("event") == "pool"), default=0)

    def worker_pids(self):
        out = []
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                stat = open(f"/proc/{p}/stat").read()
            except OSError:
                continue
            comm = stat[stat.find("(") + 1:stat.rfind(")")]
            fields = stat[stat.rfind(")") + 2:].split()
            if fields[1] == str(self.proc.pid) and fields[0] != "Z" and comm.startswith("vf-worker"):
                out.append(int(p))
        return out

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()


def rss_mb(pid):
    try:
        s = open(f"/proc/{pid}/status").read()
    except OSError:
        return None, None
    g = lambda k: int(re.search(k + r":\s+(\d+)", s).group(1)) / 1024
    return g("VmRSS"), g("VmHWM")


# ------------------------------------------------------------------------------- client


class Conn:
    """A minimal HTTP/1.1 client connection (the server always sends Content-Length)."""

    def __init__(self, port):
        self.port = port
        self.r = self.w = None

    async def open(self):
        self.r, self.w = await asyncio.open_connection("127.0.0.1", self.port)

    def close(self):
        if self.w:
            self.w.close()
        self.r = self.w = None

    async def request(self, body, path="/", method="POST", timeout=60):
        if self.w is None:
            await self.open()
        head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.w.write(head + body)
        await self.w.drain()
        return await asyncio.wait_for(self.read(), timeout)

    async def read(self):
        head = await self.r.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        h = {}
        for l in lines[1:]:
            if ":" in l:
                k, v = l.split(":", 1)
                h[k.strip().lower()] = v.strip()
        body = await self.r.readexactly(int(h.get("content-length", "0")))
        if h.get("connection", "").lower() == "close":
            self.close()
        return status, h, body


class Tally:
    def __init__(self):
        self.sent = 0
        self.ok = 0
        self.kinds = {}
        self.lat = []

    def add(self, status=None, err=None, lat=None):
        self.sent += 1
        if status == 200:
            self.ok += 1
        else:
            k = str(status) if status else type(err).__name__
            self.kinds[k] = self.kinds.get(k, 0) + 1
        if lat is not None and status == 200:
            self.lat.append(lat)

    @property
    def failed(self):
        return self.sent - self.ok

    def kinds_text(self):
        return ", ".join(f"{k}: {v}" for k, v in sorted(self.kinds.items())) or "-"


class Until:
    """Until a time, or until stopped (cancelling the clients is not reliable: asyncio's
    wait_for can swallow a cancellation that races with a completed read)."""

    def __init__(self, secs):
        self.t = time.time() + secs

    def __call__(self):
        return time.time() < self.t

    def left(self):
        return max(0.0, self.t - time.time())

    def stop(self):
        self.t = 0


async def keepalive_client(port, body, until, tally, per_client=None, on_503_wait=True):
    c = Conn(port)
    while until():
        t0 = time.time()
        try:
            # A request sent just before the end may wait its turn in the queue: let it.
            st, h, _ = await c.request(body, timeout=60)
            tally.add(st, lat=time.time() - t0)
            if per_client is not None:
                per_client[st] = per_client.get(st, 0) + 1
            if st == 503 and on_503_wait:
                await asyncio.sleep(float(h.get("retry-after", "1")))
        except Exception as e:  # noqa: BLE001 - every failure is counted by kind
            tally.add(err=e)
            c.close()
    c.close()


async def fresh_client(port, body, until, tally, lat):
    while until():
        c = Conn(port)
        t0 = time.time()
        try:
            st, h, _ = await c.request(body, timeout=60)
            tally.add(st, lat=time.time() - t0)
            lat.append((st, time.time() - t0, h.get("retry-after")))
            if st == 503:
                await asyncio.sleep(float(h.get("retry-after", "1")))
        except Exception as e:  # noqa: BLE001
            tally.add(err=e)
        c.close()


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


# ------------------------------------------------------------------------------ scenarios

SLOW45 = 2000  # slow.pt iterations ≈ 45 ms on the build machine


async def soak(secs):
    s = await Server("mlp.pt", ["--workers", "2", "--max-requests", "50"], shape=[-1, 4]).start(2)
    t = Tally()
    until = Until(secs)
    await asyncio.gather(*[keepalive_client(s.port, MLP, until, t) for _ in range(16)])
    recycles = s.count("worker_exited", lambda e: e.get("reason") == "max_requests")
    pid = s.worker_pids()
    mem = max((rss_mb(p)[0] or 0) for p in pid) if pid else None
    s.stop()
    return dict(scenario=f"soak: 16 keep-alive clients, MLP, --max-requests 50, {secs} s", sent=t.sent, ok=t.ok,
                failed=t.kinds_text(), deaths=0, notes=f"{recycles} recycles; worker RSS {mem:.0f} MB",
                target="0 failed", met=t.failed == 0)


async def chaos(secs):
    s = await Server("mlp.pt", ["--workers", "2"], shape=[-1, 4]).start(2)
    t = Tally()
    until = Until(secs)
    kills = 0

    async def killer():
        nonlocal kills
        while until.left() > 1:
            await asyncio.sleep(0.5)
            pids = s.worker_pids()
            if pids:
                try:
                    os.kill(random.choice(pids), signal.SIGKILL)
                    kills += 1
                except OSError:
                    pass

    await asyncio.gather(killer(), *[keepalive_client(s.port, MLP, until, t) for _ in range(16)])
    s.stop()
    # A killed worker can take only its own connections' requests with it: at most one in
    # flight per client connection it held.
    return dict(scenario=f"chaos: kill -9 a worker every 0.5 s, 16 keep-alive clients, {secs} s", sent=t.sent,
                ok=t.ok, failed=t.kinds_text(), deaths=kills,
                notes=f"{t.failed} failed for {kills} kills",
                target="failed ≤ clients per kill", met=t.failed <= 16 * kills)


async def signal_storm(hups):
    s = await Server("mlp.pt", ["--workers", "2"], shape=[-1, 4]).start(2)
    t = Tally()
    until = Until(600)
    maxp = 0

    async def monitor():
        nonlocal maxp
        while until():
            maxp = max(maxp, len(s.worker_pids()))
            await asyncio.sleep(0.005)

    mon = asyncio.ensure_future(monitor())
    clients = [asyncio.ensure_future(keepalive_client(s.port, MLP, until, t)) for _ in range(16)]
    await asyncio.sleep(1)
    for v in range(1, hups + 1):
        s.doc["version"] = str(v)
        s.write_meta()
        s.signal(signal.SIGHUP)
        await asyncio.sleep(0.1)
    for sig in (signal.SIGTTIN, signal.SIGTTOU):
        s.signal(sig)
        await asyncio.sleep(0.1)
    def done():
        last = {e["event"]: i for i, e in enumerate(s.events)}
        return (s.pool_settled(2) and last.get("reload_complete", -1) > last.get("reload_started", 0)
                and last.get("ttou", -1) > 0)

    deadline = time.time() + 120
    while time.time() < deadline and not done():
        await asyncio.sleep(0.1)
    await asyncio.sleep(1)
    until.stop()
    await asyncio.gather(mon, *clients)
    # the last version is served
    c = Conn(s.port)
    _, _, body = await c.request(b"", method="GET")
    c.close()
    version = json.loads(body).get("version")
    maxpool = s.max_pool()
    s.stop()
    return dict(scenario=f"signal storm: {hups} HUPs 100 ms apart + TTIN/TTOU, 16 keep-alive clients",
                sent=t.sent, ok=t.ok, failed=t.kinds_text(), deaths=0,
                notes=f"workers at most {maxp} (/proc), {maxpool} (master); serves version {version}",
                target="0 failed, ≤ 3 workers (plan 2 + 1)",
                met=t.failed == 0 and maxp <= 3 and maxpool <= 3 and version == str(hups))


async def overload_keepalive(clients, secs):
    s = await Server("slow.pt", ["--workers", "2"], name="slow45").start(2)
    t = Tally()
    per = [dict() for _ in range(clients)]
    until = Until(secs)
    await asyncio.gather(*[keepalive_client(s.port, slow_body(SLOW45), until, t, per_client=per[i])
                           for i in range(clients)])
    s.stop()
    answers = [sum(p.values()) for p in per]
    served = [p.get(200, 0) for p in per]
    mean = statistics.mean(answers)
    return dict(scenario=f"overload: {clients} keep-alive clients, 45 ms model, 2 workers, {secs} s",
                sent=t.sent, ok=t.ok, failed=t.kinds_text(), deaths=0,
                notes=(f"clients answered {sum(1 for a in answers if a)}/{clients}; answers per client "
                       f"min {min(answers)} mean {mean:.1f} max {max(answers)}; 200s per client min {min(served)} max {max(served)}"),
                target="every client answered, max ≤ 3× mean",
                met=min(answers) > 0 and max(answers) <= 3 * mean)


async def overload_fresh(clients, secs, max_wait):
    s = await Server("slow.pt", ["--workers", "2", "--max-queue-wait", str(max_wait)], name="slow45").start(2)
    t = Tally()
    lat = []
    until = Until(secs)
    await asyncio.gather(*[fresh_client(s.port, slow_body(SLOW45), until, t, lat) for _ in range(clients)])
    s.stop()
    ok_lat = [l for st, l, _ in lat if st == 200]
    refused = [(l, ra) for st, l, ra in lat if st == 503]
    with_ra = sum(1 for _, ra in refused if ra is not None)
    return dict(scenario=f"overload: {clients} clients, a new connection per request, 45 ms model, 2 workers, --max-queue-wait {max_wait}, {secs} s",
                sent=t.sent, ok=t.ok, failed=t.kinds_text(), deaths=0,
                notes=(f"200 latency p50 {pct(ok_lat, 50):.2f} s max {max(ok_lat):.2f} s; {len(refused)} × 503 "
                       f"(Retry-After on {with_ra}), answered in p50 {pct([l for l, _ in refused], 50) or 0:.2f} s"),
                target="no wait > --max-queue-wait + 1 s; refusals carry Retry-After",
                met=max(ok_lat) <= max_wait + 1 and with_ra == len(refused) and max(l for l, _ in refused or [(0, 0)]) <= max_wait + 1)


async def slow_clients(half_open, drips, secs):
    s = await Server("mlp.pt", ["--workers", "2"], shape=[-1, 4]).start(2)

    async def measure(n):
        c = Conn(s.port)
        lat = []
        for _ in range(n):
            t0 = time.time()
            st, _, _ = await c.request(MLP)
            if st == 200:
                lat.append(time.time() - t0)
        c.close()
        return lat

    quiet = await measure(2000)
    socks = []
    for i in range(half_open):
        r, w = await asyncio.open_connection("127.0.0.1", s.port)
        w.write(b"POST / HTTP/1.1\r\nHo")
        socks.append(w)
    dripw = []
    for i in range(drips):
        r, w = await asyncio.open_connection("127.0.0.1", s.port)
        w.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        dripw.append(w)
    stop = time.time() + secs

    async def drip():
        while time.time() < stop:
            for w in dripw:
                w.write(b" ")
            await asyncio.sleep(1)

    d = asyncio.ensure_future(drip())
    await asyncio.sleep(0.5)
    attacked = await measure(2000)
    stop = 0
    await d
    for w in socks + dripw:
        w.close()
    s.stop()
    q99, a99 = pct(quiet, 99), pct(attacked, 99)
    return dict(scenario=f"slow clients: {half_open} half-open + {drips} bodies at 1 byte/s, MLP, 2 workers",
                sent=len(quiet) + len(attacked), ok=len(quiet) + len(attacked), failed="-", deaths=0,
                notes=(f"normal client p50 {pct(quiet, 50) * 1e3:.2f} → {pct(attacked, 50) * 1e3:.2f} ms, "
                       f"p99 {q99 * 1e3:.2f} → {a99 * 1e3:.2f} ms"),
                target="p99 ≤ 2× quiet", met=a99 <= 2 * q99)


def fuzz_requests():
    good = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 26\r\n\r\n" + b'{"inputs": [[1, 2, 3, 4]]}'
    cases = [
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1 ; a=\x01\r\nx\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n{\"inputs\"",
        b"POST /?hwFetch=%ff HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        b"BREW / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 24\r\n\r\n{\"inputs\": [[1e999,2,3]]}",
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 23\r\n\r\n{\"inputs\": [[1, 2, 3, ",
    ]
    for _ in range(200):
        b = bytearray(good)
        for _ in range(random.randint(1, 4)):
            i = random.randrange(len(b))
            op = random.random()
            if op < 0.4:
                b[i] = random.randrange(256)
            elif op < 0.7:
                del b[i]
            else:
                b.insert(i, random.randrange(256))
        cases.append(bytes(b))
    return cases


async def fuzz(secs):
    s = await Server("mlp.pt", ["--workers", "2"], shape=[-1, 4]).start(2)
    before = sorted(s.worker_pids())
    random.seed(7)
    cases = fuzz_requests()
    t = Tally()
    statuses = {}
    until = Until(secs)

    async def one():
        while until():
            req = random.choice(cases)
            try:
                r, w = await asyncio.open_connection("127.0.0.1", s.port)
                w.write(req)
                await w.drain()
                w.write_eof()
                head = await asyncio.wait_for(r.read(64), 15)
                st = int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else None
                statuses[st] = statuses.get(st, 0) + 1
                t.add(200 if st and st < 500 else st, err=None if st else ConnectionError())
                w.close()
            except Exception as e:  # noqa: BLE001
                statuses["error"] = statuses.get("error", 0) + 1
                t.add(err=e)

    await asyncio.gather(*[one() for _ in range(8)])
    after = sorted(s.worker_pids())
    s.stop()
    fivexx = sum(v for k, v in statuses.items() if isinstance(k, int) and k >= 500)
    no_answer = statuses.get(None, 0) + statuses.get("error", 0)
    return dict(scenario=f"fuzz: malformed requests, 8 clients, {secs} s", sent=t.sent, ok=t.ok,
                failed=t.kinds_text(), deaths=len(set(before) - set(after)),
                notes="statuses " + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items(), key=str)),
                target="no 5xx, no worker death", met=fivexx == 0 and before == after and no_answer == 0)


async def never_ran(secs):
    s = await Server("slow.pt", ["--workers", "1", "--request-timeout", "1"], name="slow45").start(1)
    t = Tally()
    until = Until(secs)
    # One connection sends requests that get stuck; others queue behind them.
    conns = [Conn(s.port) for _ in range(4)]
    for c in conns:
        await c.request(b"", path="/healthz", method="GET")
    statuses = {}

    async def run(c, body):
        while until():
            try:
                st, h, _ = await c.request(body, timeout=30)
                statuses[(st, h.get("retry-after"))] = statuses.get((st, h.get("retry-after")), 0) + 1
                t.add(st)
            except Exception as e:  # noqa: BLE001
                t.add(err=e)
                c.close()
            await asyncio.sleep(0.05)

    await asyncio.gather(run(conns[0], slow_body(10_000_000)), *[run(c, slow_body(1)) for c in conns[1:]])
    s.stop()
    c504 = sum(v for (st, _), v in statuses.items() if st == 504)
    c503 = sum(v for (st, ra), v in statuses.items() if st == 503 and ra == "0")
    return dict(scenario=f"stuck requests: --request-timeout 1, 1 stuck + 3 good clients, {secs} s",
                sent=t.sent, ok=t.ok, failed=t.kinds_text(), deaths=s.count("worker_exited"),
                notes=f"{c504} × 504 (stuck), {c503} × 503 Retry-After: 0 (never ran)",
                target="only requests that ran get 504", met=c504 <= s.count("worker_retiring", lambda e: e.get("reason") == "request_timeout") + 1)


async def two_part_post(port, body):
    """One POST on a new connection, the head and then the body 20 ms later (as Python's
    http.client sends them: two writes, and Nagle with delayed ACKs can part them). Returns
    the answering worker's pid."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write((f"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
             f"Content-Length: {len(body)}\r\n\r\n").encode())
    await w.drain()
    await asyncio.sleep(0.02)
    w.write(body)
    await w.drain()
    raw = await asyncio.wait_for(r.read(), 60)
    w.close()
    head = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    if " 200 " not in head.split("\r\n")[0] + " ":
        raise RuntimeError(head.split("\r\n")[0])
    return int(re.search(r"(?im)^x-worker-pid:\s*(\d+)", head).group(1))


SLOW_DISPATCH = 8000  # slow.pt iterations ≈ 180 ms on the build machine


async def dispatch(tries):
    """Promise 1: k simultaneous slow requests on new connections against k idle workers land
    on k distinct workers, `tries` times, for 2 and 4 workers, with batching, and under a CPU
    hog (one busy process per core)."""
    body = slow_body(SLOW_DISPATCH)
    cases = [("2 workers", ["--workers", "2"], 2, False),
             ("4 workers", ["--workers", "4"], 4, False),
             ("2 workers, --max-batch-size 4", ["--workers", "2", "--max-batch-size", "4"], 2, False),
             ("2 workers, CPU hog", ["--workers", "2"], 2, True)]
    notes, met, sent, ok = [], True, 0, 0
    for label, args, k, hog in cases:
        s = await Server("slow.pt", args, name="dispatch").start(k)
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() if hog else 0)]
        good = 0
        try:
            for _ in range(tries):
                pids = await asyncio.gather(*[two_part_post(s.port, body) for _ in range(k)])
                sent += k
                ok += k
                good += len(set(pids)) == k
        finally:
            for h in hogs:
                h.kill()
                h.wait()
            s.stop()
        notes.append(f"{label}: {good}/{tries}")
        met = met and good == tries
    return dict(scenario=f"dispatch: k simultaneous ~180 ms requests, new connections, k idle workers, {tries} tries each",
                sent=sent, ok=ok, failed="-", deaths=0,
                notes="tries on k distinct workers — " + "; ".join(notes),
                target="every try on k distinct workers", met=met)


def wrk_rps(port, conns, secs):
    """Small-MLP keep-alive req/s from wrk (one thread), as scripts/bench measures it."""
    cmd = ["wrk", "-t", "1", "-c", str(conns), "-d", f"{secs}s", "--timeout", "10s",
           "-s", os.path.join(ROOT, "scripts", "bench.d", "post.lua"), f"http://127.0.0.1:{port}/"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, BENCH_BODY=MLP.decode()),
                       timeout=secs + 30)
    for line in p.stdout.splitlines():
        if line.startswith("BENCHJSON "):
            r = json.loads(line[len("BENCHJSON "):])
            errs = sum(r["errors"].values())
            return r["requests"] / (r["duration_us"] / 1e6), errs
    raise RuntimeError(f"wrk gave no result: {p.stdout} {p.stderr}")


async def throughput(baseline, rounds, secs):
    """Promise 3: small-MLP req/s at c = 1, 4, 16, 64 (2 workers, keep-alive, wrk) for this
    build and, when given, a baseline build (`--baseline DIR` holding its app and
    app-worker), in rounds of one run each, the order reversed every other round; this
    build's median must reach the baseline's lowest run."""
    builds = [("this build", None)] + ([("baseline", os.path.join(baseline, "app"))] if baseline else [])
    conc = [1, 4, 16, 64]
    got = {(b, c): [] for b, _ in builds for c in conc}
    errors = 0
    for r in range(rounds):
        # ABBA order: a machine that speeds up or slows down during the run favours neither.
        for label, app in (builds if r % 2 == 0 else builds[::-1]):
            s = await Server("mlp.pt", ["--workers", "2"], shape=[-1, 4], name="throughput", app=app).start(2)
            try:
                for c in conc:
                    rps, e = await asyncio.get_running_loop().run_in_executor(None, wrk_rps, s.port, c, secs)
                    got[(label, c)].append(rps)
                    errors += e
            finally:
                s.stop()
    notes, met = [], errors == 0
    for c in conc:
        new = got[("this build", c)]
        text = f"c={c}: {statistics.median(new):,.0f} ({min(new):,.0f}–{max(new):,.0f})"
        if baseline:
            old = got[("baseline", c)]
            text += f" vs baseline {statistics.median(old):,.0f} ({min(old):,.0f}–{max(old):,.0f})"
            met = met and statistics.median(new) >= min(old)
        notes.append(text)
    return dict(scenario=f"throughput: small MLP, 2 workers, keep-alive, wrk, {rounds} rounds × {secs} s"
                         + (", against a baseline build" if baseline else " (no baseline given)"),
                sent="-", ok="-", failed=f"{errors} wrk errors", deaths=0,
                notes="req/s median (min–max): " + "; ".join(notes),
                target="median ≥ the baseline's lowest run, 0 errors" if baseline else "0 errors (no baseline to compare)",
                met=met, runs={f"{b} c={c}": v for (b, c), v in got.items()})


async def memory(body_mb):
    res = []
    for label, row, tail in (("typical floats, valid (200)", b"[0.1234,0.5678,0.9012,0.3456],", b"[1,2,3,4]]}"),
                             ("densest floats, ragged at the end (400)", b"[0,0,0,0],", b"[1,2,3]]}")):
        # A fresh worker for each, so that each peak is its own.
        s = await Server("mlp.pt", ["--workers", "1", "--max-body-mb", str(body_mb)], shape=[-1, 4]).start(1)
        pid = s.worker_pids()[0]
        c = Conn(s.port)
        await c.request(MLP)
        rss0, hwm0 = rss_mb(pid)
        n = (body_mb << 20) // len(row) - 10
        body = b'{"inputs": [' + row * n + tail
        st, _, _ = await c.request(body, timeout=120)
        rss, hwm = rss_mb(pid)
        c.close()
        s.stop()
        res.append((label, len(body) / 2**20, st, hwm - hwm0, rss0, rss))
    worst = max(r[3] / r[1] for r in res)
    return dict(scenario=f"memory: bodies at --max-body-mb {body_mb}, MLP, 1 worker", sent=2,
                ok=sum(1 for r in res if r[2] in (200, 400)), failed="-", deaths=0,
                notes="; ".join(f"{l}: {b:.0f} MB body → {st}, peak +{d:.0f} MB ({d / b:.1f}×), resident {r0:.0f} → {r1:.0f} MB after"
                                for l, b, st, d, r0, r1 in res),
                target="peak ≤ 3× body above baseline, memory back near baseline",
                met=worst <= 3 and all(r[5] <= r[4] + body_mb / 4 for r in res))


async def main(args):
    q = args.quick
    runs = [
        ("soak", lambda: soak(10 if q else 60)),
        ("chaos", lambda: chaos(10 if q else 30)),
        ("storm", lambda: signal_storm(5 if q else 20)),
        ("keepalive", lambda: overload_keepalive(100 if q else 500, 10 if q else 30)),
        ("fresh", lambda: overload_fresh(100 if q else 500, 10 if q else 30, 5)),
        ("slow", lambda: slow_clients(200 if q else 1000, 50 if q else 200, 10 if q else 20)),
        ("fuzz", lambda: fuzz(10 if q else 60)),
        ("stuck", lambda: never_ran(5 if q else 15)),
        ("memory", lambda: memory(16 if q else 64)),
        ("dispatch", lambda: dispatch(20 if q else 100)),
        ("throughput", lambda: throughput(args.baseline, 2 if q else 6, 3 if q else 4)),
    ]
    rows = []
    for name, f in runs:
        if args.only and name not in args.only:
            continue
        log(f"{name} ...")
        t0 = time.time()
        try:
            row = await asyncio.wait_for(f(), 1200)
        except Exception as e:  # noqa: BLE001
            row = dict(scenario=name, sent=0, ok=0, failed=repr(e), deaths=0, notes="scenario failed", target="", met=False)
        row["secs"] = round(time.time() - t0, 1)
        log(f"{name}: {'MET' if row['met'] else 'NOT MET'} — {row['notes']}")
        rows.append(row)
    md = ["| scenario | sent | ok | failed (by kind) | worker deaths | measured | target | met |",
          "|---|---:|---:|---|---:|---|---|---|"]
    for r in rows:
        md.append(f"| {r['scenario']} | {r['sent']} | {r['ok']} | {r['failed']} | {r['deaths']} | {r['notes']} | {r['target']} | {'yes' if r['met'] else '**no**'} |")
    text = "\n".join(md)
    print("\n" + text)
    os.makedirs(os.path.join(ROOT, "bench"), exist_ok=True)
    cmd = "scripts/stress" + (" --quick" if q else "") + (" --only " + " ".join(args.only) if args.only else "") \
        + (" --baseline DIR" if args.baseline else "")
    with open(os.path.join(ROOT, "bench", "stress.md"), "w") as f:
        f.write(f"Produced by `{cmd}` on {time.strftime('%Y-%m-%d')} ({os.cpu_count()} cores, load generator on the same machine).\n\n{text}\n")
    with open(os.path.join(ROOT, "bench", "stress.json"), "w") as f:
        json.dump({"command": cmd, "date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(), "rows": rows}, f, indent=1)
    met = sum(1 for r in rows if r["met"])
    print(f"{met} passed, {len(rows) - met} failed")
    return 0 if met == len(rows) else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--baseline", help="a directory with another build's app and app-worker, for the throughput row")
    sys.exit(asyncio.run(main(ap.parse_args())))
