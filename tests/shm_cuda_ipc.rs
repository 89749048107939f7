//! CUDA IPC over shm between real processes: a large send from CUDA device memory is offered
//! unstaged, the receiver opens the sender's allocation (cuIpcOpenMemHandle) and copies it
//! with cuMemcpyAsync, device to device into a device receive (skipping its host bounce) or
//! device to host, the copy's event polled by progress. Checked here: the data, the opened
//! handle cached per (peer, allocation) across messages, a stale handle (the allocation freed
//! and another made, at the same address where the allocator gives it) never served from the
//! old mapping, small messages staged (below XFABRIC_SHM_IPC_MIN), a receiver whose driver
//! refuses IPC (the messages go staged, counted), and a sender killed while the receiver
//! holds its allocation open (the peer is lost, the mapping closed).
//!
//! The same for virtual-memory-management allocations (cuMemCreate, mapped into a reserved
//! range; no legacy IPC handle): the sender exports the allocation as a file descriptor
//! (cuMemExportToShareableHandle), passes it over the receiver's descriptor socket
//! (SCM_RIGHTS, the receiver checking the connection's SO_PEERCRED pid), and the receiver
//! imports and maps it (cuMemImportFromShareableHandle, reserve, map, set access): cached,
//! stale, refused and killed as above, plus memory that cannot be exported that way (not
//! created shareable, a driver without the POSIX descriptor handle type) going staged,
//! counted on the sender.
//!
//! CUDA here is the TEST DOUBLE of libcuda (hmem/tests/doubles/cuda_double.c: device memory is
//! a memfd per allocation, an IPC handle names it through /proc/<pid>/fd with the allocation's
//! id, asynchronous copies land when their event is polled complete). Processes that load it
//! are children started with the double first on LD_LIBRARY_PATH. The same roles run on a real
//! GPU with `XFABRIC_GPU_TESTS=1` (ignored with the reason otherwise); the double's own
//! counters are skipped there.

#![cfg(feature = "cuda")]

mod common;

use common::cuda_double::*;
use common::*;
use xfabric::*;
use xfabric_core::hmem_stage::offer_counts;
use xfabric_core::rdm::wire::{self, Frame};
use xfabric_core::rdm::Desc;
use xfabric_hmem::{Iface, IpcHandle};
use xfabric_providers::shm::raw::{ipc_counts, ipc_desc, RawPeer, FRAME, PIECE, PIECE_LEN};

const CAPS: u64 = FI_MSG | FI_HMEM;
/// Which memory the sender sends from: `legacy` (cuMemAlloc), `vmm` (cuMemCreate, exportable
/// as a descriptor), `vmm-plain` (cuMemCreate, not exportable). The receiver is told.
const MEM_ENV: &str = "XFABRIC_TEST_CUDA_MEM";

/// The device both sides allocate on (0 unless set; the receiver inherits it).
const DEVICE_ENV: &str = "XFABRIC_TEST_CUDA_DEVICE";

fn device() -> u64 {
    std::env::var(DEVICE_ENV).map_or(0, |v| v.parse().expect(DEVICE_ENV))
}

/// Device memory of the kind `mem` names, on `device()`.
fn alloc(mem: &str, len: usize) -> xfabric::hmem::DeviceBuffer {
    let d = device();
    match mem {
        "vmm" => cuda().alloc_device_vmm(d, len, true).unwrap(),
        "vmm-plain" => cuda().alloc_device_vmm(d, len, false).unwrap(),
        _ => cuda().alloc_device(d, len).unwrap(),
    }
}

fn mem() -> String {
    std::env::var(MEM_ENV).unwrap_or_else(|_| "legacy".into())
}

/// Whether the sender's memory cannot be exported as a descriptor: not created so, or (the
/// double's switch, which the receiver inherits) a driver without the handle type.
fn unexportable(mem: &str) -> bool {
    mem == "vmm-plain"
        || (mem == "vmm" && std::env::var("CUDA_DOUBLE_VMM_NO_FD").is_ok_and(|v| v == "1"))
}
const BIG: usize = 1 << 20;
const SMALL: usize = 1000;
/// VMM offers from as many allocations sent before the receiver looks: more than the 16
/// descriptors it holds per peer (`fdpass::PER_PID_MAX`).
const BURST: u64 = 20;
const HELD_PER_PEER: u64 = 16;

