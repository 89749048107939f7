//! Frames shm holds back because the engine answered them `Sink::Wait`.
//!
//! Frames held because the unexpected-message bound is reached wait for receives the
//! application has not posted: no progress call can move them, so they must not keep the
//! endpoint from sleeping. Before, they did, and a blocking read (`fi_cq_sread`) spun a core
//! until the application posted a receive, which any local process could cause by sending one
//! message past the bound. `fi_trywait` on a CQ that waits on a descriptor says whether
//! sleeping is safe. Past the held queue's bound the lane stalls with messages still in it:
//! those cannot be read until the held ones move, and must not count as work either.
//!
//! A peer's held frames are still taken after it is gone (what it fully sent is delivered): a
//! read among them is served and its answer dropped, and a write behind the read, which waits
//! until the read's answer no longer carries the memory read, then goes ahead. Before, the
//! dropped answer was never reported and the write waited for good. A large message among
//! them whose data was to come from the peer ends the receive that takes it with an error;
//! before, that receive waited for good. One the peer offered by descriptor is not read once
//! the peer is gone (its buffer is its application's again). A peer lost while its lane is
//! stalled is unmapped once its goodbye is read.
//!
//! The unexpected-message bound is set in the environment once, before the first endpoint
//! opens (`setup`).

mod common;

use std::time::Instant;

use common::*;
use xfabric::*;
use xfabric_core::rdm::wire::{self, Frame};
use xfabric_core::rdm::Desc;
use xfabric_core::{RmaIov, RmaIovList};
use xfabric_providers::shm::raw::{RawPeer, FRAME, HELD_MAX};

const UNEXP: usize = 4;
/// Held in the sender's queue (the bound on it) and left in its ring behind them, the lane
/// stalled.
const HELD: usize = HELD_MAX + 8;

fn setup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::env::set_var("XFABRIC_SHM_UNEXP_MSGS", UNEXP.to_string()));
}

/// Writes tagged 8-byte messages `tags` from `raw`, the bytes naming the tag.
fn messages(raw: &mut RawPeer, tags: std::ops::Range<u64>) {
    for i in tags {
        let b = tagged_frame(i, &i.to_le_bytes());
        assert!(raw.send_raw(FRAME, &b, 64), "message {i} did not fit");
    }
}

/// One progress call of `n` (a read of its CQ, whatever it holds dropped).
fn poll(n: &Node) {
    let _ = n.cq.read(&mut [CqTaggedEntry::default(); 4]);
}

/// Drives `n` until `done`, failing with `what` past `deadline`.
fn drive_until(n: &Node, deadline: Instant, what: &str, mut done: impl FnMut() -> bool) {
    while !done() {
        poll(n);
        assert!(Instant::now() < deadline, "{what}");
    }
}

/// Drives `n` until a send to `to` fails as to a peer known gone.
fn until_lost(n: &Node, to: FiAddr, deadline: Instant) {
    drive_until(n, deadline, "the peer was never found gone", || {
        match n.ep.inject(&[1], to) {
            Err(Error::PeerLost(_)) => true,
            Ok(()) | Err(Error::Again(_)) => false,
            Err(e) => panic!("inject to the gone peer: {e}"),
        }
    });
}

