//! One-sided copies (`CopyReq`): large messages the receiver's transport pulls, RMA writes
//! and reads the target's transport serves; each copy's refusal and the fallback to frames,
//! its failure, a peer lost or the endpoint closed while a copy is under way, and the
//! ordering of a peer's later requests behind its served ones.

use super::*;
use crate::rdm::Dir;

fn pulling() -> Net {
    Net::sides(World::new(), true, true)
}

#[test]
fn pull_posted_first_copies_and_acks() {
    let data = pattern(300, 30);
    let mut buf = vec![0u8; 400];
    let mut net = pulling();
    net.b.recv(recv(10, &mut buf, Some(4), 0));
    net.a.send(send(1, &data, Some(4), Some(9), 0));
    assert_eq!(net.flush(S::A), vec![Kind::Rts]);
    // No Cts: B's transport copies instead.
    assert_eq!(net.flush(S::B), vec![]);
    let p = net.b.eng.poll_copy().expect("a copy to perform");
    assert!(net.b.eng.poll_copy().is_none());
    assert_eq!((p.peer, p.len), (0, 300));
    assert!(net.b.eng.copying());
    net.b.quiet();
    perform(&p);
    net.b.eng.on_copied(p.token, Copied::Done);
    net.report();
    let e = net.b.one(10);
    assert_eq!((e.len, e.tag, e.data), (300, 4, 9));
    assert_eq!(&buf[..300], &data[..]);
    // Acknowledged like a transfer through frames.
    net.a.quiet();
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    assert_eq!(net.a.one(1).flags, FI_SEND | FI_TAGGED);
    assert!(!net.a.eng.busy() && !net.b.eng.busy());
    // A stale or repeated report changes nothing.
    net.b.eng.on_copied(p.token, Copied::Done);
    net.report();
    net.b.quiet();
    assert_eq!(net.flush(S::B), vec![]);
}

#[test]
fn pull_unexpected_and_truncated() {
    let data = pattern(300, 31);
    let mut small = vec![0u8; 120];
    let mut net = pulling();
    net.a.send(send(1, &data, None, None, 0));
    net.pump();
    assert!(net.b.eng.poll_copy().is_none());
    net.b.recv(recv(10, &mut small, None, 0));
    let p = net.b.eng.poll_copy().expect("a copy on match");
    assert_eq!(p.len, 120);
    perform(&p);
    net.b.eng.on_copied(p.token, Copied::Done);
    net.report();
    let e = net.b.one_err(10);
    assert_eq!((e.err, e.len, e.olen), (FI_ETRUNC, 120, 180));
    assert_eq!(&small[..], &data[..120]);
    net.pump();
    net.a.one(1);
}

#[test]
fn pull_only_where_both_transports_can() {
    let data = pattern(300, 32);
    let small = pattern(PULL_MIN - 1, 33);
    let mut buf = vec![0u8; 300];
    // The sender offers nothing: frames.
    let mut net = Net::sides(World::new(), false, true);
    net.b.recv(recv(10, &mut buf, None, 0));
    net.a.send(send(1, &data, None, None, 0));
    net.flush(S::A);
    assert_eq!(net.flush(S::B), vec![Kind::Cts]);
    assert!(net.b.eng.poll_copy().is_none());
    net.pump();
    net.b.one(10);
    net.a.one(1);
    // A receiver whose transport never copies (tcp's) refuses an offer: no engine it talks
    // to makes one (a provider's endpoints all copy or none does), so one is a hostile
    // peer's. A receiver that can copy but not now answers frames instead
    // (`first_pull_answered`).
    let mut net = Net::sides(World::new(), true, false);
    net.b.recv(recv(10, &mut buf, None, 0));
    net.a.send(send(1, &data, None, None, 0));
    net.flush(S::A);
    assert_eq!(net.b.refused, vec![WireError::Malformed(Kind::Rts)]);
    assert!(net.flush(S::B).is_empty());
    net.b.quiet();
    // Below the transport's threshold (but above eager): no offer.
    let mut net = pulling();
    net.b.recv(recv(10, &mut buf, None, 0));
    net.a.send(send(1, &small, None, None, 0));
    net.flush(S::A);
    assert_eq!(net.flush(S::B), vec![Kind::Cts]);
    net.pump();
    net.b.one(10);
    net.a.one(1);
}

