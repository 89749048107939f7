//! Large messages: rendezvous after a match. The receiver copies with cross-memory attach
//! (alone, or split with the sender for the largest messages so both cores copy), or, where
//! the kernel refuses that, asks for fragments through the ring (CTS, DATA) and acknowledges
//! the last one.

use super::*;

impl ShmEndpoint {
    /// Starts moving a matched large message into `slot`.
    pub(super) fn start_rndv(
        &self,
        st: &mut State,
        slot: RecvSlot,
        r: Rndv,
        tag: u64,
        data: Option<u64>,
        src: FiAddr,
    ) {
        if st.peers[r.peer].dead {
            // Its data went with it (and its pid may already name another process).
            return st.push_rx(Done::SlotErr {
                slot,
                tag,
                err: FI_ECONNRESET,
            });
        }
        let cap = slot.iov.total();
        let n = r.len.min(cap);
        // Copy through the peer's pid only as verified, never as the message claims.
        let mut r = r;
        // From `split_min` the copy needs the sender's progress anyway (it writes half); up
        // to `cma_min`, two copies through the ring that overlap (the sender writes one
        // fragment while we read the last) beat a split cross-memory attach, whose syscalls
        // pin pages: 16 GB/s against 10 at 64 KiB here, even at 512 KiB, behind from 1 MiB.
        // Below `split_min` we copy alone, needing nothing from the sender.
        let stream = n >= self.split_min && n < self.cma_min;
        let cma_pid = st.peers[r.peer]
            .cma_pid
            .filter(|_| self.cma.usable() && !stream);
        if let Some(pid) = cma_pid {
            r.pid = pid;
        }
        if cma_pid.is_some() && n >= self.split_min && self.cma.known_working() {
            return self.start_split(st, slot, r, n, tag, data, src);
        }
        if cma_pid.is_some() {
            match cma::read(&self.cma, r.pid, &slot.iov, &r.iov, n) {
                CmaResult::Done => {
                    let status = self.sink_status(&slot, n);
                    self.ack(st, r.peer, r.tx_id, status);
                    let raw = self.raw_src(st, r.peer, src);
                    st.push_rx(Done::Rx {
                        slot,
                        len: n,
                        olen: r.len - n,
                        tag,
                        data,
                        src,
                        raw,
                    });
                    return;
                }
                CmaResult::Refused => {}
                CmaResult::PeerGone => {
                    st.push_rx(Done::SlotErr {
                        slot,
                        tag,
                        err: FI_ECONNRESET,
                    });
                    return;
                }
                CmaResult::Failed(e) => {
                    self.ack(st, r.peer, r.tx_id, e);
                    st.push_rx(Done::SlotErr { slot, tag, err: e });
                    return;
                }
            }
        }
        let id = st.rxp.insert(RxPipe {
            slot,
            peer: r.peer,
            tx_id: r.tx_id,
            total: r.len,
            got: 0,
            tag,
            data,
            src,
            split: None,
        });
        let h = Header {
            kind: kind::CTS,
            aux: r.tx_id,
            tag: id as u64,
            ..Default::default()
        };
        self.send_ctrl(st, r.peer, h, &[]);
    }

