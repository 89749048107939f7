//! Interfaces that exist in `enum fi_hmem_iface` but have no code behind them in this build:
//! ones xfabric does not implement (ROCr, Neuron, SynapseAI) and ones whose cargo feature was
//! off at build time (CUDA without `cuda`, Level Zero without `ze`). An application naming
//! one still compiles and gets a typed error at run time; one implementation of "every call
//! says no" serves all of them.

use std::fmt::Debug;

use crate::error::{HmemError, Unavailable};
use crate::mem::{DeviceBuffer, HostMapped, IpcHandle, IpcMapping};
use crate::{DeviceInfo, HmemIface, Iface, Owner, Result};

mod sealed {
    /// An interface with no code behind it: what it is and what every call answers.
    pub trait Absent: Send + Sync + std::fmt::Debug {
        /// The interface.
        fn iface(&self) -> crate::Iface;
        /// What every operation answers.
        fn error(&self) -> crate::HmemError;
    }
}
pub(crate) use sealed::Absent;

/// An interface libfabric defines and xfabric does not implement (ROCr, Neuron, SynapseAI):
/// always unavailable, every operation says so.
#[derive(Debug)]
pub struct NotImplemented(pub Iface);

impl Absent for NotImplemented {
    fn iface(&self) -> Iface {
        self.0
    }

    fn error(&self) -> HmemError {
        HmemError::Unavailable(Unavailable {
            iface: self.0,
            reason: format!("xfabric does not implement {}", self.0.c_name()),
        })
    }
}

/// An interface whose cargo feature was off when xfabric-hmem was built.
// Compiled in every build so that its answers are tested in every build (below); only a
// build missing a feature uses it.
#[cfg_attr(all(feature = "cuda", feature = "ze"), allow(dead_code))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct NotBuilt {
    pub(crate) iface: Iface,
    pub(crate) support: &'static str,
    pub(crate) feature: &'static str,
}

impl Absent for NotBuilt {
    fn iface(&self) -> Iface {
        self.iface
    }

    fn error(&self) -> HmemError {
        HmemError::NotBuilt {
            iface: self.iface,
            support: self.support,
            feature: self.feature,
        }
    }
}

impl<T: Absent> HmemIface for T {
    fn iface(&self) -> Iface {
        Absent::iface(self)
    }

    fn available(&self) -> Result<(), Unavailable> {
        Err(match self.error() {
            HmemError::Unavailable(u) => u,
            // `xfabric info` prints the reason after "unavailable: ".
            HmemError::NotBuilt {
                support, feature, ..
            } => Unavailable {
                iface: Absent::iface(self),
                reason: format!("built without {support} support (feature `{feature}`)"),
            },
            e => Unavailable {
                iface: Absent::iface(self),
                reason: e.to_string(),
            },
        })
    }

    fn devices(&self) -> Vec<DeviceInfo> {
        Vec::new()
    }

    fn dmabuf(&self, _addr: *const u8, _len: usize) -> Result<crate::Dmabuf> {
        Err(self.error())
    }

    fn owns(&self, _addr: *const u8) -> Result<Option<Owner>> {
        Err(self.error())
    }

    unsafe fn copy_from_host(&self, _device: u64, _dst: *mut u8, _src: &[u8]) -> Result<()> {
        Err(self.error())
    }

    unsafe fn copy_to_host(&self, _device: u64, _dst: &mut [u8], _src: *const u8) -> Result<()> {
        Err(self.error())
    }

    unsafe fn host_register(&self, _addr: *mut u8, _len: usize) -> Result<()> {
        Err(self.error())
    }

    unsafe fn host_unregister(&self, _addr: *mut u8) -> Result<()> {
        Err(self.error())
    }

    fn alloc_host_mapped(&self, _device: u64, _len: usize) -> Result<HostMapped> {
        Err(self.error())
    }

    fn alloc_device(&self, _device: u64, _len: usize) -> Result<DeviceBuffer> {
        Err(self.error())
    }

    fn ipc_get(&self, _addr: *const u8, _len: usize) -> Result<IpcHandle> {
        Err(self.error())
    }

