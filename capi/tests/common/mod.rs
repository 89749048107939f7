//! Shared by capi's tests: the libfabric.so under test, built fresh.

// Each test binary uses a part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Once;

/// target/<profile>, where cargo leaves libfabric.so.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>")
        .to_path_buf()
}

/// The cdylib, rebuilt first: `cargo test` links integration tests with the rlib and leaves a
/// stale libfabric.so from an earlier build in place.
pub fn cdylib() -> PathBuf {
    static BUILD: Once = Once::new();
    let dir = target_dir();
    BUILD.call_once(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-j2", "-p", "xfabric-capi", "--lib"]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let out = cmd.output().expect("run cargo build");
        assert!(
            out.status.success(),
            "building libfabric.so: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    dir.join("libfabric.so")
}

/// A directory holding only `libfabric.so.1`, a link to the fresh cdylib: what
/// `LD_LIBRARY_PATH` names so that Debian's programs, linked against libfabric.so.1, load
/// xfabric. Its own directory, so no other library there is picked up instead.
pub fn so1_dir() -> PathBuf {
    let lib = cdylib();
    let dir = target_dir().join("capi-so1");
    std::fs::create_dir_all(&dir).expect("mkdir capi-so1");
    let link = dir.join("libfabric.so.1");
    if std::fs::read_link(&link).ok().as_deref() != Some(lib.as_path()) {
        let _ = std::fs::remove_file(&link);
        // Another test binary may have made it meanwhile: an existing link to lib is fine.
        if let Err(e) = std::os::unix::fs::symlink(&lib, &link) {
            assert_eq!(std::fs::read_link(&link).ok(), Some(lib.clone()), "{e}");
        }
    }
    dir
}

/// Runs `cmd` with its output collected, in a process group of its own, killed after `limit`:
/// returns the output, or panics naming `what` when it had to be killed. Whatever it forked is
/// in its group and goes with it (also when it exits leaving a child behind).
pub fn output_within(mut cmd: Command, limit: std::time::Duration, what: &str) -> Output {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    let group = child.id() as i32;
    // SAFETY: kill(2) on the process group this function created.
    let kill_group = move || unsafe {
        libc::kill(-group, libc::SIGKILL);
    };
    // Read both pipes in threads so a child filling one never blocks; the deadline is checked
    // while waiting.
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if std::time::Instant::now() >= deadline {
            kill_group();
            let _ = child.wait();
            let (o, e) = (
                t_out.join().unwrap_or_default(),
                t_err.join().unwrap_or_default(),
            );
            panic!(
                "{what} did not finish within {limit:?}; it printed:\n{}\n{}",
                String::from_utf8_lossy(&o),
                String::from_utf8_lossy(&e)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    kill_group();
    Output {
        status,
        stdout: t_out.join().expect("stdout reader"),
        stderr: t_err.join().expect("stderr reader"),
    }
}

/// Whether cc and libfabric-dev are there; says why not (and fails under CI).
pub fn have_toolchain() -> bool {
    let ok = Path::new("/usr/include/rdma/fabric.h").exists()
        && Command::new("cc").arg("--version").output().is_ok();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI needs cc and libfabric-dev"
        );
        eprintln!("skipped: cc or /usr/include/rdma/fabric.h missing");
    }
    ok
}

/// Compiles `src` (linked with this libfabric.so when `link`) and returns its stdout.
pub fn run_c(name: &str, src: &str, link: bool) -> String {
    let dir = target_dir().join("capi-c-tests");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let c = dir.join(format!("{name}.c"));
    let exe = dir.join(name);
    std::fs::write(&c, src).expect("write C source");
    let lib = target_dir();
    let mut cc = Command::new("cc");
    cc.arg("-Wall").arg("-Werror").arg("-o").arg(&exe).arg(&c);
    if link {
        // The soname is libfabric.so.1 but the build leaves libfabric.so: link the file itself.
        cc.arg(cdylib());
    }
    let out = cc.output().expect("run cc");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if link {
        // The program records libfabric.so.1 as needed: make that name resolve to this build.
        let so1 = lib.join("libfabric.so.1");
        let _ = std::fs::remove_file(&so1);
        std::os::unix::fs::symlink("libfabric.so", &so1).expect("symlink libfabric.so.1");
    }
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .expect("run C program");
    assert!(
        out.status.success(),
        "{name} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
