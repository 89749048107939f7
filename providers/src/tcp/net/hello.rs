//! The connection handshake: one fixed-size message each way before any engine frame. The
//! connector says who it is (HELLO: its listen address and an incarnation nonce); the
//! acceptor answers ACCEPT (with its own nonce) or REJECT (with a reason). Pure encoding and
//! checking, no I/O.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// First four bytes of every handshake message ("XFHS"), distinct from `wire::MAGIC`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"XFHS");
/// The handshake's version.
pub const VERSION: u16 = 1;
/// Size of every handshake message.
pub const LEN: usize = 40;

/// Why an acceptor refused a connection (`Hs::Reject`).
pub mod reason {
    /// The acceptor's own connection to the connector wins a simultaneous connect: the
    /// connector should wait for it rather than fail.
    pub const DUPLICATE: u32 = 1;
    /// The acceptor knows too many peers.
    pub const FULL: u32 = 2;
}

/// A handshake message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hs {
    /// Connector to acceptor: "I listen at `addr`; this incarnation of me is `nonce`".
    Hello { addr: SocketAddr, nonce: u64 },
    /// Acceptor to connector: go ahead; the acceptor's incarnation is `nonce`.
    Accept { nonce: u64 },
    /// Acceptor to connector: no (`reason::*`); the acceptor closes the connection.
    Reject { reason: u32 },
}

/// Why bytes are not a handshake message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HsError {
    #[error("bad handshake magic {0:#010x}")]
    Magic(u32),
    #[error("unsupported handshake version {0}")]
    Version(u16),
    #[error("handshake message of {0} bytes (expected {LEN})")]
    Len(u16),
    #[error("unknown handshake kind {0}")]
    Kind(u8),
    #[error("malformed address in HELLO (family {0})")]
    Addr(u8),
}

const HELLO: u8 = 1;
const ACCEPT: u8 = 2;
const REJECT: u8 = 3;

// Layout, little-endian: magic u32 | version u16 | kind u8 | family u8 | len u16 | port u16 |
// reason u32 | nonce u64 | ip [u8; 16].

impl Hs {
    /// The message's bytes.
    pub fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[8..10].copy_from_slice(&(LEN as u16).to_le_bytes());
        match *self {
            Hs::Hello { addr, nonce } => {
                b[6] = HELLO;
                b[10..12].copy_from_slice(&addr.port().to_le_bytes());
                b[16..24].copy_from_slice(&nonce.to_le_bytes());
                match addr.ip() {
                    IpAddr::V4(ip) => {
                        b[7] = 4;
                        b[24..28].copy_from_slice(&ip.octets());
                    }
                    IpAddr::V6(ip) => {
                        b[7] = 6;
                        b[24..40].copy_from_slice(&ip.octets());
                    }
                }
            }
            Hs::Accept { nonce } => {
                b[6] = ACCEPT;
                b[16..24].copy_from_slice(&nonce.to_le_bytes());
            }
            Hs::Reject { reason } => {
                b[6] = REJECT;
                b[12..16].copy_from_slice(&reason.to_le_bytes());
            }
        }
        b
    }

    /// Checks the first bytes that arrived (fewer than `LEN` possibly): garbage is refused as
    /// soon as the magic is wrong, without waiting for a whole message.
    pub fn check_start(b: &[u8]) -> Result<(), HsError> {
        let n = b.len().min(4);
        if b[..n] != MAGIC.to_le_bytes()[..n] {
            let mut m = [0u8; 4];
            m[..n].copy_from_slice(&b[..n]);
            return Err(HsError::Magic(u32::from_le_bytes(m)));
        }
        Ok(())
    }

    /// Decodes exactly `LEN` bytes, checking every field.
    pub fn decode(b: &[u8; LEN]) -> Result<Hs, HsError> {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut v = [0u8; 8];
            v.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(v)
        };
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(HsError::Magic(magic));
        }
        if u16_at(4) != VERSION {
            return Err(HsError::Version(u16_at(4)));
        }
        if u16_at(8) as usize != LEN {
            return Err(HsError::Len(u16_at(8)));
        }
        let (kind, family, port, reason, nonce) = (b[6], b[7], u16_at(10), u32_at(12), u64_at(16));
        let ip = &b[24..40];
        let zero_tail = |from: usize| ip[from..].iter().all(|&x| x == 0);
        match kind {
            HELLO => {
                let ip = match family {
                    4 if zero_tail(4) => IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])),
                    6 => {
                        let mut o = [0u8; 16];
                        o.copy_from_slice(ip);
                        IpAddr::V6(Ipv6Addr::from(o))
                    }
                    _ => return Err(HsError::Addr(family)),
                };
                if port == 0 || reason != 0 {
                    return Err(HsError::Addr(family));
                }
                Ok(Hs::Hello {
                    addr: SocketAddr::new(ip, port),
                    nonce,
                })
            }
            ACCEPT if family == 0 && port == 0 && reason == 0 && zero_tail(0) => {
                Ok(Hs::Accept { nonce })
            }
            REJECT if family == 0 && port == 0 && nonce == 0 && zero_tail(0) => {
                Ok(Hs::Reject { reason })
            }
            k => Err(HsError::Kind(k)),
        }
    }
}

