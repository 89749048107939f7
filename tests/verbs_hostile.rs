//! A hostile verbs peer (`providers::verbs::raw`: its own side channel, queue pair and work
//! requests) against real verbs endpoints on Soft-RoCE, inside the QEMU VM
//! (`scripts/rxe-vm.sh`), as tests/verbs_vm.rs runs its own.
//!
//! `hostile_peers_on_soft_roce` (the host half) boots the VM once and runs this binary inside
//! it, selecting the `vm_*` tests, with `XFABRIC_RXE_VM=1` and the verbs provider; it skips
//! with the reason where the VM cannot run. The `vm_*` tests do the work there and skip
//! themselves on the host. Every wait is bounded, and children are killed if a test fails.

mod common;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use xfabric::providers::inet;
use xfabric::providers::verbs::raw::{self, Heard, RawLink, RawPeer};
use xfabric::*;

/// Whether this process runs inside the VM (set by the host half).
fn inside() -> bool {
    std::env::var_os("XFABRIC_RXE_VM").is_some()
}

/// Skips (true) unless inside the VM.
fn skip() -> bool {
    if !inside() {
        eprintln!("skipped: runs inside the Soft-RoCE VM only (see hostile_peers_on_soft_roce)");
        return true;
    }
    false
}

/// The `vm_*` tests below, which the host half expects to see pass.
const VM_TESTS: usize = 3;

/// A bound far past what each step takes in the emulated VM.
const STEP: Duration = Duration::from_secs(30);

// The host half's name must not contain "vm_" (the filter).
#[test]
fn hostile_peers_on_soft_roce() {
    if inside() || role().is_some() {
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let runner = root.join("scripts/rxe-vm.sh");
    match Command::new(&runner).arg("--check").output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            eprintln!("skipped: {}", String::from_utf8_lossy(&o.stdout).trim());
            return;
        }
        Err(e) => {
            eprintln!("skipped: cannot run {}: {e}", runner.display());
            return;
        }
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(&runner)
        .args(["--timeout", "400", "--"])
        .arg(&exe)
        .args(["vm_", "--test-threads=1"])
        .env("XFABRIC_RXE_VM", "1")
        .env("XFABRIC_TEST_PROVIDER", "verbs")
        .current_dir(root)
        .output()
        .expect("run scripts/rxe-vm.sh");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "the tests in the VM failed: {}",
        out.status
    );
    let want = format!("test result: ok. {VM_TESTS} passed");
    assert!(text.contains(&want), "expected \"{want}\" from the VM");
}

fn addr_of(raw: &[u8]) -> SocketAddr {
    inet::decode(raw).expect("a verbs endpoint's name")
}

/// Bytes of the large message: past the engine's eager limit and verbs' pull threshold
/// (64 KiB), so that it is announced with its memory offered for the receiver's NIC to read.
const BIG: usize = 1 << 20;
const TAG: u64 = 0x7a6;

