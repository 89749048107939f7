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
//!
//! `-o` picks the operation, as fabtests' RMA benchmarks do: `msg` and `tagged` ping-pong with
//! sends; `writedata` ping-pongs with RMA writes that carry remote CQ data (fi_rma_pingpong);
//! `write` and `read` are one-sided bandwidth tests in which the client keeps a window of `-W`
//! operations in flight on the server's registered buffer, `-I` windows in all (fi_rma_bw);
//! `fetchadd` is the same with 8-byte fetching atomic adds. In the one-sided tests the server
//! only makes progress (shm's target executes RMA) until the client says it is done, and both
//! print the client's measurement, per operation.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use xfabric::*;

#[path = "../common/mod.rs"]
mod common;
mod control;
mod rma;
use control::*;

/// fi_pingpong's control port.
const DEFAULT_PORT: u16 = 47592;
/// The largest transfer size accepted: each side holds two buffers of it.
const MAX_SIZE: usize = 1 << 30;
/// How long a client keeps retrying a refused control connection.
const CONNECT_RETRY: Duration = Duration::from_secs(5);
/// How long a wait for a completion may go without one before the peer is declared gone.
const DEFAULT_STALL: Duration = Duration::from_secs(30);
/// Receives and transmit-side operations in flight, told apart by their contexts.
const RX_CTX: Context = 0x5258;
const TX_CTX: Context = 0x5458;
/// The tag used in tagged mode.
const TAG: u64 = 0x7070;
/// fabtests' window of outstanding operations in the one-sided tests.
const DEFAULT_WINDOW: usize = 64;
/// The requested key of a side's registered buffer (used where the provider lets us choose).
const MR_KEY: u64 = 0x6b65_7900;
/// The operand of every fetch-add: static, because it must outlive the operations.
static ONE: [u8; 8] = 1u64.to_ne_bytes();

type Res<T> = Result<T, String>;

fn main() -> ExitCode {
    let opts = match common::args::parse::<Cli>().into_opts() {
        Ok(o) => o,
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

/// What a run transfers with (`-o`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    /// Send/receive ping-pong.
    Msg,
    /// Tagged send/receive ping-pong.
    Tagged,
    /// Ping-pong of RMA writes with remote CQ data.
    WriteData,
    /// Windows of RMA writes, client to server.
    Write,
    /// Windows of RMA reads of the server's buffer.
    Read,
    /// Windows of 8-byte fetching atomic adds on the server's counter.
    FetchAdd,
}

impl Op {
    fn parse(s: &str) -> Res<Op> {
        Ok(match s {
            "msg" => Op::Msg,
            "tagged" => Op::Tagged,
            "writedata" => Op::WriteData,
            "write" => Op::Write,
            "read" => Op::Read,
            "fetchadd" => Op::FetchAdd,
            other => {
                return Err(format!(
                    "unknown operation {other:?} (msg|tagged|writedata|write|read|fetchadd)"
                ))
            }
        })
    }

    /// Whether the client streams windows of one-sided operations (rather than ping-pongs).
    fn one_sided(self) -> bool {
        matches!(self, Op::Write | Op::Read | Op::FetchAdd)
    }

    fn rma(self) -> bool {
        !matches!(self, Op::Msg | Op::Tagged)
    }
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
    op: Op,
    /// Operations in flight in the one-sided tests.
    window: usize,
    verbose: bool,
    ipv6: bool,
    /// Send from shared host memory (`-H`).
    shared_tx: bool,
    /// The server's host: present on the client only.
    server: Option<String>,
}

/// Ping pong client and server over xfabric (fi_pingpong's options and output). Without
/// <srv_addr> it starts a server; with one, a client that connects to it.
#[derive(clap::Parser, Debug)]
#[command(
    name = "pingpong",
    after_help = "XFABRIC_PINGPONG_PORT (this example's own variable, not a library setting) overrides \
                  the default control port (47592)."
)]
struct Cli {
    /// Source control port number (server: 47592, client: auto)
    #[arg(short = 'B', value_name = "src_port", value_parser = parse_port)]
    src_port: Option<u16>,
    /// Destination control port number (client: 47592)
    #[arg(short = 'P', value_name = "dst_port", value_parser = parse_port)]
    dst_port: Option<u16>,
    /// Domain name
    #[arg(short = 'd', value_name = "domain")]
    domain: Option<String>,
    /// Specific provider name
    #[arg(short = 'p', value_name = "provider", default_value = DEFAULT_PROVIDER)]
    provider: String,
    /// Endpoint type: msg|rdm|dgram
    #[arg(short = 'e', value_name = "ep_type", default_value = "rdm", value_parser = parse_ep_type)]
    ep_type: EpType,
    /// Number of iterations
    #[arg(short = 'I', value_name = "number", default_value_t = 10, value_parser = parse_iterations)]
    iterations: usize,
    /// Specific transfer size or 'all' (default: 64 256 1k 4k 64k 1m)
    #[arg(short = 'S', value_name = "size", value_parser = parse_sizes)]
    sizes: Option<Sizes>,
    /// Enables data_integrity checks
    #[arg(short = 'c')]
    check: bool,
    /// Transmit mode type: msg|tagged
    #[arg(short = 'm', value_name = "transmit mode", value_parser = parse_mode)]
    mode: Option<Op>,
    /// Operation: msg|tagged (ping-pong with sends), writedata (ping-pong with RMA writes
    /// carrying remote CQ data), write|read (RMA bandwidth), fetchadd (8-byte fetching atomic
    /// add rate; -S is ignored) [default: msg]
    #[arg(short = 'o', value_name = "op", value_parser = Op::parse)]
    op: Option<Op>,
    /// Operations in flight for write|read|fetchadd
    #[arg(short = 'W', value_name = "window", default_value_t = DEFAULT_WINDOW, value_parser = parse_window)]
    window: usize,
    /// Enable debugging output
    #[arg(short = 'v')]
    verbose: bool,
    /// Use IPv6 address
    #[arg(short = '6')]
    ipv6: bool,
    /// Send from shared host memory (hmem's alloc_host_mapped on FI_HMEM_SYSTEM, which shm
    /// reads from a mapping of the sender's memory) instead of the heap (xfabric only)
    #[arg(short = 'H')]
    shared_tx: bool,
    /// The server to connect to (client only)
    srv_addr: Option<String>,
}

