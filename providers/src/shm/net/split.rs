//! The split copy: a large message that the receiving transport would pull alone by
//! cross-memory attach is copied by both processes at once, so that two cores copy.
//! The receiver's transport asks the sender's, with a message of the transport's own (its
//! slot kind is neither `FRAME` nor `PIECE`: the engine never sees it), to write the tail of
//! the offer into the receiver's memory; reads the head itself; and reports the copy to its
//! engine (`Engine::on_copied`) once both parts are done. The engine's protocol is unchanged:
//! to it this is one `CopyReq` that took a while.
//!
//! ```text
//! SPLIT:      0 seq:u32 | 4 kind:u8 | 5 flags:u8 | 6 nslots:u16 | 8 token:u64 | 16 offer:u32
//!             | 20 nsegs:u32 | 24 from:u64 | 32 to:u64 | 40 state:u32 | 44 0:u32
//!             | 48 nsegs x (addr:u64, len:u64)
//! SPLIT_DONE: 0 seq:u32 | 4 kind:u8 | 5 flags:u8 | 6 nslots:u16 | 8 token:u64 | 16 status:i32
//! ```
//!
//! SPLIT asks: "write bytes `from..to` of your offer `offer` (`CopyReq::offer`) into my memory
//! at these segments". The sender's transport first claims it (`state`: `PENDING` to
//! `CLAIMED`, an atomic in the ring slot, which both processes map), then checks that `offer`
//! is live and offered to this peer to copy from (`Engine::offered`) and that the range lies
//! in it, writes with `process_vm_writev` into the pid it verified for the peer (never one a
//! message names), and answers SPLIT_DONE with 0 or the errno. Everything in a SPLIT is the
//! peer's: one that does not parse or names anything else is answered with an error
//! (`FI_EINVAL`; `FI_ECANCELED` for an offer that is not live) and a log line, and nothing is
//! copied.
//!
//! The sender's progress: a receiver copying alone needs none, and a split must not come to
//! need it either (under `FI_PROGRESS_MANUAL` the sender may be computing, not calling into
//! libfabric, for as long as it likes). So the receiver, once its own part is read, revokes
//! the request (`PENDING` to `REVOKED`) unless the sender claimed it already, and then reads
//! the sender's part too: exactly one of the two copies it. Revoked, the copy ends within
//! the receiver's call, as an unsplit one does; claimed, the sender's transport is copying
//! inside a progress call of its own and answers as soon as it is done, which the receiver
//! spins for, once and briefly (`SPIN`), before leaving it to later progress calls. What
//! still waits on the sender is only a copy under way, never its application: one that dies
//! there fails the receive with `FI_ECONNRESET` when the sweep finds it gone. (A hostile
//! peer that claims and never answers holds the receive until it dies or closes, as one that
//! never acknowledges holds a send.)
//!
//! Which copies: a large message's pull (not a served RMA write: `Net::split`) of at least
//! `XFABRIC_SHM_SPLIT_MIN` bytes, where the engine asks for pulls only from
//! `XFABRIC_SHM_CMA_MIN` (32 KiB: every message past the eager limit), and
//! once cross-memory attach has worked on this endpoint. Each side takes half, page-aligned
//! (`split_at`). A sender whose kernel refuses it the write (Yama's ptrace_scope lets a parent
//! reach its child, not the other way) answers `FI_EPERM`: the receiver reads that part too
//! and asks that peer no more.
//!
//! Device memory never reaches the transport: core stages it through host bounce buffers
//! (`ep_start`, `EpCore::stage_remote`) before the engine offers or copies it, so the split
//! moves host memory only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use xfabric_core::consts::errno::*;
use xfabric_core::rdm::{Copied, CopyReq, Dir, Engine, PeerId};
use xfabric_core::rxq::IOV_LIMIT;
use xfabric_core::{IovList, RawIov};

use crate::rdm::Glue;

use super::super::cma::{self, CmaResult};
use super::super::ring::{RawView, CTRL_SPARE};
use super::Net;

