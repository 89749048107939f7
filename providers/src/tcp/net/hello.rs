//! The connection handshake: fixed-size messages before any engine frame. Pure encoding,
//! checking and the authentication code, no I/O.
//!
//! The connector says who it claims to be (HELLO: its listen address, an incarnation nonce,
//! a fresh random challenge, whether it holds an authentication key). A claim is not an
//! identity, so the acceptor proves it before the connection carries anything:
//!
//! - With an authentication key (both sides must have one, or neither): the acceptor answers
//!   CHALLENGE (its nonce, its own random challenge and an HMAC-SHA-256 over both challenges,
//!   both listen addresses and both nonces), the connector checks it and answers PROOF (the
//!   same inputs under another label, so that neither MAC can be replayed as the other).
//! - Without one: the acceptor calls the claimed address back. A new connection to that
//!   listener carries VERIFY (the source address the claim came from, the acceptor's own
//!   listen address, the nonce it named), and the real endpoint answers VOUCH yes only if its
//!   incarnation has that nonce and its own outbound connection in bring-up leaves from that
//!   source address for that acceptor. A stranger can make neither true: one the real
//!   endpoint connects to learns the nonce and the source port, and may open a connection of
//!   its own from that port elsewhere, but the real one went to the stranger, not there.
//!
//! Then ACCEPT (with the acceptor's nonce) or REJECT (with a reason).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use hmac::{KeyInit, Mac};

/// First four bytes of every handshake message ("XFHS"), distinct from `wire::MAGIC`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"XFHS");
/// The handshake's version (3: VERIFY names the acceptor asking; 2: challenges,
/// authentication and verification).
pub const VERSION: u16 = 3;
/// Size of every handshake message.
pub const LEN: usize = 104;
/// Bytes of a random challenge.
pub const RAND: usize = 32;
/// Bytes of an authentication code (HMAC-SHA-256).
pub const MAC: usize = 32;

/// Why an acceptor refused a connection (`Hs::Reject`).
pub mod reason {
    /// The acceptor's own connection to the connector wins a simultaneous connect: the
    /// connector should wait for it rather than fail.
    pub const DUPLICATE: u32 = 1;
    /// The acceptor knows too many peers.
    pub const FULL: u32 = 2;
    /// The acceptor requires an authentication key and the connector has none.
    pub const AUTH_REQUIRED: u32 = 3;
    /// The connector has an authentication key and the acceptor takes none.
    pub const AUTH_UNEXPECTED: u32 = 4;
    /// A proof of the key did not check (the keys differ).
    pub const AUTH_FAILED: u32 = 5;
    /// The claimed address did not vouch for the connection (a stranger, or an endpoint
    /// that did not open it).
    pub const UNVERIFIED: u32 = 6;
}

/// HELLO's flag: the connector holds an authentication key.
pub const KEYED: u32 = 1;

/// A handshake message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hs {
    /// Connector to acceptor: "I listen at `addr`; this incarnation of me is `nonce`".
    Hello {
        /// The listen address it claims.
        addr: SocketAddr,
        /// Its incarnation.
        nonce: u64,
        /// Its challenge, fresh for this connection.
        rand: [u8; RAND],
        /// Whether it holds an authentication key.
        keyed: bool,
    },
    /// Acceptor to a keyed connector: its incarnation, its challenge, and its proof of the key.
    Challenge {
        /// The acceptor's incarnation.
        nonce: u64,
        /// The acceptor's challenge, fresh for this connection.
        rand: [u8; RAND],
        /// The acceptor's proof (`Transcript::mac` with `Side::Acceptor`).
        mac: [u8; MAC],
    },
    /// Keyed connector to acceptor: its proof of the key.
    Proof {
        /// `Transcript::mac` with `Side::Connector`.
        mac: [u8; MAC],
    },
    /// Acceptor to connector: go ahead; the acceptor's incarnation is `nonce`.
    Accept {
        /// The acceptor's incarnation.
        nonce: u64,
    },
    /// Acceptor to connector: no (`reason::*`); the acceptor closes the connection.
    Reject {
        /// One of `reason::*`.
        reason: u32,
    },
    /// Acceptor to a claimed address, on a connection of its own: "did your incarnation
    /// `nonce` open a connection to me (`to`) from `src`?"
    Verify {
        /// The source address the claim came from.
        src: SocketAddr,
        /// Where the claimant's connection reached the acceptor asking (the address it dialled).
        to: SocketAddr,
        /// The incarnation it claimed.
        nonce: u64,
    },
    /// The answer to `Verify`.
    Vouch {
        /// Whether this endpoint opened that connection.
        yes: bool,
    },
}

