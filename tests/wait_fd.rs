//! FI_WAIT_FD: completion queues, counters and event queues opened with it hand out a
//! descriptor (`wait_fd`, C's fi_control(FI_GETWAIT)) that becomes readable when the object
//! has something, and `trywait` (fi_trywait) says when sleeping on it is safe. One epoll loop
//! drives two endpoints of `XFABRIC_TEST_PROVIDER`: under auto progress (the domain's thread
//! writes the entries whose arrival wakes the loop), and under manual progress, where nothing
//! moves while the loop sleeps: the CQ's and counter's descriptors must become readable when a
//! frame reaches an endpoint's transport.

mod common;
use std::time::Instant;

use common::*;
use xfabric::*;

/// An epoll set over `fds`, each registered with its index as the event's data.
struct Epoll(std::os::fd::OwnedFd);

impl Epoll {
    fn new(fds: &[i32]) -> Epoll {
        use std::os::fd::FromRawFd;
        // SAFETY: plain epoll_create1; the result is checked.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0);
        for (i, fd) in fds.iter().enumerate() {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: i as u64,
            };
            // SAFETY: valid descriptors and event.
            assert_eq!(
                unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, *fd, &mut ev) },
                0
            );
        }
        // SAFETY: a fresh descriptor we own.
        Epoll(unsafe { std::os::fd::OwnedFd::from_raw_fd(ep) })
    }

    /// Indices of the ready descriptors, waiting at most `ms`.
    fn wait(&self, ms: i32) -> Vec<usize> {
        use std::os::fd::AsRawFd;
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
        // SAFETY: evs is writable for its length.
        let n = unsafe { libc::epoll_wait(self.0.as_raw_fd(), evs.as_mut_ptr(), 8, ms) };
        assert!(n >= 0, "epoll_wait");
        evs[..n as usize].iter().map(|e| e.u64 as usize).collect()
    }
}

/// An endpoint whose CQ (both directions) and receive counter wait on descriptors.
struct FdEnd {
    ep: Endpoint,
    cq: CompletionQueue,
    rx: Counter,
    av: AddressVector,
    _domain: Domain,
}

fn fd_end(progress: Progress) -> FdEnd {
    fd_end_on(progress, None)
}

/// As `fd_end`; with a wait set, the CQ and counter wait on it (`FI_WAIT_SET`) instead.
fn fd_end_on(progress: Progress, ws: Option<&WaitSet>) -> FdEnd {
    let wait_obj = if ws.is_some() {
        WaitObj::Set
    } else {
        WaitObj::Fd
    };
    let mut hints = Info {
        caps: FI_MSG,
        ..Default::default()
    };
    hints.fabric_attr.prov_name = Some(test_provider());
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.domain_attr.data_progress = progress;
    let info = getinfo(fi_version(1, 17), None, None, 0, Some(&hints)).unwrap()[0].clone();
    let domain = xfabric::fabric(&info.fabric_attr)
        .unwrap()
        .domain(&info)
        .unwrap();
    let cq = domain
        .cq_open(&CqAttr {
            format: CqFormat::Tagged,
            wait_obj,
            wait_set: ws.cloned(),
            ..Default::default()
        })
        .unwrap();
    let rx = domain
        .cntr_open(&CntrAttr {
            wait_obj,
            wait_set: ws.cloned(),
            ..Default::default()
        })
        .unwrap();
    let av = domain.av_open(&AvAttr::default()).unwrap();
    let ep = domain.endpoint(&info).unwrap();
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
    ep.bind_cntr(&rx, FI_RECV).unwrap();
    ep.bind_av(&av).unwrap();
    ep.enable().unwrap();
    FdEnd {
        ep,
        cq,
        rx,
        av,
        _domain: domain,
    }
}

/// Reads every entry `cq` holds now: how many.
fn drain(cq: &CompletionQueue) -> u64 {
    let mut buf = [CqTaggedEntry::default(); 16];
    let mut n = 0;
    loop {
        match cq.read(&mut buf) {
            Ok(k) => n += k as u64,
            Err(Error::Again(_)) => return n,
            Err(e) => panic!("cq read: {e}"),
        }
    }
}

