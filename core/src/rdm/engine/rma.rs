//! RMA at both ends. The initiator posts a `Write` with its data (or, where the target's
//! transport can copy it, with a descriptor of it: `rma_copy`) or a `Read`. The target checks
//! keys and ranges (`target::resolve`), takes a write's body straight into its memory, made
//! durable for commit and persistent-memory endpoints, and `Ack`s; it answers a read with
//! `ReadResp`, its memory as the body.

use super::*;

/// The token of a read's answer whose body is the memory read (`Engine::read_resp`).
pub(crate) const READ_SENT: u64 = u64::MAX;

/// A peer's write whose data is arriving (or was refused: `status`), and where it lands.
pub(super) struct WriteBody {
    pub id: u32,
    pub fl: u8,
    /// Remote CQ data for the target's completion.
    pub data: Option<u64>,
    /// 0, or the errno the write failed its checks with (its body is discarded).
    pub status: i32,
    pub len: usize,
    /// The checked ranges.
    pub dest: IovList,
    /// The peer's ranges, their keys: a region closing fails the write if it named it.
    pub segs: RmaIovList,
    /// Device memory: the bounce buffer the body goes into first, landed from there.
    pub staged: Option<Context>,
}

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

    /// Starts an RMA operation that nothing holds back: through the NIC where it can go
    /// there, else through frames.
    ///
    /// # Safety
    /// As `post_rma`; `copy` is the inject data, copied already.
    pub(super) unsafe fn rma_now(
        &mut self,
        peer: PeerId,
        op: &RmaOp,
        copy: Option<Body>,
    ) -> std::result::Result<(), (Context, u64, Error)> {
        if copy.is_none() && self.native_rma(peer, op) {
            return Ok(());
        }
        if op.flags & FI_READ != 0 {
            self.send_read(peer, op);
        } else {
            self.send_write(peer, op, copy);
        }
        Ok(())
    }

    /// A `Read`, offering the destination for the target's transport to copy into.
    fn send_read(&mut self, peer: PeerId, op: &RmaOp) {
        let desc = self.offer(peer, &op.iov, false);
        let (id, _) = self.new_tx(TxReq {
            want: op.iov.total(),
            pull: !desc.is_empty(),
            ..TxReq::new(op.ctx, op.flags, peer, op.iov)
        });
        let f = Frame::Read {
            id: id as u32,
            segs: op.rma,
            desc,
        };
        self.frame(peer, f, Body::None, None);
    }

    /// A `Write` with its data as the body, or with a descriptor of it where the target's
    /// transport may copy it itself.
    fn send_write(&mut self, peer: PeerId, op: &RmaOp, copy: Option<Body>) {
        let mut fl = flags::ACK;
        if op.flags & FI_REMOTE_CQ_DATA != 0 {
            fl |= flags::CQ_DATA;
        }
        if op.flags & FI_COMMIT_COMPLETE != 0 {
            fl |= flags::COMMIT;
        }
        // The target's transport may copy the data itself (no inject: its copy is ours).
        let desc = match copy {
            None => self.offer(peer, &op.iov, true),
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
    }

    /// A `Write`: served through the transport's copies where the initiator offered its
    /// memory instead of sending the data, else its body lands here.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_write(
        &mut self,
        peer: PeerId,
        id: u32,
        data: u64,
        fl: u8,
        segs: RmaIovList,
        desc: Desc,
        body: u64,
    ) -> Sink {
        if !desc.is_empty() && body == 0 && segs.total() > 0 {
            self.serve_write(peer, id, data, fl, segs, desc);
            self.no_body(peer)
        } else {
            self.write_frame(peer, id, data, fl, &segs, body, 0)
        }
    }

    /// A write whose data is `body` bytes after its control part (or a `Data` frame
    /// bringing it): where they go.
    /// `failed`: the write already failed with this error (0: not), its body then dropped
    /// and the failure answered (a served write whose region closed before its `Data` came).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_frame(
        &mut self,
        peer: PeerId,
        id: u32,
        data: u64,
        fl: u8,
        segs: &RmaIovList,
        body: u64,
        failed: i32,
    ) -> Sink {
        let len = segs.total();
        let mut w = WriteBody {
            id,
            fl,
            data: (fl & flags::CQ_DATA != 0).then_some(data),
            status: 0,
            len,
            dest: IovList::default(),
            segs: *segs,
            staged: None,
        };
        let sink = if failed != 0 {
            // Its region closed while its data was on the way: nothing of it may land, in
            // whatever now answers to its key.
            w.status = failed;
            Sink::Discard
        } else if body != len as u64 {
            w.status = FI_EINVAL;
            Sink::Discard
        } else {
            match self.resolve(peer, segs, FI_REMOTE_WRITE) {
                Err(e) => {
                    w.status = e;
                    Sink::Discard
                }
                Ok((iov, None)) => {
                    w.dest = iov;
                    Sink::Iov(iov)
                }
                Ok((iov, Some(segs))) if self.core.hmem().is_some() => {
                    let (ctx, bounce) = self.core.stage_remote(segs);
                    w.dest = iov;
                    w.staged = Some(ctx);
                    Sink::Iov(bounce)
                }
                Ok(_) => {
                    w.status = FI_EOPNOTSUPP;
                    Sink::Discard
                }
            }
        };
        self.expect(peer, sink, Pending::Write(w))
    }

    /// A peer's write landed in `w.dest` (status 0), or failed: made durable where asked,
    /// acknowledged, reported.
    pub(super) fn write_landed(&mut self, peer: PeerId, w: WriteBody) {
        let mut status = w.status;
        if let Some(ctx) = w.staged {
            if status == 0 {
                // Lands before the acknowledgement: delivery complete means the device has
                // the data.
                status = match self.core.land_remote(ctx, w.len) {
                    Ok(()) => 0,
                    Err(_) => FI_EIO,
                };
            } else {
                // Failed since it was staged (its region closed: `cut_region`).
                self.core.drop_remote(ctx);
            }
        }
        if status == 0 && self.core.caps & FI_RMA_PMEM != 0 {
            status = self.note_written(peer, &w.dest, w.fl & flags::COMMIT != 0);
        } else if status == 0 && w.fl & flags::COMMIT != 0 {
            status = target::commit(&w.dest);
        }
        if w.fl & flags::ACK != 0 {
            self.ack(peer, w.id, status);
        }
        if status == 0 {
            self.done.push(Done::Remote {
                flags: FI_RMA | FI_WRITE,
                len: w.len,
                data: w.data,
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

    /// A `Read`: the target's transport copies the checked ranges into the initiator's
    /// offered memory where it can (`rma_copy`); else they are answered as `ReadResp`'s body
    /// (device memory gathered into a buffer first).
    pub(super) fn on_read(&mut self, peer: PeerId, id: u32, segs: &RmaIovList, desc: Desc) -> Sink {
        if !desc.is_empty() && self.serve_read(peer, id, segs, desc) {
            return Sink::Discard;
        }
        let (status, body) = match self.resolve(peer, segs, FI_REMOTE_READ) {
            Err(e) => (e, Body::None),
            Ok((iov, None)) => (0, Body::Iov(iov)),
            Ok((_, Some(segs))) => match self.core.hmem() {
                None => (FI_EOPNOTSUPP, Body::None),
                // SAFETY: the ranges passed the key check: registered memory of their
                // owners.
                Some(hm) => match unsafe { hmem_stage::gather(hm, &segs) } {
                    Ok(c) => (0, Body::Owned(c)),
                    Err(Error::NoMem(_)) => (FI_ENOMEM, Body::None),
                    Err(_) => (FI_EIO, Body::None),
                },
            },
        };
        let len = body.len();
        self.read_resp(peer, id, status, body);
        if status == 0 {
            self.done.push(Done::Remote {
                flags: FI_RMA | FI_READ,
                len,
                data: None,
            });
        }
        self.no_body(peer)
    }

    /// Answers a peer's read. Where the body is the memory read itself, the peer's later
    /// requests wait until the transport has taken all of it (`on_sent`): a write it sends
    /// next must not land in what is still being read.
    pub(super) fn read_resp(&mut self, peer: PeerId, id: u32, status: i32, body: Body) {
        let token = if let Body::Iov(iov) = &body {
            self.peer(peer).answering(*iov);
            Some(READ_SENT)
        } else {
            None
        };
        self.frame(peer, Frame::ReadResp { id, status }, body, token);
    }

    /// The transport took all of an answer to `peer`'s read (`READ_SENT`): one fewer for
    /// its later writes and atomics to wait behind.
    pub(super) fn read_sent(&mut self, peer: PeerId) {
        self.peer(peer).answers_taken(1);
    }

    /// A `ReadResp` to our read `id`: its body, the bytes read, goes into the read's
    /// destination (none where the target's transport copied them in already).
    pub(super) fn on_read_resp(
        &mut self,
        peer: PeerId,
        id: u32,
        status: i32,
        body: u64,
    ) -> std::result::Result<Sink, WireError> {
        let read = |t: &TxReq| t.flags & (FI_RMA | FI_READ) == FI_RMA | FI_READ;
        self.on_data_answer(peer, Kind::ReadResp, id, status, body, read)
    }
}
