"""Drives vramfork's gRPC service (KServe v2, inference.GRPCInferenceService) with NVIDIA's
own client (PyPI tritonclient[grpc]) and prints what it saw as one JSON object; the Rust
tests (tests/grpc.rs) check it.

usage:
  triton_grpc.py basics HOST:PORT MODEL CASES_JSON
      health, metadata, inference against the cases (raw contents through tritonclient,
      typed contents through its stub on the same channel), requested outputs, request ids,
      a stream, and the errors: unknown model, bad tensors, a method not served.
  triton_grpc.py spread HOST:PORT MODEL CALLS ITERS ROUNDS [WORKERS]
      ROUNDS times: CALLS async_infer at once on one client (one channel) to the slow model
      (input [[ITERS]]); the worker pid each answer came from (x-worker-pid, initial
      metadata), per round. With WORKERS: stops after the first round whose answers came
      from WORKERS workers, as many from each.
  triton_grpc.py traced HOST:PORT MODEL CALLS ITERS ROUNDS TRACE_PREFIX
      as spread, each call with its own `traceparent` metadata (trace TRACE_PREFIX + round
      and call numbers, the caller's span 00f067aa0ba902b7, sampled); stops after the first
      round answered by more than one worker. Per call: its trace, the answering pid and the
      answer's traceparent (initial metadata).
  triton_grpc.py sequential HOST:PORT MODEL COUNT
      COUNT calls one after the other on one client, through a TCP relay that counts the
      connections the client opens.
  triton_grpc.py loop HOST:PORT MODEL CONCURRENCY SECONDS
      a closed loop: CONCURRENCY calls in flight on one client for SECONDS; every error.
  triton_grpc.py auth HOST:PORT MODEL KEY
      calls without a key, with a wrong one and with KEY (`authorization: Bearer KEY`).
  triton_grpc.py deadline HOST:PORT MODEL
      while a long pass holds the one worker (slowcount.pt): two calls at once, one whose
      parameters.timeout passes while it waits and one whose client deadline
      (grpc-timeout) does; then one without a deadline (its answer counts the passes).
  triton_grpc.py tls HOST:PORT CAFILE MODEL
      health and one inference over TLS (ssl=True, the CA as root certificates).
  triton_grpc.py outputs HOST:PORT MODEL INPUT SHAPE_JSON
      one inference of INPUT (FP32, that shape, every value 0.5): each output's name and
      shape, in the answer's order."""
import json
import socket
import sys
import threading
import time

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException


def err(e):
    if isinstance(e, InferenceServerException):
        return {"status": e.status(), "message": e.message()}
    if isinstance(e, grpc.RpcError):
        return {
            "status": str(e.code()),
            "message": e.details(),
            "trailers": dict(e.trailing_metadata() or ()),
        }
    return {"status": "other", "message": repr(e)}


