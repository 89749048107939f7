//! One-sided operations between two real processes: writes and reads at every size through
//! each path (inline, cross-memory attach, split copy, and without CMA), remote CQ data and
//! RMA events at the target, access checks that leave the target untouched, both addressing
//! modes and key modes, and fences.
//!
//! Written once for every provider: shm by default, tcp through `XFABRIC_TEST_PROVIDER` in
//! scripts/test.sh, verbs in the Soft-RoCE VM (scripts/test-verbs-vm.sh).

mod common;
use common::*;
use xfabric::*;

const LEN: usize = 1 << 22; // the target's window: 4 MiB
const CAPS: u64 = FI_MSG | FI_RMA | FI_RMA_EVENT;

/// The target: registers a window (and a read-only one), tells the initiator where they are,
/// and makes progress until told to stop, then reports what it saw.
fn target(mr_mode: u32) {
    let n = node_with(CAPS, Progress::Manual, |h| h.domain_attr.mr_mode = mr_mode);
    let parent = connect_parent(&n);
    let window = vec![0u8; LEN];
    let ro = pattern(4096, 99);
    // SAFETY: both buffers outlive their registrations (dropped at the end of this function,
    // after the registrations).
    let (mr, mr_ro) = unsafe {
        (
            n.domain
                .mr_reg(&window, FI_REMOTE_WRITE | FI_REMOTE_READ, 0, 7)
                .unwrap(),
            n.domain.mr_reg(&ro, FI_REMOTE_READ, 0, 8).unwrap(),
        )
    };
    let virt = mr_mode & FI_MR_VIRT_ADDR != 0;
    let base = |buf: &[u8]| if virt { buf.as_ptr() as u64 } else { 0 };
    say(&format!(
        "{} {} {} {}",
        mr.key(),
        base(&window),
        mr_ro.key(),
        base(&ro)
    ));
    // Serve until the initiator says how it ended, counting remote-CQ-data entries.
    let mut data_seen = Vec::new();
    let mut buf = [CqTaggedEntry::default(); 16];
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            assert_eq!(listen(), "done");
            stop.store(true, std::sync::atomic::Ordering::Release);
        });
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            if let Ok(k) = n.cq.read(&mut buf) {
                for e in &buf[..k] {
                    if e.flags & FI_REMOTE_CQ_DATA != 0 {
                        assert_eq!(
                            e.flags & (FI_REMOTE_WRITE | FI_RMA),
                            FI_REMOTE_WRITE | FI_RMA
                        );
                        data_seen.push(e.data);
                    }
                }
            }
        }
    });
    // The read-only window was never changed by the refused writes.
    assert!(ro == pattern(4096, 99));
    say(&format!("{data_seen:?}"));
    drop((mr, mr_ro));
    drop(window);
    let _ = parent;
}

fn sizes() -> Vec<usize> {
    let eager = [8192, 8193, 16384, 16385];
    let mut v = vec![0, 1, 8, 100, 4096, 65536, 100_000, 1 << 20, LEN];
    v.extend(eager);
    v
}

