//! The engine driven deterministically, as quinn-proto's tests drive theirs: two engines (A
//! and B, each the other's peer 0) joined by an in-memory ordered queue per direction, with
//! switches to hold back `on_sent` reports, to move frames one direction at a time, and to
//! lose the peer midway. No threads, no clock. Completions go through `report` into the mock
//! endpoints' CQs, and the tests look at those entries and at the bytes in the buffers.

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::engine::EAGER_LIMIT;
use super::wire::{self, Frame, Kind, Prefix, WireError, PREFIX};
use super::{
    report, Body, Config, Copied, CopyReq, Desc, Dir, Engine, OneSided, PeerId, Sink, Transmit,
    Transport,
};

mod armed;
mod cut;
mod done;
mod early;
mod fuzz;
mod native;
mod pull;
mod small;
use crate::consts::errno::*;
use crate::consts::*;
use crate::entry::{Context, CqErrEntry, CqTaggedEntry};
use crate::ep::atomic::AtomicReq;
use crate::ep::rma::{RmaIov, RmaIovList, RmaOp};
use crate::ep::{EpCore, TxOp};
use crate::hmem_iface::Iface;
use crate::mr::{MemoryRegion, MrAttr};
use crate::rxq::{IovList, PostedRecv};
use crate::trigger::testkit::{Ep, FakeHmem, World};
use crate::{AtomicOp, Datatype};

/// Small, so that the large-message path runs with small buffers.
const EAGER: usize = 64;
/// Remote key of the region the tests register at B.
const KEY: u64 = 0x77;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum S {
    A,
    B,
}

struct Side {
    ep: Ep,
    core: Arc<EpCore>,
    eng: Engine,
    /// Hold `on_sent` reports back (in `held`) instead of making them.
    hold_sent: bool,
    held: Vec<u64>,
    /// What `on_ctrl` refused at this side.
    refused: Vec<WireError>,
    /// Completions being reported (kept for its allocation).
    done: Vec<super::Done>,
    /// Whether the last frame that arrived here came whole (`arrive` alternates).
    whole: bool,
}

/// A transport that copies one-sidedly from `PULL_MIN` bytes: within one process, from the
/// memory a `Desc::of_iov` names.
struct SameProcess;

/// Where the test transport's one-sided copies start.
const PULL_MIN: usize = 100;

impl OneSided for SameProcess {
    fn pull_min(&self) -> usize {
        PULL_MIN
    }

    fn describe(&self, _peer: PeerId, iov: &IovList, _dir: Dir) -> Option<Desc> {
        Some(Desc::of_iov(iov))
    }
}

impl Side {
    fn new(world: &World) -> Side {
        Side::with(world, false)
    }

    /// A side whose transport copies one-sidedly (`SameProcess`) when `one_sided`.
    fn with(world: &World, one_sided: bool) -> Side {
        let mut s = Side::on(world.ep());
        if one_sided {
            s.eng = s.eng.with_one_sided(Box::new(SameProcess));
        }
        s
    }

    /// A side on endpoint `ep` (one of `World::ep_with`'s, for other capabilities).
    fn on(ep: Ep) -> Side {
        let core = ep.ep.core().clone();
        let eng = Engine::new(
            core.clone(),
            Config {
                eager_max: EAGER,
                ..Config::default()
            },
        );
        Side {
            ep,
            core,
            eng,
            hold_sent: false,
            held: Vec::new(),
            refused: Vec::new(),
            done: Vec::new(),
            whole: false,
        }
    }

    fn report(&mut self) {
        self.eng.take_done_into(&mut self.done);
        report(&self.core, &mut self.done);
    }

    fn send(&mut self, op: TxOp) {
        // SAFETY: every test keeps its send buffers alive until the operation ends.
        unsafe { self.eng.post_send(0, &op) }.unwrap();
        self.report();
    }

    fn recv(&mut self, r: PostedRecv) {
        // SAFETY: every test keeps its receive buffers alive, and reads them only after the
        // receive ends.
        unsafe { self.eng.post_recv(r) }.unwrap();
        self.report();
    }

    fn rma(&mut self, op: RmaOp) {
        // SAFETY: every test keeps its local RMA buffers alive until the operation ends.
        unsafe { self.eng.post_rma(0, &op) }.unwrap();
        self.report();
    }

    fn atomic(&mut self, req: AtomicReq) -> crate::error::Result<()> {
        // SAFETY: every test keeps operand, compare and result alive until the operation
        // ends.
        let r = unsafe { self.eng.post_atomic(0, &req) };
        self.report();
        r
    }

    /// Every CQ entry now there: (successes, errors).
    fn cq(&self) -> (Vec<CqTaggedEntry>, Vec<CqErrEntry>) {
        let (mut ok, mut err) = (Vec::new(), Vec::new());
        loop {
            let (o, e) = (self.ep.entries(), self.ep.errors());
            if o.is_empty() && e.is_empty() {
                return (ok, err);
            }
            ok.extend(o);
            err.extend(e);
        }
    }

    /// Asserts the CQ is empty.
    fn quiet(&self) {
        let (ok, err) = self.cq();
        assert!(ok.is_empty() && err.is_empty(), "{ok:?} {err:?}");
    }

    /// Asserts the CQ holds exactly one success, for `ctx`, and returns it.
    fn one(&self, ctx: Context) -> CqTaggedEntry {
        let (ok, err) = self.cq();
        assert!(err.is_empty(), "{err:?}");
        assert_eq!(ok.len(), 1, "{ok:?}");
        assert_eq!(ok[0].op_context, ctx);
        ok[0]
    }

    /// Asserts the CQ holds exactly one error, for `ctx`, and returns it.
    fn one_err(&self, ctx: Context) -> CqErrEntry {
        let (ok, err) = self.cq();
        assert!(ok.is_empty(), "{ok:?}");
        assert_eq!(err.len(), 1, "{err:?}");
        assert_eq!(err[0].op_context, ctx);
        err[0]
    }
}

/// The bytes of a frame's body.
fn body_bytes(b: &Body) -> Vec<u8> {
    match b {
        Body::None => Vec::new(),
        Body::Inline(v) => v.to_vec(),
        Body::Owned(v) => v.clone(),
        Body::Iov(iov) => {
            let mut v = vec![0u8; iov.total()];
            // SAFETY: a body's memory is valid until its frame is reported sent: the tests'
            // buffers or registered memory, all alive.
            unsafe { iov.copy_out(0, &mut v) };
            v
        }
    }
}

/// Fills `sink` from `body` as a transport does: into memory (the rest dropped), a buffer,
/// or nowhere.
fn fill(sink: Sink, body: &[u8]) -> Sink {
    assert!(
        !matches!(sink, Sink::Wait),
        "flow control in a test that does not expect it"
    );
    // SAFETY: the engine keeps a sink's memory valid until on_body; it is the tests' receive
    // buffers or registered memory, not aliased by `body`.
    unsafe { sink.fill(body) }
}

/// Performs `p` as a transport that reaches its peer's memory would: between the memory the
/// peer's `Desc::of_iov` names and the local side, the way `p.dir` says.
fn perform(p: &CopyReq) {
    let remote = p.remote.to_iov().expect("a descriptor written by of_iov");
    let (from, to) = match p.dir {
        Dir::Read => (remote, p.local),
        Dir::Write => (p.local, remote),
    };
    let mut v = vec![0u8; p.len];
    // SAFETY: the descriptor names a test's buffer, alive until its operation ends, and the
    // local side is the transport's until `on_copied`.
    unsafe {
        from.copy_out(0, &mut v);
        to.copy_in(0, &v);
    }
}

/// Hands `to` one frame from peer 0: control part, then body. The refusal, if any.
fn arrive(to: &mut Side, ctrl: &[u8], body: &[u8]) -> Result<(), WireError> {
    let p = wire::prefix(ctrl)?;
    let end = (PREFIX + p.ctrl_len as usize).min(ctrl.len());
    // Every other frame whole (`on_frame`, as a message transport hands it over), the rest
    // in two steps (`on_ctrl`, `on_body`, as a stream does): both ways run in every test.
    to.whole = !to.whole;
    let r = if to.whole {
        match to.eng.on_frame(0, 0, &p, &ctrl[PREFIX..end], body) {
            Ok(true) => Ok(()),
            Ok(false) => panic!("flow control in a test that does not expect it"),
            Err(e) => Err(e),
        }
    } else {
        to.eng.on_ctrl(0, 0, &p, &ctrl[PREFIX..end]).map(|sink| {
            let sink = fill(sink, body);
            to.eng.on_body(0, sink);
        })
    };
    if let Err(e) = r {
        to.refused.push(e);
    }
    r
}

struct Net {
    a: Side,
    b: Side,
    /// B's registered memory (`KEY`), when a test asked for it.
    mr: Option<MemoryRegion>,
    world: World,
}

impl Net {
    fn new() -> Net {
        Net::on(World::new())
    }

    fn on(world: World) -> Net {
        Net::sides(world, false, false)
    }

    /// A pair whose transports copy one-sidedly where `a` and `b` say.
    fn sides(world: World, a: bool, b: bool) -> Net {
        Net {
            a: Side::with(&world, a),
            b: Side::with(&world, b),
            mr: None,
            world,
        }
    }

