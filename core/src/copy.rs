//! Copying bytes between buffers without `rep movsb`'s slow band.
//!
//! glibc's `memcpy` copies with `rep movsb` from about 2 KiB up to about 512 KiB. On AMD Zen
//! (this project's machines) that instruction runs some seventeen to twenty times slower when
//! the destination lies 1 to 31 bytes past the source modulo 4 KiB: measured here, 32 KiB in
//! 12 us against 0.7 us at any other offset. A heap buffer (16 bytes into its page) meeting a
//! page-aligned ring slot or shared buffer falls in that band, and which transfers do depends
//! on where slots and buffers happen to lie: a slow mode that comes and goes. Such copies go in
//! pieces short enough for `memcpy`'s vector loop, which has no such band; every other copy is
//! one `memcpy`.

/// Below this many bytes `memcpy` never uses `rep movsb` (glibc's `rep_movsb_threshold` is
/// 2,048 bytes or more).
const SHORT: usize = 2048;

/// Offsets (destination minus source, modulo 4 KiB) at which `rep movsb` is slow, with a margin.
const BAND: usize = 64;

/// Copies `len` bytes from `src` to `dst`.
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`: `src..src + len` readable, `dst..dst + len` writable,
/// the two not overlapping.
#[inline]
pub unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    // A few bytes (a small message's body) without the call into the C library's memcpy,
    // which costs more than the copy: two overlapping unaligned words.
    // SAFETY (both arms): each word lies within the `len` bytes at either end; the caller's
    // contract.
    match len {
        8..=16 => unsafe {
            let (a, b) = (
                src.cast::<u64>().read_unaligned(),
                src.add(len - 8).cast::<u64>().read_unaligned(),
            );
            dst.cast::<u64>().write_unaligned(a);
            dst.add(len - 8).cast::<u64>().write_unaligned(b);
            return;
        },
        4..=7 => unsafe {
            let (a, b) = (
                src.cast::<u32>().read_unaligned(),
                src.add(len - 4).cast::<u32>().read_unaligned(),
            );
            dst.cast::<u32>().write_unaligned(a);
            dst.add(len - 4).cast::<u32>().write_unaligned(b);
            return;
        },
        _ => {}
    }
    if len >= SHORT {
        let near = (dst as usize).wrapping_sub(src as usize) % 4096;
        if near != 0 && near < BAND {
            // SAFETY: the caller's contract.
            unsafe { copy_in_pieces(src, dst, len) };
            return;
        }
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

#[cold]
unsafe fn copy_in_pieces(src: *const u8, dst: *mut u8, len: usize) {
    let mut at = 0;
    while at < len {
        let k = (SHORT - 64).min(len - at);
        // SAFETY: `at + k <= len`, inside both ranges by the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), k) };
        at += k;
    }
}

/// `dst.copy_from_slice(src)` without the slow band.
///
/// # Panics
/// If the lengths differ, as `copy_from_slice`.
#[inline]
pub fn copy_slice(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_slice: lengths differ");
    // SAFETY: two live slices of one length; a `&mut` never overlaps a `&`.
    unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr(), src.len()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_offset_and_length_copies_exactly() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 13 + i / 7) as u8).collect();
        for off in [0usize, 1, 16, 31, 32, 63, 64, 4095] {
            for len in [0usize, 1, 2047, 2048, 4096, 5000, 16_384] {
                let mut dst = vec![0xAAu8; len + off + 8];
                copy_slice(&mut dst[off..off + len], &src[..len]);
                assert_eq!(&dst[off..off + len], &src[..len], "off {off} len {len}");
                assert!(dst[..off].iter().all(|&b| b == 0xAA));
                assert!(dst[off + len..].iter().all(|&b| b == 0xAA));
            }
        }
    }
}
