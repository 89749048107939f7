//! A provider that moves no bytes, for testing triggered operations in one process: it
//! records every operation it is handed, can refuse the next few with `Again`, completes
//! transfers at once when asked to, and keeps posted receives for the test to complete (or
//! cancel). `FakeHmem` (`crate::hmem_fake`) plays a device whose memory is host memory, for
//! `FI_HMEM` endpoints.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::av::{AddrFormat, AvAttr};
use crate::cntr::Counter;
use crate::consts::*;
use crate::cq::{CompletionQueue, CqAttr};
use crate::entry::{Context, CqErrEntry, CqTaggedEntry};
use crate::ep::atomic::AtomicReq;
use crate::ep::rma::RmaOp;
use crate::ep::{Endpoint, EndpointOps, EpCore, Msg, TxOp};
use crate::error::{Error, Result};
pub use crate::hmem_fake::FakeHmem;
use crate::hmem_iface::{HmemOps, Iface};
use crate::info::{FabricAttr, Info};
use crate::object::{Domain, DomainOps, Fabric, Provider};
use crate::rxq::{PostedRecv, RawIov, RecvSlot};
use crate::trigger::{Doorbell, DoorbellAlloc, Xpu};
use crate::wait::ProgressSource;
use crate::xpu::{XpuMem, XpuMemAlloc};

/// What the provider was handed, in order: (kind, context).
#[derive(Default)]
pub struct Shared {
    pub log: Mutex<Vec<(char, Context)>>,
    /// Refuse this many more operations with `Again`.
    pub again: AtomicUsize,
    /// Complete sends, RMA and atomics during the call.
    pub inline: AtomicBool,
    pub recvs: Mutex<Vec<(Arc<EpCore>, PostedRecv)>>,
    /// Keep a copy of each send's bytes in `sent` (only for tests whose buffers are live
    /// whenever a send starts).
    pub keep_data: AtomicBool,
    pub sent: Mutex<Vec<(Context, Vec<u8>)>>,
    /// Run once by the next operation's start, before it is taken or refused (a start that
    /// takes long: tests of what happens meanwhile).
    pub gate: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
}

impl Shared {
    pub fn ctxs(&self) -> Vec<Context> {
        self.log.lock().unwrap().iter().map(|e| e.1).collect()
    }

    /// Completes the oldest posted receive with `len` bytes.
    pub fn deliver(&self, len: usize) {
        self.deliver_posted(len, |_| {});
    }

    /// Writes `data` into the oldest posted receive's memory and completes it.
    pub fn deliver_data(&self, data: &[u8]) {
        // SAFETY: the receive's memory is writable until it completes (the posting contract).
        self.deliver_posted(data.len(), |r| unsafe {
            r.iov.copy_in(0, data);
        });
    }

    fn deliver_posted(&self, len: usize, fill: impl FnOnce(&PostedRecv)) {
        let (core, r) = self.recvs.lock().unwrap().remove(0);
        fill(&r);
        let slot = RecvSlot {
            ctx: r.ctx,
            iov: r.iov,
            flags: FI_RECV | (r.flags & (FI_MSG | FI_TAGGED)),
            op_flags: r.flags,
        };
        core.complete_rx(&slot, len, 0, r.tag, None, FI_ADDR_NOTAVAIL, Vec::new);
    }
}

struct MockEp {
    core: Arc<EpCore>,
    sh: Arc<Shared>,
}

impl MockEp {
    fn take(&self, kind: char, ctx: Context) -> Result<()> {
        let gate = self
            .sh
            .gate
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(g) = gate {
            g();
        }
        let refuse = self
            .sh
            .again
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if refuse {
            return Err(Error::Again("mock: full"));
        }
        self.sh.log.lock().unwrap().push((kind, ctx));
        Ok(())
    }

    fn done(&self, ctx: Context, flags: u64) {
        if self.sh.inline.load(Ordering::Acquire) {
            self.core.complete_tx(ctx, flags);
        }
    }
}

impl ProgressSource for MockEp {
    fn progress(&self) -> usize {
        0
    }
}

