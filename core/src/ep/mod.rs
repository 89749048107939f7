//! Endpoints: the generic half. `Endpoint` is what applications hold: it checks state and
//! arguments, reduces the many libfabric calls (send, sendv, sendmsg, senddata, inject, the
//! tagged forms, recv...) to two provider operations, and `EpCore` writes completions and bumps
//! counters the same way for every provider.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::av::{AddressVector, AvInner};
use crate::cntr::{CntrInner, Counter};
use crate::consts::errno::*;
use crate::consts::*;
use crate::cq::{CompletionQueue, CqInner};
use crate::entry::*;
use crate::eq::{EqInner, EventQueue};
use crate::error::{Error, Result};
use crate::hmem_iface::HmemOps;
use crate::hmem_stage::{self, OwnedSeg, Staged, StagingRegistry};
use crate::info::Info;
use crate::mr::{MrDesc, MrMap};
pub use crate::op::TxOp;
use crate::op::{AtomicReq, RmaOp};
use crate::rxq::{IovList, PostedRecv, RawIov, RecvSlot, IOV_LIMIT};
use crate::trigger::{DeferredRegistry, DoorbellAlloc, EpLink};
use crate::wait::{ProgressList, ProgressSource};

pub mod atomic;
mod complete;
pub use complete::Reporting;
mod credit;
pub mod rma;
mod start;
mod trigger;

/// xfabric's own operation flag (no libfabric flag uses bit 63): set by the inject calls
/// (`inject`, `tinject`, `inject_write`, `inject_atomic`, ...), which write no completion entry.
/// `FI_INJECT` alone, given to `sendmsg` and the like, only means "copy the data now": that
/// operation still completes, at the completion level it asked for.
pub const INJECT_CALL: u64 = 1 << 63;

/// xfabric's own operation flag (bit 62, unused by libfabric): a send from device memory
/// posted unstaged (`EpCore::device_offer_min`). The engine never puts its memory into a
/// frame itself: it offers it to the peer's transport (CUDA IPC over shm) and stages it only
/// if the peer asks for the data instead.
pub const DEVICE_OFFER: u64 = 1 << 62;

/// The CQ of an endpoint that an operation completes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    /// The transmit CQ: sends, RMA and atomics initiated here.
    Tx = 0,
    /// The receive CQ: receives, peeks, remote accesses that report.
    Rx = 1,
}

/// Counter classes an endpoint can bind (`fi_ep_bind` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum CntrClass {
    /// Completed sends.
    Send = 0,
    /// Completed receives.
    Recv = 1,
    /// Completed RMA reads / fetching atomics initiated here.
    Read = 2,
    /// Completed RMA writes / atomics initiated here.
    Write = 3,
    /// Remote reads of this endpoint's memory.
    RemoteRead = 4,
    /// Remote writes to this endpoint's memory.
    RemoteWrite = 5,
}

/// What an endpoint is bound to; frozen when it is enabled.
#[derive(Clone, Default)]
pub struct Bindings {
    /// Transmit completion queue.
    pub tx_cq: Option<Arc<CqInner>>,
    /// Only operations with `FI_COMPLETION` write transmit entries.
    pub tx_selective: bool,
    /// Receive completion queue.
    pub rx_cq: Option<Arc<CqInner>>,
    /// Only operations with `FI_COMPLETION` write receive entries.
    pub rx_selective: bool,
    /// Counters by `CntrClass`.
    pub cntr: [Option<Arc<CntrInner>>; 6],
    /// Address vector.
    pub av: Option<Arc<AvInner>>,
    /// Event queue.
    pub eq: Option<Arc<EqInner>>,
}

impl Bindings {
    /// The completion queues bound, each once (one may serve both directions).
    fn cqs(&self) -> Vec<&Arc<CqInner>> {
        distinct([&self.tx_cq, &self.rx_cq].into_iter().flatten())
    }

    /// The counters bound, each once (one may count several classes).
    fn cntrs(&self) -> Vec<&Arc<CntrInner>> {
        distinct(self.cntr.iter().flatten())
    }

    /// Gives back what each binding holds (`bind_cq`, `bind_cntr` and `bind_av` count one per
    /// binding, direction or class).
    fn release(&self) {
        for cq in [&self.tx_cq, &self.rx_cq].into_iter().flatten() {
            cq.release();
        }
        for c in self.cntr.iter().flatten() {
            c.release();
        }
        if let Some(av) = &self.av {
            av.release();
        }
    }
}

/// `items` without repeats of the same object, in order.
fn distinct<'a, T>(items: impl Iterator<Item = &'a Arc<T>>) -> Vec<&'a Arc<T>> {
    let mut out: Vec<&Arc<T>> = Vec::new();
    for x in items {
        if !out.iter().any(|k| Arc::ptr_eq(k, x)) {
            out.push(x);
        }
    }
    out
}

/// The provider's half of an endpoint: moving bytes. Everything else is `Endpoint`'s.
pub trait EndpointOps: ProgressSource {
    /// Called once bindings are frozen; the provider may now use `EpCore::bound`.
    fn enable(&self) -> Result<()>;
    /// The endpoint's address (`fi_getname`).
    fn name(&self) -> Vec<u8>;
    /// Starts a send.
    ///
    /// # Safety
    /// `op.iov` must stay readable until the operation completes, unless `FI_INJECT` is set, in
    /// which case only for the duration of the call.
    unsafe fn send(&self, op: &TxOp) -> Result<()>;
    /// Posts a receive.
    ///
    /// # Safety
    /// `r.iov` must stay writable, and not otherwise accessed, until the receive completes or
    /// is canceled.
    unsafe fn recv(&self, r: PostedRecv) -> Result<()>;
    /// Whether receive `r`, from an XPU's descriptor, must be refused for room: the receives
    /// descriptors posted and not yet matched fill the receive context (`rx_attr.size`, the
    /// provider's default where 0), and `r` would not take a buffered message now. Refused:
    /// `Some((posted, bound))`. The default counts nothing and refuses nothing.
    fn xpu_recv_refused(&self, r: &PostedRecv) -> Option<(usize, usize)> {
        let _ = r;
        None
    }
    /// Starts an RMA read or write.
    ///
    /// # Safety
    /// `op.iov` must stay valid (readable for writes, writable for reads) until the operation
    /// completes, unless `FI_INJECT` is set, in which case only for the duration of the call.
    unsafe fn rma(&self, op: &RmaOp) -> Result<()> {
        let _ = op;
        Err(Error::OpNotSupp("this provider has no RMA".into()))
    }
    /// Starts an atomic operation.
    ///
    /// # Safety
    /// The operand and compare values must stay readable, and the result buffer writable,
    /// until the operation completes (the operand only during the call with `FI_INJECT`).
    unsafe fn atomic(&self, req: &AtomicReq) -> Result<()> {
        let _ = req;
        Err(Error::OpNotSupp("this provider has no atomics".into()))
    }
    /// Cancels a posted receive (or a not-yet-started send) by context; `NoEntry` if none.
    fn cancel(&self, ctx: Context) -> Result<()>;
    /// Sets an option the provider keeps (`FI_OPT_MIN_MULTI_RECV`, ...).
    fn setopt(&self, name: i32, value: usize) -> Result<()>;
    /// Reads an option the provider keeps (`FI_OPT_MIN_MULTI_RECV`); `NoSys` by default.
    fn getopt(&self, name: i32) -> Result<usize> {
        Err(Error::NoSys(format!(
            "getopt: option {name} is not supported"
        )))
    }
    /// Releases everything: outstanding operations complete with `Canceled`.
    fn close(&self);
    /// What the endpoint buffers now for messages it could not handle yet.
    fn buffered(&self) -> Buffered {
        Buffered::default()
    }
    /// Arms `op`, an XPU-triggered send, ahead in the provider where it can (its
    /// announcement made now, for the peer to take when it fires): a token for
    /// `xpu_fired` and `xpu_disarm`, or `None` (the trigger then starts `op` as a post).
    ///
    /// # Safety
    /// As `send`: `op.iov` stays readable until the send completes or is disarmed.
    unsafe fn xpu_prearm(&self, op: &TxOp) -> Option<u64> {
        let _ = op;
        None
    }
    /// The armed send `token` fired: it starts now. `false` when it had ended already (its
    /// peer lost, say): nothing starts, and no completion will be reported for this firing.
    fn xpu_fired(&self, token: u64) -> bool {
        let _ = token;
        false
    }
    /// Ends the armed send `token`, which has not fired: `true` if it ended so (nothing
    /// started, and no completion is reported for it here).
    fn xpu_disarm(&self, token: u64) -> bool {
        let _ = token;
        false
    }
}

