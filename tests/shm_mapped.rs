//! shm's mapped copy: a message sent from shared host memory (hmem's `alloc_host_mapped` on
//! `FI_HMEM_SYSTEM`, a sealed memfd) is read by the receiver from a mapping of the sender's
//! allocation, below the eager limit too. Checked here between real processes: every byte
//! lands, the mapped path was taken for what it serves and not for the rest (heap memory,
//! short messages, several segments); a sender that dies with its allocation mapped at the
//! receiver leaves no mapping behind and later senders are served as before; and descriptors
//! a hostile peer forges (a handle that does not open, names another process or a sparse file
//! larger than the machine, an address that is not mapped, bytes that do not parse) are served
//! by cross-memory attach, fail the receive cleanly, or go through frames: never a crash.
//!
//! Whether a copy was mapped is read from the process's counters (`mapped_counts`), never
//! timed. Where the kernel forbids cross-memory attach, the peers never verify each other's
//! pid and nothing is mapped: the tests say so and check the bytes alone.

mod common;
use std::time::Instant;

use common::*;
use xfabric::*;
use xfabric_core::rdm::wire::{self, Frame};
use xfabric_hmem::{Hmem, HostMapped, Iface, IpcHandle};
use xfabric_providers::shm::raw::{mapped_counts, mapped_desc, RawPeer, FRAME};

const CAPS: u64 = FI_MSG | FI_TAGGED;
const SMALL: usize = 32 << 10;
const LARGE: usize = 256 << 10;

/// Shared host memory of `len` bytes holding `pattern(len, seed)`.
fn shared(len: usize, seed: u64) -> HostMapped {
    let m = Hmem::global()
        .get(Iface::System)
        .alloc_host_mapped(0, len)
        .expect("alloc_host_mapped");
    // SAFETY: `m` owns `len` bytes, written only here.
    unsafe { std::slice::from_raw_parts_mut(m.as_ptr(), len) }.copy_from_slice(&pattern(len, seed));
    m
}

/// `len` bytes at `off` of `m`.
fn part(m: &HostMapped, off: usize, len: usize) -> &[u8] {
    assert!(off + len <= m.len());
    // SAFETY: inside the allocation, which `m` keeps; nothing writes it while borrowed.
    unsafe { std::slice::from_raw_parts(m.as_ptr().add(off), len) }
}

/// Mappings of other processes' shared allocations in this one (hmem names its memfds).
fn peer_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("memfd:xfabric-hmem") && l.contains(" r--s "))
        .count()
}

/// The messages a sender sends, in order, each `(tag, bytes, mapped)`: whether the receiver
/// should read it from a mapping.
fn messages(m: &HostMapped, heap: &[u8]) -> Vec<(u64, Vec<RawIov>, bool)> {
    let one = |b: &[u8]| vec![RawIov::of(b)];
    vec![
        (1, one(part(m, 0, SMALL)), true),
        (2, one(part(m, SMALL, LARGE)), true),
        // Heap memory has no handle: eager, as before.
        (3, one(heap), false),
        // Below XFABRIC_SHM_MAP_MIN: eager.
        (4, one(part(m, 100, 4096)), false),
        // Two segments: not described as mapped.
        (
            5,
            vec![
                RawIov::of(part(m, 0, SMALL / 2)),
                RawIov::of(part(m, SMALL, SMALL / 2)),
            ],
            false,
        ),
        // The same allocation again: its mapping is cached.
        (6, one(part(m, 4096, SMALL + 5)), true),
    ]
}

fn sender() {
    let n = node(CAPS, Progress::Manual);
    let peer = connect_parent(&n);
    let m = shared(SMALL + LARGE, 1);
    let heap = pattern(SMALL, 2);
    for (tag, iov, _) in messages(&m, &heap) {
        // SAFETY: `m` and `heap` outlive the completion waited for below.
        n.retry(|| unsafe { n.ep.tsendv(&iov, &[], peer, tag, tag as Context) });
        assert_eq!(n.wait_one().op_context, tag as Context);
    }
    say("sent");
    assert_eq!(listen(), "bye");
}

/// Receives one tagged message of at most `len` bytes with `tag` from `src`: its bytes.
fn receive(n: &Node, src: FiAddr, tag: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    // SAFETY: `buf` outlives the completion waited for below.
    n.retry(|| unsafe { n.ep.trecv(&mut buf, None, src, tag, 0, tag as Context) });
    let e = n.wait_one();
    assert_eq!(e.op_context, tag as Context);
    buf.truncate(e.len);
    buf
}

