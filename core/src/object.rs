//! Fabric and domain, and the traits a provider implements to plug into them. A provider says
//! what it offers (`Provider::info`), opens its domain state (`DomainOps`) and its endpoints
//! (`EndpointOps`); queues, counters, AVs, MRs, event queues and auto progress come from here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::av::{AddrFormat, AddressVector, AvAttr};
use crate::cntr::{CntrAttr, Counter};
use crate::consts::*;
use crate::cq::{CompletionQueue, CqAttr};
use crate::ep::{Endpoint, EndpointOps, EpCore};
use crate::eq::{EqAttr, EventQueue};
use crate::error::{Error, Result};
use crate::hmem_iface::{HmemOps, Owner};
use crate::info::{FabricAttr, Info};
use crate::mr::{MemoryRegion, MrAttr, MrMap, ProviderMr};
use crate::trigger::{DomainWork, DoorbellAlloc};
use crate::wait::{ProgressList, WaitAttr, WaitSet};

pub use crate::tag::DomainTag;

/// A provider: a transport and the description of what it can do.
pub trait Provider: Send + Sync + 'static {
    /// Short name (`shm`).
    fn name(&self) -> &'static str;
    /// Provider version, `FI_VERSION(major, minor)`.
    fn version(&self) -> u32;
    /// Everything it offers, most capable first.
    fn info(&self) -> Vec<Info>;
    /// `fi_getinfo` for this provider: its descriptions narrowed to the hints.
    fn getinfo(
        &self,
        node: Option<&str>,
        service: Option<&str>,
        flags: u64,
        hints: &Info,
    ) -> Result<Vec<Info>> {
        let _ = (node, service, flags);
        Info::fit_each(self.name(), self.info(), hints)
    }
    /// Opens the provider's per-domain state.
    fn domain(&self, info: &Info) -> Result<Arc<dyn DomainOps>>;
}

/// A provider's per-domain state.
pub trait DomainOps: Send + Sync {
    /// How this provider's addresses are checked and printed.
    fn addr_format(&self) -> Arc<dyn AddrFormat>;
    /// Opens the transport half of an endpoint.
    fn endpoint(&self, info: &Info, core: Arc<EpCore>) -> Result<Arc<dyn EndpointOps>>;
    /// The heterogeneous-memory layer this provider moves device memory with; `None` (the
    /// default): host memory only, and registering device memory fails.
    fn hmem(&self) -> Option<Arc<dyn HmemOps>> {
        None
    }

    /// Where XPU-triggered operations' doorbells come from; `None` if this provider offers
    /// no `FI_XPU_TRIGGER`.
    fn xpu_doorbells(&self) -> Option<Arc<dyn DoorbellAlloc>> {
        None
    }

    /// `fi_mr_reg` is registering `attr` (checked; `mr_mode` is the domain's): the
    /// provider's own registration of it (a NIC's), whose key becomes the region's and which
    /// is dropped when the region closes; `None` (the default): the region is core's alone.
    ///
    /// # Safety
    /// As `Domain::mr_regattr`: the range stays valid memory while the region lives.
    unsafe fn mr_register(&self, attr: &MrAttr, mr_mode: u32) -> Option<Box<dyn ProviderMr>> {
        let _ = (attr, mr_mode);
        None
    }

    /// Whether this provider's registrations make NIC keys (`mr::NIC_KEY_TAG`), which its
    /// peers tell apart by that tag alone: the domain then draws no key of that space, nor
    /// takes one from the application. The default: no.
    fn nic_keys(&self) -> bool {
        false
    }
}

/// `fid_fabric`.
#[derive(Clone)]
pub struct Fabric {
    inner: Arc<FabricInner>,
}

struct FabricInner {
    attr: FabricAttr,
    prov: Arc<dyn Provider>,
}

impl Fabric {
    /// `fi_fabric`: opens the fabric described by `attr` on `prov`.
    pub fn open(prov: Arc<dyn Provider>, attr: &FabricAttr) -> Result<Self> {
        crate::log::init();
        if let Some(p) = attr.prov_name.as_deref() {
            if p != prov.name() {
                return Err(Error::Inval(format!(
                    "fabric: attributes name provider {p:?}, opened on {:?}",
                    prov.name()
                )));
            }
        }
        let mut attr = attr.clone();
        attr.prov_name = Some(prov.name().to_string());
        attr.prov_version = prov.version();
        Ok(Fabric {
            inner: Arc::new(FabricInner { attr, prov }),
        })
    }

