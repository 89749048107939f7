//! `xfabric info` run as a real process: the layouts fi_info users expect, fi_info's flags,
//! and clean failures (one line on stderr, non-zero status, never a panic).

mod common;

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::bounded;

/// Runs the binary with `args` and `env` set, bounded in time.
fn xfabric_os(args: &[OsString], env: &[(&str, &OsStr)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xfabric"));
    cmd.args(args)
        .env_remove("FI_PROVIDER")
        .env_remove("FI_LOG_LEVEL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("run the xfabric binary");
    let pid = child.id();
    bounded(pid, Duration::from_secs(60), "xfabric", || {
        child.wait_with_output()
    })
    .expect("xfabric output")
}

fn xfabric(args: &[&str]) -> Output {
    xfabric_os(&args.iter().map(OsString::from).collect::<Vec<_>>(), &[])
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
    assert_one_line_failure(&out, "--bogus");
}

/// A failure is exit status 1 and one line on stderr that names the problem; no panic.
fn assert_one_line_failure(out: &Output, names: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(names), "{names:?} not in {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(stdout(out).is_empty(), "{}", stdout(out));
}

#[test]
fn bad_command_lines_fail_in_one_line() {
    let not_utf8 = OsStr::from_bytes(b"\xff\xfe").to_os_string();
    for args in [
        vec![not_utf8.clone()],
        vec!["info".into(), not_utf8.clone()],
    ] {
        let out = xfabric_os(&args, &[]);
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    }
    let out = xfabric_os(&["info".into(), "-p".into(), not_utf8], &[]);
    assert_one_line_failure(&out, "UTF-8");
    assert_one_line_failure(&xfabric(&["bogus"]), "bogus");
    assert_one_line_failure(&xfabric(&[]), "command");
    assert_one_line_failure(&xfabric(&["info", "-5"]), "-5");
    assert_one_line_failure(&xfabric(&["info", "-x"]), "-x");
    assert_one_line_failure(&xfabric(&["info", "-t", "FI_EP_BOGUS"]), "FI_EP_BOGUS");
    assert_one_line_failure(&xfabric(&["info", "-a", "17"]), "17");
    assert_one_line_failure(&xfabric(&["info", "-m", "FI_NOTAMODE"]), "FI_NOTAMODE");
    assert_one_line_failure(&xfabric(&["info", "-p", "nosuch"]), "nosuch");
    // A setting that is not UTF-8 is a bad value like any other: a warning naming it, and
    // the default (every provider) applies.
    let bad_env = OsStr::from_bytes(b"sh\xffm");
    let out = xfabric_os(
        &["info".into(), "-p".into(), "shm".into()],
        &[("FI_PROVIDER", bad_env)],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("FI_PROVIDER"), "{}", stderr(&out));
    assert!(stdout(&out).contains("shm"), "{}", stdout(&out));
}

#[test]
fn version_prints_as_fi_info_does() {
    for args in [&["--version"][..], &["info", "--version"]] {
        let out = xfabric(args);
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("xfabric: "), "{text}");
        assert_eq!(lines[2], "libfabric api: 1.17", "{text}");
    }
}

/// The providers each entry of a listing names.
fn providers_in(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            l.strip_prefix("provider: ")
                .or_else(|| l.strip_prefix("        prov_name: "))
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn list_names_only_providers() {
    let out = xfabric(&["info", "-l"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    for (i, line) in text.lines().enumerate() {
        if i % 2 == 0 {
            assert!(line.ends_with(':') && !line.starts_with(' '), "{text}");
        } else {
            assert!(line.starts_with("    version: "), "{text}");
        }
    }
    assert!(text.contains("shm:\n"), "{text}");
}

#[test]
fn fi_provider_is_honoured() {
    let shm = OsStr::new("shm");
    let out = xfabric_os(&["info".into()], &[("FI_PROVIDER", shm)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let names = providers_in(&stdout(&out));
    assert!(
        !names.is_empty() && names.iter().all(|n| n == "shm"),
        "{names:?}"
    );
    // Excluding shm leaves tcp; excluding both leaves nothing, which is a failure.
    let out = xfabric_os(&["info".into()], &[("FI_PROVIDER", OsStr::new("^shm"))]);
    assert!(out.status.success(), "{}", stderr(&out));
    let names = providers_in(&stdout(&out));
    assert!(
        !names.is_empty() && names.iter().all(|n| n == "tcp"),
        "{names:?}"
    );
    let out = xfabric_os(&["info".into()], &[("FI_PROVIDER", OsStr::new("^shm,tcp"))]);
    assert_one_line_failure(&out, "FI_PROVIDER");
}

#[test]
fn filters_narrow_to_what_they_ask() {
    // -c: every entry offers every asked capability; one nobody offers matches nothing.
    let out = xfabric(&["info", "-v", "-c", "FI_MSG|FI_TAGGED"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    let caps: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("    caps: "))
        .collect();
    assert!(!caps.is_empty(), "{text}");
    for c in caps {
        assert!(c.contains("FI_MSG") && c.contains("FI_TAGGED"), "{c}");
    }
    assert_one_line_failure(&xfabric(&["info", "-c", "FI_COLLECTIVE"]), "FI_COLLECTIVE");
    // -a, -d, -f, -m name what the entries have; other values match nothing.
    for (flag, good, bad) in [
        ("-a", "FI_ADDR_STR", "FI_SOCKADDR_IN"),
        ("-d", "shm", "nodomain"),
        ("-f", "shm", "nofabric"),
    ] {
        let out = xfabric(&["info", "-p", "shm", flag, good]);
        assert!(out.status.success(), "{flag} {good}: {}", stderr(&out));
        assert_eq!(providers_in(&stdout(&out)), ["shm"], "{flag} {good}");
        assert_one_line_failure(&xfabric(&["info", "-p", "shm", flag, bad]), bad);
    }
    let out = xfabric(&["info", "-p", "shm", "-m", "FI_CONTEXT|FI_MSG_PREFIX"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // -s, -n and -P are passed to getinfo as fi_info passes them; shm reaches any local node.
    let out = xfabric(&["info", "-p", "shm", "-n", "localhost", "-P", "47592"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = xfabric(&["info", "-p", "shm", "-s", "localhost"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn info_substring_prints_only_matching_structures() {
    let out = xfabric(&["info", "-p", "shm", "-i", "fi_addr_str"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(text.starts_with("---\nfi_info:\n"), "{text}");
    assert!(!text.contains("\nhmem:\n"), "{text}");
    let out = xfabric(&["info", "-p", "shm", "-i", "NO_SUCH_FIELD_TEXT"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
}

#[test]
fn env_lists_the_settings_table() {
    let out = xfabric(&["info", "-e"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    for s in xfabric::settings::SETTINGS {
        let head = format!("# {}: {}\n# ", s.name, s.kind);
        assert!(text.contains(&head), "{head:?} not in:\n{text}");
        assert!(
            text.contains(&format!("(default: {})\n", s.default)),
            "{text}"
        );
    }
    for name in [
        "XFABRIC_XPU_SPIN_MS",
        "XFABRIC_XPU_POLL_US",
        "XFABRIC_SHM_CMA",
        "XFABRIC_SHM_SPLIT_MIN",
        "XFABRIC_ZE_LOADER",
    ] {
        assert!(text.contains(name), "{name} not in:\n{text}");
    }
    let out = xfabric(&["info", "-g", "shm"]);
    let text = stdout(&out);
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# XFABRIC_"))
        .collect();
    assert!(!names.is_empty(), "{text}");
    for l in text
        .lines()
        .filter(|l| l.starts_with("# XFABRIC_") || l.starts_with("# XDG_"))
    {
        assert!(l.contains("SHM"), "-g shm printed {l}");
    }
}

/// fi_getinfo(3): the target side of RMA and atomics is a receive capability, so whatever an
/// entry offers of it appears in its fi_rx_attr caps too.
#[test]
fn verbose_rx_caps_carry_the_target_side() {
    let out = xfabric(&["info", "-v", "-p", "shm"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    let top = text
        .lines()
        .find(|l| l.starts_with("    caps: "))
        .expect("caps");
    let rx_at = text.find("\n    fi_rx_attr:\n").expect("fi_rx_attr");
    let rx = text[rx_at..]
        .lines()
        .find(|l| l.starts_with("        caps: "))
        .expect("rx caps");
    let has = |line: &str, cap: &str| {
        line.contains(&format!(" {cap},")) || line.contains(&format!(" {cap} ]"))
    };
    for cap in [
        "FI_RMA",
        "FI_ATOMIC",
        "FI_REMOTE_READ",
        "FI_REMOTE_WRITE",
        "FI_RMA_EVENT",
        "FI_RECV",
    ] {
        if has(top, cap) {
            assert!(has(rx, cap), "{cap} offered but not in {rx}");
        }
    }
    assert!(
        !has(rx, "FI_SEND") && !has(rx, "FI_READ") && !has(rx, "FI_WRITE"),
        "{rx}"
    );
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

#[test]
fn fi_log_level_turns_logging_on_and_a_bad_value_is_named() {
    let quiet = xfabric(&["info", "-p", "shm"]);
    assert!(quiet.status.success());
    assert_eq!(stderr(&quiet), "", "logging is off by default");
    let debug = xfabric_os(
        &[
            OsString::from("info"),
            OsString::from("-p"),
            OsString::from("shm"),
        ],
        &[("FI_LOG_LEVEL", OsStr::new("debug"))],
    );
    assert!(debug.status.success());
    assert!(stderr(&debug).contains("getinfo"), "{}", stderr(&debug));
    let bad = xfabric_os(
        &[
            OsString::from("info"),
            OsString::from("-p"),
            OsString::from("shm"),
        ],
        &[("FI_LOG_LEVEL", OsStr::new("loud"))],
    );
    assert!(
        bad.status.success(),
        "a bad log level is a warning, not a failure"
    );
    let e = stderr(&bad);
    assert!(e.contains("FI_LOG_LEVEL") && e.contains("loud"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}
