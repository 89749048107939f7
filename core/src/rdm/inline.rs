//! Small byte strings kept inline (a frame's control part, a small body, a transport's
//! descriptor), so that the engine's hot path allocates nothing per frame.

use std::ops::{Deref, DerefMut};

/// Up to `N` bytes, inline.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Inline<const N: usize> {
    len: u16,
    bytes: [u8; N],
}

impl<const N: usize> Default for Inline<N> {
    fn default() -> Self {
        Inline {
            len: 0,
            bytes: [0; N],
        }
    }
}

impl<const N: usize> std::fmt::Debug for Inline<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:02x?}", self.as_bytes())
    }
}

impl<const N: usize> Inline<N> {
    /// Holding `bytes`; `None` if they are longer than `N`.
    pub fn new(bytes: &[u8]) -> Option<Self> {
        let mut d = Self::default();
        d.push(bytes).then_some(d)
    }

    /// `n` zero bytes, to be filled in place; `None` past `N`.
    pub fn zeroed(n: usize) -> Option<Self> {
        (n <= N).then_some(Inline {
            len: n as u16,
            bytes: [0; N],
        })
    }

    /// Appends `bytes`; false (and nothing appended) past `N`.
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        let at = self.len as usize;
        let Some(dst) = self.bytes.get_mut(at..at + bytes.len()) else {
            return false;
        };
        dst.copy_from_slice(bytes);
        self.len += bytes.len() as u16;
        true
    }

    /// Its bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl<const N: usize> Deref for Inline<N> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl<const N: usize> DerefMut for Inline<N> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[..self.len as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_up_to_its_size_and_no_more() {
        let mut b = Inline::<4>::new(&[1, 2]).unwrap();
        assert!(b.push(&[3, 4]));
        assert!(!b.push(&[5]));
        assert_eq!(&b[..], &[1, 2, 3, 4]);
        b[0] = 9;
        assert_eq!(b.as_bytes(), &[9, 2, 3, 4]);
        assert_eq!(Inline::<4>::new(&[0; 5]), None);
        assert_eq!(Inline::<4>::zeroed(3).map(|z| z.len()), Some(3));
        assert_eq!(Inline::<4>::zeroed(5), None);
    }
}
