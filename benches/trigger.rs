//! What triggered operations cost, through the shm provider in one process:
//!
//! - `trigger_arm_fire/cntr_add/<depth>`: queue one deferred `FI_OP_CNTR_ADD` and move its
//!   counter past the threshold: the machinery alone (queue, wake, start), with `depth`
//!   other operations waiting on the same counter at thresholds never reached.
//! - `trigger_send/{send,triggered}`: post a receive, start a 64-byte send (plainly, or armed on
//!   a counter then released by `fi_cntr_add`), and reap both completions, on one thread; the
//!   difference is the cost of arming and firing a send.
//! - `trigger_latency` (a table of percentiles, not a criterion group): from the moment the
//!   sending thread calls `fi_send` (or `fi_cntr_add` on the counter an armed send waits for)
//!   to the moment the receiving thread, spinning on its CQ on the other core, sees the
//!   message; plain and triggered rounds alternate.
//!
//! ```text
//! cargo bench --bench trigger
//! ```

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use xfabric::*;

/// An endpoint and its CQ; the endpoint is declared first so it drops before the CQ.
struct Side {
    ep: Endpoint,
    cq: CompletionQueue,
    _av: AddressVector,
}

struct Pair {
    tx: Side,
    rx: Side,
    to_rx: FiAddr,
    domain: Domain,
}

fn pair() -> Pair {
    let mut hints = Info {
        caps: FI_MSG | FI_TRIGGER,
        ..Default::default()
    };
    hints.fabric_attr.prov_name = Some("shm".into());
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.domain_attr.data_progress = Progress::Manual;
    // The latency table pre-posts more receives than a CQ holds (it reaps every entry as it
    // comes); with FI_RM_ENABLED each would reserve an entry and the posts be refused.
    hints.domain_attr.resource_mgmt = ResourceMgmt::Disabled;
    let info = getinfo(fi_version(1, 17), None, None, 0, Some(&hints)).expect("getinfo")[0].clone();
    let fabric = xfabric::fabric(&info.fabric_attr).expect("fabric");
    let domain = fabric.domain(&info).expect("domain");
    let side = || {
        let cq = domain
            .cq_open(&CqAttr {
                format: CqFormat::Tagged,
                size: 4096,
                ..Default::default()
            })
            .expect("cq");
        let av = domain.av_open(&AvAttr::default()).expect("av");
        let ep = domain.endpoint(&info).expect("endpoint");
        ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).expect("bind cq");
        ep.bind_av(&av).expect("bind av");
        ep.enable().expect("enable");
        Side { ep, cq, _av: av }
    };
    let (tx, rx) = (side(), side());
    let to_rx = tx._av.insert_one(&rx.ep.getname().unwrap()).unwrap();
    Pair {
        tx,
        rx,
        to_rx,
        domain,
    }
}

fn reap(cq: &CompletionQueue) -> usize {
    let mut buf = [CqTaggedEntry::default(); 4];
    match cq.read(&mut buf) {
        Ok(n) => n,
        Err(Error::Again(_)) => 0,
        Err(e) => panic!("cq: {e} {:?}", cq.readerr()),
    }
}

fn msg(iov: &[RawIov], addr: FiAddr) -> Msg<'_> {
    Msg {
        iov,
        desc: &[],
        addr,
        context: 0,
        data: 0,
        tag: 0,
        ignore: 0,
    }
}

fn arm_fire(c: &mut Criterion) {
    let mut g = c.benchmark_group("trigger_arm_fire");
    g.throughput(Throughput::Elements(1));
    let p = pair();
    for depth in [0u64, 1_000, 100_000] {
        let trig = p.domain.cntr_open(&CntrAttr::default()).unwrap();
        let sink = p.domain.cntr_open(&CntrAttr::default()).unwrap();
        let add = |threshold| DeferredWork {
            threshold,
            triggering_cntr: &trig,
            completion_cntr: None,
            op: WorkOp::CntrAdd(OpCntr {
                cntr: &sink,
                value: 1,
            }),
        };
        for _ in 0..depth {
            // SAFETY: counter operations name no buffers.
            unsafe { p.domain.queue_work(&add(u64::MAX)) }.unwrap();
        }
        g.bench_with_input(BenchmarkId::new("cntr_add", depth), &depth, |b, _| {
            b.iter(|| {
                let next = trig.read() + 1;
                // SAFETY: as above.
                unsafe { p.domain.queue_work(&add(next)) }.unwrap();
                trig.add(1).unwrap();
            })
        });
        assert_eq!(sink.read(), trig.read());
        p.domain.flush_work(Some(&trig)).unwrap();
    }
}

