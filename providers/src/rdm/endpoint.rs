//! An endpoint made of core's RDM engine and a transport under it (its `Wire`): the one
//! endpoint of every provider on the engine (shm, tcp, verbs). Everything protocol is the
//! engine's; this maps `fi_addr_t`s to peers, moves the engine's frames into the wire and the
//! wire's frames into the engine, and reports completions after its lock is released (so that
//! counters bumped by them may start triggered operations here). A provider brings its wire,
//! its endpoint name and its engine configuration (`RdmEndpoint::open`).

use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use xfabric_core::av::PeerCache;
use xfabric_core::consts::*;
use xfabric_core::ep::TxOp;
use xfabric_core::rdm::{self, Engine, PeerId};
use xfabric_core::rxq::PostedRecv;
use xfabric_core::settings;
use xfabric_core::{
    AtomicReq, Context, EndpointOps, EpCore, Error, FiAddr, Join, ProgressSource, RegionCut,
    Result, RmaOp,
};

use super::seam::{Bell, Glue, Wire};
use super::sources::Sources;

/// How long a closing endpoint keeps sending the answers its peers wait for.
const CLOSE_FLUSH: Duration = Duration::from_secs(1);

/// The engine limits of an endpoint on `core` (the `XFABRIC_TCP_*` settings, for tcp and
/// verbs: they describe the engine, not the transport).
pub fn engine_config(core: &EpCore) -> rdm::Config {
    rdm::Config {
        eager_max: settings::TCP_EAGER_MAX.usize(),
        unexp_msgs: settings::TCP_UNEXP_MSGS.usize(),
        unexp_bytes: settings::TCP_UNEXP_BYTES.usize(),
        unexp_peer_bytes: settings::TCP_UNEXP_PEER_BYTES.usize(),
        tx_max: tx_max(core),
        // Taken frames are queued in the provider, or in the kernel's socket buffer: not yet
        // at the peer.
        delivered_on_take: false,
    }
}

/// A context size (`tx_attr.size`, `rx_attr.size`), the provider's default where 0.
fn context_size(size: usize) -> usize {
    if size == 0 {
        1024
    } else {
        size
    }
}

/// Operations the engine queues before posts answer `Again`: the endpoint's `tx_size`.
pub fn tx_max(core: &EpCore) -> usize {
    context_size(core.tx_size)
}

/// Receives posted by XPUs' descriptors the engine keeps waiting before it refuses more
/// (`EndpointOps::xpu_recv_refused`): the endpoint's `rx_size`.
fn rx_max(core: &EpCore) -> usize {
    context_size(core.rx_size)
}

struct State<W> {
    engine: Engine,
    net: W,
    /// Peer by AV index.
    av_cache: PeerCache,
    /// Peers' source addresses.
    sources: Sources,
    /// Completions being reported, kept for its allocation.
    done: Vec<rdm::Done>,
    /// Armed sends (`EndpointOps::xpu_prearm`), by their request's slot in the engine (a
    /// token's low half): the token and the wire's slot holding their announcement.
    armed: Vec<Option<(u64, u32)>>,
}

/// An endpoint of a provider on the engine.
pub struct RdmEndpoint<W: Wire> {
    core: Arc<EpCore>,
    name: Vec<u8>,
    st: Mutex<State<W>>,
    /// The wire's lock-free side: whether progress has work, and sleeping.
    bell: W::Bell,
    /// A close holds the lock while it flushes (up to `CLOSE_FLUSH`): an idle wait that
    /// finds the lock taken naps then, rather than spin (`idle_wait`).
    closing: std::sync::atomic::AtomicBool,
}

/// Where an armed send's token is kept (`State::armed`): its request's slot in the engine.
fn armed_at(token: u64) -> usize {
    (token & 0xffff_ffff) as usize
}

/// Takes the wire's slot of the armed send `token` out of `armed`, if it is there.
fn take_armed(armed: &mut [Option<(u64, u32)>], token: u64) -> Option<u32> {
    let e = armed.get_mut(armed_at(token))?;
    match *e {
        Some((t, slot)) if t == token => {
            *e = None;
            Some(slot)
        }
        _ => None,
    }
}

/// The glue over a locked state's engine.
macro_rules! glue {
    ($self:ident, $st:expr) => {{
        let State {
            engine,
            net,
            sources,
            ..
        } = $st;
        (net, Glue::new(engine, &$self.core, sources))
    }};
}

