//! Receive-side matching written once: posted receives (untagged and tagged), unexpected
//! messages, directed receive, ignore bits, `FI_PEEK` / `FI_CLAIM` / `FI_DISCARD` and
//! `FI_MULTI_RECV`. It is a plain data structure with no I/O: a provider feeds it arrivals and
//! posts, and acts on what it returns (copy bytes, complete, tell a sender).
//!
//! `U` is the provider's handle to an unexpected message's payload (buffered bytes, or a
//! rendezvous descriptor saying where the sender's data still lives).

use std::collections::{HashMap, VecDeque};

use crate::consts::*;
use crate::entry::{Context, FiAddr};

/// Most segments an I/O vector may have (`iov_limit`).
pub const IOV_LIMIT: usize = 4;

/// `struct iovec`: one raw segment of caller memory (`iov_base`, `iov_len`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawIov {
    /// Start address.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
}

/// A fixed-capacity I/O vector of raw segments; copying one never allocates.
///
/// Invariant: no segment wraps the address space (`addr + len` fits a `usize`), so offsets
/// inside a segment never overflow. Segments can come from a peer (a rendezvous or RMA
/// descriptor): `from_segs` refuses one that wraps, and `one` cuts its length at the end of
/// the address space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IovList {
    segs: [RawIov; IOV_LIMIT],
    n: u8,
}

impl IovList {
    /// One segment (its length cut where it would wrap the address space, which no real
    /// buffer does).
    #[inline]
    pub fn one(addr: usize, len: usize) -> Self {
        let mut l = IovList::default();
        let len = len.min(usize::MAX - addr);
        l.segs[0] = RawIov { addr, len };
        l.n = 1;
        l
    }

    /// Up to `IOV_LIMIT` segments; `None` if there are more, or if one wraps the address
    /// space.
    pub fn from_segs(segs: impl IntoIterator<Item = RawIov>) -> Option<Self> {
        let mut l = IovList::default();
        for s in segs {
            if l.n as usize == IOV_LIMIT || s.addr.checked_add(s.len).is_none() {
                return None;
            }
            l.segs[l.n as usize] = s;
            l.n += 1;
        }
        Some(l)
    }

    /// The segments.
    #[inline]
    pub fn segs(&self) -> &[RawIov] {
        &self.segs[..self.n as usize]
    }

    /// Total length.
    #[inline]
    pub fn total(&self) -> usize {
        // Saturating: lengths can come from a peer, and a sum that wrapped must not pass a check.
        self.segs()
            .iter()
            .fold(0usize, |a, s| a.saturating_add(s.len))
    }

    /// Whether any byte of the list lies in `addr..addr + len`.
    pub fn overlaps(&self, addr: usize, len: usize) -> bool {
        let end = addr.saturating_add(len);
        self.segs()
            .iter()
            .any(|s| s.len > 0 && len > 0 && s.addr < end && addr < s.addr.saturating_add(s.len))
    }

    /// Address of the first byte (0 for an empty list).
    pub fn first_addr(&self) -> usize {
        self.segs().first().map_or(0, |s| s.addr)
    }

    /// Copies `src` into the vector starting `offset` bytes in; returns bytes copied.
    ///
    /// # Safety
    /// Every segment must be writable memory of its stated length, not aliased by `src`.
    #[inline]
    pub unsafe fn copy_in(&self, offset: usize, src: &[u8]) -> usize {
        // One segment, from its start (every small message into a plain receive): one copy,
        // without the walk over segments.
        if self.n == 1 && offset == 0 {
            let s = self.segs[0];
            let n = s.len.min(src.len());
            if n == 0 {
                // An empty buffer may be null: nothing to copy, nowhere.
                return 0;
            }
            // SAFETY: as below, with offset 0.
            unsafe { crate::copy::copy_bytes(src.as_ptr(), s.addr as *mut u8, n) };
            return n;
        }
        // SAFETY: forwarded.
        unsafe { self.copy_in_walk(offset, src) }
    }

    /// `copy_in` over any segments.
    ///
    /// # Safety
    /// As `copy_in`.
    unsafe fn copy_in_walk(&self, mut offset: usize, mut src: &[u8]) -> usize {
        let mut done = 0;
        for s in self.segs() {
            if src.is_empty() {
                break;
            }
            if offset >= s.len {
                offset -= s.len;
                continue;
            }
            let n = (s.len - offset).min(src.len());
            // SAFETY: the caller guarantees the segment is writable for s.len bytes and that
            // it does not overlap src; offset + n <= s.len.
            unsafe { crate::copy::copy_bytes(src.as_ptr(), (s.addr + offset) as *mut u8, n) };
            src = &src[n..];
            done += n;
            offset = 0;
        }
        done
    }

