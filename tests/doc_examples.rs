//! Every example in README.md and docs/ runs as written, or says where it is run.
//!
//! Each fenced shell, console or Python block carries a marker on the line above it:
//! - `<!-- example: serves FIXTURE at PORT[, FIXTURE at PORT] -->`: the test serves each
//!   `tests/fixtures/FIXTURE` (its own name, its own model) and runs the block as it is
//!   written, with only the port numbers (and `localhost`) pointed at those servers;
//! - `<!-- example: starts app with FIXTURE; ports PORT[, PORT] -->`: the block starts `app`
//!   itself (a line that starts `app `, in the background as a second terminal would be); the
//!   test runs it in a temporary folder with `app` on `PATH`, `VRAMFORK_METADATA` naming
//!   the fixture, each port number replaced by a free one (`VRAMFORK_PORT` the one for
//!   5000, `app`'s default) and `/etc/vramfork/` by a folder of the temporary one;
//! - `<!-- example: run by tests/FILE.rs::FN -->`: a process test runs it (the function
//!   must exist there);
//! - `<!-- example: copy of tests/support/FILE -->`: every line of the block is in that
//!   script, which a process test runs;
//! - `<!-- example: not run here: WHY -->`.
//!
//! Run "as written" means: its exit status is 0 (bash with `-e` and `pipefail`, or Python),
//! and each output the block shows is printed — a `# …` line right under a shell command,
//! the lines under a `$ ` command of a console block, a `# …` comment after a `print(…)`
//! (`# (…)` is a remark) — unless it elides with `…`.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{app_bin, fixtures, free_port, python, App, Server};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fenced block of a page: where it is, its language, its marker and its text.
#[derive(Debug)]
struct Example {
    at: String,
    lang: String,
    marker: Option<String>,
    text: String,
}

const RUNNABLE: [&str; 6] = ["sh", "bash", "shell", "console", "python", "py"];

/// The shell, console and Python blocks of README.md and every docs/*.md, with the marker
/// on the last non-blank line above each (a block of no language counts when it shows a
/// `$ ` command).
fn examples() -> Vec<Example> {
    let mut pages = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    let mut out = Vec::new();
    for page in pages {
        let name = page.strip_prefix(root()).unwrap().display().to_string();
        let text = std::fs::read_to_string(&page).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let Some(lang) = lines[i].strip_prefix("```") else {
                i += 1;
                continue;
            };
            let end = (i + 1..lines.len())
                .find(|&j| lines[j] == "```")
                .unwrap_or_else(|| panic!("{name}:{}: a block never closed", i + 1));
            let body = lines[i + 1..end].join("\n") + "\n";
            let marker = lines[..i]
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty())
                .and_then(|l| l.trim().strip_prefix("<!-- example: "))
                .and_then(|l| l.strip_suffix(" -->"))
                .map(str::to_string);
            let shows_commands = body.lines().any(|l| l.starts_with("$ "));
            if RUNNABLE.contains(&lang) || (lang.is_empty() && shows_commands) {
                out.push(Example {
                    at: format!("{name}:{}", i + 1),
                    lang: if lang.is_empty() { "console" } else { lang }.to_string(),
                    marker,
                    text: body,
                });
            }
            i = end + 1;
        }
    }
    out
}

/// `FIXTURE at PORT, …` or `FIXTURE; ports PORT, …`: the fixture names and the ports.
fn fixtures_and_ports(spec: &str) -> (Vec<String>, Vec<String>) {
    if let Some((fixture, ports)) = spec.split_once("; ports ") {
        let ports = ports.split(", ").map(str::to_string).collect();
        return (vec![fixture.to_string()], ports);
    }
    spec.split(", ")
        .map(|s| {
            let (f, p) = s
                .split_once(" at ")
                .unwrap_or_else(|| panic!("{s:?}: FIXTURE at PORT"));
            (f.to_string(), p.to_string())
        })
        .unzip()
}

/// `text` with each port number (as a whole number) replaced, and `localhost` as
/// 127.0.0.1 (where the servers listen).
fn repoint(text: &str, ports: &BTreeMap<String, u16>) -> String {
    let mut out = text.replace("localhost:", "127.0.0.1:");
    for (from, to) in ports {
        let mut s = String::new();
        let mut rest = out.as_str();
        while let Some(at) = rest.find(from.as_str()) {
            let before = rest[..at].chars().next_back();
            let after = rest[at + from.len()..].chars().next();
            let whole = !before.is_some_and(|c| c.is_ascii_digit())
                && !after.is_some_and(|c| c.is_ascii_digit());
            s.push_str(&rest[..at]);
            let to = to.to_string();
            s.push_str(if whole { &to } else { from });
            rest = &rest[at + from.len()..];
        }
        s.push_str(rest);
        out = s;
    }
    out
}

