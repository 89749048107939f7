//! The contract between the engine and a transport: what the transport sends for the engine
//! ([`Transmit`], in order per peer, or given back when the peer is full: [`Transport`]), where
//! it puts what arrives ([`Sink`]), and what it tells the engine about itself beyond moving
//! frames: the one-sided copies it can do.
//!
//! A transport that can read a peer's memory without that peer's help (shm: cross
//! memory attach; verbs: the NIC's RDMA read) hands the engine a [`OneSided`]. A large send
//! then announces, in its `Rts`, an opaque [`Desc`] of the sender's memory that the sender's
//! transport wrote; once a receive matches, the receiving engine asks its transport for a
//! [`CopyReq`] (pull the bytes described there into the receive's buffer) instead of answering
//! `Cts`, and acknowledges when the transport reports it done (`Engine::on_copied`). Where the
//! transport cannot copy after all ([`Copied::Refused`]: the kernel forbids cross-memory attach,
//! say), the message goes through frames (`Cts`, `Data`) as on a transport without one-sided
//! copies, and the engine asks for no more copies with that peer.

use crate::consts::errno::FI_EACCES;
use crate::rxq::IovList;

pub use super::desc::{Desc, MAX_DESC};
use super::inline::Inline;
use super::wire;

/// A peer, as the transport numbers them (an index into its own table). The engine keeps
/// per-peer state by this number.
pub type PeerId = usize;

/// Bodies up to this many bytes that the engine copies (inject data) are kept inline.
pub const INLINE_BODY: usize = 64;

/// The bytes after a frame's control part.
#[derive(Debug, Default)]
pub enum Body {
    /// None.
    #[default]
    None,
    /// A few bytes the frame holds inline.
    Inline(Inline<INLINE_BODY>),
    /// Bytes the frame owns.
    Owned(Vec<u8>),
    /// Application memory (a send's buffer, the source of a write, a read's target range):
    /// the engine keeps it valid until the transport reports the frame sent (`Transmit::token`)
    /// or the peer lost.
    Iov(IovList),
}

impl Body {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Body::None => 0,
            Body::Inline(v) => v.len(),
            Body::Owned(v) => v.len(),
            Body::Iov(iov) => iov.total(),
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of `parts`, one after the other, that the frame holds: inline when small.
    pub fn concat(parts: &[&[u8]]) -> Body {
        let n: usize = parts.iter().map(|p| p.len()).sum();
        if n > INLINE_BODY {
            return Body::Owned(parts.concat());
        }
        let mut b = Inline::default();
        for p in parts {
            b.push(p);
        }
        Body::Inline(b)
    }

    /// Bytes it holds itself (not application memory).
    pub fn held(&self) -> Option<&[u8]> {
        match self {
            Body::None => Some(&[]),
            Body::Inline(b) => Some(b),
            Body::Owned(v) => Some(v),
            Body::Iov(_) => None,
        }
    }
}

impl Sink {
    /// Puts `body` (a frame's whole body, in hand) where this sink says: into the buffer (up
    /// to its length), into the memory (up to its length), or nowhere. `Wait` stays `Wait`.
    ///
    /// # Safety
    /// A `Sink::Iov` is the engine's answer to the frame, not yet handed back (`on_body`):
    /// its memory is writable.
    pub unsafe fn fill(self, body: &[u8]) -> Sink {
        match self {
            Sink::Buffer(mut v) => {
                let n = v.len().min(body.len());
                crate::copy::copy_slice(&mut v[..n], &body[..n]);
                Sink::Buffer(v)
            }
            Sink::Iov(iov) => {
                // SAFETY: the caller's contract; `copy_in` writes no more than the iov holds.
                unsafe { iov.copy_in(0, body) };
                Sink::Iov(iov)
            }
            other => other,
        }
    }
}

/// One frame for the transport to send, in order with the others to the same peer.
#[derive(Debug)]
pub struct Transmit {
    /// To whom.
    pub peer: PeerId,
    /// The frame's prefix and control part (`wire::Frame::ctrl`).
    pub ctrl: wire::Ctrl,
    /// Its body.
    pub body: Body,
    /// When set, the transport calls `Engine::on_sent(peer, token)` once every byte of the
    /// frame is handed over (a stream's kernel buffer, a ring): the engine then releases the
    /// body's memory or completes the operation.
    pub token: Option<u64>,
}

