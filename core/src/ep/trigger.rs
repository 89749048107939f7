//! The endpoint's half of triggered operations. Posting: the `*msg` calls with `FI_TRIGGER`
//! and a `TriggerContext` (or an XPU's trigger), each checked exactly as its untriggered form
//! is, then left to wait in the trigger machinery instead of starting. Starting: `EpPort`,
//! the narrow interface (`trigger::Port`) through which the machinery starts, fails and
//! reports what waited, without importing the endpoint.

use std::sync::Arc;

use super::atomic::MsgAtomic;
use super::rma::MsgRma;
use super::{CntrClass, Endpoint, EndpointOps, EpCore, Msg};
use crate::consts::errno::FI_EINVAL;
use crate::consts::*;
use crate::entry::{Context, CqErrEntry};
use crate::error::{Error, Result};
use crate::rxq::RawIov;
use crate::trigger::StartError;
use crate::trigger::{Action, Armed, DeferredRegistry, DoorbellAlloc, EpLink, Job, Port};
use crate::trigger::{TriggerContext, TriggerVar, TriggerXpu, Watch, Xpu};
use crate::trigger::{XPU_ERR_BACKWARDS, XPU_ERR_PAST_ARMED};

/// Doorbell misuse reports (`XPU_ERR_PAST_ARMED`, `XPU_ERR_BACKWARDS`) an endpoint's send CQ
/// holds unread at most.
const MISUSE_KEPT: usize = 8;
use crate::wait::ProgressSource;

/// A trigger-able endpoint as its `EpLink` holds it: the core, to start operations as an
/// immediate post does and to report them, and the provider, to drive.
struct EpPort {
    core: Arc<EpCore>,
    ops: Arc<dyn EndpointOps>,
}

impl Port for EpPort {
    unsafe fn start(&self, action: &Action) -> Result<(), StartError> {
        let (core, ops) = (&*self.core, &*self.ops);
        // SAFETY: forwarded from this function's contract.
        unsafe {
            match action {
                Action::Send(o) => core.start_send(ops, o),
                Action::Recv(r) => core.start_recv(ops, r.clone()),
                Action::Rma(o) => core.start_rma(ops, o),
                Action::Atomic(a) => core.start_atomic(ops, a),
                Action::Armed(a) => core.start_armed(ops, a),
                Action::CntrSet(..) | Action::CntrAdd(..) => Ok(()),
            }
        }
    }

    fn prearm(&self, action: &Action) -> Option<Armed> {
        // A send only, of host memory (a device buffer is staged when the send starts). Its
        // CQ entry is reserved when it fires, as any triggered operation's.
        let Action::Send(op) = action else {
            return None;
        };
        if self.core.caps & FI_HMEM != 0 || !crate::settings::XPU_PREARM.flag() {
            return None;
        }
        // SAFETY: the posting call's contract keeps the buffers valid until the send
        // completes or is canceled, which disarms it.
        let token = unsafe { self.ops.xpu_prearm(op) }?;
        Some(Armed {
            token,
            ctx: op.ctx,
            flags: op.flags,
        })
    }

    fn disarm(&self, a: &Armed) -> bool {
        self.ops.xpu_disarm(a.token)
    }

