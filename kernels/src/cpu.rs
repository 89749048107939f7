//! The CPU as XPU: what the CUDA kernels do, done by a host thread, for machines without a GPU
//! and for providers' tests. Same store semantics (each variable at its exact width, in order,
//! after the data), same data pattern.

use std::sync::atomic::{fence, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::thread::JoinHandle;

use xfabric_xpu_trigger::{Signal, TriggerVar};

use crate::KernelError;

/// The value the example kernel writes at global index `i` (`xf_compute_and_trigger`):
/// `(uint32_t)(i * 2654435761u) ^ seed`. Only the low 32 bits of the product matter, so the
/// 64-bit index gives the same value the device computes.
pub fn pattern(i: u64, seed: u32) -> u32 {
    (i.wrapping_mul(2_654_435_761) as u32) ^ seed
}

/// Computes one bucket: `out[j] = pattern(base + j, seed)`, written `passes` times over (at
/// least once). The extra passes are work and nothing else: they let a demo or a test give the
/// CPU XPU a compute time of its choosing per bucket (the pattern alone runs at memory speed,
/// far faster than any transfer), with the same bytes at the end.
pub fn compute_bucket(out: &mut [u32], base: u64, seed: u32, passes: u32) {
    for _ in 0..passes.max(1) {
        // Hidden from the optimiser, so that each pass is computed and stored again.
        let seed = std::hint::black_box(seed);
        for (j, x) in out.iter_mut().enumerate() {
            *x = pattern(base + j as u64, seed);
        }
        std::hint::black_box(&mut *out);
    }
}

/// How much a CPU XPU computes per bucket, in sixteenths of a pass of [`compute_bucket`]
/// (at least one whole pass, the one that leaves the pattern): a part of a pass lets a demo
/// match a bucket's compute to its transfer more finely than a pass does (a pass over 32 KiB
/// takes about 1.5 us, as long as half a transfer of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CpuWork(u32);

impl CpuWork {
    /// One pass: the pattern and nothing more.
    pub const ONCE: CpuWork = CpuWork(16);

    /// `passes` whole passes (0 counts as 1).
    pub fn passes(passes: u32) -> CpuWork {
        CpuWork(passes.max(1).saturating_mul(16))
    }

    /// `n` sixteenths of a pass (at least 16: one pass).
    pub fn sixteenths(n: u32) -> CpuWork {
        CpuWork(n.max(16))
    }

    /// In sixteenths of a pass.
    pub fn in_sixteenths(self) -> u32 {
        self.0
    }

    /// In passes.
    pub fn in_passes(self) -> f64 {
        f64::from(self.0) / 16.0
    }

    /// Whole passes, rounded up (what an XPU that computes whole passes only, a GPU kernel,
    /// gets for the same work).
    pub fn whole_passes(self) -> u32 {
        self.0.div_ceil(16)
    }
}

/// [`compute_bucket`] for `work`: its part of a pass over the bucket's first sixteenths, then
/// its whole passes over all of it (the last leaves the pattern).
pub fn compute_bucket_work(out: &mut [u32], base: u64, seed: u32, work: CpuWork) {
    let part = (work.0 % 16) as usize;
    if part > 0 {
        let head = out.len() * part / 16;
        compute_bucket(&mut out[..head], base, seed, 1);
    }
    compute_bucket(out, base, seed, work.0 / 16);
}

/// Checks one variable the way [`ring`] will use it.
///
/// # Safety
/// As [`TriggerVar::signal`]: for `FI_UINT8` with count > 1, `value.data` points to `count`
/// readable bytes.
unsafe fn checked_signal(index: usize, v: &TriggerVar) -> Result<Signal<'_>, KernelError> {
    if v.addr.is_null() {
        return Err(KernelError::InvalidVar {
            index,
            reason: "addr is null".into(),
        });
    }
    // SAFETY: the caller's contract.
    unsafe { v.signal() }.ok_or_else(|| KernelError::InvalidVar {
        index,
        reason: format!(
            "datatype {} with count {} is not FI_UINT8/16/32/64 with count 1, nor FI_UINT8 \
             bytes with a data pointer",
            v.datatype, v.count
        ),
    })
}

