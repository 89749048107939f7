//! A registered region closing while peers' requests hold its memory: everything the engine
//! keeps of that memory is let go before the close returns (`Engine::cut_region`), so that
//! nothing of the region is written or read once the application may free it.

use super::*;
use crate::rdm::transport::{cut_frame, Copied};

/// What a closing region leaves to the transport (`Engine::cut_region`).
#[derive(Debug, Default)]
pub struct Cut {
    /// Peers whose body now arriving was going into the region: the transport drops the rest
    /// of it (its sink becomes `Sink::Discard`) and hands the sink back as usual.
    pub sinks: Vec<PeerId>,
    /// Copies serving a peer's RMA into or out of it that the transport was handed: it does
    /// not start them (or what is left of them), and reports them failed when what it
    /// started of them ends (`Copied::Failed(FI_EACCES)`).
    pub copies: Vec<u64>,
}

impl Engine {
    /// The region with key `key`, `addr..addr + len`, closes (called under the endpoint's
    /// lock by the region's removal from the domain, before the close returns): from now on
    /// nothing this endpoint does may touch it.
    ///
    /// - A peer's write into it (its body arriving, or copied by the transport) fails with
    ///   `FI_EACCES` (answered so, no completion at the target): the transport drops the rest
    ///   of a body (`Cut::sinks`), a copy not yet handed to the transport is not, one under
    ///   way ends failed however it ends, and a write staged for device memory is not landed.
    /// - A peer's read of it the same: the answers queued here that carry its memory become
    ///   failures (`FI_EACCES`, no body), as does a copy serving it.
    ///
    /// A write through another key of the same memory goes on; a read of the memory fails
    /// whichever key it came through (its answer names memory, not a key). The transport does
    /// the same with the answers it holds (`transport::cut_frame`).
    pub fn cut_region(&mut self, key: u64, addr: usize, len: usize) -> Cut {
        let mut cut = Cut::default();
        for p in 0..self.peers.len() {
            let ps = &mut self.peers[p];
            // Ranges written into it are no longer for a commit to flush (the memory may be
            // unmapped, or another region's, by then).
            let end = addr.saturating_add(len);
            ps.dirty
                .retain(|&(a, l)| a.saturating_add(l) <= addr || a >= end);
            if let Some(Pending::Write(w)) = &mut ps.pending {
                if w.segs.segs().iter().any(|s| s.key == key) {
                    if w.status == 0 {
                        w.status = FI_EACCES;
                    }
                    // A staged body arrives into the engine's bounce buffer, kept until
                    // `on_body`, and is not landed (`write_landed`).
                    if w.staged.is_none() {
                        cut.sinks.push(p);
                    }
                }
            }
            let ended = self
                .frames_to(p)
                .filter_map(|t| cut_frame(t, false, addr, len))
                .count();
            let ps = &mut self.peers[p];
            ps.answers_taken(ended);
        }
        // Copies serving them: those not yet handed to the transport fail now; the
        // transport stops those it holds (`Cut::copies`), and any that still reports ends
        // failed.
        let tokens = self.cut_served(key, addr, len);
        let mine: Vec<u64> = self
            .copies
            .iter()
            .filter(|c| tokens.contains(&c.token))
            .map(|c| c.token)
            .collect();
        self.copies.retain(|c| !mine.contains(&c.token));
        for &t in &mine {
            self.on_copied(t, Copied::Failed(FI_EACCES));
        }
        cut.copies = tokens.into_iter().filter(|t| !mine.contains(t)).collect();
        cut
    }
}
