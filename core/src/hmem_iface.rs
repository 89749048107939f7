//! `enum fi_hmem_iface` (fi_domain.h, libfabric 1.17): which software interface owns a piece of
//! memory. Memory registrations (`MrAttr`) and XPU triggers name one; `xfabric-hmem` implements
//! them.
//!
//! Core cannot depend on `xfabric-hmem` (it depends on core), so what core needs of it is the
//! [`HmemOps`] trait: a provider's domain hands one out (`DomainOps::hmem`), and registration
//! checks and the endpoint's staging of device buffers (`crate::hmem_stage`) go through it.

use std::fmt;

use crate::error::Result;

/// A heterogeneous-memory interface: libfabric's `enum fi_hmem_iface`, with the same values.
///
/// xfabric implements `System`, `Cuda` and `Ze`; `Rocr`, `Neuron` and `SynapseAi` are
/// recognised (a registration or hint naming them parses) and reported unsupported.
#[repr(u32)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Iface {
    /// `FI_HMEM_SYSTEM`: host memory.
    #[default]
    System = 0,
    /// `FI_HMEM_CUDA`: NVIDIA CUDA device memory.
    Cuda = 1,
    /// `FI_HMEM_ROCR`: AMD ROCr memory (not supported by xfabric).
    Rocr = 2,
    /// `FI_HMEM_ZE`: oneAPI Level Zero memory.
    Ze = 3,
    /// `FI_HMEM_NEURON`: AWS Neuron memory (not supported by xfabric).
    Neuron = 4,
    /// `FI_HMEM_SYNAPSEAI`: Habana SynapseAI memory (not supported by xfabric).
    SynapseAi = 5,
}

impl Iface {
    /// Every interface libfabric 1.17 defines, in value order.
    pub const ALL: [Iface; 6] = [
        Iface::System,
        Iface::Cuda,
        Iface::Rocr,
        Iface::Ze,
        Iface::Neuron,
        Iface::SynapseAi,
    ];

    /// The C enumerator's name, e.g. `"FI_HMEM_CUDA"`.
    pub fn c_name(self) -> &'static str {
        match self {
            Iface::System => "FI_HMEM_SYSTEM",
            Iface::Cuda => "FI_HMEM_CUDA",
            Iface::Rocr => "FI_HMEM_ROCR",
            Iface::Ze => "FI_HMEM_ZE",
            Iface::Neuron => "FI_HMEM_NEURON",
            Iface::SynapseAi => "FI_HMEM_SYNAPSEAI",
        }
    }

    /// The value of `enum fi_hmem_iface`.
    pub fn as_raw(self) -> u32 {
        self as u32
    }

    /// Parses a raw `enum fi_hmem_iface` value; `None` for values 1.17 does not define.
    pub fn from_raw(raw: u32) -> Option<Iface> {
        Iface::ALL.get(usize::try_from(raw).ok()?).copied()
    }

    /// True for the interfaces xfabric implements (system, CUDA, Level Zero).
    pub fn is_implemented(self) -> bool {
        matches!(self, Iface::System | Iface::Cuda | Iface::Ze)
    }

    /// True for every interface other than host memory.
    pub fn is_device(self) -> bool {
        self != Iface::System
    }
}

impl fmt::Display for Iface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Iface::System => "system",
            Iface::Cuda => "cuda",
            Iface::Rocr => "rocr",
            Iface::Ze => "ze",
            Iface::Neuron => "neuron",
            Iface::SynapseAi => "synapseai",
        })
    }
}

/// Which interface and which of its devices own an address (`fi_mr_attr`'s `iface` and
/// `device`). Device numbers are the interface's own: a CUDA ordinal, an index into the
/// Level Zero driver's device list, 0 for host memory.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash)]
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

    /// True for memory of a device interface.
    pub fn is_device(&self) -> bool {
        self.iface.is_device()
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} device {}", self.iface, self.device)
    }
}

/// What core asks of the heterogeneous-memory layer: is an interface usable, who owns an
/// address, and synchronous copies between host and device memory. `xfabric-hmem` implements
/// it; a provider's domain hands it out through `DomainOps::hmem` when the provider can move
/// device memory.
pub trait HmemOps: Send + Sync {
    /// `Ok` when `iface` is implemented and usable here; otherwise an error naming it and why.
    fn check_iface(&self, iface: Iface) -> Result<()>;

    /// Who owns `addr`: the device interface that claims it, else host memory.
    fn owner(&self, addr: usize) -> Result<Owner>;

    /// Copies `dst.len()` bytes of `owner`'s memory at `src` into `dst`; on return they are
    /// there.
    ///
    /// # Safety
    /// `src` must be `owner`'s memory, valid for `dst.len()` bytes, not written meanwhile.
    unsafe fn copy_to_host(&self, owner: Owner, dst: &mut [u8], src: usize) -> Result<()>;

    /// Copies `src` into `owner`'s memory at `dst`; on return the bytes are in place and
    /// visible to the device (the copy is synchronous: any stream it used is drained).
    ///
    /// # Safety
    /// `dst` must be `owner`'s memory, valid for `src.len()` bytes, not accessed meanwhile.
    unsafe fn copy_from_host(&self, owner: Owner, dst: usize, src: &[u8]) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_round_trip() {
        for (i, iface) in Iface::ALL.iter().enumerate() {
            assert_eq!(iface.as_raw() as usize, i);
            assert_eq!(Iface::from_raw(i as u32), Some(*iface));
        }
        assert_eq!(Iface::from_raw(6), None);
        assert_eq!(Iface::from_raw(u32::MAX), None);
        assert_eq!(Iface::Ze.c_name(), "FI_HMEM_ZE");
        assert_eq!(Iface::Cuda.to_string(), "cuda");
        assert!(Iface::Ze.is_implemented() && !Iface::Rocr.is_implemented());
    }
}