/// A view of `len` bytes of device memory at `p`, only to hand to the endpoint.
///
/// # Safety
/// `p` is a device allocation of at least `len` bytes that outlives every operation posted
/// with the view; the host never reads or writes the view as a slice.
unsafe fn dev_view<'a>(p: *mut u8, len: usize) -> &'a mut [u8] {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(p, len) }
}

/// Descriptors of the double's VMM allocations this process holds open (0 on a real driver,
/// whose descriptors are not named so).
fn held_vmm_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy().starts_with("/memfd:cuda-double-vmm-"))
                .count()
        })
        .unwrap_or(0)
}

/// Receives messages from the initiator and checks how each came.
fn receiver() {
    let n = node(CAPS, Progress::Manual);
    let peer = connect_parent(&n);
    let refused = std::env::var("CUDA_DOUBLE_IPC_REFUSE").is_ok_and(|v| v == "1");
    let mem = mem();
    let vmm = mem.starts_with("vmm");
    let rx = cuda()
        .alloc_device(device(), BIG)
        .expect("device receive buffer");
    let mut taken = ipc_counts().taken;
    // Descriptors taken from the sender since the last look (one per VMM offer).
    let mut passed = move || {
        let now = ipc_counts().taken;
        std::mem::replace(&mut taken, now).abs_diff(now)
    };
    let got = |seed: u64, len: usize, into_device: bool| {
        let before = ipc_counts();
        let mut host = vec![0u8; len];
        if into_device {
            to_device(&rx, &vec![0u8; len]);
            // SAFETY: `rx` outlives the completion awaited below.
            unsafe { n.ep.recv(dev_view(rx.as_ptr(), len), None, peer, 7) }.unwrap();
        } else {
            // SAFETY: `host` outlives the completion awaited below.
            unsafe { n.ep.recv(&mut host, None, peer, 7) }.unwrap();
        }
        let c = n.wait_one();
        assert_eq!((c.op_context, c.len), (7, len));
        let data = if into_device {
            from_device(&rx, len)
        } else {
            host
        };
        assert!(data == pattern(len, seed), "message {seed} differs");
        let after = ipc_counts();
        (
            after.copies - before.copies,
            after.direct - before.direct,
            after.opens - before.opens,
            after.stale - before.stale,
            after.refused - before.refused,
        )
    };
    if refused {
        // The driver will not open the handle: the first message is refused and staged by
        // its sender; the engine then asks that peer for no more copies (no second refusal).
        assert_eq!(got(1, BIG, true), (0, 0, 0, 0, 1));
        assert_eq!(got(2, BIG, false), (0, 0, 0, 0, 0));
        if vmm {
            // A VMM allocation's descriptor came with both offers (the refusal answered Cts,
            // so the sender passed it again): the first's was taken by the copy (whose import
            // the driver refused); the second's, never used (no more
            // copies are asked of that peer), is closed unread by progress's sweep rather
            // than left queued or kept: nothing here holds the peer's allocation.
            let deadline = std::time::Instant::now() + completion_bound();
            let mut seen = passed();
            assert_eq!(seen, 1, "the refused copy took the first");
            loop {
                n.ep.progress();
                seen += passed();
                // (The process's count: this peer is its only one.)
                let gone = ipc_counts().fd_discarded;
                if seen == 1 && gone == 1 && held_vmm_fds() == 0 {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the peer's descriptors: {seen} taken, {gone} discarded, {} still held",
                    held_vmm_fds()
                );
                std::thread::yield_now();
            }
        }
        say("received");
        assert_eq!(listen(), "done");
        return;
    }
    if unexportable(&mem) {
        // Never offered (the sender could not export the memory): staged, nothing refused,
        // nothing passed.
        assert_eq!(got(1, BIG, true), (0, 0, 0, 0, 0));
        assert_eq!(got(2, BIG, false), (0, 0, 0, 0, 0));
        assert_eq!(passed(), 0);
        say("received");
        assert_eq!(listen(), "done");
        return;
    }
    // Three messages from one allocation: opened once, device to device.
    assert_eq!(got(1, BIG, true), (1, 1, 1, 0, 0));
    assert_eq!(got(2, BIG, true), (1, 1, 0, 0, 0));
    // Device to host, from the cached mapping.
    assert_eq!(got(3, BIG, false), (1, 0, 0, 0, 0));
    // Small: staged, no IPC.
    assert_eq!(got(4, SMALL, true), (0, 0, 0, 0, 0));
    // A VMM allocation's descriptor came with its first offer only (the sender knows it
    // passed it); nothing was refused on the descriptor socket.
    assert_eq!(passed(), u64::from(vmm));
    assert_eq!(ipc_counts().fd_refused, 0);
    say("phase1");
    // The sender freed its allocation and made another; same address or not, the new one is
    // opened and the old mapping never serves it.
    let same = listen() == "same";
    let (copies, direct, opens, stale, _) = got(5, BIG, true);
    assert_eq!((copies, direct, opens), (1, 1, 1));
    assert_eq!(
        stale,
        u64::from(same),
        "a stale mapping closed where the address repeats"
    );
    assert!(offer_counts().direct >= 3);
    assert_eq!(passed(), u64::from(vmm));
    if vmm {
        // A burst of offers from more allocations than the descriptors held per peer, all
        // queued before this side looks: the oldest descriptors close under the bound, their
        // messages go staged (declined), the rest are copied, nothing is refused, and copies
        // with the peer go on (a refusal would have ended them for good).
        say("burst");
        assert_eq!(listen(), "sent");
        let before = ipc_counts();
        for seed in 0..BURST {
            got(100 + seed, BIG, false);
        }
        let after = ipc_counts();
        assert_eq!(
            (
                after.declined - before.declined,
                after.copies - before.copies,
                after.refused - before.refused
            ),
            (BURST - HELD_PER_PEER, HELD_PER_PEER, 0)
        );
        say("again");
        let (copies, _, opens, _, refused) = got(200, BIG, false);
        assert_eq!((copies, opens, refused), (1, 1, 0));
        passed();
        // A burst allocation whose offer was declined: its sender was told (the Cts) and
        // passes its descriptor again. Then the phase-1 allocation, whose mapping the
        // burst evicted from the cache: its sender, which passed it before, passes nothing;
        // that offer is declined (staged), and the next passes it again and is copied.
        say("evicted");
        let declined = || ipc_counts().declined;
        let d0 = declined();
        assert_eq!(got(300, BIG, false), (1, 0, 1, 0, 0));
        assert_eq!((passed(), declined() - d0), (1, 0));
        assert_eq!(got(301, BIG, false), (0, 0, 0, 0, 0));
        assert_eq!((passed(), declined() - d0), (0, 1));
        assert_eq!(got(302, BIG, false), (1, 0, 1, 0, 0));
        assert_eq!((passed(), declined() - d0), (1, 1));
    }
    say("received");
    assert_eq!(listen(), "done");
}

