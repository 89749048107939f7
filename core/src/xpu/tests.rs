//! The device API against the mock provider (`trigger::testkit`), with test threads as CPU
//! XPUs: descriptors become the provider calls a host post makes, hostile ones become error
//! completions naming the fault, full rings answer again, close cancels, exported counters
//! and CQs are read from their mirrors.

use std::ffi::c_void;
use std::mem::{offset_of, size_of};
use std::sync::atomic::Ordering;

use super::abi::*;
use super::device as dev;
use super::*;
use crate::av::{AddressVector, AvAttr};
use crate::consts::errno::*;
use crate::consts::*;
use crate::cq::{CompletionQueue, CqAttr};
use crate::entry::INTERNAL_CTX;
use crate::entry::{CqErrEntry, CqTaggedEntry};
use crate::ep::Endpoint;
use crate::mr::MemoryRegion;
use crate::trigger::testkit::{World, XPU_CAPS};
use crate::trigger::Xpu;

const W: i32 = FI_XPU_WORK_ITEM;
const U64: i32 = crate::atomic::Datatype::UInt64 as i32;
const CSWAP: i32 = crate::atomic::AtomicOp::Cswap as i32;

struct Node {
    ep: Endpoint,
    cq: CompletionQueue,
    av: AddressVector,
}

fn node(w: &World) -> Node {
    node_sized(w, 1024)
}

fn node_sized(w: &World, cq_size: usize) -> Node {
    node_from(w, w.domain.info().clone(), cq_size)
}

/// `node_sized` whose domain asks for `FI_RM_ENABLED`: operations wait for CQ room.
fn node_managed(w: &World, cq_size: usize) -> Node {
    let mut info = w.domain.info().clone();
    info.domain_attr.resource_mgmt = crate::consts::ResourceMgmt::Enabled;
    node_from(w, info, cq_size)
}

/// An enabled endpoint of `info` with the XPU capabilities, its CQ of `cq_size` entries for
/// both directions and an AV holding one peer.
fn node_from(w: &World, mut info: crate::info::Info, cq_size: usize) -> Node {
    info.caps = XPU_CAPS;
    let ep = w.domain.endpoint(&info).unwrap();
    let cq = w
        .domain
        .cq_open(&CqAttr {
            format: CqFormat::Tagged,
            size: cq_size,
            ..Default::default()
        })
        .unwrap();
    let av = w.domain.av_open(&AvAttr::default()).unwrap();
    av.insert_one(b"peer").unwrap();
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
    ep.bind_av(&av).unwrap();
    ep.enable().unwrap();
    Node { ep, cq, av }
}

/// Every error entry now in `cq`, the success entries queued before them read and passed
/// over (a queue answers an error only once it is the topmost entry, fi_cq(3)).
fn errors(cq: &CompletionQueue) -> Vec<(CqErrEntry, String)> {
    let mut out = Vec::new();
    loop {
        match cq.readerr_data() {
            Ok((e, d)) => out.push((
                e,
                String::from_utf8_lossy(&d.unwrap_or_default()).into_owned(),
            )),
            Err(_) => {
                let mut ok = [CqTaggedEntry::default(); 16];
                if !matches!(cq.read(&mut ok), Ok(n) if n > 0) {
                    return out;
                }
            }
        }
    }
}

/// Progresses `n` until `done` (or a generous bound has passed): the endpoint's watcher takes
/// descriptors too, and a progress call finding nothing does not mean it is done.
fn settle(n: &Node, done: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    loop {
        while n.ep.progress() > 0 {}
        if done() || start.elapsed() > std::time::Duration::from_secs(30) {
            return;
        }
        std::thread::yield_now();
    }
}

/// What `take` reads from `n`'s queue, once `want` of it is in (or a generous bound has
/// passed): the endpoint's watcher takes descriptors too, and a progress call finding nothing
/// does not mean it is done.
fn settled<T>(n: &Node, want: usize, take: fn(&CompletionQueue) -> Vec<T>) -> Vec<T> {
    let start = std::time::Instant::now();
    let mut out = Vec::new();
    loop {
        while n.ep.progress() > 0 {}
        out.extend(take(&n.cq));
        if out.len() >= want || start.elapsed() > std::time::Duration::from_secs(30) {
            return out;
        }
        std::thread::yield_now();
    }
}

/// The error entries once `want` of them are in (`settled`).
fn errors_settled(n: &Node, want: usize) -> Vec<(CqErrEntry, String)> {
    settled(n, want, errors)
}

/// The entries once `want` of them are in (`settled`).
fn entries_settled(n: &Node, want: usize) -> Vec<CqTaggedEntry> {
    settled(n, want, entries)
}

fn entries(cq: &CompletionQueue) -> Vec<CqTaggedEntry> {
    let mut out = Vec::new();
    let mut buf = [CqTaggedEntry::default(); 16];
    while let Ok(n) = cq.read(&mut buf) {
        out.extend_from_slice(&buf[..n]);
    }
    out
}

fn reg(w: &World, buf: &[u8], access: u64) -> (MemoryRegion, u64) {
    // SAFETY: every test keeps its buffers alive past its regions.
    static KEY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0x1000);
    let key = KEY.fetch_add(1, Ordering::Relaxed);
    // SAFETY: every test keeps its buffers alive past its regions.
    let mr = unsafe { w.domain.mr_reg(buf, access, 0, key) }.unwrap();
    let desc = mr.get_xpu_desc().unwrap();
    (mr, desc)
}

fn p(b: &[u8]) -> *const c_void {
    b.as_ptr().cast()
}

#[test]
fn layouts_are_what_the_device_header_will_say() {
    assert_eq!(size_of::<FidXpu>(), 16);
    assert_eq!(offset_of!(FidXpu, prov_id), 4);
    assert_eq!(offset_of!(FidXpu, prov_ctx), 8);
    let d = XpuDesc {
        seq: 1,
        opcode: 2,
        op: -3,
        datatype: 4,
        check: 5,
        flags: 6,
        len: 7,
        result_desc: 8,
        reserved: [9; 6],
        ..Default::default()
    };
    let w = d.to_words();
    assert_eq!(
        w[1],
        2 | ((-3i32 as u32 as u64) << 32),
        "opcode then op in word 1"
    );
    assert_eq!(w[17], 8);
    assert_eq!(XpuDesc::from_words(w), d);
    let e = XpuCqEntry {
        kind: 1,
        prov_errno: 7,
        ..Default::default()
    };
    assert_eq!(XpuCqEntry::from_words(e.to_words()), e);
}

#[test]
fn exported_handles_carry_xfabrics_provider_id_and_shared_block() {
    let w = World::new();
    let n = node(&w);
    let x = n.ep.export_xpu(Xpu::CPU).unwrap();
    assert_eq!(x.fid().fclass, FI_CLASS_EP);
    assert_eq!(x.fid().prov_id, FI_XPU_PROV_XFABRIC);
    // SAFETY: prov_ctx is the live ring header's address while `x` lives.
    let h = unsafe { &*(x.fid().prov_ctx as *const RingHeader) };
    assert_eq!(
        (h.magic, h.version, h.mask),
        (RING_MAGIC, ABI_VERSION, 1023)
    );
    // Same XPU: the same ring.
    let again = n.ep.export_xpu_slots(Xpu::CPU, 8).unwrap();
    assert_eq!(again.fid().prov_ctx, x.fid().prov_ctx);
    // A size refused on a first export is refused on a later one too.
    assert!(matches!(
        n.ep.export_xpu_slots(Xpu::CPU, 3),
        Err(crate::error::Error::Inval(_))
    ));
    let gpu = Xpu {
        iface: crate::hmem_iface::Iface::Cuda,
        device: 0,
    };
    assert!(matches!(
        n.ep.export_xpu(gpu),
        Err(crate::error::Error::OpNotSupp(_))
    ));
    assert!(
        n.ep.export_xpu_slots(
            Xpu {
                iface: crate::hmem_iface::Iface::System,
                device: 1
            },
            3
        )
        .is_err(),
        "not a power of two"
    );
    let c = w.cntr().export_xpu(Xpu::CPU).unwrap();
    assert_eq!(
        (c.fid().fclass, c.fid().prov_id),
        (FI_CLASS_CNTR, FI_XPU_PROV_XFABRIC)
    );
    let q = n.cq.export_xpu(Xpu::CPU).unwrap();
    assert_eq!(
        (q.fid().fclass, q.fid().prov_id),
        (FI_CLASS_CQ, FI_XPU_PROV_XFABRIC)
    );
}