    /// Copies bytes `offset..offset+dst.len()` of the vector into `dst`; returns bytes copied.
    ///
    /// # Safety
    /// Every segment must be readable memory of its stated length.
    #[inline]
    pub unsafe fn copy_out(&self, offset: usize, dst: &mut [u8]) -> usize {
        // One segment, from its start (every small send): one copy.
        if self.n == 1 && offset == 0 {
            let s = self.segs[0];
            let n = s.len.min(dst.len());
            if n == 0 {
                // An empty buffer may be null: nothing to copy, nowhere.
                return 0;
            }
            // SAFETY: as below, with offset 0.
            unsafe { crate::copy::copy_bytes(s.addr as *const u8, dst.as_mut_ptr(), n) };
            return n;
        }
        // SAFETY: forwarded.
        unsafe { self.copy_out_walk(offset, dst) }
    }

    /// `copy_out` over any segments.
    ///
    /// # Safety
    /// As `copy_out`.
    unsafe fn copy_out_walk(&self, mut offset: usize, dst: &mut [u8]) -> usize {
        let mut done = 0;
        for s in self.segs() {
            if done == dst.len() {
                break;
            }
            if offset >= s.len {
                offset -= s.len;
                continue;
            }
            let n = (s.len - offset).min(dst.len() - done);
            // SAFETY: the caller guarantees the segment is readable; offset + n <= s.len and
            // done + n <= dst.len().
            unsafe {
                crate::copy::copy_bytes((s.addr + offset) as *const u8, dst[done..].as_mut_ptr(), n)
            };
            done += n;
            offset = 0;
        }
        done
    }

    /// The sub-vector covering bytes `offset..offset+len`.
    pub fn slice(&self, mut offset: usize, mut len: usize) -> IovList {
        let mut out = IovList::default();
        for s in self.segs() {
            if len == 0 {
                break;
            }
            if offset >= s.len {
                offset -= s.len;
                continue;
            }
            let n = (s.len - offset).min(len);
            out.segs[out.n as usize] = RawIov {
                addr: s.addr + offset,
                len: n,
            };
            out.n += 1;
            len -= n;
            offset = 0;
        }
        out
    }
}

/// A receive the application posted.
#[derive(Clone, Debug)]
pub struct PostedRecv {
    /// Returned in the completion.
    pub ctx: Context,
    /// Where data goes.
    pub iov: IovList,
    /// Only messages from this address match (`FI_ADDR_UNSPEC`: any).
    pub src: FiAddr,
    /// Tag to match (tagged receives).
    pub tag: u64,
    /// Bits of the tag that are ignored.
    pub ignore: u64,
    /// Operation flags: `FI_TAGGED` or `FI_MSG`, `FI_COMPLETION`, `FI_MULTI_RECV`, ...
    pub flags: u64,
    /// Bytes of a multi-receive buffer already handed out.
    pub used: usize,
    /// Posted by an XPU's descriptor: counted while it waits (`RecvQueue::xpu_posted`), so
    /// that a device posting receives in a loop meets a bound.
    pub from_xpu: bool,
}

impl PostedRecv {
    fn tagged(&self) -> bool {
        self.flags & FI_TAGGED != 0
    }

    fn accepts(&self, src: FiAddr, tag: u64, directed: bool) -> bool {
        (!directed || self.src == FI_ADDR_UNSPEC || self.src == src)
            && (!self.tagged() || (tag & !self.ignore) == (self.tag & !self.ignore))
    }
}

/// Where one arriving message lands.
#[derive(Clone, Copy, Debug)]
pub struct RecvSlot {
    /// The receive's context.
    pub ctx: Context,
    /// The memory for this message (a window of a multi-receive buffer).
    pub iov: IovList,
    /// `FI_RECV | FI_MSG` or `FI_RECV | FI_TAGGED`, plus `FI_MULTI_RECV` when this message
    /// releases a multi-receive buffer.
    pub flags: u64,
    /// Whether a CQ entry is wanted (selective completion).
    pub op_flags: u64,
}

/// An arrived message no receive has taken yet.
#[derive(Debug)]
pub struct Unexpected<U> {
    /// Sender's address (`FI_ADDR_NOTAVAIL` if not in the AV).
    pub src: FiAddr,
    /// Tag (tagged messages).
    pub tag: u64,
    /// Remote CQ data, if `has_data`.
    pub data: u64,
    /// Whether the sender attached remote CQ data.
    pub has_data: bool,
    /// Message length.
    pub len: usize,
    /// Bytes the provider holds for it (buffered payload and bookkeeping), counted against
    /// the endpoint's unexpected-message limit until a receive takes it.
    pub held: usize,
    /// Who `held` is charged to (the sending peer, as the provider numbers peers): one peer's
    /// share of the limit is bounded too (`RecvQueue::held_by`).
    pub owner: usize,
    /// Provider's payload handle.
    pub payload: U,
}