/// Sends the messages `receiver` expects from device memory.
fn sender(test: &str, child_env: &[(&str, &str)]) {
    let n = node(CAPS, Progress::Manual);
    let mem = mem();
    let mut env = child_env.to_vec();
    env.push((MEM_ENV, &mem));
    let mut child = spawn(test, "receiver", &env);
    let peer = connect(&mut child, &n);
    let refused = child_env.contains(&("CUDA_DOUBLE_IPC_REFUSE", "1"));
    let mut src = alloc(&mem, BIG);
    let before = offer_counts();
    let ipc_before = ipc_counts();
    let send = |src: &xfabric::hmem::DeviceBuffer, seed: u64, len: usize| {
        to_device(src, &pattern(len, seed));
        // SAFETY: `src` outlives the completion awaited below.
        unsafe { n.ep.send(dev_view(src.as_ptr(), len), None, peer, 3) }.unwrap();
        assert_eq!(n.wait_one().op_context, 3);
    };
    if refused {
        send(&src, 1, BIG);
        send(&src, 2, BIG);
        assert_eq!(child.hear(), "received");
        let c = offer_counts();
        assert_eq!(
            (c.offered - before.offered, c.staged - before.staged),
            (2, 2)
        );
        // The sender still offers (and passes a VMM allocation's descriptor) each time; the
        // receiver, which copies no more from it, closes the second one unread.
        let i = ipc_counts();
        assert_eq!(i.passed - ipc_before.passed, 2 * u64::from(mem == "vmm"));
    } else if unexportable(&mem) {
        // Not exportable as a descriptor (not created so, or the driver lacks the handle
        // type): not offered, staged, counted here.
        send(&src, 1, BIG);
        send(&src, 2, BIG);
        assert_eq!(child.hear(), "received");
        let c = offer_counts();
        assert_eq!(c.staged - before.staged, 2);
        let i = ipc_counts();
        assert_eq!(
            (
                i.passed - ipc_before.passed,
                i.unexported - ipc_before.unexported
            ),
            (0, 2)
        );
    } else {
        for (seed, len) in [(1, BIG), (2, BIG), (3, BIG), (4, SMALL)] {
            send(&src, seed, len);
        }
        assert_eq!(child.hear(), "phase1");
        let old = src.addr();
        drop(src);
        src = alloc(&mem, BIG);
        child.tell(if src.addr() == old { "same" } else { "moved" });
        send(&src, 5, BIG);
        let vmm = u64::from(mem == "vmm");
        if vmm == 1 {
            // The burst: every send posted before the receiver looks, from its own allocation.
            assert_eq!(child.hear(), "burst");
            let bufs: Vec<_> = (0..BURST).map(|_| alloc(&mem, BIG)).collect();
            for (seed, b) in (100..).zip(&bufs) {
                to_device(b, &pattern(BIG, seed));
                // SAFETY: `b` outlives the completions awaited below.
                unsafe { n.ep.send(dev_view(b.as_ptr(), BIG), None, peer, 3) }.unwrap();
            }
            child.tell("sent");
            for _ in 0..BURST {
                assert_eq!(n.wait_one().op_context, 3);
            }
            assert_eq!(child.hear(), "again");
            let b = alloc(&mem, BIG);
            send(&b, 200, BIG);
            assert_eq!(child.hear(), "evicted");
            send(&bufs[0], 300, BIG);
            send(&src, 301, BIG);
            send(&src, 302, BIG);
            drop(bufs);
        }
        assert_eq!(child.hear(), "received");
        let c = offer_counts();
        // The burst, the allocation after it, and the three sends after the eviction.
        let later = (BURST + 4) * vmm;
        assert_eq!(
            (c.offered - before.offered, c.staged - before.staged),
            (4 + later, (BURST - HELD_PER_PEER + 1) * vmm)
        );
        // Passed: each allocation once (phase 1's two, the burst's, the one after it), then
        // again after a decline (bufs[0], src); not passed: the second and third sends of
        // phase 1's first allocation, and src's first send after the eviction.
        let i = ipc_counts();
        assert_eq!(
            (
                i.passed - ipc_before.passed,
                i.not_repassed - ipc_before.not_repassed,
                i.unexported - ipc_before.unexported
            ),
            ((BURST + 5) * vmm, 3 * vmm, 0)
        );
    }
    child.tell("done");
    child.join_leaving_nothing();
    drop(src);
    assert!(cuda().take_drop_errors().is_empty());
}

