//! Device memory in the multi-process tests: the CUDA TEST DOUBLE of libcuda
//! (hmem/tests/doubles/cuda_double.c: "device memory" that is host memory the double tracks,
//! host-to-device copies that land only when their stream is synchronized), built once per
//! test process, and small copies to and from CUDA memory.
//!
//! A process uses the double only if it was started with `double_env()`: the parent test
//! starts its roles as children with the double first on LD_LIBRARY_PATH.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use xfabric::hmem::{DeviceBuffer, Hmem, HmemIface};
use xfabric::Iface;

/// Set (with `GPU_ENV` unset) when the children run against the double.
pub const DOUBLE_ENV: &str = "XFABRIC_CUDA_DOUBLE";
/// `XFABRIC_GPU_TESTS=1` runs the same checks on a real GPU.
pub const GPU_ENV: &str = "XFABRIC_GPU_TESTS";

/// Builds the CUDA double once per test process as `<tmp>/devmem/cuda/libcuda.so`.
pub fn cuda_double() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("devmem/cuda");
        std::fs::create_dir_all(&dir).expect("create the double's directory");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("hmem/tests/doubles/cuda_double.c");
        let out = dir.join("libcuda.so");
        // Built beside its final name and renamed into place: test binaries running at once
        // never load a half-written library.
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

/// The environment a child needs to load the double instead of a real libcuda.
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

/// One of the double's counters (`int f(void)`, not a CUDA call); `None` on a real driver.
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

/// The CUDA interface of this process.
pub fn cuda() -> &'static dyn HmemIface {
    Hmem::global().get(Iface::Cuda)
}

/// Copies `data` to the start of `buf` (synchronously: on the device when this returns).
pub fn to_device(buf: &DeviceBuffer, data: &[u8]) {
    assert!(data.len() <= buf.len());
    // SAFETY: `buf` is device memory of at least `data.len()` bytes (asserted).
    unsafe { cuda().copy_from_host(0, buf.as_ptr(), data) }.expect("copy to the device");
}

/// The first `len` bytes of `buf`.
pub fn from_device(buf: &DeviceBuffer, len: usize) -> Vec<u8> {
    assert!(len <= buf.len());
    let mut out = vec![0u8; len];
    // SAFETY: as above.
    unsafe { cuda().copy_to_host(0, &mut out, buf.as_ptr()) }.expect("copy from the device");
    out
}
