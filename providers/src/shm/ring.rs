//! The segment layout and its single-producer rings.
//!
//! A segment is a header followed by `LANES` lanes. A sender claims one lane in the receiver's
//! segment and is its only producer; the receiver is its only consumer. A lane is a ring of
//! 64-byte slots. A message takes one or more consecutive slots (never wrapping: a pad message
//! fills the end of the ring instead). Its first slot starts with the sequence word and the
//! slot header; what follows, to the end of its slots, is its bytes, which `super::net` gives
//! meaning (the engine's frames). The producer writes the bytes and slot header first and the sequence word
//! last (release); the consumer polls only the sequence word of its next slot (acquire).
//!
//! The consumer never writes a slot: a slot's line goes from the producer's core to the
//! consumer's and back only with the messages themselves. So the producer keeps what the
//! consumer will poll meaningful: the later slots of a longer message hold its bytes where a
//! sequence word would be, which could equal the position the consumer looks for there in a
//! later lap; the producer remembers such slots (`Producer::dirty`) and, before it publishes
//! a message, clears the word of the slot after it if that slot is one. Every slot the consumer
//! polls is then 0, published, or an older lap's sequence word.
//!
//! ```text
//! first slot: 0 seq:u32 | 4 kind:u8 | 5 flags:u8 | 6 nslots:u16 | 8.. the message's bytes
//! next slots: 64 bytes each
//! ```
//!
//! A lane's first message (CONNECT, the sender's segment name) and its last (BYE) carry a
//! `Header` in their bytes: `8 len:u32 | 12..32 zero | 32.. len bytes`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::segment::Segment;

/// Lanes (distinct senders) per endpoint.
pub const LANES: usize = 64;
/// Slots per lane.
pub const SLOTS: usize = 2048;
/// Bytes per slot.
pub const SLOT: usize = 64;
/// Slots of a lane that requests leave free for answers (acknowledgements, CTS, read and
/// atomic responses: one or two slots each).
pub const CTRL_SPARE: usize = 64;
/// Bytes of a message's slot header: the sequence word, kind, flags, slot count.
pub const RAW_HDR: usize = 8;
/// Slots written after a `Producer::rewind` found the consumer behind, before it asks again.
const REWIND_RETRY: u64 = 64;
/// The longest message, in slots, that `Producer::rewind`s (8 KiB).
const REWIND_MAX: usize = 128;
/// Bytes a `Header` message's payload starts at in its first slot.
const HDR: usize = 32;
const LANE_HDR: usize = 128;
const LANE_BYTES: usize = LANE_HDR + SLOTS * SLOT;
/// Bytes before the first lane.
pub const SEG_HDR: usize = 4096;
/// Armed sends' announcements the owner keeps for their receivers, after the lanes: slots
/// the owner writes when it arms a send and a receiver reads once told to (`super::net`'s
/// RELEASE message), each a length word then the frame.
pub const ARMED_SLOTS: usize = 128;
/// Bytes per armed slot.
pub const ARMED_SLOT: usize = 256;
/// Largest frame an armed slot holds.
pub const ARMED_MAX: usize = ARMED_SLOT - 8;
/// Where the armed slots start.
const ARMED_OFF: usize = SEG_HDR + LANES * LANE_BYTES;
/// Total segment size.
pub const SEG_BYTES: usize = ARMED_OFF + ARMED_SLOTS * ARMED_SLOT;

/// Header offsets.
pub const OFF_MAGIC: usize = 0;
/// Number of threads of the owner sleeping until a message arrives.
pub const OFF_SLEEPING: usize = 64;
/// Futex word: bumped by a sender that saw a sleeper, so a wait that has not started yet
/// returns at once instead of missing the wake-up.
pub const OFF_DOORBELL: usize = 68;
/// The owner's pid, the address the owner mapped the segment at, and a random cookie: a peer
/// reads the cookie through that pid with cross-memory attach to learn whether the pid really
/// names the owner (pid namespaces, reuse) before it ever copies through it.
pub const OFF_PID: usize = 72;
/// See `OFF_PID`.
pub const OFF_BASE: usize = 80;
/// See `OFF_PID`.
pub const OFF_COOKIE: usize = 88;
/// Set while the owner may sleep on its wake socket (`super::fdwake`) rather than the
/// futex: a sender then rings the socket too. Bit 0 (`FD_TRYWAIT`) is a sleep through
/// `fi_trywait`, cleared by the owner's next progress call, whichever thread makes it (that
/// application polls then); bits 1 to 30 count joint sleeps (`FD_JOINT` each: a progress
/// thread asleep on several endpoints at once), which a progress call that finds the word
/// raised puts back to the owner's own count, so another thread's call leaves them
/// standing; bit 31 (`FD_UNREACHABLE`) is set by a sender whose datagram could not reach the
/// socket (another network namespace): from then on the owner takes no joint sleep
/// (`fi_trywait`'s sleeps go on as before).
pub const OFF_FD_SLEEPING: usize = 96;
/// See `OFF_FD_SLEEPING`.
pub const FD_TRYWAIT: u32 = 1;
/// See `OFF_FD_SLEEPING`.
pub const FD_JOINT: u32 = 2;
/// See `OFF_FD_SLEEPING`.
pub const FD_UNREACHABLE: u32 = 1 << 31;
/// The random number in the name of the owner's wake socket (`super::fdwake`), written once
/// it is bound (0 before): senders ring the socket of that name.
pub const OFF_WAKE_NONCE: usize = 112;
/// The descriptor the owner holds its segment open (and locked) on: where a peer looks for
/// the owner's lock (`verified`).
pub const OFF_OWNER_FD: usize = 104;
/// Bit i set: lane i is claimed and may hold messages.
pub const OFF_ACTIVE: usize = 128;
/// Lane claims: the claiming sender's id, 0 when free.
pub const OFF_CLAIM: usize = 192;
/// Identifies a segment of this layout.
/// "XFSHM03" (little-endian-ish): 03 since the wake socket's name took a nonce from the
/// header (`OFF_WAKE_NONCE`); a peer of another layout is refused, not woken wrongly.
pub const MAGIC: u64 = 0x3330_4d48_5346_5846;

/// Message kinds of the ring itself.
pub mod kind {
    /// Fills the end of the ring; skipped.
    pub const PAD: u8 = 1;
    /// First message on a lane: the sender's name.
    pub const CONNECT: u8 = 2;
    /// The sender is closing this lane.
    pub const BYE: u8 = 8;
    // 3 to 7 and 9 to 17: shm's first protocol, retired for the engine's; 20 and 21: the
    // engine's framing (`super::net::FRAME`, `PIECE`); 22 and 23: split copies
    // (`super::net::SPLIT`, `SPLIT_DONE`); 24: an armed slot released (`super::net::RELEASE`).
}

/// The header of a lane's CONNECT and BYE messages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub kind: u8,
    /// Payload bytes.
    pub len: u32,
}

/// Byte offset of lane `i` in a segment.
pub fn lane_off(i: usize) -> usize {
    SEG_HDR + i * LANE_BYTES
}

/// Where lane `i` lies in a segment: (offset, bytes).
pub fn lane_span(i: usize) -> (usize, usize) {
    (lane_off(i), LANE_BYTES)
}

