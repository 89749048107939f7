//! What an XPU and the host both read and write for the device API: the handle head
//! (`struct fid_xpu`), the descriptor an XPU posts, the ring header, the exported CQ's entry
//! slot and the exported counter's mirror. One definition each, `repr(C)`, with its size and
//! offsets asserted at compile time, so that the CUDA header a later step writes can be
//! checked against these numbers (as `trigger::xpu_abi` is for `fi_trigger_var`).
//!
//! Every shared word is a 64-bit (or 32-bit) atomic in memory: the XPU stores plain words and
//! publishes with one release store; the host never trusts what it reads.

use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// `enum fi_xpu_provider` value of xfabric: `"xf"` in ASCII. Upstream's range starts at 1
/// (`FI_XPU_PROV_EFA`) and is meant to stay small and dense; 0x7866 is far outside it, so a
/// dispatch switch compiled against upstream's header never takes xfabric's handles for its
/// own.
pub const FI_XPU_PROV_XFABRIC: u32 = 0x7866;

/// `FI_CLASS_EP` of fabric.h: an exported endpoint's `fclass`.
pub const FI_CLASS_EP: u32 = 3;
/// `FI_CLASS_CQ`: an exported completion queue's `fclass`.
pub const FI_CLASS_CQ: u32 = 14;
/// `FI_CLASS_CNTR`: an exported counter's `fclass`.
pub const FI_CLASS_CNTR: u32 = 15;

/// `FI_XPU_WORK_ITEM`: the calling thread alone issues the operation.
pub const FI_XPU_WORK_ITEM: i32 = 0;
/// `FI_XPU_SUBGROUP`: every lane of the warp (subgroup) issues it together.
pub const FI_XPU_SUBGROUP: i32 = 1;
/// `FI_XPU_WORK_GROUP`: every thread of the block (work group) issues it together.
pub const FI_XPU_WORK_GROUP: i32 = 2;
/// `FI_XPU_DEVICE`: every thread of the device issues it together.
pub const FI_XPU_DEVICE: i32 = 3;

/// `struct fid_xpu`: the first member of every exported handle. `prov_ctx` is the address,
/// as the XPU sees it, of the object's shared block (a `RingHeader`, a `CqRingHeader`, a
/// `CntrMirror`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FidXpu {
    /// `FI_CLASS_EP`, `FI_CLASS_CQ` or `FI_CLASS_CNTR`.
    pub fclass: u32,
    /// `FI_XPU_PROV_XFABRIC`.
    pub prov_id: u32,
    /// The shared block's address.
    pub prov_ctx: u64,
}

/// Descriptor opcodes (`XpuDesc::opcode`). 0 is never valid: a zeroed slot is no operation.
pub mod opcode {
    /// `fi_xpu_send`.
    pub const SEND: u32 = 1;
    /// `fi_xpu_tsend`.
    pub const TSEND: u32 = 2;
    /// `fi_xpu_recv`.
    pub const RECV: u32 = 3;
    /// `fi_xpu_trecv`.
    pub const TRECV: u32 = 4;
    /// `fi_xpu_write` (with `FI_REMOTE_CQ_DATA`: the write carries `data`).
    pub const WRITE: u32 = 5;
    /// `fi_xpu_read`.
    pub const READ: u32 = 6;
    /// `fi_xpu_atomic`.
    pub const ATOMIC: u32 = 7;
    /// `fi_xpu_fetch_atomic`.
    pub const FETCH_ATOMIC: u32 = 8;
    /// `fi_xpu_compare_atomic`.
    pub const COMPARE_ATOMIC: u32 = 9;
    /// `fi_xpu_cntr_add` (an exported counter's ring only; `data` is the value).
    pub const CNTR_ADD: u32 = 32;
    /// `fi_xpu_cntr_set`.
    pub const CNTR_SET: u32 = 33;
    /// `fi_xpu_cntr_adderr`.
    pub const CNTR_ADDERR: u32 = 34;
    /// `fi_xpu_cntr_seterr`.
    pub const CNTR_SETERR: u32 = 35;
    /// A position a post claimed and then found its ring closed: published so that a close
    /// that counted it does not wait for it, and neither started nor reported (the post was
    /// answered `-FI_ESHUTDOWN`). Found by the watcher in an open ring (only a hostile XPU
    /// writes it there), it is refused as any unknown opcode.
    pub const WITHDRAWN: u32 = 63;
}