    /// The fabric's attributes.
    pub fn attr(&self) -> &FabricAttr {
        &self.inner.attr
    }

    /// `fi_domain`.
    pub fn domain(&self, info: &Info) -> Result<Domain> {
        if info.provider() != self.inner.prov.name() {
            return Err(Error::Inval(format!(
                "domain: info is for provider {:?}, fabric is {:?}",
                info.provider(),
                self.inner.prov.name()
            )));
        }
        let ops = self.inner.prov.domain(info)?;
        let progress = Arc::new(ProgressList::default());
        let auto = if info.domain_attr.data_progress == Progress::Auto {
            Some(AutoProgress::start(Arc::downgrade(&progress)))
        } else {
            None
        };
        let nic_keys = ops.nic_keys();
        // Asked for once: registrations and FI_HMEM endpoints consult it.
        let hmem = if info.caps & FI_HMEM != 0 {
            Some(ops.hmem().ok_or_else(|| {
                Error::NoSys(format!(
                    "domain: FI_HMEM requested, but provider {} moves host memory only",
                    info.provider()
                ))
            })?)
        } else {
            None
        };
        Ok(Domain {
            inner: Arc::new(DomainInner {
                fabric: self.clone(),
                info: info.clone(),
                hmem,
                ops,
                mr: Arc::new(MrMap::new(mr_mode_bits(info.domain_attr.mr_mode)).nic_keys(nic_keys)),
                progress,
                work: DomainWork::default(),
                retired: Arc::default(),
                _auto: auto,
            }),
        })
    }

    /// `fi_eq_open`.
    pub fn eq_open(&self, attr: &EqAttr) -> Result<EventQueue> {
        EventQueue::open(attr)
    }

    /// `fi_wait_open`.
    pub fn wait_open(&self, attr: &WaitAttr) -> Result<WaitSet> {
        WaitSet::open(attr)
    }
}

/// `fid_domain`.
#[derive(Clone)]
pub struct Domain {
    inner: Arc<DomainInner>,
}

struct DomainInner {
    fabric: Fabric,
    info: Info,
    ops: Arc<dyn DomainOps>,
    /// The provider's heterogeneous-memory layer, when the domain was opened with FI_HMEM.
    hmem: Option<Arc<dyn HmemOps>>,
    mr: Arc<MrMap>,
    progress: Arc<ProgressList>,
    /// Deferred work queued on this domain (released when it closes).
    work: DomainWork,
    /// The device API's shared blocks of objects closed in this domain (`xpu::Retired`).
    retired: Arc<crate::xpu::Retired>,
    _auto: Option<AutoProgress>,
}

impl Domain {
    /// The fabric this domain belongs to.
    pub fn fabric(&self) -> &Fabric {
        &self.inner.fabric
    }

    /// The domain's number in this process (what errors about mixed domains name).
    pub fn id(&self) -> u64 {
        self.inner.work.domain_id()
    }

    /// The info the domain was opened with.
    pub fn info(&self) -> &Info {
        &self.inner.info
    }

    /// Where the device API's shared blocks for GPU XPUs come from (the provider's doorbell
    /// source), for the CQs and counters opened here.
    fn xpu_memory(&self) -> Option<Arc<dyn crate::xpu::XpuMemAlloc>> {
        self.inner.ops.xpu_doorbells().and_then(|d| d.memory())
    }

    /// `fi_cq_open`.
    pub fn cq_open(&self, attr: &CqAttr) -> Result<CompletionQueue> {
        let cq = CompletionQueue::open(attr)?;
        cq.inner().domain.set(self.id());
        let _ = cq.inner().retired.set(self.inner.retired.clone());
        if let Some(m) = self.xpu_memory() {
            let _ = cq.inner().xpu_mem.set(m);
        }
        Ok(cq)
    }

    /// `fi_poll_open`.
    pub fn poll_open(&self, attr: &crate::poll::PollAttr) -> Result<crate::poll::PollSet> {
        crate::poll::PollSet::open(attr)
    }

    /// `fi_cntr_open`.
    pub fn cntr_open(&self, attr: &CntrAttr) -> Result<Counter> {
        let c = Counter::open(attr)?;
        c.inner().domain.set(self.id());
        let _ = c.inner().retired.set(self.inner.retired.clone());
        if let Some(m) = self.xpu_memory() {
            let _ = c.inner().xpu_mem.set(m);
        }
        Ok(c)
    }