/// Why bytes are not a handshake message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HsError {
    /// Not our protocol at all.
    #[error("bad handshake magic {0:#010x}")]
    Magic(u32),
    /// Another version of it.
    #[error("unsupported handshake version {0}")]
    Version(u16),
    /// A length field that is not `LEN`.
    #[error("handshake message of {0} bytes (expected {LEN})")]
    Len(u16),
    /// An unknown kind, or a known one with fields it does not use set.
    #[error("unknown or malformed handshake message (kind {0})")]
    Kind(u8),
    /// An address that is none.
    #[error("malformed address in a handshake message (family {0})")]
    Addr(u8),
}

const HELLO: u8 = 1;
const ACCEPT: u8 = 2;
const REJECT: u8 = 3;
const CHALLENGE: u8 = 4;
const PROOF: u8 = 5;
const VERIFY: u8 = 6;
const VOUCH: u8 = 7;

// Layout, little-endian: magic u32 | version u16 | kind u8 | family u8 | len u16 | port u16 |
// word u32 (flags, reason, answer) | nonce u64 | ip [u8; 16] | rand [u8; 32] | mac [u8; 32].
// VERIFY's second address (`to`) takes the first 20 bytes of `rand`: family u8 | 0 u8 |
// port u16 | ip [u8; 16].
const WORD: usize = 12;
const NONCE: usize = 16;
const IP: usize = 24;
const RAND_AT: usize = 40;
const MAC_AT: usize = 72;

fn put_addr(b: &mut [u8; LEN], addr: &SocketAddr) {
    b[10..12].copy_from_slice(&addr.port().to_le_bytes());
    match addr.ip() {
        IpAddr::V4(ip) => {
            b[7] = 4;
            b[IP..IP + 4].copy_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            b[7] = 6;
            b[IP..IP + 16].copy_from_slice(&ip.octets());
        }
    }
}

/// VERIFY's second address, in the first 20 bytes of `rand`.
fn put_second_addr(b: &mut [u8; LEN], addr: &SocketAddr) {
    let at = RAND_AT;
    b[at + 2..at + 4].copy_from_slice(&addr.port().to_le_bytes());
    match addr.ip() {
        IpAddr::V4(ip) => {
            b[at] = 4;
            b[at + 4..at + 8].copy_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            b[at] = 6;
            b[at + 4..at + 20].copy_from_slice(&ip.octets());
        }
    }
}

/// What `put_second_addr` wrote, checked as the first address is.
fn second_addr(b: &[u8; LEN]) -> Result<SocketAddr, HsError> {
    let at = RAND_AT;
    if b[at + 1] != 0 {
        return Err(HsError::Addr(b[at]));
    }
    let port = u16::from_le_bytes([b[at + 2], b[at + 3]]);
    decode_addr(b[at], port, &b[at + 4..at + 20])
}

/// An address from its family byte (4 or 6), port (not 0) and 16 IP bytes (an IPv4 one in
/// the first 4, the rest zero).
fn decode_addr(family: u8, port: u16, ip: &[u8]) -> Result<SocketAddr, HsError> {
    let ip = match family {
        4 if ip[4..].iter().all(|&x| x == 0) => {
            IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]))
        }
        6 => {
            let mut o = [0u8; 16];
            o.copy_from_slice(ip);
            IpAddr::V6(Ipv6Addr::from(o))
        }
        _ => return Err(HsError::Addr(family)),
    };
    if port == 0 {
        return Err(HsError::Addr(family));
    }
    Ok(SocketAddr::new(ip, port))
}

impl Hs {
    /// The message's bytes.
    pub fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[8..10].copy_from_slice(&(LEN as u16).to_le_bytes());
        let (kind, word, nonce) = match *self {
            Hs::Hello {
                addr,
                nonce,
                rand,
                keyed,
            } => {
                put_addr(&mut b, &addr);
                b[RAND_AT..RAND_AT + RAND].copy_from_slice(&rand);
                (HELLO, if keyed { KEYED } else { 0 }, nonce)
            }
            Hs::Challenge { nonce, rand, mac } => {
                b[RAND_AT..RAND_AT + RAND].copy_from_slice(&rand);
                b[MAC_AT..MAC_AT + MAC].copy_from_slice(&mac);
                (CHALLENGE, 0, nonce)
            }
            Hs::Proof { mac } => {
                b[MAC_AT..MAC_AT + MAC].copy_from_slice(&mac);
                (PROOF, 0, 0)
            }
            Hs::Accept { nonce } => (ACCEPT, 0, nonce),
            Hs::Reject { reason } => (REJECT, reason, 0),
            Hs::Verify { src, to, nonce } => {
                put_addr(&mut b, &src);
                put_second_addr(&mut b, &to);
                (VERIFY, 0, nonce)
            }
            Hs::Vouch { yes } => (VOUCH, u32::from(yes), 0),
        };
        b[6] = kind;
        b[WORD..WORD + 4].copy_from_slice(&word.to_le_bytes());
        b[NONCE..NONCE + 8].copy_from_slice(&nonce.to_le_bytes());
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

