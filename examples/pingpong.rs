//! A ping-pong latency and bandwidth test with fi_pingpong's command line and output, so the two
//! can be run side by side and their numbers compared column for column.
//!
//! ```text
//! server$ cargo run --release --example pingpong -- -p shm -e rdm -I 10000 -S 8
//! client$ cargo run --release --example pingpong -- -p shm -e rdm -I 10000 -S 8 localhost
//! ```
//!
//! Endpoint addresses are exchanged over a TCP control connection (fi_pingpong's port, 47592,
//! unless `-B`/`-P` or `XFABRIC_PINGPONG_PORT` say otherwise). The data path is manual progress
//! with busy-polled completion queues. As in fi_pingpong, `usec/xfer` is half a round trip and
//! both sides print their own measurement.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use xfabric::*;

/// fi_pingpong's control port.
const DEFAULT_PORT: u16 = 47592;
/// The largest transfer size accepted: each side holds two buffers of it.
const MAX_SIZE: usize = 1 << 30;
/// How long a client keeps retrying a refused control connection.
const CONNECT_RETRY: Duration = Duration::from_secs(5);
/// How long a wait for a completion may go without one before the peer is declared gone.
const DEFAULT_STALL: Duration = Duration::from_secs(30);
/// The one receive and the one send in flight, told apart by their contexts.
const RX_CTX: Context = 0x5258;
const TX_CTX: Context = 0x5458;
/// The tag used in tagged mode.
const TAG: u64 = 0x7070;

type Res<T> = Result<T, String>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse(&args) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            print!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("pingpong: {e} (-h for help)");
            return ExitCode::from(2);
        }
    };
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pingpong: error: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Command line

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Msg,
    Tagged,
}

#[derive(Debug)]
struct Opts {
    provider: String,
    domain: Option<String>,
    ep_type: EpType,
    iterations: usize,
    sizes: Vec<usize>,
    src_port: Option<u16>,
    dst_port: Option<u16>,
    check: bool,
    mode: Mode,
    verbose: bool,
    ipv6: bool,
    /// The server's host: present on the client only.
    server: Option<String>,
}

enum Parsed {
    Run(Opts),
    Help,
}

fn usage() -> String {
    format!(
        "Usage:
  pingpong [OPTIONS]\t\tstart server
  pingpong [OPTIONS] <srv_addr>\tconnect to server

Ping pong client and server over xfabric (fi_pingpong's options and output)

Options:
 -B <src_port>        source control port number (server: {DEFAULT_PORT}, client: auto)
 -P <dst_port>        destination control port number (client: {DEFAULT_PORT})
 -d <domain>          domain name
 -p <provider>        specific provider name (shm)
 -e <ep_type>         endpoint type: msg|rdm|dgram (rdm)
 -I <number>          number of iterations (10)
 -S <size>            specific transfer size or 'all' (64 256 1k 4k 64k 1m)
 -c                   enables data_integrity checks
 -m <transmit mode>   transmit mode type: msg|tagged (msg)
 -h                   display this help output
 -v                   enable debugging output
 -6                   use IPv6 address

XFABRIC_PINGPONG_PORT overrides the default control port ({DEFAULT_PORT}).
"
    )
}

fn parse(args: &[String]) -> Res<Parsed> {
    let mut o = Opts {
        provider: DEFAULT_PROVIDER.to_string(),
        domain: None,
        ep_type: EpType::Rdm,
        iterations: 10,
        sizes: default_sizes(),
        src_port: None,
        dst_port: None,
        check: false,
        mode: Mode::Msg,
        verbose: false,
        ipv6: false,
        server: None,
    };
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        i += 1;
        if !a.starts_with('-') || a == "-" {
            if o.server.replace(a.to_string()).is_some() {
                return Err(format!("more than one server address given ({a:?})"));
            }
            continue;
        }
        // Options take their value attached ("-I100") or as the next argument ("-I 100").
        let flag = a[1..].chars().next().expect("a has a character after '-'");
        let attached = &a[1 + flag.len_utf8()..];
        let mut value = |name: &str| -> Res<String> {
            if !attached.is_empty() {
                return Ok(attached.to_string());
            }
            let v = args
                .get(i)
                .ok_or_else(|| format!("option -{name} needs a value"))?;
            i += 1;
            Ok(v.clone())
        };
        match flag {
            'h' => return Ok(Parsed::Help),
            'c' | 'v' | '6' if !attached.is_empty() => {
                return Err(format!("option -{flag} takes no value (got {a:?})"))
            }
            'c' => o.check = true,
            'v' => o.verbose = true,
            '6' => o.ipv6 = true,
            'p' => o.provider = value("p")?,
            'd' => o.domain = Some(value("d")?),
            'e' => {
                o.ep_type = match value("e")?.as_str() {
                    "rdm" => EpType::Rdm,
                    "msg" => EpType::Msg,
                    "dgram" => EpType::Dgram,
                    other => {
                        return Err(format!("unknown endpoint type {other:?} (msg|rdm|dgram)"))
                    }
                }
            }
            'm' => {
                o.mode = match value("m")?.as_str() {
                    "msg" => Mode::Msg,
                    "tagged" => Mode::Tagged,
                    other => return Err(format!("unknown transmit mode {other:?} (msg|tagged)")),
                }
            }
            'I' => {
                let v = value("I")?;
                o.iterations = match v.parse::<usize>() {
                    Ok(n) if n > 0 => n,
                    _ => {
                        return Err(format!(
                            "-I wants a positive number of iterations, not {v:?}"
                        ))
                    }
                };
            }
            'S' => {
                let v = value("S")?;
                o.sizes = if v == "all" {
                    all_sizes()
                } else {
                    vec![parse_size(&v)?]
                };
            }
            'B' => o.src_port = Some(parse_port(&value("B")?)?),
            'P' => o.dst_port = Some(parse_port(&value("P")?)?),
            _ => return Err(format!("unknown option {a:?}")),
        }
    }
    Ok(Parsed::Run(o))
}

