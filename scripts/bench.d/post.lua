-- wrk script: POST a body and print one JSON line (prefix BENCHJSON) with the request
-- count, errors (socket errors and non-2xx/3xx statuses), bytes read and latency
-- percentiles in microseconds. The body is $BENCH_BODY, or the bytes of the file
-- $BENCH_BODY_FILE (binary bodies: environment variables cannot hold NUL bytes). With
-- $BENCH_HEADER_LEN set, the body is a v2 binary request: Inference-Header-Content-Length
-- is sent and the content type is application/octet-stream. With $BENCH_CLOSE set, every
-- request says `Connection: close`, so wrk opens a new connection (and over https a new TLS
-- handshake) for each.
wrk.method = "POST"
local file = os.getenv("BENCH_BODY_FILE")
if file then
  local f = assert(io.open(file, "rb"))
  wrk.body = f:read("*a")
  f:close()
else
  wrk.body = os.getenv("BENCH_BODY")
end
local header_len = os.getenv("BENCH_HEADER_LEN")
if header_len then
  wrk.headers["Inference-Header-Content-Length"] = header_len
  wrk.headers["Content-Type"] = "application/octet-stream"
else
  wrk.headers["Content-Type"] = "application/json"
end
if os.getenv("BENCH_CLOSE") then
  wrk.headers["Connection"] = "close"
end

done = function(summary, latency, requests)
  local e = summary.errors
  local parts = {}
  for _, p in ipairs({1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 97, 99, 99.5, 99.9}) do
    parts[#parts + 1] = string.format('"%s":%d', tostring(p), latency:percentile(p))
  end
  io.write(string.format(
    'BENCHJSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"lat_us":{"min":%d,"max":%d,"mean":%.1f,"pct":{%s}}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.max, latency.mean, table.concat(parts, ",")))
end
