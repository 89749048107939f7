//! The CUDA test double for the multi-process device-memory tests: building it, the
//! environment a child needs to load it, its counters, and copies to and from CUDA memory.
//!
//! The double (hmem/tests/doubles/cuda_double.c) is NOT libcuda: its "device memory" is host
//! memory it tracks, and its host-to-device copies land only when their stream is synchronized.
//! Processes that load it are children started with the double first on LD_LIBRARY_PATH.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use xfabric::hmem::{DeviceBuffer, Hmem, HmemIface};
use xfabric::Iface;

/// With this set to 1, the real-GPU variants run (on a machine with an NVIDIA GPU).
pub const GPU_ENV: &str = "XFABRIC_GPU_TESTS";
/// Where the double's library is, for `double_counter` (set by `double_env`).
pub const DOUBLE_ENV: &str = "XFABRIC_CUDA_DOUBLE";

/// Builds the CUDA double once per test process as `<tmp>/shm-hmem/cuda/libcuda.so`.
pub fn cuda_double() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("shm-hmem/cuda");
        std::fs::create_dir_all(&dir).expect("create the double's directory");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("hmem/tests/doubles/cuda_double.c");
        let out = dir.join("libcuda.so");
        let tmp = dir.join(format!("libcuda.so.{}.tmp", std::process::id()));
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let o = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
            .arg(&tmp)
            .arg(&src)
            .arg("-lpthread")
            .output()
            .unwrap_or_else(|e| panic!("running {cc}: {e}"));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::rename(&tmp, &out).expect("move the double into place");
        out
    })
}

/// The environment of a child that is to load the double instead of libcuda.
pub fn double_env() -> Vec<(&'static str, String)> {
    let lib = cuda_double();
    vec![
        (
            "LD_LIBRARY_PATH",
            lib.parent().unwrap().display().to_string(),
        ),
        (DOUBLE_ENV, lib.display().to_string()),
    ]
}

/// One of the double's counters (not CUDA calls); `None` on a real driver.
pub fn double_counter(name: &str) -> Option<i32> {
    let lib = CString::new(std::env::var(DOUBLE_ENV).ok()?).ok()?;
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

/// Whether this process runs on the double (rather than a real driver).
pub fn on_double() -> bool {
    std::env::var_os(DOUBLE_ENV).is_some()
}

/// The CUDA interface (the double's or the real driver's).
pub fn cuda() -> &'static dyn HmemIface {
    Hmem::global().get(Iface::Cuda)
}

/// Copies `data` to the start of `buf`.
pub fn to_device(buf: &DeviceBuffer, data: &[u8]) {
    to_device_at(buf, 0, data)
}

/// Copies `data` into `buf` at byte `off`.
pub fn to_device_at(buf: &DeviceBuffer, off: usize, data: &[u8]) {
    assert!(off + data.len() <= buf.len());
    // SAFETY: `buf` is device memory with `data.len()` bytes from `off` (asserted).
    unsafe { cuda().copy_from_host(0, buf.as_ptr().wrapping_add(off), data) }
        .expect("copy to the device");
}

/// The first `len` bytes of `buf`.
pub fn from_device(buf: &DeviceBuffer, len: usize) -> Vec<u8> {
    assert!(len <= buf.len());
    let mut out = vec![0u8; len];
    // SAFETY: as above.
    unsafe { cuda().copy_to_host(0, &mut out, buf.as_ptr()) }.expect("copy from the device");
    out
}
