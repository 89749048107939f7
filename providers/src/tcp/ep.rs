//! The tcp endpoint: core's RDM engine over `net`'s connections, through the glue every
//! provider on the engine shares (crate::rdm). What is tcp's here: the listening socket
//! the endpoint is named after, the connections' liveness setting, and how the socket layer
//! takes frames and is waited on.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use xfabric_core::rdm::{self, Engine, PeerId};
use xfabric_core::settings;
use xfabric_core::{EpCore, Error, Result};

use super::net::Net;
use crate::inet;
use crate::rdm::{self as glue, FdBell, Glue, RdmEndpoint, Wire};

/// A tcp endpoint.
pub type TcpEndpoint = RdmEndpoint<Net>;

/// Listens on `bind` (port 0: any); the endpoint's name is a sockaddr, or with `str_name` the
/// `FI_ADDR_STR` form. Peers must prove they hold `auth_key`, when there is one.
pub fn open(
    core: Arc<EpCore>,
    bind: SocketAddr,
    str_name: bool,
    auth_key: Option<Vec<u8>>,
) -> Result<Arc<TcpEndpoint>> {
    let mut net = Net::bind(bind)
        .map_err(|e| Error::from_io(format!("tcp endpoint: listen on {bind}"), e))?;
    net.set_auth_key(auth_key);
    net.set_dead_after(match settings::TCP_DEAD_MS.usize() {
        0 => None,
        ms => Some(Duration::from_millis(ms as u64)),
    });
    net.set_stall_after(match settings::TCP_STALL_MS.usize() {
        0 => None,
        ms => Some(Duration::from_millis(ms as u64)),
    });
    let name = inet::name(&net.local_addr(), str_name);
    let cfg = glue::engine_config(&core);
    RdmEndpoint::open(core, net, name, cfg, None)
}

impl Wire for Net {
    const PROVIDER: &'static str = "tcp";
    type Bell = FdBell;

    fn bell(&self) -> Result<FdBell> {
        FdBell::new(Self::PROVIDER, self.gate())
    }

    fn peer(&mut self, raw: &[u8]) -> Result<PeerId> {
        Ok(Net::peer(self, inet::decode(raw)?))
    }

    fn queued(&self, p: PeerId) -> usize {
        Net::queued(self, p)
    }

    #[inline(always)]
    fn progress(&mut self, g: &mut Glue<'_>) -> usize {
        Net::progress(self, g)
    }

    #[inline(always)]
    fn push(&mut self, g: &mut Glue<'_>) {
        // After every locked call, mostly with nothing to give (`has_output`: what
        // `transmit` would hand over).
        if g.engine.has_output() {
            g.engine.transmit(self);
        }
    }

    #[inline(always)]
    fn publish(&self, engine: &Engine, bell: &FdBell) {
        bell.set(engine.busy() || Net::busy(self), Net::backlog(self));
    }

    fn arm(&mut self) {
        Net::arm(self)
    }

    fn fds_exported(&mut self) {
        Net::keep_in_epoll(self)
    }

    fn wait_fds(&self) -> Vec<(RawFd, i16)> {
        // mio's epoll fd: readable when a connection or the listener has an event.
        vec![(self.wait_fd(), libc::POLLIN)]
    }

    fn cut_region(&mut self, g: &mut Glue<'_>, addr: usize, len: usize, cut: &rdm::Cut) {
        Net::cut_region(self, g, addr, len, cut)
    }

    fn shutdown(&mut self, _: &mut Glue<'_>, deadline: Instant) {
        Net::shutdown(self, deadline)
    }
}
