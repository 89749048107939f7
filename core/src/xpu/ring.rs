//! A descriptor ring: many XPU threads produce, the host's watcher consumes.
//!
//! Producer (`post`, what device code does): read `head` (acquire), reserve room with a
//! fetch-and-add on `claimed` (its old value `c`; `c - head` >= slots: the ring is full, give
//! the reservation back and answer `-FI_EAGAIN`), claim a position with a fetch-and-add on
//! `tail`, write the slot's words, then store its `seq` (position + 1) with release. Room is
//! reserved before the position so that a full ring never hands out a position it would have
//! to take back: the claim always succeeds, and positions stay dense. A reservation that
//! succeeded left `claimed`'s successes at most `head + slots`, and positions are handed out
//! one per success, so position `p` < `head + slots`: position `p - slots`, the slot's last
//! occupant, was copied out before `head` passed it.
//!
//! Consumer (`take`, the watcher, one at a time under its lock): the slot at `head` is taken
//! only when its `seq` is `head + 1`; its words are copied out and `head` advances (release),
//! so a producer that saw the new `head` writes the slot only after the copy. A claimed slot
//! whose `seq` never comes (an XPU that died mid-descriptor) is never taken: what follows it
//! waits, and closing the ring reports each of them.
//!
//! Closing (`DescRing::close`): the host stores `state`, then reads `tail`; a producer looks at
//! `state` again after its claim. Either the close counts the position or the producer finds
//! the ring closed; one that does answers `-FI_ESHUTDOWN` and publishes the position
//! withdrawn, which a close that counted it skips. A post racing the close is reported or
//! refused, never neither; both only where its thread stops between the claim and the second
//! look for longer than the close waits (`CLOSE_WAIT`).
//!
//! Each shared word has one writer side: `claimed` and `tail` are the producers' (their
//! read-modify-writes), `head` and `state` the host's (stores). A GPU's atomics on mapped host
//! memory are atomic among its own threads but, over a link without native host atomics
//! (PCIe: `hostNativeAtomicSupported` 0), a read then a write as the host sees them: a host
//! read-modify-write of the same word landing between the two is lost. The first protocol
//! had the host give credits back with a fetch-and-add on the word the GPU took them from;
//! under a block's pressure the host's returns were lost until the ring read full while
//! empty (`tests_gpu_ring`).
//!
//! The ring is one shared block (`mem::Block`): the header, then the slots. A CPU XPU's is
//! ordinary heap memory; a GPU's is mapped page-locked host memory from the domain's
//! allocator. The host reads and writes through the block's host address only; the header's
//! `slots` and the handle's `prov_ctx` carry the XPU's addresses, and the host never follows
//! what the header holds (an XPU can write anything there).

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::abi::{DescSlot, RingHeader, XpuDesc, DESC_WORDS, RING_CLOSED, RING_OPEN};
use super::mem::{Block, XpuMemAlloc};
use crate::consts::errno::{FI_EAGAIN, FI_ESHUTDOWN};
use crate::error::{Error, Result};
use crate::trigger::Xpu;

/// Where the slots start in a ring's block: right after the header.
const SLOTS_AT: usize = std::mem::size_of::<RingHeader>();

/// Fewest and most slots a ring may have.
pub const RING_MIN_SLOTS: usize = 2;
/// Most slots a ring may have (48 MiB of descriptors).
pub const RING_MAX_SLOTS: usize = 1 << 18;
/// Slots of a ring exported without a size.
pub const RING_DEFAULT_SLOTS: usize = 1024;
/// How long closing a ring waits for positions claimed before the close to be published
/// (`DescRing::close_within`): what a live producer needs to write a slot, preempted once.
const CLOSE_WAIT: Duration = Duration::from_millis(2);

/// The host's side of one ring: it owns the shared memory.
pub(crate) struct DescRing {
    /// The header at offset 0, `mask + 1` slots at `SLOTS_AT`.
    mem: Block,
    /// The next position the consumer takes: the host's own copy. The header's `head` is
    /// written from it for the XPU to see, never read back (an XPU can write anything there).
    head: AtomicU64,
    /// Slots - 1, the host's own copy (a device may write its header).
    mask: u64,
    /// Closed by the host (`close`): its own record, the header's `state` being the XPU's to
    /// read and so to write too.
    closed: std::sync::atomic::AtomicBool,
}