/// Receives one message by IPC, then kills its sender while holding the mapping open.
fn killer(test: &str) {
    let n = node(CAPS, Progress::Manual);
    let mem = mem();
    let mut child = spawn(test, "victim", &[(MEM_ENV, &mem)]);
    let peer = connect(&mut child, &n);
    let rx = cuda().alloc_device(0, BIG).unwrap();
    // What is live before the peer's allocation is opened: all of that opening made
    // (a VMM one: the imported allocation, the reservation, the mapping) goes with the peer.
    let unopened = double_counter("cuda_double_live");
    // SAFETY: `rx` outlives the completion awaited below.
    unsafe { n.ep.recv(dev_view(rx.as_ptr(), BIG), None, peer, 9) }.unwrap();
    assert_eq!(n.wait_one().op_context, 9);
    assert!(from_device(&rx, BIG) == pattern(BIG, 9));
    assert_eq!(ipc_counts().opens, 1);
    assert_eq!(ipc_counts().taken, u64::from(mem == "vmm"));
    let live = double_counter("cuda_double_live");
    let pid = child.pid();
    child.kill();
    // The peer is found gone by progress's sweep, and its mapping closed with it.
    let deadline = std::time::Instant::now() + completion_bound();
    while std::time::Instant::now() < deadline {
        n.ep.progress();
        if double_counter("cuda_double_live") != live {
            break;
        }
        std::thread::yield_now();
    }
    if let Some(live) = live {
        assert_eq!(
            double_counter("cuda_double_live"),
            unopened,
            "the dead peer's mapping is closed"
        );
        assert!(unopened < Some(live));
    }
    reclaim(pid);
}

