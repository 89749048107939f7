//! RMA and atomics: the initiator's posts, and a write's landing at the target (checked by
//! `target`, made durable for commit and persistent-memory endpoints, acknowledged).

use super::*;

impl Engine {
    /// Starts an RMA read or write toward `peer`.
    ///
    /// # Safety
    /// `op.iov` stays valid until the operation completes (during the call only with
    /// `FI_INJECT`).
    pub unsafe fn post_rma(&mut self, peer: PeerId, op: &RmaOp) -> Result<()> {
        self.check_room("rma")?;
        let inject = op.flags & FI_WRITE != 0 && op.flags & (FI_INJECT | INJECT_CALL) != 0;
        // SAFETY: the caller's contract keeps the iov readable during the call.
        let copy = || unsafe { inject_copy(inject, &op.iov) };
        if self.fence(peer, op.flags, || Fenced::Rma(*op, copy())) {
            return Ok(());
        }
        let c = copy();
        // SAFETY: forwarded.
        unsafe { self.rma_now(peer, op, c) }.map_err(|(_, _, e)| e)
    }

    pub(super) unsafe fn rma_now(
        &mut self,
        peer: PeerId,
        op: &RmaOp,
        copy: Option<Body>,
    ) -> std::result::Result<(), (Context, u64, Error)> {
        let len = op.iov.total();
        if copy.is_none() && self.native_rma(peer, op) {
            return Ok(());
        }
        if op.flags & FI_READ != 0 {
            let desc = self.offer(peer, &op.iov);
            let (id, _) = self.new_tx(TxReq {
                want: len,
                pull: !desc.is_empty(),
                ..TxReq::new(op.ctx, op.flags, peer, op.iov)
            });
            let f = Frame::Read {
                id: id as u32,
                segs: op.rma,
                desc,
            };
            self.frame(peer, f, Body::None, None);
            return Ok(());
        }
        let mut fl = flags::ACK;
        if op.flags & FI_REMOTE_CQ_DATA != 0 {
            fl |= flags::CQ_DATA;
        }
        if op.flags & FI_COMMIT_COMPLETE != 0 {
            fl |= flags::COMMIT;
        }
        // The target's transport may copy the data itself (no inject: its copy is ours).
        let desc = match copy {
            None => self.offer(peer, &op.iov),
            Some(_) => Desc::default(),
        };
        let pull = !desc.is_empty();
        let body = match copy {
            _ if pull => Body::None,
            Some(b) => b,
            None => Body::Iov(op.iov),
        };
        let owned = !matches!(body, Body::Iov(_));
        let (id, gen) = self.new_tx(TxReq {
            unsent: u8::from(!owned),
            // Until the target copies, or asks for the data with `Cts`.
            rts: pull,
            pull,
            ..TxReq::new(op.ctx, op.flags, peer, op.iov)
        });
        let f = Frame::Write {
            id: id as u32,
            data: op.data,
            flags: fl,
            segs: op.rma,
            desc,
        };
        self.frame(peer, f, body, (!owned).then(|| token(id, gen)));
        Ok(())
    }

    /// Starts an atomic toward `peer`.
    ///
    /// # Safety
    /// The operand and compare values stay readable, and the result buffer writable, until the
    /// operation completes (the operand only during the call with `FI_INJECT`).
    pub unsafe fn post_atomic(&mut self, peer: PeerId, req: &AtomicReq) -> Result<()> {
        self.check_room("atomic")?;
        if !self.releasing
            && (!self.peer(peer).fenced.is_empty()
                || (req.flags & FI_FENCE != 0 && self.peer(peer).outstanding > 0))
        {
            // Atomics are small: a fenced one waits as Again until its peer is drained.
            return Err(Error::Again("atomic: fenced behind outstanding operations"));
        }
        // SAFETY: forwarded.
        unsafe { self.atomic_now(peer, req) }.map_err(|(_, _, e)| e)
    }