impl<W: Wire> RdmEndpoint<W> {
    /// Buffered messages of senders inserted into the AV since they came are theirs from
    /// now on (what a receive matches them by).
    fn refresh_sources(&self, st: &mut State<W>) {
        let State {
            engine, sources, ..
        } = st;
        sources.refresh(engine, &self.core);
    }

    /// An endpoint named `name` (what `fi_getname` returns) on `net`, its engine configured
    /// by `cfg` and using the wire's one-sided operations (`one_sided`) where it has them.
    pub fn open(
        core: Arc<EpCore>,
        net: W,
        name: Vec<u8>,
        cfg: rdm::Config,
        one_sided: Option<Box<dyn rdm::OneSided>>,
    ) -> Result<Arc<Self>> {
        let bell = net.bell()?;
        let mut engine = Engine::new(core.clone(), cfg);
        if let Some(t) = one_sided {
            engine = engine.with_one_sided(t);
        }
        let ep = Arc::new(RdmEndpoint {
            core,
            name,
            st: Mutex::new(State {
                engine,
                net,
                av_cache: PeerCache::default(),
                sources: Sources::default(),
                done: Vec::new(),
                armed: Vec::new(),
            }),
            bell,
            closing: std::sync::atomic::AtomicBool::new(false),
        });
        let weak: Weak<dyn RegionCut> = Arc::downgrade(&ep) as _;
        ep.core.mr.watch_closes(weak);
        Ok(ep)
    }

    fn lock(&self) -> MutexGuard<'_, State<W>> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands the engine's frames to the wire, then reports completions unlocked.
    fn finish(&self, mut st: MutexGuard<'_, State<W>>) {
        self.push(&mut st);
        let s = &mut *st;
        s.engine.take_done_into(&mut s.done);
        s.net.publish(&s.engine, &self.bell);
        rdm::report_unlocked(&self.core, st, |s| &mut s.done);
    }

    /// `finish` after `op` was written in place (`Wire::send_in_place`): complete, its
    /// completion reported here once the lock is released. Alone (the common case) it goes
    /// straight to the CQ, without a trip through the completion list; with others that
    /// came of this call it goes first, as it happened first.
    fn finish_sent(&self, st: MutexGuard<'_, State<W>>, op: &TxOp) {
        self.finish_light(st, Some(op));
    }

    /// `finish` for a call that took nothing in (a send written in place, an armed send
    /// fired): the bell's mirrors are published only if they moved, and the completion list
    /// is gone through only if it holds something. `sent`, a send that completed here, is
    /// reported first (`finish_sent`).
    #[inline(always)]
    fn finish_light(&self, mut st: MutexGuard<'_, State<W>>, sent: Option<&TxOp>) {
        let current = st.net.published_current(&st.engine);
        self.push(&mut st);
        let s = &mut *st;
        if !current {
            s.net.publish(&s.engine, &self.bell);
        }
        if s.engine.has_done() || !s.done.is_empty() {
            if let Some(op) = sent {
                s.done.push(rdm::Done::Tx {
                    ctx: op.ctx,
                    flags: op.flags,
                });
            }
            s.engine.take_done_into(&mut s.done);
            rdm::report_unlocked(&self.core, st, |s| &mut s.done);
        } else if let Some(op) = sent {
            let _r = self.core.reporting();
            drop(st);
            self.core.complete_tx(op.ctx, op.flags);
        }
    }

    /// The peer an `fi_addr_t` names.
    fn peer_for(&self, st: &mut State<W>, dest: FiAddr) -> Result<PeerId> {
        let b = self
            .core
            .bound()
            .ok_or_else(|| Error::OpBadState("endpoint is not enabled".into()))?;
        let net = &mut st.net;
        st.av_cache.lookup(b.av.as_ref(), dest, |raw| net.peer(raw))
    }

    /// The peer an operation to `dest` goes to, reachable.
    fn reach(&self, st: &mut State<W>, dest: FiAddr) -> Result<PeerId> {
        let p = self.peer_for(st, dest)?;
        st.net.reach(p)?;
        Ok(p)
    }

    /// The peer an operation goes to, reachable and with room for a request of `len` body
    /// bytes.
    fn sendable(
        &self,
        st: &mut State<W>,
        dest: FiAddr,
        len: usize,
        what: &'static str,
    ) -> Result<PeerId> {
        let p = self.reach(st, dest)?;
        self.room(st, p, len, what)?;
        Ok(p)
    }

