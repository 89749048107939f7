//! A registered region closing while peers' requests hold its memory: everything the engine
//! keeps of that memory is let go before the close returns (`Engine::cut_region`), so that
//! nothing of the region is written or read once the application may free it.

use super::rma_copy::SERVE;
use super::*;
use crate::rdm::transport::Copied;

/// What a closing region leaves to the transport (`Engine::cut_region`).
#[derive(Debug, Default)]
pub struct Cut {
    /// Peers whose body now arriving was going into the region: the transport drops the rest
    /// of it (its sink becomes `Sink::Discard`) and hands the sink back as usual.
    pub sinks: Vec<PeerId>,
}

impl Engine {
    /// The region `addr..addr + len` closes (called under the endpoint's lock by the region's
    /// removal from the domain, before the close returns): from now on nothing this endpoint
    /// does may touch it.
    ///
    /// - A peer's write whose body is arriving into it fails with `FI_EACCES` (answered so,
    ///   no completion at the target); the transport drops the rest of the body
    ///   (`Cut::sinks`). A write staged through a bounce buffer (device memory) is not landed.
    /// - Copies into or out of it that serve a peer's RMA and that the transport has not
    ///   taken fail the same way.
    /// - Frames whose body is in it (the answer to a peer's read, queued behind others) get a
    ///   copy of those bytes, taken now, while the memory is still the region's: the read
    ///   came before the close.
    ///
    /// The transport does the same with what it holds (`transport::keep_body`).
    pub fn cut_region(&mut self, addr: usize, len: usize) -> Cut {
        let mut cut = Cut::default();
        for (p, ps) in self.peers.iter_mut().enumerate() {
            if let Some(Pending::Write(w)) = &mut ps.pending {
                if w.dest.overlaps(addr, len) {
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
            for t in &mut ps.blocked {
                super::super::transport::keep_body(t, addr, len);
            }
        }
        for t in &mut self.out {
            super::super::transport::keep_body(t, addr, len);
        }
        let serving = |c: &super::super::transport::CopyReq| {
            split(c.token).0 & SERVE as usize != 0 && c.local.overlaps(addr, len)
        };
        let failed: Vec<u64> = self
            .copies
            .iter()
            .filter(|c| serving(c))
            .map(|c| c.token)
            .collect();
        self.copies.retain(|c| !serving(c));
        for token in failed {
            self.on_copied(token, Copied::Failed(FI_EACCES));
        }
        cut
    }
}
