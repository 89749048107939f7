//! The engine fed what a hostile or broken peer may send (frames naming nothing, lengths
//! past the limits, random frames from two peers), and random schedules between two
//! well-behaved engines.

use super::*;

// 8. Hostile frames.

fn inject(to: &mut Side, f: Frame, body: &[u8]) -> Result<(), WireError> {
    let r = arrive(to, &f.to_vec(body.len() as u64), body);
    to.report();
    r
}

#[test]
fn hostile_frames_are_refused_or_ignored() {
    let mut tgt = vec![0u8; 64];
    let mut buf = vec![0u8; 64];
    let mut back = vec![0xeeu8; 16];
    let mut res = 0xeeu64;
    let mut net = Net::new();
    net.register(&tgt);
    let at = net.raddr(tgt.as_mut_ptr(), 0);
    net.b.recv(recv(10, &mut buf, None, 0));
    let b = &mut net.b;
    assert!(inject(b, Frame::Data { rx: 5 }, &[1; 10]).is_err());
    assert!(inject(b, Frame::Data { rx: u32::MAX }, &[]).is_err());
    assert!(inject(b, Frame::ReadResp { id: 99, status: 0 }, &[1; 8]).is_ok());
    assert!(inject(b, Frame::AtomicResp { id: 99, status: 0 }, &[1; 8]).is_ok());
    assert!(inject(b, Frame::Ack { id: 99, status: 0 }, &[]).is_ok());
    assert!(inject(b, Frame::Cts { id: 99, rx: 0 }, &[]).is_ok());
    // A message announcing more than any engine takes eagerly.
    let f = Frame::Msg {
        id: 0,
        tag: 0,
        data: 0,
        flags: 0,
    };
    let ctrl = f.to_vec(EAGER_LIMIT as u64 + 1);
    let p = wire::prefix(&ctrl).unwrap();
    assert!(b.eng.on_ctrl(0, 0, &p, &ctrl[PREFIX..]).is_err());
    // A write with no ranges and a body: refused at the target, nothing written.
    let w = Frame::Write {
        id: 3,
        data: 0,
        flags: wire::flags::ACK,
        segs: RmaIovList::from_segs(&[]).unwrap(),
        desc: Desc::default(),
    };
    assert!(inject(b, w, &[9; 8]).is_ok());
    let t = b.eng.poll_transmit().expect("an answer");
    assert_eq!(
        wire::decode_all(&t.ctrl).unwrap().0,
        Frame::Ack {
            id: 3,
            status: FI_EINVAL
        }
    );
    assert!(b.eng.poll_transmit().is_none());
    b.quiet();
    assert!(tgt.iter().all(|&x| x == 0));
    assert!(buf.iter().all(|&x| x == 0));
    // Answers naming outstanding requests of the wrong kind, or a negative status, invent no
    // success. (Frames from A's engine are moved by hand here: ids are A's.)
    net.a.rma(rma(
        1,
        iov_mut(&mut back),
        &[seg(at, 16, KEY)],
        None,
        FI_READ,
    ));
    let one = 1u64;
    let req = fetching(atomic(2, at, AtomicOp::Sum, (&one, None)), &mut res);
    net.a.atomic(req).unwrap();
    while net.a.eng.poll_transmit().is_some() {}
    let a = &mut net.a;
    assert!(inject(a, Frame::Ack { id: 0, status: 0 }, &[]).is_ok());
    assert!(inject(a, Frame::Ack { id: 1, status: 0 }, &[]).is_ok());
    assert!(inject(a, Frame::AtomicResp { id: 0, status: 0 }, &[1; 16]).is_ok());
    a.quiet();
    assert!(inject(a, Frame::ReadResp { id: 0, status: -5 }, &[]).is_ok());
    assert!(inject(a, Frame::AtomicResp { id: 1, status: -5 }, &[]).is_ok());
    let (ok, err) = a.cq();
    assert!(ok.is_empty(), "{ok:?}");
    assert_eq!(err.len(), 2);
    assert!(err.iter().all(|e| e.err > 0));
    assert!(back.iter().all(|&x| x == 0xee));
    assert_eq!(res, 0xee);
}

