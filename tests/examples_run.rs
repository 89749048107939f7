//! Runs the built examples that check themselves: `deferred_allreduce` sums a vector across 4
//! processes using deferred work only and asserts the exact sum on every rank; `xpu_pipeline`
//! sends XPU-triggered buckets to a peer process that checks every byte; `first`, the README's
//! first program, sends "hello" between two shm endpoints; `moe_dispatch` routes tokens among
//! 4 processes at run time, each receiver checking every byte. scripts/test.sh (what CI runs)
//! builds the examples before the tests.

mod common;

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::bounded;

fn example(name: &str) -> Option<PathBuf> {
    // target/<profile>/deps/<this test> -> target/<profile>/examples/<name>
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("examples").join(name);
    p.exists().then_some(p)
}

/// The example's path, or `None` (with the reason printed) when the examples are not built
/// outside CI.
fn built(name: &str) -> Option<PathBuf> {
    let Some(exe) = example(name) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "examples are not built: run the suite as scripts/test.sh does (cargo build --examples first)"
        );
        eprintln!("skipped: the {name} example is not built (cargo build --examples)");
        return None;
    };
    Some(exe)
}

/// Runs example `name` with `args` (bounded); returns its standard output, or `None` when the
/// examples are not built outside CI.
fn run_example(name: &str, args: &[&str]) -> Option<String> {
    let exe = built(name)?;
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
        // The ordinary way runs beside it, with the bound overlap allows.
        assert!(text.contains("triggered/ordinary"), "{text}");
        assert!(
            text.contains("max(compute, transfer)/(compute + transfer)"),
            "{text}"
        );
        // Calibrated to the sixteenth of a pass, until compute meets transfer.
        assert!(text.contains("calibrated: "), "{text}");
    }
    // A fraction of a pass, as the calibration picks them.
    let args = [
        "--buckets",
        "8",
        "--rounds",
        "1",
        "--xpu",
        "cpu",
        "--work",
        "1.5",
    ];
    if let Some(text) = run_example("xpu_pipeline", &args) {
        assert!(text.contains("bucket 1.5 time(s) over"), "{text}");
        assert!(!text.contains("calibrat"), "{text}");
    }
}

#[test]
fn moe_dispatch_checks_every_token_across_four_processes() {
    let args = [
        "--ranks", "4", "--tokens", "64", "--rounds", "2", "--work", "1",
    ];
    if let Some(text) = run_example("moe_dispatch", &args) {
        assert!(
            text.contains("2 rounds, every byte checked by its receiver"),
            "{text}"
        );
        assert!(text.contains("verdict: device/host"), "{text}");
    }
}

/// Runs example `name` with `args`, bounded, with all its output captured.
fn run_raw(name: &str, args: &[OsString]) -> Option<Output> {
    run_raw_env(name, args, &[])
}

/// [`run_raw`] with `env` added to the example's environment.
fn run_raw_env(name: &str, args: &[OsString], env: &[(&str, String)]) -> Option<Output> {
    let exe = built(name)?;
    let child = Command::new(exe)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start example");
    let pid = child.id();
    Some(
        bounded(pid, Duration::from_secs(60), name, || {
            child.wait_with_output()
        })
        .expect("output"),
    )
}

const EXAMPLES: [&str; 6] = [
    "pingpong",
    "deferred_allreduce",
    "xpu_pipeline",
    "xpu_bench",
    "moe_dispatch",
    "gpu_ipc_bench",
];

#[test]
fn every_example_answers_help() {
    for name in EXAMPLES {
        let Some(out) = run_raw(name, &["--help".into()]) else {
            continue;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name} --help: {out:?}");
        assert!(text.contains("Usage: "), "{name} --help printed {text}");
    }
}

/// Bad input to every example: a non-UTF-8 argument, a word where a number goes, a negative
/// number, an unknown flag. Each is one line on stderr and a non-zero status, never a panic.
#[test]
fn every_example_refuses_bad_arguments_in_one_line() {
    let not_utf8 = OsStr::from_bytes(b"\xff\xfe").to_os_string();
    let cases: [(&str, Vec<&str>); 6] = [
        ("pingpong", vec!["-I"]),
        ("deferred_allreduce", vec![]),
        ("xpu_pipeline", vec!["--rounds"]),
        ("xpu_bench", vec!["lat", "--samples"]),
        ("moe_dispatch", vec!["--rounds"]),
        ("gpu_ipc_bench", vec!["--rounds"]),
    ];
    for (name, number_flag) in cases {
        let with = |last: OsString| -> Vec<OsString> {
            number_flag
                .iter()
                .map(OsString::from)
                .chain([last])
                .collect()
        };
        for args in [
            vec![not_utf8.clone()],
            with(not_utf8.clone()),
            with("notanumber".into()),
            with("-5".into()),
            with("0".into()),
            vec!["--no-such-flag".into()],
        ] {
            let Some(out) = run_raw(name, &args) else {
                break;
            };
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{name} {args:?} succeeded");
            assert_eq!(err.lines().count(), 1, "{name} {args:?}: {err}");
            assert!(!err.contains("panicked"), "{name} {args:?}: {err}");
            assert!(err.starts_with(name), "{name} {args:?}: {err}");
        }
    }
}

