//! XPU triggers (`FI_TRIGGER_XPU`): operations armed by the host and started when an XPU — a
//! GPU kernel, or a CPU thread — stores a value to a doorbell.
//!
//! Each (endpoint, XPU) pair has one 64-bit doorbell in memory that XPU can store to and the
//! host can poll; the k-th operation armed for it is started by the value k (fi_trigger(3):
//! "providers may return the same trigger variable for multiple data transfer requests").
//! The watcher is the endpoint's progress: the domain's thread under auto progress, the
//! application's reads under manual progress. It starts every armed operation whose value
//! the doorbell has reached, in posting order, exactly once, and reports misuse — a value
//! past what was armed, or one going backwards — as an error entry, starting nothing that
//! was not armed.
//!
//! Where the doorbell memory comes from is the provider's domain's business
//! (`DoorbellAlloc`, which xfabric-xpu-trigger implements over xfabric-hmem).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::job::{Job, Owner};
use super::port::{Action, Port};
use super::xpu_abi::{TriggerVar, Xpu};
use super::xpu_predict::{Policy, Predictor};
use crate::atomic::Datatype;
use crate::entry::Context;
use crate::error::{Error, Result};
use crate::hmem_iface::Iface;
use crate::xpu::ring::DescRing;

/// Most operations one endpoint keeps armed; posting past it answers `Again`.
pub const XPU_ARMED_MAX: usize = 1 << 16;

/// After an operation is armed or a trigger fires, the watcher keeps polling without sleeping
/// for this long (`XFABRIC_XPU_SPIN_MS`, default 20): a trigger in that window is seen at once.
fn spin_window() -> Duration {
    static V: OnceLock<Duration> = OnceLock::new();
    *V.get_or_init(|| Duration::from_millis(crate::settings::XPU_SPIN_MS.size()))
}

/// The spin window when every doorbell of the endpoint belongs to a CPU XPU
/// (`XFABRIC_XPU_CPU_SPIN_US`, default 50): a CPU ring wakes a sleeping watcher
/// (`notify_xpu_ring`), so spinning longer only takes CPU from the XPU's own thread.
fn cpu_spin_window() -> Duration {
    static V: OnceLock<Duration> = OnceLock::new();
    *V.get_or_init(|| Duration::from_micros(crate::settings::XPU_CPU_SPIN_US.size()))
}

/// Past the spin window, how long the watcher sleeps between looks at a doorbell that armed
/// operations wait on (`XFABRIC_XPU_POLL_US`, default 1000): what a trigger from a GPU that
/// came when it was not predicted may wait, against what a silent XPU costs (each look is a
/// wake-up of the thread, 10-20 us of CPU on a VM). A CPU XPU's ring ends the sleep at once.
/// 0: the watcher never sleeps while something is armed.
fn poll_sleep() -> Duration {
    static V: OnceLock<Duration> = OnceLock::new();
    *V.get_or_init(|| Duration::from_micros(crate::settings::XPU_POLL_US.size()))
}

/// The longest the periodic looks space out to after a long quiet (`XFABRIC_XPU_POLL_MAX_US`,
/// default 8000), never below `poll_sleep`.
fn poll_max() -> Duration {
    static V: OnceLock<Duration> = OnceLock::new();
    *V.get_or_init(|| {
        Duration::from_micros(crate::settings::XPU_POLL_MAX_US.size()).max(poll_sleep())
    })
}

/// Quiet (ns) up to which the periodic look keeps its base interval; past it the interval
/// doubles each time the quiet doubles.
const QUIET_START: u64 = 256_000_000;

/// The periodic look's interval after `quiet` ns without an arm, ring or post: `base` up to
/// `QUIET_START`, then doubled each time the quiet doubles, up to `max`. What a store nobody
/// predicted waits for grows with the silence before it, and an armed or exported endpoint
/// left quiet costs less and less (each look is a wake-up: 10-20 us of CPU on a VM). `base`
/// zero (the watcher never sleeps) stays zero.
pub(crate) fn poll_interval(base: Duration, max: Duration, quiet: u64) -> Duration {
    if base.is_zero() || quiet < QUIET_START {
        return base;
    }
    // quiet / QUIET_START >= 1: doublings of the quiet past the start.
    let doublings = (quiet / QUIET_START).ilog2() + 1;
    base.saturating_mul(1u32 << doublings.min(16))
        .min(max.max(base))
}

