//! Shared pieces of the multi-process tests: opening an endpoint, and running a role of a test
//! in a child process (the test binary re-executed with `XF_ROLE` set), with addresses
//! exchanged over the child's stdin and stdout.

#![allow(dead_code)]

pub mod cuda_double;
pub mod doubles;
pub mod netns;
pub mod warnings;
pub mod ze_double;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use xfabric::*;

/// An opened RDM endpoint with its queues.
pub struct Node {
    pub fabric: Fabric,
    pub domain: Domain,
    pub cq: CompletionQueue,
    pub av: AddressVector,
    pub ep: Endpoint,
    pub info: Info,
}

/// Opens an endpoint of `test_provider()` with `caps`, a tagged-format CQ for both directions, and a table AV.
pub fn node(caps: u64, progress: Progress) -> Node {
    node_with(caps, progress, |_| {})
}

/// As `node`, letting the caller adjust the hints first.
pub fn node_with(caps: u64, progress: Progress, adjust: impl FnOnce(&mut Info)) -> Node {
    node_custom(caps, progress, adjust, 4096, |_, _| {})
}

impl Node {
    /// Waits (bounded) for one successful completion.
    pub fn wait_one(&self) -> CqTaggedEntry {
        self.wait_n(1)[0]
    }

    /// Waits (bounded by a generous deadline) for `n` successful completions; panics on an error
    /// entry, printing it.
    pub fn wait_n(&self, n: usize) -> Vec<CqTaggedEntry> {
        let mut out = Vec::with_capacity(n);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut buf = [CqTaggedEntry::default(); 64];
        while out.len() < n {
            match self.cq.read(&mut buf[..(n - out.len()).min(64)]) {
                Ok(k) => out.extend_from_slice(&buf[..k]),
                Err(Error::Again(_)) => {}
                Err(Error::Avail) => panic!("error completion: {:?}", self.cq.readerr()),
                Err(e) => panic!("cq read: {e}"),
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for completions ({} of {n})",
                out.len()
            );
        }
        out
    }

    /// Waits (bounded) for the next error entry.
    pub fn wait_err(&self) -> CqErrEntry {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut buf = [CqTaggedEntry::default(); 1];
        loop {
            match self.cq.read(&mut buf) {
                Err(Error::Avail) => return self.cq.readerr().expect("readerr after Avail"),
                Ok(_) => panic!("expected an error completion, got {:?}", buf[0]),
                Err(Error::Again(_)) => {}
                Err(e) => panic!("cq read: {e}"),
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for an error completion"
            );
        }
    }

    /// Inserts a peer's raw address.
    pub fn add_peer(&self, raw: &[u8]) -> FiAddr {
        self.av.insert_one(raw).expect("av insert")
    }

    /// Where a peer's RMA addresses a region registered over `buf` start: its virtual address
    /// under `FI_MR_VIRT_ADDR`, else 0 (offsets).
    pub fn rma_base(&self, buf: &[u8]) -> u64 {
        if self.info.domain_attr.mr_mode & FI_MR_VIRT_ADDR != 0 {
            buf.as_ptr() as u64
        } else {
            0
        }
    }
}

/// How many of this process's mappings are of the shm segments `names` (their files unlinked
/// or not).
pub fn shm_mappings(names: &[impl AsRef<str>]) -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("/proc/self/maps")
        .lines()
        .filter(|l| {
            names
                .iter()
                .any(|n| l.contains(&format!("/dev/shm/{}", n.as_ref())))
        })
        .count()
}

/// The provider the tests run over: `XFABRIC_TEST_PROVIDER`, "shm" when unset. Children started
/// by `spawn` inherit the environment, so both ends of a test use the same provider.
pub fn test_provider() -> String {
    std::env::var("XFABRIC_TEST_PROVIDER").unwrap_or_else(|_| "shm".into())
}