    /// `fi_av_open`.
    pub fn av_open(&self, attr: &AvAttr) -> Result<AddressVector> {
        let mut attr = attr.clone();
        if attr.av_type == AvType::Unspec {
            attr.av_type = self.inner.info.domain_attr.av_type;
        }
        let av = AddressVector::open(&attr, self.inner.ops.addr_format())?;
        av.inner().domain.set(self.id());
        if self.inner.info.addr_format == FI_ADDR_STR {
            av.take_strings();
        }
        Ok(av)
    }

    /// `fi_mr_regattr`: registers host memory, or device memory named by `attr.iface` and
    /// `attr.device` (the domain needs `FI_HMEM` for that). With `FI_HMEM` the memory's owner
    /// is looked up and must be what `attr` names. `flags` may be `FI_HMEM_DEVICE_ONLY` (the
    /// memory is a device allocation) or `FI_HMEM_HOST_ALLOC` (it is host memory allocated
    /// through `attr.iface`; `attr.device` is ignored), as fi_mr(3) defines them.
    ///
    /// # Safety
    /// The range must stay valid memory for as long as the region is registered, because peers
    /// given its key may read or write it (per its access flags) at any time until then.
    pub unsafe fn mr_regattr(&self, attr: &MrAttr, flags: u64) -> Result<MemoryRegion> {
        const HMEM_FLAGS: u64 = FI_HMEM_DEVICE_ONLY | FI_HMEM_HOST_ALLOC;
        // fi_mr(3): FI_RMA_EVENT and FI_RMA_PMEM "may be specified to any memory
        // registration call"; no domain here asks for FI_MR_RMA_EVENT, so they change nothing.
        let flags = flags & !(FI_RMA_EVENT | FI_RMA_PMEM);
        if flags & !HMEM_FLAGS != 0 || flags == HMEM_FLAGS {
            return Err(Error::BadFlags(format!(
                "mr_regattr: flags {flags:#x}; only one of FI_HMEM_DEVICE_ONLY and \
                 FI_HMEM_HOST_ALLOC is supported"
            )));
        }
        let attr = self.check_owner(attr, flags)?;
        let mode = mr_mode_bits(self.inner.info.domain_attr.mr_mode);
        // SAFETY: forwarded: the caller keeps the range valid while the region lives.
        let prov = unsafe { self.inner.ops.mr_register(&attr, mode) };
        MemoryRegion::register_with(&self.inner.mr, &attr, prov)
    }

    /// Checks a registration's (iface, device) against the domain's capabilities and against
    /// who owns the memory; returns the attributes to register.
    fn check_owner(&self, attr: &MrAttr, flags: u64) -> Result<MrAttr> {
        let mut attr = attr.clone();
        let host_alloc = flags & FI_HMEM_HOST_ALLOC != 0;
        if host_alloc {
            attr.device = 0;
        }
        if !attr.iface.is_implemented() {
            return Err(Error::NoSys(format!(
                "mr_regattr: iface {} is not implemented by xfabric",
                attr.iface.c_name()
            )));
        }
        let Some(hmem) = &self.inner.hmem else {
            if attr.iface.is_device() || flags != 0 {
                return Err(Error::OpNotSupp(format!(
                    "mr_regattr: iface {} device {} given, but the domain was opened without \
                     FI_HMEM",
                    attr.iface, attr.device
                )));
            }
            // Host memory in a host-only domain: no owner lookup on this path.
            return Ok(attr);
        };
        hmem.check_iface(attr.iface)?;
        if attr.len == 0 {
            return Ok(attr);
        }
        let found = hmem.owner(attr.addr)?;
        let named = if host_alloc {
            Owner::SYSTEM
        } else {
            attr.owner()
        };
        let what = |o: Owner| {
            if o.is_device() {
                format!("{o} memory")
            } else {
                "host memory".to_string()
            }
        };
        if found != named {
            return Err(Error::Inval(format!(
                "mr_regattr: iface {} device {} given{}, but {:#x} is {}",
                attr.iface,
                attr.device,
                if host_alloc {
                    " (FI_HMEM_HOST_ALLOC)"
                } else {
                    ""
                },
                attr.addr,
                what(found)
            )));
        }
        if flags & FI_HMEM_DEVICE_ONLY != 0 && !found.is_device() {
            return Err(Error::Inval(format!(
                "mr_regattr: FI_HMEM_DEVICE_ONLY given, but {:#x} is host memory",
                attr.addr
            )));
        }
        Ok(attr)
    }