/// Checks a whole list before anything is stored, so a bad variable never leaves a list half
/// rung (the device kernel can only stop at it).
///
/// # Safety
/// For every variable of `FI_UINT8` with count > 1, `value.data` points to `count` readable
/// bytes.
pub unsafe fn validate(vars: &[TriggerVar]) -> Result<(), KernelError> {
    for (i, v) in vars.iter().enumerate() {
        // SAFETY: the caller's contract.
        unsafe { checked_signal(i, v) }?;
    }
    Ok(())
}

/// Rings a trigger list from this thread: each variable's value stored at its address with a
/// release store of its exact width (bytes: copied, then a release fence), in order, then a
/// sleeping watcher is woken. Everything this thread wrote before the call is visible to whoever
/// observes a variable's value.
///
/// Nothing is stored unless every variable is well formed.
///
/// # Safety
/// Each `addr` must be valid, suitably aligned for its width and writable for the store (and
/// only accessed atomically by others); for `FI_UINT8` with count > 1, `value.data` must point
/// to `count` readable bytes and `addr` to `count` writable ones.
pub unsafe fn ring(vars: &[TriggerVar]) -> Result<(), KernelError> {
    // SAFETY: the caller's contract.
    unsafe { store(vars) }?;
    // A CPU can do what a GPU cannot: wake a watcher asleep past its spin window.
    xfabric_xpu_trigger::notify_xpu_ring();
    Ok(())
}

/// Rings a trigger list as a device does: the stores of [`ring`] and nothing else, so that no
/// sleeping watcher is woken and the watcher must find the values by looking (what a GPU's
/// store to mapped host memory, or another process's, looks like to the host).
///
/// # Safety
/// As [`ring`].
pub unsafe fn store(vars: &[TriggerVar]) -> Result<(), KernelError> {
    // SAFETY: the caller's contract.
    unsafe { validate(vars) }?;
    for v in vars {
        // SAFETY: validated above; the stores are the caller's contract.
        unsafe {
            match v.signal() {
                Some(Signal::U8(x)) => {
                    AtomicU8::from_ptr(v.addr.cast()).store(x, Ordering::Release)
                }
                Some(Signal::U16(x)) => {
                    AtomicU16::from_ptr(v.addr.cast()).store(x, Ordering::Release)
                }
                Some(Signal::U32(x)) => {
                    AtomicU32::from_ptr(v.addr.cast()).store(x, Ordering::Release)
                }
                Some(Signal::U64(x)) => {
                    AtomicU64::from_ptr(v.addr.cast()).store(x, Ordering::Release)
                }
                Some(Signal::Bytes(b)) => {
                    // The fence orders the data and earlier variables before the bytes; a
                    // second one orders the bytes before whatever comes next.
                    fence(Ordering::Release);
                    std::ptr::copy_nonoverlapping(b.as_ptr(), v.addr.cast::<u8>(), b.len());
                    fence(Ordering::Release);
                }
                None => unreachable!("validated above"),
            }
        }
    }
    Ok(())
}

/// A CPU thread standing in for a GPU: "compute then trigger" on a host buffer.
#[derive(Debug)]
pub struct CpuXpu {
    /// Its compute per bucket.
    work: CpuWork,
}

impl Default for CpuXpu {
    fn default() -> Self {
        CpuXpu {
            work: CpuWork::ONCE,
        }
    }
}

/// A host buffer an XPU may write while the host keeps its address, and the fabric reads.
struct SendPtr(*mut u32);
// SAFETY: the raw buffer is handed to exactly one worker thread; the caller's contract on
// `compute_and_trigger` makes it that thread's to write.
unsafe impl Send for SendPtr {}

