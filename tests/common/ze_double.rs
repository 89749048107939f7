//! The Level Zero test double for the multi-process device-memory tests: building it, the
//! environment a child needs to load it, its counters, and copies to and from Level Zero memory.
//!
//! The double (hmem/tests/doubles/ze_double.c) is NOT a Level Zero loader: it fakes two devices
//! whose "device memory" is host memory it tracks, and its copies are `memcpy`. Processes that
//! load it are children started with `XFABRIC_ZE_LOADER` naming it, which `Hmem::global()`
//! probes instead of libze_loader.so.1.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

// Each test binary uses one of the double modules: the other's re-export goes unused.
#[allow(unused_imports)]
pub use super::doubles::{from_device, from_device_at, to_device, to_device_at};
use xfabric::hmem::ze::LOADER_ENV;
use xfabric::hmem::{Hmem, HmemIface};
use xfabric::Iface;

/// The number of devices the double fakes (its default `ZE_DOUBLE_DEVICES`).
pub const ZE_DEVICES: u64 = 2;

/// Builds the Level Zero double once per test process as
/// `<tmp>/shm-hmem/ze/libze_loader.so.1`.
pub fn ze_double() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| super::doubles::build_double("ze_double.c", "ze", "libze_loader.so.1"))
}

/// The environment of a child that is to load the double as its Level Zero loader.
pub fn ze_double_env() -> Vec<(&'static str, String)> {
    vec![(LOADER_ENV, ze_double().display().to_string())]
}

/// One of the double's counters (not Level Zero calls); `None` when no double was named.
pub fn ze_counter(name: &str) -> Option<i32> {
    super::doubles::counter(LOADER_ENV, name)
}

/// Copies the double has made (out of device memory, into device memory) so far; `None`
/// without the double.
pub fn ze_copies() -> Option<(i32, i32)> {
    Some((
        ze_counter("ze_double_copies_from_device")?,
        ze_counter("ze_double_copies_to_device")?,
    ))
}

/// The Level Zero interface (the double's, where `XFABRIC_ZE_LOADER` names it).
pub fn ze() -> &'static dyn HmemIface {
    Hmem::global().get(Iface::Ze)
}
