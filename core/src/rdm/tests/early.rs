//! Memory the transports copy cheaply (`OneSided::offer_min`): a message of it is announced
//! and pulled from the transport's size on, below `eager_max` too, and an RMA write's source
//! likewise; smaller ones, injected ones and reads' destinations go as before; a receiver
//! that cannot copy after all takes the data through frames.

use super::*;

/// `SameProcess`, with every memory cheap to pull from `.0` bytes.
struct Cheap(usize);

impl OneSided for Cheap {
    fn pull_min(&self) -> usize {
        PULL_MIN
    }

    fn describe(&self, _peer: PeerId, iov: &IovList, _dir: Dir) -> Option<Desc> {
        Some(Desc::of_iov(iov))
    }

    fn offer_min(&self, iov: &IovList) -> Option<usize> {
        (iov.total() >= self.0).then_some(self.0)
    }
}

/// A pair whose transports copy one-sidedly, A's cheaply from `min` bytes.
fn cheap_from(min: usize) -> Net {
    let mut net = Net::sides(World::new(), true, true);
    let cfg = Config {
        eager_max: EAGER,
        ..Config::default()
    };
    net.a.eng = Engine::new(net.a.core.clone(), cfg).with_one_sided(Box::new(Cheap(min)));
    net
}

#[test]
fn cheap_memory_is_pulled_below_eager_max() {
    const { assert!(40 < EAGER) };
    let data = pattern(40, 50);
    let mut buf = vec![0u8; EAGER];
    let mut net = cheap_from(32);
    net.b.recv(recv(10, &mut buf, None, 0));
    net.a.send(send(1, &data, None, None, 0));
    assert_eq!(net.flush(S::A), vec![Kind::Rts]);
    let p = net.b.eng.poll_copy().expect("pulled, not sent");
    assert_eq!((p.dir, p.len), (Dir::Read, 40));
    assert_eq!(net.a.eng.offered(0, p.offer).map(|l| l.total()), Some(40));
    perform(&p);
    net.b.eng.on_copied(p.token, Copied::Done);
    net.report();
    assert_eq!(net.b.one(10).len, 40);
    assert_eq!(&buf[..40], &data[..]);
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    net.a.one(1);

    // Shorter than the transport's size, or injected (its bytes are copied at once): eager.
    for (ctx, len, flags) in [(2, 31, 0), (3, 40, FI_INJECT)] {
        let d = pattern(len, ctx as u8);
        buf.fill(0);
        net.b.recv(recv(ctx + 10, &mut buf, None, 0));
        net.a.send(send(ctx, &d, None, None, flags));
        assert_eq!(net.flush(S::A), vec![Kind::Msg]);
        assert!(net.b.eng.poll_copy().is_none());
        net.b.one(ctx + 10);
        assert_eq!(&buf[..len], &d[..]);
        if flags == 0 {
            net.a.one(ctx);
        }
    }
    assert!(!net.a.eng.busy() && !net.b.eng.busy());
}

#[test]
fn a_refused_cheap_pull_goes_through_frames() {
    let data = pattern(40, 52);
    let (mut b1, mut b2) = (vec![0u8; 40], vec![0u8; 40]);
    let mut net = cheap_from(32);
    net.b.recv(recv(10, &mut b1, None, 0));
    net.a.send(send(1, &data, None, None, 0));
    net.flush(S::A);
    let p = net.b.eng.poll_copy().expect("a copy");
    net.b.eng.on_copied(p.token, Copied::Refused);
    net.report();
    assert_eq!(net.flush(S::B), vec![Kind::Cts]);
    assert_eq!(net.flush(S::A), vec![Kind::Data]);
    net.b.one(10);
    assert_eq!(&b1[..], &data[..]);
    net.pump();
    net.a.one(1);
    // The sender still offers; the receiver asks for the data instead.
    net.b.recv(recv(11, &mut b2, None, 0));
    net.a.send(send(2, &data, None, None, 0));
    assert_eq!(net.flush(S::A), vec![Kind::Rts]);
    assert!(net.b.eng.poll_copy().is_none());
    net.pump();
    net.b.one(11);
    net.a.one(2);
    assert_eq!(&b2[..], &data[..]);
}

#[test]
fn cheap_rma_sources_are_pulled_and_read_destinations_not_offered() {
    let tgt = vec![0u8; 100];
    let data = pattern(40, 53);
    let mut net = cheap_from(32);
    net.register(&tgt);
    let at = net.raddr(tgt.as_ptr(), 0);
    net.a
        .rma(rma(1, iov(&data), &[seg(at, 40, KEY)], None, FI_WRITE));
    assert_eq!(net.flush(S::A), vec![Kind::Write]);
    let p = net.b.eng.poll_copy().expect("the write's source pulled");
    assert_eq!((p.dir, p.len), (Dir::Read, 40));
    perform(&p);
    net.b.eng.on_copied(p.token, Copied::Done);
    net.report();
    net.pump();
    net.a.one(1);
    assert_eq!(&tgt[..40], &data[..]);

    // A read's destination is written, not pulled from: it is not offered early.
    let mut back = vec![0u8; 40];
    net.a.rma(rma(
        2,
        iov_mut(&mut back),
        &[seg(at, 40, KEY)],
        None,
        FI_READ,
    ));
    net.flush(S::A);
    assert!(net.b.eng.poll_copy().is_none());
    assert_eq!(net.flush(S::B), vec![Kind::ReadResp]);
    net.a.one(2);
    assert_eq!(&back[..], &data[..]);
}