/// A fixture's metadata in an app folder of its own, its model named by absolute path.
fn fixture_app(fixture: &str) -> App {
    let app = App::new("mlp.pt", "");
    let text = std::fs::read_to_string(fixtures().join(fixture))
        .unwrap_or_else(|e| panic!("tests/fixtures/{fixture}: {e}"));
    let mut meta: serde_json::Value = serde_json::from_str(&text).unwrap();
    let model = fixtures().join(meta["model"].as_str().unwrap());
    meta["model"] = model.display().to_string().into();
    std::fs::write(app.metadata(), meta.to_string()).unwrap();
    app
}

/// The outputs a block shows, each as the trimmed line to find in what it printed.
fn shown_outputs(ex: &Example) -> Vec<String> {
    let mut out = Vec::new();
    let mut under_command = false;
    for line in ex.text.lines() {
        let shown = match ex.lang.as_str() {
            "console" => {
                under_command = line.starts_with("$ ") || (under_command && !line.is_empty());
                (!line.starts_with("$ ") && under_command).then_some(line)
            }
            "python" | "py" => line
                .trim_start()
                .starts_with("print(")
                .then(|| line.split_once(")   # ").or(line.split_once(")  # ")))
                .flatten()
                .map(|(_, c)| c)
                .filter(|c| !c.starts_with('(')),
            _ => {
                let shown = line.strip_prefix("# ").filter(|_| under_command);
                under_command = shown.is_some() || !(line.starts_with('#') || line.is_empty());
                shown
            }
        };
        if let Some(s) = shown.filter(|s| !s.contains('…')) {
            out.push(s.trim().to_string());
        }
    }
    out
}

/// Runs a shell or Python text in `dir` with `path` first on PATH; its standard output.
fn run(at: &str, lang: &str, text: &str, dir: &Path, env: &[(&str, String)]) -> String {
    let mut cmd = if lang.starts_with("py") {
        let mut c = Command::new(python());
        c.arg("-c").arg(text);
        c
    } else {
        let mut c = Command::new("bash");
        c.args(["-euo", "pipefail", "-c"]).arg(text);
        c
    };
    let path = format!(
        "{}:{}",
        app_bin().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = cmd
        .current_dir(dir)
        .env("PATH", path)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    assert!(
        out.status.success(),
        "{at}: the example failed ({}):\n{text}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn assert_shown(ex: &Example, stdout: &str) {
    let printed: Vec<&str> = stdout.lines().map(str::trim).collect();
    for want in shown_outputs(ex) {
        assert!(
            printed.contains(&want.as_str()),
            "{}: the example shows {want:?}, but printed:\n{stdout}",
            ex.at
        );
    }
}

/// A console block's commands (the text after each `$ `).
fn commands(ex: &Example) -> String {
    if ex.lang != "console" {
        return ex.text.clone();
    }
    let lines = ex.text.lines().filter_map(|l| l.strip_prefix("$ "));
    lines.map(|l| format!("{l}\n")).collect()
}

/// Runs a block that starts `app` itself: the lines before each `app` line run, then that
/// `app` starts (in the background, its log captured) and the test waits until it listens.
fn run_starting_app(ex: &Example, fixture: &str, ports: &[String]) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("etc/vramfork")).unwrap();
    let ports: BTreeMap<String, u16> = ports.iter().map(|p| (p.clone(), free_port())).collect();
    let etc = format!("{}/etc/vramfork/", dir.path().display());
    let text = repoint(&commands(ex), &ports).replace("/etc/vramfork/", &etc);
    // The port `app` serves on unless the block says: the block's 5000 where it names it.
    let serving = ports.get("5000").copied().unwrap_or_else(free_port);
    let app = fixture_app(fixture);
    let env = [("VRAMFORK_METADATA", app.metadata().display().to_string())];
    let mut servers = Vec::new();
    let (mut chunk, mut stdout) = (String::new(), String::new());
    for line in text.lines() {
        if let Some(args) = line.strip_prefix("app ") {
            stdout += &run(&ex.at, &ex.lang, &chunk, dir.path(), &env);
            chunk.clear();
            let mut cmd = Command::new("bash");
            let args = args.trim_end().trim_end_matches('&');
            cmd.arg("-c")
                .arg(format!("exec {} {args}", app_bin().display()))
                .current_dir(dir.path())
                .env("VRAMFORK_METADATA", &env[0].1)
                .env("VRAMFORK_PORT", serving.to_string())
                .env("VRAMFORK_LOG_FORMAT", "json");
            servers.push(Server::spawn_command(cmd).wait_listening());
        } else {
            chunk.push_str(line);
            chunk.push('\n');
        }
    }
    stdout += &run(&ex.at, &ex.lang, &chunk, dir.path(), &env);
    assert_shown(ex, &stdout);
    drop(servers);
}

