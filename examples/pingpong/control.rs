//! The TCP control connection: address and settings exchange, as fi_pingpong does it.

use super::*;

pub(super) fn default_port() -> Res<u16> {
    match std::env::var("XFABRIC_PINGPONG_PORT") {
        Ok(v) => parse_port(&v).map_err(|e| format!("XFABRIC_PINGPONG_PORT: {e}")),
        Err(_) => Ok(DEFAULT_PORT),
    }
}

/// Server: listens on `-B` (or `-P`, so both sides can be given the same options) and takes one
/// client. std's listener sets SO_REUSEADDR, so back-to-back runs can reuse the port.
pub(super) fn accept(o: &Opts) -> Res<TcpStream> {
    let port = match o.src_port.or(o.dst_port) {
        Some(p) => p,
        None => default_port()?,
    };
    let any: SocketAddr = if o.ipv6 {
        (std::net::Ipv6Addr::UNSPECIFIED, port).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, port).into()
    };
    let listener =
        TcpListener::bind(any).map_err(|e| format!("control: cannot listen on {any}: {e}"))?;
    if o.verbose {
        eprintln!("pingpong: waiting for a client on {any}");
    }
    let (s, peer) = listener
        .accept()
        .map_err(|e| format!("control: accept on {any}: {e}"))?;
    if o.verbose {
        eprintln!("pingpong: client {peer} connected");
    }
    Ok(s)
}

/// Client: connects to the server's control port, retrying a refused connection for a few
/// seconds so client and server may be started together.
pub(super) fn connect(o: &Opts, host: &str) -> Res<TcpStream> {
    let port = match o.dst_port {
        Some(p) => p,
        None => default_port()?,
    };
    let mut addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("control: cannot resolve {host:?}: {e}"))?
        .filter(|a| a.is_ipv6() == o.ipv6 || host_is_name(host))
        .collect();
    // The server listens on one family: try that one's addresses first.
    addrs.sort_by_key(|a| a.is_ipv6() != o.ipv6);
    if addrs.is_empty() {
        return Err(format!("control: {host:?} has no usable address"));
    }
    let give_up = Instant::now() + CONNECT_RETRY;
    loop {
        let mut last = None;
        for a in &addrs {
            let r = match o.src_port {
                Some(sp) => connect_from(sp, a),
                None => TcpStream::connect_timeout(a, Duration::from_secs(2)),
            };
            match r {
                Ok(s) => return Ok(s),
                Err(e) => last = Some((a, e)),
            }
        }
        let (a, e) = last.expect("at least one address was tried");
        let retryable = matches!(
            e.kind(),
            io::ErrorKind::ConnectionRefused | io::ErrorKind::AddrInUse
        );
        if !retryable || Instant::now() >= give_up {
            return Err(format!("control: cannot connect to {a}: {e}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(super) fn host_is_name(host: &str) -> bool {
    host.parse::<std::net::IpAddr>().is_err()
}

/// Connects from a fixed local port (client `-B`), which std's TcpStream cannot do.
pub(super) fn connect_from(src_port: u16, to: &SocketAddr) -> io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let family = if to.is_ipv6() {
        libc::AF_INET6
    } else {
        libc::AF_INET
    };
    // SAFETY: plain socket(2); the descriptor is owned by `stream` right below.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket nothing else owns; TcpStream closes it on drop.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: `one` outlives the call and its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let local: SocketAddr = if to.is_ipv6() {
        (std::net::Ipv6Addr::UNSPECIFIED, src_port).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, src_port).into()
    };
    let (l, ll) = sockaddr(&local);
    // SAFETY: `l` is a sockaddr of length `ll` living across the call.
    if unsafe { libc::bind(fd, (&l as *const libc::sockaddr_storage).cast(), ll) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let (r, rl) = sockaddr(to);
    // SAFETY: as for bind.
    if unsafe { libc::connect(fd, (&r as *const libc::sockaddr_storage).cast(), rl) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stream)
}

pub(super) fn sockaddr(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all zeroes is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// The control connection: length-prefixed blobs and one-byte barriers.
pub(super) struct Control(pub(super) TcpStream);

impl Control {
    pub(super) fn send_blob(&mut self, b: &[u8]) -> Res<()> {
        let mut msg = (b.len() as u32).to_le_bytes().to_vec();
        msg.extend_from_slice(b);
        self.0
            .write_all(&msg)
            .map_err(|e| format!("control: send to peer: {e}"))
    }

    pub(super) fn recv_blob(&mut self) -> Res<Vec<u8>> {
        let mut len = [0u8; 4];
        self.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > 1 << 16 {
            return Err(format!(
                "control: peer sent a {len}-byte message; is it a pingpong?"
            ));
        }
        let mut b = vec![0u8; len];
        self.read_exact(&mut b)?;
        Ok(b)
    }

    pub(super) fn read_exact(&mut self, b: &mut [u8]) -> Res<()> {
        self.0.read_exact(b).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => "control: peer closed the connection".to_string(),
            _ => format!("control: receive from peer: {e}"),
        })
    }

    /// Client, in the one-sided tests: the run is over and took `elapsed`.
    pub(super) fn send_done(&mut self, elapsed: Duration) -> Res<()> {
        let mut m = [0xd0u8; 9];
        m[1..].copy_from_slice(&(elapsed.as_nanos() as u64).to_le_bytes());
        self.0
            .write_all(&m)
            .map_err(|e| format!("control: done: {e}"))
    }

    /// Server: waits for `send_done` and returns the client's time.
    pub(super) fn recv_done(&mut self) -> Res<Duration> {
        let mut m = [0u8; 9];
        self.read_exact(&mut m)?;
        if m[0] != 0xd0 {
            return Err("control: peer is out of step".into());
        }
        let nanos = u64::from_le_bytes(m[1..].try_into().expect("8 bytes"));
        Ok(Duration::from_nanos(nanos))
    }

    /// Both sides pass only when both have arrived.
    pub(super) fn barrier(&mut self) -> Res<()> {
        self.0
            .write_all(&[0xb7])
            .map_err(|e| format!("control: barrier: {e}"))?;
        let mut b = [0u8; 1];
        self.read_exact(&mut b)?;
        if b[0] != 0xb7 {
            return Err("control: peer is out of step".into());
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Fabric resources