/// Words in one descriptor.
pub const DESC_WORDS: usize = 24;

/// One operation an XPU posts: 192 bytes (three cache lines), every field a plain integer.
///
/// The XPU writes every word but `seq`, `check` among them, then stores `seq` with a release
/// (system scope on a GPU). `seq` and `check` both carry the slot's position plus one (`check`
/// its low 32 bits): the host takes a slot only when `seq` is the position it waits for, and a
/// slot whose `check` disagrees with it is torn (its words are not all of one descriptor).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XpuDesc {
    /// The publishing word: position + 1, stored last with release.
    pub seq: u64,
    /// `opcode::*`.
    pub opcode: u32,
    /// `enum fi_op` of an atomic.
    pub op: i32,
    /// `enum fi_datatype` of an atomic.
    pub datatype: i32,
    /// Low 32 bits of position + 1, stored before `seq`.
    pub check: u32,
    /// Operation flags (`FI_COMPLETION`, `FI_REMOTE_CQ_DATA`, completion levels, `FI_FENCE`,
    /// `FI_MORE`); anything else is refused.
    pub flags: u64,
    /// Bytes of a message or RMA, elements of an atomic.
    pub len: u64,
    /// Local buffer (source of a send, write or atomic operand; destination of a receive or read).
    pub buf: u64,
    /// `buf`'s descriptor (`MemoryRegion::get_xpu_desc`).
    pub desc: u64,
    /// Peer (`AddressVector::get_xpu_addr`); `FI_ADDR_UNSPEC` for a receive from anyone.
    pub peer: u64,
    /// Completion context reported with the operation's entries.
    pub context: u64,
    /// Remote CQ data.
    pub data: u64,
    /// Tag of a tagged send or receive.
    pub tag: u64,
    /// Ignore mask of a tagged receive.
    pub ignore: u64,
    /// Remote address of an RMA or atomic.
    pub raddr: u64,
    /// Remote key of an RMA or atomic.
    pub rkey: u64,
    /// Compare values of a compare atomic.
    pub compare: u64,
    /// `compare`'s descriptor.
    pub compare_desc: u64,
    /// Where a fetching atomic's original values go.
    pub result: u64,
    /// `result`'s descriptor.
    pub result_desc: u64,
    /// Reserved for later fields (iov counts, a second local range); ignored now.
    pub reserved: [u64; 6],
}

const _: () = {
    assert!(size_of::<XpuDesc>() == DESC_WORDS * 8);
    assert!(offset_of!(XpuDesc, seq) == 0);
    assert!(offset_of!(XpuDesc, opcode) == 8);
    assert!(offset_of!(XpuDesc, op) == 12);
    assert!(offset_of!(XpuDesc, datatype) == 16);
    assert!(offset_of!(XpuDesc, check) == 20);
    assert!(offset_of!(XpuDesc, flags) == 24);
    assert!(offset_of!(XpuDesc, len) == 32);
    assert!(offset_of!(XpuDesc, buf) == 40);
    assert!(offset_of!(XpuDesc, desc) == 48);
    assert!(offset_of!(XpuDesc, peer) == 56);
    assert!(offset_of!(XpuDesc, context) == 64);
    assert!(offset_of!(XpuDesc, data) == 72);
    assert!(offset_of!(XpuDesc, tag) == 80);
    assert!(offset_of!(XpuDesc, ignore) == 88);
    assert!(offset_of!(XpuDesc, raddr) == 96);
    assert!(offset_of!(XpuDesc, rkey) == 104);
    assert!(offset_of!(XpuDesc, compare) == 112);
    assert!(offset_of!(XpuDesc, compare_desc) == 120);
    assert!(offset_of!(XpuDesc, result) == 128);
    assert!(offset_of!(XpuDesc, result_desc) == 136);
    assert!(offset_of!(XpuDesc, reserved) == 144);
};

