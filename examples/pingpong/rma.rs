//! One-sided modes: write and read bandwidth and the fetch-add rate (fi_rma_bw's shape).

use super::*;

// ---------------------------------------------------------------------------------------------
// One-sided streams: write, read, fetchadd

impl Node {
    /// Client: `count` windows of one-sided operations on the server's buffer, each window
    /// waited for before the next, as fabtests' rma_bw does. Returns the time they took and
    /// tells the server it is over.
    pub(super) fn stream(
        &mut self,
        ctl: &mut Control,
        size: usize,
        count: usize,
        phase: u64,
        tx: &mut [u8],
        rx: &mut LandingBuf,
    ) -> Res<Duration> {
        let seed = seed(phase, size, 0, self.op == Op::Write);
        if self.check && self.op == Op::Write {
            fill(&mut tx[..size], seed);
        }
        let mut fetched = 0u128;
        ctl.barrier()?;
        let start = Instant::now();
        for _ in 0..count {
            for j in 0..self.window {
                self.post_one_sided(j, &tx[..size], rx)?;
            }
            self.wait(false)?;
            if self.check && self.op == Op::FetchAdd {
                // SAFETY: every fetch of the window has completed.
                let results = unsafe { rx.bytes(0, 8 * self.window) };
                fetched += results
                    .chunks_exact(8)
                    .map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")) as u128)
                    .sum::<u128>();
            }
        }
        let elapsed = start.elapsed();
        if self.check {
            match self.op {
                Op::Write if size > 0 => self.flush_writes(rx)?,
                // SAFETY: every read has completed.
                Op::Read => verify(unsafe { rx.bytes(0, size) }, seed, count - 1)?,
                Op::FetchAdd => {
                    // Every add fetched a distinct count: 0, 1, .. n - 1.
                    let n = (count * self.window) as u128;
                    if fetched != n * (n - 1) / 2 {
                        return Err(format!(
                            "data integrity check failed: {n} fetch-adds fetched values \
                             summing to {fetched}, not {}",
                            n * (n - 1) / 2
                        ));
                    }
                }
                _ => {}
            }
        }
        ctl.send_done(elapsed)?;
        Ok(elapsed)
    }

    /// Posts operation `j` of a window: fabtests aims every operation of a window at the same
    /// bytes, so every read lands in the same local bytes; fetches get a result slot each.
    pub(super) fn post_one_sided(&mut self, j: usize, tx: &[u8], rx: &mut LandingBuf) -> Res<()> {
        let Remote { addr, key } = self.remote;
        let size = tx.len();
        loop {
            let inject = self.op == Op::Write && size < self.inject_size;
            let r = match self.op {
                Op::Write if inject => self.ep.inject_write(tx, self.peer, addr, key),
                // SAFETY (all three): neither `tx` is written nor `rx` looked at until `wait` has
                // seen every completion of the window; the `rx` slices live for the call only.
                Op::Write => unsafe { self.ep.write(tx, None, self.peer, addr, key, TX_CTX) },
                Op::Read => unsafe {
                    let buf = rx.bytes_mut(0, size);
                    self.ep.read(buf, None, self.peer, addr, key, TX_CTX)
                },
                Op::FetchAdd => unsafe {
                    let result = rx.bytes_mut(8 * j, 8);
                    self.ep.fetch_atomic(
                        &ONE,
                        1,
                        result,
                        self.peer,
                        addr,
                        key,
                        Datatype::UInt64,
                        AtomicOp::Sum,
                        TX_CTX,
                    )
                },
                other => unreachable!("{other:?} is not one-sided"),
            };
            match r {
                Ok(()) => {
                    self.tx_outstanding += !inject as usize;
                    return Ok(());
                }
                Err(Error::Again(_)) => {
                    self.poll()?;
                }
                Err(e) => return Err(format!("post {:?} of {size} bytes: {e}", self.op)),
            }
        }
    }

    /// Waits until every write posted so far has landed at the server, with a 1-byte read
    /// fenced behind them: a write may complete here before the server has placed it.
    pub(super) fn flush_writes(&mut self, rx: &mut LandingBuf) -> Res<()> {
        let iov = [RawIov {
            addr: rx.addr() as usize,
            len: 1,
        }];
        let rma = [RmaIov {
            addr: self.remote.addr,
            len: 1,
            key: self.remote.key,
        }];
        let m = MsgRma {
            iov: &iov,
            desc: &[],
            addr: self.peer,
            rma_iov: &rma,
            context: TX_CTX,
            data: 0,
        };
        loop {
            // SAFETY: `rx` is not looked at until `wait` has seen the read's completion.
            match unsafe { self.ep.readmsg(&m, FI_FENCE) } {
                Ok(()) => break,
                Err(Error::Again(_)) => {
                    self.poll()?;
                }
                Err(e) => return Err(format!("fenced read after the writes: {e}")),
            }
        }
        self.tx_outstanding += 1;
        self.wait(false)
    }

    /// Server: sets up its buffer for the run, then makes progress (shm's target executes the
    /// client's operations) until the client says it is done. Returns the client's time.
    pub(super) fn serve(
        &mut self,
        ctl: &mut Control,
        size: usize,
        count: usize,
        phase: u64,
        rx: &mut LandingBuf,
    ) -> Res<Duration> {
        let seed = seed(phase, size, 0, self.op == Op::Write);
        // SAFETY (both): the client posts nothing before the barrier below.
        match self.op {
            Op::Read => fill(unsafe { rx.bytes_mut(0, size) }, seed),
            Op::FetchAdd => unsafe { rx.bytes_mut(0, 8) }.fill(0),
            _ => {}
        }
        ctl.barrier()?;
        let elapsed = self.progress_until_done(ctl)?;
        if self.check {
            match self.op {
                // SAFETY (both): the client's operations are over (it flushed its writes).
                Op::Write => verify(unsafe { rx.bytes(0, size) }, seed, count - 1)?,
                Op::FetchAdd => {
                    let got = u64::from_ne_bytes(unsafe { rx.bytes(0, 8) }.try_into().expect("8"));
                    let want = (count * self.window) as u64;
                    if got != want {
                        return Err(format!(
                            "data integrity check failed: counter is {got} after {want} \
                             fetch-adds"
                        ));
                    }
                }
                _ => {}
            }
        }
        Ok(elapsed)
    }

    /// Polls the CQ (which drives progress) until the client's done message has come in on the
    /// control connection, which a second thread waits for.
    pub(super) fn progress_until_done(&mut self, ctl: &mut Control) -> Res<Duration> {
        // To wake the reader if polling fails first.
        let sock = ctl
            .0
            .try_clone()
            .map_err(|e| format!("control: clone: {e}"))?;
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let r = ctl.recv_done();
                done.store(true, Ordering::Release);
                r
            });
            let mut polled = Ok(());
            while !done.load(Ordering::Acquire) {
                if let Err(e) = self.poll() {
                    let _ = sock.shutdown(Shutdown::Both);
                    polled = Err(e);
                    break;
                }
            }
            let told = reader
                .join()
                .unwrap_or_else(|_| Err("control: reader thread panicked".into()));
            polled.and(told)
        })
    }
}