#[test]
fn descriptors_start_as_the_host_calls_would() {
    let w = World::new();
    w.sh.inline.store(true, Ordering::Release);
    let n = node(&w);
    let x = n.ep.export_xpu(Xpu::CPU).unwrap();
    let peer = n.av.get_xpu_addr(0).unwrap();
    assert!(n.av.get_xpu_addr(7).is_err());
    let buf = vec![1u8; 256];
    let res = vec![0u8; 64];
    let (_mr, desc) = reg(&w, &buf, 0);
    let (_mr2, rdesc) = reg(&w, &res, 0);
    assert_eq!(dev::send(&x, p(&buf), 16, desc, 0, peer, 1, 0, W), 0);
    assert_eq!(dev::tsend(&x, p(&buf), 16, desc, 0, peer, 99, 2, 0, W), 0);
    assert_eq!(
        dev::write(
            &x,
            p(&buf),
            32,
            desc,
            7,
            peer,
            0x10,
            5,
            3,
            FI_REMOTE_CQ_DATA,
            W
        ),
        0
    );
    assert_eq!(
        dev::read(
            &x,
            buf.as_ptr() as *mut c_void,
            32,
            desc,
            peer,
            0x10,
            5,
            4,
            0,
            W
        ),
        0
    );
    let (dt, add, cswap) = (
        crate::atomic::Datatype::UInt64 as i32,
        crate::atomic::AtomicOp::Sum as i32,
        crate::atomic::AtomicOp::Cswap as i32,
    );
    assert_eq!(
        dev::atomic(&x, p(&buf), 2, desc, peer, 0, 5, dt, add, 5, 0, W),
        0
    );
    let r = res.as_ptr() as *mut c_void;
    assert_eq!(
        dev::fetch_atomic(&x, p(&buf), 1, desc, r, rdesc, peer, 0, 5, dt, add, 6, 0, W),
        0
    );
    assert_eq!(
        dev::compare_atomic(
            &x,
            p(&buf),
            1,
            desc,
            p(&buf[8..]),
            desc,
            r,
            rdesc,
            peer,
            0,
            5,
            dt,
            cswap,
            7,
            0,
            W
        ),
        0
    );
    let rb = buf.as_ptr() as *mut c_void;
    assert_eq!(dev::recv(&x, rb, 64, desc, FI_ADDR_UNSPEC, 8, 0, W), 0);
    assert_eq!(dev::trecv(&x, rb, 64, desc, peer, 5, 0, 9, 0, W), 0);
    assert_eq!(dev::tx_flush(&x, 0, W), 0);
    settle(&n, || w.sh.log.lock().unwrap().len() >= 9);
    let log: Vec<_> = w.sh.log.lock().unwrap().clone();
    assert_eq!(
        log,
        vec![
            ('s', 1),
            ('s', 2),
            ('m', 3),
            ('m', 4),
            ('a', 5),
            ('a', 6),
            ('a', 7),
            ('r', 8),
            ('r', 9)
        ]
    );
    let ctxs: Vec<usize> = entries(&n.cq).iter().map(|e| e.op_context).collect();
    assert_eq!(
        ctxs,
        vec![1, 2, 3, 4, 5, 6, 7],
        "transmits complete as the host's do"
    );
    assert!(errors(&n.cq).is_empty());
    let r = w.sh.recvs.lock().unwrap();
    assert_eq!(
        (r[1].1.tag, r[1].1.src, r[0].1.src),
        (5, peer, FI_ADDR_UNSPEC)
    );
}

#[test]
fn every_hostile_descriptor_is_an_error_naming_its_fault_and_starts_nothing() {
    let w = World::new();
    let n = node(&w);
    let x = n.ep.export_xpu(Xpu::CPU).unwrap();
    let buf = vec![0u8; 128];
    let (_mr, desc) = reg(&w, &buf, 0);
    let secret = vec![0u8; 64];
    // SAFETY: `secret` outlives the region.
    let hidden = unsafe { w.domain.mr_reg(&secret, 0, 0, 77) }.unwrap();
    let ok = XpuDesc {
        opcode: opcode::SEND,
        len: 8,
        buf: buf.as_ptr() as u64,
        desc,
        peer: 0,
        ..Default::default()
    };
    let cases: Vec<(XpuDesc, i32, &str)> = vec![
        (
            XpuDesc {
                opcode: 77,
                context: 1,
                ..ok
            },
            XPU_FAULT_OPCODE,
            "opcode 77",
        ),
        (
            XpuDesc {
                opcode: 0,
                context: 2,
                ..ok
            },
            XPU_FAULT_OPCODE,
            "opcode 0",
        ),
        (
            XpuDesc {
                peer: 5,
                context: 3,
                ..ok
            },
            XPU_FAULT_ADDR,
            "AV",
        ),
        (
            XpuDesc {
                peer: u64::MAX - 1,
                context: 4,
                ..ok
            },
            XPU_FAULT_ADDR,
            "AV",
        ),
        (
            XpuDesc {
                desc: hidden.key(),
                context: 5,
                ..ok
            },
            XPU_FAULT_DESC,
            "exported",
        ),
        (
            XpuDesc {
                desc: 0xdead,
                context: 6,
                ..ok
            },
            XPU_FAULT_DESC,
            "exported",
        ),
        (
            XpuDesc {
                len: 129,
                context: 7,
                ..ok
            },
            XPU_FAULT_RANGE,
            "outside",
        ),
        (
            XpuDesc {
                buf: ok.buf + 121,
                context: 8,
                ..ok
            },
            XPU_FAULT_RANGE,
            "outside",
        ),
        (
            XpuDesc {
                buf: u64::MAX - 2,
                context: 9,
                ..ok
            },
            XPU_FAULT_RANGE,
            "outside",
        ),
        (
            XpuDesc {
                buf: ok.buf - 1,
                context: 10,
                ..ok
            },
            XPU_FAULT_RANGE,
            "outside",
        ),
        (
            XpuDesc {
                flags: FI_INJECT,
                context: 11,
                ..ok
            },
            XPU_FAULT_FLAGS,
            "flags",
        ),
        (
            XpuDesc {
                flags: FI_TRIGGER,
                context: 12,
                ..ok
            },
            XPU_FAULT_FLAGS,
            "flags",
        ),
        (
            XpuDesc {
                flags: 1 << 63,
                context: 13,
                ..ok
            },
            XPU_FAULT_FLAGS,
            "flags",
        ),
        (
            XpuDesc {
                opcode: opcode::RECV,
                flags: FI_MULTI_RECV,
                context: 14,
                ..ok
            },
            XPU_FAULT_FLAGS,
            "flags",
        ),
        (
            XpuDesc {
                len: 1 << 40,
                context: 15,
                ..ok
            },
            XPU_FAULT_ARGS,
            "max_msg_size",
        ),
        (
            XpuDesc {
                opcode: opcode::ATOMIC,
                datatype: 99,
                context: 16,
                ..ok
            },
            XPU_FAULT_ARGS,
            "fi_datatype",
        ),
        (
            XpuDesc {
                opcode: opcode::ATOMIC,
                len: 0,
                context: 17,
                ..ok
            },
            XPU_FAULT_ARGS,
            "count",
        ),
        (
            XpuDesc {
                opcode: opcode::COMPARE_ATOMIC,
                datatype: U64,
                op: CSWAP,
                len: 1,
                compare_desc: 5,
                context: 18,
                ..ok
            },
            XPU_FAULT_DESC,
            "exported",
        ),
        (
            XpuDesc {
                opcode: opcode::CNTR_ADD,
                context: 19,
                ..ok
            },
            XPU_FAULT_OPCODE,
            "opcode 32",
        ),
        // What only a post refused by a closed ring publishes: in an open ring, a lie.
        (
            XpuDesc {
                opcode: opcode::WITHDRAWN,
                context: 21,
                ..ok
            },
            XPU_FAULT_OPCODE,
            "opcode 63",
        ),
        // A context in the endpoint's own namespace: the completion of what it started would
        // be taken for a deferred transfer's or a staged operation's record.
        (
            XpuDesc {
                context: INTERNAL_CTX as u64 | 0x40,
                ..ok
            },
            XPU_FAULT_ARGS,
            "reserved",
        ),
    ];
    for (d, _, _) in &cases {
        assert_eq!(dev::post_raw(&x, d), 0);
    }
    // A torn slot: published, but its check word is another position's.
    let c = dev::claim(&x).unwrap();
    c.write(&XpuDesc { context: 20, ..ok });
    c.store_word(2, (c.position() + 9) << 32);
    c.publish();
    let errs = errors_settled(&n, cases.len() + 1);
    assert!(w.sh.log.lock().unwrap().is_empty(), "nothing started");
    assert_eq!(errs.len(), cases.len() + 1);
    for ((e, why), (d, code, says)) in errs.iter().zip(&cases) {
        assert_eq!(
            (e.op_context as u64, e.prov_errno),
            (d.context, *code),
            "{why}"
        );
        assert!(
            why.contains(says),
            "context {}: {why:?} should say {says:?}",
            d.context
        );
        assert!(e.err != 0);
    }
    let (torn, why) = errs.last().unwrap();
    assert_eq!(
        (torn.op_context, torn.prov_errno, torn.err),
        (0, XPU_FAULT_TORN, FI_EINVAL)
    );
    assert!(why.contains("torn"), "{why}");
    // A receive's fault is on the receive side.
    let multi = &errs[13].0;
    assert_eq!(multi.flags, FI_RECV | FI_MSG);
    // A region closed after export is refused from then on.
    drop(_mr);
    assert_eq!(dev::post_raw(&x, &XpuDesc { context: 21, ..ok }), 0);
    let errs = errors_settled(&n, 1);
    assert_eq!(
        (errs[0].0.op_context, errs[0].0.prov_errno),
        (21, XPU_FAULT_DESC)
    );
    assert!(w.sh.log.lock().unwrap().is_empty());
}