fn parse_port(s: &str) -> Res<u16> {
    s.parse::<u16>()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| format!("invalid port {s:?} (1 to 65535)"))
}

/// A byte count, optionally with a k/m/g suffix (powers of 1024).
fn parse_size(s: &str) -> Res<usize> {
    let bad =
        || format!("invalid transfer size {s:?} (a byte count such as 4096 or 64k, or 'all')");
    let (digits, shift) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: usize = digits.parse().map_err(|_| bad())?;
    let bytes = n.checked_mul(1 << shift).ok_or_else(bad)?;
    if bytes > MAX_SIZE {
        return Err(format!(
            "transfer size {s:?} is above this test's limit of 1 GiB"
        ));
    }
    Ok(bytes)
}

/// fi_pingpong's sizes when `-S` is not given.
fn default_sizes() -> Vec<usize> {
    vec![64, 256, 1 << 10, 4 << 10, 64 << 10, 1 << 20]
}

/// fi_pingpong's `-S all`: 0 to 3, then every power of two and the midpoint 1.5 times it, up to
/// 6 MiB.
fn all_sizes() -> Vec<usize> {
    let mut v = vec![0, 1, 2, 3];
    let mut p = 4usize;
    while p <= 4 << 20 {
        v.push(p);
        v.push(p + p / 2);
        p *= 2;
    }
    v
}

// ---------------------------------------------------------------------------------------------
// Output, in fi_pingpong's formats

/// A byte count in powers of 1024, one decimal below 10 ("1.5k", "12m", "768").
fn size_str(n: u64) -> String {
    let (base, mag) = if n >= 1 << 30 {
        (1u64 << 30, "g")
    } else if n >= 1 << 20 {
        (1 << 20, "m")
    } else if n >= 1 << 10 {
        (1 << 10, "k")
    } else {
        (1, "")
    };
    let whole = n / base;
    let tenth = if whole < 10 {
        (n % base) * 10 / base
    } else {
        0
    };
    if tenth > 0 {
        format!("{whole}.{tenth}{mag}")
    } else {
        format!("{whole}{mag}")
    }
}

