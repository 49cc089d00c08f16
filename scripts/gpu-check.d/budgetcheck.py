#!/usr/bin/env python3
"""The `budget` step of scripts/gpu-check: a burst of the longest documents stays within the
footprint the warm-up measured, because every pass keeps to the token budget
(`max_batch_tokens`, rows x padded length) whose worst shape the warm-up ran.

  budgetcheck.py make WORK SIZE     the encoder, its tokenizer, metadata and request bodies
  budgetcheck.py burst PORT LOG WORK CUDA
                                    the burst and the comparison; prints one line of figures

SIZE `base` is BERT-base's shape (12 layers of width 768, 12 heads, 512 positions, eager
attention, whose scores grow with rows x tokens^2; its output the states' mean, so that
answers stay small), random weights, made with this machine's transformers; `small` (a rehearsal on the CPU) is one layer of width 32 and 128
positions. The tokenizer is a word-level one over made-up words ("w0" ...), so that documents
of any length can be written.

The burst: 4 clients at once, each sending a `/v1/embeddings` request and a `POST /` request
of 4 passes' worth of `max_length` documents (the first cut shortest first by the text
door, the second run in parts). With CUDA the worker's caching-allocator peak (reserved
bytes, `vramfork_worker_gpu_allocator_peak_bytes`) after the burst is compared with the
same figure after its warm-up, and with the footprint the master measured
(`memory_profiled`). Without CUDA (the rehearsal) there is no allocator to compare: only
the rest is checked. Either way every answer must be 200 with a row a document, and no
pass may hold more than the budget (`vramfork_text_pass_tokens_max`). Exit 0 PASS, 1 FAIL.
"""
import http.client
import json
import os
import re
import sys
import threading
import time

MIB = 1 << 20
SHAPES = {
    # layers, width, heads, positions, budget (tokens a pass)
    "base": (12, 768, 12, 512, 16384),
    "small": (1, 32, 8, 128, 2048),
}
VOCAB = 2000
CLIENTS = 4
PASSES = 4  # a request's documents: this many passes' worth
PATIENCE = 20.0


def err(*a):
    print(*a, file=sys.stderr, flush=True)


