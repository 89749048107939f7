//! XPU-triggered sends armed ahead over shm (docs/xpu-triggers.md, "Armed sends"), across two
//! real processes, with the main thread as the CPU XPU so that every ring comes at a known
//! point between the host's own posts: a send from shared host memory is announced when it is
//! armed, released by one message when its trigger fires, and reaches the receiver in the
//! order a send started at the firing would; it waits for its trigger (its buffer is zero until
//! then, so an early start would deliver zeros); a disarmed one never arrives; one fired while
//! a fence holds its peer's operations goes behind them; one to a peer that died fails. Which
//! way each send went is read from the process's counters (`armed_counts`), never timed.

mod common;
use common::*;
use xfabric::errno::*;
use xfabric::kernels::cpu::ring;
use xfabric::*;
use xfabric_hmem::{Hmem, HostMapped, Iface};
use xfabric_providers::shm::{armed_counts, ArmedCounts};

const CAPS: u64 = FI_MSG | FI_TAGGED | FI_TRIGGER | FI_XPU_TRIGGER;
/// A bucket of the pipeline demo: offered by its mapping (`XFABRIC_SHM_MAP_MIN`), below the
/// eager limit.
const LEN: usize = 32 << 10;
/// Buffers of each sender: more than the armed slots of a segment (128).
const BUFS: usize = 160;

/// One test at a time in this process: the counters are the process's.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Shared host memory for `BUFS` messages, zero.
fn shared() -> HostMapped {
    Hmem::global()
        .get(Iface::System)
        .alloc_host_mapped(0, BUFS * LEN)
        .expect("alloc_host_mapped")
}

/// Message buffer `i` of `m`.
fn buf(m: &HostMapped, i: usize) -> &[u8] {
    assert!(i < BUFS);
    // SAFETY: inside the allocation, which `m` keeps.
    unsafe { std::slice::from_raw_parts(m.as_ptr().add(i * LEN), LEN) }
}

/// As the XPU: fills buffer `i` with `pattern(LEN, seed)`, then rings `var`.
fn fill_and_ring(m: &HostMapped, i: usize, seed: u64, var: TriggerVar) {
    let data = pattern(LEN, seed);
    // SAFETY: buffer `i` of `m`, which nothing reads before its trigger fires.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), m.as_ptr().add(i * LEN), LEN) };
    // SAFETY: a variable the endpoint filled for the CPU XPU, its doorbell alive with it.
    unsafe { ring(&[var]) }.expect("ring");
}

/// The next completion of `n` is the cancel of `ctx`.
fn canceled(n: &Node, ctx: Context) {
    match n.next() {
        Completion::Err(e, _) => assert_eq!((e.op_context, e.err), (ctx, FI_ECANCELED)),
        Completion::Ok(c, _) => panic!("a canceled send completed: {c:?}"),
    }
}

/// Arms buffer `i` of `m` as a send to `to` with `ctx` and `tag`: its trigger variable.
fn arm(n: &Node, m: &HostMapped, i: usize, to: FiAddr, ctx: Context, tag: u64) -> TriggerVar {
    let iov = [RawIov::of(buf(m, i))];
    let mut v = [TriggerVar::default()];
    // SAFETY: `m` outlives the send (each test waits for its completion, or cancels it).
    let k = unsafe {
        n.ep.tsendmsg_xpu(&tmsg(&iov, to, ctx, tag, 0), 0, Xpu::CPU, &mut v)
    };
    assert_eq!(k.expect("arm"), 1);
    v[0]
}

/// A host send of `pattern(LEN, seed)` with `tag` and `flags`, its buffer kept in `keep`.
fn post(
    n: &Node,
    to: FiAddr,
    ctx: Context,
    tag: u64,
    seed: u64,
    flags: u64,
    keep: &mut Vec<Vec<u8>>,
) {
    keep.push(pattern(LEN, seed));
    let b = keep.last().expect("pushed");
    let iov = [RawIov::of(b)];
    // SAFETY: `keep` outlives the send (each test waits for its completion).
    n.retry(|| unsafe { n.ep.tsendmsg(&tmsg(&iov, to, ctx, tag, 0), flags) });
}

