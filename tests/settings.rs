//! The settings table is complete and documented, and a bad value is a warning, not a silent
//! default.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use xfabric::settings::{self, SETTINGS};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// docs/settings.md's table has a row for every setting (the README links to it).
#[test]
fn docs_settings_table_names_every_setting() {
    let page = std::fs::read_to_string(root().join("docs/settings.md")).expect("docs/settings.md");
    for s in SETTINGS {
        assert!(
            page.contains(&format!("\n| `{}` |", s.name)),
            "{} has no row in docs/settings.md's table",
            s.name
        );
    }
}

/// Every `.rs` file of the library's source: tests, examples and benchmarks read their own
/// variables, which are not library settings.
fn library_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name();
        if path.is_dir() {
            if !["tests", "examples", "benches", "target"].contains(&name.to_str().unwrap_or("")) {
                library_sources(&path, out);
            }
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// String literals that are a whole `XFABRIC_*` name, or a whole `FI_*` name on a line that
/// speaks of the environment (`FI_*` literals are mostly libfabric's constant names).
fn env_names_in(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in text.lines() {
        for (i, lit) in line.split('"').enumerate() {
            if i % 2 == 0
                || !lit
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            {
                continue;
            }
            let env_line = line.to_ascii_lowercase().contains("env");
            if lit.starts_with("XFABRIC_") || (lit.starts_with("FI_") && env_line) {
                names.push(lit.to_string());
            }
        }
    }
    names
}

#[test]
fn every_variable_the_library_reads_is_in_the_table() {
    let mut files = Vec::new();
    for dir in ["core", "providers", "hmem", "kernels", "xpu-trigger", "src"] {
        library_sources(&root().join(dir), &mut files);
    }
    assert!(files.len() > 20, "found only {files:?}");
    let mut seen = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read source");
        for name in env_names_in(&text) {
            seen += 1;
            assert!(
                SETTINGS.iter().any(|s| s.name == name),
                "{name} (in {}) is not in core/src/settings.rs",
                f.display()
            );
        }
    }
    assert!(
        seen >= SETTINGS.len() - 2,
        "the scan found only {seen} names"
    );
    // The scan itself: a reader the table lacks is caught.
    assert_eq!(
        env_names_in("let v = std::env::var(\"FI_NEW_THING\");\nlet c = \"FI_MSG\";"),
        ["FI_NEW_THING"]
    );
}

#[test]
fn info_e_lists_every_setting() {
    let out = Command::new(env!("CARGO_BIN_EXE_xfabric"))
        .args(["info", "-e"])
        .stdin(Stdio::null())
        .output()
        .expect("run xfabric");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for s in SETTINGS {
        assert!(
            text.contains(&format!("# {}: {}\n", s.name, s.kind)),
            "{} not in:\n{text}",
            s.name
        );
        assert!(
            text.contains(&format!("(default: {})", s.default)),
            "{text}"
        );
    }
}

/// Runs this test in a child with `XFABRIC_SHM_UNEXP_MSGS=value` and logging off; returns its
/// stderr.
fn child_stderr(test: &str, value: &str) -> String {
    let mut child = Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env("XF_ROLE", "child")
        .env("XFABRIC_SHM_UNEXP_MSGS", value)
        .env_remove("FI_LOG_LEVEL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let pid = child.id();
    let stderr = child.stderr.take().expect("stderr");
    let (status, err) = common::bounded(pid, Duration::from_secs(60), "the child", move || {
        let err = std::io::read_to_string(stderr).unwrap_or_default();
        (child.wait().expect("wait"), err)
    });
    assert!(status.success(), "child failed:\n{err}");
    assert_eq!(common::segments_of(pid), 0, "the child left a segment");
    err
}

/// Said on stderr by the child once its endpoints are open, before it reads the setting itself:
/// a warning before it came from the provider's own reading.
const OPENED: &str = "child: endpoints open";

/// In the child: two shm endpoints open (each reads the setting), then the value is checked.
fn child_reads_unexp_msgs(want: u64) {
    let n = common::node(xfabric::FI_TAGGED, xfabric::Progress::Auto);
    let m = common::node(xfabric::FI_TAGGED, xfabric::Progress::Auto);
    eprintln!("{OPENED}");
    assert_eq!(settings::SHM_UNEXP_MSGS.size(), want);
    drop((n, m));
}

#[test]
fn a_bad_value_is_one_warning_and_the_default_applies() {
    if common::role().is_some() {
        child_reads_unexp_msgs(16384);
        return;
    }
    let err = child_stderr("a_bad_value_is_one_warning_and_the_default_applies", "lots");
    let (opening, _) = err
        .split_once(OPENED)
        .expect("the child opened its endpoints");
    let warnings: Vec<_> = err
        .lines()
        .filter(|l| l.contains("XFABRIC_SHM_UNEXP_MSGS"))
        .collect();
    assert!(
        opening.contains("XFABRIC_SHM_UNEXP_MSGS"),
        "the provider did not report it:\n{err}"
    );
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(warnings[0].contains("\"lots\""), "{err}");
    assert!(warnings[0].contains("16384"), "{err}");
}

#[test]
fn a_good_value_is_used_without_a_warning() {
    if common::role().is_some() {
        child_reads_unexp_msgs(4096);
        return;
    }
    let err = child_stderr("a_good_value_is_used_without_a_warning", "4096");
    assert!(!err.contains("XFABRIC_SHM_UNEXP_MSGS"), "{err}");
}
