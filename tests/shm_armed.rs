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

fn msg(iov: &[RawIov], addr: FiAddr, ctx: Context, tag: u64) -> Msg<'_> {
    Msg {
        iov,
        desc: &[],
        addr,
        context: ctx,
        data: 0,
        tag,
        ignore: 0,
    }
}

/// Arms buffer `i` of `m` as a send to `to` with `ctx` and `tag`: its trigger variable.
fn arm(n: &Node, m: &HostMapped, i: usize, to: FiAddr, ctx: Context, tag: u64) -> TriggerVar {
    let iov = [RawIov::of(buf(m, i))];
    let mut v = [TriggerVar::default()];
    // SAFETY: `m` outlives the send (each test waits for its completion, or cancels it).
    let k = unsafe {
        n.ep.tsendmsg_xpu(&msg(&iov, to, ctx, tag), 0, Xpu::CPU, &mut v)
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
    n.retry(|| unsafe { n.ep.tsendmsg(&msg(&iov, to, ctx, tag), flags) });
}

fn since(before: ArmedCounts) -> ArmedCounts {
    let now = armed_counts();
    ArmedCounts {
        prearmed: now.prearmed - before.prearmed,
        released: now.released - before.released,
        taken: now.taken - before.taken,
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
        n.retry(|| unsafe { n.ep.trecvmsg(&msg(&iov, peer, i, 0), 0) });
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

/// Starts the receiver for `count` messages: the parent's node, the address and the child.
fn start(test: &str, count: usize) -> (Node, FiAddr, Peer) {
    let mut child = spawn(test, "rx", &[]);
    let n = node(CAPS, Progress::Manual);
    let to = connect(&mut child, &n);
    child.tell(&count.to_string());
    assert_eq!(child.hear(), "ready");
    (n, to, child)
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
    const T: &str = "armed_sends_are_released_in_order_with_posted_ones";
    if role().is_some() {
        return receiver();
    }
    let _one = serial();
    let (n, to, mut child) = start(T, 6);
    let m = shared();
    let before = armed_counts();
    let a0 = arm(&n, &m, 0, to, 10, 0);
    let a1 = arm(&n, &m, 1, to, 11, 0);
    let a2 = arm(&n, &m, 2, to, 12, 0);
    assert_eq!(since(before).prearmed, 3, "each armed send announced ahead");
    let mut keep = Vec::new();
    // Posted after the arming, before the ring: ahead of it.
    post(&n, to, 20, 0, 20, 0, &mut keep);
    fill_and_ring(&m, 0, 10, a0);
    post(&n, to, 21, 0, 21, 0, &mut keep);
    // Two rings in a row, then a post behind both.
    fill_and_ring(&m, 1, 11, a1);
    fill_and_ring(&m, 2, 12, a2);
    post(&n, to, 22, 0, 22, 0, &mut keep);
    child.tell("collect");
    assert_eq!(contexts(&n, 6), [10, 11, 12, 20, 21, 22]);
    assert_eq!(since(before).released, 3, "each released by a message");
    let (seeds, taken) = collected(&mut child, [10, 11, 12, 20, 21, 22]);
    assert_eq!(seeds, "20 10 21 11 12 22");
    assert_eq!(taken, 3);
    child.tell("bye");
    child.join();
}

#[test]
fn an_armed_send_waits_for_its_trigger() {
    const T: &str = "an_armed_send_waits_for_its_trigger";
    if role().is_some() {
        return receiver();
    }
    let _one = serial();
    let (n, to, mut child) = start(T, 1);
    let m = shared();
    let before = armed_counts();
    let a = arm(&n, &m, 3, to, 30, 0);
    // The receiver looks for it many times over: nothing comes before the trigger.
    child.tell("poll");
    assert_eq!(child.hear(), "seen 0");
    let mut e = [CqTaggedEntry::default(); 1];
    assert!(matches!(n.cq.read(&mut e), Err(Error::Again(_))));
    assert_eq!(since(before).released, 0);
    fill_and_ring(&m, 3, 30, a);
    child.tell("collect");
    assert_eq!(contexts(&n, 1), [30]);
    let (seeds, taken) = collected(&mut child, [30]);
    assert_eq!(seeds, "30", "the bytes the XPU wrote before its ring");
    assert_eq!(taken, 1);
    child.tell("bye");
    child.join();
}

#[test]
fn a_canceled_armed_send_never_arrives() {
    const T: &str = "a_canceled_armed_send_never_arrives";
    if role().is_some() {
        return receiver();
    }
    let _one = serial();
    let (n, to, mut child) = start(T, 1);
    let m = shared();
    let before = armed_counts();
    let a = arm(&n, &m, 4, to, 40, 0);
    n.ep.cancel(40).expect("cancel");
    match n.next() {
        Completion::Err(e, _) => assert_eq!((e.op_context, e.err), (40, FI_ECANCELED)),
        Completion::Ok(c, _) => panic!("a canceled send completed: {c:?}"),
    }
    // Its doorbell rung all the same: nothing starts.
    fill_and_ring(&m, 4, 40, a);
    let mut keep = Vec::new();
    post(&n, to, 41, 0, 41, 0, &mut keep);
    child.tell("collect");
    assert_eq!(contexts(&n, 1), [41]);
    let (seeds, _) = collected(&mut child, [40, 41]);
    assert_eq!(seeds, "41", "the canceled send's bytes arrived");
    let c = since(before);
    assert_eq!((c.prearmed, c.released), (1, 0));
    child.tell("bye");
    child.join();
}

#[test]
fn a_fired_armed_send_waits_behind_a_fence() {
    const T: &str = "a_fired_armed_send_waits_behind_a_fence";
    if role().is_some() {
        return receiver();
    }
    let _one = serial();
    let (n, to, mut child) = start(T, 2);
    let m = shared();
    let before = armed_counts();
    let a = arm(&n, &m, 5, to, 50, 0);
    // A large message the receiver matches only later: outstanding until then.
    let big = pattern(1 << 20, 99);
    // SAFETY: `big` outlives the send (waited for below).
    n.retry(|| unsafe { n.ep.tsend(&big, None, to, 1, 1000) });
    // Fenced behind it, then the armed send fires: it goes behind the fenced one.
    let mut keep = Vec::new();
    post(&n, to, 51, 0, 51, FI_FENCE, &mut keep);
    fill_and_ring(&m, 5, 50, a);
    child.tell("tag1");
    child.tell("collect");
    assert_eq!(contexts(&n, 3), [50, 51, 1000]);
    let (seeds, taken) = collected(&mut child, [50, 51]);
    assert_eq!(seeds, "51 50");
    // It went as the engine's frame, not by its slot.
    assert_eq!(taken, 0);
    let c = since(before);
    assert_eq!((c.prearmed, c.released), (1, 0));
    child.tell("bye");
    child.join();
}

#[test]
fn armed_sends_to_a_peer_that_died_fail() {
    const T: &str = "armed_sends_to_a_peer_that_died_fail";
    if role().is_some() {
        return receiver();
    }
    let _one = serial();
    let (n, to, child) = start(T, 2);
    let m = shared();
    let a = arm(&n, &m, 6, to, 60, 0);
    let b = arm(&n, &m, 7, to, 61, 0);
    fill_and_ring(&m, 6, 60, a);
    child.kill();
    // Whether the loss is noticed before or after the second ring, both end, within the
    // bound, and the first may have been delivered before the kill.
    fill_and_ring(&m, 7, 61, b);
    let mut ended = Vec::new();
    for _ in 0..2 {
        match n.next() {
            Completion::Err(e, _) => {
                assert!([FI_ECONNRESET, FI_ECANCELED].contains(&e.err), "{e:?}");
                ended.push(e.op_context);
            }
            Completion::Ok(c, _) => ended.push(c.op_context),
        }
    }
    ended.sort_unstable();
    assert_eq!(ended, [60, 61]);
}

/// More armed sends at once than the sender's segment has armed slots: those past the slots
/// start as posts when they fire, the slots are used again once their receiver has read past
/// their release, and every message arrives once, in order.
#[test]
fn more_armed_sends_than_slots() {
    const T: &str = "more_armed_sends_than_slots";
    if role().is_some() {
        return receiver();
    }
    let _one = serial();
    let (n, to, mut child) = start(T, 2 * BUFS);
    let m = shared();
    let before = armed_counts();
    for round in 0..2 {
        let vars: Vec<TriggerVar> = (0..BUFS)
            .map(|i| arm(&n, &m, i, to, i + BUFS * round, 0))
            .collect();
        let c = since(before);
        assert_eq!(
            c.prearmed,
            128 * (round as u64 + 1),
            "every armed slot in use, no more"
        );
        for (i, v) in vars.into_iter().enumerate() {
            fill_and_ring(&m, i, (1000 * round + i) as u64, v);
        }
        if round == 0 {
            child.tell("collect");
        }
        // Every send of the round completed: the buffers are free for the next one.
        assert_eq!(contexts(&n, BUFS).len(), BUFS);
    }
    let c = since(before);
    assert_eq!((c.prearmed, c.released), (256, 256));
    let want: Vec<u64> = (0..2u64)
        .flat_map(|r| (0..BUFS as u64).map(move |i| 1000 * r + i))
        .collect();
    let (seeds, taken) = collected(&mut child, want.iter().copied());
    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    assert_eq!(seeds, want.join(" "));
    assert_eq!(taken, 256);
    child.tell("bye");
    child.join();
}
