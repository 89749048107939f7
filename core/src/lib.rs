//! xfabric-core: libfabric's object model in Rust, and the generic machinery every provider
//! shares. A provider implements transport (`DomainOps`, `EndpointOps`); completion queues,
//! counters, address vectors, memory-region keys, event queues, wait sets, receive matching and
//! progress are written here once.

#![warn(missing_docs)]

pub mod atomic;
pub mod av;
pub mod clock;
pub mod cntr;
pub mod consts;
pub mod copy;
pub mod cq;
pub mod entry;
pub mod ep;
/// The old path of `ep::atomic` (atomic operations on an endpoint).
pub mod ep_atomic {
    pub use crate::ep::atomic::*;
}
/// The old path of `ep::rma` (RMA operations on an endpoint).
pub mod ep_rma {
    pub use crate::ep::rma::*;
}
pub mod eq;
pub mod error;
#[cfg(test)]
pub(crate) mod hmem_fake;
pub mod hmem_iface;
pub mod hmem_stage;
pub mod info;
pub mod log;
pub mod mr;
pub mod object;
pub(crate) mod op;
pub mod poll;
mod rcu;
pub mod rdm;
pub mod rxq;
pub mod settings;
mod tag;
pub mod trigger;
pub mod wait;
pub mod work;
pub mod xpu;

pub use atomic::{AtomicOp, Datatype};
pub use av::{AddrFormat, AddressVector, AvAttr};
pub use cntr::{CntrAttr, Counter};
pub use consts::*;
pub use cq::{CompletionQueue, CqAttr};
pub use entry::*;
pub use ep::{Buffered, CntrClass, Endpoint, EndpointOps, EpCore, Msg, TxOp};
pub use ep_atomic::{AtomicReq, MsgAtomic, ATOMIC_MAX};
pub use ep_rma::{MsgRma, RmaIov, RmaIovList, RmaOp};
pub use eq::{EqAttr, EqEntry, EqErrEntry, EventQueue};
pub use error::{strerror, Error, Result};
pub use hmem_iface::{HmemOps, Iface, Owner};
pub use info::{DomainAttr, EpAttr, FabricAttr, Info, RxAttr, TxAttr};
pub use mr::{MemoryRegion, MrAttr, MrDesc, ProviderMr, RegionCut};
pub use object::{Domain, DomainOps, Fabric, Provider};
pub use poll::{PollAttr, PollSet, Pollable};
pub use rxq::{IovList, RawIov};
pub use trigger::{
    notify_xpu_ring, user_monitor_wait, Doorbell, DoorbellAlloc, Signal, TriggerValue, TriggerVar,
    TriggerXpu, Xpu, XpuDevice, XPU_ARMED_MAX, XPU_ERR_BACKWARDS, XPU_ERR_PAST_ARMED,
};
pub use trigger::{TriggerContext, WorkId};
pub use wait::{Join, ProgressSource, WaitAttr, WaitSet};
pub use work::{
    DeferredWork, OpAtomic, OpCntr, OpCompareAtomic, OpFetchAtomic, OpMsg, OpRma, WorkOp,
};
