//! The verbs endpoint: core's RDM engine over `net`'s RC connections. Like tcp's endpoint
//! (which this mirrors): `fi_addr_t`s to peers, the engine's frames into chunks and back,
//! completions reported after the lock is released. Progress polls the CQ; an idle wait arms
//! the CQ and sleeps on its completion channel, the side channels and a wake eventfd.

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

use super::ib::Nic;
use crate::tcp::addr;
use crate::tcp::net::Handler;

/// Bytes one peer's queue may hold before posts to it answer `Again` (inject copies and
/// frames the engine made; application buffers are not copied but count here too): a peer
/// that stops reading holds back its senders instead of growing their memory.
const QUEUE_MAX: usize = 64 << 20;
use super::net::Net;

struct State {
    engine: Engine,
    net: Net,
    /// Peer by AV index.
    av_cache: PeerCache,
    /// Source `fi_addr_t` by peer, for the AV generation `src_gen`.
    srcs: Vec<Option<FiAddr>>,
    src_gen: u64,
}

/// A verbs endpoint.
pub struct VerbsEndpoint {
    core: Arc<EpCore>,
    name: Vec<u8>,
    st: Mutex<State>,
    /// Written by `wake` to end an `idle_wait`.
    wake_fd: OwnedFd,
    /// Whether the last locked call left work the engine can advance without a peer (frames
    /// queued, answers awaited): `progress` then does not skip on an idle socket set.
    busy: AtomicBool,
}

/// The engine as `net`'s handler, with what it needs to name a peer's source address.
struct Glue<'a> {
    engine: &'a mut Engine,
    core: &'a EpCore,
    srcs: &'a mut Vec<Option<FiAddr>>,
}

impl Glue<'_> {
    fn src(&mut self, peer: PeerId, addr: SocketAddr) -> FiAddr {
        if let Some(Some(s)) = self.srcs.get(peer) {
            return *s;
        }
        let s = self
            .core
            .bound()
            .and_then(|b| b.av.as_ref())
            .and_then(|av| av.reverse(&addr::encode(&addr)))
            .unwrap_or(FI_ADDR_NOTAVAIL);
        if self.srcs.len() <= peer {
            self.srcs.resize(peer + 1, None);
        }
        self.srcs[peer] = Some(s);
        s
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
}

