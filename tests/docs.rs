//! The documents tell the truth about themselves and the code: a short README from
//! which every page of `docs/` is reached; every internal link and anchor resolves; every page
//! opens with a contents list that is exactly its headings; the options table is exactly the
//! flags `app --help` lists; every app-metadata example is accepted by the real parser;
//! docs/architecture.md names every source file of `src/` and `worker/src/`, and no other,
//! and every other path it names exists.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The README's length a newcomer reads before being sent elsewhere.
const README_MAX_LINES: usize = 300;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every `docs/*.md`, by path relative to the root.
fn pages() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    out.insert(
        "README.md".to_string(),
        std::fs::read_to_string(root().join("README.md")).unwrap(),
    );
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            let name = format!("docs/{}", p.file_name().unwrap().to_string_lossy());
            out.insert(name, std::fs::read_to_string(&p).unwrap());
        }
    }
    out
}

/// The lines outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces
/// as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The page's headings (level, text), outside code blocks.
fn headings(text: &str) -> Vec<(usize, String)> {
    prose(text)
        .into_iter()
        .filter_map(|l| {
            let level = l.chars().take_while(|c| *c == '#').count();
            (1..=6)
                .contains(&level)
                .then(|| l[level..].strip_prefix(' '))
                .flatten()
                .map(|t| (level, t.to_string()))
        })
        .collect()
}

/// Every anchor of a page (a repeated heading gets `-1`, `-2`… as on GitHub).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    headings(text)
        .into_iter()
        .map(|(_, t)| {
            let s = slug(&t);
            let n = seen.entry(s.clone()).or_default();
            let a = if *n == 0 { s } else { format!("{s}-{n}") };
            *n += 1;
            a
        })
        .collect()
}

/// Markdown link targets `](…)` outside code blocks (inline code spans included: a link
/// written in backticks is not one, and none of ours are).
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

/// A link from `page` resolved to (page or file path relative to the root, anchor);
/// `None` for links out of the repository.
fn resolve(page: &str, target: &str) -> Option<(String, Option<String>)> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (file, anchor) = match target.split_once('#') {
        Some((f, a)) => (f, Some(a.to_string())),
        None => (target, None),
    };
    if file.is_empty() {
        return Some((page.to_string(), anchor));
    }
    let base = Path::new(page).parent().unwrap_or(Path::new(""));
    let mut parts: Vec<String> = Vec::new();
    for c in base.join(file).components() {
        match c {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::Normal(n) => parts.push(n.to_string_lossy().into_owned()),
            _ => {}
        }
    }
    Some((parts.join("/"), anchor))
}

