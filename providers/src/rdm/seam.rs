//! The seam between the engine's endpoint and a transport: the one trait pair. A transport
//! (`Wire`: shm's rings, tcp's sockets, verbs' queue pairs) moves frames and calls back into
//! the endpoint (`Handler`, implemented by the endpoint's glue over core's engine) with what
//! arrived, what was sent and what was lost. Neither side knows the other's insides.
//!
//! Most of `Wire` is optional: what one transport needs and another does not has a default
//! that does nothing. shm's rings use them all: a frame written in place in a ring slot
//! (`send_in_place`), a room check before a post (`room`, `stuck`), and a `Bell` of its own,
//! a lock-free "has work" and a futex sleep; tcp and verbs sleep on descriptors (`FdBell`).

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use xfabric_core::ep::TxOp;
use xfabric_core::rdm::wire::{Prefix, WireError};
use xfabric_core::rdm::{self, Engine, PeerId, Sink};
use xfabric_core::{EpCore, FiAddr, Join, Result};

use super::sources::Sources;

/// Bytes one peer's queue may hold before posts to it answer `Again` (inject copies and
/// frames the engine made; application buffers are not copied but count here too): a peer
/// that stops reading holds back its senders instead of growing their memory. The default
/// `Wire::room`.
pub const QUEUE_MAX: usize = 64 << 20;