/// A's first large message to B, whose copy B's transport answers `how` (refused or
/// declined): it comes through frames instead (Cts, Data), whole, and both ends complete.
fn first_pull_answered(net: &mut Net, how: Copied, data: &[u8], b1: &mut [u8]) {
    net.b.recv(recv(10, b1, None, 0));
    net.a.send(send(1, data, None, None, 0));
    net.flush(S::A);
    let p = net.b.eng.poll_copy().expect("a copy");
    net.b.eng.on_copied(p.token, how);
    net.report();
    net.b.quiet();
    assert_eq!(net.flush(S::B), vec![Kind::Cts]);
    assert_eq!(net.flush(S::A), vec![Kind::Data]);
    net.b.one(10);
    assert_eq!(&b1[..], data);
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    net.a.one(1);
}

#[test]
fn a_declined_pull_goes_through_frames_and_the_next_is_still_pulled() {
    let data = pattern(300, 35);
    let (mut b1, mut b2) = (vec![0u8; 300], vec![0u8; 300]);
    let mut net = pulling();
    first_pull_answered(&mut net, Copied::Declined, &data, &mut b1);
    // Declined says nothing of the next: it is pulled again.
    net.b.recv(recv(11, &mut b2, None, 0));
    net.a.send(send(2, &data, None, None, 0));
    net.flush(S::A);
    let p = net.b.eng.poll_copy().expect("asked again");
    perform(&p);
    net.b.eng.on_copied(p.token, Copied::Done);
    net.pump();
    net.b.one(11);
    net.a.one(2);
    assert_eq!(&b2[..], &data[..]);
}

#[test]
fn pull_refused_falls_back_to_frames() {
    let data = pattern(300, 34);
    let (mut b1, mut b2) = (vec![0u8; 300], vec![0u8; 300]);
    let mut net = pulling();
    first_pull_answered(&mut net, Copied::Refused, &data, &mut b1);
    // Refused once, never asked again with that peer.
    net.b.recv(recv(11, &mut b2, None, 0));
    net.a.send(send(2, &data, None, None, 0));
    net.flush(S::A);
    assert!(net.b.eng.poll_copy().is_none());
    assert_eq!(net.flush(S::B), vec![Kind::Cts]);
    net.pump();
    net.b.one(11);
    net.a.one(2);
    assert_eq!(&b2[..], &data[..]);
    // Another peer's large message (peer 1 at B, announced as A's was) is still pulled.
    let mut b3 = vec![0u8; 300];
    net.b.recv(recv(12, &mut b3, None, 0));
    let rts = Frame::Rts {
        id: 7,
        tag: 0,
        data: 0,
        len: 300,
        flags: 0,
        desc: Desc::of_iov(&iov(&data)),
    }
    .ctrl(0);
    let p = wire::prefix(&rts).unwrap();
    let sink = net.b.eng.on_ctrl(1, 0, &p, &rts[PREFIX..]).unwrap();
    net.b.eng.on_body(1, sink);
    let c = net.b.eng.poll_copy().expect("peer 1 is still copied from");
    assert_eq!((c.peer, c.offer, c.len), (1, 7, 300));
    perform(&c);
    net.b.eng.on_copied(c.token, Copied::Done);
    net.b.report();
    net.b.one(12);
    assert_eq!(b3, data);
}

#[test]
fn pull_failed_fails_both_ends() {
    let data = pattern(300, 35);
    let mut buf = vec![0u8; 300];
    let mut net = pulling();
    net.b.recv(recv(10, &mut buf, None, 0));
    net.a.send(send(1, &data, None, None, 0));
    net.flush(S::A);
    let p = net.b.eng.poll_copy().expect("a copy");
    net.b.eng.on_copied(p.token, Copied::Failed(FI_EFAULT));
    net.report();
    assert_eq!(net.b.one_err(10).err, FI_EFAULT);
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    assert_eq!(net.a.one_err(1).err, FI_EFAULT);
    // A Data frame for the ended transfer is garbage.
    assert!(arrive(&mut net.b, &Frame::Data { rx: 0 }.to_vec(300), &data).is_err());
}