#[test]
fn one_epoll_loop_drives_two_endpoints() {
    const N: u64 = 50;
    let (a, b) = (fd_end(Progress::Auto), fd_end(Progress::Auto));
    let eq = EventQueue::open(&EqAttr {
        wait_obj: WaitObj::Fd,
        ..Default::default()
    })
    .unwrap();
    let fds = [
        a.cq.wait_fd().unwrap(),
        b.cq.wait_fd().unwrap(),
        a.rx.wait_fd().unwrap(),
        eq.wait_fd().unwrap(),
    ];
    let ep = Epoll::new(&fds);
    assert!(ep.wait(0).is_empty(), "nothing yet");
    assert_eq!(a.rx.trywait(), Ok(()));
    let pa = b.av.insert_one(&a.ep.getname().unwrap()).unwrap();
    let pb = a.av.insert_one(&b.ep.getname().unwrap()).unwrap();
    let mut bufs = vec![[0u8; 8]; 2 * N as usize];
    let (ra, rb) = bufs.split_at_mut(N as usize);
    for (i, (x, y)) in ra.iter_mut().zip(rb.iter_mut()).enumerate() {
        // SAFETY: the buffers outlive the loop, which waits for every receive.
        unsafe {
            a.ep.recv(x, None, pb, i).unwrap();
            b.ep.recv(y, None, pa, i).unwrap();
        }
    }
    let one = [7u8; 8];
    for i in 0..N {
        for (from, to) in [(&a, pb), (&b, pa)] {
            // SAFETY: `one` outlives its sends (the loop below reads their completions).
            while let Err(e) = unsafe { from.ep.send(&one, None, to, 1000 + i as usize) } {
                assert!(matches!(e, Error::Again(_)), "{e}");
                drain(&from.cq);
            }
        }
    }
    eq.write(EqEntry {
        event: FI_NOTIFY,
        fid: 1,
        context: 2,
        data: 3,
        bytes: None,
    })
    .unwrap();
    // The loop: sleep only when every object says it may; then read what is there. Each CQ
    // ends with N sends and N receives (some may have been read while posting).
    let (mut got_a, mut got_b, mut got_eq) = (0, 0, false);
    let deadline = Instant::now() + BOUND;
    while a.rx.read() < N || b.rx.read() < N || !got_eq {
        assert!(
            Instant::now() < deadline,
            "stuck at a {}, b {}, eq {got_eq}",
            a.rx.read(),
            b.rx.read()
        );
        let may_sleep = [a.cq.trywait(), b.cq.trywait(), a.rx.trywait(), eq.trywait()];
        if may_sleep.iter().all(|r| r.is_ok()) {
            ep.wait(1000);
        }
        got_a += drain(&a.cq);
        got_b += drain(&b.cq);
        if let Ok(e) = eq.read(0) {
            assert_eq!((e.event, e.context, e.data), (FI_NOTIFY, 2, 3));
            got_eq = true;
        }
    }
    assert!(bufs.iter().all(|x| *x == one));
    assert!(got_a <= 2 * N && got_b <= 2 * N);
    assert_eq!(eq.trywait(), Ok(()), "the EQ is empty again");
    // A change after trywait makes the descriptor readable, and the next trywait says so
    // (once: the one after it finds nothing new).
    let _ = a.rx.trywait();
    assert_eq!(a.rx.trywait(), Ok(()));
    assert!(!ep.wait(0).contains(&2));
    a.rx.add(1).unwrap();
    assert!(ep.wait(1000).contains(&2));
    assert_eq!(a.rx.trywait(), Err(Error::Again("cntr trywait")));
    assert_eq!(a.rx.trywait(), Ok(()));
}