/// Faulty descriptors fill the CQ's errors at most to its size: the ring is not drained
/// further, so that it fills and the XPU is answered `-FI_EAGAIN`, until the application reads
/// them; then every one is reported, once, in order.
#[test]
fn faulty_descriptors_stop_at_the_cqs_size_until_their_errors_are_read() {
    const CQ: usize = 8;
    let w = World::new();
    let n = node_sized(&w, CQ);
    let x = n.ep.export_xpu(Xpu::CPU).unwrap();
    let bad = |ctx: u64| XpuDesc {
        opcode: 77,
        context: ctx,
        ..Default::default()
    };
    // Posted until the XPU is told to wait (a ring's worth and the CQ's at most).
    let mut posted = 0u64;
    loop {
        match dev::post_raw(&x, &bad(100 + posted)) {
            0 => posted += 1,
            r => {
                assert_eq!(r, -FI_EAGAIN);
                break;
            }
        }
        assert!(posted < 1 << 16, "the ring never filled");
    }
    settle(&n, || n.cq.inner().errors_waiting() >= CQ);
    assert_eq!(
        n.cq.inner().errors_waiting(),
        CQ,
        "errors kept for a CQ of {CQ}"
    );
    assert!(posted > CQ as u64);
    assert!(x.ring().ready(), "descriptors left in the ring");
    // Held back, the ring keeps no watcher looking: once the spin after the last look (and
    // any window it predicted) is over, the watcher may sleep (it spun for as long as the
    // application left its errors unread).
    let watch = n.ep.link().unwrap().xpu.as_ref().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while watch.nap_with(false) == Some(std::time::Duration::ZERO) {
        assert!(
            std::time::Instant::now() < deadline,
            "a ring held back by unread errors kept the watcher looking"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // Read (each read drives progress, which drains on as room is made): all, in order.
    let mut got = Vec::new();
    for _ in 0..4 {
        got.extend(errors(&n.cq).iter().map(|(e, _)| e.op_context as u64));
        while n.ep.progress() > 0 {}
    }
    assert_eq!(got, (100..100 + posted).collect::<Vec<_>>());
    assert!(w.sh.log.lock().unwrap().is_empty(), "nothing started");
}

/// Closing an endpoint whose ring holds more descriptors than its CQ has room for error
/// entries: as many are reported one by one as the CQ holds, the rest in one entry that says
/// how many (every one reported, none kept past the CQ's size).
#[test]
fn a_close_reports_past_the_cqs_size_in_one_entry() {
    const CQ: usize = 8;
    let w = World::new();
    let n = node_sized(&w, CQ);
    let x = n.ep.export_xpu_slots(Xpu::CPU, 64).unwrap();
    let buf = vec![0u8; 8];
    let (_mr, desc) = reg(&w, &buf, 0);
    for ctx in 1..=40 {
        assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, ctx, 0, W), 0);
    }
    let started = w.sh.ctxs().len();
    let Node { ep, cq, av: _av } = n;
    ep.close().unwrap();
    let errs = errors(&cq);
    assert!(errs.len() <= CQ + 1, "{} entries", errs.len());
    let one_by_one = errs.iter().filter(|(e, _)| e.op_context != 0).count();
    let (last, why) = errs.last().expect("reports");
    assert_eq!((last.op_context, last.err), (0, FI_ECANCELED));
    let rest = 40 - started - one_by_one;
    assert!(why.contains(&format!("{rest} more descriptors")), "{why}");
}

#[test]
fn a_full_ring_answers_again_until_the_watcher_drains_it() {
    let w = World::new();
    let n = node(&w);
    let x = n.ep.export_xpu_slots(Xpu::CPU, 4).unwrap();
    let buf = vec![0u8; 8];
    let (_mr, desc) = reg(&w, &buf, 0);
    for i in 0..4 {
        assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, i, 0, W), 0);
    }
    assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, 4, 0, W), -FI_EAGAIN);
    assert_eq!(
        dev::send(&x, p(&buf), 8, desc, 0, 0, 4, 0, 9),
        -FI_EINVAL,
        "bad scope"
    );
    n.ep.progress();
    assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, 4, 0, W), 0);
    n.ep.progress();
    assert_eq!(w.sh.ctxs(), vec![0, 1, 2, 3, 4]);
}

/// The look that finds a ring full says so once (the watcher then gives its core to the
/// refused producer before it spins); a look at a ring with room does not.
#[test]
fn a_look_at_a_full_ring_tells_the_watcher_its_producer_waits() {
    let w = World::new();
    let n = node(&w);
    let x = n.ep.export_xpu_slots(Xpu::CPU, 4).unwrap();
    let watch = || n.ep.link().unwrap().xpu.as_ref().unwrap();
    let buf = vec![0u8; 8];
    let (_mr, desc) = reg(&w, &buf, 0);
    for i in 0..3 {
        assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, i, 0, W), 0);
    }
    n.ep.progress();
    assert!(
        !watch().take_producer_waited(),
        "three of four slots: room left"
    );
    for i in 3..7 {
        assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, i, 0, W), 0);
    }
    assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, 7, 0, W), -FI_EAGAIN);
    n.ep.progress();
    assert!(watch().take_producer_waited(), "the look found it full");
    assert!(!watch().take_producer_waited(), "told once");
    assert_eq!(w.sh.ctxs(), (0..7).collect::<Vec<_>>());
    // The watcher's next wait gives the core away at once (the hint taken there) rather
    // than spinning or sleeping first.
    assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, 7, 0, W), 0);
    assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, 8, 0, W), 0);
    assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, 9, 0, W), 0);
    assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, 10, 0, W), 0);
    n.ep.progress();
    let link = n.ep.link().unwrap();
    crate::wait::ProgressSource::idle_wait(&**link, std::time::Duration::from_secs(1));
    assert!(!watch().take_producer_waited(), "the wait took the hint");
    // A tail that claims a full ring with nothing published in it (the XPU writes the tail:
    // it may be wrong) gives no hint, so that it cannot keep the watcher from sleeping.
    let h = x.ring().header();
    h.tail
        .store(h.tail.load(Ordering::Relaxed) + 1000, Ordering::Relaxed);
    n.ep.progress();
    assert!(!watch().take_producer_waited(), "a tail alone is no hint");
}

#[test]
fn a_refusing_provider_holds_the_ring_back_and_keeps_the_order() {
    let w = World::new();
    let n = node(&w);
    let x = n.ep.export_xpu_slots(Xpu::CPU, 4).unwrap();
    let buf = vec![0u8; 8];
    let (_mr, desc) = reg(&w, &buf, 0);
    w.sh.again.store(1000, Ordering::Release);
    let mut posted = 0;
    let mut refused = 0;
    // The provider refuses: the first descriptor waits for room, the ring is not drained
    // behind it, fills, and the XPU is told again.
    while posted < 6 {
        match dev::send(&x, p(&buf), 8, desc, 0, 0, posted, 0, W) {
            0 => posted += 1,
            e => {
                assert_eq!(e, -FI_EAGAIN);
                refused += 1;
                if refused == 3 {
                    w.sh.again.store(0, Ordering::Release);
                }
                n.ep.progress();
            }
        }
        n.ep.progress();
    }
    settle(&n, || w.sh.ctxs().len() >= 6);
    assert!(refused >= 3);
    assert_eq!(w.sh.ctxs(), (0..6).collect::<Vec<_>>());
}

/// Closing with a descriptor held for room at the provider and more behind it in the ring
/// cancels them in the ring's order: the one taken first is reported first.
#[test]
fn closing_cancels_a_held_descriptor_before_those_behind_it() {
    let w = World::new();
    let n = node(&w);
    let x = n.ep.export_xpu(Xpu::CPU).unwrap();
    let buf = vec![0u8; 8];
    let (_mr, desc) = reg(&w, &buf, 0);
    w.sh.again.store(u32::MAX as _, Ordering::Release);
    for ctx in 0..3 {
        assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, ctx, 0, W), 0);
    }
    n.ep.progress();
    assert!(x.ring().ready(), "the ring is held behind the first");
    let Node { ep, cq, av: _av } = n;
    ep.close().unwrap();
    let got: Vec<_> = errors(&cq)
        .iter()
        .map(|(e, _)| (e.op_context, e.err))
        .collect();
    assert_eq!(
        got,
        vec![(0, FI_ECANCELED), (1, FI_ECANCELED), (2, FI_ECANCELED)]
    );
    assert!(w.sh.ctxs().is_empty(), "nothing started");
}

