//! Small messages on a transport whose taking a frame delivers it (`delivered_on_take`, as
//! shm's rings): each completes when its frame is taken, in order, and never before; what was
//! never taken fails when the peer is lost or the endpoint closes.

use super::*;

/// Side A's engine made again, with `delivered_on_take` (and messages a little larger than
/// small ones still eager).
fn taking(net: &mut Net) {
    net.a.eng = Engine::new(
        net.a.core.clone(),
        Config {
            eager_max: 4 * INLINE_BODY_BYTES,
            delivered_on_take: true,
            ..Config::default()
        },
    );
}

/// A transport that takes nothing (a full ring).
struct Full;

impl Transport for Full {
    fn send(&mut self, t: Transmit) -> std::result::Result<(), Transmit> {
        Err(t)
    }
}

/// A transport that takes everything, keeping it.
#[derive(Default)]
struct Keep(Vec<Transmit>);

impl Transport for Keep {
    fn send(&mut self, t: Transmit) -> std::result::Result<(), Transmit> {
        self.0.push(t);
        Ok(())
    }
}

#[test]
fn a_small_message_completes_when_taken_and_not_before() {
    let data = pattern(INLINE_BODY_BYTES, 3);
    let mut bufs = [[0u8; INLINE_BODY_BYTES]; 3];
    let mut net = Net::new();
    taking(&mut net);
    for (i, b) in bufs.iter_mut().enumerate() {
        net.b.recv(recv(10 + i, b, None, 0));
    }
    for ctx in 1..=3 {
        net.a
            .send(send(ctx, &data, None, None, FI_TRANSMIT_COMPLETE));
    }
    net.a.quiet();
    // The ring is full: nothing is taken, nothing completes.
    assert_eq!(net.a.eng.transmit(&mut Full), 0);
    net.a.report();
    net.a.quiet();
    // Taken: each completes, in posting order, with no token for the transport to report.
    let mut keep = Keep::default();
    assert_eq!(net.a.eng.transmit(&mut keep), 3);
    net.a.report();
    let (ok, err) = net.a.cq();
    assert!(err.is_empty(), "{err:?}");
    let ctxs: Vec<_> = ok.iter().map(|e| e.op_context).collect();
    assert_eq!(ctxs, [1, 2, 3]);
    assert!(keep.0.iter().all(|t| t.token.is_none()));
    // The bytes were copied at the post: the frames hold them, and they arrive.
    for t in &keep.0 {
        assert_eq!(body_bytes(&t.body), data);
        arrive(&mut net.b, &t.ctrl, &body_bytes(&t.body)).unwrap();
    }
    net.b.report();
    let got: Vec<_> = net.b.cq().0.iter().map(|e| e.op_context).collect();
    assert_eq!(got, [10, 11, 12]);
    assert!(bufs.iter().all(|b| b[..] == data[..]));
}

#[test]
fn larger_or_acknowledged_messages_keep_their_request() {
    let small = pattern(8, 4);
    let large = pattern(INLINE_BODY_BYTES + 1, 5);
    let mut net = Net::new();
    taking(&mut net);
    net.a.hold_sent = true;
    net.a.send(send(1, &large, None, None, 0));
    net.a
        .send(send(2, &small, None, None, FI_DELIVERY_COMPLETE));
    let mut keep = Keep::default();
    net.a.eng.transmit(&mut keep);
    net.a.report();
    // Neither completes on being taken: the first when reported sent, the second on its Ack.
    net.a.quiet();
    assert!(keep.0[0].token.is_some());
    net.a.eng.on_sent(0, keep.0[0].token.unwrap());
    net.a.report();
    net.a.one(1);
}

