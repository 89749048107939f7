//! A mixture-of-experts dispatch across processes: what arming in advance cannot do.
//!
//! Each of `--ranks` processes holds `--tokens` tokens per round. Its XPU (a CPU thread here)
//! computes each token and decides where it goes and how large it is — the expert's rank and
//! the token's length come from a hash of the token, as a router's choice would — so no send
//! can be armed before the kernel runs. Two ways, alternating round by round:
//!
//! - device: the XPU posts each token's tagged send itself through the endpoint it was
//!   exported (`xfabric::xpu::device::tsend`), as soon as the token is computed, and tells
//!   each peer how many tokens it sent (a last message per peer). The host only drives
//!   progress.
//! - host: the XPU computes every token and its route into memory; the host waits for it
//!   (the kernel's synchronize), reads the routes and posts the same sends.
//!
//! Every rank receives into pre-posted tagged receives that match any tag, learns from each
//! peer's last message how many tokens to expect, and checks every byte of every token against
//! what its sender computed. A round's time runs from a start instant every rank waits for
//! (CLOCK_MONOTONIC, one clock for the machine) to the last rank's end; the coordinator prints
//! both ways side by side with their ratio.
//!
//! ```text
//! cargo run --release --example moe_dispatch -- [--ranks 4] [--tokens 256] [--rounds 5]
//!                                              [--work 16] [--provider shm|tcp]
//!                                              [--netns NS0,NS1,...]
//! ```
//! `--netns` starts rank i inside namespace i of the list (`ip netns exec`), as other hosts
//! would be: with `--provider tcp`, ranks in different namespaces talk across their link.

use std::ffi::c_void;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use xfabric::clock::mono_ns as now_ns;
use xfabric::kernels::CpuXpuStream;
use xfabric::xpu::device as dev;
use xfabric::*;

mod common;
use common::{die, hex, unhex};

const RANK_ENV: &str = "XF_MOE_RANK";
const CAPS: u64 = FI_MSG | FI_TAGGED | FI_TRIGGER | FI_XPU_TRIGGER;
/// The largest token, in bytes (each receive holds one).
const MAX_TOKEN: usize = 1024;
/// The smallest.
const MIN_TOKEN: usize = 64;
/// Tag bit of a token; its sender's rank is in bits 40..56 and its index below.
const TOKEN: u64 = 1 << 63;
/// Tag bit of a sender's last message to a peer: the number of tokens it sent there.
const COUNT: u64 = 1 << 62;
/// How often the XPU announces what it posted (`tx_flush`), in tokens: a sleeping watcher is
/// woken once per batch rather than once per token.
const FLUSH_EVERY: usize = 16;

/// Mixture-of-experts dispatch: each XPU routes its tokens at run time and posts them itself,
/// against the host reading the routes and posting.
#[derive(clap::Parser, Debug, Clone)]
#[command(name = "moe_dispatch")]
struct Opts {
    /// Processes taking part
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=64))]
    ranks: u32,
    /// Tokens each rank dispatches per round
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1 << 16))]
    tokens: u32,
    /// Rounds, each running both ways
    #[arg(long, default_value_t = 5, value_parser = common::args::positive)]
    rounds: usize,
    /// Passes of compute over each token (the expert's work before it is sent)
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    work: u32,
    /// The provider every rank uses (shm, or tcp to cross hosts)
    #[arg(long, default_value = "shm")]
    provider: String,
    /// Namespaces to start the ranks in, one per rank, comma-separated
    #[arg(long, value_delimiter = ',')]
    netns: Vec<String>,
    /// How each rank's host thread waits for its completions: `spin` (reading its queue
    /// without sleeping: it is also the watcher that drains its XPU's ring at once), `sleep`
    /// (in sread; the XPU announces its posts every 16 tokens, which starts them on the XPU's
    /// own thread), or `auto`: spin where the machine has a core for each rank's two threads
    #[arg(long, value_enum, default_value_t = HostWait::Auto)]
    host_wait: HostWait,
}

#[derive(Clone, Copy, Debug, PartialEq, clap::ValueEnum)]
enum HostWait {
    Auto,
    Spin,
    Sleep,
}

