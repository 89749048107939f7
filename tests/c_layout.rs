//! Checks xfabric's constants, enum values and completion-entry layouts against libfabric's own
//! C headers: a table of (C expression, Rust value) pairs is built once, turned into a C program
//! that prints each expression, and the printed values are compared with the Rust ones.
//!
//! Needs `cc` and libfabric-dev (`/usr/include/rdma`). Without the headers the test is skipped
//! with a printed reason, except under CI, where it fails.

use std::collections::BTreeMap;
use std::mem::{align_of, offset_of, size_of, size_of_val};
use std::path::Path;
use std::process::Command;

use xfabric::consts::errno::*;
use xfabric::consts::*;
use xfabric::entry::{CqDataEntry, CqEntry, CqErrEntry, CqMsgEntry, CqTaggedEntry};
use xfabric::{Iface, TriggerVar, TriggerXpu};

const HEADER: &str = "/usr/include/rdma/fabric.h";

/// Constants in consts.rs that no public libfabric header defines, with the reason.
const NOT_IN_C_HEADERS: &[(&str, &str)] = &[
    (
        "FI_PRIMARY_CAPS",
        "libfabric keeps OFI_PRIMARY_CAPS in its internal ofi.h",
    ),
    (
        "FI_SECONDARY_CAPS",
        "libfabric keeps OFI_SECONDARY_CAPS in its internal ofi.h",
    ),
    (
        "FI_OPT_IN_CAPS",
        "xfabric's own grouping: secondary caps getinfo returns only when asked",
    ),
    (
        "FI_ASKED_ONLY_CAPS",
        "xfabric's own grouping: caps getinfo returns only when the hints ask, even empty ones",
    ),
    (
        "FI_DOMAIN_CAPS",
        "xfabric's own grouping: the caps that describe a domain (domain_attr->caps)",
    ),
    (
        "FI_MR_BASIC_MAP",
        "xfabric's own: the mr_mode bits FI_MR_BASIC stands for (fi_mr(3))",
    ),
];

/// One value to compare: a C expression (also the name it is reported by) and what Rust says.
struct Check {
    c_expr: String,
    rust: u64,
}

/// Values travel as `unsigned long long` on the C side and as `as u64` on the Rust side, so a
/// negative value of either sign-extends the same way on both.
fn check(c_expr: impl Into<String>, rust: u64) -> Check {
    Check {
        c_expr: c_expr.into(),
        rust,
    }
}

/// Constants whose C name is the Rust name.
macro_rules! named {
    ($($name:ident),* $(,)?) => {
        [$(check(stringify!($name), $name as u64)),*]
    };
}

/// Size and alignment of a struct, and offset and size of each field.
macro_rules! layout {
    ($rust:ty, $c:literal { $($field:ident),* $(,)? }) => {{
        let value = <$rust>::default();
        let mut v = vec![
            check(concat!("sizeof(struct ", $c, ")"), size_of::<$rust>() as u64),
            check(concat!("_Alignof(struct ", $c, ")"), align_of::<$rust>() as u64),
        ];
        $(
            v.push(check(
                concat!("offsetof(struct ", $c, ", ", stringify!($field), ")"),
                offset_of!($rust, $field) as u64,
            ));
            v.push(check(
                concat!("sizeof(((struct ", $c, " *)0)->", stringify!($field), ")"),
                size_of_val(&value.$field) as u64,
            ));
        )*
        v
    }};
}

/// Every variant of a `c_enum!` enum, by its C enumerator name. The enums have no variant list,
/// so the raw range is scanned; all of libfabric's enumerators used here are small.
macro_rules! enum_values {
    ($($ty:ty),* $(,)?) => {{
        let mut v = Vec::new();
        $(
            v.extend((0..=255).filter_map(<$ty>::from_raw).map(|e| check(e.c_name(), e as u64)));
        )*
        v
    }};
}