/// Size of [`key`].
pub const KEY: usize = 19;

/// A canonical byte encoding of a listen address (family, ip, port big-endian) whose
/// byte-wise order decides which side of a simultaneous connect wins.
pub fn key(addr: &SocketAddr) -> [u8; KEY] {
    let mut k = [0u8; KEY];
    match addr.ip() {
        IpAddr::V4(ip) => {
            k[0] = 4;
            k[1..5].copy_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            k[0] = 6;
            k[1..17].copy_from_slice(&ip.octets());
        }
    }
    k[17..19].copy_from_slice(&addr.port().to_be_bytes());
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for m in [
            Hs::Hello {
                addr: "127.0.0.1:4000".parse().unwrap(),
                nonce: 7,
            },
            Hs::Hello {
                addr: "[::1]:65535".parse().unwrap(),
                nonce: u64::MAX,
            },
            Hs::Accept { nonce: 3 },
            Hs::Reject {
                reason: reason::DUPLICATE,
            },
        ] {
            assert_eq!(Hs::decode(&m.encode()), Ok(m));
        }
    }

    #[test]
    fn bad_fields_are_refused() {
        let good = Hs::Hello {
            addr: "127.0.0.1:4000".parse().unwrap(),
            nonce: 7,
        }
        .encode();
        let mut b = good;
        b[8] = 41;
        assert_eq!(Hs::decode(&b), Err(HsError::Len(41)));
        let mut b = good;
        b[4] = 9;
        assert_eq!(Hs::decode(&b), Err(HsError::Version(9)));
        let mut b = good;
        b[7] = 5;
        assert_eq!(Hs::decode(&b), Err(HsError::Addr(5)));
        let mut b = good;
        b[30] = 1; // bytes past an IPv4 address
        assert_eq!(Hs::decode(&b), Err(HsError::Addr(4)));
        let mut b = good;
        b[6] = 9;
        assert_eq!(Hs::decode(&b), Err(HsError::Kind(9)));
        assert!(Hs::check_start(b"XF").is_ok());
        assert!(Hs::check_start(b"GET ").is_err());
    }

    #[test]
    fn random_bytes_decode_or_fail_cleanly() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut b = [0u8; LEN];
        for i in 0..50_000 {
            for v in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *v = x as u8;
            }
            if i % 2 == 0 {
                b[..4].copy_from_slice(&MAGIC.to_le_bytes());
                b[4..6].copy_from_slice(&VERSION.to_le_bytes());
                b[8..10].copy_from_slice(&(LEN as u16).to_le_bytes());
            }
            if let Ok(m) = Hs::decode(&b) {
                assert_eq!(Hs::decode(&m.encode()), Ok(m));
            }
        }
    }

    #[test]
    fn keys_order_addresses() {
        let a = key(&"127.0.0.1:5000".parse().unwrap());
        let b = key(&"127.0.0.1:5001".parse().unwrap());
        let c = key(&"[::1]:1".parse().unwrap());
        assert!(a < b && b < c);
    }
}