fn send_cost(c: &mut Criterion) {
    let mut g = c.benchmark_group("trigger_send");
    g.throughput(Throughput::Elements(1));
    let p = pair();
    let out = [7u8; 64];
    let mut inb = [0u8; 64];
    let cntr = p.domain.cntr_open(&CntrAttr::default()).unwrap();
    for triggered in [false, true] {
        let name = if triggered { "triggered" } else { "send" };
        g.bench_function(name, |b| {
            b.iter(|| {
                let iov = [RawIov::of(&out)];
                // SAFETY: both buffers outlive the operations, which complete in this
                // iteration (both completions are reaped below).
                unsafe {
                    p.rx.ep.recv(&mut inb, None, FI_ADDR_UNSPEC, 1).unwrap();
                    if triggered {
                        let t = TriggerContext::threshold(&cntr, cntr.read() + 1);
                        p.tx.ep
                            .sendmsg_triggered(&msg(&iov, p.to_rx), 0, &t)
                            .unwrap();
                        cntr.add(1).unwrap();
                    } else {
                        p.tx.ep.sendmsg(&msg(&iov, p.to_rx), 0).unwrap();
                    }
                }
                let (mut got_rx, mut got_tx) = (0, 0);
                while got_rx == 0 || got_tx == 0 {
                    got_rx += reap(&p.rx.cq);
                    got_tx += reap(&p.tx.cq);
                }
                black_box(&inb);
            })
        });
    }
}

/// One message's latency: from the sending thread's `fi_send` (or its `fi_cntr_add` on the
/// counter an armed send waits for) to the receiving thread, spinning on its CQ on the other
/// core, seeing the completion.
fn one_latency(
    p: &Pair,
    cntr: &Counter,
    triggered: bool,
    seen: &AtomicU64,
    at: &Mutex<Instant>,
) -> Duration {
    let out = [7u8; 64];
    let iov = [RawIov::of(&out)];
    let before = seen.load(Ordering::Acquire);
    let t0 = if triggered {
        let t = TriggerContext::threshold(cntr, cntr.read() + 1);
        // SAFETY: `out` outlives the send: its completion is reaped before returning.
        unsafe { p.tx.ep.sendmsg_triggered(&msg(&iov, p.to_rx), 0, &t) }.unwrap();
        let t0 = Instant::now();
        cntr.add(1).unwrap();
        t0
    } else {
        let t0 = Instant::now();
        // SAFETY: as above.
        unsafe { p.tx.ep.sendmsg(&msg(&iov, p.to_rx), 0) }.unwrap();
        t0
    };
    while seen.load(Ordering::Acquire) == before {
        std::hint::spin_loop();
    }
    let d = *at.lock().unwrap() - t0;
    while reap(&p.tx.cq) == 0 {}
    d
}

/// Latency percentiles of plain and triggered sends, measured in alternating rounds (this
/// machine is noisy, so the two are compared side by side), printed as a table.
fn latency_table() {
    const ROUNDS: usize = 10;
    const PER_ROUND: usize = 2_000;
    let p = pair();
    let cntr = p.domain.cntr_open(&CntrAttr::default()).unwrap();
    let mut inb = vec![[0u8; 64]; 2 * ROUNDS * PER_ROUND];
    for buf in inb.iter_mut() {
        // SAFETY: `inb` outlives the receives: all of them complete before it is dropped.
        unsafe { p.rx.ep.recv(buf, None, FI_ADDR_UNSPEC, 1) }.unwrap();
    }
    let seen = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let at = Mutex::new(Instant::now());
    let mut lat = [Vec::new(), Vec::new()];
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Acquire) {
                if reap(&p.rx.cq) > 0 {
                    *at.lock().unwrap() = Instant::now();
                    seen.fetch_add(1, Ordering::Release);
                }
            }
        });
        for _ in 0..ROUNDS {
            for (k, triggered) in [false, true].into_iter().enumerate() {
                for _ in 0..PER_ROUND {
                    lat[k].push(one_latency(&p, &cntr, triggered, &seen, &at));
                }
            }
        }
        stop.store(true, Ordering::Release);
    });
    println!("trigger_latency: counter update (or send) -> delivery seen by the peer thread, 64 B");
    for (k, name) in ["send", "triggered"].into_iter().enumerate() {
        let v = &mut lat[k];
        v.sort();
        let q = |f: f64| v[((v.len() - 1) as f64 * f) as usize];
        println!(
            "  {name:>9}: p50 {:>8?}  p90 {:>8?}  p99 {:>8?}  ({} messages)",
            q(0.5),
            q(0.9),
            q(0.99),
            v.len()
        );
    }
}

criterion_group!(benches, arm_fire, send_cost);

fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    if filter
        .as_deref()
        .is_none_or(|f| "trigger_latency".contains(f))
    {
        latency_table();
    }
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
