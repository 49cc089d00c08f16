"""An OTLP/HTTP trace receiver for the tests (tests/tracing/): decodes each POST's body
with the official protobuf definitions (the opentelemetry-proto package) and prints one JSON
line per span on stdout: ids as hex, name, kind, times, attributes, status, its resource's
attributes. Its first line is `{"listening": PORT}`; each connection it accepts (after the
TLS handshake, over TLS) is a line `{"connection": N}` (N counting from 1).

    otlp_receiver.py ok      answer 200 (as a collector that takes them)
    otlp_receiver.py 503     answer 503 to every export (one line {"refused": N} each)
    otlp_receiver.py 503-once  answer 503 to the first export (as 503 does), then as ok:
                             a collector that comes back
    otlp_receiver.py hang    accept and read every export, answer nothing, ever
    otlp_receiver.py close   as ok, then close the connection without a word (no
                             `Connection: close`: the exporter finds it closed later)
    otlp_receiver.py once    as ok for a connection's first export; a second export on
                             the same connection is read and the connection closed
                             unanswered (one line {"unanswered": N} each): a collector
                             closing an idle connection just as an export arrives
    otlp_receiver.py continue-forever  answer each export with `100 Continue` answers,
                             without end and as fast as the exporter reads them
    otlp_receiver.py trailers-forever  answer each export 200, chunked: the last chunk, then
                             trailer lines without end
    otlp_receiver.py drip    answer each export 200 one byte every half second (a whole
                             answer takes 19 s)
    (the last three print one line {"answering": N} per export they take, and stop when
    the exporter drops the connection)

    ... MODE --tls CERT KEY [CLIENT_CA]
        over TLS (https://) with the server certificate CERT and its key KEY (PEM); with
        CLIENT_CA, a client certificate signed by it is required (mutual TLS) and each
        span's line names the client's (`client`: its subject's common name)
"""
import http.server
import json
import ssl
import sys
import threading
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

MODE = sys.argv[1]
OUT = threading.Lock()
REFUSED = [0]
COUNT = threading.Lock()
CONNECTIONS = [0]
UNANSWERED = [0]
ANSWERING = [0]
# What the modes that never finish an answer write: once, then again and again.
ENDLESS = {
    "continue-forever": (b"", b"HTTP/1.1 100 Continue\r\n\r\n"),
    "trailers-forever": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n",
                         b"X-Trailer: more\r\n"),
}
DRIP = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


def say(obj):
    with OUT:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def client_name(conn):
    """The common name of the client certificate a TLS connection presented, or None."""
    peer = conn.getpeercert() if isinstance(conn, ssl.SSLSocket) else None
    for rdn in (peer or {}).get("subject", ()):
        for key, val in rdn:
            if key == "commonName":
                return val
    return None


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        self.exports = 0
        with COUNT:
            CONNECTIONS[0] += 1
            n = CONNECTIONS[0]
        say({"connection": n})

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.exports += 1
        if MODE == "once" and self.exports > 1:
            with COUNT:
                UNANSWERED[0] += 1
                n = UNANSWERED[0]
            say({"unanswered": n})
            self.close_connection = True
            return
        if MODE == "hang":
            threading.Event().wait()  # never answers
        if MODE in ENDLESS or MODE == "drip":
            with COUNT:
                ANSWERING[0] += 1
                n = ANSWERING[0]
            say({"answering": n})
            self.close_connection = True
            try:
                if MODE == "drip":
                    for i in range(len(DRIP)):
                        self.connection.sendall(DRIP[i:i + 1])
                        time.sleep(0.5)
                    return
                first, again = ENDLESS[MODE]
                self.connection.sendall(first)
                while True:
                    self.connection.sendall(again * 64)
            except OSError:
                return  # the exporter gave up on the answer and dropped the connection
        if MODE == "503" or (MODE == "503-once" and REFUSED[0] == 0):
            REFUSED[0] += 1
            say({"refused": REFUSED[0]})
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        for rs in req.resource_spans:
            resource = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    say({
                        "path": self.path,
                        "client": client_name(self.connection),
                        "content_type": self.headers.get("Content-Type"),
                        "header_x_tenant": self.headers.get("x-tenant"),
                        "scope": ss.scope.name,
                        "resource": resource,
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "name": s.name,
                        "kind": s.kind,
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                        "attributes": attributes(s.attributes),
                        "status_code": s.status.code,
                        "links": [{"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex()}
                                  for l in s.links],
                    })
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
        if MODE == "close":
            self.close_connection = True


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
if "--tls" in sys.argv:
    cert, key, *client_ca = sys.argv[sys.argv.index("--tls") + 1:]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    if client_ca:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(client_ca[0])
    # The handshake happens at accept; one that fails (the exporter refused this
    # certificate, or sent none) is dropped by the server loop.
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
say({"listening": server.server_address[1]})
server.serve_forever()