    /// Room for a request of `len` body bytes to `p`, after taking in what arrived and
    /// handing over what waits if there is none at first; `Again` (or `PeerLost` once the
    /// peer is found gone) if still none.
    fn room(&self, st: &mut State<W>, p: PeerId, len: usize, what: &'static str) -> Result<()> {
        if st.net.room(&st.engine, p, len) {
            return Ok(());
        }
        self.do_progress(st);
        self.push(st);
        // That progress may have found the peer gone (a sweep): nothing goes to it now.
        st.net.alive(p)?;
        if st.net.room(&st.engine, p, len) {
            return Ok(());
        }
        let (net, mut g) = glue!(self, st);
        net.stuck(&mut g, p)?;
        Err(Error::Again(what))
    }

    /// Hands the engine's frames to the wire now: a caller that posts and then waits
    /// elsewhere (on its own control channel) must not find its frame still queued here.
    fn push(&self, st: &mut State<W>) {
        let (net, mut g) = glue!(self, st);
        net.push(&mut g);
    }

    /// A progress call that has work, behind a bell that looks (`Bell::LOOKS`): apart, so
    /// that the many that find none (most of a polling loop's) do not pay for this one's
    /// frame.
    #[inline(never)]
    fn progress_apart(&self) -> usize {
        self.progress_locked()
    }

    /// A progress call's work.
    #[inline(always)]
    fn progress_locked(&self) -> usize {
        let Ok(mut st) = self.st.try_lock() else {
            return 0;
        };
        let n = self.do_progress(&mut st);
        self.finish(st);
        n
    }

    /// Takes in what arrived (what that has to send goes out in `finish`).
    fn do_progress(&self, st: &mut State<W>) -> usize {
        let (net, mut g) = glue!(self, st);
        net.progress(&mut g)
    }
}

impl<W: Wire> RegionCut for RdmEndpoint<W> {
    fn cut(&self, key: u64, addr: usize, len: usize) {
        // Under the lock: a progress call copying into the region now finishes first.
        let mut st = self.lock();
        let cut = st.engine.cut_region(key, addr, len);
        let (net, mut g) = glue!(self, &mut *st);
        net.cut_region(&mut g, addr, len, &cut);
        // Copies that failed answer their peers.
        self.finish(st);
    }
}

/// How long an idle wait naps while a close holds the endpoint (about 10,000 looks a second
/// through a close that flushes for a second, where a return spun a core).
const LOCKED_NAP: Duration = Duration::from_micros(100);

/// A sleep about to begin (`RdmEndpoint::sleep_coming`).
struct Coming {
    ticket: u64,
    timeout: Duration,
    fds: Vec<(RawFd, i16)>,
}

impl<W: Wire> RdmEndpoint<W> {
    /// Readies a sleep of at most `timeout` (less where the bell says so): the bell counts a
    /// sleeper, the wire is armed, then progressed once, so that what arrives after raises an
    /// event (or moves the ticket) and the sleep cannot miss it. No sleep: `Ready` where work
    /// was found or waits that nothing will announce, `Cannot` where another thread is
    /// progressing (it may leave work behind; for long, in a close: the caller sleeps
    /// another way, briefly, rather than spin). `Ok` binds the caller to the bell's `sleep`
    /// or, for a sleep shared with others, `join_sleep`.
    fn sleep_coming(&self, timeout: Duration) -> std::result::Result<Coming, Join> {
        let timeout = self.bell.nap(timeout).ok_or(Join::Ready)?;
        let ticket = self.bell.ticket();
        let mut st = self.st.try_lock().map_err(|_| Join::Cannot)?;
        self.bell.sleep_coming();
        st.net.arm();
        if self.do_progress(&mut st) > 0 {
            self.finish(st);
            self.bell.sleep_skipped();
            return Err(Join::Ready);
        }
        let fds = st.net.wait_fds();
        self.finish(st);
        Ok(Coming {
            ticket,
            timeout,
            fds,
        })
    }
}

impl<W: Wire> ProgressSource for RdmEndpoint<W> {
    fn progress(&self) -> usize {
        self.bell.awake();
        if !self.bell.has_work() {
            return 0;
        }
        if <W::Bell as Bell>::LOOKS {
            self.progress_apart()
        } else {
            self.progress_locked()
        }
    }

    fn idle_wait(&self, timeout: Duration) {
        match self.sleep_coming(timeout) {
            Ok(s) => self.bell.sleep(s.ticket, s.timeout, &s.fds),
            // Another thread holds the endpoint. Most often it progresses or posts for a
            // moment, and what it leaves in the CQ is read at once when this returns; a
            // close holds it while it flushes, for up to a second: nap then, not spin.
            Err(Join::Cannot) if self.closing.load(std::sync::atomic::Ordering::Relaxed) => {
                std::thread::sleep(timeout.min(LOCKED_NAP))
            }
            Err(_) => {}
        }
    }

