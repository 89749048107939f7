//! The verbs endpoint: core's RDM engine over `net`'s RC connections, through the glue every
//! provider on the engine shares (crate::rdm). What is verbs' here: the device the
//! endpoint listens on, and how the connections take frames (queued, then posted as credits
//! and buffers allow) and are waited on (the CQ armed, its completion channel, the side
//! channels).

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Instant;

use xfabric_core::rdm::{self, Engine, PeerId};
use xfabric_core::{EpCore, Result};

use super::ib::Nic;
use super::mr::Registry;
use super::net::native::{Shared, VerbsOneSided};
use super::net::Net;
use crate::inet;
use crate::rdm::{self as glue, FdBell, Glue, RdmEndpoint, Wire};

/// A verbs endpoint.
pub type VerbsEndpoint = RdmEndpoint<Net>;

/// Listens on `bind` (device `nic`'s address; port 0: any); the endpoint's name is a
/// sockaddr, or with `str_name` the `FI_ADDR_STR` form. `reg`: the domain's NIC
/// registrations, which one-sided operations use in place.
pub fn open(
    core: Arc<EpCore>,
    nic: &Arc<Nic>,
    reg: &Arc<Registry>,
    bind: SocketAddr,
    str_name: bool,
) -> Result<Arc<VerbsEndpoint>> {
    let shared = Shared::new(reg.clone());
    let net = Net::bind(nic, bind, core.clone(), shared.clone())?;
    let name = inet::name(&net.local_addr(), str_name);
    let cfg = glue::engine_config(&core);
    let one_sided = Box::new(VerbsOneSided::new(shared, nic));
    RdmEndpoint::open(core, net, name, cfg, Some(one_sided))
}

impl Wire for Net {
    const PROVIDER: &'static str = "verbs";
    type Bell = FdBell;

    fn bell(&self) -> Result<FdBell> {
        // verbs takes no descriptor out of its set.
        FdBell::new(Self::PROVIDER, Default::default())
    }

    fn peer(&mut self, raw: &[u8]) -> Result<PeerId> {
        Ok(Net::peer(self, inet::decode(raw)?))
    }

    fn queued(&self, p: PeerId) -> usize {
        Net::queued(self, p)
    }

    fn progress(&mut self, g: &mut Glue<'_>) -> usize {
        Net::progress(self, g)
    }

    /// Queues the engine's frames and posts what credits and buffers allow, now.
    fn push(&mut self, g: &mut Glue<'_>) {
        // Sending can complete operations (on_sent), which can queue frames: a few rounds.
        for _ in 0..4 {
            let mut any = false;
            self.report_copies(g);
            // Copies of a peer's memory (a large message it offered, an RMA it lets us
            // serve), queued in order with the rest to that peer.
            while let Some(c) = g.engine.poll_copy() {
                self.copy(c);
                any = true;
            }
            // One-sided operations first: the engine hands one over only when nothing
            // framed to its peer is queued (see core's rdm::engine::native).
            while let Some(n) = g.engine.poll_native() {
                self.native(n);
                any = true;
            }
            if g.engine.transmit(self) > 0 {
                any = true;
            }
            if !any {
                break;
            }
            self.flush(g);
        }
    }

    fn publish(&self, engine: &Engine, bell: &FdBell) {
        bell.set(engine.busy() || Net::busy(self), false);
    }

    fn arm(&mut self) {
        Net::arm(self)
    }

    fn wait_fds(&self) -> Vec<(RawFd, i16)> {
        self.fds()
    }

    fn cut_region(&mut self, g: &mut Glue<'_>, addr: usize, len: usize, cut: &rdm::Cut) {
        Net::cut_region(self, g, addr, len, cut)
    }

    fn shutdown(&mut self, _: &mut Glue<'_>, deadline: Instant) {
        Net::shutdown(self, deadline)
    }
}