impl EndpointOps for MockEp {
    fn enable(&self) -> Result<()> {
        Ok(())
    }
    fn name(&self) -> Vec<u8> {
        b"mock".to_vec()
    }
    unsafe fn send(&self, op: &TxOp) -> Result<()> {
        self.take('s', op.ctx)?;
        if self.sh.keep_data.load(Ordering::Acquire) {
            let mut data = vec![0u8; op.iov.total()];
            // SAFETY: the send's memory is readable (the posting contract); `keep_data` tests
            // keep their buffers alive.
            unsafe { op.iov.copy_out(0, &mut data) };
            self.sh.sent.lock().unwrap().push((op.ctx, data));
        }
        self.done(op.ctx, op.flags);
        Ok(())
    }
    unsafe fn recv(&self, r: PostedRecv) -> Result<()> {
        self.take('r', r.ctx)?;
        self.sh.recvs.lock().unwrap().push((self.core.clone(), r));
        Ok(())
    }
    unsafe fn rma(&self, op: &RmaOp) -> Result<()> {
        self.take('m', op.ctx)?;
        self.done(op.ctx, op.flags);
        Ok(())
    }
    unsafe fn atomic(&self, req: &AtomicReq) -> Result<()> {
        self.take('a', req.ctx)?;
        if self.sh.keep_data.load(Ordering::Acquire) {
            let n = req.bytes();
            let mut data = vec![0u8; n];
            // SAFETY: the operand is readable (the posting contract); `keep_data` tests keep
            // their buffers alive. A fetch's result is written with the operand's bytes
            // reversed, as a target's original values would be.
            unsafe {
                std::ptr::copy_nonoverlapping(req.operand as *const u8, data.as_mut_ptr(), n);
                if req.result != 0 {
                    let back: Vec<u8> = data.iter().rev().copied().collect();
                    std::ptr::copy_nonoverlapping(back.as_ptr(), req.result as *mut u8, n);
                }
            }
            self.sh.sent.lock().unwrap().push((req.ctx, data));
        }
        self.done(req.ctx, req.flags);
        Ok(())
    }
    fn cancel(&self, ctx: Context) -> Result<()> {
        let found = {
            let mut rs = self.sh.recvs.lock().unwrap();
            let i = rs.iter().position(|(_, r)| r.ctx == ctx);
            i.map(|i| rs.remove(i).1)
        };
        let r =
            found.ok_or_else(|| Error::NoEntry(format!("mock: nothing with context {ctx:#x}")))?;
        let flags = FI_RECV | (r.flags & (FI_MSG | FI_TAGGED));
        self.core
            .fail_rx(r.ctx, flags, r.tag, crate::consts::errno::FI_ECANCELED);
        Ok(())
    }
    fn setopt(&self, _name: i32, _value: usize) -> Result<()> {
        Ok(())
    }
    fn close(&self) {}
}

struct MockAddr;

impl AddrFormat for MockAddr {
    fn validate(&self, _addr: &[u8]) -> Result<()> {
        Ok(())
    }
    fn to_string(&self, addr: &[u8]) -> String {
        format!("{addr:?}")
    }
}

struct MockDom(Arc<Shared>, Option<Arc<dyn HmemOps>>);

impl DomainOps for MockDom {
    fn addr_format(&self) -> Arc<dyn AddrFormat> {
        Arc::new(MockAddr)
    }
    fn endpoint(&self, _info: &Info, core: Arc<EpCore>) -> Result<Arc<dyn EndpointOps>> {
        Ok(Arc::new(MockEp {
            core,
            sh: self.0.clone(),
        }))
    }
    fn xpu_doorbells(&self) -> Option<Arc<dyn DoorbellAlloc>> {
        Some(Arc::new(HeapBells))
    }
    fn hmem(&self) -> Option<Arc<dyn HmemOps>> {
        self.1.clone()
    }
}

/// A message over `iov` to any peer, with context `ctx`.
pub fn msg(iov: &[RawIov], ctx: Context) -> Msg<'_> {
    Msg {
        iov,
        desc: &[],
        addr: FI_ADDR_UNSPEC,
        context: ctx,
        data: 0,
        tag: 0,
        ignore: 0,
    }
}

