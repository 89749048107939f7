//! xfabric-providers: transports that plug into xfabric-core. Each moves bytes and nothing
//! else; queues, counters, matching and addressing are core's.

#![warn(missing_docs)]

use std::sync::Arc;

use xfabric_core::Provider;

mod clock;
mod domain;
pub mod hmem;
pub mod inet;
mod info;
mod rdm;
pub mod shm;
pub mod tcp;
pub mod verbs;

/// Every provider this build has, in preference order.
pub fn all() -> Vec<Arc<dyn Provider>> {
    vec![
        Arc::new(shm::Shm),
        Arc::new(tcp::Tcp),
        Arc::new(verbs::Verbs),
    ]
}