/// A descriptor the provider refused for room waits, taken from its ring (which then looks
/// empty); if the application closes the region it names meanwhile, it must not start from
/// that memory later: it is checked again before it starts, and ends as a descriptor naming
/// a region that is not exported, nothing started.
#[test]
fn a_held_descriptor_does_not_start_after_its_region_closed() {
    let w = World::new();
    let n = node(&w);
    let x = n.ep.export_xpu(Xpu::CPU).unwrap();
    let buf = vec![0u8; 8];
    let (mr, desc) = reg(&w, &buf, 0);
    w.sh.again.store(u32::MAX as _, Ordering::Release);
    assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, 7, 0, W), 0);
    n.ep.progress();
    assert!(!x.ring().ready(), "taken from the ring and held");
    drop(mr);
    w.sh.again.store(0, Ordering::Release);
    let errs = errors_settled(&n, 1);
    assert!(w.sh.ctxs().is_empty(), "started: {:?}", w.sh.ctxs());
    assert_eq!(errs[0].0.op_context, 7);
    assert_eq!(errs[0].0.err, FI_EACCES);
    assert_eq!(errs[0].0.prov_errno, XPU_FAULT_DESC);
    // One whose region stays open starts as it would have.
    let (_mr2, desc2) = reg(&w, &buf, 0);
    w.sh.again.store(u32::MAX as _, Ordering::Release);
    assert_eq!(dev::send(&x, p(&buf), 8, desc2, 0, 0, 8, 0, W), 0);
    n.ep.progress();
    assert!(!x.ring().ready(), "taken from the ring and held");
    w.sh.again.store(0, Ordering::Release);
    settle(&n, || !w.sh.ctxs().is_empty());
    assert_eq!(w.sh.ctxs(), vec![8]);
}

/// A publishing word of another lap, at the next slot or again at one already taken, is
/// never taken: nothing starts twice, nothing starts from it, and no error is made up.
#[test]
fn a_publishing_word_of_another_lap_is_never_taken() {
    let w = World::new();
    let n = node(&w);
    let x = n.ep.export_xpu_slots(Xpu::CPU, 4).unwrap();
    let buf = vec![0u8; 8];
    let (_mr, desc) = reg(&w, &buf, 0);
    assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, 1, 0, W), 0);
    settle(&n, || !w.sh.ctxs().is_empty());
    assert_eq!(w.sh.ctxs(), vec![1]);
    let r = x.ring();
    // The slot taken, published again (a replay): behind the head.
    r.seq_word(0).store(1, Ordering::Release);
    // The next slot with a later lap's word, then an earlier lap's.
    for seq in [1 + 4 + 1, 1u64.wrapping_sub(4).wrapping_add(1)] {
        r.seq_word(1).store(seq, Ordering::Release);
        while n.ep.progress() > 0 {}
        assert_eq!(w.sh.ctxs(), vec![1], "taken at {seq:#x}");
    }
    assert!(errors(&n.cq).is_empty(), "an error made up");
    // The position's own word: taken.
    assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, 2, 0, W), 0);
    settle(&n, || w.sh.ctxs().len() >= 2);
    assert_eq!(w.sh.ctxs(), vec![1, 2]);
}

/// A tail an XPU wrote back below what it published does not hide those descriptors from
/// close: each still ends canceled.
#[test]
fn closing_cancels_what_was_published_past_a_tail_written_back() {
    let w = World::new();
    let n = node(&w);
    let x = n.ep.export_xpu(Xpu::CPU).unwrap();
    let buf = vec![0u8; 8];
    let (_mr, desc) = reg(&w, &buf, 0);
    for ctx in [7, 8] {
        assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, ctx, 0, W), 0);
    }
    let h = x.ring().header();
    h.tail.store(x.ring().head(), Ordering::Relaxed);
    let Node { ep, cq, av: _av } = n;
    ep.close().unwrap();
    let got: Vec<_> = errors(&cq)
        .iter()
        .map(|(e, _)| (e.op_context, e.err))
        .collect();
    assert_eq!(got, vec![(7, FI_ECANCELED), (8, FI_ECANCELED)]);
    assert!(w.sh.ctxs().is_empty(), "nothing started");
}

#[test]
fn closing_cancels_what_the_rings_hold_and_an_unpublished_slot_is_named() {
    let w = World::new();
    let n = node(&w);
    let x = n.ep.export_xpu(Xpu::CPU).unwrap();
    let buf = vec![0u8; 8];
    let (_mr, desc) = reg(&w, &buf, 0);
    assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, 1, 0, W), 0);
    // An XPU that died mid-descriptor: claimed, half written, never published.
    dev::claim(&x)
        .unwrap()
        .store_word(1, u64::from(opcode::SEND));
    // Published behind it: never taken (the ring keeps its order), canceled at close.
    assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, 3, 0, W), 0);
    // A torn slot among them: reported as the drain would (no context), not under the
    // context it claims.
    let c = dev::claim(&x).unwrap();
    c.write(&XpuDesc {
        opcode: opcode::SEND,
        context: 99,
        ..Default::default()
    });
    c.store_word(2, (c.position() + 9) << 32);
    c.publish();
    assert_eq!(
        dev::recv(
            &x,
            buf.as_ptr() as *mut c_void,
            8,
            desc,
            FI_ADDR_UNSPEC,
            4,
            0,
            W
        ),
        0
    );
    n.ep.progress();
    assert_eq!(
        w.sh.ctxs(),
        vec![1],
        "nothing past the unpublished slot started"
    );
    let Node { ep, cq, av: _av } = n;
    ep.close().unwrap();
    let errs = errors(&cq);
    let got: Vec<_> = errs
        .iter()
        .map(|(e, _)| (e.op_context, e.err, e.prov_errno))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, FI_ECANCELED, XPU_FAULT_UNPUBLISHED),
            (3, FI_ECANCELED, FI_ECANCELED),
            (0, FI_EINVAL, XPU_FAULT_TORN),
            (4, FI_ECANCELED, FI_ECANCELED),
        ]
    );
    assert!(errs[2].1.contains("torn"), "{}", errs[2].1);
    assert_eq!(errs[3].0.flags, FI_RECV | FI_MSG);
    assert_eq!(
        dev::send(&x, p(&buf), 8, desc, 0, 0, 5, 0, W),
        -FI_ESHUTDOWN
    );
}

/// A post whose look at the ring's state came just before the close and whose claim came just
/// after the close read the tail: refused, so that nothing is published that the close did not
/// count (before, it was published, answered 0, and neither taken nor reported).
#[test]
fn a_claim_landing_after_the_close_looked_is_refused() {
    /// The producer's atomics, with the ring closed just before its claim of a position.
    struct CloseFirst<'a> {
        ring: &'a ring::DescRing,
        left: std::cell::RefCell<Option<Vec<ring::Left>>>,
    }
    impl ring::ProducerRmw for CloseFirst<'_> {
        fn fetch_add(&self, w: &std::sync::atomic::AtomicU64, v: u64) -> u64 {
            if std::ptr::eq(w, &self.ring.header().tail) {
                self.left.replace(Some(self.ring.close()));
            }
            ring::Native.fetch_add(w, v)
        }
    }
    let r = ring::DescRing::new(4, Xpu::CPU, None).unwrap();
    let rmw = CloseFirst {
        ring: &r,
        left: Default::default(),
    };
    assert_eq!(r.claim_with(&rmw).err(), Some(-FI_ESHUTDOWN));
    let left = rmw.left.take().expect("the ring was closed");
    assert!(left.is_empty(), "the close counted {left:?}");
}

/// A post whose claim the close counted but whose second look found the ring closed: refused,
/// and its position published withdrawn, so that the close neither waits for it nor reports
/// it as a position an XPU died writing (it did: up to its wait, then a report).
#[test]
fn a_claim_the_close_counted_but_refused_is_neither_waited_for_nor_reported() {
    /// The producer's atomics, with a close started on another thread right after the claim
    /// of a position, and under way (the state stored) before the producer looks again.
    struct CloseAfter<'a> {
        ring: &'a ring::DescRing,
        go: std::sync::mpsc::Sender<()>,
    }
    impl ring::ProducerRmw for CloseAfter<'_> {
        fn fetch_add(&self, w: &std::sync::atomic::AtomicU64, v: u64) -> u64 {
            let old = ring::Native.fetch_add(w, v);
            if std::ptr::eq(w, &self.ring.header().tail) {
                self.go.send(()).unwrap();
                while self.ring.header().state.load(Ordering::Acquire) == RING_OPEN {
                    std::thread::yield_now();
                }
            }
            old
        }
    }
    let r = &*ring::DescRing::new(4, Xpu::CPU, None).unwrap();
    let (go, started) = std::sync::mpsc::channel();
    let (answer, left) = std::thread::scope(|s| {
        let closer = s.spawn(move || {
            started.recv().unwrap();
            // Long enough that only the withdrawn slot ends the wait in time.
            r.close_within(std::time::Duration::from_secs(120))
        });
        let answer = r.claim_with(&CloseAfter { ring: r, go }).err();
        (answer, closer.join().unwrap())
    });
    assert_eq!(answer, Some(-FI_ESHUTDOWN));
    assert!(left.is_empty(), "the close reported {left:?}");
}

