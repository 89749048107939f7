//! The export table of libfabric.so must be Debian's libfabric 1.17.0's (FABRIC_1.x nodes),
//! or programs linked against Debian's library fail to resolve their versioned symbols; xfabric's
//! own symbols (the device API's host calls) are in nodes of their own, XFABRIC_1.0 and XFABRIC_1.1.

use std::process::Command;

mod common;
use common::cdylib;

const EXPECTED: [(&str, &str); 25] = [
    ("fi_version", "FABRIC_1.0"),
    ("fi_strerror", "FABRIC_1.0"),
    ("fi_tostr", "FABRIC_1.0"),
    ("fi_log_enabled", "FABRIC_1.0"),
    ("fi_log", "FABRIC_1.0"),
    ("fi_param_define", "FABRIC_1.0"),
    ("fi_param_get", "FABRIC_1.0"),
    ("fi_getparams", "FABRIC_1.0"),
    ("fi_freeparams", "FABRIC_1.0"),
    ("fi_fabric", "FABRIC_1.1"),
    ("fi_getinfo", "FABRIC_1.3"),
    ("fi_freeinfo", "FABRIC_1.3"),
    ("fi_dupinfo", "FABRIC_1.3"),
    ("fi_tostr_r", "FABRIC_1.4"),
    ("fi_open", "FABRIC_1.5"),
    ("fi_log_ready", "FABRIC_1.6"),
    // xfabric's own (the device API's host calls), in a node Debian does not have.
    ("fi_ep_export_xpu", "XFABRIC_1.0"),
    ("fi_cq_export_xpu", "XFABRIC_1.0"),
    ("fi_cntr_export_xpu", "XFABRIC_1.0"),
    ("fi_av_get_xpu_addr", "XFABRIC_1.0"),
    ("fi_mr_get_xpu_desc", "XFABRIC_1.0"),
    ("xf_ep_export_xpu", "XFABRIC_1.0"),
    ("xf_cq_export_xpu", "XFABRIC_1.0"),
    ("xf_cntr_export_xpu", "XFABRIC_1.0"),
    ("xf_xpu_notify", "XFABRIC_1.1"),
];

fn tool(name: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(name).args(args).output().ok()?;
    assert!(out.status.success(), "{name} {args:?} failed");
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn exports_match_debian_libfabric_1_17() {
    let lib = cdylib();
    assert!(lib.exists(), "{} not built", lib.display());
    let lib = lib.to_str().expect("utf-8 path");
    let Some(table) = tool("objdump", &["-T", lib]) else {
        eprintln!("skipped: objdump (binutils) not installed");
        return;
    };
    // Defined functions: "ADDR g DF .text SIZE VERSION NAME".
    let mut got: Vec<(String, String)> = table
        .lines()
        .filter(|l| l.contains(" DF ") && !l.contains("*UND*"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let n = f.len();
            (n >= 2).then(|| (f[n - 1].to_string(), f[n - 2].to_string()))
        })
        .collect();
    got.sort();
    let mut want: Vec<(String, String)> = EXPECTED
        .iter()
        .map(|(s, v)| (s.to_string(), v.to_string()))
        .collect();
    want.sort();
    assert_eq!(got, want, "exported functions and their version nodes");
    // Every version node Debian defines, 1.2 included (it holds only compatibility aliases).
    let headers = tool("objdump", &["-p", lib]).expect("objdump ran above");
    let defined: Vec<&str> = headers
        .lines()
        .skip_while(|l| !l.starts_with("Version definitions:"))
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter(|n| n.starts_with("FABRIC_"))
        .collect();
    let nodes = ["1.0", "1.1", "1.2", "1.3", "1.4", "1.5", "1.6"].map(|n| format!("FABRIC_{n}"));
    assert_eq!(defined, nodes, "version nodes");
    let dynamic = tool("readelf", &["-d", lib]).expect("readelf comes with objdump");
    assert!(
        dynamic.contains("Library soname: [libfabric.so.1]"),
        "soname is not libfabric.so.1"
    );
}

#[test]
fn strerror_and_version() {
    use std::ffi::CStr;
    assert_eq!(fabric::fi_version(), (1 << 16) | 17);
    // SAFETY: fi_strerror returns a valid static C string for any input.
    let msg = |e| {
        unsafe { CStr::from_ptr(fabric::fi_strerror(e)) }
            .to_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(msg(-265), "Truncation error");
    assert_eq!(msg(265), "Truncation error");
    assert_eq!(msg(i32::MIN), "Unspecified error");
    assert_eq!(msg(100_000), "Unspecified error");
    assert!(!msg(libc::EINVAL).is_empty());
}
