//! `FI_HMEM_CUDA` in a build without the `cuda` feature: cudarc is not compiled in, and every
//! call answers [`HmemError::NotBuilt`] ("built without CUDA
//! support (feature `cuda`)"). The type keeps the API of the real one, so an application
//! naming CUDA builds either way and finds out at run time.

use crate::absent::{Absent, NotBuilt};
use crate::{HmemError, Iface};

/// The CUDA interface, left out of this build (feature `cuda` off).
#[derive(Debug)]
pub struct Cuda(NotBuilt);

impl Default for Cuda {
    fn default() -> Self {
        Self::new()
    }
}

impl Cuda {
    /// The left-out interface: unavailable, every call answers `NotBuilt`.
    pub fn new() -> Self {
        Cuda(NotBuilt {
            iface: Iface::Cuda,
            support: "CUDA",
            feature: "cuda",
        })
    }

    /// Always `None`: no driver is loaded by this build.
    pub fn driver_version(&self) -> Option<i32> {
        None
    }
}

impl Absent for Cuda {
    fn iface(&self) -> Iface {
        self.0.iface()
    }

    fn error(&self) -> HmemError {
        self.0.error()
    }
}