/// A large send's source is offered for reading only. The raw peer connects to a sender (as
/// its peer of that name), receives the engine's Rts for a 1 MiB tagged send with its
/// descriptor (the send buffer's address, length, rkey), reads the whole buffer with that
/// rkey (the key is right: the bytes are the message), then writes into it with the same
/// key: the sender's NIC refuses (a remote access error at the raw peer) and the sender's
/// buffer is unchanged. The raw peer then drops the connection: the send fails, and the
/// sender closes cleanly.
///
/// First, a hello whose GID is not its name's address (the raw peer's name, the GID of
/// another host), otherwise a real one with a queue pair of ours that our listener would
/// vouch for: refused before any call-back, with no answer and the connection closed.
///
/// On the tree before 1c87ca8 the write succeeded and the sender's buffer changed; before
/// 6814082 the forged hello was called back and answered.
#[test]
fn vm_an_offered_send_buffer_is_read_only_to_the_receiver() {
    const T: &str = "vm_an_offered_send_buffer_is_read_only_to_the_receiver";
    if skip() {
        return;
    }
    if role().is_some() {
        let n = node(FI_MSG | FI_TAGGED, Progress::Auto);
        say(&hex(&n.ep.getname().unwrap()));
        let to = n.add_peer(&unhex(&listen()));
        let msg = pattern(BIG, 7);
        say(&format!("{}", msg.as_ptr() as u64));
        // SAFETY: `msg` outlives the send's completion, read below.
        n.retry(|| unsafe { n.ep.tsend(&msg, None, to, TAG, 1) });
        assert_eq!(listen(), "check");
        // The receiver never acknowledges and went: the send ends in error.
        match n.next() {
            Completion::Err(e, _) => {
                assert_eq!(e.op_context, 1, "{e:?}");
                eprintln!("sender: the send failed as expected: {e:?}");
            }
            Completion::Ok(c, _) => panic!("a send nobody received succeeded: {c:?}"),
        }
        assert!(
            msg == pattern(BIG, 7),
            "the receiver's NIC wrote into the offered send buffer"
        );
        say("ok");
        assert_eq!(listen(), "bye");
        drop(n);
        return;
    }
    let raw = RawPeer::new().expect("raw verbs peer");
    let mut child = spawn(T, "sender", &[]);
    let ep = addr_of(&unhex(&child.hear()));

    // A hello whose GID names another host than its name.
    let elsewhere = Ipv4Addr::new(198, 51, 100, 7).to_ipv6_mapped().octets();
    let (forged, got) = raw
        .hello_answer(ep, |h| h.qp.gid = elsewhere, STEP)
        .expect("the endpoint closes a refused hello's connection");
    assert!(
        got.is_empty(),
        "the endpoint answered a hello whose GID is another host's ({} bytes)",
        got.len()
    );
    assert!(
        !raw.heard()
            .iter()
            .any(|h| matches!(h, Heard::Question { nonce, .. } if *nonce == forged.nonce)),
        "the forged hello was called back: its GID was not checked first"
    );

    // The raw peer as the sender's peer of its name; then the sender sends to that name.
    let mut link = raw.connect(ep, STEP).expect("raw peer connects");
    child.tell(&hex(&raw.raw_name()));
    let buf: u64 = child.hear().parse().unwrap();
    let offer = link.offer(2 * STEP).expect("the sender's Rts");
    assert_eq!((offer.len, offer.tag), (BIG as u64, TAG), "{offer:?}");
    assert_ne!(
        offer.flags & xfabric_core::rdm::wire::flags::TAGGED,
        0,
        "a tagged message's Rts: {offer:?}"
    );
    assert_eq!(offer.segs.len(), 1, "{offer:?}");
    let seg = offer.segs[0];
    assert_eq!((seg.addr, seg.len), (buf, BIG as u64), "{offer:?}");

    // The key reads the offered buffer: the bytes are the message.
    let (st, bytes) = link.read(seg.addr, seg.rkey, BIG, STEP).expect("RDMA read");
    assert_eq!(st, raw::WC_SUCCESS, "reading the offer with its rkey");
    assert!(
        bytes == pattern(BIG, 7),
        "the offer's bytes are not the message"
    );

    // The same key does not write it.
    let junk = vec![0xa5u8; 4096];
    let st = link
        .write(seg.addr, seg.rkey, &junk, STEP)
        .expect("RDMA write");
    assert_eq!(
        st,
        raw::WC_REM_ACCESS_ERR,
        "an RDMA write into an offered send buffer (status {st})"
    );

    // The receiver goes: the sender's send fails, its buffer intact.
    drop(link);
    child.tell("check");
    assert_eq!(child.hear(), "ok");
    child.tell("bye");
    child.join();
}

/// A key of one domain does not reach another domain's memory through the NIC: each verbs
/// domain has a protection domain of its own. The victim opens two domains with NIC keys and
/// registers a secret window (remote read and write) in the second; the raw peer connects to
/// the first domain's endpoint and uses the window's key and address there: an RDMA read and
/// an RDMA write each end in an error at the raw peer, and the window is unchanged.
///
/// On the tree before this test every domain of a process shared one protection domain, and
/// the read returned the secret.
#[test]
fn vm_a_key_of_another_domain_does_not_reach_its_memory() {
    const T: &str = "vm_a_key_of_another_domain_does_not_reach_its_memory";
    const LEN: usize = 4096;
    if skip() {
        return;
    }
    if role().is_some() {
        let nic_keys = |h: &mut Info| h.domain_attr.mr_mode = FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
        let first = node_with(FI_MSG | FI_RMA, Progress::Auto, nic_keys);
        let second = node_with(FI_MSG | FI_RMA, Progress::Auto, nic_keys);
        let secret = pattern(LEN, 9);
        // SAFETY: `secret` outlives the region, dropped below.
        let mr = unsafe {
            second
                .domain
                .mr_reg(&secret, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0)
        }
        .unwrap();
        assert!(mr.provider_registered(), "the NIC registered the window");
        say(&hex(&first.ep.getname().unwrap()));
        say(&format!("{} {}", mr.key(), secret.as_ptr() as u64));
        assert_eq!(listen(), "check");
        assert!(
            secret == pattern(LEN, 9),
            "written through another domain's endpoint"
        );
        say("ok");
        assert_eq!(listen(), "bye");
        drop(mr);
        return;
    }
    let raw = RawPeer::new().expect("raw verbs peer");
    let mut child = spawn(T, "victim", &[]);
    let ep = addr_of(&unhex(&child.hear()));
    let v: Vec<u64> = child
        .hear()
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    let (key, addr) = (v[0], v[1]);
    let mut link = raw.connect(ep, STEP).expect("raw peer connects");
    let (st, bytes) = link.read(addr, key as u32, LEN, STEP).expect("RDMA read");
    assert_ne!(
        st,
        raw::WC_SUCCESS,
        "read another domain's window through this one's endpoint ({} bytes)",
        bytes.len()
    );
    drop(link);
    // A queue pair that took an access error is in its error state: the write on a new one.
    let mut link = raw.connect(ep, STEP).expect("raw peer connects again");
    let st = link
        .write(addr, key as u32, &[0xa5; LEN], STEP)
        .expect("RDMA write");
    assert_ne!(
        st,
        raw::WC_SUCCESS,
        "wrote another domain's window through this one's endpoint"
    );
    drop(link);
    child.tell("check");
    assert_eq!(child.hear(), "ok");
    child.tell("bye");
    child.join();
}

