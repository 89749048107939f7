//! `struct fi_triggered_context`: the condition a triggered operation waits for, as the
//! application gives it to an endpoint's `*_triggered` calls. It names a counter, so it sits
//! above the counter; the machinery that waits for it does not.

use crate::cntr::Counter;
use crate::consts::TriggerEvent;

/// `struct fi_triggered_context`: the condition a triggered operation waits for.
#[derive(Clone)]
#[non_exhaustive]
pub enum TriggerContext {
    /// `FI_TRIGGER_THRESHOLD` (`struct fi_trigger_threshold`): start once `cntr`'s success
    /// value reaches `threshold`. Operations on one counter start in threshold order, equal
    /// thresholds in posting order, even when the counter moves by more than one at a time.
    Threshold {
        /// The counter to watch.
        cntr: Counter,
        /// The value it must reach.
        threshold: u64,
    },
}

impl TriggerContext {
    /// A threshold trigger on `cntr`.
    pub fn threshold(cntr: &Counter, threshold: u64) -> Self {
        TriggerContext::Threshold {
            cntr: cntr.clone(),
            threshold,
        }
    }

    /// `event_type` of the C structure.
    pub fn event_type(&self) -> TriggerEvent {
        match self {
            TriggerContext::Threshold { .. } => TriggerEvent::Threshold,
        }
    }
}
