//! Open MPI from Debian over xfabric's libfabric.so.1: an MPI ping-pong with checked contents
//! on 2 ranks and an MPI_Allreduce with checked results on 2 and 4 ranks, through Open MPI's
//! `btl ofi` on the shm provider, as the issue's users run it:
//!
//! ```text
//! mpirun --allow-run-as-root -np N --mca pml ob1 --mca btl self,ofi --mca btl_ofi_mode 2 \
//!        --mca btl_ofi_provider_include shm -x FI_PROVIDER=shm -x LD_LIBRARY_PATH ...
//! ```
//!
//! `scripts/setup.sh` installs Open MPI; where it is missing the tests say so and pass.

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// What one mpirun may take before it is killed: far above the ~2 s these take.
const LIMIT: Duration = Duration::from_secs(120);

/// A directory holding `libfabric.so.1` -> the cdylib under test, for LD_LIBRARY_PATH.
fn lib_dir() -> PathBuf {
    let lib = common::cdylib();
    let dir = common::target_dir().join("mpi-libdir");
    std::fs::create_dir_all(&dir).expect("create the library directory");
    let link = dir.join("libfabric.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&lib, &link).expect("link libfabric.so.1");
    dir
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Compiles `capi/tests/c/<name>.c` with mpicc into the target directory.
fn build(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let exe = common::target_dir().join(format!("capi-{name}"));
    let out = Command::new("mpicc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run mpicc");
    assert!(
        out.status.success(),
        "mpicc {name}.c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs `cmd` in its own process group; past [`LIMIT`] the whole group is killed and the test
/// fails with what it printed.
fn bounded(mut cmd: Command) -> Output {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let child = cmd.spawn().expect("spawn mpirun");
    let pgid = child.id() as i32;
    let deadline = Instant::now() + LIMIT;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(out) => return out.expect("wait for mpirun"),
            Err(_) if Instant::now() > deadline => {
                // SAFETY: kill(2) on our own child's process group.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                let out = rx.recv().expect("mpirun's output").expect("wait");
                panic!(
                    "mpirun did not finish within {LIMIT:?}; it printed:\n{}\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Err(_) => {}
        }
    }
}

/// `mpirun -np ranks exe args` over xfabric's shm, as the module says; asserts success and
/// returns stdout.
fn mpirun(ranks: u32, exe: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        &ranks.to_string(),
    ])
    .args(["--mca", "pml", "ob1", "--mca", "btl", "self,ofi"])
    .args([
        "--mca",
        "btl_ofi_mode",
        "2",
        "--mca",
        "btl_ofi_provider_include",
        "shm",
    ])
    .args(["-x", "FI_PROVIDER=shm", "-x", "LD_LIBRARY_PATH"])
    .env("LD_LIBRARY_PATH", lib_dir())
    .env("FI_PROVIDER", "shm")
    .arg(exe)
    .args(args);
    let out = bounded(cmd);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "mpirun -np {ranks} {} failed ({}):\n{stdout}\n{}",
        exe.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// True where Open MPI is there; otherwise says why the test does nothing.
fn open_mpi() -> bool {
    if have("mpicc") && have("mpirun") {
        return true;
    }
    eprintln!("skipped: Open MPI (openmpi-bin, libopenmpi-dev) is not installed; scripts/setup.sh installs it");
    false
}

#[test]
fn mpi_pingpong_two_ranks() {
    if !open_mpi() {
        return;
    }
    let exe = build("mpi_pingpong");
    let out = mpirun(2, &exe, &["20"]);
    assert!(out.contains("pingpong ok"), "{out}");
    // Every size reported, up to 4 MiB.
    assert!(out.lines().any(|l| l.starts_with("4194304 ")), "{out}");
}

#[test]
fn mpi_allreduce_two_and_four_ranks() {
    if !open_mpi() {
        return;
    }
    let exe = build("mpi_allreduce");
    for ranks in [2, 4] {
        let out = mpirun(ranks, &exe, &[]);
        assert!(out.contains(&format!("allreduce ok {ranks}")), "{out}");
    }
}