    fn reporting(&self) -> crate::ep::Reporting<'_> {
        self.core.reporting()
    }

    fn fail_tx(&self, ctx: Context, flags: u64, err: i32) {
        // A triggered job that did not start (canceled, or refused): nothing reserved.
        self.core.fail_tx_as(ctx, flags, err, false);
    }

    fn fail_rx(&self, ctx: Context, flags: u64, tag: u64, err: i32) {
        self.core.fail_rx_as(ctx, flags, tag, err, false);
    }

    fn fails_count_on(&self, rx: bool, flags: u64, c: &Arc<dyn crate::trigger::CntrPort>) -> bool {
        let class = if rx {
            CntrClass::Recv
        } else {
            super::complete::initiator_kind(flags).1
        };
        self.core
            .class_cntr(class)
            .is_some_and(|k| std::ptr::addr_eq(Arc::as_ptr(&k), Arc::as_ptr(c)))
    }

    fn staging_failed(&self, e: Error) {
        self.core.staging.record_error(e);
    }

    fn deferred(&self) -> &DeferredRegistry {
        &self.core.deferred
    }

    fn auto_progress(&self) -> bool {
        self.core.auto_progress
    }

    fn xpu_action(
        &self,
        d: &crate::xpu::XpuDesc,
        seen: &mut crate::xpu::Checked,
    ) -> Result<Action, crate::xpu::Fault> {
        let action = crate::xpu::action(&self.core, seen, d)?;
        if let Action::Recv(r) = &action {
            // A device posting receives in a loop must not grow the host's queue without
            // end. Past the bound the descriptor is answered with an error entry, not held:
            // a held one would hold back every later descriptor of the endpoint (its order
            // is kept), the device's "ready" to a peer among them. Only descriptors' receives
            // count: the application's own it bounds itself.
            if let Some((n, bound)) = self.ops.xpu_recv_refused(r) {
                return Err(crate::xpu::room_fault(d.opcode, n, bound));
            }
        }
        Ok(action)
    }

    fn xpu_fault(&self, ctx: Context, opcode: u32, f: &crate::xpu::Fault) {
        self.core.fail_xpu(ctx, opcode, f);
    }

    fn retire(&self, block: Arc<dyn std::any::Any + Send + Sync>) {
        self.core.retired.keep(block);
    }

    fn xpu_faults_full(&self) -> bool {
        let Some(b) = self.core.bound() else {
            return false;
        };
        [&b.tx_cq, &b.rx_cq]
            .into_iter()
            .flatten()
            .any(|cq| cq.errors_full())
    }

    fn xpu_faults_full_for(&self, opcode: u32) -> bool {
        let Some(b) = self.core.bound() else {
            return false;
        };
        let cq = if crate::xpu::is_recv(opcode) {
            &b.rx_cq
        } else {
            &b.tx_cq
        };
        cq.as_ref().is_some_and(|cq| cq.errors_full())
    }

    fn xpu_misuse(&self, prov_errno: i32, value: u64) {
        let Some(b) = self.core.bound() else { return };
        if let Some(cq) = &b.tx_cq {
            // An XPU that stores stray values without end fills at most `MISUSE_KEPT` of the
            // queue's entries: later reports, while those are unread, are logged, not queued
            // (queued, they would take the room real completions need).
            let kept = cq.errors_waiting_of(|e| {
                e.flags == FI_TRIGGER
                    && e.op_context == 0
                    && matches!(e.prov_errno, XPU_ERR_PAST_ARMED | XPU_ERR_BACKWARDS)
            });
            if kept >= MISUSE_KEPT.min(cq.cap()) {
                tracing::warn!(
                    "an XPU stored {value} to a doorbell (misuse {prov_errno}); not queued: \
                     {kept} such reports wait unread"
                );
                return;
            }
            cq.push_err(CqErrEntry {
                op_context: 0,
                flags: FI_TRIGGER,
                err: FI_EINVAL,
                prov_errno,
                data: value,
                ..Default::default()
            });
        } else if let Some(c) = &b.cntr[CntrClass::Send as usize] {
            c.inc_err();
            c.notify_observers();
        }
    }
}

impl ProgressSource for EpPort {
    fn progress(&self) -> usize {
        self.ops.progress()
    }

    fn idle_wait(&self, timeout: std::time::Duration) {
        self.ops.idle_wait(timeout);
    }

    fn wake(&self) {
        self.ops.wake();
    }

    fn next_look(&self) -> Option<std::time::Duration> {
        self.ops.next_look()
    }

    fn wait_fds(&self, out: &mut Vec<(std::os::fd::RawFd, i16)>) {
        self.ops.wait_fds(out);
    }