impl Opts {
    /// Whether the host threads spin (`--host-wait`, resolved).
    fn spin(&self) -> bool {
        match self.host_wait {
            HostWait::Spin => true,
            HostWait::Sleep => false,
            HostWait::Auto => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                cores >= 2 * self.ranks as usize
            }
        }
    }
}

fn main() {
    let o: Opts = common::args::parse();
    match std::env::var(RANK_ENV) {
        Ok(r) => rank(&o, r.parse().unwrap_or_else(|_| die("bad rank"))),
        Err(_) => coordinate(&o),
    }
}

/// A 64-bit mix (splitmix64's finalizer): the router's hash.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Where token `t` of rank `src` goes in the round seeded `seed`, and its length: what the
/// XPU decides, and what the receiver recomputes to check what arrived.
fn route(seed: u64, ranks: u32, src: u32, t: u32) -> (u32, usize) {
    let h = mix(seed ^ (u64::from(src) << 32) ^ u64::from(t));
    let dest = (h % u64::from(ranks)) as u32;
    let span = (MAX_TOKEN - MIN_TOKEN) / 8 + 1;
    let len = MIN_TOKEN + ((h >> 32) as usize % span) * 8;
    (dest, len)
}

/// Byte `j` of token `t` of rank `src` in the round seeded `seed`.
fn byte(seed: u64, src: u32, t: u32, j: usize) -> u8 {
    (mix(seed.wrapping_add(u64::from(src) << 20 | u64::from(t)) ^ (j as u64 >> 3)) >> ((j & 7) * 8))
        as u8
}

/// The expert's work on a token: its bytes, computed `work` times over.
fn compute_token(out: &mut [u8], seed: u64, src: u32, t: u32, work: u32) {
    for _ in 0..work {
        let seed = std::hint::black_box(seed);
        for (j, b) in out.iter_mut().enumerate() {
            *b = byte(seed, src, t, j);
        }
        std::hint::black_box(&mut *out);
    }
}

fn token_tag(src: u32, t: u32) -> u64 {
    TOKEN | u64::from(src) << 40 | u64::from(t)
}

fn count_tag(src: u32) -> u64 {
    COUNT | u64::from(src) << 40
}

// ---------------------------------------------------------------------------------------------
// The coordinator: starts the ranks, relays their addresses, and times each round.

