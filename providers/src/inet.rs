//! Socket addresses, as tcp and verbs name endpoints: `struct sockaddr_in` / `sockaddr_in6`
//! bytes (`FI_SOCKADDR_IN` / `_IN6`, what
//! `fi_getname` returns and an AV stores), or the strings `fi_sockaddr_in://1.2.3.4:5` and
//! `fi_sockaddr_in6://[::1]:5` (`FI_ADDR_STR`). Everything from outside is parsed with checked
//! lengths; the AV stores the sockaddr form, so both spellings of one address are one entry.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, ToSocketAddrs};

use xfabric_core::av::AddrFormat;
use xfabric_core::{Error, Result};

/// Bytes of a `struct sockaddr_in`.
pub const SOCKADDR_IN_LEN: usize = 16;
/// Bytes of a `struct sockaddr_in6`.
pub const SOCKADDR_IN6_LEN: usize = 28;

/// A peer named by its socket address: the AV holds its `sockaddr_in(6)` bytes.
impl crate::rdm::PeerName for SocketAddr {
    fn raw(&self) -> Vec<u8> {
        encode(self)
    }
}

/// The `sockaddr_in(6)` bytes of `a`.
pub fn encode(a: &SocketAddr) -> Vec<u8> {
    match a {
        SocketAddr::V4(v4) => {
            let mut b = vec![0u8; SOCKADDR_IN_LEN];
            b[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            b[2..4].copy_from_slice(&v4.port().to_be_bytes());
            b[4..8].copy_from_slice(&v4.ip().octets());
            b
        }
        SocketAddr::V6(v6) => {
            let mut b = vec![0u8; SOCKADDR_IN6_LEN];
            b[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            b[2..4].copy_from_slice(&v6.port().to_be_bytes());
            b[4..8].copy_from_slice(&v6.flowinfo().to_be_bytes());
            b[8..24].copy_from_slice(&v6.ip().octets());
            b[24..28].copy_from_slice(&v6.scope_id().to_ne_bytes());
            b
        }
    }
}

/// The source address hints name (`src_addr`), if any: one that is no address is an answer of
/// none (`NoData`), not another address in its place. `prov` names the provider in the error.
pub fn hinted_src(src_addr: Option<&[u8]>, prov: &str) -> Result<Option<SocketAddr>> {
    hinted(src_addr, prov, "src_addr")
}

/// The hints' `dest_addr`, parsed: the peer an answer names where `node` names none (or names
/// this side, with `FI_SOURCE`), as libfabric's providers take it.
pub fn hinted_dest(dest_addr: Option<&[u8]>, prov: &str) -> Result<Option<SocketAddr>> {
    hinted(dest_addr, prov, "dest_addr")
}

fn hinted(raw: Option<&[u8]>, prov: &str, field: &str) -> Result<Option<SocketAddr>> {
    raw.map(decode)
        .transpose()
        .map_err(|e| Error::NoData(format!("{prov}: the hints' {field}: {e}")))
}

/// Parses sockaddr bytes or the `FI_ADDR_STR` form (a trailing NUL allowed).
pub fn decode(raw: &[u8]) -> Result<SocketAddr> {
    let bad = |why: &str| Error::Inval(format!("tcp address: {why}"));
    if let Some(s) = as_str(raw) {
        return parse_str(s)
            .ok_or_else(|| bad(&format!("{s:?} is not fi_sockaddr_in[6]://ip:port")));
    }
    let family = raw
        .get(0..2)
        .map(|f| u16::from_ne_bytes([f[0], f[1]]) as i32)
        .ok_or_else(|| bad("shorter than a sockaddr"))?;
    let port = |b: &[u8]| u16::from_be_bytes([b[2], b[3]]);
    // A sockaddr in a larger buffer (a `sockaddr_storage` and its size, as C callers often
    // pass hints) is read as its family says, the rest ignored, as libfabric sizes it.
    match (family, raw.len()) {
        (libc::AF_INET, n) if n >= SOCKADDR_IN_LEN => {
            let ip = Ipv4Addr::new(raw[4], raw[5], raw[6], raw[7]);
            Ok(SocketAddr::V4(SocketAddrV4::new(ip, port(raw))))
        }
        (libc::AF_INET6, n) if n >= SOCKADDR_IN6_LEN => {
            let mut o = [0u8; 16];
            o.copy_from_slice(&raw[8..24]);
            let flow = u32::from_be_bytes([raw[4], raw[5], raw[6], raw[7]]);
            let scope = u32::from_ne_bytes([raw[24], raw[25], raw[26], raw[27]]);
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(o),
                port(raw),
                flow,
                scope,
            )))
        }
        (f, n) => Err(bad(&format!(
            "family {f} with {n} bytes is neither sockaddr_in nor sockaddr_in6"
        ))),
    }
}

