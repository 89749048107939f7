//! Running C programs on the libfabric.so under test: its directory for LD_LIBRARY_PATH, C
//! builds against it, and bounded runs killed by process group.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{cdylib, target_dir};

/// A directory holding `libfabric.so.1` and `libfabric.so` -> the cdylib under test: for
/// LD_LIBRARY_PATH, and for `-L` when linking C programs against it.
pub fn lib_dir() -> PathBuf {
    let lib = cdylib();
    let dir = target_dir().join("capi-libdir");
    std::fs::create_dir_all(&dir).expect("create the library directory");
    for name in ["libfabric.so.1", "libfabric.so"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&lib, &link).expect("link the library");
    }
    dir
}

/// True if `tool` is on PATH.
#[allow(dead_code)] // not every test crate including this module asks
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `capi/tests/c/<name>.c`.
pub fn c_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"))
}

/// Compiles `capi/tests/c/<name>.c` with `compiler` and `extra` arguments into the target
/// directory; panics with the compiler's message on failure.
pub fn compile(compiler: &str, name: &str, extra: &[&str]) -> PathBuf {
    let exe = target_dir().join(format!("capi-{name}"));
    let out = Command::new(compiler)
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(c_source(name))
        .args(extra)
        .output()
        .unwrap_or_else(|e| panic!("run {compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} {name}.c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs `cmd` in its own process group; past `limit` the whole group is killed and the test
/// fails with what it printed.
pub fn bounded(mut cmd: Command, limit: Duration) -> Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let child = cmd.spawn().expect("spawn");
    let pgid = child.id() as i32;
    let deadline = Instant::now() + limit;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(out) => {
                // Whatever the program left behind in its group (a forked child) goes too.
                // SAFETY: kill(2) on our own child's process group.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                return out.expect("wait");
            }
            Err(_) if Instant::now() > deadline => {
                // SAFETY: as above.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                let out = rx.recv().expect("the output").expect("wait");
                panic!(
                    "{cmd:?} did not finish within {limit:?}; it printed:\n{}\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Err(_) => {}
        }
    }
}

/// Asserts that `out` is a success, showing what was printed otherwise; returns stdout.
pub fn success(what: &str, out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