/// Two posts refused after their claims, which the close's read of the tail did not count:
/// the later one already withdrawn when the close looks, the earlier one still writing. The
/// withdrawn slot must not stretch what the close reports over the earlier position, which
/// would then be reported as unpublished though its post was refused too.
#[test]
fn a_withdrawn_slot_past_the_tail_does_not_make_the_close_report_the_claims_before_it() {
    let r = ring::DescRing::new(4, Xpu::CPU, None).unwrap();
    // Claimed (the earlier post, still writing) and claimed then withdrawn (the later).
    let _writing = r.claim().unwrap();
    r.claim().unwrap().withdraw();
    // The tail as the close's read found it: before both claims.
    r.header().tail.store(0, Ordering::Relaxed);
    let left = r.close_within(std::time::Duration::ZERO);
    assert!(left.is_empty(), "the close reported {left:?}");
}

/// A descriptor claimed before the close and published while the close looks is canceled
/// under its own context, not reported as a position never published.
#[test]
fn a_descriptor_published_while_the_close_looks_is_canceled_under_its_context() {
    let r = ring::DescRing::new(4, Xpu::CPU, None).unwrap();
    let c = r.claim().unwrap();
    c.write(&XpuDesc {
        opcode: opcode::SEND,
        context: 7,
        ..Default::default()
    });
    let left = std::thread::scope(|s| {
        // Long enough that only a publish that never comes ends the wait.
        let closer = s.spawn(|| r.close_within(std::time::Duration::from_secs(120)));
        while r.header().state.load(Ordering::Acquire) == RING_OPEN {
            std::thread::yield_now();
        }
        c.publish();
        closer.join().unwrap()
    });
    assert!(
        matches!(left.as_slice(), [ring::Left::Published(d)] if d.context == 7),
        "{left:?}"
    );
    assert_eq!(r.claim().err(), Some(-FI_ESHUTDOWN));
}

/// An endpoint whose CQ of 2 entries is under resource management, exported, with four
/// sends posted by descriptors (completing inline once started): what it returns must live
/// while they run.
fn four_sends_for_a_cq_of_two(w: &World) -> (Node, XpuEp, MemoryRegion, Vec<u8>) {
    w.sh.inline.store(true, Ordering::Release);
    let n = node_managed(w, 2);
    let x = n.ep.export_xpu(Xpu::CPU).unwrap();
    let buf = vec![0u8; 8];
    let (mr, desc) = reg(w, &buf, 0);
    for ctx in 1..=4 {
        assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, ctx, 0, W), 0);
    }
    (n, x, mr, buf)
}

/// Descriptors waiting in a ring behind operations that wait for CQ room are no reason to
/// keep looking: once those have waited their first millisecond, the watcher's next look is a
/// nap, as for the operations alone. Before, the ring's published slot made every look "now",
/// and a progress thread (or `fi_wait` under manual progress) spun a core until the
/// application read its CQ. Once it does, everything starts, in order.
#[test]
fn descriptors_behind_operations_waiting_for_room_let_the_watcher_nap() {
    use crate::wait::ProgressSource;
    let w = World::new();
    let (n, _x, _mr, _buf) = four_sends_for_a_cq_of_two(&w);
    n.ep.progress();
    assert_eq!(
        w.sh.ctxs(),
        vec![1, 2],
        "the third waits for room, the fourth behind it"
    );
    let link = n.ep.link().expect("an FI_TRIGGER endpoint's link").clone();
    // Past the operations' first millisecond of retries at once (`STALL_SPIN`), the watcher
    // may sleep: looked and asked until it says so (a look can also be "now" for a moment for
    // reasons of its own, such as another thread looking, or another test's exported counter
    // with an add waiting).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        link.progress();
        if link.next_look() != Some(std::time::Duration::ZERO) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "descriptors behind waiting operations kept the watcher looking at once"
        );
        std::thread::yield_now();
    }
    let ctxs: Vec<usize> = entries_settled(&n, 4)
        .iter()
        .map(|e| e.op_context)
        .collect();
    assert_eq!(ctxs, [1, 2, 3, 4], "every completion, in order");
}

/// The progress call whose retry starts the last operation that waited for room takes the
/// descriptors that waited behind it in the ring at once, rather than leaving them for the
/// watcher's next look (which a thread that is not the watcher, an application reading its
/// CQ, never makes).
#[test]
fn the_retry_that_ends_a_wait_for_room_takes_the_descriptors_behind_it() {
    use crate::wait::ProgressSource;
    let w = World::new();
    let (n, _x, _mr, _buf) = four_sends_for_a_cq_of_two(&w);
    let link = n.ep.link().expect("an FI_TRIGGER endpoint's link").clone();
    link.progress();
    assert_eq!(
        w.sh.ctxs(),
        vec![1, 2],
        "the third waits for room, the fourth behind it"
    );
    // Room: a read drives progress first (nothing can start yet), then takes both entries.
    let mut two = [CqTaggedEntry::default(); 2];
    assert_eq!(n.cq.read(&mut two).unwrap(), 2);
    assert_eq!(w.sh.ctxs(), vec![1, 2]);
    // One progress call: its retry starts the third, and the fourth follows in the same call.
    link.progress();
    assert_eq!(w.sh.ctxs(), vec![1, 2, 3, 4]);
}

/// Drives `n` until `done` (120 s at most, then fails saying `what`).
fn progress_until(n: &Node, mut done: impl FnMut() -> bool, what: impl Fn() -> String) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !done() {
        n.ep.progress();
        assert!(std::time::Instant::now() < deadline, "{}", what());
    }
}

