//! The shm provider: RDM endpoints between processes on one host through shared memory. The
//! protocol is core's RDM engine (`xfabric_core::rdm`); this provider is its transport: the
//! segments (`segment`) and their rings (`ring`), cross-memory attach (`cma`), futex wake-ups
//! (`futex`; `fdwake` for a sleeper on a descriptor), and noticing dead peers (`net`); `ep`
//! puts `net` under the endpoint every provider on the engine shares (crate::rdm), `addr` checks
//! addresses.

mod addr;
mod cma;
mod ep;
mod fdwake;
mod futex;
mod guard;
mod net;
#[doc(hidden)]
pub mod raw;
mod ring;
pub mod segment;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use xfabric_core::av::AddrFormat;
use xfabric_core::consts::*;
use xfabric_core::info::*;
use xfabric_core::{DomainOps, EndpointOps, EpCore, Provider, Result};

use crate::domain::{Domain, ProviderDomain};
use crate::info::{check_hmem, rdm_info, RdmDesc};

pub use addr::ADDR_PREFIX;
pub use fdwake::wakes as fd_wakes;
pub use futex::wakes as futex_wakes;
pub use net::{armed_counts, ArmedCounts};

use addr::ShmAddr;

/// Largest inject (copied out of the caller's buffer during the call).
pub const INJECT_SIZE: usize = 4096;

/// Capabilities the shm provider offers: what the engine gives any transport.
pub const SHM_CAPS: u64 = crate::info::RDM_CAPS;

/// The shm provider.
#[derive(Debug, Default)]
pub struct Shm;

impl Provider for Shm {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn version(&self) -> u32 {
        fi_version(1, 0)
    }

    fn getinfo(
        &self,
        node: Option<&str>,
        service: Option<&str>,
        flags: u64,
        hints: &Info,
    ) -> Result<Vec<Info>> {
        check_hmem("shm", hints)?;
        let mut out = Info::fit_each("shm", self.info(), hints)?;
        // An endpoint's name is made when it opens (a fresh segment): what getinfo reports is
        // this process's, for the caller to see which side is which. A node (and service)
        // names a peer, or with FI_SOURCE this side, as written; an endpoint never binds to it.
        let named = match (node, service) {
            (None, None) => None,
            (n, s) => Some([n, s].into_iter().flatten().collect::<Vec<_>>().join(":")),
        };
        let own = format!("{ADDR_PREFIX}{}{}", segment::PREFIX, std::process::id());
        let c_string = |s: String| {
            let mut b = s.into_bytes();
            b.push(0);
            b
        };
        for f in &mut out {
            if flags & FI_SOURCE != 0 {
                if let Some(n) = &named {
                    f.src_addr = Some(c_string(format!("{ADDR_PREFIX}{n}")));
                }
            } else if f.dest_addr.is_none() {
                f.dest_addr = named
                    .as_ref()
                    .map(|n| c_string(format!("{ADDR_PREFIX}{n}")));
            }
            if f.src_addr.is_none() {
                f.src_addr = Some(c_string(own.clone()));
            }
        }
        Ok(out)
    }

    fn info(&self) -> Vec<Info> {
        vec![rdm_info(&RdmDesc {
            name: "shm",
            caps: SHM_CAPS,
            addr_format: FI_ADDR_STR,
            protocol: FI_PROTO_SHM,
            inject_size: INJECT_SIZE,
        })]
    }

    fn domain(&self, _info: &Info) -> Result<Arc<dyn DomainOps>> {
        reclaim_now_and_then();
        Ok(Domain::ops(ShmDomain))
    }
}

/// Shortest time between two reclaim passes of one process.
const RECLAIM_EVERY: Duration = Duration::from_secs(1);

/// Unlinks segments of dead processes, at most once per `RECLAIM_EVERY`: a long-running
/// process opening endpoints now and then also cleans up after peers that died since it
/// started, without a directory scan on every open.
fn reclaim_now_and_then() {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if last.is_some_and(|t| t.elapsed() < RECLAIM_EVERY) {
        return;
    }
    *last = Some(Instant::now());
    drop(last);
    segment::reclaim_stale();
}

struct ShmDomain;

impl ProviderDomain for ShmDomain {
    const NAME: &'static str = "shm";
    const CAPS: u64 = SHM_CAPS;

    fn addr_format(&self) -> Arc<dyn AddrFormat> {
        Arc::new(ShmAddr)
    }

    fn open(&self, _info: &Info, core: Arc<EpCore>) -> Result<Arc<dyn EndpointOps>> {
        reclaim_now_and_then();
        Ok(ep::open(core)?)
    }
}