/// Where the armed slots lie in a segment: (offset, bytes).
pub fn armed_span() -> (usize, usize) {
    (ARMED_OFF, ARMED_SLOTS * ARMED_SLOT)
}

/// Offset of the lane's tail word (slots consumed, written by the consumer).
fn tail_off(i: usize) -> usize {
    lane_off(i)
}

/// Offset of the lane's count of armed sends finished, on the lane header's second line, and
/// of where its producer's head stood when it last moved the count, after it (`armed_done`).
fn armed_done_off(i: usize) -> usize {
    lane_off(i) + 64
}

/// The words of `lane`'s header holding the count, kept by its producer, of the consumer's
/// armed sends released to it that it finished in order (`super::net::armed`), and where its
/// head stood when it moved the count last (every message before that position was written
/// before the count). The count word carries the low 32 bits of its writer's claim on the
/// lane (`claim`) above the count, so that a count stored by a producer that has lost the
/// lane counts nothing for the one that claimed it next.
fn armed_done(seg: &Segment, lane: usize) -> (&AtomicU64, &AtomicU64) {
    assert!(lane < LANES);
    let off = armed_done_off(lane);
    // SAFETY: both 8-aligned inside the lane header, which lies inside the segment.
    unsafe { (seg.u64_at(off), seg.u64_at(off + 8)) }
}

/// The producer holding claim `claim_id` on `lane` stores its count and its head: the head
/// first, so that a consumer that sees the count sees where the messages before it end.
pub fn store_count(seg: &Segment, lane: usize, claim_id: u64, count: u32, head: u64) {
    let (c, h) = armed_done(seg, lane);
    h.store(head, Ordering::Relaxed);
    c.store(
        (claim_id & 0xffff_ffff) << 32 | u64::from(count),
        Ordering::Release,
    );
}

/// The consumer's read of `lane`'s (count, head), if the lane's present holder stored the
/// count (a peer's words, which may say anything else). The count is read first: the head
/// then is at least the one stored with it.
pub fn load_count(seg: &Segment, lane: usize) -> Option<(u32, u64)> {
    let (c, h) = armed_done(seg, lane);
    let word = c.load(Ordering::Acquire);
    let claim_id = claim(seg, lane).load(Ordering::Acquire);
    (word >> 32 == claim_id & 0xffff_ffff).then(|| (word as u32, h.load(Ordering::Relaxed)))
}

/// Writes `frame` into armed slot `slot` of our own segment (`frame.len() <= ARMED_MAX`,
/// `slot < ARMED_SLOTS`). A receiver reads it only after the RELEASE message naming it,
/// published after this.
pub fn write_armed(seg: &Segment, slot: usize, frame: &[u8]) {
    write_armed_as(seg, slot, frame.len() as u64, frame);
}

/// `write_armed` with `len` as the slot's length word, whatever `frame` holds (a raw peer's,
/// which may lie).
pub fn write_armed_as(seg: &Segment, slot: usize, len: u64, frame: &[u8]) {
    assert!(slot < ARMED_SLOTS && frame.len() <= ARMED_MAX && seg.len() >= SEG_BYTES);
    // SAFETY: the slot lies inside SEG_BYTES (checked above); it is ours to write until a
    // receiver is told to read it, and 8-aligned (ARMED_OFF and ARMED_SLOT are).
    unsafe {
        let p = seg.base().add(ARMED_OFF + slot * ARMED_SLOT);
        (p as *mut u64).write(len);
        std::ptr::copy_nonoverlapping(frame.as_ptr(), p.add(8), frame.len());
    }
}

/// Copies armed slot `slot` of a peer's segment into `out`: its frame's length, or `None`
/// for a slot out of range or a length past `ARMED_MAX` (the peer's bytes, all of them).
pub fn read_armed(seg: &Segment, slot: usize, out: &mut [u8; ARMED_MAX]) -> Option<usize> {
    if slot >= ARMED_SLOTS || seg.len() < SEG_BYTES {
        return None;
    }
    // SAFETY: the slot lies inside the segment (checked above), 8-aligned. The peer may
    // write it while we read (a broken or hostile one): it is copied once, then parsed from
    // the copy.
    unsafe {
        let p = seg.base().add(ARMED_OFF + slot * ARMED_SLOT);
        let len = (p as *const u64).read_volatile();
        let len = usize::try_from(len).ok().filter(|n| *n <= ARMED_MAX)?;
        std::ptr::copy_nonoverlapping(p.add(8), out.as_mut_ptr(), len);
        Some(len)
    }
}

fn slot_ptr(seg: &Segment, lane: usize, idx: usize) -> *mut u8 {
    // SAFETY (of the arithmetic): lane < LANES and idx < SLOTS keep it inside SEG_BYTES.
    debug_assert!(lane < LANES && idx < SLOTS);
    unsafe { seg.base().add(lane_off(lane) + LANE_HDR + idx * SLOT) }
}

/// The sequence word that publishes the message at position `pos`: never 0 (what a cleared
/// word holds), and never the value the same slot held a lap before. Positions are counted
/// from a lane's tail word, which a peer writes: the arithmetic wraps instead of trusting it.
/// The low 32 bits plus one, with the one position where that wraps to 0 (the last slot,
/// every 2^32 positions) given 1: its slot's other values are multiples of `SLOTS`.
#[inline(always)]
fn seq_at(pos: u64) -> u32 {
    (pos as u32).wrapping_add(1).max(1)
}

fn seq_of(p: *mut u8) -> &'static AtomicU32 {
    // SAFETY: slots are 64-byte aligned inside a live mapping; callers keep the segment alive
    // for as long as they use the reference (it never escapes a method call).
    unsafe { &*(p as *const AtomicU32) }
}

/// The producer side of one lane (lives in the sender).
#[derive(Debug)]
pub struct Producer {
    lane: usize,
    head: u64,
    cached_tail: u64,
    broken: bool,
    /// One bit per slot: its sequence word may hold bytes other than an older lap's sequence
    /// word (a later slot of a message written here, or anything before this producer: every
    /// slot at first). Cleared where a message starts, or when the word is cleared.
    dirty: [u64; SLOTS / 64],
    /// No `rewind` before the head reaches this position.
    rewind_at: u64,
    /// The last message written took more than one slot: the next may `rewind`, which
    /// reads the consumer's tail (`wants_tail`).
    multi: bool,
}

impl Producer {
    /// A producer for `lane`, starting where the consumer's tail is.
    pub fn new(seg: &Segment, lane: usize) -> Self {
        // SAFETY: the tail word is 8-aligned inside the lane header.
        let tail = unsafe { seg.u64_at(tail_off(lane)) }.load(Ordering::Acquire);
        Producer {
            lane,
            head: tail,
            cached_tail: tail,
            broken: false,
            // A lane a previous sender used may hold its messages' bytes anywhere.
            dirty: [u64::MAX; SLOTS / 64],
            rewind_at: tail,
            multi: false,
        }
    }

