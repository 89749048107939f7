//! xfabric: a native Rust implementation of the libfabric (OFI) 1.17 object model, with
//! XPU-triggered transfers. This crate is the one applications depend on: it re-exports the
//! object model from `xfabric-core` and knows the providers. Each type's page names the
//! libfabric object or call it stands for (`Endpoint` is a `struct fid_ep`, `Counter` a
//! `struct fid_cntr`, ...); libfabric's man pages (`fi_endpoint(3)`, `fi_cq(3)`, `fi_cntr(3)`,
//! `fi_trigger(3)`) are the specification. `use xfabric::prelude::*` brings what applications
//! use; what providers are built from lives in [`provider_api`].
//!
//! # A first program
//!
//! Two endpoints in one process, over the shm provider, with manual progress: one sends, the
//! other receives, and each reads its completion queue until the completion comes (reading a
//! CQ is what drives progress). Then a triggered send: with `FI_TRIGGER`, a send is armed to
//! start when a counter reaches 1, and starts when the application increments the counter.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use xfabric::prelude::*;
//!
//! /// An endpoint over shm with its CQ and address vector, enabled.
//! fn open(caps: u64) -> xfabric::Result<(Domain, Endpoint, CompletionQueue, AddressVector)> {
//!     let mut hints = Info { caps, ..Default::default() };
//!     hints.fabric_attr.prov_name = Some("shm".into());
//!     hints.ep_attr.ep_type = EpType::Rdm;
//!     hints.domain_attr.data_progress = Progress::Manual;
//!     let info = &xfabric::getinfo(fi_version(1, 17), None, None, 0, Some(&hints))?[0];
//!     let domain = xfabric::fabric(&info.fabric_attr)?.domain(info)?;
//!     let cq = domain.cq_open(&CqAttr { format: CqFormat::Msg, ..Default::default() })?;
//!     let av = domain.av_open(&AvAttr::default())?;
//!     let ep = domain.endpoint(info)?;
//!     ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV)?;
//!     ep.bind_av(&av)?;
//!     ep.enable()?;
//!     Ok((domain, ep, cq, av))
//! }
//!
//! /// Reads `cq` until one completion comes: with manual progress, the read moves the data.
//! /// Bounded, as every wait should be.
//! fn wait_one(cq: &CompletionQueue) -> xfabric::Result<CqMsgEntry> {
//!     let deadline = Instant::now() + Duration::from_secs(30);
//!     let mut entry = [CqMsgEntry::default()];
//!     loop {
//!         match cq.read(&mut entry) {
//!             Ok(_) => return Ok(entry[0]),
//!             Err(Error::Again(_)) if Instant::now() < deadline => {}
//!             Err(Error::Again(_)) => return Err(Error::TimedOut("no completion in 30 s")),
//!             Err(Error::Avail) => {
//!                 let e = cq.readerr()?;
//!                 let why = xfabric::strerror(e.err);
//!                 return Err(Error::Inval(format!("operation {} failed: {why}", e.op_context)));
//!             }
//!             Err(e) => return Err(e),
//!         }
//!     }
//! }
//!
//! # fn main() -> xfabric::Result<()> {
//! let (_d1, sender, tx_cq, tx_av) = open(FI_MSG | FI_TRIGGER)?;
//! let (_d2, receiver, rx_cq, _rx_av) = open(FI_MSG)?;
//! let to = tx_av.insert_one(&receiver.getname()?)?;
//!
//! let mut inbox = [0u8; 5];
//! // SAFETY: `inbox` stays alive and untouched until its completion is read below.
//! unsafe { receiver.recv(&mut inbox, None, FI_ADDR_UNSPEC, 1)? };
//! let hello = *b"hello";
//! // SAFETY: `hello` stays alive and unchanged until its completion is read below.
//! unsafe { sender.send(&hello, None, to, 2)? };
//! assert_eq!(wait_one(&tx_cq)?.op_context, 2);
//! let got = wait_one(&rx_cq)?;
//! assert_eq!((got.op_context, got.len), (1, 5));
//! assert_eq!(&inbox, b"hello");
//!
//! // A counter-triggered send: armed now, started when `go` reaches 1.
//! let go = _d1.cntr_open(&CntrAttr::default())?;
//! let later = *b"later";
//! let iov = [RawIov::of(&later)];
//! let msg = Msg { iov: &iov, desc: &[], addr: to, context: 3, data: 0, tag: 0, ignore: 0 };
//! // SAFETY: `inbox` and `later` outlive the operations (their completions are read below).
//! unsafe {
//!     receiver.recv(&mut inbox, None, FI_ADDR_UNSPEC, 4)?;
//!     sender.sendmsg_triggered(&msg, 0, &TriggerContext::threshold(&go, 1))?;
//! }
//! go.add(1)?;
//! assert_eq!(wait_one(&tx_cq)?.op_context, 3);
//! assert_eq!(wait_one(&rx_cq)?.op_context, 4);
//! assert_eq!(&inbox, b"later");
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

