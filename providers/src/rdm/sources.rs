//! Peers' source addresses: the `fi_addr_t` the bound AV holds for a peer, which completions
//! carry with `FI_SOURCE`, looked up once per AV generation (an insert or a removal changes
//! the answers). A peer the AV does not hold is named to the engine by its raw address, for
//! `FI_SOURCE_ERR`. One cache for every provider on the engine.

use xfabric_core::consts::{FI_ADDR_NOTAVAIL, FI_DIRECTED_RECV, FI_SOURCE};
use xfabric_core::rdm::{Engine, PeerId};
use xfabric_core::{EpCore, FiAddr};

/// The cache: per peer, the AV generation its entry was looked up in, and the answer.
#[derive(Default)]
pub struct Sources {
    by_peer: Vec<(u64, FiAddr)>,
    /// The raw addresses of peers the AV did not hold when last asked: looked up again
    /// (`refresh`) once the AV changes, for the messages of theirs still buffered.
    unknown: std::collections::HashMap<PeerId, Vec<u8>>,
    /// The AV generation `refresh` last ran in.
    refreshed: u64,
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
            // Looked up again once the AV changes, where a source is used (`refresh`).
            if core.caps & (FI_SOURCE | FI_DIRECTED_RECV) != 0 {
                self.unknown.insert(p, raw.clone());
            }
            eng.name_peer(p, raw);
        } else {
            self.unknown.remove(&p);
        }
        e.1
    }

    /// Before a receive is posted: where the AV changed since the last look, the messages
    /// buffered from peers it did not hold when they came take the source it holds for
    /// them now, so that a receive directed at a sender inserted since takes them, and a
    /// wildcard one reports the sender it now knows (libfabric matches a buffered message
    /// by its sender, not by what the AV said on its arrival).
    pub fn refresh(&mut self, eng: &mut Engine, core: &EpCore) {
        if self.unknown.is_empty() {
            return;
        }
        let Some(av) = core.bound().and_then(|b| b.av.as_ref()) else {
            return;
        };
        let gen = av.generation();
        if gen == self.refreshed {
            return;
        }
        self.refreshed = gen;
        let mut now = std::collections::HashMap::new();
        self.unknown.retain(|&p, raw| match av.reverse(raw) {
            Some(a) => {
                now.insert(p, a);
                false
            }
            None => true,
        });
        if now.is_empty() {
            return;
        }
        for (&p, &a) in &now {
            if let Some(e) = self.by_peer.get_mut(p) {
                *e = (gen, a);
            }
        }
        eng.resolve_sources(|p| now.get(&p).copied());
    }
}
