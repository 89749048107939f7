//! A raw sender for tests: a peer that writes whatever frames it is told into another
//! endpoint's ring, as a broken or hostile process could (every byte of a ring slot is the
//! sender's). Tests use it to check that nothing a peer writes makes an endpoint panic, wrap,
//! or start an operation. Not for applications.

use std::sync::atomic::Ordering;

use xfabric_core::{Error, Result};

use super::addr::ADDR_PREFIX;
pub use super::guard::faults as guard_faults;
pub use super::guard::Filler as GuardFiller;
use super::net::split;
pub use super::net::{
    armed_counts, ipc_counts, ipc_desc, mapped_counts, mapped_desc, split_counts, ArmedCounts,
    IpcCounts, MappedCounts, SplitCounts, FRAME, HELD_MAX, PIECE, PIECE_LEN, RELEASE, SPLIT,
    SPLIT_DONE,
};
pub use super::ring::ARMED_SLOTS;
use super::ring::{self, kind, Consumer, Header, Producer};
use super::segment::{fresh_name, Segment};

/// Maps the segment of the endpoint whose address is `addr`.
fn open_target(addr: &[u8]) -> Result<Segment> {
    let name = std::str::from_utf8(addr)
        .ok()
        .and_then(|s| s.trim_end_matches('\0').strip_prefix(ADDR_PREFIX))
        .ok_or_else(|| Error::Inval("raw peer: not an shm address".into()))?;
    Segment::open(name, ring::SEG_BYTES)
}

/// How many joint sleeps (a progress thread asleep on several endpoints at once, on their
/// wake sockets) the endpoint whose address is `addr` counts in its header now, as a sender
/// reads it (`ring::OFF_FD_SLEEPING`).
pub fn joint_sleeps(addr: &[u8]) -> Result<u32> {
    let word = ring::fd_sleeping(&open_target(addr)?).load(Ordering::Acquire);
    Ok((word & !(ring::FD_TRYWAIT | ring::FD_UNREACHABLE)) / ring::FD_JOINT)
}

/// A lane claimed in another endpoint's segment with nothing ever written into it, as by a
/// sender that died right after claiming, or a process that claims lanes and never names
/// itself.
pub struct NamelessClaim {
    target: Segment,
    lane: usize,
}

impl NamelessClaim {
    /// Claims a free lane of the segment `addr` names; `None` when none is free.
    pub fn claim(addr: &[u8]) -> Result<Option<NamelessClaim>> {
        let target = open_target(addr)?;
        let id = 0xdead_0000 | u64::from(std::process::id());
        Ok(ring::claim_lane(&target, id).map(|lane| NamelessClaim { target, lane }))
    }

    /// Whether the target still has the lane claimed.
    pub fn claimed(&self) -> bool {
        ring::claim(&self.target, self.lane).load(Ordering::Acquire) != 0
    }
}

/// A peer made of a segment that looks like an endpoint's and one lane in the target's.
pub struct RawPeer {
    own: Segment,
    target: Segment,
    prod: Producer,
    lane: usize,
    /// The lane the target writes to us on, once it claimed one, and our place in it.
    rx: Option<(usize, Consumer)>,
}

impl RawPeer {
    /// Creates a segment with an endpoint's header (claiming, with `base`, to be mapped at
    /// that address instead of where it is), claims a lane in the segment `addr` names, and
    /// writes the CONNECT message naming our segment.
    pub fn connect(addr: &[u8], base: Option<u64>) -> Result<RawPeer> {
        let target = open_target(addr)?;
        let own_name = fresh_name();
        let own = Segment::create(&own_name, ring::SEG_BYTES)?;
        ring::init_header(&own, 0x005e_ed0f_u64 << 20 | u64::from(std::process::id()));
        if let Some(b) = base {
            // SAFETY: fixed aligned offset in the header of a segment we created.
            unsafe { own.u64_at(ring::OFF_BASE) }.store(b, Ordering::Release);
        }
        let lane = ring::claim_lane(&target, 0xbad0_0000 | u64::from(std::process::id()))
            .ok_or_else(|| Error::Busy("raw peer: no free lane".into()))?;
        RawPeer::on_lane(own, target, lane)
    }

    /// Claims another lane of the same target and names this peer's segment there too, as a
    /// process writing two streams under one name would (or one that lost the target and
    /// came back without saying goodbye).
    pub fn another_lane(&self) -> Result<RawPeer> {
        let target = Segment::open(self.target.name(), ring::SEG_BYTES)?;
        let own = Segment::open(self.own.name(), ring::SEG_BYTES)?;
        let lane = ring::claim_lane(&target, 0xbad1_0000 | u64::from(std::process::id()))
            .ok_or_else(|| Error::Busy("raw peer: no free lane".into()))?;
        RawPeer::on_lane(own, target, lane)
    }

    /// Writes the CONNECT naming `own` on `lane` of `target` (claimed).
    fn on_lane(own: Segment, target: Segment, lane: usize) -> Result<RawPeer> {
        let me = own.name().to_string();
        let mut peer = RawPeer {
            prod: Producer::new(&target, lane),
            target,
            lane,
            rx: None,
            own,
        };
        if !peer.connect_again(&me) {
            return Err(Error::Again("raw peer: connect"));
        }
        Ok(peer)
    }

    /// Lets go of our segment's lock while we keep writing: the target then counts us gone
    /// (as a process that died), and anything we write after must land nowhere.
    pub fn play_dead(&self) {
        self.own.unlock();
    }

