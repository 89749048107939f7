//! Compiled PTX, kept twice: in this process (a second `GpuXpu::open` compiles nothing) and on
//! disk under `$XDG_CACHE_HOME/xfabric/kernels/` (else `~/.cache/xfabric/kernels/`), so a new
//! process skips NVRTC too (compiling these kernels takes a good fraction of a second).
//!
//! The key covers everything that changes the PTX: the NVRTC version, the options, the program
//! and each header. The disk cache is best effort: a directory that cannot be created or a file
//! that cannot be written costs a recompilation, never an error.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// FNV-1a, 64 bits: stable across Rust releases and machines, unlike `DefaultHasher`, so a
/// key written to disk by one build is found by the next.
#[derive(Clone, Copy)]
pub(crate) struct Fnv64(u64);

impl Fnv64 {
    pub(crate) fn new() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }

    fn byte(&mut self, b: u8) {
        self.0 ^= u64::from(b);
        self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
    }

    /// Adds a field: its length first, so ("ab", "c") and ("a", "bc") differ.
    pub(crate) fn field(mut self, bytes: &[u8]) -> Self {
        for b in (bytes.len() as u64).to_le_bytes() {
            self.byte(b);
        }
        for &b in bytes {
            self.byte(b);
        }
        self
    }

    pub(crate) fn finish(self) -> u64 {
        self.0
    }
}

fn memory() -> &'static Mutex<HashMap<u64, Arc<str>>> {
    static MEM: OnceLock<Mutex<HashMap<u64, Arc<str>>>> = OnceLock::new();
    MEM.get_or_init(Default::default)
}

pub(crate) fn memory_get(key: u64) -> Option<Arc<str>> {
    memory()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
        .cloned()
}

pub(crate) fn memory_put(key: u64, ptx: Arc<str>) {
    memory()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, ptx);
}

/// Where compiled kernels are kept between processes, if a home for them can be named.
pub fn cache_dir() -> Option<PathBuf> {
    let base = match xfabric_core::settings::XDG_CACHE_HOME.text() {
        Some(x) if !x.is_empty() => PathBuf::from(x),
        // HOME is the system's, not a setting of xfabric's: it only spells XDG_CACHE_HOME's
        // default.
        _ => PathBuf::from(std::env::var_os("HOME").filter(|h| !h.is_empty())?).join(".cache"),
    };
    Some(base.join("xfabric").join("kernels"))
}

fn file_for(key: u64) -> Option<PathBuf> {
    Some(cache_dir()?.join(format!("{key:016x}.ptx")))
}

pub(crate) fn disk_get(key: u64) -> Option<Arc<str>> {
    let text = std::fs::read_to_string(file_for(key)?).ok()?;
    // A file cut short by a crash (the rename below makes that unlikely) is not PTX.
    (text.contains(".version") && text.contains(".entry")).then(|| Arc::from(text))
}

pub(crate) fn disk_put(key: u64, ptx: &str) {
    let Some(path) = file_for(key) else { return };
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    // Write then rename: a reader in another process sees the whole file or none.
    let tmp = dir.join(format!(".{key:016x}.{}.tmp", std::process::id()));
    if std::fs::write(&tmp, ptx).is_ok() && std::fs::rename(&tmp, &path).is_ok() {
        return;
    }
    let _ = std::fs::remove_file(&tmp);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_is_the_published_function_and_fields_are_delimited() {
        // FNV-1a 64 of the empty input is its offset basis; of "a", the published 0xaf63dc4c8601ec8c.
        let mut h = Fnv64::new();
        assert_eq!(h.finish(), 0xcbf2_9ce4_8422_2325);
        h.byte(b'a');
        assert_eq!(h.finish(), 0xaf63_dc4c_8601_ec8c);
        let ab_c = Fnv64::new().field(b"ab").field(b"c").finish();
        let a_bc = Fnv64::new().field(b"a").field(b"bc").finish();
        assert_ne!(ab_c, a_bc);
    }
}