#[test]
fn small_messages_never_taken_fail_when_the_peer_is_lost() {
    let data = pattern(16, 6);
    let mut net = Net::new();
    taking(&mut net);
    net.a.send(send(1, &data, None, None, 0));
    let mut keep = Keep::default();
    net.a.eng.transmit(&mut keep);
    net.a.send(send(2, &data, None, None, 0));
    net.a.send(send(3, &data, None, None, 0));
    assert_eq!(net.a.eng.transmit(&mut Full), 0);
    net.a.report();
    net.a.one(1);
    net.a.eng.on_lost(0, FI_ECONNRESET);
    net.a.report();
    let (ok, err) = net.a.cq();
    assert!(ok.is_empty(), "{ok:?}");
    let failed: Vec<_> = err.iter().map(|e| (e.op_context, e.err)).collect();
    assert_eq!(failed, [(2, FI_ECONNRESET), (3, FI_ECONNRESET)]);
    // Nothing is left to hand over, and a later message to the peer goes as usual.
    assert!(net.a.eng.poll_transmit().is_none());
    net.a.send(send(4, &data, None, None, 0));
    assert!(net.a.eng.poll_transmit().is_some());
    net.a.report();
    net.a.one(4);
}

#[test]
fn closing_cancels_small_messages_never_taken_once() {
    let data = pattern(16, 7);
    let mut net = Net::new();
    taking(&mut net);
    net.a.send(send(1, &data, None, None, 0));
    net.a.send(send(2, &data, None, None, 0));
    assert_eq!(net.a.eng.transmit(&mut Full), 0);
    net.a.eng.close();
    net.a.report();
    let failed: Vec<_> = net.a.cq().1.iter().map(|e| (e.op_context, e.err)).collect();
    assert_eq!(failed, [(1, FI_ECANCELED), (2, FI_ECANCELED)]);
    // Reported canceled, their frames never go out (sent again after a reopen, they would
    // arrive twice).
    let mut keep = Keep::default();
    net.a.eng.transmit(&mut keep);
    net.a.report();
    net.a.quiet();
    assert!(keep.0.is_empty(), "{} frames went out", keep.0.len());
}

/// `INLINE_BODY`, the largest small message.
const INLINE_BODY_BYTES: usize = crate::rdm::INLINE_BODY;

/// A transport that writes frames in place into slots of its own, up to `room` of them, and
/// takes queued ones (`send`) only while it has room too.
struct Slots {
    room: usize,
    frames: Vec<Vec<u8>>,
    /// How many came in place.
    in_place: usize,
}

impl Transport for Slots {
    fn send(&mut self, t: Transmit) -> std::result::Result<(), Transmit> {
        if self.frames.len() == self.room {
            return Err(t);
        }
        let mut f = t.ctrl.to_vec();
        f.extend_from_slice(&body_bytes(&t.body));
        self.frames.push(f);
        Ok(())
    }

    fn send_in_place(&mut self, _peer: PeerId, len: usize, fill: impl FnOnce(&mut [u8])) -> bool {
        if self.frames.len() == self.room {
            return false;
        }
        let mut f = vec![0xee; len];
        fill(&mut f);
        self.frames.push(f);
        self.in_place += 1;
        true
    }
}

/// Posts `op` to peer 0 as shm's endpoint does: in place if `tr` takes it now, else queued.
///
/// # Safety
/// As for `Engine::post_send`.
unsafe fn post_via(eng: &mut Engine, op: &TxOp, tr: &mut impl Transport) {
    // SAFETY: forwarded.
    if !unsafe { eng.send_in_place(0, op, tr) }.unwrap() {
        // SAFETY: forwarded.
        unsafe { eng.post_send(0, op) }.unwrap();
    }
}