use std::sync::Arc;

// The crate root holds what applications use; what providers are built from is in
// `provider_api`, so an application's view of the crate is libfabric's, not xfabric's insides.
pub use xfabric_core::consts::*;
pub use xfabric_core::entry::*;
/// The device API's exported handles (`Endpoint::export_xpu`, `CompletionQueue::export_xpu`,
/// `Counter::export_xpu`); the device calls are in `xpu::device`.
pub use xfabric_core::xpu::{XpuCntr, XpuCq, XpuEp};
pub use xfabric_core::{atomic, av, clock, consts, entry, error, log, settings, xpu};
pub use xfabric_core::{
    notify_xpu_ring, strerror, user_monitor_wait, AddrFormat, AddressVector, AtomicOp, AvAttr,
    Buffered, CntrAttr, CompletionQueue, Counter, CqAttr, Datatype, DeferredWork, Domain,
    DomainAttr, Endpoint, EpAttr, EqAttr, EqEntry, EqErrEntry, Error, EventQueue, Fabric,
    FabricAttr, Iface, Info, MemoryRegion, MrAttr, MrDesc, Msg, MsgAtomic, MsgRma, OpAtomic,
    OpCntr, OpCompareAtomic, OpFetchAtomic, OpMsg, OpRma, PollAttr, PollSet, Pollable, RawIov,
    Result, RmaIov, RxAttr, TriggerContext, TriggerValue, TriggerVar, TriggerXpu, TxAttr, WaitAttr,
    WaitSet, WorkId, WorkOp, Xpu, XpuDevice, ATOMIC_MAX, XPU_ARMED_MAX, XPU_ERR_BACKWARDS,
    XPU_ERR_PAST_ARMED,
};
pub use xfabric_hmem as hmem;
pub use xfabric_kernels as kernels;
pub use xfabric_providers as providers;
pub use xfabric_xpu_trigger as xpu_trigger;

pub mod hex;
pub mod tostr;

/// What applications use, for `use xfabric::prelude::*`: the objects (fabric, domain,
/// endpoint, CQ, counter, AV, MR, EQ, wait set), their attributes, completion entries, the
/// `FI_*` constants, triggered and deferred operations, errors, and `getinfo` and `fabric` to
/// open them.
pub mod prelude {
    pub use crate::consts::*;
    pub use crate::entry::*;
    pub use crate::{fabric, getinfo, Error, Result};
    pub use crate::{
        AddressVector, AtomicOp, AvAttr, CntrAttr, CompletionQueue, Counter, CqAttr, Datatype,
        DeferredWork, Domain, Endpoint, EqAttr, EventQueue, Fabric, Info, MemoryRegion, MrAttr,
        MrDesc, Msg, MsgAtomic, MsgRma, OpMsg, RawIov, RmaIov, TriggerContext, WaitAttr, WaitSet,
        WorkOp,
    };
}

