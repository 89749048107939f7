//! `xfabric info` run as a real process: the layouts fi_info users expect, and clean failures.

use std::process::{Command, Output};

fn xfabric(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xfabric"))
        .args(args)
        .output()
        .expect("run the xfabric binary")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn short_layout_names_provider_and_endpoint_type() {
    let out = xfabric(&["info", "-p", "shm"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(text.contains("provider: shm"), "{text}");
    assert!(text.contains("    type: FI_EP_RDM"), "{text}");
    assert!(text.contains("    protocol: FI_PROTO_SHM"), "{text}");
}

#[test]
fn verbose_layout_uses_libfabric_names() {
    let out = xfabric(&["info", "-v", "-p", "shm"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    for want in [
        "FI_MSG",
        "FI_TAGGED",
        "FI_PROGRESS_MANUAL",
        "FI_ADDR_STR",
        "\n    fi_tx_attr:\n",
        "\n        type: FI_EP_RDM\n",
        "\n    nic: (nil)\n",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    assert!(text.starts_with("---\nfi_info:\n"), "{text}");
}

#[test]
fn no_match_fails_with_a_reason() {
    let out = xfabric(&["info", "-p", "nosuch"]);
    assert!(!out.status.success());
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("fi_getinfo") && err.contains("nosuch"),
        "{err}"
    );
}

#[test]
fn unknown_capability_fails_cleanly() {
    let out = xfabric(&["info", "-c", "FI_MSG|FI_BOGUS"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("FI_BOGUS"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn caps_and_ep_type_narrow_the_results() {
    let out = xfabric(&["info", "-c", "FI_MSG|FI_TAGGED", "-t", "FI_EP_RDM"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("provider: shm"));
    let out = xfabric(&["info", "-p", "shm", "-t", "FI_EP_MSG"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("FI_EP_MSG"), "{}", stderr(&out));
}

#[test]
fn list_and_help() {
    let out = xfabric(&["info", "-l"]);
    assert!(out.status.success());
    assert!(
        stdout(&out).contains("shm:\n    version: "),
        "{}",
        stdout(&out)
    );
    for args in [&["--help"][..], &["info", "--help"]] {
        let out = xfabric(args);
        assert!(out.status.success());
        assert!(
            stdout(&out).starts_with("Usage: xfabric"),
            "{}",
            stdout(&out)
        );
    }
    let out = xfabric(&["info", "--bogus"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("Usage: xfabric info"));
}

#[test]
fn hmem_report_names_every_interface() {
    let out = xfabric(&["info", "--hmem"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(text.starts_with("hmem:\n"), "{text}");
    assert!(
        text.contains("    FI_HMEM_SYSTEM: available, 1 device(s)"),
        "{text}"
    );
    // Each device interface says whether it is usable, and why not if it is not.
    for iface in [
        "FI_HMEM_CUDA: ",
        "FI_HMEM_ZE: ",
        "FI_HMEM_ROCR: unavailable: ",
    ] {
        assert!(text.contains(iface), "missing {iface:?} in:\n{text}");
    }
    let verbose = stdout(&xfabric(&["info", "-v", "-p", "shm"]));
    assert!(
        verbose.contains("\nhmem:\n    FI_HMEM_SYSTEM: "),
        "{verbose}"
    );
    let bad = xfabric(&["info", "--hmem=yes"]);
    assert!(!bad.status.success());
}