#[test]
fn small_messages_go_in_place_in_order_behind_queued_frames() {
    let data = pattern(INLINE_BODY_BYTES, 8);
    let mut bufs = [[0u8; INLINE_BODY_BYTES]; 6];
    let mut net = Net::new();
    taking(&mut net);
    for (i, b) in bufs.iter_mut().enumerate() {
        net.b.recv(recv(10 + i, b, Some(i as u64), 0));
    }
    let mut slots = Slots {
        room: 1,
        frames: Vec::new(),
        in_place: 0,
    };
    let post = |net: &mut Net, slots: &mut Slots, ctx: Context, tag: u64, flags: u64| {
        let op = send(ctx, &data, Some(tag), None, flags);
        // SAFETY: `data` outlives the call and every frame holds its own copy.
        unsafe { post_via(&mut net.a.eng, &op, slots) };
    };
    // Written in place and complete at once: nothing queued, no token.
    post(&mut net, &mut slots, 1, 0, 0);
    assert_eq!(slots.in_place, 1);
    assert!(!net.a.eng.has_output());
    net.a.report();
    net.a.one(1);
    // The slots are full: the next one queues, and the one after it must not pass it.
    post(&mut net, &mut slots, 2, 1, 0);
    slots.room = 6;
    post(&mut net, &mut slots, 3, 2, 0);
    assert_eq!(
        slots.in_place, 1,
        "posted behind a queued frame, it queues too"
    );
    // Acknowledged, fenced or larger messages are never written in place.
    post(&mut net, &mut slots, 4, 3, FI_FENCE);
    net.a.eng.transmit(&mut slots);
    post(&mut net, &mut slots, 5, 4, FI_DELIVERY_COMPLETE);
    assert_eq!(slots.in_place, 1);
    net.a.eng.transmit(&mut slots);
    // Once nothing waits, in place again.
    post(&mut net, &mut slots, 6, 5, 0);
    assert_eq!(slots.in_place, 2);
    assert_eq!(slots.frames.len(), 6);
    net.a.report();
    let done: Vec<_> = net.a.cq().0.iter().map(|e| e.op_context).collect();
    assert_eq!(done, [2, 3, 4, 6], "5 waits for its Ack");
    // Every frame decodes, and they arrive in posting order with their bytes.
    for f in &slots.frames {
        let (frame, body) = wire::decode_all(f).unwrap();
        assert!(matches!(frame, Frame::Msg { .. }));
        assert_eq!(body, &data[..]);
        arrive(&mut net.b, &f[..f.len() - body.len()], body).unwrap();
    }
    net.b.report();
    let got: Vec<_> = net.b.cq().0.iter().map(|e| (e.op_context, e.tag)).collect();
    assert_eq!(got, [(10, 0), (11, 1), (12, 2), (13, 3), (14, 4), (15, 5)]);
    assert!(bufs.iter().all(|b| b[..] == data[..]));
}

#[test]
fn eager_messages_larger_than_small_ones_go_in_place_too() {
    let mid = pattern(3 * INLINE_BODY_BYTES, 9);
    let mut buf = vec![0u8; mid.len()];
    let mut net = Net::new();
    taking(&mut net);
    net.b.recv(recv(10, &mut buf, None, 0));
    let mut slots = Slots {
        room: 4,
        frames: Vec::new(),
        in_place: 0,
    };
    let op = send(1, &mid, None, None, 0);
    // SAFETY: `mid` outlives the call.
    unsafe { post_via(&mut net.a.eng, &op, &mut slots) };
    assert_eq!(slots.in_place, 1);
    net.a.report();
    net.a.one(1);
    // Past `eager_max`: a rendezvous, announced by a queued frame.
    let large = pattern(4 * INLINE_BODY_BYTES + 1, 10);
    let op = send(2, &large, None, None, 0);
    // SAFETY: `large` outlives the operation (which waits for a Cts nobody sends).
    unsafe { post_via(&mut net.a.eng, &op, &mut slots) };
    assert_eq!(slots.in_place, 1);
    assert!(net.a.eng.has_output());
    let (frame, body) = wire::decode_all(&slots.frames[0]).unwrap();
    assert!(matches!(frame, Frame::Msg { .. }));
    arrive(
        &mut net.b,
        &slots.frames[0][..slots.frames[0].len() - body.len()],
        body,
    )
    .unwrap();
    net.b.report();
    net.b.one(10);
    assert_eq!(buf, mid);
}
