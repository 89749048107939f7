//! The tcp provider: RDM endpoints over TCP (IPv4 and IPv6), for peers on other hosts as well
//! as this one. The protocol is core's engine (`xfabric_core::rdm`); this provider is the
//! transport under it: a listening socket per endpoint, connections made on first use
//! (`net`), and the glue that feeds frames between the two (`ep`).

mod ep;
pub mod net;

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use xfabric_core::consts::*;
use xfabric_core::info::*;
use xfabric_core::{DomainOps, EndpointOps, EpCore, Error, Provider, Result};

use crate::domain::{Domain, ProviderDomain};
use crate::inet;
use crate::info::{check_hmem, rdm_info, RdmDesc};

pub use ep::TcpEndpoint;

/// Capabilities the tcp provider offers: the engine's, to peers on other hosts too.
pub const TCP_CAPS: u64 = crate::info::RDM_CAPS | FI_REMOTE_COMM;

/// The `auth_key_size` getinfo reports: tcp takes keys of any length, and HMAC-SHA-256's
/// own (32 random bytes) is the one to use.
pub const AUTH_KEY_SIZE: usize = 32;

/// Largest inject (copied during the call).
pub const INJECT_SIZE: usize = 4096;

/// The tcp provider.
#[derive(Debug, Default)]
pub struct Tcp;

fn family_format(a: &SocketAddr) -> u32 {
    match a {
        SocketAddr::V4(_) => FI_SOCKADDR_IN,
        SocketAddr::V6(_) => FI_SOCKADDR_IN6,
    }
}

/// The source an answer names when nothing else does: what an endpoint opened from it binds
/// to (port 0, any). For an IPv6 peer other than the loopback, the address the kernel sends
/// from toward it (an endpoint connects from its name's address, and a name must be
/// reachable: the loopback, which the endpoint used to be bound to, was neither), or none
/// where there is no route.
fn default_src(dest: Option<SocketAddr>, v6: bool) -> Option<SocketAddr> {
    match dest {
        Some(d @ SocketAddr::V6(v)) if !v.ip().is_loopback() => {
            inet::route_src(d).map(|ip| SocketAddr::new(ip, 0))
        }
        Some(SocketAddr::V6(_)) => Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 0)),
        _ if v6 => Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 0)),
        _ => Some(SocketAddr::new(inet::default_ip(), 0)),
    }
}

impl Provider for Tcp {
    fn name(&self) -> &'static str {
        "tcp"
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
        check_hmem("tcp", hints)?;
        let v6 = hints.addr_format == FI_SOCKADDR_IN6;
        // Without a node, the loopback of the family asked for, or our default address; a
        // named host may answer in either family.
        let dflt = if v6 {
            IpAddr::V6(Ipv6Addr::LOCALHOST)
        } else {
            inet::default_ip()
        };
        let fits = |a: &SocketAddr| a.is_ipv6() == v6 || node.is_some();
        let named = inet::resolve("tcp", node, service, dflt, ("usable", &fits))?;
        let (src, dest) = if flags & FI_SOURCE != 0 {
            (named, None)
        } else {
            (None, named)
        };
        let dest = match dest {
            Some(d) => Some(d),
            None => inet::hinted_dest(hints.dest_addr.as_deref(), "tcp")?,
        };
        let hinted = inet::hinted_src(hints.src_addr.as_deref(), "tcp")?;
        let src = src.or(hinted).or_else(|| default_src(dest, v6));
        let want = hints.addr_format;
        let format = if want == FI_ADDR_STR {
            FI_ADDR_STR
        } else if let Some(a) = src.or(dest) {
            family_format(&a)
        } else if want == FI_SOCKADDR_IN6 {
            FI_SOCKADDR_IN6
        } else {
            FI_SOCKADDR_IN
        };
        if !addr_format_fits(want, format) {
            return Err(Error::NoData(format!(
                "provider tcp: address format {want} does not fit {node:?}"
            )));
        }
        // The addresses are dealt with here: fit would copy the hints' raw ones.
        let mut h = hints.clone();
        h.src_addr = None;
        h.dest_addr = None;
        h.addr_format = FI_FORMAT_UNSPEC;
        let mut out = Info::fit_each("tcp", self.info(), &h)?;
        for f in &mut out {
            // The key the caller will open the domain and endpoints with (fi_domain(3)).
            f.domain_attr
                .auth_key
                .clone_from(&hints.domain_attr.auth_key);
            f.ep_attr.auth_key.clone_from(&hints.ep_attr.auth_key);
            f.addr_format = format;
            f.src_addr = src.map(|a| inet::name(&a, format == FI_ADDR_STR));
            f.dest_addr = dest.map(|a| inet::name(&a, format == FI_ADDR_STR));
        }
        Ok(out)
    }

    fn info(&self) -> Vec<Info> {
        // One ordered stream per peer and a target that handles frames in arrival order: the
        // same guarantees as shm (providers/src/info.rs).
        let mut i = rdm_info(&RdmDesc {
            name: "tcp",
            caps: TCP_CAPS,
            addr_format: FI_SOCKADDR_IN,
            protocol: FI_PROTO_SOCK_TCP,
            inject_size: INJECT_SIZE,
        });
        // Keys are taken (tcp's handshake proves them: docs/security.md), of any length: `fit`
        // answers callers that give one, and the answers say so.
        i.domain_attr.auth_key_size = AUTH_KEY_SIZE;
        vec![i]
    }

    fn domain(&self, _info: &Info) -> Result<Arc<dyn DomainOps>> {
        Ok(Domain::ops(TcpDomain))
    }
}

struct TcpDomain;

/// The key peers must prove they hold: the endpoint's, else the domain's (fi_domain(3)'s
/// `auth_key`), else `XFABRIC_AUTH_KEY`'s bytes; none when all are empty.
fn auth_key(info: &Info) -> Option<Vec<u8>> {
    [&info.ep_attr.auth_key, &info.domain_attr.auth_key]
        .into_iter()
        .flatten()
        .find(|k| !k.is_empty())
        .cloned()
        .or_else(|| {
            xfabric_core::settings::AUTH_KEY
                .text()
                .filter(|k| !k.is_empty())
                .map(|k| k.as_bytes().to_vec())
        })
}

impl ProviderDomain for TcpDomain {
    const NAME: &'static str = "tcp";
    const CAPS: u64 = TCP_CAPS;

    fn addr_format(&self) -> Arc<dyn xfabric_core::AddrFormat> {
        Arc::new(inet::SockAddr)
    }

    fn open(&self, info: &Info, core: Arc<EpCore>) -> Result<Arc<dyn EndpointOps>> {
        let bind = match info.src_addr.as_deref() {
            Some(a) => inet::decode(a)?,
            None if info.addr_format == FI_SOCKADDR_IN6 => "[::1]:0".parse().expect("literal"),
            None => SocketAddr::new(inet::default_ip(), 0),
        };
        Ok(ep::open(
            core,
            bind,
            info.addr_format == FI_ADDR_STR,
            auth_key(info),
        )?)
    }
}
