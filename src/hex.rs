//! Addresses in hex: how the examples and tests pass an endpoint's name to a peer process
//! through a pipe or an argument. Decoding takes hostile text and says what is wrong with it.

use std::fmt::Write as _;

/// Lower-case hex of `bytes`, two digits a byte, no prefix.
pub fn encode(bytes: &[u8]) -> String {
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The bytes `text` (as [`encode`] writes it, either case, surrounding whitespace ignored)
/// stands for.
pub fn decode(text: &str) -> Result<Vec<u8>, String> {
    let t = text.trim().as_bytes();
    if !t.len().is_multiple_of(2) {
        return Err(format!("hex address of odd length {}", t.len()));
    }
    t.chunks_exact(2)
        .map(|pair| {
            let digit = |c: u8| (c as char).to_digit(16);
            match (digit(pair[0]), digit(pair[1])) {
                (Some(h), Some(l)) => Ok((h * 16 + l) as u8),
                _ => Err(format!(
                    "not a hex address: {:?}",
                    String::from_utf8_lossy(pair)
                )),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bad_text() {
        let b = [0u8, 1, 0xab, 0xff];
        assert_eq!(encode(&b), "0001abff");
        assert_eq!(decode(" 0001ABff\n").unwrap(), b);
        assert!(decode("abc").is_err());
        assert!(decode("zz").is_err());
        assert!(decode("é0").is_err());
        assert_eq!(decode("").unwrap(), Vec::<u8>::new());
    }
}
