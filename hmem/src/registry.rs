//! [`Hmem`]: every interface, probed once, with the reasons the unusable ones gave. This is what
//! `xfabric info` prints, what getinfo consults before offering FI_HMEM, and where memory
//! registration asks who owns an address.

use std::fmt;
use std::sync::OnceLock;

use crate::absent::NotImplemented;
use crate::error::Unavailable;
use crate::{Cuda, DeviceInfo, HmemIface, Iface, Owner, Result, System, Ze};

/// All interfaces of libfabric 1.17, each probed once.
#[derive(Debug)]
pub struct Hmem {
    system: System,
    cuda: Cuda,
    ze: Ze,
    rocr: NotImplemented,
    neuron: NotImplemented,
    synapseai: NotImplemented,
}

/// One line of [`Hmem::report`]: an interface and either its devices or why it is unusable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfaceStatus {
    /// The interface.
    pub iface: Iface,
    /// Its devices, or the probe's reason.
    pub status: Result<Vec<DeviceInfo>, Unavailable>,
}

impl fmt::Display for IfaceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.iface.c_name())?;
        match &self.status {
            Ok(devices) => {
                write!(f, "available, {} device(s)", devices.len())?;
                for d in devices {
                    write!(f, "; {}: {}", d.index, d.name)?;
                }
                Ok(())
            }
            Err(u) => write!(f, "unavailable: {}", u.reason),
        }
    }
}

impl Hmem {
    /// Probes every interface now: loads libcuda and the Level Zero loader if present and
    /// initialises them. Never panics; unusable interfaces keep their reason.
    pub fn detect() -> Self {
        Hmem {
            system: System::new(),
            cuda: Cuda::new(),
            ze: Ze::new(),
            rocr: NotImplemented(Iface::Rocr),
            neuron: NotImplemented(Iface::Neuron),
            synapseai: NotImplemented(Iface::SynapseAi),
        }
    }

    /// The process-wide registry, detected on first use.
    pub fn global() -> &'static Hmem {
        static GLOBAL: OnceLock<Hmem> = OnceLock::new();
        GLOBAL.get_or_init(Hmem::detect)
    }

    /// The interface `iface`.
    pub fn get(&self, iface: Iface) -> &dyn HmemIface {
        match iface {
            Iface::System => &self.system,
            Iface::Cuda => &self.cuda,
            Iface::Ze => &self.ze,
            Iface::Rocr => &self.rocr,
            Iface::Neuron => &self.neuron,
            Iface::SynapseAi => &self.synapseai,
        }
    }

    /// The host-memory interface.
    pub fn system(&self) -> &System {
        &self.system
    }

    /// The CUDA interface, with its CUDA-only calls.
    pub fn cuda(&self) -> &Cuda {
        &self.cuda
    }

    /// The Level Zero interface.
    pub fn ze(&self) -> &Ze {
        &self.ze
    }

    /// Every interface with its devices or its reason, in `enum fi_hmem_iface` order.
    pub fn report(&self) -> Vec<IfaceStatus> {
        Iface::ALL
            .iter()
            .map(|&iface| {
                let i = self.get(iface);
                IfaceStatus {
                    iface,
                    status: i.available().map(|()| i.devices()),
                }
            })
            .collect()
    }

    /// Device interfaces usable here. Empty means getinfo must not offer FI_HMEM.
    pub fn device_ifaces(&self) -> Vec<Iface> {
        Iface::ALL
            .into_iter()
            .filter(|&i| i.is_device() && self.get(i).available().is_ok())
            .collect()
    }

    /// Who owns `addr`: the first available device interface that claims it, else host memory.
    pub fn owner(&self, addr: *const u8) -> Result<Owner> {
        for iface in self.device_ifaces() {
            if let Some(owner) = self.get(iface).owns(addr)? {
                return Ok(owner);
            }
        }
        Ok(Owner::SYSTEM)
    }
}