/// What an endpoint holds for messages that arrived before they could be handled: a
/// provider bounds each (shm: `XFABRIC_SHM_UNEXP_MSGS`, `XFABRIC_SHM_UNEXP_BYTES`, its
/// `HELD_MAX`) and leaves what does not fit with the sender. For watching memory, not for
/// matching. libfabric has no counterpart (xfabric's own, from `Endpoint::buffered`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Buffered {
    /// Messages no posted receive has taken yet (`FI_CLAIM`ed ones included).
    pub unexpected: usize,
    /// Bytes held for them (payload and bookkeeping), with the bodies still arriving into
    /// buffers of their own.
    pub unexpected_bytes: usize,
    /// Requests held back to keep a peer's order (behind its landing large writes).
    pub held: usize,
}

/// Generic per-endpoint state shared between `Endpoint` and the provider.
pub struct EpCore {
    /// Capabilities the endpoint was opened with.
    pub caps: u64,
    /// Default transmit operation flags (`tx_attr.op_flags`).
    pub tx_op_flags: u64,
    /// Default receive operation flags (`rx_attr.op_flags`).
    pub rx_op_flags: u64,
    /// Largest inject.
    pub inject_size: usize,
    /// Operations the transmit context holds at once (`tx_attr.size`): a provider may answer
    /// `Again` past it.
    pub tx_size: usize,
    /// Receives the receive context holds at once (`rx_attr.size`): what bounds the receives
    /// XPUs' descriptors keep posted (`EndpointOps::xpu_recv_refused`).
    pub rx_size: usize,
    /// Largest message.
    pub max_msg_size: usize,
    /// The domain's memory-region keys: where a target checks remote accesses.
    pub mr: Arc<MrMap>,
    /// Data progress is the domain's thread's (`FI_PROGRESS_AUTO`).
    pub auto_progress: bool,
    /// The domain's number (`Domain::id`); 0 for an endpoint built outside a domain.
    pub domain: u64,
    /// `FI_RM_ENABLED`: operations reserve their CQ entries (`credit`), counted here.
    pub rm: bool,
    pub(crate) credits: [std::sync::atomic::AtomicUsize; 2],
    pending: Mutex<Bindings>,
    bound: OnceLock<Bindings>,
    /// Deferred work this endpoint has started: its completions go to the work's completion
    /// counter instead of (or, with `FI_COMPLETION`, besides) this endpoint's CQ and counters.
    pub(crate) deferred: DeferredRegistry,
    /// The domain's heterogeneous-memory layer (domains opened with `FI_HMEM`).
    pub hmem: Option<Arc<dyn HmemOps>>,
    /// Operations whose device buffers go through host bounce buffers (`hmem_stage`).
    pub(crate) staging: StagingRegistry,
    /// Sends of at least this many bytes from one segment of CUDA device memory are posted
    /// unstaged and offered to the peer (`DEVICE_OFFER`): set by a provider whose transport
    /// copies such memory itself (shm: CUDA IPC); `usize::MAX`, the default, never.
    pub device_offer_min: std::sync::atomic::AtomicUsize,
    /// Where this endpoint's descriptor rings go when it closes: its domain's (`Retired`), so
    /// that an XPU still posting reaches a closed ring, not freed memory.
    pub retired: Arc<crate::xpu::Retired>,
    /// Reports under way outside the provider's lock (`reporting`): the close waits them out.
    reports: std::sync::atomic::AtomicUsize,
    /// Batches holding multi-receive windows taken so far, and the next one whose turn it is
    /// to be reported (`rdm::done`: they are reported in the order they were taken).
    pub(crate) multi_taken: std::sync::atomic::AtomicU64,
    pub(crate) multi_done: std::sync::atomic::AtomicU64,
}

