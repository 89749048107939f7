//! What the device test doubles (hmem/tests/doubles/) have in common for the multi-process
//! tests: compiling one with `cc`, reading one of its counters, and copies to and from a
//! device buffer through the interface that allocated it.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;

use xfabric::hmem::{DeviceBuffer, Hmem};

/// Compiles `hmem/tests/doubles/<src>` into `<tmp>/shm-hmem/<dir>/<name>` and returns the path.
/// The library is built under a temporary name and renamed into place, so test binaries
/// building it at the same time never load a half-written file. Callers build once per
/// process (behind a `OnceLock`).
pub fn build_double(src: &str, dir: &str, name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("shm-hmem")
        .join(dir);
    std::fs::create_dir_all(&dir).expect("create the double's directory");
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("hmem/tests/doubles")
        .join(src);
    let out = dir.join(name);
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let o = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
        .arg(&tmp)
        .arg(&src)
        .arg("-lpthread")
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(
        o.status.success(),
        "{cc} failed on {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::rename(&tmp, &out).expect("move the double into place");
    out
}

/// The value of `int <name>(void)`, a counter exported by the double whose path is in the
/// environment variable `lib_env`; `None` when that variable is unset (a real driver).
pub fn counter(lib_env: &str, name: &str) -> Option<i32> {
    let lib = CString::new(std::env::var(lib_env).ok()?).ok()?;
    let sym = CString::new(name).ok()?;
    // SAFETY: the double is already loaded in this process (RTLD_NOLOAD); the symbol is
    // `int f(void)`.
    unsafe {
        let h = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        assert!(!h.is_null(), "the double is not loaded");
        let f = libc::dlsym(h, sym.as_ptr());
        assert!(!f.is_null(), "the double has no {name}");
        let f: extern "C" fn() -> i32 = std::mem::transmute(f);
        let n = f();
        libc::dlclose(h);
        Some(n)
    }
}

/// Copies `data` to the start of `buf`, through the interface and device that own it.
pub fn to_device(buf: &DeviceBuffer, data: &[u8]) {
    to_device_at(buf, 0, data)
}

/// Copies `data` into `buf` at byte `off`.
pub fn to_device_at(buf: &DeviceBuffer, off: usize, data: &[u8]) {
    assert!(off + data.len() <= buf.len());
    let iface = Hmem::global().get(buf.iface());
    // SAFETY: `buf` is memory of `iface` on `buf.device()` with `data.len()` bytes from `off`
    // (asserted).
    unsafe { iface.copy_from_host(buf.device(), buf.as_ptr().wrapping_add(off), data) }
        .expect("copy to the device");
}

/// The first `len` bytes of `buf`.
pub fn from_device(buf: &DeviceBuffer, len: usize) -> Vec<u8> {
    from_device_at(buf, 0, len)
}

/// `len` bytes of `buf` from byte `off`.
pub fn from_device_at(buf: &DeviceBuffer, off: usize, len: usize) -> Vec<u8> {
    assert!(off + len <= buf.len());
    let mut out = vec![0u8; len];
    let iface = Hmem::global().get(buf.iface());
    // SAFETY: as in `to_device_at`.
    unsafe { iface.copy_to_host(buf.device(), &mut out, buf.as_ptr().wrapping_add(off)) }
        .expect("copy from the device");
    out
}