impl XpuDesc {
    /// The descriptor as the words a slot holds.
    pub fn to_words(&self) -> [u64; DESC_WORDS] {
        // SAFETY: `XpuDesc` is `repr(C)`, exactly DESC_WORDS * 8 bytes of integers with no
        // padding (asserted above), 8-aligned like the array.
        unsafe { std::mem::transmute::<XpuDesc, [u64; DESC_WORDS]>(*self) }
    }

    /// The descriptor as its words, to fill in place (the watcher copies a slot straight in).
    pub fn words_mut(&mut self) -> &mut [u64; DESC_WORDS] {
        // SAFETY: as `to_words`: same size, no padding, the array's alignment (8) is at most
        // the struct's; every bit pattern is a valid value of every field.
        unsafe { &mut *(self as *mut XpuDesc).cast::<[u64; DESC_WORDS]>() }
    }

    /// The descriptor `words` hold (any bits are a descriptor; validation judges it).
    pub fn from_words(words: [u64; DESC_WORDS]) -> XpuDesc {
        // SAFETY: as `to_words`; every bit pattern is a valid value of every field.
        unsafe { std::mem::transmute::<[u64; DESC_WORDS], XpuDesc>(words) }
    }
}

/// One descriptor slot of a ring, as shared memory.
#[repr(C, align(64))]
pub struct DescSlot(pub [AtomicU64; DESC_WORDS]);

const _: () = assert!(size_of::<DescSlot>() == 192);

impl DescSlot {
    /// The `opcode` its words hold now: the first four bytes of word 1 (`XpuDesc`'s offset 8).
    pub fn opcode(&self) -> u32 {
        let w = self.0[1].load(Ordering::Relaxed).to_ne_bytes();
        u32::from_ne_bytes([w[0], w[1], w[2], w[3]])
    }
}

/// Value of `RingHeader::magic`.
pub const RING_MAGIC: u32 = 0x5846_5852; // "XFXR"
/// Value of `CqRingHeader::magic`.
pub const CQ_RING_MAGIC: u32 = 0x5846_5143; // "XFQC"
/// Value of `CntrMirror::magic`.
pub const CNTR_MAGIC: u32 = 0x5846_4e43; // "XFCN"
/// Layout version of every shared block here.
pub const ABI_VERSION: u32 = 3;

/// `RingHeader::state`: the ring takes descriptors.
pub const RING_OPEN: u32 = 0;
/// `RingHeader::state`: its endpoint (or counter) closed; device calls answer `-FI_ESHUTDOWN`.
pub const RING_CLOSED: u32 = 1;

/// The shared block of a descriptor ring (an exported endpoint's `prov_ctx` points here; an
/// exported counter's `CntrMirror::ring` does). Producers, many XPU threads, reserve room
/// (`claimed`, a fetch-and-add given back when it reaches `head` + slots), claim a position
/// with a fetch-and-add on `tail`, write the slot at position & `mask` and publish it. The
/// host, the one consumer, copies a published slot out and advances `head`, which frees it.
/// No word is read-modify-written by both sides: a GPU's atomics on mapped host memory are
/// not atomic against the host's where the link has no native host atomics (PCIe).
#[repr(C, align(64))]
pub struct RingHeader {
    /// `RING_MAGIC`.
    pub magic: u32,
    /// `ABI_VERSION`.
    pub version: u32,
    /// Address of slot 0 as the XPU sees it.
    pub slots: u64,
    /// Slots - 1 (slots is a power of two).
    pub mask: u64,
    /// `RING_OPEN` or `RING_CLOSED`.
    pub state: AtomicU32,
    _pad0: [u8; 36],
    /// Next position to claim (producers).
    pub tail: AtomicU64,
    _pad1: [u8; 56],
    /// Reservations taken (producers only: fetch-and-add; the host never writes it). A
    /// producer holding value `c` has room while `c - head` < slots.
    pub claimed: AtomicU64,
    _pad2: [u8; 56],
    /// Next position the host takes (written by the host only).
    pub head: AtomicU64,
    _pad3: [u8; 56],
}