#[test]
fn every_internal_link_and_anchor_resolves() {
    let pages = pages();
    let mut broken = Vec::new();
    for (page, text) in &pages {
        for target in links(text) {
            let Some((file, anchor)) = resolve(page, &target) else {
                continue;
            };
            if !root().join(&file).exists() {
                broken.push(format!("{page}: {target} (no file {file})"));
                continue;
            }
            if let Some(a) = anchor {
                match pages.get(&file) {
                    Some(t) if anchors(t).contains(&a) => {}
                    Some(_) => broken.push(format!("{page}: {target} (no heading #{a} in {file})")),
                    None => {} // an anchor into a source file: not checked
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_short_and_reaches_every_page() {
    let pages = pages();
    let readme = &pages["README.md"];
    assert!(
        readme.lines().count() <= README_MAX_LINES,
        "README.md has {} lines; keep it at most {README_MAX_LINES} (the rest goes to docs/)",
        readme.lines().count()
    );
    let mut reached = BTreeSet::from(["README.md".to_string()]);
    let mut todo = vec!["README.md".to_string()];
    while let Some(p) = todo.pop() {
        for target in links(&pages[&p]) {
            if let Some((file, _)) = resolve(&p, &target) {
                if pages.contains_key(&file) && reached.insert(file.clone()) {
                    todo.push(file);
                }
            }
        }
    }
    let unreached: Vec<_> = pages.keys().filter(|p| !reached.contains(*p)).collect();
    assert!(
        unreached.is_empty(),
        "pages no link from README.md leads to: {unreached:?}"
    );
}

#[test]
fn every_page_opens_with_a_contents_list_of_its_headings() {
    for (page, text) in pages() {
        if page == "README.md" {
            continue;
        }
        let heads = headings(&text);
        let wanted: Vec<String> = heads
            .iter()
            .filter(|(l, t)| (2..=3).contains(l) && t != "Contents")
            .map(|(_, t)| format!("#{}", slug(t)))
            .collect();
        let lines = prose(&text);
        let start = lines
            .iter()
            .position(|l| *l == "## Contents")
            .unwrap_or_else(|| panic!("{page} has no `## Contents` list"));
        let listed: Vec<String> = lines[start + 1..]
            .iter()
            .take_while(|l| l.is_empty() || l.trim_start().starts_with("- "))
            .flat_map(|l| links(l))
            .collect();
        assert_eq!(
            listed, wanted,
            "{page}: the contents list must link every ## and ### heading, in order"
        );
    }
}

#[test]
fn the_options_table_is_exactly_what_app_help_lists() {
    let out = std::process::Command::new(common::app_bin())
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let flag = |s: &str| -> Option<String> {
        let s = s.trim().trim_start_matches('`');
        s.starts_with("--").then(|| {
            s.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect()
        })
    };
    let mut from_help: BTreeSet<String> = help.lines().filter_map(&flag).collect();
    from_help.remove("--help");
    let options = std::fs::read_to_string(root().join("docs/options.md")).unwrap();
    let in_table: BTreeSet<String> = prose(&options)
        .into_iter()
        .filter(|l| l.starts_with("| `--"))
        .filter_map(|l| flag(l.trim_start_matches('|')))
        .collect();
    assert!(from_help.len() >= 30, "{help}");
    assert_eq!(
        in_table, from_help,
        "docs/options.md's table and `app --help` list different flags"
    );
}

/// Each option's default in docs/options.md is the one the code renders into `app --help`
/// (from the one place it is written, the option's group in src/master/config/): a value
/// shown there in backticks must be the value `app` uses, `off` must be off, and a default
/// that is a rule in the code (planned, by GPU size) must not be a value in the docs.
#[test]
fn the_options_tables_defaults_are_what_app_help_says() {
    let out = std::process::Command::new(common::app_bin())
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout).to_string();
    let mut from_help: BTreeMap<String, Option<String>> = BTreeMap::new();
    for line in help.lines() {
        let line = line.trim_start();
        let Some(rest) = line.strip_prefix("--") else {
            continue;
        };
        let flag: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        let default = line.find("[default: ").map(|i| {
            let d = &line[i + "[default: ".len()..];
            d[..d.find(']').unwrap()].to_string()
        });
        from_help.insert(format!("--{flag}"), default);
    }
    let options = std::fs::read_to_string(root().join("docs/options.md")).unwrap();
    let literal = |cell: &str| -> Option<String> {
        // `value`, optionally followed by a parenthetical: "`0` (never)".
        let rest = cell.strip_prefix('`')?;
        let end = rest.find('`')?;
        let after = rest[end + 1..].trim();
        (after.is_empty() || after.starts_with('(') && after.ends_with(')'))
            .then(|| rest[..end].to_string())
    };
    let mut checked = 0;
    for row in prose(&options)
        .into_iter()
        .filter(|l| l.starts_with("| `--"))
    {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let flag = cells[1].trim_matches('`');
        let flag = flag.split(' ').next().unwrap();
        let documented = cells[3];
        let Some(code) = from_help.get(flag) else {
            panic!("{flag} is in docs/options.md but not in app --help")
        };
        match code.as_deref() {
            Some("off") => assert_eq!(documented, "off", "{flag}: app --help says off"),
            Some(v) if !v.contains(' ') => assert_eq!(
                literal(documented).as_deref(),
                Some(v),
                "{flag}: docs/options.md says {documented:?}, app --help [default: {v}]"
            ),
            _ => assert_eq!(
                literal(documented),
                None,
                "{flag}: docs/options.md gives a value ({documented:?}); app --help has {code:?}"
            ),
        }
        checked += 1;
    }
    assert!(checked >= 40, "{checked} rows checked");
    // The defaults written once in the code are values --help renders.
    for (flag, v) in [
        ("--port", "5000"),
        ("--timeout", "30"),
        ("--ledger", "/run/vramfork"),
    ] {
        assert_eq!(from_help[flag].as_deref(), Some(v), "{flag}");
    }
}

#[test]
fn every_app_metadata_example_is_accepted_by_the_parser() {
    let dir = tempfile::tempdir().unwrap();
    // What the examples point at, so that the parser's own reads succeed.
    std::fs::write(
        dir.path().join("labels.json"),
        r#"["negative", "neutral", "positive"]"#,
    )
    .unwrap();
    for f in ["model.pt", "resnet18.pt", "encoder.pt", "tokenizer.json"] {
        std::fs::write(dir.path().join(f), "").unwrap();
    }
    // The TorchServe archives migrating.md's examples name.
    std::fs::create_dir(dir.path().join("model-store")).unwrap();
    for (archive, handler) in [
        ("resnet-18", "image_classifier"),
        ("fasterrcnn", "object_detector"),
    ] {
        let path = dir.path().join(format!("model-store/{archive}.mar"));
        let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
        let manifest = format!(
            r#"{{"model": {{"modelName": "{archive}", "serializedFile": "model.pt", "handler": "{handler}"}}}}"#
        );
        for (name, data) in [
            ("MAR-INF/MANIFEST.json", manifest.as_str()),
            ("model.pt", ""),
        ] {
            z.start_file(name, zip::write::FileOptions::default())
                .unwrap();
            std::io::Write::write_all(&mut z, data.as_bytes()).unwrap();
        }
        z.finish().unwrap();
    }
    let meta = dir.path().join("app-metadata.json");
    let mut checked = 0;
    for (page, text) in pages() {
        let mut block: Option<String> = None;
        for line in text.lines() {
            match (&mut block, line) {
                (None, "```json") => block = Some(String::new()),
                (Some(b), "```") => {
                    let b = std::mem::take(b);
                    block = None;
                    // A fragment of fields is shown inside a minimal metadata.
                    let doc = if b.trim_start().starts_with('{') {
                        b
                    } else {
                        format!("{{\"name\": \"x\", \"model\": \"model.pt\", {b}}}")
                    };
                    let v: serde_json::Value = match serde_json::from_str(&doc) {
                        Ok(v) => v,
                        Err(e) => panic!("{page}: a json block is not JSON ({e}):\n{doc}"),
                    };
                    if v.get("name").is_none() || v.get("model").is_none() {
                        continue; // not app metadata (a device call, a v2 answer…)
                    }
                    if let Err(e) = vramfork::metadata::AppMetadata::parse(&meta, &doc) {
                        panic!("{page}: an app-metadata example is refused: {e}\n{doc}");
                    }
                    checked += 1;
                }
                (Some(b), l) => {
                    b.push_str(l);
                    b.push('\n');
                }
                (None, _) => {}
            }
        }
    }
    assert!(checked >= 5, "only {checked} metadata examples found");
}

/// Every `.rs` file under `dir` (relative to the root), sorted.
fn source_files(dir: &str) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(root).unwrap();
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let mut out = Vec::new();
    walk(&root(), &root().join(dir), &mut out);
    out.sort();
    out
}

/// The architecture map names every source file (by its path, in the first column of a
/// table row), as `src/master/events.rs`'s test checks the events table: a file added
/// without a line there, or a line left for a file gone, fails.
#[test]
fn the_architecture_map_names_every_source_file() {
    let text = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let mut named = BTreeSet::new();
    for line in prose(&text) {
        let Some(row) = line.strip_prefix("| ") else {
            continue;
        };
        let first = row.split(" | ").next().unwrap_or_default();
        named.extend(
            first
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|p| p.ends_with(".rs"))
                .map(str::to_string),
        );
    }
    let files: BTreeSet<String> = source_files("src")
        .into_iter()
        .chain(source_files("worker/src"))
        .collect();
    assert!(files.len() > 100, "{files:?}");
    let missing: Vec<_> = files.difference(&named).collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md does not name these source files (add a row: path | what it owns): {missing:?}"
    );
    let gone: Vec<_> = named.difference(&files).collect();
    assert!(
        gone.is_empty(),
        "docs/architecture.md names files that do not exist: {gone:?}"
    );
}

/// Every file and folder docs/architecture.md names in backquotes exists: a path with a `/`
/// as a path from the root or as the end of one (`grpc/mod.rs` for `worker/src/grpc/mod.rs`),
/// a bare file name as some file's name. A page that sends a reader to a file that was moved
/// or deleted fails here. Names of users' own files are listed apart.
#[test]
fn the_architecture_page_names_only_paths_that_exist() {
    const USERS_FILES: &[&str] = &["tokenizer.json"];
    const KINDS: &[&str] = &[
        "rs", "py", "cpp", "h", "md", "toml", "json", "sh", "service", "yaml", "yml", "txt",
        "proto", "patch",
    ];
    fn walk(root: &Path, dir: &Path, files: &mut BTreeSet<String>, dirs: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            if name == "target" || name.starts_with('.') {
                continue;
            }
            let rel = p
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            if p.is_dir() {
                dirs.insert(format!("{rel}/"));
                walk(root, &p, files, dirs);
            } else {
                files.insert(rel);
            }
        }
    }
    let (mut files, mut dirs) = (BTreeSet::new(), BTreeSet::new());
    walk(&root(), &root(), &mut files, &mut dirs);
    let names: BTreeSet<&str> = files
        .iter()
        .map(|f| f.rsplit('/').next().unwrap())
        .collect();
    let text = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let mut checked = 0;
    let mut gone = Vec::new();
    for line in prose(&text) {
        for quoted in line.split('`').skip(1).step_by(2) {
            let path = quoted
                .split("::")
                .next()
                .unwrap()
                .split('#')
                .next()
                .unwrap();
            if path.contains(char::is_whitespace)
                || path.contains('<')
                || path.starts_with(['/', '.'])
            {
                continue;
            }
            let is_file = path
                .rsplit_once('.')
                .is_some_and(|(stem, ext)| !stem.is_empty() && KINDS.contains(&ext));
            let is_dir = path.ends_with('/') && path.len() > 1 && !path.contains("://");
            let found = if is_file && path.contains('/') {
                files.contains(path) || files.iter().any(|f| f.ends_with(&format!("/{path}")))
            } else if is_file {
                names.contains(path) || USERS_FILES.contains(&path)
            } else if is_dir {
                dirs.contains(path) || dirs.iter().any(|d| d.ends_with(&format!("/{path}")))
            } else {
                continue;
            };
            checked += 1;
            if !found {
                gone.push(quoted.to_string());
            }
        }
    }
    assert!(
        checked > 200,
        "only {checked} paths read: is the page's format changed?"
    );
    assert!(
        gone.is_empty(),
        "docs/architecture.md names paths that do not exist: {gone:?}"
    );
}