/// `-S`'s value: one size, or every size.
#[derive(Clone, Debug)]
struct Sizes(Vec<usize>);

impl Cli {
    fn into_opts(self) -> Res<Opts> {
        let op = match (self.op, self.mode) {
            (Some(a), Some(b)) if a != b => {
                return Err(format!("-o {a:?} and -m {b:?} disagree"));
            }
            (a, b) => a.or(b).unwrap_or(Op::Msg),
        };
        let sizes = if op == Op::FetchAdd {
            vec![8]
        } else {
            self.sizes.map_or_else(default_sizes, |s| s.0)
        };
        Ok(Opts {
            provider: self.provider,
            domain: self.domain,
            ep_type: self.ep_type,
            iterations: self.iterations,
            sizes,
            src_port: self.src_port,
            dst_port: self.dst_port,
            check: self.check,
            op,
            window: self.window,
            verbose: self.verbose,
            ipv6: self.ipv6,
            shared_tx: self.shared_tx,
            server: self.srv_addr,
        })
    }
}

fn parse_ep_type(s: &str) -> Res<EpType> {
    match s {
        "rdm" => Ok(EpType::Rdm),
        "msg" => Ok(EpType::Msg),
        "dgram" => Ok(EpType::Dgram),
        other => Err(format!("unknown endpoint type {other:?} (msg|rdm|dgram)")),
    }
}

fn parse_mode(s: &str) -> Res<Op> {
    match s {
        "msg" => Ok(Op::Msg),
        "tagged" => Ok(Op::Tagged),
        other => Err(format!("unknown transmit mode {other:?} (msg|tagged)")),
    }
}

fn parse_window(v: &str) -> Res<usize> {
    match v.parse::<usize>() {
        Ok(n) if (1..=1 << 16).contains(&n) => Ok(n),
        _ => Err(format!("-W wants a window of 1 to 65536, not {v:?}")),
    }
}

fn parse_iterations(v: &str) -> Res<usize> {
    match v.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "-I wants a positive number of iterations, not {v:?}"
        )),
    }
}

