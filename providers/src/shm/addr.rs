//! shm addresses: `fi_shm://` and an endpoint's segment name (`FI_ADDR_STR`), checked so that
//! a name from outside can only ever name an xfabric segment, never a path.

use xfabric_core::av::AddrFormat;
use xfabric_core::{Error, Result};

use super::segment;

/// Every shm address starts with this, followed by the endpoint's segment name.
pub const ADDR_PREFIX: &str = "fi_shm://";

/// The AV's view of shm addresses.
pub(super) struct ShmAddr;

impl AddrFormat for ShmAddr {
    fn validate(&self, addr: &[u8]) -> Result<()> {
        seg_name(addr).map(|_| ())
    }

    fn to_string(&self, addr: &[u8]) -> String {
        String::from_utf8_lossy(addr)
            .trim_end_matches('\0')
            .to_string()
    }

    fn canonical(&self, addr: &[u8]) -> Vec<u8> {
        let end = addr.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        addr[..end].to_vec()
    }
}

/// The segment name an shm address names, checked: an xfabric segment's name, never a path.
pub(crate) fn seg_name(raw: &[u8]) -> Result<String> {
    let s =
        std::str::from_utf8(raw).map_err(|_| Error::Inval("shm address is not UTF-8".into()))?;
    let s = s.trim_end_matches('\0');
    let name = s.strip_prefix(ADDR_PREFIX).ok_or_else(|| {
        Error::Inval(format!(
            "shm address {s:?} does not start with {ADDR_PREFIX}"
        ))
    })?;
    if !name.starts_with(segment::PREFIX) || name.contains('/') || name.len() > 200 {
        return Err(Error::Inval(format!(
            "shm address {s:?} does not name an xfabric segment"
        )));
    }
    Ok(name.to_string())
}
