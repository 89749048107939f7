//! The engine's wire format: every frame one peer sends another, as one enum with one encoder
//! and one decoder. Used as is by byte-stream transports (tcp); a transport with its own
//! framing carries the same bytes in its messages.
//!
//! A frame is a fixed 16-byte [`Prefix`], a control part of `ctrl_len` bytes (the kind's
//! fixed header, then for RMA kinds the remote ranges), and a body of `body_len` bytes (the
//! payload: message data, written or read bytes, atomic operands or results). Control parts
//! are small and always buffered whole ([`MAX_CTRL`]); bodies may be large and go straight to
//! their destination (a posted receive, registered memory), so the decoder sees only the
//! prefix and the control part.
//!
//! Everything a peer sends is untrusted: [`decode`] answers a frame or a [`WireError`] for
//! any bytes, never panics, and checks every count and length it reads.

use bytemuck::{Pod, Zeroable};

use crate::ep::rma::{RmaIov, RmaIovList};
use crate::rxq::IOV_LIMIT;

use super::desc::{Desc, MAX_DESC};
use super::inline::Inline;

/// First two bytes of every frame ("XF").
pub const MAGIC: u16 = 0x4658;
/// Largest control part a peer may announce: the biggest kind (a write with `IOV_LIMIT`
/// ranges) is far below it, so anything larger is garbage.
pub const MAX_CTRL: usize = 1024;

/// The fixed start of every frame.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Prefix {
    /// [`MAGIC`].
    pub magic: u16,
    /// What the frame is (`Kind`).
    pub kind: u8,
    /// Per-kind flags ([`flags`]).
    pub flags: u8,
    /// Bytes of control part after the prefix.
    pub ctrl_len: u32,
    /// Bytes of body after the control part.
    pub body_len: u64,
}

/// Size of [`Prefix`] on the wire.
pub const PREFIX: usize = std::mem::size_of::<Prefix>();

/// Longest prefix and control part this engine encodes: a write or read with every range
/// and a full descriptor.
pub const MAX_ENCODED: usize =
    PREFIX + std::mem::size_of::<RmaHdr>() + IOV_LIMIT * std::mem::size_of::<WireIov>() + MAX_DESC;
const _: () = assert!(
    PREFIX + std::mem::size_of::<RtsHdr>() + MAX_DESC <= MAX_ENCODED && MAX_ENCODED <= MAX_CTRL
);

/// Bytes of a `Msg` frame's prefix and control part (`Frame::msg_ctrl`).
pub const MSG_CTRL: usize = PREFIX + std::mem::size_of::<MsgHdr>();

/// Encoded prefixes and control parts up to this many bytes are kept inline in a [`Ctrl`]:
/// every frame of a message (an Rts with a one-segment descriptor included), every answer,
/// an atomic, a one-range write or read.
pub const SMALL_CTRL: usize = 64;

/// An encoded prefix and control part: inline up to [`SMALL_CTRL`] bytes, boxed past it
/// (multi-range RMA, long descriptors). Every frame the engine queues moves a few times on
/// its way to the transport, so the common ones stay small instead of all carrying room for
/// the largest.
#[derive(Clone, PartialEq, Eq)]
pub enum Ctrl {
    /// Up to `SMALL_CTRL` bytes.
    Small(Inline<SMALL_CTRL>),
    /// Up to `MAX_ENCODED` bytes.
    Large(Box<Inline<MAX_ENCODED>>),
}

impl Ctrl {
    /// Its bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self
    }
}

impl std::ops::Deref for Ctrl {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        match self {
            Ctrl::Small(b) => b,
            Ctrl::Large(b) => b,
        }
    }
}

impl std::ops::DerefMut for Ctrl {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Ctrl::Small(b) => b,
            Ctrl::Large(b) => b,
        }
    }
}

impl std::fmt::Debug for Ctrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:02x?}", &self[..])
    }
}