    fn prepare_fd_sleep(&self) -> bool {
        self.ops.prepare_fd_sleep()
    }

    fn join_sleep(
        &self,
        timeout: std::time::Duration,
        out: &mut Vec<(std::os::fd::RawFd, i16)>,
    ) -> crate::wait::Join {
        self.ops.join_sleep(timeout, out)
    }

    fn leave_sleep(&self) {
        self.ops.leave_sleep();
    }
}

impl Endpoint {
    /// The link through which triggered operations wait for and start on a new endpoint
    /// (`Endpoint::new`), for one opened with `FI_TRIGGER`; it watches `doorbells` for
    /// XPU-triggered ones where the endpoint has `FI_XPU_TRIGGER` too.
    pub(super) fn new_link(
        core: &Arc<EpCore>,
        ops: &Arc<dyn EndpointOps>,
        doorbells: Option<Arc<dyn DoorbellAlloc>>,
    ) -> Option<Arc<EpLink>> {
        let doorbells = doorbells.filter(|_| core.caps & FI_XPU_TRIGGER != 0);
        (core.caps & FI_TRIGGER != 0).then(|| {
            let port = EpPort {
                core: core.clone(),
                ops: ops.clone(),
            };
            EpLink::new(Arc::new(port), doorbells)
        })
    }

    /// The endpoint's link, if it may take triggered operations with these flags.
    fn trigger_link(&self, what: &'static str, flags: u64) -> Result<Arc<EpLink>> {
        let link = self.link().ok_or_else(|| {
            Error::OpNotSupp(format!("{what}: endpoint was opened without FI_TRIGGER"))
        })?;
        if flags & FI_INJECT != 0 {
            return Err(Error::BadFlags(format!(
                "{what}: FI_INJECT reads the data during the call, a triggered operation only when it starts"
            )));
        }
        Ok(link.clone())
    }

    fn arm(&self, link: Arc<EpLink>, trig: &TriggerContext, action: Action) -> Result<()> {
        match trig {
            TriggerContext::Threshold { cntr, threshold } => {
                cntr.inner().domain.check(
                    "triggered operation",
                    "threshold counter",
                    self.core().domain,
                )?;
                let job = Job {
                    action,
                    ep: Some(link.clone()),
                    work: None,
                };
                let c = cntr.inner();
                link.arm(c.trigger_queue(), c, Watch::Success, *threshold, job);
                Ok(())
            }
        }
    }

    /// A send posted for later: checked as its untriggered form is.
    fn later_send(
        &self,
        what: &'static str,
        msg: &Msg<'_>,
        flags: u64,
        kind: u64,
    ) -> Result<Action> {
        let op = self.msg_tx(what, msg, flags & !FI_TRIGGER, kind)?;
        self.check_tx(what, &op)?;
        Ok(Action::Send(op))
    }

    /// A write or read posted for later.
    fn later_rma(
        &self,
        what: &'static str,
        msg: &MsgRma<'_>,
        flags: u64,
        dir: u64,
    ) -> Result<Action> {
        let op = self.msg_rma(what, msg, flags & !FI_TRIGGER, dir)?;
        self.check_rma(what, &op)?;
        Ok(Action::Rma(Box::new(op)))
    }

    /// An atomic posted for later.
    fn later_atomic(
        &self,
        m: &MsgAtomic,
        operand: &[u8],
        count: usize,
        flags: u64,
    ) -> Result<Action> {
        let what = "atomicmsg";
        let r = self.atomic_req(what, m, RawIov::of(operand), count, flags & !FI_TRIGGER)?;
        self.check_atomic(what, &r)?;
        Ok(Action::Atomic(Box::new(r)))
    }