/// Sends one message from device memory, then waits to be killed.
fn victim() {
    let n = node(CAPS, Progress::Manual);
    let peer = connect_parent(&n);
    let src = alloc(&mem(), BIG);
    to_device(&src, &pattern(BIG, 9));
    // SAFETY: `src` outlives the completion awaited below.
    unsafe { n.ep.send(dev_view(src.as_ptr(), BIG), None, peer, 1) }.unwrap();
    assert_eq!(n.wait_one().op_context, 1);
    // Killed here by the receiver; bounded should it never come.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        n.ep.progress();
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    panic!("never killed");
}

/// pidfds this process holds open.
fn pidfds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| l.to_string_lossy().contains("pidfd"))
                .count()
        })
        .unwrap_or(0)
}

/// Peers that connect and go, one after another, to an endpoint that keeps a pidfd per peer it
/// verified (CUDA IPC's descriptor passing): each one's pidfd is closed with its segment once
/// it is gone, so the endpoint does not keep a descriptor per peer that ever came.
fn pidfd_churn() {
    let n = node(CAPS, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    const PEERS: usize = 40;
    let before = pidfds();
    let mut names = Vec::new();
    for i in 0..PEERS {
        let raw = RawPeer::connect(&addr, None).expect("raw peer");
        names.push(raw.name().to_string());
        let _ = n.cq.read(&mut [CqTaggedEntry::default(); 1]);
        if i == 0 {
            assert!(
                pidfds() > before,
                "the endpoint keeps no pidfd: nothing to test"
            );
        }
        drop(raw);
    }
    let mapped = || {
        std::fs::read_to_string("/proc/self/maps")
            .expect("/proc/self/maps")
            .lines()
            .filter(|l| names.iter().any(|n| l.contains(&format!("/dev/shm/{n}"))))
            .count()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while mapped() > 0 || pidfds() > before {
        let _ = n.cq.read(&mut [CqTaggedEntry::default(); 1]);
        assert!(
            std::time::Instant::now() < deadline,
            "{} segments and {} pidfds of gone peers kept",
            mapped(),
            pidfds() - before
        );
    }
}

fn run_roles(test: &str) -> bool {
    match role().as_deref() {
        Some("pidfd-churn") => pidfd_churn(),
        Some("sender") => sender(test, &[]),
        Some("refused-sender") => sender(test, &[("CUDA_DOUBLE_IPC_REFUSE", "1")]),
        Some("receiver") => receiver(),
        Some("killer") => killer(test),
        Some("victim") => {
            victim();
            return true;
        }
        Some(r) => panic!("unknown role {r}"),
        None => return false,
    }
    say("OK");
    true
}

fn skip_not_shm() -> bool {
    if test_provider() != "shm" {
        eprintln!("skipped: CUDA IPC is shm's");
        return true;
    }
    false
}

#[test]
fn cuda_double_ipc_device_to_device_cached_and_stale() {
    const NAME: &str = "cuda_double_ipc_device_to_device_cached_and_stale";
    if run_roles(NAME) || skip_not_shm() {
        return;
    }
    run_child(NAME, "sender", &double_env(), &[]);
}

#[test]
fn cuda_double_gone_peers_pidfds_are_closed() {
    const NAME: &str = "cuda_double_gone_peers_pidfds_are_closed";
    if run_roles(NAME) || skip_not_shm() {
        return;
    }
    run_child(NAME, "pidfd-churn", &double_env(), &[]);
}

#[test]
fn cuda_double_ipc_refused_goes_staged() {
    const NAME: &str = "cuda_double_ipc_refused_goes_staged";
    if run_roles(NAME) || skip_not_shm() {
        return;
    }
    run_child(NAME, "refused-sender", &double_env(), &[]);
}

#[test]
fn cuda_double_ipc_peer_killed_with_handle_open() {
    const NAME: &str = "cuda_double_ipc_peer_killed_with_handle_open";
    if run_roles(NAME) || skip_not_shm() {
        return;
    }
    run_child(NAME, "killer", &double_env(), &[]);
}

#[test]
fn cuda_double_vmm_fd_passed_cached_and_stale() {
    const NAME: &str = "cuda_double_vmm_fd_passed_cached_and_stale";
    if run_roles(NAME) || skip_not_shm() {
        return;
    }
    run_child(NAME, "sender", &double_env(), &[(MEM_ENV, "vmm")]);
}

#[test]
fn cuda_double_vmm_import_refused_goes_staged() {
    const NAME: &str = "cuda_double_vmm_import_refused_goes_staged";
    if run_roles(NAME) || skip_not_shm() {
        return;
    }
    run_child(NAME, "refused-sender", &double_env(), &[(MEM_ENV, "vmm")]);
}

#[test]
fn cuda_double_vmm_not_exportable_goes_staged() {
    const NAME: &str = "cuda_double_vmm_not_exportable_goes_staged";
    if run_roles(NAME) || skip_not_shm() {
        return;
    }
    // An allocation not created with the POSIX descriptor handle type ...
    run_child(NAME, "sender", &double_env(), &[(MEM_ENV, "vmm-plain")]);
    // ... and a driver whose device lacks it.
    run_child(
        NAME,
        "sender",
        &double_env(),
        &[(MEM_ENV, "vmm"), ("CUDA_DOUBLE_VMM_NO_FD", "1")],
    );
}

/// Both sides on the second device of GPUs that cannot reach each other's memory: the handle
/// is opened, and the copy made, on the receive's device (the sender's for a receive into
/// host memory), never on the first device, whose copy would fail.
#[test]
fn cuda_double_ipc_on_the_receives_device_without_peer_access() {
    const NAME: &str = "cuda_double_ipc_on_the_receives_device_without_peer_access";
    if run_roles(NAME) || skip_not_shm() {
        return;
    }
    for mem in ["legacy", "vmm"] {
        run_child(
            NAME,
            "sender",
            &double_env(),
            &[
                (MEM_ENV, mem),
                (DEVICE_ENV, "1"),
                ("CUDA_DOUBLE_NO_PEER", "1"),
            ],
        );
    }
}

#[test]
fn cuda_double_vmm_peer_killed_with_mapping_open() {
    const NAME: &str = "cuda_double_vmm_peer_killed_with_mapping_open";
    if run_roles(NAME) || skip_not_shm() {
        return;
    }
    run_child(NAME, "killer", &double_env(), &[(MEM_ENV, "vmm")]);
}

#[test]
#[cfg_attr(
    not(xfabric_gpu_tests),
    ignore = "needs an NVIDIA GPU: run with XFABRIC_GPU_TESTS=1 cargo test (the CUDA double \
              variants run everywhere)"
)]
fn gpu_cuda_vmm_ipc() {
    const NAME: &str = "gpu_cuda_vmm_ipc";
    if run_roles(NAME) || skip_not_shm() {
        return;
    }
    run_child(NAME, "sender", &[], &[(MEM_ENV, "vmm")]);
}