/// A count in powers of 1000, truncated ("1k" for 1500).
fn cnt_str(n: u64) -> String {
    match n {
        1_000_000_000.. => format!("{}b", n / 1_000_000_000),
        1_000_000.. => format!("{}m", n / 1_000_000),
        1_000.. => format!("{}k", n / 1_000),
        _ => n.to_string(),
    }
}

const HEADER: &str =
    "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec";

/// One result row. A transfer is one direction of a round trip, so `usec/xfer` is half the
/// round-trip time; MB/sec counts both directions' bytes in decimal megabytes.
fn row(size: usize, iterations: usize, elapsed: Duration) -> String {
    let xfers = 2 * iterations as u64;
    let total = xfers * size as u64;
    let us = (elapsed.as_secs_f64() * 1e6).max(1e-3);
    format!(
        "{:<8}{:<8}={:<8}{:<8}{:8.2}s{:10.2}{:11.2}{:11.2}",
        size_str(size as u64),
        cnt_str(iterations as u64),
        cnt_str(iterations as u64),
        size_str(total),
        elapsed.as_secs_f64(),
        total as f64 / us,
        us / xfers as f64,
        xfers as f64 / us,
    )
}

// ---------------------------------------------------------------------------------------------
// Control connection

fn default_port() -> Res<u16> {
    match std::env::var("XFABRIC_PINGPONG_PORT") {
        Ok(v) => parse_port(&v).map_err(|e| format!("XFABRIC_PINGPONG_PORT: {e}")),
        Err(_) => Ok(DEFAULT_PORT),
    }
}

/// Server: listens on `-B` (or `-P`, so both sides can be given the same options) and takes one
/// client. std's listener sets SO_REUSEADDR, so back-to-back runs can reuse the port.
fn accept(o: &Opts) -> Res<TcpStream> {
    let port = match o.src_port.or(o.dst_port) {
        Some(p) => p,
        None => default_port()?,
    };
    let any: SocketAddr = if o.ipv6 {
        (std::net::Ipv6Addr::UNSPECIFIED, port).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, port).into()
    };
    let listener =
        TcpListener::bind(any).map_err(|e| format!("control: cannot listen on {any}: {e}"))?;
    if o.verbose {
        eprintln!("pingpong: waiting for a client on {any}");
    }
    let (s, peer) = listener
        .accept()
        .map_err(|e| format!("control: accept on {any}: {e}"))?;
    if o.verbose {
        eprintln!("pingpong: client {peer} connected");
    }
    Ok(s)
}