    /// `fi_sendmsg` with `FI_TRIGGER` (implied): the send starts when `trig` is met.
    ///
    /// # Safety
    /// Every segment must stay valid and unmodified until the send completes or is canceled;
    /// it is not read before the trigger.
    pub unsafe fn sendmsg_triggered(
        &self,
        msg: &Msg<'_>,
        flags: u64,
        trig: &TriggerContext,
    ) -> Result<()> {
        let link = self.trigger_link("sendmsg", flags)?;
        let action = self.later_send("sendmsg", msg, flags, FI_MSG)?;
        self.arm(link, trig, action)
    }

    /// `fi_tsendmsg` with `FI_TRIGGER`.
    ///
    /// # Safety
    /// As `sendmsg_triggered`.
    pub unsafe fn tsendmsg_triggered(
        &self,
        msg: &Msg<'_>,
        flags: u64,
        trig: &TriggerContext,
    ) -> Result<()> {
        let link = self.trigger_link("tsendmsg", flags)?;
        let action = self.later_send("tsendmsg", msg, flags, FI_TAGGED)?;
        self.arm(link, trig, action)
    }

    /// `fi_recvmsg` with `FI_TRIGGER`: the receive is posted when `trig` is met (messages
    /// arriving before then wait as unexpected ones).
    ///
    /// # Safety
    /// Every segment must stay valid, and untouched by anything else, until the receive
    /// completes or is canceled.
    pub unsafe fn recvmsg_triggered(
        &self,
        msg: &Msg<'_>,
        flags: u64,
        trig: &TriggerContext,
    ) -> Result<()> {
        let link = self.trigger_link("recvmsg", flags)?;
        let r = self.msg_rx(msg, flags & !FI_TRIGGER)?;
        self.check_rx("recvmsg", &r)?;
        self.arm(link, trig, Action::Recv(r))
    }

    /// `fi_trecvmsg` with `FI_TRIGGER` (not with `FI_PEEK`, `FI_CLAIM` or `FI_DISCARD`).
    ///
    /// # Safety
    /// As `recvmsg_triggered`.
    pub unsafe fn trecvmsg_triggered(
        &self,
        msg: &Msg<'_>,
        flags: u64,
        trig: &TriggerContext,
    ) -> Result<()> {
        let link = self.trigger_link("trecvmsg", flags)?;
        if flags & (FI_PEEK | FI_CLAIM | FI_DISCARD) != 0 {
            return Err(Error::BadFlags(
                "trecvmsg: FI_PEEK, FI_CLAIM and FI_DISCARD cannot be triggered".into(),
            ));
        }
        let r = self.msg_trx(msg, flags & !FI_TRIGGER)?;
        self.check_rx("trecvmsg", &r)?;
        self.arm(link, trig, Action::Recv(r))
    }

    /// `fi_readmsg` with `FI_TRIGGER`.
    ///
    /// # Safety
    /// Every local segment must stay valid and untouched until the read completes or is
    /// canceled.
    pub unsafe fn readmsg_triggered(
        &self,
        msg: &MsgRma<'_>,
        flags: u64,
        trig: &TriggerContext,
    ) -> Result<()> {
        let link = self.trigger_link("readmsg", flags)?;
        let action = self.later_rma("readmsg", msg, flags, FI_READ)?;
        self.arm(link, trig, action)
    }

    /// `fi_writemsg` with `FI_TRIGGER`.
    ///
    /// # Safety
    /// Every local segment must stay valid and unmodified until the write completes or is
    /// canceled.
    pub unsafe fn writemsg_triggered(
        &self,
        msg: &MsgRma<'_>,
        flags: u64,
        trig: &TriggerContext,
    ) -> Result<()> {
        let link = self.trigger_link("writemsg", flags)?;
        let action = self.later_rma("writemsg", msg, flags, FI_WRITE)?;
        self.arm(link, trig, action)
    }

    /// `fi_atomicmsg` with `FI_TRIGGER`.
    ///
    /// # Safety
    /// `operand` must stay valid until the operation completes or is canceled.
    pub unsafe fn atomicmsg_triggered(
        &self,
        m: &MsgAtomic,
        operand: &[u8],
        count: usize,
        flags: u64,
        trig: &TriggerContext,
    ) -> Result<()> {
        let link = self.trigger_link("atomicmsg", flags)?;
        let action = self.later_atomic(m, operand, count, flags)?;
        self.arm(link, trig, action)
    }