    fn wake(&self) {
        self.bell.wake();
    }

    fn join_sleep(&self, timeout: Duration, out: &mut Vec<(RawFd, i16)>) -> Join {
        let s = match self.sleep_coming(timeout) {
            Ok(s) => s,
            Err(j) => return j,
        };
        match self.bell.join_sleep(s.timeout, &s.fds, out) {
            j @ Join::Joined(_) => j,
            other => {
                self.bell.sleep_skipped();
                other
            }
        }
    }

    fn leave_sleep(&self) {
        self.bell.leave_sleep();
    }

    fn wait_fds(&self, out: &mut Vec<(RawFd, i16)>) {
        // Asked by fi_trywait before a sleep: tcp's is its epoll set, fixed for its life;
        // verbs' change with its side channels, and each trywait asks again.
        self.bell.wait_fds(out);
        if let Ok(mut st) = self.st.lock() {
            st.net.fds_exported();
            out.extend(st.net.wait_fds());
        }
    }

    fn prepare_fd_sleep(&self) -> bool {
        self.bell.arm_fds();
        // Another thread progressing now: it may leave work behind, so do not sleep yet.
        let Ok(mut st) = self.st.try_lock() else {
            return false;
        };
        // As idle_wait: armed first, then progressed, so what arrives after raises an event.
        st.net.fds_exported();
        st.net.arm();
        let n = self.do_progress(&mut st);
        self.finish(st);
        n == 0 && self.bell.quiet()
    }
}

impl<W: Wire> EndpointOps for RdmEndpoint<W> {
    fn enable(&self) -> Result<()> {
        Ok(())
    }

    fn name(&self) -> Vec<u8> {
        self.name.clone()
    }

    unsafe fn send(&self, op: &TxOp) -> Result<()> {
        let mut st = self.lock();
        let p = self.reach(&mut st, op.dest)?;
        let State { engine, net, .. } = &mut *st;
        // A message the wire takes whole now is written there and done; otherwise it needs
        // room as any request.
        // SAFETY: forwarded from the caller.
        let r = match unsafe { net.send_in_place(engine, p, op) } {
            Ok(true) => {
                self.finish_sent(st, op);
                return Ok(());
            }
            Ok(false) => self
                .room(&mut st, p, op.iov.total(), "send")
                .and_then(|()| {
                    // SAFETY: forwarded from the caller.
                    unsafe { st.engine.post_send(p, op) }
                }),
            Err(e) => Err(e),
        };
        self.finish(st);
        r
    }

    unsafe fn rma(&self, op: &RmaOp) -> Result<()> {
        let mut st = self.lock();
        // A read's request carries no body.
        let len = if op.flags & FI_READ != 0 {
            0
        } else {
            op.iov.total()
        };
        // A refusal is finished too: finding no room ran progress, whose completions and
        // mirrors are reported here.
        let r = self.sendable(&mut st, op.dest, len, "rma").and_then(|p| {
            // SAFETY: forwarded from the caller.
            unsafe { st.engine.post_rma(p, op) }
        });
        self.finish(st);
        r
    }

    unsafe fn atomic(&self, req: &AtomicReq) -> Result<()> {
        let mut st = self.lock();
        // Its operands travel in the control part.
        let r = self
            .sendable(&mut st, req.dest, 64, "atomic")
            .and_then(|p| {
                // SAFETY: forwarded from the caller.
                unsafe { st.engine.post_atomic(p, req) }
            });
        self.finish(st);
        r
    }

    fn xpu_recv_refused(&self, r: &PostedRecv) -> Option<(usize, usize)> {
        let bound = rx_max(&self.core);
        let mut st = self.lock();
        let n = st.engine.xpu_recvs_posted();
        if n < bound {
            return None;
        }
        // One that takes a buffered message frees memory rather than holding more, matched
        // as `recv` matches it.
        self.refresh_sources(&mut st);
        (!st.engine.takes_buffered(r)).then_some((n, bound))
    }

