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
//!
//! Answers. A released send is finished at the receiver when it has copied the data (an
//! `Ack` of status 0). Rather than one frame each, the receiver counts the sender's released
//! sends it finished in the order they were released, in a word of the header of its own
//! lane to the sender (`ring::store_count`: its producer alone writes it, zeroed before the
//! lane's CONNECT), next to where its head stood when it moved the count, and the sender
//! finishes as many of its released sends, oldest first, when it sees the count move: a CPU
//! XPU that rang 64 buckets leaves its host one word to read instead of 64 frames, each a
//! line from the receiver's core. Only the oldest released send not answered yet is answered
//! so, and only by an `Ack` of status 0; any other answer (an `Ack` of a send that finished
//! out of order, a failure, a `Cts`) goes as a frame, on the same lane, as before, and takes
//! its send out of both sides' lists. The sender reads the count and the head, and applies
//! the count once it has read its lane up to that head: a frame that answered an older send
//! was written before the count moved past a newer one, so the oldest left then is the one
//! the count means. A count that runs past what was released drops the peer, as garbage;
//! the last count a closing or lost peer left is applied before its sends fail with it. The
//! count is in the sender's own segment, so its lock-free look for work (`has_work`) reads
//! it, and the receiver wakes a sleeping sender after moving it as after a frame.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use xfabric_core::rdm::wire::{self, Frame};

use super::*;

/// Kind of the message that releases an armed slot.
pub const RELEASE: u8 = 24;

static PREARMED: AtomicU64 = AtomicU64::new(0);
static RELEASED: AtomicU64 = AtomicU64::new(0);
static TAKEN: AtomicU64 = AtomicU64::new(0);
static COUNTED: AtomicU64 = AtomicU64::new(0);

/// Released sends a receiver may have taken and not answered before it answers every later
/// one by frame (a sender that never lets them finish must not grow the list without end).
const TAKEN_MAX: usize = 4096;

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
    /// Released sends finished by their receiver's count rather than an answer frame (at
    /// the sender).
    pub counted: u64,
}

/// What the armed sends of every shm endpoint of this process did so far.
pub fn counts() -> Counts {
    Counts {
        prearmed: PREARMED.load(Ordering::Relaxed),
        released: RELEASED.load(Ordering::Relaxed),
        taken: TAKEN.load(Ordering::Relaxed),
        counted: COUNTED.load(Ordering::Relaxed),
    }
}

/// The sender's armed slots.
pub(super) struct Slots {
    free: Vec<u32>,
    /// Released slots: the peer, the slot, and where in the peer's lane its RELEASE message
    /// starts (free again once the peer's tail is past it).
    released: Vec<(PeerId, u32, u64)>,
    /// Released sends not answered yet, every peer's (`TxAcks::released`).
    pub(super) unanswered: usize,
    /// (peer, its lane to us, its count, its head then) read at the start of a progress call
    /// (`look_at_counts`).
    counts: Vec<(PeerId, usize, u32, u64)>,
}

impl Default for Slots {
    fn default() -> Self {
        Slots {
            free: (0..ring::ARMED_SLOTS as u32).rev().collect(),
            released: Vec::new(),
            unanswered: 0,
            counts: Vec::new(),
        }
    }
}

/// The sender's side of one peer's answers by count.
#[derive(Debug, Default)]
pub(super) struct TxAcks {
    /// Tokens of the sends released to the peer, in release order, not answered yet.
    released: VecDeque<u64>,
}

/// The receiver's side of one peer's answers by count.
#[derive(Debug, Default)]
pub(super) struct RxAcks {
    /// The peer's request ids of its released sends we took, in order, not answered yet.
    taken: VecDeque<u32>,
    /// The count last stored in our lane to it (`ring::store_count`).
    done: u32,
    /// Every answer goes as a frame from now on (`TAKEN_MAX` were unanswered at once).
    frames_only: bool,
}

