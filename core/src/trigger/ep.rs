//! Posting triggered operations on an endpoint: the `*msg` calls with `FI_TRIGGER` and a
//! `TriggerContext`. Each is checked exactly as its untriggered form is, then waits on the
//! trigger's counter instead of starting.

use std::sync::Arc;

use super::link::EpLink;
use super::queue::Watch;
use super::{Action, Job, TriggerContext};
use crate::consts::*;
use crate::ep::{Endpoint, Msg};
use crate::ep_atomic::MsgAtomic;
use crate::ep_rma::MsgRma;
use crate::error::{Error, Result};
use crate::rxq::RawIov;

impl Endpoint {
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
                let job = Job {
                    action,
                    ep: Some(link.clone()),
                    work: None,
                };
                link.arm(cntr.inner(), Watch::Success, *threshold, job);
                Ok(())
            }
        }
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
        let op = self.msg_tx("sendmsg", msg, flags & !FI_TRIGGER, FI_MSG)?;
        self.check_tx("sendmsg", &op)?;
        self.arm(link, trig, Action::Send(op))
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
        let op = self.msg_tx("tsendmsg", msg, flags & !FI_TRIGGER, FI_TAGGED)?;
        self.check_tx("tsendmsg", &op)?;
        self.arm(link, trig, Action::Send(op))
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
        let op = self.msg_rma("readmsg", msg, flags & !FI_TRIGGER, FI_READ)?;
        self.check_rma("readmsg", &op)?;
        self.arm(link, trig, Action::Rma(Box::new(op)))
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
        let op = self.msg_rma("writemsg", msg, flags & !FI_TRIGGER, FI_WRITE)?;
        self.check_rma("writemsg", &op)?;
        self.arm(link, trig, Action::Rma(Box::new(op)))
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
        let operand = RawIov::of(operand);
        let r = self.atomic_req("atomicmsg", m, operand, count, flags & !FI_TRIGGER)?;
        self.check_atomic("atomicmsg", &r)?;
        self.arm(link, trig, Action::Atomic(Box::new(r)))
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