/// A frame for the fuzzer: structured (ids, keys and lengths near the engine's state) or raw.
#[derive(Clone, Debug)]
enum Input {
    Frame(Box<Frame>),
    Raw { kind: u8, flags: u8, ctrl: Vec<u8> },
}

fn any_key() -> impl Strategy<Value = u64> {
    prop_oneof![Just(KEY), Just(KEY + 1), any::<u64>()]
}

fn any_segs() -> impl Strategy<Value = RmaIovList> {
    proptest::collection::vec((0u64..80, 0usize..80, any_key()), 0..3).prop_map(|v| {
        let s: Vec<RmaIov> = v.into_iter().map(|(a, l, k)| seg(a, l, k)).collect();
        RmaIovList::from_segs(&s).unwrap()
    })
}

/// Descriptors: none, or bytes a hostile peer chose.
fn any_desc() -> impl Strategy<Value = Desc> {
    prop_oneof![
        Just(Desc::default()),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(|v| Desc::new(&v).expect("short")),
    ]
}

fn any_frame() -> impl Strategy<Value = Frame> {
    let id = || prop_oneof![0u32..4, any::<u32>()];
    let status = || prop_oneof![Just(0i32), -3i32..300];
    let fl = || prop_oneof![0u8..64, any::<u8>()];
    prop_oneof![
        (id(), 0u64..3, any::<u64>(), fl()).prop_map(|(id, tag, data, flags)| Frame::Msg {
            id,
            tag,
            data,
            flags
        }),
        (id(), status()).prop_map(|(id, status)| Frame::Ack { id, status }),
        (id(), any::<u64>(), fl(), any_segs(), any_desc()).prop_map(
            |(id, data, flags, segs, desc)| Frame::Write {
                id,
                data,
                flags,
                segs,
                desc
            }
        ),
        (id(), any_segs(), any_desc()).prop_map(|(id, segs, desc)| Frame::Read { id, segs, desc }),
        (id(), status()).prop_map(|(id, status)| Frame::ReadResp { id, status }),
        (
            id(),
            0u32..20,
            prop_oneof![0u32..20, any::<u32>()],
            0u32..4,
            0u64..72,
            any_key(),
            fl()
        )
            .prop_map(
                |(id, op, datatype, count, addr, key, flags)| Frame::Atomic {
                    id,
                    op,
                    datatype,
                    count,
                    addr,
                    key,
                    flags
                }
            ),
        (id(), status()).prop_map(|(id, status)| Frame::AtomicResp { id, status }),
        (id(), 0u64..3, any::<u64>(), 0u64..400, fl(), any_desc()).prop_map(
            |(id, tag, data, len, flags, desc)| Frame::Rts {
                id,
                tag,
                data,
                len,
                flags,
                desc,
            }
        ),
        (id(), prop_oneof![0u32..3, Just(u32::MAX)]).prop_map(|(id, rx)| Frame::Cts { id, rx }),
        prop_oneof![0u32..3, any::<u32>()].prop_map(|rx| Frame::Data { rx }),
    ]
}

fn any_input() -> impl Strategy<Value = Input> {
    prop_oneof![
        4 => any_frame().prop_map(|f| Input::Frame(Box::new(f))),
        1 => (0u8..12, any::<u8>(), proptest::collection::vec(any::<u8>(), 0..120))
            .prop_map(|(kind, flags, ctrl)| Input::Raw { kind, flags, ctrl }),
    ]
}