    /// `fi_fetch_atomicmsg` with `FI_TRIGGER`.
    ///
    /// # Safety
    /// `operand` and `result` must stay valid until the operation completes or is canceled;
    /// `result` is written.
    pub unsafe fn fetch_atomicmsg_triggered(
        &self,
        m: &MsgAtomic,
        operand: &[u8],
        result: &mut [u8],
        count: usize,
        flags: u64,
        trig: &TriggerContext,
    ) -> Result<()> {
        let what = "fetch_atomicmsg";
        let link = self.trigger_link(what, flags)?;
        let (operand, result) = (RawIov::of(operand), RawIov::of_mut(result));
        let r = self.fetch_req(what, m, operand, result, count, flags & !FI_TRIGGER)?;
        self.check_atomic(what, &r)?;
        self.arm(link, trig, Action::Atomic(Box::new(r)))
    }

    /// `fi_compare_atomicmsg` with `FI_TRIGGER`.
    ///
    /// # Safety
    /// `operand`, `compare` and `result` must stay valid until the operation completes or is
    /// canceled; `result` is written.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn compare_atomicmsg_triggered(
        &self,
        m: &MsgAtomic,
        operand: &[u8],
        compare: &[u8],
        result: &mut [u8],
        count: usize,
        flags: u64,
        trig: &TriggerContext,
    ) -> Result<()> {
        let what = "compare_atomicmsg";
        let link = self.trigger_link(what, flags)?;
        let (operand, compare) = (RawIov::of(operand), RawIov::of(compare));
        let result = RawIov::of_mut(result);
        let flags = flags & !FI_TRIGGER;
        let r = self.compare_req(what, m, operand, compare, result, count, flags)?;
        self.check_atomic(what, &r)?;
        self.arm(link, trig, Action::Atomic(Box::new(r)))
    }
}

/// XPU-triggered operations (`FI_TRIGGER_XPU`): posted like their `*msg` forms, armed instead
/// of started, and started when the XPU stores the filled variables' values.
impl Endpoint {
    fn xpu_link(&self, what: &'static str, flags: u64) -> Result<Arc<EpLink>> {
        let link = self.trigger_link(what, flags)?;
        if link.xpu.is_none() {
            return Err(Error::OpNotSupp(format!(
                "{what}: endpoint was opened without FI_XPU_TRIGGER"
            )));
        }
        Ok(link)
    }

    fn arm_xpu(
        &self,
        what: &'static str,
        link: Arc<EpLink>,
        xpu: Xpu,
        vars: &mut [TriggerVar],
        action: Action,
    ) -> Result<usize> {
        let job = Job {
            action,
            ep: Some(link.clone()),
            work: None,
        };
        link.arm_xpu(what, xpu, vars, job)
    }

    /// `fi_getopt(FI_OPT_XPU_TRIGGER)`: how many variables a trigger rung by `xpu` needs.
    /// With `vars` empty, only the count; otherwise the datatype and count of each variable
    /// are filled in as far as `vars` reaches. `OpNotSupp` (with the reason) for an XPU this
    /// endpoint cannot serve.
    pub fn xpu_trigger_vars(&self, xpu: Xpu, vars: &mut [TriggerVar]) -> Result<usize> {
        let what = "getopt(FI_OPT_XPU_TRIGGER)";
        let link = self.link().ok_or_else(|| {
            Error::OpNotSupp(format!("{what}: endpoint was opened without FI_TRIGGER"))
        })?;
        let x = link.xpu.as_ref().ok_or_else(|| {
            Error::OpNotSupp(format!(
                "{what}: endpoint was opened without FI_XPU_TRIGGER"
            ))
        })?;
        x.layout(xpu, vars)
    }