/// A writer with immediate data past its credits, and a sender of credit-only chunks past its
/// reserve, each on a connection of its own (a raw peer each) to an endpoint whose engine is
/// not consuming (manual progress, none made while they write): once the endpoint progresses,
/// it fails that connection as a protocol error (the raw peer's side channel closes, and its
/// next work request fails: no queue pair answers it), every progress call returning within
/// a bound meanwhile. A proven peer that connects a second time loses its first connection
/// and keeps the second. Then an honest peer (a normal endpoint in another process) exchanges
/// messages with it both ways.
///
/// On the tree before 18e226d neither connection was cut: the endpoint took all 64 writes
/// (and returned their 64 data credits in a credit-only chunk) and all 20 credit-only
/// chunks.
#[test]
fn vm_a_peer_past_its_credits_is_cut_off() {
    const T: &str = "vm_a_peer_past_its_credits_is_cut_off";
    if skip() {
        return;
    }
    match role().as_deref() {
        Some("victim") => return victim(),
        Some("honest") => return honest(),
        Some(r) => panic!("unknown role {r}"),
        None => {}
    }
    let mut victim = spawn(T, "victim", &[]);
    let victim_raw = unhex(&victim.hear());
    let ep = addr_of(&victim_raw);

    // Writes with immediate data: `RQ` of them, each taking one of the endpoint's posted
    // receives, past the `RQ - RESERVE` data credits a peer holds.
    let writer = RawPeer::new().expect("raw verbs peer");
    let mut link = writer.connect(ep, STEP).expect("raw peer connects");
    victim.tell("pause");
    assert_eq!(victim.hear(), "paused");
    let st = link
        .write_imm(raw::RQ as usize, 0x5eed, STEP)
        .expect("writes with immediate data");
    assert!(
        st.iter().all(|&s| s == raw::WC_SUCCESS),
        "the endpoint's NIC took every write (its receives were posted): {st:?}"
    );
    victim.tell("go");
    cut_off(&mut link, "a peer writing past its credits");
    assert_eq!(link.chunks().len(), 0, "{:?}", link.chunks());
    drop(link);

    // Credit-only chunks: more than a peer's `RESERVE` could ever be, none returning any of
    // the endpoint's.
    let chatter = RawPeer::new().expect("raw verbs peer");
    let mut link = chatter.connect(ep, STEP).expect("raw peer connects");
    victim.tell("pause");
    assert_eq!(victim.hear(), "paused");
    let credit = RawLink::chunk(raw::KIND_CREDIT, 0, 0, &[]);
    let chunks = vec![credit; 5 * raw::RESERVE as usize];
    let st = link.send_chunks(&chunks, STEP).expect("credit-only chunks");
    assert!(
        st.iter().all(|&s| s == raw::WC_SUCCESS),
        "the endpoint's NIC took every chunk: {st:?}"
    );
    victim.tell("go");
    cut_off(&mut link, "a peer sending past its reserve");
    drop(link);

    // A proven peer that connects again: its first connection is dead to it (a restart),
    // and goes; the second carries on. Without that, one peer could hold every connection
    // (each a queue pair and its pinned buffers) the endpoint has room for.
    let twice = RawPeer::new().expect("raw verbs peer");
    let mut first = twice.connect(ep, STEP).expect("raw peer connects");
    let mut second = twice.connect(ep, STEP).expect("raw peer connects again");
    assert!(
        first.closed_within(STEP),
        "a peer's earlier connection outlived its new one"
    );
    let st = second
        .write_imm(1, 0, STEP)
        .expect("a write on the new connection");
    assert_eq!(st[0], raw::WC_SUCCESS, "the new connection was cut too");
    drop((first, second, twice));

    // Every progress call of the endpoint returned within the bound.
    victim.tell("slowest");
    let ms: u64 = victim
        .hear()
        .strip_prefix("slowest_ms ")
        .expect("slowest_ms N")
        .parse()
        .unwrap();
    eprintln!("the endpoint's slowest CQ read meanwhile: {ms} ms");
    assert!(ms < STEP.as_millis() as u64, "a CQ read took {ms} ms");

    // An honest peer still gets through, both ways.
    let mut honest = spawn(T, "honest", &[]);
    let honest_raw = honest.hear();
    victim.tell(&format!("peer {honest_raw}"));
    honest.tell(&hex(&victim_raw));
    assert_eq!(honest.hear(), "done");
    assert_eq!(victim.hear(), "done");
    honest.tell("bye");
    victim.tell("bye");
    honest.join();
    victim.join();
    drop((writer, chatter));
}

