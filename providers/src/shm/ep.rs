//! The shm endpoint, on core's RDM engine: the engine does the protocol (eager and
//! rendezvous, acknowledgements, RMA and atomics at the target, fences, ordering, commit, peer
//! loss); `net` moves its frames through the rings and copies by cross-memory attach. This
//! file maps addresses to peers, keeps a lock-free check of whether a poll has anything to do,
//! and reports completions after its lock is released.

use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use xfabric_core::av::PeerCache;
use xfabric_core::consts::*;
use xfabric_core::ep::TxOp;
use xfabric_core::rdm::{self, Engine, PeerId};
use xfabric_core::rxq::PostedRecv;
use xfabric_core::settings;
use xfabric_core::{
    AtomicReq, Context, EndpointOps, EpCore, Error, FiAddr, ProgressSource, Result, RmaOp,
};

use super::net::{Net, ShmOneSided};
use super::{ring, ADDR_PREFIX};

/// How long a closing endpoint keeps sending the answers its peers wait for.
const CLOSE_FLUSH: Duration = Duration::from_secs(1);
/// How long it waits for a peer that claimed its part of a split copy into one of its
/// buffers to say it is done (or to die) before handing the buffer back.
const CLOSE_SPLIT: Duration = Duration::from_secs(5);

/// Largest message sent eagerly. Larger ones go by rendezvous, whose data below the pull
/// threshold (`XFABRIC_SHM_CMA_MIN`) crosses the ring just as an eager body would, after one
/// more round trip: eager pays up to where cross-memory attach takes over.
const EAGER_MAX: usize = 65536;

struct State {
    engine: Engine,
    net: Net,
    av_cache: PeerCache,
    /// Completions being reported, kept for its allocation.
    done: Vec<rdm::Done>,
}

/// An shm endpoint on the engine.
pub struct ShmEndpoint {
    core: Arc<EpCore>,
    /// Our segment's name (the address is `fi_shm://` and it).
    name: String,
    /// A second mapping of our own segment and the lock-free mirrors, for `progress` and
    /// `idle_wait` without the lock.
    seg: super::segment::Segment,
    idle: Arc<super::net::Idle>,
    st: Mutex<State>,
    /// Bound when a wait object first asks for this endpoint's descriptors (`None` if that
    /// failed: such a sleeper is then woken only by its completions).
    wake_sock: OnceLock<Option<super::fdwake::WakeSock>>,
}

