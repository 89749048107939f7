//! The device API's C layouts (`kernels/cuda/xfabric/fi_xpu_abi.h`) against their one Rust
//! definition (`xfabric::xpu::abi`): a C program prints every size, offset and constant the
//! header defines, and each is compared with the Rust value. The header asserts the same
//! numbers itself (`_Static_assert`); this test ties both sides to each other.

use std::mem::{offset_of, size_of};
use std::process::Command;

use xfabric::xpu::abi::{self, opcode, CntrMirror, CqRingHeader, FidXpu, RingHeader};
use xfabric::xpu::abi::{XpuCqEntry, XpuDesc};

mod common;

macro_rules! off {
    ($v:ident, $rust:ty, $c:literal, $($f:ident),*) => {
        $v.push((format!("sizeof(struct {})", $c), size_of::<$rust>() as u64));
        $($v.push((
            format!("__builtin_offsetof(struct {}, {})", $c, stringify!($f)),
            offset_of!($rust, $f) as u64,
        ));)*
    };
}

fn checks() -> Vec<(String, u64)> {
    let mut v = Vec::new();
    off!(v, FidXpu, "fid_xpu", fclass, prov_id, prov_ctx);
    off!(
        v,
        XpuDesc,
        "xf_xpu_desc",
        seq,
        opcode,
        op,
        datatype,
        check,
        flags,
        len,
        buf,
        desc,
        peer,
        context,
        data,
        tag,
        ignore,
        raddr,
        rkey,
        compare,
        compare_desc,
        result,
        result_desc,
        reserved
    );
    off!(
        v,
        RingHeader,
        "xf_xpu_ring",
        magic,
        version,
        slots,
        mask,
        state,
        tail,
        claimed,
        head
    );
    off!(
        v,
        XpuCqEntry,
        "xf_xpu_cq_entry",
        seq,
        kind,
        err,
        op_context,
        flags,
        len,
        buf,
        data,
        tag,
        src,
        olen,
        prov_errno,
        pad,
        reserved
    );
    off!(
        v,
        CqRingHeader,
        "xf_xpu_cq_ring",
        magic,
        version,
        slots,
        mask,
        format,
        overrun,
        tail,
        head
    );
    off!(
        v,
        CntrMirror,
        "xf_xpu_cntr_mirror",
        value,
        err,
        magic,
        version,
        ring
    );
    for (c, r) in [
        (
            "_Alignof(struct xf_xpu_ring)",
            std::mem::align_of::<RingHeader>(),
        ),
        (
            "_Alignof(struct xf_xpu_cq_ring)",
            std::mem::align_of::<CqRingHeader>(),
        ),
        (
            "_Alignof(struct xf_xpu_cntr_mirror)",
            std::mem::align_of::<CntrMirror>(),
        ),
    ] {
        v.push((c.to_string(), r as u64));
    }
    let consts: [(&str, u64); 41] = [
        ("FI_XPU_PROV_XFABRIC", abi::FI_XPU_PROV_XFABRIC.into()),
        ("XF_XPU_CLASS_EP", abi::FI_CLASS_EP.into()),
        ("XF_XPU_CLASS_CQ", abi::FI_CLASS_CQ.into()),
        ("XF_XPU_CLASS_CNTR", abi::FI_CLASS_CNTR.into()),
        ("FI_XPU_WORK_ITEM", abi::FI_XPU_WORK_ITEM as u64),
        ("FI_XPU_SUBGROUP", abi::FI_XPU_SUBGROUP as u64),
        ("FI_XPU_WORK_GROUP", abi::FI_XPU_WORK_GROUP as u64),
        ("FI_XPU_DEVICE", abi::FI_XPU_DEVICE as u64),
        ("XF_XPU_DESC_WORDS", abi::DESC_WORDS as u64),
        ("XF_XPU_CQ_WORDS", abi::CQ_WORDS as u64),
        ("XF_XPU_RING_MAGIC", abi::RING_MAGIC.into()),
        ("XF_XPU_CQ_RING_MAGIC", abi::CQ_RING_MAGIC.into()),
        ("XF_XPU_CNTR_MAGIC", abi::CNTR_MAGIC.into()),
        ("XF_XPU_ABI_VERSION", abi::ABI_VERSION.into()),
        ("XF_XPU_RING_OPEN", abi::RING_OPEN.into()),
        ("XF_XPU_RING_CLOSED", abi::RING_CLOSED.into()),
        ("XF_XPU_CQ_KIND_OK", abi::CQ_KIND_OK.into()),
        ("XF_XPU_CQ_KIND_ERR", abi::CQ_KIND_ERR.into()),
        // Every opcode and every fault, both sides.
        ("XF_XPU_OP_SEND", opcode::SEND.into()),
        ("XF_XPU_OP_TSEND", opcode::TSEND.into()),
        ("XF_XPU_OP_RECV", opcode::RECV.into()),
        ("XF_XPU_OP_TRECV", opcode::TRECV.into()),
        ("XF_XPU_OP_WRITE", opcode::WRITE.into()),
        ("XF_XPU_OP_READ", opcode::READ.into()),
        ("XF_XPU_OP_ATOMIC", opcode::ATOMIC.into()),
        ("XF_XPU_OP_FETCH_ATOMIC", opcode::FETCH_ATOMIC.into()),
        ("XF_XPU_OP_COMPARE_ATOMIC", opcode::COMPARE_ATOMIC.into()),
        ("XF_XPU_OP_CNTR_ADD", opcode::CNTR_ADD.into()),
        ("XF_XPU_OP_CNTR_SET", opcode::CNTR_SET.into()),
        ("XF_XPU_OP_CNTR_ADDERR", opcode::CNTR_ADDERR.into()),
        ("XF_XPU_OP_CNTR_SETERR", opcode::CNTR_SETERR.into()),
        ("XF_XPU_OP_WITHDRAWN", opcode::WITHDRAWN.into()),
        ("XF_XPU_FAULT_OPCODE", xfabric::xpu::XPU_FAULT_OPCODE as u64),
        ("XF_XPU_FAULT_ADDR", xfabric::xpu::XPU_FAULT_ADDR as u64),
        ("XF_XPU_FAULT_DESC", xfabric::xpu::XPU_FAULT_DESC as u64),
        ("XF_XPU_FAULT_RANGE", xfabric::xpu::XPU_FAULT_RANGE as u64),
        ("XF_XPU_FAULT_FLAGS", xfabric::xpu::XPU_FAULT_FLAGS as u64),
        ("XF_XPU_FAULT_TORN", xfabric::xpu::XPU_FAULT_TORN as u64),
        ("XF_XPU_FAULT_ARGS", xfabric::xpu::XPU_FAULT_ARGS as u64),
        (
            "XF_XPU_FAULT_UNPUBLISHED",
            xfabric::xpu::XPU_FAULT_UNPUBLISHED as u64,
        ),
        ("XF_XPU_FAULT_ROOM", xfabric::xpu::XPU_FAULT_ROOM as u64),
    ];
    v.extend(consts.iter().map(|(c, r)| (c.to_string(), *r)));
    v
}

#[test]
fn c_header_layouts_match_the_rust_abi() {
    let checks = checks();
    let mut src =
        String::from("#include <stdio.h>\n#include \"xfabric/fi_xpu_abi.h\"\nint main(void) {\n");
    for (c, _) in &checks {
        src.push_str(&format!(
            "printf(\"%llu\\n\", (unsigned long long)({c}));\n"
        ));
    }
    src.push_str("return 0;\n}\n");
    let dir = common::target_dir().join("capi-xpu-header");
    std::fs::create_dir_all(&dir).unwrap();
    let (c, exe) = (dir.join("layout.c"), dir.join("layout"));
    std::fs::write(&c, src).unwrap();
    let headers = concat!(env!("CARGO_MANIFEST_DIR"), "/../kernels/cuda");
    let out = Command::new("cc")
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-pedantic",
            "-Werror",
            "-I",
            headers,
            "-o",
        ])
        .arg(&exe)
        .arg(&c)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().expect("run the layout program");
    let got: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(got.len(), checks.len());
    let wrong: Vec<String> = checks
        .iter()
        .zip(&got)
        .filter(|((_, r), c)| r != *c)
        .map(|((e, r), c)| format!("{e}: C {c}, Rust {r}"))
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}
