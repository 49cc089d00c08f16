"""What every part of the bench shares (written once here): where things are, the log line,
the median and a percentile, a free port, a process's CPU time, one HTTP GET, a closed loop of
clients POSTing a list of bodies, the requests each worker answered by its access log, and `app --production` (or another server) started in its
own process group, waited for on a state it reports, and stopped.

Stdlib only: every part imports it (`sys.path` holds this folder when a part runs as a
script).
"""
import http.client
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The release binaries `scripts/bench` builds; VRAMFORK_BENCH_BIN points elsewhere (a smoke
# run of a part on the debug build, whose figures mean nothing).
BIN = os.environ.get("VRAMFORK_BENCH_BIN") or os.path.join(ROOT, "target", "release")
OUT = os.path.join(ROOT, "bench")
TMP = os.path.join(OUT, "tmp")


def log(msg, part="bench"):
    print(f"[{part} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def pct(xs, p):
    """The nearest-rank `p`th percentile of `xs` (None when empty)."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[max(0, math.ceil(p / 100 * len(xs)) - 1)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    """User + system CPU seconds process `pid` has used so far (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        st = f.read()
    fields = st[st.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads_cpu_seconds(pids, name):
    """User + system CPU seconds the threads called `name` (their comm) of processes `pids`
    have used so far (from /proc/PID/task); threads or processes gone count 0."""
    total = 0.0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    if f.read().strip() != name:
                        continue
                total += cpu_seconds(f"{pid}/task/{tid}")
            except OSError:
                pass
    return total


def get(port, path, timeout=5.0):
    """GET `path` on 127.0.0.1:`port`: (status, body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def post_status(c, path, payload):
    """POSTs the JSON `payload` to `path` on the keep-alive connection `c` and reads the
    answer whole: its status, or 0 when there was no answer (then `c` is closed, and its
    next request reconnects)."""
    try:
        c.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        return r.status
    except (OSError, http.client.HTTPException):
        c.close()
        return 0


def closed_loop(port, path, payloads, clients, timeout=1800):
    """`clients` threads, each on its own keep-alive connection, taking the next of `payloads`
    (JSON bodies, any iterable: a list, or a generator that ends when a run's time is up) as
    soon as its last answer is in, and POSTing it to `path`: wall seconds, every answered
    request's latency (ms), and the failures by status (0: no answer)."""
    lat, failed, lock, it = [], {}, threading.Lock(), iter(payloads)

    def client():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            while True:
                with lock:
                    payload = next(it, None)
                if payload is None:
                    return
                t0 = time.perf_counter()
                status = post_status(c, path, payload)
                ms = (time.perf_counter() - t0) * 1e3
                with lock:
                    if status == 200:
                        lat.append(ms)
                    else:
                        failed[status] = failed.get(status, 0) + 1
        finally:
            c.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, lat, failed


def answered_by_worker(log_path, path):
    """Requests to `path` answered so far by each worker of the `app --access-log` whose log
    is `log_path`, from its access lines: {slot: requests}."""
    counts = {}
    with open(log_path) as f:
        for line in f:
            m = re.search(r"\bslot=(\d+)", line) if "access:" in line and path in line else None
            if m:
                counts[m[1]] = counts.get(m[1], 0) + 1
    return counts


def worker_share(log_path, path, before, requests):
    """The `requests` answered since `before` (answered_by_worker's counts then) by each
    worker: {slot: requests}. An access line is written once its answer has gone, so this
    waits (10 s at most) until every one is in the log."""
    end = time.monotonic() + 10
    while (sum((after := answered_by_worker(log_path, path)).values())
           < sum(before.values()) + requests and time.monotonic() < end):
        time.sleep(0.1)
    return {k: v - before.get(k, 0) for k, v in sorted(after.items())}


class App:
    """`app --production ARGS` in its own process group, stderr to `log_path`."""

    def __init__(self, args, log_path, env=None, wrap=(), binary_dir=None):
        """`wrap`: a command that execs `app` (joining a cgroup first, say); `binary_dir`:
        where `app` is, instead of BIN."""
        self._start([*wrap, os.path.join(binary_dir or BIN, "app"), "--production", *args],
                    log_path, env)

    @classmethod
    def other(cls, cmd, log_path):
        """Another server's command line (a Python server a part compares with), started,
        waited for and stopped as `app` is."""
        srv = cls.__new__(cls)
        srv._start(cmd, log_path, None)
        return srv

    def _start(self, cmd, log_path, env):
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        self.log_path = log_path
        self.logf = open(log_path, "w")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=self.logf, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=ROOT, env=env if env is not None else dict(os.environ),
        )

    @property
    def pid(self):
        return self.proc.pid

    def wait(self, ready, deadline_s=120):
        """Until `ready()` is true (an exception in it counts as not yet); fails when `app`
        exits first or the deadline passes."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"app exited {self.proc.returncode}; see {self.log_path}")
            try:
                if ready():
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"app not ready in {deadline_s} s; see {self.log_path}")

    def wait_ready(self, port, deadline_s=120):
        """Until the serving port's readiness check (`GET /v2/health/ready`) answers 200."""
        self.wait(lambda: get(port, "/v2/health/ready", timeout=2)[0] == 200, deadline_s)

    def stop(self):
        """TERM (a clean stop, 15 s), then SIGKILL to the whole process group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.logf.close()