fn initiator(test: &str, mr_mode: u32, envs: &[(&str, &str)]) {
    let mut child = spawn(test, "target", envs);
    let n = node_with(CAPS, Progress::Manual, |h| h.domain_attr.mr_mode = mr_mode);
    let peer = connect(&mut child, &n);
    let f: Vec<u64> = child
        .hear()
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    let (key, base, ro_key, ro_base) = (f[0], f[1], f[2], f[3]);
    for (i, &len) in sizes().iter().enumerate() {
        let out = pattern(len, i as u64 + 1);
        let off = (LEN - len) as u64 / 3;
        // SAFETY: the buffers outlive the completions awaited right after.
        unsafe { n.ep.write(&out, None, peer, base + off, key, 1) }.unwrap();
        let c = n.wait_one();
        assert_eq!((c.op_context, c.flags), (1, FI_RMA | FI_WRITE));
        let mut back = vec![0u8; len];
        // SAFETY: as above.
        unsafe { n.ep.read(&mut back, None, peer, base + off, key, 2) }.unwrap();
        let c = n.wait_one();
        assert_eq!((c.op_context, c.flags), (2, FI_RMA | FI_READ));
        assert!(back == out, "read back differs at {len} bytes");
    }
    // writedata: the target gets the data in a CQ entry; inject_writedata too.
    // SAFETY: the buffer outlives the completion.
    unsafe { n.ep.writedata(&[1, 2, 3], None, 0xabc, peer, base, key, 3) }.unwrap();
    n.wait_one();
    n.ep.inject_writedata(&[4], 0xdef, peer, base, key).unwrap();
    // Access checks: each fails at the initiator with FI_EACCES, target memory untouched.
    let junk = [0xffu8; 64];
    let cases = [
        (ro_key, ro_base, 64usize, "region without FI_REMOTE_WRITE"),
        (key, base + LEN as u64 - 32, 64, "past the end"),
        (key ^ 0x5555, base, 64, "wrong key"),
    ];
    for (k, a, l, why) in cases {
        // SAFETY: junk outlives the completion.
        unsafe { n.ep.write(&junk[..l], None, peer, a, k, 9) }.unwrap();
        let e = n.wait_err();
        assert_eq!((e.op_context, e.err), (9, libc::EACCES), "{why}: {e:?}");
        assert_eq!(e.flags, FI_RMA | FI_WRITE);
    }
    let mut tmp = [0u8; 64];
    // SAFETY: tmp outlives the completion.
    unsafe { n.ep.read(&mut tmp, None, peer, ro_base + 4090, ro_key, 10) }.unwrap();
    assert_eq!(n.wait_err().err, libc::EACCES, "read past the end");
    // A read of the read-only window works.
    let mut ro = vec![0u8; 4096];
    // SAFETY: as above.
    unsafe { n.ep.read(&mut ro, None, peer, ro_base, ro_key, 11) }.unwrap();
    n.wait_one();
    assert!(ro == pattern(4096, 99));
    // Fenced: a read fenced behind a large write sees the write.
    let big = pattern(1 << 20, 77);
    let mut seen = vec![0u8; 1 << 20];
    // SAFETY: both buffers outlive the two completions.
    unsafe {
        n.ep.write(&big, None, peer, base, key, 12).unwrap();
        let iov = [RawIov::of_mut(&mut seen)];
        let rma = [RmaIov {
            addr: base,
            len: 1 << 20,
            key,
        }];
        let m = MsgRma {
            iov: &iov,
            desc: &[],
            addr: peer,
            rma_iov: &rma,
            context: 13,
            data: 0,
        };
        n.ep.readmsg(&m, FI_FENCE).unwrap();
    }
    let done = n.wait_n(2);
    assert_eq!(
        done.iter().map(|c| c.op_context).collect::<Vec<_>>(),
        vec![12, 13]
    );
    assert!(seen == big);
    child.tell("done");
    assert_eq!(child.hear(), format!("{:?}", [0xabcu64, 0xdef]));
    child.join();
}

#[test]
fn write_read_every_size_offsets_and_user_keys() {
    if role().is_some() {
        return target(0);
    }
    initiator("write_read_every_size_offsets_and_user_keys", 0, &[]);
}

#[test]
fn write_read_every_size_virtual_addresses_and_provider_keys() {
    let mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY;
    if role().is_some() {
        return target(mode);
    }
    initiator(
        "write_read_every_size_virtual_addresses_and_provider_keys",
        mode,
        &[],
    );
}

#[test]
fn write_read_every_size_without_cma() {
    if skip_shm_variant("write_read_every_size_offsets_and_user_keys") {
        return;
    }
    if role().is_some() {
        return target(0);
    }
    initiator(
        "write_read_every_size_without_cma",
        0,
        &[("XFABRIC_SHM_CMA", "0")],
    );
}

