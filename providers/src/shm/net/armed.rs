//! Armed sends over shm (the engine's `armed`): a send armed for an XPU's trigger has its
//! announcement (the engine's `Rts`, naming memory the receiver copies from) written into an
//! armed slot of the sender's own segment when it is armed; when it fires, the sender writes
//! one RELEASE message (the slot's number) into its lane in the receiver's segment, and the
//! receiver takes the slot's frame there as if it had come in the lane itself. So the send
//! reaches the receiver in lane order with everything else the sender wrote, and the thread
//! that fires it writes one slot.
//!
//! ```text
//! RELEASE: 0 seq:u32 | 4 kind:u8 | 5 flags:u8 | 6 nslots:u16 | 8 slot:u32
//! ```
//!
//! A slot is the sender's until it is released, and again once the receiver has read past
//! the RELEASE message naming it (its lane's tail word): one never released (disarmed, or
//! sent as a frame instead) is free at once. The receiver reads nothing a RELEASE message
//! does not name, checks the slot number and the length it finds, and copies the frame out
//! once before parsing it: the sender's bytes, all of them.

use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

/// Kind of the message that releases an armed slot.
pub const RELEASE: u8 = 24;

static PREARMED: AtomicU64 = AtomicU64::new(0);
static RELEASED: AtomicU64 = AtomicU64::new(0);
static TAKEN: AtomicU64 = AtomicU64::new(0);

/// What every shm endpoint of this process did with armed sends: for tests, which must know
/// which way a send went without timing it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Announcements written into an armed slot.
    pub prearmed: u64,
    /// Armed slots released to their receiver by a RELEASE message.
    pub released: u64,
    /// Armed slots' frames taken in by a receiver.
    pub taken: u64,
}

/// What the armed sends of every shm endpoint of this process did so far.
pub fn counts() -> Counts {
    Counts {
        prearmed: PREARMED.load(Ordering::Relaxed),
        released: RELEASED.load(Ordering::Relaxed),
        taken: TAKEN.load(Ordering::Relaxed),
    }
}

/// The sender's armed slots.
pub(super) struct Slots {
    free: Vec<u32>,
    /// Released slots: the peer, the slot, and where in the peer's lane its RELEASE message
    /// starts (free again once the peer's tail is past it).
    released: Vec<(PeerId, u32, u64)>,
}

impl Default for Slots {
    fn default() -> Self {
        Slots {
            free: (0..ring::ARMED_SLOTS as u32).rev().collect(),
            released: Vec::new(),
        }
    }
}

impl Net {
    /// Keeps `ctrl` (an armed send's announcement to `p`) in a free armed slot: its number,
    /// or `None` (too long, or every slot in use).
    pub fn prearm(&mut self, p: PeerId, ctrl: &[u8]) -> Option<u32> {
        if ctrl.len() > ring::ARMED_MAX || self.links.get(p).is_none_or(|l| l.dead) {
            return None;
        }
        if self.armed.free.is_empty() {
            self.reclaim_armed();
        }
        let slot = self.armed.free.pop()?;
        ring::write_armed(&self.seg, slot as usize, ctrl);
        PREARMED.fetch_add(1, Ordering::Relaxed);
        Some(slot)
    }

    /// Writes the RELEASE message of `slot` into our lane in `p`'s segment, behind what we
    /// wrote there before; `false` if it cannot go now (a frame to `p` is partly written, or
    /// the ring is full), the slot then still the caller's.
    pub fn release(&mut self, p: PeerId, slot: u32) -> bool {
        if self.writing_to(p) {
            return false;
        }
        let link = &mut self.links[p];
        let (Some(prod), Some(seg)) = (link.prod.as_mut(), link.seg.as_ref()) else {
            return false;
        };
        let at = prod.head();
        let written = prod.write_raw(seg, RELEASE, 0, 4, CTRL_SPARE, |b| {
            b.copy_from_slice(&slot.to_le_bytes())
        });
        if !written {
            return false;
        }
        link.wrote = true;
        self.wrote = true;
        self.armed.released.push((p, slot, at));
        RELEASED.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Frees `slot`, never released.
    pub fn unarm(&mut self, slot: u32) {
        debug_assert!(!self.armed.free.contains(&slot));
        self.armed.free.push(slot);
    }

    /// Frees the released slots their receivers have read past (or will never read).
    fn reclaim_armed(&mut self) {
        let links = &self.links;
        let free = &mut self.armed.free;
        self.armed.released.retain(|&(p, slot, at)| {
            let l = &links[p];
            let read = match (&l.prod, &l.seg) {
                (Some(prod), Some(seg)) if !l.dead => prod.consumed(seg) > at,
                _ => true,
            };
            if read {
                free.push(slot);
            }
            !read
        });
    }

    /// A RELEASE message from `p` on `lane` (`bytes`, from after its slot header): the frame
    /// in the armed slot it names, in `p`'s segment, taken in as a frame on the lane would
    /// be. `Ok(false)`: the frame must wait (the message stays at the lane's head, and the
    /// slot stays `p`'s to keep until we read past it).
    pub(super) fn on_release(
        &mut self,
        g: &mut Glue<'_>,
        lane: usize,
        p: PeerId,
        bytes: &[u8],
    ) -> std::result::Result<bool, String> {
        let slot = bytes
            .get(..4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or("a short release message")?;
        // Its segment gone: the peer is, and nothing it armed will be read.
        let Some(seg) = self.links[p].seg.as_ref() else {
            return Ok(true);
        };
        let mut frame = [0u8; ring::ARMED_MAX];
        let len = ring::read_armed(seg, slot, &mut frame)
            .ok_or_else(|| format!("a release of armed slot {slot}, out of range or too long"))?;
        let took = self.on_frame(g, lane, p, &frame[..len])?;
        if took {
            TAKEN.fetch_add(1, Ordering::Relaxed);
        }
        Ok(took)
    }
}
