//! A registered region closing while peers' requests hold its memory (`Engine::cut_region`):
//! a write arriving into it fails and lands nothing more, a read's answer not yet begun fails,
//! a copy serving a write into it fails whether or not the transport took it, and a write
//! through another key of the same memory goes on.

use super::*;

/// B's region `tgt` closes; the engine's cut, as the endpoint makes it under its lock.
fn close_region(net: &mut Net, tgt: &[u8]) -> crate::rdm::Cut {
    net.mr = None;
    net.b.eng.cut_region(KEY, tgt.as_ptr() as usize, tgt.len())
}

/// A 4 KiB write from A into `tgt` (registered at B under `KEY`) whose control part B took as
/// a stream transport does: the frame and the sink its body goes into.
fn write_under_way(net: &mut Net, tgt: &[u8], src: &[u8], data: Option<u64>) -> (Transmit, Sink) {
    net.register(tgt);
    let at = net.raddr(tgt.as_ptr(), 0);
    net.a
        .rma(rma(1, iov(src), &[seg(at, src.len(), KEY)], data, FI_WRITE));
    let w = net.a.eng.poll_transmit().expect("the write");
    let p = wire::prefix(&w.ctrl).unwrap();
    let sink = net.b.eng.on_ctrl(0, 0, &p, &w.ctrl[PREFIX..]).unwrap();
    (w, sink)
}

/// A write from A into `tgt` that B's transport is asked to serve by a copy (`Write` frame
/// taken, the copy not yet).
fn served_write(tgt: &[u8], data: &[u8]) -> Net {
    let (mut net, at) = super::pull::rma_pair(tgt);
    net.a.rma(rma(
        1,
        iov(data),
        &[seg(at, data.len(), KEY)],
        None,
        FI_WRITE,
    ));
    assert_eq!(net.flush(S::A), vec![Kind::Write]);
    net
}

/// B's transport hands `sink` back; A hears its frame went.
fn body_done(net: &mut Net, w: &Transmit, sink: Sink) {
    net.b.eng.on_body(0, sink);
    if let Some(t) = w.token {
        net.a.eng.on_sent(0, t);
    }
    net.report();
}

#[test]
fn a_write_arriving_as_its_region_closes_fails_at_both_ends() {
    let tgt = vec![0u8; 4096];
    let src = pattern(4096, 5);
    let mut net = Net::new();
    let (w, sink) = write_under_way(&mut net, &tgt, &src, Some(3));
    let Sink::Iov(dest) = &sink else {
        panic!("the write's body goes into the region");
    };
    // SAFETY: the sink is the region's memory, registered and alive.
    unsafe { dest.copy_in(0, &body_bytes(&w.body)[..1000]) };
    let cut = close_region(&mut net, &tgt);
    assert_eq!(cut.sinks, vec![0], "the transport must drop the rest");
    // The transport drops the rest and hands the sink back.
    body_done(&mut net, &w, Sink::Discard);
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    assert_eq!(net.a.one_err(1).err, FI_EACCES);
    // No completion at the target for a write that did not land.
    net.b.quiet();
    assert_eq!(&tgt[..1000], &src[..1000]);
    assert!(tgt[1000..].iter().all(|&b| b == 0));
}

/// The answer to a read, queued and not begun when the region closes, is the read's failure:
/// nothing reads the memory after the close.
#[test]
fn a_read_answer_not_begun_as_its_region_closes_fails_the_read() {
    let mut tgt = pattern(4096, 7);
    let mut back = vec![0u8; 4096];
    let mut net = Net::new();
    net.register(&tgt);
    let at = net.raddr(tgt.as_ptr(), 0);
    net.a.rma(rma(
        1,
        iov_mut(&mut back),
        &[seg(at, 4096, KEY)],
        None,
        FI_READ,
    ));
    assert_eq!(net.flush(S::A), vec![Kind::Read]);
    // The answer waits in B's engine, its body the region's memory.
    close_region(&mut net, &tgt);
    // What a program does with memory it no longer registers.
    tgt.fill(0xee);
    net.pump();
    assert_eq!(net.a.one_err(1).err, FI_EACCES);
    assert!(back.iter().all(|&b| b == 0));
    // Nothing waits behind an answer that is no longer the memory's: the peer's next write
    // is answered at once (refused: its key is gone), not held behind the read.
    let src = [1u8; 64];
    net.a
        .rma(rma(2, iov(&src), &[seg(at, 64, KEY)], None, FI_WRITE));
    net.pump();
    assert_eq!(net.a.one_err(2).err, FI_EACCES);
    assert!(!net.b.eng.busy());
}

