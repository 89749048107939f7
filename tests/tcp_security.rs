//! tcp as a hostile host on the same network would try it, with real processes: a stranger
//! claiming to be a connected peer (without and with an authentication key), endpoints whose
//! keys differ, strangers that hold unexpected bodies open to pin our memory, strangers that
//! hold connections open to keep real peers out of an endpoint at its descriptor limit, and a
//! peer that asks for atomics' original values and never reads them.
//! The stranger speaks tcp's handshake itself (`providers::tcp::net::hello`), as an attacker
//! who read the source would.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use xfabric::errno::*;
use xfabric::providers::inet;
use xfabric::providers::tcp::net::hello::{self, reason, Hs};
use xfabric::*;
use xfabric_core::rdm::wire::Frame;

const CAPS: u64 = FI_MSG | FI_TAGGED;
const WAIT: Duration = Duration::from_secs(20);

fn tcp(progress: Progress, key: Option<&str>) -> Node {
    node_with(CAPS, progress, |h| {
        h.fabric_attr.prov_name = Some("tcp".into());
        h.domain_attr.auth_key = key.map(|k| k.as_bytes().to_vec());
    })
}

fn listener_of(raw: &[u8]) -> SocketAddr {
    inet::decode(raw).expect("a tcp address")
}

fn hello_msg(claimed: SocketAddr, keyed: bool) -> [u8; hello::LEN] {
    Hs::Hello {
        addr: claimed,
        nonce: u64::from_le_bytes(pattern(8, 5).try_into().unwrap()),
        rand: hello::random().unwrap(),
        keyed,
    }
    .encode()
}

/// The next handshake message on `s`, or `None` at EOF (bounded by `WAIT`).
fn next_hs(s: &mut TcpStream) -> Option<Hs> {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut b = [0u8; hello::LEN];
    match s.read_exact(&mut b) {
        Ok(()) => Some(Hs::decode(&b).expect("a handshake message")),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => None,
        Err(e) => panic!("stranger's read: {e}"),
    }
}

/// Whatever else arrives on `s` until EOF: nothing, for a refused stranger.
fn rest(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut v = Vec::new();
    s.read_to_end(&mut v).expect("EOF after the refusal");
    v
}

/// Child: a peer that receives `n` tagged messages from its parent and answers each.
fn echo_peer(n: usize) {
    let node = tcp(Progress::Manual, None);
    let parent = connect_parent(&node);
    echo(&node, parent, n);
    say("done");
}

/// Sends back each of the `n` messages its parent sends (which checks what comes back).
fn echo(node: &Node, parent: FiAddr, n: usize) {
    for _ in 0..n {
        let mut b = vec![0u8; 64];
        // SAFETY: b outlives the completion waited for.
        node.retry(|| unsafe { node.ep.trecv(&mut b, None, parent, 0, 0, 1) });
        node.wait_one();
        // SAFETY: as above.
        node.retry(|| unsafe { node.ep.tsend(&b, None, parent, 0, 2) });
        node.wait_one();
    }
}

/// Parent half of `echo`: `n` messages there and back, each checked.
fn exchange(node: &Node, peer: FiAddr, n: usize) {
    for i in 0..n {
        let out = pattern(64, i as u64);
        let mut back = vec![0u8; 64];
        // SAFETY: both buffers outlive the completions waited for.
        unsafe { node.ep.trecv(&mut back, None, peer, 0, 0, 11) }.unwrap();
        node.retry(|| unsafe { node.ep.tsend(&out, None, peer, 0, 10) });
        node.wait_n(2);
        assert!(back == out, "answer {i} changed");
    }
}