/// Kind of a message asking the peer's transport to write part of its offer.
pub const SPLIT: u8 = 22;
/// Kind of its answer.
pub const SPLIT_DONE: u8 = 23;
/// Bytes of a SPLIT before its segments (after the slot header).
const REQ_FIXED: usize = 40;
/// Where its state word is (after the slot header).
pub const STATE: usize = 32;
/// States of a SPLIT: sent, nobody copies yet; the sender copies; the receiver copies.
pub const PENDING: u32 = 0;
pub const CLAIMED: u32 = 1;
pub const REVOKED: u32 = 2;
/// Bytes of a SPLIT_DONE.
const DONE_LEN: usize = 12;
/// How long a progress call spins on the lanes for the answer to a claimed split (once per
/// split): the sender claimed it while we read our part and copies as fast, so it normally
/// finishes within microseconds of us.
const SPIN: Duration = Duration::from_micros(200);

/// Splits this process started, of those the ones it revoked (the sender had not claimed
/// them), and the ones whose sender wrote its part: for tests, which must know how a copy
/// went without timing it.
static STARTED: AtomicU64 = AtomicU64::new(0);
static REVOKES: AtomicU64 = AtomicU64::new(0);
static SHARED: AtomicU64 = AtomicU64::new(0);

/// What the splits of every endpoint of this process did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests sent.
    pub started: u64,
    /// Revoked before the sender claimed them: read alone.
    pub revoked: u64,
    /// Claimed, and the sender's part written by the sender.
    pub shared: u64,
}

/// What the splits of every endpoint of this process did so far.
pub fn counts() -> Counts {
    Counts {
        started: STARTED.load(Ordering::Relaxed),
        revoked: REVOKES.load(Ordering::Relaxed),
        shared: SHARED.load(Ordering::Relaxed),
    }
}

/// How `Net::split` took a copy.
pub(super) enum Taken {
    /// Not split: the caller copies alone.
    Alone,
    /// Split, the sender copying its part: reported when its answer comes.
    Pending,
    /// Copied (split and revoked, the receiver reading it all): report this.
    Done(Copied),
}

/// A SPLIT's content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Named again in the answer (the requester's `CopyReq::token`).
    pub token: u64,
    /// The offer the bytes come from.
    pub offer: u32,
    /// Its bytes `from..to`.
    pub from: usize,
    pub to: usize,
    /// Where they go, in the requester's memory: `to - from` bytes.
    pub dest: IovList,
}

impl Request {
    /// Bytes the message takes after its slot header.
    pub fn len(&self) -> usize {
        REQ_FIXED + 16 * self.dest.segs().len()
    }

    /// Writes it into `b` (`len()` bytes).
    pub fn encode(&self, b: &mut [u8]) {
        let segs = self.dest.segs();
        b[0..8].copy_from_slice(&self.token.to_le_bytes());
        b[8..12].copy_from_slice(&self.offer.to_le_bytes());
        b[12..16].copy_from_slice(&(segs.len() as u32).to_le_bytes());
        b[16..24].copy_from_slice(&(self.from as u64).to_le_bytes());
        b[24..32].copy_from_slice(&(self.to as u64).to_le_bytes());
        b[STATE..STATE + 8].copy_from_slice(&[0; 8]);
        for (i, s) in segs.iter().enumerate() {
            let o = REQ_FIXED + 16 * i;
            b[o..o + 8].copy_from_slice(&(s.addr as u64).to_le_bytes());
            b[o + 8..o + 16].copy_from_slice(&(s.len as u64).to_le_bytes());
        }
    }

