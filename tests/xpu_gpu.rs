//! The device API driven by GPU kernels (kernels/cuda/xfabric_xpu_kernels.cu through
//! `GpuXpuApi`): two endpoints of one process over the provider under test (shm by default),
//! their rings, counters' mirrors and buffers in mapped page-locked memory, the kernels posting
//! and waiting while host threads only drive progress and read the CQs:
//!
//! - `gpu_xpu_send_burst`: 4 blocks x 256 tagged sends of computed sizes and tags; the peer
//!   checks every tag, length and byte;
//! - `gpu_xpu_put_with_signal`: writes with remote CQ data; the peer's kernel waits on its
//!   exported remote-write counter and checks the bytes;
//! - `gpu_xpu_latency`: a kernel ping-pong of 8-byte tagged sends (each side waits on its
//!   exported receive counter): p50 of kernel send -> peer completion, as half a round trip;
//! - `gpu_xpu_rate`: one block posting 8-byte writes as fast as it can: descriptors/s.
//!
//! The GPU tests run only with a GPU (`XFABRIC_GPU_TESTS=1`, or `--ignored` where
//! scripts/gpu-pack.sh packed them); they print `FIGURE ...` lines that scripts/gpu-run.sh
//! collects. `cuda_double_pingpong_setup` runs the same setup and protocol on the CUDA double
//! with a CPU thread in the kernel's place, wherever the tests run.

#![cfg(feature = "cuda")]

mod common;

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::cuda_double::*;
use common::*;
use xfabric::hmem::HostMapped;
use xfabric::xpu::device as dev;
use xfabric::xpu::*;
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_TAGGED | FI_RMA | FI_TRIGGER | FI_XPU_TRIGGER;
const CUDA0: Xpu = Xpu {
    iface: Iface::Cuda,
    device: 0,
};
const DEADLINE: Duration = Duration::from_secs(60);

/// One side: a node with a receive counter and a remote-write counter bound.
struct Side {
    n: Node,
    rx: Counter,
    rw: Counter,
}

fn side(cq_size: usize) -> Side {
    let mut cntrs = None;
    let n = node_custom(
        CAPS,
        Progress::Manual,
        |i| i.domain_attr.mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY,
        cq_size,
        |d, ep| {
            let rx = d.cntr_open(&CntrAttr::default()).unwrap();
            let rw = d.cntr_open(&CntrAttr::default()).unwrap();
            ep.bind_cntr(&rx, FI_RECV).unwrap();
            ep.bind_cntr(&rw, FI_REMOTE_WRITE).unwrap();
            cntrs = Some((rx, rw));
        },
    );
    let (rx, rw) = cntrs.unwrap();
    Side { n, rx, rw }
}

/// Two sides that know each other: (a, b, a's address of b, b's address of a).
fn pair(cq_size: usize) -> (Side, Side, FiAddr, FiAddr) {
    let a = side(cq_size);
    let b = side(cq_size);
    let to_b = a.n.add_peer(&b.n.ep.getname().unwrap());
    let to_a = b.n.add_peer(&a.n.ep.getname().unwrap());
    (a, b, to_b, to_a)
}

/// `len` bytes of mapped page-locked memory, whose device address must be its host address
/// (unified addressing: descriptors carry it, and the host checks it against the region).
fn mapped(len: usize) -> HostMapped {
    let m = cuda().alloc_host_mapped(0, len).expect("mapped memory");
    assert_eq!(
        m.device_addr(),
        m.as_ptr() as u64,
        "unified addressing: a mapped allocation's device address is its host address"
    );
    m
}

/// Registers `m` on `n` with `access`: (region, its XPU descriptor).
fn register(n: &Node, m: &HostMapped, access: u64) -> (MemoryRegion, u64) {
    // SAFETY: `m` outlives the region (every caller drops the region first).
    let s = unsafe { std::slice::from_raw_parts(m.as_ptr(), m.len()) };
    // SAFETY: as above.
    let mr = unsafe { n.domain.mr_reg(s, access, 0, 0) }.expect("mr_reg");
    let desc = mr.get_xpu_desc().expect("get_xpu_desc");
    (mr, desc)
}