/// For a test that differs from `sibling` only by shm's `XFABRIC_SHM_CMA=0` (its path without
/// cross-memory attach): true, saying so, where the provider is not shm, whose variable it is,
/// and the test would repeat `sibling`.
pub fn skip_shm_variant(sibling: &str) -> bool {
    let p = test_provider();
    if p == "shm" {
        return false;
    }
    eprintln!("skipped: XFABRIC_SHM_CMA=0 is shm's; over {p} this would repeat {sibling}");
    true
}

/// The role this process plays, when it is a child started by `spawn`.
pub fn role() -> Option<String> {
    std::env::var("XF_ROLE").ok()
}

/// A child process running `test_name` in role `role`.
pub struct Peer {
    pub child: Child,
    pub stdin: ChildStdin,
    pub stdout: BufReader<ChildStdout>,
}

/// Starts this test binary again, running only `test_name`, with `XF_ROLE=role` and `envs`.
/// With `XFABRIC_TEST_PEER_NETNS=NS` the child runs in network namespace NS (another "host";
/// tests/tcp_netns.rs runs the conformance suite that way).
pub fn spawn(test_name: &str, role: &str, envs: &[(&str, &str)]) -> Peer {
    match std::env::var("XFABRIC_TEST_PEER_NETNS") {
        Ok(ns) => spawn_via(&["ip", "netns", "exec", &ns], test_name, role, envs),
        Err(_) => spawn_via(&[], test_name, role, envs),
    }
}

/// As `spawn`, started through the command `via` (e.g. `ip netns exec NS`), which must run
/// its arguments with the environment it was given.
pub fn spawn_via(via: &[&str], test_name: &str, role: &str, envs: &[(&str, &str)]) -> Peer {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = match via.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    // --include-ignored: the child must run its half even when the test is run with --ignored.
    cmd.args([
        "--exact",
        test_name,
        "--nocapture",
        "--test-threads=1",
        "--include-ignored",
    ])
    .env("XF_ROLE", role)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn peer");
    let stdin = child.stdin.take().expect("stdin");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    Peer {
        child,
        stdin,
        stdout,
    }
}

impl Peer {
    /// Reads the next line the child wrote with `say`, skipping the test harness's own lines.
    pub fn hear(&mut self) -> String {
        let pid = self.child.id();
        let out = &mut self.stdout;
        // Bounded: a child that never says its line (a test's steps out of order, a hang) is
        // killed, which ends the read.
        let line = bounded(
            pid,
            Duration::from_secs(120),
            "the peer's next line",
            || loop {
                let mut line = String::new();
                let n = out.read_line(&mut line).expect("read from peer");
                if n == 0 {
                    return None;
                }
                // libtest may print "test name ... " without a newline just before our line.
                if let Some(i) = line.find("XF> ") {
                    return Some(line[i + 4..].trim_end().to_string());
                }
            },
        );
        line.expect("peer exited before saying anything")
    }

    /// `hear`, progressing `n`'s endpoint meanwhile (no CQ read: entries stay where they are):
    /// over a transport whose connection setup needs this side's progress (tcp's handshake),
    /// the child's sends would otherwise wait for it while it waits for them.
    pub fn hear_progressing(&mut self, n: &Node) -> String {
        std::thread::scope(|s| {
            let line = s.spawn(|| self.hear());
            while !line.is_finished() {
                n.ep.progress();
            }
            line.join().expect("hear")
        })
    }

    /// Sends a line to the child (read with `listen`).
    pub fn tell(&mut self, s: &str) {
        writeln!(self.stdin, "{s}").expect("write to peer");
        self.stdin.flush().expect("flush");
    }

    /// Waits (bounded) for the child to exit successfully.
    pub fn join(mut self) {
        let pid = self.child.id();
        let child = &mut self.child;
        let st = bounded(pid, Duration::from_secs(120), "peer", || child.wait())
            .expect("wait for the peer");
        assert!(st.success(), "peer failed: {st}");
    }

