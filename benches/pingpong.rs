//! Round trips through a provider (shm, or the one `XFABRIC_BENCH_PROVIDER` names: tcp runs
//! over loopback) between two endpoints of one process, driven by one thread that alternates
//! between them. Nothing waits on another core, so the cost measured is
//! the software path alone (post, progress, completion), and an instruction count from
//! callgrind is repeatable:
//!
//! ```text
//! cargo bench --bench pingpong
//! cargo bench --bench pingpong --no-run        # then, with the binary it names:
//! valgrind --tool=callgrind --toggle-collect='*round_trip*' \
//!     target/release/deps/pingpong-HASH --bench --profile-time 2 shm_round_trip/send/8
//! callgrind_annotate callgrind.out.*     # Ir / calls of round_trip = instructions per trip
//! ```
//!
//! `--profile-time` runs each benchmark for that long without analysis, which is what a
//! profiler wants.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use xfabric::*;

const RX: Context = 1;
const TX: Context = 2;

/// One endpoint, its CQ and AV, and the other endpoint's address in that AV. The endpoint is
/// declared first so it drops before the queues it is bound to.
struct Side {
    ep: Endpoint,
    cq: CompletionQueue,
    av: AddressVector,
    peer: FiAddr,
    rx: Vec<u8>,
    tx: Vec<u8>,
}

struct Pair {
    a: Side,
    b: Side,
    _domain: Domain,
    _fabric: Fabric,
}

/// The provider measured: `XFABRIC_BENCH_PROVIDER`, shm by default.
fn provider() -> String {
    std::env::var("XFABRIC_BENCH_PROVIDER").unwrap_or_else(|_| "shm".into())
}

fn open_pair(size: usize) -> Pair {
    let mut hints = Info {
        caps: FI_MSG,
        ..Default::default()
    };
    hints.fabric_attr.prov_name = Some(provider());
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.domain_attr.data_progress = Progress::Manual;
    let info = getinfo(fi_version(1, 17), None, None, 0, Some(&hints))
        .expect("getinfo: the provider with FI_MSG, RDM, manual progress")
        .swap_remove(0);
    let fabric = xfabric::fabric(&info.fabric_attr).expect("fabric");
    let domain = fabric.domain(&info).expect("domain");
    let side = || {
        let cq = domain
            .cq_open(&CqAttr {
                format: CqFormat::Msg,
                wait_obj: WaitObj::None,
                size: 64,
                ..Default::default()
            })
            .expect("cq_open");
        let av = domain.av_open(&AvAttr::default()).expect("av_open");
        let ep = domain.endpoint(&info).expect("endpoint");
        ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).expect("bind cq");
        ep.bind_av(&av).expect("bind av");
        ep.enable().expect("enable");
        Side {
            ep,
            cq,
            av,
            peer: FI_ADDR_UNSPEC,
            rx: vec![0u8; size],
            tx: vec![0x5a; size],
        }
    };
    let (mut a, mut b) = (side(), side());
    a.peer = a.av.insert_one(&b.ep.getname().unwrap()).expect("insert b");
    b.peer = b.av.insert_one(&a.ep.getname().unwrap()).expect("insert a");
    a.post_recv();
    b.post_recv();
    Pair {
        a,
        b,
        _domain: domain,
        _fabric: fabric,
    }
}

impl Side {
    fn post_recv(&mut self) {
        // SAFETY: `rx` is owned by this side, is not touched until the receive's completion is
        // read, and the endpoint (dropped first) never outlives it.
        unsafe { self.ep.recv(&mut self.rx, None, self.peer, RX) }.expect("recv");
    }

    /// Sends `tx` to the peer; returns whether a send completion will follow.
    fn send(&self, inject: bool) -> bool {
        if inject {
            self.ep.inject(&self.tx, self.peer).expect("inject");
            false
        } else {
            // SAFETY: `tx` is never written after setup, and this send's completion is read
            // (`finish`) before the next round trip posts another.
            unsafe { self.ep.send(&self.tx, None, self.peer, TX) }.expect("send");
            true
        }
    }

    /// One CQ read (driving this side's progress); counts receives and sends completed.
    fn poll(&self, rx: &mut usize, tx: &mut usize) {
        let mut e = [CqMsgEntry::default(); 4];
        match self.cq.read(&mut e) {
            Ok(n) => {
                for c in &e[..n] {
                    match c.op_context {
                        RX => *rx += 1,
                        TX => *tx += 1,
                        other => panic!("completion with unknown context {other}"),
                    }
                }
            }
            Err(Error::Again(_)) => {}
            Err(Error::Avail) => panic!("error completion: {:?}", self.cq.readerr()),
            Err(e) => panic!("cq read: {e}"),
        }
    }
}

/// Polls both sides, alternately, until `to` has its receive and `from` its send completion
/// (when one was asked for). Both must be polled: a large message may need the sender's
/// progress as well as the receiver's.
fn finish(from: &Side, to: &Side, want_tx: bool) {
    let (mut rx, mut tx, mut ignored) = (0, 0, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut spins = 0u32;
    while rx == 0 || (want_tx && tx == 0) {
        to.poll(&mut rx, &mut ignored);
        from.poll(&mut ignored, &mut tx);
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(65536) {
            assert!(
                Instant::now() < deadline,
                "round trip stuck (rx {rx}, tx {tx})"
            );
        }
    }
    assert_eq!(ignored, 0, "a completion arrived on the wrong side");
}

/// One round trip: a to b, then b to a, each receive reposted as it completes. Never inlined, so
/// callgrind can count it alone (`--toggle-collect='*round_trip*'`).
#[inline(never)]
fn round_trip(p: &mut Pair, inject: bool) {
    let t = p.a.send(inject);
    finish(&p.a, &p.b, t);
    p.b.post_recv();
    let t = p.b.send(inject);
    finish(&p.b, &p.a, t);
    p.a.post_recv();
    black_box(&p.a.rx);
}

fn provider_round_trip(c: &mut Criterion) {
    let mut g = c.benchmark_group(format!("{}_round_trip", provider()));
    for (kind, size) in [
        ("inject", 8usize),
        ("send", 8),
        ("send", 256),
        ("send", 4096),
        ("send", 64 << 10),
    ] {
        let mut pair = open_pair(size);
        // Both directions' bytes, as fi_pingpong counts them.
        g.throughput(Throughput::Bytes(2 * size as u64));
        g.bench_with_input(BenchmarkId::new(kind, size), &size, |bch, _| {
            bch.iter(|| round_trip(&mut pair, kind == "inject"))
        });
    }
    g.finish();
}

/// One CQ read that finds nothing, a receive posted and the peers connected (after a round
/// trip, as in a ping-pong between messages): what a side waiting for a message repeats,
/// so its length adds to the latency of every message that arrives while it runs. Never
/// inlined, so callgrind can count it alone (`--toggle-collect='*idle_poll*'`).
#[inline(never)]
fn idle_poll(p: &Pair) {
    let (mut rx, mut tx) = (0, 0);
    p.a.poll(&mut rx, &mut tx);
    assert_eq!(rx + tx, 0, "a completion with nothing sent");
}

fn provider_idle_poll(c: &mut Criterion) {
    let mut pair = open_pair(8);
    round_trip(&mut pair, false);
    c.bench_function(&format!("{}_idle_poll", provider()), |bch| {
        bch.iter(|| idle_poll(&pair))
    });
}

criterion_group!(benches, provider_round_trip, provider_idle_poll);
criterion_main!(benches);
