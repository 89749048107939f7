//! A descriptor ring driven as a GPU kernel drives it (`xf_xpu_rate` in
//! kernels/cuda/xfabric_xpu_kernels.cu): many threads of one device reserving positions at
//! once, the slot's words written with plain stores and `seq` last, nobody told (no
//! `tx_flush`, no wake), a ring of 65,536 slots filled and drained past several wraps, the
//! watcher (manual progress) draining it only when it is full, as a watcher slower than a GPU
//! would.
//!
//! The producers' read-modify-writes are a GPU's on mapped host memory over PCIe, which has
//! no native host atomics on the machines the GPU tests run on (`hostNativeAtomicSupported`
//! 0): atomic among the device's own threads, but, as the host sees them, a read and then a
//! write. libcu++ forbids CPU and GPU threads from both atomically updating such a word; a
//! protocol in which the host and the device both read-modify-write one word loses the host's
//! updates that land between the device's read and its write.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::abi::*;
use super::ring::{self, ProducerRmw};
use crate::consts::errno::FI_EAGAIN;
use crate::consts::*;
use crate::cq::CqAttr;
use crate::entry::CqTaggedEntry;
use crate::trigger::testkit::{World, FAKE_GPU, XPU_CAPS};

/// A GPU's atomics on host memory across PCIe: serialized among the device's threads (one
/// lock), each a read then a write to the host, with the bus's round trip between them, in
/// which the host's own atomic updates of the word may land (and are then overwritten).
struct PcieRmw {
    device: Mutex<()>,
}

impl ProducerRmw for PcieRmw {
    fn fetch_add(&self, w: &AtomicU64, v: u64) -> u64 {
        let _one_at_a_time = self.device.lock().unwrap_or_else(|e| e.into_inner());
        let old = w.load(Ordering::Acquire);
        // The read's round trip: ~1 us on PCIe; here, a chance for the host to run.
        for _ in 0..64 {
            std::hint::spin_loop();
        }
        std::thread::yield_now();
        w.store(old.wrapping_add(v), Ordering::Release);
        old
    }
}

/// Threads of the "block" (256 on the GPU; enough here to keep many reservations in flight).
const THREADS: usize = 8;
/// Descriptors in all: three laps of the ring and more.
const TOTAL: usize = 200_000;
const SLOTS: usize = 1 << 16;
/// `-FI_EAGAIN` answers after the watcher found the ring empty, with nothing posted since,
/// that prove the device is told "full" about an empty ring (a ring with room answers none:
/// at most the reservations in flight when it emptied can still see it full).
const STUCK: usize = 20_000;

