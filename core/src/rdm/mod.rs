//! The RDM protocol engine: what makes a reliable-datagram endpoint out of a transport that
//! moves frames between peers. Written once, I/O-free, in the manner of quinn-proto: a
//! transport feeds it (`Engine::post_*`, a frame's control part arrived, its body arrived, a
//! frame was sent, a copy finished, a peer was lost) and drains it (frames to transmit, copies
//! to perform, completions, which it writes through `EpCore`). It owns no socket, ring, thread or clock.
//!
//! - [`wire`]: every frame as one enum, one encoder, one fuzzed decoder.
//! - [`transport`]: the contract with a transport: what it sends ([`Transmit`]), where it puts
//!   what arrives ([`Sink`]), what it can copy one-sidedly ([`OneSided`]), and the copies the
//!   engine asks of it ([`CopyReq`]).
//! - [`engine`]: per-endpoint protocol state: matching (core's `RecvQueue`), the initiator's
//!   outstanding requests, acknowledgements for the completion levels, fences, RMA and
//!   atomics executed at the target after key checks ([`target`]), peer loss.
//!
//! Each part is defined in its own file; this one only declares and re-exports them, so that
//! the parts, which use one another, never import it back.

mod desc;
pub mod done;
pub mod engine;
pub mod inline;
pub mod target;
#[cfg(test)]
mod tests;
pub mod transport;
pub mod wire;

pub use done::{report, report_unlocked, Done};
pub use engine::{
    answer_charge, kept_at_close, Config, Cut, Engine, Fired, WaitStamp, OWED_BYTES_MAX, OWED_MAX,
};
pub use inline::Inline;
pub use transport::{
    cut_frame, detach_frame, keep_body, Body, PeerId, Sink, Transmit, INLINE_BODY,
};
pub use transport::{Copied, CopyReq, Desc, Dir, Native, NativeKind, OneSided, Transport};