/// What posting a receive led to.
pub enum PostResult<U> {
    /// Queued; it will match a later arrival.
    Queued,
    /// Matched buffered messages: copy each into its slot and complete. (A multi-receive
    /// buffer can take several.)
    Matched(Vec<(RecvSlot, Unexpected<U>)>),
    /// `FI_PEEK`: a matching message is there (left queued unless claimed). The completion
    /// carries its length, tag and data; no data moves.
    Peeked {
        /// Context of the peek.
        ctx: Context,
        /// Length of the message found.
        len: usize,
        /// Its tag.
        tag: u64,
        /// Its data.
        data: u64,
        /// Whether it carries data.
        has_data: bool,
        /// Its source.
        src: FiAddr,
        /// The message itself when `FI_DISCARD` asked for it to be dropped.
        discarded: Option<Unexpected<U>>,
    },
    /// `FI_PEEK` found nothing: report `FI_ENOMSG`.
    NoMessage,
}

/// A multi-receive buffer with messages still landing in it.
#[derive(Default)]
struct MultiState {
    inflight: u32,
    exhausted: bool,
}

/// A posted receive of context `ctx` leaves the queue unfinished (canceled, its source lost,
/// the endpoint closed): whether its buffer is released now. A multi-receive buffer with
/// messages still landing in it is only retired: they complete, and the last one carries
/// `FI_MULTI_RECV` (released before them, the application could reuse memory a copy still
/// writes).
fn retire(multi: &mut HashMap<Context, MultiState>, ctx: Context) -> bool {
    match multi.get_mut(&ctx) {
        Some(m) if m.inflight > 0 => {
            m.exhausted = true;
            false
        }
        Some(_) => {
            multi.remove(&ctx);
            true
        }
        None => true,
    }
}

/// The matching engine.
pub struct RecvQueue<U> {
    posted_msg: VecDeque<PostedRecv>,
    posted_tag: VecDeque<PostedRecv>,
    unexp_msg: VecDeque<Unexpected<U>>,
    unexp_tag: VecDeque<Unexpected<U>>,
    claimed: HashMap<Context, Unexpected<U>>,
    /// Multi-receive buffers by context: the buffer is released (`FI_MULTI_RECV` on a
    /// completion) only when it is exhausted and the last message landing in it completes,
    /// which for a large message moved in fragments is not the order they were matched in.
    multi: HashMap<Context, MultiState>,
    directed: bool,
    /// Sum of `held` over the buffered and claimed messages.
    held: usize,
    /// The same sum per `owner`, with the owner's message count (owners holding nothing are
    /// not kept).
    held_by: HashMap<usize, (usize, usize)>,
    /// Smallest space a multi-receive buffer keeps before it is released (`FI_OPT_MIN_MULTI_RECV`).
    pub min_multi_recv: usize,
    /// Posted receives with `from_xpu`.
    xpu_posted: usize,
}

impl<U> RecvQueue<U> {
    /// An empty engine; `directed` enables source filtering (`FI_DIRECTED_RECV`).
    pub fn new(directed: bool) -> Self {
        RecvQueue {
            posted_msg: VecDeque::new(),
            posted_tag: VecDeque::new(),
            unexp_msg: VecDeque::new(),
            unexp_tag: VecDeque::new(),
            claimed: HashMap::new(),
            multi: HashMap::new(),
            directed,
            held: 0,
            held_by: HashMap::new(),
            min_multi_recv: 64,
            xpu_posted: 0,
        }
    }

    /// An arrival: the slot it lands in, if a posted receive takes it.
    #[inline]
    pub fn match_arrival(
        &mut self,
        src: FiAddr,
        tag: u64,
        tagged: bool,
        len: usize,
    ) -> Option<RecvSlot> {
        let directed = self.directed;
        let q = if tagged {
            &mut self.posted_tag
        } else {
            &mut self.posted_msg
        };
        // The oldest receive takes most arrivals, whole: its slot is read in place and the
        // receive popped, with no search and no call.
        let front = q.front()?;
        if front.accepts(src, tag, directed) && front.flags & FI_MULTI_RECV == 0 {
            let slot = RecvSlot {
                ctx: front.ctx,
                iov: front.iov,
                flags: FI_RECV | if front.tagged() { FI_TAGGED } else { FI_MSG },
                op_flags: front.flags,
            };
            self.xpu_posted -= usize::from(front.from_xpu);
            q.pop_front();
            return Some(slot);
        }
        self.match_later(src, tag, tagged, len)
    }