impl VerbsEndpoint {
    /// Listens on `bind` (port 0: any); its name is a sockaddr, or with `str_name` the
    /// `FI_ADDR_STR` form.
    pub fn open(
        core: Arc<EpCore>,
        nic: &Arc<Nic>,
        bind: SocketAddr,
        str_name: bool,
    ) -> Result<Arc<Self>> {
        let net = Net::bind(nic, bind)?;
        let name = if str_name {
            let mut s = addr::to_str(&net.local_addr()).into_bytes();
            s.push(0);
            s
        } else {
            addr::encode(&net.local_addr())
        };
        // SAFETY: plain syscall; the descriptor is owned by this endpoint and closed in Drop.
        let wake_fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if wake_fd < 0 {
            return Err(Error::last_os("verbs endpoint: eventfd"));
        }
        // SAFETY: a descriptor we just opened and own alone.
        let wake_fd = unsafe { OwnedFd::from_raw_fd(wake_fd) };
        // The engine limits are tcp's settings (XFABRIC_TCP_*): one more set of knobs would
        // only repeat them.
        let engine = Engine::new(
            core.clone(),
            rdm::Config {
                eager_max: settings::TCP_EAGER_MAX.usize(),
                unexp_msgs: settings::TCP_UNEXP_MSGS.usize(),
                unexp_bytes: settings::TCP_UNEXP_BYTES.usize(),
                tx_max: if core.tx_size == 0 {
                    1024
                } else {
                    core.tx_size
                },
            },
        );
        Ok(Arc::new(VerbsEndpoint {
            core,
            name,
            st: Mutex::new(State {
                engine,
                net,
                av_cache: PeerCache::default(),
                srcs: Vec::new(),
                src_gen: u64::MAX,
            }),
            wake_fd,
            busy: AtomicBool::new(false),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands the engine's frames to the sockets, then reports completions unlocked.
    fn finish(&self, mut st: MutexGuard<'_, State>) {
        self.push(&mut st);
        let st_ref = &mut *st;
        let mut done = st_ref.engine.take_done();
        self.busy
            .store(st_ref.engine.busy() || st_ref.net.busy(), Ordering::Release);
        drop(st);
        if !done.is_empty() {
            rdm::report(&self.core, &mut done);
        }
    }

    /// The peer an `fi_addr_t` names, with room in its queue (progressing once if not).
    fn sendable(&self, st: &mut State, dest: FiAddr, what: &'static str) -> Result<PeerId> {
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
    fn peer_for(&self, st: &mut State, dest: FiAddr) -> Result<PeerId> {
        let b = self
            .core
            .bound()
            .ok_or_else(|| Error::OpBadState("endpoint is not enabled".into()))?;
        let net = &mut st.net;
        st.av_cache
            .lookup(b.av.as_ref(), dest, |raw| Ok(net.peer(addr::decode(raw)?)))
    }

    fn refresh_srcs(&self, st: &mut State) {
        let gen = self
            .core
            .bound()
            .and_then(|b| b.av.as_ref())
            .map_or(0, |av| av.generation());
        if gen != st.src_gen {
            st.srcs.clear();
            st.src_gen = gen;
        }
    }

    fn do_progress(&self, st: &mut State) -> usize {
        self.refresh_srcs(st);
        let State {
            engine, net, srcs, ..
        } = st;
        let mut glue = Glue {
            engine,
            core: &self.core,
            srcs,
        };
        let n = net.progress(&mut glue);
        // Answers the engine owes (ACKs, CTS, read data) go out in the same call.
        self.push(st);
        n
    }

    /// Hands the engine's frames to the connections and posts what credits allow, now: a
    /// caller that posts and then waits elsewhere (on its own control channel) must not find
    /// its frame still queued here.
    fn push(&self, st: &mut State) {
        // Sending can complete operations (on_sent), which can queue frames: a few rounds.
        for _ in 0..4 {
            let mut any = false;
            while let Some(t) = st.engine.poll_transmit() {
                st.net.send(t);
                any = true;
            }
            if !any {
                break;
            }
            let State {
                engine, net, srcs, ..
            } = st;
            let mut glue = Glue {
                engine,
                core: &self.core,
                srcs,
            };
            net.flush(&mut glue);
        }
    }
}

impl ProgressSource for VerbsEndpoint {
    fn progress(&self) -> usize {
        let Ok(mut st) = self.st.try_lock() else {
            return 0;
        };
        let n = self.do_progress(&mut st);
        self.finish(st);
        n
    }

    fn idle_wait(&self, timeout: Duration) {
        // While answers are awaited, sleep, but not long.
        let timeout = if self.busy.load(Ordering::Acquire) {
            timeout.min(Duration::from_millis(1))
        } else {
            timeout
        };
        let Ok(mut st) = self.st.try_lock() else {
            return;
        };
        // Armed first, then polled once: a completion that lands after this poll raises the
        // channel's event, so the sleep below cannot miss it.
        st.net.arm();
        if self.do_progress(&mut st) > 0 {
            self.finish(st);
            return;
        }
        let fds = st.net.fds();
        self.finish(st);
        self.poll_fds(&fds, timeout);
    }

    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local to our eventfd.
        unsafe { libc::write(self.wake_fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

impl VerbsEndpoint {
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

impl EndpointOps for VerbsEndpoint {
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
        match name {
            FI_OPT_MIN_MULTI_RECV => {
                self.lock().engine.set_min_multi_recv(value);
                Ok(())
            }
            _ => Err(Error::NoSys(format!(
                "setopt: option {name} is not supported by verbs"
            ))),
        }
    }

    fn buffered(&self) -> xfabric_core::Buffered {
        self.lock().engine.buffered()
    }

    fn close(&self) {
        let mut st = self.lock();
        st.engine.close();
        while let Some(t) = st.engine.poll_transmit() {
            st.net.send(t);
        }
        // Answers peers wait for go out first, for a bounded time.
        st.net.shutdown(Instant::now() + Duration::from_secs(1));
        self.finish(st);
    }
}
