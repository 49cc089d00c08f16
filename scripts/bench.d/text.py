#!/usr/bin/env python3
"""scripts/bench --only text: N mixed-length inputs through `/v1/embeddings`, four servers.

One sentence encoder (random weights; embeddings_model.py, traced with the same attention
kernel the Python sides run, `sdpa`), of all-MiniLM-L6-v2's shape
(`--shape minilm`, the default: 6 layers, width 384, max_length 256) or BERT-base's
(`--shape bert-base`: 12 layers, width 768, max_length 512), the same weights and tokenizer on
every side:

- *after*: `app --production` of this build (bench's binaries), 2 workers x 1 torch thread;
- *before*: the same of commit BEFORE (its `app` and `app-worker` only, built once into
  bench/tmp/text/before-BEFORE when missing: a throwaway checkout, the release target copied
  in, built, the rest deleted);
- *infinity*: `infinity-emb` (text_infinity.py: its own venv, torch engine, its batch size
  and length sorting as it ships), 1 process x 2 torch threads;
- *python*: sentence-transformers behind LitServe (embeddings_litserve.py, each request's
  inputs encoded together), 2 workers x 1 torch thread.

The inputs: N documents cut from the docs (rerank_model.documents, seeded): about 70 % one
sentence, 20 % a paragraph of three to five, 10 % twelve to twenty sentences, which
max_length cuts. They go in order, in requests of K (base64 vectors, as OpenAI's SDK asks),
through c = 1, 4 and 16 closed-loop clients (each taking the next request when its last answer
is in); a run's inputs/s is N ÷ its wall time. The sides run interleaved, `rounds` rounds (the
order reversed every other round), and a cell's figure is the median round's. Before timing,
every side's vectors for the first CHECK inputs must agree with *after*'s within 1e-4 (else
the bench stops: the sides would not be the same model); that pass also times each side, from
which the run's length is foretold, and, without `--n`, N chosen (256 to 512, a multiple of
16) so that the run fits `--minutes` (9 by default) after the servers are up.

Then the *after* server's interactive latency beside a bulk ingestion, with and without
priority (text_priority.py). Writes bench/text.{json,md}.

Usage: text.py --command CMD [--quick] [--shape minilm|bert-base] [--n N | --minutes M]
               [--rounds R]
"""
import argparse
import base64
import json
import os
import struct
import subprocess
import sys
import time
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import embeddings as E  # noqa: E402
import run as R  # noqa: E402
import text_infinity  # noqa: E402
import text_priority  # noqa: E402
from common import BIN, ROOT, TMP, answered_by_worker, closed_loop, log, median, pct  # noqa: E402
from common import worker_share  # noqa: E402
from rerank_model import documents  # noqa: E402
from text_report import write  # noqa: E402

PY = os.environ.get("VRAMFORK_PYTHON", sys.executable)
NAME = "encoder"
PATH = "/v1/embeddings"
BEFORE = "834a3b3"
BEFORE_DIR = os.path.join(TMP, "text", f"before-{BEFORE}")
MAX_LENGTH = {"minilm": 256, "bert-base": 512}
SIDES = ("after", "before", "infinity", "python")
# The traced model's attention: PyTorch's fused scaled_dot_product_attention, as transformers
# runs it on the Python sides (eager attention cost the traced model about 1.5x at 16 x 256
# tokens on one thread).
ATTENTION = "sdpa"
CONCURRENCY = (1, 4, 16)
CHECK = 48
K = 16
# vramfork's sides wait without bound and time out late, as LitServe's does not refuse
# either: the bench measures the serving, not each server's refusal policy.
# The access log says which worker answered each request (a keep-alive connection stays with
# the worker that accepted it).
VF_ARGS = ("--max-queue-wait", "0", "--request-timeout", "600", "--access-log")
VF_SIDES = ("after", "before")


