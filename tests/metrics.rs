//! `/metrics` end to end: the real `app` serving a real TorchScript model, scraped over
//! HTTP while it serves and recycles, every scrape parsed by the Prometheus project's own
//! parsers (`tests/support/parse_metrics.py`, PyPI `prometheus-client`), and checked with
//! `promtool check metrics` when Debian's `prometheus` package is installed (`scripts/test`
//! installs it).

mod common;
use common::nvml_sim;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{http, worker_pids, App, Server};
use serde_json::{json, Value};

const INPUT: &str = r#"{"inputs": [[0.5, -1.0, 2.0, 0.25]]}"#;

/// The port of the metrics listener, from the master's `metrics_listening` event.
fn metrics_port(s: &Server) -> u16 {
    let e = s.wait_event("metrics_listening", |_| true);
    e.str("addr")
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {:?}", e.fields))
}

/// One scrape: (status, content type, body).
fn scrape_with(port: u16, method: &str, path: &str, accept: Option<&str>) -> common::Response {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{accept}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    common::parse_response(&raw).unwrap()
}

/// A scrape in the Prometheus text format (no `Accept`).
fn scrape(port: u16) -> String {
    let r = scrape_with(port, "GET", "/metrics", None);
    assert_eq!(r.status, 200, "{r:?}");
    r.body
}

/// Parses scrapes (`(format, text)`) with the Prometheus project's parsers; one map of
/// families per scrape.
fn parse(scrapes: &[(&str, &str)]) -> Vec<Value> {
    let input: Vec<Value> = scrapes
        .iter()
        .map(|(f, t)| json!({"format": f, "text": t}))
        .collect();
    let out = common::python_json(
        "parse_metrics.py",
        &[],
        &serde_json::to_vec(&input).unwrap(),
    );
    serde_json::from_value(out).unwrap()
}

fn parse_one(text: &str) -> Value {
    parse(&[("prometheus", text)]).remove(0)
}

/// The sum of the samples named `sample` whose labels include `labels`.
fn sum(families: &Value, sample: &str, labels: &[(&str, &str)]) -> f64 {
    families
        .as_object()
        .unwrap()
        .values()
        .flat_map(|f| f["samples"].as_array().unwrap())
        .filter(|s| s[0] == sample && labels.iter().all(|(k, v)| s[1][*k] == *v))
        .map(|s| s[2].as_f64().unwrap())
        .sum()
}

/// Every counter-like sample (counters, histogram buckets, counts and sums) with its
/// labels, for the never-backwards check.
fn monotonic_samples(families: &Value) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for f in families.as_object().unwrap().values() {
        if f["type"] != "counter" && f["type"] != "histogram" {
            continue;
        }
        for s in f["samples"].as_array().unwrap() {
            out.push((format!("{}{}", s[0], s[1]), s[2].as_f64().unwrap()));
        }
    }
    out
}

/// Fails when a counter of `later` is below its value in `earlier`.
fn never_backwards(earlier: &Value, later: &Value, what: &str) {
    let before: std::collections::HashMap<String, f64> =
        monotonic_samples(earlier).into_iter().collect();
    for (k, v) in monotonic_samples(later) {
        if let Some(b) = before.get(&k) {
            assert!(v >= *b, "{what}: {k} went from {b} to {v}");
        }
    }
}

/// Waits until a parsed scrape satisfies `ok`; returns it.
fn wait_metrics(s: &Server, port: u16, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    s.poll(what, || Some(parse_one(&scrape(port))).filter(|f| ok(f)))
}

fn start(app: &App, args: &[&str]) -> (Server, u16) {
    let mut all = vec!["--production", "--metrics-port", "0"];
    all.extend_from_slice(args);
    let s = Server::start(app, &all);
    let port = metrics_port(&s);
    (s, port)
}

