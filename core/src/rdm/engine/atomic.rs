//! Atomics: the initiator sends `Atomic` with the operands (and compare values) as the body;
//! the target checks and executes it (`target::atomic`, under the process-wide lock) and
//! answers `AtomicResp` with the original values for a fetch, or an `Ack`.

use super::*;

/// A peer's atomic whose operands are arriving: the frame's fields, unchecked.
pub(super) struct AtomicBody {
    pub id: u32,
    pub fl: u8,
    pub op: u32,
    pub datatype: u32,
    pub count: u32,
    pub addr: u64,
    pub key: u64,
}

impl Engine {
    /// Starts an atomic toward `peer`.
    ///
    /// # Safety
    /// The operand and compare values stay readable, and the result buffer writable, until the
    /// operation completes (the operand only during the call with `FI_INJECT`).
    pub unsafe fn post_atomic(&mut self, peer: PeerId, req: &AtomicReq) -> Result<()> {
        self.check_room("atomic")?;
        if self.atomic_fenced(peer, req.flags) {
            // Atomics are small: a fenced one waits as Again until its peer is drained.
            return Err(Error::Again("atomic: fenced behind outstanding operations"));
        }
        // SAFETY: forwarded.
        unsafe { self.atomic_now(peer, req) }.map_err(|(_, _, e)| e)
    }

    /// Starts an atomic that nothing holds back: through the NIC where it is one the NIC
    /// has, else as an `Atomic` frame with copies of the operands.
    ///
    /// # Safety
    /// As `post_atomic`.
    unsafe fn atomic_now(
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
        if req.flags & FI_COMMIT_COMPLETE != 0 {
            fl |= flags::COMMIT;
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

    /// An `Atomic`: its operands (no more than two operands' worth) come into a buffer.
    pub(super) fn on_atomic(
        &mut self,
        peer: PeerId,
        a: AtomicBody,
        body: u64,
    ) -> std::result::Result<Sink, WireError> {
        if body > 2 * ATOMIC_MAX as u64 {
            return Err(WireError::Malformed(Kind::Atomic));
        }
        let sink = Sink::Buffer(vec![0; body as usize]);
        Ok(self.expect(peer, sink, Pending::Atomic(a)))
    }

    /// A peer's atomic with its operands in hand: checked, executed, answered (the original
    /// values for a fetch, an `Ack` where asked) and reported.
    pub(super) fn atomic_arrived(&mut self, peer: PeerId, a: AtomicBody, sink: Sink) {
        let Sink::Buffer(args) = sink else { return };
        let req = target::AtomicAt {
            op: a.op as i32,
            datatype: a.datatype as i32,
            count: a.count as usize,
            addr: a.addr,
            key: a.key,
            fetch: a.fl & flags::FETCH != 0,
            args: &args,
        };
        let id = a.id;
        match target::atomic(&self.core, &req) {
            Err(e) => {
                if e == FI_EACCES {
                    self.refused(peer);
                }
                self.frame(peer, Frame::AtomicResp { id, status: e }, Body::None, None)
            }
            Ok(d) => {
                // What it changed is durable before the answer says so, as for a write: on a
                // persistent-memory endpoint recorded (and with `COMMIT` flushed with the
                // rest), elsewhere flushed where the initiator asked for it.
                let commit = a.fl & flags::COMMIT != 0;
                let status = if d.dir != FI_WRITE {
                    0
                } else if self.core.caps & FI_RMA_PMEM != 0 {
                    self.note_written(peer, &IovList::one(d.at, d.len), commit)
                } else if commit {
                    target::commit(&IovList::one(d.at, d.len))
                } else {
                    0
                };
                if status != 0 {
                    // Executed but not made durable: the initiator is told it failed.
                    let f = Frame::AtomicResp { id, status };
                    self.frame(peer, f, Body::None, None);
                    return;
                }
                if req.fetch {
                    self.frame(
                        peer,
                        Frame::AtomicResp { id, status: 0 },
                        Body::Owned(d.result),
                        None,
                    );
                } else if a.fl & flags::ACK != 0 {
                    self.ack(peer, id, 0);
                }
                self.done.push(Done::Remote {
                    flags: FI_ATOMIC | d.dir,
                    len: d.len,
                    data: None,
                });
            }
        }
    }

    /// An `AtomicResp` to our atomic `id`: its body, a fetch's original values, goes into
    /// the result buffer.
    pub(super) fn on_atomic_resp(
        &mut self,
        peer: PeerId,
        id: u32,
        status: i32,
        body: u64,
    ) -> std::result::Result<Sink, WireError> {
        let atomic = |t: &TxReq| t.flags & FI_ATOMIC != 0;
        self.on_data_answer(peer, Kind::AtomicResp, id, status, body, atomic)
    }
}
