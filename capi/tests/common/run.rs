//! C programs of capi/tests/c on the libfabric.so under test: compiled against it, run with
//! its libfabric.so.1 first on the library path (`common::so1_dir`), bounded
//! (`common::output_within`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::common::{cdylib, target_dir};

/// True if `tool` is on PATH.
#[allow(dead_code)] // not every test crate including this module asks
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Compiles `capi/tests/c/<name>.c` with `compiler` and `extra` arguments into the target
/// directory, linked with the libfabric.so under test when `link`; panics with the
/// compiler's message on failure.
pub fn compile(compiler: &str, name: &str, extra: &[&str], link: bool) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let exe = target_dir().join(format!("capi-{name}"));
    // Written under a name of its own, then renamed: two tests compiling the same program at
    // once must not run a file the other is rewriting (mpirun once failed to launch it so).
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = target_dir().join(format!("capi-{name}.{}.{n}.tmp", std::process::id()));
    let mut cmd = Command::new(compiler);
    cmd.args(["-O2", "-Wall", "-Werror", "-I"])
        .arg(&dir)
        .arg("-o")
        .arg(&tmp)
        .arg(dir.join(format!("{name}.c")));
    if link {
        // The soname is libfabric.so.1 but the build leaves libfabric.so: link the file itself.
        cmd.arg(cdylib());
    }
    let out = cmd
        .args(extra)
        .output()
        .unwrap_or_else(|e| panic!("run {compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} {name}.c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, &exe).unwrap_or_else(|e| panic!("rename {}: {e}", tmp.display()));
    exe
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
