//! Completions the engine gathers under its provider's lock, and their reporting through
//! `EpCore` once the lock is released.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use crate::consts::*;
use crate::entry::Context;
use crate::ep::EpCore;
use crate::rxq::RecvSlot;
use crate::FiAddr;

use super::engine::DONE_KEPT;

/// A completion to report (`report`), gathered under the provider's lock.
#[derive(Debug)]
pub enum Done {
    /// An initiated operation completed.
    Tx {
        /// Its context.
        ctx: Context,
        /// Its operation flags.
        flags: u64,
    },
    /// An initiated operation failed.
    TxErr {
        /// Its context.
        ctx: Context,
        /// Its operation flags.
        flags: u64,
        /// Positive errno.
        err: i32,
    },
    /// A receive completed.
    Rx {
        /// Where it landed.
        slot: RecvSlot,
        /// Bytes delivered.
        len: usize,
        /// Bytes that did not fit.
        olen: usize,
        /// Tag.
        tag: u64,
        /// Remote CQ data.
        data: Option<u64>,
        /// Source.
        src: FiAddr,
        /// The sender's raw address, for `FI_SOURCE_ERR` when `src` is unknown.
        raw: Option<Vec<u8>>,
    },
    /// A posted receive failed (canceled, no message for a peek, its sender lost).
    RxErr {
        /// Its context.
        ctx: Context,
        /// `FI_RECV` and its kind.
        flags: u64,
        /// Tag.
        tag: u64,
        /// Positive errno.
        err: i32,
    },
    /// A matched receive failed; its slot is finished like a completed one.
    SlotErr {
        /// The slot.
        slot: RecvSlot,
        /// Tag.
        tag: u64,
        /// Positive errno.
        err: i32,
    },
    /// A peer's RMA or atomic access to our memory.
    Remote {
        /// `FI_RMA` or `FI_ATOMIC`, with `FI_READ` or `FI_WRITE`.
        flags: u64,
        /// Bytes.
        len: usize,
        /// Remote CQ data.
        data: Option<u64>,
    },
    /// A large remote write into device memory that arrived in a host buffer.
    RemoteStaged {
        /// The staging context (`EpCore::stage_remote`).
        ctx: Context,
        /// Bytes.
        len: usize,
        /// Remote CQ data.
        data: Option<u64>,
    },
    /// A failed remote write into device memory: its host buffer is freed.
    DropStaged {
        /// The staging context.
        ctx: Context,
    },
    /// A peek found a message.
    Peek {
        /// The peek's context.
        ctx: Context,
        /// The message's length.
        len: usize,
        /// Its tag.
        tag: u64,
        /// Its data.
        data: Option<u64>,
        /// Its source.
        src: FiAddr,
    },
}

/// Reports completions gathered under a provider's lock (`Engine::take_done`), in order,
/// leaving `done` empty (its allocation kept for the next round). Call it without holding the
/// lock the engine is under.
pub fn report(core: &EpCore, done: &mut Vec<Done>) {
    // Each completion is reported from where it lies (moving one out is a copy of its whole
    // variant); the vector is cleared at the end, keeping its allocation.
    report_each(core, done);
    done.clear();
}

/// Reports each of `done`, in order (what `report` does before clearing its vector).
fn report_each(core: &EpCore, done: &mut [Done]) {
    for d in done.iter_mut() {
        report_one(core, d);
    }
}

/// Reports `d` (taking its raw source address out, where it has one).
#[inline(always)]
fn report_one(core: &EpCore, d: &mut Done) {
    match d {
        Done::Tx { ctx, flags } => core.complete_tx(*ctx, *flags),
        Done::TxErr { ctx, flags, err } => core.fail_tx(*ctx, *flags, *err),
        Done::Rx {
            slot,
            len,
            olen,
            tag,
            data,
            src,
            raw,
        } => core.complete_rx(slot, *len, *olen, *tag, *data, *src, || {
            raw.take().unwrap_or_default()
        }),
        Done::RxErr {
            ctx,
            flags,
            tag,
            err,
        } => core.fail_rx(*ctx, *flags, *tag, *err),
        Done::SlotErr { slot, tag, err } => core.fail_rx(slot.ctx, slot.flags, *tag, *err),
        Done::Remote { flags, len, data } => core.complete_remote(*flags, *len, *data),
        Done::RemoteStaged { ctx, len, data } => {
            // A write that did not reach the device is not reported as done; the
            // driver's reason is kept (`EpCore::take_staging_errors`).
            if core.land_remote(*ctx, *len).is_ok() {
                core.complete_remote(FI_RMA | FI_WRITE, *len, *data)
            }
        }
        Done::DropStaged { ctx } => core.drop_remote(*ctx),
        Done::Peek {
            ctx,
            len,
            tag,
            data,
            src,
        } => core.complete_peek(*ctx, *len, *tag, *data, *src),
    }
}

