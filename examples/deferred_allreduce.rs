//! Allreduce (sum) of a vector of u64 across 4 processes by recursive doubling, built only
//! from deferred work: once the requests are queued, no process's host code does anything but
//! wait for the result; every step starts on a counter.
//!
//! Each rank r owns two target buffers, S1 and S2, each behind its own endpoint (ep0, ep1)
//! whose remote-write counter (rw0, rw1) counts the atomics that land there.
//!
//! - Step 0 (threshold 0: starts when queued): r atomically adds its input into S1 of its
//!   partner r^1 and into its own S1 (through ep0 to their ep0s).
//! - Step 1 (triggered by rw0 reaching 2 x chunks, i.e. S1 complete): r adds S1 into S2 of
//!   r^2 and into its own S2 (through ep1 to their ep1s).
//! - rw1 reaching 2 x chunks means S2 holds the sum of all four inputs.
//!
//! Separate endpoints per step keep the counters apart: a fast partner's step-1 atomics may
//! arrive before a slow partner's step-0 ones.
//!
//! ```text
//! cargo run --release --example deferred_allreduce [-- <elements>]
//! ```

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

use xfabric::*;

mod common;
use common::{hex, unhex};

const RANKS: usize = 4;
/// u64 elements per atomic request.
const CHUNK: usize = ATOMIC_MAX / 8;
/// Each rank holds three vectors of this many u64s.
const MAX_ELEMENTS: usize = 1 << 27;
const RANK_ENV: &str = "XF_ALLREDUCE_RANK";

/// Allreduce (sum) across 4 processes built only from counter-triggered deferred work.
#[derive(clap::Parser, Debug)]
#[command(name = "deferred_allreduce")]
struct Args {
    /// u64 elements in the vector
    #[arg(default_value_t = 1 << 16, value_parser = common::args::positive)]
    elements: usize,
}

fn main() {
    let len = common::args::parse::<Args>().elements;
    if len > MAX_ELEMENTS {
        common::die(&format!("{len} elements: at most {MAX_ELEMENTS}"));
    }
    match std::env::var(RANK_ENV) {
        Ok(r) => match r.parse::<usize>() {
            Ok(r) if r < RANKS => rank_main(r, len),
            _ => common::die(&format!("{RANK_ENV}={r:?} is not a rank below {RANKS}")),
        },
        Err(_) => launch(len),
    }
}

/// Starts the ranks, passes every rank's addresses to all of them, and reports.
fn launch(len: usize) {
    let exe = std::env::current_exe().expect("current_exe");
    let mut kids: Vec<_> = (0..RANKS)
        .map(|r| {
            let mut c = Command::new(&exe)
                .arg(len.to_string())
                .env(RANK_ENV, r.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn rank");
            let out = BufReader::new(c.stdout.take().expect("stdout"));
            (c, out)
        })
        .collect();
    let line = |out: &mut BufReader<_>| {
        let mut s = String::new();
        out.read_line(&mut s).expect("read from rank");
        s.trim_end().to_string()
    };
    let addrs: Vec<String> = kids.iter_mut().map(|(_, o)| line(o)).collect();
    let all = addrs.join(" ");
    for (c, _) in &mut kids {
        let stdin = c.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{all}").expect("write to rank");
    }
    let reports: Vec<String> = kids.iter_mut().map(|(_, o)| line(o)).collect();
    // Every rank has its result: now they may go.
    for (c, _) in &mut kids {
        let stdin = c.stdin.as_mut().expect("stdin");
        writeln!(stdin, "bye").expect("write to rank");
    }
    let mut ok = true;
    for (r, ((c, _), report)) in kids.iter_mut().zip(&reports).enumerate() {
        println!("rank {r}: {report}");
        ok &= report.starts_with("ok") && c.wait().expect("wait").success();
    }
    assert!(ok, "a rank failed");
    println!("allreduce of {len} u64 across {RANKS} processes: exact sum on every rank");
}

/// One rank's endpoint pair, counters and buffers.
struct Rank {
    domain: Domain,
    av: AddressVector,
    eps: [Endpoint; 2],
    rw: [Counter; 2],
    _cq: CompletionQueue,
}

fn open(rank: usize) -> Rank {
    let mut hints = Info {
        caps: FI_ATOMIC | FI_RMA_EVENT | FI_TRIGGER,
        ..Default::default()
    };
    hints.fabric_attr.prov_name = Some("shm".into());
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.domain_attr.data_progress = Progress::Auto;
    let info = getinfo(fi_version(1, 17), None, None, 0, Some(&hints)).expect("getinfo")[0].clone();
    let fabric = xfabric::fabric(&info.fabric_attr).expect("fabric");
    let domain = fabric.domain(&info).expect("domain");
    let cq = domain
        .cq_open(&CqAttr {
            format: CqFormat::Tagged,
            ..Default::default()
        })
        .expect("cq");
    let av = domain.av_open(&AvAttr::default()).expect("av");
    let mk = || {
        let ep = domain.endpoint(&info).expect("endpoint");
        let rw = domain.cntr_open(&CntrAttr::default()).expect("cntr");
        ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).expect("bind cq");
        ep.bind_av(&av).expect("bind av");
        ep.bind_cntr(&rw, FI_REMOTE_WRITE).expect("bind cntr");
        ep.enable().expect("enable");
        (ep, rw)
    };
    let (e0, r0) = mk();
    let (e1, r1) = mk();
    let _ = rank;
    Rank {
        domain,
        av,
        eps: [e0, e1],
        rw: [r0, r1],
        _cq: cq,
    }
}

