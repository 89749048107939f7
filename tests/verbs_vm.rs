//! The verbs provider on a real kernel RDMA device: Soft-RoCE (rdma_rxe) inside a QEMU VM
//! (`scripts/rxe-vm.sh`), since these machines have no RDMA NIC and their kernel no InfiniBand.
//!
//! `boots_the_soft_roce_vm` (the host half) boots the VM once and runs this same test binary
//! inside it, selecting the `vm_*` tests, with `XFABRIC_RXE_VM=1` and the verbs provider; it
//! skips with the reason where the VM cannot run. The `vm_*` tests do the work there and skip
//! themselves on the host. Each is a two-process test (`common::spawn`), bounded in time.

mod common;
use std::process::Command;
use std::time::Duration;

use common::*;
use xfabric::errno::*;
use xfabric::*;

/// Whether this process runs inside the VM (set by the host half).
fn inside() -> bool {
    std::env::var_os("XFABRIC_RXE_VM").is_some()
}

/// The `vm_*` tests below, which the host half expects to see pass (one needs the `cuda`
/// feature: the CUDA test double).
const VM_TESTS: usize = if cfg!(feature = "cuda") { 11 } else { 10 };

/// The `pair_*` tests below, which run in a VM with two devices.
const PAIR_TESTS: usize = 3;

// The host halves' names must not contain "vm_" or "pair_" (the filters).
#[test]
fn boots_the_soft_roce_vm() {
    boot(false, "vm_", VM_TESTS);
}

#[test]
fn boots_the_soft_roce_pair() {
    boot(true, "pair_", PAIR_TESTS);
}