/// Copies a transport runs at once may end in any order (two cross-memory reads, a split
/// copy's halves, a NIC's reads): each receive ends with its own message, whatever the order,
/// and a small message that passed them all on the wire is not held up by them.
#[test]
fn copies_ending_out_of_order_complete_each_their_own_receive() {
    let msgs: Vec<Vec<u8>> = (0..3)
        .map(|i| pattern(300 + 50 * i, 50 + i as u8))
        .collect();
    let small = pattern(40, 53);
    let mut bufs = vec![vec![0u8; 512]; 3];
    let mut sbuf = vec![0u8; 64];
    let mut net = pulling();
    for (i, b) in bufs.iter_mut().enumerate() {
        net.b.recv(recv(10 + i, b, Some(7), 0));
    }
    net.b.recv(recv(20, &mut sbuf, Some(8), 0));
    for (i, m) in msgs.iter().enumerate() {
        net.a.send(send(1 + i, m, Some(7), Some(100 + i as u64), 0));
    }
    net.a.send(send(4, &small, Some(8), None, 0));
    assert_eq!(
        net.flush(S::A),
        vec![Kind::Rts, Kind::Rts, Kind::Rts, Kind::Msg]
    );
    // The small message is delivered while the three copies are still the transport's.
    let e = net.b.one(20);
    assert_eq!((e.len, e.tag), (40, 8));
    assert_eq!(&sbuf[..40], &small[..]);
    let mut copies = Vec::new();
    while let Some(c) = net.b.eng.poll_copy() {
        copies.push(c);
    }
    assert_eq!(copies.len(), 3, "all three copies handed out at once");
    for order in [2, 0, 1] {
        let c = &copies[order];
        perform(c);
        net.b.eng.on_copied(c.token, Copied::Done);
        net.report();
        // Only the receive that copy served ends, with its own length and data.
        let e = net.b.one(10 + order);
        assert_eq!(
            (e.len, e.tag, e.data),
            (msgs[order].len(), 7, 100 + order as u64)
        );
        assert_eq!(&bufs[order][..msgs[order].len()], &msgs[order][..]);
        assert!(bufs[order][msgs[order].len()..].iter().all(|&x| x == 0));
    }
    net.pump();
    let (ok, err) = net.a.cq();
    assert!(err.is_empty(), "{err:?}");
    let mut got: Vec<_> = ok.iter().map(|e| e.op_context).collect();
    got.sort();
    assert_eq!(got, [1, 2, 3, 4]);
    // Reports repeated in yet another order change nothing.
    for c in copies.iter().rev() {
        net.b.eng.on_copied(c.token, Copied::Done);
    }
    net.report();
    net.b.quiet();
    assert_eq!(net.flush(S::B), vec![]);
    assert!(!net.a.eng.busy() && !net.b.eng.busy());
}

/// Two large messages (sends 1 and 2, receives 10 and 11) matched at B; the first copy
/// taken by B's transport, the second left with the engine.
fn two_large(net: &mut Net, data: &[u8], b1: &mut [u8], b2: &mut [u8]) -> CopyReq {
    net.b.recv(recv(10, b1, Some(1), 0));
    net.b.recv(recv(11, b2, Some(2), 0));
    net.a.send(send(1, data, Some(1), None, 0));
    net.a.send(send(2, data, Some(2), None, 0));
    net.flush(S::A);
    net.b.eng.poll_copy().expect("a copy")
}

#[test]
fn lost_mid_copy_waits_for_the_copy() {
    let data = pattern(300, 36);
    let (mut b1, mut b2) = (vec![0u8; 300], vec![0u8; 300]);
    let mut net = pulling();
    // The transport took the first copy; the second waits in the engine.
    let p = two_large(&mut net, &data, &mut b1, &mut b2);
    net.b.eng.on_lost(0, FI_ECONNRESET);
    net.a.eng.on_lost(0, FI_ECONNRESET);
    net.report();
    let mut got: Vec<_> = net.a.cq().1.iter().map(|e| e.op_context).collect();
    got.sort();
    assert_eq!(got, [1, 2]);
    // The one never taken fails at once; the one under way when its copy reports, whatever
    // the copy did, and nothing is acknowledged.
    assert_eq!(net.b.one_err(11).err, FI_ECONNRESET);
    assert!(net.b.eng.poll_copy().is_none());
    assert!(net.b.eng.copying());
    net.b.eng.on_copied(p.token, Copied::Done);
    net.report();
    assert_eq!(net.b.one_err(10).err, FI_ECONNRESET);
    assert_eq!(net.flush(S::B), vec![]);
    assert!(!net.b.eng.busy());
}