/// Target for `ordering_without_fence`: a window, and a posted receive whose arrival must see
/// every write sent before it (send after write).
fn ordering_target() {
    let n = node_with(CAPS, Progress::Manual, |_| {});
    let parent = connect_parent(&n);
    let window = vec![0u8; 1 << 21];
    // SAFETY: window outlives the registration (dropped first, below).
    let mr = unsafe {
        n.domain
            .mr_reg(&window, FI_REMOTE_WRITE | FI_REMOTE_READ, 0, 11)
    }
    .unwrap();
    say(&format!("{}", mr.key()));
    let mut note = [0u8; 8];
    // SAFETY: note outlives the completion.
    unsafe { n.ep.recv(&mut note, None, parent, 1) }.unwrap();
    let c = loop {
        let mut e = [CqTaggedEntry::default(); 1];
        match n.cq.read(&mut e) {
            Ok(_) if e[0].flags & FI_RECV != 0 => break e[0],
            _ => {}
        }
    };
    assert_eq!(c.op_context, 1);
    // The large write and the small one over its start landed before the message.
    let mut want = pattern(1 << 21, 5);
    want[..100].copy_from_slice(&pattern(100, 6));
    say(if window == want { "seen" } else { "stale" });
    // Keep serving (the read's data may still be on its way) until the initiator is done.
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            assert_eq!(listen(), "done");
            stop.store(true, std::sync::atomic::Ordering::Release);
        });
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            n.ep.progress();
        }
    });
    drop(mr);
}

fn ordering(test: &str, envs: &[(&str, &str)]) {
    let mut child = spawn(test, "target", envs);
    let n = node_with(CAPS, Progress::Manual, |_| {});
    let peer = connect(&mut child, &n);
    let key: u64 = child.hear().parse().unwrap();
    let big = pattern(1 << 21, 5);
    let small = pattern(100, 6);
    let mut back = vec![0u8; 1 << 21];
    // A first large write shows cross-memory attach works, so the next large one is split.
    // SAFETY: big outlives the completion.
    unsafe { n.ep.write(&big[..100_000], None, peer, 0, key, 9) }.unwrap();
    n.wait_one();
    // No fences: the provider's ordering alone must give read-after-write, write-after-write
    // and send-after-write.
    // SAFETY: every buffer outlives the completions awaited below.
    unsafe {
        n.ep.write(&big, None, peer, 0, key, 1).unwrap();
        n.ep.write(&small, None, peer, 0, key, 2).unwrap();
        n.ep.read(&mut back, None, peer, 0, key, 3).unwrap();
        n.ep.send(&[1u8; 8], None, peer, 4).unwrap();
    }
    n.wait_n(4);
    let mut want = big.clone();
    want[..100].copy_from_slice(&small);
    assert!(back == want, "read after write saw stale data");
    assert_eq!(child.hear(), "seen", "the message overtook the writes");
    child.tell("done");
    child.join();
}

#[test]
fn ordering_without_fence_split_copy() {
    if role().is_some() {
        return ordering_target();
    }
    ordering("ordering_without_fence_split_copy", &[]);
}

#[test]
fn ordering_without_fence_fragments() {
    if skip_shm_variant("ordering_without_fence_split_copy") {
        return;
    }
    if role().is_some() {
        return ordering_target();
    }
    ordering(
        "ordering_without_fence_fragments",
        &[("XFABRIC_SHM_CMA", "0")],
    );
}