/// One VM at a time: two would share this machine's cores.
static ONE_VM: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Boots the VM (`--pair`: two devices on a veth pair) and runs the tests matching `filter`
/// inside, expecting `count` to pass.
fn boot(pair: bool, filter: &str, count: usize) {
    if inside() || role().is_some() {
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let runner = root.join("scripts/rxe-vm.sh");
    let check = Command::new(&runner).arg("--check").output();
    match check {
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
    let _one = ONE_VM.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new(&runner);
    if pair {
        cmd.arg("--pair");
    }
    let out = cmd
        .args(["--timeout", "240", "--"])
        .arg(&exe)
        .args([filter, "--test-threads=1"])
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
    let want = format!("test result: ok. {count} passed");
    assert!(text.contains(&want), "expected \"{want}\" from the VM");
}

/// On a machine without an RDMA device (or without rdma-core), verbs is not listed and
/// `xfabric info -p verbs` says why; where there is one (the VM), it is listed.
#[test]
fn info_lists_verbs_in_the_vm_or_says_why_not() {
    if role().is_some() {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_xfabric"))
        .args(["info", "-p", "verbs"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if inside() || out.status.success() {
        assert!(out.status.success(), "{text}");
        assert!(text.contains("provider: verbs"), "{text}");
        assert!(text.contains("FI_EP_RDM"), "{text}");
    } else {
        let why = text.split("provider verbs: ").nth(1).unwrap_or("");
        assert!(
            why.starts_with("libibverbs.so.1 not found")
                || why.starts_with("no RDMA device")
                || why.starts_with("no usable RDMA device"),
            "{text}"
        );
        eprintln!("verbs unavailable here: {}", why.trim());
        // Listing everything still works, without verbs.
        let all = Command::new(env!("CARGO_BIN_EXE_xfabric"))
            .args(["info", "-l"])
            .output()
            .unwrap();
        assert!(all.status.success());
    }
}

/// Skips (true) unless inside the VM.
fn skip() -> bool {
    if !inside() {
        eprintln!("skipped: runs inside the Soft-RoCE VM only (see boots_the_soft_roce_vm)");
        return true;
    }
    false
}

fn send(n: &Node, b: &[u8], to: FiAddr, ctx: Context) {
    // SAFETY: every caller keeps the buffer until the send's completion.
    n.retry(|| unsafe { n.ep.send(b, None, to, ctx) });
}

fn recv(n: &Node, b: &mut [u8], from: FiAddr, ctx: Context) {
    // SAFETY: every caller keeps the buffer until the receive's completion.
    unsafe { n.ep.recv(b, None, from, ctx) }.unwrap();
}

const SIZES: [usize; 4] = [1, 4096, 100_000, 4 << 20];

#[test]
fn vm_two_processes_exchange_messages() {
    if skip() {
        return;
    }
    assert_eq!(
        std::env::var("XFABRIC_TEST_PROVIDER").as_deref(),
        Ok("verbs")
    );
    if role().is_some() {
        let n = node(FI_MSG, Progress::Auto);
        let p = connect_parent(&n);
        let mut bufs: Vec<Vec<u8>> = SIZES.iter().map(|s| vec![0u8; *s]).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            recv(&n, b, p, i);
        }
        let mut got: Vec<Context> = n.wait_n(SIZES.len()).iter().map(|c| c.op_context).collect();
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2, 3]);
        for (i, b) in bufs.iter().enumerate() {
            assert!(*b == pattern(SIZES[i], i as u64), "message {i} differs");
        }
        let back = pattern(1000, 9);
        send(&n, &back, p, 9);
        n.wait_one();
        say("done");
        assert_eq!(listen(), "bye");
        return;
    }
    let mut child = spawn("vm_two_processes_exchange_messages", "child", &[]);
    let n = node(FI_MSG, Progress::Auto);
    let c = connect(&mut child, &n);
    let msgs: Vec<Vec<u8>> = (0..SIZES.len())
        .map(|i| pattern(SIZES[i], i as u64))
        .collect();
    let mut back = vec![0u8; 1000];
    recv(&n, &mut back, c, 9);
    for (i, m) in msgs.iter().enumerate() {
        send(&n, m, c, i);
    }
    // Four sends and the receive.
    n.wait_n(SIZES.len() + 1);
    assert!(back == pattern(1000, 9));
    assert_eq!(child.hear(), "done");
    child.tell("bye");
    child.join();
}

/// A stranger that reaches an endpoint's side channel and says a hello naming a real peer
/// (with a nonce of its own, and a queue pair of its own): the endpoint calls the real peer's
/// address back, hears that the hello is not its, and closes the stranger's connection
/// without answering: no queue pair of ours is connected to the stranger's, and nothing it
/// could send would be taken as the peer's. The real peer goes on exchanging messages.
#[test]
fn vm_a_stranger_claiming_a_peer_gets_no_queue_pair() {
    use std::io::{Read, Write};
    use xfabric::providers::verbs::{claim, QpInfo};
    if skip() {
        return;
    }
    let rounds = 2;
    if role().is_some() {
        let n = node(FI_MSG, Progress::Auto);
        let p = connect_parent(&n);
        for r in 0..rounds {
            let mut b = vec![0u8; 64];
            recv(&n, &mut b, p, r);
            n.wait_one();
            assert!(b == pattern(64, r as u64), "round {r}");
            let back = pattern(64, 100 + r as u64);
            send(&n, &back, p, r);
            n.wait_one();
        }
        say("done");
        assert_eq!(listen(), "bye");
        return;
    }
    let t = "vm_a_stranger_claiming_a_peer_gets_no_queue_pair";
    let mut child = spawn(t, "child", &[]);
    let n = node(FI_MSG, Progress::Auto);
    let peer_raw = unhex(&child.hear());
    let c = n.add_peer(&peer_raw);
    child.tell(&hex(&n.ep.getname().unwrap()));
    let exchange = |r: usize| {
        let mut back = vec![0u8; 64];
        recv(&n, &mut back, c, 1000 + r);
        let msg = pattern(64, r as u64);
        send(&n, &msg, c, r);
        n.wait_n(2);
        assert!(back == pattern(64, 100 + r as u64), "round {r}");
    };
    exchange(0);
    let ours = xfabric::providers::inet::decode(&n.ep.getname().unwrap()).unwrap();
    let claimed = xfabric::providers::inet::decode(&peer_raw).unwrap();
    // A queue pair the endpoint could connect to: the device's own GID (RoCE v2: its IPv4
    // address, mapped), so that only the missing proof stops it.
    let std::net::IpAddr::V4(ip) = ours.ip() else {
        panic!("verbs names are IPv4")
    };
    let forged = claim::Hello {
        qp: QpInfo {
            qpn: 0x11,
            psn: 0x22,
            gid: ip.to_ipv6_mapped().octets(),
        },
        name: claimed,
        flags: 0,
        nonce: claim::nonce().unwrap(),
    };
    let mut s = std::net::TcpStream::connect(ours).unwrap();
    s.write_all(&forged.encode()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => assert!(
            got.is_empty(),
            "the endpoint answered a stranger claiming its peer: {} bytes",
            got.len()
        ),
        Err(e) => panic!("the stranger's connection was neither answered nor closed: {e}"),
    }
    exchange(1);
    assert_eq!(child.hear(), "done");
    child.tell("bye");
    child.join();
}

/// A node whose regions the NIC knows: provider keys (the rkeys) and virtual addresses, as
/// verbs applications ask for them.
fn nic_node(caps: u64) -> Node {
    node_with(caps, Progress::Auto, |h| {
        h.domain_attr.mr_mode = FI_MR_PROV_KEY | FI_MR_VIRT_ADDR
    })
}

/// Registers `win` with `access` and tells the parent "key base".
fn tell_window(n: &Node, win: &[u8], access: u64) -> MemoryRegion {
    // SAFETY: every caller keeps `win` alive (and unmoved) past the region's drop.
    let mr = unsafe { n.domain.mr_reg(win, access, 0, 0) }.unwrap();
    assert!(mr.provider_registered(), "the NIC registered the window");
    say(&format!("{} {}", mr.key(), win.as_ptr() as u64));
    mr
}

/// Bytes of the RMA tests' window.
const WIN: usize = 1 << 20;

/// Large messages read by the receiver's NIC from the sender's memory (RDMA read), at the
/// sizes the figures cover, contents checked; one sent from a region the application
/// registered, one from plain memory (registered for the offer and deregistered after).
#[test]
fn vm_large_messages_by_rdma_read() {
    const T: &str = "vm_large_messages_by_rdma_read";
    const BIG: [usize; 4] = [64 << 10, 100_000, 1 << 20, 4 << 20];
    if skip() {
        return;
    }
    if role().is_some() {
        let n = node(FI_MSG, Progress::Auto);
        let p = connect_parent(&n);
        let before = xfabric_providers::verbs::native_counts();
        let mut bufs: Vec<Vec<u8>> = BIG.iter().map(|s| vec![0u8; *s]).collect();
        let mut again = vec![vec![0u8; 1 << 20]; 2];
        for (i, b) in bufs.iter_mut().enumerate() {
            recv(&n, b, p, i);
        }
        for (i, b) in again.iter_mut().enumerate() {
            recv(&n, b, p, 10 + i);
        }
        n.wait_n(BIG.len() + again.len());
        for (i, b) in bufs.iter().enumerate() {
            assert!(*b == pattern(BIG[i], 20 + i as u64), "message {i} differs");
        }
        for b in &again {
            assert!(
                *b == pattern(1 << 20, 22),
                "a message sent twice at once differs"
            );
        }
        let pulls = xfabric_providers::verbs::native_counts().pulls - before.pulls;
        say(&format!("pulls {pulls}"));
        assert_eq!(listen(), "bye");
        return;
    }
    let mut child = spawn(T, "child", &[]);
    let n = node(FI_MSG, Progress::Auto);
    let c = connect(&mut child, &n);
    let msgs: Vec<Vec<u8>> = (0..BIG.len())
        .map(|i| pattern(BIG[i], 20 + i as u64))
        .collect();
    // SAFETY: `msgs[3]` outlives the region.
    let mr = unsafe { n.domain.mr_reg(&msgs[3], FI_SEND, 0, 3) }.unwrap();
    for (i, m) in msgs.iter().enumerate() {
        send(&n, m, c, i);
    }
    // The same buffer offered twice more at once (one registration for both offers).
    send(&n, &msgs[2], c, 10);
    send(&n, &msgs[2], c, 11);
    n.wait_n(BIG.len() + 2);
    // Above the eager limit (64 KiB): all but the first were read by the receiver's NIC.
    assert_eq!(child.hear(), "pulls 5");
    drop(mr);
    child.tell("bye");
    child.join();
}

/// The child's half of the RMA tests: a window, its key and base told to the parent; then,
/// on "look LEN SEED", checks the window's first LEN bytes are `pattern(LEN, SEED)` and
/// answers "ok" with the NIC writes it was told of; "bye" ends it.
fn window_child() {
    window_child_on(nic_node(FI_MSG | FI_RMA | FI_ATOMIC), WIN);
}

/// `window_child` on the node `n`, with a window of `size` bytes.
fn window_child_on(n: Node, size: usize) {
    connect_parent(&n);
    let mut win = vec![0u8; size];
    win[1024..1032].copy_from_slice(&40u64.to_ne_bytes());
    let mr = tell_window(&n, &win, FI_REMOTE_READ | FI_REMOTE_WRITE);
    loop {
        let line = listen();
        let w: Vec<&str> = line.split(' ').collect();
        match w[..] {
            ["bye"] => break,
            ["look", len, seed] => {
                let (len, seed) = (len.parse().unwrap(), seed.parse().unwrap());
                assert!(win[..len] == pattern(len, seed), "the window differs");
                let c = xfabric_providers::verbs::native_counts();
                say(&format!("ok {}", c.writes_in));
            }
            ["data", want] => {
                // A remote write's CQ data, reported here.
                let e = n.wait_one();
                assert_eq!(e.flags, FI_REMOTE_WRITE | FI_RMA | FI_REMOTE_CQ_DATA);
                assert_eq!(e.data, want.parse::<u64>().unwrap());
                say("ok");
            }
            _ => panic!("child: unknown command {line:?}"),
        }
    }
    drop(mr);
}

fn remote(child: &mut Peer) -> (u64, u64) {
    let v: Vec<u64> = child
        .hear()
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    (v[0], v[1])
}

#[test]
fn vm_wrong_rkey_fails_with_eacces() {
    const T: &str = "vm_wrong_rkey_fails_with_eacces";
    if skip() {
        return;
    }
    if role().is_some() {
        return window_child();
    }
    let mut child = spawn(T, "child", &[]);
    let n = nic_node(FI_MSG | FI_RMA | FI_ATOMIC);
    let c = connect(&mut child, &n);
    let (key, base) = remote(&mut child);
    let data = pattern(512, 3);
    let mut back = vec![0u8; 512];
    let before = xfabric_providers::verbs::native_counts();
    // The first write (connecting) learns whether the peer reports remote reads.
    // SAFETY: the buffers outlive the completions read below.
    unsafe { n.ep.write(&data[..8], None, c, base + 8, key, 9) }.unwrap();
    assert_eq!(n.wait_one().op_context, 9);
    // A wrong rkey: the peer's NIC refuses it (a remote access error, the QP in error).
    // SAFETY: as above.
    unsafe { n.ep.write(&data, None, c, base, key ^ 0x5a5a, 1) }.unwrap();
    match n.next() {
        Completion::Err(e, _) => assert_eq!((e.op_context, e.err), (1, FI_EACCES), "{e:?}"),
        Completion::Ok(c, _) => panic!("a write with a wrong key succeeded: {c:?}"),
    }
    // SAFETY: as above.
    unsafe { n.ep.read(&mut back, None, c, base, key.wrapping_add(1), 2) }.unwrap();
    match n.next() {
        Completion::Err(e, _) => assert_eq!((e.op_context, e.err), (2, FI_EACCES), "{e:?}"),
        Completion::Ok(c, _) => panic!("a read with a wrong key succeeded: {c:?}"),
    }
    // The connection is made again at the next use: the right key works.
    // SAFETY: as above.
    unsafe { n.ep.write(&data, None, c, base, key, 3) }.unwrap();
    assert_eq!(n.wait_one().op_context, 3);
    // SAFETY: as above.
    unsafe { n.ep.read(&mut back, None, c, base, key, 4) }.unwrap();
    assert_eq!(n.wait_one().op_context, 4);
    assert!(back == data);
    // A read in pieces running past the window's end: its first pieces are read, the fifth
    // is refused, and the read fails once, with that refusal; the read after it (on a new
    // connection) is the next completion.
    let mut big = vec![0u8; 2 * WIN];
    // SAFETY: `big` outlives the region and the completions read below.
    let big_mr = unsafe { n.domain.mr_reg(&big, FI_READ, 0, 5) }.unwrap();
    unsafe { n.ep.read(&mut big, None, c, base, key, 5) }.unwrap();
    match n.next() {
        Completion::Err(e, _) => assert_eq!((e.op_context, e.err), (5, FI_EACCES), "{e:?}"),
        Completion::Ok(c, _) => panic!("a read past the window succeeded: {c:?}"),
    }
    back.fill(0);
    // SAFETY: as above.
    unsafe { n.ep.read(&mut back, None, c, base, key, 6) }.unwrap();
    match n.next() {
        Completion::Ok(e, _) => assert_eq!(e.op_context, 6),
        Completion::Err(e, _) => panic!("after a refused read in pieces: {e:?}"),
    }
    assert!(back == data);
    drop(big_mr);
    // All seven went to the NIC; the two wrong keys and the read past the end were refused
    // there.
    let after = xfabric_providers::verbs::native_counts();
    assert_eq!(
        (after.done - before.done, after.refused - before.refused),
        (4, 3)
    );
    child.tell("look 512 3");
    assert!(child.hear().starts_with("ok "));
    child.tell("bye");
    child.join();
}

fn u64_bytes(v: &u64) -> &[u8] {
    // SAFETY: a u64's 8 bytes.
    unsafe { std::slice::from_raw_parts(v as *const u64 as *const u8, 8) }
}

fn u64_bytes_mut(v: &mut u64) -> &mut [u8] {
    // SAFETY: a u64's 8 bytes.
    unsafe { std::slice::from_raw_parts_mut(v as *mut u64 as *mut u8, 8) }
}
/// On the word at `at` (40 before): a fetch-add of 2 (context 4), then a compare-swap of 42
/// for 100 (context 5); checks what each fetched.
fn fetch_add_then_cswap(n: &Node, c: FiAddr, at: u64, key: u64) {
    let (two, c42, hundred) = (2u64, 42u64, 100u64);
    let (mut r1, mut r2) = (0u64, 0u64);
    let dt = Datatype::UInt64;
    // SAFETY (both blocks): the operands and results outlive the completions waited for.
    unsafe {
        n.ep.fetch_atomic(
            u64_bytes(&two),
            1,
            u64_bytes_mut(&mut r1),
            c,
            at,
            key,
            dt,
            AtomicOp::Sum,
            4,
        )
    }
    .unwrap();
    n.wait_one();
    unsafe {
        n.ep.compare_atomic(
            u64_bytes(&hundred),
            1,
            u64_bytes(&c42),
            u64_bytes_mut(&mut r2),
            c,
            at,
            key,
            dt,
            AtomicOp::Cswap,
            5,
        )
    }
    .unwrap();
    n.wait_one();
    assert_eq!((r1, r2), (40, 42));
}

/// A 1 MiB and a 4 MiB RDMA read at once of the 4 MiB window at `base` (its first bytes
/// `head`, the rest zero), `rounds` times, contents checked: each is one operation of the
/// NIC's, posted in pieces of 256 KiB (4 and 16: the counts say so).
fn large_reads_at_once(n: &Node, c: FiAddr, base: u64, key: u64, head: &[u8], rounds: u64) {
    let mut big = vec![0u8; 4 << 20];
    let mut big2 = vec![0u8; 1 << 20];
    // SAFETY: both outlive their regions (dropped at the end).
    let mrs = unsafe {
        [
            n.domain.mr_reg(&big, FI_READ, 0, 3).unwrap(),
            n.domain.mr_reg(&big2, FI_READ, 0, 4).unwrap(),
        ]
    };
    let same = |b: &[u8]| b[..head.len()] == *head && b[head.len()..].iter().all(|x| *x == 0);
    let before = xfabric_providers::verbs::native_counts();
    for round in 0..rounds {
        // Not what the window holds: every byte must come from the read.
        big.fill(0xee);
        big2.fill(0xee);
        // SAFETY: the buffers outlive the completions waited for.
        unsafe { n.ep.read(&mut big2, None, c, base, key, 11) }.unwrap();
        unsafe { n.ep.read(&mut big, None, c, base, key, 12) }.unwrap();
        let mut ctx: Vec<Context> = n.wait_n(2).iter().map(|e| e.op_context).collect();
        ctx.sort();
        assert_eq!(ctx, [11, 12]);
        assert!(
            same(&big2),
            "the 1 MiB read's contents differ (round {round})"
        );
        assert!(
            same(&big),
            "the 4 MiB read's contents differ (round {round})"
        );
    }
    let after = xfabric_providers::verbs::native_counts();
    assert_eq!(
        (
            after.done - before.done,
            after.read_pieces - before.read_pieces
        ),
        (2 * rounds, 20 * rounds),
        "each read went to the NIC, in pieces"
    );
    drop(mrs);
}

/// RDMA write (with and without remote CQ data), read and the two atomics, through the
/// NIC (its counts say so), with the contents checked at both ends; an atomic the NIC does
/// not have goes through the engine, and the next read goes to the NIC again.
#[test]
fn vm_native_rma_and_atomics_go_through_the_nic() {
    const T: &str = "vm_native_rma_and_atomics_go_through_the_nic";
    if skip() {
        return;
    }
    if role().is_some() {
        return window_child_on(nic_node(FI_MSG | FI_RMA | FI_ATOMIC), 4 << 20);
    }
    let mut child = spawn(T, "child", &[]);
    let n = nic_node(FI_MSG | FI_RMA | FI_ATOMIC);
    let c = connect(&mut child, &n);
    let (key, base) = remote(&mut child);
    let before = xfabric_providers::verbs::native_counts();
    let data = pattern(512, 5);
    let mut back = vec![0u8; 512];
    // SAFETY (every block below): the buffers outlive the completions waited for.
    unsafe { n.ep.write(&data, None, c, base, key, 1) }.unwrap();
    assert_eq!(n.wait_one().flags, FI_RMA | FI_WRITE);
    let small = pattern(64, 6);
    unsafe { n.ep.writedata(&small, None, 0x1234, c, base + 2048, key, 2) }.unwrap();
    assert_eq!(n.wait_one().op_context, 2);
    child.tell("data 4660");
    assert_eq!(child.hear(), "ok");
    unsafe { n.ep.read(&mut back, None, c, base, key, 3) }.unwrap();
    assert_eq!(n.wait_one().flags, FI_RMA | FI_READ);
    assert!(back == data);
    let (at, dt) = (base + 1024, Datatype::UInt64);
    fetch_add_then_cswap(&n, c, at, key);
    let mid = xfabric_providers::verbs::native_counts();
    // The two atomics by the NIC only where asked for (XFABRIC_VERBS_NATIVE_ATOMICS): by
    // default the target's engine does them, with the same results.
    let nic_atomics = 2 * u64::from(xfabric::settings::VERBS_NATIVE_ATOMICS.flag());
    assert_eq!(
        mid.done - before.done,
        3 + nic_atomics,
        "the writes and the read by the NIC, the atomics where asked"
    );
    // FI_MAX is not the NIC's: the target's engine does it; then a read by the NIC sees it.
    let five = 5u64;
    unsafe {
        n.ep.atomic(
            u64_bytes(&five),
            1,
            None,
            c,
            at + 8,
            key,
            dt,
            AtomicOp::Max,
            6,
        )
    }
    .unwrap();
    n.wait_one();
    let mut words = [0u8; 16];
    unsafe { n.ep.read(&mut words, None, c, at, key, 7) }.unwrap();
    n.wait_one();
    assert_eq!(u64::from_ne_bytes(words[..8].try_into().unwrap()), 100);
    assert_eq!(u64::from_ne_bytes(words[8..].try_into().unwrap()), 5);
    let after = xfabric_providers::verbs::native_counts();
    assert_eq!(
        after.done - mid.done,
        1,
        "FI_MAX went through the engine, the read not"
    );
    child.tell("look 512 5");
    let got = child.hear();
    // The child was told of both writes by their immediate data.
    let writes_in: u64 = got.strip_prefix("ok ").unwrap().parse().unwrap();
    assert_eq!(writes_in, 2, "{got}");
    // Reads above 256 KiB: one operation each, in pieces.
    let mut head = vec![0u8; 2048 + 64];
    head[..512].copy_from_slice(&data);
    head[1024..1032].copy_from_slice(&100u64.to_ne_bytes());
    head[1032..1040].copy_from_slice(&5u64.to_ne_bytes());
    head[2048..].copy_from_slice(&small);
    large_reads_at_once(&n, c, base, key, &head, 3);
    child.tell("bye");
    child.join();
}

/// `FI_FENCE` across the two paths: a fenced send after an RDMA write reaches the target
/// after the write is in place; a read after a write the engine carries (remote CQ data too
/// wide for the immediate) goes behind it and sees its data.
///
/// The target progresses only when it reads its CQ (manual progress), and it does not until
/// the parent has posted the read: the engine's write is then still unanswered when the read
/// is posted, whatever the scheduling, so the read must take the engine's path behind it.
#[test]
fn vm_native_fence_and_order_with_framed_operations() {
    const T: &str = "vm_native_fence_and_order_with_framed_operations";
    if skip() {
        return;
    }
    if role().is_some() {
        let n = node_with(FI_MSG | FI_RMA, Progress::Manual, |h| {
            h.domain_attr.mr_mode = FI_MR_PROV_KEY | FI_MR_VIRT_ADDR
        });
        let p = connect_parent(&n);
        let win = vec![0u8; 4096];
        let mr = tell_window(&n, &win, FI_REMOTE_READ | FI_REMOTE_WRITE);
        let mut m = vec![0u8; 16];
        recv(&n, &mut m, p, 1);
        n.wait_one();
        // The fenced send came after the write: the window holds it already.
        assert!(
            win[..1024] == pattern(1024, 8),
            "the fenced send overtook the write"
        );
        // No progress here until the parent has posted the wide write and the read.
        assert_eq!(listen(), "go");
        // The wide CQ data's write, reported by the engine.
        let e = n.wait_one();
        assert_eq!(e.data, 1 << 40);
        say("ok");
        // The read behind the write may not have arrived yet: serve it.
        serve_until(&n, "bye");
        drop(mr);
        return;
    }
    let mut child = spawn(T, "child", &[]);
    let n = nic_node(FI_MSG | FI_RMA);
    let c = connect(&mut child, &n);
    let (key, base) = remote(&mut child);
    let data = pattern(1024, 8);
    let before = xfabric_providers::verbs::native_counts();
    // SAFETY (every block below): the buffers outlive the completions waited for.
    unsafe { n.ep.write(&data, None, c, base, key, 1) }.unwrap();
    let note = [1u8; 16];
    let iov = [RawIov::of(&note)];
    let msg = Msg {
        iov: &iov,
        desc: &[],
        addr: c,
        context: 2,
        data: 0,
        tag: 0,
        ignore: 0,
    };
    unsafe { n.ep.sendmsg(&msg, FI_FENCE) }.unwrap();
    n.wait_n(2);
    let wide = pattern(256, 9);
    let mut back = vec![0u8; 256];
    unsafe { n.ep.writedata(&wide, None, 1 << 40, c, base + 2048, key, 3) }.unwrap();
    unsafe { n.ep.read(&mut back, None, c, base + 2048, key, 4) }.unwrap();
    child.tell("go");
    n.wait_n(2);
    assert!(back == wide, "the read passed the write before it");
    let after = xfabric_providers::verbs::native_counts();
    // The first write by the NIC; the wide write and the read behind it by the engine.
    assert_eq!(after.done - before.done, 1);
    assert_eq!(child.hear(), "ok");
    child.tell("bye");
    child.join();
}

/// A peer killed while the NIC reads its memory: every read ends (done, or failed with the
/// connection), none hangs; the next one fails too.
#[test]
fn vm_native_peer_killed_mid_rdma_no_hang() {
    const T: &str = "vm_native_peer_killed_mid_rdma_no_hang";
    if skip() {
        return;
    }
    if role().is_some() {
        let n = nic_node(FI_MSG | FI_RMA);
        connect_parent(&n);
        let win = vec![7u8; WIN];
        // (This process is killed holding both.)
        let _mr = tell_window(&n, &win, FI_REMOTE_READ);
        listen();
        unreachable!("this child is killed");
    }
    let mut child = spawn(T, "child", &[]);
    let n = nic_node(FI_MSG | FI_RMA);
    let c = connect(&mut child, &n);
    let (key, base) = remote(&mut child);
    let mut local = vec![0u8; WIN];
    // SAFETY: `local` outlives the region and every read.
    let mr = unsafe { n.domain.mr_reg(&local, FI_READ, 0, 0) }.unwrap();
    const PART: usize = 256 << 10;
    let parts = WIN / PART;
    let before = xfabric_providers::verbs::native_counts();
    let read_all = |ctx: usize, local: &mut [u8]| {
        for (i, b) in local.chunks_mut(PART).enumerate() {
            // SAFETY: `local` outlives every read (waited for below).
            unsafe {
                n.ep.read(b, None, c, base + (i * PART) as u64, key, ctx + i)
            }
            .unwrap();
        }
    };
    // A message first: once sent, the connection is up and the peer has said it does not
    // report remote reads (its hello), so reads go to the NIC.
    send(&n, &[1u8; 8], c, 50);
    n.wait_one();
    read_all(0, &mut local);
    n.wait_n(parts);
    assert!(local.iter().all(|b| *b == 7));
    let first = xfabric_providers::verbs::native_counts();
    assert_eq!(first.done - before.done, parts as u64, "the NIC read them");
    // A second round, and the kill while it is in flight.
    read_all(100, &mut local);
    child.kill();
    let started = std::time::Instant::now();
    let end = |what: &str| match n.next() {
        Completion::Err(e, _) => {
            let ok = [FI_ECONNRESET, FI_ECANCELED, FI_ECONNREFUSED];
            assert!(ok.contains(&e.err), "{what}: {e:?}");
        }
        Completion::Ok(..) => {}
    };
    for _ in 0..parts {
        end("in flight");
    }
    // Afterwards: the peer is gone, the next read fails.
    read_all(200, &mut local);
    for _ in 0..parts {
        end("after");
    }
    assert!(started.elapsed() < Duration::from_secs(30));
    drop(mr);
}

#[test]
fn vm_queue_pairs_moved_to_error_fail_operations() {
    const T: &str = "vm_queue_pairs_moved_to_error_fail_operations";
    if skip() {
        return;
    }
    if role().is_some() {
        // Progresses only until the first message is in (the connection is up), then never:
        // the parent's reads stay unanswered until its QPs fail.
        let n = node(FI_MSG | FI_RMA, Progress::Manual);
        let p = connect_parent(&n);
        let mut b = vec![0u8; 64];
        recv(&n, &mut b, p, 1);
        n.wait_one();
        say("idle");
        assert_eq!(listen(), "bye");
        return;
    }
    let mut child = spawn(T, "child", &[]);
    let n = node(FI_MSG | FI_RMA, Progress::Auto);
    let c = connect(&mut child, &n);
    send(&n, &[7u8; 64], c, 1);
    assert_eq!(child.hear(), "idle");
    assert_eq!(n.wait_one().op_context, 1);
    let mut reads = vec![vec![0u8; 4096]; 4];
    for (i, r) in reads.iter_mut().enumerate() {
        // SAFETY: the buffers outlive the error completions read below.
        unsafe { n.ep.read(r, None, c, 0, 1, 10 + i) }.unwrap();
    }
    xfabric_providers::verbs::fault_queue_pairs();
    let mut ended = Vec::new();
    for _ in 0..reads.len() {
        match n.next() {
            Completion::Err(e, _) => {
                assert_eq!(e.err, FI_ECANCELED, "{e:?}");
                ended.push(e.op_context);
            }
            Completion::Ok(c, _) => panic!("a read of a peer that never answers succeeded: {c:?}"),
        }
    }
    ended.sort_unstable();
    assert_eq!(ended, [10, 11, 12, 13]);
    child.tell("bye");
    child.join();
}

#[test]
fn vm_peer_killed_mid_transfer_no_hang() {
    const T: &str = "vm_peer_killed_mid_transfer_no_hang";
    if skip() {
        return;
    }
    if role().is_some() {
        // Receives part of a long stream, then waits to be killed.
        let n = node(FI_MSG, Progress::Auto);
        let p = connect_parent(&n);
        let mut b = vec![0u8; 1 << 20];
        recv(&n, &mut b, p, 1);
        n.wait_one();
        say("one");
        listen();
        unreachable!("this child is killed");
    }
    let mut child = spawn(T, "child", &[]);
    let n = node(FI_MSG, Progress::Auto);
    let c = connect(&mut child, &n);
    let big = pattern(1 << 20, 1);
    send(&n, &big, c, 1);
    assert_eq!(child.hear(), "one");
    // The first one's acknowledgement in before the kill (the peer took it, but its answer
    // could still be on the wire when the peer dies).
    assert_eq!(n.wait_one().op_context, 1);
    // Sends the peer never receives (no receive posted: they wait as unexpected or for a
    // match), then the kill while they are in flight.
    let mut hdl = Vec::new();
    for i in 0..8usize {
        // SAFETY: `big` outlives every completion below.
        match unsafe { n.ep.senddata(&big, None, i as u64, c, 100 + i) } {
            Ok(()) => hdl.push(100 + i),
            Err(Error::Again(_)) => break,
            Err(e) => panic!("send: {e}"),
        }
    }
    child.kill();
    // Every operation ends, one way or the other, within the bound: none hangs.
    let started = std::time::Instant::now();
    let mut ended = 0;
    let mut errs = 0;
    while ended < hdl.len() {
        match n.next() {
            Completion::Err(e, _) => {
                assert_eq!(e.err, FI_ECONNRESET, "{e:?}");
                errs += 1;
            }
            Completion::Ok(..) => {}
        }
        ended += 1;
    }
    assert!(started.elapsed() < Duration::from_secs(30));
    // Larger than the eager limit, unmatched: each waited for the peer, and failed with it.
    assert_eq!(errs, hdl.len());
}

/// Bytes sent so far by a network interface of the VM.
fn tx_bytes(dev: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{dev}/statistics/tx_bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Two processes on two devices (rxe0 on veth0, 192.0.2.1; rxe1 on veth1, 192.0.2.2), each
/// choosing its device by its source address: the messages cross the veth pair (its byte
/// counters say so), not rxe's internal loopback.
#[test]
fn pair_two_devices_exchange_messages_across_the_veth_pair() {
    if !inside() || std::fs::metadata("/sys/class/net/veth0").is_err() {
        eprintln!("skipped: runs inside the two-device Soft-RoCE VM only");
        return;
    }
    let on = |ip: &str| {
        let a: std::net::SocketAddr = format!("{ip}:0").parse().unwrap();
        let raw = xfabric_providers::inet::encode(&a);
        node_with(FI_MSG, Progress::Auto, move |h| h.src_addr = Some(raw))
    };
    if role().is_some() {
        let n = on("192.0.2.2");
        assert_eq!(n.info.domain_attr.name.as_deref(), Some("rxe1"));
        let p = connect_parent(&n);
        let mut bufs: Vec<Vec<u8>> = SIZES.iter().map(|s| vec![0u8; *s]).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            recv(&n, b, p, i);
        }
        n.wait_n(SIZES.len());
        for (i, b) in bufs.iter().enumerate() {
            assert!(*b == pattern(SIZES[i], i as u64), "message {i} differs");
        }
        say("done");
        assert_eq!(listen(), "bye");
        return;
    }
    const T: &str = "pair_two_devices_exchange_messages_across_the_veth_pair";
    let mut child = spawn(T, "child", &[]);
    let n = on("192.0.2.1");
    assert_eq!(n.info.domain_attr.name.as_deref(), Some("rxe0"));
    let c = connect(&mut child, &n);
    let before = tx_bytes("veth0");
    let msgs: Vec<Vec<u8>> = (0..SIZES.len())
        .map(|i| pattern(SIZES[i], i as u64))
        .collect();
    for (i, m) in msgs.iter().enumerate() {
        send(&n, m, c, i);
    }
    n.wait_n(SIZES.len());
    assert_eq!(child.hear(), "done");
    let total: usize = SIZES.iter().sum();
    let sent = tx_bytes("veth0") - before;
    assert!(
        sent >= total as u64,
        "veth0 sent {sent} bytes for {total} of messages"
    );
    child.tell("bye");
    child.join();
}

/// Skips (true) unless inside the two-device VM.
fn skip_pair() -> bool {
    if !inside() || std::fs::metadata("/sys/class/net/veth0").is_err() {
        eprintln!("skipped: runs inside the two-device Soft-RoCE VM only");
        return true;
    }
    false
}

/// A node on the device whose address is `ip` (rxe0: 192.0.2.1, rxe1: 192.0.2.2); with
/// `nic`, its regions have provider keys and virtual addresses (see `nic_node`).
fn pair_node(ip: &str, caps: u64, nic: bool) -> Node {
    let a: std::net::SocketAddr = format!("{ip}:0").parse().unwrap();
    let raw = xfabric_providers::inet::encode(&a);
    let n = node_with(caps, Progress::Auto, move |h| {
        h.src_addr = Some(raw);
        if nic {
            h.domain_attr.mr_mode = FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
        }
    });
    let dev = if ip.ends_with(".1") { "rxe0" } else { "rxe1" };
    assert_eq!(n.info.domain_attr.name.as_deref(), Some(dev));
    n
}

/// RDMA write (with and without remote CQ data), read, fetch-add and compare-swap by the NIC
/// from rxe0 to a window on rxe1: the operations cross the veth pair, contents checked at
/// both ends, the NIC's counts saying it did all five.
#[test]
fn pair_native_rma_and_atomics_across_the_veth_pair() {
    const T: &str = "pair_native_rma_and_atomics_across_the_veth_pair";
    if skip_pair() {
        return;
    }
    if role().is_some() {
        let n = pair_node("192.0.2.2", FI_MSG | FI_RMA | FI_ATOMIC, true);
        return window_child_on(n, 4 << 20);
    }
    let mut child = spawn(T, "child", &[]);
    let n = pair_node("192.0.2.1", FI_MSG | FI_RMA | FI_ATOMIC, true);
    let c = connect(&mut child, &n);
    let (key, base) = remote(&mut child);
    let before = xfabric_providers::verbs::native_counts();
    let tx = tx_bytes("veth0");
    let data = pattern(WIN / 2, 7);
    let mut back = vec![0u8; WIN / 2];
    // Registered: larger than a send buffer, the NIC must reach them itself.
    // SAFETY: both outlive their regions (dropped at the end).
    let mrs = unsafe {
        [
            n.domain.mr_reg(&data, FI_WRITE, 0, 1).unwrap(),
            n.domain.mr_reg(&back, FI_READ, 0, 2).unwrap(),
        ]
    };
    // SAFETY (every block below): the buffers outlive the completions waited for.
    unsafe { n.ep.write(&data, None, c, base, key, 1) }.unwrap();
    assert_eq!(n.wait_one().flags, FI_RMA | FI_WRITE);
    let step = xfabric_providers::verbs::native_counts();
    assert_eq!(step.done - before.done, 1, "the write went to the NIC");
    assert!(
        tx_bytes("veth0") - tx >= (WIN / 2) as u64,
        "the write crossed veth0"
    );
    child.tell(&format!("look {} 7", WIN / 2));
    assert!(child.hear().starts_with("ok "));
    let small = pattern(64, 8);
    unsafe { n.ep.writedata(&small, None, 0xbeef, c, base + 2048, key, 2) }.unwrap();
    assert_eq!(n.wait_one().op_context, 2);
    child.tell("data 48879");
    assert_eq!(child.hear(), "ok");
    // 256 KiB: one work request.
    unsafe { n.ep.read(&mut back[..WIN / 4], None, c, base, key, 3) }.unwrap();
    assert_eq!(n.wait_one().flags, FI_RMA | FI_READ);
    let mut want = data.clone();
    want[2048..2048 + 64].copy_from_slice(&small);
    assert!(
        back[..WIN / 4] == want[..WIN / 4],
        "the read's contents differ"
    );
    let step = xfabric_providers::verbs::native_counts();
    assert_eq!(step.done - before.done, 3, "the read went to the NIC");
    // The window's word at 1024 was overwritten by the first write: start it again at 40.
    let forty = 40u64;
    unsafe { n.ep.write(u64_bytes(&forty), None, c, base + 1024, key, 9) }.unwrap();
    n.wait_one();
    let at = base + 1024;
    fetch_add_then_cswap(&n, c, at, key);
    let mut word = 0u64;
    unsafe { n.ep.read(u64_bytes_mut(&mut word), None, c, at, key, 6) }.unwrap();
    n.wait_one();
    assert_eq!(word, 100, "compare-swap stored 100");
    let after = xfabric_providers::verbs::native_counts();
    let nic_atomics = 2 * u64::from(xfabric::settings::VERBS_NATIVE_ATOMICS.flag());
    assert_eq!(
        (after.done - before.done, after.refused - before.refused),
        (5 + nic_atomics, 0),
        "the writes and reads by the NIC, the atomics where asked"
    );
    // Reads above 256 KiB go to the NIC as one operation each, posted in pieces of 256 KiB
    // (whole reads of 1 MiB and 4 MiB at once never completed across two rxe devices).
    let mut head = want.clone();
    head[1024..1032].copy_from_slice(&100u64.to_ne_bytes());
    large_reads_at_once(&n, c, base, key, &head, 5);
    drop(mrs);
    child.tell("bye");
    child.join();
}

/// Large messages read by the receiver's NIC (rxe1) from the sender's memory (rxe0), with
/// `XFABRIC_VERBS_PULL_MIN` at its default (64 KiB), contents checked. Both ends are
/// children: this process passes their addresses between them.
#[test]
fn pair_large_messages_by_rdma_read_across_the_veth_pair() {
    const T: &str = "pair_large_messages_by_rdma_read_across_the_veth_pair";
    const BIG: [usize; 4] = [64 << 10, 100_000, 1 << 20, 4 << 20];
    if skip_pair() {
        return;
    }
    match role().as_deref() {
        Some("recv") => {
            let n = pair_node("192.0.2.2", FI_MSG, false);
            let p = connect_parent(&n);
            let before = xfabric_providers::verbs::native_counts();
            let mut bufs: Vec<Vec<u8>> = BIG.iter().map(|s| vec![0u8; *s]).collect();
            for (i, b) in bufs.iter_mut().enumerate() {
                recv(&n, b, p, i);
            }
            n.wait_n(BIG.len());
            for (i, b) in bufs.iter().enumerate() {
                assert!(*b == pattern(BIG[i], 30 + i as u64), "message {i} differs");
            }
            let pulls = xfabric_providers::verbs::native_counts().pulls - before.pulls;
            say(&format!("pulls {pulls}"));
            assert_eq!(listen(), "bye");
            return;
        }
        Some(_) => {
            let n = pair_node("192.0.2.1", FI_MSG, false);
            let c = connect_parent(&n);
            let msgs: Vec<Vec<u8>> = (0..BIG.len())
                .map(|i| pattern(BIG[i], 30 + i as u64))
                .collect();
            for (i, m) in msgs.iter().enumerate() {
                send(&n, m, c, i);
            }
            n.wait_n(BIG.len());
            say("sent");
            assert_eq!(listen(), "bye");
            return;
        }
        None => {}
    }
    struct Show;
    impl Drop for Show {
        fn drop(&mut self) {
            eprintln!("{}", rxe_counters());
        }
    }
    let _show = Show;
    eprintln!("{}", rxe_counters());
    let mut rx = spawn(T, "recv", &[]);
    let mut tx = spawn(T, "send", &[]);
    let (a, b) = (rx.hear(), tx.hear());
    rx.tell(&b);
    tx.tell(&a);
    // Above the eager limit (64 KiB): all but the first were read by the receiver's NIC.
    assert_eq!(rx.hear(), "pulls 3");
    assert_eq!(tx.hear(), "sent");
    rx.tell("bye");
    tx.tell("bye");
    rx.join();
    tx.join();
}

/// The two devices' counters and the kernel's UDP counters, for a failure's report.
fn rxe_counters() -> String {
    let mut out = String::new();
    for d in ["rxe0", "rxe1"] {
        let dir = format!("/sys/class/infiniband/{d}/ports/1/hw_counters");
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut v: Vec<String> = rd
            .flatten()
            .map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let val = std::fs::read_to_string(e.path()).unwrap_or_default();
                format!("{name}={}", val.trim())
            })
            .collect();
        v.sort();
        out += &format!("{d}: {}\n", v.join(" "));
    }
    let snmp = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    for l in snmp.lines().filter(|l| l.starts_with("Udp:")) {
        out += l;
        out += "\n";
    }
    out
}