fn bytes(v: &[u64]) -> &[u8] {
    // SAFETY: any u64 slice is a valid byte slice of eight times its length.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

fn rank_main(rank: usize, len: usize) {
    let input: Vec<u64> = (0..len as u64)
        .map(|i| (rank as u64 + 1) * 1_000_000 + i)
        .collect();
    let s1 = vec![0u64; len];
    let s2 = vec![0u64; len];
    let me = open(rank);
    // SAFETY: `s1` and `s2` outlive their registrations (dropped at the end of this
    // function, after the regions); peers only add into them, through atomics.
    let (_mr1, _mr2) = unsafe {
        (
            me.domain
                .mr_reg(bytes(&s1), FI_REMOTE_WRITE, 0, 1)
                .expect("mr s1"),
            me.domain
                .mr_reg(bytes(&s2), FI_REMOTE_WRITE, 0, 2)
                .expect("mr s2"),
        )
    };
    println!(
        "{} {}",
        hex(&me.eps[0].getname().unwrap()),
        hex(&me.eps[1].getname().unwrap())
    );
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("peers");
    let raw: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(raw.len(), 2 * RANKS);
    // fi_addr of (rank, endpoint).
    let addr: Vec<FiAddr> = raw
        .iter()
        .map(|a| me.av.insert_one(&unhex(a)).expect("av insert"))
        .collect();
    let at = |r: usize, e: usize| addr[2 * r + e];

    let chunks = len.div_ceil(CHUNK);
    let go = me.domain.cntr_open(&CntrAttr::default()).expect("cntr");
    let sent = me.domain.cntr_open(&CntrAttr::default()).expect("cntr");
    let start = Instant::now();
    // Step 0 from `input`, step 1 from `s1`: into the partner's and our own next buffer.
    let steps: [(&[u64], &Counter, u64, u64); 2] =
        [(&input, &go, 0, 1), (&s1, &me.rw[0], 2 * chunks as u64, 2)];
    for (step, (src, trig, threshold, key)) in steps.into_iter().enumerate() {
        for target in [rank ^ (1 << step), rank] {
            for c in 0..chunks {
                let lo = c * CHUNK;
                let n = CHUNK.min(len - lo);
                let work = DeferredWork {
                    threshold,
                    triggering_cntr: trig,
                    completion_cntr: Some(&sent),
                    op: WorkOp::Atomic(OpAtomic {
                        ep: &me.eps[step],
                        msg: MsgAtomic {
                            addr: at(target, step),
                            rma_addr: (lo * 8) as u64,
                            key,
                            datatype: Datatype::UInt64,
                            op: AtomicOp::Sum,
                            context: 0,
                        },
                        operand: RawIov {
                            addr: src[lo..].as_ptr() as usize,
                            len: n * 8,
                        },
                        count: n,
                        flags: 0,
                    }),
                };
                // SAFETY: `input` and `s1` outlive the work (this function waits for all of
                // it below); `s1` is only read once the counter says it is complete.
                unsafe { me.domain.queue_work(&work) }.expect("queue_work");
            }
        }
    }
    let posted = start.elapsed();
    // From here on the host only waits: the domain's progress thread runs every step.
    let done = 2 * chunks as u64;
    let r = me.rw[1].wait(done, 30_000);
    let all = start.elapsed();
    let sent_ok = sent.wait(4 * chunks as u64, 30_000);
    let expect = |i: usize| 10_000_000 + 4 * i as u64;
    // SAFETY: every atomic into `s2` has landed (rw1 counted them all); nothing writes it now.
    let got: Vec<u64> = (0..len)
        .map(|i| unsafe { std::ptr::read_volatile(s2.as_ptr().add(i)) })
        .collect();
    let bad = (0..len).find(|&i| got[i] != expect(i));
    match (r, sent_ok, bad) {
        (Ok(()), Ok(()), None) => println!(
            "ok: {} requests queued in {posted:?}; sum complete {all:?} after queueing began",
            4 * chunks
        ),
        (r, s, bad) => println!(
            "FAILED: wait {r:?}, sends {s:?} ({} of {}), first wrong element {bad:?}",
            sent.read(),
            4 * chunks
        ),
    }
    std::io::stdout().flush().unwrap();
    // Stay (and keep progressing) until every rank has reported: a slower peer may still need
    // acknowledgements from us for its last atomics.
    let mut bye = String::new();
    let _ = std::io::stdin().read_line(&mut bye);
}