fn parse_sizes(v: &str) -> Res<Sizes> {
    Ok(Sizes(if v == "all" {
        all_sizes()
    } else {
        vec![parse_size(v)?]
    }))
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

/// One result row for `ops` operations (sent and acknowledged) that made `xfers` transfers of
/// `size` bytes: in a ping-pong a transfer is one direction of a round trip (two per
/// operation), so `usec/xfer` is half the round-trip time; in the one-sided tests it is one
/// operation. MB/sec counts every transfer's bytes in decimal megabytes.
fn row(size: usize, ops: u64, xfers: u64, elapsed: Duration) -> String {
    let total = xfers * size as u64;
    let us = (elapsed.as_secs_f64() * 1e6).max(1e-3);
    format!(
        "{:<8}{:<8}={:<8}{:<8}{:8.2}s{:10.2}{:11.2}{:11.2}",
        size_str(size as u64),
        cnt_str(ops),
        cnt_str(ops),
        size_str(total),
        elapsed.as_secs_f64(),
        total as f64 / us,
        us / xfers as f64,
        xfers as f64 / us,
    )
}

// ---------------------------------------------------------------------------------------------
// Control connection

/// One endpoint with its queues, the peer's address and, for the RMA operations, this side's
/// registered buffer and the peer's. Fields drop in order: the endpoint before the region and
/// queues it uses, those before the domain and fabric.
struct Node {
    ep: Endpoint,
    mr: Option<MemoryRegion>,
    cq: CompletionQueue,
    av: AddressVector,
    domain: Domain,
    _fabric: Fabric,
    info: Info,
    peer: FiAddr,
    /// The peer's registered buffer (RMA operations only).
    remote: Remote,
    op: Op,
    check: bool,
    window: usize,
    /// Sends and writes smaller than this go out with inject (no completion), as fi_pingpong
    /// and fabtests do.
    inject_size: usize,
    rx_posted: bool,
    /// Transmit-side operations (sends, writes, reads, atomics) posted and not yet completed.
    tx_outstanding: usize,
    /// The peer's writedata announcements (remote-CQ-data entries) not yet waited for, and the
    /// data of the latest.
    remote_writes: usize,
    remote_data: u64,
    stall: Duration,
    /// Where CQ reads land: kept, so a poll does not zero a fresh array each time (fabtests
    /// read into an uninitialized entry).
    entries: [CqDataEntry; 8],
}

/// Where the peer's registered buffer is: the address to aim at (its virtual address under
/// FI_MR_VIRT_ADDR, else offset 0) and its key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Remote {
    addr: u64,
    key: u64,
}

impl Remote {
    fn to_bytes(self) -> Vec<u8> {
        [self.addr.to_le_bytes(), self.key.to_le_bytes()].concat()
    }

    fn from_bytes(b: &[u8]) -> Res<Remote> {
        let word = |i: usize| -> Res<u64> {
            b.get(8 * i..8 * i + 8)
                .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
                .ok_or_else(|| format!("control: bad buffer description ({} bytes)", b.len()))
        };
        Ok(Remote {
            addr: word(0)?,
            key: word(1)?,
        })
    }
}