/// What a host thread driving one side saw.
#[derive(Default)]
struct Seen {
    ok: Vec<CqTaggedEntry>,
    errors: Vec<CqErrEntry>,
}

/// Drives both sides' progress (a thread each, reading their CQs) while `body` runs, until it
/// returns and each side has `want` completions (or an error, or the deadline): what each saw.
fn driven<T: Send>(
    a: &Side,
    b: &Side,
    want: (usize, usize),
    body: impl FnOnce() -> T + Send,
) -> (T, Seen, Seen) {
    let stop = AtomicBool::new(false);
    let count = [AtomicUsize::new(0), AtomicUsize::new(0)];
    let drive = |s: &Side, c: &AtomicUsize| {
        let mut seen = Seen::default();
        let mut buf = [CqTaggedEntry::default(); 64];
        let deadline = Instant::now() + DEADLINE;
        while !stop.load(Ordering::Acquire) && Instant::now() < deadline {
            match s.n.cq.read(&mut buf) {
                Ok(k) => {
                    seen.ok.extend_from_slice(&buf[..k]);
                    c.fetch_add(k, Ordering::Release);
                }
                Err(Error::Avail) => {
                    if let Ok(e) = s.n.cq.readerr() {
                        seen.errors.push(e);
                        c.fetch_add(1, Ordering::Release);
                    }
                }
                Err(Error::Again(_)) => {}
                Err(e) => panic!("cq read: {e}"),
            }
        }
        seen
    };
    std::thread::scope(|sc| {
        let ta = sc.spawn(|| drive(a, &count[0]));
        let tb = sc.spawn(|| drive(b, &count[1]));
        let r = body();
        let deadline = Instant::now() + DEADLINE;
        while (count[0].load(Ordering::Acquire) < want.0
            || count[1].load(Ordering::Acquire) < want.1)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, Ordering::Release);
        (r, ta.join().unwrap(), tb.join().unwrap())
    })
}

fn no_errors(who: &str, s: &Seen) {
    assert!(
        s.errors.is_empty(),
        "{who}: error completions {:?}",
        s.errors
    );
}

/// Percentile `p` (0..=100) of sorted `v`.
fn pct(v: &[i64], p: usize) -> i64 {
    v[(v.len() - 1) * p / 100]
}

/// The ping-pong's exports and receives: (A's endpoint, B's, A's receive counter, B's).
fn pingpong_setup(
    a: &Side,
    b: &Side,
    iters: usize,
    scratch: &HostMapped,
) -> (XpuEp, XpuEp, XpuCntr, XpuCntr) {
    let xa = a.n.ep.export_xpu(CUDA0).expect("export A");
    let xb = b.n.ep.export_xpu(CUDA0).expect("export B");
    let ra = a.rx.export_xpu(CUDA0).expect("export A's receive counter");
    let rb = b.rx.export_xpu(CUDA0).expect("export B's receive counter");
    // Every receive posted beforehand (8 bytes each, into scratch: the bytes are not checked).
    let p = scratch.as_ptr() as usize;
    for s in [a, b] {
        for i in 0..iters {
            // SAFETY: `scratch` outlives the receives (the sides close first).
            let buf = unsafe { std::slice::from_raw_parts_mut((p + 64) as *mut u8, 8) };
            s.n.retry(|| unsafe { s.n.ep.trecv(&mut *buf, None, FI_ADDR_UNSPEC, 1, 0, i) });
        }
    }
    (xa, xb, ra, rb)
}

