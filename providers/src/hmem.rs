//! The heterogeneous-memory layer providers hand to core (`DomainOps::hmem`): xfabric-hmem's
//! process-wide registry behind core's `HmemOps` hook, and what getinfo may offer with it.

use std::sync::Arc;

use xfabric_core::{Error, HmemOps, Iface, Owner, Result};
use xfabric_hmem::Hmem;

/// `HmemOps` over `Hmem::global()`.
#[derive(Debug, Clone, Copy)]
pub struct GlobalHmem(&'static Hmem);

impl GlobalHmem {
    /// The process-wide registry (probed on first use).
    pub fn get() -> Self {
        GlobalHmem(Hmem::global())
    }

    /// As a core hook.
    pub fn ops() -> Arc<dyn HmemOps> {
        Arc::new(Self::get())
    }

    /// `None` when some device interface is usable (getinfo may offer `FI_HMEM`), else why
    /// not: each interface's reason.
    pub fn no_devices_reason(&self) -> Option<String> {
        if !self.0.device_ifaces().is_empty() {
            return None;
        }
        let why = self
            .0
            .report()
            .into_iter()
            .filter(|s| s.iface.is_device() && s.iface.is_implemented())
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join("; ");
        Some(format!("no device memory interface is available ({why})"))
    }
}

impl HmemOps for GlobalHmem {
    fn check_iface(&self, iface: Iface) -> Result<()> {
        self.0
            .get(iface)
            .available()
            .map_err(|u| Error::NoSys(format!("mr_regattr: {u}")))
    }

    fn owner(&self, addr: usize) -> Result<Owner> {
        Ok(self.0.owner(addr as *const u8)?)
    }

    unsafe fn copy_to_host(&self, owner: Owner, dst: &mut [u8], src: usize) -> Result<()> {
        // SAFETY: forwarded contract.
        Ok(unsafe {
            self.0
                .get(owner.iface)
                .copy_to_host(owner.device, dst, src as *const u8)
        }?)
    }

    unsafe fn copy_from_host(&self, owner: Owner, dst: usize, src: &[u8]) -> Result<()> {
        // SAFETY: forwarded contract; every interface's copy_from_host is synchronous.
        Ok(unsafe {
            self.0
                .get(owner.iface)
                .copy_from_host(owner.device, dst as *mut u8, src)
        }?)
    }
}
