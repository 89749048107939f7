//! The counter as the trigger machinery sees it. The machinery compares a counter's values
//! with thresholds, updates counters (a deferred `FI_OP_CNTR_SET` or `FI_OP_CNTR_ADD`, a
//! deferred transfer's completion counter) and lets reading one drive an endpoint, all through
//! this trait, which the counter implements (`cntr.rs`). The counter owns its threshold queue
//! and kicks it after every change; the machinery sits below it instead of importing it back.

use std::sync::Arc;

use crate::wait::ProgressSource;

/// A counter, to the trigger machinery.
pub(crate) trait CntrPort: Send + Sync + 'static {
    /// The success value, without driving progress.
    fn value(&self) -> u64;

    /// The error value, without driving progress.
    fn err_value(&self) -> u64;

    /// `fi_cntr_set`: what a deferred `FI_OP_CNTR_SET` does.
    fn set(self: Arc<Self>, v: u64);

    /// `fi_cntr_add`: what a deferred `FI_OP_CNTR_ADD` does.
    fn add(self: Arc<Self>, v: u64);

    /// One more completion on the success value (`ok`) or the error value, reported as a
    /// provider reports one: waiters woken, thresholds it reached started.
    fn count(self: Arc<Self>, ok: bool);

    /// Reading the counter drives `p` from now on (a deferred transfer's completion counter
    /// under manual progress: waiting on it makes the endpoint's progress). Not a binding:
    /// the counter may close whatever `p` does (the work that counts on it holds it alive).
    fn drive_by(&self, p: Arc<dyn ProgressSource>);

    /// Undoes `drive_by`.
    fn undrive(&self, p: &Arc<dyn ProgressSource>);
}