/// How the watcher predicts rings of doorbells that wake no one (`XFABRIC_XPU_PREDICT`,
/// `XFABRIC_XPU_MARGIN_US`, `XFABRIC_XPU_MAX_SPIN_US`); `None` when it does not.
fn policy() -> Option<Policy> {
    static V: OnceLock<Option<Policy>> = OnceLock::new();
    *V.get_or_init(|| {
        use crate::settings::{XPU_MARGIN_US, XPU_MAX_SPIN_US, XPU_PREDICT};
        XPU_PREDICT.flag().then(|| Policy {
            margin: XPU_MARGIN_US.size().saturating_mul(1_000),
            max_spin: XPU_MAX_SPIN_US.size().saturating_mul(1_000),
        })
    })
}

/// Who found a doorbell's new value.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finder {
    /// The watcher, looking (spinning, or a periodic look).
    Watcher,
    /// The ringing thread, through `notify_xpu_ring`: a CPU XPU that announces its rings.
    Ringer,
}

/// `prov_errno` of an error entry: the XPU stored a value past the last one armed.
pub const XPU_ERR_PAST_ARMED: i32 = 1;
/// `prov_errno` of an error entry: the XPU stored a value below one it stored before.
pub const XPU_ERR_BACKWARDS: i32 = 2;

/// One doorbell: a 64-bit word the XPU stores to and the host polls.
pub trait Doorbell: Send + Sync {
    /// The word as the host reads it.
    fn word(&self) -> &AtomicU64;
    /// The address the XPU stores to (a device address for a GPU, the host address for a
    /// CPU thread).
    fn xpu_addr(&self) -> usize;
}

/// Where an endpoint's doorbells come from; a provider's domain supplies one
/// (`DomainOps::xpu_doorbells`).
pub trait DoorbellAlloc: Send + Sync {
    /// `Ok` if doorbells for `xpu` can be made here; `OpNotSupp` saying why not.
    fn check(&self, xpu: Xpu) -> Result<()>;
    /// A new doorbell for `xpu`, reading 0.
    fn alloc(&self, xpu: Xpu) -> Result<Box<dyn Doorbell>>;
    /// Where the device API's shared blocks (descriptor rings, exported CQs' rings, counter
    /// mirrors) for XPUs other than the CPU one come from; `None` (the default): only the
    /// CPU XPU may be exported to.
    fn memory(&self) -> Option<Arc<dyn crate::xpu::XpuMemAlloc>> {
        None
    }
}

/// The variables a trigger needs: one 64-bit value.
const VARS: [(Datatype, i32); 1] = [(Datatype::UInt64, 1)];

/// One (endpoint, XPU) doorbell and the operations waiting on it.
struct Bell {
    xpu: Xpu,
    /// Shared with a watcher spinning on it outside the lock (`XpuWatch::spin`).
    bell: Arc<dyn Doorbell>,
    /// Last value handed out.
    armed: u64,
    /// Last value read from the doorbell.
    seen: u64,
    /// Armed operations by value, increasing.
    jobs: VecDeque<(u64, Job)>,
    /// When its rings came: what the watcher predicts the next one from.
    timing: Predictor,
    /// Its rings are announced: a sleeping watcher is woken and no prediction is needed. Set
    /// when `notify_xpu_ring`'s look finds a ring; cleared when a periodic look (not a spin)
    /// does, since that ring woke no one; a ring found while spinning tells nothing.
    wakes: bool,
}

/// How long the watcher may wait before looking again at something an XPU stores to without
/// waking anyone (a doorbell with armed operations, a descriptor ring), at `now` (ns since the
/// watch's epoch), `last_fire` being the watch's last arm, trigger or post: zero to spin. With
/// a history of stores that woke no one, until shortly before the next is due, then through
/// the predicted window; without, spin within the spin window after the last activity; past
/// either, `Duration::MAX` (the caller's periodic look). Not capped by the poll period.
fn nap_of(device: bool, wakes: bool, timing: &Predictor, now: u64, last_fire: u64) -> Duration {
    let predicted = policy()
        .filter(|_| device || !wakes)
        .and_then(|p| timing.window(&p));
    match predicted {
        Some(w) if now < w.from => Duration::from_nanos(w.from - now),
        Some(w) if now <= w.until => Duration::ZERO,
        // Past the window: the ring came later than predicted; periodic looks.
        Some(_) => Duration::MAX,
        // No history: spin for a while after an arm or a trigger, then periodic looks.
        None => {
            let window = if device {
                spin_window()
            } else {
                cpu_spin_window()
            };
            if now.saturating_sub(last_fire) < window.as_nanos() as u64 {
                Duration::ZERO
            } else {
                Duration::MAX
            }
        }
    }
}