    /// Parses a peer's SPLIT (`b`: the bytes after the slot header, to the end of its
    /// slots): the token to answer, and the request or why it is none.
    pub fn decode(b: &[u8]) -> (u64, Result<Request, String>) {
        let word = |o: usize| -> Option<u64> {
            Some(u64::from_le_bytes(
                b.get(o..o.checked_add(8)?)?.try_into().ok()?,
            ))
        };
        let half = |o: usize| -> Option<u32> {
            Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
        };
        let token = word(0).unwrap_or(0);
        let r = (|| {
            let offer = half(8).ok_or("short")?;
            let n = half(12).ok_or("short")? as usize;
            if n > IOV_LIMIT {
                return Err(format!("{n} segments"));
            }
            let size = |w: u64| usize::try_from(w).map_err(|_| "a length past usize".to_string());
            let from = size(word(16).ok_or("short")?)?;
            let to = size(word(24).ok_or("short")?)?;
            let segs = (0..n)
                .map(|i| {
                    let o = REQ_FIXED + 16 * i;
                    Ok(RawIov {
                        addr: size(word(o).ok_or("segments past the slots")?)?,
                        len: size(word(o + 8).ok_or("segments past the slots")?)?,
                    })
                })
                .collect::<Result<Vec<_>, String>>()?;
            let dest = IovList::from_segs(segs).ok_or("a segment that wraps")?;
            Ok(Request {
                token,
                offer,
                from,
                to,
                dest,
            })
        })();
        (token, r)
    }

    /// The part of `offered` (what the engine says the peer may copy from, if anything) this
    /// request names, checked: its range within the offer, its destination exactly as long.
    pub fn source(&self, offered: Option<IovList>) -> Result<IovList, String> {
        let iov = offered.ok_or_else(|| format!("offer {} is not a live offer", self.offer))?;
        let n = self
            .to
            .checked_sub(self.from)
            .ok_or_else(|| format!("range {}..{} runs backwards", self.from, self.to))?;
        if self.to > iov.total() {
            return Err(format!(
                "range {}..{} past the offer's {} bytes",
                self.from,
                self.to,
                iov.total()
            ));
        }
        // `total` saturates: a sum that wrapped cannot pass as `n`.
        let dest: Option<usize> = self
            .dest
            .segs()
            .iter()
            .try_fold(0usize, |a, s| a.checked_add(s.len));
        if dest != Some(n) {
            return Err(format!("a destination of {dest:?} bytes for {n}"));
        }
        Ok(iov.slice(self.from, n))
    }
}

/// A SPLIT_DONE's bytes.
pub fn done_bytes(token: u64, status: i32) -> [u8; DONE_LEN] {
    let mut b = [0; DONE_LEN];
    b[..8].copy_from_slice(&token.to_le_bytes());
    b[8..].copy_from_slice(&status.to_le_bytes());
    b
}

/// A peer's SPLIT_DONE: (token, status as an errno: 0 or positive).
pub fn parse_done(b: &[u8]) -> Option<(u64, i32)> {
    let token = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
    let status = i32::from_le_bytes(b.get(8..12)?.try_into().ok()?);
    // Nothing but 0 and an errno means anything; the rest is the peer's garbage.
    let status = if (0..4096).contains(&status) {
        status
    } else {
        FI_EIO
    };
    Some((token, status))
}

/// Where a copy of `len` bytes splits: the receiver reads `..at`, the sender writes `at..`.
/// Half each, page-aligned (the two copies start about together: the sender one message
/// hop later, a microsecond or two against the tens a half takes).
pub fn split_at(len: usize) -> usize {
    (len / 2) & !4095
}

/// A split under way at the receiver.
pub(super) struct Pending {
    token: u64,
    peer: PeerId,
    pid: i32,
    /// How our own part (`..at`) went.
    own: Copied,
    local: IovList,
    remote: IovList,
    at: usize,
    len: usize,
    /// A progress call spun for its answer already.
    pub(super) spun: bool,
}

fn copied(r: CmaResult) -> Copied {
    match r {
        CmaResult::Done => Copied::Done,
        CmaResult::Refused => Copied::Refused,
        CmaResult::PeerGone => Copied::Failed(FI_ECONNRESET),
        CmaResult::Failed(e) => Copied::Failed(e),
    }
}