    /// Kills the child with SIGKILL and reaps it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `wait` (a blocking wait on process `pid`) and returns what it returns; if that takes
/// longer than `limit`, kills the process (so the wait returns) and panics naming `what`.
/// The wait blocks on the process itself: no polling, no sleeping.
pub fn bounded<T: Send>(
    pid: u32,
    limit: Duration,
    what: &str,
    wait: impl FnOnce() -> T + Send,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(move || {
            let _ = tx.send(wait());
        });
        match rx.recv_timeout(limit) {
            Ok(r) => r,
            Err(_) => {
                // SAFETY: kill(2) on a pid; the process is not reaped yet (its wait is still
                // blocked on it), so the pid still names it.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                let _ = rx.recv();
                panic!("{what} did not finish within {limit:?}");
            }
        }
    })
}

/// In a child: writes a line for the parent's `hear`.
pub fn say(s: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "XF> {s}").expect("stdout");
    out.flush().expect("flush");
}

/// In a child: drives `n`'s progress (reading its CQ, the entries dropped) until the parent
/// says `word`, so that what the parent still waits for (a read of this side's memory, an
/// answer) is served whenever it arrives.
pub fn serve_until(n: &Node, word: &str) {
    let stop = std::sync::atomic::AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(120);
    let heard = std::thread::scope(|s| {
        // Any line ends the serving (a parent gone reads as an empty one): the check is
        // after, so that a wrong word fails the test instead of leaving this loop spinning.
        let h = s.spawn(|| {
            let got = listen();
            stop.store(true, std::sync::atomic::Ordering::Release);
            got
        });
        let mut buf = [CqTaggedEntry::default(); 4];
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            assert!(Instant::now() < deadline, "served 120 s without a word");
            let _ = n.cq.read(&mut buf);
        }
        h.join().expect("listen")
    });
    assert_eq!(heard, word);
}

/// In a child: reads a line the parent sent with `tell`.
pub fn listen() -> String {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("stdin");
    line.trim_end().to_string()
}

/// Hex encoding for addresses on the control channel (the library's one helper).
pub fn hex(b: &[u8]) -> String {
    xfabric::hex::encode(b)
}

/// Decodes `hex`; a test's peer sending anything else is a failed test.
pub fn unhex(s: &str) -> Vec<u8> {
    xfabric::hex::decode(s).expect("hex address from the peer")
}

/// A deterministic byte pattern for `len` bytes, distinct per `seed`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Runs `role` of `test` in a child with `env` and then `extra` in its environment, which says
/// "OK" when its side (and whatever it started) passed; checks it left no segment behind.
pub fn run_child(test: &str, role: &str, env: &[(&str, String)], extra: &[(&str, &str)]) {
    let mut all: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    all.extend_from_slice(extra);
    let mut child = spawn(test, role, &all);
    assert_eq!(child.hear(), "OK");
    let pid = child.pid();
    child.join();
    assert_eq!(segments_of(pid), 0, "the {role} left a segment");
}

/// Number of xfabric segments in /dev/shm whose name contains `pid`.
pub fn segments_of(pid: u32) -> usize {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.starts_with("xfabric-shm-") && n.contains(&format!("-{pid}-"))
                })
                .count()
        })
        .unwrap_or(0)
}

// ---- Helpers for the shm_* tests: bounded waits, one-shot handshakes, message builders. ----

/// The bound on every wait below: far beyond what a passing test needs, short enough that a
/// hang fails the test instead of the run.
pub const BOUND: Duration = Duration::from_secs(10);

/// `BOUND` for a completion over the provider under test: over verbs the tests run in the
/// Soft-RoCE VM, whose emulated CPU takes several seconds for a 4 MiB message when the host is
/// busy (the same test on the tree before: 47.6 s alone for what takes 1 s over shm).
pub fn completion_bound() -> Duration {
    if test_provider() == "verbs" {
        6 * BOUND
    } else {
        BOUND
    }
}