    /// `match_arrival` past its common case: a later receive, or a multi-receive buffer.
    #[inline(never)]
    fn match_later(&mut self, src: FiAddr, tag: u64, tagged: bool, len: usize) -> Option<RecvSlot> {
        let directed = self.directed;
        let min = self.min_multi_recv;
        let q = if tagged {
            &mut self.posted_tag
        } else {
            &mut self.posted_msg
        };
        let i = q.iter().position(|r| r.accepts(src, tag, directed))?;
        Some(take_slot(
            q,
            i,
            len,
            min,
            &mut self.multi,
            &mut self.xpu_posted,
        ))
    }

    /// Whether an arrival would be taken by a posted receive (nothing changes).
    pub fn would_match(&self, src: FiAddr, tag: u64, tagged: bool) -> bool {
        let q = if tagged {
            &self.posted_tag
        } else {
            &self.posted_msg
        };
        q.iter().any(|r| r.accepts(src, tag, self.directed))
    }

    /// Whether posting `r` now would take a buffered message (nothing changes).
    pub fn takes_buffered(&self, r: &PostedRecv) -> bool {
        let q = if r.tagged() {
            &self.unexp_tag
        } else {
            &self.unexp_msg
        };
        q.iter().any(|u| r.accepts(u.src, u.tag, self.directed))
    }

    /// Buffers an arrival no receive took.
    pub fn push_unexpected(&mut self, tagged: bool, u: Unexpected<U>) {
        self.held = self.held.saturating_add(u.held);
        let by = self.held_by.entry(u.owner).or_insert((0, 0));
        by.0 = by.0.saturating_add(u.held);
        by.1 += 1;
        if tagged {
            self.unexp_tag.push_back(u);
        } else {
            self.unexp_msg.push_back(u);
        }
    }

    /// Whether a message claimed by a peek (`FI_PEEK | FI_CLAIM`) waits under `ctx`.
    pub fn claimed_by(&self, ctx: Context) -> bool {
        self.claimed.contains_key(&ctx)
    }

    /// A message claimed under `from` is now claimed under `to` (a claim posted again under
    /// another context: a staged receive's key); false where nothing is claimed under `from`.
    pub fn rekey_claim(&mut self, from: Context, to: Context) -> bool {
        match self.claimed.remove(&from) {
            Some(u) => {
                self.claimed.insert(to, u);
                true
            }
            None => false,
        }
    }

    /// Posts a receive (with `flags` from `recvmsg`).
    pub fn post(&mut self, r: PostedRecv) -> PostResult<U> {
        let tagged = r.tagged();
        let directed = self.directed;
        if r.flags & FI_PEEK != 0 {
            let q = if tagged {
                &mut self.unexp_tag
            } else {
                &mut self.unexp_msg
            };
            let Some(i) = q.iter().position(|u| r.accepts(u.src, u.tag, directed)) else {
                return PostResult::NoMessage;
            };
            let u = &q[i];
            let (len, tag, data, has_data, src) = (u.len, u.tag, u.data, u.has_data, u.src);
            let mut discarded = None;
            if r.flags & (FI_CLAIM | FI_DISCARD) != 0 {
                let u = q.remove(i).expect("index from position");
                if r.flags & FI_DISCARD != 0 {
                    self.release(&u);
                    discarded = Some(u);
                } else {
                    self.claimed.insert(r.ctx, u);
                }
            }
            return PostResult::Peeked {
                ctx: r.ctx,
                len,
                tag,
                data,
                has_data,
                src,
                discarded,
            };
        }
        if r.flags & FI_CLAIM != 0 {
            let Some(u) = self.claimed.remove(&r.ctx) else {
                return PostResult::NoMessage;
            };
            self.release(&u);
            let slot = RecvSlot {
                ctx: r.ctx,
                iov: if r.flags & FI_DISCARD != 0 {
                    IovList::default()
                } else {
                    r.iov
                },
                flags: FI_RECV | FI_TAGGED,
                op_flags: r.flags,
            };
            return PostResult::Matched(vec![(slot, u)]);
        }
        let min = self.min_multi_recv;
        let (posted, unexp) = if tagged {
            (&mut self.posted_tag, &mut self.unexp_tag)
        } else {
            (&mut self.posted_msg, &mut self.unexp_msg)
        };
        self.xpu_posted += usize::from(r.from_xpu);
        if unexp.is_empty() {
            // Nothing waits for it (a ping-pong's every receive): queued, no search.
            posted.push_back(r);
            return PostResult::Queued;
        }
        let multi = r.flags & FI_MULTI_RECV != 0;
        let mut matched = Vec::new();
        // Queue it first so that take_slot's multi-receive bookkeeping is the one used for
        // arrivals too; it is at the back, and nothing queued before it matched these messages.
        posted.push_back(r);
        let idx = posted.len() - 1;
        loop {
            let r = &posted[idx];
            let Some(i) = unexp.iter().position(|u| r.accepts(u.src, u.tag, directed)) else {
                break;
            };
            let u = unexp.remove(i).expect("index from position");
            self.held = self.held.saturating_sub(u.held);
            release_owner(&mut self.held_by, &u);
            let before = posted.len();
            let slot = take_slot(
                posted,
                idx,
                u.len,
                min,
                &mut self.multi,
                &mut self.xpu_posted,
            );
            matched.push((slot, u));
            if !multi || posted.len() < before {
                break;
            }
        }
        if matched.is_empty() {
            PostResult::Queued
        } else {
            PostResult::Matched(matched)
        }
    }

