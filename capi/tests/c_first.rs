//! The README's first C program (capi/tests/c/first.c, shown there as it is) builds against
//! /usr/include/rdma with the project's warnings as errors and runs on xfabric's
//! libfabric.so.1: two shm endpoints in one process, "hello" sent and received.

mod common;
#[path = "common/run.rs"]
mod run;

use std::process::Command;
use std::time::Duration;

#[test]
fn readme_c_program_sends_hello_over_shm() {
    let exe = run::compile("cc", "first", &[], true);
    let mut cmd = Command::new(&exe);
    cmd.env("LD_LIBRARY_PATH", common::so1_dir())
        .env_remove("FI_PROVIDER")
        .env_remove("RUST_LOG");
    let out = run::success(
        "first",
        &common::output_within(cmd, Duration::from_secs(60), "first"),
    );
    assert_eq!(out.trim(), "received \"hello\"", "{out}");
}
