//! Runs the built examples that check themselves: `deferred_allreduce` sums a vector across 4
//! processes using deferred work only and asserts the exact sum on every rank. scripts/test.sh
//! (what CI runs) builds the examples before the tests.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn example(name: &str) -> Option<PathBuf> {
    // target/<profile>/deps/<this test> -> target/<profile>/examples/<name>
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("examples").join(name);
    p.exists().then_some(p)
}

#[test]
fn deferred_allreduce_sums_exactly_across_four_processes() {
    let Some(exe) = example("deferred_allreduce") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "examples are not built: run the suite as scripts/test.sh does (cargo build --examples first)"
        );
        eprintln!("skipped: the deferred_allreduce example is not built (cargo build --examples)");
        return;
    };
    let mut child = Command::new(exe)
        .arg("4096")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start example");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("deferred_allreduce did not finish in time");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let out = child.wait_with_output().expect("output");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(status.success(), "example failed: {text}");
    assert!(text.contains("exact sum on every rank"), "{text}");
}