// Kept as dense tables, grouped as fabric.h groups them; rustfmt would put one name per line.
#[rustfmt::skip]
fn constant_checks() -> Vec<Check> {
    let version = fi_version(FI_MAJOR_VERSION, FI_MINOR_VERSION) as u64;
    let mut v = vec![check("FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION)", version)];
    v.extend(named![FI_MAJOR_VERSION, FI_MINOR_VERSION]);
    // Capabilities and operation flags.
    v.extend(named![
        FI_MSG, FI_RMA, FI_TAGGED, FI_ATOMIC, FI_MULTICAST, FI_COLLECTIVE, FI_READ, FI_WRITE,
        FI_RECV, FI_SEND, FI_TRANSMIT, FI_REMOTE_READ, FI_REMOTE_WRITE, FI_MULTI_RECV,
        FI_REMOTE_CQ_DATA, FI_MORE, FI_PEEK, FI_TRIGGER, FI_FENCE, FI_PRIORITY, FI_COMPLETION,
        FI_EVENT, FI_INJECT, FI_INJECT_COMPLETE, FI_TRANSMIT_COMPLETE, FI_DELIVERY_COMPLETE,
        FI_AFFINITY, FI_COMMIT_COMPLETE, FI_MATCH_COMPLETE, FI_PEER_TRANSFER, FI_AV_USER_ID,
        FI_PEER, FI_XPU_TRIGGER, FI_HMEM_HOST_ALLOC, FI_HMEM_DEVICE_ONLY, FI_HMEM,
        FI_VARIABLE_MSG, FI_RMA_PMEM, FI_SOURCE_ERR, FI_LOCAL_COMM, FI_REMOTE_COMM,
        FI_SHARED_AV, FI_PROV_ATTR_ONLY, FI_NUMERICHOST, FI_RMA_EVENT, FI_SOURCE,
        FI_NAMED_RX_CTX, FI_DIRECTED_RECV, FI_CLAIM, FI_DISCARD, FI_SELECTIVE_COMPLETION,
    ]);
    // Mode bits.
    v.extend(named![
        FI_CONTEXT, FI_MSG_PREFIX, FI_ASYNC_IOV, FI_RX_CQ_DATA, FI_LOCAL_MR, FI_NOTIFY_FLAGS_ONLY,
        FI_RESTRICTED_COMP, FI_CONTEXT2, FI_BUFFERED_RECV,
    ]);
    // Special addresses, address formats, memory registration modes.
    v.extend(named![FI_ADDR_UNSPEC, FI_ADDR_NOTAVAIL, FI_KEY_NOTAVAIL]);
    v.extend(named![
        FI_FORMAT_UNSPEC, FI_SOCKADDR, FI_SOCKADDR_IN, FI_SOCKADDR_IN6, FI_SOCKADDR_IB,
        FI_ADDR_STR,
    ]);
    v.extend(named![
        FI_MR_UNSPEC, FI_MR_BASIC, FI_MR_SCALABLE, FI_MR_LOCAL, FI_MR_RAW, FI_MR_VIRT_ADDR,
        FI_MR_ALLOCATED, FI_MR_PROV_KEY, FI_MR_MMU_NOTIFY, FI_MR_RMA_EVENT, FI_MR_ENDPOINT,
        FI_MR_HMEM, FI_MR_COLLECTIVE,
    ]);
    // Message ordering, protocols, endpoint options, EQ events.
    v.extend(named![
        FI_ORDER_NONE, FI_ORDER_RAR, FI_ORDER_RAW, FI_ORDER_RAS, FI_ORDER_WAR, FI_ORDER_WAW,
        FI_ORDER_WAS, FI_ORDER_SAR, FI_ORDER_SAW, FI_ORDER_SAS, FI_ORDER_STRICT, FI_ORDER_DATA,
        FI_ORDER_RMA_RAR, FI_ORDER_RMA_RAW, FI_ORDER_RMA_WAR, FI_ORDER_RMA_WAW,
        FI_ORDER_ATOMIC_RAR, FI_ORDER_ATOMIC_RAW, FI_ORDER_ATOMIC_WAR, FI_ORDER_ATOMIC_WAW,
    ]);
    v.extend(named![FI_PROTO_UNSPEC, FI_PROTO_SOCK_TCP, FI_PROTO_SHM]);
    v.extend(named![
        FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, FI_OPT_CM_DATA_SIZE, FI_OPT_BUFFERED_MIN,
        FI_OPT_BUFFERED_LIMIT, FI_OPT_SEND_BUF_SIZE, FI_OPT_RECV_BUF_SIZE, FI_OPT_TX_SIZE,
        FI_OPT_RX_SIZE, FI_OPT_FI_HMEM_P2P, FI_OPT_XPU_TRIGGER,
    ]);
    v.extend(named![
        FI_NOTIFY, FI_CONNREQ, FI_CONNECTED, FI_SHUTDOWN, FI_MR_COMPLETE, FI_AV_COMPLETE,
        FI_JOIN_COMPLETE,
    ]);
    v.extend(named![FI_QUEUE_WORK, FI_CANCEL_WORK, FI_FLUSH_WORK]);
    // Error numbers.
    v.extend(named![
        FI_SUCCESS, FI_EPERM, FI_ENOENT, FI_EINTR, FI_EIO, FI_E2BIG, FI_EBADF, FI_EAGAIN,
        FI_ENOMEM, FI_EACCES, FI_EFAULT, FI_EBUSY, FI_ENODEV, FI_EINVAL, FI_EMFILE, FI_ENOSPC,
        FI_ENOSYS, FI_ENOMSG, FI_ENODATA, FI_EOVERFLOW, FI_EMSGSIZE, FI_ENOPROTOOPT,
        FI_EOPNOTSUPP, FI_EADDRINUSE, FI_EADDRNOTAVAIL, FI_ENETDOWN, FI_ENETUNREACH,
        FI_ECONNABORTED, FI_ECONNRESET, FI_ENOBUFS, FI_EISCONN, FI_ENOTCONN, FI_ESHUTDOWN,
        FI_ETIMEDOUT, FI_ECONNREFUSED, FI_EHOSTDOWN, FI_EHOSTUNREACH, FI_EALREADY,
        FI_EINPROGRESS, FI_EREMOTEIO, FI_ECANCELED, FI_EKEYREJECTED, FI_ERRNO_OFFSET, FI_EOTHER,
        FI_ETOOSMALL, FI_EOPBADSTATE, FI_EAVAIL, FI_EBADFLAGS, FI_ENOEQ, FI_EDOMAIN, FI_ENOCQ,
        FI_ECRC, FI_ETRUNC, FI_ENOKEY, FI_ENOAV, FI_EOVERRUN, FI_ENORX,
    ]);
    v
}