    /// Decodes exactly `LEN` bytes, checking every field: what a kind does not use is zero.
    pub fn decode(b: &[u8; LEN]) -> Result<Hs, HsError> {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[NONCE..NONCE + 8]);
        let nonce = u64::from_le_bytes(v);
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
        let (kind, family, port, word) = (b[6], b[7], u16_at(10), u32_at(WORD));
        let zero = |r: std::ops::Range<usize>| b[r].iter().all(|&x| x == 0);
        let no_addr = family == 0 && port == 0 && zero(IP..IP + 16);
        let no_rand = zero(RAND_AT..RAND_AT + RAND);
        let no_mac = zero(MAC_AT..LEN);
        let addr = || decode_addr(family, port, &b[IP..IP + 16]);
        let rand = || {
            let mut r = [0u8; RAND];
            r.copy_from_slice(&b[RAND_AT..RAND_AT + RAND]);
            r
        };
        let mac = || {
            let mut m = [0u8; MAC];
            m.copy_from_slice(&b[MAC_AT..MAC_AT + MAC]);
            m
        };
        Ok(match kind {
            HELLO if word & !KEYED == 0 && no_mac => Hs::Hello {
                addr: addr()?,
                nonce,
                rand: rand(),
                keyed: word & KEYED != 0,
            },
            CHALLENGE if word == 0 && no_addr => Hs::Challenge {
                nonce,
                rand: rand(),
                mac: mac(),
            },
            PROOF if word == 0 && nonce == 0 && no_addr && no_rand => Hs::Proof { mac: mac() },
            ACCEPT if word == 0 && no_addr && no_rand && no_mac => Hs::Accept { nonce },
            REJECT if nonce == 0 && no_addr && no_rand && no_mac => Hs::Reject { reason: word },
            VERIFY if word == 0 && no_mac && zero(RAND_AT + 20..RAND_AT + RAND) => Hs::Verify {
                src: addr()?,
                to: second_addr(b)?,
                nonce,
            },
            VOUCH if word <= 1 && nonce == 0 && no_addr && no_rand && no_mac => {
                Hs::Vouch { yes: word == 1 }
            }
            k => return Err(HsError::Kind(k)),
        })
    }
}

/// What both sides of one keyed handshake know, and each side's proof over it: the two
/// challenges, both listen addresses (the connector's claimed one, the acceptor's dialled
/// one) and both incarnations. The label differs by direction, so that the acceptor's MAC is
/// never a valid proof from the connector.
pub struct Transcript<'a> {
    /// The connector's challenge (HELLO's).
    pub conn_rand: &'a [u8; RAND],
    /// The acceptor's challenge (CHALLENGE's).
    pub acc_rand: &'a [u8; RAND],
    /// The connector's listen address, as its HELLO claims it.
    pub conn_addr: SocketAddr,
    /// The acceptor's listen address, as the connector dialled it.
    pub acc_addr: SocketAddr,
    /// The connector's incarnation.
    pub conn_nonce: u64,
    /// The acceptor's incarnation.
    pub acc_nonce: u64,
}

/// Which side's proof.
#[derive(Clone, Copy)]
pub enum Side {
    /// CHALLENGE's.
    Acceptor,
    /// PROOF's.
    Connector,
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

impl Transcript<'_> {
    fn hmac(&self, key: &[u8], side: Side) -> HmacSha256 {
        // HMAC takes keys of any length (longer ones are hashed first).
        let mut m = <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC takes any key");
        m.update(match side {
            Side::Acceptor => b"xfabric tcp acceptor v2",
            Side::Connector => b"xfabric tcp connector v2",
        });
        m.update(self.conn_rand);
        m.update(self.acc_rand);
        m.update(&key_of(&self.conn_addr));
        m.update(&key_of(&self.acc_addr));
        m.update(&self.conn_nonce.to_le_bytes());
        m.update(&self.acc_nonce.to_le_bytes());
        m
    }

    /// `side`'s proof of holding `key`.
    pub fn mac(&self, key: &[u8], side: Side) -> [u8; MAC] {
        self.hmac(key, side).finalize().into_bytes().into()
    }

    /// Whether `mac` is `side`'s proof of `key`, compared in constant time.
    pub fn check(&self, key: &[u8], side: Side, mac: &[u8; MAC]) -> bool {
        self.hmac(key, side).verify_slice(mac).is_ok()
    }
}

/// A fresh random challenge from the OS's CSPRNG; `None` when the OS gives none (the
/// connection is then refused rather than challenged with something guessable).
pub fn random() -> Option<[u8; RAND]> {
    let mut r = [0u8; RAND];
    getrandom::fill(&mut r).ok()?;
    Some(r)
}