/// `--xpu gpu` where no GPU is usable: one line saying why and a non-zero status. The peer
/// process used to be started first and then panic writing its address into the closed pipe.
#[test]
fn xpu_pipeline_refuses_a_missing_gpu_in_one_line() {
    let Some(out) = run_raw(
        "xpu_pipeline",
        &["--xpu".into(), "gpu".into(), "--rounds".into(), "1".into()],
    ) else {
        return;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        println!("skipped: a GPU is usable here, so --xpu gpu ran");
        return;
    }
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("xpu_pipeline: --xpu gpu: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn xpu_bench_silence_mode_runs_with_tiny_gaps() {
    for extra in [&[][..], &["--manual"][..]] {
        let mut args = vec!["silence", "--gaps", "0,1", "--samples", "3"];
        args.extend_from_slice(extra);
        if let Some(text) = run_example("xpu_bench", &args) {
            // Its table: one row per gap (trigger and plain send after the same silence), then
            // the back-to-back plain sends; no figure is asserted.
            assert!(text.contains("gap ms  samples"), "{text}");
            let rows = text
                .lines()
                .filter(|l| l.split_whitespace().nth(1) == Some("3"))
                .count();
            assert_eq!(rows, 2, "{text}");
            assert!(text.contains("plain back to back: p50"), "{text}");
            assert!(text.contains("user-level monitor/wait"), "{text}");
        }
    }
}

/// `rate --device`: one XPU thread posts every send as a descriptor while the watcher waits in
/// `fi_cq_sread`; every send completes at the peer (the peer counts them) in each round, and
/// the figures and the goal's verdict are printed, with completions and without. No figure is
/// asserted.
#[test]
fn xpu_bench_rate_through_the_device_api_completes() {
    let args = ["rate", "--device", "--count", "3000", "--rounds", "2"];
    if let Some(text) = run_example("xpu_bench", &args) {
        assert!(
            text.contains("3000 per round, 2 rounds"),
            "the header names the count and rounds: {text}"
        );
        assert!(
            text.contains("xpu-device (one XPU thread, one watcher): "),
            "{text}"
        );
        assert!(text.contains("host tinject: "), "{text}");
        assert!(text.contains("goal (issue 31, device API rate: "), "{text}");
        // The first message's wait is shown apart from the rate.
        assert!(
            text.contains("first post -> the peer's first completion, us"),
            "{text}"
        );
    }
    // Like for like, as bench.sh runs it: no completions, as an inject writes none.
    let args = [
        "rate", "--device", "--quiet", "--count", "3000", "--rounds", "2",
    ];
    if let Some(text) = run_example("xpu_bench", &args) {
        assert!(
            text.contains("xpu-device (one XPU thread, one watcher, no completions): "),
            "{text}"
        );
        assert!(text.contains("goal (issue 31, device API rate: "), "{text}");
    }
}

#[test]
fn readme_first_program_sends_hello() {
    if let Some(text) = run_example("first", &[]) {
        assert_eq!(text.trim(), "received \"hello\"", "{text}");
    }
}

/// gpu_ipc_bench where no CUDA is usable: one line saying why and a non-zero status.
#[test]
fn gpu_ipc_bench_refuses_a_missing_gpu_in_one_line() {
    let Some(out) = run_raw("gpu_ipc_bench", &["--rounds".into(), "1".into()]) else {
        return;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        println!("skipped: a GPU is usable here, so the bench ran");
        return;
    }
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("gpu_ipc_bench: no CUDA"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// gpu_ipc_bench against the CUDA double (functional only: the double has no real timing):
/// every message checked by the receiver, the 4 MiB ones copied by IPC with one handle
/// opened, and the three figures printed.
#[cfg(feature = "cuda")]
#[test]
fn gpu_ipc_bench_runs_against_the_cuda_double() {
    let args: Vec<OsString> = ["--rounds", "1", "--pings", "20"]
        .iter()
        .map(OsString::from)
        .collect();
    let env = common::cuda_double::double_env();
    let Some(out) = run_raw_env("gpu_ipc_bench", &args, &env) else {
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}{err}");
    assert_eq!(text.matches("figure: ").count(), 3, "{text}");
    assert!(
        err.contains("by CUDA IPC (18 device to device), opened 1 handle(s), 0 refused"),
        "{err}"
    );
}