fn all_checks() -> Vec<Check> {
    let mut v = constant_checks();
    v.extend(enum_values![
        EpType,
        AvType,
        xfabric::consts::Progress,
        Threading,
        ResourceMgmt,
        CqFormat,
        WaitObj,
        CqWaitCond,
        CntrEvents,
        TriggerEvent,
        WorkOpType,
        Iface,
    ]);
    v.extend(layout!(CqEntry, "fi_cq_entry" { op_context }));
    v.extend(layout!(CqMsgEntry, "fi_cq_msg_entry" { op_context, flags, len }));
    v.extend(layout!(CqDataEntry, "fi_cq_data_entry" { op_context, flags, len, buf, data }));
    v.extend(layout!(CqTaggedEntry, "fi_cq_tagged_entry" {
        op_context, flags, len, buf, data, tag,
    }));
    v.extend(layout!(CqErrEntry, "fi_cq_err_entry" {
        op_context, flags, len, buf, data, tag, olen, err, prov_errno, err_data, err_data_size,
    }));
    v.extend(layout!(TriggerVar, "fi_trigger_var" { datatype, count, addr, value }));
    v.extend(layout!(TriggerXpu, "fi_trigger_xpu" { count, iface, device, var }));
    v
}

fn c_program(checks: &[Check]) -> String {
    let mut src = String::from(
        "#include <stddef.h>\n\
         #include <stdio.h>\n\
         #include <rdma/fabric.h>\n\
         #include <rdma/fi_domain.h>\n\
         #include <rdma/fi_endpoint.h>\n\
         #include <rdma/fi_eq.h>\n\
         #include <rdma/fi_errno.h>\n\
         #include <rdma/fi_tagged.h>\n\
         #include <rdma/fi_trigger.h>\n\
         \n\
         int main(void)\n\
         {\n",
    );
    for c in checks {
        assert!(
            !c.c_expr.contains(['"', '\\', '\n']),
            "expression {:?} cannot be put in a C string literal",
            c.c_expr
        );
        src += &format!(
            "\tprintf(\"%s %llu\\n\", \"{0}\", (unsigned long long)({0}));\n",
            c.c_expr
        );
    }
    src += "\treturn 0;\n}\n";
    src
}

