//! The process's exported objects of one kind (counters, completion queues), held weakly, for
//! every watcher to serve: an object bound to no endpoint with a watcher of its own is still
//! looked at. One mechanism for both kinds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

pub(crate) struct Exports<T> {
    list: Mutex<Vec<Weak<T>>>,
    /// Exports alive (`born` / `gone`): a watcher skips the list while none is.
    live: AtomicUsize,
}

impl<T> Exports<T> {
    pub(crate) const fn new() -> Self {
        Exports {
            list: Mutex::new(Vec::new()),
            live: AtomicUsize::new(0),
        }
    }

    /// One more export made (its drop calls `gone`, also when another came first).
    pub(crate) fn born(&self) {
        self.live.fetch_add(1, Ordering::AcqRel);
    }

    /// An export dropped.
    pub(crate) fn gone(&self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether any export lives.
    pub(crate) fn any(&self) -> bool {
        self.live.load(Ordering::Acquire) > 0
    }

    /// Adds `x` to those served (dead ones are dropped on the way).
    pub(crate) fn add(&self, x: Weak<T>) {
        let mut v = self.list.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0);
        v.push(x);
    }

    /// Those alive now (none, without taking the lock, while no export lives).
    pub(crate) fn alive(&self) -> Vec<Arc<T>> {
        if !self.any() {
            return Vec::new();
        }
        let mut v = self.list.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0);
        v.iter().filter_map(Weak::upgrade).collect()
    }

    /// Whether `f` holds for one of those alive, looked at under the list's lock (nothing
    /// allocated: for a watcher's spin).
    pub(crate) fn any_where(&self, f: impl Fn(&T) -> bool) -> bool {
        if !self.any() {
            return false;
        }
        let v = self.list.lock().unwrap_or_else(|e| e.into_inner());
        v.iter().filter_map(Weak::upgrade).any(|x| f(&x))
    }
}