    /// Marks slots `from..to` (within one lap) dirty: the partial words at either end by
    /// masks, the whole words between by one fill (a pad that rewinds marks most of the ring).
    #[inline(never)]
    fn mark_dirty(&mut self, from: usize, to: usize) {
        if from >= to {
            return;
        }
        let bits = |lo: usize, hi: usize| -> u64 {
            // Bits lo..hi of one word, 0 <= lo < hi <= 64.
            (u64::MAX >> (64 - (hi - lo))) << lo
        };
        let (w0, w1) = (from / 64, (to - 1) / 64);
        if w0 == w1 {
            self.dirty[w0] |= bits(from % 64, (to - 1) % 64 + 1);
            return;
        }
        self.dirty[w0] |= bits(from % 64, 64);
        self.dirty[w0 + 1..w1].fill(u64::MAX);
        self.dirty[w1] |= bits(0, (to - 1) % 64 + 1);
    }

    fn free(&mut self, seg: &Segment, need: usize) -> bool {
        if seg.faulted() {
            // Truncated under us (`super::guard`): what we would write reaches no one.
            self.broken = true;
            return false;
        }
        let used = self.head.wrapping_sub(self.cached_tail);
        if used <= SLOTS as u64 && SLOTS as u64 - used >= need as u64 {
            return true;
        }
        // SAFETY: as in new().
        self.cached_tail = unsafe { seg.u64_at(tail_off(self.lane)) }.load(Ordering::Acquire);
        let used = self.head.wrapping_sub(self.cached_tail);
        if used > SLOTS as u64 {
            // The consumer's tail is ahead of what we wrote: the peer is corrupt or hostile.
            self.broken = true;
            return false;
        }
        SLOTS as u64 - used >= need as u64
    }

    /// Whether the peer's tail word made no sense (the lane cannot be used any more).
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// Where the next message will start (a count of slots written, every lap).
    pub fn head(&self) -> u64 {
        self.head
    }

    /// The lane this producer writes.
    pub fn lane(&self) -> usize {
        self.lane
    }