/// The endpoint, progressed again, fails `link`: its side channel closes, and the next work
/// request on it fails (no queue pair answers, or ours is in error).
fn cut_off(link: &mut RawLink, who: &str) {
    let t = Instant::now();
    assert!(
        link.closed_within(STEP),
        "{who}: the endpoint kept the connection"
    );
    eprintln!("{who}: side channel closed after {:?}", t.elapsed());
    let st = link.write_imm(1, 0, STEP).expect("a last write");
    assert_ne!(
        st[0],
        raw::WC_SUCCESS,
        "{who}: its queue pair still answered"
    );
    eprintln!(
        "{who}: cut off; the raw peer's next write: status {}",
        st[0]
    );
}

/// Reads `n`'s CQ (progressing it) on another thread until the parent's next line: that line,
/// and the longest one read took.
fn serve(n: &Node) -> (String, Duration) {
    let stop = std::sync::atomic::AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(300);
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut slowest = Duration::ZERO;
            let mut buf = [CqTaggedEntry::default(); 8];
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                assert!(Instant::now() < deadline, "served 300 s without a word");
                let t = Instant::now();
                let r = n.cq.read(&mut buf);
                slowest = slowest.max(t.elapsed());
                match r {
                    Ok(_) | Err(Error::Again(_)) => {}
                    Err(Error::Avail) => {
                        let e = n.cq.readerr();
                        eprintln!("victim: an error entry: {e:?}");
                    }
                    Err(e) => panic!("victim: cq read: {e}"),
                }
            }
            slowest
        });
        let word = listen();
        stop.store(true, std::sync::atomic::Ordering::Release);
        (word, reader.join().expect("CQ reader"))
    })
}

/// The endpoint the raw peers flood: manual progress, made only while it serves.
fn victim() {
    let n = node(FI_MSG, Progress::Manual);
    say(&hex(&n.ep.getname().unwrap()));
    let mut slowest = Duration::ZERO;
    loop {
        let (line, s) = serve(&n);
        slowest = slowest.max(s);
        let w: Vec<&str> = line.split(' ').collect();
        match w[..] {
            ["pause"] => {
                // No progress until the parent says so: nothing the raw peer's NIC puts in
                // our queue pair's CQ is taken meanwhile.
                say("paused");
                assert_eq!(listen(), "go");
            }
            ["slowest"] => say(&format!("slowest_ms {}", slowest.as_millis())),
            ["peer", name] => {
                let p = n.add_peer(&unhex(name));
                let mut b = vec![0u8; 64];
                // SAFETY: both buffers outlive the completions waited for below.
                unsafe { n.ep.recv(&mut b, None, p, 1) }.unwrap();
                let msg = pattern(64, 6);
                // SAFETY: as above.
                n.retry(|| unsafe { n.ep.send(&msg, None, p, 2) });
                n.wait_n(2);
                assert!(b == pattern(64, 5), "the honest peer's message differs");
                say("done");
            }
            ["bye"] => break,
            _ => panic!("victim: unknown command {line:?}"),
        }
    }
}

/// A normal endpoint that exchanges a message each way with the victim.
fn honest() {
    let n = node(FI_MSG, Progress::Auto);
    say(&hex(&n.ep.getname().unwrap()));
    let v = n.add_peer(&unhex(&listen()));
    let mut b = vec![0u8; 64];
    // SAFETY: both buffers outlive the completions waited for below.
    unsafe { n.ep.recv(&mut b, None, v, 1) }.unwrap();
    let msg = pattern(64, 5);
    // SAFETY: as above.
    n.retry(|| unsafe { n.ep.send(&msg, None, v, 2) });
    n.wait_n(2);
    assert!(b == pattern(64, 6), "the victim's message differs");
    say("done");
    assert_eq!(listen(), "bye");
}