    /// Writes a CONNECT on this peer's lane naming `name` (a second one, once connected).
    pub fn connect_again(&mut self, name: &str) -> bool {
        let h = Header {
            kind: kind::CONNECT,
            len: name.len() as u32,
        };
        self.prod.write(&self.target, &h, name.len(), |b| {
            b.copy_from_slice(name.as_bytes())
        })
    }

    /// Writes a goodbye on this peer's lane, as a closing endpoint does (its lock kept: the
    /// process lives on).
    pub fn bye(&mut self) -> bool {
        let h = Header {
            kind: kind::BYE,
            ..Default::default()
        };
        self.prod.write(&self.target, &h, 0, |_| {})
    }

    /// Writes one message: `kind` (a frame start, `FRAME`, or a body piece, `PIECE`, or
    /// anything else) in the slot header, then `bytes` as given. False when the ring has no
    /// room for it and `spare` more slots.
    pub fn send_raw(&mut self, kind: u8, bytes: &[u8], spare: usize) -> bool {
        self.prod
            .write_raw(&self.target, kind, 0, bytes.len(), spare, |b| {
                b.copy_from_slice(bytes)
            })
    }

    /// Writes `len` (as the length word) and `bytes` into armed slot `slot` of our own
    /// segment, as a sender arming a send would, but unchecked: the length may lie.
    pub fn put_armed(&mut self, slot: usize, len: u64, bytes: &[u8]) {
        ring::write_armed_as(&self.own, slot, len, bytes);
    }

    /// The frame the target keeps in its armed slot `slot` (a send armed to one of its
    /// peers), as a receiver would read it once released; `None` for an empty slot. A
    /// hostile peer can read it before the release: what it names must be of no use then.
    pub fn target_armed(&self, slot: usize) -> Option<Vec<u8>> {
        let mut frame = [0u8; ring::ARMED_MAX];
        let len = ring::read_armed(&self.target, slot, &mut frame)?;
        (len > 0).then(|| frame[..len].to_vec())
    }

    /// Stores `v` as our count of the target's released armed sends finished (in the header
    /// of our lane in its segment, `ring::store_count`) with our head after what we wrote
    /// so far, as a receiver that took them does instead of answering each, but unchecked: it
    /// may say anything.
    pub fn put_count(&self, v: u32) {
        let claim = ring::claim(&self.target, self.lane).load(Ordering::Acquire);
        self.put_count_as(claim, v);
    }

    /// `put_count` as the holder of claim `claim` would write it (a producer that lost the
    /// lane to another, when `claim` is not ours).
    pub fn put_count_as(&self, claim: u64, v: u32) {
        ring::store_count(&self.target, self.lane, claim, v, self.prod.head());
    }

    /// `put_count` with `head` as the head that came with it, whatever we wrote (a lie when it
    /// is past our producer's head).
    pub fn put_count_at(&self, v: u32, head: u64) {
        let claim = ring::claim(&self.target, self.lane).load(Ordering::Acquire);
        ring::store_count(&self.target, self.lane, claim, v, head);
    }

    /// Our producer's head in the lane (what `put_count` sends with the count).
    pub fn head(&self) -> u64 {
        self.prod.head()
    }

    /// Whether the target still has our lane claimed (it drops the lane of a peer that sent
    /// garbage).
    pub fn lane_claimed(&self) -> bool {
        ring::claim(&self.target, self.lane).load(Ordering::Acquire) != 0
    }

    /// The next message the target wrote into our segment (its slot kind and the bytes after
    /// the slot header, to the end of its slots), its CONNECT and padding skipped; `None`
    /// while there is none.
    pub fn recv_raw(&mut self) -> Option<(u8, Vec<u8>)> {
        self.next_raw(false).map(|(k, b, _)| (k, b))
    }

    /// As `recv_raw`, claiming a SPLIT (a split copy's request) as the sender's transport does
    /// before it writes its part: the target then waits for an answer (`SPLIT_DONE`). The
    /// flag says whether the claim took (false: the target had revoked it, and reads alone).
    pub fn recv_claiming(&mut self) -> Option<(u8, Vec<u8>, bool)> {
        self.next_raw(true)
    }

    fn next_raw(&mut self, claim: bool) -> Option<(u8, Vec<u8>, bool)> {
        if self.rx.is_none() {
            let mask = ring::active(&self.own).load(Ordering::Acquire);
            if mask == 0 {
                return None;
            }
            let lane = mask.trailing_zeros() as usize;
            self.rx = Some((lane, Consumer::attach(&self.own, lane)));
        }
        let (lane, c) = self.rx.as_mut()?;
        loop {
            let v = c.raw_at(&self.own, *lane, c.pos())?;
            let claimed = claim && v.kind == SPLIT && {
                // SAFETY: before the consumer advances past the message.
                let state = unsafe { v.word(split::STATE) };
                state
                    .compare_exchange(
                        split::PENDING,
                        split::CLAIMED,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok()
            };
            // SAFETY: copied out before the consumer advances past the message.
            let bytes = unsafe { v.bytes() }.to_vec();
            c.advance_slots(&self.own, *lane, v.slots());
            if v.kind != kind::PAD && v.kind != kind::CONNECT {
                return Some((v.kind, bytes, claimed));
            }
        }
    }

    /// Our segment's name (what the target maps).
    pub fn name(&self) -> &str {
        self.own.name()
    }
}
