//! The small value types every interface reports: which devices it has and who owns an address.
//! `Iface` itself (`enum fi_hmem_iface`) lives in xfabric-core, which registrations name it in.

use std::fmt;

pub use xfabric_core::Iface;

/// Which interface and which of its devices own an address (`fi_mr_attr`'s `iface` and
/// `device`). Device numbers are the interface's own: a CUDA ordinal, an index into the
/// Level Zero driver's device list, 0 for host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner {
    /// The interface.
    pub iface: Iface,
    /// The device within it.
    pub device: u64,
}

impl Owner {
    /// Host memory.
    pub const SYSTEM: Owner = Owner {
        iface: Iface::System,
        device: 0,
    };
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} device {}", self.iface, self.device)
    }
}

/// One device of an interface, as `xfabric info` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device number used in registrations (`fi_mr_attr.device`).
    pub index: u64,
    /// The driver's name for it.
    pub name: String,
}