/// What providers are built from, not what applications call: the provider and domain
/// traits, the generic endpoint half (`EpCore`) that writes completions, receive matching
/// (`RecvQueue`), counter internals, progress sources, device-memory hooks and doorbells.
/// `xfabric-providers` uses these through `xfabric-core`; they are here for a provider kept
/// outside this workspace.
pub mod provider_api {
    pub use xfabric_core::cntr::CntrInner;
    pub use xfabric_core::cq::CqInner;
    pub use xfabric_core::rxq::{IovList, RecvQueue};
    pub use xfabric_core::{ep, hmem_iface, hmem_stage, object, rxq, trigger, wait};
    pub use xfabric_core::{
        AtomicReq, CntrClass, DomainOps, Doorbell, DoorbellAlloc, EndpointOps, EpCore, HmemOps,
        Owner, ProgressSource, Provider, RmaIovList, RmaOp, Signal, TxOp,
    };
}

/// The provider used when hints name none.
pub const DEFAULT_PROVIDER: &str = "shm";

/// Every provider this build has.
pub fn provider_list() -> Vec<Arc<dyn provider_api::Provider>> {
    xfabric_providers::all()
}

/// `fi_getinfo`: every (provider, configuration) that satisfies `hints`, best first. `version`
/// is the API version the caller was written for (`fi_version(1, 17)`); `NoData` says why
/// nothing matched.
pub fn getinfo(
    version: u32,
    node: Option<&str>,
    service: Option<&str>,
    flags: u64,
    hints: Option<&Info>,
) -> Result<Vec<Info>> {
    if version > fi_version(FI_MAJOR_VERSION, FI_MINOR_VERSION) || version < fi_version(1, 0) {
        return Err(Error::NoSys(format!(
            "getinfo: API version {}.{} is not supported (1.0 to {FI_MAJOR_VERSION}.{FI_MINOR_VERSION})",
            version >> 16,
            version & 0xffff
        )));
    }
    xfabric_core::log::init();
    if flags & FI_PROV_ATTR_ONLY != 0 {
        // Exactly one entry per provider, usable here or not, whatever the hints: its name and
        // version, every other field its default (fi_getinfo(3)); `fi_info -l` lists these.
        return Ok(provider_list()
            .into_iter()
            .map(|p| {
                let mut i = Info::default();
                i.fabric_attr.prov_name = Some(p.name().to_string());
                i.fabric_attr.prov_version = p.version();
                i.fabric_attr.api_version = version;
                i
            })
            .collect());
    }
    if flags & FI_SOURCE != 0 && node.is_none() && service.is_none() {
        return Err(Error::NoData(
            "getinfo: FI_SOURCE names this side by node or service, and both are NULL \
             (fi_getinfo(3))"
                .into(),
        ));
    }
    let default = Info::default();
    let hints = hints.unwrap_or(&default);
    let mut out = Vec::new();
    let mut reasons = Vec::new();
    for p in provider_list() {
        match p.getinfo(node, service, flags, hints) {
            // The version the caller asked for is the one its fabric will speak.
            Ok(v) => out.extend(v.into_iter().map(|mut i| {
                i.fabric_attr.api_version = version;
                i
            })),
            Err(Error::NoData(why)) => reasons.push(why),
            Err(e) => reasons.push(e.to_string()),
        }
    }
    tracing::debug!(
        entries = out.len(),
        node,
        service,
        flags,
        "getinfo: {} answer(s)",
        out.len()
    );
    if out.is_empty() {
        return Err(Error::NoData(format!(
            "getinfo: no provider matches the hints: {}",
            reasons.join("; ")
        )));
    }
    Ok(out)
}

/// `fi_fabric`: opens the fabric `attr` describes (an `Info::fabric_attr` from getinfo).
pub fn fabric(attr: &FabricAttr) -> Result<Fabric> {
    let name = attr.prov_name.as_deref().unwrap_or(DEFAULT_PROVIDER);
    let prov = provider_list()
        .into_iter()
        .find(|p| p.name() == name)
        .ok_or_else(|| Error::NoData(format!("fabric: no provider named {name:?}")))?;
    Fabric::open(prov, attr)
}