/// What the consumer found at the head.
#[derive(Debug)]
pub(crate) enum Taken {
    /// A published descriptor (not yet validated).
    Desc(XpuDesc),
    /// A published slot whose `check` disagrees with its `seq`: its words are not one
    /// descriptor's (read only by the log of a counter that refuses it).
    Torn(#[allow(dead_code)] XpuDesc),
}

/// What `take_into` found at the head (the descriptor is in its argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Took {
    /// A published descriptor (not yet validated).
    Desc,
    /// A published slot whose `check` disagrees with its `seq`.
    Torn,
}

/// What closing found between the head and the tail.
#[derive(Debug)]
pub(crate) enum Left {
    /// A published descriptor never taken.
    Published(XpuDesc),
    /// Published slots whose check word is another position's (as `Took::Torn`), `n` of
    /// them in a row from position `first`: nothing in them is trusted, so a run is one
    /// report (an XPU that leaves a lap of them makes one entry, not a lap's worth).
    Torn { first: u64, n: u64 },
    /// Claimed positions whose descriptors were never published, `n` in a row from `first`
    /// (one report a run, as `Torn`).
    Unpublished { first: u64, n: u64 },
}

impl Left {
    /// Adds position `pos`, torn (`torn`) or unpublished, to the run `out` ends with if it
    /// continues it, or starts a new one.
    fn extend_run(out: &mut Vec<Left>, pos: u64, torn: bool) {
        match (out.last_mut(), torn) {
            (Some(Left::Torn { first, n }), true)
            | (Some(Left::Unpublished { first, n }), false)
                if first.wrapping_add(*n) == pos =>
            {
                *n += 1;
            }
            (_, true) => out.push(Left::Torn { first: pos, n: 1 }),
            (_, false) => out.push(Left::Unpublished { first: pos, n: 1 }),
        }
    }
}

/// Whether `slots` is a size a descriptor ring may have: a power of two within
/// `RING_MIN_SLOTS..=RING_MAX_SLOTS`.
pub(crate) fn check_slots(slots: usize) -> Result<()> {
    if !(RING_MIN_SLOTS..=RING_MAX_SLOTS).contains(&slots) || !slots.is_power_of_two() {
        return Err(Error::Inval(format!(
            "export_xpu: {slots} ring slots; a power of two from {RING_MIN_SLOTS} to {RING_MAX_SLOTS}"
        )));
    }
    Ok(())
}