impl Bell {
    /// How long the watcher may wait before looking at this doorbell again (`nap_of`); `None`
    /// if nothing waits on it.
    fn nap(&self, now: u64, last_fire: u64) -> Option<Duration> {
        if self.jobs.is_empty() {
            return None;
        }
        let device = self.xpu.iface != Iface::System;
        Some(nap_of(device, self.wakes, &self.timing, now, last_fire))
    }
}

/// One exported (endpoint, XPU) descriptor ring (`Endpoint::export_xpu`) and how its
/// descriptors have come: watched as a doorbell with something armed always is, since an XPU
/// may post at any time.
struct RingWatch {
    xpu: Xpu,
    ring: Arc<DescRing>,
    timing: Predictor,
    /// Its posts are announced (`fi_xpu_tx_flush` of a CPU XPU); as `Bell::wakes`.
    wakes: bool,
    /// What its descriptors' validation found last (regions, peer), reused while valid.
    checked: crate::xpu::Checked,
    /// The last look left descriptors in it because the CQ their faults go to holds as many
    /// unread errors as its size: until the application reads them no look can take one,
    /// so a descriptor waiting is no reason to keep looking.
    held: bool,
}

impl RingWatch {
    /// `backlog`: its endpoint's operations wait for room, and no look takes a descriptor
    /// before they start (taken after them, a descriptor would overtake them): one waiting
    /// is then no reason to keep looking either; their retries set the looks
    /// (`EpLink::next_look`), and the one that starts the last of them drains the ring.
    fn nap(&self, now: u64, last_fire: u64, backlog: bool) -> Duration {
        if self.takeable(backlog) {
            return Duration::ZERO;
        }
        self.planned(now, last_fire)
    }

    /// Whether a look would take its next descriptor now (published, and neither held nor
    /// behind waiting operations).
    fn takeable(&self, backlog: bool) -> bool {
        !self.held && !backlog && self.ring.ready()
    }

    /// The wait the watcher planned, whatever the ring holds now: zero while it spins.
    fn planned(&self, now: u64, last_fire: u64) -> Duration {
        let device = self.xpu.iface != Iface::System;
        nap_of(device, self.wakes, &self.timing, now, last_fire)
    }
}

/// The publishing word of a ring's next slot, watched as a doorbell while the watcher spins.
struct NextSlot {
    ring: Arc<DescRing>,
    pos: u64,
}

impl Doorbell for NextSlot {
    fn word(&self) -> &AtomicU64 {
        self.ring.seq_word(self.pos)
    }

    fn xpu_addr(&self) -> usize {
        self.word() as *const AtomicU64 as usize
    }
}

/// Most descriptors one look takes from one ring (other work of the endpoint waits at most
/// that long).
pub(crate) const DRAIN_MAX: usize = 256;

/// What an error entry reports about a doorbell.
struct Misuse {
    value: u64,
    code: i32,
}

/// An endpoint's XPU-triggered operations.
pub(crate) struct XpuWatch {
    alloc: Arc<dyn DoorbellAlloc>,
    bells: Mutex<Vec<Bell>>,
    /// Operations armed and not yet started or canceled (read without the lock).
    armed: AtomicUsize,
    /// A doorbell exists: the watcher has something to look at (read without the lock).
    has_bells: AtomicBool,
    /// When a trigger last fired (nanoseconds since `epoch`), for the watcher's back-off.
    last_fire: AtomicU64,
    /// The monotonic clock's reading (`clock::mono_ns`) when the watch was made.
    epoch: u64,
    /// Exported descriptor rings (`Endpoint::export_xpu`).
    rings: Mutex<Vec<RingWatch>>,
    /// A ring exists (read without the lock).
    has_rings: AtomicBool,
    /// An exported CQ of the endpoint holds entries its ring had no room for: the watcher
    /// keeps looking so that they move once the XPU makes room.
    cq_backlog: AtomicBool,
    /// A look found a ring full: its producer is being refused and retries
    /// (`take_producer_waited`).
    producer_waited: AtomicBool,
}