    /// Starts fetching the consumer's tail word, which the next `rewind` reads: worth it where
    /// that rewind will read it (`wants_tail`; a message of one slot never rewinds). Called
    /// when the consumer's side sent us something (a reply, an answer), by which time it has
    /// often read all we wrote: the rewind's read then finds the line here instead of paying
    /// a transfer on the send's path (a 4 KiB ping-pong, pinned, medians of 16 alternating
    /// runs: 0.69 -> 0.62 us a one-way trip; 8 B to 64 KiB otherwise unchanged).
    #[inline]
    pub fn prefetch_tail(&self, seg: &Segment) {
        #[cfg(not(target_arch = "x86_64"))]
        let _ = seg;
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch never faults; the tail word lies inside the lane header.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(seg.base().add(tail_off(self.lane)).cast::<i8>());
        }
    }

    /// Whether the next `rewind` may read the consumer's tail word (`prefetch_tail`): the
    /// last message took more than one slot, and no rewind found the consumer behind within
    /// the last `REWIND_RETRY` slots (a stream both ways reads the word that seldom, and the
    /// line would only travel for nothing).
    #[inline]
    pub fn wants_tail(&self) -> bool {
        self.multi && self.may_ask()
    }

    /// Whether a `rewind` may read the consumer's tail word now: not within `REWIND_RETRY`
    /// slots of finding the consumer behind.
    #[inline]
    fn may_ask(&self) -> bool {
        self.head.wrapping_sub(self.rewind_at) < 1 << 63
    }

    /// How far the consumer has read (its tail word, now).
    pub fn consumed(&self, seg: &Segment) -> u64 {
        // SAFETY: as in new().
        unsafe { seg.u64_at(tail_off(self.lane)) }.load(Ordering::Acquire)
    }

    /// Writes a CONNECT or BYE message: `h`, then `payload_len` bytes that `fill` produces.
    /// Returns false (writing nothing) when the ring has no room.
    pub fn write(
        &mut self,
        seg: &Segment,
        h: &Header,
        payload_len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> bool {
        let at = HDR - RAW_HDR;
        self.write_raw(seg, h.kind, 0, at + payload_len, 0, |b| {
            b[..4].copy_from_slice(&h.len.to_le_bytes());
            b[4..at].fill(0);
            fill(&mut b[at..]);
        })
    }

    /// Writes one message: `kind` and `flags` in the slot header, then `len` bytes that
    /// `fill` produces, from byte `RAW_HDR` of the first slot on. Leaves `spare` slots free
    /// (`CTRL_SPARE` for a request, so that answers to transfers under way always fit, even in
    /// a ring whose receiver has stopped reading new requests: flow control). False (nothing
    /// written) when the ring has no room.
    pub fn write_raw(
        &mut self,
        seg: &Segment,
        kind: u8,
        flags: u8,
        len: usize,
        spare: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> bool {
        let n = raw_slots_for(len);
        // SAFETY: `claim` hands over free slots, ours to write until published.
        let Some(p) = self.claim(seg, n, spare, |p, pad| unsafe {
            write_kind(p, kind::PAD, 0, pad)
        }) else {
            return false;
        };
        // SAFETY: n free, contiguous slots start at p (no wrap: `claim`); the consumer does
        // not read them until the sequence word is published below.
        unsafe {
            write_kind(p, kind, flags, n);
            fill(std::slice::from_raw_parts_mut(p.add(RAW_HDR), len));
        }
        self.publish(seg, p, n);
        true
    }

    /// Whether `write_raw` of `len` bytes leaving `spare` slots free would succeed now.
    pub fn fits_raw(&mut self, seg: &Segment, len: usize, spare: usize) -> bool {
        let n = raw_slots_for(len);
        let pad = self.pad_for(n);
        self.free(seg, n + pad + spare)
    }

    /// Slots a message of `n` slots must skip first (a pad) so as not to wrap the ring.
    fn pad_for(&self, n: usize) -> usize {
        let idx = (self.head % SLOTS as u64) as usize;
        if idx + n > SLOTS {
            SLOTS - idx
        } else {
            0
        }
    }

    /// The pad the next message of `n` slots, leaving `spare` free, goes behind: to the end of
    /// the ring where it would wrap or where it `rewind`s, else none.
    fn pad_before(&mut self, seg: &Segment, n: usize, spare: usize) -> usize {
        match self.pad_for(n) {
            0 => self.rewind(seg, n, spare),
            pad => pad,
        }
    }

    /// A pad to the end of the ring, so that a message of `n` slots starts at the ring's first
    /// slot again, where the consumer has read everything written: 0 where not. A ring
    /// walked from end to end hands the consumer lines its core has not held for a lap (128
    /// KiB ago, long gone from its first-level cache, and from the producer's) and has the
    /// producer fetch them back to write; while the two take turns (a ping-pong, a request
    /// and its answer), starting again at the front keeps both on the same few lines: a 4 KiB
    /// message's 66 lines cost 0.82 -> 0.65 us a one-way trip, 1 KiB 0.41 -> 0.32 (pinned, this
    /// 2-core VM). Asking costs a read of the consumer's tail word, a line its core writes, so
    /// a message of one slot never asks (its line is all it would save), and after an answer
    /// that the consumer is behind nobody asks again until `REWIND_RETRY` more slots are
    /// written: a stream pays one such read per that many. The pad and the message leave
    /// `spare` slots free, as any message must. Until the consumer reads past the pad, the
    /// room left is what lies between the front and the pad (the pad's first slot must stay
    /// as written): so only messages up to `REWIND_MAX` slots go back, never the pieces of a
    /// long one, whose later pieces would wait for the consumer to read the first.
    fn rewind(&mut self, seg: &Segment, n: usize, spare: usize) -> usize {
        let idx = (self.head % SLOTS as u64) as usize;
        if !(2..=REWIND_MAX).contains(&n) || idx < n + spare || !self.may_ask() {
            return 0;
        }
        let tail = self.consumed(seg);
        self.cached_tail = tail;
        if tail == self.head {
            SLOTS - idx
        } else {
            self.rewind_at = self.head.wrapping_add(REWIND_RETRY);
            0
        }
    }

    /// Claims `n` contiguous free slots at the head, leaving `spare` more free, after padding
    /// the end of the ring where the message would wrap (`write_pad` writes that pad
    /// message's slot header): the first slot, or `None` (nothing written) when the ring has
    /// no room.
    fn claim(
        &mut self,
        seg: &Segment,
        n: usize,
        spare: usize,
        write_pad: impl FnOnce(*mut u8, usize),
    ) -> Option<*mut u8> {
        debug_assert!(n <= SLOTS / 2, "message of {n} slots does not fit a lane");
        let pad = self.pad_before(seg, n, spare);
        if !self.free(seg, n + pad + spare) {
            return None;
        }
        if pad > 0 {
            let idx = (self.head % SLOTS as u64) as usize;
            let p = slot_ptr(seg, self.lane, idx);
            write_pad(p, pad);
            // A pad's later slots are not written: they hold what they held.
            self.publish(seg, p, pad);
        }
        let idx = (self.head % SLOTS as u64) as usize;
        Some(slot_ptr(seg, self.lane, idx))
    }

    /// Publishes the run of `n` slots written at the head (`p`): the word of the slot after it
    /// is cleared first if it may hold bytes (the consumer polls it next), the sequence word
    /// written last. The run's later slots are marked dirty: a message's hold its bytes, and a
    /// pad's are not written at all, so they keep a sequence word of the last lap that wrote
    /// them, which may be 2^32 positions ago (a pad that `rewind`s skips most of the ring
    /// every time): the same 32-bit word the consumer will look for there.
    #[inline]
    fn publish(&mut self, seg: &Segment, p: *mut u8, n: usize) {
        let idx = (self.head % SLOTS as u64) as usize;
        self.dirty[idx / 64] &= !(1 << (idx % 64));
        if n > 1 {
            self.mark_dirty(idx + 1, idx + n);
        }
        let next = (idx + n) % SLOTS;
        if self.dirty[next / 64] & (1 << (next % 64)) != 0 {
            // Free: it starts no message still unread (the first slot of one is clean), and
            // a later slot of one cannot follow this run's end.
            seq_of(slot_ptr(seg, self.lane, next)).store(0, Ordering::Relaxed);
            self.dirty[next / 64] &= !(1 << (next % 64));
        }
        seq_of(p).store(seq_at(self.head), Ordering::Release);
        self.head = self.head.wrapping_add(n as u64);
        self.multi = n > 1;
    }
}

/// Slots a message of `len` bytes needs.
pub fn raw_slots_for(len: usize) -> usize {
    (RAW_HDR + len).div_ceil(SLOT).max(1)
}

/// # Safety
/// `p` must point at a slot the caller may write.
unsafe fn write_kind(p: *mut u8, kind: u8, flags: u8, nslots: usize) {
    // SAFETY: per the contract; fields at fixed offsets within the slot.
    unsafe {
        *p.add(4) = kind;
        *p.add(5) = flags;
        (p.add(6) as *mut u16).write(nslots as u16);
    }
}

/// A published message as the consumer sees it, its slot header parsed: valid until the
/// consumer advances past it.
#[derive(Clone, Copy)]
pub struct RawView {
    /// Its kind byte.
    pub kind: u8,
    nslots: usize,
    first: *const u8,
}

impl RawView {
    /// Slots the message takes.
    pub fn slots(&self) -> usize {
        self.nslots
    }

    /// The bytes after the slot header, to the end of the message's slots (what the sender
    /// wrote there and, past its length, whatever the slots held before).
    ///
    /// # Safety
    /// Valid only until the consumer advances past this message.
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: the message's slots, published and not reused before the consumer passes.
        unsafe { std::slice::from_raw_parts(self.first.add(RAW_HDR), self.nslots * SLOT - RAW_HDR) }
    }

    /// The 4-byte word `off` bytes after the raw slot header, inside the message's first
    /// slot, as an atomic: a word of the message that both ends may change after it is
    /// published (`net`'s split requests, claimed by the consumer or revoked by the producer).
    ///
    /// # Safety
    /// Valid only until the consumer advances past this message.
    pub unsafe fn word(&self, off: usize) -> &AtomicU32 {
        assert!(off.is_multiple_of(4) && RAW_HDR + off + 4 <= SLOT);
        // SAFETY: inside the message's first slot (checked above), 64-byte aligned plus a
        // multiple of 4; published and not reused before the consumer passes.
        unsafe { &*self.first.add(RAW_HDR + off).cast::<AtomicU32>() }
    }

    /// A CONNECT or BYE message's `Header`, where its payload starts and the bytes its slots
    /// hold from there (the sender's `len` is not checked against them).
    pub fn header(&self) -> (Header, *const u8, usize) {
        let p = self.first;
        // SAFETY: published slot; fixed offsets inside it.
        let h = Header {
            kind: self.kind,
            len: unsafe { (p.add(RAW_HDR) as *const u32).read() },
        };
        // SAFETY: inside the same run of slots.
        (h, unsafe { p.add(HDR) }, self.nslots * SLOT - HDR)
    }
}

/// The consumer side of one lane (lives in the receiver).
#[derive(Debug, Default, Clone, Copy)]
pub struct Consumer {
    pos: u64,
}

impl Consumer {
    /// Starts at the lane's current tail.
    pub fn attach(seg: &Segment, lane: usize) -> Self {
        // SAFETY: the tail word is 8-aligned inside the lane header.
        let pos = unsafe { seg.u64_at(tail_off(lane)) }.load(Ordering::Acquire);
        Consumer { pos }
    }

    /// The message at `pos`, at or past this consumer's position, if published (padding
    /// included), without parsing more than its slot header.
    pub fn raw_at(&self, seg: &Segment, lane: usize, pos: u64) -> Option<RawView> {
        if pos.wrapping_sub(self.pos) >= SLOTS as u64 {
            return None;
        }
        let idx = (pos % SLOTS as u64) as usize;
        let p = slot_ptr(seg, lane, idx);
        if seq_of(p).load(Ordering::Acquire) != seq_at(pos) {
            return None;
        }
        // SAFETY: published with release after the slot header was written.
        let (kind, nslots) = unsafe { (*p.add(4), (p.add(6) as *const u16).read() as usize) };
        Some(RawView {
            kind,
            nslots: nslots.clamp(1, SLOTS - idx),
            first: p,
        })
    }

