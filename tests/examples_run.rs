//! Runs the built examples that check themselves: `deferred_allreduce` sums a vector across 4
//! processes using deferred work only and asserts the exact sum on every rank; `xpu_pipeline`
//! sends XPU-triggered buckets to a peer process that checks every byte. scripts/test.sh
//! (what CI runs) builds the examples before the tests.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::bounded;

fn example(name: &str) -> Option<PathBuf> {
    // target/<profile>/deps/<this test> -> target/<profile>/examples/<name>
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("examples").join(name);
    p.exists().then_some(p)
}

/// Runs example `name` with `args` (bounded); returns its standard output, or `None` (with the
/// reason printed) when the examples are not built outside CI.
fn run_example(name: &str, args: &[&str]) -> Option<String> {
    let Some(exe) = example(name) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "examples are not built: run the suite as scripts/test.sh does (cargo build --examples first)"
        );
        eprintln!("skipped: the {name} example is not built (cargo build --examples)");
        return None;
    };
    let child = Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start example");
    // Its output is read while it runs (a full pipe must not stall it).
    let pid = child.id();
    let out = bounded(pid, Duration::from_secs(120), name, || {
        child.wait_with_output()
    })
    .expect("output");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{name} failed: {text}");
    Some(text)
}

#[test]
fn deferred_allreduce_sums_exactly_across_four_processes() {
    if let Some(text) = run_example("deferred_allreduce", &["4096"]) {
        assert!(text.contains("exact sum on every rank"), "{text}");
    }
}

#[test]
fn xpu_pipeline_delivers_every_bucket_checked() {
    let args = [
        "--buckets",
        "32",
        "--bucket-kib",
        "16",
        "--rounds",
        "3",
        "--xpu",
        "cpu",
    ];
    if let Some(text) = run_example("xpu_pipeline", &args) {
        assert!(
            text.contains("3 rounds, every byte checked by the peer"),
            "{text}"
        );
        assert!(text.contains("XPU: CPU thread"), "{text}");
    }
}

#[test]
fn xpu_bench_silence_mode_runs_with_tiny_gaps() {
    for extra in [&[][..], &["--manual"][..]] {
        let mut args = vec!["silence", "--gaps", "0,1", "--samples", "3"];
        args.extend_from_slice(extra);
        if let Some(text) = run_example("xpu_bench", &args) {
            // Its table: one row per gap and the plain sends; no figure is asserted.
            assert!(text.contains("gap ms  samples"), "{text}");
            let rows = text
                .lines()
                .filter(|l| l.split_whitespace().nth(1) == Some("3"))
                .count();
            assert_eq!(rows, 3, "{text}");
            assert!(text.contains("user-level monitor/wait"), "{text}");
        }
    }
}