#[test]
fn close_during_a_copy_cancels_when_it_reports() {
    let data = pattern(300, 37);
    let (mut b1, mut b2) = (vec![0u8; 300], vec![0u8; 300]);
    let mut net = pulling();
    let p = two_large(&mut net, &data, &mut b1, &mut b2);
    net.b.eng.close();
    net.report();
    // The receive whose buffer the transport is writing stays out until the copy reports.
    assert_eq!(net.b.one_err(11).err, FI_ECANCELED);
    assert!(net.b.eng.copying());
    perform(&p);
    net.b.eng.on_copied(p.token, Copied::Refused);
    net.report();
    assert_eq!(net.b.one_err(10).err, FI_ECANCELED);
    assert!(!net.b.eng.copying() && net.b.eng.poll_copy().is_none());
    // Nothing goes to the sender for a canceled receive.
    assert_eq!(net.flush(S::B), vec![]);
    // The sender closing while its data is being copied: its sends end canceled.
    net.a.eng.close();
    net.report();
    let mut got: Vec<_> = net.a.cq().1.iter().map(|e| (e.op_context, e.err)).collect();
    got.sort();
    assert_eq!(got, [(1, FI_ECANCELED), (2, FI_ECANCELED)]);
}

// RMA served by the target's transport.

/// A pair that copies one-sidedly, with `tgt` registered at B; the remote address of its start.
pub(super) fn rma_pair(tgt: &[u8]) -> (Net, u64) {
    let mut net = pulling();
    net.register(tgt);
    let at = net.raddr(tgt.as_ptr(), 0);
    (net, at)
}

#[test]
fn rma_write_pulled_by_the_target() {
    let tgt = vec![0u8; 400];
    let data = pattern(300, 40);
    let (mut net, at) = rma_pair(&tgt);
    net.a.rma(rma(
        1,
        iov(&data),
        &[seg(at + 50, 300, KEY)],
        Some(7),
        FI_WRITE,
    ));
    // The frame carries no data.
    assert_eq!(net.flush(S::A), vec![Kind::Write]);
    let p = net.b.eng.poll_copy().expect("a copy");
    assert_eq!((p.dir, p.len), (Dir::Read, 300));
    assert_eq!(net.a.eng.offered(0, p.offer).map(|l| l.total()), Some(300));
    perform(&p);
    net.b.eng.on_copied(p.token, Copied::Done);
    net.report();
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    net.a.one(1);
    assert_eq!(net.a.eng.offered(0, p.offer), None);
    assert_eq!(&tgt[50..350], &data[..]);
    assert!(tgt[..50].iter().chain(&tgt[350..]).all(|&x| x == 0));
    assert!(!net.b.eng.busy());
}

#[test]
fn rma_write_refused_or_unservable_goes_through_frames() {
    let tgt = vec![0u8; 300];
    let data = pattern(300, 41);
    let (mut net, at) = rma_pair(&tgt);
    // A bad key: refused at once, nothing to copy.
    net.a
        .rma(rma(1, iov(&data), &[seg(at, 300, KEY + 1)], None, FI_WRITE));
    net.flush(S::A);
    assert!(net.b.eng.poll_copy().is_none());
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    assert_eq!(net.a.one_err(1).err, FI_EACCES);
    // The transport refuses the copy: the target asks for the data.
    net.a
        .rma(rma(2, iov(&data), &[seg(at, 300, KEY)], None, FI_WRITE));
    net.flush(S::A);
    let p = net.b.eng.poll_copy().expect("a copy");
    net.b.eng.on_copied(p.token, Copied::Refused);
    net.report();
    assert_eq!(net.flush(S::B), vec![Kind::Cts]);
    assert_eq!(net.flush(S::A), vec![Kind::Data]);
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    net.a.one(2);
    assert_eq!(&tgt[..], &data[..]);
    // Refused once, asked no more.
    net.a.rma(rma(
        3,
        iov(&data[..200]),
        &[seg(at, 200, KEY)],
        None,
        FI_WRITE,
    ));
    net.flush(S::A);
    assert!(net.b.eng.poll_copy().is_none());
    net.pump();
    net.a.one(3);
}

