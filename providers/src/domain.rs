//! What every provider's domain does alike, written once: refuse an endpoint whose
//! capabilities the provider lacks, move device memory through hmem, take XPU doorbells from
//! xpu-trigger. A provider says only what is its own (`ProviderDomain`): its addresses, how
//! its endpoint opens, and (verbs) the NIC's registration of a region.

use std::sync::Arc;

use xfabric_core::consts::{caps_str, FI_HMEM};
use xfabric_core::info::Info;
use xfabric_core::mr::{MrAttr, ProviderMr};
use xfabric_core::{
    AddrFormat, DomainOps, DoorbellAlloc, EndpointOps, EpCore, Error, HmemOps, Result,
};

use crate::hmem::GlobalHmem;

/// A provider's own part of its domain.
pub(crate) trait ProviderDomain: Send + Sync + 'static {
    /// The provider's name, for messages.
    const NAME: &'static str;
    /// The capabilities its endpoints take (`FI_HMEM` aside).
    const CAPS: u64;
    /// How its addresses are checked and printed.
    fn addr_format(&self) -> Arc<dyn AddrFormat>;
    /// Opens an endpoint (its capabilities already checked).
    fn open(&self, info: &Info, core: Arc<EpCore>) -> Result<Arc<dyn EndpointOps>>;
    /// The provider's own registration of a region (a NIC's); `None`: core's alone.
    ///
    /// # Safety
    /// As `DomainOps::mr_register`: the range stays valid memory while the region lives.
    unsafe fn mr_register(&self, attr: &MrAttr, mr_mode: u32) -> Option<Box<dyn ProviderMr>> {
        let _ = (attr, mr_mode);
        None
    }
    /// Its registrations make NIC keys (`DomainOps::nic_keys`).
    const NIC_KEYS: bool = false;
}

/// A provider's domain: its own part, and the rest every provider shares.
pub(crate) struct Domain<D>(pub D);

impl<D: ProviderDomain> Domain<D> {
    /// The domain as core's object takes it.
    pub fn ops(d: D) -> Arc<dyn DomainOps> {
        Arc::new(Domain(d))
    }
}

impl<D: ProviderDomain> DomainOps for Domain<D> {
    fn addr_format(&self) -> Arc<dyn AddrFormat> {
        self.0.addr_format()
    }

    fn endpoint(&self, info: &Info, core: Arc<EpCore>) -> Result<Arc<dyn EndpointOps>> {
        let extra = info.caps & !(D::CAPS | FI_HMEM);
        if extra != 0 {
            return Err(Error::OpNotSupp(format!(
                "{} endpoint: capabilities {} are not supported",
                D::NAME,
                caps_str(extra)
            )));
        }
        self.0.open(info, core)
    }

    fn hmem(&self) -> Option<Arc<dyn HmemOps>> {
        // Device memory moves through host bounce buffers (core's hmem_stage) on every
        // provider; verbs also registers CUDA regions with the NIC by dma-buf (`verbs::mr`).
        Some(GlobalHmem::ops())
    }

    fn xpu_doorbells(&self) -> Option<Arc<dyn DoorbellAlloc>> {
        Some(xfabric_xpu_trigger::doorbells())
    }

    unsafe fn mr_register(&self, attr: &MrAttr, mr_mode: u32) -> Option<Box<dyn ProviderMr>> {
        // SAFETY: forwarded: the caller keeps the range valid while the region lives.
        unsafe { self.0.mr_register(attr, mr_mode) }
    }

    fn nic_keys(&self) -> bool {
        D::NIC_KEYS
    }
}
