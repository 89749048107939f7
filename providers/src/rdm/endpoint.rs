//! An endpoint made of core's RDM engine and a transport under it (its `Wire`): the glue every
//! provider on the engine shares (tcp, verbs). Everything protocol is the engine's; this maps
//! `fi_addr_t`s to peers, moves the engine's frames into the wire and the wire's frames into
//! the engine, and reports completions after its lock is released (so that counters bumped by
//! them may start triggered operations here). A provider brings its wire, its endpoint name
//! and its engine configuration (`RdmEndpoint::open`).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use xfabric_core::av::PeerCache;
use xfabric_core::consts::*;
use xfabric_core::ep::TxOp;
use xfabric_core::rdm::wire::{Prefix, WireError};
use xfabric_core::rdm::{self, Engine, PeerId, Sink};
use xfabric_core::rxq::PostedRecv;
use xfabric_core::settings;
use xfabric_core::{
    AtomicReq, Context, EndpointOps, EpCore, Error, FiAddr, ProgressSource, Result, RmaOp,
};

use super::seam::{Handler, Wire};
use super::sources::Sources;
use crate::inet;

/// Bytes one peer's queue may hold before posts to it answer `Again` (inject copies and
/// frames the engine made; application buffers are not copied but count here too): a peer
/// that stops reading holds back its senders instead of growing their memory.
const QUEUE_MAX: usize = 64 << 20;

/// The engine limits of an endpoint on `core` (the `XFABRIC_TCP_*` settings, for every wire:
/// they describe the engine, not the transport).
pub fn engine_config(core: &EpCore) -> rdm::Config {
    rdm::Config {
        eager_max: settings::TCP_EAGER_MAX.usize(),
        unexp_msgs: settings::TCP_UNEXP_MSGS.usize(),
        unexp_bytes: settings::TCP_UNEXP_BYTES.usize(),
        unexp_peer_bytes: settings::TCP_UNEXP_PEER_BYTES.usize(),
        tx_max: if core.tx_size == 0 {
            1024
        } else {
            core.tx_size
        },
        // Taken frames are queued in the provider, or in the kernel's socket buffer: not yet
        // at the peer.
        delivered_on_take: false,
    }
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
}

/// An endpoint of a provider on the engine.
pub struct RdmEndpoint<W: Wire> {
    core: Arc<EpCore>,
    name: Vec<u8>,
    st: Mutex<State<W>>,
    /// Written by `wake` to end an `idle_wait`.
    wake_fd: OwnedFd,
    /// Whether the last locked call left work the engine or the wire can advance without a
    /// peer (frames queued, answers awaited): `idle_wait` then sleeps at most 1 ms.
    busy: AtomicBool,
    /// Whether the last locked call left bytes no descriptor will announce (`Wire::backlog`):
    /// `idle_wait` then does not sleep.
    backlog: AtomicBool,
}

/// The engine as the wire's handler, with what it needs to name a peer's source address.
pub struct Glue<'a> {
    /// The endpoint's engine.
    pub engine: &'a mut Engine,
    core: &'a EpCore,
    sources: &'a mut Sources,
}

impl Glue<'_> {
    fn src(&mut self, peer: PeerId, addr: SocketAddr) -> FiAddr {
        self.sources
            .of(self.engine, self.core, peer, || inet::encode(&addr))
    }
}

impl Handler for Glue<'_> {
    fn on_ctrl(
        &mut self,
        peer: PeerId,
        addr: SocketAddr,
        prefix: &Prefix,
        ctrl: &[u8],
    ) -> std::result::Result<Sink, WireError> {
        let src = self.src(peer, addr);
        self.engine.on_ctrl(peer, src, prefix, ctrl)
    }

    fn on_body(&mut self, peer: PeerId, sink: Sink) {
        self.engine.on_body(peer, sink)
    }

    fn on_frame(
        &mut self,
        peer: PeerId,
        addr: SocketAddr,
        prefix: &Prefix,
        ctrl: &[u8],
        body: &[u8],
    ) -> std::result::Result<bool, WireError> {
        let src = self.src(peer, addr);
        self.engine.on_frame(peer, src, prefix, ctrl, body)
    }

    fn on_sent(&mut self, peer: PeerId, token: u64) {
        self.engine.on_sent(peer, token)
    }

    fn on_lost(&mut self, peer: PeerId, addr: Option<SocketAddr>, errno: i32) {
        self.engine.on_lost(peer, errno);
        if let Some(a) = addr {
            // Receives directed at it alone would wait for nothing.
            let src = self.src(peer, a);
            self.engine.source_lost(src, errno);
        }
    }

    fn on_native(&mut self, token: u64, status: i32) {
        self.engine.on_native(token, status)
    }

    fn on_copied(&mut self, token: u64, how: rdm::Copied) {
        self.engine.on_copied(token, how)
    }

    fn on_native_write(&mut self, _peer: PeerId, len: usize, data: Option<u64>) {
        self.engine.on_native_write(len, data)
    }
}