impl DescRing {
    /// A ring of `slots` slots (a power of two within the limits) for `xpu`, in memory from
    /// `alloc` (heap memory for the CPU XPU).
    pub(crate) fn new(
        slots: usize,
        xpu: Xpu,
        alloc: Option<&dyn XpuMemAlloc>,
    ) -> Result<Arc<DescRing>> {
        let what = "export_xpu";
        check_slots(slots)?;
        // Within RING_MAX_SLOTS: 48 MiB and a header, no overflow.
        let len = SLOTS_AT + slots * std::mem::size_of::<DescSlot>();
        let mem = Block::new(what, xpu, alloc, len)?;
        let header = RingHeader::new(mem.xpu_at(SLOTS_AT), slots as u64);
        // SAFETY: the block is zero-filled, `len` bytes, 64-aligned (checked by Block), and
        // no one else knows it yet: the header is written before it is shared. Zeroed slots
        // are valid atomics.
        unsafe { mem.host_at(0).cast::<RingHeader>().write(header) };
        Ok(Arc::new(DescRing {
            mem,
            head: AtomicU64::new(0),
            mask: slots as u64 - 1,
            closed: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// The shared header, through the host's address.
    pub(crate) fn header(&self) -> &RingHeader {
        // SAFETY: written in `new`, alive and 64-aligned as long as `self`; its shared words
        // are atomics.
        unsafe { &*self.mem.host_at(0).cast::<RingHeader>() }
    }

    /// The header's address as the XPU sees it (what `prov_ctx` names).
    pub(crate) fn ctx(&self) -> u64 {
        self.mem.xpu_at(0)
    }

    /// Whether the XPU's addresses are valid host addresses too (the host's device calls on
    /// a handle stand for the XPU only then: `xpu::device`).
    pub(crate) fn host_reachable(&self) -> bool {
        self.mem.host_reachable()
    }

    pub(crate) fn slot(&self, pos: u64) -> &DescSlot {
        // The mask keeps the index within the slots (their number is mask + 1).
        let idx = (pos & self.mask) as usize;
        // SAFETY: slot `idx` <= mask lies inside the block (`new` sized it), 64-aligned; its
        // words are atomics.
        unsafe { &*self.mem.host_at(SLOTS_AT).cast::<DescSlot>().add(idx) }
    }

    /// The next position the consumer takes.
    pub(crate) fn head(&self) -> u64 {
        self.head.load(Ordering::Relaxed)
    }

    /// The word that publishes position `pos` (the watcher's spin waits for a store to it).
    pub(crate) fn seq_word(&self, pos: u64) -> &AtomicU64 {
        &self.slot(pos).0[0]
    }

    /// Whether every slot is claimed (the producers' `tail` a whole ring past the head): a
    /// producer is then answered `-FI_EAGAIN` until the watcher takes some. `tail` is the
    /// XPU's to write and is only a hint here, never a bound on what is read.
    pub(crate) fn full(&self) -> bool {
        let tail = self.header().tail.load(Ordering::Relaxed);
        tail.wrapping_sub(self.head()) > self.mask
    }

    /// Whether the next slot is published (a look without taking it): never once the host
    /// closed the ring, whatever an XPU writes into it after.
    pub(crate) fn ready(&self) -> bool {
        let head = self.head();
        !self.closed.load(Ordering::Relaxed)
            && self.slot(head).0[0].load(Ordering::Acquire) == head.wrapping_add(1)
    }

    /// Takes the slot at the head if it is published. Consumer only (one at a time).
    pub(crate) fn take(&self) -> Option<Taken> {
        let mut d = XpuDesc::default();
        Some(match self.take_into(&mut d)? {
            Took::Desc => Taken::Desc(d),
            Took::Torn => Taken::Torn(d),
        })
    }

    /// `take` into `d` (the watcher's loop reuses one, copying each descriptor once).
    pub(crate) fn take_into(&self, d: &mut XpuDesc) -> Option<Took> {
        let head = self.head();
        let want = head.wrapping_add(1);
        let slot = self.slot(head);
        if slot.0[0].load(Ordering::Acquire) != want {
            return None;
        }
        let words = d.words_mut();
        for (w, s) in words.iter_mut().zip(&slot.0) {
            *w = s.load(Ordering::Relaxed);
        }
        // Copied out: the slot goes back to the producers (the head is their room).
        self.head.store(want, Ordering::Relaxed);
        self.header().head.store(want, Ordering::Release);
        Some(if d.check == want as u32 {
            Took::Desc
        } else {
            Took::Torn
        })
    }

    /// Closes the ring to producers and returns what lies between the head and the tail, or
    /// the last slot of this lap found published if that lies further (at most one lap:
    /// `tail` is the XPU's to write, and is trusted neither to bound what was published nor
    /// past a lap). Positions the close counts (claimed before it read `tail`) but finds not
    /// yet published are waited for up to `CLOSE_WAIT`, then reported as unpublished. A
    /// producer that finds the ring closed after its claim is answered `-FI_ESHUTDOWN` and
    /// publishes its position withdrawn, which ends the wait and is not reported (`reserve`).
    /// Consumer only. Closed already: nothing (what it held was returned then).
    pub(crate) fn close(&self) -> Vec<Left> {
        self.close_within(CLOSE_WAIT)
    }

    /// `close` for a ring whose leftovers nobody is told of (a counter's, once the counter is
    /// gone: an add has nothing left to change): it waits for no claim, which would stall
    /// the watcher that found the counter gone.
    pub(crate) fn close_unreported(&self) {
        self.close_within(Duration::ZERO);
    }

    /// `close`, waiting up to `wait` for positions claimed before it to be published.
    pub(crate) fn close_within(&self, wait: Duration) -> Vec<Left> {
        let h = self.header();
        h.state.store(RING_CLOSED, Ordering::Release);
        if self.closed.swap(true, Ordering::Relaxed) {
            return Vec::new();
        }
        let head = self.head();
        let lap = head.saturating_add(self.mask + 1);
        // Pairs with the producers' fence in `reserve`: a claim this read misses finds the
        // ring closed and publishes nothing.
        fence(Ordering::SeqCst);
        let tail = h.tail.load(Ordering::Acquire);
        let published_at =
            |pos: u64| self.slot(pos).0[0].load(Ordering::Acquire) == pos.wrapping_add(1);
        // A producer that claimed before the close is writing its slot: a few stores, unless
        // its thread was preempted or its XPU died. Wait for it a while, so that a live one's
        // descriptor is reported under its context rather than as unpublished.
        let until = Instant::now() + wait;
        let (mut pos, claimed, mut spins) = (head, tail.clamp(head, lap), 0u32);
        while pos < claimed {
            if published_at(pos) {
                pos += 1;
                continue;
            }
            if Instant::now() >= until {
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        // Only this lap's publishing value matches a slot's `seq` (a slot left from an
        // earlier lap holds its position then), so the scan finds nothing stale. A withdrawn
        // slot moves nothing: its post came after the read of `tail` above, so did every post
        // after it, and positions before it that this read did not count are refused posts
        // still writing their own (reported as unpublished, they would be both).
        let withdrawn = |pos: u64| self.slot(pos).opcode() == super::abi::opcode::WITHDRAWN;
        let published = (head..lap)
            .rev()
            .find(|&pos| published_at(pos) && !withdrawn(pos))
            .map_or(head, |pos| pos + 1);
        let end = tail.clamp(head, lap).max(published);
        let mut out = Vec::new();
        let mut pos = head;
        while pos < end {
            let slot = self.slot(pos);
            let want = pos.wrapping_add(1);
            if slot.0[0].load(Ordering::Acquire) == want {
                let words = std::array::from_fn(|i| slot.0[i].load(Ordering::Relaxed));
                let d = XpuDesc::from_words(words);
                if d.check == want as u32 {
                    // A post refused after its claim: it was answered -FI_ESHUTDOWN.
                    if d.opcode != super::abi::opcode::WITHDRAWN {
                        out.push(Left::Published(d));
                    }
                } else {
                    Left::extend_run(&mut out, pos, true);
                }
            } else {
                Left::extend_run(&mut out, pos, false);
            }
            pos = want;
        }
        self.head.store(end, Ordering::Relaxed);
        h.head.store(end, Ordering::Release);
        out
    }
}

/// A position claimed on a ring, not yet published. Dropping it unpublished leaves the slot
/// as an XPU that died while writing it would.
pub struct Claim<'a> {
    slot: &'a DescSlot,
    pos: u64,
}

impl<'a> Claim<'a> {
    /// The position claimed.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Stores word `i` (1 to 23; word 0 is `seq`, stored by `publish`) of the slot.
    pub fn store_word(&self, i: usize, v: u64) {
        if (1..DESC_WORDS).contains(&i) {
            self.slot.0[i].store(v, Ordering::Relaxed);
        }
    }

    /// Writes every word of `d` but `seq`, with `check` set for this position.
    pub fn write(&self, d: &XpuDesc) {
        let mut d = *d;
        d.check = self.pos.wrapping_add(1) as u32;
        let w = d.to_words();
        // Over slices of known length, which the compiler unrolls into 23 plain stores (an
        // iterator over the array by value was ~4 times the instructions).
        for (s, v) in self.slot.0[1..].iter().zip(&w[1..]) {
            s.store(*v, Ordering::Relaxed);
        }
    }

    /// Publishes the slot: its `seq`, with release, after everything written.
    pub fn publish(self) {
        self.slot.0[0].store(self.pos.wrapping_add(1), Ordering::Release);
    }

    /// Publishes the slot as `opcode::WITHDRAWN`: what a producer that found the ring closed
    /// after its claim leaves there.
    pub(crate) fn withdraw(self) {
        self.write(&XpuDesc {
            opcode: super::abi::opcode::WITHDRAWN,
            ..Default::default()
        });
        self.publish();
    }
}

/// How a producer's read-modify-writes reach a ring's shared words. A CPU thread's are the
/// CPU's atomics (`Native`); a GPU's on mapped host memory are atomic among the GPU's own
/// threads only where the link has no native atomics (PCIe: the RMW is a read, then a write),
/// which the tests model.
pub(crate) trait ProducerRmw {
    /// Adds `v` to `w` (wrapping) and returns the value before, with acquire.
    fn fetch_add(&self, w: &AtomicU64, v: u64) -> u64;
}

/// The CPU's own atomics.
pub(crate) struct Native;

impl ProducerRmw for Native {
    fn fetch_add(&self, w: &AtomicU64, v: u64) -> u64 {
        w.fetch_add(v, Ordering::Acquire)
    }
}

/// Why `reserve` gave no position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The ring is full: `-FI_EAGAIN`.
    Full,
    /// The ring was closed before the claim: `-FI_ESHUTDOWN`.
    Closed,
    /// The position was claimed, then the ring found closed: `-FI_ESHUTDOWN`, and the
    /// caller publishes `opcode::WITHDRAWN` there (`Claim::withdraw`), since a close that
    /// counted the position waits for it.
    ClosedAfterClaim(u64),
}

impl Refused {
    /// The answer a device call gives.
    pub(crate) fn errno(self) -> i32 {
        match self {
            Refused::Full => -FI_EAGAIN,
            Refused::Closed | Refused::ClosedAfterClaim(_) => -FI_ESHUTDOWN,
        }
    }
}

/// Reserves a position on the ring whose header is `h` and whose slots number `mask + 1`
/// (the producer protocol, up to the slot's words). `mask` is the caller's: a device reads
/// the header's (all it has), a host thread passes the ring's own copy, never the header's,
/// which an XPU can write.
pub(crate) fn reserve(
    h: &RingHeader,
    mask: u64,
    rmw: &impl ProducerRmw,
) -> std::result::Result<u64, Refused> {
    if h.state.load(Ordering::Acquire) != RING_OPEN {
        return Err(Refused::Closed);
    }
    // Read before the reservation: a head read earlier is only smaller (room underestimated).
    let head = h.head.load(Ordering::Acquire);
    let c = rmw.fetch_add(&h.claimed, 1);
    if c.wrapping_sub(head) > mask {
        rmw.fetch_add(&h.claimed, u64::MAX);
        return Err(Refused::Full);
    }
    let pos = rmw.fetch_add(&h.tail, 1);
    // The close stores `state`, then reads `tail`; a producer adds to `tail`, then reads
    // `state`, each pair across a full fence. So either the close's read counts this position
    // (it reports what is published there, and waits a while for it), or this read finds the
    // ring closed. Without this second look a post whose first look came just before the
    // close and whose claim came just after it was published, answered 0, and neither taken
    // nor reported. Found closed, the position is published withdrawn: a close that counted
    // it then neither waits for it nor reports it.
    fence(Ordering::SeqCst);
    if h.state.load(Ordering::Relaxed) != RING_OPEN {
        return Err(Refused::ClosedAfterClaim(pos));
    }
    Ok(pos)
}

impl DescRing {
    /// Claims a position, as a CPU XPU's thread does: `-FI_EAGAIN` when the ring is full,
    /// `-FI_ESHUTDOWN` when it closed. The slot is found through the ring's own mask and
    /// address, not the header's `slots` and `mask` (what a device reads), which the XPU
    /// may have overwritten.
    pub(crate) fn claim(&self) -> std::result::Result<Claim<'_>, i32> {
        self.claim_with(&Native)
    }

    /// `claim` with the producer's atomics `rmw`.
    pub(crate) fn claim_with(&self, rmw: &impl ProducerRmw) -> std::result::Result<Claim<'_>, i32> {
        let claim = |pos| Claim {
            slot: self.slot(pos),
            pos,
        };
        match reserve(self.header(), self.mask, rmw) {
            Ok(pos) => Ok(claim(pos)),
            Err(r) => {
                if let Refused::ClosedAfterClaim(pos) = r {
                    claim(pos).withdraw();
                }
                Err(r.errno())
            }
        }
    }

    /// Claims, writes and publishes `d` (what every device call does).
    pub(crate) fn post(&self, d: &XpuDesc) -> i32 {
        match self.claim() {
            Ok(c) => {
                c.write(d);
                c.publish();
                0
            }
            Err(e) => e,
        }
    }
}
