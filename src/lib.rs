//! xfabric: a native Rust implementation of the libfabric (OFI) object model, with
//! XPU-triggered transfers. This crate is the one applications depend on: it re-exports the
//! object model from `xfabric-core` and knows the providers.
//!
//! ```no_run
//! let hints = xfabric::Info { caps: xfabric::FI_MSG, ..Default::default() };
//! let info = xfabric::getinfo(xfabric::fi_version(1, 17), None, None, 0, Some(&hints)).unwrap();
//! let fabric = xfabric::fabric(&info[0].fabric_attr).unwrap();
//! let domain = fabric.domain(&info[0]).unwrap();
//! let ep = domain.endpoint(&info[0]).unwrap();
//! # let _ = ep;
//! ```

use std::sync::Arc;

pub use xfabric_core::*;
pub use xfabric_hmem as hmem;
pub use xfabric_kernels as kernels;
pub use xfabric_providers as providers;
pub use xfabric_xpu_trigger as xpu_trigger;

pub mod hex;

/// The provider used when hints name none.
pub const DEFAULT_PROVIDER: &str = "shm";

/// Every provider this build has.
pub fn provider_list() -> Vec<Arc<dyn Provider>> {
    xfabric_providers::all()
}

/// `fi_getinfo`: every (provider, configuration) that satisfies `hints`, best first. `version`
/// is the API version the caller was written for (`fi_version(1, 17)`); `NoData` says why
/// nothing matched.
pub fn getinfo(
    version: u32,
    node: Option<&str>,
    service: Option<&str>,
    flags: u64,
    hints: Option<&Info>,
) -> Result<Vec<Info>> {
    if version > fi_version(FI_MAJOR_VERSION, FI_MINOR_VERSION) || version < fi_version(1, 0) {
        return Err(Error::NoSys(format!(
            "getinfo: API version {}.{} is not supported (1.0 to {FI_MAJOR_VERSION}.{FI_MINOR_VERSION})",
            version >> 16,
            version & 0xffff
        )));
    }
    xfabric_core::log::init();
    let default = Info::default();
    let hints = hints.unwrap_or(&default);
    let mut out = Vec::new();
    let mut reasons = Vec::new();
    for p in provider_list() {
        match p.getinfo(node, service, flags, hints) {
            Ok(v) => out.extend(v),
            Err(Error::NoData(why)) => reasons.push(why),
            Err(e) => reasons.push(e.to_string()),
        }
    }
    tracing::debug!(
        entries = out.len(),
        node,
        service,
        flags,
        "getinfo: {} answer(s)",
        out.len()
    );
    if out.is_empty() {
        return Err(Error::NoData(format!(
            "getinfo: no provider matches the hints: {}",
            reasons.join("; ")
        )));
    }
    Ok(out)
}

/// `fi_fabric`: opens the fabric `attr` describes (an `Info::fabric_attr` from getinfo).
pub fn fabric(attr: &FabricAttr) -> Result<Fabric> {
    let name = attr.prov_name.as_deref().unwrap_or(DEFAULT_PROVIDER);
    let prov = provider_list()
        .into_iter()
        .find(|p| p.name() == name)
        .ok_or_else(|| Error::NoData(format!("fabric: no provider named {name:?}")))?;
    Fabric::open(prov, attr)
}
