"""The text bench's second half: an interactive request's latency while a bulk ingestion runs,
with and without priority, on one vramfork server (text.py starts it and calls `measure`).

- *bulk*: BULK_CLIENTS closed-loop clients, each sending requests of BULK_INPUTS of the bench's
  mixed-length inputs in turn for the whole window;
- *interactive*: one short input a request, arriving open-loop (one every 1 / RATE s,
  whether or not the last was answered) for the window after the bulk has started, in turn of
  two kinds: on a *new connection* each (a client without a pool: the connection waits to be
  accepted by a worker), and *kept alive* (a client's pool of keep-alive connections, opened
  before the bulk starts; an arrival takes an idle one, or opens one more when none is idle,
  and gives it back once answered; a connection the server closes is opened again).

Three modes: *alone* (the interactive arrivals on an idle server), *no priority* (the bulk
running, neither side sending a priority) and *priority* (the bulk sending vLLM's body field
`"priority": 1`, the interactive `"priority": -1`; lower is served earlier). The modes with a
bulk alternate over `rounds` (no priority, priority, priority, no priority, ...); each mode's
p50/p99, by kind, is over all its interactive requests, each timed from its arrival.

Before that, one request of each kind with the field says what the server makes of it: a
refusal (its status and message; the priority mode is then left out) or an answer. An answer
does not prove the field was read: the priority mode's p99 against the no-priority mode's says
whether it changed anything, and the access log which lane each request's passes waited in,
how long it waited (for a worker and its model) and how long its model time was.
"""
import http.client
import json
import queue
import re
import threading
import time

from common import closed_loop, get, log, pct, post_status

PATH = "/v1/embeddings"
BULK_CLIENTS = 4
BULK_INPUTS = 64
RATE = 4.0  # interactive arrivals a second, the two kinds in turn
KINDS = ("new connection", "kept alive")
POOL = 4  # kept-alive connections opened before the bulk starts
QUERY = "how does the server recycle a worker without failing a request?"


def body(name, texts, priority=None):
    b = {"model": name, "input": texts, "encoding_format": "base64"}
    if priority is not None:
        b["priority"] = priority
    return json.dumps(b).encode()


def one(port, payload, timeout=600):
    """POST `payload` on a new connection: (status, latency ms, answer bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.perf_counter()
    try:
        c.request("POST", PATH, body=payload, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        got = r.read()
        return r.status, (time.perf_counter() - t0) * 1e3, got
    except (OSError, http.client.HTTPException):
        return 0, (time.perf_counter() - t0) * 1e3, b""
    finally:
        c.close()


def probe(port, name, texts):
    """What the server answers to each kind's request with its priority field."""
    out = {}
    for kind, payload in (("interactive", body(name, [QUERY], -1)),
                          ("bulk", body(name, texts[:BULK_INPUTS], 1))):
        status, _, got = one(port, payload)
        out[kind] = {"status": status}
        if status != 200:
            out[kind]["message"] = got[:300].decode("utf-8", "replace")
    return out


def open_pool(port, payload):
    """POOL keep-alive connections, each taken by a worker (its first request answered)."""
    pool = queue.LifoQueue()
    for _ in range(POOL):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", PATH, body=payload, headers={"Content-Type": "application/json"})
        c.getresponse().read()
        pool.put(c)
    return pool


def interactive(port, payload, secs, pool):
    """Open-loop arrivals of `payload` at RATE a second for `secs`, the KINDS in turn (the
    kept-alive ones on `pool`, closed after): {kind: (latencies ms of the answered, failures
    by status)}."""
    out = {k: ([], {}) for k in KINDS}
    lock, threads = threading.Lock(), []

    def kept_alive():
        try:
            c = pool.get_nowait()
        except queue.Empty:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        status = post_status(c, PATH, payload)
        pool.put(c)
        return status

    def send(kind, due):
        status = one(port, payload)[0] if kind == KINDS[0] else kept_alive()
        ms = (time.perf_counter() - due) * 1e3
        with lock:
            lat, failed = out[kind]
            if status == 200:
                lat.append(ms)
            else:
                failed[status] = failed.get(status, 0) + 1

    t0 = time.perf_counter()
    for i in range(int(secs * RATE)):
        due = t0 + i / RATE
        time.sleep(max(0.0, due - time.perf_counter()))
        t = threading.Thread(target=send, args=(KINDS[i % 2], due))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    while not pool.empty():
        pool.get().close()
    return out


def bulk_with(port, payloads, secs, fn):
    """The bulk's closed loop running while `fn()` runs (started one bulk request's worth
    of time before, stopped after: the clients finish the request they hold): (fn's result,
    (inputs the bulk had answered a second, its requests answered))."""
    stop = threading.Event()

    def feed():
        i = 0
        while not stop.is_set():
            yield payloads[i % len(payloads)]
            i += 1

    got = {}
    t = threading.Thread(target=lambda: got.update(run=closed_loop(
        port, PATH, feed(), BULK_CLIENTS, timeout=600)))
    t.start()
    time.sleep(1.0)
    try:
        result = fn()
    finally:
        stop.set()
        t.join()
    wall, lat, _ = got["run"]
    return result, (len(lat) * BULK_INPUTS / wall, len(lat))


