//! CUDA IPC over shm, measured: two processes on one GPU, CUDA device memory on both sides
//! (FI_HMEM). A 4 MiB send from device memory is offered unstaged and the receiver copies it
//! device to device out of the sender's allocation, opened by IPC handle (shm's CUDA IPC path).
//!
//! Three figures, each printed with its goal and whether it was met:
//! - the handle's opening amortized: the 1st 4 MiB message (which opens the handle) against the
//!   10th (cached), each the time from its post to the receiver's 8-byte answer; goal: the 10th
//!   at least 10x faster;
//! - the bandwidth: rounds of 8 messages of 4 MiB posted back to back (median round) against
//!   rounds of 8 `cuMemcpyAsync` device-to-device copies of 4 MiB on the same device in the same
//!   run; goal: at least 0.8x;
//! - the latency: 8 B device to device, ping-pong, one way = half the round trip, p50; goal: at
//!   most 10 us.
//!
//! The receiver checks the bytes of every single message and of each round's last, after its
//! answer completed (the check is not timed, and holds no answer back). Without a GPU it fails in one line.
//!
//! ```text
//! cargo run --release --example gpu_ipc_bench [-- [--rounds R] [--pings N]]
//! ```

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use xfabric::hmem::{DeviceBuffer, Hmem, HmemIface, Iface};
use xfabric::*;

mod common;
use common::{hex, open, unhex, Node};

const ROLE_ENV: &str = "XF_IPC_BENCH_ROLE";
const BIG: usize = 4 << 20;
const SMALL: usize = 8;
/// Messages per bandwidth round.
const WINDOW: usize = 8;
/// Single messages timed one by one (the 1st opens the handle; the 10th is the figure).
const SINGLES: usize = 10;

/// CUDA IPC over shm between two processes on one GPU: 4 MiB messages and 8 B latency.
#[derive(clap::Parser, Debug)]
#[command(name = "gpu_ipc_bench")]
struct Opts {
    /// Bandwidth rounds (of 8 messages of 4 MiB each, and of 8 copies)
    #[arg(long, default_value_t = 9, value_parser = common::args::positive)]
    rounds: usize,
    /// 8 B round trips for the latency (after 100 that warm up)
    #[arg(long, default_value_t = 2000, value_parser = common::args::positive)]
    pings: usize,
}

fn fail(why: &str) -> ! {
    eprintln!("gpu_ipc_bench: {why}");
    std::process::exit(1)
}

fn main() {
    let o: Opts = common::args::parse();
    let cuda = Hmem::global().get(Iface::Cuda);
    if let Err(e) = cuda.available() {
        fail(&format!("no CUDA: {e}"));
    }
    if cuda.devices().is_empty() {
        fail("no CUDA device");
    }
    match std::env::var(ROLE_ENV).as_deref() {
        Ok("rx") => receiver(&o, cuda),
        _ => sender(&o, cuda),
    }
}

/// Byte `i` of message `seed`.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(131).wrapping_add(seed * 7 + 1) as u8)
        .collect()
}

fn alloc(cuda: &dyn HmemIface, len: usize) -> DeviceBuffer {
    cuda.alloc_device(0, len)
        .unwrap_or_else(|e| fail(&format!("device memory ({len} B): {e}")))
}

fn fill(cuda: &dyn HmemIface, b: &DeviceBuffer, data: &[u8]) {
    // SAFETY: `b` is device memory of at least `data.len()` bytes that no operation uses now.
    unsafe { cuda.copy_from_host(0, b.as_ptr(), data) }
        .unwrap_or_else(|e| fail(&format!("copy to the device: {e}")));
}

fn read(cuda: &dyn HmemIface, b: &DeviceBuffer, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: `b` is device memory of at least `len` bytes that no operation writes now.
    unsafe { cuda.copy_to_host(0, &mut v, b.as_ptr()) }
        .unwrap_or_else(|e| fail(&format!("copy from the device: {e}")));
    v
}