/// The kernel's ping-pong, by a CPU thread through the same CUDA-exported handles, on the
/// double: the host side of `gpu_xpu_latency` checked wherever the tests run.
fn cpu_pingpong(
    handles: &(XpuEp, XpuEp, XpuCntr, XpuCntr),
    bufs: (u64, u64),
    descs: (u64, u64),
    peers: (u64, u64),
    iters: usize,
) -> Vec<i64> {
    let (xa, xb, ra, rb) = handles;
    let w = FI_XPU_WORK_ITEM;
    let send = |x: &XpuEp, buf: u64, desc: u64, peer: u64, i: usize| loop {
        match dev::tsend(x, buf as *const c_void, 8, desc, 0, peer, 1, i, 0, w) {
            0 => break,
            r if r == -errno::FI_EAGAIN => std::thread::yield_now(),
            r => panic!("tsend: {r}"),
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..iters {
                assert_eq!(
                    dev::cntr_wait(rb, i as u64 + 1, 10_000, w),
                    0,
                    "B's wait {i}"
                );
                send(xb, bufs.1, descs.1, peers.1, i);
            }
        });
        let mut rtt = Vec::with_capacity(iters);
        for i in 0..iters {
            let t0 = Instant::now();
            send(xa, bufs.0, descs.0, peers.0, i);
            assert_eq!(
                dev::cntr_wait(ra, i as u64 + 1, 10_000, w),
                0,
                "A's wait {i}"
            );
            rtt.push(t0.elapsed().as_nanos() as i64);
        }
        rtt
    })
}

fn pingpong_on_double() {
    let iters = 200;
    let (a, b, to_b, to_a) = pair(4096);
    let scratch = mapped(4096);
    let (mra, da) = register(&a.n, &scratch, FI_SEND | FI_RECV);
    let (mrb, db) = register(&b.n, &scratch, FI_SEND | FI_RECV);
    // As many receives as the GPU test posts: the provider takes them all.
    let h = pingpong_setup(&a, &b, 1000, &scratch);
    let peers = (
        a.n.av.get_xpu_addr(to_b).unwrap(),
        b.n.av.get_xpu_addr(to_a).unwrap(),
    );
    let base = scratch.as_ptr() as u64;
    let (rtt, sa, sb) = driven(&a, &b, (2 * iters, 2 * iters), || {
        cpu_pingpong(&h, (base, base + 8), (da, db), peers, iters)
    });
    no_errors("A", &sa);
    no_errors("B", &sb);
    assert_eq!(rtt.len(), iters);
    let mut r = rtt;
    r.sort_unstable();
    println!("double: round trip p50 {} us", pct(&r, 50) / 1000);
    drop((h, mra, mrb));
}

#[test]
fn cuda_double_pingpong_setup() {
    const NAME: &str = "cuda_double_pingpong_setup";
    match role().as_deref() {
        Some("run") => {
            pingpong_on_double();
            say("OK");
        }
        Some(r) => panic!("unknown role {r}"),
        None => run_child(NAME, "run", &double_env(), &[]),
    }
}

// ---- On a GPU ----

use xfabric::kernels::{burst_byte, burst_len, burst_tag, GpuXpu, GpuXpuApi};

fn gpu() -> (GpuXpu, GpuXpuApi) {
    let g = GpuXpu::open(0).unwrap_or_else(|e| panic!("{GPU_ENV}=1 but {e}"));
    let api = g.device_api().expect("device API kernels");
    println!("GPU 0: compute capability {:?}", g.compute_capability());
    (g, api)
}

