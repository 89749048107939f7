//! Completion levels and completion suppression across two processes: match complete waits
//! for a matching receive, delivery complete for the peer to take the message in, inject writes
//! no entry but counts, selective completion writes only what was asked for; and multi-segment
//! I/O vectors on both sides.
//!
//! Written once for every provider: shm by default, tcp through `XFABRIC_TEST_PROVIDER` in
//! scripts/test.sh, verbs in the Soft-RoCE VM (scripts/test-verbs-vm.sh).

mod common;
use common::*;
use xfabric::*;

/// Reads the CQ a few times (driving progress) and asserts nothing completed.
fn assert_quiet(n: &Node) {
    let mut buf = [CqTaggedEntry::default(); 4];
    for _ in 0..1000 {
        match n.cq.read(&mut buf) {
            Err(Error::Again(_)) => {}
            other => panic!("expected no completion yet, got {other:?} {buf:?}"),
        }
    }
}

#[test]
fn match_complete_waits_for_a_matching_receive() {
    let caps = FI_MSG | FI_TAGGED;
    if role().is_some() {
        let n = node(caps, Progress::Manual);
        let parent = connect_parent(&n);
        let data = pattern(100, 1);
        let iov = [RawIov::of(&data)];
        // SAFETY: data outlives the completion awaited below.
        unsafe {
            n.ep.tsendmsg(&tmsg(&iov, parent, 7, 5, 0), FI_MATCH_COMPLETE)
        }
        .unwrap();
        // Progress while waiting: over a transport whose send needs it (a connection's
        // handshake, a lane not yet claimed), the message goes out only through progress.
        // Nothing can complete meanwhile: the receiver matches nothing until told.
        let line = std::thread::spawn(listen);
        while !line.is_finished() {
            let mut buf = [CqTaggedEntry::default(); 1];
            assert!(
                matches!(n.cq.read(&mut buf), Err(Error::Again(_))),
                "completed before the receiver matched: {buf:?}"
            );
        }
        assert_eq!(line.join().unwrap(), "buffered");
        // The receiver holds the message but has matched nothing: no ACK can have been sent.
        assert_quiet(&n);
        say("quiet");
        let c = n.wait_one();
        assert_eq!((c.op_context, c.flags), (7, FI_SEND | FI_TAGGED));
        return;
    }
    let mut child = spawn("match_complete_waits_for_a_matching_receive", "send", &[]);
    let n = node(caps, Progress::Manual);
    let peer = connect(&mut child, &n);
    // Peek until the message is buffered as unexpected (a peek never matches it).
    loop {
        let none: [RawIov; 0] = [];
        // SAFETY: a peek touches no memory.
        unsafe { n.ep.trecvmsg(&tmsg(&none, peer, 1, 5, 0), FI_PEEK) }.unwrap();
        match n.next() {
            Completion::Ok(e, _) if e.op_context == 1 => break,
            Completion::Err(e, _) if e.err == libc::ENOMSG => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
    child.tell("buffered");
    assert_eq!(child.hear(), "quiet");
    let mut buf = vec![0u8; 100];
    // SAFETY: buf outlives the completion.
    unsafe { n.ep.trecv(&mut buf, None, peer, 5, 0, 2) }.unwrap();
    assert_eq!(n.wait_one().op_context, 2);
    assert_eq!(buf, pattern(100, 1));
    // Keep progressing until the child has its completion: the ACK must be flushed.
    while child.child.try_wait().unwrap().is_none() {
        n.ep.progress();
    }
    child.join();
}

#[test]
fn delivery_complete_needs_the_peer_to_take_the_message_in() {
    let caps = FI_MSG;
    if role().is_some() {
        let n = node(caps, Progress::Manual);
        let parent = connect_parent(&n);
        let data = pattern(64, 2);
        let iov = [RawIov::of(&data)];
        // SAFETY: data outlives the completion.
        unsafe {
            n.ep.sendmsg(
                &Msg {
                    iov: &iov,
                    desc: &[],
                    addr: parent,
                    context: 9,
                    data: 0,
                    tag: 0,
                    ignore: 0,
                },
                FI_DELIVERY_COMPLETE,
            )
        }
        .unwrap();
        // The parent's receive is posted, but only its progress (taking the message into the
        // receive) acks.
        assert_eq!(n.wait_one().op_context, 9);
        say("delivered");
        return;
    }
    let mut child = spawn(
        "delivery_complete_needs_the_peer_to_take_the_message_in",
        "send",
        &[],
    );
    let n = node(caps, Progress::Manual);
    let peer = connect(&mut child, &n);
    let mut buf = vec![0u8; 64];
    // A message is delivered once a receive takes it (a bounce buffer is not the receive's
    // memory): the receive is posted first, and the progress below still has to take the
    // message in for the sender to hear.
    // SAFETY: buf outlives the completion.
    unsafe { n.ep.recv(&mut buf, None, peer, 3) }.unwrap();
    let t = std::time::Instant::now();
    loop {
        n.ep.progress();
        if child.child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            t.elapsed() < completion_bound(),
            "sender never saw delivery"
        );
    }
    assert_eq!(child.hear(), "delivered");
    assert_eq!(n.wait_one().len, 64);
    assert_eq!(buf, pattern(64, 2));
    child.join();
}

#[test]
fn inject_counts_without_entries_and_selective_completion() {
    if role().is_some() {
        let n = node(FI_MSG, Progress::Manual);
        let parent = connect_parent(&n);
        for i in 0..5u8 {
            let mut b = [0u8; 16];
            // SAFETY: b outlives the completion.
            unsafe { n.ep.recv(&mut b, None, parent, i as usize) }.unwrap();
            let c = n.wait_one();
            assert_eq!((c.len, b[0]), (16, i));
        }
        say("got all");
        return;
    }
    let mut child = spawn(
        "inject_counts_without_entries_and_selective_completion",
        "recv",
        &[],
    );
    // The node provides the domain, AV and a receive CQ; the endpoint under test is a second
    // one, with a selectively bound transmit CQ and a send counter.
    let n = node(FI_MSG, Progress::Manual);
    let tx_cq = n
        .domain
        .cq_open(&CqAttr {
            format: CqFormat::Tagged,
            ..Default::default()
        })
        .unwrap();
    let counter = n.domain.cntr_open(&CntrAttr::default()).unwrap();
    let ep = n.domain.endpoint(&n.info).unwrap();
    ep.bind_cq(&tx_cq, FI_TRANSMIT | FI_SELECTIVE_COMPLETION)
        .unwrap();
    ep.bind_cq(&n.cq, FI_RECV).unwrap();
    ep.bind_cntr(&counter, FI_SEND).unwrap();
    ep.bind_av(&n.av).unwrap();
    ep.enable().unwrap();
    let peer = n.add_peer(&unhex(&child.hear()));
    child.tell(&hex(&ep.getname().unwrap()));
    let bufs: Vec<[u8; 16]> = (0..5u8).map(|i| [i; 16]).collect();
    ep.inject(&bufs[0], peer).unwrap();
    ep.inject(&bufs[1], peer).unwrap();
    // SAFETY: bufs outlive the completions (the test waits for the counter).
    unsafe {
        ep.send(&bufs[2], None, peer, 102).unwrap();
        let iov = [RawIov::of(&bufs[3])];
        let m = |ctx| Msg {
            iov: &iov,
            desc: &[],
            addr: peer,
            context: ctx,
            data: 0,
            tag: 0,
            ignore: 0,
        };
        ep.sendmsg(&m(103), FI_COMPLETION).unwrap();
        let iov4 = [RawIov::of(&bufs[4])];
        ep.sendmsg(
            &Msg {
                iov: &iov4,
                desc: &[],
                addr: peer,
                context: 104,
                data: 0,
                tag: 0,
                ignore: 0,
            },
            0,
        )
        .unwrap();
    }
    counter.wait(5, completion_ms()).unwrap();
    // Of five sends, only the one posted with FI_COMPLETION wrote an entry.
    let mut e = [CqTaggedEntry::default(); 8];
    assert_eq!(tx_cq.read(&mut e), Ok(1));
    assert_eq!(e[0].op_context, 103);
    assert_eq!(tx_cq.read(&mut e), Err(Error::Again("cq read")));
    assert_eq!(child.hear(), "got all");
    child.join();
}

#[test]
fn multi_segment_iov_both_sides() {
    // (sender split, receiver split), eager and rendezvous sizes.
    let cases: [(&[usize], &[usize]); 4] = [
        (&[3, 0, 61], &[10, 54]),
        (&[1000, 3000, 5], &[4005]),
        (&[100_000, 1, 200_000], &[150_000, 150_001]),
        (&[1 << 20], &[1, 1 << 19, (1 << 19) - 1]),
    ];
    if role().is_some() {
        let n = node(FI_MSG, Progress::Manual);
        let parent = connect_parent(&n);
        for (i, (_, rx)) in cases.iter().enumerate() {
            let mut bufs: Vec<Vec<u8>> = rx.iter().map(|&l| vec![0u8; l]).collect();
            let iov: Vec<RawIov> = bufs.iter_mut().map(|b| RawIov::of_mut(b)).collect();
            // SAFETY: bufs outlive the completion.
            unsafe { n.ep.recvv(&iov, &[], parent, i) }.unwrap();
            let c = n.wait_one();
            let total: usize = rx.iter().sum();
            assert_eq!(c.len, total);
            assert_eq!(bufs.concat(), pattern(total, i as u64), "case {i}");
        }
        say("ok");
        return;
    }
    let mut child = spawn("multi_segment_iov_both_sides", "recv", &[]);
    let n = node(FI_MSG, Progress::Manual);
    let peer = connect(&mut child, &n);
    for (i, (tx, _)) in cases.iter().enumerate() {
        let total: usize = tx.iter().sum();
        let data = pattern(total, i as u64);
        let mut at = 0;
        let iov: Vec<RawIov> = tx
            .iter()
            .map(|&l| {
                let s = RawIov::of(&data[at..at + l]);
                at += l;
                s
            })
            .collect();
        // SAFETY: data outlives the completion.
        n.retry(|| unsafe { n.ep.sendv(&iov, &[], peer, 50 + i) });
        assert_eq!(n.wait_one().op_context, 50 + i);
    }
    assert_eq!(child.hear(), "ok");
    child.join();
}

/// fi_domain(3): CQs, counters and AVs serve their own domain. One from another domain is
/// refused, by an error naming both, when bound to an endpoint or used by deferred work.
#[test]
fn objects_of_another_domain_are_refused() {
    let a = node(FI_MSG | FI_TAGGED, Progress::Manual);
    let b = a.fabric.domain(&a.info).expect("second domain");
    assert_ne!(a.domain.id(), b.id());
    let ep = a.domain.endpoint(&a.info).expect("endpoint");
    let names_both = |r: Result<()>, what: &str| match r {
        Err(Error::Inval(m)) => assert!(
            m.contains(&format!("domain {}", b.id()))
                && m.contains(&format!("domain {}", a.domain.id())),
            "{what}: {m}"
        ),
        other => panic!("{what}: expected Inval naming both domains, got {other:?}"),
    };
    let cq = b.cq_open(&CqAttr::default()).expect("cq");
    names_both(ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV), "bind cq");
    let cntr = b.cntr_open(&CntrAttr::default()).expect("cntr");
    names_both(ep.bind_cntr(&cntr, FI_SEND), "bind cntr");
    let av = b.av_open(&AvAttr::default()).expect("av");
    names_both(ep.bind_av(&av), "bind av");
    let own = a.domain.cntr_open(&CntrAttr::default()).expect("own cntr");
    let work = |trig, target| DeferredWork {
        threshold: 1,
        triggering_cntr: trig,
        completion_cntr: None,
        op: WorkOp::CntrAdd(OpCntr {
            cntr: target,
            value: 1,
        }),
    };
    // SAFETY: counter operations name no buffers.
    let r = unsafe { a.domain.queue_work(&work(&cntr, &own)) };
    names_both(r.map(drop), "queue_work triggering counter");
    // SAFETY: as above.
    let r = unsafe { a.domain.queue_work(&work(&own, &cntr)) };
    names_both(r.map(drop), "queue_work target counter");
    // The same objects of the endpoint's own domain are accepted.
    let cq = a.domain.cq_open(&CqAttr::default()).expect("own cq");
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV)
        .expect("own cq binds");
    ep.bind_cntr(&own, FI_SEND).expect("own counter binds");
    drop(ep);
}