fn open(o: &Opts) -> Res<Node> {
    let mut hints = Info {
        caps: match o.op {
            Op::Msg => FI_MSG,
            Op::Tagged => FI_TAGGED,
            _ => FI_MSG | FI_RMA | FI_ATOMIC,
        },
        ..Default::default()
    };
    hints.fabric_attr.prov_name = Some(o.provider.clone());
    hints.domain_attr.name = o.domain.clone();
    hints.ep_attr.ep_type = o.ep_type;
    hints.domain_attr.data_progress = Progress::Manual;
    // The registration modes fabtests accept: with provider keys the verbs provider's keys are
    // the NIC's rkeys, and one-sided operations go through the NIC.
    hints.domain_attr.mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    let info = getinfo(fi_version(1, 17), None, None, 0, Some(&hints))
        .map_err(|e| format!("getinfo (provider {}, {:?}): {e}", o.provider, o.ep_type))?
        .swap_remove(0);
    if o.verbose {
        eprintln!(
            "pingpong: provider {} domain {} inject_size {} mr_mode {:#x}",
            info.provider(),
            info.domain_attr.name.as_deref().unwrap_or("?"),
            info.tx_attr.inject_size,
            info.domain_attr.mr_mode
        );
    }
    let fabric = xfabric::fabric(&info.fabric_attr).map_err(|e| format!("fabric: {e}"))?;
    let domain = fabric.domain(&info).map_err(|e| format!("domain: {e}"))?;
    let cq = domain
        .cq_open(&CqAttr {
            // Data, for writedata's remote CQ data; the other operations ignore the field.
            format: CqFormat::Data,
            wait_obj: WaitObj::None,
            // Room for a whole window of completions.
            size: (2 * o.window).max(64),
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
        mr: None,
        cq,
        av,
        domain,
        _fabric: fabric,
        info,
        peer: FI_ADDR_UNSPEC,
        remote: Remote::default(),
        op: o.op,
        check: o.check,
        window: o.window,
        rx_posted: false,
        tx_outstanding: 0,
        remote_writes: 0,
        remote_data: 0,
        stall,
        entries: [CqDataEntry::default(); 8],
    })
}

/// What both sides must agree on, so a mismatch is an error and not a hang.
fn settings(o: &Opts) -> Vec<u8> {
    format!(
        "xfabric-pingpong/2 iters={} sizes={:?} op={:?} window={} check={} ep={:?} shared={}",
        o.iterations, o.sizes, o.op, o.window, o.check, o.ep_type, o.shared_tx
    )
    .into_bytes()
}

fn run(o: &Opts) -> Res<()> {
    // The buffers are made before the endpoint so they are dropped after it: on an early error
    // a posted receive may still be written until the endpoint is closed, and a registered
    // buffer must outlive its region.
    let max = o.sizes.iter().copied().max().unwrap_or(0);
    // Every page written now, as fi_pingpong's memset does: a zeroed allocation is left
    // untouched by calloc, and reading untouched pages reads the kernel's one zero page,
    // always in cache, which made large transfers look faster than they are.
    let (mut heap, shared);
    let tx: &mut [u8] = if o.shared_tx {
        shared = hmem::Hmem::global()
            .get(hmem::Iface::System)
            .alloc_host_mapped(0, max.max(1))
            .map_err(|e| format!("-H: {e}"))?;
        // SAFETY: `shared` owns `max` bytes or more and outlives `tx`; nothing else reaches
        // them but the transfers this program posts.
        unsafe { std::slice::from_raw_parts_mut(shared.as_ptr(), max) }
    } else {
        heap = vec![0u8; max];
        &mut heap
    };
    tx.fill(0xa5);
    // Receives, the peer's writes and atomics, and reads' and fetches' results land here.
    let mut rx = LandingBuf::new(max.max(8 * o.window));
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
    // The source of writes, registered as fabtests register theirs (dropped before `tx`).
    let _tx_mr = if o.op.rma() {
        Some(node.register_source(tx)?)
    } else {
        None
    };
    if o.op.rma() {
        let mine = node.register(&rx)?;
        ctl.send_blob(&mine.to_bytes())?;
        node.remote = Remote::from_bytes(&ctl.recv_blob()?)?;
    }
    if o.verbose {
        eprintln!(
            "pingpong: local {} peer {}",
            node.av.straddr(&name),
            node.av.straddr(&peer_name)
        );
        if o.op.rma() {
            eprintln!("pingpong: peer's buffer {:?}", node.remote);
        }
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
        let mut elapsed = Duration::ZERO;
        for (phase, count) in [(0, warmup), (1, o.iterations)] {
            elapsed = match (o.op.one_sided(), client) {
                (false, _) => {
                    node.timed_pingpong(&mut ctl, client, size, count, phase, tx, &mut rx)?
                }
                (true, true) => node.stream(&mut ctl, size, count, phase, tx, &mut rx)?,
                (true, false) => node.serve(&mut ctl, size, count, phase, &mut rx)?,
            };
        }
        let ops = o.iterations as u64 * if o.op.one_sided() { o.window as u64 } else { 1 };
        let xfers = if o.op.one_sided() { ops } else { 2 * ops };
        println!("{}", row(size, ops, xfers, elapsed));
        let _ = io::stdout().flush();
    }
    // Neither side closes its endpoint while the other may still be reading from it.
    ctl.barrier()?;
    Ok(())
}