#[test]
#[cfg_attr(
    not(xfabric_gpu_tests),
    ignore = "needs an NVIDIA GPU (and libnvrtc): run with XFABRIC_GPU_TESTS=1 cargo test"
)]
fn gpu_xpu_send_burst() {
    let (_g, api) = gpu();
    const BLOCKS: u32 = 4;
    const THREADS: u32 = 64;
    const PER: u32 = 256;
    const MAX: u32 = 256;
    let total = (BLOCKS * PER) as usize;
    let (a, b, to_b, _) = pair(8192);
    let x = a.n.ep.export_xpu(CUDA0).unwrap();
    let src = mapped(total * MAX as usize);
    let (mr, desc) = register(&a.n, &src, FI_SEND);
    let mut dst = vec![0u8; total * MAX as usize];
    let base = dst.as_mut_ptr() as usize;
    for i in 0..total {
        // SAFETY: `dst` outlives the receives (all completed below).
        let s = unsafe {
            std::slice::from_raw_parts_mut((base + i * MAX as usize) as *mut u8, MAX as usize)
        };
        b.n.retry(|| unsafe {
            b.n.ep
                .trecv(&mut *s, None, FI_ADDR_UNSPEC, burst_tag(i as u64), 0, i)
        });
    }
    let peer = a.n.av.get_xpu_addr(to_b).unwrap();
    let rc = api.alloc_out(BLOCKS as usize).unwrap();
    let t0 = Instant::now();
    let ((), sa, sb) = driven(&a, &b, (total, total), || {
        // SAFETY: `src` is registered under `desc`, alive until the sends completed (waited for
        // here); the handle lives.
        unsafe {
            api.send_burst(
                x.fid(),
                src.device_addr(),
                desc,
                peer,
                BLOCKS,
                THREADS,
                PER,
                MAX,
                &rc,
            )
        }
        .unwrap();
    });
    let took = t0.elapsed();
    let rcs = api.read_out(&rc).unwrap();
    assert!(rcs.iter().all(|&r| r == 0), "blocks' first errors: {rcs:?}");
    no_errors("sender", &sa);
    no_errors("receiver", &sb);
    assert_eq!(sa.ok.len(), total, "every send completed");
    assert_eq!(sb.ok.len(), total, "every message arrived");
    for e in &sb.ok {
        let i = e.op_context;
        let len = burst_len(i as u64, MAX);
        assert_eq!(e.tag, burst_tag(i as u64), "tag of {i}");
        assert_eq!(e.len, len, "length of {i}");
        let got = &dst[i * MAX as usize..][..len];
        assert!(
            got.iter()
                .enumerate()
                .all(|(k, &v)| v == burst_byte(i as u64, k as u64)),
            "bytes of message {i}"
        );
    }
    println!(
        "FIGURE send_burst: {total} tagged sends from {BLOCKS} blocks, all checked, in {took:?}"
    );
    drop(mr);
}

#[test]
#[cfg_attr(
    not(xfabric_gpu_tests),
    ignore = "needs an NVIDIA GPU (and libnvrtc): run with XFABRIC_GPU_TESTS=1 cargo test"
)]
fn gpu_xpu_put_with_signal() {
    let (_g, api) = gpu();
    const N: u32 = 64;
    const LEN: u32 = 4096;
    let bytes = (N * LEN) as usize;
    let (a, b, to_b, _) = pair(4096);
    let x = a.n.ep.export_xpu(CUDA0).unwrap();
    let signal = b.rw.export_xpu(CUDA0).unwrap();
    let src = mapped(bytes);
    let dst = mapped(bytes);
    let (mra, desc) = register(&a.n, &src, FI_WRITE);
    let (mrb, _) = register(&b.n, &dst, FI_REMOTE_WRITE);
    let peer = a.n.av.get_xpu_addr(to_b).unwrap();
    let out = api.alloc_out(5).unwrap();
    let ((), sa, sb) = driven(&a, &b, (N as usize, N as usize), || {
        // SAFETY: both regions registered and alive until the kernel and writes finished
        // (read_out below waits for the kernel; driven for the completions).
        unsafe {
            api.put_signal(
                x.fid(),
                src.device_addr(),
                desc,
                peer,
                dst.as_ptr() as u64,
                mrb.key(),
                N,
                LEN,
                FI_REMOTE_CQ_DATA | FI_DELIVERY_COMPLETE,
                signal.fid(),
                dst.device_addr(),
                &out,
            )
        }
        .unwrap();
    });
    let o = api.read_out(&out).unwrap();
    no_errors("initiator", &sa);
    no_errors("target", &sb);
    assert_eq!(o[0], 0, "the initiator's first error");
    assert_eq!(o[1], 0, "the target kernel's counter wait");
    assert_eq!(o[2], 0, "bytes that differ at the target");
    let mut data: Vec<u64> = sb.ok.iter().map(|e| e.data).collect();
    data.sort_unstable();
    assert_eq!(data, (0..N as u64).collect::<Vec<_>>(), "remote CQ data");
    println!(
        "FIGURE put_with_signal: {N} x {LEN} B writes, first post -> peer kernel's signal {} us",
        (o[4] - o[3]) / 1000
    );
    drop((mra, mrb));
}