    /// Call for every slot before reporting its completion (success or error): adds
    /// `FI_MULTI_RECV` when this is the last message of an exhausted multi-receive buffer.
    #[inline]
    pub fn finish_slot(&mut self, slot: &mut RecvSlot) {
        if slot.op_flags & FI_MULTI_RECV != 0 {
            self.finish_multi(slot);
        }
    }

    /// `finish_slot` for a window of a multi-receive buffer.
    #[inline(never)]
    fn finish_multi(&mut self, slot: &mut RecvSlot) {
        let Some(m) = self.multi.get_mut(&slot.ctx) else {
            return;
        };
        m.inflight = m.inflight.saturating_sub(1);
        if m.exhausted && m.inflight == 0 {
            self.multi.remove(&slot.ctx);
            slot.flags |= FI_MULTI_RECV;
        }
    }

    /// Removes a posted receive by context (`fi_cancel`). Returns it and whether its buffer is
    /// released now: a multi-receive buffer with messages still landing in it is only retired
    /// (those complete, and the last one carries `FI_MULTI_RECV`).
    pub fn cancel(&mut self, ctx: Context) -> Option<(PostedRecv, bool)> {
        for q in [&mut self.posted_msg, &mut self.posted_tag] {
            if let Some(i) = q.iter().position(|r| r.ctx == ctx) {
                let r = q.remove(i)?;
                self.xpu_posted -= usize::from(r.from_xpu);
                let released = retire(&mut self.multi, ctx);
                return Some((r, released));
            }
        }
        None
    }

    /// Removes the receives posted for source `src` alone (their peer is gone), each with
    /// whether its buffer is released now (as `cancel`).
    pub fn drain_from(&mut self, src: FiAddr) -> Vec<(PostedRecv, bool)> {
        let mut out = Vec::new();
        for q in [&mut self.posted_msg, &mut self.posted_tag] {
            let (from, rest): (VecDeque<_>, VecDeque<_>) = q.drain(..).partition(|r| r.src == src);
            *q = rest;
            out.extend(from.into_iter().map(|r| {
                self.xpu_posted -= usize::from(r.from_xpu);
                let released = retire(&mut self.multi, r.ctx);
                (r, released)
            }));
        }
        out
    }

    /// Whether a receive is posted for source `src` alone.
    pub fn has_posted_from(&self, src: FiAddr) -> bool {
        self.posted_msg
            .iter()
            .chain(&self.posted_tag)
            .any(|r| r.src == src)
    }

    /// Every posted receive, removed (endpoint close), each with whether its buffer is
    /// released now (as `cancel`).
    pub fn drain_posted(&mut self) -> Vec<(PostedRecv, bool)> {
        self.xpu_posted = 0;
        let multi = &mut self.multi;
        self.posted_msg
            .drain(..)
            .chain(self.posted_tag.drain(..))
            .map(|r| {
                let released = retire(multi, r.ctx);
                (r, released)
            })
            .collect()
    }

    /// Every buffered or claimed message, removed (endpoint close).
    pub fn drain_unexpected(&mut self) -> Vec<Unexpected<U>> {
        self.held = 0;
        self.held_by.clear();
        let mut v: Vec<_> = self
            .unexp_msg
            .drain(..)
            .chain(self.unexp_tag.drain(..))
            .collect();
        v.extend(self.claimed.drain().map(|(_, u)| u));
        v
    }

    /// Number of buffered unexpected messages.
    pub fn unexpected_len(&self) -> usize {
        self.unexp_msg.len() + self.unexp_tag.len() + self.claimed.len()
    }

    /// Bytes held for buffered unexpected messages (the sum of their `held`).
    pub fn unexpected_bytes(&self) -> usize {
        self.held
    }

    /// Bytes held for buffered unexpected messages charged to `owner`.
    pub fn held_by(&self, owner: usize) -> usize {
        self.held_by.get(&owner).map_or(0, |b| b.0)
    }

    /// Buffered unexpected messages charged to `owner`.
    pub fn msgs_by(&self, owner: usize) -> usize {
        self.held_by.get(&owner).map_or(0, |b| b.1)
    }

    /// A buffered message leaves: its bytes are no longer charged.
    fn release(&mut self, u: &Unexpected<U>) {
        self.held = self.held.saturating_sub(u.held);
        release_owner(&mut self.held_by, u);
    }