impl CpuXpu {
    /// A CPU XPU.
    pub fn new() -> Self {
        CpuXpu::default()
    }

    /// A CPU XPU that computes each bucket `passes` times over ([`compute_bucket`]); 0 counts
    /// as 1.
    pub fn with_passes(passes: u32) -> Self {
        CpuXpu {
            work: CpuWork::passes(passes),
        }
    }

    /// The equivalent of `xf_compute_and_trigger`, on a new thread: for each bucket k in order,
    /// fill `out[k*bucket_elems..(k+1)*bucket_elems]` with [`pattern`] ([`compute_bucket`],
    /// with this XPU's passes), then ring `vars[k]`.
    /// Join the handle to wait for it; it returns the first error, with nothing rung from the
    /// bad variable on.
    ///
    /// # Safety
    /// `out` must point to `bucket_elems * nbuckets` writable `u32`s that nothing else writes
    /// until the thread finishes, and that are read only after their bucket's variable is seen
    /// rung; `vars` as for [`ring`], and the addresses stay valid until the thread finishes.
    pub unsafe fn compute_and_trigger(
        &self,
        out: *mut u32,
        bucket_elems: u32,
        nbuckets: u32,
        seed: u32,
        vars: Vec<TriggerVar>,
    ) -> Result<JoinHandle<Result<(), KernelError>>, KernelError> {
        check_buckets(
            "CpuXpu::compute_and_trigger",
            bucket_elems,
            nbuckets,
            vars.len(),
        )?;
        if out.is_null() {
            return Err(KernelError::inval(
                "CpuXpu::compute_and_trigger",
                "out is null",
            ));
        }
        // SAFETY: the caller's contract.
        unsafe { validate(&vars) }?;
        let out = SendPtr(out);
        let work = self.work;
        let spawned = std::thread::Builder::new()
            .name("xfabric-cpu-xpu".into())
            .spawn(move || {
                let out = out;
                // SAFETY: the caller's contract, checked shape.
                unsafe { compute_and_ring(out.0, bucket_elems as usize, seed, work, &vars) }
                    .map(|_| ())
            });
        spawned.map_err(|e| KernelError::inval("CpuXpu::compute_and_trigger", e.to_string()))
    }
}

/// The compute-and-trigger kernel's body, on the calling thread: for each bucket k in order,
/// compute it (`work`: [`compute_bucket_work`]), then ring `vars[k]`. Returns where the time
/// went; stops at the first variable that cannot be rung.
///
/// # Safety
/// `out` points to `n * vars.len()` writable `u32`s nothing else touches meanwhile, read only
/// after their bucket's variable is seen rung; `vars` as for [`ring`].
unsafe fn compute_and_ring(
    out: *mut u32,
    n: usize,
    seed: u32,
    work: CpuWork,
    vars: &[TriggerVar],
) -> Result<RingProfile, KernelError> {
    // Each bucket's two boundaries are read from the cheapest clock there is (`Ticks`), as
    // the ordinary way's compute reads none: the profile should not make the rings it
    // measures look dearer.
    let clock = Ticks::start();
    let (mut computing, mut ringing) = (0u64, 0u64);
    let mut t = clock.now();
    for (k, var) in vars.iter().enumerate() {
        let base = k * n;
        // SAFETY: the caller's contract: this bucket is ours to write.
        let bucket = unsafe { std::slice::from_raw_parts_mut(out.add(base), n) };
        compute_bucket_work(bucket, base as u64, seed, work);
        let computed = clock.now();
        // A step backwards (a move between cores whose counters disagree) counts as none.
        computing = computing.saturating_add(computed.saturating_sub(t));
        // SAFETY: the caller's contract; ring's release store publishes the bucket.
        unsafe { ring(std::slice::from_ref(var)) }?;
        t = clock.now();
        ringing = ringing.saturating_add(t.saturating_sub(computed));
    }
    Ok(clock.profile(computing, ringing))
}

