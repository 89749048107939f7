//! The completions an engine gathers between two takes: a batch as large as one before it
//! grows no list (growth reallocates, into memory the heap may have handed back: page faults
//! that were most of what 64 armed sends answered by one count cost the host).

use std::sync::Mutex;

use crate::rdm::{report_unlocked, Done};

use super::*;

/// B posts `n` receives and A sends them `n` small messages, all of which B's engine takes
/// in before anything takes its completions: one batch of `n`.
fn batch(net: &mut Net, bufs: &mut [[u8; 8]], ctx0: Context) {
    let data = pattern(8, 5);
    for (i, b) in bufs.iter_mut().enumerate() {
        net.b.recv(recv(ctx0 + i, b, None, 0));
    }
    for i in 0..bufs.len() {
        net.a.send(send(ctx0 + i, &data, None, None, 0));
    }
    for _ in 0..bufs.len() {
        let t = net.a.eng.poll_transmit().expect("a queued message");
        let _ = arrive(&mut net.b, &t.ctrl, &body_bytes(&t.body));
    }
}

#[test]
fn an_engine_keeps_the_room_its_largest_batch_of_completions_grew() {
    const N: usize = 64;
    let mut net = Net::new();
    let mut bufs = [[0u8; 8]; N];
    batch(&mut net, &mut bufs, 100);
    // Taken into an empty list, as a provider whose list a report just emptied.
    let mut out = Vec::new();
    net.b.eng.take_done_into(&mut out);
    assert_eq!(out.len(), N);
    let (at, room) = net.b.eng.done_room();
    assert!(
        room >= N,
        "the engine kept room for {room} completions, not {N}"
    );
    report(&net.b.core, &mut out);
    net.a.report();
    assert_eq!(net.b.cq().0.len(), N);
    // The same again: the engine's list neither moves nor grows.
    batch(&mut net, &mut bufs, 200);
    assert_eq!(net.b.eng.done_room(), (at, room));
    net.b.eng.take_done_into(&mut out);
    assert_eq!(out.len(), N);
    report(&net.b.core, &mut out);
    assert_eq!(net.b.cq().0.len(), N);
}

#[test]
fn a_reported_batch_leaves_its_room_to_the_list_it_came_from() {
    // A provider's list of completions, handed to `report_unlocked` by a thread whose spare
    // list is empty (one that never reported a batch): the list it gets back has room for
    // as many as it held, so the next batch as large is appended without growing it.
    let world = World::new();
    let ep = world.ep();
    let core = ep.ep.core().clone();
    let st = Mutex::new(Vec::<Done>::with_capacity(64));
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut held = st.lock().unwrap();
            for ctx in 0..64 {
                held.push(Done::Tx {
                    ctx,
                    flags: FI_SEND | FI_MSG,
                });
            }
            report_unlocked(&core, held, |v| v);
        });
    });
    let kept = st.lock().unwrap().capacity();
    assert!(kept >= 64, "the list came back with room for {kept}");
}