    pub(super) unsafe fn atomic_now(
        &mut self,
        peer: PeerId,
        req: &AtomicReq,
    ) -> std::result::Result<(), (Context, u64, Error)> {
        // SAFETY: forwarded.
        if unsafe { self.native_atomic(peer, req) } {
            return Ok(());
        }
        let n = req.bytes();
        let fetch = req.result != 0;
        // SAFETY: the caller's contract keeps operand and compare readable during the call.
        let (operand, compare) = unsafe {
            let of = |p: usize| std::slice::from_raw_parts(p as *const u8, n);
            (
                if req.op != crate::AtomicOp::Read {
                    of(req.operand)
                } else {
                    &[][..]
                },
                if req.compare != 0 {
                    of(req.compare)
                } else {
                    &[][..]
                },
            )
        };
        let args = Body::concat(&[operand, compare]);
        let mut fl = flags::ACK;
        if fetch {
            fl |= flags::FETCH;
        }
        let want = if fetch { n } else { 0 };
        let (id, _) = self.new_tx(TxReq {
            want,
            ..TxReq::new(req.ctx, req.flags, peer, IovList::one(req.result, want))
        });
        let f = Frame::Atomic {
            id: id as u32,
            op: req.op as i32 as u32,
            datatype: req.dt as i32 as u32,
            count: req.count as u32,
            addr: req.addr,
            key: req.key,
            flags: fl,
        };
        self.frame(peer, f, args, None);
        Ok(())
    }

    /// A write whose data is `body` bytes after its control part (or a `Data` frame
    /// bringing it): where they go.
    pub(super) fn write_frame(
        &mut self,
        id: u32,
        data: u64,
        fl: u8,
        segs: &RmaIovList,
        body: u64,
    ) -> (Sink, Pending) {
        let len = segs.total();
        let data = (fl & flags::CQ_DATA != 0).then_some(data);
        let mut p = Pending::Write {
            id,
            fl,
            data,
            status: 0,
            len,
            dest: IovList::default(),
            staged: None,
        };
        let sink = if body != len as u64 {
            Pending::set_status(&mut p, FI_EINVAL);
            Sink::Discard
        } else {
            match target::resolve(&self.core, segs, FI_REMOTE_WRITE) {
                Err(e) => {
                    Pending::set_status(&mut p, e);
                    Sink::Discard
                }
                Ok((iov, None)) => {
                    if let Pending::Write { dest, .. } = &mut p {
                        *dest = iov;
                    }
                    Sink::Iov(iov)
                }
                Ok((iov, Some(segs))) if self.core.hmem().is_some() => {
                    let (ctx, bounce) = self.core.stage_remote(segs);
                    if let Pending::Write { dest, staged, .. } = &mut p {
                        *dest = iov;
                        *staged = Some(ctx);
                    }
                    Sink::Iov(bounce)
                }
                Ok(_) => {
                    Pending::set_status(&mut p, FI_EOPNOTSUPP);
                    Sink::Discard
                }
            }
        };
        (sink, p)
    }

    /// A peer's write landed in `dest` (status 0), or failed: made durable where asked,
    /// acknowledged, reported.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_landed(
        &mut self,
        peer: PeerId,
        id: u32,
        fl: u8,
        data: Option<u64>,
        mut status: i32,
        len: usize,
        dest: &IovList,
        staged: Option<Context>,
    ) {
        if status == 0 {
            if let Some(ctx) = staged {
                // Lands before the acknowledgement: delivery complete means the device has
                // the data.
                status = match self.core.land_remote(ctx, len) {
                    Ok(()) => 0,
                    Err(_) => FI_EIO,
                };
            }
        }
        if status == 0 && self.core.caps & FI_RMA_PMEM != 0 {
            status = self.note_written(peer, dest, fl & flags::COMMIT != 0);
        } else if status == 0 && fl & flags::COMMIT != 0 {
            status = target::commit(dest);
        }
        if fl & flags::ACK != 0 {
            self.ack(peer, id, status);
        }
        if status == 0 {
            self.done.push(Done::Remote {
                flags: FI_RMA | FI_WRITE,
                len,
                data,
            });
        }
    }

    /// Records ranges a peer wrote (persistent-memory endpoints); with `commit`, makes
    /// everything it wrote so far durable. 0 or an errno.
    pub(super) fn note_written(&mut self, peer: PeerId, iov: &IovList, commit: bool) -> i32 {
        let dirty = &mut self.peer(peer).dirty;
        dirty.extend(iov.segs().iter().map(|s| (s.addr, s.len)));
        if !commit && dirty.len() <= 4096 {
            return 0;
        }
        let mut status = 0;
        for (addr, len) in std::mem::take(dirty) {
            let s = target::commit(&IovList::one(addr, len));
            if status == 0 {
                status = s;
            }
        }
        status
    }
}
