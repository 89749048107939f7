//! `FI_HMEM_ZE` in a build without the `ze` feature: no loader is opened, and every call
//! answers [`HmemError::NotBuilt`] ("built without Level Zero
//! support (feature `ze`)"). The type keeps the API of the real one.

use crate::absent::{Absent, NotBuilt};
use crate::{HmemError, Iface};

/// Environment variable that names the loader; read only by builds with the `ze` feature.
pub const LOADER_ENV: &str = "XFABRIC_ZE_LOADER";

/// The Level Zero interface, left out of this build (feature `ze` off).
#[derive(Debug)]
pub struct Ze {
    loader: String,
    off: NotBuilt,
}

impl Default for Ze {
    fn default() -> Self {
        Self::new()
    }
}

impl Ze {
    /// The left-out interface: unavailable, every call answers `NotBuilt`.
    pub fn new() -> Self {
        Self::with_loader(xfabric_core::settings::ZE_LOADER.text_or_default())
    }

    /// As [`new`](Self::new); `path` is remembered, never opened.
    pub fn with_loader(path: &str) -> Self {
        Ze {
            loader: path.to_string(),
            off: NotBuilt {
                iface: Iface::Ze,
                support: "Level Zero",
                feature: "ze",
            },
        }
    }

    /// The library a build with the `ze` feature would load.
    pub fn loader(&self) -> &str {
        &self.loader
    }
}

impl Absent for Ze {
    fn iface(&self) -> Iface {
        self.off.iface()
    }

    fn error(&self) -> HmemError {
        self.off.error()
    }
}
