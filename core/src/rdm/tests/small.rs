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
    // The frames may still go out (they hold their bytes), completing nothing again.
    let mut keep = Keep::default();
    net.a.eng.transmit(&mut keep);
    net.a.report();
    net.a.quiet();
    assert!(keep.0.iter().all(|t| t.token.is_none()));
}

/// `INLINE_BODY`, the largest small message.
const INLINE_BODY_BYTES: usize = crate::rdm::INLINE_BODY;