fn receiver() {
    let n = node(CAPS, Progress::Manual);
    let src = connect_parent(&n);
    // What the sender sends, rebuilt here from the same patterns.
    let m = shared(SMALL + LARGE, 1);
    let heap = pattern(SMALL, 2);
    let mut want_mapped = 0;
    for (tag, iov, mapped) in messages(&m, &heap) {
        let want: Vec<u8> = iov
            .iter()
            // SAFETY: the segments are in `m` and `heap`, alive here.
            .flat_map(|s| unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.len) })
            .copied()
            .collect();
        let got = receive(&n, src, tag, LARGE + 100);
        assert!(got == want, "message {tag}: bytes differ");
        want_mapped += u64::from(mapped);
        let c = mapped_counts();
        if c.copies == 0 && tag == 1 {
            eprintln!("cross-memory attach is refused here: nothing is mapped (bytes checked)");
            say("OK");
            assert_eq!(listen(), "bye");
            return;
        }
        assert_eq!(c.copies, want_mapped, "after message {tag}: {c:?}");
    }
    let c = mapped_counts();
    assert_eq!((c.opens, c.fallbacks), (1, 0), "{c:?}");
    assert_eq!(peer_mappings(), 1, "the sender's allocation, mapped once");
    say("OK");
    assert_eq!(listen(), "bye");
}

#[test]
fn mapped_sends_land_every_byte() {
    let t = "mapped_sends_land_every_byte";
    match role().as_deref() {
        Some("recv") => receiver(),
        Some(_) => sender(),
        None => {
            let mut r = spawn(t, "recv", &[]);
            let mut s = spawn(t, "send", &[]);
            s.tell(&r.hear());
            r.tell(&s.hear());
            assert_eq!(r.hear(), "OK");
            assert_eq!(s.hear(), "sent");
            r.tell("bye");
            s.tell("bye");
            r.join_leaving_nothing();
            s.join_leaving_nothing();
        }
    }
}

/// Sender child for `a_dead_senders_mapping_goes`: one mapped message, then killed.
fn doomed_sender(seed: u64) {
    let n = node(CAPS, Progress::Manual);
    let peer = connect_parent(&n);
    let m = shared(SMALL, seed);
    // SAFETY: `m` outlives the completion waited for below.
    n.retry(|| unsafe { n.ep.tsend(part(&m, 0, SMALL), None, peer, seed, 1) });
    n.wait_one();
    say("sent");
    assert_eq!(listen(), "bye");
}

/// Receiver child: takes one message from each of two senders in turn; after the first is
/// killed, drives its endpoint until that sender's mapping is gone.
fn survivor() {
    let n = node(CAPS, Progress::Manual);
    say(&hex(&n.ep.getname().unwrap()));
    for seed in [11, 12] {
        let src = n.add_peer(&unhex(&listen()));
        let got = receive(&n, src, seed, SMALL);
        assert!(got == pattern(SMALL, seed), "sender {seed}: bytes differ");
        let mapped = mapped_counts().copies > 0;
        if mapped {
            assert_eq!(peer_mappings(), 1, "sender {seed}'s allocation mapped");
        }
        say("got");
        if seed == 11 {
            assert_eq!(listen(), "killed");
            // The sweep finds it gone within a progress call or two; its mapping goes then.
            let start = Instant::now();
            let mut buf = [CqTaggedEntry::default(); 1];
            while peer_mappings() != 0 {
                let _ = n.cq.read(&mut buf);
                assert!(start.elapsed() < BOUND, "the dead sender's mapping stayed");
            }
        }
    }
    let c = mapped_counts();
    eprintln!("mapped copies: {c:?}");
    assert!(c.copies == 0 || c.opens == 2, "{c:?}");
    say("OK");
    assert_eq!(listen(), "bye");
}

