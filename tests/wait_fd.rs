//! FI_WAIT_FD: completion queues, counters and event queues opened with it hand out a
//! descriptor (`wait_fd`, C's fi_control(FI_GETWAIT)) that becomes readable when the object
//! has something, and `trywait` (fi_trywait) says when sleeping on it is safe. One epoll loop
//! drives two endpoints of `XFABRIC_TEST_PROVIDER` (auto progress: the domain's thread writes
//! the entries whose arrival wakes the loop).

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
            wait_obj: WaitObj::Fd,
            ..Default::default()
        })
        .unwrap();
    let rx = domain
        .cntr_open(&CntrAttr {
            wait_obj: WaitObj::Fd,
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