/// Size of [`key_of`].
pub const KEY: usize = 19;

/// A canonical byte encoding of a listen address (family, ip, port big-endian) whose
/// byte-wise order decides which side of a simultaneous connect wins.
pub fn key_of(addr: &SocketAddr) -> [u8; KEY] {
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

    fn hello() -> Hs {
        Hs::Hello {
            addr: "127.0.0.1:4000".parse().unwrap(),
            nonce: 7,
            rand: [3; RAND],
            keyed: true,
        }
    }

    #[test]
    fn round_trips() {
        for m in [
            hello(),
            Hs::Hello {
                addr: "[::1]:65535".parse().unwrap(),
                nonce: u64::MAX,
                rand: [0xff; RAND],
                keyed: false,
            },
            Hs::Challenge {
                nonce: 9,
                rand: [1; RAND],
                mac: [2; MAC],
            },
            Hs::Proof { mac: [5; MAC] },
            Hs::Accept { nonce: 3 },
            Hs::Reject {
                reason: reason::DUPLICATE,
            },
            Hs::Verify {
                src: "127.0.0.2:51000".parse().unwrap(),
                to: "127.0.0.3:40000".parse().unwrap(),
                nonce: 11,
            },
            Hs::Verify {
                src: "[::1]:1".parse().unwrap(),
                to: "[fe80::1]:65535".parse().unwrap(),
                nonce: 12,
            },
            Hs::Vouch { yes: true },
            Hs::Vouch { yes: false },
        ] {
            assert_eq!(Hs::decode(&m.encode()), Ok(m));
        }
    }

    #[test]
    fn bad_fields_are_refused() {
        let good = hello().encode();
        let mut b = good;
        b[8] = 41;
        assert_eq!(Hs::decode(&b), Err(HsError::Len(41)));
        let mut b = good;
        b[4] = 1; // version 1: the handshake without challenges
        assert_eq!(Hs::decode(&b), Err(HsError::Version(1)));
        let mut b = good;
        b[7] = 5;
        assert_eq!(Hs::decode(&b), Err(HsError::Addr(5)));
        let mut b = good;
        b[IP + 6] = 1; // bytes past an IPv4 address
        assert_eq!(Hs::decode(&b), Err(HsError::Addr(4)));
        let mut b = good;
        b[6] = 9;
        assert_eq!(Hs::decode(&b), Err(HsError::Kind(9)));
        let mut b = good;
        b[MAC_AT] = 1; // a HELLO carries no MAC
        assert_eq!(Hs::decode(&b), Err(HsError::Kind(HELLO)));
        let mut b = Hs::Accept { nonce: 1 }.encode();
        b[RAND_AT] = 1;
        assert_eq!(Hs::decode(&b), Err(HsError::Kind(ACCEPT)));
        let mut b = Hs::Vouch { yes: true }.encode();
        b[WORD] = 2;
        assert_eq!(Hs::decode(&b), Err(HsError::Kind(VOUCH)));
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
                b[6] = (i % 8) as u8;
            }
            if let Ok(m) = Hs::decode(&b) {
                assert_eq!(Hs::decode(&m.encode()), Ok(m));
            }
        }
    }

    #[test]
    fn proofs_bind_key_side_and_transcript() {
        let (rc, ra) = ([1u8; RAND], [2u8; RAND]);
        let t = Transcript {
            conn_rand: &rc,
            acc_rand: &ra,
            conn_addr: "127.0.0.1:5000".parse().unwrap(),
            acc_addr: "127.0.0.1:6000".parse().unwrap(),
            conn_nonce: 1,
            acc_nonce: 2,
        };
        let m = t.mac(b"secret", Side::Acceptor);
        assert!(t.check(b"secret", Side::Acceptor, &m));
        assert!(!t.check(b"secret", Side::Connector, &m), "reflected");
        assert!(!t.check(b"other", Side::Acceptor, &m), "another key");
        let swapped = Transcript {
            conn_addr: t.acc_addr,
            acc_addr: t.conn_addr,
            ..t
        };
        assert!(!swapped.check(b"secret", Side::Acceptor, &m), "relayed");
        let mut bad = m;
        bad[31] ^= 1;
        assert!(!t.check(b"secret", Side::Acceptor, &bad));
    }

    #[test]
    fn challenges_are_fresh() {
        let a = random().unwrap();
        let b = random().unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn keys_order_addresses() {
        let a = key_of(&"127.0.0.1:5000".parse().unwrap());
        let b = key_of(&"127.0.0.1:5001".parse().unwrap());
        let c = key_of(&"[::1]:1".parse().unwrap());
        assert!(a < b && b < c);
    }
}
