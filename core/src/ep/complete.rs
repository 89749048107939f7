//! How an endpoint reports finished operations: CQ entries and counters, written the same way
//! for every provider.

use super::*;

/// A report under way (`EpCore::reporting`); ends when dropped, a panic's unwinding included.
#[must_use = "the report is under way only while this is held"]
pub struct Reporting<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Reporting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

impl EpCore {
    /// Marks completions being reported once the provider's lock is released: take it
    /// before releasing the lock under which they were taken, hold it until they are
    /// reported. The endpoint's close (`wait_reports`) returns only after every such report:
    /// otherwise a progress call on another thread that took a completion just before the
    /// close reports it after `fi_close` returned, writing the CQ, a counter, or a staged
    /// receive's bytes into the application's buffer, which the application may have freed.
    pub fn reporting(&self) -> Reporting<'_> {
        // Ordered before the close's look by the provider's lock, released after this; SeqCst
        // for the callers that take it before reading an endpoint's `closed` flag, which the
        // close sets before it looks (`Job::fire`, `EpLink::retry`): one of the two sees the
        // other.
        self.reports.fetch_add(1, Ordering::SeqCst);
        Reporting(&self.reports)
    }

    /// Waits until no report taken before this call is under way (`reporting`). A report
    /// writes to memory and never waits on anything, so this ends; the core goes to the
    /// reporting thread meanwhile.
    pub(crate) fn wait_reports(&self) {
        while self.reports.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
    }

    /// The counter bound for a class of operations, if any.
    pub(crate) fn class_cntr(&self, class: CntrClass) -> Option<Arc<CntrInner>> {
        self.bound().and_then(|b| b.cntr[class as usize].clone())
    }

    /// The frozen bindings; `None` before `enable`.
    #[inline]
    pub fn bound(&self) -> Option<&Bindings> {
        self.bound.get()
    }

    /// Reports a finished operation this endpoint initiated (send, RMA, atomic): a CQ entry
    /// unless suppressed (inject, selective completion), and the counter of its class.
    pub fn complete_tx(&self, ctx: Context, op_flags: u64) {
        let ctx = match self.unstage(ctx, Some(usize::MAX)) {
            None => ctx,
            Some((user, _, true)) => user,
            Some((user, _, false)) => return self.fail_tx(user, op_flags, FI_EIO),
        };
        match self.claim_deferred(ctx, Dir::Tx) {
            None => self.complete_tx_ep(ctx, op_flags),
            Some(w) => {
                let counted = w.ep_completion.then(|| {
                    self.complete_tx_ep(w.user_ctx, op_flags | FI_COMPLETION);
                    self.class_cntr(initiator_kind(op_flags).1)
                });
                w.finish(true, counted.flatten().as_ref());
            }
        }
    }

    #[inline]
    fn complete_tx_ep(&self, ctx: Context, op_flags: u64) {
        let Some(b) = self.bound() else { return };
        let (flags, class) = initiator_kind(op_flags);
        let wants =
            op_flags & INJECT_CALL == 0 && (!b.tx_selective || op_flags & FI_COMPLETION != 0);
        if wants {
            self.write_entry(
                Dir::Tx,
                CqTaggedEntry {
                    op_context: ctx,
                    flags,
                    ..Default::default()
                },
                FI_ADDR_NOTAVAIL,
            );
        }
        if let Some(c) = &b.cntr[class as usize] {
            c.inc();
            c.notify_observers();
        }
    }

    /// Reports a failed initiated operation (errors are always reported, except for deferred
    /// work that did not ask for endpoint completions: its completion counter's error value
    /// says it).
    pub fn fail_tx(&self, ctx: Context, op_flags: u64, err: i32) {
        self.fail_tx_as(ctx, op_flags, err, true);
    }

    /// `fail_tx` of an operation that reserved a CQ entry if `reserved` (it started), or of
    /// one that never did (a triggered operation canceled or refused before it started): its
    /// entry then takes no other operation's reservation.
    pub(crate) fn fail_tx_as(&self, ctx: Context, op_flags: u64, err: i32, reserved: bool) {
        let ctx = self.unstage(ctx, None).map_or(ctx, |(user, _, _)| user);
        match self.claim_deferred_as(ctx, Dir::Tx, reserved) {
            None => self.fail_tx_ep(ctx, op_flags, err, reserved),
            Some(w) => {
                let counted = w.ep_completion.then(|| {
                    self.fail_tx_ep(w.user_ctx, op_flags, err, reserved);
                    self.class_cntr(initiator_kind(op_flags).1)
                });
                w.finish(false, counted.flatten().as_ref());
            }
        }
    }

    fn fail_tx_ep(&self, ctx: Context, op_flags: u64, err: i32, reserved: bool) {
        let Some(b) = self.bound() else { return };
        let (flags, class) = initiator_kind(op_flags);
        // An inject, or a send without FI_COMPLETION on a selective binding, reserved nothing
        // when it started (`reserve_entry`): its error takes no other operation's room.
        let reserved = reserved
            && op_flags & INJECT_CALL == 0
            && (!b.tx_selective || op_flags & FI_COMPLETION != 0);
        self.write_err_as(
            Dir::Tx,
            CqErrEntry {
                op_context: ctx,
                flags,
                err,
                prov_errno: err,
                ..Default::default()
            },
            None,
            reserved,
        );
        if let Some(c) = &b.cntr[class as usize] {
            c.inc_err();
            c.notify_observers();
        }
    }

    /// Reports, at the target, an RMA or atomic access a peer made to this endpoint's memory:
    /// a receive-CQ entry when it carried remote CQ data or the endpoint asked for
    /// `FI_RMA_EVENT`, and the remote-read or remote-write counter.
    pub fn complete_remote(&self, op_flags: u64, len: usize, data: Option<u64>) {
        let Some(b) = self.bound() else { return };
        let write = op_flags & FI_WRITE != 0;
        let (dir, class) = if write {
            (FI_REMOTE_WRITE, CntrClass::RemoteWrite)
        } else {
            (FI_REMOTE_READ, CntrClass::RemoteRead)
        };
        let kind = op_flags & (FI_RMA | FI_ATOMIC);
        if data.is_some() || self.caps & FI_RMA_EVENT != 0 {
            let cq_data = if data.is_some() { FI_REMOTE_CQ_DATA } else { 0 };
            self.write_unsolicited(
                Dir::Rx,
                CqTaggedEntry {
                    op_context: 0,
                    flags: dir | kind | cq_data,
                    len,
                    data: data.unwrap_or(0),
                    ..Default::default()
                },
                FI_ADDR_NOTAVAIL,
            );
        }
        if let Some(c) = &b.cntr[class as usize] {
            c.inc();
            c.notify_observers();
        }
    }

    /// Reports a message placed in `slot`: `len` bytes arrived (`olen` more did not fit).
    /// `raw_src` is the sender's raw address, used when `src` is unknown and the endpoint
    /// asked for `FI_SOURCE_ERR`.
    #[allow(clippy::too_many_arguments)]
    pub fn complete_rx(
        &self,
        slot: &RecvSlot,
        len: usize,
        olen: usize,
        tag: u64,
        data: Option<u64>,
        src: FiAddr,
        raw_src: impl FnOnce() -> Vec<u8>,
    ) {
        // Data staged for device memory lands before anything reports it (fi_cq(3)).
        let staged;
        let slot = match self.unstage_rx(slot, Some(len)) {
            None => slot,
            Some((user, _, false)) => return self.fail_rx(user, slot.flags, tag, FI_EIO),
            Some((ctx, iov, true)) => {
                staged = RecvSlot { ctx, iov, ..*slot };
                &staged
            }
        };
        match self.claim_deferred(slot.ctx, Dir::Rx) {
            None => self.complete_rx_ep(slot, len, olen, tag, data, src, raw_src),
            Some(w) => {
                if w.ep_completion {
                    let slot = RecvSlot {
                        ctx: w.user_ctx,
                        op_flags: slot.op_flags | FI_COMPLETION,
                        ..*slot
                    };
                    self.complete_rx_ep(&slot, len, olen, tag, data, src, raw_src);
                }
                let counted = w.ep_completion.then(|| self.class_cntr(CntrClass::Recv));
                w.finish(olen == 0, counted.flatten().as_ref());
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn complete_rx_ep(
        &self,
        slot: &RecvSlot,
        len: usize,
        olen: usize,
        tag: u64,
        data: Option<u64>,
        src: FiAddr,
        raw_src: impl FnOnce() -> Vec<u8>,
    ) {
        let Some(b) = self.bound() else { return };
        let flags = slot.flags | if data.is_some() { FI_REMOTE_CQ_DATA } else { 0 };
        let buf = slot.iov.first_addr();
        let cntr = &b.cntr[CntrClass::Recv as usize];
        if olen > 0 {
            self.write_err(
                Dir::Rx,
                CqErrEntry {
                    op_context: slot.ctx,
                    flags,
                    len,
                    buf,
                    data: data.unwrap_or(0),
                    tag,
                    olen,
                    err: FI_ETRUNC,
                    prov_errno: FI_ETRUNC,
                    ..Default::default()
                },
                None,
            );
            if let Some(c) = cntr {
                c.inc_err();
                c.notify_observers();
            }
            return;
        }
        if src == FI_ADDR_NOTAVAIL && self.caps & FI_SOURCE_ERR != 0 {
            self.write_err(
                Dir::Rx,
                CqErrEntry {
                    op_context: slot.ctx,
                    flags,
                    len,
                    buf,
                    data: data.unwrap_or(0),
                    tag,
                    err: FI_EADDRNOTAVAIL,
                    prov_errno: FI_EADDRNOTAVAIL,
                    ..Default::default()
                },
                // The sender's address as the application's AV takes it back.
                Some({
                    let raw = raw_src();
                    match b.av.as_ref() {
                        Some(av) => av.insertable(&raw),
                        None => raw,
                    }
                    .into_boxed_slice()
                }),
            );
            if let Some(c) = cntr {
                c.inc();
                c.notify_observers();
            }
            return;
        }
        let wants =
            !b.rx_selective || slot.op_flags & FI_COMPLETION != 0 || flags & FI_MULTI_RECV != 0;
        if wants {
            let src = if self.caps & FI_SOURCE != 0 {
                src
            } else {
                FI_ADDR_NOTAVAIL
            };
            self.write_entry(
                Dir::Rx,
                CqTaggedEntry {
                    op_context: slot.ctx,
                    flags,
                    len,
                    buf,
                    data: data.unwrap_or(0),
                    tag,
                },
                src,
            );
        }
        if let Some(c) = cntr {
            c.inc();
            c.notify_observers();
        }
    }

    /// Reports a descriptor an XPU posted that never started (refused by validation, or
    /// canceled when the endpoint closed): an error entry under `ctx` on the CQ of its
    /// direction, `prov_errno` the fault's code and, as error data, the reason in words; the
    /// error value of its class's counter.
    pub(crate) fn fail_xpu(&self, ctx: Context, opcode: u32, f: &crate::xpu::Fault) {
        let Some(b) = self.bound() else { return };
        let rx = crate::xpu::is_recv(opcode);
        let flags = crate::xpu::entry_flags(opcode);
        let (dir, class) = if rx {
            (Dir::Rx, CntrClass::Recv)
        } else {
            (Dir::Tx, initiator_kind(flags).1)
        };
        // A descriptor that never started reserved nothing.
        self.write_err_as(
            dir,
            CqErrEntry {
                op_context: ctx,
                flags,
                err: f.err,
                prov_errno: f.code,
                ..Default::default()
            },
            Some(f.why.as_bytes().into()),
            false,
        );
        if let Some(c) = &b.cntr[class as usize] {
            c.inc_err();
            c.notify_observers();
        }
    }

    /// Reports a receive-side error (`FI_ECANCELED`, `FI_ENOMSG`, a lost peer...).
    pub fn fail_rx(&self, ctx: Context, flags: u64, tag: u64, err: i32) {
        self.fail_rx_as(ctx, flags, tag, err, true);
    }

    /// `fail_rx` of a receive that reserved a CQ entry if `reserved` (`fail_tx_as`).
    pub(crate) fn fail_rx_as(&self, ctx: Context, flags: u64, tag: u64, err: i32, reserved: bool) {
        let slot = RecvSlot {
            ctx,
            iov: IovList::default(),
            flags,
            op_flags: 0,
        };
        let ctx = self
            .unstage_rx(&slot, None)
            .map_or(ctx, |(user, _, _)| user);
        match self.claim_deferred_as(ctx, Dir::Rx, reserved) {
            None => self.fail_rx_ep(ctx, flags, tag, err, reserved),
            Some(w) => {
                let counted = w.ep_completion.then(|| {
                    self.fail_rx_ep(w.user_ctx, flags, tag, err, reserved);
                    self.class_cntr(CntrClass::Recv)
                });
                w.finish(false, counted.flatten().as_ref());
            }
        }
    }

    fn fail_rx_ep(&self, ctx: Context, flags: u64, tag: u64, err: i32, reserved: bool) {
        let Some(b) = self.bound() else { return };
        self.write_err_as(
            Dir::Rx,
            CqErrEntry {
                op_context: ctx,
                flags,
                tag,
                err,
                prov_errno: err,
                ..Default::default()
            },
            None,
            reserved,
        );
        if let Some(c) = &b.cntr[CntrClass::Recv as usize] {
            c.inc_err();
            c.notify_observers();
        }
    }

    /// Reports a peek that found a message (no data moves).
    pub fn complete_peek(
        &self,
        ctx: Context,
        len: usize,
        tag: u64,
        data: Option<u64>,
        src: FiAddr,
    ) {
        let flags = FI_RECV | FI_TAGGED | if data.is_some() { FI_REMOTE_CQ_DATA } else { 0 };
        // A source only where the endpoint reports sources, as a receive's entry.
        let src = if self.caps & FI_SOURCE != 0 {
            src
        } else {
            FI_ADDR_NOTAVAIL
        };
        self.write_entry(
            Dir::Rx,
            CqTaggedEntry {
                op_context: ctx,
                flags,
                len,
                buf: 0,
                data: data.unwrap_or(0),
                tag,
            },
            src,
        );
    }
}

/// Completion flags and counter class of an initiated operation, from its operation flags:
/// `FI_RMA` or `FI_ATOMIC` with `FI_READ` or `FI_WRITE`, else a send (`FI_MSG`/`FI_TAGGED`).
pub(crate) fn initiator_kind(op_flags: u64) -> (u64, CntrClass) {
    let kind = op_flags & (FI_RMA | FI_ATOMIC);
    if kind != 0 {
        let rw = op_flags & (FI_READ | FI_WRITE);
        let class = if rw & FI_READ != 0 {
            CntrClass::Read
        } else {
            CntrClass::Write
        };
        (kind | rw, class)
    } else {
        (FI_SEND | (op_flags & (FI_MSG | FI_TAGGED)), CntrClass::Send)
    }
}