/// A clock for [`compute_and_ring`]'s profile: the time-stamp counter on x86-64 (a read costs
/// a third of a `clock_gettime` on a VM), turned into time by the kernel's own span as the
/// system clock measures it; elsewhere the system clock's nanoseconds.
struct Ticks {
    t0: std::time::Instant,
    ticks0: u64,
}

impl Ticks {
    fn start() -> Self {
        let t0 = std::time::Instant::now();
        Ticks {
            ticks0: Self::read(t0),
            t0,
        }
    }

    #[inline(always)]
    fn now(&self) -> u64 {
        Self::read(self.t0)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn read(_t0: std::time::Instant) -> u64 {
        // SAFETY: reading the time-stamp counter has no preconditions.
        unsafe { std::arch::x86_64::_rdtsc() }
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[inline(always)]
    fn read(t0: std::time::Instant) -> u64 {
        t0.elapsed().as_nanos() as u64
    }

    /// `compute` and `ring` ticks as durations, at the rate the span since `start` shows.
    fn profile(&self, compute: u64, ring: u64) -> RingProfile {
        let span = self.t0.elapsed().as_nanos() as f64;
        let ticks = self.now().saturating_sub(self.ticks0).max(1) as f64;
        let ns = |t: u64| std::time::Duration::from_nanos((t as f64 * span / ticks) as u64);
        RingProfile {
            compute: ns(compute),
            ring: ns(ring),
        }
    }
}

/// A CPU XPU that keeps its thread, as a GPU keeps its stream: [`launch`](Self::launch) queues
/// work and returns, [`synchronize`](Self::synchronize) waits for everything launched. What
/// [`CpuXpu::compute_and_trigger`] pays per call and this does not: a thread's creation (its
/// stack mapped and faulted in) and exit (the stack given back, the joiner woken by the
/// kernel's child-tid futex), tens of microseconds each on a VM, on the core the XPU computes
/// on. The thread is created on the caller's CPU affinity and ends when this is dropped.
pub struct CpuXpuStream {
    work: Option<std::sync::mpsc::Sender<Kernel>>,
    state: std::sync::Arc<(std::sync::Mutex<StreamState>, std::sync::Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for CpuXpuStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuXpuStream").finish_non_exhaustive()
    }
}

/// Launched and finished kernels, and the first error not yet reported.
#[derive(Default)]
struct StreamState {
    launched: u64,
    finished: u64,
    error: Option<KernelError>,
    last_rings: Option<RingProfile>,
}

/// Where the thread of a [`CpuXpuStream::compute_and_trigger`] kernel spent its time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingProfile {
    /// Computing the buckets.
    pub compute: std::time::Duration,
    /// Ringing their variables: the stores, and what a CPU XPU's ring does on its own thread
    /// (it starts the operations it reached: host work that a GPU leaves to the host's cores).
    pub ring: std::time::Duration,
}

/// One launched kernel: what it runs on the stream's thread.
type Kernel = Box<dyn FnOnce() -> Result<(), KernelError> + Send>;

impl CpuXpuStream {
    /// Starts the stream's thread (named `name`).
    pub fn new(name: &str) -> Result<Self, KernelError> {
        let (tx, rx) = std::sync::mpsc::channel::<Kernel>();
        let state: std::sync::Arc<(std::sync::Mutex<StreamState>, std::sync::Condvar)> =
            Default::default();
        let st = state.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // Ends when the stream is dropped (its sender with it).
                for k in rx {
                    // A kernel that panics is an error of that launch, not the stream's end.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(k))
                        .unwrap_or_else(|_| {
                            Err(KernelError::inval(
                                "CpuXpuStream",
                                "a launched kernel panicked",
                            ))
                        });
                    let (m, cv) = &*st;
                    let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
                    s.finished += 1;
                    if let Err(e) = r {
                        s.error.get_or_insert(e);
                    }
                    if s.finished == s.launched {
                        cv.notify_all();
                    }
                }
            })
            .map_err(|e| KernelError::inval("CpuXpuStream::new", e.to_string()))?;
        Ok(CpuXpuStream {
            work: Some(tx),
            state,
            thread: Some(thread),
        })
    }

    /// Queues `kernel` to run on the stream's thread after everything launched before it.
    pub fn launch(
        &self,
        kernel: impl FnOnce() -> Result<(), KernelError> + Send + 'static,
    ) -> Result<(), KernelError> {
        let (m, _) = &*self.state;
        m.lock().unwrap_or_else(|e| e.into_inner()).launched += 1;
        let sent = self.work.as_ref().map(|w| w.send(Box::new(kernel)));
        if !matches!(sent, Some(Ok(()))) {
            let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
            s.launched -= 1;
            return Err(KernelError::inval(
                "CpuXpuStream::launch",
                "the stream's thread is gone",
            ));
        }
        Ok(())
    }

    /// Waits until everything launched has run; returns the first error any of it gave since
    /// the last call (and clears it).
    pub fn synchronize(&self) -> Result<(), KernelError> {
        let (m, cv) = &*self.state;
        let mut s = m.lock().unwrap_or_else(|e| e.into_inner());
        while s.finished != s.launched {
            s = cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.error.take().map_or(Ok(()), Err)
    }

    /// Where the last [`compute_and_trigger`](Self::compute_and_trigger) kernel that ran to
    /// its end spent its time (`None` before the first). Call after
    /// [`synchronize`](Self::synchronize).
    pub fn last_rings(&self) -> Option<RingProfile> {
        let (m, _) = &*self.state;
        m.lock().unwrap_or_else(|e| e.into_inner()).last_rings
    }

    /// [`CpuXpu::compute_and_trigger`]'s kernel, launched on this stream: for each bucket k in
    /// order, compute it ([`compute_bucket_work`]), then ring `vars[k]`.
    ///
    /// # Safety
    /// As [`CpuXpu::compute_and_trigger`], until [`synchronize`](Self::synchronize) returns.
    pub unsafe fn compute_and_trigger(
        &self,
        out: *mut u32,
        bucket_elems: u32,
        nbuckets: u32,
        seed: u32,
        work: CpuWork,
        vars: Vec<TriggerVar>,
    ) -> Result<(), KernelError> {
        const OP: &str = "CpuXpuStream::compute_and_trigger";
        check_buckets(OP, bucket_elems, nbuckets, vars.len())?;
        if out.is_null() {
            return Err(KernelError::inval(OP, "out is null"));
        }
        // SAFETY: the caller's contract.
        unsafe { validate(&vars) }?;
        let out = SendPtr(out);
        let state = self.state.clone();
        self.launch(move || {
            let out = out;
            // SAFETY: the caller's contract, checked shape.
            let p = unsafe { compute_and_ring(out.0, bucket_elems as usize, seed, work, &vars) }?;
            state.0.lock().unwrap_or_else(|e| e.into_inner()).last_rings = Some(p);
            Ok(())
        })
    }

    /// The same computation without rings (what an ordinary pipeline's kernel does before
    /// the host posts the sends).
    ///
    /// # Safety
    /// `out` must point to `bucket_elems * nbuckets` writable `u32`s that nothing else touches
    /// until [`synchronize`](Self::synchronize) returns.
    pub unsafe fn compute(
        &self,
        out: *mut u32,
        bucket_elems: u32,
        nbuckets: u32,
        seed: u32,
        work: CpuWork,
    ) -> Result<(), KernelError> {
        const OP: &str = "CpuXpuStream::compute";
        check_buckets(OP, bucket_elems, nbuckets, nbuckets as usize)?;
        if out.is_null() {
            return Err(KernelError::inval(OP, "out is null"));
        }
        let out = SendPtr(out);
        self.launch(move || {
            let out = out;
            let n = bucket_elems as usize;
            for k in 0..nbuckets as usize {
                let base = k * n;
                // SAFETY: the caller's contract: the buffer is ours to write.
                let bucket = unsafe { std::slice::from_raw_parts_mut(out.0.add(base), n) };
                compute_bucket_work(bucket, base as u64, seed, work);
            }
            Ok(())
        })
    }
}