    fn pair(&mut self, from: S) -> (&mut Side, &mut Side) {
        match from {
            S::A => (&mut self.a, &mut self.b),
            S::B => (&mut self.b, &mut self.a),
        }
    }

    fn report(&mut self) {
        self.a.report();
        self.b.report();
    }

    /// Moves one frame from `from` to the other side; its kind, or `None` if none was queued.
    fn step(&mut self, from: S) -> Option<Kind> {
        self.step_with(from, |t| t)
    }

    /// `step`, letting `edit` change the frame on the way.
    fn step_with(&mut self, from: S, edit: impl FnOnce(Transmit) -> Transmit) -> Option<Kind> {
        let (src, dst) = self.pair(from);
        let t = edit(src.eng.poll_transmit()?);
        let kind = wire::decode_all(&t.ctrl).ok().map(|(f, _)| f.kind());
        let kind = kind.or_else(|| {
            let p = wire::prefix(&t.ctrl).ok()?;
            wire::decode(&p, &t.ctrl[PREFIX..]).ok().map(|f| f.kind())
        });
        let body = body_bytes(&t.body);
        assert_eq!(
            wire::prefix(&t.ctrl).map(|p| p.body_len),
            Ok(body.len() as u64),
            "a frame announces its body's length"
        );
        let _ = arrive(dst, &t.ctrl, &body);
        if let Some(tok) = t.token {
            if src.hold_sent {
                src.held.push(tok);
            } else {
                src.eng.on_sent(0, tok);
            }
        }
        self.report();
        kind
    }

    /// Moves every frame `from` has queued (and those queued meanwhile).
    fn flush(&mut self, from: S) -> Vec<Kind> {
        let mut kinds = Vec::new();
        while let Some(k) = self.step(from) {
            kinds.push(k);
            assert!(kinds.len() < 1000, "runaway");
        }
        kinds
    }

    /// Moves frames both ways until neither side has any.
    fn pump(&mut self) {
        for _ in 0..100 {
            let a = self.flush(S::A);
            let b = self.flush(S::B);
            if a.is_empty() && b.is_empty() {
                return;
            }
        }
        panic!("the engines never went quiet");
    }

    /// Reports `from`'s held-back `on_sent`s.
    fn release_sent(&mut self, from: S) {
        let (s, _) = self.pair(from);
        for tok in std::mem::take(&mut s.held) {
            s.eng.on_sent(0, tok);
        }
        self.report();
    }

    /// Registers `buf` at B under `KEY` for remote read and write; the address of its byte
    /// `off` as a peer names it.
    fn register(&mut self, buf: &[u8]) {
        // SAFETY: the tests' registered buffers outlive the region (kept in `self.mr`, and
        // every test declares its buffer before its `Net`).
        let mr = unsafe {
            self.world
                .domain
                .mr_reg(buf, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, KEY)
        }
        .unwrap();
        assert_eq!(mr.key(), KEY);
        self.mr = Some(mr);
    }

    /// Registers `buf`, device memory of the test's CUDA double, at B under `KEY` for remote
    /// read and write; the address of its start as a peer names it.
    fn register_device(&mut self, buf: &[u8]) -> u64 {
        let attr = MrAttr {
            addr: buf.as_ptr() as usize,
            len: buf.len(),
            access: FI_REMOTE_READ | FI_REMOTE_WRITE,
            requested_key: KEY,
            iface: Iface::Cuda,
            device: 0,
            ..Default::default()
        };
        // SAFETY: the tests' registered buffers outlive the region (kept in `self.mr`, and
        // every test declares its buffer before its `Net`).
        self.mr = Some(unsafe { self.world.domain.mr_regattr(&attr, 0) }.unwrap());
        self.raddr(buf.as_ptr(), 0)
    }

    /// The remote address of byte `off` of the buffer registered at `base`.
    fn raddr(&self, base: *const u8, off: usize) -> u64 {
        if self.b.core.mr.mode() & FI_MR_VIRT_ADDR != 0 {
            (base as usize + off) as u64
        } else {
            off as u64
        }
    }
}

fn iov(buf: &[u8]) -> IovList {
    IovList::one(buf.as_ptr() as usize, buf.len())
}

fn iov_mut(buf: &mut [u8]) -> IovList {
    IovList::one(buf.as_mut_ptr() as usize, buf.len())
}

fn send(ctx: Context, buf: &[u8], tag: Option<u64>, data: Option<u64>, flags: u64) -> TxOp {
    let kind = if tag.is_some() { FI_TAGGED } else { FI_MSG };
    let cq_data = if data.is_some() { FI_REMOTE_CQ_DATA } else { 0 };
    TxOp {
        ctx,
        iov: iov(buf),
        dest: 0,
        tag: tag.unwrap_or(0),
        data: data.unwrap_or(0),
        flags: kind | cq_data | flags,
    }
}

fn recv(ctx: Context, buf: &mut [u8], tag: Option<u64>, flags: u64) -> PostedRecv {
    PostedRecv {
        ctx,
        iov: iov_mut(buf),
        src: FI_ADDR_UNSPEC,
        tag: tag.unwrap_or(0),
        ignore: 0,
        flags: (if tag.is_some() { FI_TAGGED } else { FI_MSG }) | flags,
        used: 0,
        from_xpu: false,
    }
}

fn rma(ctx: Context, local: IovList, segs: &[RmaIov], data: Option<u64>, flags: u64) -> RmaOp {
    RmaOp {
        ctx,
        iov: local,
        dest: 0,
        rma: RmaIovList::from_segs(segs).unwrap(),
        data: data.unwrap_or(0),
        flags: FI_RMA | flags | if data.is_some() { FI_REMOTE_CQ_DATA } else { 0 },
    }
}