/// A write into device memory the target's transport copies into a bounce buffer (landed in
/// the device memory before the acknowledgement), not asked for through frames: the peer's
/// later requests wait behind the write, and a transport with one ordered stream per peer
/// keeps them at its head, so a `Data` behind them would never be read (over verbs, a write
/// into a staged window and a read at once hung). Refused, it goes through frames as any.
#[test]
fn rma_write_into_device_memory_pulled_through_a_bounce_buffer() {
    let fake = Arc::new(FakeHmem::default());
    let tgt = vec![0u8; 400];
    fake.add(&tgt);
    let data = pattern(300, 44);
    let mut net = Net::sides(World::with_hmem(fake.clone()), true, true);
    let at = net.register_device(&tgt);
    net.a.rma(rma(
        1,
        iov(&data),
        &[seg(at + 50, 300, KEY)],
        Some(7),
        FI_WRITE,
    ));
    assert_eq!(net.flush(S::A), vec![Kind::Write]);
    let p = net.b.eng.poll_copy().expect("a copy, not a Cts");
    assert_eq!((p.dir, p.len), (Dir::Read, 300));
    let into = p.local.segs()[0].addr;
    assert!(
        !(tgt.as_ptr() as usize..tgt.as_ptr() as usize + tgt.len()).contains(&into),
        "copied into a bounce buffer, not the device memory"
    );
    assert!(net.b.core.staging.any());
    perform(&p);
    assert!(
        tgt.iter().all(|&x| x == 0),
        "not landed before the copy is done"
    );
    net.b.eng.on_copied(p.token, Copied::Done);
    net.report();
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    net.a.one(1);
    assert_eq!(net.b.one(0).data, 7);
    assert_eq!(&tgt[50..350], &data[..]);
    assert!(fake.from_host.load(std::sync::atomic::Ordering::Acquire) > 0);
    assert!(!net.b.core.staging.any());
    // A copy that fails: nothing lands, the bounce buffer goes.
    net.a
        .rma(rma(2, iov(&data), &[seg(at, 300, KEY)], None, FI_WRITE));
    net.flush(S::A);
    let p = net.b.eng.poll_copy().expect("a copy");
    net.b.eng.on_copied(p.token, Copied::Failed(FI_EFAULT));
    net.report();
    net.pump();
    assert_eq!(net.a.one_err(2).err, FI_EFAULT);
    assert!(!net.b.core.staging.any());
    // Refused: the bounce buffer goes, the data comes through frames, staged as any write's.
    net.a
        .rma(rma(3, iov(&data), &[seg(at, 300, KEY)], None, FI_WRITE));
    net.flush(S::A);
    let p = net.b.eng.poll_copy().expect("a copy");
    net.b.eng.on_copied(p.token, Copied::Refused);
    net.report();
    assert_eq!(net.flush(S::B), vec![Kind::Cts]);
    assert_eq!(net.flush(S::A), vec![Kind::Data]);
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    net.a.one(3);
    assert_eq!(&tgt[..300], &data[..]);
    assert!(!net.b.core.staging.any());
}

/// A's read `ctx` of 300 bytes at `at` into `back`, which B's transport ends with `how`
/// (performing it first when `Done`); B's answer moved to A.
fn read_served(net: &mut Net, ctx: Context, back: &mut [u8], at: u64, how: Copied) {
    net.a
        .rma(rma(ctx, iov_mut(back), &[seg(at, 300, KEY)], None, FI_READ));
    net.flush(S::A);
    let p = net.b.eng.poll_copy().expect("a copy");
    assert_eq!((p.dir, p.len), (Dir::Write, 300));
    // Offered to be written, never to be read from (shm's split copy asks for the latter).
    assert_eq!(net.a.eng.offered(0, p.offer), None);
    if how == Copied::Done {
        perform(&p);
    }
    net.b.eng.on_copied(p.token, how);
    net.report();
    assert_eq!(net.flush(S::B), vec![Kind::ReadResp]);
}

