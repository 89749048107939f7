//! What a transport tells the engine about itself beyond moving frames: the one-sided copies
//! it can do. A transport that can read a peer's memory without that peer's help (shm: cross
//! memory attach; verbs: the NIC's RDMA read) hands the engine a [`OneSided`]. A large send
//! then announces, in its `Rts`, an opaque [`Desc`] of the sender's memory that the sender's
//! transport wrote; once a receive matches, the receiving engine asks its transport for a
//! [`CopyReq`] (pull the bytes described there into the receive's buffer) instead of answering
//! `Cts`, and acknowledges when the transport reports it done (`Engine::on_copied`). Where the
//! transport cannot copy after all ([`Copied::Refused`]: the kernel forbids cross-memory attach,
//! say), the message goes through frames (`Cts`, `Data`) as on a transport without one-sided
//! copies, and the engine asks for no more copies with that peer.

use crate::rxq::{IovList, RawIov, IOV_LIMIT};

use super::inline::Inline;
use super::PeerId;

/// Longest descriptor a `Rts` carries: room for 32 bytes per segment of a largest iov (an
/// address, a length, a key and a spare word).
pub const MAX_DESC: usize = 32 * IOV_LIMIT;

/// A transport's description of memory a peer may copy from one-sidedly: bytes only the
/// transports read. From a peer it is untrusted input, and only as long as [`MAX_DESC`].
pub type Desc = Inline<MAX_DESC>;

impl Desc {
    /// The plainest descriptor: `iov`'s segments as (address, length) pairs, for a transport
    /// whose peers name memory by its address alone (shm, which knows each peer's process).
    pub fn of_iov(iov: &IovList) -> Desc {
        let mut d = Desc::default();
        for s in iov.segs() {
            // At most IOV_LIMIT segments of 16 bytes: always fits.
            d.push(&(s.addr as u64).to_le_bytes());
            d.push(&(s.len as u64).to_le_bytes());
        }
        d
    }

    /// The segments of a descriptor written by [`Desc::of_iov`], checked: `None` for bytes
    /// that are not such a list.
    pub fn to_iov(&self) -> Option<IovList> {
        let b = self.as_bytes();
        if b.is_empty() || !b.len().is_multiple_of(16) {
            return None;
        }
        let word = |c: &[u8]| usize::try_from(u64::from_le_bytes(c.try_into().ok()?)).ok();
        let segs: Option<Vec<RawIov>> = b
            .chunks_exact(16)
            .map(|c| {
                Some(RawIov {
                    addr: word(&c[..8])?,
                    len: word(&c[8..])?,
                })
            })
            .collect();
        IovList::from_segs(segs?)
    }
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
    fn send(&mut self, t: super::Transmit) -> Result<(), super::Transmit>;

    /// Writes a whole frame of `len` bytes to `peer` in the transport's own memory (a ring
    /// slot): `fill` writes its prefix, control part and body there. False: not now (the
    /// engine then queues the frame as a [`Transmit`](super::Transmit)). The engine asks only
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
    /// peer's transport to copy from; `None`: not this memory (the send goes by frames).
    fn describe(&self, peer: PeerId, iov: &IovList) -> Option<Desc>;

    /// An offer `describe` made of `iov` to `peer` has ended (its request completed, failed,
    /// or was canceled): nobody copies from it any more, and the transport may release what
    /// it holds for it (a NIC registration).
    fn offer_ended(&self, peer: PeerId, iov: &IovList) {
        let _ = (peer, iov);
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
    /// The copy failed with this errno; the message fails at both ends.
    Failed(i32),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iov_descriptors_round_trip_and_garbage_is_refused() {
        let (a, b) = ([1u8; 10], [2u8; 30]);
        let iov = IovList::from_segs([RawIov::of(&a), RawIov::of(&b)]).unwrap();
        let d = Desc::of_iov(&iov);
        let back = d.to_iov().unwrap();
        assert_eq!(back.total(), 40);
        assert_eq!(back.segs(), iov.segs());
        assert_eq!(Desc::default().to_iov(), None);
        assert_eq!(Desc::new(&[0; 15]).unwrap().to_iov(), None);
        // More segments than an iov holds.
        assert_eq!(
            Desc::new(&[1; 16 * (IOV_LIMIT + 1)]).unwrap().to_iov(),
            None
        );
        assert_eq!(Desc::new(&[0; MAX_DESC + 1]), None);
        let mut d = Desc::new(&[0; MAX_DESC]).unwrap();
        assert!(!d.push(&[1]));
        assert_eq!(d.as_bytes().len(), MAX_DESC);
    }
}