def before_binaries():
    """BEFORE's `app` and `app-worker` in BEFORE_DIR, built once."""
    if all(os.path.exists(os.path.join(BEFORE_DIR, b)) for b in ("app", "app-worker")):
        return
    src = os.path.join(TMP, "text", f"src-{BEFORE}")
    log(f"building {BEFORE}'s release binaries into {os.path.relpath(BEFORE_DIR, ROOT)}", "text")
    subprocess.run(["git", "worktree", "add", "--detach", "--force", src, BEFORE], cwd=ROOT,
                   check=True)
    try:
        os.makedirs(os.path.join(src, "target"), exist_ok=True)
        subprocess.run(["cp", "-a", os.path.join(ROOT, "target", "release"),
                        os.path.join(src, "target")], check=True)
        subprocess.run(["cargo", "build", "--release", "--workspace"], cwd=src, check=True)
        os.makedirs(BEFORE_DIR, exist_ok=True)
        for b in ("app", "app-worker"):
            subprocess.run(["cp", os.path.join(src, "target", "release", b), BEFORE_DIR],
                           check=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", src], cwd=ROOT)
        subprocess.run(["rm", "-rf", src])


def body(texts):
    return json.dumps({"model": NAME, "input": texts, "encoding_format": "base64"}).encode()


def vectors(port, texts):
    """`texts`' vectors from one side, in requests of K, decoded from base64."""
    out = []
    for i in range(0, len(texts), K):
        status, _, got = E.post(port, PATH, body(texts[i:i + K]),
                                {"Content-Type": "application/json"})
        if status != 200:
            raise SystemExit(f"text: port {port} answered {status}: {got[:300]!r}")
        for d in sorted(json.loads(got)["data"], key=lambda d: d["index"]):
            raw = base64.b64decode(d["embedding"])
            out.append(struct.unpack(f"<{len(raw) // 4}f", raw))
    return out


def same_vectors(ports, texts):
    """{side: max |Δ| against *after*} over `texts`, and each side's seconds an input at one
    client; stops the bench above 1e-4."""
    got, per_input = {}, {}
    for k in SIDES:
        t0 = time.perf_counter()
        got[k] = vectors(ports[k], texts)
        per_input[k] = (time.perf_counter() - t0) / len(texts)
    diff = {}
    for k in SIDES[1:]:
        if len(got[k]) != len(got["after"]):
            raise SystemExit(f"text: {k} answered {len(got[k])} vectors for {len(texts)}")
        diff[k] = max(abs(a - b) for u, v in zip(got["after"], got[k]) for a, b in zip(u, v))
        log(f"text: {k} vs after: max |Δ| {diff[k]:.2e} over {len(texts)} vectors", "text")
        if diff[k] > 1e-4:
            raise SystemExit(f"text: {k} answers other vectors than after (max |Δ| {diff[k]})")
    return diff, per_input


def token_counts(folder, texts, max_length):
    """Tokens an input (special tokens included) before and after the cut to max_length."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    full = [len(e.ids) for e in tok.encode_batch(texts)]
    cut = [min(n, max_length) for n in full]
    return {"mean": sum(cut) / len(cut), "p50": pct(cut, 50), "p90": pct(cut, 90),
            "p99": pct(cut, 99), "max": max(cut), "cut": sum(n > max_length for n in full),
            "under_64": sum(n <= 64 for n in cut), "total": sum(cut)}


def foretell(per_input, n, rounds, prio_s, prio_rounds):
    """The timed part's expected seconds from each side's checked pace at one client (a
    round at c = 4 or 16 took about as long as at c = 1 on two cores): the cells, and the
    priority part's windows, each followed by the wait for the interactive requests still
    queued behind the bulk's (about two rounds of every bulk client's request)."""
    cells = len(CONCURRENCY) * rounds * n * sum(per_input[k] for k in SIDES)
    drain = 2 * text_priority.BULK_CLIENTS * text_priority.BULK_INPUTS * per_input["after"]
    return cells + prio_s * (0.5 + 2 * prio_rounds) + 2 * prio_rounds * (1 + drain)


def fit(per_input, most, rounds, prio_s, prio_rounds, minutes):
    """The most inputs (a multiple of K, at most `most`, at least K x 16: a request for each
    of 16 clients) whose foretold run fits `minutes`."""
    n = most
    while n > K * max(CONCURRENCY) and foretell(per_input, n, rounds, prio_s, prio_rounds) > 60 * minutes:
        n -= K
    return n


def vf_log(side):
    return os.path.join(TMP, f"log-text-{side}.txt")


def cell(ports, bodies, n, c, rounds):
    """One concurrency: `rounds` interleaved runs a side."""
    before = {k: answered_by_worker(vf_log(k), PATH) for k in VF_SIDES}
    runs = R.interleaved(list(SIDES), rounds, lambda k: closed_loop(ports[k], PATH, bodies, c,
                                                                    timeout=600))
    row = {"c": c}
    for k, rs in runs.items():
        lat = [x for _, ls, _ in rs for x in ls]
        per_run = [len(ls) * K / secs for secs, ls, _ in rs]
        row[k] = {"inputs_s": median(per_run), "inputs_s_all": [round(x, 1) for x in per_run],
                  "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "requests": len(lat),
                  "failed": sum(sum(f.values()) for _, _, f in rs)}
    for k in VF_SIDES:
        row[k]["by_worker"] = worker_share(vf_log(k), PATH, before[k], row[k]["requests"])
    for k in SIDES[1:]:
        row[f"after_over_{k}"] = (row["after"]["inputs_s"] / row[k]["inputs_s"]
                                  if row[k]["inputs_s"] else None)
    log(f"text c={c}: " + ", ".join(f"{k} {row[k]['inputs_s']:.1f}" for k in SIDES)
        + " inputs/s; after ÷ " + ", ".join(f"{k} {row[f'after_over_{k}'] or 0:.2f}"
                                           for k in SIDES[1:])
        + f"; failed {[row[k]['failed'] for k in SIDES]}; requests by worker "
        + ", ".join(f"{k} {row[k]['by_worker']}" for k in VF_SIDES), "text")
    return row


def start(folder, max_length):
    """The four servers, each waited for: ({side: server}, {side: port})."""
    srv, ports = {}, {}
    try:
        srv["after"], ports["after"] = E.vramfork(folder, max_length, tag="text-after",
                                                  args=VF_ARGS, name=NAME)
        srv["before"], ports["before"] = E.vramfork(folder, max_length, BEFORE_DIR,
                                                    "text-before", VF_ARGS, NAME)
        srv["infinity"], ports["infinity"] = text_infinity.start(
            os.path.join(folder, "hf"), NAME, os.path.join(TMP, "log-text-infinity.txt"))
        srv["python"], ports["python"] = E.litserve(1, folder, max_length)
    except BaseException:
        stop(srv)
        raise
    return srv, ports


def stop(srv):
    for s in srv.values():
        s.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--command", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shape", choices=sorted(MAX_LENGTH), default="minilm")
    ap.add_argument("--n", type=int, help="inputs a run (a multiple of 16); without it, "
                    "at most 512 (--quick: 128), as many as fit --minutes")
    ap.add_argument("--minutes", type=float, default=9.0,
                    help="the time the run may take after its servers are up, without --n")
    ap.add_argument("--rounds", type=int)
    a = ap.parse_args()
    n = a.n or (128 if a.quick else 512)
    rounds = a.rounds or (1 if a.quick else 2)
    prio_s, prio_rounds = (8, 1) if a.quick else (20, 1)
    if n % K:
        raise SystemExit(f"text: --n {n} is not a multiple of {K}")
    max_length = MAX_LENGTH[a.shape]
    folder = os.path.join(TMP, "text", f"{a.shape}-{ATTENTION}")
    t0 = time.monotonic()
    before_binaries()
    subprocess.run([PY, os.path.join(HERE, "embeddings_model.py"), folder, a.shape,
                    str(max_length), ATTENTION], check=True, stderr=subprocess.DEVNULL)
    srv, ports = start(folder, max_length)
    try:
        diff, per_input = same_vectors(ports, documents(CHECK))
        if not a.n:
            n = fit(per_input, n, rounds, prio_s, prio_rounds, a.minutes)
        expect = foretell(per_input, n, rounds, prio_s, prio_rounds)
        texts = documents(n)
        tokens = token_counts(folder, texts, max_length)
        log(f"text: {n} inputs (tokens an input p50 {tokens['p50']}, p90 {tokens['p90']}, max "
            f"{tokens['max']}, {tokens['cut']} cut at {max_length}); about {expect / 60:.1f} "
            "min to go (an input at c=1: "
            + ", ".join(f"{k} {1e3 * v:.0f} ms" for k, v in per_input.items()) + ")", "text")
        bodies = [body(texts[i:i + K]) for i in range(0, n, K)]
        rows = [cell(ports, bodies, n, c, rounds) for c in CONCURRENCY]
        prio = text_priority.measure(ports["after"], vf_log("after"), NAME, texts, prio_s,
                                     prio_rounds)
    finally:
        stop(srv)
    took = time.monotonic() - t0
    res = {"command": a.command, "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "bin": os.path.relpath(BIN, ROOT), "before": BEFORE, "shape": a.shape,
           "max_length": max_length, "n": n, "k": K, "rounds": rounds, "cpus": os.cpu_count(),
           "infinity_version": text_infinity.VERSION, "infinity_threads": text_infinity.THREADS,
           "tokens": tokens, "max_abs_diff": diff, "check_inputs": CHECK,
           "seconds_per_input_c1": per_input, "expected_s": expect, "took_s": took,
           "rows": rows, "priority": prio}
    write(res)


if __name__ == "__main__":
    main()
