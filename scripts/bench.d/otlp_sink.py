#!/usr/bin/env python3
"""The tracing bench's collector on loopback: takes OTLP/HTTP protobuf exports, decodes each
with the official definitions (opentelemetry-proto) to count its spans, and answers 200 —
no per-span output, so that on the cores it shares with the server it costs what a
collector's receiving end costs, not what printing every span would. Its first line on stdout
is `{"listening": PORT}`; `GET /count` answers `{"spans": N, "exports": M}`.

Usage: otlp_sink.py
"""
import http.server
import json
import sys
import threading

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

LOCK = threading.Lock()
COUNT = {"spans": 0, "exports": 0}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body=b""):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        req = ExportTraceServiceRequest.FromString(body)
        n = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        with LOCK:
            COUNT["spans"] += n
            COUNT["exports"] += 1
        self.answer(200)

    def do_GET(self):
        with LOCK:
            body = json.dumps(COUNT).encode()
        self.answer(200, body)


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(json.dumps({"listening": server.server_address[1]}), flush=True)
sys.stdout.close()
server.serve_forever()