/// Doorbells in plain heap memory, for CPU XPUs `System` devices 0 and 1.
struct HeapBells;

struct HeapBell(Box<AtomicU64>);

impl Doorbell for HeapBell {
    fn word(&self) -> &AtomicU64 {
        &self.0
    }
    fn xpu_addr(&self) -> usize {
        &*self.0 as *const AtomicU64 as usize
    }
}

/// The mock's GPU: CUDA device 1 (device 0 stays refused, as on a machine without one), whose
/// shared blocks are heap memory at device addresses `FAKE_DEVICE_OFFSET` above the host's:
/// what follows a device address from the host reads nothing of it.
pub const FAKE_GPU: Xpu = Xpu {
    iface: Iface::Cuda,
    device: 1,
};

/// How far the mock GPU's device addresses lie from the host's.
pub const FAKE_DEVICE_OFFSET: u64 = 1 << 60;

impl DoorbellAlloc for HeapBells {
    fn check(&self, xpu: Xpu) -> Result<()> {
        if (xpu.iface == Iface::System && xpu.device < 2) || xpu == FAKE_GPU {
            Ok(())
        } else {
            Err(Error::OpNotSupp(format!("mock: no XPU {xpu:?}")))
        }
    }
    fn alloc(&self, _xpu: Xpu) -> Result<Box<dyn Doorbell>> {
        Ok(Box::new(HeapBell(Box::default())))
    }
    fn memory(&self) -> Option<Arc<dyn XpuMemAlloc>> {
        Some(Arc::new(FakeGpuMem))
    }
}

/// The mock GPU's shared blocks (`FAKE_GPU`).
struct FakeGpuMem;

impl XpuMemAlloc for FakeGpuMem {
    fn alloc(&self, xpu: Xpu, len: usize) -> Result<Box<dyn XpuMem>> {
        if xpu != FAKE_GPU {
            return Err(Error::OpNotSupp(format!("mock: no memory for {xpu:?}")));
        }
        Ok(Box::new(AlignedBlock::new(len)))
    }
}

/// Zeroed heap memory aligned to 64 bytes, at `FAKE_DEVICE_OFFSET` for the device.
struct AlignedBlock {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: owned heap memory, accessed through atomics by the blocks' users.
unsafe impl Send for AlignedBlock {}
// SAFETY: as above.
unsafe impl Sync for AlignedBlock {}

impl AlignedBlock {
    fn new(len: usize) -> AlignedBlock {
        let layout = std::alloc::Layout::from_size_align(len.max(64), 64).expect("layout");
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        AlignedBlock {
            ptr: std::ptr::NonNull::new(p).expect("mock allocation"),
            layout,
        }
    }
}

impl Drop for AlignedBlock {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl XpuMem for AlignedBlock {
    fn host_ptr(&self) -> std::ptr::NonNull<u8> {
        self.ptr
    }
    fn xpu_addr(&self) -> u64 {
        self.ptr.as_ptr() as u64 + FAKE_DEVICE_OFFSET
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
}

struct MockProv(Arc<Shared>, Option<Arc<dyn HmemOps>>);

impl Provider for MockProv {
    fn name(&self) -> &'static str {
        "mock"
    }
    fn version(&self) -> u32 {
        fi_version(1, 0)
    }
    fn info(&self) -> Vec<Info> {
        vec![info(ALL_CAPS)]
    }
    fn domain(&self, _info: &Info) -> Result<Arc<dyn DomainOps>> {
        Ok(Arc::new(MockDom(self.0.clone(), self.1.clone())))
    }
}

pub const ALL_CAPS: u64 = FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_TRIGGER;
pub const XPU_CAPS: u64 = ALL_CAPS | FI_XPU_TRIGGER;

fn info(caps: u64) -> Info {
    let mut i = Info {
        caps,
        ..Default::default()
    };
    i.fabric_attr = FabricAttr {
        prov_name: Some("mock".into()),
        ..Default::default()
    };
    i.ep_attr.ep_type = EpType::Rdm;
    i.ep_attr.max_msg_size = 1 << 30;
    i.tx_attr.inject_size = 64;
    // These tests start far more operations than a CQ holds and look at what the provider was
    // handed, not at every entry: without resource management nothing waits for CQ room.
    i.domain_attr.resource_mgmt = ResourceMgmt::Disabled;
    i
}

/// A mock domain and what its endpoints are handed.
pub struct World {
    pub sh: Arc<Shared>,
    pub domain: Domain,
}

/// An enabled endpoint with one CQ for both directions.
pub struct Ep {
    pub ep: Endpoint,
    pub cq: CompletionQueue,
}

impl World {
    pub fn new() -> Self {
        Self::open(None)
    }

