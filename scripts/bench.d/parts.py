#!/usr/bin/env python3
"""scripts/bench: the one entry point and the one registry of the bench's parts.

Each part is one row of PARTS: its name (`--only NAME`), what it measures, about how long it
takes after the build, what it needs made first, and the program that runs it. `scripts/bench`
with no `--only` runs every part in turn (the full bench), and names any part it leaves out
and why (only `memory`, when not run as root: it makes a memory cgroup). `--quick` makes each
part shorter where the part has a quick form. Results go to bench/ (each part's file names
are in its row). Loopback only; the load generator shares the machine's cores, so compare
ratios within one run, not absolute figures across machines.

    scripts/bench                 every part (about 45 minutes after the build)
    scripts/bench --quick         every part, short (about 15 minutes)
    scripts/bench --only NAME     one part
    scripts/bench --help          this text and the parts

VRAMFORK_BENCH_BIN=DIR runs the parts on the binaries in DIR without building (a smoke run of
the bench itself, e.g. on target/debug: its figures mean nothing).
"""
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, log  # noqa: E402

PY = os.environ.get("VRAMFORK_PYTHON", sys.executable)  # the torch venv's (scripts/env.sh)
D = "scripts/bench.d"

# What a part needs made first (in bench/tmp), each made once per run.
PREPARE = {
    "models": [PY, f"{D}/make_model.py", "bench/tmp"],
    "real-libraries": [PY, "-c", "import torchvision, transformers"],
    "real": [PY, f"{D}/make_real.py", "bench/tmp/real"],
    "embeddings-libraries": [PY, "-c", "import litserve, sentence_transformers"],
    # NVIDIA's aiperf in a venv of its own (it wants transformers 5; the tests pin 4).
    "aiperf": ["bash", "-c", "test -x bench/tmp/aiperf-venv/bin/aiperf || { python3 -m venv "
               "bench/tmp/aiperf-venv && bench/tmp/aiperf-venv/bin/pip install --quiet "
               "--disable-pip-version-check aiperf==0.13.0; }"],
    # Infinity (infinity-emb, pinned) in a venv of its own; see text_infinity.py.
    "infinity": [PY, f"{D}/text_infinity.py", "--prepare"],
    "cnn": [PY, f"{D}/make_real.py", "bench/tmp/real", "cnn"],
    "shapes": [PY, "tests/support/make_shapes.py", "bench/tmp/shapes", "mlp64", "mlp256",
               "mlp1024", "conv1d", "attention"],
}
# torchvision and transformers, pinned to match torch 2.11.0 (bench only), installed when the
# import above fails; the same for the embeddings and rerank parts' Python servers.
LIBRARIES = {
    "real-libraries": ["torchvision==0.26.0", "transformers==4.57.1"],
    "embeddings-libraries": ["litserve==0.2.19", "sentence-transformers==5.7.0",
                             "transformers==4.57.1"],
}


@dataclass
class Part:
    name: str
    minutes: int
    what: str
    run: list
    timeout_s: int = 1800
    quick: bool = True  # takes --quick
    prepare: list = field(default_factory=list)
    needs_root: bool = False
    # Run inside the full run's `core` (run.py's full mode measures it and writes it into
    # bench/results.*), so the full run does not run it again.
    in_core: bool = False


def run_py(only=None):
    return ["python3", f"{D}/run.py"] + (["--only", only] if only else [])


