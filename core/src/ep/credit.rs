//! CQ credits: how an endpoint honours `FI_RM_ENABLED` (fi_domain(3): with resource management
//! a full CQ makes posting return `-FI_EAGAIN`; the CQ is never overrun).
//!
//! Every operation that will write an entry to a CQ reserves one there when it starts (an
//! immediate post, or a triggered or deferred operation when it fires), whichever endpoints
//! share the CQ; no room left makes the start fail with `Again`, having handed nothing to the
//! provider. The entry written at completion (success or error) takes the reservation's place,
//! and reading it frees the room. Credits are counted per endpoint and direction rather than
//! per operation: a completion of this endpoint uses one if any is held, so an accounting
//! mismatch can only let an entry go past the CQ's size, never lose one.
//!
//! Entries no posted operation reserved are kept too, even beyond the CQ's size: a target's
//! remote-CQ-data or `FI_RMA_EVENT` entry (shm cannot ask the peer to retry a write already
//! placed), the extra entries of a multi-receive buffer, errors of inject calls. A CQ that
//! must stay within its size should not receive those. With `FI_RM_DISABLED` nothing is
//! reserved, and a full CQ is overrun as before.

use std::sync::atomic::Ordering;

use crate::consts::*;
use crate::entry::{Context, CqErrEntry, CqTaggedEntry, FiAddr};
use crate::ep::{Dir, EpCore, INJECT_CALL};
use crate::error::{Error, Result};
use crate::trigger::Pending;

impl EpCore {
    /// Reserves the entry an operation with `op_flags` will write, if the domain manages
    /// resources and the operation writes one. `Ok(true)` when reserved (release it if the
    /// start fails), `Again` when the CQ has no room left.
    #[inline]
    pub(crate) fn reserve_entry(&self, dir: Dir, op_flags: u64) -> Result<bool> {
        if !self.rm {
            return Ok(false);
        }
        let Some(b) = self.bound() else {
            return Ok(false);
        };
        let (cq, writes) = match dir {
            Dir::Tx => (
                &b.tx_cq,
                op_flags & INJECT_CALL == 0 && (!b.tx_selective || op_flags & FI_COMPLETION != 0),
            ),
            Dir::Rx => (
                &b.rx_cq,
                !b.rx_selective || op_flags & (FI_COMPLETION | FI_MULTI_RECV) != 0,
            ),
        };
        let Some(cq) = cq.as_ref().filter(|_| writes) else {
            return Ok(false);
        };
        if !cq.reserve() {
            return Err(Error::Again(
                "post: the completion queue is full (FI_RM_ENABLED)",
            ));
        }
        self.credits[dir as usize].fetch_add(1, Ordering::AcqRel);
        Ok(true)
    }

    /// Gives back a reservation whose entry will not be written (the start failed, or
    /// deferred work completes to its counter only).
    pub(crate) fn release_entry(&self, dir: Dir) {
        if self.take_credit(dir) {
            if let Some(cq) = self.cq_of(dir) {
                cq.unreserve();
            }
        }
    }

    /// Gives back every reservation still held: the endpoint closed.
    pub(crate) fn release_all_entries(&self) {
        for dir in [Dir::Tx, Dir::Rx] {
            while self.take_credit(dir) {
                if let Some(cq) = self.cq_of(dir) {
                    cq.unreserve();
                }
            }
        }
    }

    /// Writes a success entry of one of this endpoint's operations.
    pub(crate) fn write_entry(&self, dir: Dir, entry: CqTaggedEntry, src: FiAddr) {
        let Some(cq) = self.cq_of(dir) else { return };
        if self.rm {
            cq.push_managed(entry, src, self.take_credit(dir));
        } else {
            cq.push(entry, src);
        }
    }

    /// Writes an entry no posted operation reserved (remote CQ data at the target).
    pub(crate) fn write_unsolicited(&self, dir: Dir, entry: CqTaggedEntry, src: FiAddr) {
        let Some(cq) = self.cq_of(dir) else { return };
        if self.rm {
            cq.push_managed(entry, src, false);
        } else {
            cq.push(entry, src);
        }
    }

    /// Writes an error entry of one of this endpoint's operations.
    pub(crate) fn write_err(&self, dir: Dir, e: CqErrEntry, data: Option<Box<[u8]>>) {
        self.write_err_as(dir, e, data, true);
    }

    /// `write_err` of an operation that reserved its entry if `reserved`; one that never
    /// started reserved none, and takes no other operation's reservation.
    pub(crate) fn write_err_as(
        &self,
        dir: Dir,
        e: CqErrEntry,
        data: Option<Box<[u8]>>,
        reserved: bool,
    ) {
        let Some(cq) = self.cq_of(dir) else { return };
        if reserved && self.rm && self.take_credit(dir) {
            cq.unreserve();
        }
        cq.push_err_data(e, data);
    }

    /// The deferred work `ctx` belongs to, if any; one that completes to its counter only
    /// writes no entry, so its reservation is given back here.
    pub(crate) fn claim_deferred(&self, ctx: Context, dir: Dir) -> Option<Box<Pending>> {
        self.claim_deferred_as(ctx, dir, true)
    }

    /// `claim_deferred` of work whose start reserved an entry if `reserved` (one whose start
    /// failed gave its reservation back already).
    pub(crate) fn claim_deferred_as(
        &self,
        ctx: Context,
        dir: Dir,
        reserved: bool,
    ) -> Option<Box<Pending>> {
        let w = self.deferred.claim(ctx)?;
        if reserved && !w.ep_completion {
            self.release_entry(dir);
        }
        Some(w)
    }

    fn cq_of(&self, dir: Dir) -> Option<&std::sync::Arc<crate::cq::CqInner>> {
        let b = self.bound()?;
        match dir {
            Dir::Tx => b.tx_cq.as_ref(),
            Dir::Rx => b.rx_cq.as_ref(),
        }
    }

    fn take_credit(&self, dir: Dir) -> bool {
        self.credits[dir as usize]
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }
}
