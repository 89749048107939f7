//! xfabric across "machines": two network namespaces joined by a veth pair
//! (tests/common/netns.rs), one process in each, over the tcp provider. The test makes the
//! namespaces and removes them (also when it fails); where namespaces cannot be made (not
//! root, no `ip`), it says so and skips.
//! Traffic stays between the two namespaces this test created.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::netns::*;
use common::*;
use xfabric::*;

fn example(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.parent()?.join("examples").join(name);
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "examples are not built: run the suite as scripts/test.sh does"
    );
    eprintln!("skipped: the {name} example is not built (cargo build --examples)");
    None
}

fn in_ns(ns: &str, exe: &PathBuf, args: &[&str]) -> std::process::Child {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a process in a namespace")
}

fn finish(child: std::process::Child, what: &str) -> Output {
    let pid = child.id();
    let out = bounded(pid, Duration::from_secs(120), what, || {
        child.wait_with_output()
    })
    .expect("wait");
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn pingpong_between_two_hosts_checks_every_byte() {
    let Some(exe) = example("pingpong") else {
        return;
    };
    let Some(h) = hosts_or_skip(0) else { return };
    for op in [None, Some("tagged")] {
        for size in ["8", "64k", "4m"] {
            let mut args = vec!["-p", "tcp", "-e", "rdm", "-c", "-I", "20", "-S", size];
            if let Some(o) = op {
                args.extend(["-o", o]);
            }
            let server = in_ns(&h.a, &exe, &args);
            let mut cargs = args.clone();
            cargs.push(&h.ip_a);
            // The client retries a refused control connection while the server starts.
            let client = in_ns(&h.b, &exe, &cargs);
            let c = finish(client, "pingpong client");
            let s = finish(server, "pingpong server");
            let text = String::from_utf8_lossy(&c.stdout);
            assert!(text.contains("usec/xfer"), "{text}");
            let _ = s;
        }
    }
}

#[test]
fn xpu_pipeline_between_two_hosts_checks_every_byte() {
    let Some(exe) = example("xpu_pipeline") else {
        return;
    };
    let Some(h) = hosts_or_skip(1) else { return };
    let args = [
        "--provider",
        "tcp",
        "--peer-netns",
        &h.b,
        "--xpu",
        "cpu",
        "--rounds",
        "2",
        "--buckets",
        "16",
    ];
    let out = finish(in_ns(&h.a, &exe, &args), "xpu_pipeline");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("2 rounds, every byte checked by the peer"),
        "{text}"
    );
}

#[test]
fn moe_dispatch_across_two_hosts_checks_every_token() {
    let Some(exe) = example("moe_dispatch") else {
        return;
    };
    let Some(h) = hosts_or_skip(5) else { return };
    // Two ranks on each host: each routes tokens over loopback and across the link.
    let netns = format!("{},{},{},{}", h.a, h.a, h.b, h.b);
    let args = [
        "--provider",
        "tcp",
        "--netns",
        &netns,
        "--ranks",
        "4",
        "--tokens",
        "64",
        "--rounds",
        "2",
        "--work",
        "1",
    ];
    let child = Command::new(&exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start moe_dispatch");
    let out = finish(child, "moe_dispatch");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("2 rounds, every byte checked by its receiver"),
        "{text}"
    );
}

/// The conformance suite's test binary, built beside this one (cargo names it
/// `conformance-HASH` in the same directory; the newest wins).
fn conformance_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("conformance-") && !n.contains('.'))
        })
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

#[test]
fn the_conformance_suite_passes_between_two_hosts() {
    let Some(bin) = conformance_binary() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "the conformance test binary is not built: run the suite as scripts/test.sh does"
        );
        eprintln!("skipped: the conformance test binary is not built (cargo test --no-run)");
        return;
    };
    let Some(h) = hosts_or_skip(3) else { return };
    // The parent runs in A, every child it starts in B (common::spawn).
    let child = Command::new("ip")
        .args(["netns", "exec", &h.a])
        .arg(&bin)
        .args(["--test-threads=1"])
        .env("XFABRIC_TEST_PROVIDER", "tcp")
        .env("XFABRIC_TEST_PEER_NETNS", &h.b)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the conformance suite in namespace A");
    let out = finish(child, "the conformance suite across namespaces");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("test result: ok"), "{text}");
    assert!(!text.contains(" 0 passed"), "{text}");
}

/// Host A's start in the vanishing tests: one message to B, then the word that B's link is
/// cut.
fn talk_until_cut() -> (Node, FiAddr) {
    let n = tcp_node();
    let b = connect_parent(&n);
    let m = [7u8; 8];
    // SAFETY: m outlives the completion waited for.
    unsafe { n.ep.tsend(&m, None, b, 0, 1) }.unwrap();
    n.wait_one();
    say("sent");
    assert_eq!(listen(), "cut");
    (n, b)
}

