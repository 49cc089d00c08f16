"""HTTPS clients for tests/tls.rs, on Python's own ssl module and NVIDIA's tritonclient.

usage:
  tls_client.py triton HOST:PORT CAFILE MODEL
      one v2 inference with tritonclient.http (ssl=True, the CA given through its
      ssl_context_factory); prints {"ready", "ok", "output"} or the error.
  tls_client.py fingerprint HOST:PORT CAFILE
      one handshake; prints {"fingerprint"}: the SHA-256 of the certificate the server sent.
  tls_client.py keepalive HOST:PORT CAFILE BODY
      POST / with BODY again and again on one kept-alive HTTPS connection (opening a new one
      only when the server answered `Connection: close`, as clients do) until standard input
      closes; prints "answered" once it has its first answer, then at the end
      {"requests", "failures", "connections", "fingerprints"}: every request
      that did not get a 200, and the SHA-256 of the certificate each connection saw, in
      order."""
import hashlib
import http.client
import json
import ssl
import sys
import threading


def context(cafile):
    ctx = ssl.create_default_context(cafile=cafile)
    return ctx


def triton(addr, cafile, model):
    import tritonclient.http as httpclient
    from triton_auth import ready_and_infer  # beside this script

    client = httpclient.InferenceServerClient(
        url=addr, ssl=True, ssl_context_factory=lambda: context(cafile)
    )
    print(json.dumps(ready_and_infer(client, model)))


def fingerprint(addr, cafile):
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), context=context(cafile), timeout=30)
    conn.connect()
    der = conn.sock.getpeercert(binary_form=True)
    conn.close()
    print(json.dumps({"fingerprint": hashlib.sha256(der).hexdigest()}))


def keepalive(addr, cafile, body):
    host, port = addr.rsplit(":", 1)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    ctx = context(cafile)
    conn = None
    out = {"requests": 0, "failures": [], "connections": 0, "fingerprints": []}
    while not stop.is_set():
        if conn is None:
            conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=30)
            conn.connect()
            out["connections"] += 1
            der = conn.sock.getpeercert(binary_form=True)
            out["fingerprints"].append(hashlib.sha256(der).hexdigest())
        try:
            conn.request("POST", "/", body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            out["requests"] += 1
            if out["requests"] == 1:
                print("answered", flush=True)
            if r.status != 200:
                out["failures"].append(f"status {r.status}")
            if r.getheader("Connection", "").lower() == "close":
                conn.close()
                conn = None
        except Exception as e:  # a reset or a closed connection: a failed request
            out["requests"] += 1
            out["failures"].append(repr(e))
            conn.close()
            conn = None
    print(json.dumps(out))


def main():
    mode = sys.argv[1]
    if mode == "triton":
        triton(*sys.argv[2:5])
    elif mode == "fingerprint":
        fingerprint(*sys.argv[2:4])
    elif mode == "keepalive":
        keepalive(*sys.argv[2:5])
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