struct Rank {
    child: Child,
    to: ChildStdin,
    from: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Rank {
    fn hear(&mut self) -> String {
        self.from
            .next()
            .and_then(|l| l.ok())
            .unwrap_or_else(|| die("a rank exited"))
    }

    fn say(&mut self, line: &str) {
        writeln!(self.to, "{line}").unwrap_or_else(|_| die("a rank exited"));
    }
}

fn coordinate(o: &Opts) {
    if !o.netns.is_empty() && o.netns.len() != o.ranks as usize {
        die(&format!(
            "--netns names {} namespaces for {} ranks",
            o.netns.len(),
            o.ranks
        ));
    }
    let exe = std::env::current_exe().unwrap_or_else(|e| die(&format!("current_exe: {e}")));
    let mut ranks: Vec<Rank> = (0..o.ranks)
        .map(|r| {
            let mut cmd = match o.netns.get(r as usize) {
                None => Command::new(&exe),
                Some(ns) => {
                    let mut c = Command::new("ip");
                    c.args(["netns", "exec", ns]).arg(&exe);
                    c
                }
            };
            let mut child = cmd
                .args(std::env::args_os().skip(1))
                .env(RANK_ENV, r.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| die(&format!("start rank {r}: {e}")));
            let to = child.stdin.take().expect("stdin");
            let from = BufReader::new(child.stdout.take().expect("stdout")).lines();
            Rank { child, to, from }
        })
        .collect();
    let addrs: Vec<String> = ranks.iter_mut().map(Rank::hear).collect();
    let all = addrs.join(" ");
    for r in &mut ranks {
        r.say(&all);
    }
    for r in &mut ranks {
        assert_eq!(r.hear(), "ready");
    }
    println!(
        "moe_dispatch: {} ranks over {}, {} tokens of {MIN_TOKEN}..{MAX_TOKEN} B per rank per \
         round, each routed at run time, {} pass(es) of compute each (--work); host threads {}",
        o.ranks,
        o.provider,
        o.tokens,
        o.work,
        if o.spin() {
            "spin (a core each)"
        } else {
            "sleep between completions"
        }
    );
    println!(
        "  device: each XPU posts its tokens' sends itself as it computes them (fi_xpu_tsend)"
    );
    println!(
        "  host:   each XPU computes every token and its route; the host synchronizes, reads \
         the routes and posts the sends"
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    println!(
        "round   device us     host us   ratio   tokens sent   CPU busy (device, host; {cores} \
         cores)   every byte checked"
    );
    let (mut dev_t, mut host_t, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut busy: Vec<f64> = Vec::new();
    let mut seed = 0u64;
    for round in 0..o.rounds {
        // Alternate which way goes first, so neither always runs on a warmer cache.
        let order: [&str; 2] = if round % 2 == 0 {
            ["device", "host"]
        } else {
            ["host", "device"]
        };
        let (mut d, mut h, mut sent) = (0u64, 0u64, 0u64);
        let (mut d_busy, mut h_busy) = (0.0, 0.0);
        for way in order {
            seed += 1;
            // Far enough ahead for every rank to have posted its receives.
            let start = now_ns() + 20_000_000;
            for r in &mut ranks {
                r.say(&format!("go {way} {seed} {start}"));
            }
            let (mut end, mut n, mut cpu) = (start, 0u64, 0u64);
            for r in &mut ranks {
                let l = r.hear();
                let mut w = l.split_whitespace();
                if w.next() != Some("done") {
                    die(&format!("a rank said {l:?}"));
                }
                let e: u64 = w.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                n += w.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
                cpu += w.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
                end = end.max(e);
            }
            let us = (end - start) / 1000;
            // The ranks' CPU time over what the machine's cores offered in that time (it
            // counts from the post of the round's receives, a little before the start).
            let busy = 100.0 * cpu as f64 / (us.max(1) * cores) as f64;
            if way == "device" {
                (d, d_busy) = (us, busy);
            } else {
                (h, h_busy) = (us, busy);
            }
            sent = n;
        }
        let ratio = d as f64 / h.max(1) as f64;
        println!(
            "{round:>5}   {d:>9}   {h:>9}   {ratio:>5.2}   {sent:>11}   {d_busy:>5.0}% {h_busy:>5.0}%{:>17}   yes",
            ""
        );
        busy.push(d_busy.max(h_busy));
        dev_t.push(d);
        host_t.push(h);
        ratios.push(ratio);
    }
    for r in &mut ranks {
        r.say("end");
    }
    for mut r in ranks {
        let st = r
            .child
            .wait()
            .unwrap_or_else(|e| die(&format!("wait: {e}")));
        if !st.success() {
            die(&format!("a rank failed: {st}"));
        }
    }
    let spread = |v: &mut Vec<u64>| {
        v.sort_unstable();
        format!("{} / {} / {}", v[0], v[v.len() / 2], v[v.len() - 1])
    };
    ratios.sort_by(f64::total_cmp);
    let ratio = ratios[ratios.len() / 2];
    println!(
        "moe_dispatch: {} rounds, every byte checked by its receiver; min / median / max us: \
         device {}, host {}",
        o.rounds,
        spread(&mut dev_t),
        spread(&mut host_t)
    );
    busy.sort_by(f64::total_cmp);
    if busy[busy.len() / 2] >= 90.0 {
        // Overlap reclaims idle time; with every core busy in both ways there is none to
        // reclaim, whoever posts: the ranks' work, not the wait between compute and post,
        // sets the time.
        println!(
            "note: the ranks kept {:.0}% of this machine's {cores} cores busy: with no core \
             idle, posting from the device has no waiting to overlap (give each rank's XPU \
             and host threads cores of their own to see it)",
            busy[busy.len() / 2]
        );
    }
    println!(
        "verdict: device/host {ratio:.2} (min {:.2}, max {:.2}; goal at most 0.70): {}",
        ratios[0],
        ratios[ratios.len() - 1],
        if ratio <= 0.70 {
            "posting from the device pays"
        } else {
            "the gain is NOT shown"
        }
    );
}

// ---------------------------------------------------------------------------------------------
// A rank.

/// A rank's fabric objects and buffers.
struct Me {
    o: Opts,
    rank: u32,
    _fabric: Fabric,
    _domain: Domain,
    cq: CompletionQueue,
    ep: Endpoint,
    /// Every rank's address in this rank's AV.
    peers: Vec<FiAddr>,
    /// The same, as a descriptor names them.
    xpu_peers: Vec<u64>,
    xep: Arc<xfabric::xpu::XpuEp>,
    /// Tokens, one `MAX_TOKEN` slot each, then one count word per rank.
    send: Vec<u8>,
    send_desc: u64,
    _send_mr: MemoryRegion,
    /// One `MAX_TOKEN` slot per receive.
    recv: Vec<u8>,
    stream: CpuXpuStream,
}

fn rank(o: &Opts, me: u32) {
    let common::Node {
        fabric,
        domain,
        cq,
        av,
        ep,
    } = common::open_with(&o.provider, CAPS, Progress::Manual, |h| {
        h.domain_attr.mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY;
    });
    println!("{}", hex(&ep.getname().expect("getname")));
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut line = || lines.next().and_then(|l| l.ok()).unwrap_or_default();
    let peers: Vec<FiAddr> = line()
        .split_whitespace()
        .map(|a| av.insert_one(&unhex(a)).expect("av insert"))
        .collect();
    if peers.len() != o.ranks as usize {
        die("the coordinator sent the wrong number of addresses");
    }
    let xpu_peers = peers
        .iter()
        .map(|&p| av.get_xpu_addr(p).expect("fi_av_get_xpu_addr"))
        .collect();
    let xep = Arc::new(ep.export_xpu(Xpu::CPU).expect("fi_ep_export_xpu"));
    let tokens = o.tokens as usize;
    let send = vec![0u8; tokens * MAX_TOKEN + o.ranks as usize * 8];
    // SAFETY: `send` lives as long as the region (both in `Me`, the region dropped first).
    let send_mr = unsafe { domain.mr_reg(&send, FI_SEND, 0, 0) }.expect("mr_reg");
    let send_desc = send_mr.get_xpu_desc().expect("fi_mr_get_xpu_desc");
    // The most tokens that can come: every other rank's, plus a count from each.
    let slots = (o.ranks as usize - 1) * (tokens + 1);
    let recv = vec![0u8; slots * MAX_TOKEN];
    let stream = CpuXpuStream::new("xfabric-moe-xpu")
        .unwrap_or_else(|e| die(&format!("start the CPU XPU: {e}")));
    let mut m = Me {
        o: o.clone(),
        rank: me,
        _fabric: fabric,
        _domain: domain,
        cq,
        ep,
        peers,
        xpu_peers,
        xep,
        send,
        send_desc,
        _send_mr: send_mr,
        recv,
        stream,
    };
    for s in 0..slots {
        m.post_recv(s);
    }
    println!("ready");
    loop {
        let l = line();
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            ["go", way, seed, start] => {
                let seed: u64 = seed.parse().unwrap_or_else(|_| die("bad seed"));
                let start: u64 = start.parse().unwrap_or_else(|_| die("bad start"));
                let cpu0 = cpu_us();
                let sent = m.round(way == &"device", seed, start);
                let end = now_ns();
                println!("done {end} {sent} {}", cpu_us().saturating_sub(cpu0));
            }
            ["end"] | [] => break,
            _ => die(&format!("the coordinator said {l:?}")),
        }
    }
}

/// What a round's completions tell the host.
#[derive(Default)]
struct Tally {
    sends_done: u64,
    /// Tokens received from each rank, and the count each announced (once it arrived).
    got: Vec<u64>,
    announced: Vec<Option<u64>>,
    /// The receive slots the counts took.
    count_slots: Vec<usize>,
}

impl Me {
    /// Posts the round's receives, waits for `start`, dispatches one way, waits until every
    /// send completed and every token announced arrived, then checks them. Returns how many
    /// tokens this rank sent.
    fn round(&mut self, device: bool, seed: u64, start: u64) -> u64 {
        let ranks = self.o.ranks;
        // Asleep until shortly before the start, then watching the clock.
        let early = start.saturating_sub(now_ns()).saturating_sub(1_000_000);
        std::thread::sleep(Duration::from_nanos(early));
        while now_ns() < start {
            std::hint::spin_loop();
        }
        // Tokens this rank's XPU sent, once it knows (the XPU's last act).
        let sent = Arc::new(AtomicU64::new(u64::MAX));
        let mut tally = Tally {
            got: vec![0; ranks as usize],
            announced: vec![None; ranks as usize],
            ..Default::default()
        };
        let mut arrived: Vec<(usize, u64, usize)> = Vec::new();
        if device {
            self.launch_device(seed, sent.clone());
        } else {
            self.host_way(seed, &sent, &mut tally, &mut arrived);
        }
        self.drive(&sent, &mut tally, &mut arrived);
        self.stream
            .synchronize()
            .unwrap_or_else(|e| die(&format!("the CPU XPU: {e}")));
        self.check(seed, &arrived);
        // The receives this round took, posted again for the next (the others stay posted).
        for &(slot, _, _) in &arrived {
            self.post_recv(slot);
        }
        for slot in std::mem::take(&mut tally.count_slots) {
            self.post_recv(slot);
        }
        sent.load(Ordering::Acquire)
    }

    /// Posts the receive of slot `s` of the receive buffer: any tag, from anyone.
    fn post_recv(&mut self, s: usize) {
        let base = self.recv.as_mut_ptr() as usize;
        // SAFETY: slot s of `recv`, which outlives the endpoint's receives (the endpoint
        // closes first); read only once its receive completed.
        let b =
            unsafe { std::slice::from_raw_parts_mut((base + s * MAX_TOKEN) as *mut u8, MAX_TOKEN) };
        self.retry(|| unsafe { self.ep.trecv(&mut *b, None, FI_ADDR_UNSPEC, 0, !0, s) });
    }

    /// `post` until it is taken, driving progress while the queue is full.
    fn retry(&self, mut post: impl FnMut() -> Result<()>) {
        loop {
            match post() {
                Ok(()) => return,
                Err(Error::Again(_)) => {
                    let _ = self.cq.read::<CqTaggedEntry>(&mut []);
                }
                Err(e) => die(&format!("post: {e}")),
            }
        }
    }

    /// The device way: the XPU computes each token, routes it and posts its send at once;
    /// then each peer's count.
    fn launch_device(&mut self, seed: u64, sent: Arc<AtomicU64>) {
        let (ranks, me, tokens, work) = (self.o.ranks, self.rank, self.o.tokens, self.o.work);
        let spin = self.o.spin();
        let x = self.xep.clone();
        let peers = self.xpu_peers.clone();
        let desc = self.send_desc;
        let base = self.send.as_mut_ptr() as usize;
        let counts_at = base + tokens as usize * MAX_TOKEN;
        self.stream
            .launch(move || {
                let post = |f: &dyn Fn() -> i32| loop {
                    match f() {
                        0 => return,
                        e if e == -(errno::FI_EAGAIN) => std::hint::spin_loop(),
                        e => die(&format!("fi_xpu_tsend: {e}")),
                    }
                };
                let mut counts = vec![0u64; ranks as usize];
                let mut n = 0u64;
                for t in 0..tokens {
                    let (dest, len) = route(seed, ranks, me, t);
                    let slot = base + t as usize * MAX_TOKEN;
                    // SAFETY: token t's slot of the send buffer: only this kernel writes it,
                    // and the send reading it is posted after.
                    let out = unsafe { std::slice::from_raw_parts_mut(slot as *mut u8, len) };
                    compute_token(out, seed, me, t, work);
                    if dest == me {
                        // The local expert's: it stays here.
                        continue;
                    }
                    counts[dest as usize] += 1;
                    n += 1;
                    let buf = slot as *const c_void;
                    let tag = token_tag(me, t);
                    post(&|| {
                        dev::tsend(
                            &x,
                            buf,
                            len,
                            desc,
                            0,
                            peers[dest as usize],
                            tag,
                            0,
                            0,
                            dev_scope(),
                        )
                    });
                    // A spinning host finds the descriptors as they are published; a sleeping
                    // one is told.
                    if !spin && n.is_multiple_of(FLUSH_EVERY as u64) {
                        dev::tx_flush(&x, 0, dev_scope());
                    }
                }
                for d in (0..ranks).filter(|&d| d != me) {
                    let at = counts_at + d as usize * 8;
                    // SAFETY: rank d's count word, past every token; only this kernel writes
                    // it, before the send that reads it.
                    unsafe { (at as *mut u64).write_unaligned(counts[d as usize]) };
                    let buf = at as *const c_void;
                    post(&|| {
                        dev::tsend(
                            &x,
                            buf,
                            8,
                            desc,
                            0,
                            peers[d as usize],
                            count_tag(me),
                            0,
                            0,
                            dev_scope(),
                        )
                    });
                }
                if !spin {
                    dev::tx_flush(&x, 0, dev_scope());
                }
                sent.store(n, Ordering::Release);
                Ok(())
            })
            .unwrap_or_else(|e| die(&format!("launch: {e}")));
    }

    /// The host way: the XPU computes every token and its route; the host synchronizes, reads
    /// the routes and posts the sends.
    fn host_way(
        &mut self,
        seed: u64,
        sent: &Arc<AtomicU64>,
        tally: &mut Tally,
        arrived: &mut Vec<(usize, u64, usize)>,
    ) {
        let (ranks, me, tokens, work) = (self.o.ranks, self.rank, self.o.tokens, self.o.work);
        let base = self.send.as_mut_ptr() as usize;
        let routes = Arc::new(std::sync::Mutex::new(Vec::with_capacity(tokens as usize)));
        let r = routes.clone();
        self.stream
            .launch(move || {
                let mut v = r.lock().unwrap_or_else(|e| e.into_inner());
                for t in 0..tokens {
                    let (dest, len) = route(seed, ranks, me, t);
                    // SAFETY: as in the device way; the host reads it after the synchronize.
                    let out = unsafe {
                        std::slice::from_raw_parts_mut(
                            (base + t as usize * MAX_TOKEN) as *mut u8,
                            len,
                        )
                    };
                    compute_token(out, seed, me, t, work);
                    v.push((dest, len));
                }
                Ok(())
            })
            .unwrap_or_else(|e| die(&format!("launch: {e}")));
        self.stream
            .synchronize()
            .unwrap_or_else(|e| die(&format!("the CPU XPU: {e}")));
        let routes = routes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut counts = vec![0u64; ranks as usize];
        let mut n = 0u64;
        for (t, &(dest, len)) in routes.iter().enumerate() {
            if dest == me {
                continue;
            }
            counts[dest as usize] += 1;
            n += 1;
            // SAFETY: token t's slot, computed and not written again this round.
            let b = unsafe { std::slice::from_raw_parts((base + t * MAX_TOKEN) as *const u8, len) };
            self.post_host(b, dest, token_tag(me, t as u32), tally, arrived);
        }
        let counts_at = base + tokens as usize * MAX_TOKEN;
        for d in (0..ranks).filter(|&d| d != me) {
            let at = counts_at + d as usize * 8;
            // SAFETY: rank d's count word, written here before its send.
            unsafe { (at as *mut u64).write_unaligned(counts[d as usize]) };
            let b = unsafe { std::slice::from_raw_parts(at as *const u8, 8) };
            self.post_host(b, d, count_tag(me), tally, arrived);
        }
        sent.store(n, Ordering::Release);
    }

    /// A host-posted tagged send, taking completions in while the queue is full.
    fn post_host(
        &self,
        b: &[u8],
        dest: u32,
        tag: u64,
        tally: &mut Tally,
        arrived: &mut Vec<(usize, u64, usize)>,
    ) {
        loop {
            // SAFETY: `b` is in the send buffer, not written until the round ends (every send
            // completed).
            match unsafe { self.ep.tsend(b, None, self.peers[dest as usize], tag, 0) } {
                Ok(()) => return,
                Err(Error::Again(_)) => self.take(tally, arrived, false),
                Err(e) => die(&format!("fi_tsend: {e}")),
            }
        }
    }

    /// Takes in completions once: `wait` sleeps in the CQ if none is there.
    fn take(&self, tally: &mut Tally, arrived: &mut Vec<(usize, u64, usize)>, wait: bool) {
        let mut buf = [CqTaggedEntry::default(); 64];
        let r = if wait {
            self.cq.sread(&mut buf, 1, 1)
        } else {
            self.cq.read(&mut buf)
        };
        match r {
            Ok(k) => {
                for e in &buf[..k] {
                    if e.flags & FI_SEND != 0 {
                        tally.sends_done += 1;
                        continue;
                    }
                    let src = ((e.tag >> 40) & 0xffff) as usize;
                    if src >= tally.got.len() {
                        die(&format!("a message with tag {:#x}", e.tag));
                    }
                    if e.tag & COUNT != 0 {
                        let s = e.op_context * MAX_TOKEN;
                        let c = u64::from_ne_bytes(self.recv[s..s + 8].try_into().expect("8"));
                        tally.announced[src] = Some(c);
                        tally.count_slots.push(e.op_context);
                    } else {
                        tally.got[src] += 1;
                        arrived.push((e.op_context, e.tag, e.len));
                    }
                }
            }
            Err(Error::Again(_)) => {}
            Err(Error::Avail) => die(&format!("error completion: {:?}", self.cq.readerr())),
            Err(e) => die(&format!("cq: {e}")),
        }
    }

    /// Drives progress until this rank's sends all completed and every token announced to it
    /// arrived.
    fn drive(&self, sent: &AtomicU64, tally: &mut Tally, arrived: &mut Vec<(usize, u64, usize)>) {
        let me = self.rank as usize;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let n = sent.load(Ordering::Acquire);
            // Tokens plus one count per peer.
            let sends_ok = n != u64::MAX && tally.sends_done == n + u64::from(self.o.ranks) - 1;
            let recvs_ok = (0..tally.got.len())
                .filter(|&r| r != me)
                .all(|r| tally.announced[r] == Some(tally.got[r]));
            if sends_ok && recvs_ok {
                return;
            }
            self.take(tally, arrived, !self.o.spin());
            if Instant::now() > deadline {
                die(&format!(
                    "round not done after 60 s: {} of {} sends, tokens {:?} of {:?}",
                    tally.sends_done, n, tally.got, tally.announced
                ));
            }
        }
    }

    /// Every token that arrived: the route its sender computed names this rank, its length
    /// is the route's, and every byte is what the sender computed.
    fn check(&self, seed: u64, arrived: &[(usize, u64, usize)]) {
        for &(slot, tag, len) in arrived {
            let src = ((tag >> 40) & 0xffff) as u32;
            let t = (tag & 0xff_ffff_ffff) as u32;
            let (dest, want) = route(seed, self.o.ranks, src, t);
            if dest != self.rank || len != want {
                die(&format!(
                    "token {t} of rank {src}: {len} B here, routed to rank {dest} with {want} B"
                ));
            }
            let got = &self.recv[slot * MAX_TOKEN..slot * MAX_TOKEN + len];
            if let Some(j) = (0..len).find(|&j| got[j] != byte(seed, src, t, j)) {
                die(&format!("token {t} of rank {src}: byte {j} differs"));
            }
        }
    }
}

/// CPU time this process has used (all its threads, user and system), in microseconds.
fn cpu_us() -> u64 {
    // SAFETY: a zeroed rusage is a valid out-parameter.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(u.ru_utime) + us(u.ru_stime)
}

/// The scope of the XPU's device calls: a CPU thread is a work item.
fn dev_scope() -> i32 {
    xfabric::xpu::FI_XPU_WORK_ITEM
}
