//! Shared pieces of the multi-process tests: opening an endpoint, and running a role of a test
//! in a child process (the test binary re-executed with `XF_ROLE` set), with addresses
//! exchanged over the child's stdin and stdout.

#![allow(dead_code)]

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

/// Opens an shm endpoint with `caps`, a tagged-format CQ for both directions, and a table AV.
pub fn node(caps: u64, progress: Progress) -> Node {
    node_with(caps, progress, |_| {})
}

/// As `node`, letting the caller adjust the hints first.
pub fn node_with(caps: u64, progress: Progress, adjust: impl FnOnce(&mut Info)) -> Node {
    let mut hints = Info {
        caps,
        ..Default::default()
    };
    hints.fabric_attr.prov_name = Some("shm".into());
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.domain_attr.data_progress = progress;
    adjust(&mut hints);
    let info = getinfo(fi_version(1, 17), None, None, 0, Some(&hints)).expect("getinfo")[0].clone();
    let fabric = xfabric::fabric(&info.fabric_attr).expect("fabric");
    let domain = fabric.domain(&info).expect("domain");
    let cq = domain
        .cq_open(&CqAttr {
            format: CqFormat::Tagged,
            wait_obj: WaitObj::Unspec,
            size: 4096,
            ..Default::default()
        })
        .expect("cq");
    let av = domain.av_open(&AvAttr::default()).expect("av");
    let ep = domain.endpoint(&info).expect("endpoint");
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).expect("bind cq");
    ep.bind_av(&av).expect("bind av");
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
pub fn spawn(test_name: &str, role: &str, envs: &[(&str, &str)]) -> Peer {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", test_name, "--nocapture", "--test-threads=1"])
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
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).expect("read from peer");
            assert!(n > 0, "peer exited before saying anything");
            // libtest may print "test name ... " without a newline just before our line.
            if let Some(i) = line.find("XF> ") {
                return line[i + 4..].trim_end().to_string();
            }
        }
    }

    /// Sends a line to the child (read with `listen`).
    pub fn tell(&mut self, s: &str) {
        writeln!(self.stdin, "{s}").expect("write to peer");
        self.stdin.flush().expect("flush");
    }

    /// Waits (bounded) for the child to exit successfully.
    pub fn join(mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                assert!(st.success(), "peer failed: {st}");
                return;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("peer did not exit in time");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
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

/// In a child: writes a line for the parent's `hear`.
pub fn say(s: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "XF> {s}").expect("stdout");
    out.flush().expect("flush");
}

/// In a child: reads a line the parent sent with `tell`.
pub fn listen() -> String {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("stdin");
    line.trim_end().to_string()
}

/// Hex encoding for addresses on the control channel.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Decodes `hex`.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
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