    /// Posted receives an XPU's descriptor posted (`PostedRecv::from_xpu`).
    pub fn xpu_posted(&self) -> usize {
        self.xpu_posted
    }

    /// Number of posted receives.
    pub fn posted_len(&self) -> usize {
        self.posted_msg.len() + self.posted_tag.len()
    }

    /// Visits buffered messages mutably (e.g. to fail those from a dead peer).
    pub fn unexpected_mut(&mut self) -> impl Iterator<Item = &mut Unexpected<U>> {
        self.unexp_msg
            .iter_mut()
            .chain(self.unexp_tag.iter_mut())
            .chain(self.claimed.values_mut())
    }
}

/// Takes `u`'s bytes off its owner's sum (a free function: `post` holds other fields borrowed).
fn release_owner<U>(held_by: &mut HashMap<usize, (usize, usize)>, u: &Unexpected<U>) {
    if let Some(by) = held_by.get_mut(&u.owner) {
        by.0 = by.0.saturating_sub(u.held);
        by.1 = by.1.saturating_sub(1);
        if by.1 == 0 {
            held_by.remove(&u.owner);
        }
    }
}

/// Takes the slot for a `len`-byte message from posted receive `i`, removing the receive
/// unless it is a multi-receive buffer with at least `min` bytes left afterwards.
fn take_slot(
    q: &mut VecDeque<PostedRecv>,
    i: usize,
    len: usize,
    min: usize,
    multi: &mut HashMap<Context, MultiState>,
    xpu_posted: &mut usize,
) -> RecvSlot {
    let r = &mut q[i];
    let kind = if r.tagged() { FI_TAGGED } else { FI_MSG };
    if r.flags & FI_MULTI_RECV == 0 {
        // Read in place (the receive is not moved out whole, only its slot's fields).
        let slot = RecvSlot {
            ctx: r.ctx,
            iov: r.iov,
            flags: FI_RECV | kind,
            op_flags: r.flags,
        };
        *xpu_posted -= usize::from(r.from_xpu);
        // The oldest receive takes most arrivals: popped, not shifted out.
        if i == 0 {
            q.pop_front();
        } else {
            q.remove(i);
        }
        return slot;
    }
    let total = r.iov.total();
    let n = len.min(total - r.used);
    let iov = r.iov.slice(r.used, total - r.used);
    r.used += n;
    let slot = RecvSlot {
        ctx: r.ctx,
        iov,
        flags: FI_RECV | kind,
        op_flags: r.flags,
    };
    let m = multi.entry(r.ctx).or_default();
    m.inflight += 1;
    if total - r.used < min.max(1) {
        m.exhausted = true;
        *xpu_posted -= usize::from(r.from_xpu);
        q.remove(i);
    }
    slot
}

#[cfg(test)]
mod tests {

    #[test]
    fn copies_of_every_small_size_are_exact() {
        let src: Vec<u8> = (1..=48).collect();
        for n in 0..=40 {
            let mut dst = [0u8; 48];
            // SAFETY: both buffers hold at least n bytes and do not overlap.
            unsafe { crate::copy::copy_bytes(src.as_ptr(), dst.as_mut_ptr(), n) };
            assert_eq!(&dst[..n], &src[..n], "{n} bytes");
            assert!(
                dst[n..].iter().all(|&b| b == 0),
                "{n} bytes: none past the end"
            );
        }
    }

    #[test]
    fn no_segment_wraps_the_address_space() {
        let wrap = RawIov {
            addr: usize::MAX - 10,
            len: 100,
        };
        assert!(IovList::from_segs([wrap]).is_none());
        let edge = RawIov {
            addr: usize::MAX - 100,
            len: 100,
        };
        let l = IovList::from_segs([edge]).unwrap();
        assert_eq!(l.slice(50, 50).segs()[0].addr, usize::MAX - 50);
        assert_eq!(IovList::one(usize::MAX - 10, 100).total(), 10);
    }

    use super::*;

    fn recv(ctx: usize, tag: u64, ignore: u64, flags: u64, len: usize) -> PostedRecv {
        PostedRecv {
            ctx,
            iov: IovList::one(0x1000, len),
            src: FI_ADDR_UNSPEC,
            tag,
            ignore,
            flags,
            used: 0,
            from_xpu: false,
        }
    }

    fn unexp(src: FiAddr, tag: u64, len: usize) -> Unexpected<u32> {
        Unexpected {
            src,
            tag,
            data: 0,
            has_data: false,
            len,
            held: len,
            owner: (tag & 1) as usize,
            payload: tag as u32,
        }
    }

