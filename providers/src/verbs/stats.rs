//! What this process's verbs endpoints did, for tests and diagnostics (the NIC's one-sided
//! operations, how device memory was registered), and fault injection for tests: counters
//! below every other verbs file, which bump them.

use std::sync::atomic::{AtomicU64, Ordering};

static FAULTS: AtomicU64 = AtomicU64::new(0);

/// Fault injection for tests: every verbs endpoint of this process moves its queue pairs to the
/// error state at its next progress (`ibv_modify_qp` to `IBV_QPS_ERR`): what they had posted
/// completes flushed, and the operations waiting on those peers fail.
pub fn fault_queue_pairs() {
    FAULTS.fetch_add(1, Ordering::SeqCst);
}

pub(super) fn faults() -> u64 {
    FAULTS.load(Ordering::SeqCst)
}

pub(super) static NATIVE_DONE: AtomicU64 = AtomicU64::new(0);
pub(super) static NATIVE_REFUSED: AtomicU64 = AtomicU64::new(0);
pub(super) static NATIVE_WRITES_IN: AtomicU64 = AtomicU64::new(0);
pub(super) static PULLS: AtomicU64 = AtomicU64::new(0);
pub(super) static READ_PIECES: AtomicU64 = AtomicU64::new(0);

/// What this process's NIC did one-sidedly: evidence, for tests and diagnostics, of which
/// path operations took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NativeCounts {
    /// RDMA writes, reads and atomics carried out successfully.
    pub done: u64,
    /// Ones the peer's NIC refused (a bad key, range or access).
    pub refused: u64,
    /// Peers' NIC writes into this process's memory that it was told of (immediate data).
    pub writes_in: u64,
    /// Copies of a peer's memory the NIC made for the engine (large messages read by RDMA).
    pub pulls: u64,
    /// Work requests the application's large RDMA reads were posted as (each of at most
    /// 256 KiB; a read of up to 256 KiB is one work request and not counted here).
    pub read_pieces: u64,
}

/// How CUDA memory registered in verbs domains went in this process: by dma-buf (the NIC
/// reaches it) or staged through host memory (the engine does), and why the last staged one
/// was (the driver, the library or the device refusing).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Regions registered with the NIC by dma-buf.
    pub by_dmabuf: u64,
    /// Regions left staged.
    pub staged: u64,
    /// Why the last staged one was.
    pub why_staged: Option<String>,
}

/// The counts so far.
pub fn native_counts() -> NativeCounts {
    NativeCounts {
        done: NATIVE_DONE.load(Ordering::Relaxed),
        refused: NATIVE_REFUSED.load(Ordering::Relaxed),
        writes_in: NATIVE_WRITES_IN.load(Ordering::Relaxed),
        pulls: PULLS.load(Ordering::Relaxed),
        read_pieces: READ_PIECES.load(Ordering::Relaxed),
    }
}