#[test]
fn a_gpu_block_fills_a_ring_of_65536_past_its_wraps_and_never_sees_an_empty_ring_full() {
    let w = World::new();
    w.sh.inline.store(true, Ordering::Release);
    let mut info = w.domain.info().clone();
    info.caps = XPU_CAPS;
    let ep = w.domain.endpoint(&info).unwrap();
    let cq = w
        .domain
        .cq_open(&CqAttr {
            format: CqFormat::Tagged,
            size: TOTAL + 16,
            ..Default::default()
        })
        .unwrap();
    let av = w.domain.av_open(&crate::av::AvAttr::default()).unwrap();
    av.insert_one(b"peer").unwrap();
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
    ep.bind_av(&av).unwrap();
    ep.enable().unwrap();
    let x = ep.export_xpu_slots(FAKE_GPU, SLOTS).unwrap();
    let buf = vec![0u8; 64];
    let key = 0x7777;
    // SAFETY: `buf` outlives the region (dropped at the end of the test, after it).
    let mr = unsafe { w.domain.mr_reg(&buf, FI_SEND | FI_WRITE, 0, key) }.unwrap();
    let desc = mr.get_xpu_desc().unwrap();
    let peer = av.get_xpu_addr(0).unwrap();
    let addr = buf.as_ptr() as u64;

    let ring = x.ring();
    let rmw = PcieRmw {
        device: Mutex::new(()),
    };
    let next = AtomicUsize::new(0);
    let again = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut stuck = None;
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                // As the kernel: descriptor i goes to whichever thread takes it next; each
                // retries `-FI_EAGAIN`.
                let mut i = next.fetch_add(1, Ordering::Relaxed);
                while i < TOTAL && !stop.load(Ordering::Acquire) {
                    let pos = match ring::reserve(ring.header(), ring.header().mask, &rmw) {
                        Ok(pos) => pos,
                        Err(e) => {
                            assert_eq!(e.errno(), -FI_EAGAIN);
                            again.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    };
                    let d = XpuDesc {
                        opcode: opcode::WRITE,
                        check: pos as u32 + 1,
                        len: 8,
                        buf: addr,
                        desc,
                        peer,
                        context: i as u64 + 1,
                        raddr: 0x1000 + 8 * i as u64,
                        rkey: 1,
                        ..Default::default()
                    };
                    // Plain stores through the host's view of the mapped memory, seq last.
                    let slot = ring.slot(pos);
                    for (k, v) in d.to_words().into_iter().enumerate().skip(1) {
                        slot.0[k].store(v, Ordering::Relaxed);
                    }
                    slot.0[0].store(pos + 1, Ordering::Release);
                    i = next.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        // The watcher: waits for a full ring (or the last descriptors), drains it empty.
        let h = ring.header();
        let mut taken = 0;
        let mut again_seen = 0;
        while taken < TOTAL {
            assert!(Instant::now() < deadline, "{taken} of {TOTAL} taken");
            let tail = h.tail.load(Ordering::Acquire);
            let waiting = tail.saturating_sub(ring.head()) as usize;
            // Drained when full, at the end, or when the producers are told "full" (a ring
            // whose free count went wrong says so before it is).
            let told_full = again.load(Ordering::Relaxed) > again_seen + 1000;
            if waiting < SLOTS && taken + waiting < TOTAL && !told_full {
                std::thread::yield_now();
                continue;
            }
            again_seen = again.load(Ordering::Relaxed);
            while ep.progress() > 0 {}
            taken = ring.head() as usize;
            if ring.head() == h.tail.load(Ordering::Acquire) && taken < TOTAL {
                // Empty: the producers must find room now.
                let seen = again.load(Ordering::Relaxed);
                let tail = h.tail.load(Ordering::Acquire);
                while h.tail.load(Ordering::Acquire) == tail
                    && again.load(Ordering::Relaxed) - seen < STUCK
                    && Instant::now() < deadline
                {
                    std::thread::yield_now();
                }
                if h.tail.load(Ordering::Acquire) == tail {
                    stuck = Some((taken, again.load(Ordering::Relaxed) - seen));
                    stop.store(true, Ordering::Release);
                    break;
                }
                again_seen = again.load(Ordering::Relaxed);
            }
        }
    });
    if let Some((taken, n)) = stuck {
        panic!(
            "the ring is empty (all {taken} descriptors posted so far taken) and the device was \
             answered -FI_EAGAIN {n} times since: the GPU's block stalls (tail {}, claimed {}, \
             head {})",
            ring.header().tail.load(Ordering::Acquire),
            ring.header().claimed.load(Ordering::Acquire),
            ring.header().head.load(Ordering::Acquire),
        );
    }
    // Every descriptor started once, as the host's write would be, and completed.
    let mut ctxs = w.sh.ctxs();
    assert_eq!(ctxs.len(), TOTAL);
    ctxs.sort_unstable();
    assert!(ctxs.iter().enumerate().all(|(i, c)| *c == i + 1));
    let mut n = 0;
    let mut entries = [CqTaggedEntry::default(); 256];
    while let Ok(k) = cq.read(&mut entries) {
        n += k;
    }
    assert_eq!(n, TOTAL);
    assert!(cq.readerr().is_err(), "no error entry");
    drop(x);
    drop(mr);
}
