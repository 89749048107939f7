//! Debian's `fi_pingpong` (libfabric-bin), server and client both on this libfabric.so, over
//! shm RDM endpoints: every transfer size (`-S all`) with data checks (`-c`), in message and in
//! tagged mode. Both must exit 0 and print the results table up to the largest size.
//!
//! Skipped with a printed reason where fi_pingpong is not installed (scripts/setup.sh installs
//! it), except under CI.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

mod common;
use common::{output_within, so1_dir};

const FI_PINGPONG: &str = "/usr/bin/fi_pingpong";
/// Both sides together, every size, in a debug build on a loaded machine: generous.
const LIMIT: Duration = Duration::from_secs(240);

fn have_fi_pingpong() -> bool {
    let ok = Path::new(FI_PINGPONG).exists();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI needs libfabric-bin (scripts/setup.sh)"
        );
        eprintln!("skipped: {FI_PINGPONG} missing (libfabric-bin; scripts/setup.sh installs it)");
    }
    ok
}

/// A TCP port nobody listens on now (pingpong's control connection).
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

fn pingpong(args: &[&str]) -> Command {
    let mut cmd = Command::new(FI_PINGPONG);
    cmd.args(["-p", "shm", "-e", "rdm", "-I", "3", "-S", "all", "-c"])
        .args(args)
        .env("LD_LIBRARY_PATH", so1_dir())
        .env_remove("FI_PROVIDER")
        .env_remove("FI_LOG_LEVEL");
    cmd
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Whether `port` is in LISTEN state in /proc/net/tcp, polled until it is, the server has
/// exited, or [`LIMIT`] has passed.
fn wait_listening<T>(port: &u16, server: &std::thread::ScopedJoinHandle<'_, T>) -> bool {
    let want = format!(":{port:04X} ");
    let deadline = std::time::Instant::now() + LIMIT;
    while std::time::Instant::now() < deadline && !server.is_finished() {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        // Fields: sl local_address rem_address st ...; LISTEN is state 0A.
        let up = table.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && format!("{} ", f[1]).ends_with(&want) && f[3] == "0A"
        });
        if up {
            return true;
        }
        // A poll interval, not a wait for an outcome: the table has no change notification.
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Runs a server and a client in `mode`; both outputs, each after asserting success and a
/// results table that reaches pingpong's largest size.
fn run(mode: &str) {
    let port = free_port();
    let server = pingpong(&["-m", mode, "-B", &port.to_string()]);
    let client = pingpong(&["-m", mode, "-P", &port.to_string(), "127.0.0.1"]);
    let (s, c) = std::thread::scope(|sc| {
        let s = sc.spawn(|| output_within(server, LIMIT, "fi_pingpong server"));
        // The client gives up at once if the server's control port is not listening yet, and
        // a probe connection would be taken for the client: look at the socket table instead.
        let listening = wait_listening(&port, &s);
        let c = sc.spawn(move || {
            assert!(listening, "fi_pingpong server never listened on {port}");
            output_within(client, LIMIT, "fi_pingpong client")
        });
        (s.join(), c.join())
    });
    let (s, c) = (
        s.unwrap_or_else(|_| panic!("server side of {mode}")),
        c.unwrap_or_else(|_| panic!("client side of {mode}")),
    );
    for (who, o) in [("server", &s), ("client", &c)] {
        let t = text(o);
        assert!(o.status.success(), "{mode} {who}: {:?}\n{t}", o.status);
        assert!(
            t.contains("bytes   #sent   #ack"),
            "{mode} {who}: no table\n{t}"
        );
        for size in ["\n1 ", "\n64 ", "\n4k ", "\n1m ", "\n6m "] {
            assert!(t.contains(size), "{mode} {who}: size {size:?} missing\n{t}");
        }
    }
}

#[test]
fn fi_pingpong_rdm_msg_every_size_checked() {
    if have_fi_pingpong() {
        run("msg");
    }
}

#[test]
fn fi_pingpong_rdm_tagged_every_size_checked() {
    if have_fi_pingpong() {
        run("tagged");
    }
}