    /// The position of the next message (for a lock-free `published` check elsewhere).
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// Consumes `n` slots (a message `raw_at` showed, or padding).
    pub fn advance_slots(&mut self, seg: &Segment, lane: usize, n: usize) {
        // Nothing is written into the slots handed back (the producer keeps what will be
        // polled there meaningful): their lines stay where they are until the producer
        // writes them again.
        self.pos = self.pos.wrapping_add(n as u64);
        // SAFETY: the tail word is 8-aligned inside the lane header.
        unsafe { seg.u64_at(tail_off(lane)) }.store(self.pos, Ordering::Release);
    }
}

/// Whether the message at position `pos` of `lane` is published.
pub fn published(seg: &Segment, lane: usize, pos: u64) -> bool {
    let p = slot_ptr(seg, lane, (pos % SLOTS as u64) as usize);
    seq_of(p).load(Ordering::Acquire) == seq_at(pos)
}

/// The segment header's futex word.
pub fn sleeping(seg: &Segment) -> &AtomicU32 {
    // SAFETY: fixed aligned offset in the header.
    unsafe { seg.u32_at(OFF_SLEEPING) }
}

/// The segment header's `OFF_FD_SLEEPING` word.
pub fn fd_sleeping(seg: &Segment) -> &AtomicU32 {
    // SAFETY: fixed aligned offset in the header.
    unsafe { seg.u32_at(OFF_FD_SLEEPING) }
}

/// The segment header's wake-socket nonce (`OFF_WAKE_NONCE`).
pub fn wake_nonce(seg: &Segment) -> &AtomicU64 {
    // SAFETY: fixed aligned offset in the header.
    unsafe { seg.u64_at(OFF_WAKE_NONCE) }
}

/// The segment header's doorbell (futex) word.
pub fn doorbell(seg: &Segment) -> &AtomicU32 {
    // SAFETY: fixed aligned offset in the header.
    unsafe { seg.u32_at(OFF_DOORBELL) }
}

/// The segment header's active-lane mask (one word: LANES == 64).
pub fn active(seg: &Segment) -> &AtomicU64 {
    // SAFETY: fixed aligned offset in the header.
    unsafe { seg.u64_at(OFF_ACTIVE) }
}

/// The claim word of lane `i`.
pub fn claim(seg: &Segment, i: usize) -> &AtomicU64 {
    // SAFETY: fixed aligned offsets in the header, i < LANES.
    unsafe { seg.u64_at(OFF_CLAIM + i * 8) }
}

/// Stamps a new segment's header.
pub fn init_header(seg: &Segment, cookie: u64) {
    // SAFETY: fixed aligned offsets in the header.
    unsafe {
        seg.u32_at(OFF_PID)
            .store(std::process::id(), Ordering::Relaxed);
        seg.u64_at(OFF_BASE)
            .store(seg.base() as u64, Ordering::Relaxed);
        seg.u64_at(OFF_COOKIE).store(cookie, Ordering::Relaxed);
        seg.u32_at(OFF_OWNER_FD)
            .store(seg.fd() as u32, Ordering::Relaxed);
        seg.u64_at(OFF_MAGIC).store(MAGIC, Ordering::Release);
    }
}

/// The owner's pid if cross-memory attach through it reaches this very segment: the cookie
/// read through the pid at the owner's address equals the cookie as we see it, and that
/// process maps this very file (device and inode) at that address, from its start. The
/// header's words are the peer's: a segment that copies another process's pid, base and
/// cookie (this process's own included) names memory of that process, not itself, and
/// would make our copies write there. With it, if `pidfd`, a pidfd of that very process
/// where the kernel has them (opened before the checks: a pid that held the cookie after
/// the pidfd was opened held it when it was, since a process keeps its pid from birth and
/// the owner was born before its segment).
pub fn verified(seg: &Segment, pidfd: bool) -> Option<(i32, u32, Option<std::os::fd::OwnedFd>)> {
    // SAFETY: fixed aligned offsets in the header.
    let (pid, base, cookie, fd) = unsafe {
        (
            seg.u32_at(OFF_PID).load(Ordering::Relaxed) as i32,
            seg.u64_at(OFF_BASE).load(Ordering::Relaxed),
            seg.u64_at(OFF_COOKIE).load(Ordering::Relaxed),
            seg.u32_at(OFF_OWNER_FD).load(Ordering::Relaxed),
        )
    };
    let pidfd = pidfd.then(|| super::net::fdpass::pidfd_open(pid)).flatten();
    let file = seg.file_id()?;
    // A process maps every peer's segment it sends to: the mapping shows who reaches the
    // file, not who owns it. A hostile peer's header naming this process (or another peer)
    // at the address where that process maps the hostile file would pass the cookie and the
    // maps; our copies would then write where its frames say, in the named process. Only the
    // owner holds its segment's exclusive lock (`segment::Segment::create`).
    if !owner_locks(pid, fd, file) {
        return None;
    }
    // Checked before the cookie is read through the pid: the address read is then this very
    // file's (a tmpfs page), never memory the header's words chose, which could be a file
    // of a file system that never answers the fault (FUSE).
    if !maps_at(pid, base, file) {
        // Hostile, or a /dev/shm whose files /proc shows under other numbers (an overlay):
        // said once, since cross-memory attach then stays off for every peer.
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                pid,
                "shm: a peer's segment is not mapped by the process its header names; \
                 cross-memory attach with it is off"
            );
        }
        return None;
    }
    let mut seen = 0u64;
    let local = libc::iovec {
        iov_base: (&mut seen as *mut u64).cast(),
        iov_len: 8,
    };
    // The base is the peer's word: one that wraps names nothing to verify.
    let cookie_at = (base as usize).checked_add(OFF_COOKIE)?;
    let remote = libc::iovec {
        iov_base: cookie_at as *mut libc::c_void,
        iov_len: 8,
    };
    // SAFETY: writes 8 bytes into `seen`; the remote address is only dereferenced by the
    // kernel, in `pid`.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    let cookie_ok = n == 8 && seen == cookie && cookie != 0;
    if !cookie_ok {
        return None;
    }
    Some((pid, fd, pidfd))
}

/// Whether the owner whose pid `pid` and lock descriptor `fd` were verified (`verified`)
/// still holds `seg`'s lock itself: once it dies its lock may pass to a process that waited
/// for it, or stay with a child it forked without exec (sharing its open file), and the lock
/// alone would keep the dead owner alive for good. Only an answer that says so counts: its
/// `fdinfo` gone (the process, or the descriptor), or there without the lock; a read that
/// failed otherwise (no descriptor left here, a process that made itself non-dumpable) leaves
/// the lock's own answer.
pub fn still_owned_by(seg: &Segment, pid: i32, fd: u32) -> bool {
    seg.file_id()
        .is_none_or(|file| lock_owned(pid, fd, file).unwrap_or(true))
}

/// Bytes of a peer's `fdinfo` read for its owner's lock (`owner_locks`).
const FDINFO_MAX: u64 = 16 << 10;