/// `completion_bound` in milliseconds, for the waits that take a timeout (counters, `sread`).
pub fn completion_ms() -> i32 {
    completion_bound().as_millis() as i32
}

/// As `node_with`, with a CQ of `cq_size` entries, and `before_enable` run after the CQ and AV
/// are bound and before the endpoint is enabled (bindings freeze at enable: counters go there).
pub fn node_custom(
    caps: u64,
    progress: Progress,
    adjust: impl FnOnce(&mut Info),
    cq_size: usize,
    before_enable: impl FnOnce(&Domain, &Endpoint),
) -> Node {
    let mut hints = Info {
        caps,
        ..Default::default()
    };
    hints.fabric_attr.prov_name = Some(test_provider());
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.domain_attr.data_progress = progress;
    if std::env::var("XFABRIC_TEST_MR_MODE").as_deref() == Ok("nic") {
        // Provider keys and virtual addresses, as verbs applications ask: with verbs, the
        // keys are the NIC's and one-sided operations go through it.
        hints.domain_attr.mr_mode = FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
    }
    adjust(&mut hints);
    let info = getinfo(fi_version(1, 17), None, None, 0, Some(&hints)).expect("getinfo")[0].clone();
    let fabric = xfabric::fabric(&info.fabric_attr).expect("fabric");
    let domain = fabric.domain(&info).expect("domain");
    let cq = domain
        .cq_open(&CqAttr {
            format: CqFormat::Tagged,
            wait_obj: WaitObj::Unspec,
            size: cq_size,
            ..Default::default()
        })
        .expect("cq");
    let av = domain.av_open(&AvAttr::default()).expect("av");
    let ep = domain.endpoint(&info).expect("endpoint");
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).expect("bind cq");
    ep.bind_av(&av).expect("bind av");
    before_enable(&domain, &ep);
    ep.enable().expect("enable");
    Node {
        fabric,
        domain,
        cq,
        av,
        ep,
        info,
    }
}

/// An enabled endpoint of `domain` with `info`, bound to its own CQ (`cq`) and AV.
pub fn enabled_ep(
    domain: &Domain,
    info: &Info,
    cq: &CqAttr,
) -> (CompletionQueue, AddressVector, Endpoint) {
    let cq = domain.cq_open(cq).expect("cq");
    let av = domain.av_open(&AvAttr::default()).expect("av");
    let ep = domain.endpoint(info).expect("endpoint");
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).expect("bind cq");
    ep.bind_av(&av).expect("bind av");
    ep.enable().expect("enable");
    (cq, av, ep)
}

/// The bytes of a tagged message frame (`Frame::Msg`: its control part, then `body`), as a
/// raw peer writes one into a lane (`RawPeer::send_raw` with kind `FRAME`).
pub fn tagged_frame(tag: u64, body: &[u8]) -> Vec<u8> {
    use xfabric_core::rdm::wire::{self, Frame};
    let f = Frame::Msg {
        id: 0,
        tag,
        data: 0,
        flags: wire::flags::TAGGED,
    };
    let mut b = f.ctrl(body.len() as u64).as_bytes().to_vec();
    b.extend_from_slice(body);
    b
}

/// What the next completion turned out to be.
#[derive(Debug)]
pub enum Completion {
    /// A success entry and its source (`FI_ADDR_NOTAVAIL` unless `FI_SOURCE` resolved one).
    Ok(CqTaggedEntry, FiAddr),
    /// An error entry and a copy of its error data.
    Err(CqErrEntry, Option<Vec<u8>>),
}