const _: () = {
    assert!(size_of::<RingHeader>() == 256);
    assert!(offset_of!(RingHeader, slots) == 8);
    assert!(offset_of!(RingHeader, mask) == 16);
    assert!(offset_of!(RingHeader, state) == 24);
    assert!(offset_of!(RingHeader, tail) == 64);
    assert!(offset_of!(RingHeader, claimed) == 128);
    assert!(offset_of!(RingHeader, head) == 192);
};

impl RingHeader {
    pub(crate) fn new(slots: u64, capacity: u64) -> RingHeader {
        RingHeader {
            magic: RING_MAGIC,
            version: ABI_VERSION,
            slots,
            mask: capacity - 1,
            state: AtomicU32::new(RING_OPEN),
            _pad0: [0; 36],
            tail: AtomicU64::new(0),
            _pad1: [0; 56],
            claimed: AtomicU64::new(0),
            _pad2: [0; 56],
            head: AtomicU64::new(0),
            _pad3: [0; 56],
        }
    }
}

/// Words in one exported-CQ slot.
pub const CQ_WORDS: usize = 16;

/// `XpuCqEntry::kind`: a success entry.
pub const CQ_KIND_OK: u32 = 0;
/// `XpuCqEntry::kind`: an error entry (`fi_xpu_cq_readerr` takes it).
pub const CQ_KIND_ERR: u32 = 1;

/// One completion as an exported CQ's ring holds it: 128 bytes, the host's tagged entry, its
/// source and, for an error, the error fields. `seq` (position + 1) is written last, with
/// release.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XpuCqEntry {
    /// Position + 1, stored last.
    pub seq: u64,
    /// `CQ_KIND_OK` or `CQ_KIND_ERR`.
    pub kind: u32,
    /// `err` of an error entry (positive errno).
    pub err: i32,
    /// `op_context`.
    pub op_context: u64,
    /// `flags`.
    pub flags: u64,
    /// `len`.
    pub len: u64,
    /// `buf`.
    pub buf: u64,
    /// `data`.
    pub data: u64,
    /// `tag`.
    pub tag: u64,
    /// The source address (`fi_cq_readfrom`), `FI_ADDR_NOTAVAIL` when unknown.
    pub src: u64,
    /// `olen` of an error entry.
    pub olen: u64,
    /// `prov_errno` of an error entry.
    pub prov_errno: i32,
    /// Zero.
    pub pad: u32,
    /// Reserved.
    pub reserved: [u64; 5],
}

const _: () = {
    assert!(size_of::<XpuCqEntry>() == CQ_WORDS * 8);
    assert!(offset_of!(XpuCqEntry, kind) == 8);
    assert!(offset_of!(XpuCqEntry, err) == 12);
    assert!(offset_of!(XpuCqEntry, op_context) == 16);
    assert!(offset_of!(XpuCqEntry, flags) == 24);
    assert!(offset_of!(XpuCqEntry, len) == 32);
    assert!(offset_of!(XpuCqEntry, buf) == 40);
    assert!(offset_of!(XpuCqEntry, data) == 48);
    assert!(offset_of!(XpuCqEntry, tag) == 56);
    assert!(offset_of!(XpuCqEntry, src) == 64);
    assert!(offset_of!(XpuCqEntry, olen) == 72);
    assert!(offset_of!(XpuCqEntry, prov_errno) == 80);
};

impl XpuCqEntry {
    /// The entry as slot words.
    pub fn to_words(&self) -> [u64; CQ_WORDS] {
        // SAFETY: `repr(C)`, CQ_WORDS * 8 bytes of integers, no padding (asserted above).
        unsafe { std::mem::transmute::<XpuCqEntry, [u64; CQ_WORDS]>(*self) }
    }

    /// The entry `words` hold.
    pub fn from_words(words: [u64; CQ_WORDS]) -> XpuCqEntry {
        // SAFETY: as `to_words`; every bit pattern is valid.
        unsafe { std::mem::transmute::<[u64; CQ_WORDS], XpuCqEntry>(words) }
    }
}