impl Node {
    /// Posts a send of `len` bytes at `addr` (device or host memory) to `to`.
    ///
    /// # Safety
    /// `addr..addr + len` stays valid and unwritten until the send's completion.
    unsafe fn send_raw(&self, addr: *mut u8, len: usize, to: FiAddr, context: usize) {
        let iov = [RawIov {
            addr: addr as usize,
            len,
        }];
        let m = Msg {
            iov: &iov,
            desc: &[],
            addr: to,
            context,
            data: 0,
            tag: 0,
            ignore: 0,
        };
        loop {
            // SAFETY: the caller's contract.
            match unsafe { self.ep.sendmsg(&m, 0) } {
                Ok(()) => return,
                Err(Error::Again(_)) => {
                    let _ = self.cq.read::<CqTaggedEntry>(&mut []);
                }
                Err(e) => fail(&format!("send: {e}")),
            }
        }
    }

    /// Posts a receive of `len` bytes into `addr` (device or host memory) from `from`.
    ///
    /// # Safety
    /// `addr..addr + len` stays valid and otherwise untouched until the receive's completion.
    unsafe fn recv_raw(&self, addr: *mut u8, len: usize, from: FiAddr, context: usize) {
        let iov = [RawIov {
            addr: addr as usize,
            len,
        }];
        let m = Msg {
            iov: &iov,
            desc: &[],
            addr: from,
            context,
            data: 0,
            tag: 0,
            ignore: 0,
        };
        // SAFETY: the caller's contract.
        unsafe { self.ep.recvmsg(&m, 0) }.unwrap_or_else(|e| fail(&format!("recv: {e}")));
    }

    /// Spins until the receive with `context` completed; any other completion is a send's
    /// (the contexts of sends and receives differ) and counted off `pending_sends`.
    fn spin_for(&self, context: usize, pending_sends: &mut usize) {
        loop {
            for e in self.spin(1, fail) {
                if e.op_context == context {
                    return;
                }
                *pending_sends = pending_sends.saturating_sub(1);
            }
        }
    }
}

/// Context of the 8-byte answers and pings.
const SMALL_CTX: usize = 1 << 40;