/// The child's `MrAttr` for CUDA memory at `addr`: remote reads and writes.
#[cfg(feature = "cuda")]
fn cuda_window(addr: usize, len: usize) -> MrAttr {
    MrAttr {
        addr,
        len,
        access: FI_REMOTE_WRITE | FI_REMOTE_READ,
        iface: Iface::Cuda,
        device: 0,
        ..Default::default()
    }
}

/// The target half of the device-memory tests: CUDA memory of `len` bytes registered in a
/// verbs domain with the NIC's keys; tells the parent "key base by_dmabuf staged why"; on
/// "look SEED" checks the memory holds `pattern(len, SEED)` and answers "ok"; "bye" ends it.
#[cfg(feature = "cuda")]
fn cuda_window_child(len: usize) {
    use common::cuda_double::*;
    let n = node_with(FI_MSG | FI_RMA | FI_HMEM, Progress::Auto, |h| {
        h.domain_attr.mr_mode = FI_MR_PROV_KEY | FI_MR_VIRT_ADDR | FI_MR_HMEM
    });
    connect_parent(&n);
    let dev = cuda().alloc_device(0, len).expect("device memory");
    to_device(&dev, &vec![0u8; len]);
    let attr = cuda_window(dev.as_ptr() as usize, len);
    // SAFETY: the memory outlives the registration (dropped first, below).
    let mr = unsafe { n.domain.mr_regattr(&attr, 0) }.expect("register CUDA memory");
    let d = xfabric_providers::verbs::device_memory();
    say(&format!(
        "{} {} {} {} {}",
        mr.key(),
        dev.as_ptr() as u64,
        d.by_dmabuf,
        d.staged,
        d.why_staged.unwrap_or_default()
    ));
    loop {
        let line = listen();
        match line.split(' ').collect::<Vec<_>>()[..] {
            ["bye"] => break,
            ["look", seed] => {
                let seed = seed.parse().unwrap();
                assert!(
                    from_device(&dev, len) == pattern(len, seed),
                    "the device memory differs"
                );
                say("ok");
            }
            _ => panic!("child: unknown command {line:?}"),
        }
    }
    drop(mr);
    drop(dev);
}

