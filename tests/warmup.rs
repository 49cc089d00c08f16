//! Warm workers: `--warmup-passes N` forward passes before a process serves, at
//! the metadata's `warmup_inputs` (or declared) shapes and, with batching, at
//! `max_batch_size` rows too — run by the template before it forks workers and by a worker
//! that loads the model itself (development mode execs one). Checked with a model that
//! counts its passes (`tests/fixtures/counter.pt`, made by
//! `tests/support/make_counter_model.py`): the first request a worker serves answers how
//! many passes, and at which shapes, its model ran before it.

mod common;

use common::{App, Server, PATIENCE};

/// Production (workers forked from the template, which warmed the model) and development
/// mode (one worker, exec'd, which warms the model itself).
const MODES: [(&str, &[&str]); 2] = [
    ("template", &["--production", "--workers", "1"]),
    ("exec'd", &[]),
];

/// What `counter.pt` answers for a first request of one row: the passes before it, the most
/// and fewest rows and the most columns of those passes, and this pass's rows.
fn first_answer(app: &App, args: &[&str], env: &[(&str, &str)]) -> Vec<f64> {
    let s = Server::start_env(app, args, env);
    let r = s.post("/", r#"{"inputs": [[1, 2]]}"#);
    assert_eq!(r.status, 200, "{args:?}: {}\n{}", r.body, s.log_text());
    let out = r.json()["outputs"].clone();
    serde_json::from_value::<Vec<Vec<f64>>>(out)
        .unwrap()
        .remove(0)
}

fn with(mode: &[&'static str], more: &[&'static str]) -> Vec<&'static str> {
    let mut a = mode.to_vec();
    a.extend_from_slice(more);
    a
}

