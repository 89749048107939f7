//! Triggered operations and deferred work: fi_trigger(3), written once for every provider.
//!
//! - `FI_TRIGGER_THRESHOLD`: a data transfer posted with a `TriggerContext` (the
//!   `*_triggered` calls of `Endpoint`, on an endpoint opened with `FI_TRIGGER`) waits until its
//!   counter's success value reaches the threshold, then starts.
//! - The deferred work queue (`Domain::queue_work`, `cancel_work`, `flush_work`): a data
//!   transfer or a counter update that waits until the triggering counter's success plus error
//!   value reaches the threshold; a finished transfer adds one to its completion counter and
//!   writes endpoint completions only if it carries `FI_COMPLETION`.
//!
//! Both wait in the counter's `TriggerQueue` and start from inside the counter's
//! notification (`CntrInner::notify_observers`), which providers call after every completion
//! without holding their locks. An operation the provider cannot take yet (`Again`: a full
//! ring) waits on its endpoint's `EpLink` and is retried, in order, when the endpoint is
//! driven. Nothing a triggered operation names is read or written before it starts; when it
//! starts, it goes through the same path as an immediate post (`EpCore::start_*`), so an
//! `FI_HMEM` endpoint stages its device memory then (a send's data is gathered at the
//! trigger), and a staging copy that fails completes the operation with `FI_EIO`.
//!
//! The machinery sits below the endpoint and the counter and reaches them through two narrow
//! traits they implement: `Port` (`port.rs`, the endpoint: start, fail, report) and
//! `CntrPort` (`cntr_port.rs`, the counter: values, updates, binding). A waiting operation is
//! a `Job` (`job.rs`); it waits in a counter's `TriggerQueue` (`queue.rs`), on an endpoint's
//! `EpLink` (`link.rs`) or on an XPU's doorbell (`xpu*.rs`). Only `TriggerContext`
//! (`context.rs`), the argument the application passes, names a `Counter`.

mod cntr_port;
mod context;
mod deferred;
mod dwq;
mod job;
mod link;
mod port;
mod queue;
#[cfg(test)]
pub(crate) mod testkit;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_dwq;
#[cfg(test)]
mod tests_hmem;
#[cfg(test)]
mod tests_xpu;
mod xpu;
mod xpu_abi;
mod xpu_predict;
mod xpu_wake;

pub(crate) use cntr_port::CntrPort;
pub use context::TriggerContext;
pub(crate) use deferred::{DeferredRegistry, Pending};
pub(crate) use dwq::DomainWork;
pub use dwq::WorkId;
pub(crate) use job::{Job, Owner, WorkTag};
pub(crate) use link::EpLink;
pub(crate) use port::{Action, Armed, Port, StartError};
pub(crate) use queue::{TriggerQueue, Watch};
pub(crate) use xpu::DRAIN_MAX;
pub use xpu::{Doorbell, DoorbellAlloc, XPU_ARMED_MAX, XPU_ERR_BACKWARDS, XPU_ERR_PAST_ARMED};
pub use xpu_abi::{Signal, TriggerValue, TriggerVar, TriggerXpu, Xpu, XpuDevice};
pub(crate) use xpu_wake::sleep_joined;
pub use xpu_wake::{notify_xpu_ring, user_monitor_wait};