#[test]
fn four_xpu_threads_keep_each_threads_order() {
    let w = World::new();
    w.sh.inline.store(true, Ordering::Release);
    let n = node_sized(&w, 1 << 20);
    let x = std::sync::Arc::new(n.ep.export_xpu_slots(Xpu::CPU, 64).unwrap());
    let buf = vec![0u8; 8];
    let (_mr, desc) = reg(&w, &buf, 0);
    const PER: usize = 20_000;
    let addr = buf.as_ptr() as usize;
    let threads: Vec<_> = (0..4usize)
        .map(|t| {
            let x = x.clone();
            std::thread::spawn(move || {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
                for i in 0..PER {
                    let ctx = (t << 32) | i;
                    while dev::tsend(
                        &x,
                        addr as *const c_void,
                        8,
                        desc,
                        0,
                        0,
                        i as u64,
                        ctx,
                        0,
                        W,
                    ) != 0
                    {
                        assert!(std::time::Instant::now() < deadline, "the ring stayed full");
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    progress_until(
        &n,
        || w.sh.log.lock().unwrap().len() >= 4 * PER,
        || format!("{} of {}", w.sh.log.lock().unwrap().len(), 4 * PER),
    );
    for t in threads {
        t.join().unwrap();
    }
    let mut next = [0usize; 4];
    for (k, ctx) in w.sh.log.lock().unwrap().iter() {
        assert_eq!(*k, 's');
        let (t, i) = (ctx >> 32, ctx & 0xffff_ffff);
        assert_eq!(i, next[t], "thread {t}'s order");
        next[t] += 1;
    }
    assert_eq!(entries(&n.cq).len(), 4 * PER);
}

#[test]
fn an_exported_counter_is_mirrored_and_takes_the_xpus_adds() {
    let w = World::new();
    let n = node(&w);
    let _x = n.ep.export_xpu(Xpu::CPU).unwrap();
    let c = w.cntr();
    c.add(5).unwrap();
    let xc = c.export_xpu(Xpu::CPU).unwrap();
    assert_eq!(dev::cntr_read(&xc, W), 5, "mirrored at export");
    c.add(2).unwrap();
    assert_eq!(dev::cntr_read(&xc, W), 7);
    c.adderr(1).unwrap();
    assert_eq!(dev::cntr_readerr(&xc, W), 1);
    assert_eq!(dev::cntr_wait(&xc, 7, 0, W), 0);
    assert_eq!(dev::cntr_wait(&xc, 8, 0, W), -FI_ETIMEDOUT);
    assert_eq!(dev::cntr_add(&xc, 3, W), 0);
    assert_eq!(dev::cntr_adderr(&xc, 2, W), 0);
    // Every watcher of the process drains every exported counter's ring, one at a time: this
    // test's own progress call finds nothing to do while another test's watcher holds the
    // ring, and that watcher applies what it took.
    progress_until(
        &n,
        || (c.read(), c.readerr()) == (10, 3),
        || "never applied".into(),
    );
    assert_eq!((dev::cntr_read(&xc, W), dev::cntr_readerr(&xc, W)), (10, 3));
    assert_eq!(dev::cntr_set(&xc, 1, W), 0);
    assert_eq!(dev::cntr_seterr(&xc, 0, W), 0);
    progress_until(
        &n,
        || (c.read(), c.readerr()) == (1, 0),
        || "never applied".into(),
    );
    // A wait on another thread ends when the host's change is mirrored.
    let waiter = std::thread::spawn(move || dev::cntr_wait(&xc, 4, -1, W));
    c.add(3).unwrap();
    assert_eq!(waiter.join().unwrap(), 0);
}

/// A counter opened outside a domain and gone while its export's handle lives: its ring is
/// closed too (only a domain's counters closed it), so a wait on it ends.
#[test]
fn a_counter_without_a_domain_closes_its_ring_when_it_goes() {
    let c = crate::cntr::Counter::open(&crate::cntr::CntrAttr::default()).unwrap();
    let xc = c.export_xpu(Xpu::CPU).unwrap();
    c.add(2).unwrap();
    drop(c);
    assert_eq!(dev::cntr_read(&xc, W), 2, "the mirror outlives the counter");
    assert_eq!(dev::cntr_add(&xc, 1, W), -FI_ESHUTDOWN);
    assert_eq!(dev::cntr_wait(&xc, 3, 10_000, W), -FI_ESHUTDOWN);
}

/// A counter gone while its export's handle lives: its ring is closed, and a slot an XPU
/// publishes into it after (without the reservation a closed ring refuses) never reads as
/// ready, so it keeps no watcher looking (every watcher looks at every exported counter).
#[test]
fn a_closed_counter_ring_is_never_ready_again() {
    let w = World::new();
    let c = w.cntr();
    let xc = c.export_xpu(Xpu::CPU).unwrap();
    drop(c);
    assert_eq!(dev::cntr_add(&xc, 1, W), -FI_ESHUTDOWN, "closed to the XPU");
    // A wait on it ends: its values change no more (it spun for good without a limit).
    assert_eq!(dev::cntr_wait(&xc, 1, 10_000, W), -FI_ESHUTDOWN);
    // Unless the value reached the threshold before the close: that wait is met.
    assert_eq!(dev::cntr_wait(&xc, 0, 10_000, W), 0);
    let r = xc.ring();
    let head = r.head();
    r.seq_word(head)
        .store(head.wrapping_add(1), Ordering::Release);
    assert!(!r.ready(), "a closed ring published into reads as ready");
}

/// An exported counter's ring takes counter descriptors only: an endpoint's opcode, an
/// unknown one and a torn slot each count one error on the counter (which ends any
/// `fi_xpu_cntr_wait`) and change its value in nothing.
#[test]
fn a_counter_ring_counts_an_error_for_what_is_not_a_counter_descriptor() {
    let w = World::new();
    let n = node(&w);
    let _x = n.ep.export_xpu(Xpu::CPU).unwrap();
    let c = w.cntr();
    let xc = c.export_xpu(Xpu::CPU).unwrap();
    for op in [opcode::SEND, 77] {
        let d = XpuDesc {
            opcode: op,
            data: 5,
            ..Default::default()
        };
        assert_eq!(xc.ring().post(&d), 0);
    }
    let torn = xc.ring().claim().unwrap();
    torn.write(&XpuDesc {
        opcode: opcode::CNTR_ADD,
        data: 100,
        ..Default::default()
    });
    torn.store_word(2, (torn.position() + 9) << 32);
    torn.publish();
    assert_eq!(dev::cntr_add(&xc, 1, W), 0);
    progress_until(
        &n,
        || (c.read(), c.readerr()) == (1, 3),
        || format!("counter {} errors {}", c.read(), c.readerr()),
    );
}

/// A drain of a counter's ring takes a bounded number of descriptors: an XPU adding as fast
/// as they are taken cannot keep the watcher (and every endpoint it serves) in one drain.
#[test]
fn a_counter_drain_is_bounded() {
    let w = World::new();
    let c = w.cntr();
    let xc = c.export_xpu(Xpu::CPU).unwrap();
    let max = crate::trigger::DRAIN_MAX;
    let posted = 3 * max + 1;
    for i in 0..posted {
        assert_eq!(dev::cntr_add(&xc, 1, W), 0, "add {i}");
    }
    // Whatever the posting (or another test's watcher, draining every counter of the
    // process) took on the way, no drain takes more than its bound, and all arrive.
    let start = std::time::Instant::now();
    while c.read() < posted as u64 {
        let k = xc.drain_once();
        assert!(k <= max, "one drain took {k}");
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "adds lost"
        );
    }
    assert_eq!(c.read(), posted as u64);
}

/// An enabled endpoint of a world whose sends complete inline, with its own tagged CQ of
/// `size` entries (no endpoint of the world exports a ring: no watcher looks at it) and an AV
/// holding one peer: (the world, the endpoint, the CQ, the AV, the peer).
fn inline_ep_with_cq(
    size: usize,
) -> (
    World,
    Endpoint,
    CompletionQueue,
    AddressVector,
    crate::entry::FiAddr,
) {
    let w = World::new();
    w.sh.inline.store(true, Ordering::Release);
    let mut info = w.domain.info().clone();
    info.caps = crate::trigger::testkit::ALL_CAPS;
    let ep = w.domain.endpoint(&info).unwrap();
    let cq = w
        .domain
        .cq_open(&CqAttr {
            format: CqFormat::Tagged,
            size,
            ..Default::default()
        })
        .unwrap();
    let av = w.domain.av_open(&AvAttr::default()).unwrap();
    let peer = av.insert_one(b"peer").unwrap();
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
    ep.bind_av(&av).unwrap();
    ep.enable().unwrap();
    (w, ep, cq, av, peer)
}

/// A queue exported but bound to no exported endpoint (no watcher looks at it): what did
/// not fit its ring when it came is moved by the CPU XPU's own read once the ring is empty,
/// with no host call and no later completion.
#[test]
fn an_exported_cq_without_a_watcher_delivers_what_did_not_fit() {
    let (_w, ep, cq, _av, peer) = inline_ep_with_cq(64);
    let q = cq.export_xpu_slots(Xpu::CPU, 2).unwrap();
    let buf = vec![0u8; 8];
    for i in 0..5 {
        // SAFETY: `buf` outlives the sends (completed inline).
        unsafe { ep.send(&buf, None, peer, 100 + i) }.unwrap();
    }
    let mut got = Vec::new();
    let mut two = [CqTaggedEntry::default(); 2];
    for _ in 0..10 {
        match dev::cq_read(&q, &mut two, W) {
            k if k > 0 => got.extend(two[..k as usize].iter().map(|e| e.op_context)),
            k => assert_eq!(k, -(FI_EAGAIN as isize)),
        }
    }
    assert_eq!(got, vec![100, 101, 102, 103, 104]);
}

/// Under `FI_RM_DISABLED` completions past the queue's size and its ring's are dropped, as
/// for any queue: the XPU reading the ring is told once it has read every entry from before
/// the overrun (`-FI_EOVERRUN`, as `fi_cq_read` answers), where it read `-FI_EAGAIN` for good.
#[test]
fn an_exported_cq_that_overran_says_so_to_its_xpu() {
    let (_w, ep, cq, _av, peer) = inline_ep_with_cq(4);
    let q = cq.export_xpu_slots(Xpu::CPU, 2).unwrap();
    let buf = vec![0u8; 8];
    for i in 0..10 {
        // SAFETY: `buf` outlives the sends (completed inline).
        unsafe { ep.send(&buf, None, peer, 100 + i) }.unwrap();
    }
    // An error entry after the overrun (a receive canceled): the flag waits for it to move.
    let mut rbuf = vec![0u8; 8];
    // SAFETY: `rbuf` outlives the receive, canceled below.
    unsafe { ep.recv(&mut rbuf, None, FI_ADDR_UNSPEC, 500) }.unwrap();
    ep.cancel(500).unwrap();
    let flag = || q.shared().header().overrun.load(Ordering::Acquire);
    let mut got = Vec::new();
    let mut two = [CqTaggedEntry::default(); 2];
    let mut last = 0;
    for _ in 0..20 {
        last = dev::cq_read(&q, &mut two, W);
        if last > 0 {
            got.extend(two[..last as usize].iter().map(|e| e.op_context));
            if got.len() == 6 {
                // The ring's two slots held the last successes while the error waited
                // behind them in the host queue: the XPU is not told yet.
                assert_eq!(
                    flag(),
                    0,
                    "told of the overrun with an entry from before it unread"
                );
            }
            continue;
        }
        if last == -(FI_EAVAIL as isize) {
            assert_eq!(got.len(), 6, "{got:?}");
            let mut e = CqErrEntry::default();
            assert_eq!(dev::cq_readerr(&q, &mut e, 0, W), 1);
            assert_eq!((e.op_context, e.err), (500, FI_ECANCELED));
            got.push(e.op_context);
            continue;
        }
        if last == -(FI_EOVERRUN as isize) {
            break;
        }
        assert_eq!(last, -(FI_EAGAIN as isize));
    }
    assert_eq!(last, -(FI_EOVERRUN as isize), "read {got:?}");
    // The entries from before the overrun, in order, none skipped: the queue's 4 and the
    // ring's 2, then the error.
    let want: Vec<usize> = (100..106).chain([500]).collect();
    assert_eq!(got, want);
    // And it stays so.
    assert_eq!(dev::cq_read(&q, &mut two, W), -(FI_EOVERRUN as isize));
    assert!(matches!(cq.read(&mut two), Err(crate::Error::Overrun)));
    drop(rbuf);
}

#[test]
fn an_exported_cq_keeps_what_does_not_fit_and_loses_nothing() {
    let w = World::new();
    w.sh.inline.store(true, Ordering::Release);
    let n = node(&w);
    let x = n.ep.export_xpu(Xpu::CPU).unwrap();
    let q = n.cq.export_xpu_slots(Xpu::CPU, 2).unwrap();
    let buf = vec![0u8; 8];
    let (_mr, desc) = reg(&w, &buf, 0);
    for i in 0..5 {
        assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, 100 + i, 0, W), 0);
    }
    // One hostile descriptor: its error entry comes through the ring too.
    assert_eq!(
        dev::post_raw(
            &x,
            &XpuDesc {
                opcode: 99,
                context: 7,
                ..Default::default()
            }
        ),
        0
    );
    while n.ep.progress() > 0 {}
    let mut got = Vec::new();
    let mut errs = Vec::new();
    let mut buf3 = [CqTaggedEntry::default(); 3];
    let mut src = [0u64; 3];
    for _ in 0..100 {
        match dev::cq_readfrom(&q, &mut buf3, &mut src, W) {
            k if k > 0 => {
                assert!(k <= 2, "never more than the ring holds");
                got.extend(buf3[..k as usize].iter().map(|e| e.op_context));
                assert_eq!(src[0], FI_ADDR_NOTAVAIL);
            }
            k if k == -(FI_EAVAIL as isize) => {
                let mut e = CqErrEntry::default();
                assert_eq!(dev::cq_readerr(&q, &mut e, 0, W), 1);
                errs.push((e.op_context, e.prov_errno));
            }
            k => assert_eq!(k, -(FI_EAGAIN as isize)),
        }
        n.ep.progress();
    }
    assert_eq!(got, vec![100, 101, 102, 103, 104]);
    assert_eq!(errs, vec![(7, XPU_FAULT_OPCODE)]);
    let mut e = CqErrEntry::default();
    assert_eq!(dev::cq_readerr(&q, &mut e, 0, W), -(FI_EAGAIN as isize));
    let mut one = [crate::entry::CqEntry::default(); 1];
    assert_eq!(dev::cq_read(&q, &mut one, W), -(FI_EAGAIN as isize));
}

#[test]
fn words_an_xpu_may_scribble_on_bound_what_the_host_does() {
    let w = World::new();
    w.sh.inline.store(true, Ordering::Release);
    let n = node(&w);
    let x = n.ep.export_xpu_slots(Xpu::CPU, 4).unwrap();
    let q = n.cq.export_xpu_slots(Xpu::CPU, 2).unwrap();
    let buf = vec![0u8; 8];
    let (_mr, desc) = reg(&w, &buf, 0);
    // A head far ahead of the host's tail: the CQ ring has no room, entries stay on the host.
    q.shared()
        .header()
        .head
        .store(u64::MAX / 2, Ordering::Release);
    // The ring's head and tail as a hostile XPU leaves them: the host keeps its own head (and
    // writes it back over the scribble), and close looks at one lap at most.
    assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, 1, 0, W), 0);
    x.ring().header().head.store(12345, Ordering::Release);
    settle(&n, || !w.sh.ctxs().is_empty());
    assert_eq!(w.sh.ctxs(), vec![1]);
    assert_eq!(x.ring().header().head.load(Ordering::Acquire), 1);
    let mut one = [CqTaggedEntry::default(); 1];
    assert_eq!(dev::cq_read(&q, &mut one, W), -(FI_EAGAIN as isize));
    assert_eq!(
        entries(&n.cq)
            .iter()
            .map(|e| e.op_context)
            .collect::<Vec<_>>(),
        vec![1]
    );
    x.ring().header().tail.store(u64::MAX, Ordering::Release);
    let Node { ep, cq, av: _av } = n;
    ep.close().unwrap();
    // One lap at most, and a run of positions never published is one report, not one each:
    // a tail scribbled a lap ahead of a large ring makes one entry, not thousands (on a CQ
    // that other endpoints' completions need room in).
    let errs = errors(&cq);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].0.prov_errno, XPU_FAULT_UNPUBLISHED);
    assert!(
        errs[0].1.contains("4 descriptors at positions 1 to 4"),
        "{}",
        errs[0].1
    );
}