PARTS = [
    Part("core", 17, "the model's own forward-pass limit, served throughput and latency through "
         "`app --production` (1 and 2 workers, concurrency 1/2/4/8, wrk), recycling cost "
         "(--max-requests 1/10/100 vs persistent), worker boot, cold start and memory, for the "
         "small MLP and a ~5-20 ms model; then metrics, v2, warm, first, batching, real and "
         "shapes below, and the targets; to bench/results.{json,md,svg}",
         run_py(), 5400, prepare=["real-libraries", "real", "shapes", "cnn"]),
    Part("metrics", 2, "metrics on vs off and scrape times; to bench/metrics.{json,md}",
         run_py("metrics"), in_core=True),
    Part("v2", 2, "POST / vs v2 JSON vs v2 binary (small MLP, 224x224 image); to "
         "bench/v2.{json,md}", run_py("v2"), in_core=True),
    Part("warm", 2, "--max-requests 1 vs persistent, warm vs cold template (medium model); to "
         "bench/warm.{json,md}", run_py("warm"), in_core=True),
    Part("first", 2, "warm exec'd workers: an exec'd worker's first request ÷ its steady "
         "latency with --warmup-passes 0/1/2/3, medium model and small MLP, median of 7 starts "
         "each; to bench/first.{json,md}", run_py("first"), in_core=True),
    Part("batching", 7, "dynamic batching off vs --max-batch-size 16 at concurrency 1/4/16/64 "
         "for the small MLP, the medium model and a memory-bound wide one: req/s, p50/p99, the "
         "batch sizes formed, served ÷ the model's own batched loop; to "
         "bench/batching.{json,md}", run_py("batching"), in_core=True),
    Part("real", 25, "real architectures with random weights (a CIFAR-style CNN as POST / "
         "JSON and v2 binary, ResNet-50, a BERT-base encoder): served ÷ the model's own loop "
         "at c=1/2/4/16, PSS of 2 workers, template used or not, ResNet-50 --max-requests 1 ÷ "
         "persistent; the small MLP against its combined ceiling at c=16/64; to "
         "bench/real.{json,md}", run_py("real"), 5400, prepare=["real-libraries", "real"],
         in_core=True),
    Part("shapes", 15, "plain models of other shapes than the fixtures (MLPs of widths "
         "64/256/1024, a 1-D conv net, a transformer encoder block, the CNN): served ÷ the "
         "model's own loop at c=1/4/16, rows below their floor FLAGGED; to "
         "bench/shapes.{json,md}", run_py("shapes"), prepare=["shapes", "cnn"], in_core=True),
    Part("access", 3, "the access log off vs on (small MLP, 2 workers, c=16/64, interleaved); "
         "to bench/access.{json,md}", run_py("access")),
    Part("tls", 2, "TLS vs plain HTTP (small MLP, 2 workers, c=16, keep-alive and a new "
         "connection per request, interleaved); to bench/tls.{json,md}", run_py("tls")),
    Part("grpc", 5, "gRPC (tritonclient.grpc) vs REST v2 binary (wrk) for the small MLP and the "
         "CNN, 2 workers x 1 torch thread, c=1/4/16: served ÷ the model's own loop; to "
         "bench/grpc.{json,md}", [PY, f"{D}/grpc_bench.py"], prepare=["cnn"]),
    Part("torchserve", 5, "the same TorchServe archive (image_classifier, a small CNN) served by "
         "TorchServe 0.12 (Java 17, 2 workers, its batching off and on) and by vramfork (2 "
         "workers, batching off and on) on the same cores: req/s and p50/p99 at c=1/4/16, "
         "cold start, PSS; to bench/torchserve.{json,md}", [PY, f"{D}/torchserve.py"]),
    Part("documents", 5, "text and image classification with documents pre-processed in the "
         "worker vs in the client sending tensors: docs/s at 1 and 4 clients; to "
         "bench/documents.{json,md}", [PY, f"{D}/documents.py"]),
    Part("queue", 4, "queue length against latency, to choose an autoscaling threshold (the CNN "
         "on 2 workers, 1 to 16 closed-loop clients, vramfork_requests_waiting sampled every "
         "100 ms); to bench/queue.{json,md}", ["python3", f"{D}/queue_latency.py"],
         quick=False, prepare=["cnn"]),
    Part("memory", 3, "a model leaking 24 MB per request, without and with "
         "--max-worker-memory-mb 240, in a 2 GB memory cgroup made for them: the tree's memory "
         "over time, req/s, failures, OOM kills; to bench/memory.{json,md,svg}",
         ["python3", f"{D}/memory.py"], 900, needs_root=True),
    Part("h2flood", 2, "a normal HTTP/1.1 client's rate alone, beside 4 processes flooding "
         "WINDOW_UPDATE(+1) frames on HTTP/2 connections, and beside 4 that reconnect whenever "
         "one is ended; to bench/h2flood.{json,md}", ["python3", f"{D}/h2_flood.py"], 600,
         quick=False),
    Part("pt2", 30, "each format served ÷ its own loop: the MLP 64-256-256-16, the CNN, "
         "ResNet-50 and BERT-base (random weights, made and compiled once: about 3 minutes on "
         "two cores) as TorchScript, a torch.export program (Native Runtime) and an "
         "AOTInductor package, c=1/4/16, load time, PSS of 2 workers; to bench/pt2.{json,md}",
         [PY, f"{D}/pt2.py"], 3600),
    Part("tracing", 4, "what exporting spans costs: the small MLP and the CNN at c=16 with "
         "tracing off, on (every request sampled, exported to an OTLP receiver on loopback) and "
         "on to a collector nobody listens on, interleaved; to bench/tracing.{json,md}",
         [PY, f"{D}/tracing.py"], prepare=["cnn"]),
    Part("embeddings", 6, "embeddings/s through /v1/embeddings (base64, as OpenAI's SDK asks) "
         "beside the same server's v2 binary door and sentence-transformers behind LitServe's "
         "OpenAI embeddings spec, a MiniLM-L6-shaped encoder, 1 and 16 sentences a request, "
         "c=1/4/16, interleaved, and aiperf --endpoint-type embeddings at c=4/16; to "
         "bench/embeddings.{json,md}", [PY, f"{D}/embeddings.py"],
         prepare=["embeddings-libraries", "aiperf"]),
    Part("rerank", 45, "documents reranked a second through /v1/rerank (Jina/Cohere v1) "
         "beside sentence-transformers' CrossEncoder behind LitServe taking the same body, a "
         "MiniLM-L6-shaped cross-encoder, one query against 100 and 1,000 documents of mixed "
         "length, c=1/4/16 closed-loop clients, interleaved: docs/s, p50/p99; --quick: 100 "
         "documents only, about 7 minutes; 16 clients of 1,000 documents are most of the "
         "full form's time on 2 cores; to bench/rerank.{json,md}", [PY, f"{D}/rerank.py"], 5400,
         prepare=["embeddings-libraries"]),
    Part("text", 12, "N mixed-length inputs (many short, a tail cut at max_length; 512 by "
         "default, --quick 128) through /v1/embeddings in requests of 16 at c=1/4/16: this "
         "build against the release build of 834a3b3, Infinity (infinity-emb 0.0.78, torch "
         "engine) and sentence-transformers behind LitServe, interleaved, a MiniLM-L6-shaped "
         "encoder (text.py --shape bert-base: BERT-base); then an interactive request's "
         "p50/p99 beside a bulk ingestion, with and without vLLM's `priority` field; to "
         "bench/text.{json,md}", [PY, f"{D}/text.py"], 1800,
         prepare=["embeddings-libraries", "infinity"]),
    Part("ledger", 1, "the GPU-memory ledger and --idle-release on one simulated A100 (small MLP "
         "on the CPU): the first request after an idle release (connect → answer, 7 rounds) "
         "beside a warm request, `app plan` with and without the ledger, TTIN → the grown "
         "reservation written; to bench/ledger.{json,md}", ["python3", f"{D}/ledger.py"], 900,
         quick=False),
    Part("lending", 3, "three apps on one simulated A100 where two fit, bursts alternating: "
         "requests answered and refused, p50/p99 of a burst's first request, with lending "
         "(--evictable-after) and with today's timer alone (--idle-release); to "
         "bench/lending.{json,md}", ["python3", f"{D}/lending.py"], 900, quick=False),
]
BY_NAME = {p.name: p for p in PARTS}


