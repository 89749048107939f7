//! Open MPI from Debian over xfabric's libfabric.so.1: an MPI ping-pong with checked contents
//! on 2 ranks and an MPI_Allreduce with checked results on 2 and 4 ranks, through Open MPI's
//! `btl ofi` on the shm provider, as the issue's users run it (below); the same two over the
//! tagged path (`mtl ofi`) on tcp; MPI one-sided communication (put, get, accumulate,
//! fetch-and-op, compare-and-swap) through `osc rdma` on `btl ofi`, over shm and tcp; and both
//! between two network namespaces (two "hosts", tests/common/netns.rs), mpirun starting the
//! far rank through `ip netns exec` as it would through ssh:
//!
//! ```text
//! mpirun --allow-run-as-root -np N --mca pml ob1 --mca btl self,ofi --mca btl_ofi_mode 2 \
//!        --mca btl_ofi_provider_include shm -x FI_PROVIDER=shm -x LD_LIBRARY_PATH ...
//! ```
//!
//! `scripts/setup.sh` installs Open MPI; where it is missing the tests say so and pass.

mod common;
#[path = "../../tests/common/netns.rs"]
#[allow(dead_code)]
mod netns;
#[path = "common/run.rs"]
mod run;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// What one mpirun may take before it is killed: far above the ~2 s these take.
const LIMIT: Duration = Duration::from_secs(120);

/// Compiles `capi/tests/c/<name>.c` with mpicc.
fn build(name: &str) -> PathBuf {
    run::compile("mpicc", name, &[], false)
}

/// Open MPI's MCA choices for its `btl ofi` path over xfabric's `provider`.
fn btl_ofi(provider: &str) -> Vec<&str> {
    vec![
        "--mca",
        "pml",
        "ob1",
        "--mca",
        "btl",
        "self,ofi",
        "--mca",
        "btl_ofi_mode",
        "2",
        "--mca",
        "btl_ofi_provider_include",
        provider,
    ]
}

/// `mpirun -np ranks exe args` over xfabric's shm through Open MPI's `btl ofi`, as the module
/// says; asserts success and returns stdout.
fn mpirun(ranks: u32, exe: &Path, args: &[&str]) -> String {
    mpirun_on("shm", &btl_ofi("shm"), ranks, exe, args)
}

/// `mpirun -np ranks exe args` through Open MPI's tagged path (`pml cm`, `mtl ofi`) over
/// xfabric's tcp provider, as its users run it across nodes; asserts success and returns
/// stdout.
fn mpirun_mtl_tcp(ranks: u32, exe: &Path, args: &[&str]) -> String {
    mpirun_on("tcp", &mtl_ofi("tcp"), ranks, exe, args)
}

/// Open MPI's MCA choices for its tagged path (`pml cm`, `mtl ofi`) over xfabric's `provider`.
fn mtl_ofi(provider: &str) -> [&str; 9] {
    [
        "--mca",
        "pml",
        "cm",
        "--mca",
        "mtl",
        "ofi",
        "--mca",
        "mtl_ofi_provider_include",
        provider,
    ]
}

/// `mpirun` with Open MPI's `path` (its MCA choices) over xfabric's `provider`.
fn mpirun_on(provider: &str, path: &[&str], ranks: u32, exe: &Path, args: &[&str]) -> String {
    mpirun_env(provider, path, ranks, exe, args, &[])
}

/// As `mpirun_on`, with `env` set for every rank (`-x NAME`).
fn mpirun_env(
    provider: &str,
    path: &[&str],
    ranks: u32,
    exe: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> String {
    let mut cmd = Command::new("mpirun");
    for (k, v) in env {
        cmd.args(["-x", k]).env(k, v);
    }
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        &ranks.to_string(),
    ])
    .args(path)
    .args([
        "-x",
        &format!("FI_PROVIDER={provider}"),
        "-x",
        "LD_LIBRARY_PATH",
    ])
    .env("LD_LIBRARY_PATH", common::so1_dir())
    .env("FI_PROVIDER", provider)
    .arg(exe)
    .args(args);
    let what = format!("mpirun ({provider}) -np {ranks} {}", exe.display());
    run::success(&what, &common::output_within(cmd, LIMIT, &what))
}

