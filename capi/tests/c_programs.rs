//! C programs of our own, compiled against /usr/include/rdma and linked with xfabric's
//! libfabric.so, exercising the headline features through the C API over shm: a chain of
//! counter-triggered sends across two processes, deferred work (counter add, an RMA write,
//! cancel, flush), an XPU-triggered send rung by a CPU thread with the variables from
//! fi_getopt(FI_OPT_XPU_TRIGGER), the device API (fi_xpu(3)) posted from a CPU thread with
//! xfabric's headers (kernels/cuda/xfabric/) and through its handles after their objects
//! closed, and device-memory registration refused with -FI_ENOSYS where no device exists, and calls a careless caller makes (a threshold passed as cond's value, lengths past any buffer, a NULL region) answered with error codes. Each program checks what it received and exits non-zero otherwise. Also: scripts/bench.sh's C ABI probe (scripts/probes/capi_pingpong.c) builds and runs.

mod common;
#[path = "common/run.rs"]
mod run;

use std::process::Command;
use std::time::Duration;

/// Far above what each takes (well under a second).
const LIMIT: Duration = Duration::from_secs(60);

fn run_c(name: &str, extra: &[&str]) -> String {
    run_c_with(name, extra, &[])
}

fn run_c_with(name: &str, extra: &[&str], env: &[(&str, &str)]) -> String {
    let exe = run::compile("cc", name, extra, true);
    let mut cmd = Command::new(&exe);
    cmd.env("LD_LIBRARY_PATH", common::so1_dir())
        .env("FI_PROVIDER", "shm")
        .env_remove("RUST_LOG")
        .envs(env.iter().copied());
    run::success(name, &common::output_within(cmd, LIMIT, name))
}

#[test]
fn c_log_enabled_follows_fi_log_level() {
    // FI_LOG_LEVEL=info: warn and info on, debug and trace off (libfabric's order: warn <
    // info < debug < trace in verbosity).
    let out = run_c_with("log_enabled", &[], &[("FI_LOG_LEVEL", "info")]);
    assert_eq!(out.trim(), "warn 1 trace 0 info 1 debug 0", "{out}");
    let out = run_c_with("log_enabled", &[], &[("FI_LOG_LEVEL", "trace")]);
    assert_eq!(out.trim(), "warn 1 trace 1 info 1 debug 1", "{out}");
    // Off by default.
    let out = run_c_with("log_enabled", &[], &[]);
    assert_eq!(out.trim(), "warn 0 trace 0 info 0 debug 0", "{out}");
}

#[test]
fn c_triggered_send_chain_across_processes() {
    let out = run_c("trig_chain", &[]);
    assert!(out.contains("receiver: 16 messages in order"), "{out}");
    assert!(out.contains("sender: 16 sends"), "{out}");
}

#[test]
fn c_deferred_work_counter_ops_and_rma_write() {
    let out = run_c("deferred", &[]);
    assert!(out.contains("target: the deferred write landed"), "{out}");
    assert!(
        out.contains("initiator: counter add, RMA write (its segments misaligned), cancel and flush as queued; misaligned work refused"),
        "{out}"
    );
}

#[test]
fn c_xpu_triggered_send_rung_by_a_cpu_thread() {
    let out = run_c("xpu_send", &["-lpthread"]);
    assert!(
        out.contains("receiver: the XPU-triggered message arrived whole"),
        "{out}"
    );
    assert!(out.contains("rung by a CPU thread"), "{out}");
}

#[test]
fn c_xpu_device_api_from_a_cpu_thread_with_the_installed_headers() {
    let headers = concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/cuda");
    let out = run_c("xpu_device", &["-lpthread", "-I", headers]);
    assert!(
        out.contains("parent: full ring, hostile descriptors"),
        "{out}"
    );
    assert!(out.contains("its XPU waited on the counter"), "{out}");
}

#[test]
fn c_cq_readerr_gives_error_data_with_and_without_room() {
    let headers = concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/cuda");
    let out = run_c("cq_err_data", &["-I", headers, "-D_GNU_SOURCE"]);
    assert!(out.contains("error data given back both ways"), "{out}");
}

#[test]
fn c_cq_readerr_keeps_each_api_versions_layout_and_the_callers_buffer() {
    let out = run_c("cq_readerr_versions", &[]);
    assert!(out.contains("cq_readerr_versions: ok"), "{out}");
}

#[test]
fn c_mr_regattr_reads_nothing_past_an_api_1_9_attr() {
    let out = run_c("mr_attr_before_1_10", &[]);
    assert!(out.contains("mr_attr_before_1_10: ok"), "{out}");
}

#[test]
fn c_a_close_ends_a_wait_in_another_thread() {
    let out = run_c("close_while_waiting", &["-lpthread"]);
    assert!(out.contains("close_while_waiting: ok"), "{out}");
}

#[test]
fn c_careless_calls_get_error_codes_not_crashes() {
    let out = run_c("careless_calls", &[]);
    assert!(
        out.contains("careless calls answered without a crash"),
        "{out}"
    );
}

