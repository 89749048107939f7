//! The CUDA test double for the multi-process device-memory tests: building it, the
//! environment a child needs to load it, its counters, and copies to and from CUDA memory.
//!
//! The double (hmem/tests/doubles/cuda_double.c) is NOT libcuda: its "device memory" is host
//! memory it tracks, and its host-to-device copies land only when their stream is synchronized.
//! Processes that load it are children started with the double first on LD_LIBRARY_PATH.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

// Each test binary uses one of the double modules: the other's re-export goes unused.
#[allow(unused_imports)]
pub use super::doubles::{from_device, from_device_at, to_device, to_device_at};
use xfabric::hmem::{Hmem, HmemIface};
use xfabric::Iface;

/// With this set to 1, the real-GPU variants run (on a machine with an NVIDIA GPU).
pub const GPU_ENV: &str = "XFABRIC_GPU_TESTS";
/// Where the double's library is, for `double_counter` (set by `double_env`).
pub const DOUBLE_ENV: &str = "XFABRIC_CUDA_DOUBLE";

/// Builds the CUDA double once per test process as `<tmp>/shm-hmem/cuda/libcuda.so`.
pub fn cuda_double() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| super::doubles::build_double("cuda_double.c", "cuda", "libcuda.so"))
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
    super::doubles::counter(DOUBLE_ENV, name)
}

/// Whether this process runs on the double (rather than a real driver).
pub fn on_double() -> bool {
    std::env::var_os(DOUBLE_ENV).is_some()
}

/// The CUDA interface (the double's or the real driver's).
pub fn cuda() -> &'static dyn HmemIface {
    Hmem::global().get(Iface::Cuda)
}