impl Net {
    /// Copies `c` split, where it is one that splits (a large message's pull of at least
    /// `split_min` bytes from a peer whose memory cross-memory attach has reached, and whose
    /// transport has not refused to write) and the request fits the peer's ring now.
    ///
    /// Copies serving a peer's RMA write are not split: that peer's later requests wait
    /// behind them (`CopyReq::holds`), and past the held queue's bound they stay at the head
    /// of its lane, where the answer would queue behind them for ever.
    pub(super) fn split(&mut self, c: &CopyReq) -> Taken {
        if c.dir != Dir::Read || c.holds || c.len < self.split_min || !self.cma.known_working() {
            return Taken::Alone;
        }
        let Some(link) = self.links.get_mut(c.peer) else {
            return Taken::Alone;
        };
        let (Some(pid), Some(prod), Some(seg)) = (link.pid, link.prod.as_mut(), link.seg.as_ref())
        else {
            return Taken::Alone;
        };
        if link.dead || link.no_split {
            return Taken::Alone;
        }
        let Some(remote) = c.remote.to_iov() else {
            return Taken::Alone;
        };
        if c.len > remote.total() || c.len > c.local.total() {
            // `copy` fails it.
            return Taken::Alone;
        }
        let at = split_at(c.len);
        let req = Request {
            token: c.token,
            offer: c.offer,
            from: at,
            to: c.len,
            dest: c.local.slice(at, c.len - at),
        };
        let mut state = std::ptr::null_mut::<u8>();
        // A request: it leaves the ring's spare slots to answers.
        let sent = prod.write_raw(seg, SPLIT, 0, req.len(), CTRL_SPARE, |b| {
            req.encode(b);
            state = b[STATE..].as_mut_ptr();
        });
        if !sent {
            return Taken::Alone;
        }
        // Now, not after our part: the sender copies while we do.
        Self::wake(seg);
        STARTED.fetch_add(1, Ordering::Relaxed);
        let own = copied(cma::read(&self.cma, pid, &c.local, remote.segs(), at));
        // SAFETY: the request's state word, in its first slot in our lane of the peer's
        // segment (mapped while the link is): nothing was written to the lane since, so the
        // slot holds the request whether or not the peer consumed it yet; 4-aligned.
        let state = unsafe { std::sync::atomic::AtomicU32::from_ptr(state.cast()) };
        let revoked = state
            .compare_exchange(PENDING, REVOKED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if revoked {
            // The sender never started (not polling): its part is ours, and it will not
            // answer.
            REVOKES.fetch_add(1, Ordering::Relaxed);
            let n = c.len - at;
            let rest = || {
                let local = c.local.slice(at, n);
                copied(cma::read(
                    &self.cma,
                    pid,
                    &local,
                    remote.slice(at, n).segs(),
                    n,
                ))
            };
            return Taken::Done(match own {
                Copied::Done => rest(),
                o => o,
            });
        }
        self.splits.push(Pending {
            token: c.token,
            peer: c.peer,
            pid,
            own,
            local: c.local,
            remote,
            at,
            len: c.len,
            spun: false,
        });
        Taken::Pending
    }

    /// Whether splits wait for their answers.
    pub fn splitting(&self) -> bool {
        !self.splits.is_empty()
    }

    /// A SPLIT from `p`, `v` at the head of its lane: claimed, its part written or
    /// refused, and answered; or, revoked already, passed over.
    pub(super) fn serve_split(&mut self, eng: &Engine, p: PeerId, v: &RawView) {
        // SAFETY: the consumer has not advanced past `v` (the caller's contract).
        let state = unsafe { v.word(STATE) };
        if state
            .compare_exchange(PENDING, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // Revoked (the requester read it all), or a state only garbage has: not ours.
            return;
        }
        // SAFETY: as above; the requester no longer writes the message once it is claimed.
        let bytes = unsafe { v.bytes() };
        let (token, req) = Request::decode(bytes);
        let checked = match req {
            Err(why) => Err((FI_EINVAL, why)),
            Ok(r) => match eng.offered(p, r.offer) {
                // Ended (this endpoint closed with the send outstanding), or never was.
                None => Err((
                    FI_ECANCELED,
                    format!("offer {} is not a live offer", r.offer),
                )),
                Some(o) => r
                    .source(Some(o))
                    .map(|s| (r, s))
                    .map_err(|why| (FI_EINVAL, why)),
            },
        };
        let status = match checked {
            Err((status, why)) => {
                tracing::warn!(
                    peer = %self.links[p].name,
                    "shm: refusing a split copy request ({why})"
                );
                status
            }
            Ok((r, src)) => match self.links[p].pid {
                // The kernel would not let us reach it: the requester reads it all.
                None => FI_EPERM,
                Some(_) if !self.split_cma.usable() => FI_EPERM,
                Some(pid) => {
                    match cma::write(&self.split_cma, pid, &src, r.dest.segs(), src.total()) {
                        CmaResult::Done => 0,
                        CmaResult::Refused => FI_EPERM,
                        CmaResult::PeerGone => FI_ECONNRESET,
                        CmaResult::Failed(e) => e,
                    }
                }
            },
        };
        self.answer_split(p, token, status);
    }

    /// Writes SPLIT_DONE to `p` (an answer: it may take the ring's spare slots). A ring with
    /// no room at all is one its owner stopped reading; the answer is dropped then, and the
    /// requester's split ends with the peer's loss.
    fn answer_split(&mut self, p: PeerId, token: u64, status: i32) {
        if self.ensure_lane(p).is_err() {
            return;
        }
        let link = &mut self.links[p];
        let (Some(prod), Some(seg)) = (link.prod.as_mut(), link.seg.as_ref()) else {
            return;
        };
        let b = done_bytes(token, status);
        if prod.write_raw(seg, SPLIT_DONE, 0, b.len(), 0, |d| d.copy_from_slice(&b)) {
            Self::wake(seg);
        } else {
            tracing::warn!(peer = %link.name, "shm: no room to answer a split copy");
        }
    }

    /// A SPLIT_DONE from `p`: the split it answers is reported to the engine. One naming no
    /// split of `p`'s is ignored.
    pub(super) fn split_done(&mut self, eng: &mut Engine, p: PeerId, bytes: &[u8]) {
        let Some((token, status)) = parse_done(bytes) else {
            return;
        };
        let Some(i) = self
            .splits
            .iter()
            .position(|s| s.token == token && s.peer == p)
        else {
            return;
        };
        let s = self.splits.swap_remove(i);
        let how = match (s.own, status) {
            (Copied::Done, 0) => {
                SHARED.fetch_add(1, Ordering::Relaxed);
                Copied::Done
            }
            (Copied::Done, FI_EPERM) => {
                // Its kernel will not let it write to us: we read its part too, and ask it
                // no more.
                self.links[p].no_split = true;
                let n = s.len - s.at;
                let local = s.local.slice(s.at, n);
                let remote = s.remote.slice(s.at, n);
                copied(cma::read(&self.cma, s.pid, &local, remote.segs(), n))
            }
            (Copied::Done, e) => Copied::Failed(e),
            // Ours failed (refused: the message goes through frames, over what it wrote).
            (own, _) => own,
        };
        if how == Copied::Refused {
            self.copies_refused(p);
        }
        eng.on_copied(s.token, how);
    }

    /// Ends the splits waiting on `p` (every peer: `None`) with `err`: it is gone, nothing
    /// more of it will be written.
    pub fn end_splits(&mut self, eng: &mut Engine, p: Option<PeerId>, err: i32) {
        let mut i = 0;
        while i < self.splits.len() {
            if p.is_none_or(|p| self.splits[i].peer == p) {
                let s = self.splits.swap_remove(i);
                eng.on_copied(s.token, Copied::Failed(err));
            } else {
                i += 1;
            }
        }
    }

    /// Spins a little on the lanes of peers whose answer to a split just started is due,
    /// taking in what arrives, until no such split is left or `SPIN` has passed.
    pub(super) fn spin_splits(&mut self, g: &mut Glue<'_>) {
        let mut lanes = 0u64;
        for s in self.splits.iter_mut().filter(|s| !s.spun) {
            s.spun = true;
            if let Some(l) = self.links[s.peer].rx_lane {
                lanes |= 1 << l;
            }
        }
        let until = Instant::now() + SPIN;
        while lanes != 0 && Instant::now() < until {
            for l in super::bits(lanes) {
                let c = self.cons[l];
                if c.raw_at(&self.seg, l, c.pos()).is_some() {
                    self.poll_lane(g, l, super::BATCH);
                }
            }
            // Lanes whose splits were all answered (or dropped) are not watched further.
            lanes &= self
                .splits
                .iter()
                .filter_map(|s| self.links[s.peer].rx_lane)
                .fold(0, |m, l| m | 1 << l);
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(from: usize, to: usize, dest: &[(usize, usize)]) -> Request {
        Request {
            token: 0x1234_5678_9abc,
            offer: 7,
            from,
            to,
            dest: IovList::from_segs(dest.iter().map(|&(addr, len)| RawIov { addr, len })).unwrap(),
        }
    }

    fn bytes(r: &Request) -> Vec<u8> {
        let mut b = vec![0; r.len()];
        r.encode(&mut b);
        b
    }

    #[test]
    fn requests_round_trip_and_are_checked_against_the_offer() {
        let offer = IovList::from_segs([
            RawIov {
                addr: 0x10000,
                len: 4096,
            },
            RawIov {
                addr: 0x40000,
                len: 8192,
            },
        ])
        .unwrap();
        let r = req(2048, 12288, &[(0x9000, 10000), (0xa0000, 240)]);
        let (t, back) = Request::decode(&bytes(&r));
        assert_eq!((t, back.clone()), (r.token, Ok(r)));
        let src = back.unwrap().source(Some(offer)).unwrap();
        assert_eq!(src.total(), 10240);
        assert_eq!(src.segs()[0].addr, 0x10000 + 2048);
        // Not live, past its end, backwards, a destination of another length.
        assert!(r.source(None).is_err());
        assert!(req(0, 12289, &[(1, 12289)]).source(Some(offer)).is_err());
        assert!(req(10, 5, &[]).source(Some(offer)).is_err());
        assert!(req(0, 100, &[(1, 99)]).source(Some(offer)).is_err());
        assert!(req(0, 100, &[(1, 101)]).source(Some(offer)).is_err());
        // Destination lengths whose sum wraps to the range's length.
        let wrap = req(0, 100, &[(1, usize::MAX - 10), (1, 111)]);
        assert!(wrap.source(Some(offer)).is_err());
        // An empty range is fine (nothing to write).
        assert_eq!(req(5, 5, &[]).source(Some(offer)).unwrap().total(), 0);
    }

    #[test]
    fn garbage_requests_do_not_parse() {
        let r = req(0, 100, &[(1, 100)]);
        let mut b = bytes(&r);
        // Too many segments.
        b[12..16].copy_from_slice(&(IOV_LIMIT as u32 + 1).to_le_bytes());
        assert!(Request::decode(&b).1.is_err());
        // Segments past the bytes there.
        b[12..16].copy_from_slice(&2u32.to_le_bytes());
        assert!(Request::decode(&b).1.is_err());
        // A segment that wraps the address space.
        let mut b = bytes(&r);
        b[REQ_FIXED..REQ_FIXED + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Request::decode(&b).1.is_err());
        // Short of the fixed part; the token is still read where it is there.
        assert_eq!(Request::decode(&b[..20]).0, r.token);
        assert!(Request::decode(&b[..20]).1.is_err());
        assert!(Request::decode(&[]).1.is_err());
    }

    #[test]
    fn answers_carry_an_errno_or_eio() {
        assert_eq!(parse_done(&done_bytes(9, 0)), Some((9, 0)));
        assert_eq!(parse_done(&done_bytes(9, FI_EPERM)), Some((9, FI_EPERM)));
        assert_eq!(parse_done(&done_bytes(9, -5)), Some((9, FI_EIO)));
        assert_eq!(parse_done(&done_bytes(9, 1 << 20)), Some((9, FI_EIO)));
        assert_eq!(parse_done(&[1; 11]), None);
    }

    #[test]
    fn splits_are_page_aligned_halves() {
        assert_eq!(split_at(1 << 20), 1 << 19);
        assert_eq!(split_at((1 << 20) + 4095), 1 << 19);
        assert_eq!(split_at(3 * 4096 + 7) % 4096, 0);
    }
}