#[test]
fn rma_read_pushed_by_the_target() {
    let tgt = pattern(300, 42);
    let mut back = vec![0u8; 300];
    let (mut net, at) = rma_pair(&tgt);
    read_served(&mut net, 1, &mut back, at, Copied::Done);
    net.a.one(1);
    assert_eq!(&back[..], &tgt[..]);
    // Refused: the bytes come back as the answer's body.
    back.fill(0);
    read_served(&mut net, 2, &mut back, at, Copied::Refused);
    net.a.one(2);
    assert_eq!(&back[..], &tgt[..]);
    // Failed: the read fails, nothing arrives.
    back.fill(0);
    let (mut net, at) = rma_pair(&tgt);
    read_served(&mut net, 3, &mut back, at, Copied::Failed(FI_EFAULT));
    assert_eq!(net.a.one_err(3).err, FI_EFAULT);
    assert!(back.iter().all(|&x| x == 0));
}

#[test]
fn later_requests_wait_behind_a_served_write() {
    let tgt = vec![0u8; 300];
    let data = pattern(300, 43);
    let mut buf = vec![0u8; 8];
    let (mut net, at) = rma_pair(&tgt);
    net.b.recv(recv(10, &mut buf, None, 0));
    net.a
        .rma(rma(1, iov(&data), &[seg(at, 300, KEY)], None, FI_WRITE));
    net.a.send(send(2, &data[..8], None, None, 0));
    assert_eq!(net.step(S::A), Some(Kind::Write));
    let p = net.b.eng.poll_copy().expect("a copy");
    // The message behind it is kept by the transport until the write landed.
    let t = net.a.eng.poll_transmit().expect("the message");
    let pre = wire::prefix(&t.ctrl).unwrap();
    let sink = net.b.eng.on_ctrl(0, 0, &pre, &t.ctrl[PREFIX..]).unwrap();
    assert!(matches!(sink, Sink::Wait));
    // Answers still pass: an acknowledgement naming nothing is dropped, not held.
    let ack = Frame::Ack { id: 99, status: 0 }.ctrl(0);
    let q = wire::prefix(&ack).unwrap();
    assert!(matches!(
        net.b.eng.on_ctrl(0, 0, &q, &ack[PREFIX..]),
        Ok(Sink::Discard)
    ));
    net.b.eng.on_body(0, Sink::Discard);
    perform(&p);
    net.b.eng.on_copied(p.token, Copied::Done);
    // Offered again, it is taken.
    assert!(arrive(&mut net.b, &t.ctrl, &body_bytes(&t.body)).is_ok());
    net.a.eng.on_sent(
        0,
        t.token.expect("the message's buffer is in use until sent"),
    );
    net.report();
    net.b.one(10);
    assert_eq!(&buf[..], &data[..8]);
    net.pump();
    let mut got: Vec<_> = net.a.cq().0.iter().map(|e| e.op_context).collect();
    got.sort();
    assert_eq!(got, [1, 2]);
}

#[test]
fn served_copies_end_with_their_peer() {
    let tgt = vec![0u8; 300];
    let data = pattern(300, 44);
    let (mut net, at) = rma_pair(&tgt);
    net.a
        .rma(rma(1, iov(&data), &[seg(at, 300, KEY)], None, FI_WRITE));
    net.a
        .rma(rma(2, iov(&data), &[seg(at, 300, KEY)], None, FI_WRITE));
    assert_eq!(net.step(S::A), Some(Kind::Write));
    let p = net.b.eng.poll_copy().expect("a copy");
    net.b.eng.on_lost(0, FI_ECONNRESET);
    net.a.eng.on_lost(0, FI_ECONNRESET);
    net.report();
    assert_eq!(net.a.cq().1.len(), 2);
    // Still the transport's until it reports; then dropped without an answer.
    assert!(net.b.eng.copying() && net.b.eng.busy());
    net.b.eng.on_copied(p.token, Copied::Done);
    net.report();
    net.b.quiet();
    assert_eq!(net.flush(S::B), vec![]);
    assert!(!net.b.eng.busy());
    assert!(tgt.iter().all(|&x| x == 0));
}

// Frames given back by a full transport.

