//! `DomainTag`: which domain an object was opened in. Its own module, below the objects that
//! carry it (CQ, counter, AV) and the domain that sets it, so that they need not import each
//! other. Its public path is also `object::DomainTag`.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// The domain an object (CQ, counter, AV) was opened in: fi_domain(3) resources serve
/// endpoints and operations of their own domain only. 0 means "opened outside any domain"
/// (`CompletionQueue::open` directly, as unit tests do), which any domain may use.
#[derive(Default)]
pub struct DomainTag(AtomicU64);

impl DomainTag {
    pub(crate) fn set(&self, domain: u64) {
        self.0.store(domain, Ordering::Relaxed);
    }

    /// The domain's number, 0 if none.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Refuses the object (a `kind` such as "counter") for use by domain `user` in `what`.
    pub(crate) fn check(&self, what: &str, kind: &str, user: u64) -> Result<()> {
        let own = self.get();
        if own != 0 && user != 0 && own != user {
            return Err(Error::Inval(format!(
                "{what}: the {kind} belongs to domain {own}, but is used in domain {user}"
            )));
        }
        Ok(())
    }
}