/// Frame flag bits (`Prefix::flags`).
pub mod flags {
    /// A tagged message.
    pub const TAGGED: u8 = 1;
    /// Remote CQ data rides along (`Msg::data`, `Write::data`).
    pub const CQ_DATA: u8 = 2;
    /// The initiator wants an `Ack` once the target has delivered (or, for a message,
    /// matched, with `ACK_MATCH`).
    pub const ACK: u8 = 4;
    /// With `ACK` on a message: acknowledge on match rather than on delivery.
    pub const ACK_MATCH: u8 = 8;
    /// A write the target makes durable before it acknowledges (`FI_COMMIT_COMPLETE`).
    pub const COMMIT: u8 = 16;
    /// An atomic whose original values go back (`AtomicResp` with a body).
    pub const FETCH: u8 = 32;
}

/// Kind codes (`Prefix::kind`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A message (`Frame::Msg`).
    Msg = 1,
    /// An acknowledgement (`Frame::Ack`).
    Ack = 2,
    /// An RMA write (`Frame::Write`).
    Write = 3,
    /// An RMA read request (`Frame::Read`).
    Read = 4,
    /// The data of a read (`Frame::ReadResp`).
    ReadResp = 5,
    /// An atomic request (`Frame::Atomic`).
    Atomic = 6,
    /// An atomic's answer (`Frame::AtomicResp`).
    AtomicResp = 7,
    /// A large message's announcement (`Frame::Rts`).
    Rts = 8,
    /// The receiver's go-ahead for a large message (`Frame::Cts`).
    Cts = 9,
    /// A large message's data (`Frame::Data`).
    Data = 10,
}

impl Kind {
    /// Whether frames of this kind answer a request of the receiver's, or carry data it
    /// asked for (`Ack`, `Cts`, `Data`, `ReadResp`, `AtomicResp`): never held back for
    /// ordering. A transport that keeps a frame the engine answered `Sink::Wait` must still
    /// hand over frames of these kinds that come after it from the same peer, when its
    /// engine copies one-sidedly (a write it serves may wait for its `Data`).
    pub fn is_answer(self) -> bool {
        matches!(
            self,
            Kind::Ack | Kind::Cts | Kind::Data | Kind::ReadResp | Kind::AtomicResp
        )
    }

