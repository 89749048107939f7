//! The C layouts of libfabric 1.17's headers that this library reads and writes, other than
//! `struct fi_info` (`info`) and the ops tables (`ops`): the `struct fid` and each object's
//! head (`struct fid_X`), the attribute structures the opens take, the messages and vectors of
//! the data calls, event queue entries, and the triggered contexts and deferred work of
//! fi_trigger(3). Each is `#[repr(C)]` with the header's members in the header's order; the
//! tests check sizes and offsets against the installed headers.

use std::ffi::{c_char, c_int, c_void};

use xfabric::TriggerXpu;

use crate::ops::{
    FiOps, FiOpsAtomic, FiOpsCm, FiOpsDomain, FiOpsEp, FiOpsFabric, FiOpsMr, FiOpsMsg, FiOpsRma,
    FiOpsTagged,
};

/// `struct fid`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Fid {
    pub fclass: usize,
    pub context: *mut c_void,
    pub ops: *const FiOps,
}

/// `struct fid_fabric`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FabricHead {
    pub fid: Fid,
    pub ops: *const FiOpsFabric,
    pub api_version: u32,
}

/// `struct fid_domain`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct DomainHead {
    pub fid: Fid,
    pub ops: *const FiOpsDomain,
    pub mr: *const FiOpsMr,
}

/// `struct fid_ep`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct EpHead {
    pub fid: Fid,
    pub ops: *const FiOpsEp,
    pub cm: *const FiOpsCm,
    pub msg: *const FiOpsMsg,
    pub rma: *const FiOpsRma,
    pub tagged: *const FiOpsTagged,
    pub atomic: *const FiOpsAtomic,
    /// Collectives are not part of xfabric: null, which fi_collective.h's calls check for.
    pub collective: *const c_void,
}

/// `struct fid_av`, `fid_cq`, `fid_cntr`, `fid_eq`, `fid_wait`, `fid_poll`: the fid and one
/// ops table.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct OpsHead<O: 'static> {
    pub fid: Fid,
    pub ops: *const O,
}

/// `struct fid_mr`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct MrHead {
    pub fid: Fid,
    /// What `fi_mr_desc` hands out and data calls give back: the region's own fid.
    pub mem_desc: *mut c_void,
    pub key: u64,
}

/// `struct fi_cq_attr`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiCqAttr {
    pub size: usize,
    pub flags: u64,
    pub format: c_int,
    pub wait_obj: c_int,
    pub signaling_vector: c_int,
    pub wait_cond: c_int,
    pub wait_set: *mut c_void,
}

/// `struct fi_cntr_attr`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiCntrAttr {
    pub events: c_int,
    pub wait_obj: c_int,
    pub wait_set: *mut c_void,
    pub flags: u64,
}

/// `struct fi_av_attr`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiAvAttr {
    pub type_: c_int,
    pub rx_ctx_bits: c_int,
    pub count: usize,
    pub ep_per_node: usize,
    pub name: *const c_char,
    pub map_addr: *mut c_void,
    pub flags: u64,
}

/// `struct fi_eq_attr`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiEqAttr {
    pub size: usize,
    pub flags: u64,
    pub wait_obj: c_int,
    pub signaling_vector: c_int,
    pub wait_set: *mut c_void,
}

/// `struct fi_wait_attr`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiWaitAttr {
    pub wait_obj: c_int,
    pub flags: u64,
}

/// `struct fi_poll_attr`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiPollAttr {
    pub flags: u64,
}

/// `struct fi_mr_attr` (the device union read as its widest member).
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiMrAttr {
    pub mr_iov: *const libc::iovec,
    pub iov_count: usize,
    pub access: u64,
    pub offset: u64,
    pub requested_key: u64,
    pub context: *mut c_void,
    pub auth_key_size: usize,
    pub auth_key: *mut u8,
    pub iface: c_int,
    pub device: u64,
}

/// `struct fi_atomic_attr`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiAtomicAttr {
    pub count: usize,
    pub size: usize,
}

/// `struct fi_msg` and `struct fi_msg_tagged`'s common shape: segments, descriptors, count,
/// address, then (tagged) tag and ignore, then context and data.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiMsg {
    pub msg_iov: *const libc::iovec,
    pub desc: *mut *mut c_void,
    pub iov_count: usize,
    pub addr: u64,
    pub context: *mut c_void,
    pub data: u64,
}