    #[test]
    fn held_bytes_follow_every_way_out() {
        let mut q = RecvQueue::<u32>::new(false);
        q.push_unexpected(true, unexp(0, 1, 10));
        q.push_unexpected(true, unexp(0, 2, 20));
        q.push_unexpected(true, unexp(0, 3, 40));
        assert_eq!(q.unexpected_bytes(), 70);
        assert!(!q.would_match(0, 9, true));
        assert!(matches!(
            q.post(recv(1, 1, 0, FI_TAGGED, 100)),
            PostResult::Matched(_)
        ));
        assert_eq!(q.unexpected_bytes(), 60);
        assert_eq!((q.held_by(0), q.held_by(1)), (20, 40));
        // Claimed messages are still held; discarded ones are not.
        assert!(matches!(
            q.post(recv(2, 2, 0, FI_TAGGED | FI_PEEK | FI_CLAIM, 0)),
            PostResult::Peeked { .. }
        ));
        assert_eq!(q.unexpected_bytes(), 60);
        assert!(matches!(
            q.post(recv(2, 2, 0, FI_TAGGED | FI_CLAIM, 100)),
            PostResult::Matched(_)
        ));
        assert_eq!(q.unexpected_bytes(), 40);
        assert_eq!((q.held_by(0), q.held_by(1)), (0, 40));
        assert!(matches!(
            q.post(recv(3, 3, 0, FI_TAGGED | FI_PEEK | FI_DISCARD, 0)),
            PostResult::Peeked { .. }
        ));
        assert_eq!(q.unexpected_bytes(), 0);
        assert_eq!(q.held_by(1), 0);
        q.push_unexpected(false, unexp(0, 0, 5));
        q.drain_unexpected();
        assert_eq!((q.unexpected_bytes(), q.held_by(0)), (0, 0));
        assert!(!q.would_match(0, 0, false));
        let _ = q.post(recv(4, 0, 0, 0, 100));
        assert!(q.would_match(0, 0, false));
    }

    #[test]
    fn receives_from_xpus_are_counted_until_every_way_out() {
        let mut q = RecvQueue::<u32>::new(true);
        let xpu = |ctx, tag, flags, len| PostedRecv {
            from_xpu: true,
            ..recv(ctx, tag, 0, flags, len)
        };
        // Queued, with the application's own beside them (not counted).
        for (ctx, tag) in [(1, 1), (2, 2), (3, 3)] {
            let _ = q.post(xpu(ctx, tag, FI_TAGGED, 8));
        }
        let _ = q.post(recv(4, 4, 0, FI_TAGGED, 8));
        let _ = q.post(xpu(5, 0, FI_MSG, 8));
        assert_eq!(q.xpu_posted(), 4);
        // Taken by an arrival at the front, and past it.
        assert!(q.match_arrival(0, 1, true, 8).is_some());
        assert!(q.match_arrival(0, 3, true, 8).is_some());
        assert_eq!(q.xpu_posted(), 2);
        // Matched when posted: never counted.
        q.push_unexpected(true, unexp(0, 6, 8));
        assert!(matches!(
            q.post(xpu(6, 6, FI_TAGGED, 8)),
            PostResult::Matched(_)
        ));
        assert_eq!(q.xpu_posted(), 2);
        // Canceled; drained for a lost source; a multi-receive buffer once exhausted.
        assert!(q.cancel(2).is_some());
        assert_eq!(q.xpu_posted(), 1);
        let _ = q.post(PostedRecv {
            src: 9,
            ..xpu(7, 0, FI_MSG, 8)
        });
        assert_eq!(q.xpu_posted(), 2);
        assert_eq!(q.drain_from(9).len(), 1);
        assert_eq!(q.xpu_posted(), 1);
        q.min_multi_recv = 8;
        let _ = q.post(xpu(8, 0, FI_MSG | FI_MULTI_RECV, 16));
        assert_eq!(q.xpu_posted(), 2);
        assert!(q.match_arrival(0, 0, false, 8).is_some()); // receive 5
        assert!(q.match_arrival(0, 0, false, 8).is_some()); // 8 of the buffer: 8 left
        assert_eq!(q.xpu_posted(), 1);
        assert!(q.match_arrival(0, 0, false, 8).is_some()); // exhausted
        assert_eq!(q.xpu_posted(), 0);
        // Closing drains the rest.
        let _ = q.post(xpu(10, 0, FI_MSG, 8));
        assert_eq!(q.xpu_posted(), 1);
        assert_eq!(q.drain_posted().len(), 2);
        assert_eq!(q.xpu_posted(), 0);
    }

    #[test]
    fn tagged_match_with_ignore_bits_in_post_order() {
        let mut q = RecvQueue::<u32>::new(false);
        assert!(matches!(
            q.post(recv(1, 0x10, 0x0f, FI_TAGGED, 8)),
            PostResult::Queued
        ));
        assert!(matches!(
            q.post(recv(2, 0x10, 0, FI_TAGGED, 8)),
            PostResult::Queued
        ));
        assert!(q.match_arrival(0, 0x20, true, 8).is_none());
        let s = q.match_arrival(0, 0x13, true, 8).unwrap();
        assert_eq!(s.ctx, 1);
        assert_eq!(s.flags, FI_RECV | FI_TAGGED);
        assert_eq!(q.match_arrival(0, 0x10, true, 8).unwrap().ctx, 2);
        assert!(q.match_arrival(0, 0x10, false, 8).is_none());
    }