/// The device calls of a CPU XPU reach the slots through the ring's own address and mask,
/// never the header's `slots` and `mask`, which the XPU can write (another thread of it, or C
/// device code through the same handle): a header pointing both at a buffer of the test's
/// own, with a mask eight times the ring's, leaves that buffer untouched, the descriptors go
/// to the ring, and a full ring still says so at its own size.
#[test]
fn device_calls_follow_the_rings_own_slots_not_the_header() {
    let w = World::new();
    w.sh.inline.store(true, Ordering::Release);
    let n = node(&w);
    let x = n.ep.export_xpu_slots(Xpu::CPU, 4).unwrap();
    let q = n.cq.export_xpu_slots(Xpu::CPU, 4).unwrap();
    let buf = vec![0u8; 8];
    let (_mr, desc) = reg(&w, &buf, 0);
    let decoy = vec![0u64; 8 * 24 * 8];
    // As an XPU writes them: through the handle's address of the headers (`prov_ctx`).
    let eh = x.fid().prov_ctx as *mut RingHeader;
    let ch = q.fid().prov_ctx as *mut CqRingHeader;
    // SAFETY: the live headers of both exported blocks, written as a device would write them
    // (the host never reads these two words back); `decoy` outlives every call below.
    unsafe {
        std::ptr::addr_of_mut!((*eh).slots).write_volatile(decoy.as_ptr() as u64);
        std::ptr::addr_of_mut!((*eh).mask).write_volatile(31);
        std::ptr::addr_of_mut!((*ch).slots).write_volatile(decoy.as_ptr() as u64);
        std::ptr::addr_of_mut!((*ch).mask).write_volatile(31);
    }
    for ctx in 1..=4 {
        assert_eq!(dev::send(&x, p(&buf), 8, desc, 0, 0, ctx, 0, W), 0);
    }
    assert_eq!(
        dev::send(&x, p(&buf), 8, desc, 0, 0, 5, 0, W),
        -FI_EAGAIN,
        "full at the ring's own 4 slots, not the header's 32"
    );
    settle(&n, || w.sh.ctxs().len() == 4);
    assert_eq!(w.sh.ctxs(), vec![1, 2, 3, 4]);
    let mut got = [CqTaggedEntry::default(); 4];
    let mut seen = Vec::new();
    for _ in 0..1000 {
        n.ep.progress();
        let k = dev::cq_read(&q, &mut got, W);
        if k > 0 {
            seen.extend(got[..k as usize].iter().map(|e| e.op_context));
        }
        if seen.len() == 4 {
            break;
        }
    }
    assert_eq!(
        seen,
        vec![1, 2, 3, 4],
        "the CQ ring read through its own slots"
    );
    assert!(
        decoy.iter().all(|&v| v == 0),
        "nothing written where the header pointed"
    );
}