    unsafe fn recv(&self, r: PostedRecv) -> Result<()> {
        let mut st = self.lock();
        // Whether the wire or the bell may be stale after this call (`finish` refreshes
        // them).
        let mut stale = false;
        if r.flags & FI_PEEK != 0 {
            // A peek looks only at what arrived: take it in first.
            self.do_progress(&mut st);
            stale = true;
        }
        if W::WATCHES_SOURCES && self.core.caps & FI_DIRECTED_RECV != 0 && r.src != FI_ADDR_UNSPEC {
            // Know the source as a peer, so that its death fails this receive.
            let known = self.peer_for(&mut st, r.src).and_then(|p| st.net.alive(p));
            if let Err(e) = known {
                // What a peek's progress took in, and a peer named now, are reported and
                // shown all the same.
                self.finish(st);
                return Err(e);
            }
            // A peer now watched for its death (`publish`).
            stale = true;
        }
        self.refresh_sources(&mut st);
        // SAFETY: forwarded from the caller.
        let res = unsafe { st.engine.post_recv(r) };
        if st.net.held() > 0 {
            // Frames that waited for a receive may go on now.
            self.do_progress(&mut st);
            stale = true;
        }
        // A receive that only queued changed nothing the wire or the bell shows.
        if stale || st.engine.has_output() || st.engine.has_done() {
            self.finish(st);
        }
        res
    }

    fn cancel(&self, ctx: Context) -> Result<()> {
        let mut st = self.lock();
        let r = st.engine.cancel(ctx);
        self.finish(st);
        r
    }

    fn setopt(&self, name: i32, value: usize) -> Result<()> {
        self.lock().engine.setopt(name, value, W::PROVIDER)
    }

    fn getopt(&self, name: i32) -> Result<usize> {
        self.lock().engine.getopt(name, W::PROVIDER)
    }

    fn buffered(&self) -> xfabric_core::Buffered {
        let st = self.lock();
        xfabric_core::Buffered {
            held: st.net.held(),
            ..st.engine.buffered()
        }
    }

    unsafe fn xpu_prearm(&self, op: &TxOp) -> Option<u64> {
        if !W::PREARMS {
            return None;
        }
        let mut st = self.lock();
        let token = self.reach(&mut st, op.dest).ok().and_then(|p| {
            let State {
                engine, net, armed, ..
            } = &mut *st;
            let (token, ctrl) = engine.arm_send(p, op)?;
            let at = armed_at(token);
            if armed.len() <= at {
                armed.resize(at + 1, None);
            }
            // A send armed before in this request slot that ended without firing (its peer
            // lost): its announcement is not needed any more.
            if let Some((_, old)) = armed[at].take() {
                net.unarm(old);
            }
            let slot = net.prearm(p, ctrl.as_bytes()).or_else(|| {
                // Every slot in use: those of sends that ended without firing are freed.
                let mut freed = false;
                for e in armed.iter_mut() {
                    if let Some((t, s)) = *e {
                        if !engine.is_armed(t) {
                            *e = None;
                            net.unarm(s);
                            freed = true;
                        }
                    }
                }
                if !freed {
                    return None;
                }
                net.prearm(p, engine.armed_frame(token)?.as_bytes())
            });
            let Some(slot) = slot else {
                engine.disarm(token);
                return None;
            };
            armed[at] = Some((token, slot));
            Some(token)
        });
        self.finish(st);
        token
    }

    fn xpu_fired(&self, token: u64) -> bool {
        let mut st = self.lock();
        let slot = take_armed(&mut st.armed, token);
        let fired = st.engine.fire_armed(token);
        let started = !matches!(fired, rdm::Fired::Stale);
        match fired {
            rdm::Fired::Release(p) => {
                if !slot.is_some_and(|s| st.net.release(p, s, token)) {
                    // The wire cannot tell the peer now: the frame goes as any other.
                    if let Some(s) = slot {
                        st.net.unarm(s);
                    }
                    st.engine.send_armed(token);
                }
            }
            rdm::Fired::Queued | rdm::Fired::Stale => {
                if let Some(s) = slot {
                    st.net.unarm(s);
                }
            }
        }
        // On a CPU XPU's thread, between two buckets of its compute: nothing was taken in.
        self.finish_light(st, None);
        started
    }

    fn xpu_disarm(&self, token: u64) -> bool {
        let mut st = self.lock();
        if let Some(s) = take_armed(&mut st.armed, token) {
            st.net.unarm(s);
        }
        let ended = st.engine.disarm(token);
        self.finish(st);
        ended
    }

    fn close(&self) {
        self.closing
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let mut st = self.lock();
        st.engine.close();
        // The armed sends ended with the engine's other requests.
        for (_, s) in std::mem::take(&mut st.armed).into_iter().flatten() {
            st.net.unarm(s);
        }
        self.push(&mut st);
        // Answers peers wait for go out first, for a bounded time.
        let (net, mut g) = glue!(self, &mut *st);
        net.shutdown(&mut g, Instant::now() + CLOSE_FLUSH);
        self.finish(st);
    }
}