fn seg(addr: u64, len: usize, key: u64) -> RmaIov {
    RmaIov { addr, len, key }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

// 1. Eager messages.

#[test]
fn eager_posted_first_untagged() {
    let data = pattern(20, 1);
    let mut buf = vec![0u8; 32];
    let mut net = Net::new();
    net.b.recv(recv(10, &mut buf, None, 0));
    net.a.send(send(1, &data, None, None, 0));
    assert_eq!(net.flush(S::A), vec![Kind::Msg]);
    let e = net.b.one(10);
    assert_eq!(e.flags, FI_RECV | FI_MSG);
    assert_eq!(e.len, 20);
    assert_eq!(&buf[..20], &data[..]);
    assert!(buf[20..].iter().all(|&b| b == 0));
    let e = net.a.one(1);
    assert_eq!(e.flags, FI_SEND | FI_MSG);
    // Nothing answers a transmit-complete eager message.
    assert_eq!(net.flush(S::B), vec![]);
}

#[test]
fn eager_unexpected_tagged_with_data() {
    let d1 = pattern(20, 2);
    let d2 = pattern(7, 3);
    let (mut b1, mut b2) = (vec![0u8; 64], vec![0u8; 64]);
    let mut net = Net::new();
    // A receive for tag 1 waits while a message for tag 2 arrives unexpected.
    net.b.recv(recv(11, &mut b1, Some(1), 0));
    net.a.send(send(1, &d2, Some(2), Some(0xd00d), 0));
    net.pump();
    net.b.quiet();
    assert_eq!(net.b.eng.buffered().unexpected, 1);
    net.a.one(1);
    net.b.recv(recv(12, &mut b2, Some(2), 0));
    let e = net.b.one(12);
    assert_eq!(e.flags, FI_RECV | FI_TAGGED | FI_REMOTE_CQ_DATA);
    assert_eq!((e.len, e.tag, e.data), (7, 2, 0xd00d));
    assert_eq!(&b2[..7], &d2[..]);
    assert_eq!(net.b.eng.buffered().unexpected, 0);
    // The waiting receive takes the next message for its tag.
    net.a.send(send(2, &d1, Some(1), None, 0));
    net.pump();
    let e = net.b.one(11);
    assert_eq!((e.flags, e.len, e.tag), (FI_RECV | FI_TAGGED, 20, 1));
    assert_eq!(&b1[..20], &d1[..]);
    net.a.one(2);
    // Tagged and untagged never match each other.
    let mut b3 = vec![0u8; 8];
    net.b.recv(recv(13, &mut b3, None, 0));
    net.a.send(send(3, &d2, Some(0), None, 0));
    net.pump();
    net.b.quiet();
}

#[test]
fn eager_truncation_posted_and_unexpected() {
    let data = pattern(20, 4);
    let (mut b1, mut b2) = (vec![0u8; 8], vec![0u8; 8]);
    let mut net = Net::new();
    net.b.recv(recv(10, &mut b1, None, 0));
    net.a.send(send(1, &data, None, None, 0));
    net.pump();
    let e = net.b.one_err(10);
    assert_eq!((e.err, e.len, e.olen), (FI_ETRUNC, 8, 12));
    assert_eq!(&b1[..], &data[..8]);
    net.a.one(1);
    net.a.send(send(2, &data, Some(5), None, 0));
    net.pump();
    net.b.recv(recv(11, &mut b2, Some(5), 0));
    let e = net.b.one_err(11);
    assert_eq!((e.err, e.len, e.olen, e.tag), (FI_ETRUNC, 8, 12, 5));
    assert_eq!(&b2[..], &data[..8]);
}

// 2. Large messages.

#[test]
fn large_posted_first_completes_sender_on_ack() {
    let data = pattern(200, 5);
    let mut buf = vec![0u8; 300];
    let mut net = Net::new();
    net.b.recv(recv(10, &mut buf, Some(9), 0));
    net.a.send(send(1, &data, Some(9), Some(42), 0));
    assert_eq!(net.flush(S::A), vec![Kind::Rts]);
    net.b.quiet();
    assert_eq!(net.flush(S::B), vec![Kind::Cts]);
    assert_eq!(net.step(S::A), Some(Kind::Data));
    let e = net.b.one(10);
    assert_eq!(e.flags, FI_RECV | FI_TAGGED | FI_REMOTE_CQ_DATA);
    assert_eq!((e.len, e.tag, e.data), (200, 9, 42));
    assert_eq!(&buf[..200], &data[..]);
    // Sent, but not acknowledged: not complete.
    net.a.quiet();
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    assert_eq!(net.a.one(1).flags, FI_SEND | FI_TAGGED);
    assert!(!net.a.eng.busy() && !net.b.eng.busy());
}

#[test]
fn large_unexpected_and_truncated() {
    let data = pattern(200, 6);
    let (mut b1, mut b2) = (vec![0u8; 200], vec![0u8; 100]);
    let mut net = Net::new();
    net.a.send(send(1, &data, None, None, 0));
    assert_eq!(net.flush(S::A), vec![Kind::Rts]);
    // Never buffered: only the announcement waits.
    assert_eq!(net.flush(S::B), vec![]);
    assert_eq!(net.b.eng.buffered().unexpected, 1);
    net.b.recv(recv(10, &mut b1, None, 0));
    net.pump();
    assert_eq!(net.b.one(10).len, 200);
    assert_eq!(&b1[..], &data[..]);
    net.a.one(1);
    // A smaller receive takes what fits.
    net.a.send(send(2, &data, None, None, 0));
    net.pump();
    net.b.recv(recv(11, &mut b2, None, 0));
    net.pump();
    let e = net.b.one_err(11);
    assert_eq!((e.err, e.len, e.olen), (FI_ETRUNC, 100, 100));
    assert_eq!(&b2[..], &data[..100]);
    net.a.one(2);
}

#[test]
fn large_peek_claim_discard() {
    let data = pattern(200, 7);
    let other = pattern(150, 8);
    let mut buf = vec![0u8; 256];
    let mut none = [0u8; 0];
    let mut net = Net::new();
    net.a.send(send(1, &data, Some(7), Some(3), 0));
    net.a.send(send(2, &other, Some(8), None, 0));
    net.pump();
    // Peek: found, left in place.
    net.b.recv(recv(20, &mut none, Some(7), FI_PEEK));
    let e = net.b.one(20);
    assert_eq!((e.len, e.tag, e.data), (200, 7, 3));
    assert_eq!(net.b.eng.buffered().unexpected, 2);
    // Peek for a tag nobody sent: FI_ENOMSG.
    net.b.recv(recv(21, &mut none, Some(99), FI_PEEK));
    assert_eq!(net.b.one_err(21).err, FI_ENOMSG);
    // Claim it, then receive the claimed message.
    net.b.recv(recv(22, &mut none, Some(7), FI_PEEK | FI_CLAIM));
    assert_eq!(net.b.one(22).len, 200);
    // A second claim under the same context is refused: it would lose the first message.
    // SAFETY: a peek moves no data.
    let again = unsafe {
        net.b
            .eng
            .post_recv(recv(22, &mut none, Some(8), FI_PEEK | FI_CLAIM))
    };
    assert!(matches!(again, Err(crate::Error::Busy(_))), "{again:?}");
    // (A claimed message still counts as buffered.)
    assert_eq!(net.b.eng.buffered().unexpected, 2);
    net.b.recv(recv(22, &mut buf, Some(7), FI_CLAIM));
    assert_eq!(net.flush(S::B), vec![Kind::Cts]);
    net.pump();
    let e = net.b.one(22);
    assert_eq!((e.len, e.tag, e.data), (200, 7, 3));
    assert_eq!(&buf[..200], &data[..]);
    net.a.one(1);
    assert_eq!(net.b.eng.buffered().unexpected, 1);
    // Discard: the sender completes, and no data moves.
    net.b
        .recv(recv(23, &mut none, Some(8), FI_PEEK | FI_DISCARD));
    assert_eq!(net.b.one(23).len, 150);
    assert_eq!(net.flush(S::B), vec![Kind::Cts]);
    assert_eq!(net.flush(S::A), vec![]);
    net.a.one(2);
    assert_eq!(net.b.eng.buffered().unexpected, 0);
    assert!(!net.a.eng.busy() && !net.b.eng.busy());
}

// 3. Completion levels.

#[test]
fn transmit_complete_waits_for_on_sent() {
    let data = pattern(30, 9);
    let mut buf = vec![0u8; 30];
    let mut net = Net::new();
    net.a.hold_sent = true;
    net.b.recv(recv(10, &mut buf, None, 0));
    net.a.send(send(1, &data, None, None, FI_TRANSMIT_COMPLETE));
    net.pump();
    net.b.one(10);
    net.a.quiet();
    net.release_sent(S::A);
    net.a.one(1);
}

#[test]
fn delivery_complete_waits_for_ack() {
    let data = pattern(30, 10);
    let mut buf = vec![0u8; 30];
    let mut net = Net::new();
    net.b.recv(recv(10, &mut buf, None, 0));
    net.a.send(send(1, &data, None, None, FI_DELIVERY_COMPLETE));
    assert_eq!(net.flush(S::A), vec![Kind::Msg]);
    net.b.one(10);
    net.a.quiet();
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    net.a.one(1);
    // Acknowledged but not yet reported sent: still not complete.
    net.a.hold_sent = true;
    net.b.recv(recv(11, &mut buf, None, 0));
    net.a.send(send(2, &data, None, None, FI_DELIVERY_COMPLETE));
    net.pump();
    net.b.one(11);
    net.a.quiet();
    net.release_sent(S::A);
    net.a.one(2);
}

#[test]
fn match_complete_waits_for_the_receive() {
    let data = pattern(30, 11);
    let mut buf = vec![0u8; 30];
    let mut net = Net::new();
    net.a.send(send(1, &data, None, None, FI_MATCH_COMPLETE));
    net.pump();
    net.a.quiet();
    net.b.recv(recv(10, &mut buf, None, 0));
    net.b.one(10);
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    net.a.one(1);
}

#[test]
fn delivery_complete_unexpected_waits_for_the_receive() {
    let data = pattern(30, 25);
    let mut buf = vec![0u8; 30];
    let mut net = Net::new();
    net.a.send(send(1, &data, None, None, FI_DELIVERY_COMPLETE));
    assert_eq!(net.flush(S::A), vec![Kind::Msg]);
    // Buffered is not delivered: no acknowledgement yet.
    assert_eq!(net.flush(S::B), vec![]);
    net.a.quiet();
    net.b.recv(recv(10, &mut buf, None, 0));
    net.b.one(10);
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    net.a.one(1);
    assert_eq!(&buf[..], &data[..]);
}

#[test]
fn multi_recv_windows_and_release() {
    let (m1, m2, m3) = (pattern(30, 26), pattern(80, 27), pattern(30, 28));
    let mut buf = vec![0u8; 200];
    let base = buf.as_ptr() as usize;
    let mut net = Net::new();
    net.b.eng.set_min_multi_recv(64);
    net.b.recv(recv(10, &mut buf, None, FI_MULTI_RECV));
    net.a.send(send(1, &m1, None, None, 0));
    net.a.send(send(2, &m2, None, None, 0));
    net.a.send(send(3, &m3, None, None, 0));
    net.pump();
    let (ok, err) = net.b.cq();
    assert!(err.is_empty(), "{err:?}");
    // The large one finishes last, and releases the buffer: 60 bytes left is under 64.
    let got: Vec<_> = ok
        .iter()
        .map(|e| (e.op_context, e.len, e.buf - base))
        .collect();
    assert_eq!(got, [(10, 30, 0), (10, 30, 110), (10, 80, 30)]);
    let released: Vec<_> = ok.iter().map(|e| e.flags & FI_MULTI_RECV != 0).collect();
    assert_eq!(released, [false, false, true]);
    assert_eq!(&buf[..30], &m1[..]);
    assert_eq!(&buf[30..110], &m2[..]);
    assert_eq!(&buf[110..140], &m3[..]);
}

/// Two threads took `first` then `second` under B's provider lock; the first is slow to
/// report: the second reports meanwhile (through `report_unlocked`), the first then. Returns
/// what B's CQ held before the first reported (nothing, where the second waits its turn).
fn report_second_while_the_first_waits(
    b: &Side,
    mut first: Vec<crate::rdm::Done>,
    second: Vec<crate::rdm::Done>,
) -> Vec<CqTaggedEntry> {
    use crate::rdm::done::{multi_ticket, multi_turn};
    let core = b.core.clone();
    let ticket = multi_ticket(&core, &first);
    assert!(ticket.is_some(), "the first batch takes no turn");
    let state = std::sync::Mutex::new(second);
    std::thread::scope(|s| {
        let two = s.spawn(|| {
            crate::rdm::report_unlocked(
                &core,
                state.lock().unwrap(),
                |v: &mut Vec<crate::rdm::Done>| v,
            )
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        let early = b.cq().0;
        let turn = multi_turn(&core, ticket);
        report(&core, &mut first);
        drop(turn);
        two.join().unwrap();
        early
    })
}

/// Two threads each report a batch they took under the provider's lock: the second holds
/// the buffer's release, the first an earlier message in it. The release waits its turn, so
/// the application never sees the buffer handed back before every entry that points into it.
#[test]
fn a_multi_receive_release_waits_for_the_earlier_windows_another_thread_took() {
    let (m1, m2) = (pattern(40, 1), pattern(40, 2));
    let mut buf = vec![0u8; 80];
    let mut net = Net::new();
    net.b.eng.set_min_multi_recv(32);
    net.b.recv(recv(10, &mut buf, None, FI_MULTI_RECV));
    net.a.send(send(1, &m1, None, None, 0));
    net.a.send(send(2, &m2, None, None, 0));
    // Each message arrives alone and is taken as a batch of its own.
    let batch = |net: &mut Net| {
        let t = net.a.eng.poll_transmit().expect("a message");
        let body = body_bytes(&t.body);
        arrive(&mut net.b, &t.ctrl, &body).unwrap();
        net.b.eng.take_done()
    };
    let first = batch(&mut net);
    let second = batch(&mut net);
    assert_eq!((first.len(), second.len()), (1, 1));
    let early = report_second_while_the_first_waits(&net.b, first, second);
    assert!(
        early.is_empty(),
        "the release was reported first: {early:?}"
    );
    let (ok, err) = net.b.cq();
    assert!(err.is_empty(), "{err:?}");
    let released: Vec<_> = ok.iter().map(|e| e.flags & FI_MULTI_RECV != 0).collect();
    assert_eq!(released, [false, true]);
}

// 4. RMA.

#[test]
fn rma_write_and_read() {
    let mut tgt = vec![0u8; 128];
    let src = pattern(16, 12);
    let mut back = vec![0u8; 32];
    let mut net = Net::new();
    net.register(&tgt);
    let base = net.raddr(tgt.as_mut_ptr(), 0);
    let at = |off: u64| base + off;
    let w = rma(1, iov(&src), &[seg(at(8), 16, KEY)], Some(0xabc), FI_WRITE);
    let r = rma(2, iov_mut(&mut back), &[seg(at(0), 32, KEY)], None, FI_READ);
    net.a.rma(w);
    assert_eq!(net.flush(S::A), vec![Kind::Write]);
    let e = net.b.one(0);
    assert_eq!(e.flags, FI_REMOTE_WRITE | FI_RMA | FI_REMOTE_CQ_DATA);
    assert_eq!((e.len, e.data), (16, 0xabc));
    // The initiator completes on the target's acknowledgement.
    net.a.quiet();
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    assert_eq!(net.a.one(1).flags, FI_RMA | FI_WRITE);
    assert_eq!(&tgt[8..24], &src[..]);
    net.a.rma(r);
    net.pump();
    assert_eq!(net.a.one(2).flags, FI_RMA | FI_READ);
    assert_eq!(&back[..8], &[0u8; 8]);
    assert_eq!(&back[8..24], &src[..]);
    // A read carries no CQ data and the endpoint did not ask for FI_RMA_EVENT.
    net.b.quiet();
}

/// A write that follows a read from the same initiator waits while the read's answer, whose
/// body is the target's memory itself, is still with the transport: it must not change what
/// is being sent (FI_ORDER_WAR).
#[test]
fn write_waits_while_a_read_answer_carries_the_memory() {
    let mut tgt = pattern(4096, 3);
    let before = tgt.clone();
    let mut back = vec![0u8; 4096];
    let src = pattern(4096, 9);
    let mut net = Net::new();
    net.register(&tgt);
    let at = net.raddr(tgt.as_mut_ptr(), 0);
    net.a.rma(rma(
        1,
        iov_mut(&mut back),
        &[seg(at, 4096, KEY)],
        None,
        FI_READ,
    ));
    assert_eq!(net.flush(S::A), vec![Kind::Read]);
    // The answer is with B's transport, its bytes not yet all taken.
    let answer = net.b.eng.poll_transmit().expect("the read's answer");
    assert!(
        matches!(answer.body, Body::Iov(_)),
        "the answer is the memory read"
    );
    net.a
        .rma(rma(2, iov(&src), &[seg(at, 4096, KEY)], None, FI_WRITE));
    let write = net.a.eng.poll_transmit().expect("the write");
    let p = wire::prefix(&write.ctrl).unwrap();
    let sink = net.b.eng.on_ctrl(0, 0, &p, &write.ctrl[PREFIX..]).unwrap();
    assert!(matches!(sink, Sink::Wait), "the write waits for the answer");
    assert_eq!(tgt, before);
    // The transport takes the answer's last byte: the write goes ahead.
    arrive(&mut net.a, &answer.ctrl, &body_bytes(&answer.body)).unwrap();
    net.b
        .eng
        .on_sent(0, answer.token.expect("the answer's bytes are tracked"));
    arrive(&mut net.b, &write.ctrl, &body_bytes(&write.body)).unwrap();
    if let Some(t) = write.token {
        net.a.eng.on_sent(0, t);
    }
    net.pump();
    let (done, errs) = net.a.cq();
    let flags: Vec<_> = done.iter().map(|e| (e.op_context, e.flags)).collect();
    assert_eq!(flags, vec![(1, FI_RMA | FI_READ), (2, FI_RMA | FI_WRITE)]);
    assert!(errs.is_empty());
    assert_eq!(back, before);
    assert_eq!(tgt, src);
}

#[test]
fn rma_refused_leaves_the_target_untouched() {
    let mut tgt = vec![0u8; 128];
    let src = pattern(16, 13);
    let mut back = vec![0xeeu8; 16];
    let mut net = Net::new();
    net.register(&tgt);
    let base = net.raddr(tgt.as_mut_ptr(), 0);
    let at = |off: u64| base + off;
    let ops = [
        rma(1, iov(&src), &[seg(at(0), 16, KEY + 1)], Some(1), FI_WRITE),
        rma(2, iov(&src), &[seg(at(120), 16, KEY)], Some(1), FI_WRITE),
        rma(
            3,
            iov_mut(&mut back),
            &[seg(at(0), 16, KEY + 1)],
            None,
            FI_READ,
        ),
        rma(
            4,
            iov_mut(&mut back),
            &[seg(at(120), 16, KEY)],
            None,
            FI_READ,
        ),
    ];
    for op in ops {
        let ctx = op.ctx;
        net.a.rma(op);
        net.pump();
        assert_eq!(net.a.one_err(ctx).err, FI_EACCES, "op {ctx}");
        net.b.quiet();
    }
    assert!(tgt.iter().all(|&b| b == 0));
    assert!(back.iter().all(|&b| b == 0xee));
    // A write whose body is longer than its ranges: refused whole.
    net.a
        .rma(rma(5, iov(&src), &[seg(at(0), 8, KEY)], Some(1), FI_WRITE));
    net.pump();
    assert_eq!(net.a.one_err(5).err, FI_EINVAL);
    net.b.quiet();
    assert!(tgt.iter().all(|&b| b == 0));
}

#[test]
fn rma_commit_complete_write() {
    let mut tgt = vec![0u8; 64];
    let src = pattern(16, 29);
    let mut net = Net::new();
    net.register(&tgt);
    let at = net.raddr(tgt.as_mut_ptr(), 0);
    net.a.rma(rma(
        1,
        iov(&src),
        &[seg(at, 16, KEY)],
        None,
        FI_WRITE | FI_COMMIT_COMPLETE,
    ));
    net.pump();
    net.a.one(1);
    assert_eq!(&tgt[..16], &src[..]);
}

#[test]
fn rma_into_device_memory() {
    let fake = Arc::new(FakeHmem::default());
    let tgt = vec![0u8; 64];
    fake.add(&tgt);
    let src = pattern(16, 32);
    let mut back = vec![0u8; 16];
    let mut net = Net::on(World::with_hmem(fake.clone()));
    let at = net.register_device(&tgt);
    net.a.rma(rma(
        1,
        iov(&src),
        &[seg(at + 8, 16, KEY)],
        Some(5),
        FI_WRITE,
    ));
    net.pump();
    net.a.one(1);
    assert_eq!(net.b.one(0).data, 5);
    assert_eq!(&tgt[8..24], &src[..]);
    assert!(fake.from_host.load(std::sync::atomic::Ordering::Acquire) > 0);
    net.a.rma(rma(
        2,
        iov_mut(&mut back),
        &[seg(at + 8, 16, KEY)],
        None,
        FI_READ,
    ));
    net.pump();
    net.a.one(2);
    assert_eq!(&back[..], &src[..]);
    // The device copy fails: the initiator hears FI_EIO, the target reports nothing.
    fake.fail.store(true, std::sync::atomic::Ordering::Release);
    net.a
        .rma(rma(3, iov(&back), &[seg(at, 16, KEY)], Some(5), FI_WRITE));
    net.pump();
    assert_eq!(net.a.one_err(3).err, FI_EIO);
    net.b.quiet();
    assert!(!net.b.core.staging.any());
    fake.fail.store(false, std::sync::atomic::Ordering::Release);
    // A staged write whose body never comes (the peer is lost): its bounce buffer goes.
    net.a
        .rma(rma(4, iov(&src), &[seg(at, 16, KEY)], None, FI_WRITE));
    let t = net.a.eng.poll_transmit().unwrap();
    let p = wire::prefix(&t.ctrl).unwrap();
    assert!(matches!(
        net.b.eng.on_ctrl(0, 0, &p, &t.ctrl[PREFIX..]),
        Ok(Sink::Iov(_))
    ));
    assert!(net.b.core.staging.any());
    net.b.eng.on_lost(0, FI_ECONNRESET);
    net.a.eng.on_lost(0, FI_ECONNRESET);
    net.report();
    assert!(!net.b.core.staging.any());
    assert_eq!(net.a.one_err(4).err, FI_ECONNRESET);
    net.b.quiet();
}

// 5. Atomics.

fn atomic(ctx: Context, addr: u64, op: AtomicOp, args: (&u64, Option<&u64>)) -> AtomicReq {
    AtomicReq {
        ctx,
        dest: 0,
        addr,
        key: KEY,
        dt: Datatype::UInt64,
        op,
        count: 1,
        operand: args.0 as *const u64 as usize,
        compare: args.1.map_or(0, |c| c as *const u64 as usize),
        result: 0,
        flags: FI_ATOMIC | FI_WRITE,
    }
}

fn fetching(mut req: AtomicReq, result: &mut u64) -> AtomicReq {
    req.result = result as *mut u64 as usize;
    req.flags = FI_ATOMIC | FI_READ;
    req
}

#[test]
fn atomics_execute_at_the_target() {
    let mut tgt = Box::new([40u64, 0]);
    let mut net = Net::new();
    net.register(bytemuck::bytes_of(&*tgt));
    let at = net.raddr(tgt.as_mut_ptr() as *const u8, 0);
    let (two, five, hundred) = (2u64, 5u64, 100u64);
    let (mut r1, mut r2, mut r3) = (0u64, 0u64, 0u64);
    net.a
        .atomic(fetching(
            atomic(1, at, AtomicOp::Sum, (&two, None)),
            &mut r1,
        ))
        .unwrap();
    net.pump();
    assert_eq!(net.a.one(1).flags, FI_ATOMIC | FI_READ);
    assert_eq!((r1, tgt[0]), (40, 42));
    net.a
        .atomic(atomic(2, at, AtomicOp::Sum, (&five, None)))
        .unwrap();
    net.pump();
    assert_eq!(net.a.one(2).flags, FI_ATOMIC | FI_WRITE);
    assert_eq!(tgt[0], 47);
    // Compare-swap: swaps when equal, not otherwise; the old value comes back either way.
    let (c47, c1) = (47u64, 1u64);
    let req = atomic(3, at, AtomicOp::Cswap, (&hundred, Some(&c47)));
    net.a.atomic(fetching(req, &mut r2)).unwrap();
    net.pump();
    net.a.one(3);
    assert_eq!((r2, tgt[0]), (47, 100));
    let req = atomic(4, at, AtomicOp::Cswap, (&two, Some(&c1)));
    net.a.atomic(fetching(req, &mut r3)).unwrap();
    net.pump();
    net.a.one(4);
    assert_eq!((r3, tgt[0]), (100, 100));
    assert_eq!(tgt[1], 0);
    // B asked for no FI_RMA_EVENT: atomics leave no entry there.
    net.b.quiet();
}

#[test]
fn atomics_refused_touch_nothing() {
    let mut tgt = Box::new([40u64, 0]);
    let mut net = Net::new();
    net.register(bytemuck::bytes_of(&*tgt));
    let at = net.raddr(tgt.as_mut_ptr() as *const u8, 0);
    let one = 1u64;
    let mut res = 0xeeu64;
    // A datatype and an op no peer may name, put into A's frame on the way.
    for (ctx, field) in [(1, 28), (2, 24)] {
        let req = fetching(atomic(ctx, at, AtomicOp::Sum, (&one, None)), &mut res);
        net.a.atomic(req).unwrap();
        let kind = net.step_with(S::A, |mut t| {
            // AtomicHdr: id, count, addr, key, op (at 24), datatype (at 28).
            t.ctrl[PREFIX + field..PREFIX + field + 4].copy_from_slice(&999u32.to_le_bytes());
            t
        });
        assert_eq!(kind, Some(Kind::Atomic));
        net.pump();
        assert_eq!(net.a.one_err(ctx).err, FI_EINVAL);
    }
    // A bad key, an address past the region.
    let mut req = fetching(atomic(3, at, AtomicOp::Sum, (&one, None)), &mut res);
    req.key = KEY + 1;
    net.a.atomic(req).unwrap();
    net.pump();
    assert_eq!(net.a.one_err(3).err, FI_EACCES);
    let req = atomic(4, at + 16, AtomicOp::Sum, (&one, None));
    net.a.atomic(req).unwrap();
    net.pump();
    assert_eq!(net.a.one_err(4).err, FI_EACCES);
    assert_eq!((tgt[0], tgt[1], res), (40, 0, 0xee));
    net.b.quiet();
}

// 6. Fences.

/// Posts at A a write of `src` into B's registered `tgt` (ctx 1), then a fenced read of it
/// into `back` (ctx 2), then a send of `msg` (ctx 3) that B's receive into `buf` (ctx 10)
/// takes. Returns the write's remote address. Every buffer must outlive the operations.
fn write_fenced_read_send(
    net: &mut Net,
    tgt: &mut [u8],
    src: &[u8],
    back: &mut [u8],
    msg: &[u8],
    buf: &mut [u8],
) -> u64 {
    net.register(tgt);
    let at = net.raddr(tgt.as_mut_ptr(), 0);
    net.b.recv(recv(10, buf, None, 0));
    net.a
        .rma(rma(1, iov(src), &[seg(at, 16, KEY)], None, FI_WRITE));
    let read = rma(2, iov_mut(back), &[seg(at, 16, KEY)], None, FI_READ);
    net.a.rma(RmaOp {
        flags: read.flags | FI_FENCE,
        ..read
    });
    net.a.send(send(3, msg, None, None, 0));
    at
}

#[test]
fn fenced_read_waits_for_the_write() {
    let mut tgt = vec![0u8; 64];
    let src = pattern(16, 14);
    let mut back = vec![0u8; 16];
    let msg = pattern(10, 15);
    let mut buf = vec![0u8; 10];
    let mut net = Net::new();
    let at = write_fenced_read_send(&mut net, &mut tgt, &src, &mut back, &msg, &mut buf);
    // A fenced atomic is refused while operations wait.
    let one = 1u64;
    let mut req = atomic(4, at, AtomicOp::Sum, (&one, None));
    req.flags |= FI_FENCE;
    assert!(matches!(
        net.a.atomic(req),
        Err(crate::error::Error::Again(_))
    ));
    assert_eq!(net.flush(S::A), vec![Kind::Write]);
    net.a.quiet();
    // The write's acknowledgement lets the read go, and the send after it, in order.
    assert_eq!(net.step(S::B), Some(Kind::Ack));
    assert_eq!(net.a.one(1).flags, FI_RMA | FI_WRITE);
    assert_eq!(net.flush(S::A), vec![Kind::Read, Kind::Msg]);
    net.pump();
    let (ok, err) = net.a.cq();
    assert!(err.is_empty(), "{err:?}");
    let mut ctxs: Vec<_> = ok.iter().map(|e| e.op_context).collect();
    ctxs.sort();
    assert_eq!(ctxs, [2, 3]);
    assert_eq!(&back[..], &src[..]);
    assert_eq!(net.b.one(10).len, 10);
    assert_eq!(&buf[..], &msg[..]);
}

#[test]
fn fenced_send_waits_for_a_large_send() {
    let big = pattern(200, 16);
    let small = pattern(8, 17);
    let (mut b1, mut b2) = (vec![0u8; 200], vec![0u8; 8]);
    let mut net = Net::new();
    net.b.recv(recv(10, &mut b1, None, 0));
    net.b.recv(recv(11, &mut b2, None, 0));
    net.a.send(send(1, &big, None, None, 0));
    net.a.send(send(2, &small, None, None, FI_FENCE));
    assert_eq!(net.flush(S::A), vec![Kind::Rts]);
    assert_eq!(net.flush(S::B), vec![Kind::Cts]);
    assert_eq!(net.flush(S::A), vec![Kind::Data]);
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    assert_eq!(net.flush(S::A), vec![Kind::Msg]);
    let (ok, _) = net.a.cq();
    assert_eq!(ok.iter().map(|e| e.op_context).collect::<Vec<_>>(), [1, 2]);
    let (ok, _) = net.b.cq();
    assert_eq!(
        ok.iter().map(|e| e.op_context).collect::<Vec<_>>(),
        [10, 11]
    );
}

#[test]
fn canceled_fenced_op_lets_the_rest_go() {
    let mut tgt = vec![0u8; 64];
    let src = pattern(16, 30);
    let mut back = vec![0u8; 16];
    let msg = pattern(10, 31);
    let mut buf = vec![0u8; 10];
    let mut net = Net::new();
    write_fenced_read_send(&mut net, &mut tgt, &src, &mut back, &msg, &mut buf);
    net.a.eng.cancel(2).unwrap();
    net.report();
    assert_eq!(net.a.one_err(2).err, FI_ECANCELED);
    assert!(net.a.eng.cancel(2).is_err());
    assert_eq!(net.flush(S::A), vec![Kind::Write]);
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    assert_eq!(net.flush(S::A), vec![Kind::Msg]);
    let (ok, _) = net.a.cq();
    assert_eq!(ok.iter().map(|e| e.op_context).collect::<Vec<_>>(), [1, 3]);
    net.b.one(10);
    assert!(back.iter().all(|&x| x == 0));
}

// 7. Peer loss.

#[test]
fn lost_mid_rendezvous() {
    let data = pattern(200, 18);
    let mut buf = vec![0u8; 200];
    let mut net = Net::new();
    net.b.recv(recv(10, &mut buf, None, 0));
    net.a.send(send(1, &data, None, None, 0));
    assert_eq!(net.step(S::A), Some(Kind::Rts));
    assert_eq!(net.step(S::B), Some(Kind::Cts));
    // A has the Data queued; the connection goes.
    net.b.eng.on_lost(0, FI_ECONNRESET);
    net.a.eng.on_lost(0, FI_ECONNRESET);
    net.report();
    let e = net.b.one_err(10);
    assert_eq!((e.err, e.flags), (FI_ECONNRESET, FI_RECV | FI_MSG));
    assert_eq!(net.a.one_err(1).err, FI_ECONNRESET);
    assert_eq!(net.flush(S::A), vec![]);
    assert!(buf.iter().all(|&b| b == 0));
    assert!(!net.a.eng.busy() && !net.b.eng.busy());
    // The peer is back: messages flow again.
    net.b.recv(recv(11, &mut buf, None, 0));
    net.a.send(send(2, &data, None, None, 0));
    net.pump();
    net.b.one(11);
    net.a.one(2);
    assert_eq!(&buf[..], &data[..]);
}

#[test]
fn lost_at_the_sender_fails_with_its_errno() {
    let mut tgt = vec![0u8; 64];
    let data = pattern(200, 19);
    let mut back = vec![0u8; 16];
    let mut net = Net::new();
    net.register(&tgt);
    let at = net.raddr(tgt.as_mut_ptr(), 0);
    net.a.send(send(1, &data, None, None, 0));
    net.a.rma(rma(
        2,
        iov_mut(&mut back),
        &[seg(at, 16, KEY)],
        None,
        FI_READ,
    ));
    net.a
        .send(send(3, &data[..10], None, None, FI_DELIVERY_COMPLETE));
    net.a.eng.on_lost(0, libc::EPIPE);
    net.report();
    let (ok, err) = net.a.cq();
    assert!(ok.is_empty());
    let mut got: Vec<_> = err.iter().map(|e| (e.op_context, e.err)).collect();
    got.sort();
    assert_eq!(got, [(1, libc::EPIPE), (2, libc::EPIPE), (3, libc::EPIPE)]);
    assert_eq!(net.flush(S::A), vec![]);
    net.a.rma(rma(
        4,
        iov_mut(&mut back),
        &[seg(at, 16, KEY)],
        None,
        FI_READ,
    ));
    net.pump();
    net.a.one(4);
}

#[test]
fn lost_peer_unexpected_rts_fails_on_match() {
    let data = pattern(200, 20);
    let mut buf = vec![0u8; 200];
    let mut net = Net::new();
    net.a.send(send(1, &data, None, None, 0));
    assert_eq!(net.flush(S::A), vec![Kind::Rts]);
    net.b.eng.on_lost(0, FI_ECONNRESET);
    net.a.eng.on_lost(0, FI_ECONNRESET);
    net.report();
    assert_eq!(net.a.one_err(1).err, FI_ECONNRESET);
    net.b.recv(recv(10, &mut buf, None, 0));
    assert_eq!(net.b.one_err(10).err, FI_ECONNRESET);
    // No Cts goes to the new connection for the old announcement.
    assert_eq!(net.flush(S::B), vec![]);
}

#[test]
fn lost_peer_old_match_ack_cannot_complete_a_new_request() {
    let data = pattern(10, 21);
    let (mut b1, mut b2) = (vec![0u8; 10], vec![0u8; 10]);
    let mut net = Net::new();
    // A match-complete message waits unexpected at B; the connection goes.
    net.a.send(send(1, &data, None, None, FI_MATCH_COMPLETE));
    net.pump();
    net.a.eng.on_lost(0, FI_ECONNRESET);
    net.b.eng.on_lost(0, FI_ECONNRESET);
    net.report();
    assert_eq!(net.a.one_err(1).err, FI_ECONNRESET);
    // A's next match-complete send reuses the old one's id and waits unexpected behind it.
    net.a.send(send(2, &data, None, None, FI_MATCH_COMPLETE));
    net.pump();
    net.a.quiet();
    // The old message is delivered; its acknowledgement would name the new request.
    net.b.recv(recv(10, &mut b1, None, 0));
    net.b.one(10);
    assert_eq!(net.flush(S::B), vec![]);
    net.a.quiet();
    // The new message's own acknowledgement ends it.
    net.b.recv(recv(11, &mut b2, None, 0));
    net.b.one(11);
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    net.a.one(2);
}

// 9. Close.

/// A write the target acknowledged (it took effect there) whose frame the transport has not
/// yet reported sent ends as the target said, not as failed, when the peer is lost or the
/// endpoint closes meanwhile: an application told it failed would apply it again.
#[test]
fn an_acknowledged_write_ends_as_acknowledged_on_a_loss_or_a_close() {
    for close in [false, true] {
        let mut tgt = vec![0u8; 64];
        let src = pattern(16, 30);
        let mut net = Net::new();
        net.register(&tgt);
        let at = net.raddr(tgt.as_mut_ptr(), 0);
        net.a.hold_sent = true;
        net.a
            .rma(rma(1, iov(&src), &[seg(at, 16, KEY)], None, FI_WRITE));
        assert_eq!(net.step(S::A), Some(Kind::Write));
        assert_eq!(net.step(S::B), Some(Kind::Ack));
        assert!(tgt[..16] == src[..], "the write took effect");
        net.a.quiet();
        if close {
            net.a.eng.close();
        } else {
            net.a.eng.on_lost(0, FI_ECONNRESET);
        }
        net.report();
        net.a.one(1);
    }
}

/// A close drops the go-ahead (`Cts`) a receive it canceled had queued: the peer would send
/// the whole message to an endpoint that takes none of it (and shm's closing endpoint took
/// that for garbage and lost the peer, answers owed to it included).
#[test]
fn a_close_sends_no_go_ahead_for_a_receive_it_canceled() {
    let big = pattern(200, 31);
    let mut buf = vec![0u8; 200];
    let mut net = Net::new();
    net.b.recv(recv(10, &mut buf, None, 0));
    net.a.send(send(1, &big, None, None, 0));
    assert_eq!(net.step(S::A), Some(Kind::Rts));
    net.b.eng.close();
    net.report();
    assert_eq!(net.b.one_err(10).err, FI_ECANCELED);
    assert_eq!(net.step(S::B), None, "a go-ahead went out after the close");
}

/// A close still sends the `Cts` that tells a sender a discarding receive took its large
/// message (it asks for no data): that send completes, as the message was taken.
#[test]
fn a_close_still_tells_a_sender_its_message_was_discarded() {
    let big = pattern(150, 32);
    let mut none = vec![0u8; 0];
    let mut net = Net::new();
    net.a.send(send(2, &big, Some(8), None, 0));
    assert_eq!(net.step(S::A), Some(Kind::Rts));
    net.b
        .recv(recv(23, &mut none, Some(8), FI_PEEK | FI_DISCARD));
    assert_eq!(net.b.one(23).len, 150);
    net.b.eng.close();
    net.report();
    assert_eq!(net.flush(S::B), vec![Kind::Cts]);
    net.a.one(2);
}

#[test]
fn close_cancels_everything() {
    let mut tgt = vec![0u8; 64];
    let big = pattern(200, 23);
    let small = pattern(10, 24);
    let mut back = vec![0u8; 16];
    let (mut b1, mut b2, mut b3) = (vec![0u8; 200], vec![0u8; 10], vec![0u8; 10]);
    let mut net = Net::new();
    net.register(&tgt);
    let at = net.raddr(tgt.as_mut_ptr(), 0);
    // B: a pipe (a matched large message), a message whose body is arriving, a posted receive.
    net.b.recv(recv(10, &mut b1, Some(1), 0));
    net.b.recv(recv(11, &mut b2, Some(2), 0));
    net.b.recv(recv(12, &mut b3, Some(3), 0));
    net.a.send(send(1, &big, Some(1), None, 0));
    assert_eq!(net.step(S::A), Some(Kind::Rts));
    let msg = Frame::Msg {
        id: 0,
        tag: 2,
        data: 0,
        flags: wire::flags::TAGGED,
    }
    .to_vec(10);
    let p = wire::prefix(&msg).unwrap();
    assert!(matches!(
        net.b.eng.on_ctrl(0, 0, &p, &msg[PREFIX..]),
        Ok(Sink::Iov(_))
    ));
    // A: a large send waiting for Cts (above), a delivery-complete send, a read, a fenced
    // write behind it.
    net.a
        .send(send(2, &small, None, None, FI_DELIVERY_COMPLETE));
    net.a.rma(rma(
        3,
        iov_mut(&mut back),
        &[seg(at, 16, KEY)],
        None,
        FI_READ,
    ));
    let w = rma(4, iov(&small), &[seg(at, 10, KEY)], None, FI_WRITE);
    net.a.rma(RmaOp {
        flags: w.flags | FI_FENCE,
        ..w
    });
    net.a.eng.close();
    net.b.eng.close();
    net.report();
    let ends = |s: &Side| {
        let (ok, err) = s.cq();
        assert!(ok.is_empty(), "{ok:?}");
        assert!(err.iter().all(|e| e.err == FI_ECANCELED), "{err:?}");
        let mut c: Vec<_> = err.iter().map(|e| e.op_context).collect();
        c.sort();
        c
    };
    assert_eq!(ends(&net.a), [1, 2, 3, 4]);
    assert_eq!(ends(&net.b), [10, 11, 12]);
    // No frame reads memory that was handed back, and no request ended above goes out.
    for s in [&mut net.a, &mut net.b] {
        while let Some(t) = s.eng.poll_transmit() {
            assert!(!matches!(t.body, Body::Iov(_)));
            assert!(
                crate::rdm::answer_charge(&t).is_some(),
                "a request's frame went out"
            );
        }
    }
    // The body that was arriving lands nowhere; closed engines take nothing new.
    net.b.eng.on_body(0, Sink::Discard);
    net.report();
    net.b.quiet();
    // SAFETY: refused at once; nothing is kept.
    assert!(unsafe { net.a.eng.post_send(0, &send(5, &small, None, None, 0)) }.is_err());
    assert!(tgt.iter().all(|&x| x == 0));
}

/// One peer's unexpected messages take at most its share of the endpoint's places (as its
/// bytes take at most `unexp_peer_bytes`): past it, its next waits, and another peer's message
/// is still buffered. Else one peer's empty messages, each charged 128 bytes, took every place
/// and every other peer waited until the application received them.
#[test]
fn one_peers_unexpected_messages_take_only_its_share_of_the_places() {
    let world = World::new();
    let mut a = Side::new(&world);
    let mut b = Side::new(&world);
    b.eng = Engine::new(
        b.core.clone(),
        Config {
            eager_max: EAGER,
            unexp_msgs: 8,
            unexp_bytes: 1 << 22,
            unexp_peer_bytes: 1 << 20,
            ..Config::default()
        },
    );
    for i in 0..4 {
        a.send(send(i, &[], None, None, 0));
    }
    let frames: Vec<Transmit> = std::iter::from_fn(|| a.eng.poll_transmit()).collect();
    let offer = |b: &mut Side, peer: PeerId, t: &Transmit| {
        let p = wire::prefix(&t.ctrl).unwrap();
        b.eng.on_ctrl(peer, 0, &p, &t.ctrl[PREFIX..]).unwrap()
    };
    // The share: 8 places x 1 MiB / 4 MiB = 2.
    for t in &frames[..2] {
        let sink = offer(&mut b, 1, t);
        b.eng.on_body(1, fill(sink, &[]));
    }
    assert!(matches!(offer(&mut b, 1, &frames[2]), Sink::Wait));
    let sink = offer(&mut b, 2, &frames[3]);
    assert!(!matches!(sink, Sink::Wait), "another peer waited");
    b.eng.on_body(2, fill(sink, &[]));
    assert_eq!(b.eng.buffered().unexpected, 3);
}

/// Flow control: past the bound on unexpected messages, a message no receive takes is answered
/// `Sink::Wait` (the transport keeps it) and nothing is buffered for it; once a receive takes a
/// buffered one, the same frame offered again is taken. A message a posted receive takes, and a
/// large message's announcement past the bound, are handled alike.
#[test]
fn unexpected_messages_past_the_bound_wait_with_the_transport() {
    let world = World::new();
    let mut a = Side::new(&world);
    let mut b = Side::new(&world);
    b.eng = Engine::new(
        b.core.clone(),
        Config {
            eager_max: EAGER,
            unexp_msgs: 2,
            // The endpoint's bound, which this one peer may take all of.
            unexp_peer_bytes: Config::default().unexp_bytes,
            ..Config::default()
        },
    );
    let msgs: Vec<Vec<u8>> = (0..3).map(|i| pattern(16, i as u8)).collect();
    for (i, m) in msgs.iter().enumerate() {
        a.send(send(i, m, None, None, 0));
    }
    let frames: Vec<Transmit> = std::iter::from_fn(|| a.eng.poll_transmit()).collect();
    assert_eq!(frames.len(), 3);
    let offer = |b: &mut Side, t: &Transmit| {
        let p = wire::prefix(&t.ctrl).unwrap();
        b.eng.on_ctrl(0, 0, &p, &t.ctrl[PREFIX..]).unwrap()
    };
    for t in &frames[..2] {
        let sink = offer(&mut b, t);
        b.eng.on_body(0, fill(sink, &body_bytes(&t.body)));
    }
    assert_eq!(b.eng.buffered().unexpected, 2);
    // The third waits, again and again, and is not buffered.
    for _ in 0..3 {
        assert!(matches!(offer(&mut b, &frames[2]), Sink::Wait));
    }
    assert_eq!(b.eng.buffered().unexpected, 2);
    // A large message's announcement waits too.
    let big = pattern(EAGER + 1, 9);
    a.send(send(9, &big, None, None, 0));
    let rts = a.eng.poll_transmit().unwrap();
    assert!(matches!(offer(&mut b, &rts), Sink::Wait));
    // A receive takes the first buffered message: room for one more.
    let mut r0 = vec![0u8; 16];
    b.recv(recv(100, &mut r0, None, 0));
    assert_eq!(b.one(100).len, 16);
    assert_eq!(r0, msgs[0]);
    let sink = offer(&mut b, &frames[2]);
    assert!(matches!(sink, Sink::Buffer(_)));
    b.eng.on_body(0, fill(sink, &body_bytes(&frames[2].body)));
    assert_eq!(b.eng.buffered().unexpected, 2);
    // With a receive posted, the waiting announcement is taken straight away.
    let mut rb = vec![0u8; EAGER + 1];
    let mut r1 = vec![0u8; 16];
    let mut r2 = vec![0u8; 16];
    b.recv(recv(101, &mut r1, None, 0));
    b.recv(recv(102, &mut r2, None, 0));
    b.recv(recv(103, &mut rb, None, 0));
    assert_eq!((r1.clone(), r2.clone()), (msgs[1].clone(), msgs[2].clone()));
    assert!(matches!(offer(&mut b, &rts), Sink::Discard));
    b.eng.on_body(0, Sink::Discard);
    // It answered with a clear-to-send for the pipe the receive now waits on.
    let cts = b.eng.poll_transmit().unwrap();
    let p = wire::prefix(&cts.ctrl).unwrap();
    assert!(matches!(
        wire::decode(&p, &cts.ctrl[PREFIX..]),
        Ok(Frame::Cts { .. })
    ));
}

/// Every byte a peer makes the engine hold is charged before it is allocated: an unexpected
/// body is charged when its header is accepted (not when it completes), against the
/// endpoint's bound and the peer's share; past either, the header waits with the transport.
/// A body abandoned by a lost peer gives its charge back.
#[test]
fn bodies_in_flight_are_charged_when_their_header_is_accepted() {
    const LEN: u64 = 1000;
    const ONE: usize = LEN as usize + crate::rdm::engine::UNEXP_OVERHEAD; // payload, bookkeeping
    let world = World::new();
    let b = Side::new(&world);
    let mut eng = Engine::new(
        b.core.clone(),
        Config {
            eager_max: EAGER,
            unexp_bytes: 4 * ONE,
            unexp_peer_bytes: 2 * ONE,
            ..Config::default()
        },
    );
    let ctrl = Frame::Msg {
        id: 1,
        tag: 0,
        data: 0,
        flags: 0,
    }
    .ctrl(LEN);
    let p = wire::prefix(&ctrl).unwrap();
    let offer = |eng: &mut Engine, peer: PeerId| eng.on_ctrl(peer, 0, &p, &ctrl[PREFIX..]).unwrap();
    // Peer 1 at its share: one body arrived, one arriving; a third waits.
    let s = offer(&mut eng, 1);
    eng.on_body(1, fill(s, &[1; LEN as usize]));
    assert!(matches!(offer(&mut eng, 1), Sink::Buffer(_)));
    // (its body never finishes; the transport offers nothing more from it meanwhile)
    // Peers 2 and 3 start bodies that never finish: the endpoint's bound is reached with
    // one body buffered and three in flight.
    assert!(matches!(offer(&mut eng, 2), Sink::Buffer(_)));
    assert!(matches!(offer(&mut eng, 3), Sink::Buffer(_)));
    for peer in 4..64 {
        assert!(matches!(offer(&mut eng, peer), Sink::Wait), "peer {peer}");
    }
    assert_eq!(
        eng.buffered().unexpected_bytes,
        4 * ONE,
        "one buffered, three arriving"
    );
    // A peer lost mid-body gives its charge back: one more header is taken.
    eng.on_lost(2, FI_ECONNRESET);
    assert!(matches!(offer(&mut eng, 4), Sink::Buffer(_)));
    assert!(matches!(offer(&mut eng, 5), Sink::Wait));
    // Peer 1's share, by itself: its finished body and the one arriving.
    eng.on_body(
        1,
        fill(Sink::Buffer(vec![0; LEN as usize]), &[1; LEN as usize]),
    );
    eng.on_lost(3, FI_ECONNRESET);
    eng.on_lost(4, FI_ECONNRESET);
    assert_eq!(eng.buffered().unexpected_bytes, 2 * ONE);
    assert!(
        matches!(offer(&mut eng, 1), Sink::Wait),
        "past peer 1's share"
    );
    assert!(
        matches!(offer(&mut eng, 6), Sink::Buffer(_)),
        "others still fit"
    );
}

/// What the engine costs per 8-byte injected message, both sides (post, transmit, arrival,
/// completions), without a transport: run alone (`--ignored engine_cost_per_small_message`,
/// release, under `valgrind --tool=callgrind` for instruction counts).
#[test]
#[ignore = "a measurement, not a check"]
fn engine_cost_per_small_message() {
    const N: usize = 100_000;
    let data = [7u8; 8];
    let mut buf = [0u8; 8];
    let mut net = Net::new();
    let t0 = std::time::Instant::now();
    for _ in 0..N {
        net.b.recv(recv(10, &mut buf, None, 0));
        net.a.send(send(1, &data, None, None, FI_INJECT));
        net.step(S::A);
        assert_eq!(net.a.ep.entries().len() + net.b.ep.entries().len(), 2);
    }
    eprintln!("{:?} per message", t0.elapsed() / N as u32);
}

/// A receive posted after a message's header arrived unexpected, while its body is still on
/// its way (a transport delivers a body over several progress calls): it takes that message
/// when the body lands, in full. It used to find nothing unexpected when posted, and the
/// message was then kept unexpected: the receive waited for the sender's next one.
#[test]
fn a_receive_posted_while_an_unexpected_body_arrives_takes_it() {
    let world = World::new();
    let mut a = Side::new(&world);
    let mut b = Side::new(&world);
    let msg = pattern(32, 7);
    a.send(send(1, &msg, Some(5), None, 0));
    let t = a.eng.poll_transmit().unwrap();
    let p = wire::prefix(&t.ctrl).unwrap();
    let sink = b.eng.on_ctrl(0, 0, &p, &t.ctrl[PREFIX..]).unwrap();
    assert!(matches!(sink, Sink::Buffer(_)), "no receive yet: buffered");
    let mut buf = vec![0u8; 64];
    b.recv(recv(7, &mut buf, Some(5), 0));
    b.eng.on_body(0, fill(sink, &body_bytes(&t.body)));
    b.report();
    let e = b.one(7);
    assert_eq!((e.len, e.tag), (32, 5));
    assert_eq!(&buf[..32], &msg[..]);
    assert_eq!(b.eng.buffered().unexpected, 0, "nothing left unexpected");
}

/// A message from a sender the AV did not hold, whose body is still arriving when the
/// application inserts the sender and posts a receive directed at it: once the body ends,
/// that receive takes it (its source looked up again, `Engine::resolve_sources`). Before,
/// it was buffered under no source, and the directed receive never matched it.
#[test]
fn a_body_arriving_as_its_sender_is_inserted_goes_to_the_receive_directed_at_it() {
    use crate::trigger::testkit::ALL_CAPS;
    let world = World::new();
    let mut a = Side::new(&world);
    let mut b = Side::on(world.ep_with(ALL_CAPS | FI_DIRECTED_RECV, 64, &[]));
    let data = pattern(40, 3);
    a.send(send(1, &data, Some(5), None, 0));
    let t = a.eng.poll_transmit().expect("the message");
    let p = wire::prefix(&t.ctrl).unwrap();
    // Its header, from a sender the AV does not hold: no receive, a buffer for the body.
    let sink = b
        .eng
        .on_ctrl(0, FI_ADDR_NOTAVAIL, &p, &t.ctrl[PREFIX..])
        .unwrap();
    // The application inserts the sender (as fi_addr 3) and receives from it.
    b.eng.resolve_sources(|_| Some(3));
    let mut buf = vec![0u8; 40];
    let mut r = recv(9, &mut buf, Some(5), 0);
    r.src = 3;
    b.recv(r);
    b.eng.on_body(0, fill(sink, &body_bytes(&t.body)));
    b.report();
    assert_eq!(b.one(9).len, 40);
    assert_eq!(buf, data);
}

/// A multi-receive buffer canceled with a message in it, that message's entry unread: the
/// application reads the message first, then the cancel's entry that releases the buffer
/// (`FI_MULTI_RECV` on an error entry). Before, the queue answered the error first, and the
/// message's entry then pointed into a buffer the application had been told was released.
#[test]
fn a_multi_receive_buffers_release_by_cancel_is_read_after_its_messages() {
    let m1 = pattern(30, 29);
    let mut buf = vec![0u8; 200];
    let mut net = Net::new();
    net.b.eng.set_min_multi_recv(16);
    net.b.recv(recv(10, &mut buf, None, FI_MULTI_RECV));
    net.a.send(send(1, &m1, None, None, 0));
    net.pump();
    net.b.eng.cancel(10).unwrap();
    net.b.report();
    let cq = &net.b.ep.cq;
    let mut e = [CqTaggedEntry::default(); 4];
    assert_eq!(
        cq.readerr(),
        Err(crate::Error::Again("cq readerr")),
        "the message first"
    );
    assert_eq!(cq.read(&mut e), Ok(1));
    assert_eq!((e[0].op_context, e[0].len), (10, 30));
    assert_eq!(e[0].flags & FI_MULTI_RECV, 0);
    assert_eq!(cq.read(&mut e), Err(crate::Error::Avail));
    let c = cq.readerr().unwrap();
    assert_eq!((c.op_context, c.err), (10, FI_ECANCELED));
    assert_ne!(c.flags & FI_MULTI_RECV, 0, "the release");
}

/// A peek's entry carries a source only where the endpoint reports sources (`FI_SOURCE`), as
/// a receive's does. Before, a peek on an endpoint without it reported the sender's address.
#[test]
fn a_peeks_source_is_reported_only_with_fi_source() {
    let m = pattern(20, 30);
    let mut net = Net::new();
    net.a.send(send(1, &m, Some(7), None, 0));
    net.pump();
    net.b.recv(recv(4, &mut [], Some(7), FI_PEEK));
    net.b.report();
    let mut e = [CqTaggedEntry::default(); 1];
    let mut src = [0u64; 1];
    assert_eq!(net.b.ep.cq.readfrom(&mut e, &mut src), Ok(1));
    assert_eq!((e[0].op_context, e[0].len), (4, 20));
    assert_eq!(src[0], FI_ADDR_NOTAVAIL, "the endpoint has no FI_SOURCE");
}

/// A message claimed by a peek (`FI_PEEK | FI_CLAIM`) is then received into device memory:
/// the claim comes staged, under the staging key, and finds the message claimed under the
/// application's context. Before, it found none (`FI_ENOMSG`), and the message stayed
/// claimed for good.
#[test]
fn a_claimed_message_is_received_into_device_memory() {
    use crate::trigger::testkit::ALL_CAPS;
    let fake = std::sync::Arc::new(FakeHmem::default());
    let world = World::with_hmem(fake.clone());
    let mut a = Side::new(&world);
    let mut b = Side::on(world.ep_with(ALL_CAPS | FI_HMEM, 64, &[]));
    let core = b.core.clone();
    let data = pattern(32, 4);
    a.send(send(1, &data, Some(7), None, 0));
    let t = a.eng.poll_transmit().expect("the message");
    arrive(&mut b, &t.ctrl, &body_bytes(&t.body)).unwrap();
    b.recv(recv(20, &mut [], Some(7), FI_PEEK | FI_CLAIM));
    assert_eq!(b.one(20).len, 32);
    let dev = vec![0u8; 32];
    fake.add(&dev);
    let staged = core
        .stage_in(20, &iov(&dev), false)
        .unwrap()
        .expect("device memory is staged");
    let claim = recv(20, &mut [], Some(7), FI_CLAIM);
    core.post_staged(staged, false, |ctx, bounce| {
        // SAFETY: the bounce buffer lives until the receive completes.
        unsafe {
            b.eng.post_recv(PostedRecv {
                ctx,
                iov: bounce,
                ..claim
            })
        }
    })
    .unwrap();
    b.report();
    assert_eq!(b.one(20).len, 32);
    assert_eq!(dev, data, "landed in the device memory");
}