impl EpCore {
    /// State for an endpoint opened from `info` in a domain whose keys are `mr`.
    pub fn new(info: &Info, mr: Arc<MrMap>) -> Self {
        EpCore {
            mr,
            auto_progress: info.domain_attr.data_progress == crate::consts::Progress::Auto,
            domain: 0,
            rm: info.domain_attr.resource_mgmt != crate::consts::ResourceMgmt::Disabled,
            credits: Default::default(),
            caps: info.caps,
            tx_op_flags: info.tx_attr.op_flags,
            rx_op_flags: info.rx_attr.op_flags,
            inject_size: info.tx_attr.inject_size,
            tx_size: info.tx_attr.size,
            rx_size: info.rx_attr.size,
            max_msg_size: info.ep_attr.max_msg_size,
            pending: Mutex::new(Bindings::default()),
            bound: OnceLock::new(),
            deferred: DeferredRegistry::default(),
            hmem: None,
            staging: StagingRegistry::default(),
            device_offer_min: std::sync::atomic::AtomicUsize::new(usize::MAX),
            retired: Arc::default(),
            reports: std::sync::atomic::AtomicUsize::new(0),
            multi_taken: std::sync::atomic::AtomicU64::new(0),
            multi_done: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The heterogeneous-memory layer, if the domain has one.
    pub fn hmem(&self) -> Option<&dyn HmemOps> {
        self.hmem.as_deref()
    }

    /// The layer to stage local buffers with: only endpoints opened with `FI_HMEM` look up
    /// who owns their buffers, so host-only endpoints pay nothing.
    #[inline]
    pub(crate) fn stager(&self) -> Option<&dyn HmemOps> {
        if self.caps & FI_HMEM != 0 {
            self.hmem.as_deref()
        } else {
            None
        }
    }

    /// Posts a staged operation through `post(ctx, iov)` with the bounce buffer as its memory.
    /// An inject is copied by the provider during the call, so its buffer goes right after.
    pub(crate) fn post_staged(
        &self,
        staged: Staged,
        inject: bool,
        post: impl FnOnce(Context, IovList) -> Result<()>,
    ) -> Result<()> {
        let iov = staged.bounce_iov();
        if inject {
            return post(staged.user_ctx, iov);
        }
        let key = self.staging.insert(staged);
        let r = post(key, iov);
        if r.is_err() {
            drop(self.staging.claim(key));
        }
        r
    }

    /// Stages an outgoing operation's device memory, if it has any: `Ok(None)` for host
    /// memory (post as is), else the record whose bounce holds the data.
    ///
    /// # Safety
    /// `iov` must be readable for the duration of the call.
    pub(crate) unsafe fn stage_out(&self, ctx: Context, iov: &IovList) -> Result<Option<Staged>> {
        let Some(hmem) = self.stager() else {
            return Ok(None);
        };
        let Some(segs) = hmem_stage::owners(hmem, iov)? else {
            return Ok(None);
        };
        // SAFETY: forwarded.
        let bounce = unsafe { hmem_stage::gather(hmem, &segs) }?;
        Ok(Some(Staged::outgoing(ctx, *iov, bounce)))
    }

    /// Stages an incoming operation's device memory, if it has any.
    pub(crate) fn stage_in(
        &self,
        ctx: Context,
        iov: &IovList,
        multi: bool,
    ) -> Result<Option<Staged>> {
        let Some(hmem) = self.stager() else {
            return Ok(None);
        };
        Ok(hmem_stage::owners(hmem, iov)?.map(|segs| match multi {
            true => Staged::incoming_multi(ctx, *iov, segs),
            false => Staged::incoming(ctx, *iov, segs),
        }))
    }

    /// Ends a staged operation the provider posted with `ctx`: lands incoming data (`len`
    /// bytes, synchronously, so the device sees them before any completion is written) and
    /// frees the bounce. Returns the application's context and whether landing worked;
    /// `None` when `ctx` is not a staged operation.
    #[inline]
    fn unstage(&self, ctx: Context, len: Option<usize>) -> Option<(Context, IovList, bool)> {
        if !self.staging.any() {
            return None;
        }
        self.unstage_staged(ctx, len)
    }

    #[inline(never)]
    fn unstage_staged(&self, ctx: Context, len: Option<usize>) -> Option<(Context, IovList, bool)> {
        let s = self.staging.claim(ctx)?;
        let landed = match (s.landed_early(), len, self.hmem()) {
            (Some(ok), _, _) => ok,
            // SAFETY: the posting call's contract keeps the application's memory writable
            // until this completion.
            (None, Some(n), Some(h)) => match unsafe { s.land(h, n) } {
                Ok(()) => true,
                Err(e) => {
                    // The completion becomes an FI_EIO error entry; keep the driver's word.
                    self.staging.record_error(e);
                    false
                }
            },
            _ => true,
        };
        Some((s.user_ctx, s.user_iov, landed))
    }

    /// Lands data staged for device memory now, before the provider acknowledges the
    /// transfer to its initiator: a delivery-complete acknowledgement then means the device
    /// sees the data (fi_cq(3), heterogeneous memory). `ctx` is the context the provider was
    /// given for the receive (or the staged remote write); for anything not staged this is one
    /// atomic load and `true`. `false`: the copy failed (the completion reports `FI_EIO`).
    ///
    /// # Safety
    /// The provider holds the operation, `slot` (its bounce buffer, or a window of it) has the
    /// `len` received bytes, and it has not completed it yet.
    pub unsafe fn land_before_ack(&self, slot: &RecvSlot, len: usize) -> bool {
        let Some(h) = self.hmem() else { return true };
        // SAFETY: forwarded.
        unsafe { self.staging.land_early(h, slot.ctx, &slot.iov, len) }.unwrap_or(true)
    }

    /// Ends the staged part of a receive that completed into `slot` (`len` bytes) or failed
    /// (`None`): a multi-receive window, or a whole staged operation.
    #[inline]
    fn unstage_rx(&self, slot: &RecvSlot, len: Option<usize>) -> Option<(Context, IovList, bool)> {
        if !self.staging.any() {
            return None;
        }
        self.unstage_rx_staged(slot, len)
    }

    #[inline(never)]
    fn unstage_rx_staged(
        &self,
        slot: &RecvSlot,
        len: Option<usize>,
    ) -> Option<(Context, IovList, bool)> {
        let release = slot.flags & FI_MULTI_RECV != 0;
        // SAFETY: the posting call's contract keeps the application's memory writable until
        // the buffer is released; the provider is done with this window.
        let window = unsafe {
            self.staging
                .finish_window(self.hmem(), slot.ctx, &slot.iov, len, release)
        };
        window.or_else(|| self.unstage_staged(slot.ctx, len))
    }

    /// The device memory a receive staged as `ctx` lands in, where a transport may copy
    /// `len` bytes into it directly (`CopyReq::ctx`); it then calls `landed_direct`.
    pub fn direct_landing(&self, ctx: Context, len: usize) -> Option<OwnedSeg> {
        if ctx == 0 || !self.staging.any() {
            return None;
        }
        self.staging.direct_landing(ctx, len)
    }

    /// The transport copied the bytes of staged receive `ctx` into its device memory itself
    /// (`ok`), or that copy failed (its completion then reports `FI_EIO`).
    pub fn landed_direct(&self, ctx: Context, ok: bool) {
        self.staging.landed_direct(ctx, ok);
    }

    /// Whether a send of `iov` is posted unstaged and offered (`DEVICE_OFFER`): one segment
    /// of CUDA memory of at least `device_offer_min` bytes, not injected.
    pub(crate) fn device_offer(&self, hmem: &dyn HmemOps, flags: u64, iov: &IovList) -> bool {
        let [s] = iov.segs() else { return false };
        s.len >= self.device_offer_min.load(Ordering::Relaxed)
            && flags & (FI_INJECT | INJECT_CALL) == 0
            && hmem
                .owner(s.addr)
                .is_ok_and(|o| o.iface == crate::hmem_iface::Iface::Cuda)
    }

    /// Errors of staging copies into device memory (each also failed its operation with
    /// `FI_EIO`), since the last call.
    pub fn take_staging_errors(&self) -> Vec<Error> {
        self.staging.take_errors()
    }

    /// At an RMA target: a host buffer for a write into `segs` (some of them device memory)
    /// that arrives over several steps. The provider writes into the returned iov and then
    /// calls `land_remote` (or `drop_remote` if the write failed) with the returned context.
    pub fn stage_remote(&self, segs: Vec<OwnedSeg>) -> (Context, IovList) {
        let iov = IovList::from_segs(segs.iter().map(|s| s.seg)).unwrap_or_default();
        let s = Staged::remote(iov, segs);
        let bounce = s.bounce_iov();
        (self.staging.insert(s), bounce)
    }

    /// Copies a staged remote write's `len` bytes into the registered device memory, before
    /// the write is reported (synchronous: visible to the device on return).
    pub fn land_remote(&self, ctx: Context, len: usize) -> Result<()> {
        match self.unstage(ctx, Some(len)) {
            Some((_, _, true)) => Ok(()),
            Some((_, _, false)) => Err(self
                .staging
                .last_error()
                .unwrap_or_else(|| Error::Inval("land_remote: the device copy failed".into()))),
            None => Err(Error::Inval(format!("land_remote: {ctx:#x} is not staged"))),
        }
    }

    /// Frees a staged remote write that failed.
    pub fn drop_remote(&self, ctx: Context) {
        drop(self.staging.claim(ctx));
    }
}

/// A message description for `sendmsg` / `recvmsg` and their tagged forms (`struct fi_msg`,
/// `struct fi_msg_tagged`).
#[derive(Clone, Copy, Debug)]
pub struct Msg<'a> {
    /// Data segments.
    pub iov: &'a [RawIov],
    /// Memory descriptors, one per segment or none.
    pub desc: &'a [MrDesc],
    /// Peer address (destination for sends; source filter for receives).
    pub addr: FiAddr,
    /// Completion context.
    pub context: Context,
    /// Remote CQ data (sends with `FI_REMOTE_CQ_DATA`).
    pub data: u64,
    /// Tag (tagged forms).
    pub tag: u64,
    /// Ignore bits (tagged receives).
    pub ignore: u64,
}

impl RawIov {
    /// A segment covering `buf`.
    pub fn of(buf: &[u8]) -> Self {
        RawIov {
            addr: buf.as_ptr() as usize,
            len: buf.len(),
        }
    }