    #[test]
    fn unexpected_then_post_and_directed() {
        let mut q = RecvQueue::<u32>::new(true);
        q.push_unexpected(true, unexp(5, 7, 4));
        q.push_unexpected(true, unexp(6, 7, 4));
        let mut r = recv(1, 7, 0, FI_TAGGED, 8);
        r.src = 6;
        match q.post(r) {
            PostResult::Matched(v) => {
                assert_eq!(v.len(), 1);
                assert_eq!(v[0].1.src, 6);
            }
            _ => panic!("expected a match"),
        }
        assert_eq!(q.unexpected_len(), 1);
    }

    #[test]
    fn peek_claim_discard() {
        let mut q = RecvQueue::<u32>::new(false);
        assert!(matches!(
            q.post(recv(1, 9, 0, FI_TAGGED | FI_PEEK, 0)),
            PostResult::NoMessage
        ));
        q.push_unexpected(true, unexp(0, 9, 3));
        match q.post(recv(1, 9, 0, FI_TAGGED | FI_PEEK, 0)) {
            PostResult::Peeked { len, discarded, .. } => assert!(len == 3 && discarded.is_none()),
            _ => panic!(),
        }
        assert_eq!(q.unexpected_len(), 1);
        assert!(matches!(
            q.post(recv(2, 9, 0, FI_TAGGED | FI_PEEK | FI_CLAIM, 0)),
            PostResult::Peeked { .. }
        ));
        // Claimed: no longer visible to other receives.
        assert!(q.match_arrival(0, 9, true, 1).is_none());
        assert!(matches!(
            q.post(recv(3, 9, 0, FI_TAGGED | FI_PEEK, 0)),
            PostResult::NoMessage
        ));
        match q.post(recv(2, 0, 0, FI_TAGGED | FI_CLAIM, 8)) {
            PostResult::Matched(v) => assert_eq!(v[0].1.len, 3),
            _ => panic!(),
        }
        q.push_unexpected(true, unexp(0, 4, 3));
        match q.post(recv(4, 4, 0, FI_TAGGED | FI_PEEK | FI_DISCARD, 0)) {
            PostResult::Peeked { discarded, .. } => assert!(discarded.is_some()),
            _ => panic!(),
        }
        assert_eq!(q.unexpected_len(), 0);
    }

    #[test]
    fn multi_recv_windows_and_release() {
        let mut q = RecvQueue::<u32>::new(false);
        q.min_multi_recv = 16;
        q.push_unexpected(false, unexp(0, 0, 40));
        let PostResult::Matched(v) = q.post(recv(1, 0, 0, FI_MSG | FI_MULTI_RECV, 100)) else {
            panic!()
        };
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].0.iov.first_addr(), 0x1000);
        let mut first = v.into_iter().next().unwrap().0;
        let mut s = q.match_arrival(0, 0, false, 40).unwrap();
        assert_eq!(s.iov.first_addr(), 0x1000 + 40);
        // 20 bytes left >= 16, so it stays; a 10-byte message leaves 10 and exhausts it.
        let mut last = q.match_arrival(0, 0, false, 10).unwrap();
        assert_eq!(q.posted_len(), 0);
        // Completions in another order than matching: only the last to finish releases.
        q.finish_slot(&mut last);
        q.finish_slot(&mut first);
        assert_eq!((last.flags | first.flags) & FI_MULTI_RECV, 0);
        q.finish_slot(&mut s);
        assert_eq!(s.flags & FI_MULTI_RECV, FI_MULTI_RECV);
    }

    #[test]
    fn iov_copy_across_segments() {
        let mut a = [0u8; 3];
        let mut b = [0u8; 5];
        let l = IovList::from_segs([
            RawIov {
                addr: a.as_mut_ptr() as usize,
                len: 3,
            },
            RawIov {
                addr: b.as_mut_ptr() as usize,
                len: 5,
            },
        ])
        .unwrap();
        // SAFETY: both arrays live for the call.
        let n = unsafe { l.copy_in(1, b"hello") };
        assert_eq!(n, 5);
        assert_eq!(&a, b"\0he");
        assert_eq!(&b[..3], b"llo");
        let mut out = [0u8; 4];
        // SAFETY: as above.
        assert_eq!(unsafe { l.copy_out(2, &mut out) }, 4);
        assert_eq!(&out, b"ello");
        assert_eq!(l.slice(2, 3).segs().len(), 2);
    }
}