    /// The kind a prefix's `kind` byte names, if any.
    pub fn from_raw(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Msg,
            2 => Kind::Ack,
            3 => Kind::Write,
            4 => Kind::Read,
            5 => Kind::ReadResp,
            6 => Kind::Atomic,
            7 => Kind::AtomicResp,
            8 => Kind::Rts,
            9 => Kind::Cts,
            10 => Kind::Data,
            _ => return None,
        })
    }
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct MsgHdr {
    id: u32,
    _pad: u32,
    tag: u64,
    data: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct RtsHdr {
    id: u32,
    _pad: u32,
    tag: u64,
    data: u64,
    len: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct CtsHdr {
    id: u32,
    rx: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct StatusHdr {
    id: u32,
    status: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct RmaHdr {
    id: u32,
    nsegs: u32,
    data: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct WireIov {
    addr: u64,
    len: u64,
    key: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct AtomicHdr {
    id: u32,
    count: u32,
    addr: u64,
    key: u64,
    op: u32,
    datatype: u32,
}

/// One frame's prefix and control part, decoded. The body (`Prefix::body_len` bytes) is the
/// transport's to move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// A message: the body is its data.
    Msg {
        /// The initiator's request id (meaningful with `flags::ACK`).
        id: u32,
        /// Tag (`flags::TAGGED`).
        tag: u64,
        /// Remote CQ data (`flags::CQ_DATA`).
        data: u64,
        /// `flags::*` bits.
        flags: u8,
    },
    /// The target finished request `id` with `status` (0 or a positive errno).
    Ack {
        /// The initiator's request id.
        id: u32,
        /// 0, or the errno the request failed with at the target.
        status: i32,
    },
    /// An RMA write of the body into `segs` of the target's registered memory; or, with
    /// no body and a descriptor of the initiator's memory, of the bytes the target's
    /// transport copies from there (or asks for with `Cts` when it cannot).
    Write {
        /// The initiator's request id.
        id: u32,
        /// Remote CQ data (`flags::CQ_DATA`).
        data: u64,
        /// `flags::*` bits.
        flags: u8,
        /// Where the body goes at the target.
        segs: RmaIovList,
        /// Where the target's transport may copy the data from; empty: the body is the data.
        desc: Desc,
    },
    /// A request for the bytes of `segs` (no body).
    Read {
        /// The initiator's request id.
        id: u32,
        /// What to read.
        segs: RmaIovList,
        /// Where the target's transport may copy the bytes to one-sidedly (answering with
        /// an empty `ReadResp`); empty: they come back as `ReadResp`'s body.
        desc: Desc,
    },
    /// The bytes of read `id` (the body), or its failure (`status`, no body).
    ReadResp {
        /// The initiator's request id.
        id: u32,
        /// 0, or the errno the read failed with.
        status: i32,
    },
    /// An atomic on `count` elements at (`addr`, `key`); the body is the operand, then the
    /// compare values for compare ops.
    Atomic {
        /// The initiator's request id.
        id: u32,
        /// `enum fi_op`, raw (checked by the target).
        op: u32,
        /// `enum fi_datatype`, raw (checked by the target).
        datatype: u32,
        /// Elements.
        count: u32,
        /// Target address (or offset).
        addr: u64,
        /// The region's key.
        key: u64,
        /// `flags::*` bits.
        flags: u8,
    },
    /// The answer to atomic `id`: the original values (the body) for a fetch, or a status.
    AtomicResp {
        /// The initiator's request id.
        id: u32,
        /// 0, or the errno the atomic failed with.
        status: i32,
    },
    /// A message of `len` bytes whose data waits at the sender until the receiver matches
    /// it and answers `Cts`, or, with a descriptor of the sender's memory, copies it from
    /// there and answers `Ack` (no body).
    Rts {
        /// The sender's request id.
        id: u32,
        /// Tag (`flags::TAGGED`).
        tag: u64,
        /// Remote CQ data (`flags::CQ_DATA`).
        data: u64,
        /// The message's length.
        len: u64,
        /// `flags::*` bits.
        flags: u8,
        /// Where the receiver's transport may copy the data from one-sidedly; empty: only
        /// through `Cts` and `Data`.
        desc: Desc,
    },
    /// The receiver matched the sender's request `id` as its transfer `rx`: send the data
    /// (or, with `len` 0 from a discarding receive, nothing but complete).
    Cts {
        /// The sender's request id.
        id: u32,
        /// The receiver's transfer id, echoed in `Data`.
        rx: u32,
    },
    /// The data of a large message (the body) for the receiver's transfer `rx`.
    Data {
        /// The receiver's transfer id.
        rx: u32,
    },
}

/// Why bytes are not a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than a prefix.
    #[error("frame shorter than its {PREFIX}-byte prefix")]
    Short,
    /// The prefix does not start with [`MAGIC`].
    #[error("bad magic {0:#06x} (not an xfabric frame)")]
    Magic(u16),
    /// An unknown kind code.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// The control part is longer than [`MAX_CTRL`] or than what was given.
    #[error("control part of {0} bytes is too long or truncated")]
    CtrlLen(u32),
    /// The control part does not fit its kind (wrong size, too many ranges).
    #[error("malformed {0:?} frame")]
    Malformed(Kind),
    /// A kind that carries no body announced one.
    #[error("{0:?} frame carries a body of {1} bytes")]
    Body(Kind, u64),
    /// A frame began while the body of the peer's previous one was still arriving: one peer's
    /// frames come one after the other, never interleaved.
    #[error("a frame began inside the body of the peer's previous frame")]
    Interleaved,
    /// A remote access from a peer past its allowance of refused keys (a peer guessing
    /// keys).
    #[error("{0:?} frame from a peer whose keys were refused past its allowance")]
    Refused(Kind),
}

/// Reads the prefix from the start of `bytes` and checks it (magic, kind, control length).
#[inline]
pub fn prefix(bytes: &[u8]) -> Result<Prefix, WireError> {
    let raw = bytes.get(..PREFIX).ok_or(WireError::Short)?;
    let p: Prefix = bytemuck::pod_read_unaligned(raw);
    if p.magic != MAGIC {
        return Err(WireError::Magic(p.magic));
    }
    Kind::from_raw(p.kind).ok_or(WireError::Kind(p.kind))?;
    if p.ctrl_len as usize > MAX_CTRL {
        return Err(WireError::CtrlLen(p.ctrl_len));
    }
    Ok(p)
}

fn fixed<T: Pod>(ctrl: &[u8], kind: Kind, extra: usize) -> Result<T, WireError> {
    let n = std::mem::size_of::<T>();
    if ctrl.len() != n + extra {
        return Err(WireError::Malformed(kind));
    }
    Ok(bytemuck::pod_read_unaligned(&ctrl[..n]))
}

fn ranges(ctrl: &[u8], n: u32, kind: Kind) -> Result<RmaIovList, WireError> {
    let n = n as usize;
    if n > IOV_LIMIT || ctrl.len() != n * std::mem::size_of::<WireIov>() {
        return Err(WireError::Malformed(kind));
    }
    let mut segs = [RmaIov::default(); IOV_LIMIT];
    for (s, raw) in segs
        .iter_mut()
        .zip(ctrl.chunks_exact(std::mem::size_of::<WireIov>()))
    {
        let w: WireIov = bytemuck::pod_read_unaligned(raw);
        *s = RmaIov {
            addr: w.addr,
            len: usize::try_from(w.len).map_err(|_| WireError::Malformed(kind))?,
            key: w.key,
        };
    }
    RmaIovList::from_segs(&segs[..n]).ok_or(WireError::Malformed(kind))
}

/// `decode` of a frame whose prefix names a `Msg` (the commonest frame, decoded on its own
/// short path).
#[inline]
pub fn decode_msg(p: &Prefix, ctrl: &[u8]) -> Result<Frame, WireError> {
    if ctrl.len() != p.ctrl_len as usize {
        return Err(WireError::CtrlLen(p.ctrl_len));
    }
    let h: MsgHdr = fixed(ctrl, Kind::Msg, 0)?;
    Ok(Frame::Msg {
        id: h.id,
        tag: h.tag,
        data: h.data,
        flags: p.flags,
    })
}

/// Decodes a frame from its prefix and exactly its control part (`p.ctrl_len` bytes).
pub fn decode(p: &Prefix, ctrl: &[u8]) -> Result<Frame, WireError> {
    let kind = Kind::from_raw(p.kind).ok_or(WireError::Kind(p.kind))?;
    if ctrl.len() != p.ctrl_len as usize || ctrl.len() > MAX_CTRL {
        return Err(WireError::CtrlLen(p.ctrl_len));
    }
    let no_body = |f: Frame| {
        if p.body_len == 0 {
            Ok(f)
        } else {
            Err(WireError::Body(kind, p.body_len))
        }
    };
    match kind {
        Kind::Msg => decode_msg(p, ctrl),
        Kind::Ack => {
            let h: StatusHdr = fixed(ctrl, kind, 0)?;
            no_body(Frame::Ack {
                id: h.id,
                status: h.status,
            })
        }
        Kind::Write | Kind::Read => {
            let n = std::mem::size_of::<RmaHdr>();
            if ctrl.len() < n {
                return Err(WireError::Malformed(kind));
            }
            let h: RmaHdr = bytemuck::pod_read_unaligned(&ctrl[..n]);
            if h.nsegs as usize > IOV_LIMIT {
                return Err(WireError::Malformed(kind));
            }
            let end = n + h.nsegs as usize * std::mem::size_of::<WireIov>();
            let raw = ctrl.get(n..end).ok_or(WireError::Malformed(kind))?;
            let segs = ranges(raw, h.nsegs, kind)?;
            let desc = Desc::new(&ctrl[end..]).ok_or(WireError::Malformed(kind))?;
            if kind == Kind::Write {
                Ok(Frame::Write {
                    id: h.id,
                    data: h.data,
                    flags: p.flags,
                    segs,
                    desc,
                })
            } else {
                no_body(Frame::Read {
                    id: h.id,
                    segs,
                    desc,
                })
            }
        }
        Kind::ReadResp => {
            let h: StatusHdr = fixed(ctrl, kind, 0)?;
            Ok(Frame::ReadResp {
                id: h.id,
                status: h.status,
            })
        }
        Kind::Atomic => {
            let h: AtomicHdr = fixed(ctrl, kind, 0)?;
            Ok(Frame::Atomic {
                id: h.id,
                op: h.op,
                datatype: h.datatype,
                count: h.count,
                addr: h.addr,
                key: h.key,
                flags: p.flags,
            })
        }
        Kind::AtomicResp => {
            let h: StatusHdr = fixed(ctrl, kind, 0)?;
            Ok(Frame::AtomicResp {
                id: h.id,
                status: h.status,
            })
        }
        Kind::Rts => {
            let n = std::mem::size_of::<RtsHdr>();
            let extra = ctrl.len().saturating_sub(n);
            let h: RtsHdr = fixed(ctrl, kind, extra)?;
            let desc = Desc::new(&ctrl[n..]).ok_or(WireError::Malformed(kind))?;
            no_body(Frame::Rts {
                id: h.id,
                tag: h.tag,
                data: h.data,
                len: h.len,
                flags: p.flags,
                desc,
            })
        }
        Kind::Cts => {
            let h: CtsHdr = fixed(ctrl, kind, 0)?;
            no_body(Frame::Cts { id: h.id, rx: h.rx })
        }
        Kind::Data => {
            let h: CtsHdr = fixed(ctrl, kind, 0)?;
            Ok(Frame::Data { rx: h.rx })
        }
    }
}

/// Decodes a whole frame held in `bytes` (prefix, control part, body): the frame and its
/// body. For transports that carry a frame in one message, and for tests.
pub fn decode_all(bytes: &[u8]) -> Result<(Frame, &[u8]), WireError> {
    let p = prefix(bytes)?;
    let ctrl_end = PREFIX + p.ctrl_len as usize;
    let ctrl = bytes
        .get(PREFIX..ctrl_end)
        .ok_or(WireError::CtrlLen(p.ctrl_len))?;
    let f = decode(&p, ctrl)?;
    let body = &bytes[ctrl_end..];
    if body.len() as u64 != p.body_len {
        return Err(WireError::Body(
            Kind::from_raw(p.kind).unwrap_or(Kind::Msg),
            p.body_len,
        ));
    }
    Ok((f, body))
}

impl Frame {
    /// The frame's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Frame::Msg { .. } => Kind::Msg,
            Frame::Ack { .. } => Kind::Ack,
            Frame::Write { .. } => Kind::Write,
            Frame::Read { .. } => Kind::Read,
            Frame::ReadResp { .. } => Kind::ReadResp,
            Frame::Atomic { .. } => Kind::Atomic,
            Frame::AtomicResp { .. } => Kind::AtomicResp,
            Frame::Rts { .. } => Kind::Rts,
            Frame::Cts { .. } => Kind::Cts,
            Frame::Data { .. } => Kind::Data,
        }
    }

    /// A `Msg` frame's prefix and control part, announcing a body of `body_len` bytes, as
    /// `ctrl` encodes them (which it does with this), built in place: a transport writes a
    /// small message's frame straight into its own memory with no `Ctrl` in between.
    #[inline]
    pub fn msg_ctrl(id: u32, tag: u64, data: u64, flags: u8, body_len: u64) -> [u8; MSG_CTRL] {
        let p = Prefix {
            magic: MAGIC,
            kind: Kind::Msg as u8,
            flags,
            ctrl_len: std::mem::size_of::<MsgHdr>() as u32,
            body_len,
        };
        let h = MsgHdr {
            id,
            _pad: 0,
            tag,
            data,
        };
        let mut out = [0u8; MSG_CTRL];
        out[..PREFIX].copy_from_slice(bytemuck::bytes_of(&p));
        out[PREFIX..].copy_from_slice(bytemuck::bytes_of(&h));
        out
    }

    /// The prefix and control part of this frame, announcing a body of `body_len` bytes.
    // Inlined where the frame is built, its kind known: the matches fold away.
    #[inline]
    pub fn ctrl(&self, body_len: u64) -> Ctrl {
        if PREFIX + self.ctrl_len() <= SMALL_CTRL {
            let mut out = Inline::default();
            self.fill(&mut out, body_len);
            Ctrl::Small(out)
        } else {
            let mut out = Box::<Inline<MAX_ENCODED>>::default();
            self.fill(&mut out, body_len);
            Ctrl::Large(out)
        }
    }

    /// The length of its control part (after the prefix).
    #[inline]
    fn ctrl_len(&self) -> usize {
        use std::mem::size_of;
        match self {
            Frame::Msg { .. } => size_of::<MsgHdr>(),
            Frame::Ack { .. } | Frame::ReadResp { .. } | Frame::AtomicResp { .. } => {
                size_of::<StatusHdr>()
            }
            Frame::Write { segs, desc, .. } | Frame::Read { segs, desc, .. } => {
                size_of::<RmaHdr>() + segs.segs().len() * size_of::<WireIov>() + desc.len()
            }
            Frame::Atomic { .. } => size_of::<AtomicHdr>(),
            Frame::Rts { desc, .. } => size_of::<RtsHdr>() + desc.len(),
            Frame::Cts { .. } | Frame::Data { .. } => size_of::<CtsHdr>(),
        }
    }

    /// Encodes the prefix and control part into `out` (empty, with room for them).
    #[inline]
    fn fill<const N: usize>(&self, out: &mut Inline<N>, body_len: u64) {
        if let Frame::Msg {
            id,
            tag,
            data,
            flags,
        } = *self
        {
            out.push(&Frame::msg_ctrl(id, tag, data, flags, body_len));
            return;
        }
        // Every push below fits: `ctrl` chose `N` from `ctrl_len`, and `MAX_ENCODED` bounds
        // the largest kind.
        out.push(bytemuck::bytes_of(&Prefix::default()));
        let fl = match *self {
            // Encoded whole above.
            Frame::Msg { .. } => return,
            Frame::Ack { id, status }
            | Frame::ReadResp { id, status }
            | Frame::AtomicResp { id, status } => {
                out.push(bytemuck::bytes_of(&StatusHdr { id, status }));
                0
            }
            Frame::Write {
                id,
                data,
                flags,
                ref segs,
                ref desc,
            } => {
                put_rma(out, id, data, segs);
                out.push(desc);
                flags
            }
            Frame::Read {
                id,
                ref segs,
                ref desc,
            } => {
                put_rma(out, id, 0, segs);
                out.push(desc);
                0
            }
            Frame::Atomic {
                id,
                op,
                datatype,
                count,
                addr,
                key,
                flags,
            } => {
                out.push(bytemuck::bytes_of(&AtomicHdr {
                    id,
                    count,
                    addr,
                    key,
                    op,
                    datatype,
                }));
                flags
            }
            Frame::Rts {
                id,
                tag,
                data,
                len,
                flags,
                ref desc,
            } => {
                out.push(bytemuck::bytes_of(&RtsHdr {
                    id,
                    _pad: 0,
                    tag,
                    data,
                    len,
                }));
                out.push(desc.as_bytes());
                flags
            }
            Frame::Cts { id, rx } => {
                out.push(bytemuck::bytes_of(&CtsHdr { id, rx }));
                0
            }
            Frame::Data { rx } => {
                out.push(bytemuck::bytes_of(&CtsHdr { id: 0, rx }));
                0
            }
        };
        let p = Prefix {
            magic: MAGIC,
            kind: self.kind() as u8,
            flags: fl,
            ctrl_len: (out.len() - PREFIX) as u32,
            body_len,
        };
        debug_assert_eq!(out.len(), PREFIX + self.ctrl_len());
        out[..PREFIX].copy_from_slice(bytemuck::bytes_of(&p));
    }

    /// `ctrl`, appended to `out`.
    pub fn encode(&self, body_len: u64, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.ctrl(body_len));
    }

    /// `ctrl` in a fresh vector.
    pub fn to_vec(&self, body_len: u64) -> Vec<u8> {
        self.ctrl(body_len).to_vec()
    }
}

fn put_rma<const N: usize>(out: &mut Inline<N>, id: u32, data: u64, segs: &RmaIovList) {
    out.push(bytemuck::bytes_of(&RmaHdr {
        id,
        nsegs: segs.segs().len() as u32,
        data,
    }));
    for s in segs.segs() {
        out.push(bytemuck::bytes_of(&WireIov {
            addr: s.addr,
            len: s.len as u64,
            key: s.key,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn segs(n: usize) -> RmaIovList {
        let v: Vec<RmaIov> = (0..n)
            .map(|i| RmaIov {
                addr: 0x1000 * i as u64,
                len: 8 + i,
                key: 77 + i as u64,
            })
            .collect();
        RmaIovList::from_segs(&v).unwrap()
    }

    fn every_kind() -> Vec<(Frame, u64)> {
        vec![
            (
                Frame::Msg {
                    id: 7,
                    tag: u64::MAX,
                    data: 3,
                    flags: flags::TAGGED | flags::CQ_DATA | flags::ACK,
                },
                4096,
            ),
            (Frame::Ack { id: 9, status: 13 }, 0),
            (
                Frame::Write {
                    id: 1,
                    data: 5,
                    flags: flags::COMMIT,
                    segs: segs(IOV_LIMIT),
                    desc: Desc::default(),
                },
                100,
            ),
            (
                Frame::Write {
                    id: 1,
                    data: 5,
                    flags: 0,
                    segs: segs(IOV_LIMIT),
                    desc: Desc::new(&[3; MAX_DESC]).unwrap(),
                },
                0,
            ),
            (
                Frame::Read {
                    id: 2,
                    segs: segs(1),
                    desc: Desc::new(&[1; 16]).unwrap(),
                },
                0,
            ),
            (Frame::ReadResp { id: 2, status: 0 }, 9),
            (
                Frame::Atomic {
                    id: 3,
                    op: 1,
                    datatype: 9,
                    count: 4,
                    addr: 0xdead,
                    key: 1,
                    flags: flags::FETCH,
                },
                32,
            ),
            (Frame::AtomicResp { id: 3, status: 0 }, 32),
            (
                Frame::Rts {
                    id: 4,
                    tag: 1,
                    data: 2,
                    len: 1 << 40,
                    flags: flags::TAGGED,
                    desc: Desc::default(),
                },
                0,
            ),
            (
                Frame::Rts {
                    id: 5,
                    tag: 0,
                    data: 0,
                    len: 1 << 20,
                    flags: 0,
                    desc: Desc::new(&[7; MAX_DESC]).unwrap(),
                },
                0,
            ),
            (Frame::Cts { id: 4, rx: 8 }, 0),
            (Frame::Data { rx: 8 }, 1 << 20),
        ]
    }

    #[test]
    fn every_kind_round_trips() {
        for (f, body) in every_kind() {
            let v = f.to_vec(body);
            let p = prefix(&v).unwrap();
            assert_eq!(p.body_len, body);
            assert!(p.ctrl_len as usize <= MAX_CTRL);
            assert_eq!(decode(&p, &v[PREFIX..]).unwrap(), f, "{f:?}");
        }
    }

    #[test]
    fn common_frames_are_encoded_inline_and_the_largest_boxed() {
        for (f, body) in every_kind() {
            let c = f.ctrl(body);
            assert_eq!(matches!(c, Ctrl::Small(_)), c.len() <= SMALL_CTRL, "{f:?}");
        }
        let msg = Frame::Msg {
            id: 1,
            tag: 2,
            data: 3,
            flags: 0,
        };
        assert!(matches!(msg.ctrl(8), Ctrl::Small(_)));
        let read = |n| Frame::Read {
            id: 1,
            segs: segs(n),
            desc: Desc::default(),
        };
        assert!(matches!(read(1).ctrl(0), Ctrl::Small(_)));
        let big = read(IOV_LIMIT).ctrl(0);
        assert!(matches!(big, Ctrl::Large(_)));
        assert_eq!(decode_all(&big).unwrap().0, read(IOV_LIMIT));
    }

    #[test]
    fn bodies_where_none_belong_are_refused() {
        let v = Frame::Ack { id: 1, status: 0 }.to_vec(5);
        let p = prefix(&v).unwrap();
        assert_eq!(decode(&p, &v[PREFIX..]), Err(WireError::Body(Kind::Ack, 5)));
    }

    #[test]
    fn counts_past_the_limit_are_refused() {
        let mut v = Frame::Read {
            id: 1,
            segs: segs(1),
            desc: Desc::default(),
        }
        .to_vec(0);
        // nsegs claims more ranges than follow.
        v[PREFIX + 4..PREFIX + 8].copy_from_slice(&1000u32.to_le_bytes());
        let p = prefix(&v).unwrap();
        assert_eq!(
            decode(&p, &v[PREFIX..]),
            Err(WireError::Malformed(Kind::Read))
        );
        let mut big = Prefix {
            magic: MAGIC,
            kind: Kind::Msg as u8,
            ctrl_len: MAX_CTRL as u32 + 1,
            ..Default::default()
        };
        assert_eq!(
            prefix(bytemuck::bytes_of(&big)),
            Err(WireError::CtrlLen(MAX_CTRL as u32 + 1))
        );
        big.ctrl_len = 0;
        big.magic = 1;
        assert_eq!(prefix(bytemuck::bytes_of(&big)), Err(WireError::Magic(1)));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 20_000, ..ProptestConfig::default() })]

        /// The fuzzed decoder: any bytes give a frame or an error, never a panic.
        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode_all(&bytes);
            if let Ok(p) = prefix(&bytes) {
                let end = (PREFIX + p.ctrl_len as usize).min(bytes.len());
                let _ = decode(&p, &bytes[PREFIX..end]);
            }
        }

        /// Valid prefixes with random control parts: the part the decoder trusts least.
        #[test]
        fn random_control_parts_decode_or_fail_cleanly(
            kind in 0u8..13, fl in any::<u8>(), body in any::<u64>(),
            ctrl in proptest::collection::vec(any::<u8>(), 0..(MAX_CTRL + 8)),
        ) {
            let p = Prefix { magic: MAGIC, kind, flags: fl, ctrl_len: ctrl.len() as u32, body_len: body };
            if let Ok(f) = decode(&p, &ctrl) {
                // What decodes re-encodes to a frame that decodes the same.
                let v = f.to_vec(body);
                let q = prefix(&v).unwrap();
                prop_assert_eq!(decode(&q, &v[PREFIX..]).unwrap(), f);
            }
        }
    }
}