/// The transport under the engine: what a provider implements.
pub trait Wire: Send + Sized + 'static {
    /// The provider's name, for messages.
    const PROVIDER: &'static str;
    /// Whether a directed receive makes its source a known peer, so that the source's loss
    /// fails it (a transport that notices a peer's death without talking to it: shm).
    const WATCHES_SOURCES: bool = false;
    /// Whether this wire keeps armed sends' announcements (`prearm`).
    const PREARMS: bool = false;
    /// What the endpoint uses without its lock: a check for work and a way to sleep.
    type Bell: Bell;

    /// The bell of this transport's endpoint (made once, when it opens).
    fn bell(&self) -> Result<Self::Bell>;
    /// The peer whose address, as the AV holds it, is `raw`.
    fn peer(&mut self, raw: &[u8]) -> Result<PeerId>;
    /// Fails if `p` is known gone (`PeerLost`).
    fn alive(&self, p: PeerId) -> Result<()> {
        let _ = p;
        Ok(())
    }
    /// Makes `p` reachable before an operation goes to it (shm: a lane claimed in its
    /// segment); fails if it is gone.
    fn reach(&mut self, p: PeerId) -> Result<()> {
        self.alive(p)
    }
    /// Bytes queued for peer `p` and not yet handed to the hardware or the kernel.
    fn queued(&self, p: PeerId) -> usize {
        let _ = p;
        0
    }
    /// Whether a new request of `len` body bytes to `p` may be posted now (the engine's
    /// state included). The default: while `p`'s queue holds at most `QUEUE_MAX` bytes.
    fn room(&mut self, engine: &Engine, p: PeerId, len: usize) -> bool {
        let _ = (engine, len);
        self.queued(p) <= QUEUE_MAX
    }
    /// Still no `room` for `p` after progress: whether that is because `p` is gone (then
    /// lost through `g`, and `PeerLost`), rather than only slow (`Ok`: the post answers
    /// `Again`).
    fn stuck(&mut self, g: &mut Glue<'_>, p: PeerId) -> Result<()> {
        let _ = (g, p);
        Ok(())
    }
    /// Writes `op` to `p` whole in the transport's own memory now, if it can
    /// (`Engine::write_in_place`); `Ok(true)`: written and complete, its completion the
    /// caller's to report; `Ok(false)`: it goes the ordinary way.
    ///
    /// # Safety
    /// As `Engine::post_send`: `op`'s memory is valid as the caller of `fi_send` promised.
    unsafe fn send_in_place(&mut self, engine: &mut Engine, p: PeerId, op: &TxOp) -> Result<bool> {
        let _ = (engine, p, op);
        Ok(false)
    }
    /// Asked after a send written in place (`send_in_place`) and before the `push` that
    /// follows it: whether what the last `publish` showed is still current once that push
    /// is done, so that `publish` may be skipped. True only when the push has nothing to
    /// hand over and nothing the mirrors show changed in the call. The default: never.
    fn published_current(&self, engine: &Engine) -> bool {
        let _ = engine;
        false
    }
    /// Keeps `ctrl` (an encoded frame without a body: an armed send's announcement to `p`,
    /// `Engine::arm_send`) where `p` can take it when the send fires (`release`): its slot,
    /// or `None` where the wire cannot (the engine sends the frame when the send fires).
    fn prearm(&mut self, p: PeerId, ctrl: &[u8]) -> Option<u32> {
        let _ = (p, ctrl);
        None
    }
    /// The armed send `token` in `slot` fired: tells `p` to take its announcement, in order
    /// with what went to `p` before. `false` if it cannot now (the caller sends the frame
    /// instead and `unarm`s the slot). The wire may tell the engine of its answer its own
    /// way (`Engine::armed_acked`).
    fn release(&mut self, p: PeerId, slot: u32, token: u64) -> bool {
        let _ = (p, slot, token);
        false
    }
    /// Forgets the announcement in `slot`: never released (disarmed), or sent another way.
    fn unarm(&mut self, slot: u32) {
        let _ = slot;
    }
    /// Takes in what arrived, through `g`; returns how many things happened.
    fn progress(&mut self, g: &mut Glue<'_>) -> usize;
    /// Hands the engine's frames (`g.engine`) over, and what that completes or loses to `g`.
    fn push(&mut self, g: &mut Glue<'_>);
    /// At the end of each locked call: refreshes what `bell` reads without the lock.
    fn publish(&self, engine: &Engine, bell: &Self::Bell);
    /// Frames held back for ordering or flow control (`Buffered::held`).
    fn held(&self) -> usize {
        0
    }
    /// Before sleeping on `wait_fds`: ask for the events that will end the sleep.
    fn arm(&mut self) {}
    /// The descriptors (and poll(2) events) whose readiness means progress has work.
    fn wait_fds(&self) -> Vec<(RawFd, i16)> {
        Vec::new()
    }
    /// The wire's descriptors were handed to the application (fi_trywait, `FI_GETWAIT`):
    /// it may sleep on them at any time, unknown to the endpoint's bell.
    fn fds_exported(&mut self) {}
    /// A registered region `addr..addr + len` closes (`Engine::cut_region` ran, under the
    /// endpoint's lock, and said what the wire holds of it in `cut`): the body now arriving
    /// from each of `cut.sinks` was going into it, so the rest is read and dropped (its sink
    /// becomes `Sink::Discard`, handed back in `on_body` as usual); the answers to reads of it
    /// the wire holds fail or keep a copy (`rdm::cut_frame`, reporting a token it gives up
    /// through `g`); of the copies in `cut.copies`, the wire starts nothing more, and reports
    /// each failed (`FI_EACCES`) once what it started of it ended. The default holds none of
    /// these across calls.
    fn cut_region(&mut self, g: &mut Glue<'_>, addr: usize, len: usize, cut: &rdm::Cut) {
        let _ = (g, addr, len, cut);
    }
    /// The endpoint closes: writes out what peers wait for until `deadline` (the engine
    /// closed already), then lets every peer go.
    fn shutdown(&mut self, g: &mut Glue<'_>, deadline: Instant);
}

/// What an endpoint uses without its lock: whether a progress call may have work, waking a
/// sleeper, and sleeping. Made by the transport (`Wire::bell`), refreshed at the end of each
/// locked call (`Wire::publish`).
pub trait Bell: Send + Sync + 'static {
    /// Whether `has_work` looks (may answer false): then the progress calls that find
    /// nothing, most of a polling loop's, are kept short, and the work of one that finds
    /// some is done apart. The default: no (it answers true, and progress does its work
    /// inline).
    const LOOKS: bool = false;
    /// Whether a progress call may find something to do (false: it returns at once, without
    /// the lock). The default: always.
    fn has_work(&self) -> bool {
        true
    }
    /// A progress call began (the thread is awake).
    fn awake(&self) {}
    /// How long an idle wait of `timeout` may sleep now: `None`, not at all (work waits that
    /// nothing will announce).
    fn nap(&self, timeout: Duration) -> Option<Duration>;
    /// Taken before the last look for work: a `sleep` on it ends at once if work arrived
    /// since.
    fn ticket(&self) -> u64 {
        0
    }
    /// A thread may sleep after its next look for work: counted from before the wire is
    /// armed, and until `sleep` ends or `sleep_skipped` (a wire that takes descriptors out
    /// of the set slept on leaves them in meanwhile: `bell::Gate`).
    fn sleep_coming(&self) {}
    /// The look after `sleep_coming` found work: no sleep.
    fn sleep_skipped(&self) {}
    /// Sleeps at most `timeout`, until `wake`, or work (since `ticket`, or on the wire's
    /// descriptors `fds`); after `sleep_coming`.
    fn sleep(&self, ticket: u64, timeout: Duration, fds: &[(RawFd, i16)]);
    /// Ends a `sleep`, or a sleep joined.
    fn wake(&self);
    /// Joins a sleep shared with other endpoints' bells (one thread driving several), where
    /// `sleep` would begin (after `sleep_coming` and a last look that found nothing): adds
    /// what ends it, the wire's descriptors `fds` among them, to `out`. Not joined, the
    /// caller calls `sleep_skipped`; joined, `leave_sleep` once the sleep has ended. The
    /// default cannot: a bell whose sleep is a futex's has no descriptor to poll.
    fn join_sleep(
        &self,
        timeout: Duration,
        fds: &[(RawFd, i16)],
        out: &mut Vec<(RawFd, i16)>,
    ) -> Join {
        let _ = (timeout, fds, out);
        Join::Cannot
    }
    /// Ends a sleep joined (as `sleep` ends).
    fn leave_sleep(&self) {}
    /// Descriptors of the bell's own a sleeper on descriptors (fi_trywait) polls besides
    /// the wire's.
    fn wait_fds(&self, out: &mut Vec<(RawFd, i16)>) {
        let _ = out;
    }
    /// Before a sleep on descriptors: whatever arrives from now on makes one of them ready.
    fn arm_fds(&self) {}
    /// After a last progress that found nothing: whether a sleep on descriptors may begin.
    fn quiet(&self) -> bool {
        true
    }
}

/// An address as the AV holds it, made when the endpoint needs to name a peer (its source
/// address): tcp and verbs give a `SocketAddr`, shm a segment's name.
pub trait PeerName {
    /// The bytes the AV holds for it.
    fn raw(&self) -> Vec<u8>;
}

/// What a transport calls back with (the endpoint's glue over the engine implements it).
pub trait Handler {
    /// A frame's prefix and control part (exactly `prefix.ctrl_len` bytes) arrived from
    /// `peer`. Answer where its `prefix.body_len` body bytes go; `Err`: the peer speaks
    /// garbage, its connection is dropped and `on_lost(peer, EPROTO)` follows.
    fn on_ctrl(
        &mut self,
        peer: PeerId,
        addr: &dyn PeerName,
        prefix: &Prefix,
        ctrl: &[u8],
    ) -> std::result::Result<Sink, WireError>;
    /// The body arrived into the sink `on_ctrl` gave (`Sink::Buffer` filled to its length,
    /// or to the body's if shorter; `Sink::Iov`: its first `iov.total()` bytes written, any
    /// rest read and dropped; `Discard`: read and dropped). Called even for `body_len` 0.
    fn on_body(&mut self, peer: PeerId, sink: Sink);
    /// A whole frame arrived from `peer`: its prefix, exactly its control part, and its whole
    /// body, in hand. What `on_ctrl` and then `on_body` do, with the body put where `on_ctrl`
    /// answers; `Ok(false)`: `on_ctrl` answered `Sink::Wait`, nothing was taken, and the same
    /// frame is offered again later. The engine takes a message this way without the
    /// two-step exchange.
    fn on_frame(
        &mut self,
        peer: PeerId,
        addr: &dyn PeerName,
        prefix: &Prefix,
        ctrl: &[u8],
        body: &[u8],
    ) -> std::result::Result<bool, WireError> {
        let sink = self.on_ctrl(peer, addr, prefix, ctrl)?;
        if matches!(sink, Sink::Wait) {
            return Ok(false);
        }
        // SAFETY: the sink is `on_ctrl`'s answer, handed back just below.
        let sink = unsafe { sink.fill(body) };
        self.on_body(peer, sink);
        Ok(true)
    }
    /// Every byte of a `Transmit` that had a token was handed to the kernel.
    fn on_sent(&mut self, peer: PeerId, token: u64);
    /// The connection to `peer` failed (refused, reset, EOF, garbage, handshake failure):
    /// `errno`. Queued transmits to it are dropped, and a body being received is abandoned
    /// (its sink dropped). A later `send` to the same peer connects again.
    fn on_lost(&mut self, peer: PeerId, addr: Option<&dyn PeerName>, errno: i32);
    /// The NIC finished a one-sided operation the engine handed over (`Engine::poll_native`)
    /// with `status` (0 or an errno). Transports without a NIC never call it.
    fn on_native(&mut self, token: u64, status: i32) {
        let _ = (token, status);
    }
    /// A copy the engine asked for (`Engine::poll_copy`) ended. Transports without one-sided
    /// copies never call it.
    fn on_copied(&mut self, token: u64, how: xfabric_core::rdm::Copied) {
        let _ = (token, how);
    }
    /// A peer's NIC wrote `len` bytes into our memory and said so (remote CQ data, or none).
    fn on_native_write(&mut self, peer: PeerId, len: usize, data: Option<u64>) {
        let _ = (peer, len, data);
    }
}

/// The engine as the wire's handler, with what it needs to name a peer's source address.
pub struct Glue<'a> {
    /// The endpoint's engine.
    pub engine: &'a mut Engine,
    core: &'a EpCore,
    sources: &'a mut Sources,
}

