"""A plain-socket HTTP/2 client (prior knowledge, no TLS) on the Python h2 library (PyPI
`h2`), for the tests' helpers that speak HTTP/2 frame by frame (h2_attacks.py, grpc_raw.py):
it sends requests as their windows allow and keeps what comes back on each stream."""
import select
import socket
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings


class H2:
    """One HTTP/2 connection (prior knowledge, no TLS) and what came back on it."""

    def __init__(self, host, port, window=None):
        self.sock = socket.create_connection((host, port))
        self.host = "%s:%d" % (host, port)
        cfg = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.c = h2.connection.H2Connection(config=cfg)
        if window is not None:
            self.c.local_settings = h2.settings.Settings(
                client=True,
                initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window},
            )
        self.c.initiate_connection()
        self.pending = {}
        self.heads, self.data, self.ended = 0, 0, 0
        self.status, self.headers, self.trailers = {}, {}, {}
        self.closed = None
        self.goaway = None
        self.flush()

    def flush(self):
        out = self.c.data_to_send()
        if out and self.closed is None:
            try:
                self.sock.sendall(out)
            except OSError as e:
                self.closed = "send: %s" % e.__class__.__name__

    def request(self, path, body, headers=()):
        sid = self.c.get_next_available_stream_id()
        self.c.send_headers(
            sid,
            [(":method", "POST"), (":path", path), (":scheme", "http"),
             (":authority", self.host)] + list(headers),
        )
        self.pending[sid] = body
        self.pump()
        return sid

    def pump(self):
        for sid, b in list(self.pending.items()):
            while b:
                n = min(len(b), self.c.local_flow_control_window(sid),
                        self.c.max_outbound_frame_size)
                if n <= 0:
                    break
                self.c.send_data(sid, b[:n])
                b = b[n:]
            self.pending[sid] = b
            if not b:
                self.c.end_stream(sid)
                del self.pending[sid]
        self.flush()

    def readable(self):
        try:
            d = self.sock.recv(1 << 16)
        except OSError as e:
            self.closed = e.__class__.__name__
            return
        if not d:
            self.closed = "eof"
            return
        try:
            events = self.c.receive_data(d)
        except h2.exceptions.ProtocolError as e:
            self.closed = "protocol error: %s" % e
            return
        for e in events:
            if isinstance(e, h2.events.ResponseReceived):
                self.heads += 1
                h = dict(e.headers)
                self.status[e.stream_id] = h.get(":status")
                self.headers[e.stream_id] = h
            elif isinstance(e, h2.events.TrailersReceived):
                self.trailers[e.stream_id] = dict(e.headers)
            elif isinstance(e, h2.events.DataReceived):
                self.data += len(e.data)
                self.c.acknowledge_received_data(0, e.stream_id)
            elif isinstance(e, h2.events.StreamEnded):
                self.ended += 1
            elif isinstance(e, h2.events.WindowUpdated):
                self.pump()
            elif isinstance(e, h2.events.ConnectionTerminated):
                self.goaway = {"error_code": int(e.error_code),
                               "name": getattr(e.error_code, "name", str(e.error_code)),
                               "debug": (e.additional_data or b"").decode("latin-1")}
        self.flush()


def pump_until(conns, done, limit_s):
    """Reads every open connection until done() or limit_s passed."""
    end = time.monotonic() + limit_s
    while not done() and time.monotonic() < end:
        socks = {c.sock: c for c in conns if c.closed is None}
        if not socks:
            return
        r, _, _ = select.select(list(socks), [], [], 0.5)
        for s in r:
            socks[s].readable()