/// A transport whose peers take `room[peer]` more frames; what it took, as (peer, tag).
struct Rings {
    room: [usize; 2],
    took: Vec<(PeerId, u64)>,
    tokens: Vec<(PeerId, u64)>,
}

impl crate::rdm::Transport for Rings {
    fn send(&mut self, t: Transmit) -> Result<(), Transmit> {
        if self.room[t.peer] == 0 {
            return Err(t);
        }
        self.room[t.peer] -= 1;
        let p = wire::prefix(&t.ctrl).unwrap();
        let Ok(Frame::Msg { tag, .. }) = wire::decode(&p, &t.ctrl[PREFIX..]) else {
            panic!("only messages here");
        };
        self.took.push((t.peer, tag));
        self.tokens.extend(t.token.map(|k| (t.peer, k)));
        Ok(())
    }
}

#[test]
fn a_full_peer_keeps_its_frames_in_order_and_others_go_on() {
    let data = pattern(8, 45);
    let mut net = Net::new();
    let eng = &mut net.a.eng;
    let post = |eng: &mut Engine, peer: PeerId, tag: u64| {
        // SAFETY: `data` outlives the engine's use of it (every frame is taken below).
        unsafe { eng.post_send(peer, &send(tag as usize + 1, &data, Some(tag), None, 0)) }.unwrap();
    };
    for (peer, tag) in [(0, 0), (1, 10), (0, 1), (0, 2), (1, 11)] {
        post(eng, peer, tag);
    }
    let mut rings = Rings {
        room: [1, 5],
        took: Vec::new(),
        tokens: Vec::new(),
    };
    assert_eq!(eng.transmit(&mut rings), 3);
    assert_eq!(rings.took, [(0, 0), (1, 10), (1, 11)]);
    assert_eq!((eng.blocked(0), eng.blocked(1)), (2, 0));
    assert!(eng.owes());
    // Room came, and another frame: the held ones first, in order.
    post(eng, 0, 3);
    rings.room[0] = 2;
    assert_eq!(eng.transmit(&mut rings), 2);
    rings.room[0] = 5;
    assert_eq!(eng.transmit(&mut rings), 1);
    let to0: Vec<u64> = rings
        .took
        .iter()
        .filter(|t| t.0 == 0)
        .map(|t| t.1)
        .collect();
    assert_eq!(to0, [0, 1, 2, 3]);
    assert!(!eng.owes());
    for (peer, tok) in std::mem::take(&mut rings.tokens) {
        eng.on_sent(peer, tok);
    }
    net.a.report();
    assert_eq!(net.a.cq().0.len(), 6);
    // A lost peer's held frames go with it.
    let eng = &mut net.a.eng;
    post(eng, 0, 4);
    rings.room[0] = 0;
    eng.transmit(&mut rings);
    assert_eq!(eng.blocked(0), 1);
    eng.on_lost(0, FI_ECONNRESET);
    assert_eq!(eng.blocked(0), 0);
    assert!(!eng.busy() && eng.poll_transmit().is_none());
}

