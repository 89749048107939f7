//! The raw layer: the few libibverbs types and entry points the provider uses, declared by hand
//! and resolved at run time (`dlopen("libibverbs.so.1")`), so that xfabric has no load-time
//! dependency on rdma-core. The layouts follow `<infiniband/verbs.h>` of rdma-core (a stable
//! ABI since libibverbs 1.1); `tests::layout` checks every offset used here against the
//! installed header where one exists.
//!
//! Data-path calls (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`) are
//! inline functions in the header: they call through the context's `ops` table, and so do we.

#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use libloading::Library;

/// `struct ibv_device` (opaque).
pub enum ibv_device {}
/// `struct ibv_pd` (opaque).
pub enum ibv_pd {}
/// `struct ibv_srq` (opaque).
pub enum ibv_srq {}

pub type PollCq = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyCq = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type PostSend =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecv =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// The start of `struct ibv_context_ops`: entries this layer does not call are padding.
#[repr(C)]
pub struct ibv_context_ops {
    _before_poll: [usize; 11],
    pub poll_cq: Option<PollCq>,
    pub req_notify_cq: Option<ReqNotifyCq>,
    _before_post: [usize; 12],
    pub post_send: Option<PostSend>,
    pub post_recv: Option<PostRecv>,
}

/// The start of `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// The start of `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
}

/// The start of `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Network byte order.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `wr.rdma` and `wr.atomic` of `struct ibv_send_wr` (the larger, atomic, shape).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_wr_remote {
    pub remote_addr: u64,
    /// `wr.atomic.compare_add`; with `rdma`, this is where `wr.rdma.rkey` lies.
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `struct ibv_send_wr`.
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    /// Network byte order.
    pub imm_data: u32,
    pub wr: ibv_wr_remote,
    pub qp_type: u32,
    /// The `bind_mw`/`tso` union, unused here.
    pub _tail: [u64; 6],
}

impl ibv_send_wr {
    /// Sets `wr.rdma` (remote address and key) of an RDMA read or write.
    pub fn set_rdma(&mut self, remote_addr: u64, rkey: u32) {
        self.wr.remote_addr = remote_addr;
        // `wr.rdma.rkey` overlays the low half of `wr.atomic.compare_add`.
        self.wr.compare_add = u64::from(rkey);
    }
}

