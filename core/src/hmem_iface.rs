//! `enum fi_hmem_iface` (fi_domain.h, libfabric 1.17): which software interface owns a piece of
//! memory. Memory registrations (`MrAttr`) and XPU triggers name one; `xfabric-hmem` implements
//! them.

use std::fmt;

/// A heterogeneous-memory interface: libfabric's `enum fi_hmem_iface`, with the same values.
///
/// xfabric implements `System`, `Cuda` and `Ze`; `Rocr`, `Neuron` and `SynapseAi` are
/// recognised (a registration or hint naming them parses) and reported unsupported.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Iface {
    /// `FI_HMEM_SYSTEM`: host memory.
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