    fn ipc_open(&self, _device: u64, _handle: &IpcHandle) -> Result<IpcMapping> {
        Err(self.error())
    }

    fn alloc_device_vmm(
        &self,
        _device: u64,
        _len: usize,
        _shareable: bool,
    ) -> Result<DeviceBuffer> {
        Err(self.error())
    }

    fn vmm_export(
        &self,
        _addr: *const u8,
        _len: usize,
    ) -> Result<(IpcHandle, std::os::fd::OwnedFd)> {
        Err(self.error())
    }

    fn vmm_open(
        &self,
        _device: u64,
        _handle: &IpcHandle,
        _fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<IpcMapping> {
        Err(self.error())
    }

    fn take_drop_errors(&self) -> Vec<HmemError> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfabric_core::consts::errno::FI_ENOSYS;

    /// What every call of an interface left out of the build answers: the typed error naming
    /// the feature, never a panic, an empty device list, and "unavailable" with the reason.
    pub(crate) fn assert_not_built(i: &dyn HmemIface, iface: Iface, support: &str, feature: &str) {
        let text = format!("built without {support} support (feature `{feature}`)");
        let u = i.available().unwrap_err();
        assert_eq!((u.iface, u.reason.as_str()), (iface, text.as_str()));
        assert!(i.devices().is_empty());
        let check = |e: HmemError| {
            assert!(
                matches!(e, HmemError::NotBuilt { iface: i, support: s, feature: f }
                    if i == iface && s == support && f == feature),
                "{e:?}"
            );
            assert_eq!(e.errno(), FI_ENOSYS);
            assert_eq!(
                e.to_string(),
                format!("{} is unavailable: {text}", iface.c_name())
            );
            assert!(
                matches!(xfabric_core::Error::from(e), xfabric_core::Error::NoSys(m) if m.contains(&text))
            );
        };
        let host = [0u8; 8];
        let mut back = [0u8; 8];
        check(i.owns(host.as_ptr()).unwrap_err());
        check(i.alloc_device(0, 64).unwrap_err());
        check(i.alloc_host_mapped(0, 64).unwrap_err());
        check(i.ipc_get(host.as_ptr(), 8).unwrap_err());
        // SAFETY: the calls are refused before any memory is touched.
        unsafe {
            check(i.copy_from_host(0, back.as_mut_ptr(), &host).unwrap_err());
            check(i.copy_to_host(0, &mut back, host.as_ptr()).unwrap_err());
            check(i.host_register(back.as_mut_ptr(), 8).unwrap_err());
            check(i.host_unregister(back.as_mut_ptr()).unwrap_err());
        }
        assert!(i.take_drop_errors().is_empty());
    }

    #[test]
    fn a_left_out_interface_answers_not_built() {
        let off = NotBuilt {
            iface: Iface::Cuda,
            support: "CUDA",
            feature: "cuda",
        };
        assert_not_built(&off, Iface::Cuda, "CUDA", "cuda");
    }

    #[test]
    fn an_unimplemented_interface_is_unavailable() {
        let r = NotImplemented(Iface::Rocr);
        let u = r.available().unwrap_err();
        assert_eq!(u.reason, "xfabric does not implement FI_HMEM_ROCR");
        assert!(matches!(r.alloc_device(0, 8), Err(HmemError::Unavailable(x)) if x == u));
    }

    /// The registry of a build without `cuda` answers for CUDA with the typed error.
    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_build_without_cuda_says_so() {
        let h = crate::Hmem::detect();
        assert_not_built(h.get(Iface::Cuda), Iface::Cuda, "CUDA", "cuda");
        assert_not_built(h.cuda(), Iface::Cuda, "CUDA", "cuda");
        assert_eq!(h.cuda().driver_version(), None);
        assert!(!h.device_ifaces().contains(&Iface::Cuda));
    }

    /// The registry of a build without `ze` answers for Level Zero with the typed error.
    #[cfg(not(feature = "ze"))]
    #[test]
    fn a_build_without_ze_says_so() {
        let h = crate::Hmem::detect();
        assert_not_built(h.get(Iface::Ze), Iface::Ze, "Level Zero", "ze");
        assert!(!h.device_ifaces().contains(&Iface::Ze));
    }
}