#[test]
fn rma_events_count_remote_accesses_at_the_target() {
    if role().is_some() {
        let n = node(CAPS, Progress::Manual);
        let target = connect_parent(&n);
        let key: u64 = listen().parse().unwrap();
        let data = [7u8; 64];
        let mut back = [0u8; 64];
        for i in 0..5 {
            // SAFETY: the buffers outlive the completions.
            unsafe { n.ep.write(&data, None, target, 0, key, i) }.unwrap();
            n.wait_one();
        }
        for i in 0..3 {
            // SAFETY: as above.
            unsafe { n.ep.read(&mut back, None, target, 0, key, 10 + i) }.unwrap();
            n.wait_one();
        }
        say("done");
        return;
    }
    let mut child = spawn(
        "rma_events_count_remote_accesses_at_the_target",
        "init",
        &[],
    );
    let (mut wc, mut rc) = (None, None);
    let n = node_custom(
        CAPS,
        Progress::Manual,
        |_| {},
        64,
        |d, ep| {
            let w = d.cntr_open(&CntrAttr::default()).unwrap();
            let r = d.cntr_open(&CntrAttr::default()).unwrap();
            ep.bind_cntr(&w, FI_REMOTE_WRITE).unwrap();
            ep.bind_cntr(&r, FI_REMOTE_READ).unwrap();
            wc = Some(w);
            rc = Some(r);
        },
    );
    let (wc, rc) = (wc.unwrap(), rc.unwrap());
    connect(&mut child, &n);
    let window = vec![0u8; 64];
    // SAFETY: window outlives the registration.
    let mr = unsafe {
        n.domain
            .mr_reg(&window, FI_REMOTE_WRITE | FI_REMOTE_READ, 0, 21)
    }
    .unwrap();
    child.tell(&format!("{}", mr.key()));
    // The counters are driven by this side's progress: waiting on them makes it.
    wc.wait(5, completion_ms()).unwrap();
    rc.wait(3, completion_ms()).unwrap();
    assert_eq!(child.hear(), "done");
    assert_eq!((wc.read(), rc.read()), (5, 3));
    // With FI_RMA_EVENT each access also wrote a receive-CQ entry.
    let mut e = [CqTaggedEntry::default(); 16];
    let k = n.cq.read(&mut e).unwrap();
    let writes = e[..k]
        .iter()
        .filter(|c| c.flags == FI_REMOTE_WRITE | FI_RMA)
        .count();
    let reads = e[..k]
        .iter()
        .filter(|c| c.flags == FI_REMOTE_READ | FI_RMA)
        .count();
    assert_eq!((writes, reads), (5, 3));
    child.join();
    drop(mr);
}

#[test]
fn write_after_split_read_does_not_leak_into_it() {
    if role().is_some() {
        return target(0);
    }
    let mut child = spawn(
        "write_after_split_read_does_not_leak_into_it",
        "target",
        &[],
    );
    let n = node_with(CAPS, Progress::Manual, |_| {});
    let peer = connect(&mut child, &n);
    let f: Vec<u64> = child
        .hear()
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    let key = f[0];
    let old = pattern(1 << 20, 31);
    let new = pattern(1 << 20, 32);
    for round in 0..20 {
        // SAFETY: every buffer outlives the completions awaited below.
        unsafe { n.ep.write(&old, None, peer, 0, key, 1) }.unwrap();
        n.wait_one();
        let mut back = vec![0u8; 1 << 20];
        // No fence: write-after-read ordering alone must keep the write out of the read (a
        // split read's initiator copies its part after the target has moved on).
        unsafe {
            n.ep.read(&mut back, None, peer, 0, key, 2).unwrap();
            n.ep.write(&new, None, peer, 0, key, 3).unwrap();
        }
        n.wait_n(2);
        assert!(back == old, "round {round}: the read saw the later write");
    }
    child.tell("done");
    assert_eq!(child.hear(), "[]");
    child.join();
}

/// Writes each side of `writes_with_remote_cq_data_both_ways_and_nothing_else` makes.
const WN: usize = 2000;
const WL: usize = 32;