/// Whether process `pid` holds the exclusive `flock` on the file `(dev, ino)`, taken by
/// itself, through its descriptor `fd`: `/proc/<pid>/fdinfo/<fd>` lists the locks held
/// through that descriptor's open file (`lock:\t1: FLOCK  ADVISORY  WRITE pid
/// major:minor:inode start end`, the device's numbers in hex), each with the pid that took
/// it. The pid counts too: a descriptor handed to that process (fd passing) shares the
/// lock, but the lock still names the process that took it.
///
/// `/proc/locks` said the same for every lock in the system, but its reader takes the lock
/// table's global semaphore for writing, which waits for an RCU grace period: 10-20 ms of
/// sleep on the first read in a while, paid by the first send to each new peer (it doubled
/// the C ABI's 8-byte ping-pong, whose timing includes its first message). A descriptor's
/// fdinfo takes only its file's lock list.
fn owner_locks(pid: i32, fd: u32, file: (u64, u64)) -> bool {
    lock_owned(pid, fd, file) == Some(true)
}

/// `owner_locks`, with `None` where the `fdinfo` could not be read for a reason other than its
/// absence (`Some(false)`: the process or the descriptor is gone).
fn lock_owned(pid: i32, fd: u32, (dev, ino): (u64, u64)) -> Option<bool> {
    use std::io::Read;
    // Its first lines are the descriptor's own and its flock (listed before any POSIX lock):
    // a few hundred bytes. A process that set a million POSIX locks through that descriptor
    // makes it megabytes, which are not ours to read.
    let mut info = String::new();
    let read = std::fs::File::open(format!("/proc/{pid}/fdinfo/{fd}"))
        .and_then(|f| f.take(FDINFO_MAX).read_to_string(&mut info));
    if let Err(e) = read {
        return match e.raw_os_error() {
            Some(libc::ENOENT | libc::ESRCH) => Some(false),
            _ => None,
        };
    }
    let want = format!(
        "{:02x}:{:02x}:{ino}",
        libc::major(dev) as u64,
        libc::minor(dev) as u64
    );
    let pid = pid.to_string();
    Some(
        info.lines()
            .filter_map(|l| l.strip_prefix("lock:"))
            .any(|l| {
                let f: Vec<&str> = l.split_ascii_whitespace().collect();
                matches!(
                    f.as_slice(),
                    [_, "FLOCK", _, "WRITE", p, file, ..] if *p == pid && *file == want
                )
            }),
    )
}

/// Whether process `pid` maps the file `(dev, ino)` at `base`, from the file's start
/// (`/proc/<pid>/maps`, readable for a process of the same user; ptrace restrictions on
/// attaching do not apply to it).
fn maps_at(pid: i32, base: u64, (dev, ino): (u64, u64)) -> bool {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return false;
    };
    let (major, minor) = (libc::major(dev) as u64, libc::minor(dev) as u64);
    maps.lines().any(|l| {
        // start-end perms offset major:minor inode [path]
        let mut f = l.split_ascii_whitespace();
        let (Some(range), Some(_), Some(off), Some(mm), Some(inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            return false;
        };
        let hex = |s: &str| u64::from_str_radix(s, 16).ok();
        let (Some((start, end)), Some(off), Some((ma, mi)), Ok(inode)) = (
            range
                .split_once('-')
                .and_then(|(a, b)| Some((hex(a)?, hex(b)?))),
            hex(off),
            mm.split_once(':')
                .and_then(|(a, b)| Some((hex(a)?, hex(b)?))),
            inode.parse::<u64>(),
        ) else {
            return false;
        };
        (start..end).contains(&base)
            && off.checked_add(base - start) == Some(0)
            && (ma, mi, inode) == (major, minor, ino)
    })
}

/// Whether a mapped segment has this layout.
pub fn check_header(seg: &Segment) -> bool {
    // SAFETY: fixed aligned offset in the header.
    seg.len() >= SEG_BYTES && unsafe { seg.u64_at(OFF_MAGIC) }.load(Ordering::Acquire) == MAGIC
}

/// Claims a free lane in `seg` for sender `id`; marks it active.
pub fn claim_lane(seg: &Segment, id: u64) -> Option<usize> {
    for i in 0..LANES {
        if claim(seg, i)
            .compare_exchange(0, id, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            active(seg).fetch_or(1 << i, Ordering::AcqRel);
            return Some(i);
        }
    }
    None
}