/// The peer: receives into device memory, answers with 8 bytes from device memory.
fn receiver(o: &Opts, cuda: &dyn HmemIface) {
    let n = open(FI_MSG | FI_HMEM, Progress::Manual);
    println!("{}", hex(&n.ep.getname().expect("getname")));
    let mut lines = std::io::stdin().lock().lines();
    let from =
        n.av.insert_one(&unhex(
            &lines.next().and_then(|l| l.ok()).unwrap_or_default(),
        ))
        .expect("av insert");
    // Two of each receive buffer: the next batch's receives are posted (into the other) before
    // the answer goes, and the bytes are checked after it, so that neither the check nor a late
    // post is inside the sender's time.
    let big = [alloc(cuda, BIG), alloc(cuda, BIG)];
    let small_rx = [alloc(cuda, SMALL), alloc(cuda, SMALL)];
    let small_tx = alloc(cuda, SMALL);
    fill(cuda, &small_tx, &pattern(SMALL, 0));
    let mut sends = 0usize;
    let answer = |n: &Node, sends: &mut usize| {
        // SAFETY: `small_tx` is only read by sends, and outlives them (the process waits for
        // them all before it frees anything).
        unsafe { n.send_raw(small_tx.as_ptr(), SMALL, from, SMALL_CTX) };
        *sends += 1;
    };
    // Batch b (seed b): the single messages one by one, then the rounds of WINDOW.
    let batches: Vec<usize> = std::iter::repeat_n(1, SINGLES)
        .chain(std::iter::repeat_n(WINDOW, o.rounds))
        .collect();
    let post = |b: usize| {
        for k in 0..batches[b] {
            // SAFETY: `big[b % 2]` is only this batch's until its completions, and read only
            // after them (every message of a round lands there; the last one is checked).
            unsafe { n.recv_raw(big[b % 2].as_ptr(), BIG, from, k) };
        }
    };
    post(0);
    // Messages of the next batch that completed while this one's answer was driven out.
    let mut early = 0;
    for (b, &count) in batches.iter().enumerate() {
        let mut got = std::mem::take(&mut early);
        while got < count {
            for e in n.spin(1, fail) {
                if e.op_context < WINDOW {
                    got += 1;
                } else {
                    sends = sends.saturating_sub(1);
                }
            }
        }
        if b + 1 < batches.len() {
            post(b + 1);
        }
        answer(&n, &mut sends);
        // The answer leaves only through this process's progress (manual progress, and a
        // send from device memory goes through a rendezvous and staging): the check below
        // drives none for as long as it takes (a 4 MiB copy to the host and a compare), which
        // would hold the answer back inside the sender's time. So it goes first, to its
        // completion; the next batch's messages that complete meanwhile are counted for it.
        while sends > 0 {
            for e in n.spin(1, fail) {
                if e.op_context < WINDOW {
                    early += 1;
                } else {
                    sends -= 1;
                }
            }
        }
        if read(cuda, &big[b % 2], BIG) != pattern(BIG, b as u64) {
            fail(&format!("batch {b} (of {count} message(s)) differs"));
        }
    }
    // SAFETY: each small receive buffer is only its receive's until its completion; the next
    // ping's receive goes to the other one, posted before the answer.
    unsafe { n.recv_raw(small_rx[0].as_ptr(), SMALL, from, SMALL_CTX + 1) };
    let pings = 100 + o.pings;
    for p in 0..pings {
        n.spin_for(SMALL_CTX + 1, &mut sends);
        if p + 1 < pings {
            // SAFETY: as above.
            unsafe { n.recv_raw(small_rx[(p + 1) % 2].as_ptr(), SMALL, from, SMALL_CTX + 1) };
        }
        answer(&n, &mut sends);
    }
    n.spin(sends, fail);
    // How the messages came: by IPC (device to device), or staged where IPC was refused.
    let c = xfabric::providers::shm::raw::ipc_counts();
    eprintln!(
        "gpu_ipc_bench: the receiver copied {} messages by CUDA IPC ({} device to device), \
         opened {} handle(s), {} refused (staged)",
        c.copies, c.direct, c.opens, c.refused
    );
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn sender(o: &Opts, cuda: &dyn HmemIface) {
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(ROLE_ENV, "rx")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the peer process");
    let mut to_peer = child.stdin.take().expect("stdin");
    let mut from_peer = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let n = open(FI_MSG | FI_HMEM, Progress::Manual);
    let peer_name = from_peer
        .next()
        .and_then(|l| l.ok())
        .unwrap_or_else(|| fail("the peer process exited"));
    let peer = n.av.insert_one(&unhex(&peer_name)).expect("av insert");
    writeln!(to_peer, "{}", hex(&n.ep.getname().expect("getname"))).expect("tell peer");

    let big = alloc(cuda, BIG);
    let copy_dst = alloc(cuda, BIG);
    let small_tx = alloc(cuda, SMALL);
    let small_rx = alloc(cuda, SMALL);
    fill(cuda, &small_tx, &pattern(SMALL, 1));
    println!(
        "gpu_ipc_bench: two processes on CUDA device 0 over shm, device memory on both sides \
         ({} MiB messages, {} B pings)",
        BIG >> 20,
        SMALL
    );
    let mut sends = 0usize;
    // One message or round: post, then wait for the peer's 8-byte answer (sends' completions
    // are counted on the way).
    let exchange = |count: usize, sends: &mut usize| -> Duration {
        // SAFETY: `small_rx` is only this receive's until its completion.
        unsafe { n.recv_raw(small_rx.as_ptr(), SMALL, peer, SMALL_CTX) };
        let t0 = Instant::now();
        for k in 0..count {
            // SAFETY: `big` is only read by the sends and not written until they completed
            // (the peer answers after its receives completed, which needs the data moved; the
            // sends' own completions are drained before the next fill).
            unsafe { n.send_raw(big.as_ptr(), BIG, peer, k) };
            *sends += 1;
        }
        n.spin_for(SMALL_CTX, sends);
        t0.elapsed()
    };
    let mut singles = Vec::new();
    for i in 0..SINGLES {
        fill(cuda, &big, &pattern(BIG, i as u64));
        singles.push(exchange(1, &mut sends));
        n.spin(std::mem::take(&mut sends), fail);
    }
    let mut ipc_bw = Vec::new();
    for r in 0..o.rounds {
        fill(cuda, &big, &pattern(BIG, (SINGLES + r) as u64));
        let dt = exchange(WINDOW, &mut sends);
        n.spin(std::mem::take(&mut sends), fail);
        ipc_bw.push((WINDOW * BIG) as f64 / dt.as_secs_f64() / 1e9);
    }
    // The same bytes device to device in this process, copies as shm's are made.
    let mut copy_bw = Vec::new();
    for _ in 0..o.rounds + 1 {
        let t0 = Instant::now();
        let mut copies: Vec<_> = (0..WINDOW)
            .map(|_| {
                // SAFETY: both buffers are this process's, untouched until the copies are done.
                unsafe { cuda.copy_async(0, copy_dst.as_ptr(), big.as_ptr(), BIG) }
                    .unwrap_or_else(|e| fail(&format!("cuMemcpyAsync: {e}")))
            })
            .collect();
        for c in &mut copies {
            while !c
                .poll()
                .unwrap_or_else(|e| fail(&format!("copy event: {e}")))
            {
                std::hint::spin_loop();
            }
        }
        copy_bw.push((WINDOW * BIG) as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    copy_bw.remove(0); // the first warms up
    let mut one_way = Vec::with_capacity(o.pings);
    for p in 0..100 + o.pings {
        // SAFETY: `small_rx` is only this receive's until its completion.
        unsafe { n.recv_raw(small_rx.as_ptr(), SMALL, peer, SMALL_CTX) };
        let t0 = Instant::now();
        // SAFETY: `small_tx` is only read by sends; it outlives them.
        unsafe { n.send_raw(small_tx.as_ptr(), SMALL, peer, SMALL_CTX + 1) };
        sends += 1;
        n.spin_for(SMALL_CTX, &mut sends);
        if p >= 100 {
            one_way.push(us(t0.elapsed()) / 2.0);
        }
    }
    n.spin(sends, fail);
    drop(to_peer);
    let status = child.wait().expect("peer exit");
    if !status.success() {
        fail(&format!("peer process failed: {status}"));
    }

    let (first, tenth) = (singles[0], singles[SINGLES - 1]);
    let speedup = first.as_secs_f64() / tenth.as_secs_f64().max(1e-12);
    let (ipc, copy) = (median(&mut ipc_bw), median(&mut copy_bw));
    let p50 = median(&mut one_way);
    println!(
        "figure: 4 MiB device->device, 1st message {:.1} us, 10th {:.1} us: {speedup:.1}x \
         (goal: the 10th at least 10x faster) [{}]",
        us(first),
        us(tenth),
        met(speedup >= 10.0)
    );
    println!(
        "figure: 4 MiB device->device bandwidth, median of {} rounds of {WINDOW}: {ipc:.1} GB/s \
         over shm, {copy:.1} GB/s cuMemcpyAsync device to device here: {:.2}x (goal: at least \
         0.8x) [{}]",
        o.rounds,
        ipc / copy,
        met(ipc / copy >= 0.8)
    );
    println!(
        "figure: 8 B device->device one-way latency p50 {p50:.2} us over {} pings (goal: at most \
         10 us) [{}]",
        o.pings,
        met(p50 <= 10.0)
    );
}