/// One side of it: registers a window, trades its key and address with the other side
/// (`trade`), then posts `WN` writes with remote CQ data into the other's window while
/// taking its own completions and the other's data; checks the bytes that landed.
fn writes_both_ways(n: &Node, peer: FiAddr, seed: u64, trade: impl FnOnce(String) -> String) {
    let window = vec![0u8; WN * WL];
    // SAFETY: the window outlives the registration (dropped below, first).
    let mr = unsafe { n.domain.mr_reg(&window, FI_REMOTE_WRITE, 0, 0) }.unwrap();
    let theirs = trade(format!("{} {}", mr.key(), window.as_ptr() as usize));
    let f: Vec<u64> = theirs.split(' ').map(|x| x.parse().unwrap()).collect();
    let (key, base) = (f[0], f[1]);
    let out: Vec<Vec<u8>> = (0..WN).map(|i| pattern(WL, seed + i as u64)).collect();
    let (mut done, mut data) = (0, Vec::with_capacity(WN));
    let mut buf = [CqTaggedEntry::default(); 64];
    let deadline = std::time::Instant::now() + completion_bound();
    let mut i = 0;
    while done < WN || data.len() < WN {
        if i < WN {
            let at = base + (i * WL) as u64;
            // SAFETY: `out` outlives the completions (all taken in this loop).
            match unsafe { n.ep.writedata(&out[i], None, i as u64, peer, at, key, i) } {
                Ok(()) => i += 1,
                Err(Error::Again(_)) => {}
                Err(e) => panic!("write {i}: {e}"),
            }
        }
        match n.cq.read(&mut buf) {
            Ok(k) => {
                for e in &buf[..k] {
                    if e.flags & FI_REMOTE_CQ_DATA != 0 {
                        data.push(e.data);
                    } else {
                        assert_eq!(e.flags, FI_RMA | FI_WRITE, "{e:?}");
                        done += 1;
                    }
                }
            }
            Err(Error::Again(_)) => {}
            Err(e) => panic!("cq read: {e} {:?}", n.cq.readerr()),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{i} posted, {done} completed, {} of the peer's arrived",
            data.len()
        );
    }
    data.sort_unstable();
    assert_eq!(data, (0..WN as u64).collect::<Vec<_>>());
    let peer_seed = seed ^ 1_000_000;
    for (i, w) in window.chunks(WL).enumerate() {
        assert!(w == pattern(WL, peer_seed + i as u64), "bytes of write {i}");
    }
    drop(mr);
}

/// Both sides write into each other at once, with remote CQ data, and send nothing else: over
/// verbs (provider keys) every write is the NIC's, each taking one of the target's receive
/// buffers, whose credits must come back without any frame to carry them.
#[test]
fn writes_with_remote_cq_data_both_ways_and_nothing_else() {
    let caps = FI_MSG | FI_RMA;
    let mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY;
    if role().is_some() {
        let n = node_with(caps, Progress::Manual, |h| h.domain_attr.mr_mode = mode);
        let parent = connect_parent(&n);
        writes_both_ways(&n, parent, 1_000_000, |mine| {
            say(&mine);
            listen()
        });
        // The parent may still need this side's progress (a transport's acknowledgements).
        say("done");
        let bye = std::thread::spawn(listen);
        while !bye.is_finished() {
            n.ep.progress();
        }
        assert_eq!(bye.join().unwrap(), "bye");
        return;
    }
    let test = "writes_with_remote_cq_data_both_ways_and_nothing_else";
    let mut child = spawn(test, "peer", &[]);
    let n = node_with(caps, Progress::Manual, |h| h.domain_attr.mr_mode = mode);
    let peer = connect(&mut child, &n);
    writes_both_ways(&n, peer, 0, |mine| {
        let theirs = child.hear();
        child.tell(&mine);
        theirs
    });
    assert_eq!(child.hear_progressing(&n), "done");
    child.tell("bye");
    child.join();
}

/// Two peers each read 32 MiB of the other's memory, then write to it: each write waits
/// behind the answer to the peer's read that carries the memory it would change, and on a
/// stream transport (tcp) a waiting write holds the stream the other's answer comes on, so
/// both waited for ever. The answers' bodies are now copied where they wait and the writes go
/// ahead; each read still sees the memory from before the write that came after it.
#[test]
fn reads_both_ways_then_writes_both_ways_finish() {
    const BIG: usize = 32 << 20;
    // At the windows' ends: the last bytes the reads' answers send.
    reads_both_ways_then_writes(BIG, BIG - 4096);
}