/// The child's answer to `cuda_window_child`'s first line.
#[cfg(feature = "cuda")]
struct CudaWindow {
    key: u64,
    base: u64,
    by_dmabuf: u64,
    staged: u64,
    why: String,
}

#[cfg(feature = "cuda")]
fn cuda_window_of(child: &mut Peer) -> CudaWindow {
    let line = child.hear();
    let w: Vec<&str> = line.splitn(5, ' ').collect();
    let num = |i: usize| w[i].parse::<u64>().unwrap_or_else(|_| panic!("{line}"));
    CudaWindow {
        key: num(0),
        base: num(1),
        by_dmabuf: num(2),
        staged: num(3),
        why: w.get(4).unwrap_or(&"").to_string(),
    }
}

/// CUDA memory in a verbs domain with the NIC's keys: registered by dma-buf where CUDA exports
/// one and the device takes it, otherwise staged (the engine reaches it) with the reason
/// kept (`verbs::device_memory`). The child runs on the CUDA test double; where the VM's
/// kernel has vgem, the double's device memory is vgem dumb buffers and it exports their
/// dma-bufs (real ones), which rxe refuses (`ibv_reg_dmabuf_mr`: EOPNOTSUPP, no dma-buf
/// support in rxe); without vgem the double refuses to export (CUDA_ERROR_NOT_SUPPORTED). Either
/// way the region still works, staged: an RMA write through the engine lands in the device
/// memory, contents checked.
#[cfg(feature = "cuda")]
#[test]
fn vm_cuda_memory_by_dmabuf_or_staged_with_the_reason() {
    const T: &str = "vm_cuda_memory_by_dmabuf_or_staged_with_the_reason";
    const LEN: usize = 256 << 10;
    if skip() {
        return;
    }
    if role().is_some() {
        return cuda_window_child(LEN);
    }
    // vgem: a DRM device that makes dumb buffers, whose dma-bufs the double hands out.
    let loaded = Command::new("modprobe").arg("vgem").status();
    let card = (0..4)
        .map(|i| format!("/dev/dri/card{i}"))
        .find(|p| std::path::Path::new(p).exists());
    eprintln!("modprobe vgem: {loaded:?}; DRM device: {card:?}");
    let mut env = common::cuda_double::double_env();
    if let Some(c) = &card {
        env.push(("CUDA_DOUBLE_DMABUF", c.clone()));
    }
    let envs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut child = spawn(T, "child", &envs);
    let n = nic_node(FI_MSG | FI_RMA);
    let c = connect(&mut child, &n);
    let w = cuda_window_of(&mut child);
    eprintln!("CUDA memory staged because: {}", w.why);
    assert_eq!((w.by_dmabuf, w.staged), (0, 1), "{}", w.why);
    if card.is_some() {
        assert!(
            w.why
                .starts_with("rxe0 refused the dma-buf: verbs: ibv_reg_dmabuf_mr")
                && w.why.contains("os error 95"),
            "{}",
            w.why
        );
    } else {
        assert!(
            w.why.starts_with("CUDA exports no dma-buf for it")
                && w.why.contains("CUDA_ERROR_NOT_SUPPORTED"),
            "{}",
            w.why
        );
    }
    // Staged: the target's engine writes it (not the NIC).
    let data = pattern(LEN, 9);
    let before = xfabric_providers::verbs::native_counts();
    // SAFETY: `data` outlives the completion.
    unsafe { n.ep.write(&data, None, c, w.base, w.key, 1) }.unwrap();
    assert_eq!(n.wait_one().op_context, 1);
    let after = xfabric_providers::verbs::native_counts();
    assert_eq!(after.done, before.done, "the write went through the engine");
    child.tell("look 9");
    assert_eq!(child.hear(), "ok");
    child.tell("bye");
    child.join();
}