#[test]
#[cfg_attr(
    not(xfabric_gpu_tests),
    ignore = "needs an NVIDIA GPU: run with XFABRIC_GPU_TESTS=1 cargo test (the CUDA double \
              variants run everywhere)"
)]
fn gpu_cuda_ipc() {
    const NAME: &str = "gpu_cuda_ipc";
    if run_roles(NAME) || skip_not_shm() {
        return;
    }
    run_child(NAME, "sender", &[], &[]);
}

/// Waits (bounded) for a frame from the endpoint that `want` accepts, reading the CQ
/// meanwhile (which drives progress).
fn await_frame(n: &Node, raw: &mut RawPeer, want: impl Fn(&Frame) -> bool) -> Frame {
    let start = std::time::Instant::now();
    let mut buf = [CqTaggedEntry::default(); 4];
    loop {
        let _ = n.cq.read(&mut buf);
        while let Some((k, b)) = raw.recv_raw() {
            let Ok(pre) = wire::prefix(&b) else { continue };
            let end = wire::PREFIX + pre.ctrl_len as usize;
            match wire::decode(&pre, &b[wire::PREFIX..end]) {
                Ok(f) if k == FRAME && want(&f) => return f,
                _ => {}
            }
        }
        assert!(start.elapsed() < BOUND, "no such frame came");
    }
}