#[test]
fn c_a_sigbus_sent_by_a_process_is_not_taken_for_a_segment_fault() {
    let out = run_c("sigbus_sent", &[]);
    assert!(out.contains("a SIGBUS sent ends the process"), "{out}");
}

#[test]
fn c_xpu_handles_used_after_their_objects_closed_reach_kept_memory() {
    let headers = concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/cuda");
    let out = run_c("xpu_late", &["-I", headers]);
    assert!(out.contains("late calls after close"), "{out}");
}

#[test]
fn c_a_cpu_threads_counter_add_is_applied_with_nobody_driving_progress() {
    let headers = concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/cuda");
    let out = run_c("xpu_notify", &["-lpthread", "-I", headers]);
    assert!(
        out.contains("a CPU thread's counter add applied with nobody driving progress"),
        "{out}"
    );
}

#[test]
fn c_a_cpu_xpu_reads_a_burst_larger_than_its_cq_ring() {
    let headers = concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/cuda");
    let out = run_c("xpu_cq_burst", &["-I", headers]);
    assert!(
        out.contains("the XPU read 8 completions through a ring of 2"),
        "{out}"
    );
}

#[test]
fn c_device_memory_registration_refused_without_a_device() {
    if xfabric_hmem_present() {
        eprintln!("skipped: a GPU is present, device registration would succeed");
        return;
    }
    let out = run_c("hmem_refused", &[]);
    assert!(out.contains("hmem_refused: ok"), "{out}");
}

/// A CUDA driver with a device, or a Level Zero loader: then the refusal is not expected.
fn xfabric_hmem_present() -> bool {
    std::path::Path::new("/dev/nvidia0").exists()
        || std::path::Path::new("/dev/dri/renderD128").exists()
}

#[test]
fn c_atomics_on_a_peers_registered_u64s() {
    let out = run_c("atomic", &[]);
    assert!(out.contains("target: every atomic landed"), "{out}");
    assert!(out.contains("fenced read back"), "{out}");
}

#[test]
fn c_av_insert_counts_bad_addresses_and_reports_through_the_eq() {
    for prov in ["tcp", "shm"] {
        let out = run_c_with("av_insert", &[], &[("FI_PROVIDER", prov)]);
        assert!(out.contains("av_insert: ok"), "{prov}: {out}");
    }
    // tcp's names as FI_ADDR_STR strings (shm's are strings either way): inserted as strings,
    // not read as sockaddrs.
    let out = run_c_with(
        "av_insert",
        &[],
        &[("FI_PROVIDER", "tcp"), ("XF_TEST_ADDR_STR", "1")],
    );
    assert!(out.contains("av_insert: ok"), "tcp, FI_ADDR_STR: {out}");
}

#[test]
fn c_ep_alias_has_its_own_default_flags() {
    for prov in ["shm", "tcp"] {
        let out = run_c_with("ep_alias", &[], &[("FI_PROVIDER", prov)]);
        assert!(out.contains("ep_alias: ok"), "{prov}: {out}");
    }
}

#[test]
fn c_wait_set_fd_readable_on_a_members_change() {
    let out = run_c("wait_set_fd", &[]);
    assert!(out.contains("wait_set_fd: ok"), "{out}");
}

#[test]
fn c_wait_objects_and_event_queues_answer_careless_calls_as_libfabric() {
    let out = run_c("wait_careless", &[]);
    assert!(out.contains("wait_careless: ok"), "{out}");
}

#[test]
fn c_poll_set_reports_a_queue_and_a_counter_by_context() {
    for prov in ["shm", "tcp"] {
        let out = run_c_with("poll_set", &[], &[("FI_PROVIDER", prov)]);
        assert!(out.contains("poll_set: ok"), "{prov}: {out}");
    }
}

#[test]
fn c_a_hinted_source_address_in_a_sockaddr_storage_is_kept() {
    let out = run_c_with("src_hint", &[], &[("FI_PROVIDER", "tcp")]);
    assert!(out.contains("src_hint: ok"), "{out}");
}

/// scripts/probes/capi_pingpong.c, the Rust pingpong's loop in C that scripts/bench.sh times
/// on this library to tell the ABI's cost apart from fi_pingpong's: it still builds against
/// 1.17's headers, and runs over shm and tcp (one forked peer, names through pipes).
#[test]
fn the_c_abi_probe_of_bench_sh_runs_over_shm_and_tcp() {
    let src =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/probes/capi_pingpong.c");
    let exe = common::target_dir().join("capi-probe-pingpong");
    let out = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg(common::cdylib())
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (provider, size, iters) in [
        ("shm", "8", "200"),
        ("shm", "65536", "20"),
        ("tcp", "8", "50"),
    ] {
        let mut cmd = Command::new(&exe);
        cmd.args([provider, size, iters])
            .env("LD_LIBRARY_PATH", common::so1_dir())
            .env_remove("FI_PROVIDER")
            .env_remove("RUST_LOG");
        let what = format!("capi_pingpong {provider} {size} {iters}");
        let out = run::success(&what, &common::output_within(cmd, LIMIT, &what));
        assert!(out.starts_with("usec/xfer "), "{what}: {out}");
    }
}
