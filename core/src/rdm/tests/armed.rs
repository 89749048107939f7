//! Armed sends (`Engine::arm_send`, `fire_armed`): a request and its `Rts` made at arming,
//! not outstanding, offering nothing and taking no answer until the send fires; a firing
//! behind held operations waits behind them, still taking no answer; at most half of
//! `tx_max` armed at once; each completes once.

use super::*;
use crate::rdm::Fired;

/// Above `EAGER` and from `PULL_MIN`: a send the peer pulls.
const LEN: usize = 4 * PULL_MIN;

/// An Ack naming request `id` of A, as a peer (a hostile one, early) would send it.
fn ack(net: &mut Net, id: u32) {
    let f = Frame::Ack { id, status: 0 }.ctrl(0);
    arrive(&mut net.a, f.as_bytes(), &[]).expect("an ack parses");
    net.a.report();
}

/// Arms `op` at A: its token and encoded `Rts`.
fn arm(net: &mut Net, op: &TxOp) -> (u64, Vec<u8>) {
    let (t, c) = net.a.eng.arm_send(0, op).expect("armed");
    (t, c.as_bytes().to_vec())
}

/// B pulls the message whose `Rts` just arrived into a matched receive, and answers.
fn pull(net: &mut Net) {
    let p = net.b.eng.poll_copy().expect("pulled, not sent");
    perform(&p);
    net.b.eng.on_copied(p.token, Copied::Done);
    net.report();
}

#[test]
fn an_armed_send_takes_no_answer_before_it_fires_and_completes_once() {
    let data = pattern(LEN, 1);
    let mut buf = vec![0u8; LEN];
    let mut net = Net::sides(World::new(), true, true);
    net.b.recv(recv(10, &mut buf, None, 0));
    let (token, rts) = arm(&mut net, &send(1, &data, None, None, 0));
    let id = (token & 0xffff_ffff) as u32;
    // Nothing queued, nothing offered, no answer taken while it waits.
    assert!(net.a.eng.poll_transmit().is_none());
    assert_eq!(net.a.eng.offered(0, id), None);
    ack(&mut net, id);
    net.a.quiet();
    assert!(net.a.eng.is_armed(token));
    // Fired: the transport hands its copy of the Rts over.
    assert_eq!(net.a.eng.fire_armed(token), Fired::Release(0));
    assert_eq!(net.a.eng.offered(0, id).map(|l| l.total()), Some(LEN));
    arrive(&mut net.b, &rts, &[]).expect("the Rts parses");
    pull(&mut net);
    assert_eq!(net.b.one(10).len, LEN);
    assert_eq!(buf, data);
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    net.a.one(1);
    // Once.
    assert_eq!(net.a.eng.fire_armed(token), Fired::Stale);
    assert!(!net.a.eng.disarm(token));
    assert!(!net.a.eng.busy() && !net.b.eng.busy());
}

#[test]
fn a_firing_behind_a_fence_waits_and_takes_no_answer_meanwhile() {
    let (x, f, d) = (pattern(LEN, 2), pattern(8, 3), pattern(LEN, 4));
    let mut bx = vec![0u8; LEN];
    let mut net = Net::sides(World::new(), true, true);
    // X outstanding (B has no receive yet), F fenced behind it.
    net.a.send(send(1, &x, None, None, 0));
    assert_eq!(net.flush(S::A), vec![Kind::Rts]);
    net.a.send(send(2, &f, None, None, FI_FENCE));
    let (token, _) = arm(&mut net, &send(3, &d, None, None, 0));
    assert_eq!(net.a.eng.fire_armed(token), Fired::Queued);
    // Waiting behind F: still armed, an early answer naming it is ignored.
    ack(&mut net, (token & 0xffff_ffff) as u32);
    net.a.quiet();
    assert!(net.a.eng.poll_transmit().is_none());
    // X answered: F goes, then the armed send's Rts, in that order.
    net.b.recv(recv(10, &mut bx, None, 0));
    pull(&mut net);
    net.b.one(10);
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    net.a.one(1);
    assert_eq!(net.flush(S::A), vec![Kind::Msg, Kind::Rts]);
    // B takes both (F unexpected, then the armed one into a receive), and A completes both.
    let (mut bf, mut bd) = (vec![0u8; 8], vec![0u8; LEN]);
    net.b.recv(recv(11, &mut bf, None, 0));
    net.b.recv(recv(12, &mut bd, None, 0));
    pull(&mut net);
    net.flush(S::B);
    net.report();
    let (ok, err) = net.a.cq();
    assert!(err.is_empty(), "{err:?}");
    let mut done: Vec<Context> = ok.iter().map(|e| e.op_context).collect();
    done.sort_unstable();
    assert_eq!(done, [2, 3], "each completed once");
    assert_eq!((bf, bd), (f, d));
    assert!(!net.a.eng.busy());
}

#[test]
fn at_most_half_of_tx_max_is_armed_and_a_disarm_ends_it_without_a_completion() {
    let data = pattern(LEN, 5);
    let mut net = Net::sides(World::new(), true, true);
    let cfg = Config {
        eager_max: EAGER,
        tx_max: 8,
        ..Config::default()
    };
    net.a.eng = Engine::new(net.a.core.clone(), cfg).with_one_sided(Box::new(SameProcess));
    let armed: Vec<Option<u64>> = (0..8)
        .map(|i| {
            net.a
                .eng
                .arm_send(0, &send(i, &data, None, None, 0))
                .map(|(t, _)| t)
        })
        .collect();
    assert_eq!(armed.iter().filter(|t| t.is_some()).count(), 4);
    // The host's posts keep the other half.
    for i in 0..4 {
        net.a
            .send(send(100 + i, &pattern(8, 6), None, None, FI_INJECT));
    }
    let (ok, err) = net.a.cq();
    assert!(err.is_empty(), "{err:?}");
    assert_eq!(ok.len(), 4, "the injects");
    // Disarmed: ended, with no completion, once.
    for t in armed.into_iter().flatten() {
        assert!(net.a.eng.disarm(t));
        assert!(!net.a.eng.disarm(t));
    }
    net.a.report();
    net.a.quiet();
    assert_eq!(net.flush(S::A), vec![Kind::Msg; 4]);
    assert!(!net.a.eng.busy());
}