#[test]
fn a_dead_senders_mapping_goes() {
    let t = "a_dead_senders_mapping_goes";
    match role().as_deref() {
        Some("recv") => survivor(),
        Some(s) => doomed_sender(s.parse().unwrap()),
        None => {
            let mut r = spawn(t, "recv", &[]);
            let raddr = r.hear();
            for seed in ["11", "12"] {
                let mut s = spawn(t, seed, &[]);
                r.tell(&s.hear());
                s.tell(&raddr);
                assert_eq!(s.hear(), "sent");
                assert_eq!(r.hear(), "got");
                if seed == "11" {
                    let pid = s.pid();
                    s.kill();
                    reclaim(pid);
                    r.tell("killed");
                } else {
                    s.tell("bye");
                    s.join_leaving_nothing();
                }
            }
            assert_eq!(r.hear(), "OK");
            r.tell("bye");
            r.join_leaving_nothing();
        }
    }
}

/// Drives `n` until `raw` has a frame from it that decodes as `want` says (bounded).
fn await_frame(n: &Node, raw: &mut RawPeer, want: impl Fn(&Frame) -> bool) -> Frame {
    let start = Instant::now();
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

/// Waits (bounded) for the next completion of either kind.
fn next(n: &Node) -> Result<CqTaggedEntry, CqErrEntry> {
    match n.next() {
        Completion::Ok(e, _) => Ok(e),
        Completion::Err(e, _) => Err(e),
    }
}

#[test]
fn forged_mapped_descriptors_are_served_otherwise_or_fail_cleanly() {
    // The only test of this binary that runs its endpoints in this process: the counters
    // are this test's.
    warnings::capture();
    let n = node(CAPS, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let mut raw = RawPeer::connect(&addr, None).expect("raw peer");
    let src = n.add_peer(format!("fi_shm://{}", raw.name()).as_bytes());
    let data = pattern(SMALL, 21);
    let shared_mem = shared(SMALL, 22);
    let real = Hmem::global()
        .get(Iface::System)
        .ipc_get(shared_mem.as_ptr(), SMALL)
        .expect("ipc_get");
    // A handle naming `data`'s address, whose descriptor is a pipe's: it does not open.
    let (pipe, _w) = std::io::pipe().expect("pipe");
    let pipe_fd = std::os::fd::AsRawFd::as_raw_fd(&pipe);
    let mut raw_id = real.raw;
    raw_id[0..4].copy_from_slice(&pipe_fd.to_le_bytes());
    let at = |addr: *const u8| IpcHandle {
        base: addr as u64,
        alloc_len: SMALL as u64,
        offset: 0,
        ..real.clone()
    };
    let offer = |raw: &mut RawPeer, id: u32, tag: u64, desc: xfabric_core::rdm::Desc| {
        let rts = Frame::Rts {
            id,
            tag,
            data: 0,
            len: SMALL as u64,
            flags: wire::flags::TAGGED,
            desc,
        };
        assert!(raw.send_raw(FRAME, rts.ctrl(0).as_bytes(), 0), "ring full");
    };
    let post = |buf: &mut Vec<u8>, tag: u64| {
        // SAFETY: every buffer outlives its receive's completion, read below.
        n.retry(|| unsafe { n.ep.trecv(buf, None, src, tag, 0, tag as Context) });
    };

    // 1. A handle that does not open (a pipe, not a memfd): the bytes come by cross-memory
    //    attach from the address it names.
    let mut b1 = vec![0u8; SMALL];
    post(&mut b1, 1);
    let h = IpcHandle {
        raw: raw_id,
        ..at(data.as_ptr())
    };
    offer(&mut raw, 1, 1, mapped_desc(&h, SMALL));
    let r = next(&n);
    if mapped_counts().fallbacks == 0 {
        // Nothing was asked of the transport: the peer's pid was never verified.
        eprintln!("cross-memory attach is refused here: no copy is asked for");
        return;
    }
    assert_eq!(r.map(|e| e.len), Ok(SMALL));
    assert!(b1 == data, "1: bytes");
    assert_eq!(warnings::count("handle does not open"), 1);

    // 2. A real allocation's handle, but naming another process: not mapped.
    let mut b2 = vec![0u8; SMALL];
    post(&mut b2, 2);
    let other = IpcHandle {
        pid: real.pid + 1,
        ..at(data.as_ptr())
    };
    offer(&mut raw, 2, 2, mapped_desc(&other, SMALL));
    assert_eq!(next(&n).map(|e| e.len), Ok(SMALL));
    assert!(b2 == data, "2: bytes");

    // 3. An address that is not mapped: the receive fails, nothing else does.
    let mut b3 = vec![0u8; SMALL];
    post(&mut b3, 3);
    offer(&mut raw, 3, 3, mapped_desc(&at(8192 as *const u8), SMALL));
    let e = next(&n).expect_err("a receive from unmapped memory fails");
    assert_eq!(e.op_context, 3);
    assert_ne!(e.err, 0);

    // 4. A descriptor whose handle does not parse: refused, the data comes through frames.
    let mut b4 = vec![0u8; SMALL];
    post(&mut b4, 4);
    let mut garbage = mapped_desc(&at(data.as_ptr()), SMALL).as_bytes().to_vec();
    garbage[1] ^= 0xff;
    offer(
        &mut raw,
        4,
        4,
        xfabric_core::rdm::Desc::new(&garbage).unwrap(),
    );
    let Frame::Cts { rx, .. } =
        await_frame(&n, &mut raw, |f| matches!(f, Frame::Cts { id: 4, .. }))
    else {
        unreachable!()
    };
    let body = pattern(SMALL, 23);
    let ctrl = Frame::Data { rx }.ctrl(SMALL as u64);
    let piece = xfabric_providers::shm::raw::PIECE_LEN;
    let mut first = ctrl.as_bytes().to_vec();
    first.extend_from_slice(&body[..piece]);
    assert!(raw.send_raw(FRAME, &first, 0));
    for chunk in body[piece..].chunks(piece) {
        assert!(raw.send_raw(xfabric_providers::shm::raw::PIECE, chunk, 0));
    }
    assert_eq!(next(&n).map(|e| e.op_context), Ok(4));
    assert!(b4 == body, "4: bytes");

    // 5. A real, sealed file whose size is past the machine's memory and swap (sparse): it
    //    would open, and 16 such per endpoint would take the address space; the bytes come
    //    by cross-memory attach, nothing is mapped.
    //    A peer of its own: the first one's handles no longer open (1.).
    let mut raw5 = RawPeer::connect(&addr, None).expect("raw peer");
    let src5 = n.add_peer(format!("fi_shm://{}", raw5.name()).as_bytes());
    let huge = sparse_sealed(machine_bytes() + 4096);
    let mut b5 = vec![0u8; SMALL];
    // SAFETY: the buffer outlives its receive's completion, read below.
    n.retry(|| unsafe { n.ep.trecv(&mut b5, None, src5, 5, 0, 5 as Context) });
    let h = IpcHandle {
        raw: huge.raw,
        alloc_len: huge.len,
        ..at(data.as_ptr())
    };
    offer(&mut raw5, 5, 5, mapped_desc(&h, SMALL));
    assert_eq!(next(&n).map(|e| e.len), Ok(SMALL));
    assert!(b5 == data, "5: bytes");

    let c = mapped_counts();
    assert_eq!((c.copies, c.opens, c.fallbacks), (0, 0, 5), "{c:?}");
    assert_eq!(peer_mappings(), 0);
}

/// The machine's memory and swap, in bytes.
fn machine_bytes() -> u64 {
    // SAFETY: `sysinfo` fills the zeroed struct it is given.
    let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::sysinfo(&mut si) }, 0);
    (si.totalram as u64 + si.totalswap as u64) * u64::from(si.mem_unit.max(1))
}

/// A memfd of `len` bytes, none written, sealed against shrinking: `raw` is its system
/// handle's file identity.
struct Sparse {
    _fd: std::os::fd::OwnedFd,
    raw: [u8; 64],
    len: u64,
}

fn sparse_sealed(len: u64) -> Sparse {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: a NUL-terminated name; the result is checked.
    let fd =
        unsafe { libc::memfd_create(c"xfabric-test-sparse".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0, "memfd_create");
    // SAFETY: a descriptor just opened, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain calls on our own descriptor.
    unsafe {
        assert_eq!(
            libc::ftruncate(fd.as_raw_fd(), len as libc::off_t),
            0,
            "ftruncate"
        );
        assert_eq!(
            libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK),
            0
        );
    }
    let st = std::fs::File::from(fd.try_clone().unwrap())
        .metadata()
        .unwrap();
    use std::os::unix::fs::MetadataExt;
    let mut raw = [0u8; 64];
    raw[0..4].copy_from_slice(&fd.as_raw_fd().to_le_bytes());
    raw[8..16].copy_from_slice(&st.ino().to_le_bytes());
    raw[16..24].copy_from_slice(&st.dev().to_le_bytes());
    Sparse { _fd: fd, raw, len }
}
