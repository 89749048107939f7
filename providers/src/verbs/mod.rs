//! The verbs provider: RDM endpoints over RDMA RC queue pairs (InfiniBand, RoCE, iWARP NICs;
//! tested on Soft-RoCE). The protocol is core's engine, as for tcp; this provider is the
//! transport: RC connections set up through a TCP side channel and carrying the engine's
//! frames in registered chunks (`net`), and the glue (`ep`).
//!
//! libibverbs is opened at run time (`sys`): a machine without rdma-core builds and runs the
//! rest, and getinfo says why verbs is absent ("libibverbs.so.1 not found", "no RDMA device").
//!
//! Addresses are those of tcp (`FI_SOCKADDR_IN` or `FI_ADDR_STR`): the device's IPv4 address
//! (its RoCE v2 GID) and the side channel's port.

mod ep;
mod ib;
mod mr;
mod net;
#[doc(hidden)]
pub mod raw;
mod stats;
mod sys;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use xfabric_core::consts::*;
use xfabric_core::info::*;
use xfabric_core::{DomainOps, EndpointOps, EpCore, Error, MrAttr, Provider, ProviderMr, Result};

use crate::domain::{Domain, ProviderDomain};
use crate::inet;
use crate::info::{check_hmem, rdm_info, RdmDesc};

pub use ep::VerbsEndpoint;
/// The side channel's hello and the proof of the name it claims, public as tcp's handshake
/// is: the tests speak it as an attacker who read the source would.
pub use ib::QpInfo;
pub use net::claim;
pub use stats::{fault_queue_pairs, native_counts, DeviceMemory, NativeCounts};

/// Capabilities the verbs provider offers (the engine's, as tcp).
pub const VERBS_CAPS: u64 = crate::info::RDM_CAPS | FI_REMOTE_COMM;

/// Largest inject (copied during the call).
pub const INJECT_SIZE: usize = 4096;

/// The verbs provider.
#[derive(Debug, Default)]
pub struct Verbs;