    /// A domain opened with `FI_HMEM` whose device memory is `hmem`'s.
    pub fn with_hmem(hmem: Arc<FakeHmem>) -> Self {
        Self::open(Some(hmem))
    }

    fn open(hmem: Option<Arc<FakeHmem>>) -> Self {
        let sh = Arc::new(Shared::default());
        let caps = XPU_CAPS | if hmem.is_some() { FI_HMEM } else { 0 };
        let hmem = hmem.map(|h| h as Arc<dyn HmemOps>);
        let prov = MockProv(sh.clone(), hmem);
        let fabric = Fabric::open(Arc::new(prov), &FabricAttr::default()).unwrap();
        let domain = fabric.domain(&info(caps)).unwrap();
        World { sh, domain }
    }

    /// An endpoint with `caps`, a CQ of `cq_size` entries, and `cntrs` bound as (counter, flags).
    pub fn ep_with(&self, caps: u64, cq_size: usize, cntrs: &[(&Counter, u64)]) -> Ep {
        self.ep_info(&info(caps), cq_size, cntrs)
    }

    /// An endpoint whose domain attributes ask for `FI_RM_ENABLED`: starts reserve CQ room.
    pub fn ep_managed(&self, cq_size: usize) -> Ep {
        self.ep_managed_caps(ALL_CAPS, cq_size)
    }

    /// `ep_managed` with `caps`.
    pub fn ep_managed_caps(&self, caps: u64, cq_size: usize) -> Ep {
        let mut i = info(caps);
        i.domain_attr.resource_mgmt = ResourceMgmt::Enabled;
        self.ep_info(&i, cq_size, &[])
    }

    fn ep_info(&self, info: &Info, cq_size: usize, cntrs: &[(&Counter, u64)]) -> Ep {
        let ep = self.domain.endpoint(info).unwrap();
        let cq = self
            .domain
            .cq_open(&CqAttr {
                format: CqFormat::Tagged,
                size: cq_size,
                ..Default::default()
            })
            .unwrap();
        let av = self.domain.av_open(&AvAttr::default()).unwrap();
        ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
        ep.bind_av(&av).unwrap();
        for (c, f) in cntrs {
            ep.bind_cntr(c, *f).unwrap();
        }
        ep.enable().unwrap();
        Ep { ep, cq }
    }

    pub fn ep(&self) -> Ep {
        self.ep_with(ALL_CAPS, 1024, &[])
    }

    pub fn cntr(&self) -> Counter {
        self.domain.cntr_open(&Default::default()).unwrap()
    }
}

impl Ep {
    /// Every success entry now in the CQ.
    pub fn entries(&self) -> Vec<CqTaggedEntry> {
        let mut out = Vec::new();
        let mut buf = [CqTaggedEntry::default(); 16];
        while let Ok(n) = self.cq.read(&mut buf) {
            out.extend_from_slice(&buf[..n]);
        }
        out
    }

    /// Every error entry now in the CQ.
    pub fn errors(&self) -> Vec<CqErrEntry> {
        cq_errors(&self.cq)
    }
}

/// Every error entry now in `cq`.
pub fn cq_errors(cq: &CompletionQueue) -> Vec<CqErrEntry> {
    let mut out = Vec::new();
    while let Ok(e) = cq.readerr() {
        out.push(e);
    }
    out
}