/// Where an arriving frame's body goes: the engine's answer to its control part
/// (`Engine::on_ctrl`), handed back filled (`Engine::on_body`). A stream transport has at most
/// one body in flight per peer; a transport holding a whole frame calls `Engine::on_frame`,
/// which does both (and takes a message straight into a matched receive).
#[derive(Debug)]
pub enum Sink {
    /// Nowhere: the transport reads and drops the bytes.
    Discard,
    /// A buffer of exactly the body's length, handed back in `Engine::on_body`.
    Buffer(Vec<u8>),
    /// Straight into memory the engine keeps valid until `Engine::on_body` (a posted receive,
    /// registered memory): the first `iov.total()` bytes go there, the rest is dropped.
    Iov(IovList),
    /// Not now (flow control: the engine's buffer for unexpected messages is full): the
    /// transport keeps the frame, reads nothing more from this peer, and offers the same
    /// frame again (`on_ctrl`) on later progress calls until another answer comes.
    Wait,
}

/// Makes a frame whose body is application memory own a copy of it instead (the frame keeps
/// its length, so the offsets a transport keeps into it stay valid).
pub fn keep_body(t: &mut Transmit) {
    if let Body::Iov(l) = &t.body {
        let mut v = vec![0; l.total()];
        // SAFETY: the engine keeps a frame's memory valid until the frame is sent; callers
        // copy it before they let go of it (a region's close has not returned yet).
        unsafe { l.copy_out(0, &mut v) };
        t.body = Body::Owned(v);
    }
}

/// `t`, if its token is `token` (the answer to a peer's read, its body the memory read),
/// becomes a copy that nothing waits on: its body owned (`keep_body`), its token cleared.
/// Whether it was one. Every holder of frames detaches them so (`Transport::detach`).
pub fn detach_frame(t: &mut Transmit, token: u64) -> bool {
    if t.token != Some(token) {
        return false;
    }
    keep_body(t);
    t.token = None;
    true
}

/// A region `addr..addr + len` closes (`Engine::cut_region`) under `t`: what becomes of the
/// frame if it is the answer to a peer's read sent from memory there (any other frame's memory
/// is its operation's, valid until it completes). Not `begun` (nothing of it handed over), it
/// becomes that read's failure (`FI_EACCES`, no body) and gives up its token, returned: a
/// transport reports it sent (`on_sent`: nothing reads the memory any more). Begun, its body
/// becomes a copy taken now (the peer gets the bytes from before the close): `None`. Every
/// holder of frames calls it on those it holds, the engine and the transports alike.
pub fn cut_frame(t: &mut Transmit, begun: bool, addr: usize, len: usize) -> Option<u64> {
    if t.token != Some(super::engine::READ_SENT) {
        return None;
    }
    if !matches!(&t.body, Body::Iov(l) if l.overlaps(addr, len)) {
        return None;
    }
    if begun {
        keep_body(t);
        return None;
    }
    let id = wire::prefix(&t.ctrl)
        .ok()
        .and_then(|p| wire::decode(&p, t.ctrl.get(wire::PREFIX..)?).ok());
    let Some(wire::Frame::ReadResp { id, .. }) = id else {
        // Not an answer after all (tokens are the engine's): a copy keeps it whole.
        keep_body(t);
        return None;
    };
    t.ctrl = wire::Frame::ReadResp {
        id,
        status: FI_EACCES,
    }
    .ctrl(0);
    t.body = Body::None;
    t.token.take()
}

/// How frames leave the engine (`Engine::transmit`): in order per peer, each handed over or,
/// when that peer cannot take it now (a full ring), given back. The engine keeps a frame
/// given back, and every later one to the same peer, and offers them again in order on the
/// next `transmit`.
pub trait Transport {
    /// Hands `t` to its peer, or gives it back.
    // The frame moves by value both ways, as a failed push hands its value back in
    // crossbeam; boxing it would cost the allocation per frame that `Transmit` avoids.
    #[allow(clippy::result_large_err)]
    fn send(&mut self, t: Transmit) -> Result<(), Transmit>;