/// A send from device memory offered unstaged (`DEVICE_OFFER`): announced whatever its size
/// (here below the eager limit), never read by the engine; pulled by the peer's transport,
/// the sender gathers nothing; refused, the sender stages it when asked (`Cts`) and the data
/// comes through frames.
#[test]
fn device_offer_is_announced_pulled_or_staged_when_refused() {
    use crate::ep::DEVICE_OFFER;
    use std::sync::atomic::Ordering;
    let fake = Arc::new(FakeHmem::default());
    let src = pattern(40, 61);
    fake.add(&src);
    let mut buf = vec![0u8; 64];
    let mut net = Net::sides(World::with_hmem(fake.clone()), true, true);
    net.b.recv(recv(10, &mut buf, Some(4), 0));
    net.a.send(send(1, &src, Some(4), None, DEVICE_OFFER));
    assert_eq!(
        net.flush(S::A),
        vec![Kind::Rts],
        "announced, not sent eagerly"
    );
    let p = net.b.eng.poll_copy().expect("a copy");
    assert_eq!((p.dir, p.len, p.ctx), (Dir::Read, 40, 10));
    perform(&p);
    net.b.eng.on_copied(p.token, Copied::Done);
    net.report();
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    let done = net.a.one(1);
    assert_eq!(
        done.flags & DEVICE_OFFER,
        0,
        "the internal flag is not reported"
    );
    assert_eq!(net.b.one(10).len, 40);
    assert_eq!(&buf[..40], &src[..]);
    assert_eq!(fake.to_host.load(Ordering::Acquire), 0, "nothing gathered");

    // Refused by the receiver's transport: the sender stages it when asked.
    let staged = crate::hmem_stage::offer_counts().staged;
    let mut buf2 = vec![0u8; 64];
    net.b.recv(recv(11, &mut buf2, Some(5), 0));
    net.a.send(send(2, &src, Some(5), None, DEVICE_OFFER));
    net.flush(S::A);
    let p = net.b.eng.poll_copy().expect("a copy");
    net.b.eng.on_copied(p.token, Copied::Refused);
    net.report();
    assert_eq!(net.flush(S::B), vec![Kind::Cts]);
    assert_eq!(net.flush(S::A), vec![Kind::Data]);
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    net.a.one(2);
    assert_eq!(net.b.one(11).len, 40);
    assert_eq!(&buf2[..40], &src[..]);
    assert_eq!(
        fake.to_host.load(Ordering::Acquire),
        1,
        "gathered once, when asked"
    );
    assert!(crate::hmem_stage::offer_counts().staged > staged);
}

/// A pair whose B has posted `buf` as a multi-receive buffer (released under 64 bytes left)
/// and A has sent it `data`, large: the copy B's transport is to perform into the buffer.
fn a_copy_into_a_multi_receive_buffer(data: &[u8], buf: &mut [u8]) -> (Net, CopyReq) {
    let mut net = pulling();
    net.b.eng.set_min_multi_recv(64);
    net.b.recv(recv(10, buf, None, FI_MULTI_RECV));
    net.a.send(send(1, data, None, None, 0));
    net.flush(S::A);
    let p = net.b.eng.poll_copy().expect("a copy into the buffer");
    (net, p)
}

/// A multi-receive buffer the close (or its directed source's loss) ends while a copy still
/// lands in it is released by that copy's completion, not before: the application could reuse
/// the memory the copy is writing.
#[test]
fn a_multi_receive_buffer_is_released_after_the_copy_landing_in_it() {
    let data = pattern(300, 38);
    let mut buf = vec![0u8; 1000];
    let (mut net, p) = a_copy_into_a_multi_receive_buffer(&data, &mut buf);
    net.b.eng.close();
    net.report();
    let errs = net.b.cq().1;
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].op_context, 10);
    assert_eq!(errs[0].flags & FI_MULTI_RECV, 0, "released under the copy");
    perform(&p);
    net.b.eng.on_copied(p.token, Copied::Refused);
    net.report();
    let errs = net.b.cq().1;
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].op_context, 10);
    assert_ne!(
        errs[0].flags & FI_MULTI_RECV,
        0,
        "the copy's end releases it"
    );
}

/// The cancel of a multi-receive buffer with a copy landing in it (its error entry carries no
/// release) and the copy's completion (which does) are reported in the order taken, from
/// whichever threads: the release never comes before the cancel's entry.
#[test]
fn a_canceled_multi_receive_buffers_release_waits_for_the_cancels_entry() {
    let data = pattern(300, 39);
    let mut buf = vec![0u8; 1000];
    let (mut net, p) = a_copy_into_a_multi_receive_buffer(&data, &mut buf);
    net.b.eng.cancel(10).unwrap();
    let canceled = net.b.eng.take_done();
    assert_eq!(canceled.len(), 1);
    perform(&p);
    net.b.eng.on_copied(p.token, Copied::Done);
    let released = net.b.eng.take_done();
    // One thread took the cancel's entry and is yet to report it; another reports the copy's.
    let early = report_second_while_the_first_waits(&net.b, canceled, released);
    assert!(early.is_empty(), "the release came first: {early:?}");
    let (ok, err) = net.b.cq();
    assert_eq!(err.len(), 1, "{err:?}");
    assert_eq!(err[0].flags & FI_MULTI_RECV, 0);
    assert_eq!(ok.len(), 1, "{ok:?}");
    assert_ne!(ok[0].flags & FI_MULTI_RECV, 0);
}
