//! The install step for C users: scripts/install.sh puts libfabric.so.1 (with its soname
//! link), xfabric's headers and libfabric.pc under a prefix; a C program built with
//! `pkg-config --cflags --libs libfabric` against it runs on xfabric's library.

mod common;
#[path = "common/run.rs"]
#[allow(dead_code)]
mod run;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(600);

/// Removes the prefix however the test ends.
struct Prefix(std::path::PathBuf);

impl Drop for Prefix {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn install_then_build_a_c_program_with_pkg_config() {
    if !common::have_toolchain() || !run::have("pkg-config") {
        eprintln!("skipped: needs cc, libfabric-dev's headers and pkg-config (scripts/setup.sh installs them)");
        return;
    }
    let target = common::target_dir();
    let profile = target.file_name().unwrap().to_string_lossy().into_owned();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let prefix = Prefix(target.join(format!("install-test-{}", std::process::id())));
    let p = &prefix.0;
    let mut cmd = Command::new(root.join("scripts/install.sh"));
    cmd.arg(p)
        .env(
            "PROFILE",
            if profile == "release" {
                "release"
            } else {
                "debug"
            },
        )
        .env("CARGO_TARGET_DIR", target.parent().unwrap());
    run::success(
        "scripts/install.sh",
        &common::output_within(cmd, LIMIT, "install"),
    );
    let lib = p.join("lib");
    assert_eq!(
        std::fs::read_link(lib.join("libfabric.so.1")).unwrap(),
        Path::new("libfabric.so.1.17.0")
    );
    assert!(p.join("include/xfabric/xfabric_trigger.cuh").exists());
    let pc = |args: &[&str]| {
        let mut c = Command::new("pkg-config");
        c.args(args).env("PKG_CONFIG_PATH", lib.join("pkgconfig"));
        run::success("pkg-config", &common::output_within(c, LIMIT, "pkg-config"))
            .trim()
            .to_string()
    };
    assert_eq!(pc(&["--modversion", "libfabric"]), "1.17.0");
    let flags = pc(&["--cflags", "--libs", "libfabric"]);
    assert!(flags.contains(&format!("-L{}", lib.display())), "{flags}");
    let exe = p.join("installed");
    let src = root.join("capi/tests/c/installed.c");
    let mut cc = Command::new("cc");
    cc.args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(flags.split_whitespace())
        .arg("-ldl");
    run::success("cc installed.c", &common::output_within(cc, LIMIT, "cc"));
    let mut prog = Command::new(&exe);
    prog.env("LD_LIBRARY_PATH", &lib).env_remove("FI_PROVIDER");
    let out = run::success(
        "installed",
        &common::output_within(prog, LIMIT, "installed"),
    );
    assert!(out.contains("provider shm"), "{out}");
    let want = format!("library {}", lib.join("libfabric.so.1").display());
    assert!(out.contains(&want), "not xfabric's library: {out}");
}
