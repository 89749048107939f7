//! The RDM protocol engine: what makes a reliable-datagram endpoint out of a transport that
//! moves frames between peers. Written once, I/O-free, in the manner of quinn-proto: a
//! transport feeds it (`Engine::post_*`, a frame's control part arrived, its body arrived, a
//! frame was sent, a copy finished, a peer was lost) and drains it (frames to transmit, copies
//! to perform, completions, which it writes through `EpCore`). It owns no socket, ring, thread or clock.
//!
//! - [`wire`]: every frame as one enum, one encoder, one fuzzed decoder.
//! - [`transport`]: what a transport can copy one-sidedly ([`OneSided`]), and the copies the
//!   engine asks of it ([`CopyReq`]).
//! - [`engine`]: per-endpoint protocol state: matching (core's `RecvQueue`), the initiator's
//!   outstanding requests, acknowledgements for the completion levels, fences, RMA and
//!   atomics executed at the target after key checks ([`target`]), peer loss.
//!
//! The types below are the contract with a transport: what it sends ([`Transmit`]) and where
//! it puts what arrives ([`Sink`]).

pub mod done;
pub mod engine;
pub mod inline;
pub mod target;
#[cfg(test)]
mod tests;
pub mod transport;
pub mod wire;

pub use done::{report, report_unlocked, Done};
pub use engine::{Config, Engine};
pub use inline::Inline;
pub use transport::{Copied, CopyReq, Desc, Dir, Native, NativeKind, OneSided, Transport};

use crate::rxq::IovList;

/// A peer, as the transport numbers them (an index into its own table). The engine keeps
/// per-peer state by this number.
pub type PeerId = usize;

/// Bodies up to this many bytes that the engine copies (inject data) are kept inline.
pub const INLINE_BODY: usize = 64;

/// The bytes after a frame's control part.
#[derive(Debug, Default)]
pub enum Body {
    /// None.
    #[default]
    None,
    /// A few bytes the frame holds inline.
    Inline(Inline<INLINE_BODY>),
    /// Bytes the frame owns.
    Owned(Vec<u8>),
    /// Application memory (a send's buffer, the source of a write, a read's target range):
    /// the engine keeps it valid until the transport reports the frame sent (`Transmit::token`)
    /// or the peer lost.
    Iov(IovList),
}

impl Body {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Body::None => 0,
            Body::Inline(v) => v.len(),
            Body::Owned(v) => v.len(),
            Body::Iov(iov) => iov.total(),
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of `parts`, one after the other, that the frame holds: inline when small.
    pub fn concat(parts: &[&[u8]]) -> Body {
        let n: usize = parts.iter().map(|p| p.len()).sum();
        if n > INLINE_BODY {
            return Body::Owned(parts.concat());
        }
        let mut b = Inline::default();
        for p in parts {
            b.push(p);
        }
        Body::Inline(b)
    }

    /// Bytes it holds itself (not application memory).
    pub fn held(&self) -> Option<&[u8]> {
        match self {
            Body::None => Some(&[]),
            Body::Inline(b) => Some(b),
            Body::Owned(v) => Some(v),
            Body::Iov(_) => None,
        }
    }
}

impl Sink {
    /// Puts `body` (a frame's whole body, in hand) where this sink says: into the buffer (up
    /// to its length), into the memory (up to its length), or nowhere. `Wait` stays `Wait`.
    ///
    /// # Safety
    /// A `Sink::Iov` is the engine's answer to the frame, not yet handed back (`on_body`):
    /// its memory is writable.
    pub unsafe fn fill(self, body: &[u8]) -> Sink {
        match self {
            Sink::Buffer(mut v) => {
                let n = v.len().min(body.len());
                v[..n].copy_from_slice(&body[..n]);
                Sink::Buffer(v)
            }
            Sink::Iov(iov) => {
                // SAFETY: the caller's contract; `copy_in` writes no more than the iov holds.
                unsafe { iov.copy_in(0, body) };
                Sink::Iov(iov)
            }
            other => other,
        }
    }
}

/// One frame for the transport to send, in order with the others to the same peer.
#[derive(Debug)]
pub struct Transmit {
    /// To whom.
    pub peer: PeerId,
    /// The frame's prefix and control part (`wire::Frame::ctrl`).
    pub ctrl: wire::Ctrl,
    /// Its body.
    pub body: Body,
    /// When set, the transport calls `Engine::on_sent(peer, token)` once every byte of the
    /// frame is handed over (a stream's kernel buffer, a ring): the engine then releases the
    /// body's memory or completes the operation.
    pub token: Option<u64>,
}

/// Where an arriving frame's body goes: the engine's answer to its control part
/// (`Engine::on_ctrl`), handed back filled (`Engine::on_body`). A stream transport has at most
/// one body in flight per peer; a transport holding a whole frame calls `Engine::on_frame`,
/// which does both (and takes a message straight into a matched receive).
#[derive(Debug)]
pub enum Sink {
    /// Nowhere: the transport reads and drops the bytes.
    Discard,
    /// A buffer of exactly the body's length, handed back in `Engine::on_body`.
    Buffer(Vec<u8>),
    /// Straight into memory the engine keeps valid until `Engine::on_body` (a posted receive,
    /// registered memory): the first `iov.total()` bytes go there, the rest is dropped.
    Iov(IovList),
    /// Not now (flow control: the engine's buffer for unexpected messages is full): the
    /// transport keeps the frame, reads nothing more from this peer, and offers the same
    /// frame again (`on_ctrl`) on later progress calls until another answer comes.
    Wait,
}