fn as_str(raw: &[u8]) -> Option<&str> {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    let s = std::str::from_utf8(&raw[..end]).ok()?;
    s.starts_with("fi_sockaddr_in").then_some(s)
}

fn parse_str(s: &str) -> Option<SocketAddr> {
    let rest = s
        .strip_prefix("fi_sockaddr_in6://")
        .or_else(|| s.strip_prefix("fi_sockaddr_in://"))?;
    rest.parse().ok()
}

/// The `FI_ADDR_STR` spelling of `a`.
pub fn to_str(a: &SocketAddr) -> String {
    match a {
        SocketAddr::V4(_) => format!("fi_sockaddr_in://{a}"),
        SocketAddr::V6(_) => format!("fi_sockaddr_in6://{a}"),
    }
}

/// An endpoint's name (what `fi_getname` returns) for the address it listens at: a
/// sockaddr, or with `str_name` the NUL-terminated `FI_ADDR_STR` form.
pub fn name(a: &SocketAddr, str_name: bool) -> Vec<u8> {
    if str_name {
        let mut s = to_str(a).into_bytes();
        s.push(0);
        s
    } else {
        encode(a)
    }
}

/// getinfo's `node`/`service` for provider `prov`: a host name or address (`default_host`
/// when absent) and a port number (0 when absent), resolved to the first address `usable`
/// accepts (`usable_what` names them in the error); `None` when both are absent.
pub fn resolve(
    prov: &str,
    node: Option<&str>,
    service: Option<&str>,
    default_host: IpAddr,
    usable: (&str, &dyn Fn(&SocketAddr) -> bool),
) -> Result<Option<SocketAddr>> {
    if node.is_none() && service.is_none() {
        return Ok(None);
    }
    let port: u16 = match service {
        None => 0,
        Some(s) => s
            .parse()
            .map_err(|_| Error::NoData(format!("provider {prov}: service {s:?} is not a port")))?,
    };
    let host = node.map_or_else(|| default_host.to_string(), str::to_string);
    let (what, ok) = usable;
    (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| Error::NoData(format!("provider {prov}: cannot resolve {host:?}: {e}")))?
        .find(|a| ok(a))
        .map(Some)
        .ok_or_else(|| Error::NoData(format!("provider {prov}: {host:?} has no {what} address")))
}