    /// `fi_getopt(FI_OPT_ENDPOINT, FI_OPT_XPU_TRIGGER, struct fi_trigger_xpu *)` as C calls
    /// it: `t.count` on output is the number of variables needed.
    ///
    /// # Safety
    /// `t.var` must point to `t.count` writable variables (or `t.count` be 0).
    pub unsafe fn getopt_xpu_trigger(&self, t: &mut TriggerXpu) -> Result<()> {
        let xpu = t.xpu().ok_or_else(|| {
            Error::Inval(format!(
                "getopt(FI_OPT_XPU_TRIGGER): iface {} is not an enum fi_hmem_iface value",
                t.iface
            ))
        })?;
        if t.count < 0 {
            return Err(Error::Inval(format!(
                "getopt(FI_OPT_XPU_TRIGGER): count {} is negative",
                t.count
            )));
        }
        // SAFETY: the caller's contract.
        let n = self.xpu_trigger_vars(xpu, unsafe { t.vars_mut() })?;
        t.count = n as i32;
        Ok(())
    }

    /// `fi_sendmsg` with `FI_TRIGGER` and an `FI_TRIGGER_XPU` context: arms the send and
    /// fills `vars` (as `xpu_trigger_vars` described them) with what `xpu` must store to
    /// start it. Returns how many variables were filled. `Again` when the endpoint already
    /// has `XPU_ARMED_MAX` operations armed.
    ///
    /// # Safety
    /// Every segment must stay valid and unmodified until the send completes or is canceled;
    /// it is not read before the XPU rings.
    pub unsafe fn sendmsg_xpu(
        &self,
        msg: &Msg<'_>,
        flags: u64,
        xpu: Xpu,
        vars: &mut [TriggerVar],
    ) -> Result<usize> {
        let link = self.xpu_link("sendmsg", flags)?;
        let action = self.later_send("sendmsg", msg, flags, FI_MSG)?;
        self.arm_xpu("sendmsg", link, xpu, vars, action)
    }

    /// `fi_tsendmsg` with an XPU trigger.
    ///
    /// # Safety
    /// As `sendmsg_xpu`.
    pub unsafe fn tsendmsg_xpu(
        &self,
        msg: &Msg<'_>,
        flags: u64,
        xpu: Xpu,
        vars: &mut [TriggerVar],
    ) -> Result<usize> {
        let link = self.xpu_link("tsendmsg", flags)?;
        let action = self.later_send("tsendmsg", msg, flags, FI_TAGGED)?;
        self.arm_xpu("tsendmsg", link, xpu, vars, action)
    }

    /// `fi_writemsg` with an XPU trigger (with `FI_REMOTE_CQ_DATA`: a triggered writedata).
    ///
    /// # Safety
    /// Every local segment must stay valid and unmodified until the write completes or is
    /// canceled.
    pub unsafe fn writemsg_xpu(
        &self,
        msg: &MsgRma<'_>,
        flags: u64,
        xpu: Xpu,
        vars: &mut [TriggerVar],
    ) -> Result<usize> {
        let link = self.xpu_link("writemsg", flags)?;
        let action = self.later_rma("writemsg", msg, flags, FI_WRITE)?;
        self.arm_xpu("writemsg", link, xpu, vars, action)
    }

    /// `fi_atomicmsg` with an XPU trigger.
    ///
    /// # Safety
    /// `operand` must stay valid until the operation completes or is canceled.
    pub unsafe fn atomicmsg_xpu(
        &self,
        m: &MsgAtomic,
        operand: &[u8],
        count: usize,
        flags: u64,
        xpu: Xpu,
        vars: &mut [TriggerVar],
    ) -> Result<usize> {
        let link = self.xpu_link("atomicmsg", flags)?;
        let action = self.later_atomic(m, operand, count, flags)?;
        self.arm_xpu("atomicmsg", link, xpu, vars, action)
    }
}
