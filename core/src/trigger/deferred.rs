//! Deferred transfers once started: the record that redirects a transfer's completion to its
//! completion counter, found again by the context the provider reports it with.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::cntr_port::CntrPort;
use crate::entry::Context;

/// A started deferred transfer, found again by the context it was handed to the provider with.
pub(crate) struct Pending {
    /// The context the application gave the transfer.
    pub(crate) user_ctx: Context,
    /// It carries `FI_COMPLETION`: the endpoint's CQ and counters report it too.
    pub(crate) ep_completion: bool,
    pub(super) completion: Option<Arc<dyn CntrPort>>,
}

impl Pending {
    /// The transfer completed (`ok`) or failed: one more on the completion counter's success
    /// or error value, unless the endpoint's own reporting already counted it there (the
    /// completion counter is the endpoint's bound counter for this class: `counted`).
    pub(crate) fn finish<C: CntrPort>(self, ok: bool, counted: Option<&Arc<C>>) {
        if let Some(c) = self.completion {
            if counted.is_some_and(|k| std::ptr::addr_eq(Arc::as_ptr(k), Arc::as_ptr(&c))) {
                return;
            }
            c.count(ok);
        }
    }
}

/// Started deferred transfers of one endpoint, by the context the provider was given: the
/// address of their `Pending` record with `INTERNAL_CTX` set, unique while it lives and never a
/// context the application or an XPU could have posted.
#[derive(Default)]
pub(crate) struct DeferredRegistry {
    live: AtomicUsize,
    map: Mutex<HashMap<usize, Box<Pending>>>,
}

impl DeferredRegistry {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Box<Pending>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn insert(&self, p: Pending) -> Context {
        let b = Box::new(p);
        // Never dereferenced: only told apart from the application's contexts.
        let key = (&*b as *const Pending as usize) | crate::entry::INTERNAL_CTX;
        self.map().insert(key, b);
        self.live.fetch_add(1, Ordering::AcqRel);
        key
    }

    pub(super) fn remove(&self, key: Context) -> Option<Box<Pending>> {
        let p = self.map().remove(&key);
        if p.is_some() {
            self.live.fetch_sub(1, Ordering::AcqRel);
        }
        p
    }

    /// The deferred transfer a completion with context `ctx` belongs to, if it is one. One
    /// load when none is in flight: the provider's own locking orders a transfer's start
    /// before its completion.
    pub(crate) fn claim(&self, ctx: Context) -> Option<Box<Pending>> {
        if self.live.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.remove(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_never_contexts_an_application_or_an_xpu_posts() {
        let r = DeferredRegistry::default();
        let key = r.insert(Pending {
            user_ctx: 7,
            ep_completion: false,
            completion: None,
        });
        assert_ne!(key & crate::entry::INTERNAL_CTX, 0);
        assert!(r.claim(key & !crate::entry::INTERNAL_CTX).is_none());
        assert_eq!(r.claim(key).map(|p| p.user_ctx), Some(7));
    }
}