/// Feeds `frames` (peer, input, body) into an engine with posted receives, outstanding
/// requests and registered memory; every completion must name an operation posted, once.
fn fuzz_engine(frames: &[(usize, Input, Vec<u8>)]) {
    let mut tgt = vec![0u8; 64];
    let mut bufs = vec![vec![0u8; 100]; 3];
    let big = pattern(150, 22);
    let mut back = vec![0u8; 16];
    let mut res = 0u64;
    let one = 1u64;
    let mut net = Net::new();
    net.register(&tgt);
    let at = net.raddr(tgt.as_mut_ptr(), 0);
    let mut posted: Vec<Context> = Vec::new();
    for (i, b) in bufs.iter_mut().enumerate() {
        let tag = (i % 2 == 1).then_some(1);
        net.b.recv(recv(10 + i, b, tag, 0));
        posted.push(10 + i);
    }
    net.b.send(send(1, &big, None, None, 0));
    net.b.rma(rma(
        2,
        iov_mut(&mut back),
        &[seg(at, 16, KEY)],
        None,
        FI_READ,
    ));
    let req = fetching(atomic(3, at, AtomicOp::Sum, (&one, None)), &mut res);
    net.b.atomic(req).unwrap();
    net.b
        .send(send(4, &big[..20], None, None, FI_DELIVERY_COMPLETE));
    posted.extend([1, 2, 3, 4]);
    let b = &mut net.b;
    for (i, (peer, input, body)) in frames.iter().enumerate() {
        let ctrl = match input {
            Input::Frame(f) => f.to_vec(body.len() as u64),
            Input::Raw { kind, flags, ctrl } => {
                let p = Prefix {
                    magic: wire::MAGIC,
                    kind: *kind,
                    flags: *flags,
                    ctrl_len: ctrl.len() as u32,
                    body_len: body.len() as u64,
                };
                let mut v = bytemuck::bytes_of(&p).to_vec();
                v.extend_from_slice(ctrl);
                v
            }
        };
        let Ok(p) = wire::prefix(&ctrl) else { continue };
        // Every other frame whole, as a message transport hands it over.
        let r = if i % 2 == 1 {
            b.eng
                .on_frame(*peer, *peer as u64, &p, &ctrl[PREFIX..], body)
                .map(|_| ())
        } else {
            b.eng
                .on_ctrl(*peer, *peer as u64, &p, &ctrl[PREFIX..])
                .map(|sink| b.eng.on_body(*peer, fill(sink, body)))
        };
        if r.is_err() {
            // The transport drops a peer that speaks garbage.
            b.eng.on_lost(*peer, FI_ECONNRESET);
        }
        while let Some(t) = b.eng.poll_transmit() {
            let _ = body_bytes(&t.body);
            if let Some(tok) = t.token {
                b.eng.on_sent(t.peer, tok);
            }
        }
        b.report();
    }
    b.eng.close();
    b.report();
    while b.eng.poll_transmit().is_some() {}
    let (ok, err) = b.cq();
    let mut seen: HashMap<Context, usize> = HashMap::new();
    for ctx in ok
        .iter()
        .map(|e| e.op_context)
        .chain(err.iter().map(|e| e.op_context))
    {
        if ctx == 0 {
            continue; // a peer's RMA with CQ data
        }
        assert!(posted.contains(&ctx), "invented completion for {ctx}");
        *seen.entry(ctx).or_default() += 1;
    }
    assert!(seen.values().all(|&n| n == 1), "{seen:?}");
    // Everything ends, one way or another, by close.
    assert_eq!(seen.len(), posted.len(), "{seen:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random frames from two peers: never a panic, never a completion the engine was not
    /// owed, every operation ended exactly once.
    #[test]
    fn random_frames_never_panic(
        frames in proptest::collection::vec(
            (0usize..2, any_input(), proptest::collection::vec(any::<u8>(), 0..160)),
            1..8,
        )
    ) {
        fuzz_engine(&frames);
    }
}

/// One action of a random schedule between the two engines.
#[derive(Clone, Copy, Debug)]
enum Act {
    /// A sends the next message: its length and completion flags.
    Send(usize, u64),
    /// B posts the next receive.
    Recv,
    /// Moves one frame A to B, or B to A.
    StepA,
    StepB,
    /// A's on_sent reports: start holding, or release those held.
    Hold,
    Release,
    /// B's transport performs its next one-sided copy, or refuses it.
    Copy(bool),
}

fn any_act() -> impl Strategy<Value = Act> {
    let level = prop_oneof![
        Just(0),
        Just(FI_TRANSMIT_COMPLETE),
        Just(FI_DELIVERY_COMPLETE),
        Just(FI_MATCH_COMPLETE),
        Just(FI_FENCE),
        Just(FI_INJECT),
    ];
    prop_oneof![
        2 => (prop_oneof![0usize..=EAGER, EAGER + 1..300], level).prop_map(|(n, f)| Act::Send(n, f)),
        2 => Just(Act::Recv),
        3 => Just(Act::StepA),
        3 => Just(Act::StepB),
        1 => Just(Act::Hold),
        1 => Just(Act::Release),
        2 => any::<bool>().prop_map(Act::Copy),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random interleavings of sends (eager and large, every completion level), receives,
    /// frame moves and held on_sent reports: once everything is moved and reported, every
    /// send and receive completed exactly once, in order, with the right bytes.
    #[test]
    fn random_schedules_deliver_in_order(
        acts in proptest::collection::vec(any_act(), 1..40),
        one_sided in any::<bool>(),
    ) {
        let sends: Vec<Act> = acts.iter().copied().filter(|a| matches!(a, Act::Send(..))).collect();
        let msgs: Vec<Vec<u8>> = sends
            .iter()
            .enumerate()
            .map(|(i, a)| match a {
                Act::Send(n, _) => pattern(*n, i as u8),
                _ => unreachable!(),
            })
            .collect();
        let mut bufs = vec![vec![0u8; 300]; msgs.len()];
        let mut net = Net::sides(World::new(), one_sided, one_sided);
        let (mut next_send, mut next_recv) = (0, 0);
        let copy = |net: &mut Net, refuse: bool| {
            if let Some(p) = net.b.eng.poll_copy() {
                if refuse {
                    net.b.eng.on_copied(p.token, Copied::Refused);
                } else {
                    perform(&p);
                    net.b.eng.on_copied(p.token, Copied::Done);
                }
                net.report();
            }
        };
        let post_recv = |net: &mut Net, bufs: &mut Vec<Vec<u8>>, next_recv: &mut usize| {
            if *next_recv < bufs.len() {
                let i = *next_recv;
                net.b.recv(recv(100 + i, &mut bufs[i], None, 0));
                *next_recv += 1;
            }
        };
        for act in &acts {
            match *act {
                Act::Send(_, fl) => {
                    let i = next_send;
                    net.a.send(send(1 + i, &msgs[i], None, None, fl));
                    next_send += 1;
                }
                Act::Recv => post_recv(&mut net, &mut bufs, &mut next_recv),
                Act::StepA => {
                    net.step(S::A);
                }
                Act::StepB => {
                    net.step(S::B);
                }
                Act::Hold => net.a.hold_sent = true,
                Act::Release => {
                    net.a.hold_sent = false;
                    net.release_sent(S::A);
                }
                Act::Copy(refuse) => copy(&mut net, refuse),
            }
        }
        while next_recv < bufs.len() {
            post_recv(&mut net, &mut bufs, &mut next_recv);
        }
        net.a.hold_sent = false;
        for _ in 0..4 {
            net.release_sent(S::A);
            net.pump();
            while net.b.eng.copying() {
                copy(&mut net, false);
                net.pump();
            }
        }
        let (ok, err) = net.a.cq();
        prop_assert!(err.is_empty(), "{:?}", err);
        let mut done: Vec<_> = ok.iter().map(|e| e.op_context).collect();
        done.sort();
        prop_assert_eq!(done, (1..=msgs.len()).collect::<Vec<_>>());
        let (ok, err) = net.b.cq();
        prop_assert!(err.is_empty(), "{:?}", err);
        let got: Vec<_> = ok.iter().map(|e| e.op_context).collect();
        let mut sorted = got.clone();
        sorted.sort();
        prop_assert_eq!(sorted, (100..100 + msgs.len()).collect::<Vec<_>>());
        for e in &ok {
            let i = e.op_context - 100;
            prop_assert_eq!(e.len, msgs[i].len());
            prop_assert_eq!(&bufs[i][..e.len], &msgs[i][..]);
        }
        prop_assert!(!net.a.eng.busy() && !net.b.eng.busy());
        prop_assert_eq!(net.b.eng.buffered().unexpected, 0);
    }
}

/// A frame that begins while the body of the peer's previous one is still expected (two
/// streams from one peer, interleaved) is refused, whole or in two steps, and takes nothing:
/// the first frame's body still lands where it was going, and its receive completes with it.
#[test]
fn a_frame_inside_another_frames_body_is_refused() {
    let mut first = vec![0u8; 64];
    let mut second = vec![0u8; 64];
    let mut net = Net::new();
    net.b.recv(recv(1, &mut first, None, 0));
    net.b.recv(recv(2, &mut second, None, 0));
    let b = &mut net.b;
    let f = Frame::Msg {
        id: 0,
        tag: 0,
        data: 0,
        flags: 0,
    };
    let ctrl = f.to_vec(64);
    let p = wire::prefix(&ctrl).unwrap();
    // The first frame's control part: its body is now expected.
    let sink = b
        .eng
        .on_ctrl(0, 0, &p, &ctrl[PREFIX..])
        .expect("the first frame");
    // A second frame, in two steps and whole: refused, nothing taken.
    assert_eq!(
        b.eng.on_ctrl(0, 0, &p, &ctrl[PREFIX..]).err(),
        Some(WireError::Interleaved)
    );
    assert_eq!(
        b.eng.on_frame(0, 0, &p, &ctrl[PREFIX..], &[7; 64]).err(),
        Some(WireError::Interleaved)
    );
    b.report();
    b.quiet();
    // The first body arrives: the first receive completes with it; the second still waits.
    let sink = fill(sink, &[5; 64]);
    b.eng.on_body(0, sink);
    b.report();
    assert_eq!(b.one(1).len, 64);
    assert!(first.iter().all(|&x| x == 5));
    assert!(second.iter().all(|&x| x == 0));
}

/// An engine whose transport does not copy one-sidedly (tcp's) never offers memory, so a
/// frame offering it (an `Rts`, a `Write` or a `Read` with a descriptor) is refused: served,
/// it had the target ask for the data with a `Cts` and then wait for it behind whatever the
/// peer sent next, which held the stream the data was to come on.
#[test]
fn memory_offered_to_an_engine_that_does_not_copy_is_refused() {
    let mut tgt = vec![0u8; 64];
    let mut buf = vec![0u8; 64];
    let mut net = Net::new();
    net.register(&tgt);
    let at = net.raddr(tgt.as_mut_ptr(), 0);
    net.b.recv(recv(1, &mut buf, None, 0));
    let offer = Desc::of_iov(&iov(&[3; 64]));
    let b = &mut net.b;
    let rts = Frame::Rts {
        id: 1,
        tag: 0,
        data: 0,
        len: 64,
        flags: 0,
        desc: offer,
    };
    let write = Frame::Write {
        id: 2,
        data: 0,
        flags: wire::flags::ACK,
        segs: RmaIovList::from_segs(&[seg(at, 64, KEY)]).unwrap(),
        desc: offer,
    };
    let read = Frame::Read {
        id: 3,
        segs: RmaIovList::from_segs(&[seg(at, 64, KEY)]).unwrap(),
        desc: offer,
    };
    for f in [rts, write, read] {
        let kind = f.kind();
        assert_eq!(inject(b, f, &[]), Err(WireError::Malformed(kind)));
    }
    assert!(b.eng.poll_transmit().is_none(), "nothing asked of the peer");
    b.quiet();
    assert!(tgt.iter().all(|&x| x == 0));
    assert!(buf.iter().all(|&x| x == 0));
}

/// A peer naming keys that do not exist, frame after frame (guessing a region's key through
/// the engine): each is answered `FI_EACCES` while it stays within a burst's allowance; past
/// it, its next remote access is refused as garbage (its transport drops it).
#[test]
fn a_peer_guessing_keys_is_cut_off() {
    let mut tgt = vec![0u8; 64];
    let mut net = Net::new();
    net.register(&tgt);
    let at = net.raddr(tgt.as_mut_ptr(), 0);
    let b = &mut net.b;
    let read = |id: u32, key: u64| Frame::Read {
        id,
        segs: RmaIovList::from_segs(&[seg(at, 64, key)]).unwrap(),
        desc: Desc::default(),
    };
    assert_eq!(inject(b, read(0, KEY), &[]), Ok(()), "the right key");
    let mut refused = 0u32;
    let cut = loop {
        refused += 1;
        assert!(refused < 100_000, "never cut off");
        match inject(b, read(refused, KEY ^ u64::from(refused) << 8), &[]) {
            Ok(()) => {}
            Err(e) => break e,
        }
        while b.eng.poll_transmit().is_some() {}
    };
    assert_eq!(cut, WireError::Refused(Kind::Read));
    assert!(
        refused > 1000,
        "cut off after {refused}: a burst is allowed"
    );
}

/// A transport whose peer reads nothing (a full ring, forever).
struct Unread;

impl Transport for Unread {
    fn send(&mut self, t: Transmit) -> std::result::Result<(), Transmit> {
        Err(t)
    }
}

/// Offers `b` the frames `frame(0)`, `frame(1)`, ... (bodiless) from peer 0, `after` each, up
/// to `n` of them: the number of the first the engine answered `Sink::Wait`, if any.
fn first_wait(
    b: &mut Side,
    n: u32,
    frame: impl Fn(u32) -> Frame,
    after: impl Fn(&mut Side),
) -> Option<u32> {
    for i in 0..n {
        let bytes = frame(i).to_vec(0);
        let p = wire::prefix(&bytes).unwrap();
        match b.eng.on_ctrl(0, 0, &p, &bytes[PREFIX..]).unwrap() {
            Sink::Wait => return Some(i),
            sink => b.eng.on_body(0, sink),
        }
        after(b);
    }
    None
}

/// A peer that asks (reads here) and never reads the answers: they wait in the engine, which
/// stops reading that peer's requests once it owes it `OWED_MAX` of them, rather than queuing
/// answers without end.
#[test]
fn a_peer_that_reads_no_answers_is_not_read_either() {
    use crate::rdm::engine::OWED_MAX;
    let mut tgt = vec![0u8; 64];
    let mut net = Net::new();
    net.register(&tgt);
    let at = net.raddr(tgt.as_mut_ptr(), 0);
    let b = &mut net.b;
    let read = |i| Frame::Read {
        id: i,
        segs: RmaIovList::from_segs(&[seg(at, 8, KEY)]).unwrap(),
        desc: Desc::default(),
    };
    let waited = first_wait(b, OWED_MAX as u32 + 10, read, |b| {
        b.eng.transmit(&mut Unread);
    });
    assert_eq!(waited, Some(OWED_MAX as u32), "never waited");
    assert_eq!(b.eng.blocked(0), OWED_MAX);
}

/// A peer announcing empty large messages into a multi-receive buffer (which they never fill)
/// and sending no data: each opened a receive pipe, without end. Past `PIPES_MAX` of its own
/// on their way, its next announcement waits.
#[test]
fn a_peer_announcing_without_end_into_a_multi_receive_waits() {
    use crate::rdm::engine::PIPES_MAX;
    let mut buf = vec![0u8; 64];
    let mut net = Net::new();
    net.b.eng.set_min_multi_recv(16);
    net.b.recv(recv(10, &mut buf, None, FI_MULTI_RECV));
    let b = &mut net.b;
    let rts = |i| Frame::Rts {
        id: i,
        tag: 0,
        data: 0,
        len: 0,
        flags: 0,
        desc: Desc::default(),
    };
    let waited = first_wait(b, PIPES_MAX as u32 + 10, rts, |b| {
        while b.eng.poll_transmit().is_some() {}
    });
    assert_eq!(waited, Some(PIPES_MAX as u32), "never waited");
}