/// A region of a device's memory, exported to the XPU for the whole domain, named by a
/// descriptor on an endpoint opened without `FI_HMEM`: an error entry saying so, nothing
/// started (the provider would have read the device's memory as host memory); the same
/// descriptor on an `FI_HMEM` endpoint starts, staged through the domain's hmem layer.
#[test]
fn device_memory_on_an_endpoint_without_hmem_is_refused() {
    let fake = std::sync::Arc::new(crate::hmem_fake::FakeHmem::default());
    let w = World::with_hmem(fake.clone());
    w.sh.inline.store(true, Ordering::Release);
    let dev_buf = vec![0u8; 64];
    fake.add(&dev_buf);
    let attr = crate::mr::MrAttr {
        addr: dev_buf.as_ptr() as usize,
        len: dev_buf.len(),
        access: FI_SEND,
        requested_key: 0x7700,
        iface: crate::hmem_iface::Iface::Cuda,
        device: 0,
        ..Default::default()
    };
    // SAFETY: `dev_buf` outlives the region (declared before it).
    let mr = unsafe { w.domain.mr_regattr(&attr, 0) }.unwrap();
    let desc = mr.get_xpu_desc().unwrap();
    let n = node(&w);
    assert_eq!(
        n.ep.core().caps & FI_HMEM,
        0,
        "the plain node has no FI_HMEM"
    );
    let x = n.ep.export_xpu(Xpu::CPU).unwrap();
    assert_eq!(dev::send(&x, p(&dev_buf), 8, desc, 0, 0, 31, 0, W), 0);
    let errs = errors_settled(&n, 1);
    assert_eq!(errs.len(), 1);
    assert_eq!(
        (errs[0].0.op_context, errs[0].0.prov_errno),
        (31, XPU_FAULT_RANGE)
    );
    assert!(errs[0].1.contains("FI_HMEM"), "{}", errs[0].1);
    assert!(w.sh.ctxs().is_empty(), "nothing started");

    let mut info = w.domain.info().clone();
    info.caps = XPU_CAPS | FI_HMEM;
    let ep = w.domain.endpoint(&info).unwrap();
    ep.bind_cq(&n.cq, FI_TRANSMIT | FI_RECV).unwrap();
    ep.bind_av(&n.av).unwrap();
    ep.enable().unwrap();
    let hx = ep.export_xpu(Xpu::CPU).unwrap();
    assert_eq!(dev::send(&hx, p(&dev_buf), 8, desc, 0, 0, 32, 0, W), 0);
    let start = std::time::Instant::now();
    while w.sh.ctxs().is_empty() && start.elapsed() < std::time::Duration::from_secs(30) {
        ep.progress();
    }
    assert_eq!(w.sh.ctxs().len(), 1, "started on the FI_HMEM endpoint");
    assert!(errors(&n.cq).is_empty());
}

/// A GPU's blocks (the mock's `FAKE_GPU`, whose device addresses lie far from the host's):
/// every address the device follows is the device's, the host reads and writes through its own
/// (a device address followed from the host would fault here), descriptors stored as a GPU
/// stores them are started as the CPU XPU's are, and the host's device calls refuse a handle
/// whose addresses they cannot follow.
#[test]
fn a_gpus_blocks_carry_device_addresses_and_the_host_reads_its_own() {
    use crate::trigger::testkit::{FAKE_DEVICE_OFFSET, FAKE_GPU};
    let w = World::new();
    w.sh.inline.store(true, Ordering::Release);
    let n = node(&w);
    let x = n.ep.export_xpu_slots(FAKE_GPU, 4).unwrap();
    let ring = x.ring();
    let host = ring.header() as *const RingHeader as u64;
    assert_eq!(x.fid().prov_ctx, host + FAKE_DEVICE_OFFSET, "prov_ctx");
    assert_eq!(
        ring.header().slots,
        x.fid().prov_ctx + size_of::<RingHeader>() as u64,
        "the header's slots: the device's address of slot 0"
    );
    assert_eq!(ring.slot(0) as *const DescSlot as u64, host + 256);
    // The host cannot follow the device's addresses: its device calls say so.
    let buf = vec![7u8; 64];
    let (_mr, desc) = reg(&w, &buf, 0);
    let peer = n.av.get_xpu_addr(0).unwrap();
    assert_eq!(
        dev::send(&x, p(&buf), 8, desc, 0, peer, 1, 0, W),
        -FI_EOPNOTSUPP
    );
    assert_eq!(dev::claim(&x).err(), Some(-FI_EOPNOTSUPP));
    // A GPU's posts, as the host sees its stores: room reserved, position, the slot's words,
    // then seq.
    let h = ring.header();
    for i in 0..6u64 {
        if i == 4 {
            // The ring (4 slots) is full until the watcher drains it.
            assert_eq!(
                ring::reserve(h, h.mask, &ring::Native),
                Err(ring::Refused::Full)
            );
            while n.ep.progress() > 0 {}
        }
        let pos = ring::reserve(h, h.mask, &ring::Native).expect("room");
        let d = XpuDesc {
            opcode: opcode::TSEND,
            check: pos as u32 + 1,
            len: 8,
            buf: buf.as_ptr() as u64,
            desc,
            peer,
            context: 10 + i,
            tag: 100 + i,
            ..Default::default()
        };
        let slot = ring.slot(pos);
        for (k, v) in d.to_words().into_iter().enumerate().skip(1) {
            slot.0[k].store(v, Ordering::Relaxed);
        }
        slot.0[0].store(pos + 1, Ordering::Release);
    }
    let ctxs: Vec<usize> = entries_settled(&n, 6)
        .iter()
        .map(|e| e.op_context)
        .collect();
    assert_eq!(
        ctxs,
        (10..16).collect::<Vec<_>>(),
        "started as the CPU XPU's"
    );
    assert!(errors(&n.cq).is_empty());

    // The CQ's ring and the counter's mirror and ring: device addresses inside, host reads.
    let q = n.cq.export_xpu(FAKE_GPU).unwrap();
    let qh = q.shared().header() as *const CqRingHeader as u64;
    assert_eq!(q.fid().prov_ctx, qh + FAKE_DEVICE_OFFSET);
    assert_eq!(q.shared().header().slots, q.fid().prov_ctx + 192);
    let mut e = [CqTaggedEntry::default(); 1];
    assert_eq!(dev::cq_read(&q, &mut e, W), -(FI_EOPNOTSUPP as isize));
    let cntr = w.cntr();
    let c = cntr.export_xpu(FAKE_GPU).unwrap();
    let m = c.mirror();
    assert_eq!(
        c.fid().prov_ctx,
        m as *const CntrMirror as u64 + FAKE_DEVICE_OFFSET
    );
    assert_eq!(
        m.ring,
        c.ring().ctx(),
        "the mirror names its ring by device address"
    );
    assert_eq!(
        c.ring().ctx(),
        c.ring().header() as *const RingHeader as u64 + FAKE_DEVICE_OFFSET
    );
    cntr.add(3).unwrap();
    assert_eq!(
        dev::cntr_read(&c, W),
        3,
        "the mirror, read through the host's view"
    );
    assert_eq!(dev::cntr_add(&c, 1, W), -FI_EOPNOTSUPP);
    // One XPU per CQ and counter; a queue opened outside a domain has no GPU memory.
    assert!(matches!(
        n.cq.export_xpu(Xpu::CPU),
        Err(crate::error::Error::Inval(_))
    ));
    assert!(matches!(
        cntr.export_xpu(Xpu::CPU),
        Err(crate::error::Error::Inval(_))
    ));
    let lone = CompletionQueue::open(&CqAttr::default()).unwrap();
    assert!(matches!(
        lone.export_xpu(FAKE_GPU),
        Err(crate::error::Error::OpNotSupp(_))
    ));
}

/// What the watcher caches of a region or a peer it validated (`xpu::Checked`) never outlives
/// them: a region closed, an address removed, after descriptors used them, refuse the next;
/// the range and access are checked on every descriptor, the cached region's too.
#[test]
fn a_region_or_peer_validated_before_is_refused_once_closed_or_removed() {
    let w = World::new();
    w.sh.inline.store(true, Ordering::Release);
    let n = node(&w);
    n.av.insert_one(b"other").unwrap();
    let x = n.ep.export_xpu(Xpu::CPU).unwrap();
    let buf = vec![0u8; 64];
    let (mr, desc) = reg(&w, &buf, FI_SEND);
    let (a0, a1) = (n.av.get_xpu_addr(0).unwrap(), n.av.get_xpu_addr(1).unwrap());
    let send = |ctx: usize, peer: u64, at: usize, len: usize| {
        // SAFETY: within `buf` or past it; only the watcher's checks look at the range.
        let p = buf.as_ptr().wrapping_add(at).cast::<c_void>();
        assert_eq!(dev::send(&x, p, len, desc, 0, peer, ctx, 0, W), 0);
        while n.ep.progress() > 0 {}
    };
    send(1, a0, 0, 8);
    send(2, a1, 8, 8);
    // Cached region, range past its end: refused.
    send(3, a1, 60, 8);
    n.av.remove(&[a1]).unwrap();
    send(4, a1, 0, 8);
    send(5, a0, 0, 8);
    drop(mr);
    send(6, a0, 0, 8);
    assert_eq!(w.sh.ctxs(), vec![1, 2, 5]);
    let faults: Vec<_> = errors(&n.cq)
        .iter()
        .map(|(e, _)| (e.op_context, e.prov_errno))
        .collect();
    assert_eq!(
        faults,
        vec![
            (3, XPU_FAULT_RANGE),
            (4, XPU_FAULT_ADDR),
            (6, XPU_FAULT_DESC)
        ]
    );
}