    /// Split copy: asks the sender to write bytes `at..n` into our buffer while we read
    /// `0..at` from its memory; the message completes when its WDONE arrives.
    #[allow(clippy::too_many_arguments)]
    fn start_split(
        &self,
        st: &mut State,
        slot: RecvSlot,
        r: Rndv,
        n: usize,
        tag: u64,
        data: Option<u64>,
        src: FiAddr,
    ) {
        // The receiver starts at once and the sender one message hop later, so the receiver
        // takes a little more than half (9/16 measured best at 64 KiB), page-aligned.
        let at = (n / 16 * 9) & !4095;
        let segs = slot.iov.segs();
        let mut pl = Vec::with_capacity(24 + 16 * segs.len());
        pl.extend_from_slice(&(at as u64).to_le_bytes());
        pl.extend_from_slice(&(n as u64).to_le_bytes());
        pl.extend_from_slice(&(std::process::id() as i32).to_le_bytes());
        pl.extend_from_slice(&(segs.len() as u32).to_le_bytes());
        for sg in segs {
            pl.extend_from_slice(&(sg.addr as u64).to_le_bytes());
            pl.extend_from_slice(&(sg.len as u64).to_le_bytes());
        }
        let (peer, tx_id, pid) = (r.peer, r.tx_id, r.pid);
        let iov = slot.iov;
        let id = st.rxp.insert(RxPipe {
            slot,
            peer,
            tx_id,
            total: r.len,
            got: 0,
            tag,
            data,
            src,
            split: Some(Split {
                pid,
                remote: r.iov,
                err: 0,
            }),
        });
        let h = Header {
            kind: kind::CTS,
            flags: flag::SPLIT,
            len: pl.len() as u32,
            aux: tx_id,
            tag: id as u64,
            ..Default::default()
        };
        self.send_ctrl(st, peer, h, &pl);
        let remote = st.rxp[id]
            .split
            .as_ref()
            .map(|s| s.remote.clone())
            .unwrap_or_default();
        match cma::read(&self.cma, pid, &iov, &remote, at) {
            CmaResult::Done => st.rxp[id].got = at,
            CmaResult::PeerGone => {
                let r = st.rxp.remove(id);
                st.push_rx(Done::SlotErr {
                    slot: r.slot,
                    tag,
                    err: FI_ECONNRESET,
                });
            }
            CmaResult::Refused => st.rxp[id].split.as_mut().expect("split").err = FI_EPERM,
            CmaResult::Failed(e) => st.rxp[id].split.as_mut().expect("split").err = e,
        }
    }

    /// The sender's half of a split copy: writes `at..n` of send `id` into the receiver's
    /// buffer described by the CTS payload, then reports with WDONE.
    pub(super) fn write_split(&self, st: &mut State, p: usize, id: usize, rx_id: u64, pl: &[u8]) {
        let Some(t) = st.tx.get(id).filter(|t| t.peer == p) else {
            return;
        };
        let cma_pid = st.peers[p].cma_pid;
        let status = match parse_split(pl) {
            Some((at, n, _, remote)) if n <= t.len && at <= n && cma_pid.is_some() => {
                let pid = cma_pid.expect("checked");
                let local = t.iov.slice(at, n - at);
                let remote = remote.slice(at, n - at);
                match cma::write(&self.cma, pid, &local, remote.segs(), n - at) {
                    CmaResult::Done => 0,
                    CmaResult::PeerGone => {
                        self.peer_died(st, p);
                        return;
                    }
                    CmaResult::Refused => FI_EPERM,
                    CmaResult::Failed(e) => e,
                }
            }
            _ => FI_EINVAL,
        };
        let h = Header {
            kind: kind::WDONE,
            aux: rx_id as u32,
            len: status as u32,
            ..Default::default()
        };
        self.send_ctrl(st, p, h, &[]);
    }

    /// The sender finished (or could not do) its part of split copy `id`.
    pub(super) fn split_written(&self, st: &mut State, id: usize, status: i32) {
        let Some(r) = st.rxp.get(id) else { return };
        let Some(sp) = r.split.as_ref() else { return };
        let n = r.total.min(r.slot.iov.total());
        let mut err = sp.err;
        if err == 0 && status != 0 {
            // The sender could not write its part: read the rest ourselves.
            let start = r.got;
            let local = r.slot.iov.slice(start, n - start);
            let remote = IovList::from_segs(sp.remote.iter().copied())
                .map(|l| l.slice(start, n - start))
                .unwrap_or_default();
            err = match cma::read(&self.cma, sp.pid, &local, remote.segs(), n - start) {
                CmaResult::Done => 0,
                CmaResult::PeerGone => FI_ECONNRESET,
                CmaResult::Refused => FI_EPERM,
                CmaResult::Failed(e) => e,
            };
        }
        let r = st.rxp.remove(id);
        let err = if err == 0 {
            self.sink_status(&r.slot, n)
        } else {
            err
        };
        self.ack(st, r.peer, r.tx_id, err);
        if err != 0 {
            st.push_rx(Done::SlotErr {
                slot: r.slot,
                tag: r.tag,
                err,
            });
            return;
        }
        let raw = self.raw_src(st, r.peer, r.src);
        st.push_rx(Done::Rx {
            slot: r.slot,
            len: n,
            olen: r.total - n,
            tag: r.tag,
            data: r.data,
            src: r.src,
            raw,
        });
    }