/// Compiles and runs `src`, returning each printed expression with its value.
fn run_c(src: &str) -> BTreeMap<String, u64> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let c_file = dir.join("c_layout.c");
    let exe = dir.join("c_layout");
    std::fs::write(&c_file, src).expect("write c_layout.c");

    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-o"])
        .arg(&exe)
        .arg(&c_file)
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(
        out.status.success(),
        "{cc} failed to compile {} against libfabric's headers:\n{}",
        c_file.display(),
        String::from_utf8_lossy(&out.stderr)
    );

    let out = Command::new(&exe).output().expect("run c_layout");
    assert!(
        out.status.success(),
        "{} failed: {}",
        exe.display(),
        out.status
    );
    String::from_utf8(out.stdout)
        .expect("c_layout printed UTF-8")
        .lines()
        .map(|line| {
            let (name, value) = line.rsplit_once(' ').expect("a `NAME VALUE` line");
            let value = value.parse().unwrap_or_else(|e| panic!("{line:?}: {e}"));
            (name.to_string(), value)
        })
        .collect()
}

/// Every `pub const` in consts.rs is either in the table or listed as absent from the headers,
/// so a constant added there without a check here fails this test.
#[test]
fn every_constant_is_checked() {
    let checked: Vec<String> = constant_checks().into_iter().map(|c| c.c_expr).collect();
    let unchecked: Vec<&str> = include_str!("../core/src/consts.rs")
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("pub const "))
        .filter(|l| !l.starts_with("fn "))
        // The enum macro's list of each enum's values, not a constant of the C API.
        .filter(|l| !l.starts_with("ALL:"))
        .filter_map(|l| l.split(':').next())
        .filter(|name| !checked.iter().any(|c| c == name))
        .filter(|name| !NOT_IN_C_HEADERS.iter().any(|(n, _)| n == name))
        .collect();
    assert!(
        unchecked.is_empty(),
        "consts.rs constants missing from tests/c_layout.rs: {unchecked:?}"
    );
}

#[test]
fn values_and_layouts_match_libfabric_headers() {
    if !Path::new(HEADER).exists() {
        if std::env::var_os("CI").is_some() {
            panic!("{HEADER} is missing: libfabric-dev must be installed (.ci/run installs it)");
        }
        eprintln!("skipped: {HEADER} not found (apt-get install libfabric-dev)");
        return;
    }

    let checks = all_checks();
    let c_values = run_c(&c_program(&checks));

    let mismatches: Vec<String> = checks
        .iter()
        .filter_map(|c| match c_values.get(&c.c_expr) {
            None => Some(format!("{}: not printed by the C program", c.c_expr)),
            Some(&v) if v != c.rust => Some(format!(
                "{}: C = {v} ({v:#x}), Rust = {} ({:#x})",
                c.c_expr, c.rust, c.rust
            )),
            Some(_) => None,
        })
        .collect();
    assert!(
        mismatches.is_empty(),
        "{} of {} values differ from libfabric's headers:\n  {}",
        mismatches.len(),
        checks.len(),
        mismatches.join("\n  ")
    );
}