fn since(before: ArmedCounts) -> ArmedCounts {
    let now = armed_counts();
    ArmedCounts {
        prearmed: now.prearmed - before.prearmed,
        released: now.released - before.released,
        taken: now.taken - before.taken,
        counted: now.counted - before.counted,
    }
}

/// The receiver: posts `count` receives of tag 0 (in order: the k-th message with tag 0 takes
/// the k-th), says "ready", and, once every one completed, answers with the seed of each, in
/// order (every byte checked against it), and how many armed slots it took in. Before that it
/// does what the parent asks: "poll" (progress a fixed number of times, then say whether
/// anything arrived), "tag1" (take one message of tag 1 first).
fn receiver() {
    let n = node(CAPS, Progress::Manual);
    let peer = connect_parent(&n);
    let count: usize = listen().parse().expect("count");
    let mut bufs = vec![vec![0u8; LEN]; count];
    for (i, b) in bufs.iter_mut().enumerate() {
        let iov = [RawIov::of_mut(b)];
        // SAFETY: `bufs` outlives the receives (all completed below).
        n.retry(|| unsafe { n.ep.trecvmsg(&tmsg(&iov, peer, i, 0, 0), 0) });
    }
    let before = armed_counts();
    say("ready");
    let mut got = Vec::new();
    loop {
        match listen().as_str() {
            "poll" => {
                let mut e = [CqTaggedEntry::default(); 4];
                let mut seen = 0;
                for _ in 0..20_000 {
                    if let Ok(k) = n.cq.read(&mut e) {
                        seen += k;
                        got.extend_from_slice(&e[..k]);
                    }
                }
                say(&format!("seen {seen}"));
            }
            "tag1" => {
                let mut big = vec![0u8; 1 << 20];
                // SAFETY: `big` outlives the receive, waited for here.
                n.retry(|| unsafe { n.ep.trecv(&mut big, None, peer, 1, 0, 1000) });
                loop {
                    let e = n.wait_one();
                    if e.op_context == 1000 {
                        break;
                    }
                    got.push(e);
                }
                assert!(big == pattern(1 << 20, 99), "the tag 1 message's bytes");
            }
            cmd if cmd.starts_with("take1 ") => {
                // One message of tag 1 and `LEN` bytes, of the seed given.
                let seed: u64 = cmd["take1 ".len()..].parse().expect("seed");
                let mut b = vec![0u8; LEN];
                // SAFETY: `b` outlives the receive, waited for here.
                n.retry(|| unsafe { n.ep.trecv(&mut b, None, peer, 1, 0, 2000) });
                loop {
                    let e = n.wait_one();
                    if e.op_context == 2000 {
                        break;
                    }
                    got.push(e);
                }
                assert!(b == pattern(LEN, seed), "the tag 1 message's bytes");
                say("took1");
            }
            "sleep" => {
                // Asleep in the CQ (the provider's futex) until a message arrives.
                say("sleeping");
                let mut e = [CqTaggedEntry::default(); 1];
                let k = n.cq.sread(&mut e, 1, 30_000).expect("sread");
                got.extend_from_slice(&e[..k]);
                say(&format!("woke {k}"));
            }
            "close" => {
                // The endpoint closes (its BYE behind whatever it wrote), with nothing said.
                drop(n);
                say("closed");
                assert_eq!(listen(), "bye");
                return;
            }
            "collect" => break,
            other => panic!("receiver: {other}?"),
        }
    }
    got.extend(n.wait_n(count - got.len()));
    got.sort_by_key(|e| e.op_context);
    let sums: Vec<String> = got
        .iter()
        .map(|e| {
            assert_eq!(e.len, LEN);
            sum(&bufs[e.op_context]).to_string()
        })
        .collect();
    say(&format!("{} taken {}", sums.join(" "), since(before).taken));
    assert_eq!(listen(), "bye");
}