/// The data pattern's seed for (phase, size, iteration, direction), so stale or misrouted data
/// fails the check.
fn seed(phase: u64, size: usize, i: usize, from_client: bool) -> u64 {
    (phase << 62) ^ ((size as u64) << 32) ^ ((i as u64) << 1) ^ from_client as u64
}

// ---------------------------------------------------------------------------------------------
// Ping-pong: msg, tagged, writedata

impl Node {
    /// Registers `rx` for the peer's RMA and atomics and says where the peer finds it.
    fn register(&mut self, rx: &LandingBuf) -> Res<Remote> {
        // SAFETY: `run` makes `rx` before the node, so the buffer outlives the node and the
        // region in it. The slice lives for this call only; nothing is in flight yet.
        let mr = unsafe {
            self.domain.mr_reg(
                rx.bytes(0, rx.len()),
                FI_REMOTE_READ | FI_REMOTE_WRITE,
                0,
                MR_KEY,
            )
        }
        .map_err(|e| format!("mr_reg of {} bytes: {e}", rx.len()))?;
        let virt = self.info.domain_attr.mr_mode & FI_MR_VIRT_ADDR != 0;
        let remote = Remote {
            addr: if virt { rx.addr() } else { 0 },
            key: mr.key(),
        };
        self.mr = Some(mr);
        Ok(remote)
    }

    /// Registers `tx`, the source of the writes.
    fn register_source(&mut self, tx: &[u8]) -> Res<MemoryRegion> {
        // SAFETY: `run` makes `tx` before the region, which it drops first.
        unsafe { self.domain.mr_reg(tx, FI_WRITE | FI_SEND, 0, MR_KEY + 1) }
            .map_err(|e| format!("mr_reg of {} bytes: {e}", tx.len()))
    }

    /// One ping-pong run of `count` round trips: the first receive is posted before the
    /// barrier, so the first message of the run never arrives unexpected.
    #[allow(clippy::too_many_arguments)]
    fn timed_pingpong(
        &mut self,
        ctl: &mut Control,
        client: bool,
        size: usize,
        count: usize,
        phase: u64,
        tx: &mut [u8],
        rx: &mut LandingBuf,
    ) -> Res<Duration> {
        self.post_recv(rx, size)?;
        ctl.barrier()?;
        let start = Instant::now();
        self.pingpong(client, size, count, phase, tx, rx)?;
        Ok(start.elapsed())
    }

    /// `count` round trips of `size` bytes, the first receive already posted; the client sends
    /// first. `phase` separates the warm-up's data pattern from the timed run's.
    fn pingpong(
        &mut self,
        client: bool,
        size: usize,
        count: usize,
        phase: u64,
        tx: &mut [u8],
        rx: &mut LandingBuf,
    ) -> Res<()> {
        let tx = &mut tx[..size];
        let seed = |i: usize, from_client: bool| seed(phase, size, i, from_client);
        for i in 0..count {
            if client {
                if self.check {
                    fill(tx, seed(i, true));
                }
                self.post_send(tx, seed(i, true))?;
                self.wait(true)?;
                self.check_rx(rx, size, seed(i, false), i)?;
                if i + 1 < count {
                    self.post_recv(rx, size)?;
                }
            } else {
                self.wait(true)?;
                self.check_rx(rx, size, seed(i, true), i)?;
                if i + 1 < count {
                    self.post_recv(rx, size)?;
                }
                if self.check {
                    fill(tx, seed(i, false));
                }
                self.post_send(tx, seed(i, false))?;
            }
        }
        self.wait(false)
    }

    /// With `-c`, checks what arrived in `rx` (and, for writedata, the remote CQ data).
    fn check_rx(&self, rx: &LandingBuf, size: usize, seed: u64, i: usize) -> Res<()> {
        if !self.check {
            return Ok(());
        }
        if self.op == Op::WriteData && self.remote_data != seed {
            return Err(format!(
                "data integrity check failed: remote CQ data of iteration {i}: expected \
                 {seed:#x}, got {:#x}",
                self.remote_data
            ));
        }
        // SAFETY: this iteration's receive (or the peer's write) has completed, and nothing
        // writes `rx` again before the next receive is posted (or the peer has our answer).
        verify(unsafe { rx.bytes(0, size) }, seed, i)
    }