#[test]
fn a_stranger_claiming_a_peer_gets_nothing_and_the_peer_keeps_its_connection() {
    if role().is_some() {
        return echo_peer(101);
    }
    let t = "a_stranger_claiming_a_peer_gets_nothing_and_the_peer_keeps_its_connection";
    let mut child = spawn(t, "peer", &[]);
    // A: automatic progress, so that it answers the stranger while this thread reads.
    let a = tcp(Progress::Auto, None);
    let b_raw = unhex(&child.hear());
    let b = a.add_peer(&b_raw);
    child.tell(&hex(&a.ep.getname().unwrap()));
    exchange(&a, b, 1);
    // The stranger: a HELLO to A's listener naming B's address.
    let mut s = TcpStream::connect(listener_of(&a.ep.getname().unwrap())).unwrap();
    s.write_all(&hello_msg(listener_of(&b_raw), false)).unwrap();
    assert_eq!(
        next_hs(&mut s),
        Some(Hs::Reject {
            reason: reason::UNVERIFIED
        })
    );
    // A's next 100 tagged sends all go to B, and the stranger hears nothing more.
    exchange(&a, b, 100);
    assert!(rest(&mut s).is_empty());
    assert_eq!(child.hear(), "done");
    child.join();
}

/// Child: an endpoint with `XFABRIC_AUTH_KEY` from its environment that echoes.
fn keyed_peer() {
    echo_peer(3);
}

#[test]
fn with_an_auth_key_only_holders_get_in() {
    if role().is_some() {
        return keyed_peer();
    }
    let t = "with_an_auth_key_only_holders_get_in";
    // The child takes its key from the setting, the parent from domain_attr->auth_key.
    let mut child = spawn(t, "peer", &[("XFABRIC_AUTH_KEY", "the shared key")]);
    let a = tcp(Progress::Auto, Some("the shared key"));
    let b_raw = unhex(&child.hear());
    let b = a.add_peer(&b_raw);
    child.tell(&hex(&a.ep.getname().unwrap()));
    exchange(&a, b, 1);
    let listener = listener_of(&a.ep.getname().unwrap());
    // A stranger without the key.
    let mut s = TcpStream::connect(listener).unwrap();
    s.write_all(&hello_msg(listener_of(&b_raw), false)).unwrap();
    assert_eq!(
        next_hs(&mut s),
        Some(Hs::Reject {
            reason: reason::AUTH_REQUIRED
        })
    );
    assert!(rest(&mut s).is_empty());
    // A stranger that says it has the key and cannot prove it.
    let mut s = TcpStream::connect(listener).unwrap();
    s.write_all(&hello_msg(listener_of(&b_raw), true)).unwrap();
    assert!(matches!(next_hs(&mut s), Some(Hs::Challenge { .. })));
    let forged = Hs::Proof {
        mac: hello::random().unwrap(),
    };
    s.write_all(&forged.encode()).unwrap();
    assert_eq!(
        next_hs(&mut s),
        Some(Hs::Reject {
            reason: reason::AUTH_FAILED
        })
    );
    assert!(rest(&mut s).is_empty());
    // The holder still talks.
    exchange(&a, b, 2);
    assert_eq!(child.hear(), "done");
    child.join();
}

/// Child: sends to its parent, which holds another key (or none), and reports the error.
fn mismatched_peer() {
    // Automatic progress: it must answer the parent's attempt while it waits on stdin.
    let node = tcp(Progress::Auto, None);
    let parent = connect_parent(&node);
    let out = pattern(64, 1);
    // SAFETY: out outlives the completion waited for.
    node.retry(|| unsafe { node.ep.tsend(&out, None, parent, 0, 1) });
    say(&format!("err {}", node.wait_err().err));
    // Stay up until the parent's own attempt has failed.
    assert_eq!(listen(), "bye");
}

#[test]
fn endpoints_whose_keys_differ_cannot_talk_and_both_say_so() {
    if role().is_some() {
        return mismatched_peer();
    }
    let t = "endpoints_whose_keys_differ_cannot_talk_and_both_say_so";
    for child_key in [Some("key two"), None] {
        let env: Vec<(&str, &str)> = child_key
            .map(|k| ("XFABRIC_AUTH_KEY", k))
            .into_iter()
            .collect();
        let mut child = spawn(t, "peer", &env);
        let a = tcp(Progress::Auto, Some("key one"));
        let b = connect(&mut child, &a);
        assert_eq!(child.hear(), format!("err {FI_EACCES}"), "{child_key:?}");
        let out = pattern(64, 2);
        // SAFETY: out outlives the completion waited for.
        a.retry(|| unsafe { a.ep.tsend(&out, None, b, 0, 1) });
        assert_eq!(a.wait_err().err, FI_EACCES, "{child_key:?}");
        child.tell("bye");
        child.join();
    }
}

/// Resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> usize {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: usize = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// The bound the victim below runs with.
const BOUND: usize = 16 << 20;
/// Strangers, and the body each announces.
const STRANGERS: usize = 128;
const BODY: usize = 1 << 20;
/// More than the bookkeeping charged per unexpected message besides its body (a few hundred
/// bytes: the engine's `UNEXP_OVERHEAD`).
const OVERHEAD_MAX: usize = 1024;

/// Child: an endpoint the strangers below try to pin memory in. Reports how much it held for
/// unexpected messages at most, and how much its resident memory grew.
fn pinned_victim() {
    let node = tcp(Progress::Manual, None);
    let before = rss(std::process::id());
    say(&hex(&node.ep.getname().unwrap()));
    let mut buf = [CqTaggedEntry::default(); 4];
    // Until the strangers have filled the bound (a body less than it: the next would not fit),
    // then 100,000 polls more: it holds however long this endpoint keeps reading.
    // A hang guard only, generous: the strangers greet one by one through this loop's
    // progress, slowly on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(300);
    let (mut most, mut after) = (0usize, 0u32);
    while after < 100_000 {
        let _ = node.cq.read(&mut buf);
        let now = node.ep.buffered().unexpected_bytes;
        assert!(now <= BOUND, "{now} bytes held (bound {BOUND})");
        most = most.max(now);
        if most + BODY + OVERHEAD_MAX > BOUND {
            after += 1;
        }
        assert!(
            Instant::now() < deadline,
            "the strangers never reached the bound ({most})"
        );
    }
    let grew = rss(std::process::id()).saturating_sub(before);
    say(&format!("{most} {grew}"));
    assert_eq!(listen(), "bye");
}

/// Connects to `victim` as a greeted peer that proves its claim: it listens at the address it
/// claims and answers the victim's call-back.
fn greeted(victim: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(victim).unwrap();
    let src = s.local_addr().unwrap();
    // Its listener on the address its connection leaves from: a claim naming another host
    // is refused without a call-back.
    let l = TcpListener::bind(SocketAddr::new(src.ip(), 0)).unwrap();
    let me = l.local_addr().unwrap();
    let nonce = u64::from_le_bytes(hello::random().unwrap()[..8].try_into().unwrap());
    let h = Hs::Hello {
        addr: me,
        nonce,
        rand: hello::random().unwrap(),
        keyed: false,
    };
    s.write_all(&h.encode()).unwrap();
    let mut c = accept_within(&l, WAIT);
    let to = victim;
    assert_eq!(next_hs(&mut c), Some(Hs::Verify { src, to, nonce }));
    c.write_all(&Hs::Vouch { yes: true }.encode()).unwrap();
    assert!(matches!(next_hs(&mut s), Some(Hs::Accept { .. })));
    s
}