/// A test's sender side, its receiver started for `count` messages (`run`).
struct Run {
    n: Node,
    to: FiAddr,
    child: Peer,
    m: HostMapped,
    before: ArmedCounts,
    /// "collect" told already.
    collecting: bool,
    _one: std::sync::MutexGuard<'static, ()>,
}

/// In the parent: starts the receiver for `count` messages and opens the sender. In the
/// child: runs the receiver, and `None`.
fn run(test: &str, count: usize) -> Option<Run> {
    run_cq(test, count, None)
}

/// `run` with the sender's CQ of `cq` entries (`None`: the default).
fn run_cq(test: &str, count: usize, cq: Option<usize>) -> Option<Run> {
    if role().is_some() {
        receiver();
        return None;
    }
    let _one = serial();
    let mut child = spawn(test, "rx", &[]);
    let n = match cq {
        Some(size) => node_custom(CAPS, Progress::Manual, |_| {}, size, |_, _| {}),
        None => node(CAPS, Progress::Manual),
    };
    let to = connect(&mut child, &n);
    child.tell(&count.to_string());
    assert_eq!(child.hear(), "ready");
    Some(Run {
        n,
        to,
        child,
        m: shared(),
        before: armed_counts(),
        collecting: false,
        _one,
    })
}

impl Run {
    /// Arms buffer `i` as a send with `ctx` and `tag` (`arm`).
    fn arm(&self, i: usize, ctx: Context, tag: u64) -> TriggerVar {
        arm(&self.n, &self.m, i, self.to, ctx, tag)
    }

    /// Arms each of `sends` (buffer, context, tag), then, as the XPU, fills each buffer with
    /// the pattern seeded by its context and rings it, in that order.
    fn arm_and_ring(&self, sends: &[(usize, Context, u64)]) {
        let vars: Vec<TriggerVar> = sends.iter().map(|&(i, c, t)| self.arm(i, c, t)).collect();
        for (&(i, c, _), v) in sends.iter().zip(vars) {
            fill_and_ring(&self.m, i, c as u64, v);
        }
    }

    /// Tells the receiver to collect every message (before the sender waits for its sends:
    /// a message the receiver copies completes only once it has), once.
    fn collect(&mut self) {
        if !std::mem::replace(&mut self.collecting, true) {
            self.child.tell("collect");
        }
    }

    /// The receiver collects; the sender's completions are `ctxs`; the receiver got the
    /// messages of seeds `want` in this order (among `sent`) and took `taken` armed slots.
    /// What the armed sends did meanwhile.
    fn end(mut self, ctxs: &[Context], sent: &[u64], want: &str, taken: u64) -> ArmedCounts {
        self.collect();
        assert_eq!(contexts(&self.n, ctxs.len()), ctxs);
        let (seeds, took) = collected(&mut self.child, sent.iter().copied());
        assert_eq!(seeds, want, "the messages the receiver got, in order");
        assert_eq!(took, taken, "armed slots the receiver took");
        self.child.tell("bye");
        self.child.join();
        since(self.before)
    }
}