    /// Pushes fragments of pipelined sends while their peers' rings have room.
    pub(super) fn pump_streams(&self, st: &mut State) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < st.streaming.len() {
            let id = st.streaming[i] as usize;
            let Some(t) = st.tx.get(id) else {
                st.streaming.swap_remove(i);
                continue;
            };
            let (p, iov, len) = (t.peer, t.iov, t.len);
            let (rx_id, mut off) = t.stream.expect("streaming sends have a stream");
            let peer = &mut st.peers[p];
            if !peer.backlog.is_empty() || peer.dead {
                i += 1;
                continue;
            }
            let prod = peer.prod.as_mut().expect("a streaming send's lane exists");
            let seg = peer.seg.as_ref().expect("a lane implies a segment");
            while off < len {
                let chunk = FRAG.min(len - off);
                let h = Header {
                    kind: kind::DATA,
                    len: chunk as u32,
                    aux: rx_id,
                    tag: off as u64,
                    ..Default::default()
                };
                // SAFETY: a pending send's buffer stays readable until it completes.
                if !prod.write(seg, &h, chunk, |b| unsafe {
                    iov.copy_out(off, b);
                }) {
                    break;
                }
                off += chunk;
                n += 1;
            }
            if n > 0 {
                Self::wake(seg);
            }
            st.tx[id].stream = Some((rx_id, off));
            if off >= len {
                st.streaming.swap_remove(i);
            } else {
                i += 1;
            }
        }
        n
    }
}

/// A split CTS payload: (at, n, receiver pid, receiver iov).
fn parse_split(pl: &[u8]) -> Option<(usize, usize, i32, IovList)> {
    let u64_at = |o: usize| {
        pl.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let at = u64_at(0)? as usize;
    let n = u64_at(8)? as usize;
    let pid = i32::from_le_bytes(pl.get(16..20)?.try_into().ok()?);
    let cnt = u32::from_le_bytes(pl.get(20..24)?.try_into().ok()?) as usize;
    let segs = (0..cnt.min(xfabric_core::rxq::IOV_LIMIT)).map(|i| {
        Some(RawIov {
            addr: u64_at(24 + 16 * i)? as usize,
            len: u64_at(32 + 16 * i)? as usize,
        })
    });
    let segs: Option<Vec<RawIov>> = segs.collect();
    Some((at, n, pid, IovList::from_segs(segs?)?))
}

pub(super) fn parse_rts(pl: &[u8], peer: usize, tx_id: u32) -> Option<Rndv> {
    let u64_at = |o: usize| {
        pl.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let len = u64_at(0)? as usize;
    let pid = i32::from_le_bytes(pl.get(8..12)?.try_into().ok()?);
    let n = u32::from_le_bytes(pl.get(12..16)?.try_into().ok()?) as usize;
    let n = n.min(xfabric_core::rxq::IOV_LIMIT);
    let mut iov = Vec::with_capacity(n);
    for i in 0..n {
        iov.push(RawIov {
            addr: u64_at(16 + 16 * i)? as usize,
            len: u64_at(24 + 16 * i)? as usize,
        });
    }
    Some(Rndv {
        peer,
        tx_id,
        len,
        pid,
        iov,
    })
}