/// Lock-free (`Net::has_work`): whether a count awaited in `seg` moved since it was applied,
/// and the lane is read up to the head that came with it (one still ahead waits for frames,
/// which `has_work` sees arrive: a peer whose head runs ahead of what it wrote keeps nobody
/// from sleeping). Only lanes of peers our released sends wait on are looked at: another's
/// count says nothing we wait for.
#[inline]
pub(super) fn counted(seg: &Segment, idle: &Idle) -> bool {
    let lanes = idle.count_lanes.load(Ordering::Relaxed);
    lanes != 0
        && bits(lanes).any(|l| {
            ring::load_count(seg, l).is_some_and(|(c, head)| {
                c != idle.count_seen[l].load(Ordering::Relaxed)
                    && read_up_to(idle.pos[l].load(Ordering::Relaxed), head)
            })
        })
}

/// Whether a consumer at position `pos` has read up to `head` (positions wrap).
fn read_up_to(pos: u64, head: u64) -> bool {
    pos.wrapping_sub(head) < 1 << 63
}

/// Whether a consumer at position `pos` has read past `at`, the message written there
/// (positions wrap).
fn read_past(pos: u64, at: u64) -> bool {
    pos != at && read_up_to(pos, at)
}

/// The request id of the `Rts` in `frame` (an armed slot's bytes), if that is what it holds.
fn rts_id(frame: &[u8]) -> Option<u32> {
    match wire::decode_all(frame) {
        Ok((Frame::Rts { id, .. }, _)) => Some(id),
        _ => None,
    }
}

/// The initiator's request id of an answer to an `Rts` (an `Ack`, with its status, or a
/// `Cts`) in `pre` and `ctrl` (a frame's prefix and control part).
fn answer_of(pre: &wire::Prefix, ctrl: &[u8]) -> Option<(u32, Option<i32>)> {
    if pre.kind != wire::Kind::Ack as u8 && pre.kind != wire::Kind::Cts as u8 {
        return None;
    }
    match wire::decode(pre, ctrl) {
        Ok(Frame::Ack { id, status }) => Some((id, Some(status))),
        Ok(Frame::Cts { id, .. }) => Some((id, None)),
        _ => None,
    }
}