    /// Posts the receive for the next message. With writedata there is none to post: the
    /// peer's write is announced by a remote-CQ-data entry that `wait` counts.
    fn post_recv(&mut self, rx: &mut LandingBuf, size: usize) -> Res<()> {
        if self.op == Op::WriteData {
            return Ok(());
        }
        loop {
            // SAFETY: `rx` is neither read nor written until `wait` has seen this receive's
            // completion (`rx_posted` cleared); the slice lives for the call only.
            let r = unsafe {
                let buf = rx.bytes_mut(0, size);
                match self.op {
                    Op::Tagged => self.ep.trecv(buf, None, self.peer, TAG, 0, RX_CTX),
                    _ => self.ep.recv(buf, None, self.peer, RX_CTX),
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

    /// Sends `buf` to the peer, or with writedata writes it at the start of the peer's buffer
    /// with `data` as the remote CQ data.
    fn post_send(&mut self, buf: &[u8], data: u64) -> Res<()> {
        let Remote { addr, key } = self.remote;
        loop {
            let inject = buf.len() < self.inject_size;
            let r = match (self.op, inject) {
                (Op::Tagged, true) => self.ep.tinject(buf, self.peer, TAG),
                (Op::WriteData, true) => self.ep.inject_writedata(buf, data, self.peer, addr, key),
                (_, true) => self.ep.inject(buf, self.peer),
                // SAFETY (all three): `buf` is not written again until `wait` has seen this
                // operation's completion (`tx_outstanding` back to 0): the next fill comes after
                // a `wait`.
                (Op::Tagged, false) => unsafe { self.ep.tsend(buf, None, self.peer, TAG, TX_CTX) },
                (Op::WriteData, false) => unsafe {
                    self.ep
                        .writedata(buf, None, data, self.peer, addr, key, TX_CTX)
                },
                (_, false) => unsafe { self.ep.send(buf, None, self.peer, TX_CTX) },
            };
            match r {
                Ok(()) => {
                    self.tx_outstanding += !inject as usize;
                    return Ok(());
                }
                Err(Error::Again(_)) => {
                    self.poll()?;
                }
                Err(e) => return Err(format!("post {:?} of {} bytes: {e}", self.op, buf.len())),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Completions

impl Node {
    /// Busy-polls until every transmit-side operation and, with `rx`, the posted receive (or
    /// the peer's next writedata) have completed.
    fn wait(&mut self, rx: bool) -> Res<()> {
        let mut spins = 0u32;
        let mut since = None;
        while self.tx_outstanding > 0 || (rx && self.rx_waiting()) {
            if self.poll()? {
                spins = 0;
                since = None;
                continue;
            }
            spins += 1;
            if spins.is_multiple_of(4096) {
                let t0 = *since.get_or_insert_with(Instant::now);
                if t0.elapsed() > self.stall {
                    let rx_what = match self.op {
                        Op::WriteData => "the peer's write",
                        _ => "a receive",
                    };
                    return Err(format!(
                        "no completion for {} s (waiting for {}); is the peer alive?",
                        self.stall.as_secs(),
                        match (self.tx_outstanding, rx && self.rx_waiting()) {
                            (0, _) => rx_what.to_string(),
                            (n, false) => format!("{n} transmit operation(s)"),
                            (n, true) => format!("{n} transmit operation(s) and {rx_what}"),
                        }
                    ));
                }
            }
        }
        if rx && self.op == Op::WriteData {
            self.remote_writes -= 1;
        }
        Ok(())
    }

    fn rx_waiting(&self) -> bool {
        match self.op {
            Op::WriteData => self.remote_writes == 0,
            _ => self.rx_posted,
        }
    }

    /// One non-blocking CQ read (which drives progress); true when it returned something.
    fn poll(&mut self) -> Res<bool> {
        match self.cq.read(&mut self.entries) {
            Ok(n) => {
                for e in &self.entries[..n] {
                    if e.flags & FI_REMOTE_CQ_DATA != 0 {
                        self.remote_writes += 1;
                        self.remote_data = e.data;
                        continue;
                    }
                    match e.op_context {
                        RX_CTX => self.rx_posted = false,
                        TX_CTX if self.tx_outstanding > 0 => self.tx_outstanding -= 1,
                        other => {
                            return Err(format!(
                                "unexpected completion (context {other:#x}, flags {})",
                                caps_str(e.flags)
                            ))
                        }
                    }
                }
                Ok(n > 0)
            }
            Err(Error::Again(_)) => Ok(false),
            Err(Error::Avail) => match self.cq.readerr() {
                Ok(e) => Err(format!(
                    "{} failed: {} (prov_errno {}, len {}, olen {})",
                    match e.op_context {
                        RX_CTX => "receive".to_string(),
                        TX_CTX => format!("{:?}", self.op),
                        _ => "operation".to_string(),
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
// Buffers the provider writes

/// Memory that is written behind the program's back: receives, the peer's writes and atomics,
/// and reads' and fetches' results land in it. It is held as a raw allocation, and looked at
/// only through slices made for a moment while nothing that writes it is in flight, so no
/// Rust borrow of it is alive while the provider writes.
struct LandingBuf {
    ptr: NonNull<u8>,
    len: usize,
}

impl LandingBuf {
    fn new(len: usize) -> LandingBuf {
        // Written now (see `run`): every page real before the first transfer.
        let b: Box<[u8]> = vec![0x5au8; len].into_boxed_slice();
        let ptr = NonNull::new(Box::into_raw(b).cast::<u8>()).expect("a Box is never null");
        LandingBuf { ptr, len }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Bytes `off..off + len`.
    ///
    /// # Safety
    /// Nothing may write them while the slice lives.
    unsafe fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(off <= self.len && len <= self.len - off, "window range");
        // SAFETY: in bounds of the live allocation (checked above); the caller rules out
        // writers.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) }
    }

    /// Bytes `off..off + len`, to fill or to hand to a posting call.
    ///
    /// # Safety
    /// Nothing else may read or write them while the slice lives (a posting call keeps only
    /// the address).
    unsafe fn bytes_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        assert!(off <= self.len && len <= self.len - off, "window range");
        // SAFETY: as in `bytes`, and `&mut self` rules out other slices made here.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) }
    }
}

impl Drop for LandingBuf {
    fn drop(&mut self) {
        let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
        // SAFETY: `raw` is the allocation `new` leaked, given back once.
        drop(unsafe { Box::from_raw(raw) });
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
            row(768, 1, 2, Duration::from_nanos(31_000)),
            "768     1       =1       1.5k        0.00s     49.55      15.50       0.06"
        );
        assert_eq!(
            row(1 << 20, 640, 640, Duration::from_millis(100)),
            "1m      640     =640     640m        0.10s   6710.89     156.25       0.01"
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
    fn operations_and_window_parse() {
        let opts = |a: &str| {
            <Cli as clap::Parser>::try_parse_from(std::iter::once("pingpong").chain(a.split(' ')))
                .map_err(|e| e.to_string())?
                .into_opts()
        };
        let o = opts("-o writedata -S 8 localhost").unwrap();
        assert_eq!(
            (o.op, o.window, o.server.as_deref()),
            (Op::WriteData, 64, Some("localhost"))
        );
        assert_eq!(opts("-m tagged").unwrap().op, Op::Tagged);
        assert_eq!(opts("-oread -W8").unwrap().window, 8);
        assert_eq!(opts("-o fetchadd -S 1m").unwrap().sizes, vec![8]);
        assert!(opts("-o send").unwrap_err().contains("unknown operation"));
        assert!(opts("-o write -W 0").is_err());
        let r = Remote {
            addr: 1 << 40,
            key: 7,
        };
        assert_eq!(Remote::from_bytes(&r.to_bytes()), Ok(r));
        assert!(Remote::from_bytes(&[0; 9]).is_err());
    }

    #[test]
    fn all_sizes_end_at_six_mib() {
        let v = all_sizes();
        assert_eq!(&v[..8], &[0, 1, 2, 3, 4, 6, 8, 12]);
        assert_eq!(*v.last().unwrap(), 6 << 20);
    }
}