def usage():
    lines = [__doc__.strip(), "", "Parts (--only NAME; minutes after the build):", ""]
    for p in PARTS:
        lines.append(f"  {p.name:<10} ~{p.minutes:>2} min  {p.what}"
                     + ("  [needs root]" if p.needs_root else "")
                     + ("  [in core]" if p.in_core else ""))
    return "\n".join(lines)


def fail(msg):
    print(f"scripts/bench: {msg}", file=sys.stderr)
    sys.exit(2)


def args(argv):
    """(quick, only) from the command line; exits 2 with a message on anything else."""
    quick, only, i = False, None, 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            print(usage())
            sys.exit(0)
        elif a == "--quick":
            quick = True
        elif a == "--only":
            if i + 1 >= len(argv) or argv[i + 1] not in BY_NAME:
                got = f" {argv[i + 1]}" if i + 1 < len(argv) else ""
                fail(f"--only{got}: not one of {', '.join(BY_NAME)}")
            only = argv[i + 1]
            i += 1
        else:
            fail(f"unknown argument {a} (try --help)")
        i += 1
    return quick, only


def prepare(names, done):
    for name in names:
        if name in done:
            continue
        done.add(name)
        if name in LIBRARIES:
            if subprocess.run(PREPARE[name], cwd=ROOT, stderr=subprocess.DEVNULL).returncode:
                subprocess.run([PY, "-m", "pip", "install", "--quiet",
                                "--disable-pip-version-check", *LIBRARIES[name]], cwd=ROOT,
                               check=True)
            continue
        subprocess.run(PREPARE[name], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def main():
    quick, only = args(sys.argv[1:])
    command = "scripts/bench" + (" --quick" if quick else "") + (f" --only {only}" if only else "")
    subprocess.run(["bash", "-c", "source scripts/env.sh && vf_need_wrk scripts/bench"],
                   cwd=ROOT, check=True)
    if os.environ.get("VRAMFORK_BENCH_BIN"):
        # A smoke run of the bench itself on other binaries (the debug build): no build, and
        # figures that mean nothing.
        log(f"binaries of {os.environ['VRAMFORK_BENCH_BIN']} (VRAMFORK_BENCH_BIN): a smoke run")
    else:
        subprocess.run(["cargo", "build", "--release", "--workspace"], cwd=ROOT, check=True)
    os.makedirs(os.path.join(ROOT, "bench", "tmp"), exist_ok=True)
    done = set()
    prepare(["models"], done)
    if only:
        chosen, left_out = [BY_NAME[only]], []
    else:
        chosen = [p for p in PARTS if not p.in_core]
        left_out = [(p, "needs root (it makes a memory cgroup)") for p in chosen
                    if p.needs_root and os.geteuid() != 0]
        chosen = [p for p in chosen if p not in [q for q, _ in left_out]]
    failed = []
    for p in chosen:
        prepare(p.prepare, done)
        cmd = ["timeout", str(p.timeout_s)] + p.run + (["--quick"] if quick and p.quick else [])
        cmd += ["--command", command]
        log(f"{p.name}: {' '.join(cmd[2:])}")
        t0 = time.monotonic()
        rc = subprocess.run(cmd, cwd=ROOT).returncode
        log(f"{p.name}: {'done' if rc == 0 else f'FAILED (exit {rc})'} in "
            f"{time.monotonic() - t0:.0f} s")
        if rc:
            failed.append(p.name)
    for p, why in left_out:
        log(f"left out: {p.name}: {why}")
    if failed:
        log(f"failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