def mlp_input(x, typed=False):
    i = grpcclient.InferInput("input__0", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return i


def typed_request(model, x, name="input__0", datatype="FP32", values=None, shape=None):
    """A ModelInferRequest with typed contents (fp32_contents), as tritonclient never sends."""
    req = service_pb2.ModelInferRequest(model_name=model, id="typed-1")
    t = req.inputs.add()
    t.name, t.datatype = name, datatype
    t.shape.extend(shape if shape is not None else list(x.shape))
    t.contents.fp32_contents.extend(values if values is not None else x.flatten().tolist())
    return req


def call(f, *a, **kw):
    try:
        return {"ok": f(*a, **kw)}
    except Exception as e:  # every failure is reported, none hidden
        return {"error": err(e)}


def basics(url, model, cases_path):
    c = grpcclient.InferenceServerClient(url)
    stub = c._client_stub
    report = {
        "live": c.is_server_live(),
        "ready": c.is_server_ready(),
        "model_ready": c.is_model_ready(model),
        "server_metadata": c.get_server_metadata(as_json=True),
        "model_metadata": c.get_model_metadata(model, as_json=True),
        "cases": [],
    }
    with open(cases_path) as f:
        cases = json.load(f)["cases"]
    for case in cases:
        x = np.array(case["inputs"], dtype=np.float32)
        seen = {}
        r = c.infer(model, [mlp_input(x)], request_id="req-7", headers={"x-request-id": "meta-7"},
                    outputs=[grpcclient.InferRequestedOutput("output__0")])
        seen["raw"] = {"output": r.as_numpy("output__0").tolist(), "id": r.get_response().id,
                       "dtype": str(r.as_numpy("output__0").dtype)}
        r = c.infer(model, [mlp_input(x)])
        seen["no_id"] = {"output": r.as_numpy("output__0").tolist(), "id": r.get_response().id}
        resp, callinfo = stub.ModelInfer.with_call(typed_request(model, x))
        out = np.frombuffer(resp.raw_output_contents[0], dtype=np.float32).reshape(list(resp.outputs[0].shape))
        seen["typed"] = {"output": out.tolist(), "id": resp.id,
                         "metadata": dict(callinfo.initial_metadata())}
        report["cases"].append({"expected": case["outputs"], "seen": seen})
    x = np.array([[1, 2, 3, 4]], np.float32)
    bad_shape = grpcclient.InferInput("input__0", [1, 3], "FP32")
    bad_shape.set_data_from_numpy(np.array([[1, 2, 3]], np.float32))
    bad_dtype = grpcclient.InferInput("input__0", [1, 4], "INT64")
    bad_dtype.set_data_from_numpy(np.array([[1, 2, 3, 4]], np.int64))
    report["errors"] = {
        "unknown_model": call(c.infer, "nope", [mlp_input(x)]),
        "unknown_version": call(c.infer, model, [mlp_input(x)], model_version="99"),
        "bad_shape": call(c.infer, model, [bad_shape]),
        "bad_dtype": call(c.infer, model, [bad_dtype]),
        "unknown_output": call(c.infer, model, [mlp_input(x)],
                               outputs=[grpcclient.InferRequestedOutput("nope")]),
        "not_served": call(c.get_model_config, model),
        "typed_count": call(lambda: stub.ModelInfer(typed_request(model, x, values=[1.0, 2.0]))),
        "typed_trailers": call(lambda: stub.ModelInfer(typed_request(model, x, name="x"))),
    }
    report["stream"] = stream(c, model)
    print(json.dumps(report, default=str))


def stream(c, model):
    """Three requests on one stream, the second bad: answered in order, the bad one's error
    on the stream, the stream going on."""
    got = []
    done = threading.Event()

    def cb(result, error):
        got.append({"id": result.get_response().id, "output": result.as_numpy("output__0").tolist()}
                   if error is None else {"error": error.message()})
        if len(got) == 3:
            done.set()

    c.start_stream(callback=cb)
    x = np.array([[1, 2, 3, 4]], np.float32)
    bad = grpcclient.InferInput("input__0", [1, 3], "FP32")
    bad.set_data_from_numpy(np.array([[1, 2, 3]], np.float32))
    c.async_stream_infer(model, [mlp_input(x)], request_id="s1")
    c.async_stream_infer(model, [bad], request_id="s2")
    c.async_stream_infer(model, [mlp_input(x * 2)], request_id="s3")
    done.wait(60)
    c.stop_stream()
    return got


def slow_input(iters):
    i = grpcclient.InferInput("input__0", [1, 1], "FP32")
    i.set_data_from_numpy(np.array([[iters]], np.float32))
    return i


def pid_of(ctx):
    """The worker that answered an async_infer: x-worker-pid of its initial metadata (the
    grpc future behind tritonclient's CallContext)."""
    return dict(ctx._CallContext__grpc_future.initial_metadata()).get("x-worker-pid")


def even(pids, workers):
    """Whether the answers came from `workers` workers, as many from each."""
    counts = [pids.count(p) for p in set(pids)]
    return len(counts) == workers and len(set(counts)) == 1


def spread(url, model, calls, iters, rounds, workers=None):
    c = grpcclient.InferenceServerClient(url)
    out = {"rounds": [], "errors": []}
    for _ in range(rounds):
        left = threading.Semaphore(0)
        errors = []

        def cb(result, error):
            if error is not None:
                errors.append(err(error))
            left.release()

        ctxs = [c.async_infer(model, [slow_input(iters)], cb) for _ in range(calls)]
        for _ in ctxs:
            left.acquire()
        out["rounds"].append([pid_of(x) for x in ctxs])
        out["errors"] += errors
        if workers is not None and even(out["rounds"][-1], workers):
            break
    print(json.dumps(out, default=str))


def traced(url, model, calls, iters, rounds, prefix):
    c = grpcclient.InferenceServerClient(url)
    out = {"rounds": [], "errors": []}
    for r in range(int(rounds)):
        left = threading.Semaphore(0)

        def cb(result, error):
            if error is not None:
                out["errors"].append(err(error))
            left.release()

        traces = [prefix + "%02d%02d" % (r, k) for k in range(int(calls))]
        ctxs = [c.async_infer(model, [slow_input(int(iters))], cb,
                              headers={"traceparent": "00-%s-00f067aa0ba902b7-01" % t})
                for t in traces]
        for _ in ctxs:
            left.acquire()
        meta = [dict(x._CallContext__grpc_future.initial_metadata()) for x in ctxs]
        got = [{"trace": t, "pid": m.get("x-worker-pid"), "traceparent": m.get("traceparent")}
               for t, m in zip(traces, meta)]
        out["rounds"].append(got)
        if len({g["pid"] for g in got}) > 1:
            break
    print(json.dumps(out, default=str))


class Relay:
    """A TCP relay on 127.0.0.1 that counts the connections made through it."""

    def __init__(self, target):
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.connections = 0
        threading.Thread(target=self.accept, daemon=True).start()

    def url(self):
        return "127.0.0.1:%d" % self.sock.getsockname()[1]

    def accept(self):
        while True:
            a, _ = self.sock.accept()
            self.connections += 1
            b = socket.create_connection(self.target)
            for s, d in ((a, b), (b, a)):
                threading.Thread(target=self.pipe, args=(s, d), daemon=True).start()

    @staticmethod
    def pipe(s, d):
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    break
                d.sendall(data)
        except OSError:
            pass
        for x in (d,):
            try:
                x.shutdown(socket.SHUT_WR)
            except OSError:
                pass


def sequential(url, model, count):
    relay = Relay(url)
    c = grpcclient.InferenceServerClient(relay.url())
    x = np.array([[1, 2, 3, 4]], np.float32)
    errors, pids = [], set()
    for _ in range(count):
        try:
            resp, info = c._client_stub.ModelInfer.with_call(typed_request(model, x))
            pids.add(dict(info.initial_metadata()).get("x-worker-pid"))
        except Exception as e:
            errors.append(err(e))
    print(json.dumps({"connections": relay.connections, "errors": errors, "pids": sorted(pids)}))


def loop(url, model, concurrency, seconds):
    c = grpcclient.InferenceServerClient(url)
    x = np.array([[1, 2, 3, 4]], np.float32)
    lock = threading.Lock()
    stats = {"done": 0, "errors": []}
    finished = threading.Semaphore(0)
    end = time.monotonic() + seconds

    def issue():
        c.async_infer(model, [mlp_input(x)], cb)

    def cb(result, error):
        with lock:
            if error is not None:
                stats["errors"].append(err(error))
            else:
                stats["done"] += 1
        if time.monotonic() < end:
            issue()
        else:
            finished.release()

    for _ in range(concurrency):
        issue()
    for _ in range(concurrency):
        finished.acquire()
    print(json.dumps(stats))


def auth(url, model, key):
    c = grpcclient.InferenceServerClient(url)
    x = np.array([[1, 2, 3, 4]], np.float32)
    stub = c._client_stub
    print(json.dumps({
        "live_without_key": call(c.is_server_live),
        "ready_without_key": call(c.is_server_ready),
        "missing": call(c.infer, model, [mlp_input(x)]),
        "missing_metadata": call(c.get_model_metadata, model),
        "wrong": call(c.infer, model, [mlp_input(x)], headers={"authorization": "Bearer nope"}),
        "wrong_trailers": call(lambda: stub.ModelInfer(
            typed_request(model, x), metadata=(("authorization", "Bearer nope"),))),
        "good": call(lambda: c.infer(model, [mlp_input(x)], headers={"authorization": "Bearer " + key})
                     .as_numpy("output__0").tolist()),
    }))


def deadline(url, model):
    """Sent while the one worker runs a long pass (the test waits for it)."""
    c = grpcclient.InferenceServerClient(url)
    out = {}
    left = threading.Semaphore(0)

    def done(name):
        def cb(result, error):
            out[name] = {"error": err(error)} if error is not None else {
                "ok": result.as_numpy("output__0").tolist()}
            left.release()
        return cb

    # Both in flight at once, both waiting behind the long pass.
    c.async_infer(model, [slow_input(1)], done("parameter"), timeout=100000)
    c.async_infer(model, [slow_input(1)], done("grpc_timeout"), client_timeout=0.2)
    left.acquire()
    left.acquire()
    out["after"] = call(lambda: c.infer(model, [slow_input(1)]).as_numpy("output__0").tolist())
    print(json.dumps(out, default=str))


def tls(url, cafile, model):
    with open(cafile, "rb") as f:
        ca = f.read()
    c = grpcclient.InferenceServerClient(url, ssl=True, root_certificates=cafile)
    x = np.array([[1, 2, 3, 4]], np.float32)
    print(json.dumps({
        "live": call(c.is_server_live),
        "infer": call(lambda: c.infer(model, [mlp_input(x)]).as_numpy("output__0").tolist()),
        "ca_bytes": len(ca),
    }))


def outputs(url, model, name, shape):
    c = grpcclient.InferenceServerClient(url)
    i = grpcclient.InferInput(name, json.loads(shape), "FP32")
    i.set_data_from_numpy(np.full(json.loads(shape), 0.5, np.float32))
    r = c.infer(model, [i]).get_response()
    print(json.dumps({"outputs": [{"name": o.name, "shape": list(o.shape)} for o in r.outputs]}))


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "basics":
        basics(*args)
    elif cmd == "spread":
        spread(args[0], args[1], *map(int, args[2:]))
    elif cmd == "traced":
        traced(*args)
    elif cmd == "sequential":
        sequential(args[0], args[1], int(args[2]))
    elif cmd == "loop":
        loop(args[0], args[1], int(args[2]), float(args[3]))
    elif cmd == "auth":
        auth(*args)
    elif cmd == "deadline":
        deadline(*args)
    elif cmd == "tls":
        tls(*args)
    elif cmd == "outputs":
        outputs(*args)
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()
