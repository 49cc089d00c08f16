"""The text bench's second half: an interactive request's latency while a bulk ingestion runs,
with and without priority, on one vramfork server (text.py starts it and calls `measure`).

- *bulk*: BULK_CLIENTS closed-loop clients, each sending requests of BULK_INPUTS of the bench's
  mixed-length inputs in turn for the whole window;
- *interactive*: one short input a request, arriving open-loop (a new connection each, one
  every 1 / RATE s, whether or not the last was answered), for the window after the bulk has
  started.

Three modes: *alone* (the interactive arrivals on an idle server), *no priority* (the bulk
running, neither side sending a priority) and *priority* (the bulk sending vLLM's body field
`"priority": 1`, the interactive `"priority": -1`; lower is served earlier). The modes with a
bulk alternate over `rounds` (no priority, priority, priority, no priority, ...); each mode's
p50/p99 is over all its interactive requests.

Before that, one request of each kind with the field says what the server makes of it: a
refusal (its status and message; the priority mode is then left out) or an answer. An answer
does not prove the field was read: the priority mode's p99 against the no-priority mode's says
whether it changed anything, and /metrics' families naming a lane or a priority are listed.
"""
import http.client
import json
import re
import threading
import time

from common import closed_loop, get, log, pct

PATH = "/v1/embeddings"
BULK_CLIENTS = 4
BULK_INPUTS = 64
RATE = 2.0  # interactive arrivals a second
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


def interactive(port, payload, secs):
    """Open-loop arrivals of `payload` at RATE a second for `secs`: (latencies ms of the
    answered, failures by status)."""
    lat, failed, lock, threads = [], {}, threading.Lock(), []

    def send():
        status, ms, _ = one(port, payload)
        with lock:
            if status == 200:
                lat.append(ms)
            else:
                failed[status] = failed.get(status, 0) + 1

    t0 = time.perf_counter()
    for i in range(int(secs * RATE)):
        time.sleep(max(0.0, t0 + i / RATE - time.perf_counter()))
        t = threading.Thread(target=send)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return lat, failed


def bulk_with(port, payloads, secs, fn):
    """The bulk's closed loop running while `fn()` runs (started one bulk request's worth
    of time before, stopped after: the clients finish the request they hold): (fn's result,
    inputs the bulk had answered a second)."""
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
    return result, len(lat) * BULK_INPUTS / wall


def lane_metrics(port):
    """/metrics' family names that speak of a lane or a priority."""
    status, text = get(port, "/metrics")
    if status != 200:
        return []
    return sorted({m[1] for m in re.finditer(r"^# TYPE (\S+)", text.decode(), re.M)
                   if re.search(r"lane|priorit", m[1])})


def measure(port, name, texts, secs, rounds):
    """The three modes' interactive p50/p99 (and the bulk's inputs/s)."""
    seen = probe(port, name, texts)
    refused = any(v["status"] != 200 for v in seen.values())
    log(f"text priority: the field answered {({k: v['status'] for k, v in seen.items()})}",
        "text")
    bulks = {False: [body(name, texts[i:i + BULK_INPUTS])
                     for i in range(0, len(texts) - BULK_INPUTS + 1, BULK_INPUTS)]}
    bulks[True] = [body(name, texts[i:i + BULK_INPUTS], 1)
                   for i in range(0, len(texts) - BULK_INPUTS + 1, BULK_INPUTS)]
    one_q = {False: body(name, [QUERY]), True: body(name, [QUERY], -1)}
    modes = {"alone": {"lat": [], "failed": {}}, "no priority": {"lat": [], "failed": {},
                                                                 "bulk_inputs_s": []}}
    if not refused:
        modes["priority"] = {"lat": [], "failed": {}, "bulk_inputs_s": []}
    lat, failed = interactive(port, one_q[False], secs / 2)
    modes["alone"].update(lat=lat, failed={str(k): v for k, v in failed.items()})
    order = [m for m in ("no priority", "priority") if m in modes]
    for r in range(rounds):
        for mode in order if r % 2 == 0 else order[::-1]:
            prio = mode == "priority"
            (lat, failed), bulk_s = bulk_with(port, bulks[prio], secs,
                                              lambda: interactive(port, one_q[prio], secs))
            m = modes[mode]
            m["lat"] += lat
            m["bulk_inputs_s"].append(bulk_s)
            for k, v in failed.items():
                m["failed"][str(k)] = m["failed"].get(str(k), 0) + v
            log(f"text priority round {r + 1} {mode}: interactive p50 {pct(lat, 50) or 0:.0f} "
                f"p99 {pct(lat, 99) or 0:.0f} ms ({len(lat)}), bulk {bulk_s:.0f} inputs/s",
                "text")
    out = {"probe": seen, "refused": refused, "lane_metrics": lane_metrics(port),
           "bulk_clients": BULK_CLIENTS, "bulk_inputs": BULK_INPUTS, "rate_per_s": RATE,
           "seconds": secs, "rounds": rounds, "modes": {}}
    for mode, m in modes.items():
        out["modes"][mode] = {"p50_ms": pct(m["lat"], 50), "p99_ms": pct(m["lat"], 99),
                              "requests": len(m["lat"]), "failed": m["failed"],
                              "bulk_inputs_s": m.get("bulk_inputs_s")}
    return out