impl XpuWatch {
    pub(crate) fn new(alloc: Arc<dyn DoorbellAlloc>) -> Self {
        XpuWatch {
            alloc,
            bells: Mutex::default(),
            armed: AtomicUsize::new(0),
            has_bells: AtomicBool::new(false),
            last_fire: AtomicU64::new(0),
            epoch: crate::clock::mono_ns(),
            rings: Mutex::default(),
            has_rings: AtomicBool::new(false),
            cq_backlog: AtomicBool::new(false),
            producer_waited: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Bell>> {
        self.bells.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Nanoseconds since `epoch` (saturating: centuries away).
    fn now(&self) -> u64 {
        crate::clock::mono_ns().saturating_sub(self.epoch)
    }

    /// True while armed operations wait: the watcher must keep looking.
    #[inline]
    pub(crate) fn waiting(&self) -> bool {
        self.armed.load(Ordering::Acquire) > 0
    }

    /// `fi_getopt(FI_OPT_XPU_TRIGGER)`: the number of variables a trigger from `xpu` needs;
    /// fills the datatype and count of as many of `vars` as there are.
    pub(crate) fn layout(&self, xpu: Xpu, vars: &mut [TriggerVar]) -> Result<usize> {
        self.alloc.check(xpu)?;
        for (v, (dt, n)) in vars.iter_mut().zip(VARS) {
            v.datatype = dt as i32;
            v.count = n;
        }
        Ok(VARS.len())
    }

    /// Arms `job` for `xpu` and fills `vars` with the doorbell and the value that starts it.
    pub(crate) fn arm(
        &self,
        what: &'static str,
        xpu: Xpu,
        vars: &mut [TriggerVar],
        job: Job,
        link: &dyn Owner,
    ) -> Result<usize> {
        let Some(var) = vars.first_mut() else {
            return Err(Error::Inval(format!(
                "{what}: no fi_trigger_var given; an XPU trigger needs {} (getopt FI_OPT_XPU_TRIGGER)",
                VARS.len()
            )));
        };
        if var.datatype != Datatype::UInt64 as i32 || var.count != 1 {
            return Err(Error::Inval(format!(
                "{what}: fi_trigger_var is datatype {} count {}; this endpoint's triggers are one FI_UINT64 with count 1 (getopt FI_OPT_XPU_TRIGGER)",
                var.datatype, var.count
            )));
        }
        let mut bells = self.lock();
        // Checked under the lock close takes to release what is armed: nothing armed after.
        if link.closed() {
            return Err(Error::OpBadState(format!("{what}: endpoint is closed")));
        }
        if self.armed.load(Ordering::Acquire) >= XPU_ARMED_MAX {
            return Err(Error::Again(
                "XPU trigger: XPU_ARMED_MAX operations already armed on this endpoint",
            ));
        }
        let i = match bells.iter().position(|b| b.xpu == xpu) {
            Some(i) => i,
            None => {
                self.alloc.check(xpu)?;
                let bell: Arc<dyn Doorbell> = Arc::from(self.alloc.alloc(xpu)?);
                let seen = bell.word().load(Ordering::Acquire);
                bells.push(Bell {
                    xpu,
                    bell,
                    armed: seen,
                    seen,
                    jobs: VecDeque::new(),
                    timing: Predictor::default(),
                    wakes: false,
                });
                self.has_bells.store(true, Ordering::Release);
                bells.len() - 1
            }
        };
        let b = &mut bells[i];
        // Judge what the XPU stored since the watcher last looked before handing out a value:
        // a stray value stored while nothing was armed must not start what is armed now.
        let mut misuse = None;
        let now = self.now();
        let started = self.scan(b, now, Finder::Watcher, &|j| link.submit(j), &mut misuse);
        let value = b.armed.checked_add(1);
        let armed = value.map(|value| {
            b.armed = value;
            // Made ready in the provider now where it can be: firing it then only releases it.
            let job = match link.port().prearm(&job.action) {
                Some(a) => Job {
                    action: Action::Armed(a),
                    ..job
                },
                None => job,
            };
            b.jobs.push_back((value, job));
            b.timing.armed(now);
            var.addr = b.bell.xpu_addr() as *mut std::ffi::c_void;
            var.value.val64 = value;
            self.armed.fetch_add(1, Ordering::AcqRel);
        });
        drop(bells);
        if started > 0 || armed.is_some() {
            // Arming restarts the spin window: a trigger is likely soon.
            self.touch();
        }
        if let Some(m) = misuse {
            link.port().xpu_misuse(m.code, m.value);
        }
        armed.map(|()| 1).ok_or_else(|| {
            // Values only grow, and the XPU's stores are untrusted: one of u64::MAX leaves no
            // value to hand out on this doorbell, and wrapping would make the next ring look
            // like one going backwards. The endpoint keeps its other XPUs.
            Error::OpBadState(format!(
                "{what}: the doorbell of XPU {:?} holds u64::MAX, past any value armed; no trigger value is left on it for this endpoint",
                xpu
            ))
        })
    }

    /// Reads `b`'s doorbell once, at `now`: starts, in order and under the caller's lock,
    /// what its value reached, and notes a misuse. Values saturate at u64::MAX. Returns how
    /// many operations started.
    fn scan(
        &self,
        b: &mut Bell,
        now: u64,
        finder: Finder,
        start: &impl Fn(Job),
        misuse: &mut Option<Misuse>,
    ) -> usize {
        let v = b.bell.word().load(Ordering::Acquire);
        if v == b.seen {
            b.timing.looked(now);
            return 0;
        }
        // Whether the watcher was spinning on it (judged before what it starts leaves).
        let spinning = finder == Finder::Watcher
            && b.nap(now, self.last_fire.load(Ordering::Relaxed)) == Some(Duration::ZERO);
        if v < b.seen {
            *misuse = Some(Misuse {
                value: v,
                code: XPU_ERR_BACKWARDS,
            });
        } else if v > b.armed {
            *misuse = Some(Misuse {
                value: v,
                code: XPU_ERR_PAST_ARMED,
            });
        }
        b.seen = v;
        // Past what was armed: start only what was armed, and hand out values above what the
        // XPU stored from now on, so its stray value starts nothing later.
        let upto = v.min(b.armed);
        b.armed = b.armed.max(v);
        let mut n = 0;
        while b.jobs.front().is_some_and(|(k, _)| *k <= upto) {
            let Some((_, job)) = b.jobs.pop_front() else {
                break;
            };
            self.armed.fetch_sub(1, Ordering::AcqRel);
            start(job);
            n += 1;
        }
        if n > 0 {
            // Who found it tells whether its rings wake a sleeper: a periodic look (not a
            // spin) finding it means this one did not.
            match finder {
                Finder::Ringer => b.wakes = true,
                Finder::Watcher if !spinning => b.wakes = false,
                Finder::Watcher => {}
            }
            let more = !b.jobs.is_empty();
            match policy() {
                // A CPU XPU's announced ring needs no prediction (`Bell::nap` makes none while
                // its rings wake the watcher): the next wait starts, no history is kept, and
                // the ringing thread, which pays for this look, goes back to its work sooner.
                Some(_) if finder == Finder::Ringer && b.xpu.iface == Iface::System => {
                    b.timing.restart(now, more);
                }
                Some(p) => {
                    let window = tracing::enabled!(tracing::Level::TRACE)
                        .then(|| b.timing.window(&p))
                        .flatten();
                    let hit = b.timing.rang(now, more, &p);
                    tracing::trace!(
                        now,
                        ?window,
                        ?hit,
                        spinning,
                        wakes = b.wakes,
                        "xpu watcher: a ring started {n} operation(s)"
                    );
                }
                None => {}
            }
        } else {
            b.timing.looked(now);
        }
        n
    }

    fn touch(&self) {
        self.last_fire.store(self.now(), Ordering::Relaxed);
    }

    /// Looks at every doorbell once: starts what its value reached, in order, and reports
    /// misuse. Returns how many operations started. Another thread already looking is left
    /// to it (one watcher at a time keeps the order).
    pub(crate) fn poll(&self, port: &dyn Port, finder: Finder, start: impl Fn(Job)) -> usize {
        // Looked at even with nothing armed, so that a stray store is reported when the
        // watcher next runs, not when something is armed after it.
        if !self.has_bells.load(Ordering::Acquire) {
            return 0;
        }
        super::xpu_wake::before_look();
        let Ok(mut bells) = self.bells.try_lock() else {
            super::xpu_wake::look_missed();
            return 0;
        };
        let mut n = 0;
        let mut misuse = Vec::new();
        let now = self.now();
        for b in bells.iter_mut() {
            let mut m = None;
            n += self.scan(b, now, finder, &start, &mut m);
            misuse.extend(m);
        }
        drop(bells);
        if n > 0 {
            self.last_fire.store(now, Ordering::Relaxed);
        }
        for m in misuse {
            port.xpu_misuse(m.code, m.value);
        }
        n
    }

    /// The descriptor ring of (this endpoint, `xpu`), made with `slots` slots if there is
    /// none yet.
    pub(crate) fn export_ring(
        &self,
        what: &'static str,
        xpu: Xpu,
        slots: usize,
        link: &dyn Owner,
    ) -> Result<Arc<DescRing>> {
        let mut rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        // Checked under the lock close takes to cancel what rings hold: nothing made after.
        if link.closed() {
            return Err(Error::OpBadState(format!("{what}: endpoint is closed")));
        }
        // Checked whether or not a ring exists: a size refused once is refused again.
        crate::xpu::ring::check_slots(slots)?;
        if let Some(r) = rings.iter().find(|r| r.xpu == xpu) {
            return Ok(r.ring.clone());
        }
        if xpu.iface != Iface::System {
            self.alloc.check(xpu)?;
        }
        let mem = self.alloc.memory();
        let ring = DescRing::new(slots, xpu, mem.as_deref())?;
        let mut timing = Predictor::default();
        timing.armed(self.now());
        rings.push(RingWatch {
            xpu,
            ring: ring.clone(),
            timing,
            wakes: false,
            checked: Default::default(),
            held: false,
        });
        self.has_rings.store(true, Ordering::Release);
        drop(rings);
        self.touch();
        Ok(ring)
    }

    /// Whether a descriptor ring was exported.
    #[inline]
    pub(crate) fn has_rings(&self) -> bool {
        self.has_rings.load(Ordering::Acquire)
    }

    /// Takes what every ring holds (up to `DRAIN_MAX` each) and starts it through `owner`
    /// (`link` is the same link as an `Arc`, for the jobs). Another thread draining is left to
    /// it (one drainer keeps each ring's order). Returns how many descriptors were taken.
    pub(crate) fn drain(&self, owner: &dyn Owner, link: &Arc<dyn Owner>, finder: Finder) -> usize {
        if !self.has_rings() {
            return 0;
        }
        super::xpu_wake::before_look();
        let Ok(mut rings) = self.rings.try_lock() else {
            super::xpu_wake::look_missed();
            return 0;
        };
        let now = self.now();
        let last_fire = self.last_fire.load(Ordering::Relaxed);
        let mut n = 0;
        for r in rings.iter_mut() {
            let full = r.ring.full();
            let k = crate::xpu::ep::drain(&r.ring, &mut r.checked, DRAIN_MAX, owner, link);
            // Held back by unread errors (`xpu::ep::drain`): a look follows the plan, not the
            // ring, until they are read (a watcher that kept looking would spin meanwhile).
            // Held behind operations waiting for room is judged live instead (`nap_with`).
            r.held = r.ring.ready() && owner.port().xpu_faults_full();
            // Full by its tail, and descriptors in it: a tail alone (the XPU's to write, so
            // possibly wrong) must not keep a watcher from ever sleeping.
            if full && k > 0 {
                self.producer_waited.store(true, Ordering::Relaxed);
            }
            if k > 0 {
                // Judged by the plan, not by what the ring holds (a descriptor waiting makes
                // any nap zero), and only when something was found (a look that finds nothing
                // pays for no prediction): a periodic look finding one means its XPU woke no
                // one. What was taken changes neither `timing` nor `last_fire`.
                let spinning =
                    finder == Finder::Watcher && r.planned(now, last_fire) == Duration::ZERO;
                match finder {
                    Finder::Ringer => r.wakes = true,
                    Finder::Watcher if !spinning => r.wakes = false,
                    Finder::Watcher => {}
                }
                match policy() {
                    // Announced by a CPU XPU (`tx_flush`): no prediction needed, as for a
                    // doorbell's announced ring.
                    Some(_) if finder == Finder::Ringer && r.xpu.iface == Iface::System => {
                        r.timing.restart(now, true);
                    }
                    Some(p) => {
                        let window = tracing::enabled!(tracing::Level::TRACE)
                            .then(|| r.timing.window(&p))
                            .flatten();
                        let hit = r.timing.rang(now, true, &p);
                        tracing::trace!(
                            now,
                            ?window,
                            ?hit,
                            spinning,
                            wakes = r.wakes,
                            "xpu watcher: took {k} descriptor(s)"
                        );
                    }
                    None => {}
                }
            } else {
                r.timing.looked(now);
            }
            n += k;
        }
        drop(rings);
        if n > 0 {
            self.touch();
        }
        n
    }

    /// The endpoint is closing: every ring is closed to its XPU, and what it held is
    /// reported canceled (`xpu::ep::cancel_all`).
    pub(crate) fn close_rings(&self, port: &dyn Port) {
        let rings = std::mem::take(&mut *self.rings.lock().unwrap_or_else(|e| e.into_inner()));
        self.has_rings.store(false, Ordering::Release);
        for r in rings {
            crate::xpu::ep::cancel_all(&r.ring, port);
            // Closed: a late post finds it so, in memory that is still there.
            port.retire(r.ring);
        }
    }

    /// Records whether an exported CQ of the endpoint holds entries its ring had no room for.
    pub(crate) fn set_cq_backlog(&self, left: bool) {
        if self.cq_backlog.load(Ordering::Relaxed) != left {
            self.cq_backlog.store(left, Ordering::Release);
        }
    }

    /// Removes the armed operation with context `ctx`, if there is one.
    pub(crate) fn take(&self, ctx: Context) -> Option<Job> {
        let mut bells = self.lock();
        for b in bells.iter_mut() {
            if let Some(i) = b.jobs.iter().position(|(_, j)| j.ctx() == ctx) {
                let (_, job) = b.jobs.remove(i)?;
                self.armed.fetch_sub(1, Ordering::AcqRel);
                if b.jobs.is_empty() {
                    b.timing.disarmed();
                }
                return Some(job);
            }
        }
        None
    }

    /// The endpoint is closing: every doorbell's memory is kept until its domain closes
    /// (`Port::retire`), as its descriptor rings are. Its variables were handed out, and an
    /// XPU that stores to one late (a kernel still running, a CPU thread behind) must find
    /// memory that is still there, never memory unmapped or given to someone else.
    pub(crate) fn retire_bells(&self, port: &dyn Port) {
        for b in self.lock().iter() {
            port.retire(Arc::new(b.bell.clone()));
        }
    }

    /// Removes every armed operation (the endpoint is closing).
    pub(crate) fn take_all(&self) -> Vec<Job> {
        let mut bells = self.lock();
        let mut out = Vec::new();
        for b in bells.iter_mut() {
            out.extend(b.jobs.drain(..).map(|(_, j)| j));
            b.timing.disarmed();
        }
        self.armed.store(0, Ordering::Release);
        out
    }

    /// Whether a look found a ring full since the last call (any look, the ringer's too). A
    /// CPU XPU refused for room retries on a core of the host's, perhaps the watcher's own:
    /// when the watcher next has nothing to take, it gives that core away before it spins
    /// (`EpLink::idle_wait`). A hint only: one left from a full ring long ago, or from one the
    /// XPU filled exactly and was never refused by, turns one spin slice into a yield.
    pub(crate) fn take_producer_waited(&self) -> bool {
        self.producer_waited.load(Ordering::Relaxed)
            && self.producer_waited.swap(false, Ordering::Relaxed)
    }

    /// How the watcher should wait when nothing is ready: `None` if nothing is armed (the
    /// provider's doorbell may put it to sleep); zero to keep looking; otherwise how long it
    /// may sleep (at most the poll interval) before it must look again, ended early by a CPU
    /// XPU's ring (`sleep_until_ring`). Per doorbell: with a history of rings that woke no
    /// one, until shortly before the next is due, then spin through the predicted window
    /// (`xpu_predict`); without, spin within the spin window after the last arm or trigger;
    /// past either, the poll interval. The soonest of its doorbells wins.
    ///
    /// `backlog`: its endpoint's operations wait for room, and its rings' descriptors wait
    /// behind them (`RingWatch::nap`).
    pub(crate) fn nap_with(&self, backlog: bool) -> Option<Duration> {
        let armed = self.waiting();
        let rings = self.has_rings.load(Ordering::Acquire);
        let others = crate::xpu::cntr::any() || self.cq_backlog.load(Ordering::Acquire);
        if !armed && !rings && !others {
            return None;
        }
        let now = self.now();
        let last_fire = self.last_fire.load(Ordering::Relaxed);
        let mut soonest = Duration::MAX;
        if armed {
            let Ok(bells) = self.bells.try_lock() else {
                // Another thread is looking (or arming): look again soon.
                return Some(Duration::ZERO);
            };
            // Armed but in no doorbell's list: a look in progress elsewhere just took it.
            soonest = bells
                .iter()
                .filter_map(|b| b.nap(now, last_fire))
                .min()
                .unwrap_or(Duration::ZERO);
        }
        if rings {
            let Ok(rs) = self.rings.try_lock() else {
                return Some(Duration::ZERO);
            };
            for r in rs.iter() {
                soonest = soonest.min(r.nap(now, last_fire, backlog));
            }
        }
        if others && crate::xpu::cntr::any_ready() {
            soonest = Duration::ZERO;
        }
        let quiet = now.saturating_sub(last_fire);
        Some(soonest.min(poll_interval(poll_sleep(), poll_max(), quiet)))
    }

    /// The spin of a watcher told to keep looking (`nap` said zero): waits, at most `max`,
    /// until a doorbell something waits on changes from what the watcher last saw, without
    /// holding the lock (arming goes on meanwhile) and without a system call. With one such
    /// doorbell and a CPU that offers a user-level monitor/wait, it waits on the doorbell's
    /// cache line (a store, by the CPU or by a device, ends the wait); otherwise it reads the
    /// doorbells with a pause between reads. The caller looks after it.
    pub(crate) fn spin(&self, max: Duration, backlog: bool) {
        let Ok(bells) = self.bells.try_lock() else {
            return;
        };
        let mut watched: Vec<(Arc<dyn Doorbell>, u64)> = bells
            .iter()
            .filter(|b| !b.jobs.is_empty())
            .map(|b| (b.bell.clone(), b.seen))
            .collect();
        drop(bells);
        if self.has_rings.load(Ordering::Acquire) {
            let Ok(rs) = self.rings.try_lock() else {
                return;
            };
            for r in rs.iter() {
                if r.takeable(backlog) {
                    // Published already, and a look would take it: look now.
                    return;
                }
                let pos = r.ring.head();
                let word = r.ring.seq_word(pos).load(Ordering::Acquire);
                if word == pos.wrapping_add(1) {
                    // Published, but no look takes it yet (`RingWatch::held`, or behind
                    // waiting operations): its word will not change; nothing to watch.
                    continue;
                }
                let next: Arc<dyn Doorbell> = Arc::new(NextSlot {
                    ring: r.ring.clone(),
                    pos,
                });
                watched.push((next, word));
            }
        }
        match watched.as_slice() {
            [] => {}
            [(bell, seen)] => super::xpu_wake::wait_for_store(bell.word(), *seen, max),
            many => {
                let until = Instant::now() + max;
                'spin: loop {
                    for _ in 0..64 {
                        if many
                            .iter()
                            .any(|(b, seen)| b.word().load(Ordering::Relaxed) != *seen)
                        {
                            break 'spin;
                        }
                        std::hint::spin_loop();
                    }
                    if Instant::now() >= until {
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn periodic_looks_space_out_only_after_a_long_quiet() {
        let (base, max) = (Duration::from_millis(1), Duration::from_millis(8));
        // Up to 256 ms of quiet (every gap the device API's goals name): the base interval.
        for quiet in [0, 5 * MS, 200 * MS, QUIET_START - 1] {
            assert_eq!(poll_interval(base, max, quiet), base, "{quiet}");
        }
        // Then doubled each time the quiet doubles, up to the cap.
        assert_eq!(poll_interval(base, max, QUIET_START), 2 * base);
        assert_eq!(poll_interval(base, max, 600 * MS), 4 * base);
        assert_eq!(poll_interval(base, max, 1_000 * MS), 4 * base);
        assert_eq!(poll_interval(base, max, 1_100 * MS), max);
        assert_eq!(poll_interval(base, max, u64::MAX), max);
        // A watcher that never sleeps keeps never sleeping; a cap below the base keeps it.
        assert_eq!(poll_interval(Duration::ZERO, max, u64::MAX), Duration::ZERO);
        assert_eq!(poll_interval(base, Duration::ZERO, u64::MAX), base);
    }
}
