//! A raw sender for tests: a peer that writes whatever frames it is told into another
//! endpoint's ring, as a broken or hostile process could (every byte of a ring slot is the
//! sender's). Tests use it to check that nothing a peer writes makes an endpoint panic, wrap,
//! or start an operation. Not for applications.

use std::sync::atomic::Ordering;

use xfabric_core::{Error, Result};

pub use super::net::{FRAME, HELD_MAX, PIECE, PIECE_LEN};
use super::ring::{self, kind, Header, Producer};
use super::segment::{fresh_name, Segment};
use super::ADDR_PREFIX;

/// A peer made of a segment that looks like an endpoint's and one lane in the target's.
pub struct RawPeer {
    own: Segment,
    target: Segment,
    prod: Producer,
    lane: usize,
}

impl RawPeer {
    /// Creates a segment with an endpoint's header (claiming, with `base`, to be mapped at
    /// that address instead of where it is), claims a lane in the segment `addr` names, and
    /// writes the CONNECT message naming our segment.
    pub fn connect(addr: &[u8], base: Option<u64>) -> Result<RawPeer> {
        let name = std::str::from_utf8(addr)
            .ok()
            .and_then(|s| s.strip_prefix(ADDR_PREFIX))
            .ok_or_else(|| Error::Inval("raw peer: not an shm address".into()))?;
        let target = Segment::open(name, ring::SEG_BYTES)?;
        let own_name = fresh_name();
        let own = Segment::create(&own_name, ring::SEG_BYTES)?;
        ring::init_header(&own, 0x005e_ed0f_u64 << 20 | u64::from(std::process::id()));
        if let Some(b) = base {
            // SAFETY: fixed aligned offset in the header of a segment we created.
            unsafe { own.u64_at(ring::OFF_BASE) }.store(b, Ordering::Release);
        }
        let lane = ring::claim_lane(&target, 0xbad0_0000 | u64::from(std::process::id()))
            .ok_or_else(|| Error::Busy("raw peer: no free lane".into()))?;
        let mut peer = RawPeer {
            own,
            prod: Producer::new(&target, lane),
            target,
            lane,
        };
        let me = own_name.into_bytes();
        let h = Header {
            kind: kind::CONNECT,
            len: me.len() as u32,
        };
        if !peer
            .prod
            .write(&peer.target, &h, me.len(), |b| b.copy_from_slice(&me))
        {
            return Err(Error::Again("raw peer: connect"));
        }
        Ok(peer)
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

    /// Whether the target still has our lane claimed (it drops the lane of a peer that sent
    /// garbage).
    pub fn lane_claimed(&self) -> bool {
        ring::claim(&self.target, self.lane).load(Ordering::Acquire) != 0
    }

    /// Our segment's name (what the target maps).
    pub fn name(&self) -> &str {
        self.own.name()
    }
}