    /// The heterogeneous-memory layer, when the domain was opened with `FI_HMEM`.
    pub fn hmem(&self) -> Option<&Arc<dyn HmemOps>> {
        self.inner.hmem.as_ref()
    }

    /// `fi_mr_reg` for a buffer.
    ///
    /// # Safety
    /// As `mr_regattr`: `buf` must outlive the registration.
    pub unsafe fn mr_reg(
        &self,
        buf: &[u8],
        access: u64,
        offset: u64,
        requested_key: u64,
    ) -> Result<MemoryRegion> {
        let attr = MrAttr {
            addr: buf.as_ptr() as usize,
            len: buf.len(),
            access,
            offset,
            requested_key,
            ..Default::default()
        };
        // SAFETY: forwarded contract.
        unsafe { self.mr_regattr(&attr, 0) }
    }

    /// The domain's deferred work queue.
    pub(crate) fn work(&self) -> &DomainWork {
        &self.inner.work
    }

    /// The domain's key map, for providers checking remote access.
    pub fn mr_map(&self) -> &Arc<MrMap> {
        &self.inner.mr
    }

    /// `fi_endpoint`: an endpoint opened from `info` (an entry getinfo returned).
    pub fn endpoint(&self, info: &Info) -> Result<Endpoint> {
        let dom = &self.inner.info;
        if info.provider() != dom.provider() {
            return Err(Error::Inval(format!(
                "endpoint: info is for provider {:?}, domain is {:?}",
                info.provider(),
                dom.provider()
            )));
        }
        if info.ep_attr.ep_type != EpType::Rdm && info.ep_attr.ep_type != EpType::Unspec {
            return Err(Error::OpNotSupp(format!(
                "endpoint: type {} (only FI_EP_RDM)",
                info.ep_attr.ep_type.c_name()
            )));
        }
        let doorbells = if info.caps & FI_XPU_TRIGGER != 0 {
            if info.caps & FI_TRIGGER == 0 {
                return Err(Error::Inval(
                    "endpoint: FI_XPU_TRIGGER needs FI_TRIGGER as well (fi_trigger(3))".into(),
                ));
            }
            Some(self.inner.ops.xpu_doorbells().ok_or_else(|| {
                Error::OpNotSupp(format!(
                    "endpoint: provider {:?} offers no FI_XPU_TRIGGER",
                    dom.provider()
                ))
            })?)
        } else {
            None
        };
        if info.caps & FI_HMEM != 0 && self.inner.hmem.is_none() {
            return Err(Error::OpNotSupp(
                "endpoint: FI_HMEM requested, but the domain was opened without it".into(),
            ));
        }
        let mut core = EpCore::new(info, self.inner.mr.clone());
        core.hmem = self.inner.hmem.clone();
        core.domain = self.id();
        core.retired = self.inner.retired.clone();
        let core = Arc::new(core);
        let ops = self.inner.ops.endpoint(info, core.clone())?;
        Ok(Endpoint::new(
            core,
            ops,
            self.inner.progress.clone(),
            doorbells,
        ))
    }
}

/// Longest sleep of an idle auto-progress thread: a peer's message rings the doorbell and ends
/// it at once; the timeout only paces housekeeping (looking for dead peers).
const IDLE_SLEEP: Duration = Duration::from_millis(100);

/// The auto-progress thread of a domain: drives every enabled endpoint, spinning briefly after
/// work, then yielding, then sleeping on the provider's doorbell so an idle process costs nothing.
struct AutoProgress {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl AutoProgress {
    fn start(list: Weak<ProgressList>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::Builder::new()
            .name("xfabric-progress".into())
            .spawn(move || {
                let mut idle = 0u32;
                while !s.load(Ordering::Acquire) {
                    let Some(l) = list.upgrade() else { break };
                    if l.run() > 0 {
                        idle = 0;
                        continue;
                    }
                    idle += 1;
                    if idle < 2048 {
                        std::hint::spin_loop();
                    } else if idle < 2048 + 64 {
                        std::thread::yield_now();
                    } else {
                        l.idle_wait(IDLE_SLEEP);
                    }
                }
            })
            .ok();
        AutoProgress { stop, handle }
    }
}

impl Drop for AutoProgress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