#[test]
#[cfg_attr(
    not(xfabric_gpu_tests),
    ignore = "needs an NVIDIA GPU (and libnvrtc): run with XFABRIC_GPU_TESTS=1 cargo test"
)]
fn gpu_xpu_latency() {
    let (_g, api) = gpu();
    const ITERS: usize = 1000;
    const WARM: usize = 100;
    let (a, b, to_b, to_a) = pair(8192);
    let scratch = mapped(4096);
    let (mra, da) = register(&a.n, &scratch, FI_SEND | FI_RECV);
    let (mrb, db) = register(&b.n, &scratch, FI_SEND | FI_RECV);
    let h = pingpong_setup(&a, &b, ITERS, &scratch);
    let peers = (
        a.n.av.get_xpu_addr(to_b).unwrap(),
        b.n.av.get_xpu_addr(to_a).unwrap(),
    );
    let base = scratch.device_addr();
    let rtt = api.alloc_out(ITERS).unwrap();
    let out = api.alloc_out(2).unwrap();
    let ((), sa, sb) = driven(&a, &b, (2 * ITERS, 2 * ITERS), || {
        // SAFETY: scratch registered on both and alive; every receive posted; handles live.
        unsafe {
            api.pingpong(
                h.0.fid(),
                h.1.fid(),
                h.2.fid(),
                h.3.fid(),
                (base, base + 8),
                (da, db),
                peers,
                ITERS as u32,
                &rtt,
                &out,
            )
        }
        .unwrap();
    });
    let o = api.read_out(&out).unwrap();
    let mut r = api.read_out(&rtt).unwrap();
    no_errors("A", &sa);
    no_errors("B", &sb);
    assert_eq!(o, [0, 0], "A's and B's first errors");
    let mut r: Vec<i64> = r.drain(WARM..).collect();
    r.sort_unstable();
    assert!(r.iter().all(|&v| v > 0), "every round trip timed");
    println!(
        "FIGURE latency: 8 B kernel send -> peer completion (half a kernel round trip, {} rounds): \
         p50 {:.2} us, p90 {:.2} us, p99 {:.2} us (goal p50 <= 5 us)",
        r.len(),
        pct(&r, 50) as f64 / 2000.0,
        pct(&r, 90) as f64 / 2000.0,
        pct(&r, 99) as f64 / 2000.0
    );
    drop((h, mra, mrb));
}

#[test]
#[cfg_attr(
    not(xfabric_gpu_tests),
    ignore = "needs an NVIDIA GPU (and libnvrtc): run with XFABRIC_GPU_TESTS=1 cargo test"
)]
fn gpu_xpu_rate() {
    let (_g, api) = gpu();
    const N: u32 = 200_000;
    const THREADS: u32 = 256;
    let (a, b, to_b, _) = pair(16384);
    let x = a.n.ep.export_xpu_slots(CUDA0, 1 << 16).unwrap();
    let src = mapped(4096);
    let dst = mapped(4096);
    let (mra, desc) = register(&a.n, &src, FI_WRITE);
    let (mrb, _) = register(&b.n, &dst, FI_REMOTE_WRITE);
    let peer = a.n.av.get_xpu_addr(to_b).unwrap();
    let out = api.alloc_out(3).unwrap();
    let t0 = Instant::now();
    let ((), sa, _) = driven(&a, &b, (N as usize, 0), || {
        // SAFETY: both regions registered, alive until every write completed (driven waits).
        unsafe {
            api.rate(
                x.fid(),
                src.device_addr(),
                desc,
                peer,
                dst.as_ptr() as u64,
                mrb.key(),
                N,
                THREADS,
                &out,
            )
        }
        .unwrap();
    });
    let wall = t0.elapsed();
    let o = api.read_out(&out).unwrap();
    no_errors("initiator", &sa);
    assert_eq!(o[2], 0, "the block's first error");
    assert_eq!(sa.ok.len(), N as usize, "every write completed");
    let posted = f64::from(N) / (o[0] as f64 / 1e9);
    let done = f64::from(N) / wall.as_secs_f64();
    println!(
        "FIGURE rate: one block of {THREADS} threads posted {N} descriptors at {:.2} M/s \
         ({} full-ring answers; ring of 65536); completed end to end at {:.2} M/s (goal >= 2 M/s)",
        posted / 1e6,
        o[1],
        done / 1e6
    );
    drop((mra, mrb));
}