/// An eventfd another thread signals when the test's deadline passes: in the epoll set of a
/// loop that sleeps without a timeout, its wake-up is a failure, not a poll.
struct Watchdog {
    fd: std::os::fd::OwnedFd,
    stop: std::sync::mpsc::Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn new(after: std::time::Duration) -> Watchdog {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: plain eventfd; the result is checked.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        let ring = fd.try_clone().unwrap();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            if stopped.recv_timeout(after).is_err() {
                let one = 1u64;
                // SAFETY: writes 8 bytes from a local to our eventfd.
                unsafe { libc::write(ring.as_raw_fd(), (&one as *const u64).cast(), 8) };
            }
        });
        Watchdog {
            fd,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Manual progress: one thread drives two endpoints, a and b, sleeping in epoll_wait (no
/// timeout) whenever every object's trywait allows. A peer endpoint in another thread sends
/// each of them a message per round, a few milliseconds after the loop answered the last
/// round's, so the loop is asleep when they arrive: nothing progresses a or b then, and only
/// a transport descriptor in a CQ's or counter's epoll set can wake it.
#[test]
fn manual_progress_epoll_loop_wakes_on_frames() {
    manual_loop(None);
}

/// As above, with a's and b's CQs and counters in one wait set opened with `FI_WAIT_FD`:
/// the loop sleeps on the set's descriptor alone and asks only the set's trywait.
#[test]
fn manual_progress_wait_set_fd_wakes_on_frames() {
    let ws = WaitSet::open(&WaitAttr {
        wait_obj: WaitObj::Fd,
        flags: 0,
    })
    .unwrap();
    manual_loop(Some(ws));
}

fn manual_loop(ws: Option<WaitSet>) {
    use std::os::fd::AsRawFd;
    const ROUNDS: usize = 20;
    let (a, b) = (
        fd_end_on(Progress::Manual, ws.as_ref()),
        fd_end_on(Progress::Manual, ws.as_ref()),
    );
    let c = fd_end(Progress::Manual);
    let dog = Watchdog::new(BOUND * 3);
    let fds = match &ws {
        None => vec![
            a.cq.wait_fd().unwrap(),
            b.cq.wait_fd().unwrap(),
            a.rx.wait_fd().unwrap(),
            b.rx.wait_fd().unwrap(),
        ],
        Some(ws) => vec![ws.wait_fd().unwrap()],
    };
    let dog_at = fds.len();
    let ep = Epoll::new(&[&fds[..], &[dog.fd.as_raw_fd()]].concat());
    let trywait = || match &ws {
        None => [
            a.cq.trywait(),
            b.cq.trywait(),
            a.rx.trywait(),
            b.rx.trywait(),
        ]
        .iter()
        .all(|r| r.is_ok()),
        Some(ws) => ws.trywait().is_ok(),
    };
    let ca = c.av.insert_one(&a.ep.getname().unwrap()).unwrap();
    let cb = c.av.insert_one(&b.ep.getname().unwrap()).unwrap();
    let ac = a.av.insert_one(&c.ep.getname().unwrap()).unwrap();
    let bc = b.av.insert_one(&c.ep.getname().unwrap()).unwrap();
    // Set by the loop just before each `epoll_wait`: 1 + the answers it had sent by then. The
    // peer sends round i only once the loop has gone to sleep with round i - 1 answered, so
    // every round's messages find it asleep or about to be, whatever the scheduling (a frame
    // that lands between the store and `epoll_wait` makes the level-triggered wait return at
    // once): each round has a sleep of its own.
    let slept_after = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let asleep = slept_after.clone();
    let peer = std::thread::spawn(move || {
        let msg = [5u8; 8];
        let mut back = vec![[0u8; 16]; 2 * ROUNDS];
        let deadline = Instant::now() + BOUND * 3;
        let mut done = 0;
        for (i, pair) in back.chunks_mut(2).enumerate() {
            let [x, y] = pair else { unreachable!() };
            // SAFETY: `back` outlives the receives, waited for below.
            unsafe {
                c.ep.recv(x, None, ca, i).unwrap();
                c.ep.recv(y, None, cb, i).unwrap();
            }
            while asleep.load(std::sync::atomic::Ordering::Acquire) < 2 * i as u64 + 1 {
                assert!(
                    Instant::now() < deadline,
                    "peer: the loop never slept (round {i})"
                );
                std::thread::yield_now();
            }
            for to in [ca, cb] {
                // SAFETY: `msg` outlives its sends (completions read below).
                while let Err(e) = unsafe { c.ep.send(&msg, None, to, 1) } {
                    assert!(matches!(e, Error::Again(_)), "{e}");
                    done += drain(&c.cq);
                }
            }
            // Both answers before the next round (c's own reads progress it).
            while c.rx.read() < 2 * (i as u64 + 1) {
                assert!(Instant::now() < deadline, "peer: no answers to round {i}");
                done += drain(&c.cq);
                std::thread::yield_now();
            }
        }
        // Every completion (2 receives and 2 sends a round), so that closing loses nothing.
        while done < 4 * ROUNDS as u64 {
            assert!(Instant::now() < deadline, "peer: {done} completions");
            done += drain(&c.cq);
            std::thread::yield_now();
        }
        back
    });
    let mut ra = [[0u8; 8]; ROUNDS];
    let mut rb = [[0u8; 8]; ROUNDS];
    for i in 0..ROUNDS {
        // SAFETY: the buffers outlive the loop, which waits for every receive.
        unsafe {
            a.ep.recv(&mut ra[i], None, ac, i).unwrap();
            b.ep.recv(&mut rb[i], None, bc, i).unwrap();
        }
    }
    let answer = [9u8; 16];
    let send = |from: &FdEnd, to: FiAddr| {
        // SAFETY: `answer` outlives the loop, which reads every send's completion.
        while let Err(e) = unsafe { from.ep.send(&answer, None, to, 7) } {
            assert!(matches!(e, Error::Again(_)), "{e}");
            drain(&from.cq);
        }
    };
    // Each of a and b: a receive and an answer's send completion per round.
    let rounds = ROUNDS as u64;
    let (mut a_sent, mut b_sent, mut a_done, mut b_done, mut sleeps) = (0, 0, 0, 0, 0);
    while a_done < 2 * rounds || b_done < 2 * rounds {
        if trywait() {
            slept_after.store(a_sent + b_sent + 1, std::sync::atomic::Ordering::Release);
            let woke = ep.wait(-1);
            assert!(
                !woke.contains(&dog_at),
                "asleep past the deadline: a answered {a_sent}, b {b_sent} of {ROUNDS} rounds"
            );
            sleeps += 1;
        }
        a_done += drain(&a.cq);
        b_done += drain(&b.cq);
        while a_sent < a.rx.read() {
            send(&a, ac);
            a_sent += 1;
        }
        while b_sent < b.rx.read() {
            send(&b, bc);
            b_sent += 1;
        }
    }
    let back = peer.join().unwrap();
    assert!(ra.iter().chain(&rb).all(|m| *m == [5u8; 8]));
    assert!(back.iter().all(|m| *m == answer));
    // At least one sleep per round: each round's messages came after the loop went to sleep.
    assert!(sleeps >= ROUNDS, "{sleeps} sleeps for {ROUNDS} rounds");
    eprintln!("{ROUNDS} rounds, {sleeps} sleeps in epoll_wait");
}

/// shm's wake socket cannot be taken from it: a process (of any user, in the network
/// namespace) that binds the name a segment's wake socket once had, `xfabric-wake/<segment>`,
/// before the endpoint binds its own, does not keep a sleeper on descriptors from waking when
/// a frame arrives. Before, the endpoint's bind failed, its trywait still let the loop sleep,
/// and the sleep lasted until its bound.
#[test]
fn a_squatted_wake_socket_name_does_not_keep_a_sleeper_asleep() {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    if test_provider() != "shm" {
        eprintln!("skipped: shm's wake socket");
        return;
    }
    let (a, c) = (fd_end(Progress::Manual), fd_end(Progress::Manual));
    let name = a.ep.getname().unwrap();
    let seg = std::str::from_utf8(&name)
        .unwrap()
        .trim_start_matches("fi_shm://")
        .trim_end_matches('\0')
        .to_string();
    // The squatter: the name the wake socket had, bound first.
    // SAFETY: plain socket(2); checked below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor we own.
    let squat = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_un is plain data; all zeroes is valid.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let path = format!("xfabric-wake/{seg}");
    for (d, &b) in sa.sun_path[1..].iter_mut().zip(path.as_bytes()) {
        *d = b as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + path.len();
    // SAFETY: a valid sockaddr_un of `len` bytes.
    let r = unsafe {
        libc::bind(
            squat.as_raw_fd(),
            (&sa as *const libc::sockaddr_un).cast(),
            len as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "bind the squatter");
    let ca = c.av.insert_one(&name).unwrap();
    let ac = a.av.insert_one(&c.ep.getname().unwrap()).unwrap();
    let mut buf = [0u8; 8];
    // SAFETY: `buf` outlives the receive, waited for below.
    unsafe { a.ep.recv(&mut buf, None, ac, 1) }.unwrap();
    let ep = Epoll::new(&[a.cq.wait_fd().unwrap()]);
    let deadline = Instant::now() + BOUND;
    while a.cq.trywait().is_err() {
        drain(&a.cq);
        assert!(
            Instant::now() < deadline,
            "trywait never let the loop sleep"
        );
    }
    let sender = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let msg = [7u8; 8];
        // SAFETY: `msg` outlives its send, whose completion is read below.
        while let Err(e) = unsafe { c.ep.send(&msg, None, ca, 2) } {
            assert!(matches!(e, Error::Again(_)), "{e}");
            drain(&c.cq);
        }
        let deadline = Instant::now() + BOUND;
        while drain(&c.cq) == 0 {
            assert!(Instant::now() < deadline, "the send never completed");
        }
        c
    });
    let woke = ep.wait(BOUND.as_millis() as i32);
    assert_eq!(woke, vec![0], "the sleeper was not woken by the frame");
    let deadline = Instant::now() + BOUND;
    while drain(&a.cq) == 0 {
        assert!(Instant::now() < deadline, "the receive never completed");
    }
    assert_eq!(buf, [7u8; 8]);
    drop(sender.join().unwrap());
    drop(squat);
}