/// Whether `d` is a message into a multi-receive buffer, or may end one: every posted
/// receive's failure counts (a canceled or lost multi-receive buffer whose release comes later,
/// with the last copy landing in it, says so by no flag of its own; failures are rare).
fn multi_window(d: &Done) -> bool {
    match d {
        Done::Rx { slot, .. } | Done::SlotErr { slot, .. } => {
            (slot.op_flags | slot.flags) & FI_MULTI_RECV != 0
        }
        Done::RxErr { .. } => true,
        _ => false,
    }
}

/// Under the provider's lock: the batch's place among this endpoint's batches that hold
/// multi-receive windows, which are reported in the order they were taken. Two threads each
/// reporting a batch taken under the lock would otherwise race: the release of a buffer
/// (`FI_MULTI_RECV`) could reach the CQ before an earlier message's entry in it, so that the
/// application reposts the buffer, a new message lands there, and the late entry points at
/// it; with a staged (device) buffer the release frees the bounce buffer the earlier message
/// had still to be landed from. None for a batch without such windows (the common case pays
/// a scan of it), or for one reported inside this thread's report of such a batch (a
/// triggered operation's completion): waiting there for our own turn would never end.
pub(crate) fn multi_ticket(core: &EpCore, batch: &[Done]) -> Option<u64> {
    if IN_MULTI.with(Cell::get) > 0 || !batch.iter().any(multi_window) {
        return None;
    }
    // Under the provider's lock: tickets follow the order batches were taken in.
    Some(core.multi_taken.fetch_add(1, Ordering::Relaxed))
}

/// Waits for `ticket`'s turn (every batch of multi-receive windows taken before it reported);
/// the turn passes to the next when the returned guard is dropped. A batch waits only for
/// ones taken before it, whose reports wait on nothing of ours, so the wait ends; the core
/// goes to them meanwhile.
pub(crate) fn multi_turn(core: &EpCore, ticket: Option<u64>) -> Option<MultiTurn<'_>> {
    let t = ticket?;
    while core.multi_done.load(Ordering::Acquire) != t {
        std::thread::yield_now();
    }
    IN_MULTI.with(|c| c.set(c.get() + 1));
    Some(MultiTurn { core, next: t + 1 })
}

/// A batch of multi-receive windows being reported (`multi_turn`); dropping it, a panic's
/// unwinding included, hands the turn on.
pub(crate) struct MultiTurn<'a> {
    core: &'a EpCore,
    next: u64,
}

impl Drop for MultiTurn<'_> {
    fn drop(&mut self) {
        IN_MULTI.with(|c| c.set(c.get().saturating_sub(1)));
        self.core.multi_done.store(self.next, Ordering::Release);
    }
}

thread_local! {
    /// Batches of multi-receive windows this thread is reporting (`multi_turn`).
    static IN_MULTI: Cell<u32> = const { Cell::new(0) };
    /// The emptied vector of the last batch this thread reported: the next batch taken out of
    /// a provider's state leaves it there, so that no lock is taken again to hand the
    /// allocation back and none is made per completion.
    static SPARE: Cell<Vec<Done>> = const { Cell::new(Vec::new()) };
}

/// The end of a provider's locked call: the completions its state holds (`done_of`, filled by
/// `Engine::take_done_into`) are reported once `st`, a guard of the provider's lock, is
/// released, so that counters they bump may start triggered operations on this endpoint. The
/// state keeps an empty vector with its allocation (this thread's spare); the reported one
/// becomes the spare. A report nested in another (a triggered operation completing at once)
/// works alike; the outer one's vector is the spare kept at the end.
pub fn report_unlocked<S>(
    core: &EpCore,
    mut st: MutexGuard<'_, S>,
    done_of: fn(&mut S) -> &mut Vec<Done>,
) {
    let held = done_of(&mut st);
    if held.len() <= 1 {
        // None, or one (most calls' completion): taken out, the state keeping its vector.
        let Some(mut one) = held.pop() else {
            return;
        };
        let ticket = multi_ticket(core, std::slice::from_ref(&one));
        let _r = core.reporting();
        drop(st);
        let _turn = multi_turn(core, ticket);
        report_one(core, &mut one);
        return;
    }
    // A thread being torn down has no spare: allocations are then made and freed.
    let mut spare = SPARE.try_with(Cell::take).unwrap_or_default();
    // The state gets as much room as the vector it hands over, whatever this thread's spare
    // was: its next batch is appended into it (`Engine::take_done_into`), and a batch as
    // large must grow nothing (growth reallocates, into memory the heap may have given back).
    let room = held.capacity().min(DONE_KEPT);
    if spare.capacity() < room {
        spare.reserve(room);
    }
    let mut done = std::mem::replace(held, spare);
    let ticket = multi_ticket(core, &done);
    let r = core.reporting();
    drop(st);
    let turn = multi_turn(core, ticket);
    report(core, &mut done);
    drop(turn);
    drop(r);
    if done.capacity() > DONE_KEPT {
        done.shrink_to(DONE_KEPT);
    }
    let _ = SPARE.try_with(|s| s.set(done));
}