    /// The frames to `peer` it holds whose token is `token` (answers to the peer's reads,
    /// their bodies the memory read) become copies: each body application memory is copied
    /// into one the frame owns, and the token cleared (nothing is reported for them). Done
    /// only if what is queued to `peer`, with `more` bytes the engine would copy of its own,
    /// stays within the transport's bound: how many frames it changed, or `None` (then the
    /// engine copies nothing either). The default, for a transport that keeps reading a peer
    /// whose frame waits (shm holds it), where the write waiting is no deadlock: `None`.
    fn detach(&mut self, peer: PeerId, token: u64, more: usize) -> Option<usize> {
        let _ = (peer, token, more);
        None
    }

    /// Writes a whole frame of `len` bytes to `peer` in the transport's own memory (a ring
    /// slot): `fill` writes its prefix, control part and body there. False: not now (the
    /// engine then queues the frame as a [`Transmit`]). The engine asks only
    /// when nothing to `peer` is queued ahead of the frame, and only where taking a frame
    /// delivers it (`Config::delivered_on_take`). The default: never.
    fn send_in_place(&mut self, peer: PeerId, len: usize, fill: impl FnOnce(&mut [u8])) -> bool {
        let _ = (peer, len, fill);
        false
    }
}

/// A transport's one-sided copies, as the engine uses them.
pub trait OneSided: Send + Sync {
    /// Messages of at least this many bytes are offered for pulling (when larger than the
    /// engine's `eager_max` too).
    fn pull_min(&self) -> usize;

    /// Describes `iov`, memory of this process that a large send to `peer` offers, for that
    /// peer's transport to copy from (`Dir::Read`: the peer reads it) or, an RMA read's
    /// destination, into (`Dir::Write`); `None`: not this memory (the send goes by frames).
    /// A transport whose hardware enforces access grants the peer that one and no other: a
    /// send's source is never writable by the receiver.
    fn describe(&self, peer: PeerId, iov: &IovList, dir: Dir) -> Option<Desc>;

    /// Whether `iov` is memory the peer's transport copies from cheaply (shm: it maps the
    /// sender's allocation and copies with plain loads, no system call per copy), and from
    /// how many bytes it is then offered: `Some(n)` offers a send (or an RMA write's source)
    /// of at least `n` bytes even below `pull_min` and the engine's `eager_max`, for one copy
    /// by the receiver instead of an eager message's two (into the frame and out of it), and
    /// the sender writes only the announcement. `None` (the default): not such memory.
    ///
    /// Asked about every message a send would otherwise send eagerly: an implementation
    /// answers `None` for an `iov` shorter than its threshold without looking further.
    fn offer_min(&self, iov: &IovList) -> Option<usize> {
        let _ = iov;
        None
    }

    /// `peer` declined to copy an offer `describe` made of device memory `iov` and asked for
    /// its data through frames (`Cts`): whatever the transport assumed the peer holds for it
    /// (a descriptor passed before) is not there. The default does nothing.
    fn offer_declined(&self, peer: PeerId, iov: &IovList) {
        let _ = (peer, iov);
    }

    /// An offer `describe` made of `iov` to `peer` has ended (its request completed, failed,
    /// or was canceled): nobody copies from it any more, and the transport may release what
    /// it holds for it (a NIC registration). `dir` is the one it was described with.
    fn offer_ended(&self, peer: PeerId, iov: &IovList, dir: Dir) {
        let _ = (peer, iov, dir);
    }

    /// Whether the transport's NIC carries `req` out itself ([`Native`]): the engine then
    /// sends no frame for it, hands it over (`Engine::poll_native`) and completes it when the
    /// transport reports it (`Engine::on_native`). The default: never.
    fn native(&self, peer: PeerId, req: &Native) -> bool {
        let _ = (peer, req);
        false
    }
}

/// What a [`Native`] operation does at the peer's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NativeKind {
    /// Writes `local` there; with remote CQ data for the target's completion.
    Write {
        /// `FI_REMOTE_CQ_DATA`'s value, if the operation carries it.
        data: Option<u64>,
    },
    /// Reads it into `local`.
    Read,
    /// Adds `add` to the 8-byte word there; its old value into `local` (8 bytes; empty: not
    /// wanted).
    FetchAdd {
        /// The addend.
        add: u64,
    },
    /// Swaps in `swap` if the 8-byte word there equals `compare`; its old value into `local`
    /// (as for `FetchAdd`).
    CompareSwap {
        /// The value compared with.
        compare: u64,
        /// The value stored where equal.
        swap: u64,
    },
}