impl ShmEndpoint {
    /// Creates the endpoint's segment and engine.
    pub fn open(core: Arc<EpCore>) -> Result<Arc<Self>> {
        let net = Net::open(core.caps & FI_DIRECTED_RECV != 0)?;
        let name = net.name.clone();
        let seg = super::segment::Segment::open(&name, ring::SEG_BYTES)?;
        let idle = net.idle.clone();
        let cfg = rdm::Config {
            eager_max: EAGER_MAX,
            unexp_msgs: settings::SHM_UNEXP_MSGS.usize(),
            unexp_bytes: settings::SHM_UNEXP_BYTES.usize(),
            // Peers on this host, each bounded by its ring: the endpoint's bound is theirs.
            unexp_peer_bytes: settings::SHM_UNEXP_BYTES.usize(),
            tx_max: if core.tx_size == 0 {
                1024
            } else {
                core.tx_size
            },
            // A frame the ring takes is in the receiver's segment: delivered.
            delivered_on_take: true,
        };
        let one_sided = ShmOneSided {
            cma: net.cma.clone(),
            pull_min: settings::SHM_CMA_MIN.usize(),
        };
        let engine = Engine::new(core.clone(), cfg).with_one_sided(Box::new(one_sided));
        Ok(Arc::new(ShmEndpoint {
            core,
            name,
            seg,
            idle,
            wake_sock: OnceLock::new(),
            st: Mutex::new(State {
                engine,
                net,
                av_cache: PeerCache::default(),
                done: Vec::new(),
            }),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands the engine's frames to the rings, then reports completions unlocked.
    fn finish(&self, mut st: MutexGuard<'_, State>) {
        let s = &mut *st;
        s.net.push(&mut s.engine);
        s.engine.take_done_into(&mut s.done);
        s.net.publish(&s.engine);
        rdm::report_unlocked(&self.core, &self.st, st, |s| &mut s.done);
    }

    /// The peer an `fi_addr_t` names, mapping its segment on first use.
    fn peer_for(&self, st: &mut State, dest: FiAddr) -> Result<PeerId> {
        let b = self
            .core
            .bound()
            .ok_or_else(|| Error::OpBadState("endpoint is not enabled".into()))?;
        let net = &mut st.net;
        st.av_cache.lookup(b.av.as_ref(), dest, |raw| {
            let name = super::seg_name(raw)?;
            net.peer_by_name(&name)
        })
    }

    /// The live peer `dest` names, with a lane claimed in its segment.
    fn reach(&self, st: &mut State, dest: FiAddr) -> Result<PeerId> {
        let p = self.peer_for(st, dest)?;
        if st.net.dead(p) {
            return Err(Error::PeerLost(format!(
                "peer {} is gone",
                st.net.peer_name(p)
            )));
        }
        st.net.ensure_lane(p)?;
        Ok(p)
    }

    /// The peer an operation goes to, with a lane claimed and room in its ring for a request
    /// of `len` body bytes: as on shm's own protocol, a post toward a full ring answers
    /// `Again` (or `PeerLost` once the peer is found dead) rather than queueing.
    fn sendable(
        &self,
        st: &mut State,
        dest: FiAddr,
        len: usize,
        what: &'static str,
    ) -> Result<PeerId> {
        let p = self.reach(st, dest)?;
        self.room(st, p, len, what)?;
        Ok(p)
    }

    /// Room in `p`'s ring for a request of `len` body bytes, after taking in what arrived if
    /// there is none at first; `Again` (or `PeerLost` once the peer is found dead) if still
    /// none.
    fn room(&self, st: &mut State, p: PeerId, len: usize, what: &'static str) -> Result<()> {
        let gone = |net: &Net| Error::PeerLost(format!("peer {} is gone", net.peer_name(p)));
        // Behind a frame still being written, posts queue in the engine (bounded by
        // `tx_max`): they go out as its pieces do.
        let room = |st: &mut State| {
            st.net.writing_to(p) || (st.engine.blocked(p) == 0 && st.net.fits(p, len))
        };
        if room(st) {
            return Ok(());
        }
        self.do_progress(st);
        st.net.push(&mut st.engine);
        if room(st) {
            return Ok(());
        }
        let State { engine, net, .. } = st;
        if net.broken(p) {
            net.lose(engine, &self.core, p, "its ring is corrupt");
            return Err(gone(net));
        }
        if net.check(engine, &self.core, p) {
            return Err(gone(net));
        }
        Err(Error::Again(what))
    }

    /// `progress` without clearing the fd-sleep flag; `None` when another thread holds the
    /// endpoint.
    fn progress_awake(&self) -> Option<usize> {
        // Idle, take the full path only when a sweep is due and something waits on a peer: a
        // dead one must be noticed by time, however slowly (or fast) the application polls.
        use std::sync::atomic::Ordering::Relaxed;
        let sweep = || {
            self.idle.watch.load(Relaxed)
                && crate::clock::coarse_ms() >= self.idle.next_sweep.load(Relaxed)
        };
        if !Net::has_work(&self.seg, &self.idle) && !sweep() {
            return Some(0);
        }
        let Ok(mut st) = self.st.try_lock() else {
            return None;
        };
        let n = self.do_progress(&mut st);
        self.finish(st);
        Some(n)
    }

    /// The wake socket, bound on first use.
    fn wake_sock(&self) -> Option<&super::fdwake::WakeSock> {
        self.wake_sock
            .get_or_init(|| match super::fdwake::WakeSock::bind(&self.name) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(
                        "shm: no wake socket, fd sleepers wake on completions only: {e}"
                    );
                    None
                }
            })
            .as_ref()
    }

    /// Takes in what arrived (what that has to send goes out in `finish`).
    fn do_progress(&self, st: &mut State) -> usize {
        let State { engine, net, .. } = st;
        let n = net.progress(engine, &self.core);
        if net.sweep_due() {
            net.sweep(engine, &self.core);
        }
        n
    }
}

impl ProgressSource for ShmEndpoint {
    fn wake(&self) {
        Net::wake(&self.seg);
    }

    fn progress(&self) -> usize {
        // Awake: senders need not ring the wake socket until the next fd sleep.
        let fd_sleeping = ring::fd_sleeping(&self.seg);
        if fd_sleeping.load(std::sync::atomic::Ordering::Relaxed) != 0 {
            fd_sleeping.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        self.progress_awake().unwrap_or(0)
    }

    fn wait_fds(&self, out: &mut Vec<(RawFd, i16)>) {
        if let Some(s) = self.wake_sock() {
            out.push((s.raw(), libc::POLLIN));
        }
    }

    fn prepare_fd_sleep(&self) -> bool {
        use std::sync::atomic::{fence, Ordering};
        let Some(s) = self.wake_sock() else {
            return self.progress_awake() == Some(0);
        };
        // Flag, then drain, then look: a sender that wrote after the look saw the flag (the
        // fences pair with `Net::wake`'s) and rings after the drain.
        ring::fd_sleeping(&self.seg).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        s.drain();
        // A peer that dies while we sleep is noticed at the next wake-up: no descriptor
        // announces it (idle_wait sleeps by time for that).
        // Another thread progressing now (None) may leave work behind: do not sleep yet.
        self.progress_awake() == Some(0) && !Net::has_work(&self.seg, &self.idle)
    }

    fn idle_wait(&self, timeout: Duration) {
        use std::sync::atomic::Ordering;
        let sleepers = ring::sleeping(&self.seg);
        let db = ring::doorbell(&self.seg);
        let seen = db.load(Ordering::SeqCst);
        // A dead peer rings no doorbell: while work waits on peers, wake in time to sweep.
        let timeout = if self.idle.watch.load(Ordering::Relaxed) {
            timeout.min(Duration::from_millis(super::net::SWEEP_EVERY_MS))
        } else {
            timeout
        };
        sleepers.fetch_add(1, Ordering::SeqCst);
        if !Net::has_work(&self.seg, &self.idle) {
            super::futex::wait(db, seen, timeout);
        }
        sleepers.fetch_sub(1, Ordering::SeqCst);
        if let Ok(mut st) = self.st.try_lock() {
            if st.net.sweep_due() {
                let State { engine, net, .. } = &mut *st;
                net.sweep(engine, &self.core);
            }
            self.finish(st);
        }
    }
}

impl EndpointOps for ShmEndpoint {
    fn enable(&self) -> Result<()> {
        Ok(())
    }

    fn name(&self) -> Vec<u8> {
        format!("{ADDR_PREFIX}{}", self.name).into_bytes()
    }

    unsafe fn send(&self, op: &TxOp) -> Result<()> {
        let mut st = self.lock();
        let p = self.reach(&mut st, op.dest)?;
        let State { engine, net, .. } = &mut *st;
        // A message the ring takes whole now is written there and done; otherwise it needs
        // room as any request.
        // SAFETY: forwarded from the caller.
        let r = match unsafe { engine.send_in_place(p, op, net) } {
            Ok(false) => self
                .room(&mut st, p, op.iov.total(), "send")
                .and_then(|()| {
                    // SAFETY: forwarded from the caller.
                    unsafe { st.engine.post_send(p, op) }
                }),
            r => r.map(|_| ()),
        };
        self.finish(st);
        r
    }

    unsafe fn rma(&self, op: &RmaOp) -> Result<()> {
        let mut st = self.lock();
        let len = if op.flags & FI_READ != 0 {
            0
        } else {
            op.iov.total()
        };
        let p = self.sendable(&mut st, op.dest, len, "rma")?;
        // SAFETY: forwarded from the caller.
        let r = unsafe { st.engine.post_rma(p, op) };
        self.finish(st);
        r
    }

    unsafe fn atomic(&self, req: &AtomicReq) -> Result<()> {
        let mut st = self.lock();
        let p = self.sendable(&mut st, req.dest, 64, "atomic")?;
        // SAFETY: forwarded from the caller.
        let r = unsafe { st.engine.post_atomic(p, req) };
        self.finish(st);
        r
    }

    unsafe fn recv(&self, r: PostedRecv) -> Result<()> {
        let mut st = self.lock();
        // Whether the lock-free mirrors may be stale after this call (`finish` refreshes
        // them).
        let mut stale = false;
        if r.flags & FI_PEEK != 0 {
            // A peek looks only at what arrived: take it in first.
            self.do_progress(&mut st);
            stale = true;
        }
        if self.core.caps & FI_DIRECTED_RECV != 0 && r.src != FI_ADDR_UNSPEC {
            // Know the source as a peer, so that its death fails this receive.
            let p = self.peer_for(&mut st, r.src)?;
            // A peer now watched for its death (`publish`).
            stale = true;
            if st.net.dead(p) {
                return Err(Error::PeerLost(format!(
                    "peer {} is gone",
                    st.net.peer_name(p)
                )));
            }
        }
        // SAFETY: forwarded from the caller.
        let res = unsafe { st.engine.post_recv(r) };
        if st.net.held() > 0 {
            // Frames that waited for a receive may go on now.
            self.do_progress(&mut st);
            stale = true;
        }
        // A receive that only queued changed nothing the rings or the mirrors show.
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
        self.lock().engine.setopt(name, value, "shm")
    }

    fn buffered(&self) -> xfabric_core::Buffered {
        let st = self.lock();
        xfabric_core::Buffered {
            held: st.net.held(),
            ..st.engine.buffered()
        }
    }

    fn close(&self) {
        let mut st = self.lock();
        st.engine.close();
        // Answers peers wait for go out first, for a bounded time.
        let start = Instant::now();
        loop {
            let State { engine, net, .. } = &mut *st;
            net.push(engine);
            let waited = start.elapsed();
            // A split copy's peer may still be writing into a buffer about to be handed back:
            // it is given longer (a claimed part is one system call away from done, but its
            // process may not be scheduled), as shm's first protocol gave it.
            let owing = (engine.owes() || net.writing()) && waited < CLOSE_FLUSH;
            let splitting = net.splitting() && waited < CLOSE_SPLIT;
            if !(owing || splitting) {
                break;
            }
            net.progress(engine, &self.core);
            if net.sweep_due() {
                net.sweep(engine, &self.core);
            }
            std::thread::yield_now();
        }
        {
            // Past the bound: a peer that neither answers nor dies is given up on.
            let State { engine, net, .. } = &mut *st;
            net.end_splits(engine, None, xfabric_core::consts::errno::FI_ECANCELED);
        }
        st.net.bye();
        self.finish(st);
    }
}