/// The same with reads past what a transport copies for a peer (64 MiB queued to it), each
/// write next to what the other's read takes: answers past that bound are not copied, and
/// the writes, which change none of the memory they carry, go ahead without waiting for them
/// (before, both peers waited for each other for ever). Not over verbs, whose reads are the
/// NIC's (no answer is queued) and whose VM has 1 GiB for every test.
#[test]
fn reads_past_the_copy_bound_both_ways_then_writes_elsewhere_finish() {
    if test_provider() == "verbs" {
        println!("skipped over verbs: its reads queue no answers (the NIC's), and its VM is small");
        return;
    }
    // Twice the bound: the sockets' buffers between the two cannot hold what is past it
    // (then the bound would be met again and the copies made, as before).
    const BIG: usize = 128 << 20;
    reads_both_ways_then_writes(BIG, BIG);
}

/// a and b each read the first `read` bytes of the other's window, then write 4 KiB into it
/// at `write_at`; both finish, each read sees the memory from before the write after it,
/// and each write lands.
fn reads_both_ways_then_writes(read: usize, write_at: usize) {
    let size = read.max(write_at + 4096);
    // Without FI_RMA_EVENT: the only completions are each side's read and write.
    let open = || {
        node_with(FI_MSG | FI_RMA, Progress::Auto, |h| {
            h.domain_attr.mr_mode = FI_MR_VIRT_ADDR;
        })
    };
    let (a, b) = (open(), open());
    let (wa, wb) = (vec![1u8; size], vec![2u8; size]);
    let access = FI_REMOTE_READ | FI_REMOTE_WRITE;
    // SAFETY: both windows outlive their registrations (dropped at the end of the test, after
    // them).
    let mra = unsafe { a.domain.mr_reg(&wa, access, 0, 11) }.unwrap();
    // SAFETY: as above.
    let mrb = unsafe { b.domain.mr_reg(&wb, access, 0, 12) }.unwrap();
    let to_b = a.add_peer(&b.ep.getname().unwrap());
    let to_a = b.add_peer(&a.ep.getname().unwrap());
    let (mut ra, mut rb) = (vec![0u8; read], vec![0u8; read]);
    let (sa, sb) = ([7u8; 4096], [8u8; 4096]);
    let at = |w: &[u8]| (w.as_ptr() as usize + write_at) as u64;
    // Each post retried while it says Again (a large read may hold the room the write needs
    // until it is under way). SAFETY: every buffer outlives the completions awaited below.
    a.retry(|| unsafe {
        a.ep.read(&mut ra, None, to_b, wb.as_ptr() as u64, mrb.key(), 1)
    });
    b.retry(|| unsafe {
        b.ep.read(&mut rb, None, to_a, wa.as_ptr() as u64, mra.key(), 1)
    });
    a.retry(|| unsafe { a.ep.write(&sa, None, to_b, at(&wb), mrb.key(), 2) });
    b.retry(|| unsafe { b.ep.write(&sb, None, to_a, at(&wa), mra.key(), 2) });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let (mut da, mut db) = (0, 0);
    let mut buf = [CqTaggedEntry::default(); 4];
    while (da, db) != (2, 2) {
        for (n, d) in [(&a, &mut da), (&b, &mut db)] {
            match n.cq.read(&mut buf) {
                Ok(k) => {
                    assert!(buf[..k].iter().all(|e| e.flags & FI_RMA != 0), "{buf:?}");
                    *d += k
                }
                Err(Error::Again(_)) => {}
                Err(e) => panic!("completion: {e}: {:?}", n.cq.readerr()),
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the peers wait for each other: {da} and {db} of 2 completions"
        );
    }
    assert!(
        ra.iter().all(|&x| x == 2),
        "a's read saw b's write after it"
    );
    assert!(
        rb.iter().all(|&x| x == 1),
        "b's read saw a's write after it"
    );
    assert!(wb[write_at..write_at + 4096].iter().all(|&x| x == 7));
    assert!(wa[write_at..write_at + 4096].iter().all(|&x| x == 8));
    drop((mra, mrb));
}