/// The next connection to `l`, within `limit` (a victim that never calls back fails the
/// test instead of holding it).
fn accept_within(l: &TcpListener, limit: Duration) -> TcpStream {
    l.set_nonblocking(true).unwrap();
    let start = Instant::now();
    loop {
        match l.accept() {
            Ok((c, _)) => {
                c.set_nonblocking(false).unwrap();
                return c;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(start.elapsed() < limit, "no call-back within {limit:?}");
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

#[test]
fn partial_unexpected_bodies_cannot_pin_more_than_the_bound() {
    if role().is_some() {
        return pinned_victim();
    }
    let t = "partial_unexpected_bodies_cannot_pin_more_than_the_bound";
    let bound = BOUND.to_string();
    let mut child = spawn(t, "victim", &[("XFABRIC_TCP_UNEXP_BYTES", bound.as_str())]);
    let victim = listener_of(&unhex(&child.hear()));
    // Each greeted stranger announces an unexpected 1 MiB message and sends all of it but the
    // last byte, as far as the victim reads it.
    let head = Frame::Msg {
        id: 1,
        tag: 0,
        data: 0,
        flags: 0,
    }
    .to_vec(BODY as u64);
    let body = vec![0x5au8; BODY - 1];
    let mut held = Vec::new();
    for _ in 0..STRANGERS {
        let mut s = greeted(victim);
        s.write_all(&head).unwrap();
        s.set_nonblocking(true).unwrap();
        let mut off = 0;
        while off < body.len() {
            match s.write(&body[off..]) {
                Ok(n) => off += n,
                // The victim stopped reading this one (its body is not charged): the rest
                // stays in the sockets.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("stranger's write: {e}"),
            }
        }
        held.push(s);
    }
    let report = child.hear();
    let (most, grew) = report.split_once(' ').expect("the victim's report");
    let (most, grew): (usize, usize) = (most.parse().unwrap(), grew.parse().unwrap());
    assert!(
        most <= BOUND && most + BODY + OVERHEAD_MAX > BOUND,
        "{report}"
    );
    // The bound, plus per connection its 64 KiB read buffer, plus slack for the allocator:
    // without the charge at the header, 128 strangers grew it by 136 MiB.
    let limit = BOUND + STRANGERS * (64 << 10) + (16 << 20);
    assert!(
        grew <= limit,
        "resident memory grew {grew} bytes (limit {limit})"
    );
    child.tell("bye");
    child.join();
}

/// Child: at a descriptor limit of 128, answers 1,000 messages from its parent while strangers
/// hold connections to its listener.
fn crowded_victim() {
    let lim = libc::rlimit {
        rlim_cur: 128,
        rlim_max: 128,
    };
    // SAFETY: setrlimit with a valid struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    let node = tcp(Progress::Manual, None);
    let parent = connect_parent(&node);
    echo(&node, parent, 1000);
    say("done");
}

#[test]
fn strangers_holding_connections_do_not_keep_a_real_peer_out() {
    if role().is_some() {
        return crowded_victim();
    }
    let t = "strangers_holding_connections_do_not_keep_a_real_peer_out";
    let mut child = spawn(t, "victim", &[]);
    let a = tcp(Progress::Auto, None);
    let raw = unhex(&child.hear());
    let victim = listener_of(&raw);
    // 500 strangers connect and say nothing: half from another address of this host, half
    // from the real peer's own.
    let mut strangers = Vec::new();
    for i in 0..500 {
        let from = if i % 2 == 0 { "127.0.0.2" } else { "127.0.0.1" };
        let sock = socket2_connect(from, victim);
        strangers.push(sock);
    }
    let b = a.add_peer(&raw);
    child.tell(&hex(&a.ep.getname().unwrap()));
    exchange(&a, b, 1000);
    assert_eq!(child.hear(), "done");
    child.join();
    drop(strangers);
}

/// A connection to `to` from address `from` (bound first), through libc: std cannot bind a
/// client socket.
fn socket2_connect(from: &str, to: SocketAddr) -> TcpStream {
    use std::os::fd::FromRawFd;
    let sin = |a: SocketAddr| {
        let SocketAddr::V4(a) = a else {
            panic!("IPv4 only")
        };
        libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: a.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(a.ip().octets()),
            },
            sin_zero: [0; 8],
        }
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket(2); the fd is owned by the TcpStream made from it below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: fd is ours; the stream closes it.
    let s = unsafe { TcpStream::from_raw_fd(fd) };
    let local = sin(SocketAddr::new(from.parse().unwrap(), 0));
    let remote = sin(to);
    // SAFETY: bind and connect with sockaddr_in values of `len` bytes.
    unsafe {
        assert_eq!(
            libc::bind(fd, &local as *const _ as *const libc::sockaddr, len),
            0,
            "bind {from}: {}",
            std::io::Error::last_os_error()
        );
        assert_eq!(
            libc::connect(fd, &remote as *const _ as *const libc::sockaddr, len),
            0,
            "connect: {}",
            std::io::Error::last_os_error()
        );
    }
    s
}

const RMA: u64 = FI_MSG | FI_TAGGED | FI_RMA | FI_REMOTE_WRITE | FI_WRITE;

/// Child: registers a region with a key the provider chooses and gives its address away (not
/// its key); says whether anything changed it once the parent is done guessing.
fn guessed_target() {
    let node = node_with(RMA, Progress::Auto, |h| {
        h.fabric_attr.prov_name = Some("tcp".into());
        h.domain_attr.mr_mode = FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
    });
    let window = vec![0u8; 4096];
    // SAFETY: window outlives the region (dropped below, before it).
    let mr = unsafe { node.domain.mr_reg(&window, FI_REMOTE_WRITE, 0, 0) }.expect("mr_reg");
    say(&hex(&node.ep.getname().unwrap()));
    say(&format!("{}", window.as_ptr() as u64));
    assert_eq!(listen(), "done");
    say(&format!("untouched {}", window.iter().all(|&b| b == 0)));
    drop(mr);
}

#[test]
fn guessed_memory_keys_land_nothing() {
    if role().is_some() {
        return guessed_target();
    }
    let t = "guessed_memory_keys_land_nothing";
    let mut child = spawn(t, "target", &[]);
    // A stranger: a real endpoint that was never given the key.
    let n = node_with(RMA, Progress::Manual, |h| {
        h.fabric_attr.prov_name = Some("tcp".into());
        h.domain_attr.mr_mode = FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
    });
    let peer = n.add_peer(&unhex(&child.hear()));
    let base: u64 = child.hear().parse().unwrap();
    let data = [0xffu8; 8];
    let mut x = 0x853c_49e6_748f_ea9bu64;
    let random = std::iter::repeat_with(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    });
    // What a counter would have handed out first, then as many random keys. Each is refused;
    // past the engine's allowance of refused keys (a burst of 1,024) the guesser is cut off
    // (its operations fail with the connection) and reconnects for the next.
    let mut cut = 0;
    for (i, key) in (1..=4096u64).chain(random.take(4096)).enumerate() {
        // At the region's address, and at offset 0 (what a domain without FI_MR_VIRT_ADDR
        // would take).
        let addr = if i % 2 == 0 { base } else { 0 };
        // SAFETY: data outlives the completion waited for.
        n.retry(|| unsafe { n.ep.write(&data, None, peer, addr, key, i) });
        let e = n.wait_err();
        assert_eq!(e.op_context, i, "key {key:#x}");
        match e.err {
            FI_EACCES => {}
            FI_ECONNRESET if i >= 1024 => cut += 1,
            err => panic!("key {key:#x}: error {err}"),
        }
    }
    assert!(
        cut > 0,
        "8,192 refused keys and the guesser was never cut off"
    );
    child.tell("done");
    assert_eq!(child.hear(), "untouched true");
    child.join();
}

/// The next frame on `s` (bounded by `WAIT`): its kind as decoded, and its body.
fn next_frame(s: &mut TcpStream) -> (Frame, Vec<u8>) {
    use xfabric_core::rdm::wire;
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut head = vec![0u8; wire::PREFIX];
    s.read_exact(&mut head).expect("a frame's prefix");
    let p = wire::prefix(&head).expect("a prefix");
    let mut ctrl = vec![0u8; p.ctrl_len as usize];
    s.read_exact(&mut ctrl).expect("a frame's control part");
    let mut body = vec![0u8; p.body_len as usize];
    s.read_exact(&mut body).expect("a frame's body");
    (wire::decode(&p, &ctrl).expect("a frame"), body)
}

/// A target registering `len` bytes for remote reads and writes, in this process, its
/// progress its own thread's; and a greeted raw peer connected to it.
fn rma_target(len: usize) -> (Node, Vec<u8>, TcpStream) {
    let node = node_with(RMA | FI_REMOTE_READ | FI_READ, Progress::Auto, |h| {
        h.fabric_attr.prov_name = Some("tcp".into());
        h.domain_attr.mr_mode = FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
    });
    let window = vec![0u8; len];
    let s = greeted(listener_of(&node.ep.getname().unwrap()));
    (node, window, s)
}

/// The ranges `window` names with `key`, as a raw peer writes them.
fn whole(window: &[u8], key: u64) -> xfabric_core::RmaIovList {
    xfabric_core::RmaIovList::from_segs(&[xfabric_core::RmaIov {
        addr: window.as_ptr() as u64,
        len: window.len(),
        key,
    }])
    .unwrap()
}

/// A peer's write that arrives partly before its region closes and partly after: the bytes
/// after the close land nowhere (the application may have freed the memory), and the peer
/// is told the write failed. Before, the rest of the body went on into the closed region.
#[test]
fn a_write_arriving_as_its_region_closes_stops_at_the_close() {
    const LEN: usize = 64 << 10;
    let (node, window, mut s) = rma_target(LEN);
    // SAFETY: window outlives the region (dropped below, before it).
    let mr = unsafe { node.domain.mr_reg(&window, FI_REMOTE_WRITE, 0, 0) }.expect("mr_reg");
    let head = Frame::Write {
        id: 7,
        data: 0,
        flags: xfabric_core::rdm::wire::flags::ACK,
        segs: whole(&window, mr.key()),
        desc: Default::default(),
    }
    .to_vec(LEN as u64);
    s.write_all(&head).unwrap();
    s.write_all(&vec![0xab; LEN / 2]).unwrap();
    // Read as the progress thread writes it: through volatile loads of the raw bytes.
    let at = |i: usize| unsafe { std::ptr::read_volatile(window.as_ptr().add(i)) };
    let deadline = Instant::now() + WAIT;
    while at(LEN / 2 - 1) != 0xab {
        assert!(Instant::now() < deadline, "the first half never landed");
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(mr);
    s.write_all(&vec![0xcd; LEN / 2]).unwrap();
    match next_frame(&mut s) {
        (Frame::Ack { id: 7, status }, _) => assert_eq!(status, FI_EACCES),
        other => panic!("not the write's answer: {other:?}"),
    }
    assert!((0..LEN / 2).all(|i| at(i) == 0xab), "the first half");
    assert!(
        (LEN / 2..LEN).all(|i| at(i) == 0),
        "bytes landed in a closed region"
    );
    // The connection is still good: a write to a closed key is refused, not a loss.
    drop(node);
}

/// Answers to a peer's reads that the peer is slow to take, as the region closes: the one
/// begun goes on with the bytes the region held at the close, not what the memory holds
/// afterwards (the application may have freed it and reused it); the one not begun is the
/// read's failure. Before, both were sent from the memory as it was by then.
#[test]
fn a_read_answered_as_its_region_closes_sends_the_bytes_from_before_the_close() {
    const LEN: usize = 32 << 20;
    let (node, mut window, mut s) = rma_target(LEN);
    window.fill(0x5a);
    // SAFETY: window outlives the region (dropped below, before it).
    let mr = unsafe { node.domain.mr_reg(&window, FI_REMOTE_READ, 0, 0) }.expect("mr_reg");
    for id in [9, 10] {
        let read = Frame::Read {
            id,
            segs: whole(&window, mr.key()),
            desc: Default::default(),
        }
        .to_vec(0);
        s.write_all(&read).unwrap();
    }
    // The answer is larger than the sockets hold: until this peer reads, most of it waits
    // in the target's queue, its body the region's memory. The progress thread's first
    // write of it is awaited as the first bytes arriving.
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut first = [0u8; 1];
    s.peek(&mut first).expect("the answer's first bytes");
    drop(mr);
    // What a program does with memory it no longer registers.
    window.fill(0xee);
    match next_frame(&mut s) {
        (Frame::ReadResp { id: 9, status: 0 }, body) => {
            assert_eq!(body.len(), LEN);
            let changed = body.iter().filter(|&&b| b != 0x5a).count();
            assert_eq!(changed, 0, "bytes of the answer read after the close");
        }
        other => panic!("not the read's answer: {:?}", other.0),
    }
    match next_frame(&mut s) {
        (Frame::ReadResp { id: 10, status }, body) => {
            assert_eq!((status, body.len()), (FI_EACCES, 0), "the second read");
        }
        other => panic!("not the second read's answer: {:?}", other.0),
    }
    drop(node);
}

/// Fetching atomics one unread peer asks for, and the 4 KiB of original values each answer holds.
const FETCHES: usize = 40_000;
const RESULT: usize = 4096;

/// Child: the target of a peer's fetching atomics, which it never reads the answers of.
/// Reports its address and its region's (address, key), and, told "report", how much its
/// resident memory grew once it settled.
fn fetched_victim() {
    let node = node_with(
        FI_ATOMIC | FI_REMOTE_READ | FI_REMOTE_WRITE,
        Progress::Auto,
        |h| {
            h.fabric_attr.prov_name = Some("tcp".into());
            h.domain_attr.mr_mode = FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
        },
    );
    let window = vec![0x11u8; RESULT];
    // SAFETY: window outlives the region (dropped at the end, after it).
    let mr = unsafe { node.domain.mr_reg(&window, FI_REMOTE_READ, 0, 0) }.expect("mr_reg");
    let me = std::process::id();
    let before = rss(me);
    say(&format!(
        "{} {} {}",
        hex(&node.ep.getname().unwrap()),
        window.as_ptr() as u64,
        mr.key()
    ));
    assert_eq!(listen(), "report");
    // Settled: its progress thread reads what it will read (without a bound on what the peer
    // owes, every request the sockets hold), and each answer's bytes are resident as queued.
    // A hang guard only: the last of two readings 100 ms apart that agree.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = rss(me);
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = rss(me);
        if now == last || Instant::now() > deadline {
            break;
        }
        last = now;
    }
    say(&rss(me).saturating_sub(before).to_string());
    assert_eq!(listen(), "bye");
    drop(mr);
}

/// A peer asking for 4 KiB of original values with each 48-byte fetching atomic and never
/// reading them: the target stops reading it once it holds 16 MiB of answers for it
/// (`OWED_BYTES_MAX`). Before, only the count of answers (65,536) stopped it: 40,000 such
/// requests grew the target by 163 MiB.
#[test]
fn a_peer_that_never_reads_its_fetched_values_cannot_grow_the_target_past_the_bound() {
    if role().is_some() {
        return fetched_victim();
    }
    let t = "a_peer_that_never_reads_its_fetched_values_cannot_grow_the_target_past_the_bound";
    let mut child = spawn(t, "victim", &[]);
    let line = child.hear();
    let v: Vec<&str> = line.split(' ').collect();
    let (name, addr, key) = (unhex(v[0]), v[1].parse().unwrap(), v[2].parse().unwrap());
    let mut s = greeted(listener_of(&name));
    let req = Frame::Atomic {
        id: 1,
        op: AtomicOp::Read as u32,
        datatype: Datatype::UInt64 as u32,
        count: (RESULT / 8) as u32,
        addr,
        key,
        flags: xfabric_core::rdm::wire::flags::FETCH,
    }
    .to_vec(0);
    let all: Vec<u8> = req.repeat(FETCHES);
    // As much as the sockets take: once the target stops reading, the rest stays unsent (a
    // second of no progress says so; the figure below does not depend on when this stops).
    s.set_nonblocking(true).unwrap();
    let (mut off, mut stuck_since) = (0, None);
    while off < all.len() {
        match s.write(&all[off..]) {
            Ok(n) => {
                off += n;
                stuck_since = None;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let since = *stuck_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(1) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("the peer's write: {e}"),
        }
    }
    child.tell("report");
    let grew: usize = child.hear().parse().unwrap();
    println!(
        "the target grew {grew} bytes after {} requests",
        off / req.len()
    );
    // The bound, plus one read's worth of requests answered past it (64 KiB of 48-byte
    // requests: 5.5 MiB of answers), plus the queue's own entries and the allocator's slack.
    let limit = (16 << 20) + (8 << 20) + (16 << 20);
    assert!(
        grew <= limit,
        "resident memory grew {grew} bytes (limit {limit}) after {} requests",
        off / req.len()
    );
    child.tell("bye");
    child.join();
}