impl<'a> Glue<'a> {
    /// The glue over `engine`, naming peers' sources in `core`'s AV through `sources`.
    pub fn new(engine: &'a mut Engine, core: &'a EpCore, sources: &'a mut Sources) -> Glue<'a> {
        Glue {
            engine,
            core,
            sources,
        }
    }

    #[inline]
    fn src(&mut self, peer: PeerId, addr: &dyn PeerName) -> FiAddr {
        self.sources.of(self.engine, self.core, peer, || addr.raw())
    }
}

impl Handler for Glue<'_> {
    fn on_ctrl(
        &mut self,
        peer: PeerId,
        addr: &dyn PeerName,
        prefix: &Prefix,
        ctrl: &[u8],
    ) -> std::result::Result<Sink, WireError> {
        let src = self.src(peer, addr);
        self.engine.on_ctrl(peer, src, prefix, ctrl)
    }

    fn on_body(&mut self, peer: PeerId, sink: Sink) {
        self.engine.on_body(peer, sink)
    }

    #[inline]
    fn on_frame(
        &mut self,
        peer: PeerId,
        addr: &dyn PeerName,
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

    fn on_lost(&mut self, peer: PeerId, addr: Option<&dyn PeerName>, errno: i32) {
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

/// The rule every transport's `rdm::Transport::send` keeps: a frame to a peer whose loss the
/// transport found but has not reported yet (`losing`) is given back, and the engine keeps it
/// and fails it with the rest when it hears, so that none leaves on a later connection after
/// its operation failed; any other frame goes to `queue`.
// The frame moves by value both ways, as `Transport::send`'s does.
#[allow(clippy::result_large_err)]
pub(crate) fn unless_losing(
    losing: bool,
    t: rdm::Transmit,
    queue: impl FnOnce(rdm::Transmit),
) -> std::result::Result<(), rdm::Transmit> {
    if losing {
        return Err(t);
    }
    queue(t);
    Ok(())
}

/// The rule every transport's `rdm::Transport::detach` keeps: when what is queued to the peer
/// (`queued` bytes), with the engine's `more`, stays within `QUEUE_MAX`, each of its `frames`
/// carrying `token` gets a copy of its body and loses the token; how many did. Past the bound
/// nothing changes (`None`: the write waiting behind them keeps waiting).
pub(crate) fn detach_queued<'a>(
    queued: usize,
    more: usize,
    frames: impl Iterator<Item = &'a mut rdm::Transmit>,
    token: u64,
) -> Option<usize> {
    if queued.saturating_add(more) > QUEUE_MAX {
        return None;
    }
    Some(
        frames
            .map(|t| rdm::detach_frame(t, token))
            .filter(|&d| d)
            .count(),
    )
}

/// A stream transport's queued frame `t` as a region `addr..addr + len` closes
/// (`Wire::cut_region`), `begun` if its first bytes went: cut (`rdm::cut_frame`), and
/// `queued`, the peer's bytes queued, less what it no longer carries. The token of an answer
/// that now ends, which the transport reports sent.
pub(crate) fn cut_queued(
    t: &mut rdm::Transmit,
    begun: bool,
    addr: usize,
    len: usize,
    queued: &mut usize,
) -> Option<u64> {
    let was = t.ctrl.len() + t.body.len();
    let token = rdm::cut_frame(t, begun, addr, len)?;
    *queued -= was - (t.ctrl.len() + t.body.len());
    Some(token)
}

/// A stream transport's body now arriving into `sink` (`got` of its bytes in, the first `keep`
/// kept) goes nowhere from here on (`Wire::cut_region`): the rest is read and skipped, and the
/// sink handed back as `Sink::Discard`.
pub(crate) fn drop_rest(sink: &mut rdm::Sink, got: u64, keep: &mut u64) {
    if matches!(sink, rdm::Sink::Iov(_)) {
        *sink = rdm::Sink::Discard;
        *keep = got;
    }
}