/// A well-formed CUDA IPC handle naming this very process (where the raw peers live): never
/// opened here, whatever the driver would say.
fn this_process_handle() -> IpcHandle {
    IpcHandle {
        iface: Iface::Cuda,
        pid: std::process::id(),
        device: 0,
        alloc_id: 7,
        base: 0x7000_0000,
        alloc_len: 1 << 20,
        offset: 0,
        raw: [9; 64],
    }
}

#[test]
fn forged_cuda_descriptors_are_refused_and_the_data_comes_through_frames() {
    if role().is_some() || skip_not_shm() {
        return;
    }
    // The only test of this binary whose endpoints run in this process (the others run
    // theirs in children): the IPC counters are this test's. No CUDA is needed: whether
    // or not a driver is here, nothing forged may be opened. (A handle that is well formed
    // and the peer's but does not open: `cuda_double_ipc_refused_goes_staged`.)
    const LEN: usize = 40_000;
    let n = node(FI_MSG | FI_TAGGED, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let good = this_process_handle();
    let mut past_end = ipc_desc(&good, 1 << 20).as_bytes().to_vec();
    past_end[1 + 40..1 + 48].copy_from_slice(&4096u64.to_le_bytes()); // offset 4096
    let mut garbage = ipc_desc(&good, LEN).as_bytes().to_vec();
    garbage[1] ^= 0xff;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("does not parse", garbage),
        ("runs past its allocation", past_end),
        (
            "names another process",
            ipc_desc(
                &IpcHandle {
                    pid: std::process::id() + 1,
                    ..good.clone()
                },
                LEN,
            )
            .as_bytes()
            .to_vec(),
        ),
        (
            "has no allocation id",
            ipc_desc(
                &IpcHandle {
                    alloc_id: 0,
                    ..good.clone()
                },
                LEN,
            )
            .as_bytes()
            .to_vec(),
        ),
        (
            "is not a CUDA handle",
            ipc_desc(
                &IpcHandle {
                    iface: Iface::System,
                    ..good.clone()
                },
                LEN,
            )
            .as_bytes()
            .to_vec(),
        ),
        // Well formed, but naming this very process (the raw peer lives here): never taken
        // as an address here, whatever the driver would say.
        (
            "names this very process",
            ipc_desc(&good, LEN).as_bytes().to_vec(),
        ),
    ];
    let before = ipc_counts();
    for (i, (what, desc)) in cases.iter().enumerate() {
        // A fresh peer each time: after a refusal the engine asks no more copies of a peer.
        let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
        let src = n.add_peer(format!("fi_shm://{}", raw.name()).as_bytes());
        let tag = i as u64 + 1;
        let mut buf = vec![0u8; LEN];
        // SAFETY: `buf` outlives the receive's completion, awaited below.
        n.retry(|| unsafe { n.ep.trecv(&mut buf, None, src, tag, 0, tag as Context) });
        let rts = Frame::Rts {
            id: 1,
            tag,
            data: 0,
            len: LEN as u64,
            flags: wire::flags::TAGGED,
            desc: Desc::new(desc).unwrap(),
        };
        assert!(raw.send_raw(FRAME, rts.ctrl(0).as_bytes(), 0), "ring full");
        let Frame::Cts { rx, .. } =
            await_frame(&n, &mut raw, |f| matches!(f, Frame::Cts { id: 1, .. }))
        else {
            unreachable!()
        };
        let body = pattern(LEN, tag);
        let ctrl = Frame::Data { rx }.ctrl(LEN as u64);
        let mut first = ctrl.as_bytes().to_vec();
        first.extend_from_slice(&body[..PIECE_LEN]);
        assert!(raw.send_raw(FRAME, &first, 0));
        for chunk in body[PIECE_LEN..].chunks(PIECE_LEN) {
            assert!(raw.send_raw(PIECE, chunk, 0));
        }
        let e = n.wait_one();
        assert_eq!((e.op_context, e.len), (tag as Context, LEN), "{what}");
        assert!(buf == body, "{what}: bytes");
        let c = ipc_counts();
        assert_eq!(
            (c.refused - before.refused, c.opens - before.opens),
            (tag, 0),
            "a descriptor that {what} is refused, never opened"
        );
    }
    assert_eq!(ipc_counts().copies, before.copies);
}