/// A write through another key of the same memory is not the closed region's: it lands.
#[test]
fn a_write_through_another_key_of_the_memory_goes_on() {
    let tgt = vec![0u8; 4096];
    let src = pattern(4096, 8);
    let mut net = Net::new();
    let (w, sink) = write_under_way(&mut net, &tgt, &src, None);
    // Another registration of the same bytes closes.
    let cut = net
        .b
        .eng
        .cut_region(KEY + 1, tgt.as_ptr() as usize, tgt.len());
    assert!(cut.sinks.is_empty());
    body_done(&mut net, &w, fill(sink, &body_bytes(&w.body)));
    net.pump();
    net.a.one(1);
    assert_eq!(tgt, src);
}

/// A copy serving a peer's write, under way in the transport when the region closes, ends
/// failed however the transport reports it: nothing lands (a device region's bounce buffer
/// would have been copied in), no completion at the target, the initiator told.
#[test]
fn a_copy_under_way_as_its_region_closes_fails_when_it_reports() {
    let tgt = vec![0u8; 400];
    let data = pattern(300, 42);
    let mut net = served_write(&tgt, &data);
    let c = net.b.eng.poll_copy().expect("a copy");
    let cut = close_region(&mut net, &tgt);
    assert_eq!(cut.copies, vec![c.token], "the transport must stop it");
    // The transport ends it anyway, even asking for the data by frames instead (a copy it
    // could not make): it fails all the same, no data is asked for.
    net.b.eng.on_copied(c.token, Copied::Refused);
    net.report();
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    assert_eq!(net.a.one_err(1).err, FI_EACCES);
    net.b.quiet();
    assert!(!net.b.eng.busy());
}

#[test]
fn a_copy_into_a_closing_region_not_yet_taken_fails_at_both_ends() {
    let tgt = vec![0u8; 400];
    let data = pattern(300, 41);
    let mut net = served_write(&tgt, &data);
    // The copy waits for the transport to take it; the region closes first.
    close_region(&mut net, &tgt);
    assert!(
        net.b.eng.poll_copy().is_none(),
        "the copy is not handed out"
    );
    net.report();
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    assert_eq!(net.a.one_err(1).err, FI_EACCES);
    assert!(tgt.iter().all(|&b| b == 0));
    assert!(!net.b.eng.busy());
}

/// A served write whose copy the transport refused asks for its data (`Cts`); its region
/// closes, and another registers under the same key, before the `Data` comes: the write
/// already failed with the close, so its bytes land nowhere, the new region's included, and
/// the initiator is told.
#[test]
fn a_write_whose_region_closed_before_its_data_came_lands_nowhere() {
    let tgt = vec![0u8; 400];
    let other = vec![0u8; 400];
    let data = pattern(300, 43);
    let mut net = served_write(&tgt, &data);
    let c = net.b.eng.poll_copy().expect("a copy");
    net.b.eng.on_copied(c.token, Copied::Refused);
    net.report();
    assert_eq!(net.flush(S::B), vec![Kind::Cts]);
    close_region(&mut net, &tgt);
    net.register(&other);
    assert_eq!(net.flush(S::A), vec![Kind::Data]);
    assert_eq!(net.flush(S::B), vec![Kind::Ack]);
    assert_eq!(net.a.one_err(1).err, FI_EACCES);
    net.b.quiet();
    assert!(tgt.iter().all(|&b| b == 0));
    assert!(other.iter().all(|&b| b == 0), "landed in the new region");
    assert!(!net.b.eng.busy());
}