    /// A writable segment covering `buf`.
    pub fn of_mut(buf: &mut [u8]) -> Self {
        RawIov {
            addr: buf.as_mut_ptr() as usize,
            len: buf.len(),
        }
    }
}

const SEND_FLAGS: u64 = FI_REMOTE_CQ_DATA
    | FI_COMPLETION
    | FI_MORE
    | FI_INJECT
    | FI_INJECT_COMPLETE
    | FI_TRANSMIT_COMPLETE
    | FI_DELIVERY_COMPLETE
    | FI_MATCH_COMPLETE
    | FI_FENCE;
const RECV_FLAGS: u64 = FI_COMPLETION | FI_MORE | FI_MULTI_RECV;
const TRECV_FLAGS: u64 = FI_COMPLETION | FI_MORE | FI_PEEK | FI_CLAIM | FI_DISCARD;
/// Flags a receive call accepts and ignores, as libfabric's providers do: what describes the
/// operation or its completion elsewhere (MPICH's probe passes `FI_REMOTE_CQ_DATA` to a
/// `FI_PEEK`; fi_msg(3) names `FI_TRANSMIT_COMPLETE` for `fi_recvmsg` too).
const RX_IGNORED: u64 = FI_REMOTE_CQ_DATA
    | FI_MSG
    | FI_TAGGED
    | FI_RECV
    | FI_INJECT_COMPLETE
    | FI_TRANSMIT_COMPLETE
    | FI_DELIVERY_COMPLETE
    | FI_MATCH_COMPLETE;

/// `fid_ep` for an RDM endpoint.
pub struct Endpoint {
    core: Arc<EpCore>,
    ops: Arc<dyn EndpointOps>,
    /// Triggered operations' link to this endpoint (`FI_TRIGGER` endpoints only).
    link: Option<Arc<EpLink>>,
    progress_reg: Arc<dyn ProgressSource>,
    domain_progress: Arc<ProgressList>,
    /// Shared with the endpoint's aliases: they see it enabled and closed with it.
    enabled: Arc<AtomicBool>,
    closed: Arc<AtomicBool>,
    /// An alias's own default operation flags (transmit, receive); `None` for the endpoint
    /// itself, whose defaults are the core's.
    alias: Option<(u64, u64)>,
}

impl Endpoint {
    /// Wraps a provider's endpoint; `Domain::endpoint` calls this.
    pub fn new(
        core: Arc<EpCore>,
        ops: Arc<dyn EndpointOps>,
        domain_progress: Arc<ProgressList>,
        doorbells: Option<Arc<dyn DoorbellAlloc>>,
    ) -> Self {
        // A trigger-able endpoint is driven through its link, which also restarts triggered
        // operations the provider could not take at once (a full ring) and watches the
        // doorbells of XPU-triggered ones.
        let link = Self::new_link(&core, &ops, doorbells);
        let as_progress: Arc<dyn ProgressSource> = match &link {
            Some(l) => l.clone(),
            None => ops.clone(),
        };
        Endpoint {
            core,
            link,
            progress_reg: as_progress,
            ops,
            domain_progress,
            enabled: Arc::new(AtomicBool::new(false)),
            closed: Arc::new(AtomicBool::new(false)),
            alias: None,
        }
    }

    /// `fi_ep_alias`: another handle on this endpoint whose operations use `flags` (less
    /// `FI_TRANSMIT` and `FI_RECV`) as their default operation flags in the directions those
    /// two name; the other direction keeps this endpoint's. It shares everything else (queues,
    /// counters, address vector, state): closing it leaves the endpoint open, and closing the
    /// endpoint ends its aliases' use.
    pub fn alias(&self, flags: u64) -> Result<Endpoint> {
        let dirs = flags & (FI_TRANSMIT | FI_RECV);
        if dirs == 0 {
            return Err(Error::Inval(
                "ep_alias: flags name neither FI_TRANSMIT nor FI_RECV".into(),
            ));
        }
        let ops = flags & !(FI_TRANSMIT | FI_RECV);
        let (tx, rx) = (self.tx_op_flags(), self.rx_op_flags());
        Ok(Endpoint {
            core: self.core.clone(),
            ops: self.ops.clone(),
            link: self.link.clone(),
            progress_reg: self.progress_reg.clone(),
            domain_progress: self.domain_progress.clone(),
            enabled: self.enabled.clone(),
            closed: self.closed.clone(),
            alias: Some((
                if dirs & FI_TRANSMIT != 0 { ops } else { tx },
                if dirs & FI_RECV != 0 { ops } else { rx },
            )),
        })
    }

    /// Default flags of transmit operations (this handle's, for an alias).
    #[inline]
    pub fn tx_op_flags(&self) -> u64 {
        self.alias.map_or(self.core.tx_op_flags, |(tx, _)| tx)
    }