/// Starts hosts A and B of `test` in their namespaces, with two seconds of silence as the
/// bound (1 s idle, then probes a second apart; the test waits on outcomes, not on a clock:
/// each wait is bounded at 60 s only to never hang), lets A send B one message, then cuts
/// B's link: B's host drops off the network without a word, A's packets go nowhere.
fn talk_then_cut(h: &Hosts, test: &str) -> (Peer, Peer) {
    let env = [("XFABRIC_TCP_DEAD_MS", "2000")];
    let mut b = spawn_via(&["ip", "netns", "exec", &h.b], test, "b", &env);
    let mut a = spawn_via(&["ip", "netns", "exec", &h.a], test, "a", &env);
    let b_addr = b.hear();
    a.tell(&b_addr);
    let a_addr = a.hear();
    b.tell(&a_addr);
    assert_eq!(a.hear(), "sent");
    assert_eq!(b.hear(), "got");
    ip(&["-n", &h.b, "link", "set", &h.dev_b, "down"]).expect("cut B's link");
    a.tell("cut");
    (a, b)
}

const VANISH_BUSY: &str = "a_host_that_vanishes_mid_transfer_is_noticed_by_time";

/// Host A: talks to B, then (after B's link is cut) sends to B over the connection that is
/// still up: its bytes go unacknowledged, and the send must fail by time.
fn sending_host() {
    let (n, b) = talk_until_cut();
    let big = vec![9u8; 4 << 20];
    // SAFETY: big outlives the completion waited for.
    unsafe { n.ep.tsend(&big, None, b, 0, 2) }.unwrap();
    let e = n.wait_err();
    say(&format!("send {} {}", e.op_context, e.err));
}

/// The busy half of the test below: the connection carries data nobody acknowledges.
/// Keepalive does not probe such a connection, and without `TCP_USER_TIMEOUT` (which would
/// also end a connection whose receiver merely holds us back) the kernel retransmits for
/// ~15 minutes: the connection look's `TCP_INFO` reading ends it after the bound.
#[test]
fn a_host_that_vanishes_mid_transfer_is_noticed_by_time() {
    match role().as_deref() {
        Some("b") => return vanishing_host(),
        Some("a") => return sending_host(),
        _ => {}
    }
    let Some(h) = hosts_or_skip(4) else { return };
    let (mut a, b) = talk_then_cut(&h, VANISH_BUSY);
    assert_eq!(a.hear(), format!("send 2 {}", errno::FI_ETIMEDOUT));
    a.join();
    b.kill();
}

const VANISH: &str = "a_host_that_vanishes_is_noticed_by_time_busy_or_idle";

fn tcp_node() -> Node {
    node_with(
        FI_MSG | FI_TAGGED | FI_DIRECTED_RECV,
        Progress::Manual,
        |h| h.fabric_attr.prov_name = Some("tcp".into()),
    )
}

/// Host B: takes one message from A, then only waits (its link is cut under it).
fn vanishing_host() {
    let n = tcp_node();
    let a = connect_parent(&n);
    let mut b = [0u8; 8];
    // SAFETY: b outlives the completion waited for.
    unsafe { n.ep.trecv(&mut b, None, a, 0, 0, 1) }.unwrap();
    n.wait_one();
    say("got");
    // Until the parent kills us.
    let _ = listen();
}

/// Host A: talks to B, then (after B's link is cut: no RST, no FIN, nothing) waits on a
/// receive directed at B over an idle connection, then sends to B. Both must fail.
fn surviving_host() {
    let (n, b) = talk_until_cut();
    let mut r = [0u8; 8];
    // SAFETY: r outlives the completion waited for.
    unsafe { n.ep.trecv(&mut r, None, b, 0, 0, 2) }.unwrap();
    let e = n.wait_err();
    say(&format!("recv {} {}", e.op_context, e.err));
    let big = vec![9u8; 1 << 20];
    // SAFETY: big outlives the completion waited for.
    unsafe { n.ep.tsend(&big, None, b, 0, 3) }.unwrap();
    let e = n.wait_err();
    say(&format!("send {} {}", e.op_context, e.err));
}

#[test]
fn a_host_that_vanishes_is_noticed_by_time_busy_or_idle() {
    match role().as_deref() {
        Some("b") => return vanishing_host(),
        Some("a") => return surviving_host(),
        _ => {}
    }
    let Some(h) = hosts_or_skip(2) else { return };
    let (mut a, b) = talk_then_cut(&h, VANISH);
    // The idle connection: keepalive probes go unanswered.
    assert_eq!(a.hear(), format!("recv 2 {}", errno::FI_ETIMEDOUT));
    // A new connection to a host that is gone fails too (bring-up or the user timeout).
    let sent = a.hear();
    eprintln!("after the cut: {sent}");
    let rest = sent.strip_prefix("send 3 ").expect(&sent);
    assert_ne!(rest, "0", "{sent}");
    a.join();
    b.kill();
}