/// On a machine with an NVIDIA GPU whose driver exports dma-bufs and an RDMA NIC that takes
/// them: CUDA memory registered by dma-buf, then written and read back by the peer's NIC
/// (RDMA write and read straight into and out of device memory), contents checked through
/// CUDA. Run with `XFABRIC_GPU_TESTS=1 cargo test --test verbs_vm -- --ignored gpu_`.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU with dma-buf support (CUDA 11.7+, open kernel modules) and an \
            RDMA NIC: neither exists on these machines or in the Soft-RoCE VM"]
fn gpu_cuda_memory_by_dmabuf_through_the_nic() {
    const T: &str = "gpu_cuda_memory_by_dmabuf_through_the_nic";
    const LEN: usize = 4 << 20;
    if role().is_some() {
        return cuda_window_child(LEN);
    }
    if std::env::var(common::cuda_double::GPU_ENV).as_deref() != Ok("1") {
        eprintln!("skipped: set XFABRIC_GPU_TESTS=1 on a machine with a GPU and an RDMA NIC");
        return;
    }
    let mut child = spawn(T, "child", &[]);
    let n = nic_node(FI_MSG | FI_RMA);
    let c = connect(&mut child, &n);
    let w = cuda_window_of(&mut child);
    assert_eq!((w.by_dmabuf, w.staged), (1, 0), "staged: {}", w.why);
    let data = pattern(LEN, 12);
    let mut back = vec![0u8; LEN];
    // SAFETY: both outlive their regions and the completions awaited.
    let mrs = unsafe {
        [
            n.domain.mr_reg(&data, FI_WRITE, 0, 1).unwrap(),
            n.domain.mr_reg(&back, FI_READ, 0, 2).unwrap(),
        ]
    };
    let before = xfabric_providers::verbs::native_counts();
    // SAFETY: as above.
    unsafe { n.ep.write(&data, None, c, w.base, w.key, 1) }.unwrap();
    n.wait_one();
    child.tell("look 12");
    assert_eq!(child.hear(), "ok");
    // SAFETY: as above.
    unsafe { n.ep.read(&mut back, None, c, w.base, w.key, 2) }.unwrap();
    n.wait_one();
    assert!(back == data, "the read from device memory differs");
    let after = xfabric_providers::verbs::native_counts();
    assert_eq!(after.done - before.done, 2, "both by the NIC");
    drop(mrs);
    child.tell("bye");
    child.join();
}