/// One exported-CQ slot, as shared memory.
#[repr(C, align(64))]
pub struct CqSlot(pub [AtomicU64; CQ_WORDS]);

/// The shared block of an exported CQ (its `prov_ctx` points here). The host writes slots at
/// `tail` while fewer than `mask + 1` are unread, each published by its `seq`; XPU threads
/// copy published slots from `head` and advance it with a compare-and-swap.
#[repr(C, align(64))]
pub struct CqRingHeader {
    /// `CQ_RING_MAGIC`.
    pub magic: u32,
    /// `ABI_VERSION`.
    pub version: u32,
    /// Address of slot 0 as the XPU sees it.
    pub slots: u64,
    /// Slots - 1 (a power of two less one).
    pub mask: u64,
    /// The queue's `enum fi_cq_format`: what a device's `fi_xpu_cq_read` writes (its header
    /// cannot know the format otherwise; C device code reads it, the host never does).
    pub format: u32,
    /// 1 once the queue overran (under `FI_RM_DISABLED`, completions past the queue's size
    /// and the ring's were dropped): written by the host after the last entry from before
    /// the overrun, so a read that finds it set and then no entry has taken them all
    /// (`fi_xpu_cq_read` then answers `-FI_EOVERRUN`, as `fi_cq_read` does).
    pub overrun: AtomicU32,
    _pad0: [u8; 32],
    /// Next position the host writes (host only).
    pub tail: AtomicU64,
    _pad1: [u8; 56],
    /// Next position an XPU reads (XPU threads, compare-and-swap).
    pub head: AtomicU64,
    _pad2: [u8; 56],
}

const _: () = {
    assert!(size_of::<CqRingHeader>() == 192);
    assert!(offset_of!(CqRingHeader, slots) == 8);
    assert!(offset_of!(CqRingHeader, mask) == 16);
    assert!(offset_of!(CqRingHeader, format) == 24);
    assert!(offset_of!(CqRingHeader, overrun) == 28);
    assert!(offset_of!(CqRingHeader, tail) == 64);
    assert!(offset_of!(CqRingHeader, head) == 128);
};

impl CqRingHeader {
    pub(crate) fn new(slots: u64, capacity: u64, format: u32) -> CqRingHeader {
        CqRingHeader {
            magic: CQ_RING_MAGIC,
            version: ABI_VERSION,
            slots,
            mask: capacity - 1,
            format,
            overrun: AtomicU32::new(0),
            _pad0: [0; 32],
            tail: AtomicU64::new(0),
            _pad1: [0; 56],
            head: AtomicU64::new(0),
            _pad2: [0; 56],
        }
    }
}

/// The shared block of an exported counter (its `prov_ctx` points here): the success and
/// error values as the host last changed them (mirrored on every change, so an XPU waits on
/// its own reads), and the ring through which the XPU adds and sets.
#[repr(C, align(64))]
pub struct CntrMirror {
    /// The success value.
    pub value: AtomicU64,
    /// The error value.
    pub err: AtomicU64,
    /// `CNTR_MAGIC`.
    pub magic: u32,
    /// `ABI_VERSION`.
    pub version: u32,
    /// Address of the counter's `RingHeader` as the XPU sees it.
    pub ring: u64,
    _pad: [u8; 32],
}

const _: () = {
    assert!(size_of::<CntrMirror>() == 64);
    assert!(offset_of!(CntrMirror, value) == 0);
    assert!(offset_of!(CntrMirror, err) == 8);
    assert!(offset_of!(CntrMirror, magic) == 16);
    assert!(offset_of!(CntrMirror, ring) == 24);
};

impl CntrMirror {
    pub(crate) fn new(ring: u64) -> CntrMirror {
        CntrMirror {
            value: AtomicU64::new(0),
            err: AtomicU64::new(0),
            magic: CNTR_MAGIC,
            version: ABI_VERSION,
            ring,
            _pad: [0; 32],
        }
    }
}