/// Client: connects to the server's control port, retrying a refused connection for a few
/// seconds so client and server may be started together.
fn connect(o: &Opts, host: &str) -> Res<TcpStream> {
    let port = match o.dst_port {
        Some(p) => p,
        None => default_port()?,
    };
    let mut addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("control: cannot resolve {host:?}: {e}"))?
        .filter(|a| a.is_ipv6() == o.ipv6 || host_is_name(host))
        .collect();
    // The server listens on one family: try that one's addresses first.
    addrs.sort_by_key(|a| a.is_ipv6() != o.ipv6);
    if addrs.is_empty() {
        return Err(format!("control: {host:?} has no usable address"));
    }
    let give_up = Instant::now() + CONNECT_RETRY;
    loop {
        let mut last = None;
        for a in &addrs {
            let r = match o.src_port {
                Some(sp) => connect_from(sp, a),
                None => TcpStream::connect_timeout(a, Duration::from_secs(2)),
            };
            match r {
                Ok(s) => return Ok(s),
                Err(e) => last = Some((a, e)),
            }
        }
        let (a, e) = last.expect("at least one address was tried");
        let retryable = matches!(
            e.kind(),
            io::ErrorKind::ConnectionRefused | io::ErrorKind::AddrInUse
        );
        if !retryable || Instant::now() >= give_up {
            return Err(format!("control: cannot connect to {a}: {e}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn host_is_name(host: &str) -> bool {
    host.parse::<std::net::IpAddr>().is_err()
}

/// Connects from a fixed local port (client `-B`), which std's TcpStream cannot do.
fn connect_from(src_port: u16, to: &SocketAddr) -> io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let family = if to.is_ipv6() {
        libc::AF_INET6
    } else {
        libc::AF_INET
    };
    // SAFETY: plain socket(2); the descriptor is owned by `stream` right below.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket nothing else owns; TcpStream closes it on drop.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: `one` outlives the call and its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let local: SocketAddr = if to.is_ipv6() {
        (std::net::Ipv6Addr::UNSPECIFIED, src_port).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, src_port).into()
    };
    let (l, ll) = sockaddr(&local);
    // SAFETY: `l` is a sockaddr of length `ll` living across the call.
    if unsafe { libc::bind(fd, (&l as *const libc::sockaddr_storage).cast(), ll) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let (r, rl) = sockaddr(to);
    // SAFETY: as for bind.
    if unsafe { libc::connect(fd, (&r as *const libc::sockaddr_storage).cast(), rl) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stream)
}

fn sockaddr(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all zeroes is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// The control connection: length-prefixed blobs and one-byte barriers.
struct Control(TcpStream);

impl Control {
    fn send_blob(&mut self, b: &[u8]) -> Res<()> {
        let mut msg = (b.len() as u32).to_le_bytes().to_vec();
        msg.extend_from_slice(b);
        self.0
            .write_all(&msg)
            .map_err(|e| format!("control: send to peer: {e}"))
    }

    fn recv_blob(&mut self) -> Res<Vec<u8>> {
        let mut len = [0u8; 4];
        self.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > 1 << 16 {
            return Err(format!(
                "control: peer sent a {len}-byte message; is it a pingpong?"
            ));
        }
        let mut b = vec![0u8; len];
        self.read_exact(&mut b)?;
        Ok(b)
    }

    fn read_exact(&mut self, b: &mut [u8]) -> Res<()> {
        self.0.read_exact(b).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => "control: peer closed the connection".to_string(),
            _ => format!("control: receive from peer: {e}"),
        })
    }

    /// Both sides pass only when both have arrived.
    fn barrier(&mut self) -> Res<()> {
        self.0
            .write_all(&[0xb7])
            .map_err(|e| format!("control: barrier: {e}"))?;
        let mut b = [0u8; 1];
        self.read_exact(&mut b)?;
        if b[0] != 0xb7 {
            return Err("control: peer is out of step".into());
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Fabric resources and the data path

/// One endpoint with its queues and the peer's address. Fields drop in order: the endpoint
/// before the queues it is bound to, those before the domain and fabric.
struct Node {
    ep: Endpoint,
    cq: CompletionQueue,
    av: AddressVector,
    _domain: Domain,
    _fabric: Fabric,
    info: Info,
    peer: FiAddr,
    mode: Mode,
    check: bool,
    /// Sends smaller than this go out with inject (no send completion), as fi_pingpong does.
    inject_size: usize,
    rx_posted: bool,
    tx_pending: bool,
    stall: Duration,
}

fn open(o: &Opts) -> Res<Node> {
    let mut hints = Info {
        caps: match o.mode {
            Mode::Msg => FI_MSG,
            Mode::Tagged => FI_TAGGED,
        },
        ..Default::default()
    };
    hints.fabric_attr.prov_name = Some(o.provider.clone());
    hints.domain_attr.name = o.domain.clone();
    hints.ep_attr.ep_type = o.ep_type;
    hints.domain_attr.data_progress = Progress::Manual;
    let info = getinfo(fi_version(1, 17), None, None, 0, Some(&hints))
        .map_err(|e| format!("getinfo (provider {}, {:?}): {e}", o.provider, o.ep_type))?
        .swap_remove(0);
    if o.verbose {
        eprintln!(
            "pingpong: provider {} domain {} inject_size {}",
            info.provider(),
            info.domain_attr.name.as_deref().unwrap_or("?"),
            info.tx_attr.inject_size
        );
    }
    let fabric = xfabric::fabric(&info.fabric_attr).map_err(|e| format!("fabric: {e}"))?;
    let domain = fabric.domain(&info).map_err(|e| format!("domain: {e}"))?;
    let cq = domain
        .cq_open(&CqAttr {
            format: CqFormat::Msg,
            wait_obj: WaitObj::None,
            size: 64,
            ..Default::default()
        })
        .map_err(|e| format!("cq_open: {e}"))?;
    let av = domain
        .av_open(&AvAttr::default())
        .map_err(|e| format!("av_open: {e}"))?;
    let ep = domain
        .endpoint(&info)
        .map_err(|e| format!("endpoint: {e}"))?;
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV)
        .map_err(|e| format!("bind cq: {e}"))?;
    ep.bind_av(&av).map_err(|e| format!("bind av: {e}"))?;
    ep.enable().map_err(|e| format!("enable: {e}"))?;
    let stall = match std::env::var("XFABRIC_PINGPONG_STALL_S") {
        Ok(v) => Duration::from_secs(
            v.parse()
                .map_err(|_| format!("XFABRIC_PINGPONG_STALL_S: not a number of seconds: {v:?}"))?,
        ),
        Err(_) => DEFAULT_STALL,
    };
    Ok(Node {
        inject_size: info.tx_attr.inject_size,
        ep,
        cq,
        av,
        _domain: domain,
        _fabric: fabric,
        info,
        peer: FI_ADDR_UNSPEC,
        mode: o.mode,
        check: o.check,
        rx_posted: false,
        tx_pending: false,
        stall,
    })
}

/// What both sides must agree on, so a mismatch is an error and not a hang.
fn settings(o: &Opts) -> Vec<u8> {
    format!(
        "xfabric-pingpong/1 iters={} sizes={:?} mode={:?} check={} ep={:?}",
        o.iterations, o.sizes, o.mode, o.check, o.ep_type
    )
    .into_bytes()
}

fn run(o: &Opts) -> Res<()> {
    // The buffers are made before the endpoint so they are dropped after it: on an early error
    // a posted receive may still be written until the endpoint is closed.
    let max = o.sizes.iter().copied().max().unwrap_or(0);
    let mut tx = vec![0u8; max];
    let mut rx = vec![0u8; max];
    let mut node = open(o)?;
    let mut ctl = Control(match &o.server {
        Some(host) => connect(o, host)?,
        None => accept(o)?,
    });
    let _ = ctl.0.set_nodelay(true);
    let name = node.ep.getname().map_err(|e| format!("getname: {e}"))?;
    ctl.send_blob(&name)?;
    ctl.send_blob(&settings(o))?;
    let peer_name = ctl.recv_blob()?;
    let peer_settings = ctl.recv_blob()?;
    if peer_settings != settings(o) {
        return Err(format!(
            "the peer was started with different options:\n  here: {}\n  peer: {}",
            String::from_utf8_lossy(&settings(o)),
            String::from_utf8_lossy(&peer_settings)
        ));
    }
    node.peer = node
        .av
        .insert_one(&peer_name)
        .map_err(|e| format!("av insert of the peer's address: {e}"))?;
    if o.verbose {
        eprintln!(
            "pingpong: local {} peer {}",
            node.av.straddr(&name),
            node.av.straddr(&peer_name)
        );
    }

    let client = o.server.is_some();
    println!("{HEADER}");
    for &size in &o.sizes {
        if size > node.info.ep_attr.max_msg_size {
            return Err(format!(
                "{size} bytes exceeds the provider's max_msg_size ({})",
                node.info.ep_attr.max_msg_size
            ));
        }
        let warmup = (o.iterations / 10).clamp(1, 100);
        // Each run's first receive is posted before the barrier, so the first message of the
        // timed run never arrives unexpected.
        node.post_recv(&mut rx[..size])?;
        ctl.barrier()?;
        node.pingpong(client, size, warmup, 0, &mut tx, &mut rx)?;
        node.post_recv(&mut rx[..size])?;
        ctl.barrier()?;
        let start = Instant::now();
        node.pingpong(client, size, o.iterations, 1, &mut tx, &mut rx)?;
        let elapsed = start.elapsed();
        println!("{}", row(size, o.iterations, elapsed));
        let _ = io::stdout().flush();
    }
    // Neither side closes its endpoint while the other may still be reading from it.
    ctl.barrier()?;
    Ok(())
}

impl Node {
    /// `count` round trips of `size` bytes, the first receive already posted; the client sends
    /// first. `phase` separates the warm-up's data pattern from the timed run's.
    fn pingpong(
        &mut self,
        client: bool,
        size: usize,
        count: usize,
        phase: u64,
        tx: &mut [u8],
        rx: &mut [u8],
    ) -> Res<()> {
        let (tx, rx) = (&mut tx[..size], &mut rx[..size]);
        // Seeds name (phase, size, iteration, direction), so stale or misrouted data fails.
        let seed = |i: usize, from_client: bool| {
            (phase << 62) ^ ((size as u64) << 32) ^ ((i as u64) << 1) ^ from_client as u64
        };
        for i in 0..count {
            if client {
                if self.check {
                    fill(tx, seed(i, true));
                }
                self.post_send(tx)?;
                self.wait(true)?;
                if self.check {
                    verify(rx, seed(i, false), i)?;
                }
                if i + 1 < count {
                    self.post_recv(rx)?;
                }
            } else {
                self.wait(true)?;
                if self.check {
                    verify(rx, seed(i, true), i)?;
                }
                if i + 1 < count {
                    self.post_recv(rx)?;
                }
                if self.check {
                    fill(tx, seed(i, false));
                }
                self.post_send(tx)?;
            }
        }
        self.wait(false)
    }

    fn post_recv(&mut self, buf: &mut [u8]) -> Res<()> {
        loop {
            // SAFETY: `buf` is a slice of the caller's receive buffer, which is neither read
            // nor written until `wait` has seen this receive's completion (`rx_posted` cleared).
            let r = unsafe {
                match self.mode {
                    Mode::Msg => self.ep.recv(buf, None, self.peer, RX_CTX),
                    Mode::Tagged => self.ep.trecv(buf, None, self.peer, TAG, 0, RX_CTX),
                }
            };
            match r {
                Ok(()) => {
                    self.rx_posted = true;
                    return Ok(());
                }
                Err(Error::Again(_)) => {
                    self.poll()?;
                }
                Err(e) => return Err(format!("post receive: {e}")),
            }
        }
    }

    fn post_send(&mut self, buf: &[u8]) -> Res<()> {
        loop {
            let inject = buf.len() < self.inject_size;
            let r = if inject {
                match self.mode {
                    Mode::Msg => self.ep.inject(buf, self.peer),
                    Mode::Tagged => self.ep.tinject(buf, self.peer, TAG),
                }
            } else {
                // SAFETY: `buf` is not written again until `wait` has seen this send's
                // completion (`tx_pending` cleared): the next fill comes after a `wait`.
                unsafe {
                    match self.mode {
                        Mode::Msg => self.ep.send(buf, None, self.peer, TX_CTX),
                        Mode::Tagged => self.ep.tsend(buf, None, self.peer, TAG, TX_CTX),
                    }
                }
            };
            match r {
                Ok(()) => {
                    self.tx_pending = !inject;
                    return Ok(());
                }
                Err(Error::Again(_)) => {
                    self.poll()?;
                }
                Err(e) => return Err(format!("post send of {} bytes: {e}", buf.len())),
            }
        }
    }

    /// Busy-polls until the outstanding send (if any) and, with `rx`, the posted receive have
    /// completed.
    fn wait(&mut self, rx: bool) -> Res<()> {
        let mut spins = 0u32;
        let mut since = None;
        while self.tx_pending || (rx && self.rx_posted) {
            if self.poll()? {
                spins = 0;
                since = None;
                continue;
            }
            spins += 1;
            if spins.is_multiple_of(4096) {
                let t0 = *since.get_or_insert_with(Instant::now);
                if t0.elapsed() > self.stall {
                    return Err(format!(
                        "no completion for {} s (waiting for {}); is the peer alive?",
                        self.stall.as_secs(),
                        match (self.tx_pending, self.rx_posted && rx) {
                            (true, true) => "a send and a receive",
                            (true, false) => "a send",
                            _ => "a receive",
                        }
                    ));
                }
            }
        }
        Ok(())
    }

    /// One non-blocking CQ read (which drives progress); true when it returned something.
    fn poll(&mut self) -> Res<bool> {
        let mut entries = [CqMsgEntry::default(); 4];
        match self.cq.read(&mut entries) {
            Ok(n) => {
                for e in &entries[..n] {
                    match e.op_context {
                        RX_CTX => self.rx_posted = false,
                        TX_CTX => self.tx_pending = false,
                        other => return Err(format!("completion with unknown context {other:#x}")),
                    }
                }
                Ok(n > 0)
            }
            Err(Error::Again(_)) => Ok(false),
            Err(Error::Avail) => match self.cq.readerr() {
                Ok(e) => Err(format!(
                    "{} failed: {} (prov_errno {}, len {}, olen {})",
                    match e.op_context {
                        RX_CTX => "receive",
                        TX_CTX => "send",
                        _ => "operation",
                    },
                    strerror(e.err),
                    e.prov_errno,
                    e.len,
                    e.olen
                )),
                Err(e) => Err(format!("cq readerr: {e}")),
            },
            Err(e) => Err(format!("cq read: {e}")),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Integrity check (-c)

/// The pattern's key for one message: a splitmix64 finaliser of its seed.
fn key(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Word `index` of a message: distinct for every word, so a shifted or stale copy is caught,
/// and one multiply cheap, so `-c` costs little more than the copy it checks.
fn word(key: u64, index: usize) -> u64 {
    key ^ (index as u64).wrapping_mul(0xd6e8_feb8_6659_fd93)
}

fn fill(buf: &mut [u8], seed: u64) {
    let k = key(seed);
    let words = buf.len() / 8;
    let mut it = buf.chunks_exact_mut(8);
    for (i, c) in (&mut it).enumerate() {
        c.copy_from_slice(&word(k, i).to_le_bytes());
    }
    let tail = it.into_remainder();
    tail.copy_from_slice(&word(k, words).to_le_bytes()[..tail.len()]);
}

fn verify(buf: &[u8], seed: u64, iteration: usize) -> Res<()> {
    let k = key(seed);
    let good = buf
        .chunks_exact(8)
        .enumerate()
        .all(|(i, c)| u64::from_le_bytes(c.try_into().expect("8 bytes")) == word(k, i));
    let words = buf.len() / 8;
    let tail = &buf[words * 8..];
    if good && tail == &word(k, words).to_le_bytes()[..tail.len()] {
        return Ok(());
    }
    // Slow path, for the message only: find the first wrong byte.
    let (at, want, got) = buf
        .iter()
        .enumerate()
        .map(|(j, &b)| (j, word(k, j / 8).to_le_bytes()[j % 8], b))
        .find(|&(_, w, b)| w != b)
        .expect("a failed check has a differing byte");
    Err(format!(
        "data integrity check failed: {}-byte message of iteration {iteration}, byte {at}: \
         expected {want:#04x}, got {got:#04x}",
        buf.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_match_fi_pingpong() {
        assert_eq!(size_str(768), "768");
        assert_eq!(size_str(1536), "1.5k");
        assert_eq!(size_str(16000), "15k");
        assert_eq!(size_str(3000), "2.9k");
        assert_eq!(size_str(74_070_000), "70m");
        assert_eq!(cnt_str(1500), "1k");
        assert_eq!(cnt_str(12345), "12k");
        assert_eq!(
            row(768, 1, Duration::from_nanos(31_000)),
            "768     1       =1       1.5k        0.00s     49.55      15.50       0.06"
        );
    }

    #[test]
    fn verify_catches_one_wrong_byte() {
        let mut b = vec![0u8; 4099];
        fill(&mut b, 7);
        assert!(verify(&b, 7, 0).is_ok());
        assert!(verify(&b, 8, 0).is_err());
        b[4097] ^= 1;
        let e = verify(&b, 7, 3).unwrap_err();
        assert!(e.contains("byte 4097"), "{e}");
    }

    #[test]
    fn all_sizes_end_at_six_mib() {
        let v = all_sizes();
        assert_eq!(&v[..8], &[0, 1, 2, 3, 4, 6, 8, 12]);
        assert_eq!(*v.last().unwrap(), 6 << 20);
    }
}