/// The address an endpoint binds to when nothing names one: the host's first configured
/// non-loopback IPv4 address (so peers on other hosts can reach it), else 127.0.0.1.
pub fn default_ip() -> IpAddr {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below; we only read it.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return IpAddr::V4(Ipv4Addr::LOCALHOST);
    }
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        let up = ifa.ifa_flags & libc::IFF_UP as u32 != 0;
        let lo = ifa.ifa_flags & libc::IFF_LOOPBACK as u32 != 0;
        if up && !lo && !ifa.ifa_addr.is_null() {
            // SAFETY: a non-null ifa_addr points to a sockaddr whose family says its type.
            let fam = unsafe { (*ifa.ifa_addr).sa_family } as i32;
            if fam == libc::AF_INET {
                // SAFETY: family AF_INET: the sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                found = Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
                break;
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    IpAddr::V4(found.unwrap_or(Ipv4Addr::LOCALHOST))
}

/// The address the kernel sends from toward `dest`, where it has a route there (a UDP socket
/// connected to `dest` sends nothing, and says which source it would use).
pub fn route_src(dest: SocketAddr) -> Option<IpAddr> {
    let any: SocketAddr = if dest.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let u = std::net::UdpSocket::bind(any).ok()?;
    u.connect(dest).ok()?;
    u.local_addr()
        .ok()
        .map(|a| a.ip())
        .filter(|ip| !ip.is_unspecified())
}

/// A non-blocking TCP connect to `to` from the address `from` (any port): the connection's
/// source is `from` whatever the route, so a peer can hold it to the address it names itself
/// by. The connect completes later (poll for writable, then `take_error`).
// std's and mio's connects bind no source address; socket2 would, for this one call.
pub fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<std::net::TcpStream> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let family = if to.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: socket(2) with constant arguments; the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just made, owned by nothing else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // The port is picked at the connect, per destination, as a plain connect's is: a bind
    // alone would take one of its own from half the ephemeral range, per address, whatever
    // the destination, and an endpoint with thousands of peers would run out. (Ignored by
    // kernels before 4.2, which pick at the bind.)
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads one c_int of the length given.
    let _ = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    let src = encode(&SocketAddr::new(from, 0));
    // SAFETY: `src` holds a sockaddr of its length (the kernel copies it; no alignment needed).
    if unsafe { libc::bind(fd, src.as_ptr().cast(), src.len() as libc::socklen_t) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let dst = encode(&to);
    // SAFETY: as above, for the destination.
    if unsafe { libc::connect(fd, dst.as_ptr().cast(), dst.len() as libc::socklen_t) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
    }
    Ok(std::net::TcpStream::from(sock))
}

/// The AV's view of tcp addresses.
pub struct SockAddr;

impl AddrFormat for SockAddr {
    fn validate(&self, addr: &[u8]) -> Result<()> {
        decode(addr).map(|_| ())
    }

    fn to_string(&self, addr: &[u8]) -> String {
        match decode(addr) {
            Ok(a) => to_str(&a),
            Err(_) => format!("(invalid tcp address of {} bytes)", addr.len()),
        }
    }

    fn canonical(&self, addr: &[u8]) -> Vec<u8> {
        decode(addr).map_or_else(|_| addr.to_vec(), |a| encode(&a))
    }

    fn sockaddr(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The source toward the loopback is the loopback, in either family where it has one.
    #[test]
    fn the_route_to_the_loopback_leaves_from_it() {
        assert_eq!(
            route_src("127.0.0.1:9".parse().unwrap()),
            Some("127.0.0.1".parse().unwrap())
        );
        if let Some(ip) = route_src("[::1]:9".parse().unwrap()) {
            assert_eq!(ip, "::1".parse::<IpAddr>().unwrap());
        }
    }

    /// A connection from a bound address picks its port at the connect, per destination
    /// (`IP_BIND_ADDRESS_NO_PORT`), not from the bind's share of the range.
    #[test]
    fn connecting_from_an_address_leaves_the_port_to_the_connect() {
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = connect_from("127.0.0.1".parse().unwrap(), l.local_addr().unwrap()).unwrap();
        let (mut v, mut n): (libc::c_int, libc::socklen_t) = (0, 4);
        // SAFETY: getsockopt writes at most `n` bytes into `v`.
        let r = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                (&mut v as *mut libc::c_int).cast(),
                &mut n,
            )
        };
        assert_eq!((r, v), (0, 1));
        let _ = l.accept().unwrap();
        assert_eq!(s.local_addr().unwrap().ip().to_string(), "127.0.0.1");
    }

    #[test]
    fn both_families_round_trip_through_bytes_and_strings() {
        for s in ["127.0.0.1:5000", "[::1]:6000", "10.1.2.3:1"] {
            let a: SocketAddr = s.parse().unwrap();
            assert_eq!(decode(&encode(&a)).unwrap(), a);
            let mut st = to_str(&a).into_bytes();
            st.push(0);
            assert_eq!(decode(&st).unwrap(), a);
            assert_eq!(SockAddr.canonical(&st), encode(&a));
            // In a sockaddr_storage's 128 bytes: the same address.
            let mut storage = encode(&a);
            storage.resize(128, 0xee);
            assert_eq!(decode(&storage).unwrap(), a, "{s} in a sockaddr_storage");
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for raw in [
            &b""[..],
            &[2u8][..],
            &[2, 0, 1, 1][..],
            &[10u8; 16][..],
            &[2u8; 28][..],
            b"fi_sockaddr_in://nonsense",
            b"fi_sockaddr_in6://[::1]",
        ] {
            assert!(decode(raw).is_err(), "{raw:?}");
        }
    }
}