impl Default for ibv_send_wr {
    fn default() -> Self {
        ibv_send_wr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            wr: ibv_wr_remote::default(),
            qp_type: 0,
            _tail: [0; 6],
        }
    }
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route` (8-aligned: its `union ibv_gid` holds two `__be64`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_global_route {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

// enum values from <infiniband/verbs.h>
pub const IBV_QPT_RC: c_uint = 2;
pub const IBV_QPS_RESET: c_uint = 0;
pub const IBV_QPS_INIT: c_uint = 1;
pub const IBV_QPS_RTR: c_uint = 2;
pub const IBV_QPS_RTS: c_uint = 3;
pub const IBV_QPS_ERR: c_uint = 6;
pub const IBV_MTU_1024: c_uint = 3;

pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;
pub const IBV_ACCESS_REMOTE_ATOMIC: c_int = 1 << 3;

pub const IBV_WR_RDMA_WRITE: c_uint = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
pub const IBV_WR_SEND: c_uint = 2;
pub const IBV_WR_RDMA_READ: c_uint = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_uint = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_uint = 6;

pub const IBV_SEND_FENCE: c_uint = 1;
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;

pub const IBV_WC_SUCCESS: c_uint = 0;
pub const IBV_WC_LOC_PROT_ERR: c_uint = 4;
pub const IBV_WC_WR_FLUSH_ERR: c_uint = 5;
pub const IBV_WC_REM_INV_REQ_ERR: c_uint = 9;
pub const IBV_WC_REM_ACCESS_ERR: c_uint = 10;
pub const IBV_WC_RETRY_EXC_ERR: c_uint = 12;
pub const IBV_WC_RNR_RETRY_EXC_ERR: c_uint = 13;

pub const IBV_WC_RECV: c_uint = 1 << 7;
pub const IBV_WC_RECV_RDMA_WITH_IMM: c_uint = IBV_WC_RECV + 1;
pub const IBV_WC_WITH_IMM: c_uint = 1 << 1;

/// The entry points resolved from libibverbs.
pub struct Verbs {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut [u8; 16]) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    pub dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub create_comp_channel: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel,
    pub destroy_comp_channel: unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut ibv_comp_channel,
        c_int,
    ) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub get_cq_event:
        unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
    pub ack_cq_events: unsafe extern "C" fn(*mut ibv_cq, c_uint),
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    /// `ibv_reg_mr_iova2` (rdma-core 22 and later): a registration whose remote addresses
    /// start at a chosen I/O virtual address; absent from older libraries.
    pub reg_mr_iova2: Option<RegMrIova2>,
    /// `ibv_reg_dmabuf_mr` (rdma-core 34 and later): a registration of a dma-buf's pages
    /// (device memory a GPU driver exports); absent from older libraries.
    pub reg_dmabuf_mr: Option<RegDmabufMr>,
    _lib: Library,
}

/// `ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access)`.
pub type RegDmabufMr =
    unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr;

/// `ibv_reg_mr_iova2(pd, addr, length, iova, access)`.
pub type RegMrIova2 =
    unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr;

/// The library's file name: the SONAME rdma-core has shipped since 2008.
pub const LIBNAME: &str = "libibverbs.so.1";

impl Verbs {
    fn load(name: &str) -> Result<Verbs, String> {
        // SAFETY: loading libibverbs runs its constructors, which only set up its own state.
        let lib = unsafe { Library::new(name) }.map_err(|e| format!("{name} not found ({e})"))?;
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the symbol's C type is the field's, declared from verbs.h above.
                let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("{name}: {} missing ({e})", $name))?;
                *s
            }};
        }
        Ok(Verbs {
            get_device_list: sym!("ibv_get_device_list"),
            free_device_list: sym!("ibv_free_device_list"),
            get_device_name: sym!("ibv_get_device_name"),
            open_device: sym!("ibv_open_device"),
            close_device: sym!("ibv_close_device"),
            query_gid: sym!("ibv_query_gid"),
            alloc_pd: sym!("ibv_alloc_pd"),
            dealloc_pd: sym!("ibv_dealloc_pd"),
            reg_mr: sym!("ibv_reg_mr"),
            dereg_mr: sym!("ibv_dereg_mr"),
            create_comp_channel: sym!("ibv_create_comp_channel"),
            destroy_comp_channel: sym!("ibv_destroy_comp_channel"),
            create_cq: sym!("ibv_create_cq"),
            destroy_cq: sym!("ibv_destroy_cq"),
            get_cq_event: sym!("ibv_get_cq_event"),
            ack_cq_events: sym!("ibv_ack_cq_events"),
            create_qp: sym!("ibv_create_qp"),
            modify_qp: sym!("ibv_modify_qp"),
            destroy_qp: sym!("ibv_destroy_qp"),
            // SAFETY: as `sym!`; a missing symbol is an older library, not an error.
            reg_mr_iova2: unsafe { lib.get::<RegMrIova2>(b"ibv_reg_mr_iova2\0") }
                .ok()
                .map(|s| *s),
            // SAFETY: as above.
            reg_dmabuf_mr: unsafe { lib.get::<RegDmabufMr>(b"ibv_reg_dmabuf_mr\0") }
                .ok()
                .map(|s| *s),
            _lib: lib,
        })
    }
}

/// libibverbs, loaded on first use; the error says why it cannot be.
pub fn verbs() -> Result<&'static Verbs, String> {
    static V: OnceLock<Result<Verbs, String>> = OnceLock::new();
    V.get_or_init(|| Verbs::load(LIBNAME))
        .as_ref()
        .map_err(Clone::clone)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn a_missing_library_is_a_reason_not_a_failure() {
        let e = Verbs::load("libibverbs-absent.so.1")
            .err()
            .expect("no such library");
        assert!(e.starts_with("libibverbs-absent.so.1 not found"), "{e}");
        // A library without the verbs: the first missing symbol is named.
        if let Err(e) = Verbs::load("libc.so.6") {
            assert!(e.contains("ibv_get_device_list missing"), "{e}");
        }
    }

    /// Compiles a C program against the installed `<infiniband/verbs.h>` that prints the
    /// offsets and sizes this layer relies on, and compares. Skipped (with the reason) where
    /// the header or a C compiler is missing.
    #[test]
    fn layout() {
        if !std::path::Path::new("/usr/include/infiniband/verbs.h").exists() {
            eprintln!("skipped: /usr/include/infiniband/verbs.h is missing (libibverbs-dev)");
            return;
        }
        let ours: Vec<(&str, usize)> = vec![
            (
                "offsetof(struct ibv_context, ops.poll_cq)",
                offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, poll_cq),
            ),
            (
                "offsetof(struct ibv_context, ops.req_notify_cq)",
                offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, req_notify_cq),
            ),
            (
                "offsetof(struct ibv_context, ops.post_send)",
                offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send),
            ),
            (
                "offsetof(struct ibv_context, ops.post_recv)",
                offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_recv),
            ),
            (
                "offsetof(struct ibv_comp_channel, fd)",
                offset_of!(ibv_comp_channel, fd),
            ),
            (
                "offsetof(struct ibv_qp, qp_num)",
                offset_of!(ibv_qp, qp_num),
            ),
            ("offsetof(struct ibv_mr, lkey)", offset_of!(ibv_mr, lkey)),
            ("offsetof(struct ibv_mr, rkey)", offset_of!(ibv_mr, rkey)),
            ("sizeof(struct ibv_wc)", std::mem::size_of::<ibv_wc>()),
            (
                "offsetof(struct ibv_wc, imm_data)",
                offset_of!(ibv_wc, imm_data),
            ),
            (
                "offsetof(struct ibv_wc, wc_flags)",
                offset_of!(ibv_wc, wc_flags),
            ),
            (
                "sizeof(struct ibv_send_wr)",
                std::mem::size_of::<ibv_send_wr>(),
            ),
            (
                "offsetof(struct ibv_send_wr, imm_data)",
                offset_of!(ibv_send_wr, imm_data),
            ),
            (
                "offsetof(struct ibv_send_wr, wr.rdma.remote_addr)",
                offset_of!(ibv_send_wr, wr),
            ),
            (
                "offsetof(struct ibv_send_wr, wr.rdma.rkey)",
                offset_of!(ibv_send_wr, wr) + offset_of!(ibv_wr_remote, compare_add),
            ),
            (
                "offsetof(struct ibv_send_wr, wr.atomic.swap)",
                offset_of!(ibv_send_wr, wr) + offset_of!(ibv_wr_remote, swap),
            ),
            (
                "offsetof(struct ibv_send_wr, wr.atomic.rkey)",
                offset_of!(ibv_send_wr, wr) + offset_of!(ibv_wr_remote, rkey),
            ),
            (
                "sizeof(struct ibv_recv_wr)",
                std::mem::size_of::<ibv_recv_wr>(),
            ),
            (
                "sizeof(struct ibv_qp_init_attr)",
                std::mem::size_of::<ibv_qp_init_attr>(),
            ),
            (
                "offsetof(struct ibv_qp_init_attr, qp_type)",
                offset_of!(ibv_qp_init_attr, qp_type),
            ),
            (
                "sizeof(struct ibv_qp_attr)",
                std::mem::size_of::<ibv_qp_attr>(),
            ),
            (
                "offsetof(struct ibv_qp_attr, ah_attr)",
                offset_of!(ibv_qp_attr, ah_attr),
            ),
            (
                "offsetof(struct ibv_qp_attr, ah_attr.port_num)",
                offset_of!(ibv_qp_attr, ah_attr) + offset_of!(ibv_ah_attr, port_num),
            ),
            (
                "offsetof(struct ibv_qp_attr, max_rd_atomic)",
                offset_of!(ibv_qp_attr, max_rd_atomic),
            ),
            (
                "offsetof(struct ibv_qp_attr, rnr_retry)",
                offset_of!(ibv_qp_attr, rnr_retry),
            ),
            (
                "offsetof(struct ibv_qp_attr, rate_limit)",
                offset_of!(ibv_qp_attr, rate_limit),
            ),
        ];
        let dir = std::env::temp_dir().join(format!("xf-verbs-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("l.c");
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
        );
        for (expr, _) in &ours {
            c.push_str(&format!("  printf(\"%zu\\n\", (size_t){expr});\n"));
        }
        c.push_str("  return 0;\n}\n");
        std::fs::write(&src, c).unwrap();
        let exe = dir.join("l");
        let cc = std::process::Command::new("cc")
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .status();
        match cc {
            Ok(s) if s.success() => {}
            other => {
                let _ = std::fs::remove_dir_all(&dir);
                eprintln!("skipped: cannot compile against verbs.h ({other:?})");
                return;
            }
        }
        let out = std::process::Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let theirs: Vec<usize> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        assert_eq!(theirs.len(), ours.len());
        for ((expr, o), t) in ours.iter().zip(theirs) {
            assert_eq!(*o, t, "{expr}");
        }
    }
}
