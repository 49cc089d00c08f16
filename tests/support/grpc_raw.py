"""One gRPC call as a client that is not grpcio might send it, frame by frame (h2_client.py
on the Python h2 library), to see the statuses the server answers for what grpcio never
sends: other content types, encodings, an expired deadline. Prints one JSON object: the
answer's HTTP status, headers and trailers (the Rust tests, tests/grpc.rs, check it).

usage:
  grpc_raw.py HOST:PORT PATH CONTENT_TYPE [HEADER=VALUE ...]
      one POST on PATH with that content type (`-`: none) and the 5-byte frame of an empty
      message.
"""
import json
import sys

from h2_client import H2, pump_until


def main():
    url, path, content_type, extra = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    host, port = url.rsplit(":", 1)
    c = H2(host, int(port))
    headers = [("te", "trailers")] + [tuple(kv.split("=", 1)) for kv in extra]
    if content_type != "-":
        headers.append(("content-type", content_type))
    sid = c.request(path, b"\x00\x00\x00\x00\x00", headers)
    pump_until([c], lambda: c.ended > 0 or c.closed is not None, 20)
    print(json.dumps({"status": c.status.get(sid), "headers": c.headers.get(sid, {}),
                      "trailers": c.trailers.get(sid, {}), "ended": c.ended > 0}))


if __name__ == "__main__":
    main()