/// The device-memory registrations so far.
pub fn device_memory() -> DeviceMemory {
    mr::DEVICE_MEMORY
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// Why verbs cannot be used here, or `None` when a device is open.
pub fn unavailable() -> Option<String> {
    ib::nic().err()
}

impl Provider for Verbs {
    fn name(&self) -> &'static str {
        "verbs"
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
        // Before probing devices (loading libibverbs): hints that name another provider.
        if !hints.allows_provider("verbs") {
            let p = hints.fabric_attr.prov_name.as_deref().unwrap_or_default();
            return Err(Error::NoData(format!(
                "provider verbs: hints name provider {p:?}"
            )));
        }
        let nics = ib::nics().map_err(|why| Error::NoData(format!("provider verbs: {why}")))?;
        check_hmem("verbs", hints)?;
        let want = hints.addr_format;
        if ![FI_FORMAT_UNSPEC, FI_SOCKADDR, FI_SOCKADDR_IN, FI_ADDR_STR].contains(&want) {
            return Err(Error::NoData(format!(
                "provider verbs: address format {want} (IPv4 only: FI_SOCKADDR_IN, FI_ADDR_STR)"
            )));
        }
        let v4 = |a: &SocketAddr| a.is_ipv4();
        let named = inet::resolve(
            "verbs",
            node,
            service,
            IpAddr::V4(nics[0].ip),
            ("IPv4", &v4),
        )?;
        let (src, dest) = if flags & FI_SOURCE != 0 {
            (named, None)
        } else {
            (None, named)
        };
        let dest = match dest {
            Some(d) => Some(d),
            None => inet::hinted_dest(hints.dest_addr.as_deref(), "verbs")?,
        };
        let hinted = inet::hinted_src(hints.src_addr.as_deref(), "verbs")?;
        let src = src.or(hinted);
        let format = if want == FI_ADDR_STR {
            FI_ADDR_STR
        } else {
            FI_SOCKADDR_IN
        };
        let mut h = hints.clone();
        h.src_addr = None;
        h.dest_addr = None;
        h.addr_format = FI_FORMAT_UNSPEC;
        // One answer per device (a domain is a device), or the one a source address names.
        let devices: Vec<_> = match src {
            Some(SocketAddr::V4(a)) => {
                vec![ib::nic_for(*a.ip())
                    .map_err(|why| Error::NoData(format!("provider verbs: {why}")))?]
            }
            Some(SocketAddr::V6(a)) => {
                return Err(Error::NoData(format!(
                    "provider verbs: {a} is IPv6 (RoCE v2 over IPv4 only)"
                )))
            }
            None => nics,
        };
        let wanted = h.domain_attr.name.take();
        let mut out = Vec::new();
        for nic in devices {
            if wanted.as_deref().is_some_and(|w| w != nic.name) {
                continue;
            }
            for mut f in Info::fit_each("verbs", self.info(), &h)? {
                f.addr_format = format;
                // Without a source named, the device's address (port 0: any), which is
                // what an endpoint opened from this answer binds to.
                let own = SocketAddr::new(IpAddr::V4(nic.ip), 0);
                f.src_addr = Some(inet::name(&src.unwrap_or(own), format == FI_ADDR_STR));
                f.dest_addr = dest.map(|a| inet::name(&a, format == FI_ADDR_STR));
                f.domain_attr.name = Some(nic.name.clone());
                out.push(f);
            }
        }
        if out.is_empty() {
            return Err(Error::NoData(format!(
                "provider verbs: no device named {:?}",
                wanted.unwrap_or_default()
            )));
        }
        Ok(out)
    }

    fn info(&self) -> Vec<Info> {
        // One RC connection per direction of a peer pair, in order, and a target that handles
        // frames in arrival order: the same guarantees as tcp.
        vec![rdm_info(&RdmDesc {
            name: "verbs",
            caps: VERBS_CAPS,
            addr_format: FI_SOCKADDR_IN,
            protocol: FI_PROTO_UNSPEC,
            inject_size: INJECT_SIZE,
        })]
    }

    fn domain(&self, info: &Info) -> Result<Arc<dyn DomainOps>> {
        let nic = match info.domain_attr.name.as_deref() {
            Some(n) if n != "verbs" => ib::nic_named(n),
            _ => ib::nic(),
        }
        .and_then(|dev| ib::Nic::open(&dev))
        .map_err(|why| Error::NoData(format!("verbs domain: {why}")))?;
        Ok(Domain::ops(VerbsDomain {
            nic,
            reg: Arc::default(),
        }))
    }
}

struct VerbsDomain {
    nic: Arc<ib::Nic>,
    /// The NIC registrations of this domain's regions (`mr`).
    reg: Arc<mr::Registry>,
}

impl ProviderDomain for VerbsDomain {
    const NAME: &'static str = "verbs";
    const CAPS: u64 = VERBS_CAPS;
    const NIC_KEYS: bool = true;

    fn addr_format(&self) -> Arc<dyn xfabric_core::AddrFormat> {
        Arc::new(inet::SockAddr)
    }

    fn open(&self, info: &Info, core: Arc<EpCore>) -> Result<Arc<dyn EndpointOps>> {
        let bind = match info.src_addr.as_deref() {
            Some(a) => match inet::decode(a)? {
                SocketAddr::V4(v4) if *v4.ip() == self.nic.ip => SocketAddr::V4(v4),
                other => {
                    return Err(Error::Inval(format!(
                        "verbs endpoint: source address {other} is not device {}'s ({})",
                        self.nic.name, self.nic.ip
                    )))
                }
            },
            None => SocketAddr::new(IpAddr::V4(self.nic.ip), 0),
        };
        Ok(ep::open(
            core,
            &self.nic,
            &self.reg,
            bind,
            info.addr_format == FI_ADDR_STR,
        )?)
    }

    unsafe fn mr_register(&self, attr: &MrAttr, mr_mode: u32) -> Option<Box<dyn ProviderMr>> {
        // SAFETY: forwarded: the range stays valid while the region lives.
        let m = unsafe { mr::register(&self.nic, &self.reg, attr, mr_mode) }?;
        Some(Box::new(m))
    }
}