/// `struct fi_msg_tagged`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiMsgTagged {
    pub msg_iov: *const libc::iovec,
    pub desc: *mut *mut c_void,
    pub iov_count: usize,
    pub addr: u64,
    pub tag: u64,
    pub ignore: u64,
    pub context: *mut c_void,
    pub data: u64,
}

/// `struct fi_rma_iov`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiRmaIov {
    pub addr: u64,
    pub len: usize,
    pub key: u64,
}

/// `struct fi_msg_rma`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiMsgRma {
    pub msg_iov: *const libc::iovec,
    pub desc: *mut *mut c_void,
    pub iov_count: usize,
    pub addr: u64,
    pub rma_iov: *const FiRmaIov,
    pub rma_iov_count: usize,
    pub context: *mut c_void,
    pub data: u64,
}

/// `struct fi_ioc`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiIoc {
    pub addr: *mut c_void,
    pub count: usize,
}

/// `struct fi_rma_ioc`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiRmaIoc {
    pub addr: u64,
    pub count: usize,
    pub key: u64,
}

/// `struct fi_msg_atomic`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiMsgAtomic {
    pub msg_iov: *const FiIoc,
    pub desc: *mut *mut c_void,
    pub iov_count: usize,
    pub addr: u64,
    pub rma_iov: *const FiRmaIoc,
    pub rma_iov_count: usize,
    pub datatype: c_int,
    pub op: c_int,
    pub context: *mut c_void,
    pub data: u64,
}

/// `struct fi_msg_fetch` and `struct fi_msg_compare` (the same members).
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiMsgIoc {
    pub msg_iov: *const FiIoc,
    pub desc: *mut *mut c_void,
    pub iov_count: usize,
}

/// `struct fi_eq_entry`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiEqEntry {
    pub fid: *mut c_void,
    pub context: *mut c_void,
    pub data: u64,
}

/// `struct fi_eq_err_entry`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiEqErrEntry {
    pub fid: *mut c_void,
    pub context: *mut c_void,
    pub data: u64,
    pub err: c_int,
    pub prov_errno: c_int,
    pub err_data: *mut c_void,
    pub err_data_size: usize,
}

/// `struct fi_alias`, `fi_control(FI_ALIAS)`'s argument.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiAlias {
    pub fid: *mut *mut c_void,
    pub flags: u64,
}

/// `struct fi_trigger_threshold`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiTriggerThreshold {
    pub cntr: *mut c_void,
    pub threshold: usize,
}

/// The union of `struct fi_triggered_context` (the `fi_context`-sized one; the `2` variant has
/// the same members at the same offsets, only more room after them).
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
#[derive(Clone, Copy)]
pub union FiTrigger {
    pub threshold: FiTriggerThreshold,
    pub xpu: TriggerXpu,
    pub internal: [*mut c_void; 3],
}

/// `struct fi_triggered_context`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiTriggeredContext {
    pub event_type: c_int,
    pub trigger: FiTrigger,
}

/// `struct fi_deferred_work`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiDeferredWork {
    pub context: [*mut c_void; 8],
    pub threshold: u64,
    pub triggering_cntr: *mut c_void,
    pub completion_cntr: *mut c_void,
    pub op_type: c_int,
    pub op: *mut c_void,
}

/// `struct fi_op_msg` (and, with the tagged message, `struct fi_op_tagged`).
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiOpMsg<M> {
    pub ep: *mut c_void,
    pub msg: M,
    pub flags: u64,
}

/// `struct fi_op_rma`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiOpRma {
    pub ep: *mut c_void,
    pub msg: FiMsgRma,
    pub flags: u64,
}

/// `struct fi_op_cntr`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiOpCntr {
    pub cntr: *mut c_void,
    pub value: u64,
}

/// `struct fi_op_atomic`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiOpAtomic {
    pub ep: *mut c_void,
    pub msg: FiMsgAtomic,
    pub flags: u64,
}

/// `struct fi_op_fetch_atomic`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiOpFetchAtomic {
    pub ep: *mut c_void,
    pub msg: FiMsgAtomic,
    pub fetch: FiMsgIoc,
    pub flags: u64,
}

/// `struct fi_op_compare_atomic`.
#[allow(missing_docs)] // the C header's members, one for one
#[repr(C)]
pub struct FiOpCompareAtomic {
    pub ep: *mut c_void,
    pub msg: FiMsgAtomic,
    pub fetch: FiMsgIoc,
    pub compare: FiMsgIoc,
    pub flags: u64,
}