/// Sends `n` model requests from `clients` threads (fresh connections); all must be 200.
fn load(port: u16, clients: usize, n: usize) {
    let per = n / clients;
    assert_eq!(per * clients, n);
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            std::thread::spawn(move || {
                for _ in 0..per {
                    let r = http(port, "POST", "/", Some(INPUT));
                    assert_eq!(r.status, 200, "{r:?}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// Scrapes while `n` requests are sent and workers recycle every `max_requests`; checks
/// that no counter ever goes back and that the totals end equal to what was sent.
fn counts_across_recycles(max_requests: &str, n: usize) {
    let app = App::new("mlp.pt", "");
    let (s, mport) = start(&app, &["--workers", "2", "--max-requests", max_requests]);
    s.wait_workers(2);
    let port = s.port;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraper = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut texts = Vec::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                texts.push(scrape(mport));
                std::thread::sleep(Duration::from_millis(25));
            }
            texts
        })
    };
    load(port, 4, n);
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut texts = scraper.join().unwrap();
    assert!(texts.len() >= 2, "the load outlasted two scrapes");
    let n_f = n as f64;
    let last = wait_metrics(&s, mport, "every request counted", |f| {
        sum(f, "vramfork_requests_total", &[("endpoint", "infer")]) >= n_f
    });
    texts.push(scrape(mport));
    let parsed = parse(
        &texts
            .iter()
            .map(|t| ("prometheus", t.as_str()))
            .collect::<Vec<_>>(),
    );
    for (i, w) in parsed.windows(2).enumerate() {
        never_backwards(&w[0], &w[1], &format!("scrape {i} → {}", i + 1));
    }
    for f in parsed.iter().chain([&last]) {
        let counted = sum(f, "vramfork_requests_total", &[("endpoint", "infer")]);
        assert!(counted <= n_f, "{counted} requests counted, {n} sent");
    }
    let end = parsed.last().unwrap();
    let infer = [("endpoint", "infer")];
    assert_eq!(
        sum(
            end,
            "vramfork_requests_total",
            &[("endpoint", "infer"), ("code", "200")]
        ),
        n_f
    );
    assert_eq!(
        sum(end, "vramfork_request_duration_seconds_count", &infer),
        n_f
    );
    assert_eq!(
        sum(end, "vramfork_forward_duration_seconds_count", &[]),
        n_f
    );
    // Every pass started after a wait (however short): the queue-wait histogram counts
    // each request once, summed over both workers and every worker they replaced.
    assert_eq!(sum(end, "vramfork_queue_wait_seconds_count", &[]), n_f);
    let bytes_in = sum(end, "vramfork_request_bytes_total", &infer);
    assert_eq!(bytes_in, (n * INPUT.len()) as f64);
    assert!(sum(end, "vramfork_response_bytes_total", &infer) > 0.0);
    // Workers retired at their limit: as many exits as the limit allows for n requests
    // over two workers, and every start is a worker that exited or one that lives.
    let per: usize = max_requests.parse().unwrap();
    let retired = wait_metrics(&s, mport, "the recycled workers reaped", |f| {
        sum(
            f,
            "vramfork_worker_exits_total",
            &[("reason", "max-requests")],
        ) >= ((n - 2 * (per - 1)) / per) as f64
    });
    let exits = sum(&retired, "vramfork_worker_exits_total", &[]);
    let starts = sum(&retired, "vramfork_worker_starts_total", &[]);
    let live: f64 = ["booting", "ready", "retiring"]
        .iter()
        .map(|st| sum(&retired, "vramfork_workers", &[("state", st)]))
        .sum();
    assert_eq!(starts, exits + live, "starts = exits + live workers");
    if per == 1 {
        let all = wait_metrics(&s, mport, "one exit per request", |f| {
            sum(
                f,
                "vramfork_worker_exits_total",
                &[("reason", "max-requests")],
            ) == n_f
        });
        never_backwards(end, &all, "after the load");
    }
}

#[test]
fn counters_equal_the_requests_sent_while_workers_recycle_after_every_request() {
    counts_across_recycles("1", 24);
}

#[test]
fn counters_equal_the_requests_sent_while_workers_recycle_after_seven() {
    counts_across_recycles("7", 60);
}

#[test]
fn kill_9_of_a_worker_does_not_make_a_counter_go_down() {
    let app = App::new("mlp.pt", "");
    let (s, mport) = start(&app, &["--workers", "2"]);
    let pids = s.wait_workers(2);
    load(s.port, 2, 20);
    let before = wait_metrics(&s, mport, "20 requests reported", |f| {
        sum(f, "vramfork_requests_total", &[("endpoint", "infer")]) == 20.0
    });
    let mark = s.mark();
    // SAFETY: kill(2) on a worker pid of this test's server; no memory is involved.
    unsafe { libc::kill(pids[0] as i32, libc::SIGKILL) };
    s.wait_event_after(mark, "worker_exited", |e| {
        e.u64("pid") == Some(pids[0] as u64)
    });
    let after = wait_metrics(&s, mport, "the kill counted", |f| {
        sum(f, "vramfork_worker_exits_total", &[("reason", "signal")]) == 1.0
    });
    never_backwards(&before, &after, "across kill -9");
    assert_eq!(
        sum(&after, "vramfork_requests_total", &[("endpoint", "infer")]),
        20.0,
        "what the killed worker had reported stays counted"
    );
    s.wait_workers(2);
    load(s.port, 1, 5);
    let more = wait_metrics(&s, mport, "25 requests reported", |f| {
        sum(f, "vramfork_requests_total", &[("endpoint", "infer")]) == 25.0
    });
    never_backwards(&after, &more, "after the replacement served");
}

/// Workers by state from a scrape.
fn states(f: &Value) -> [f64; 3] {
    ["booting", "ready", "retiring"].map(|st| sum(f, "vramfork_workers", &[("state", st)]))
}

#[test]
fn worker_gauges_match_the_processes_ps_sees() {
    let app = App::new("mlp.pt", "");
    let (s, mport) = start(&app, &["--workers", "3"]);
    let pids = s.wait_workers(3);
    let f = wait_metrics(&s, mport, "3 ready workers", |f| {
        states(f) == [0.0, 3.0, 0.0]
    });
    assert_eq!(worker_pids(s.pid()).len(), 3, "ps: three workers");
    assert_eq!(sum(&f, "vramfork_workers_planned", &[]), 3.0);
    assert_eq!(sum(&f, "vramfork_plan_workers", &[]), 3.0);
    assert_eq!(
        sum(&f, "vramfork_plan_cpu_bound", &[]),
        (2 * std::thread::available_parallelism().unwrap().get() + 1) as f64
    );
    // One resident-memory row per slot, each a live process's size.
    for slot in ["0", "1", "2"] {
        let rss = sum(
            &f,
            "vramfork_worker_resident_memory_bytes",
            &[("slot", slot)],
        );
        assert!(rss > 10e6, "slot {slot}: {rss} bytes resident");
    }
    // Served per worker follows the requests.
    load(s.port, 3, 9);
    let served = wait_metrics(&s, mport, "9 served in the per-worker gauges", |f| {
        sum(f, "vramfork_worker_requests_served", &[]) == 9.0
    });
    assert_eq!(
        sum(&served, "vramfork_requests_total", &[("endpoint", "infer")]),
        9.0
    );
    // TTOU: one worker retires; the gauges follow ps.
    s.signal(libc::SIGTTOU);
    let f = wait_metrics(&s, mport, "2 planned, 2 ready", |f| {
        sum(f, "vramfork_workers_planned", &[]) == 2.0 && states(f) == [0.0, 2.0, 0.0]
    });
    s.poll("ps: two workers", || {
        (worker_pids(s.pid()).len() == 2).then_some(())
    });
    assert_eq!(states(&f)[1] as usize, worker_pids(s.pid()).len());
    assert!(pids.iter().filter(|p| common::process_alive(**p)).count() == 2);
}

#[test]
fn formats_follow_accept_and_promtool_accepts_the_text() {
    let app = App::new("mlp.pt", "");
    let (s, mport) = start(&app, &["--workers", "1"]);
    s.wait_workers(1);
    load(s.port, 1, 3);
    assert_eq!(http(s.port, "GET", "/nope", None).status, 404);
    wait_metrics(&s, mport, "3 requests", |f| {
        sum(f, "vramfork_requests_total", &[("endpoint", "infer")]) == 3.0
    });
    let plain = scrape_with(mport, "GET", "/metrics", None);
    assert_eq!(
        plain.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let om = scrape_with(
        mport,
        "GET",
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"),
    );
    assert_eq!(
        om.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    assert!(om.body.ends_with("# EOF\n"), "{}", om.body);
    let both = parse(&[("prometheus", &plain.body), ("openmetrics", &om.body)]);
    let names = |f: &Value| {
        f.as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(
        names(&both[0]),
        names(&both[1]),
        "the same families in both formats"
    );
    assert_eq!(
        sum(
            &both[1],
            "vramfork_requests_total",
            &[("endpoint", "infer")]
        ),
        3.0
    );
    assert_eq!(
        sum(
            &both[0],
            "vramfork_requests_total",
            &[("endpoint", "other"), ("code", "404")]
        ),
        1.0
    );
    assert_eq!(
        sum(
            &both[0],
            "vramfork_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    // Wrong method, wrong path, HEAD.
    let post = scrape_with(mport, "POST", "/metrics", None);
    assert_eq!(post.status, 405);
    assert_eq!(post.header("allow"), Some("GET, HEAD"));
    assert_eq!(scrape_with(mport, "GET", "/", None).status, 404);
    let head = scrape_with(mport, "HEAD", "/metrics", None);
    assert_eq!((head.status, head.body.as_str()), (200, ""));

    match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Err(e) => eprintln!(
            "promtool not found ({e}): install Debian's prometheus package to run this check"
        ),
        Ok(mut child) => {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(plain.body.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "promtool check metrics: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// The family names of a parsed scrape.
fn family_names(f: &Value) -> BTreeSet<String> {
    f.as_object().unwrap().keys().cloned().collect()
}

#[test]
fn development_mode_serves_the_same_families() {
    let app = App::new("mlp.pt", "");
    let (prod, prod_port) = start(&app, &["--workers", "1"]);
    prod.wait_workers(1);
    let production = parse_one(&scrape(prod_port));
    drop(prod);

    let dev = Server::start(&app, &["--metrics-port", "0"]);
    let port = metrics_port(&dev);
    load(dev.port, 1, 2);
    let f = parse_one(&scrape(port));
    assert_eq!(family_names(&f), family_names(&production));
    assert_eq!(
        sum(
            &f,
            "vramfork_requests_total",
            &[("endpoint", "infer"), ("code", "200")]
        ),
        2.0,
        "the worker counts as it answers"
    );
    assert_eq!(states(&f), [0.0, 1.0, 0.0]);
    assert_eq!(
        sum(&f, "vramfork_worker_requests_served", &[("slot", "0")]),
        2.0
    );
}

/// `app --production --metrics-port 0 --workers N` on the simulated GPUs described in `file`,
/// for a model declaring 1000 MB minimum, 2000 MB typical.
fn start_on_sim(file: &std::path::Path, workers: &str) -> (App, Server, u16) {
    let app = App::new(
        "mlp.pt",
        r#""est_gpu_mem_min": 1000, "est_gpu_mem_typ": 2000"#,
    );
    let lib = nvml_sim::mock_library();
    let s = Server::start_env(
        &app,
        &[
            "--production",
            "--metrics-port",
            "0",
            "--workers",
            workers,
            "--nvml-library",
            lib.to_str().unwrap(),
            "--simulated-gpus",
        ],
        &[(nvml_sim::ENV_FILE, file.to_str().unwrap())],
    );
    let port = metrics_port(&s);
    (app, s, port)
}

#[test]
fn simulated_gpus_show_per_gpu_and_per_worker_memory() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gpus.json");
    let mut gpu = nvml_sim::SimGpu::a100_40gb();
    gpu.free_mb = 30_000;
    let mut sim = nvml_sim::SimGpus::new(vec![gpu]);
    sim.write(&file);
    let (_app, s, mport) = start_on_sim(&file, "2");
    let pids = s.wait_workers(2);
    // NVML reports 1500 MB and 700 MB for the two worker processes.
    sim.gpus[0].processes = vec![(pids[0], Some(1500)), (pids[1], Some(700))];
    sim.write(&file);
    let mb = 1024.0 * 1024.0;
    let f = wait_metrics(&s, mport, "per-worker GPU memory", |f| {
        sum(f, "vramfork_worker_gpu_memory_used_bytes", &[]) == 2200.0 * mb
    });
    let uuid = sim.uuid_of(0);
    let g = [("index", "0"), ("uuid", uuid.as_str())];
    assert_eq!(
        sum(&f, "vramfork_gpu_memory_total_bytes", &g),
        40_960.0 * mb
    );
    assert_eq!(sum(&f, "vramfork_gpu_memory_free_bytes", &g), 30_000.0 * mb);
    assert_eq!(sum(&f, "vramfork_gpu_memory_used_bytes", &g), 10_960.0 * mb);
    let named = f["vramfork_gpu_memory_total_bytes"]["samples"][0][1]["name"].clone();
    assert_eq!(named, "NVIDIA A100-SXM4-40GB");
    assert!(sum(&f, "vramfork_plan_gpu_bound", &[]) >= 1.0);
}

#[test]
fn the_grafana_dashboard_refers_only_to_exported_metrics() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/grafana/vramfork-dashboard.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let dash: Value = serde_json::from_str(&text).expect("the dashboard is valid JSON");
    assert!(dash["panels"].as_array().is_some_and(|p| p.len() >= 8));

    let app = App::new("mlp.pt", "");
    let (s, mport) = start(&app, &["--workers", "1"]);
    s.wait_workers(1);
    let f = parse_one(&scrape(mport));
    // Every sample name a family of this type can have.
    let mut exported = BTreeSet::new();
    for (name, fam) in f.as_object().unwrap() {
        match fam["type"].as_str().unwrap() {
            "counter" => {
                exported.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    exported.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                exported.insert(name.clone());
            }
        }
    }
    let mut exprs = Vec::new();
    collect_exprs(&dash, &mut exprs);
    assert!(exprs.len() >= 10, "{exprs:?}");
    let mut used = BTreeSet::new();
    for e in &exprs {
        let mut rest = e.as_str();
        while let Some(i) = rest.find("vramfork_") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            used.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    let unknown: Vec<_> = used.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard uses {unknown:?}; the server exports {exported:?}"
    );
    for family in [
        "vramfork_requests_total",
        "vramfork_request_duration_seconds_bucket",
        "vramfork_workers",
        "vramfork_gpu_memory_used_bytes",
        "vramfork_worker_gpu_memory_used_bytes",
        "vramfork_worker_exits_total",
        "vramfork_requests_waiting",
        "vramfork_queue_wait_seconds_bucket",
    ] {
        assert!(used.contains(family), "the dashboard shows no {family}");
    }
}

/// Every PromQL expression (`expr` of a target, `query` of a variable) in a dashboard.
fn collect_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    ("query", Value::String(s)) if s.contains("vramfork_") => out.push(s.clone()),
                    _ => collect_exprs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_exprs(x, out)),
        _ => {}
    }
}

/// A probe: (status, body as JSON).
fn probe(port: u16, path: &str) -> (u16, Value) {
    let r = scrape_with(port, "GET", path, None);
    let v = serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{path}: {e}: {r:?}"));
    (r.status, v)
}

#[test]
fn probes_stay_ready_while_the_only_worker_recycles_after_every_request() {
    let app = App::new("mlp.pt", "");
    let (s, mport) = start(&app, &["--workers", "1", "--max-requests", "1"]);
    s.wait_workers(1);
    let port = s.port;
    let loader = std::thread::spawn(move || load(port, 1, 30));
    let mut probes = 0;
    while !loader.is_finished() {
        for path in ["/health/ready", "/health/live"] {
            let (status, v) = probe(mport, path);
            assert_eq!(status, 200, "{path} while recycling: {v}");
            assert_eq!(v["status"], "ok");
            probes += 1;
        }
    }
    loader.join().unwrap();
    assert!(probes >= 4, "{probes} probes during the load");
    // Every request recycled the worker, so the probes ran through the gaps.
    wait_metrics(&s, mport, "30 recycles", |f| {
        sum(
            f,
            "vramfork_worker_exits_total",
            &[("reason", "max-requests")],
        ) == 30.0
    });
}

#[test]
fn readiness_fails_when_stopping_and_when_no_worker_can_start_for_a_while() {
    // Stopping: a request in flight (about 2 s of slow.pt) keeps the master in its graceful
    // stop.
    let app = App::new("slow.pt", "");
    // A graceful timeout no busy machine can make the slow request outlast.
    // One torch thread: two make slow.pt crawl on a machine busy with other tests.
    let (mut s, mport) = start(
        &app,
        &[
            "--workers",
            "1",
            "--graceful-timeout",
            "300",
            "--torch-threads",
            "1",
        ],
    );
    s.wait_workers(1);
    assert_eq!(probe(mport, "/health/ready").0, 200);
    let port = s.port;
    let slow =
        std::thread::spawn(move || http(port, "POST", "/", Some(r#"{"inputs": [[100000]]}"#)));
    s.wait_event("pool", |e| e.u64("in_flight") == Some(1));
    s.signal(libc::SIGTERM);
    let (status, v) = s.poll("readiness to fail while stopping", || {
        Some(probe(mport, "/health/ready")).filter(|(st, _)| *st == 503)
    });
    assert_eq!((status, v["error"].as_str()), (503, Some("stopping")));
    assert_eq!(probe(mport, "/health/live").0, 200, "alive while it stops");
    assert_eq!(slow.join().unwrap().status, 200);
    assert!(s.wait_exit(Duration::from_secs(60)).success());

    // No worker can start: the only one is killed and GPU memory (as NVML reports it) is
    // too short for its replacement. Alive all along; ready until the grace runs out.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gpus.json");
    let mut sim = nvml_sim::SimGpus::new(vec![nvml_sim::SimGpu::a100_40gb().free_mb(30_000)]);
    sim.write(&file);
    let (_app, s, mport) = start_on_sim(&file, "1");
    let pid = s.wait_workers(1)[0];
    sim.gpus[0].free_mb = 100;
    sim.write(&file);
    let mark = s.mark();
    // SAFETY: kill(2) on a worker pid of this test's server; no memory is involved.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    s.wait_event_after(mark, "worker_waits", |e| e.str("why") == Some("gpu_memory"));
    let (status, v) = s.poll("readiness to fail once the grace has passed", || {
        Some(probe(mport, "/health/ready")).filter(|(st, _)| *st == 503)
    });
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .starts_with("no worker ready for "),
        "{status} {v}"
    );
    assert_eq!(probe(mport, "/health/live").0, 200);
    let (status, v) = probe(mport, "/health/nope");
    assert_eq!(status, 404, "{v}");
}

/// A GPU in MIG mode shows in `/metrics` as its instances, each with its own
/// memory under its `MIG-…` UUID; the whole GPU in MIG mode is not a row of its own.
#[test]
fn mig_instances_show_as_gpus_of_their_own() {
    use nvml_sim::{SimMig, SimMigInstance};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gpus.json");
    let uuid = format!("MIG-metrics-{}", std::process::id());
    let gpu = nvml_sim::SimGpu::a100_40gb()
        .mig(SimMig::enabled().instance(SimMigInstance::a100_3g_20gb(&uuid, 1).free_mb(19_000)));
    nvml_sim::SimGpus::new(vec![gpu]).write(&file);
    let (_app, s, mport) = start_on_sim(&file, "2");
    s.wait_workers(2);
    let mb = 1024.0 * 1024.0;
    // The instance is device 1 (after the one whole GPU's NVML index 0).
    let g = [("index", "1"), ("uuid", uuid.as_str())];
    let f = wait_metrics(&s, mport, "the MIG instance's memory", |f| {
        sum(f, "vramfork_gpu_memory_total_bytes", &g) == 19_968.0 * mb
    });
    assert_eq!(sum(&f, "vramfork_gpu_memory_free_bytes", &g), 19_000.0 * mb);
    let rows = f["vramfork_gpu_memory_total_bytes"]["samples"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(rows, 1, "only the instance: {f:#}");
}
