//! Completion entry layouts, `repr(C)` and equal to fi_eq.h's structures so a C caller or a GPU
//! kernel can read what Rust wrote. Pointers are kept as `usize`: the queue never dereferences
//! them, it hands back what the caller passed in.

use crate::consts::CqFormat;

/// An operation context: the opaque value the caller posted with an operation and gets back in
/// its completion (`void *op_context` in C).
pub type Context = usize;

/// The bit that marks a context as one of the endpoint's own keys: the contexts it hands a
/// provider for its records (a started deferred transfer, a staged device-memory operation)
/// are such a record's address with this bit set. No user-space address has it, so a pointer
/// the application posts never looks like one; an XPU's descriptor carrying it is refused
/// (its completion would otherwise be taken for the record's).
pub const INTERNAL_CTX: Context = 1 << (usize::BITS - 1);

/// A fabric address as an address vector hands it out (`fi_addr_t`).
pub type FiAddr = u64;

/// `struct fi_cq_entry`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqEntry {
    /// The context the operation was posted with.
    pub op_context: usize,
}

/// `struct fi_cq_msg_entry`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqMsgEntry {
    /// The context the operation was posted with.
    pub op_context: usize,
    /// What completed: `FI_SEND`, `FI_RECV`, `FI_RMA`, `FI_READ`, `FI_WRITE`, `FI_TAGGED`,
    /// `FI_REMOTE_CQ_DATA`, `FI_MULTI_RECV`, ...
    pub flags: u64,
    /// Bytes received (receives, and remote writes that carry CQ data); not meaningful for
    /// transmits.
    pub len: usize,
}

/// `struct fi_cq_data_entry`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqDataEntry {
    /// The context the operation was posted with.
    pub op_context: usize,
    /// What completed: `FI_SEND`, `FI_RECV`, `FI_RMA`, `FI_READ`, `FI_WRITE`, `FI_TAGGED`,
    /// `FI_REMOTE_CQ_DATA`, `FI_MULTI_RECV`, ...
    pub flags: u64,
    /// Bytes received (receives, and remote writes that carry CQ data); not meaningful for
    /// transmits.
    pub len: usize,
    /// Address where the data was placed: a multi-receive buffer's part this message used;
    /// otherwise 0.
    pub buf: usize,
    /// Remote CQ data, valid when `flags` has `FI_REMOTE_CQ_DATA`.
    pub data: u64,
}

/// `struct fi_cq_tagged_entry`: the widest success format, and the one the queue stores.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqTaggedEntry {
    /// The context the operation was posted with.
    pub op_context: usize,
    /// What completed: `FI_SEND`, `FI_RECV`, `FI_RMA`, `FI_READ`, `FI_WRITE`, `FI_TAGGED`,
    /// `FI_REMOTE_CQ_DATA`, `FI_MULTI_RECV`, ...
    pub flags: u64,
    /// Bytes received (receives, and remote writes that carry CQ data); not meaningful for
    /// transmits.
    pub len: usize,
    /// Address where the data was placed: a multi-receive buffer's part this message used;
    /// otherwise 0.
    pub buf: usize,
    /// Remote CQ data, valid when `flags` has `FI_REMOTE_CQ_DATA`.
    pub data: u64,
    /// The message's tag (tagged receives).
    pub tag: u64,
}

/// `struct fi_cq_err_entry`. `err` is a positive libfabric error number; `olen` is the number of
/// bytes that did not fit (truncation); `err_data` is unused by xfabric's providers and null.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqErrEntry {
    /// The context the operation was posted with.
    pub op_context: usize,
    /// What completed: `FI_SEND`, `FI_RECV`, `FI_RMA`, `FI_READ`, `FI_WRITE`, `FI_TAGGED`,
    /// `FI_REMOTE_CQ_DATA`, `FI_MULTI_RECV`, ...
    pub flags: u64,
    /// Bytes transferred before the failure.
    pub len: usize,
    /// Address where the data was placed: a multi-receive buffer's part this message used;
    /// otherwise 0.
    pub buf: usize,
    /// Remote CQ data, valid when `flags` has `FI_REMOTE_CQ_DATA`.
    pub data: u64,
    /// The message's tag (tagged receives).
    pub tag: u64,
    /// Bytes that did not fit the receive buffer (truncation, `FI_ETRUNC`).
    pub olen: usize,
    /// The libfabric error number, positive (`FI_ETRUNC`, `FI_ECANCELED`, ...).
    pub err: i32,
    /// The provider's own error number; 0 when it has none.
    pub prov_errno: i32,
    /// Provider error data (a pointer in C); always 0 here.
    pub err_data: usize,
    /// Size of `err_data`, in bytes; always 0 here.
    pub err_data_size: usize,
}

/// A CQ entry format a queue can be read into. Sealed: only the four fi_eq.h layouts.
pub trait CqFormatEntry: Copy + Default + sealed::Sealed {
    /// The format this layout is.
    const FORMAT: CqFormat;
    /// Narrows a stored tagged entry to this format.
    fn from_tagged(e: &CqTaggedEntry) -> Self;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::CqEntry {}
    impl Sealed for super::CqMsgEntry {}
    impl Sealed for super::CqDataEntry {}
    impl Sealed for super::CqTaggedEntry {}
}

impl CqFormatEntry for CqEntry {
    const FORMAT: CqFormat = CqFormat::Context;
    fn from_tagged(e: &CqTaggedEntry) -> Self {
        CqEntry {
            op_context: e.op_context,
        }
    }
}

impl CqFormatEntry for CqMsgEntry {
    const FORMAT: CqFormat = CqFormat::Msg;
    fn from_tagged(e: &CqTaggedEntry) -> Self {
        CqMsgEntry {
            op_context: e.op_context,
            flags: e.flags,
            len: e.len,
        }
    }
}

impl CqFormatEntry for CqDataEntry {
    const FORMAT: CqFormat = CqFormat::Data;
    fn from_tagged(e: &CqTaggedEntry) -> Self {
        CqDataEntry {
            op_context: e.op_context,
            flags: e.flags,
            len: e.len,
            buf: e.buf,
            data: e.data,
        }
    }
}

impl CqFormatEntry for CqTaggedEntry {
    const FORMAT: CqFormat = CqFormat::Tagged;
    fn from_tagged(e: &CqTaggedEntry) -> Self {
        *e
    }
}

/// Size in bytes of one entry of `format` (`FI_CQ_FORMAT_UNSPEC` is the context format).
pub fn entry_size(format: CqFormat) -> usize {
    match format {
        CqFormat::Unspec | CqFormat::Context => std::mem::size_of::<CqEntry>(),
        CqFormat::Msg => std::mem::size_of::<CqMsgEntry>(),
        CqFormat::Data => std::mem::size_of::<CqDataEntry>(),
        CqFormat::Tagged => std::mem::size_of::<CqTaggedEntry>(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_lp64_c() {
        assert_eq!(size_of::<CqEntry>(), 8);
        assert_eq!(size_of::<CqMsgEntry>(), 24);
        assert_eq!(size_of::<CqDataEntry>(), 40);
        assert_eq!(size_of::<CqTaggedEntry>(), 48);
        assert_eq!(size_of::<CqErrEntry>(), 80);
        assert_eq!(offset_of!(CqErrEntry, err), 56);
        assert_eq!(offset_of!(CqErrEntry, err_data), 64);
    }
}