/// An RMA or atomic operation the transport's NIC carries out itself, one-sided (RDMA write,
/// read, the 8-byte atomics), named by the peer's key for the memory: `local` is the engine's
/// (the application's) until the transport reports it with `Engine::on_native(token, ..)`,
/// which it must do exactly once for every one it took from `Engine::poll_native`, unless the
/// peer is lost first (`on_lost` ends it) or the engine closed.
#[derive(Clone, Copy, Debug)]
pub struct Native {
    /// Whose memory.
    pub peer: PeerId,
    /// Named again in `on_native` (0 when the engine asks `OneSided::native`).
    pub token: u64,
    /// What it does.
    pub kind: NativeKind,
    /// This endpoint's side: the write's source, the read's destination, the fetched value's.
    pub local: IovList,
    /// The peer's address (virtual, or an offset: as the application named it).
    pub addr: u64,
    /// The peer's key for it (untrusted by the peer's NIC, which checks it).
    pub key: u64,
    /// Bytes at the peer.
    pub len: usize,
    /// The operation's flags (`FI_FENCE`, completion levels).
    pub flags: u64,
}

/// Which way a copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// From the peer's memory into `local` (a large message's data, a write's data).
    Read,
    /// From `local` into the peer's memory (a read's data).
    Write,
}

/// A copy for the transport to perform: `len` bytes between the peer's memory that `remote`
/// describes and `local`, from the start of both, the way `dir` says. `local` is the engine's
/// until the transport reports the copy with `Engine::on_copied(token, ..)`, which it must do
/// exactly once for every copy it took from `Engine::poll_copy`, even after the peer was lost
/// or the engine closed.
#[derive(Clone, Copy, Debug)]
pub struct CopyReq {
    /// Whose memory.
    pub peer: PeerId,
    /// Named again in `on_copied`.
    pub token: u64,
    /// Which way.
    pub dir: Dir,
    /// The peer's description of its memory (as its transport wrote it; untrusted).
    pub remote: Desc,
    /// This endpoint's side of the copy.
    pub local: IovList,
    /// How many bytes.
    pub len: usize,
    /// The peer's request the remote memory belongs to. A transport that shares the copy
    /// with the peer's transport (shm's split copy) names it, and the peer's transport checks
    /// with `Engine::offered` that it is a live offer of that memory before it copies.
    pub offer: u32,
    /// The peer's later requests wait behind this copy (it serves the peer's RMA write or
    /// read: see the engine's ordering). A transport must not let the copy's end wait on
    /// anything that peer sends later, which may queue behind those requests.
    pub holds: bool,
    /// The context the provider posted the receive that `local` belongs to (0 where the
    /// copy serves no receive). Where the receive's memory is device memory staged through
    /// a host buffer, `local` is that buffer, and a transport that can copy into the device
    /// memory itself asks `EpCore::direct_landing` for it (then `local` is left untouched).
    pub ctx: crate::entry::Context,
}

/// How a copy ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Copied {
    /// Every byte is in place.
    Done,
    /// The transport cannot copy one-sidedly here after all (cross-memory attach is
    /// forbidden): the engine moves this message through frames, and asks for no more copies
    /// with this peer (others keep theirs).
    Refused,
    /// Not this one (a transport's resource for it is missing now, for a reason that says
    /// nothing of the next: a descriptor the peer passed was dropped under a bound): the
    /// engine moves this message through frames, and keeps asking copies with this peer.
    Declined,
    /// The copy failed with this errno; the message fails at both ends.
    Failed(i32),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_inline_while_small_owned_past_it() {
        let small = [7u8; INLINE_BODY / 2];
        assert!(
            matches!(Body::concat(&[&small, &small]), Body::Inline(b) if b.len() == INLINE_BODY)
        );
        let big = Body::concat(&[&small, &small, &[1]]);
        assert!(matches!(&big, Body::Owned(v) if v.len() == INLINE_BODY + 1));
        assert_eq!(big.held().map(|h| h[INLINE_BODY]), Some(1));
    }

    #[test]
    fn a_queued_frame_stays_far_below_the_largest_control_part() {
        assert!(std::mem::size_of::<Transmit>() < wire::MAX_ENCODED);
    }
}