impl Node {
    /// Waits (bounded by `completion_bound`) for the next completion of either kind.
    pub fn next(&self) -> Completion {
        let bound = completion_bound();
        let deadline = Instant::now() + bound;
        let mut buf = [CqTaggedEntry::default(); 1];
        let mut src = [FI_ADDR_NOTAVAIL; 1];
        loop {
            match self.cq.readfrom(&mut buf, &mut src) {
                Ok(_) => return Completion::Ok(buf[0], src[0]),
                Err(Error::Avail) => {
                    let (e, d) = self.cq.readerr_data().expect("readerr after Avail");
                    return Completion::Err(e, d);
                }
                Err(Error::Again(_)) => {}
                Err(e) => panic!("cq readfrom: {e}"),
            }
            assert!(Instant::now() < deadline, "no completion within {bound:?}");
        }
    }

    /// Waits (bounded) for `n` successful completions with their sources; panics on an error.
    pub fn wait_from(&self, n: usize) -> Vec<(CqTaggedEntry, FiAddr)> {
        (0..n)
            .map(|_| match self.next() {
                Completion::Ok(e, s) => (e, s),
                Completion::Err(e, _) => panic!("error completion: {e:?}"),
            })
            .collect()
    }

    /// Retries `post` while it says `Again`, driving progress in between (bounded by
    /// `completion_bound`: room comes back as the peer takes in what was sent).
    pub fn retry(&self, mut post: impl FnMut() -> Result<()>) {
        let bound = completion_bound();
        let deadline = Instant::now() + bound;
        loop {
            match post() {
                Ok(()) => return,
                Err(Error::Again(_)) => {
                    self.ep.progress();
                }
                Err(e) => panic!("post: {e}"),
            }
            assert!(Instant::now() < deadline, "still Again after {bound:?}");
        }
    }
}

/// Parent side of the usual handshake: inserts the child's address and tells it ours.
pub fn connect(peer: &mut Peer, n: &Node) -> FiAddr {
    let addr = n.add_peer(&unhex(&peer.hear()));
    peer.tell(&hex(&n.ep.getname().unwrap()));
    addr
}

/// Child side of `connect`.
pub fn connect_parent(n: &Node) -> FiAddr {
    say(&hex(&n.ep.getname().unwrap()));
    n.add_peer(&unhex(&listen()))
}

/// One end of the control channel, so one function can play a role in either process.
pub enum Ctl<'a> {
    /// The parent, talking to its child.
    Parent(&'a mut Peer),
    /// A child, talking to its parent.
    Child,
}

impl Ctl<'_> {
    /// Sends a line to the other side.
    pub fn tell(&mut self, s: &str) {
        match self {
            Ctl::Parent(p) => p.tell(s),
            Ctl::Child => say(s),
        }
    }

    /// Reads the other side's next line.
    pub fn hear(&mut self) -> String {
        match self {
            Ctl::Parent(p) => p.hear(),
            Ctl::Child => listen(),
        }
    }

    /// Reads the next line and checks it is `want`.
    pub fn expect(&mut self, want: &str) {
        let got = self.hear();
        assert_eq!(got, want, "control channel out of step");
    }
}

impl Peer {
    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `join`, then asserts the child left no shm segment behind.
    pub fn join_leaving_nothing(self) {
        let pid = self.pid();
        self.join();
        assert_eq!(segments_of(pid), 0, "process {pid} left a segment");
    }
}

/// Reclaims the segments of killed (and reaped) process `pid`, as any endpoint's sweep would.
/// Its flock went with it, so one pass removes them (or another process's domain open
/// already did).
pub fn reclaim(pid: u32) {
    xfabric::providers::shm::segment::reclaim_stale();
    assert_eq!(segments_of(pid), 0, "stale segment of {pid} still there");
}

/// A tagged message description over `iov` (`struct fi_msg_tagged`).
pub fn tmsg(iov: &[RawIov], addr: FiAddr, ctx: Context, tag: u64, ignore: u64) -> Msg<'_> {
    Msg {
        iov,
        desc: &[],
        addr,
        context: ctx,
        data: 0,
        tag,
        ignore,
    }
}