/// True where Open MPI is there; otherwise says why the test does nothing.
fn open_mpi() -> bool {
    if run::have("mpicc") && run::have("mpirun") {
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

#[test]
fn mpi_tagged_path_over_tcp_pingpong_and_allreduce() {
    if !open_mpi() {
        return;
    }
    let exe = build("mpi_pingpong");
    let out = mpirun_mtl_tcp(2, &exe, &["20"]);
    assert!(out.contains("pingpong ok"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("4194304 ")), "{out}");
    let exe = build("mpi_allreduce");
    for ranks in [2, 4] {
        let out = mpirun_mtl_tcp(ranks, &exe, &[]);
        assert!(out.contains(&format!("allreduce ok {ranks}")), "{out}");
    }
}

#[test]
fn mpi_tagged_path_over_tcp_with_an_auth_key_on_every_rank() {
    if !open_mpi() {
        return;
    }
    // Every rank proves the key to every peer (HMAC challenge in tcp's handshake).
    let key = [("XFABRIC_AUTH_KEY", "mpi-test-key-1")];
    let exe = build("mpi_pingpong");
    let out = mpirun_env("tcp", &mtl_ofi("tcp"), 2, &exe, &["20"], &key);
    assert!(out.contains("pingpong ok"), "{out}");
    let exe = build("mpi_allreduce");
    let out = mpirun_env("tcp", &mtl_ofi("tcp"), 4, &exe, &[], &key);
    assert!(out.contains("allreduce ok 4"), "{out}");
}

#[test]
fn mpi_one_sided_through_osc_rdma_over_shm_and_tcp() {
    if !open_mpi() {
        return;
    }
    let exe = build("mpi_rma");
    for provider in ["shm", "tcp"] {
        // Open MPI's one-sided component on btl ofi: MPI_Put/Get become fi_write/fi_read,
        // MPI_Accumulate, MPI_Fetch_and_op and MPI_Compare_and_swap libfabric atomics.
        let mut path = btl_ofi(provider);
        path.extend(["--mca", "osc", "rdma"]);
        for ranks in [2, 4] {
            let out = mpirun_on(provider, &path, ranks, &exe, &[]);
            assert!(out.contains(&format!("rma ok {ranks}")), "{out}");
        }
    }
}

/// `ssh` for mpirun between namespaces: `agent HOST COMMAND...` runs COMMAND in network
/// namespace HOST (mpirun's `plm_rsh_agent`), so mpirun in one namespace starts its daemon
/// and ranks in the other as it would on another machine. Each host's daemon keeps its
/// session files under a directory of its own: the "hosts" share one hostname and one /tmp,
/// and two daemons of one job creating the same session directory at once failed the launch
/// ("mkdir ... File exists") under load.
fn netns_agent() -> PathBuf {
    let dir = common::target_dir().join("mpi-netns");
    std::fs::create_dir_all(&dir).expect("mkdir mpi-netns");
    let agent = dir.join("agent.sh");
    let script = format!(
        "#!/bin/sh\nhost=$1; shift\nbase={}/tmp-$host-$$\nmkdir -p \"$base\"\n\
         ip netns exec \"$host\" env OMPI_MCA_orte_tmpdir_base=\"$base\" sh -c \"$*\"\n\
         rc=$?\nrm -rf \"$base\"\nexit $rc\n",
        dir.display()
    );
    let script = script.as_str();
    if std::fs::read_to_string(&agent).ok().as_deref() != Some(script) {
        std::fs::write(&agent, script).expect("write the agent");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755))
            .expect("chmod the agent");
    }
    agent
}

#[test]
fn mpi_between_two_hosts_over_tcp() {
    if !open_mpi() {
        return;
    }
    let Some(h) = netns::hosts_or_skip(4) else {
        return;
    };
    let agent = netns_agent();
    /// Removed when the test ends, passed or failed.
    struct Hostfile(PathBuf);
    impl Drop for Hostfile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let guard = Hostfile(agent.with_file_name(format!("hosts-{}", std::process::id())));
    let hostfile = &guard.0;
    std::fs::write(hostfile, format!("{} slots=1\n{} slots=1\n", h.a, h.b)).expect("hostfile");
    let run = |exe: &Path, path: &[&str]| {
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &h.a,
            "mpirun",
            "--allow-run-as-root",
            "-np",
            "2",
        ])
        .args(["--hostfile", &hostfile.display().to_string()])
        .args(["--mca", "plm_rsh_agent", &agent.display().to_string()])
        .args(path)
        .args(["-x", "FI_PROVIDER=tcp", "-x", "LD_LIBRARY_PATH"])
        .env("LD_LIBRARY_PATH", common::so1_dir())
        .env("FI_PROVIDER", "tcp")
        .arg(exe);
        let what = format!("mpirun between namespaces {}", exe.display());
        run::success(&what, &common::output_within(cmd, LIMIT, &what))
    };
    // The tagged path (pml cm, mtl ofi): one rank per host.
    let out = run(&build("mpi_pingpong"), &mtl_ofi("tcp"));
    assert!(out.contains("pingpong ok"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("4194304 ")), "{out}");
    // One-sided, through osc rdma on btl ofi.
    let mut osc = btl_ofi("tcp");
    osc.extend(["--mca", "osc", "rdma"]);
    let out = run(&build("mpi_rma"), &osc);
    assert!(out.contains("rma ok 2"), "{out}");
}