impl<W: Wire> RdmEndpoint<W> {
    /// An endpoint named `name` (what `fi_getname` returns) on `net`, its engine configured
    /// by `cfg`.
    pub fn open(core: Arc<EpCore>, net: W, name: Vec<u8>, cfg: rdm::Config) -> Result<Arc<Self>> {
        Self::open_with(core, net, name, cfg, None)
    }

    /// As `open`, the engine using the wire's one-sided operations (`one_sided`) where it
    /// has them.
    pub fn open_with(
        core: Arc<EpCore>,
        net: W,
        name: Vec<u8>,
        cfg: rdm::Config,
        one_sided: Option<Box<dyn rdm::OneSided>>,
    ) -> Result<Arc<Self>> {
        // SAFETY: plain syscall; the descriptor is owned by this endpoint and closed in Drop.
        let wake_fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if wake_fd < 0 {
            return Err(Error::last_os(format!("{} endpoint: eventfd", W::PROVIDER)));
        }
        // SAFETY: a descriptor we just opened and own alone.
        let wake_fd = unsafe { OwnedFd::from_raw_fd(wake_fd) };
        let mut engine = Engine::new(core.clone(), cfg);
        if let Some(t) = one_sided {
            engine = engine.with_one_sided(t);
        }
        Ok(Arc::new(RdmEndpoint {
            core,
            name,
            st: Mutex::new(State {
                engine,
                net,
                av_cache: PeerCache::default(),
                sources: Sources::default(),
                done: Vec::new(),
            }),
            wake_fd,
            busy: AtomicBool::new(false),
            backlog: AtomicBool::new(false),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State<W>> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands the engine's frames to the wire, then reports completions unlocked.
    fn finish(&self, mut st: MutexGuard<'_, State<W>>) {
        self.push(&mut st);
        let s = &mut *st;
        s.engine.take_done_into(&mut s.done);
        self.busy
            .store(s.engine.busy() || s.net.busy(), Ordering::Release);
        self.backlog.store(s.net.backlog(), Ordering::Release);
        rdm::report_unlocked(&self.core, &self.st, st, |s| &mut s.done);
    }

    /// The peer an `fi_addr_t` names, with room in its queue (progressing once if not).
    fn sendable(&self, st: &mut State<W>, dest: FiAddr, what: &'static str) -> Result<PeerId> {
        let p = self.peer_for(st, dest)?;
        if st.net.queued(p) > QUEUE_MAX {
            self.do_progress(st);
            if st.net.queued(p) > QUEUE_MAX {
                return Err(Error::Again(what));
            }
        }
        Ok(p)
    }

    /// The peer an `fi_addr_t` names.
    fn peer_for(&self, st: &mut State<W>, dest: FiAddr) -> Result<PeerId> {
        let b = self
            .core
            .bound()
            .ok_or_else(|| Error::OpBadState("endpoint is not enabled".into()))?;
        let net = &mut st.net;
        st.av_cache
            .lookup(b.av.as_ref(), dest, |raw| Ok(net.peer(inet::decode(raw)?)))
    }

    /// Hands the engine's frames to the wire now: a caller that posts and then waits
    /// elsewhere (on its own control channel) must not find its frame still queued here.
    fn push(&self, st: &mut State<W>) {
        let State {
            engine,
            net,
            sources,
            ..
        } = st;
        net.push(&mut Glue {
            engine,
            core: &self.core,
            sources,
        });
    }

    fn do_progress(&self, st: &mut State<W>) -> usize {
        let State {
            engine,
            net,
            sources,
            ..
        } = st;
        let mut glue = Glue {
            engine,
            core: &self.core,
            sources,
        };
        let n = net.progress(&mut glue);
        // Answers the engine owes (ACKs, CTS, read data) go out in the same call.
        net.push(&mut glue);
        n
    }

    fn poll_fds(&self, net: &[(RawFd, i16)], timeout: Duration) {
        let mut fds: Vec<libc::pollfd> = std::iter::once((self.wake_fd.as_raw_fd(), libc::POLLIN))
            .chain(net.iter().copied())
            .map(|(fd, events)| libc::pollfd {
                fd,
                events,
                revents: 0,
            })
            .collect();
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: a valid pollfd array of its length. A descriptor closed since (a connection
        // dropped by another thread's progress) reports POLLNVAL and ends the wait early.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if r > 0 && fds[0].revents != 0 {
            let mut v: u64 = 0;
            // SAFETY: reads 8 bytes into a local from our non-blocking eventfd.
            unsafe { libc::read(self.wake_fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        }
    }
}

impl<W: Wire> ProgressSource for RdmEndpoint<W> {
    fn progress(&self) -> usize {
        let Ok(mut st) = self.st.try_lock() else {
            return 0;
        };
        let n = self.do_progress(&mut st);
        self.finish(st);
        n
    }

    fn idle_wait(&self, timeout: Duration) {
        // Bytes already waiting that nothing will announce: progress again at once.
        if self.backlog.load(Ordering::Acquire) {
            return;
        }
        // While answers are awaited, sleep, but not long.
        let timeout = if self.busy.load(Ordering::Acquire) {
            timeout.min(Duration::from_millis(1))
        } else {
            timeout
        };
        let Ok(mut st) = self.st.try_lock() else {
            return;
        };
        // Armed first, then progressed once: what arrives after this raises an event, so the
        // sleep below cannot miss it.
        st.net.arm();
        if self.do_progress(&mut st) > 0 {
            self.finish(st);
            return;
        }
        let fds = st.net.wait_fds();
        self.finish(st);
        self.poll_fds(&fds, timeout);
    }

    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local to our eventfd.
        unsafe { libc::write(self.wake_fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    fn wait_fds(&self, out: &mut Vec<(RawFd, i16)>) {
        // Asked by fi_trywait before a sleep: tcp's is its epoll set, fixed for its life;
        // verbs' change with its side channels, and each trywait asks again.
        if let Ok(st) = self.st.lock() {
            out.extend(st.net.wait_fds());
        }
    }

    fn prepare_fd_sleep(&self) -> bool {
        // Another thread progressing now: it may leave work behind, so do not sleep yet.
        let Ok(mut st) = self.st.try_lock() else {
            return false;
        };
        // As idle_wait: armed first, then progressed, so what arrives after raises an event.
        st.net.arm();
        let n = self.do_progress(&mut st);
        self.finish(st);
        n == 0 && !self.backlog.load(Ordering::Acquire)
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
        let p = self.sendable(&mut st, op.dest, "send")?;
        // SAFETY: forwarded from the caller.
        let r = unsafe { st.engine.post_send(p, op) };
        self.finish(st);
        r
    }

    unsafe fn rma(&self, op: &RmaOp) -> Result<()> {
        let mut st = self.lock();
        let p = self.sendable(&mut st, op.dest, "rma")?;
        // SAFETY: forwarded from the caller.
        let r = unsafe { st.engine.post_rma(p, op) };
        self.finish(st);
        r
    }

    unsafe fn atomic(&self, req: &AtomicReq) -> Result<()> {
        let mut st = self.lock();
        let p = self.sendable(&mut st, req.dest, "atomic")?;
        // SAFETY: forwarded from the caller.
        let r = unsafe { st.engine.post_atomic(p, req) };
        self.finish(st);
        r
    }

    unsafe fn recv(&self, r: PostedRecv) -> Result<()> {
        let mut st = self.lock();
        if r.flags & FI_PEEK != 0 {
            // A peek looks only at what arrived: take it in first.
            self.do_progress(&mut st);
        }
        // SAFETY: forwarded from the caller.
        let res = unsafe { st.engine.post_recv(r) };
        self.finish(st);
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

    fn buffered(&self) -> xfabric_core::Buffered {
        self.lock().engine.buffered()
    }

    fn close(&self) {
        let mut st = self.lock();
        st.engine.close();
        self.push(&mut st);
        // Answers peers wait for go out first, for a bounded time.
        st.net.shutdown(Instant::now() + Duration::from_secs(1));
        self.finish(st);
    }
}