/// A message's bytes, summed up (FNV-1a): which message a receive got, told in a line.
fn sum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, x| {
        (h ^ u64::from(*x)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The receiver's answer to "collect" (told before the sender waits for its sends: a
/// message the receiver copies completes only once it has): the seed of each message it got,
/// in order, among `seeds` (those sent), and the armed slots it took.
fn collected(child: &mut Peer, seeds: impl IntoIterator<Item = u64>) -> (String, u64) {
    let of: std::collections::HashMap<u64, u64> = seeds
        .into_iter()
        .map(|s| (sum(&pattern(LEN, s)), s))
        .collect();
    let line = child.hear();
    let (sums, taken) = line.split_once(" taken ").expect("answer");
    let got: Vec<String> = sums
        .split(' ')
        .map(|x| {
            let x: u64 = x.parse().expect("sum");
            of.get(&x).map_or("?".into(), |s| s.to_string())
        })
        .collect();
    (got.join(" "), taken.parse().expect("taken"))
}

/// Waits for `n` completions of the sender: their contexts, sorted.
fn contexts(n: &Node, count: usize) -> Vec<Context> {
    let mut c: Vec<Context> = n.wait_n(count).iter().map(|e| e.op_context).collect();
    c.sort_unstable();
    c
}

#[test]
fn armed_sends_are_released_in_order_with_posted_ones() {
    let Some(r) = run("armed_sends_are_released_in_order_with_posted_ones", 6) else {
        return;
    };
    let (a0, a1, a2) = (r.arm(0, 10, 0), r.arm(1, 11, 0), r.arm(2, 12, 0));
    assert_eq!(
        since(r.before).prearmed,
        3,
        "each armed send announced ahead"
    );
    let mut keep = Vec::new();
    // Posted after the arming, before the ring: ahead of it.
    post(&r.n, r.to, 20, 0, 20, 0, &mut keep);
    fill_and_ring(&r.m, 0, 10, a0);
    post(&r.n, r.to, 21, 0, 21, 0, &mut keep);
    // Two rings in a row, then a post behind both.
    fill_and_ring(&r.m, 1, 11, a1);
    fill_and_ring(&r.m, 2, 12, a2);
    post(&r.n, r.to, 22, 0, 22, 0, &mut keep);
    let sent = [10, 11, 12, 20, 21, 22];
    let c = r.end(&[10, 11, 12, 20, 21, 22], &sent, "20 10 21 11 12 22", 3);
    assert_eq!(c.released, 3, "each released by a message");
    assert_eq!(c.counted, 3, "each answered by the receiver's count");
}

/// The receiver answers released sends by a count only for the oldest it has not answered:
/// one that finishes before an older one (which waits, unexpected, for its receive) is
/// answered by a frame, and the older one later by the count. Each completes once.
#[test]
fn armed_sends_finished_out_of_order_are_answered_once_each() {
    let Some(mut r) = run(
        "armed_sends_finished_out_of_order_are_answered_once_each",
        1,
    ) else {
        return;
    };
    // Tag 1 first: the receiver has no receive for it until told.
    r.arm_and_ring(&[(0, 40, 1), (1, 41, 0)]);
    // The receiver takes both in: the second lands in its posted receive.
    r.child.tell("poll");
    assert_eq!(r.child.hear(), "seen 1");
    assert_eq!(contexts(&r.n, 1), [41], "the second finished first");
    r.child.tell("take1 40");
    assert_eq!(r.child.hear(), "took1");
    assert_eq!(contexts(&r.n, 1), [40]);
    let c = r.end(&[], &[41], "41", 2);
    assert_eq!(c.released, 2);
    assert_eq!(
        c.counted, 1,
        "the older one answered by the count, the other by a frame"
    );
}

/// A receiver that answered released sends by its count and then closed (its BYE after the
/// count): the sends complete, they do not fail with its close.
#[test]
fn armed_sends_counted_before_their_receiver_closed_complete() {
    let Some(mut r) = run(
        "armed_sends_counted_before_their_receiver_closed_complete",
        2,
    ) else {
        return;
    };
    r.arm_and_ring(&[(0, 50, 0), (1, 51, 0)]);
    r.child.tell("poll");
    assert_eq!(r.child.hear(), "seen 2");
    r.child.tell("close");
    assert_eq!(r.child.hear(), "closed");
    // Read only now: the count and the BYE are both there.
    assert_eq!(contexts(&r.n, 2), [50, 51]);
    assert_eq!(since(r.before).counted, 2);
    r.child.tell("bye");
    r.child.join();
}

#[test]
fn an_armed_send_waits_for_its_trigger() {
    let Some(mut r) = run("an_armed_send_waits_for_its_trigger", 1) else {
        return;
    };
    let a = r.arm(3, 30, 0);
    // The receiver looks for it many times over: nothing comes before the trigger.
    r.child.tell("poll");
    assert_eq!(r.child.hear(), "seen 0");
    let mut e = [CqTaggedEntry::default(); 1];
    assert!(matches!(r.n.cq.read(&mut e), Err(Error::Again(_))));
    assert_eq!(since(r.before).released, 0);
    fill_and_ring(&r.m, 3, 30, a);
    // The bytes the XPU wrote before its ring.
    r.end(&[30], &[30], "30", 1);
}

/// A receiver asleep in `sread` when the armed send fires is woken by its release, as by
/// any message. (Whether it is asleep yet when the trigger fires is the scheduler's: the
/// outcome is the same either way.)
#[test]
fn an_armed_send_wakes_a_sleeping_receiver() {
    let Some(mut r) = run("an_armed_send_wakes_a_sleeping_receiver", 1) else {
        return;
    };
    let a = r.arm(3, 35, 0);
    r.child.tell("sleep");
    assert_eq!(r.child.hear(), "sleeping");
    std::thread::sleep(std::time::Duration::from_millis(20));
    fill_and_ring(&r.m, 3, 35, a);
    assert_eq!(r.child.hear(), "woke 1");
    r.end(&[35], &[35], "35", 1);
}

#[test]
fn a_canceled_armed_send_never_arrives() {
    let Some(r) = run("a_canceled_armed_send_never_arrives", 1) else {
        return;
    };
    let a = r.arm(4, 40, 0);
    r.n.ep.cancel(40).expect("cancel");
    canceled(&r.n, 40);
    // Its doorbell rung all the same: nothing starts.
    fill_and_ring(&r.m, 4, 40, a);
    let mut keep = Vec::new();
    post(&r.n, r.to, 41, 0, 41, 0, &mut keep);
    let c = r.end(&[41], &[40, 41], "41", 0);
    assert_eq!((c.prearmed, c.released), (1, 0));
}

#[test]
fn a_fired_armed_send_waits_behind_a_fence() {
    let Some(mut r) = run("a_fired_armed_send_waits_behind_a_fence", 2) else {
        return;
    };
    let a = r.arm(5, 50, 0);
    // A large message the receiver matches only later: outstanding until then.
    let big = pattern(1 << 20, 99);
    // SAFETY: `big` outlives the send (waited for below).
    r.n.retry(|| unsafe { r.n.ep.tsend(&big, None, r.to, 1, 1000) });
    // Fenced behind it, then the armed send fires: it goes behind the fenced one, as the
    // engine's frame rather than by its slot.
    let mut keep = Vec::new();
    post(&r.n, r.to, 51, 0, 51, FI_FENCE, &mut keep);
    fill_and_ring(&r.m, 5, 50, a);
    r.child.tell("tag1");
    let c = r.end(&[50, 51, 1000], &[50, 51], "51 50", 0);
    assert_eq!((c.prearmed, c.released), (1, 0));
}

#[test]
fn armed_sends_to_a_peer_that_died_fail() {
    let Some(r) = run("armed_sends_to_a_peer_that_died_fail", 2) else {
        return;
    };
    let (a, b) = (r.arm(6, 60, 0), r.arm(7, 61, 0));
    fill_and_ring(&r.m, 6, 60, a);
    let pid = r.child.pid();
    r.child.kill();
    // What the killed receiver left in /dev/shm goes at the next sweep.
    reclaim(pid);
    // Whether the loss is noticed before or after the second ring, both end, within the
    // bound, and the first may have been delivered before the kill.
    fill_and_ring(&r.m, 7, 61, b);
    let mut ended = Vec::new();
    for _ in 0..2 {
        match r.n.next() {
            Completion::Err(e, _) => {
                assert!([FI_ECONNRESET, FI_ECANCELED].contains(&e.err), "{e:?}");
                ended.push(e.op_context);
            }
            Completion::Ok(c, _) => ended.push(c.op_context),
        }
    }
    ended.sort_unstable();
    assert_eq!(ended, [60, 61]);
    // The second's job still waits for its doorbell value. A send armed later under the same
    // context (to another peer) is the one `fi_cancel` cancels.
    let other = node(CAPS, Progress::Manual);
    let to = r.n.add_peer(&other.ep.getname().expect("getname"));
    let _c = arm(&r.n, &r.m, 0, to, 61, 0);
    r.n.ep.cancel(61).expect("cancel");
    canceled(&r.n, 61);
}

/// Armed sends whose peer died end then; their doorbells, rung afterwards, start nothing and
/// hold no CQ room: a CQ as small as the number of them still takes as many posts after.
#[test]
fn armed_sends_rung_after_their_peer_died_hold_no_cq_room() {
    const N: usize = 16;
    let Some(r) = run_cq(
        "armed_sends_rung_after_their_peer_died_hold_no_cq_room",
        N,
        Some(N),
    ) else {
        return;
    };
    let vars: Vec<TriggerVar> = (0..N).map(|i| r.arm(i, 100 + i, 0)).collect();
    assert_eq!(since(r.before).prearmed, N as u64, "each armed ahead");
    let pid = r.child.pid();
    r.child.kill();
    reclaim(pid);
    let mut ended: Vec<Context> = (0..N)
        .map(|_| match r.n.next() {
            Completion::Err(e, _) => {
                assert_eq!(e.err, FI_ECONNRESET, "{e:?}");
                e.op_context
            }
            Completion::Ok(c, _) => panic!("a send to a dead peer completed: {c:?}"),
        })
        .collect();
    ended.sort_unstable();
    assert_eq!(ended, (100..100 + N).collect::<Vec<_>>());
    // The XPU rings every one of them now: nothing starts, nothing is reported.
    for (i, v) in vars.into_iter().enumerate() {
        fill_and_ring(&r.m, i, i as u64, v);
    }
    // The CQ's N entries are all free: N receives post (none refused with `Again`).
    let other = node(CAPS, Progress::Manual);
    let to = r.n.add_peer(&other.ep.getname().expect("getname"));
    let mut bufs = [[0u8; 8]; N];
    for (i, b) in bufs.iter_mut().enumerate() {
        // SAFETY: `bufs` outlives the receives (canceled and reported below).
        unsafe { r.n.ep.recv(b, None, to, 200 + i) }
            .unwrap_or_else(|e| panic!("receive {i} of {N} after the stale rings: {e}"));
    }
    for i in 0..N {
        r.n.ep.cancel(200 + i).expect("cancel");
    }
    for _ in 0..N {
        match r.n.next() {
            Completion::Err(e, _) => assert_eq!(e.err, FI_ECANCELED, "{e:?}"),
            Completion::Ok(c, _) => panic!("a receive completed: {c:?}"),
        }
    }
    assert_eq!(since(r.before).released, 0, "a release after the peer died");
}

/// An armed send that fired into a full CQ waits for room; if its peer dies meanwhile it ends
/// then, and `fi_cancel` of its context passes over it to a later send armed under the same
/// context, waiting behind it.
#[test]
fn cancel_passes_over_a_waiting_armed_send_whose_peer_died() {
    const N: usize = 4;
    let Some(r) = run_cq(
        "cancel_passes_over_a_waiting_armed_send_whose_peer_died",
        1,
        Some(N),
    ) else {
        return;
    };
    let s = r.arm(0, 7, 0);
    let other = node(CAPS, Progress::Manual);
    let to = r.n.add_peer(&other.ep.getname().expect("getname"));
    // Every entry of the CQ reserved by a receive.
    let mut bufs = [[0u8; 8]; N];
    for (i, b) in bufs.iter_mut().enumerate() {
        // SAFETY: `bufs` outlives the receives (canceled and reported below).
        unsafe { r.n.ep.recv(b, None, to, 300 + i) }.expect("receive");
    }
    let pid = r.child.pid();
    r.child.kill();
    reclaim(pid);
    match r.n.next() {
        Completion::Err(e, _) => assert_eq!((e.op_context, e.err), (7, FI_ECONNRESET)),
        Completion::Ok(c, _) => panic!("a send to a dead peer completed: {c:?}"),
    }
    // A later send under the same context, to a live peer; both rung while the CQ is full:
    // both wait for room, the ended one first.
    let s2 = arm(&r.n, &r.m, 1, to, 7, 0);
    fill_and_ring(&r.m, 0, 0, s);
    fill_and_ring(&r.m, 1, 1, s2);
    r.n.ep.cancel(7).expect("cancel");
    for i in 0..N {
        r.n.ep.cancel(300 + i).expect("cancel");
    }
    let mut got: Vec<Context> = (0..=N)
        .map(|_| match r.n.next() {
            Completion::Err(e, _) => {
                assert_eq!(e.err, FI_ECANCELED, "{e:?}");
                e.op_context
            }
            Completion::Ok(c, _) => panic!("completed: {c:?}"),
        })
        .collect();
    got.sort_unstable();
    assert_eq!(
        got,
        [7, 300, 301, 302, 303],
        "the later send and the receives canceled"
    );
}

/// Armed sends hold no CQ room before they fire: the host's own posts go on beside many of
/// them (at most half of `tx_size` are armed ahead: the engine's test). Cancel ends every
/// one, armed ahead or not.
#[test]
fn armed_sends_leave_room_for_the_hosts_posts() {
    let _one = serial();
    let rx = node(CAPS, Progress::Manual);
    let n = node_custom(CAPS, Progress::Manual, |_| {}, 16, |_, _| {});
    let to = n.add_peer(&rx.ep.getname().expect("getname"));
    let m = shared();
    let before = armed_counts();
    let _vars: Vec<TriggerVar> = (0..64).map(|i| arm(&n, &m, i, to, i, 0)).collect();
    assert_eq!(since(before).prearmed, 64, "each armed ahead");
    // A CQ of 16 entries, 64 sends armed: a receive and a send still post.
    let mut b = vec![0u8; 64];
    // SAFETY: `b` outlives the receive (canceled below).
    unsafe { n.ep.recv(&mut b, None, to, 1000) }.expect("a receive beside armed sends");
    let x = pattern(64, 1);
    // SAFETY: `x` outlives the send (waited for below).
    unsafe { n.ep.tsend(&x, None, to, 5, 1001) }.expect("a send beside armed sends");
    for i in (0..64).chain([1000]) {
        n.ep.cancel(i).expect("cancel");
    }
    let mut canceled = Vec::new();
    let mut sent = false;
    for _ in 0..66 {
        match n.next() {
            Completion::Err(e, _) => {
                assert_eq!(e.err, FI_ECANCELED, "{e:?}");
                canceled.push(e.op_context);
            }
            Completion::Ok(c, _) => {
                assert_eq!(c.op_context, 1001);
                sent = true;
            }
        }
    }
    canceled.sort_unstable();
    assert_eq!(canceled, (0..64).chain([1000]).collect::<Vec<_>>());
    assert!(sent);
    assert_eq!(since(before).released, 0);
}

/// More armed sends at once than the sender's segment has armed slots: those past the slots
/// start as posts when they fire, the slots are used again once their receiver has read past
/// their release, and every message arrives once, in order.
#[test]
fn more_armed_sends_than_slots() {
    let Some(mut r) = run("more_armed_sends_than_slots", 2 * BUFS) else {
        return;
    };
    for round in 0..2 {
        let vars: Vec<TriggerVar> = (0..BUFS).map(|i| r.arm(i, i + BUFS * round, 0)).collect();
        let c = since(r.before);
        assert_eq!(
            c.prearmed,
            128 * (round as u64 + 1),
            "every armed slot in use, no more"
        );
        for (i, v) in vars.into_iter().enumerate() {
            fill_and_ring(&r.m, i, (1000 * round + i) as u64, v);
        }
        if round == 0 {
            // The second round rings only once the first's sends completed: the buffers are
            // the same. The receiver collects from here on.
            r.collect();
            assert_eq!(contexts(&r.n, BUFS), (0..BUFS).collect::<Vec<_>>());
        }
    }
    let sent: Vec<u64> = (0..2u64)
        .flat_map(|r| (0..BUFS as u64).map(move |i| 1000 * r + i))
        .collect();
    let want: Vec<String> = sent.iter().map(|s| s.to_string()).collect();
    let ctxs: Vec<Context> = (BUFS..2 * BUFS).collect();
    let c = r.end(&ctxs, &sent, &want.join(" "), 256);
    assert_eq!((c.prearmed, c.released), (256, 256));
}