/// A peer's RMA write whose data it describes as a device allocation of its own (a CUDA IPC
/// handle) is refused at once: honest initiators stage RMA through host memory, and a device
/// copy into a registered region could not be stopped by the region's close. The write fails
/// (`FI_EINVAL` in its answer), nothing is opened, the window is untouched. No CUDA is needed:
/// the handle is refused for what it is before anything would open it. Before, the copy was
/// tried, refused as the handle's own, and the target asked for the data by frames.
#[test]
fn an_rma_write_from_a_device_handle_is_refused() {
    if role().is_some() || skip_not_shm() {
        return;
    }
    const LEN: usize = 40_000;
    let n = node(FI_MSG | FI_RMA | FI_REMOTE_WRITE, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let window = vec![0u8; LEN];
    // SAFETY: window outlives the registration (dropped below, before it).
    let mr = unsafe { n.domain.mr_reg(&window, FI_REMOTE_WRITE, 0, 6) }.expect("mr_reg");
    let base = if n.info.domain_attr.mr_mode & FI_MR_VIRT_ADDR != 0 {
        window.as_ptr() as u64
    } else {
        0
    };
    let handle = this_process_handle();
    let segs = xfabric_core::RmaIovList::from_segs(&[xfabric_core::RmaIov {
        addr: base,
        len: LEN,
        key: mr.key(),
    }])
    .expect("one range");
    let f = Frame::Write {
        id: 5,
        data: 0,
        flags: wire::flags::ACK,
        segs,
        desc: Desc::new(ipc_desc(&handle, LEN).as_bytes()).unwrap(),
    };
    let before = ipc_counts();
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    assert!(raw.send_raw(FRAME, f.ctrl(0).as_bytes(), 0), "ring full");
    let Frame::Ack { status, .. } =
        await_frame(&n, &mut raw, |f| matches!(f, Frame::Ack { id: 5, .. }))
    else {
        unreachable!()
    };
    assert_eq!(status, xfabric::errno::FI_EINVAL);
    assert!(window.iter().all(|&b| b == 0), "the window changed");
    assert_eq!(ipc_counts().opens, before.opens, "a handle was opened");
    drop(mr);
}
