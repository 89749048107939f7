//! The small value types every interface reports: which devices it has and who owns an address.
//! `Iface` (`enum fi_hmem_iface`) and `Owner` live in xfabric-core, which registrations name them in.

pub use xfabric_core::{Iface, Owner};

/// One device of an interface, as `xfabric info` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device number used in registrations (`fi_mr_attr.device`).
    pub index: u64,
    /// The driver's name for it.
    pub name: String,
}