/// Runs a block against servers of the fixtures it names.
fn run_served(ex: &Example, fixtures: &[String], ports: &[String]) {
    let apps: Vec<App> = fixtures.iter().map(|f| fixture_app(f)).collect();
    let servers: Vec<Server> = apps
        .iter()
        .map(|a| Server::start(a, &["--workers", "2"]))
        .collect();
    let ports: BTreeMap<String, u16> = ports
        .iter()
        .cloned()
        .zip(servers.iter().map(|s| s.port))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let text = repoint(&commands(ex), &ports);
    let stdout = run(&ex.at, &ex.lang, &text, dir.path(), &[]);
    assert_shown(ex, &stdout);
}

/// No example is left without a word on how it is checked, and each pointer holds: a named
/// test function exists, a named script holds every line of the block.
#[test]
fn every_example_says_how_it_is_checked() {
    let all = examples();
    assert!(all.len() > 20, "found only {} examples", all.len());
    for ex in &all {
        let marker = ex.marker.as_deref().unwrap_or_else(|| {
            panic!(
                "{}: a {} example with no `<!-- example: … -->` line above it (see tests/doc_examples.rs)",
                ex.at, ex.lang
            )
        });
        if let Some(by) = marker.strip_prefix("run by ") {
            let (file, func) = by.split_once("::").expect("run by FILE::FN");
            let code = std::fs::read_to_string(root().join(file))
                .unwrap_or_else(|e| panic!("{}: {file}: {e}", ex.at));
            assert!(
                code.contains(&format!("fn {func}(")),
                "{}: {file} has no fn {func}",
                ex.at
            );
        } else if let Some(file) = marker.strip_prefix("copy of ") {
            let script = std::fs::read_to_string(root().join(file))
                .unwrap_or_else(|e| panic!("{}: {file}: {e}", ex.at));
            for line in ex.text.lines().filter(|l| !l.trim().is_empty()) {
                assert!(
                    script.lines().any(|s| s.trim_end() == line.trim_end()),
                    "{}: {file} does not hold the line {line:?}",
                    ex.at
                );
            }
        } else if let Some(why) = marker.strip_prefix("not run here: ") {
            assert!(why.len() > 10, "{}: say why it is not run", ex.at);
        } else {
            assert!(
                marker.starts_with("serves ") || marker.starts_with("starts app with "),
                "{}: unknown marker {marker:?}",
                ex.at
            );
        }
    }
}

/// The examples that talk to a running server, each against servers of the fixtures it
/// names, as written.
#[test]
fn the_examples_against_a_server_run_as_written() {
    let mut ran = 0;
    for ex in examples() {
        let Some(spec) = ex.marker.as_deref().and_then(|m| m.strip_prefix("serves ")) else {
            continue;
        };
        let (fixtures, ports) = fixtures_and_ports(spec);
        run_served(&ex, &fixtures, &ports);
        ran += 1;
    }
    assert!(ran >= 4, "ran only {ran} examples");
}

/// The examples that start `app` themselves (keys, TLS, metrics), as written.
#[test]
fn the_examples_that_start_app_run_as_written() {
    let mut ran = 0;
    for ex in examples() {
        let Some(spec) = ex
            .marker
            .as_deref()
            .and_then(|m| m.strip_prefix("starts app with "))
        else {
            continue;
        };
        let (fixtures, ports) = fixtures_and_ports(spec);
        run_starting_app(&ex, &fixtures[0], &ports);
        ran += 1;
    }
    assert!(ran >= 3, "ran only {ran} examples");
}

#[test]
fn shown_outputs_are_read_from_each_kind_of_block() {
    let ex = |lang: &str, text: &str| Example {
        at: "t".into(),
        lang: lang.into(),
        marker: None,
        text: text.into(),
    };
    let sh = "curl a | grep b\n# x: 1\n# {\"k\": 2}\n\n# a note\ncurl c  # inline\n# …\n";
    assert_eq!(shown_outputs(&ex("sh", sh)), ["x: 1", "{\"k\": 2}"]);
    let console = "$ curl a\n{\"o\": 1}\n$ curl b\nline …\n";
    assert_eq!(shown_outputs(&ex("console", console)), ["{\"o\": 1}"]);
    let py = "x = 1   # not shown\nprint(x)   # [1]\nprint(y)  # (a remark)\n";
    assert_eq!(shown_outputs(&ex("python", py)), ["[1]"]);
    let ports = BTreeMap::from([("5000".to_string(), 4242u16)]);
    assert_eq!(
        repoint("curl localhost:5000/ --port 5000 -d 15000", &ports),
        "curl 127.0.0.1:4242/ --port 4242 -d 15000"
    );
}