impl Drop for CpuXpuStream {
    fn drop(&mut self) {
        // The thread ends once what was launched has run and the channel is closed.
        drop(self.work.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The shape checks both XPUs apply: at least one element and one bucket, one variable per
/// bucket, and an element count that fits.
pub(crate) fn check_buckets(
    op: &'static str,
    bucket_elems: u32,
    nbuckets: u32,
    nvars: usize,
) -> Result<(), KernelError> {
    if bucket_elems == 0 || nbuckets == 0 {
        return Err(KernelError::inval(
            op,
            "bucket_elems and nbuckets must be > 0",
        ));
    }
    if nvars != nbuckets as usize {
        return Err(KernelError::inval(
            op,
            format!("{nvars} trigger variables for {nbuckets} buckets (one per bucket)"),
        ));
    }
    if (bucket_elems as u64)
        .checked_mul(nbuckets as u64)
        .and_then(|e| e.checked_mul(4))
        .is_none_or(|b| b > isize::MAX as u64)
    {
        return Err(KernelError::inval(op, "the output does not fit in memory"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::ffi::c_void;
    use std::sync::atomic::AtomicU64;

    use xfabric_core::{Datatype, TriggerValue};

    use super::*;

    fn var(datatype: Datatype, count: i32, addr: *mut c_void, value: TriggerValue) -> TriggerVar {
        TriggerVar {
            datatype: datatype as i32,
            count,
            addr,
            value,
        }
    }

    #[test]
    fn extra_passes_leave_the_same_bytes() {
        let mut one = vec![0u32; 1000];
        let mut five = vec![1u32; 1000];
        compute_bucket(&mut one, 77, 9, 1);
        compute_bucket(&mut five, 77, 9, 5);
        assert_eq!(one, five);
        assert!(one
            .iter()
            .enumerate()
            .all(|(j, &x)| x == pattern(77 + j as u64, 9)));
        compute_bucket(&mut five, 77, 9, 0);
        assert_eq!(one, five);
    }

    #[test]
    fn pattern_is_the_kernel_formula() {
        assert_eq!(pattern(0, 0), 0);
        assert_eq!(pattern(1, 0), 2_654_435_761);
        assert_eq!(pattern(2, 0), (2u64 * 2_654_435_761 % (1 << 32)) as u32);
        assert_eq!(pattern(1, 0xffff_ffff), !2_654_435_761u32);
        // A 64-bit index: only the low 32 bits of the product count, as on the device.
        let i = (1u64 << 32) + 7;
        assert_eq!(pattern(i, 5), 7u32.wrapping_mul(2_654_435_761) ^ 5);
    }

    #[repr(C, align(8))]
    #[derive(Default)]
    struct Cells {
        b: u8,
        _p0: u8,
        h: u16,
        w: u32,
        d: u64,
        bytes: [u8; 16],
    }

    #[test]
    fn ring_stores_each_width_and_byte_arrays() {
        let mut cells = Cells::default();
        let mut payload = *b"0123456789abcdef";
        let c = &mut cells as *mut Cells;
        // SAFETY: field addresses of a live local.
        let vars = unsafe {
            [
                var(
                    Datatype::UInt8,
                    1,
                    (&raw mut (*c).b).cast(),
                    TriggerValue { val8: 0xab },
                ),
                var(
                    Datatype::UInt16,
                    1,
                    (&raw mut (*c).h).cast(),
                    TriggerValue { val16: 0xbeef },
                ),
                var(
                    Datatype::UInt32,
                    1,
                    (&raw mut (*c).w).cast(),
                    TriggerValue { val32: 0xdead_beef },
                ),
                var(
                    Datatype::UInt64,
                    1,
                    (&raw mut (*c).d).cast(),
                    TriggerValue {
                        val64: 0x0123_4567_89ab_cdef,
                    },
                ),
                var(
                    Datatype::UInt8,
                    16,
                    (&raw mut (*c).bytes).cast(),
                    TriggerValue {
                        data: payload.as_mut_ptr(),
                    },
                ),
            ]
        };
        // SAFETY: every address is a field of `cells`, aligned for its width; payload is live.
        unsafe { ring(&vars) }.unwrap();
        assert_eq!(cells.b, 0xab);
        assert_eq!(cells._p0, 0, "a byte store must not touch its neighbour");
        assert_eq!(cells.h, 0xbeef);
        assert_eq!(cells.w, 0xdead_beef);
        assert_eq!(cells.d, 0x0123_4567_89ab_cdef);
        assert_eq!(&cells.bytes, b"0123456789abcdef");
    }

    #[test]
    fn a_bad_variable_stores_nothing() {
        let mut a = 0u64;
        let mut b = 0u64;
        let vars = [
            var(
                Datatype::UInt64,
                1,
                (&raw mut a).cast(),
                TriggerValue { val64: 1 },
            ),
            // FI_UINT32 with count 2 is not a form fi_trigger(3) defines.
            var(
                Datatype::UInt32,
                2,
                (&raw mut b).cast(),
                TriggerValue { val64: 2 },
            ),
        ];
        // SAFETY: live locals.
        let e = unsafe { ring(&vars) }.unwrap_err();
        assert!(matches!(e, KernelError::InvalidVar { index: 1, .. }), "{e}");
        assert_eq!((a, b), (0, 0));

        let null = [var(
            Datatype::UInt64,
            1,
            std::ptr::null_mut(),
            TriggerValue { val64: 1 },
        )];
        // SAFETY: refused before any store.
        let e = unsafe { ring(&null) }.unwrap_err();
        assert!(matches!(e, KernelError::InvalidVar { index: 0, .. }), "{e}");
        let no_data = [var(
            Datatype::UInt8,
            4,
            (&raw mut a).cast(),
            TriggerValue {
                data: std::ptr::null_mut(),
            },
        )];
        // SAFETY: refused before any store.
        assert!(unsafe { ring(&no_data) }.is_err());
        assert_eq!(a, 0);
        let e: xfabric_core::Error = e.into();
        assert!(matches!(e, xfabric_core::Error::Inval(_)));
    }

    /// The doorbells a watcher sees rise one by one, and each bucket's data is complete by the
    /// time its doorbell is seen (Acquire on the watcher's side pairs with ring's Release).
    #[test]
    fn cpu_xpu_rings_buckets_in_order_after_their_data() {
        const BUCKETS: u32 = 32;
        const ELEMS: u32 = 1024;
        const SEED: u32 = 0x5eed;
        let mut out = vec![0u32; (BUCKETS * ELEMS) as usize];
        let bell = AtomicU64::new(0);
        let vars: Vec<TriggerVar> = (0..BUCKETS)
            .map(|k| {
                var(
                    Datatype::UInt64,
                    1,
                    bell.as_ptr().cast(),
                    TriggerValue {
                        val64: k as u64 + 1,
                    },
                )
            })
            .collect();
        let outp = out.as_mut_ptr();
        // SAFETY: `out` and `bell` outlive the join below; `out` is read only up to the bucket
        // whose doorbell has been seen.
        let worker =
            unsafe { CpuXpu::new().compute_and_trigger(outp, ELEMS, BUCKETS, SEED, vars) }.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut seen = 0u64;
        while seen < BUCKETS as u64 {
            let now = bell.load(Ordering::Acquire);
            assert!(now >= seen, "doorbell went backwards: {now} after {seen}");
            for k in seen..now {
                let base = (k * ELEMS as u64) as usize;
                for j in 0..ELEMS as usize {
                    // SAFETY: bucket k is complete (its doorbell was seen) and no longer written.
                    let x = unsafe { outp.add(base + j).read() };
                    assert_eq!(
                        x,
                        pattern((base + j) as u64, SEED),
                        "bucket {k} element {j}"
                    );
                }
            }
            seen = now;
            assert!(std::time::Instant::now() < deadline, "stuck at {seen}");
            std::hint::spin_loop();
        }
        worker.join().unwrap().unwrap();
        assert!(out
            .iter()
            .enumerate()
            .all(|(i, &x)| x == pattern(i as u64, SEED)));
    }

    #[test]
    fn bucket_shapes_are_checked() {
        let cpu = CpuXpu::new();
        let mut out = [0u32; 4];
        // SAFETY: refused before the thread starts.
        unsafe {
            assert!(cpu
                .compute_and_trigger(out.as_mut_ptr(), 0, 1, 0, vec![TriggerVar::default()])
                .is_err());
            assert!(cpu
                .compute_and_trigger(out.as_mut_ptr(), 4, 1, 0, vec![])
                .is_err());
            // The default variable has a null address.
            assert!(matches!(
                cpu.compute_and_trigger(out.as_mut_ptr(), 4, 1, 0, vec![TriggerVar::default()]),
                Err(KernelError::InvalidVar { index: 0, .. })
            ));
        }
    }

    #[test]
    fn work_in_sixteenths_leaves_the_pattern_and_counts_at_least_a_pass() {
        assert_eq!(CpuWork::sixteenths(0), CpuWork::ONCE);
        assert_eq!(CpuWork::passes(0), CpuWork::ONCE);
        assert_eq!(CpuWork::passes(3).in_sixteenths(), 48);
        assert_eq!(CpuWork::sixteenths(17).whole_passes(), 2);
        assert_eq!(CpuWork::sixteenths(40).in_passes(), 2.5);
        for n in [16, 17, 23, 31, 32, 45] {
            let mut out = vec![0u32; 37];
            compute_bucket_work(&mut out, 100, 9, CpuWork::sixteenths(n));
            assert!(
                out.iter()
                    .enumerate()
                    .all(|(j, &v)| v == pattern(100 + j as u64, 9)),
                "{n} sixteenths"
            );
        }
    }

    #[test]
    fn a_stream_runs_launches_in_order_and_reports_the_first_error_once() {
        use std::sync::{Arc, Mutex};
        let s = CpuXpuStream::new("test-stream").unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        for i in 0..5 {
            let seen = seen.clone();
            s.launch(move || {
                seen.lock().unwrap().push(i);
                if i == 2 {
                    return Err(KernelError::inval("k", "two"));
                }
                if i == 3 {
                    panic!("a kernel's panic");
                }
                Ok(())
            })
            .unwrap();
        }
        let e = s.synchronize().unwrap_err();
        assert!(e.to_string().contains("two"), "{e}");
        assert_eq!(*seen.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        // Reported once; the panic was a launch's error, not the stream's end.
        s.synchronize().unwrap();
        let mut out = vec![0u32; 8];
        // SAFETY: `out` is 2 x 4 u32s, untouched until the synchronize below.
        unsafe { s.compute(out.as_mut_ptr(), 4, 2, 7, CpuWork::sixteenths(3 * 16 + 5)) }.unwrap();
        s.synchronize().unwrap();
        assert!(out
            .iter()
            .enumerate()
            .all(|(i, &v)| v == pattern(i as u64, 7)));
        // SAFETY: never run: the bad shape is refused first.
        assert!(unsafe { s.compute(out.as_mut_ptr(), 0, 2, 7, CpuWork::ONCE) }.is_err());
        drop(s);
    }
}