def access(log_path):
    """The server's access lines for PATH so far, each {lane, kind, wait_ms, model_ms}: the
    lane its passes waited in, and whether it was an interactive request (a body of one
    short input) or the bulk's."""
    out = []
    with open(log_path) as f:
        for line in f:
            if "access:" in line and f" {PATH} " in line:
                v = dict(re.findall(r"\b(bytes_in|wait_ms|model_ms|lane)=(\S+)", line))
                out.append({"lane": v.get("lane"), "wait_ms": float(v.get("wait_ms", 0)),
                            "model_ms": float(v.get("model_ms", 0)),
                            "kind": "interactive" if int(v.get("bytes_in", 0)) < 1000
                            else "bulk"})
    return out


def seen_since(log_path, start, answered):
    """The access lines after the first `start`, once `answered` more are in (10 s at most:
    a line is written once its answer has gone): by kind, the requests in each lane and
    p50/p99 of the time they waited (for a worker and its model) and of their model time."""
    end = time.monotonic() + 10
    while len(lines := access(log_path)) < start + answered and time.monotonic() < end:
        time.sleep(0.1)
    out = {}
    for kind in ("interactive", "bulk"):
        mine = [x for x in lines[start:] if x["kind"] == kind]
        lanes = {}
        for x in mine:
            lanes[x["lane"]] = lanes.get(x["lane"], 0) + 1
        out[kind] = {"lanes": lanes, **{f"{k}_{q}": pct([x[k] for x in mine], n)
                                        for k in ("wait_ms", "model_ms")
                                        for q, n in (("p50", 50), ("p99", 99))}}
    return out


def measure(port, log_path, name, texts, secs, rounds):
    """The three modes' interactive p50/p99 (and the bulk's inputs/s), and what the access
    log at `log_path` says of each mode's requests (seen_since)."""
    seen = probe(port, name, texts)
    refused = any(v["status"] != 200 for v in seen.values())
    log(f"text priority: the field answered {({k: v['status'] for k, v in seen.items()})}",
        "text")
    bulks = {False: [body(name, texts[i:i + BULK_INPUTS])
                     for i in range(0, len(texts) - BULK_INPUTS + 1, BULK_INPUTS)]}
    bulks[True] = [body(name, texts[i:i + BULK_INPUTS], 1)
                   for i in range(0, len(texts) - BULK_INPUTS + 1, BULK_INPUTS)]
    one_q = {False: body(name, [QUERY]), True: body(name, [QUERY], -1)}
    modes = {m: {k: {"lat": [], "failed": {}} for k in KINDS}
             for m in ("alone", "no priority", "priority")[:2 if refused else 3]}
    bulk_s = {m: [] for m in modes if m != "alone"}
    seen_log = {m: [] for m in bulk_s}

    def add(mode, got):
        for k, (lat, failed) in got.items():
            modes[mode][k]["lat"] += lat
            for st, v in failed.items():
                modes[mode][k]["failed"][str(st)] = modes[mode][k]["failed"].get(str(st), 0) + v

    add("alone", interactive(port, one_q[False], secs / 2, open_pool(port, one_q[False])))
    order = list(bulk_s)
    for r in range(rounds):
        for mode in order if r % 2 == 0 else order[::-1]:
            prio = mode == "priority"
            pool = open_pool(port, one_q[prio])
            start = len(access(log_path))
            got, (per_s, bulk_n) = bulk_with(port, bulks[prio], secs,
                                             lambda: interactive(port, one_q[prio], secs, pool))
            add(mode, got)
            seen_log[mode].append(seen_since(log_path, start, bulk_n + sum(
                len(lat) for lat, _ in got.values())))
            bulk_s[mode].append(per_s)
            log(f"text priority round {r + 1} {mode}: interactive p50/p99 " + ", ".join(
                f"{k} {pct(lat, 50) or 0:.0f}/{pct(lat, 99) or 0:.0f} ms ({len(lat)})"
                for k, (lat, _) in got.items()) + f"; bulk {per_s:.0f} inputs/s", "text")
    out = {"probe": seen, "refused": refused, "access_log": seen_log,
           "bulk_clients": BULK_CLIENTS, "bulk_inputs": BULK_INPUTS, "rate_per_s": RATE,
           "pool": POOL,
           "seconds": secs, "rounds": rounds, "modes": {}}
    for mode, m in modes.items():
        out["modes"][mode] = {k: {"p50_ms": pct(v["lat"], 50), "p99_ms": pct(v["lat"], 99),
                                  "requests": len(v["lat"]), "failed": v["failed"]}
                              for k, v in m.items()}
        out["modes"][mode]["bulk_inputs_s"] = bulk_s.get(mode)
    return out
