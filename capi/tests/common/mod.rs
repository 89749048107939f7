//! Shared by capi's tests: the libfabric.so under test, built fresh.

use std::path::PathBuf;
use std::process::Command;
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
