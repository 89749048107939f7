//! The seam between the engine's endpoint and a transport: the one trait pair. A transport
//! (`Wire`: tcp's sockets, verbs' queue pairs) moves frames and calls back into the endpoint
//! (`Handler`, implemented by the endpoint's glue over core's engine) with what arrived, what
//! was sent and what was lost. Neither side knows the other's insides.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Instant;

use xfabric_core::rdm::wire::{Prefix, WireError};
use xfabric_core::rdm::{PeerId, Sink};

use super::endpoint::Glue;

/// The transport under the engine: what a provider implements.
pub trait Wire: Send + Sized + 'static {
    /// The provider's name, for messages.
    const PROVIDER: &'static str;
    /// The peer listening at `addr` (its address as the AV holds it, decoded).
    fn peer(&mut self, addr: SocketAddr) -> PeerId;
    /// Bytes queued for peer `p` and not yet handed to the hardware or the kernel.
    fn queued(&self, p: PeerId) -> usize;
    /// Takes in what arrived, through `h`; returns how many things happened.
    fn progress<H: Handler>(&mut self, h: &mut H) -> usize;
    /// Hands the engine's frames (`g.engine`) over, and what that completes or loses to `g`.
    fn push(&mut self, g: &mut Glue<'_>);
    /// Whether it holds work that needs no peer to advance (progress should not sleep long).
    fn busy(&self) -> bool {
        false
    }
    /// Whether bytes wait that no descriptor will announce (progress must come before any
    /// sleep).
    fn backlog(&self) -> bool {
        false
    }
    /// Before sleeping on `wait_fds`: ask for the events that will end the sleep.
    fn arm(&mut self) {}
    /// The descriptors (and poll(2) events) whose readiness means progress has work.
    fn wait_fds(&self) -> Vec<(RawFd, i16)>;
    /// Writes out what peers wait for until `deadline`, then closes every connection.
    fn shutdown(&mut self, deadline: Instant);
}

/// What a transport calls back with (the endpoint's glue over the engine implements it).
pub trait Handler {
    /// A frame's prefix and control part (exactly `prefix.ctrl_len` bytes) arrived from
    /// `peer`. Answer where its `prefix.body_len` body bytes go; `Err`: the peer speaks
    /// garbage, its connection is dropped and `on_lost(peer, EPROTO)` follows.
    fn on_ctrl(
        &mut self,
        peer: PeerId,
        addr: SocketAddr,
        prefix: &Prefix,
        ctrl: &[u8],
    ) -> Result<Sink, WireError>;
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
        addr: SocketAddr,
        prefix: &Prefix,
        ctrl: &[u8],
        body: &[u8],
    ) -> Result<bool, WireError> {
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
    fn on_lost(&mut self, peer: PeerId, addr: Option<SocketAddr>, errno: i32);
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