/// Releases lane `i` (consumer side, after the sender said goodbye or died).
pub fn release_lane(seg: &Segment, i: usize) {
    active(seg).fetch_and(!(1 << i), Ordering::AcqRel);
    claim(seg, i).store(0, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::super::segment::{fresh_name, Segment};
    use super::*;

    /// A fresh segment with one lane claimed: what every test here writes through.
    fn claimed_lane() -> (Segment, usize) {
        let seg = Segment::create(&fresh_name(), SEG_BYTES).unwrap();
        init_header(&seg, 1);
        let lane = claim_lane(&seg, 7).unwrap();
        (seg, lane)
    }

    #[test]
    fn messages_cross_with_padding_and_backpressure() {
        let (seg, lane) = claimed_lane();
        let mut p = Producer::new(&seg, lane);
        let mut c = Consumer::attach(&seg, lane);
        assert!(c.raw_at(&seg, lane, c.pos()).is_none());
        // Fill with 1000-byte messages (their number, then their number's low byte) until
        // full, draining half-way through several times so the ring wraps with pad messages.
        let mut sent = 0u32;
        let mut got = 0u32;
        for round in 0..20 {
            while p.write_raw(&seg, 20, 0, 1000, 0, |b| {
                b.fill(sent as u8);
                b[..4].copy_from_slice(&sent.to_le_bytes());
            }) {
                sent += 1;
            }
            let take = if round % 2 == 0 { 5 } else { 1000 };
            let mut taken = 0;
            while taken < take {
                let Some(v) = c.raw_at(&seg, lane, c.pos()) else {
                    break;
                };
                if v.kind != kind::PAD {
                    assert_eq!(v.kind, 20);
                    // SAFETY: before the consumer advances.
                    let b = unsafe { &v.bytes()[..1000] };
                    assert_eq!(b[..4], got.to_le_bytes());
                    assert!(b[4..].iter().all(|&x| x == got as u8));
                    got += 1;
                    taken += 1;
                }
                c.advance_slots(&seg, lane, v.slots());
            }
        }
        assert!(sent > 200 && got > 100);
    }

    /// A lane whose tail word says nearly 2^32 or 2^64 slots were read (a long life, or a
    /// peer that wrote it): messages cross the sequence word's and the position's wrap, in
    /// order, with no overflow and no stale slot taken for a published one, whichever
    /// message starts at the last position before the wrap.
    #[test]
    fn positions_wrap_past_the_sequence_and_the_counter() {
        let near = |top: u64| (1..=3).map(move |k| top - k + 1);
        for start in near(u64::from(u32::MAX)).chain(near(u64::MAX)) {
            let (seg, lane) = claimed_lane();
            // SAFETY: the tail word is 8-aligned inside the lane header.
            unsafe { seg.u64_at(tail_off(lane)) }.store(start, Ordering::Release);
            let mut p = Producer::new(&seg, lane);
            let mut c = Consumer::attach(&seg, lane);
            for i in 0u32..3 * SLOTS as u32 {
                let len = [8, 100, 8, 1000][i as usize % 4];
                assert!(p.write_raw(&seg, 20, 0, len, 0, |b| {
                    b[..4].copy_from_slice(&i.to_le_bytes())
                }));
                loop {
                    let v = c.raw_at(&seg, lane, c.pos()).expect("published");
                    let pad = v.kind == kind::PAD;
                    if !pad {
                        assert_eq!(v.kind, 20);
                        // SAFETY: before the consumer advances.
                        assert_eq!(unsafe { &v.bytes()[..4] }, i.to_le_bytes(), "from {start}");
                    }
                    c.advance_slots(&seg, lane, v.slots());
                    if !pad {
                        break;
                    }
                }
                assert!(
                    c.raw_at(&seg, lane, c.pos()).is_none(),
                    "a stale slot at {i}"
                );
            }
        }
    }

    /// A segment's header is its owner's word for who it is: one that copies another
    /// segment's pid, base and cookie (here this process's own, which cross-memory attach
    /// always reaches) is not verified as that process; the real one is.
    #[test]
    fn a_copied_header_is_not_verified_as_its_owner() {
        let real = Segment::create(&fresh_name(), SEG_BYTES).unwrap();
        init_header(&real, 0x1234_5678);
        let seen = Segment::open(real.name(), SEG_BYTES).unwrap();
        // Cross-memory attach to this process itself (always allowed, unless the kernel
        // lacks it): then the real header must verify.
        let mut x = 0u64;
        let v = 7u64;
        let local = libc::iovec {
            iov_base: (&mut x as *mut u64).cast(),
            iov_len: 8,
        };
        let remote = libc::iovec {
            iov_base: (&v as *const u64).cast_mut().cast(),
            iov_len: 8,
        };
        // SAFETY: reads 8 bytes of `v` into `x`, both ours.
        if unsafe { libc::process_vm_readv(std::process::id() as i32, &local, 1, &remote, 1, 0) }
            != 8
        {
            eprintln!("cross-memory attach is not available here: nothing to check");
            return;
        }
        let (pid, _, _) = verified(&seen, false).expect("the real header verified");
        assert_eq!(pid, std::process::id() as i32);
        let fake = Segment::create(&fresh_name(), SEG_BYTES).unwrap();
        init_header(&fake, 1);
        for off in [OFF_BASE, OFF_COOKIE] {
            // SAFETY: fixed aligned offsets in the headers.
            unsafe { fake.u64_at(off) }.store(
                unsafe { real.u64_at(off) }.load(Ordering::Relaxed),
                Ordering::Relaxed,
            );
        }
        let fake_seen = Segment::open(fake.name(), SEG_BYTES).unwrap();
        assert!(
            verified(&fake_seen, false).is_none(),
            "a copied header verified"
        );
    }

    /// The owner's lock is found whatever else its descriptor holds: thousands of POSIX
    /// locks set through it (`fdinfo` of megabytes, read only in part) come after the flock.
    #[test]
    fn an_owner_with_many_posix_locks_is_still_verified() {
        let real = Segment::create(&fresh_name(), SEG_BYTES).unwrap();
        init_header(&real, 0x5eed_0001);
        for i in 0..4_000i64 {
            // SAFETY: a lock request on a descriptor we own; every field is plain data.
            let mut l: libc::flock = unsafe { std::mem::zeroed() };
            l.l_type = libc::F_WRLCK as i16;
            l.l_whence = libc::SEEK_SET as i16;
            l.l_start = 2 * i;
            l.l_len = 1;
            // SAFETY: as above.
            assert_eq!(unsafe { libc::fcntl(real.fd(), libc::F_SETLK, &l) }, 0);
        }
        let info =
            std::fs::read_to_string(format!("/proc/{}/fdinfo/{}", std::process::id(), real.fd()))
                .unwrap();
        assert!(info.len() as u64 > FDINFO_MAX, "{} bytes only", info.len());
        let seen = Segment::open(real.name(), SEG_BYTES).unwrap();
        let file = seen.file_id().unwrap();
        assert!(owner_locks(
            std::process::id() as i32,
            real.fd() as u32,
            file
        ));
    }

    /// A hostile peer's header naming this process at the address where this process maps
    /// the hostile file passes the cookie and the maps (both are true of this process) but
    /// is not verified: this process does not hold the file's lock, its owner does.
    #[test]
    fn a_header_naming_a_process_that_only_maps_it_is_not_verified() {
        let hostile = Segment::create(&fresh_name(), SEG_BYTES).unwrap();
        init_header(&hostile, 0x5eed);
        // Its owner stands for another process: not this one's lock.
        hostile.unlock();
        let seen = Segment::open(hostile.name(), SEG_BYTES).unwrap();
        // SAFETY: fixed aligned offset in the header.
        unsafe { hostile.u64_at(OFF_BASE) }.store(seen.base() as u64, Ordering::Relaxed);
        assert!(
            verified(&seen, false).is_none(),
            "a header naming a process that only maps the file verified"
        );
        // Naming a descriptor on which this process does hold an exclusive lock, but on
        // another file (a segment of its own), is no better.
        let mine = Segment::create(&fresh_name(), SEG_BYTES).unwrap();
        // SAFETY: fixed aligned offset in the header.
        unsafe { hostile.u32_at(OFF_OWNER_FD) }.store(mine.fd() as u32, Ordering::Relaxed);
        assert!(
            verified(&seen, false).is_none(),
            "a header naming another file's locked descriptor verified"
        );
    }

    #[test]
    fn consumed_slots_never_read_as_published() {
        let (seg, lane) = claimed_lane();
        let mut p = Producer::new(&seg, lane);
        let mut c = Consumer::attach(&seg, lane);
        // One-slot messages between longer ones and pads, over several laps, the consumer
        // writing nothing into the slots; each later slot's word holds what the next lap will
        // look for there. Once drained, the next position is never taken for a published
        // message, also after a new producer takes the lane over and writes one-slot messages
        // where the last lap had later slots of longer ones.
        for round in 0..4 * SLOTS {
            if round == 2 * SLOTS {
                p = Producer::new(&seg, lane);
            }
            let len = if round < 2 * SLOTS {
                [1, 56, 57, 1000, 120, 1000, 8][round % 7]
            } else {
                8
            };
            let at = p.head + p.pad_before(&seg, raw_slots_for(len), 0) as u64;
            let lap = |j: usize| seq_at(at + j as u64 + SLOTS as u64).to_le_bytes();
            assert!(p.write_raw(&seg, 20, 0, len, 0, |b| {
                for j in 1..raw_slots_for(len) {
                    if let Some(w) = b.get_mut(j * SLOT - RAW_HDR..j * SLOT - RAW_HDR + 4) {
                        w.copy_from_slice(&lap(j));
                    }
                }
            }));
            let mut got = 0;
            while let Some(v) = c.raw_at(&seg, lane, c.pos()) {
                if v.kind != kind::PAD {
                    assert_eq!(v.kind, 20);
                    got += 1;
                }
                c.advance_slots(&seg, lane, v.slots());
            }
            assert_eq!(got, 1);
            assert!(c.raw_at(&seg, lane, c.pos()).is_none());
        }
    }

    /// Taking turns (each message read before the next is written), messages of more than one
    /// slot go back to the ring's front instead of walking it, leaving the spare slots free;
    /// one-slot messages walk it; with the consumer behind, nothing is skipped and the
    /// producer asks again only `REWIND_RETRY` slots later. Every message reads back whole
    /// and in order.
    #[test]
    fn a_drained_ring_starts_again_at_its_front() {
        let (seg, lane) = claimed_lane();
        let mut p = Producer::new(&seg, lane);
        let mut c = Consumer::attach(&seg, lane);
        let mut next = 0u32;
        let mut expect = 0u32;
        let write = |p: &mut Producer, next: &mut u32, len: usize| {
            let i = *next;
            *next += 1;
            assert!(p.write_raw(&seg, 20, 0, len, CTRL_SPARE, |b| {
                b.fill(i as u8);
                b[..4].copy_from_slice(&i.to_le_bytes());
            }));
            // Where it went, and the free slots behind it.
            let n = raw_slots_for(len) as u64;
            let start = (p.head - n) % SLOTS as u64;
            let used = p.head - p.consumed(&seg);
            (start as usize, SLOTS as u64 - used)
        };
        let drain = |c: &mut Consumer, expect: &mut u32, len: usize| {
            while let Some(v) = c.raw_at(&seg, lane, c.pos()) {
                if v.kind != kind::PAD {
                    // SAFETY: before the consumer advances.
                    let b = unsafe { &v.bytes()[..len] };
                    assert_eq!(b[..4], expect.to_le_bytes());
                    assert!(b[4..].iter().all(|&x| x == *expect as u8));
                    *expect += 1;
                }
                c.advance_slots(&seg, lane, v.slots());
            }
        };
        // 4 KiB, taking turns: after the first message the two ends stay on the ring's front,
        // two messages' worth of slots.
        let n = raw_slots_for(4096);
        for i in 0..200 {
            let (start, free) = write(&mut p, &mut next, 4096);
            assert!(free >= CTRL_SPARE as u64, "{free} free");
            if i > 2 {
                assert!(
                    start + n <= 2 * n + CTRL_SPARE,
                    "message {i} at slot {start}"
                );
            }
            drain(&mut c, &mut expect, 4096);
        }
        // One slot, taking turns: walks the ring (each message right after the last).
        let mut last = None;
        for _ in 0..3 * SLOTS {
            let (start, _) = write(&mut p, &mut next, 8);
            if let Some(l) = last {
                assert_eq!(start, (l + 1) % SLOTS);
            }
            last = Some(start);
            drain(&mut c, &mut expect, 8);
        }
        // 1 KiB with the consumer one message behind: no message skips ahead of the head, and
        // the tail word is asked about once per REWIND_RETRY slots.
        let n = raw_slots_for(1024);
        let mut prev = write(&mut p, &mut next, 1024).0;
        for _ in 0..3 * SLOTS / n {
            let asked = p.rewind_at;
            let (start, _) = write(&mut p, &mut next, 1024);
            assert!(
                start == (prev + n) % SLOTS || start == 0,
                "{prev} then {start}"
            );
            assert!(p.rewind_at == asked || p.rewind_at == p.head - n as u64 + REWIND_RETRY);
            prev = start;
            // Read all but the last message.
            while c.pos() + (n as u64) < p.head {
                let v = c.raw_at(&seg, lane, c.pos()).unwrap();
                if v.kind != kind::PAD {
                    // SAFETY: before the consumer advances.
                    assert_eq!(unsafe { &v.bytes()[..4] }, expect.to_le_bytes());
                    expect += 1;
                }
                c.advance_slots(&seg, lane, v.slots());
            }
        }
        drain(&mut c, &mut expect, 1024);
        assert_eq!(expect, next);
    }

    /// Slots a pad skips keep the sequence word of the lap that last wrote them. A pad that
    /// rewinds skips most of the ring with every message, so the positions reach such a
    /// word's value again (2^32 positions, 2^21 rewinds) while the slot still holds it: it
    /// must be cleared before the consumer polls it there, not taken for a message.
    #[test]
    fn slots_pads_skipped_for_2_pow_32_positions_are_not_taken_for_messages() {
        let (seg, lane) = claimed_lane();
        let mut p = Producer::new(&seg, lane);
        let mut c = Consumer::attach(&seg, lane);
        let turn = |p: &mut Producer, c: &mut Consumer, len: usize| {
            assert!(p.write_raw(&seg, 20, 0, len, 0, |b| b.fill(0x5a)));
            let mut got = 0;
            while let Some(v) = c.raw_at(&seg, lane, c.pos()) {
                got += usize::from(v.kind != kind::PAD);
                c.advance_slots(&seg, lane, v.slots());
            }
            got
        };
        // A lap of one-slot messages: every slot's word is a sequence word of that lap.
        assert_eq!(p.head, 0);
        for _ in 0..SLOTS {
            assert_eq!(turn(&mut p, &mut c, 8), 1);
        }
        // Two-slot messages taking turns: each goes back to the front, its pad skipping the
        // rest, until the positions are 2^32 past the first lap's.
        while p.head < 1 << 32 {
            assert_eq!(turn(&mut p, &mut c, 60), 1);
        }
        // One-slot messages walk the ring over the slots the pads skipped.
        for i in 0..SLOTS {
            assert_eq!(turn(&mut p, &mut c, 8), 1, "one-slot message {i}");
        }
    }

    /// `mark_dirty` sets exactly the slots of its range, whatever words it starts and ends in.
    #[test]
    fn mark_dirty_sets_exactly_its_range() {
        let (seg, lane) = claimed_lane();
        let mut p = Producer::new(&seg, lane);
        let cases = [
            (0, 1),
            (0, 64),
            (1, 63),
            (63, 65),
            (5, 200),
            (64, 128),
            (100, SLOTS),
        ];
        for (from, to) in cases
            .into_iter()
            .chain([(0, SLOTS), (SLOTS - 1, SLOTS), (7, 7)])
        {
            p.dirty = [0; SLOTS / 64];
            p.mark_dirty(from, to);
            for i in 0..SLOTS {
                let set = p.dirty[i / 64] >> (i % 64) & 1 == 1;
                assert_eq!(set, (from..to).contains(&i), "slot {i} of {from}..{to}");
            }
        }
    }

    #[test]
    fn a_header_message_reads_back_over_stale_slots() {
        let (seg, lane) = claimed_lane();
        let mut p = Producer::new(&seg, lane);
        let mut c = Consumer::attach(&seg, lane);
        // Stale bytes in the slots the CONNECT reuses after the ring wraps.
        for _ in 0..SLOTS {
            assert!(p.write_raw(&seg, 20, 0, 56, 0, |b| b.fill(0xee)));
            let v = c.raw_at(&seg, lane, c.pos()).unwrap();
            c.advance_slots(&seg, lane, v.slots());
        }
        let h = Header {
            kind: kind::CONNECT,
            len: 5,
        };
        assert!(p.write(&seg, &h, 5, |b| b.copy_from_slice(b"hello")));
        let v = c.raw_at(&seg, lane, c.pos()).unwrap();
        assert_eq!(v.kind, kind::CONNECT);
        let (got, pl, cap) = v.header();
        assert_eq!(got, h);
        assert!(cap >= 5);
        // SAFETY: before the consumer advances.
        assert_eq!(unsafe { std::slice::from_raw_parts(pl, 5) }, b"hello");
        // SAFETY: as above.
        assert!(unsafe { v.bytes()[4..HDR - RAW_HDR].iter().all(|&b| b == 0) });
    }
}
