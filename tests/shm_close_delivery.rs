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
