-- wrk script: POST the body in $BENCH_BODY and print one JSON line (prefix BENCHJSON) with
-- the request count, errors (socket errors and non-2xx/3xx statuses) and latency
-- percentiles in microseconds.
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"

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