    /// Default flags of receive operations (this handle's, for an alias).
    #[inline]
    pub fn rx_op_flags(&self) -> u64 {
        self.alias.map_or(self.core.rx_op_flags, |(_, rx)| rx)
    }

    /// The generic state (capabilities, bindings).
    pub fn core(&self) -> &Arc<EpCore> {
        &self.core
    }

    /// The provider's half.
    pub(crate) fn ops(&self) -> &Arc<dyn EndpointOps> {
        &self.ops
    }

    /// Where triggered operations wait and start; `None` without `FI_TRIGGER`.
    pub(crate) fn link(&self) -> Option<&Arc<EpLink>> {
        self.link.as_ref()
    }

    fn pending(&self, what: &str) -> Result<std::sync::MutexGuard<'_, Bindings>> {
        if self.enabled.load(Ordering::Acquire) {
            return Err(Error::OpBadState(format!(
                "{what}: endpoint is already enabled; bind before enable"
            )));
        }
        Ok(self.core.pending.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// `fi_ep_bind` to a completion queue with `FI_TRANSMIT`, `FI_RECV` and optionally
    /// `FI_SELECTIVE_COMPLETION`.
    pub fn bind_cq(&self, cq: &CompletionQueue, flags: u64) -> Result<()> {
        let known = FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION;
        if flags & !known != 0 || flags & (FI_TRANSMIT | FI_RECV) == 0 {
            return Err(Error::BadFlags(format!(
                "bind cq: flags {flags:#x}; need FI_TRANSMIT and/or FI_RECV, optionally FI_SELECTIVE_COMPLETION"
            )));
        }
        cq.inner().domain.check("bind cq", "CQ", self.core.domain)?;
        let mut b = self.pending("bind cq")?;
        let sel = flags & FI_SELECTIVE_COMPLETION != 0;
        if flags & FI_TRANSMIT != 0 && b.tx_cq.is_some() {
            return Err(Error::Inval(
                "bind cq: a transmit CQ is already bound".into(),
            ));
        }
        if flags & FI_RECV != 0 && b.rx_cq.is_some() {
            return Err(Error::Inval(
                "bind cq: a receive CQ is already bound".into(),
            ));
        }
        // Counted now, not at enable: a queue closed between the bind and the enable would
        // leave the endpoint writing where nobody can read (libfabric counts it at bind too).
        if flags & FI_TRANSMIT != 0 {
            cq.inner().hold();
            b.tx_cq = Some(cq.inner().clone());
            b.tx_selective = sel;
        }
        if flags & FI_RECV != 0 {
            cq.inner().hold();
            b.rx_cq = Some(cq.inner().clone());
            b.rx_selective = sel;
        }
        Ok(())
    }

    /// `fi_ep_bind` to a counter for one or more classes (`FI_SEND`, `FI_RECV`, `FI_READ`,
    /// `FI_WRITE`, `FI_REMOTE_READ`, `FI_REMOTE_WRITE`).
    pub fn bind_cntr(&self, cntr: &Counter, flags: u64) -> Result<()> {
        let classes = [
            (FI_SEND, CntrClass::Send),
            (FI_RECV, CntrClass::Recv),
            (FI_READ, CntrClass::Read),
            (FI_WRITE, CntrClass::Write),
            (FI_REMOTE_READ, CntrClass::RemoteRead),
            (FI_REMOTE_WRITE, CntrClass::RemoteWrite),
        ];
        let known: u64 = classes.iter().map(|c| c.0).sum();
        if flags == 0 || flags & !known != 0 {
            return Err(Error::BadFlags(format!(
                "bind cntr: flags {flags:#x}; use FI_SEND, FI_RECV, FI_READ, FI_WRITE, FI_REMOTE_READ, FI_REMOTE_WRITE"
            )));
        }
        cntr.inner()
            .domain
            .check("bind cntr", "counter", self.core.domain)?;
        let mut b = self.pending("bind cntr")?;
        for (bit, class) in classes {
            if flags & bit != 0 {
                // Counted now, as a CQ is (`bind_cq`); a class bound again lets the old go.
                cntr.inner().hold();
                if let Some(old) = b.cntr[class as usize].replace(cntr.inner().clone()) {
                    old.release();
                }
            }
        }
        Ok(())
    }

    /// `fi_ep_bind` to an address vector.
    pub fn bind_av(&self, av: &AddressVector) -> Result<()> {
        av.inner().domain.check("bind av", "AV", self.core.domain)?;
        let mut b = self.pending("bind av")?;
        if b.av.is_some() {
            return Err(Error::Inval("bind av: an AV is already bound".into()));
        }
        // Counted now, as a CQ is (`bind_cq`).
        av.inner().hold();
        b.av = Some(av.inner().clone());
        Ok(())
    }

    /// `fi_ep_bind` to an event queue.
    pub fn bind_eq(&self, eq: &EventQueue) -> Result<()> {
        let mut b = self.pending("bind eq")?;
        b.eq = Some(eq.inner().clone());
        Ok(())
    }

    /// `fi_enable`: needs an AV, and a CQ or counter for each direction the endpoint's
    /// capabilities use.
    pub fn enable(&self) -> Result<()> {
        let b = {
            let b = self.pending("enable")?;
            if b.av.is_none() {
                return Err(Error::NoAv(
                    "enable: an RDM endpoint needs an address vector bound first (bind_av)".into(),
                ));
            }
            let sends = self.core.caps & (FI_MSG | FI_TAGGED) != 0;
            if sends && b.tx_cq.is_none() && b.cntr[CntrClass::Send as usize].is_none() {
                return Err(Error::NoCq(
                    "enable: bind a transmit CQ (FI_TRANSMIT) or a send counter first".into(),
                ));
            }
            if sends && b.rx_cq.is_none() && b.cntr[CntrClass::Recv as usize].is_none() {
                return Err(Error::NoCq(
                    "enable: bind a receive CQ (FI_RECV) or a receive counter first".into(),
                ));
            }
            b.clone()
        };
        if self.core.bound.set(b).is_err() {
            return Err(Error::OpBadState(
                "enable: endpoint is already enabled".into(),
            ));
        }
        let b = self.core.bound().expect("just set");
        for cq in b.cqs() {
            cq.bind(self.driven_by_readers());
        }
        for c in b.cntrs() {
            c.bind(self.driven_by_readers());
        }
        self.ops.enable()?;
        self.domain_progress.add(self.progress_reg.clone());
        self.enabled.store(true, Ordering::Release);
        Ok(())
    }

    /// What the endpoint's queues and counters drive when read: under manual progress every
    /// endpoint of its domain (the domain's list, this one included), nothing under auto
    /// progress (the domain's thread does it).
    fn driven_by_readers(&self) -> Option<Arc<dyn ProgressSource>> {
        (!self.core.auto_progress).then(|| self.domain_progress.clone() as Arc<dyn ProgressSource>)
    }

    /// What the endpoint buffers now for messages it could not handle yet ([`Buffered`]).
    pub fn buffered(&self) -> Buffered {
        self.ops.buffered()
    }

    /// `fi_getname`: this endpoint's raw address, to hand to peers out of band.
    pub fn getname(&self) -> Result<Vec<u8>> {
        Ok(self.ops.name())
    }

    /// `fi_setopt(FI_OPT_ENDPOINT, name, value)`.
    pub fn setopt(&self, name: i32, value: usize) -> Result<()> {
        self.ops.setopt(name, value)
    }

    /// `fi_getopt(FI_OPT_ENDPOINT, name)` of an option `setopt` sets.
    pub fn getopt(&self, name: i32) -> Result<usize> {
        self.ops.getopt(name)
    }

    /// `fi_cancel`: a posted receive completes with `FI_ECANCELED`; `NoEntry` if nothing with
    /// that context is outstanding.
    pub fn cancel(&self, ctx: Context) -> Result<()> {
        if self.link.as_ref().is_some_and(|l| l.cancel(ctx)) {
            return Ok(());
        }
        // A staged receive is known to the provider by its staging context.
        let ctx = self.core.staging.key_of(ctx).unwrap_or(ctx);
        self.ops.cancel(ctx)
    }

    /// Drives this endpoint's progress once (what reading its CQ does under manual progress).
    pub fn progress(&self) -> usize {
        self.progress_reg.progress()
    }

    // The checks every post makes are inlined into it (two loads and compares each); the
    // errors they may build are out of line, so that the check stays small enough to inline
    // into every caller, libfabric.so's exports included.

    #[inline]
    pub(crate) fn check_live(&self, what: &'static str) -> Result<()> {
        if self.enabled.load(Ordering::Acquire) && !self.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(self.not_live(what))
    }

    /// Why `check_live` refused.
    #[cold]
    #[inline(never)]
    fn not_live(&self, what: &'static str) -> Error {
        if !self.enabled.load(Ordering::Acquire) {
            return Error::OpBadState(format!(
                "{what}: endpoint is not enabled (bind an AV and CQs, then call enable)"
            ));
        }
        Error::OpBadState(format!("{what}: endpoint is closed"))
    }

    pub(crate) fn iov(&self, what: &'static str, iov: &[RawIov]) -> Result<IovList> {
        let l = IovList::from_segs(iov.iter().copied()).ok_or_else(|| {
            Error::Inval(format!(
                "{what}: {} segments, the limit is {IOV_LIMIT}",
                iov.len()
            ))
        })?;
        if l.segs().iter().any(|s| s.addr == 0 && s.len > 0) {
            return Err(Error::Inval(format!(
                "{what}: a segment has a null address"
            )));
        }
        Ok(l)
    }

    fn post_tx(&self, what: &'static str, op: TxOp) -> Result<()> {
        self.not_triggered_by_default(what, op.flags)?;
        self.check_tx(what, &op)?;
        // SAFETY: the public call's contract: the data is readable now and stays so until
        // the completion (an inject's only during the call, where the provider copies it).
        unsafe { self.core.start_send(&*self.ops, &op) }.map_err(Error::from)
    }

    /// `Inval` where a call other than a `*msg` one meets `FI_TRIGGER` among a handle's
    /// default flags (an alias made with it): such an operation waits for its trigger, which
    /// only the `*msg` calls with a triggered context name. Started at once instead, it ran
    /// before what it was meant to wait for.
    #[inline]
    pub(crate) fn not_triggered_by_default(&self, what: &'static str, flags: u64) -> Result<()> {
        if flags & FI_TRIGGER != 0 {
            return Err(Error::Inval(format!(
                "{what}: this handle's default flags hold FI_TRIGGER (fi_ep_alias): post a \
                 triggered operation with the *msg call and a triggered context"
            )));
        }
        Ok(())
    }

    /// Checks a send against the endpoint's state, sizes and capabilities.
    #[inline]
    pub(crate) fn check_tx(&self, what: &'static str, op: &TxOp) -> Result<()> {
        self.check_live(what)?;
        let len = op.iov.total();
        if len > self.core.max_msg_size
            || (op.flags & FI_INJECT != 0 && len > self.core.inject_size)
            || self.core.caps & op.flags & (FI_MSG | FI_TAGGED) == 0
        {
            return Err(self.tx_refused(what, op));
        }
        Ok(())
    }

    /// Why `check_tx` refused a live endpoint's send.
    #[cold]
    #[inline(never)]
    fn tx_refused(&self, what: &'static str, op: &TxOp) -> Error {
        let len = op.iov.total();
        if len > self.core.max_msg_size {
            return Error::MsgSize(format!(
                "{what}: {len} bytes, max_msg_size is {}",
                self.core.max_msg_size
            ));
        }
        if op.flags & FI_INJECT != 0 && len > self.core.inject_size {
            return Error::MsgSize(format!(
                "{what}: inject of {len} bytes, inject_size is {}",
                self.core.inject_size
            ));
        }
        self.without_caps(what, op.flags)
    }

    /// An operation of kind `flags` (`FI_MSG` or `FI_TAGGED`) on an endpoint opened without it.
    #[cold]
    #[inline(never)]
    fn without_caps(&self, what: &'static str, flags: u64) -> Error {
        Error::OpNotSupp(format!(
            "{what}: endpoint was opened without {}",
            caps_str(flags & (FI_MSG | FI_TAGGED))
        ))
    }

    fn post_rx(&self, what: &'static str, r: PostedRecv) -> Result<()> {
        self.check_rx(what, &r)?;
        // SAFETY: forwarded from the public call's contract.
        unsafe { self.core.start_recv(&*self.ops, r) }.map_err(Error::from)
    }

    /// Checks a receive against the endpoint's state and capabilities.
    #[inline]
    pub(crate) fn check_rx(&self, what: &'static str, r: &PostedRecv) -> Result<()> {
        self.check_live(what)?;
        if self.core.caps & r.flags & (FI_MSG | FI_TAGGED) == 0 {
            return Err(self.without_caps(what, r.flags));
        }
        if r.src != FI_ADDR_UNSPEC && self.core.caps & FI_DIRECTED_RECV == 0 {
            // Without FI_DIRECTED_RECV the source is ignored, as libfabric specifies.
        }
        Ok(())
    }

    #[inline]
    fn tx(
        &self,
        ctx: Context,
        iov: IovList,
        dest: FiAddr,
        tag: u64,
        data: u64,
        flags: u64,
    ) -> TxOp {
        TxOp {
            ctx,
            iov,
            dest,
            tag,
            data,
            flags: flags | (self.tx_op_flags() & !(FI_INJECT)),
        }
    }

    /// `fi_send`.
    ///
    /// # Safety
    /// `buf` must stay valid and unmodified until the send's completion is reported.
    #[inline]
    pub unsafe fn send(
        &self,
        buf: &[u8],
        _desc: Option<MrDesc>,
        dest: FiAddr,
        ctx: Context,
    ) -> Result<()> {
        let op = self.tx(
            ctx,
            IovList::one(buf.as_ptr() as usize, buf.len()),
            dest,
            0,
            0,
            FI_MSG,
        );
        self.post_tx("send", op)
    }

    /// `fi_senddata`: a send carrying 64 bits of remote CQ data.
    ///
    /// # Safety
    /// As `send`.
    #[inline]
    pub unsafe fn senddata(
        &self,
        buf: &[u8],
        _desc: Option<MrDesc>,
        data: u64,
        dest: FiAddr,
        ctx: Context,
    ) -> Result<()> {
        let op = self.tx(
            ctx,
            IovList::one(buf.as_ptr() as usize, buf.len()),
            dest,
            0,
            data,
            FI_MSG | FI_REMOTE_CQ_DATA,
        );
        self.post_tx("senddata", op)
    }

    /// `fi_sendv`.
    ///
    /// # Safety
    /// Every segment must stay valid until the send completes.
    pub unsafe fn sendv(
        &self,
        iov: &[RawIov],
        _desc: &[MrDesc],
        dest: FiAddr,
        ctx: Context,
    ) -> Result<()> {
        let l = self.iov("sendv", iov)?;
        self.post_tx("sendv", self.tx(ctx, l, dest, 0, 0, FI_MSG))
    }

    /// `fi_sendmsg`, with flags from `FI_REMOTE_CQ_DATA`, `FI_COMPLETION`, `FI_INJECT`,
    /// `FI_MORE`, `FI_FENCE` and the completion levels.
    ///
    /// # Safety
    /// Every segment must stay valid until the send completes (during the call with `FI_INJECT`).
    pub unsafe fn sendmsg(&self, msg: &Msg<'_>, flags: u64) -> Result<()> {
        self.sendmsg_kind("sendmsg", msg, flags, FI_MSG)
    }

    fn sendmsg_kind(&self, what: &'static str, msg: &Msg<'_>, flags: u64, kind: u64) -> Result<()> {
        let op = self.msg_tx(what, msg, flags, kind)?;
        self.post_tx(what, op)
    }

    /// The send that `sendmsg` (`kind` `FI_MSG`) or `tsendmsg` (`FI_TAGGED`) describes.
    pub(crate) fn msg_tx(
        &self,
        what: &'static str,
        msg: &Msg<'_>,
        flags: u64,
        kind: u64,
    ) -> Result<TxOp> {
        if flags & !SEND_FLAGS != 0 {
            return Err(Error::BadFlags(format!(
                "{what}: flags {} are not send flags",
                caps_str(flags & !SEND_FLAGS)
            )));
        }
        let l = self.iov(what, msg.iov)?;
        Ok(TxOp {
            ctx: msg.context,
            iov: l,
            dest: msg.addr,
            tag: msg.tag,
            data: msg.data,
            flags: flags | kind,
        })
    }

    /// `fi_inject`: the data is copied before return; no completion entry is written.
    #[inline]
    pub fn inject(&self, buf: &[u8], dest: FiAddr) -> Result<()> {
        let op = TxOp {
            ctx: 0,
            iov: IovList::one(buf.as_ptr() as usize, buf.len()),
            dest,
            tag: 0,
            data: 0,
            flags: FI_MSG | FI_INJECT | INJECT_CALL,
        };
        self.post_tx("inject", op)
    }

    /// `fi_injectdata`.
    #[inline]
    pub fn injectdata(&self, buf: &[u8], data: u64, dest: FiAddr) -> Result<()> {
        let op = TxOp {
            ctx: 0,
            iov: IovList::one(buf.as_ptr() as usize, buf.len()),
            dest,
            tag: 0,
            data,
            flags: FI_MSG | FI_INJECT | INJECT_CALL | FI_REMOTE_CQ_DATA,
        };
        self.post_tx("injectdata", op)
    }

    /// `fi_recv`.
    ///
    /// # Safety
    /// `buf` must stay valid and untouched by anything else until the receive completes or is
    /// canceled.
    #[inline]
    pub unsafe fn recv(
        &self,
        buf: &mut [u8],
        _desc: Option<MrDesc>,
        src: FiAddr,
        ctx: Context,
    ) -> Result<()> {
        self.not_triggered_by_default("recv", self.rx_op_flags())?;
        let r = PostedRecv {
            ctx,
            iov: IovList::one(buf.as_mut_ptr() as usize, buf.len()),
            src,
            tag: 0,
            ignore: 0,
            flags: FI_MSG | (self.rx_op_flags() & RECV_FLAGS),
            used: 0,
            from_xpu: false,
        };
        self.post_rx("recv", r)
    }

    /// `fi_recvv`.
    ///
    /// # Safety
    /// As `recv`, for every segment.
    pub unsafe fn recvv(
        &self,
        iov: &[RawIov],
        _desc: &[MrDesc],
        src: FiAddr,
        ctx: Context,
    ) -> Result<()> {
        let l = self.iov("recvv", iov)?;
        self.not_triggered_by_default("recvv", self.rx_op_flags())?;
        let r = PostedRecv {
            ctx,
            iov: l,
            src,
            tag: 0,
            ignore: 0,
            flags: FI_MSG | (self.rx_op_flags() & RECV_FLAGS),
            used: 0,
            from_xpu: false,
        };
        self.post_rx("recvv", r)
    }

    /// `fi_recvmsg`, with flags from `FI_COMPLETION`, `FI_MULTI_RECV`, `FI_MORE`.
    ///
    /// # Safety
    /// As `recv`, for every segment.
    pub unsafe fn recvmsg(&self, msg: &Msg<'_>, flags: u64) -> Result<()> {
        let r = self.msg_rx(msg, flags)?;
        self.post_rx("recvmsg", r)
    }

    /// The receive that `recvmsg` describes.
    pub(crate) fn msg_rx(&self, msg: &Msg<'_>, flags: u64) -> Result<PostedRecv> {
        let flags = flags & !RX_IGNORED;
        if flags & !RECV_FLAGS != 0 {
            return Err(Error::BadFlags(format!(
                "recvmsg: flags {} are not receive flags",
                caps_str(flags & !RECV_FLAGS)
            )));
        }
        if flags & FI_MULTI_RECV != 0 && self.core.caps & FI_MULTI_RECV == 0 {
            return Err(Error::OpNotSupp(
                "recvmsg: endpoint opened without FI_MULTI_RECV".into(),
            ));
        }
        Ok(PostedRecv {
            ctx: msg.context,
            iov: self.iov("recvmsg", msg.iov)?,
            src: msg.addr,
            tag: 0,
            ignore: 0,
            flags: flags | FI_MSG,
            used: 0,
            from_xpu: false,
        })
    }

    /// `fi_tsend`.
    ///
    /// # Safety
    /// As `send`.
    #[inline]
    pub unsafe fn tsend(
        &self,
        buf: &[u8],
        _desc: Option<MrDesc>,
        dest: FiAddr,
        tag: u64,
        ctx: Context,
    ) -> Result<()> {
        let op = self.tx(
            ctx,
            IovList::one(buf.as_ptr() as usize, buf.len()),
            dest,
            tag,
            0,
            FI_TAGGED,
        );
        self.post_tx("tsend", op)
    }

    /// `fi_tsenddata`.
    ///
    /// # Safety
    /// As `send`.
    #[inline]
    pub unsafe fn tsenddata(
        &self,
        buf: &[u8],
        _desc: Option<MrDesc>,
        data: u64,
        dest: FiAddr,
        tag: u64,
        ctx: Context,
    ) -> Result<()> {
        let op = self.tx(
            ctx,
            IovList::one(buf.as_ptr() as usize, buf.len()),
            dest,
            tag,
            data,
            FI_TAGGED | FI_REMOTE_CQ_DATA,
        );
        self.post_tx("tsenddata", op)
    }

    /// `fi_tsendv`.
    ///
    /// # Safety
    /// As `sendv`.
    pub unsafe fn tsendv(
        &self,
        iov: &[RawIov],
        _desc: &[MrDesc],
        dest: FiAddr,
        tag: u64,
        ctx: Context,
    ) -> Result<()> {
        let l = self.iov("tsendv", iov)?;
        self.post_tx("tsendv", self.tx(ctx, l, dest, tag, 0, FI_TAGGED))
    }

    /// `fi_tsendmsg`.
    ///
    /// # Safety
    /// As `sendmsg`.
    pub unsafe fn tsendmsg(&self, msg: &Msg<'_>, flags: u64) -> Result<()> {
        self.sendmsg_kind("tsendmsg", msg, flags, FI_TAGGED)
    }

    /// `fi_tinject`.
    #[inline]
    pub fn tinject(&self, buf: &[u8], dest: FiAddr, tag: u64) -> Result<()> {
        let op = TxOp {
            ctx: 0,
            iov: IovList::one(buf.as_ptr() as usize, buf.len()),
            dest,
            tag,
            data: 0,
            flags: FI_TAGGED | FI_INJECT | INJECT_CALL,
        };
        self.post_tx("tinject", op)
    }

    /// `fi_tinjectdata`.
    #[inline]
    pub fn tinjectdata(&self, buf: &[u8], data: u64, dest: FiAddr, tag: u64) -> Result<()> {
        let op = TxOp {
            ctx: 0,
            iov: IovList::one(buf.as_ptr() as usize, buf.len()),
            dest,
            tag,
            data,
            flags: FI_TAGGED | FI_INJECT | INJECT_CALL | FI_REMOTE_CQ_DATA,
        };
        self.post_tx("tinjectdata", op)
    }

    /// `fi_trecv`.
    ///
    /// # Safety
    /// As `recv`.
    #[inline]
    pub unsafe fn trecv(
        &self,
        buf: &mut [u8],
        _desc: Option<MrDesc>,
        src: FiAddr,
        tag: u64,
        ignore: u64,
        ctx: Context,
    ) -> Result<()> {
        self.not_triggered_by_default("trecv", self.rx_op_flags())?;
        let r = PostedRecv {
            ctx,
            iov: IovList::one(buf.as_mut_ptr() as usize, buf.len()),
            src,
            tag,
            ignore,
            flags: FI_TAGGED | (self.rx_op_flags() & FI_COMPLETION),
            used: 0,
            from_xpu: false,
        };
        self.post_rx("trecv", r)
    }

    /// `fi_trecvv`.
    ///
    /// # Safety
    /// As `recv`, for every segment.
    pub unsafe fn trecvv(
        &self,
        iov: &[RawIov],
        _desc: &[MrDesc],
        src: FiAddr,
        tag: u64,
        ignore: u64,
        ctx: Context,
    ) -> Result<()> {
        self.not_triggered_by_default("trecvv", self.rx_op_flags())?;
        let r = PostedRecv {
            ctx,
            iov: self.iov("trecvv", iov)?,
            src,
            tag,
            ignore,
            flags: FI_TAGGED | (self.rx_op_flags() & FI_COMPLETION),
            used: 0,
            from_xpu: false,
        };
        self.post_rx("trecvv", r)
    }

    /// `fi_trecvmsg`, with flags from `FI_COMPLETION`, `FI_PEEK`, `FI_CLAIM`, `FI_DISCARD`.
    ///
    /// # Safety
    /// As `recv`, for every segment (no memory is touched with `FI_PEEK` or `FI_DISCARD`).
    pub unsafe fn trecvmsg(&self, msg: &Msg<'_>, flags: u64) -> Result<()> {
        let r = self.msg_trx(msg, flags)?;
        self.post_rx("trecvmsg", r)
    }

    /// The tagged receive that `trecvmsg` describes.
    pub(crate) fn msg_trx(&self, msg: &Msg<'_>, flags: u64) -> Result<PostedRecv> {
        let flags = flags & !RX_IGNORED;
        if flags & !TRECV_FLAGS != 0 {
            return Err(Error::BadFlags(format!(
                "trecvmsg: flags {} are not tagged receive flags",
                caps_str(flags & !TRECV_FLAGS)
            )));
        }
        if flags & FI_DISCARD != 0 && flags & (FI_PEEK | FI_CLAIM) == 0 {
            return Err(Error::BadFlags(
                "trecvmsg: FI_DISCARD needs FI_PEEK or FI_CLAIM".into(),
            ));
        }
        let iov = if flags & (FI_PEEK | FI_DISCARD) != 0 {
            IovList::default()
        } else {
            self.iov("trecvmsg", msg.iov)?
        };
        Ok(PostedRecv {
            ctx: msg.context,
            iov,
            src: msg.addr,
            tag: msg.tag,
            ignore: msg.ignore,
            flags: flags | FI_TAGGED,
            used: 0,
            from_xpu: false,
        })
    }

    /// `fi_close`: outstanding operations complete with `FI_ECANCELED`; bindings are released.
    pub fn close(self) -> Result<()> {
        self.shutdown();
        Ok(())
    }

    fn shutdown(&self) {
        // An alias owns nothing of the endpoint's.
        if self.alias.is_some() || self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(l) = &self.link {
            l.close();
        }
        self.ops.close();
        // What another thread's progress took out before the close is reported before it
        // returns: nothing of this endpoint's lands after `fi_close`.
        self.core.wait_reports();
        self.core.release_all_entries();
        self.domain_progress.remove(&self.progress_reg);
        if let Some(b) = self.core.bound() {
            let driven = self.driven_by_readers();
            for cq in b.cqs() {
                cq.unbind(driven.as_ref());
            }
            for c in b.cntrs() {
                c.unbind(driven.as_ref());
            }
        }
        // Every binding made, enabled or not (`bind_cq`, `bind_cntr`, `bind_av`).
        self.core
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .release();
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.shutdown();
    }
}