def cmd_make(work, size):
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertModel

    layers, width, heads, positions, budget = SHAPES[size]
    os.makedirs(work, exist_ok=True)
    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(os.path.join(work, "tokenizer.json"))
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=width, num_hidden_layers=layers,
                     num_attention_heads=heads, intermediate_size=4 * width,
                     max_position_embeddings=positions, torchscript=True, attn_implementation="eager")

    class Hidden(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            states = self.m(input_ids=input_ids, attention_mask=attention_mask)[0]
            mask = attention_mask.unsqueeze(-1).to(states.dtype)
            return (states * mask).sum(1) / mask.sum(1).clamp(min=1.0)

    model = Hidden(BertModel(cfg, add_pooling_layer=False)).eval().to(dev)
    ids = torch.randint(2, len(vocab), (2, 8), device=dev)
    with torch.no_grad():
        torch.jit.trace(model, (ids, torch.ones_like(ids))).save(os.path.join(work, "encoder.pt"))
    rows = budget // positions
    meta = {
        "name": "encoder",
        "model": os.path.join(work, "encoder.pt"),
        "est_gpu_mem_min": 1000,
        "est_gpu_mem_typ": 4000,
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1],
                    "tokenizer": {"file": "tokenizer.json", "max_length": positions, "truncation": True,
                                  "max_documents": PASSES * rows}}],
        "embeddings": {"pooling": "none"},
        "max_batch_tokens": budget,
    }
    with open(os.path.join(work, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    # Documents longer than max_length (cut there), each its own words.
    docs = [" ".join(f"w{(d * 7 + k) % VOCAB}" for k in range(positions + 16)) for d in range(PASSES * rows)]
    with open(os.path.join(work, "embeddings.json.in"), "w") as f:
        json.dump({"input": docs, "model": "encoder"}, f)
    with open(os.path.join(work, "post.json.in"), "w") as f:
        json.dump({"inputs": docs}, f)
    with open(os.path.join(work, "shape.json"), "w") as f:
        json.dump({"size": size, "layers": layers, "width": width, "positions": positions,
                   "budget": budget, "documents": len(docs), "device": dev}, f)
    err(f"encoder.pt ({size}: {layers} layers of width {width}, {positions} positions, made on {dev}); "
        f"{len(docs)} documents a request, budget {budget} tokens ({rows} documents) a pass")
    return 0


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        c.close()


def post(port, path, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        c.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def metric(text, name, labels=""):
    """The sum of a family's samples whose labels contain `labels` (None: no such sample)."""
    got = None
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, _, value = line.rpartition(" ")
            if labels in head:
                got = (got or 0.0) + float(value)
    return got


def until(what, check):
    end = time.monotonic() + PATIENCE
    while True:
        v = check()
        if v is not None:
            return v
        if time.monotonic() > end:
            raise SystemExit(f"never saw {what} within {PATIENCE:.0f} s")
        time.sleep(0.1)


def log_field(log, event, field):
    """The last `event`'s `field` in a server log (text or JSON lines)."""
    got = None
    pat = re.compile(rf'\b{field}"?[=:] ?"?([^ ",}}]+)')
    with open(log, errors="replace") as f:
        for line in f:
            if event in line:
                m = pat.search(line)
                got = m.group(1) if m else got
    return got


def burst(port, work):
    """Every client's two requests; the failures, as text."""
    bodies = [("/v1/embeddings", open(os.path.join(work, "embeddings.json.in"), "rb").read()),
              ("/", open(os.path.join(work, "post.json.in"), "rb").read())]
    n = json.load(open(os.path.join(work, "shape.json")))["documents"]
    failures = []

    def client():
        for path, body in bodies:
            try:
                status, data = post(port, path, body)
            except OSError as e:
                failures.append(f"{path}: no answer ({e!r})")
                continue
            if status != 200:
                failures.append(f"{path}: {status} {data[:200]!r}")
                continue
            doc = json.loads(data)
            rows = len(doc["data"] if path != "/" else doc["outputs"])
            if rows != n:
                failures.append(f"{path}: {rows} rows for {n} documents")

    ts = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return failures


def cmd_burst(port, log, work, cuda):
    port, cuda = int(port), cuda == "1"
    shape = json.load(open(os.path.join(work, "shape.json")))
    mport = log_field(log, "metrics_listening", "addr")
    mport = int(mport.rsplit(":", 1)[1]) if mport else None
    if not mport:
        print("the server logged no metrics_listening address")
        return 1
    scrape = lambda: get(mport, "/metrics")[1]
    peak_name = "vramfork_worker_gpu_allocator_peak_bytes"
    before = until(f"{peak_name} after the warm-up", lambda: metric(scrape(), peak_name)) if cuda else None
    t0 = time.monotonic()
    failures = burst(port, work)
    took = time.monotonic() - t0
    sent = 2 * CLIENTS

    def after_burst():
        text = scrape()
        answered = metric(text, "vramfork_requests_total", 'code="200"') or 0
        passed = metric(text, "vramfork_text_pass_tokens_max") or 0
        return text if answered >= sent and passed > 0 else None

    text = until(f"{sent} answers and the passes' tokens in /metrics", after_burst)
    largest = metric(text, "vramfork_text_pass_tokens_max")
    fails = list(failures)
    if largest > shape["budget"]:
        fails.append(f"a pass held {largest:.0f} tokens, over the budget of {shape['budget']}")
    if cuda:
        peaks, more = allocator_verdict(before, metric(text, peak_name),
                                        log_field(log, "memory_profiled", "measured_mb"))
        fails += more
    else:
        peaks = "no CUDA allocator here (a rehearsal): peaks not compared"
    print(f"{shape['size']} encoder ({shape['layers']} x {shape['width']}, {shape['positions']} positions), "
          f"budget {shape['budget']} tokens: {CLIENTS} clients x (embeddings + POST /) of "
          f"{shape['documents']} documents of {shape['positions']} tokens in {took:.1f} s; "
          f"largest pass {largest:.0f} tokens; {peaks}; {len(fails)} failures"
          + (": " + "; ".join(fails[:3]) if fails else ""))
    return 0 if not fails else 1


def allocator_verdict(before, after, measured_mb):
    """The worker's caching-allocator peak (reserved bytes) after its warm-up and after the
    burst, and the footprint the master measured (MiB, or None): (figures, failures)."""
    fails = []
    if after is None:
        return "no allocator peak after the burst", ["no allocator peak after the burst"]
    tolerance = max(0.05 * before, 64 * MIB)
    if after > before + tolerance:
        fails.append(f"the burst took the allocator peak to {after / MIB:.0f} MiB, past the warm-up's "
                     f"{before / MIB:.0f} MiB (+{tolerance / MIB:.0f})")
    if measured_mb is None:
        fails.append("the master logged no measured footprint (memory_profiled)")
    elif after > int(measured_mb) * MIB:
        fails.append(f"the burst's allocator peak {after / MIB:.0f} MiB is past the footprint the "
                     f"master measured ({measured_mb} MiB)")
    return (f"allocator peak (reserved) after the warm-up {before / MIB:.0f} MiB, after the burst "
            f"{after / MIB:.0f} MiB; the master measured {measured_mb} MiB a worker"), fails


if __name__ == "__main__":
    cmds = {"make": cmd_make, "burst": cmd_burst}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        err(f"usage: budgetcheck.py {{{','.join(cmds)}}} ARGS...")
        sys.exit(2)
    sys.exit(cmds[sys.argv[1]](*sys.argv[2:]))
