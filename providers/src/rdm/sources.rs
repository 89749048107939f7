//! Peers' source addresses: the `fi_addr_t` the bound AV holds for a peer, which completions
//! carry with `FI_SOURCE`, looked up once per AV generation (an insert or a removal changes
//! the answers). A peer the AV does not hold is named to the engine by its raw address, for
//! `FI_SOURCE_ERR`. One cache for every provider on the engine.

use xfabric_core::consts::FI_ADDR_NOTAVAIL;
use xfabric_core::rdm::{Engine, PeerId};
use xfabric_core::{EpCore, FiAddr};

/// The cache: per peer, the AV generation its entry was looked up in, and the answer.
#[derive(Default)]
pub struct Sources {
    by_peer: Vec<(u64, FiAddr)>,
}

impl Sources {
    /// Peer `p`'s source address; `raw` gives its address as the AV stores it, called only
    /// when the cache is stale.
    #[inline(always)]
    pub fn of(
        &mut self,
        eng: &mut Engine,
        core: &EpCore,
        p: PeerId,
        raw: impl FnOnce() -> Vec<u8>,
    ) -> FiAddr {
        let av = core.bound().and_then(|b| b.av.as_ref());
        // Without an AV nothing is ever known: one lookup (and one naming) per peer.
        let gen = av.map_or(0, |av| av.generation());
        // Every message but a peer's first in a generation: the cached answer, inline.
        match self.by_peer.get(p) {
            Some(&(g, addr)) if g == gen => addr,
            // Out of line with the naming: what stays inline is the lookup alone, small
            // enough to be inlined into every frame handler (libfabric.so's too).
            _ => self.look_up(eng, core, p, gen, raw),
        }
    }

    /// `of` when the cache has no answer for `p` in generation `gen`: asks the AV.
    #[cold]
    #[inline(never)]
    fn look_up(
        &mut self,
        eng: &mut Engine,
        core: &EpCore,
        p: PeerId,
        gen: u64,
        raw: impl FnOnce() -> Vec<u8>,
    ) -> FiAddr {
        let raw = raw();
        let av = core.bound().and_then(|b| b.av.as_ref());
        if self.by_peer.len() <= p {
            self.by_peer.resize(p + 1, (u64::MAX, FI_ADDR_NOTAVAIL));
        }
        let e = &mut self.by_peer[p];
        e.1 = av
            .and_then(|av| av.reverse(&raw))
            .unwrap_or(FI_ADDR_NOTAVAIL);
        e.0 = gen;
        if e.1 == FI_ADDR_NOTAVAIL {
            eng.name_peer(p, raw);
        }
        e.1
    }
}