#[test]
fn warm_up_passes_run_before_the_first_request_through_the_template_and_exec() {
    let app = App::new("counter.pt", r#""input": {"shape": [-1, -1]}"#);
    for (mode, args) in MODES {
        // The default is 2 passes, on the declared shape with -1 as 1.
        assert_eq!(
            first_answer(&app, args, &[]),
            [2.0, 1.0, 1.0, 1.0, 1.0],
            "{mode}, default"
        );
        assert_eq!(
            first_answer(&app, &with(args, &["--warmup-passes", "3"]), &[]),
            [3.0, 1.0, 1.0, 1.0, 1.0],
            "{mode}, --warmup-passes 3"
        );
        // The variable too; 0: no pass at all, the first request is the model's first.
        assert_eq!(
            first_answer(&app, args, &[("VRAMFORK_WARMUP_PASSES", "0")]),
            [0.0, 0.0, 0.0, 0.0, 1.0],
            "{mode}, VRAMFORK_WARMUP_PASSES=0"
        );
    }
}

#[test]
fn warmup_inputs_shapes_reach_the_model() {
    let app = App::new(
        "counter.pt",
        r#""inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, -1]}],
           "warmup_inputs": {"x": [2, 7]}"#,
    );
    for (mode, args) in MODES {
        assert_eq!(
            first_answer(&app, args, &[]),
            [2.0, 2.0, 2.0, 7.0, 1.0],
            "{mode}"
        );
    }
}

#[test]
fn with_batching_the_warm_up_runs_a_full_batch_and_one_request() {
    let app = App::new(
        "counter.pt",
        r#""input": {"shape": [-1, -1]}, "warmup_inputs": [1, 7]"#,
    );
    for (mode, args) in MODES {
        // Each of the 2 passes at 4 rows (the batch) and at 1 (a lone request).
        assert_eq!(
            first_answer(&app, &with(args, &["--max-batch-size", "4"]), &[]),
            [4.0, 4.0, 1.0, 7.0, 1.0],
            "{mode}"
        );
    }
}

/// Without a warm-up pass nothing checks the declared inputs against `forward()` at boot:
/// a two-input model declared with one boots, and its requests fail (500), where with the
/// default the boot fails (tests/signature.rs).
#[test]
fn no_warm_up_pass_means_no_boot_check_of_the_declared_inputs() {
    let app = App::new(
        "pair.pt",
        r#""inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 3]}]"#,
    );
    let s = Server::start(&app, &["--warmup-passes", "0"]);
    let r = s.post("/", r#"{"inputs": [[1, 2, 3]]}"#);
    assert_eq!(r.status, 500, "{}\n{}", r.body, s.log_text());
    assert!(
        r.body.contains("is missing value for argument 'scale'"),
        "{}",
        r.body
    );
}

#[test]
fn bad_warmup_passes_and_warmup_inputs_stop_the_start_naming_them() {
    let two = r#""inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]},
                           {"name": "y", "datatype": "INT64", "shape": [-1]}]"#;
    // The app, its arguments and environment, and what the one line on stderr must say.
    type Case = (
        App,
        Vec<&'static str>,
        Vec<(&'static str, &'static str)>,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            App::new("counter.pt", ""),
            vec!["--warmup-passes", "two"],
            vec![],
            "invalid value 'two' for --warmup-passes: expected a whole number 0..=100 (0 = no warm-up pass)",
        ),
        (
            App::new("counter.pt", ""),
            vec![],
            vec![("VRAMFORK_WARMUP_PASSES", "-1")],
            "invalid value '-1' for VRAMFORK_WARMUP_PASSES (for --warmup-passes): expected a whole number 0..=100",
        ),
        (
            App::new(
                "counter.pt",
                r#""input": {"shape": [-1, 4]}, "warmup_inputs": [1, 5]"#,
            ),
            vec![],
            vec![],
            "`warmup_inputs.input__0` is [1, 5], which input 'input__0' (shape [-1, 4], -1 = any size) does not accept",
        ),
        (
            App::new(
                "counter.pt",
                r#""input": {"shape": [-1, 4]}, "warmup_inputs": [-1, 4]"#,
            ),
            vec![],
            vec![],
            "field `warmup_inputs.input__0[0]` must be a size ≥ 1, found -1",
        ),
        (
            App::new(
                "counter.pt",
                &format!(r#"{two}, "warmup_inputs": {{"z": [1, 4]}}"#),
            ),
            vec![],
            vec![],
            "field `warmup_inputs`: the model has no input named 'z'",
        ),
        (
            App::new("counter.pt", r#""warmup_inputs": [1, 4]"#),
            vec![],
            vec![],
            "field `warmup_inputs` needs the model's inputs declared",
        ),
    ];
    for (app, args, env, want) in &cases {
        for mode in [&["--production"][..], &[][..]] {
            let mut a = mode.to_vec();
            a.extend_from_slice(args);
            let mut s = Server::spawn(app, &a, env);
            let st = s.wait_exit(PATIENCE);
            let log = s.log_text();
            assert_eq!(st.code(), Some(2), "{a:?} {env:?}: {log}");
            assert!(
                log.contains(want),
                "{a:?} {env:?}: want {want:?} in:\n{log}"
            );
        }
    }
}

/// After a HUP the new workers (from a new template) warm up on the reloaded metadata's
/// `warmup_inputs`.
#[test]
fn a_reload_warms_the_new_workers_on_the_new_warmup_inputs() {
    let app = App::new(
        "counter.pt",
        r#""input": {"shape": [-1, -1]}, "warmup_inputs": [1, 3]"#,
    );
    let s = Server::start(&app, &["--production", "--workers", "1"]);
    let first = s.wait_workers(1);
    let r = s.post("/", r#"{"inputs": [[1, 2]]}"#);
    assert_eq!(
        r.json()["outputs"][0],
        serde_json::json!([2.0, 1.0, 1.0, 3.0, 1.0])
    );
    app.write_metadata(
        "counter.pt",
        r#""input": {"shape": [-1, -1]}, "warmup_inputs": [1, 9]"#,
    );
    let mark = s.mark();
    s.signal(libc::SIGHUP);
    let (_, done) = s.wait_event_after(mark, "reload_complete", |_| true);
    assert_eq!(done.str("outcome"), Some("reloaded"), "{done:?}");
    let second = s.wait_workers_where(1, |p| !p.contains(&first[0]));
    let r = s.post("/", r#"{"inputs": [[1, 2]]}"#);
    assert_eq!(r.pid(), second[0], "{}", s.log_text());
    assert_eq!(
        r.json()["outputs"][0],
        serde_json::json!([2.0, 1.0, 1.0, 9.0, 1.0])
    );
}
