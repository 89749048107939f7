//! Messages whose sends completed reach their receiver even when the sender is gone before the
//! receiver reads them: the sender closed its endpoint and exited, its segment went with it,
//! and the receiver only then reads the lane's first message (CONNECT, naming a segment that
//! no longer exists) and the messages behind it. Found by C programs run side by side on a
//! loaded machine: the receiver got none of 16 completed sends.

mod common;
use common::*;
use xfabric::*;

const N: usize = 16;

fn sender() {
    let n = node(FI_MSG, Progress::Manual);
    let parent = connect_parent(&n);
    let bufs: Vec<Vec<u8>> = (0..N).map(|i| pattern(64, i as u64)).collect();
    for (i, b) in bufs.iter().enumerate() {
        // SAFETY: `bufs` outlives the sends, whose completions are read below.
        n.retry(|| unsafe { n.ep.send(b, None, parent, i) });
    }
    n.wait_n(N);
    say("sent");
    // Closed (the segment goes) and exited before the parent reads anything.
    drop(n);
}

#[test]
fn messages_sent_before_a_close_reach_a_peer_that_reads_them_afterwards() {
    if role().is_some() {
        return sender();
    }
    let mut peer = spawn(
        "messages_sent_before_a_close_reach_a_peer_that_reads_them_afterwards",
        "send",
        &[],
    );
    let n = node(FI_MSG, Progress::Manual);
    let src = connect(&mut peer, &n);
    let mut bufs = vec![vec![0u8; 64]; N];
    for (i, b) in bufs.iter_mut().enumerate() {
        // SAFETY: `bufs` outlives the receives, read below.
        unsafe { n.ep.recv(b, None, src, i) }.unwrap();
    }
    assert_eq!(peer.hear(), "sent");
    peer.join();
    let got = n.wait_n(N);
    assert_eq!(got.len(), N);
    for (i, b) in bufs.iter().enumerate() {
        assert!(b[..] == pattern(64, i as u64)[..], "message {i}");
    }
}

/// A send of ours partly written into the peer's ring when the endpoint closes is reported
/// `FI_ECANCELED` and never arrives: the close does not finish writing it while the peer
/// reads (sent again after a reopen, it would arrive twice). What arrives is exactly what
/// completed.
#[test]
fn a_send_partly_written_at_close_is_canceled_and_never_arrives() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    if role().is_some() {
        return;
    }
    // Eager (at most 32 KiB), in two ring pieces each: three fill most of a lane, the
    // fourth's first piece fits and its second waits for room.
    const LEN: usize = 32 << 10;
    const K: usize = 6;
    let s = node(FI_MSG, Progress::Manual);
    let r = node(FI_MSG, Progress::Manual);
    let to_r = s.add_peer(&r.ep.getname().unwrap());
    let from_s = r.add_peer(&s.ep.getname().unwrap());
    let mut bufs = vec![vec![0u8; LEN]; K];
    for (i, b) in bufs.iter_mut().enumerate() {
        // SAFETY: `bufs` outlives the receives, ended below.
        unsafe { r.ep.recv(b, None, from_s, i) }.unwrap();
    }
    let data: Vec<Vec<u8>> = (0..K).map(|i| pattern(LEN, i as u64)).collect();
    let mut posted = 0;
    for (i, d) in data.iter().enumerate() {
        // SAFETY: `data` outlives the sends, ended by the close below.
        match unsafe { s.ep.send(d, None, to_r, i) } {
            Ok(()) => posted += 1,
            Err(Error::Again(_)) => break,
            Err(e) => panic!("send: {e}"),
        }
    }
    // Whatever fits goes into the ring; r reads nothing yet.
    for _ in 0..100 {
        s.ep.progress();
    }
    // r reads as fast as it can from here until told to stop, while s closes.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut ok = Vec::new();
            let mut buf = [CqTaggedEntry::default(); 16];
            while !stop.load(Ordering::Acquire) {
                match r.cq.read(&mut buf) {
                    Ok(k) => ok.extend(buf[..k].iter().map(|e| e.op_context)),
                    Err(Error::Avail) => drop(r.cq.readerr()),
                    Err(_) => {}
                }
            }
            // What is in the ring by now is read to its end.
            for _ in 0..10_000 {
                if let Ok(k) = r.cq.read(&mut buf) {
                    ok.extend(buf[..k].iter().map(|e| e.op_context));
                }
            }
            (ok, r)
        })
    };
    let Node { ep, cq, .. } = s;
    drop(ep);
    let (mut done, mut canceled) = (Vec::new(), Vec::new());
    let mut buf = [CqTaggedEntry::default(); 16];
    while done.len() + canceled.len() < posted {
        match cq.read(&mut buf) {
            Ok(k) => done.extend(buf[..k].iter().map(|e| e.op_context)),
            Err(Error::Avail) => {
                let e = cq.readerr().unwrap();
                assert_eq!(e.err, errno::FI_ECANCELED, "{e:?}");
                canceled.push(e.op_context);
            }
            Err(Error::Again(_)) => panic!("a send never ended"),
            Err(e) => panic!("cq: {e}"),
        }
    }
    assert!(
        !canceled.is_empty(),
        "every send completed before the close"
    );
    // The reader then reads what the ring holds to its end.
    stop.store(true, Ordering::Release);
    let (mut got, _r) = reader.join().unwrap();
    got.sort_unstable();
    done.sort_unstable();
    assert_eq!(
        got, done,
        "what arrived is what completed ({canceled:?} canceled)"
    );
    drop(bufs);
}