/// Reads `n`'s CQ until the `small` messages' receives completed and the receive of the one
/// tagged `big` ended: whether that one completed, and its error entry if it failed.
fn small_and_big_end(
    n: &Node,
    small: usize,
    big: u64,
    deadline: Instant,
) -> (bool, Option<CqErrEntry>) {
    let (mut ok, mut big_ok, mut failed) = (0, false, None);
    let mut buf = [CqTaggedEntry::default(); 8];
    while ok < small || (failed.is_none() && !big_ok) {
        match n.cq.read(&mut buf) {
            Ok(k) => {
                for e in &buf[..k] {
                    if e.tag == big {
                        big_ok = true;
                    } else {
                        ok += 1;
                    }
                }
            }
            Err(Error::Avail) => failed = n.cq.readerr().ok(),
            Err(Error::Again(_)) => {}
            Err(e) => panic!("cq read: {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "{ok} messages, and the large message's receive {}",
            if failed.is_some() || big_ok {
                "ended"
            } else {
                "never ended"
            }
        );
    }
    (big_ok, failed)
}

#[test]
fn frames_held_for_receives_not_posted_let_the_endpoint_sleep() {
    setup();
    let mut hints = Info {
        caps: FI_MSG | FI_TAGGED | FI_SEND | FI_RECV,
        ..Default::default()
    };
    hints.fabric_attr.prov_name = Some("shm".into());
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.domain_attr.data_progress = Progress::Manual;
    let info = getinfo(fi_version(1, 17), None, None, 0, Some(&hints)).unwrap()[0].clone();
    let domain = xfabric::fabric(&info.fabric_attr)
        .unwrap()
        .domain(&info)
        .unwrap();
    let (cq, _av, ep) = enabled_ep(
        &domain,
        &info,
        &CqAttr {
            format: CqFormat::Tagged,
            wait_obj: WaitObj::Fd,
            ..Default::default()
        },
    );

    let mut raw = RawPeer::connect(&ep.getname().unwrap(), None).expect("raw peer");
    messages(&mut raw, 0..(UNEXP + HELD) as u64);
    // Each trywait runs the endpoint's progress: the first ones take the messages in (the
    // bound's worth buffered, the rest held, a batch a call, until the held queue is full and
    // the lane stalls), and from then on the held ones, offered again, still wait. Sleeping is
    // then safe: nothing moves until a receive is posted. Every call that says otherwise
    // before takes at least one message in, so the loop's bound is a multiple of them.
    let tries = 4 * (UNEXP + HELD);
    let mut may_sleep = false;
    for _ in 0..tries {
        if cq.trywait() == Ok(()) {
            may_sleep = true;
            break;
        }
    }
    let b = ep.buffered();
    // The held queue at its bound (its count, or its bytes), the rest still in the ring.
    assert_eq!(b.unexpected, UNEXP, "{b:?}");
    assert!(b.held > 0 && b.held < HELD, "{b:?}");
    assert!(
        may_sleep,
        "fi_trywait answered FI_EAGAIN {tries} times with only frames waiting for receives \
         held, and a lane stalled behind them: a blocking read would spin"
    );
    // The receives come: every message, in order, with its bytes (each post offers the held
    // frames again itself).
    let mut got = [0u8; 8];
    let mut buf = [CqTaggedEntry::default(); 1];
    for i in 0..(UNEXP + HELD) as u64 {
        // SAFETY: got outlives the completion read below.
        unsafe { ep.trecv(&mut got, None, FI_ADDR_UNSPEC, i, 0, 1) }.unwrap();
        let n = cq.sread(&mut buf, 1, 10_000).expect("a completion");
        assert_eq!(n, 1);
        assert_eq!((buf[0].tag, buf[0].len), (i, 8), "message {i}");
        assert_eq!(u64::from_le_bytes(got), i, "message {i}'s bytes");
    }
    assert_eq!(ep.buffered().held, 0);
    drop(raw);
}

#[test]
fn a_gone_peers_write_held_behind_its_read_is_applied() {
    setup();
    let n = node(
        FI_MSG | FI_TAGGED | FI_RMA | FI_SEND | FI_RECV | FI_REMOTE_READ | FI_REMOTE_WRITE,
        Progress::Manual,
    );
    let addr = n.ep.getname().expect("getname");
    let window = vec![0u8; 4096];
    // SAFETY: window outlives the registration (dropped at the end, after it).
    let mr = unsafe {
        n.domain
            .mr_reg(&window, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 3)
    }
    .expect("mr_reg");
    let base = n.rma_base(&window);
    let segs = |off: u64, len: usize| {
        RmaIovList::from_segs(&[RmaIov {
            addr: base + off,
            len,
            key: mr.key(),
        }])
        .expect("one range")
    };
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    let to_raw = n.add_peer(format!("fi_shm://{}", raw.name()).as_bytes());
    // One message past the bound is held, and the read and the write behind it with it.
    messages(&mut raw, 0..UNEXP as u64 + 1);
    let read = Frame::Read {
        id: 1,
        segs: segs(0, 64),
        desc: Desc::default(),
    };
    assert!(raw.send_raw(FRAME, read.ctrl(0).as_bytes(), 64));
    let write = Frame::Write {
        id: 2,
        data: 0,
        flags: wire::flags::ACK,
        // Into what the read carries: it waits until the answer no longer does.
        segs: segs(0, 8),
        desc: Desc::default(),
    };
    let mut w = write.ctrl(8).as_bytes().to_vec();
    w.extend_from_slice(&[0xab; 8]);
    assert!(raw.send_raw(FRAME, &w, 64));
    let deadline = Instant::now() + BOUND;
    drive_until(&n, deadline, "the frames were never held", || {
        n.ep.buffered().held >= 3
    });
    // The peer goes; a send to it fails once the endpoint knows.
    raw.play_dead();
    until_lost(&n, to_raw, deadline);
    // Its messages are delivered; the read behind them is served to no one, and the write
    // behind the read lands.
    let mut got = [0u8; 8];
    for i in 0..UNEXP as u64 + 1 {
        // SAFETY: got outlives the completion waited for below.
        unsafe { n.ep.trecv(&mut got, None, FI_ADDR_UNSPEC, i, 0, 1) }.unwrap();
        let c = n.wait_one();
        assert_eq!((c.tag, u64::from_le_bytes(got)), (i, i), "message {i}");
    }
    // Read as the endpoint writes it (this thread drives it).
    let at = |i: usize| unsafe { std::ptr::read_volatile(window.as_ptr().add(i)) };
    drive_until(&n, deadline, "the gone peer's write never landed", || {
        (0..8).all(|i| at(i) == 0xab)
    });
    assert_eq!(n.ep.buffered().held, 0);
    drop(mr);
    drop(window);
}

/// A gone peer's large message held until after its loss, then taken by a receive: its data
/// was to come in frames from the peer (no descriptor to copy from), so the receive ends with
/// `FI_ECONNRESET`. Before, the go-ahead went to the dead link and the receive waited for good.
#[test]
fn a_receive_taking_a_gone_peers_held_large_message_ends() {
    setup();
    let n = node(FI_MSG | FI_TAGGED | FI_SEND | FI_RECV, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    let to_raw = n.add_peer(format!("fi_shm://{}", raw.name()).as_bytes());
    const BIG: u64 = 1 << 16;
    const BIG_TAG: u64 = 1000;
    // One message past the bound is held, and the announcement behind it with it.
    messages(&mut raw, 0..UNEXP as u64 + 1);
    let rts = Frame::Rts {
        id: 7,
        tag: BIG_TAG,
        data: 0,
        len: BIG,
        flags: wire::flags::TAGGED,
        desc: Desc::default(),
    };
    assert!(raw.send_raw(FRAME, rts.ctrl(0).as_bytes(), 64));
    let deadline = Instant::now() + BOUND;
    drive_until(&n, deadline, "the frames were never held", || {
        n.ep.buffered().held >= 2
    });
    raw.play_dead();
    until_lost(&n, to_raw, deadline);
    let mut big = vec![0u8; BIG as usize];
    // SAFETY: big outlives the receive (it ends below).
    unsafe { n.ep.trecv(&mut big, None, FI_ADDR_UNSPEC, BIG_TAG, 0, 99) }.unwrap();
    let mut got = [[0u8; 8]; UNEXP + 1];
    for (i, g) in got.iter_mut().enumerate() {
        // SAFETY: got outlives the completions read below.
        unsafe { n.ep.trecv(g, None, FI_ADDR_UNSPEC, i as u64, 0, 1) }.unwrap();
    }
    // The small messages arrive; the large one's receive fails (in any order with them).
    let (_, failed) = small_and_big_end(&n, UNEXP + 1, BIG_TAG, deadline);
    let e = failed.expect("an error entry");
    assert_eq!(
        (e.op_context, e.err),
        (99, xfabric::errno::FI_ECONNRESET),
        "{e:?}"
    );
    for (i, g) in got.iter().enumerate() {
        assert_eq!(u64::from_le_bytes(*g), i as u64, "message {i}'s bytes");
    }
    assert_eq!(n.ep.buffered().held, 0);
    drop(big);
}

/// Posts a tagged receive for message `i` into `bufs[i]`, waits for them all, and checks
/// each one's bytes.
fn take_all(n: &Node, bufs: &mut [[u8; 8]]) {
    for (i, g) in bufs.iter_mut().enumerate() {
        // SAFETY: bufs outlive the completions waited for below.
        unsafe { n.ep.trecv(g, None, FI_ADDR_UNSPEC, i as u64, 0, 1) }.unwrap();
    }
    n.wait_n(bufs.len());
    for (i, g) in bufs.iter().enumerate() {
        assert_eq!(u64::from_le_bytes(*g), i as u64, "message {i}'s bytes");
    }
}

/// A peer whose lane is stalled behind its held frames when it is found gone, and whose
/// goodbye is read only once receives drain the lane: its segment is unmapped, as any gone
/// peer's. Before, the goodbye dropped its last lane after the loss, and nothing unmapped it:
/// a descriptor, an 8 MiB mapping and a place among `MAX_LINKS` for the endpoint's life, per
/// peer.
#[test]
fn a_peer_lost_while_stalled_is_unmapped_once_its_goodbye_is_read() {
    setup();
    let n = node(FI_MSG | FI_TAGGED | FI_SEND | FI_RECV, Progress::Manual);
    let mut raw = RawPeer::connect(&n.ep.getname().unwrap(), None).expect("raw peer");
    let name = raw.name().to_string();
    let to_raw = n.add_peer(format!("fi_shm://{name}").as_bytes());
    let total = UNEXP + HELD;
    messages(&mut raw, 0..total as u64);
    assert!(raw.bye(), "the goodbye did not fit");
    let deadline = Instant::now() + BOUND;
    // Stalled: a progress call takes no more in.
    let mut before = (0, 0);
    drive_until(&n, deadline, "the lane never stalled", || {
        let b = n.ep.buffered();
        let now = (b.unexpected, b.held);
        std::mem::replace(&mut before, now) == now && b.held > 0
    });
    raw.play_dead();
    until_lost(&n, to_raw, deadline);
    take_all(&n, &mut vec![[0u8; 8]; total]);
    // The raw peer's own mapping goes with it: what is left is the endpoint's.
    drop(raw);
    drive_until(
        &n,
        deadline,
        "the gone peer's segment stayed mapped after its goodbye was read",
        || shm_mappings(&[&name]) == 0,
    );
}

/// A large message a peer offered by descriptor, held until after the peer closed its
/// endpoint: its buffer is that peer's application's again (its send was canceled at its
/// close), so it is not read. The receive that takes it fails. Before, the copy still read the
/// peer's memory through its pid, which outlives the endpoint (or names another process by
/// then), and the receive completed.
#[test]
fn a_closed_peers_held_large_message_is_not_read() {
    setup();
    let n = node(FI_MSG | FI_TAGGED | FI_SEND | FI_RECV, Progress::Manual);
    let mut raw = RawPeer::connect(&n.ep.getname().unwrap(), None).expect("raw peer");
    const BIG: usize = 1 << 16;
    const BIG_TAG: u64 = 1000;
    let offered = vec![0x5au8; BIG];
    let d: Vec<u8> = (offered.as_ptr() as u64)
        .to_le_bytes()
        .into_iter()
        .chain((BIG as u64).to_le_bytes())
        .collect();
    messages(&mut raw, 0..UNEXP as u64 + 1);
    let rts = Frame::Rts {
        id: 7,
        tag: BIG_TAG,
        data: 0,
        len: BIG as u64,
        flags: wire::flags::TAGGED,
        desc: Desc::new(&d).expect("a descriptor"),
    };
    assert!(raw.send_raw(FRAME, rts.ctrl(0).as_bytes(), 64));
    assert!(raw.bye(), "the goodbye did not fit");
    let deadline = Instant::now() + BOUND;
    // Taken in: the bound's worth buffered, one message and the announcement held, and the
    // goodbye read (the peer gone: a send to it fails).
    let to_raw = n.add_peer(format!("fi_shm://{}", raw.name()).as_bytes());
    until_lost(&n, to_raw, deadline);
    assert_eq!(n.ep.buffered().held, 2);
    let mut big = vec![0u8; BIG];
    // SAFETY: big outlives the receive (it ends below).
    unsafe { n.ep.trecv(&mut big, None, FI_ADDR_UNSPEC, BIG_TAG, 0, 99) }.unwrap();
    let mut got = [[0u8; 8]; UNEXP + 1];
    for (i, g) in got.iter_mut().enumerate() {
        // SAFETY: got outlives the completions read below.
        unsafe { n.ep.trecv(g, None, FI_ADDR_UNSPEC, i as u64, 0, 1) }.unwrap();
    }
    let (big_ok, failed) = small_and_big_end(&n, UNEXP + 1, BIG_TAG, deadline);
    assert!(!big_ok, "the closed peer's offered buffer was read");
    let e = failed.expect("an error entry");
    assert_eq!(
        (e.op_context, e.err),
        (99, xfabric::errno::FI_ECONNRESET),
        "{e:?}"
    );
    drop(raw);
    drop(offered);
}
