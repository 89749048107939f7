//! A transport's description of memory a peer may copy from one-sidedly: the opaque bytes a
//! large send's `Rts` (and an RMA's `Read` or `Write`) carries, which the transports write and
//! read and the engine and the wire only move. Below the wire format, which carries it, and
//! the transport contract, which hands it out (`OneSided::describe`).

use crate::rxq::{IovList, RawIov, IOV_LIMIT};

use super::inline::Inline;

/// Longest descriptor a `Rts` carries: room for 32 bytes per segment of a largest iov (an
/// address, a length, a key and a spare word).
pub const MAX_DESC: usize = 32 * IOV_LIMIT;

/// A transport's description of memory a peer may copy from one-sidedly: bytes only the
/// transports read. From a peer it is untrusted input, and only as long as [`MAX_DESC`].
pub type Desc = Inline<MAX_DESC>;

impl Desc {
    /// The plainest descriptor: `iov`'s segments as (address, length) pairs, for a transport
    /// whose peers name memory by its address alone (shm, which knows each peer's process).
    pub fn of_iov(iov: &IovList) -> Desc {
        let mut d = Desc::default();
        for s in iov.segs() {
            // At most IOV_LIMIT segments of 16 bytes: always fits.
            d.push(&(s.addr as u64).to_le_bytes());
            d.push(&(s.len as u64).to_le_bytes());
        }
        d
    }

    /// The segments of a descriptor written by [`Desc::of_iov`], checked: `None` for bytes
    /// that are not such a list.
    pub fn to_iov(&self) -> Option<IovList> {
        let b = self.as_bytes();
        if b.is_empty() || !b.len().is_multiple_of(16) {
            return None;
        }
        let word = |c: &[u8]| usize::try_from(u64::from_le_bytes(c.try_into().ok()?)).ok();
        let segs: Option<Vec<RawIov>> = b
            .chunks_exact(16)
            .map(|c| {
                Some(RawIov {
                    addr: word(&c[..8])?,
                    len: word(&c[8..])?,
                })
            })
            .collect();
        IovList::from_segs(segs?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iov_descriptors_round_trip_and_garbage_is_refused() {
        let (a, b) = ([1u8; 10], [2u8; 30]);
        let iov = IovList::from_segs([RawIov::of(&a), RawIov::of(&b)]).unwrap();
        let d = Desc::of_iov(&iov);
        let back = d.to_iov().unwrap();
        assert_eq!(back.total(), 40);
        assert_eq!(back.segs(), iov.segs());
        assert_eq!(Desc::default().to_iov(), None);
        assert_eq!(Desc::new(&[0; 15]).unwrap().to_iov(), None);
        // More segments than an iov holds.
        assert_eq!(
            Desc::new(&[1; 16 * (IOV_LIMIT + 1)]).unwrap().to_iov(),
            None
        );
        assert_eq!(Desc::new(&[0; MAX_DESC + 1]), None);
        let mut d = Desc::new(&[0; MAX_DESC]).unwrap();
        assert!(!d.push(&[1]));
        assert_eq!(d.as_bytes().len(), MAX_DESC);
    }
}