/// `answer_of` of an encoded frame of no body (what the engine hands the transport).
fn answer_in(encoded: &[u8]) -> Option<(u32, Option<i32>)> {
    let pre = wire::prefix(encoded).ok()?;
    answer_of(&pre, encoded.get(wire::PREFIX..)?)
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
    pub fn release(&mut self, p: PeerId, slot: u32, token: u64) -> bool {
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
        let first = link.tx_acks.released.is_empty();
        link.tx_acks.released.push_back(token);
        self.wrote = true;
        self.armed.released.push((p, slot, at));
        self.armed.unanswered += 1;
        if first {
            self.refresh_counts();
        }
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
                // Read past `at`, positions wrapping (the lane's tail, where our producer
                // started, is whatever its last holder left).
                (Some(prod), Some(seg)) if !l.dead => read_past(prod.consumed(seg), at),
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
        // Noted before the engine sees it: its answer may go out within the call.
        let acks = &mut self.links[p].rx_acks;
        let noted = match rts_id(&frame[..len]) {
            Some(id) if !acks.frames_only => {
                if acks.taken.len() < TAKEN_MAX {
                    acks.taken.push_back(id);
                    true
                } else {
                    acks.frames_only = true;
                    acks.taken.clear();
                    false
                }
            }
            _ => false,
        };
        let took = self.on_frame(g, lane, p, &frame[..len])?;
        if took {
            TAKEN.fetch_add(1, Ordering::Relaxed);
        } else if noted {
            self.links[p].rx_acks.taken.pop_back();
        }
        Ok(took)
    }

    /// Receiver: `ctrl`, an encoded frame of no body going to `p`, answered by the count
    /// instead when it is the `Ack` of status 0 of the oldest released send taken from `p`
    /// (`true`: nothing to write).
    pub(super) fn count_answer(&mut self, p: PeerId, ctrl: &[u8]) -> bool {
        let link = &self.links[p];
        let Some(&front) = link.rx_acks.taken.front() else {
            return false;
        };
        if answer_in(ctrl) != Some((front, Some(0))) || link.out.is_some() {
            return false;
        }
        // Our lane to it, where the count lives (claimed now if we never wrote to it: a frame
        // would claim it too).
        if link.prod.is_none() && self.ensure_lane(p).is_err() {
            return false;
        }
        let id = self.id;
        let link = &mut self.links[p];
        let (Some(prod), Some(seg)) = (link.prod.as_ref(), link.seg.as_ref()) else {
            return false;
        };
        // Not a lane the peer took back (and may have given another): the frame goes, and
        // finds out.
        if ring::claim(seg, prod.lane()).load(Ordering::Acquire) != id {
            return false;
        }
        let acks = &mut link.rx_acks;
        acks.taken.pop_front();
        acks.done = acks.done.wrapping_add(1);
        ring::store_count(seg, prod.lane(), id, acks.done, prod.head());
        // It may sleep: looked at as after a frame written to it.
        link.wrote = true;
        self.wrote = true;
        true
    }

    /// Receiver: an answer in `ctrl` went to `p` as a frame: the send it answers is no
    /// longer waiting to be counted (what follows for it, if anything, goes as frames).
    pub(super) fn answered_by_frame(&mut self, p: PeerId, ctrl: &[u8]) {
        let taken = &mut self.links[p].rx_acks.taken;
        if taken.is_empty() {
            return;
        }
        if let Some((id, _)) = answer_in(ctrl) {
            if let Some(i) = taken.iter().position(|&t| t == id) {
                taken.remove(i);
            }
        }
    }

    /// Sender: a frame from `p` (prefix `pre`, control part `ctrl`) that answers one of our
    /// released sends: that send is no longer waiting for the count.
    pub(super) fn frame_answered(&mut self, p: PeerId, pre: &wire::Prefix, ctrl: &[u8]) {
        let Some((id, _)) = answer_of(pre, ctrl) else {
            return;
        };
        let released = &mut self.links[p].tx_acks.released;
        if let Some(i) = released.iter().position(|&t| t as u32 == id) {
            released.remove(i);
            self.armed.unanswered -= 1;
            if released.is_empty() {
                self.refresh_counts();
            }
        }
    }

    /// Sender, at the start of a progress call: reads the count of every peer our released
    /// sends wait on, before its lane is read (`apply_counts` applies them after).
    #[inline]
    pub(super) fn look_at_counts(&mut self) {
        if self.armed.unanswered > 0 {
            self.look_at_counts_now();
        }
    }

    #[inline(never)]
    fn look_at_counts_now(&mut self) {
        debug_assert!(self.armed.counts.is_empty(), "apply_counts empties it");
        for (p, l) in self.links.iter().enumerate() {
            if l.tx_acks.released.is_empty() || l.dead {
                continue;
            }
            // No lane from it yet: it has counted nothing.
            let Some(lane) = l.rx_lane else {
                continue;
            };
            // A pair read before and not applied yet stays (see `count_pending`), unless the
            // word now holds one whose head this lane is already read up to: that one is
            // applied, as `counted` (which reads only the word) expects. Otherwise a peer
            // that wrote a head far ahead, then a moved count with a head it reached, would
            // keep `has_work` true and a waiter from ever sleeping, the kept pair never
            // applied.
            let live = ring::load_count(&self.seg, lane);
            let pair = match (self.count_pending[lane], live) {
                (Some(_), Some(now)) if read_up_to(self.cons[lane].pos(), now.1) => Some(now),
                (Some(kept), _) => Some(kept),
                (None, live) => live,
            };
            if let Some((w, head)) = pair {
                self.armed.counts.push((p, lane, w, head));
            }
        }
    }

    /// Sender, once every lane was read: finishes the released sends each count read by
    /// `look_at_counts` covers, where the peer's lane to us was read up to the head it gave
    /// with the count (a frame it answered an older send with may be behind). How many
    /// finished.
    #[inline(never)]
    pub(super) fn apply_counts(&mut self, g: &mut Glue<'_>) -> usize {
        let mut n = 0;
        let mut counts = std::mem::take(&mut self.armed.counts);
        for &(p, lane, w, head) in &counts {
            // The same lane still (not dropped meanwhile), read up to the head.
            if self.links[p].rx_lane == Some(lane) && !self.links[p].dead {
                n += self.apply_count(g, p, lane, w, head, false);
            }
        }
        // Emptied for the next call (which reads none while nothing is released).
        counts.clear();
        self.armed.counts = counts;
        n
    }

    /// Finishes the released sends to `p` that its count `w` (with its head `head`) on our
    /// `lane` covers, once that lane is read up to the head. A count past what was released
    /// drops `p`, as garbage, unless `last` (a peer closing or lost: as many as there are).
    fn apply_count(
        &mut self,
        g: &mut Glue<'_>,
        p: PeerId,
        lane: usize,
        w: u32,
        head: u64,
        last: bool,
    ) -> usize {
        if !read_up_to(self.cons[lane].pos(), head) {
            self.count_pending[lane] = Some((w, head));
            return 0;
        }
        self.count_pending[lane] = None;
        let k = u64::from(w.wrapping_sub(self.count_seen[lane]));
        if k == 0 {
            return 0;
        }
        let len = self.links[p].tx_acks.released.len();
        if k > len as u64 && !last {
            let why = format!(
                "its count of armed sends finished moved by {k}, past the {len} released to it"
            );
            self.garbage(g, p, Some(lane), &why);
            return 0;
        }
        let k = k.min(len as u64) as usize;
        self.count_seen[lane] = w;
        let mut acked = 0;
        for _ in 0..k {
            let t = self.links[p]
                .tx_acks
                .released
                .pop_front()
                .expect("counted above");
            acked += u64::from(g.engine.armed_acked(p, t));
        }
        self.armed.unanswered -= k;
        COUNTED.fetch_add(acked, Ordering::Relaxed);
        self.refresh_counts();
        k
    }

    /// Sender: `p`, whose lane to us is `lane`, closes or is lost, that lane read to its end:
    /// the released sends its last count covers finish before the rest fail with it.
    pub(super) fn last_count(&mut self, g: &mut Glue<'_>, p: PeerId, lane: usize) {
        if self.links[p].tx_acks.released.is_empty() {
            return;
        }
        self.count_pending[lane] = None;
        if let Some((w, head)) = ring::load_count(&self.seg, lane) {
            self.apply_count(g, p, lane, w, head, true);
        }
    }

    /// Refreshes the lock-free mirrors of the counts awaited (`Idle::count_lanes` and the
    /// counts applied), where what they show changed: a peer waited on or not any more, its
    /// lane, a count applied. Done there rather than in `publish`, which every call makes.
    #[inline(never)]
    pub(super) fn refresh_counts(&self) {
        let unanswered = self.armed.unanswered > 0;
        let mut lanes = 0u64;
        if unanswered {
            for l in &self.links {
                if let Some(lane) = l.rx_lane.filter(|_| !l.tx_acks.released.is_empty()) {
                    lanes |= 1 << lane;
                    self.idle.count_seen[lane].store(self.count_seen[lane], Ordering::Relaxed);
                }
            }
        }
        self.idle.count_lanes.store(lanes, Ordering::Relaxed);
    }

    /// Whether `look_at_counts` read no count this call.
    #[inline]
    pub(super) fn armed_counts_empty(&self) -> bool {
        self.armed.counts.is_empty()
    }

    /// `p` is lost: our sends released to it failed with it, and its released to us are
    /// nobody's to answer.
    pub(super) fn forget_acks(&mut self, p: PeerId) {
        let link = &mut self.links[p];
        self.armed.unanswered -= link.tx_acks.released.len();
        let had = !link.tx_acks.released.is_empty();
        link.tx_acks.released.clear();
        link.rx_acks.taken.clear();
        link.rx_acks.frames_only = false;
        if had {
            self.refresh_counts();
        }
    }

    /// Our lane to `p` was claimed: our count there starts again from 0 (zeroed before its
    /// CONNECT, from which `p` counts).
    pub(super) fn count_from_zero(&mut self, p: PeerId) {
        self.links[p].rx_acks.done = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A released slot is reclaimed once its receiver read past its RELEASE, also across the
    /// wrap of a lane whose tail its last holder left near the end of the positions.
    #[test]
    fn a_release_is_read_past_across_the_wrap() {
        let at = u64::MAX - 2;
        assert!(!read_past(at, at), "not read yet");
        assert!(!read_past(at - 1, at), "behind it");
        assert!(read_past(at + 1, at));
        assert!(read_past(5, at), "past it, the position wrapped");
        assert!(!read_past(at.wrapping_sub(1 << 62), at), "far behind");
    }
}
