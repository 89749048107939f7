//! When to look at a doorbell whose ring wakes no one (a GPU's store to mapped host memory):
//! hybrid polling, as the Linux block layer's hybrid polling and NAPI's adaptive polling do it.
//!
//! Per doorbell, the watcher remembers how long after the start of a wait the last rings came
//! (a wait starts when something is armed on a doorbell with nothing armed, or at the previous
//! ring while more stay armed). With that history it sleeps until shortly before the next ring
//! is due, then spins — looking at the doorbell — until the ring or a bounded deadline, and
//! past it falls back to a look per `XFABRIC_XPU_POLL_US`. The margin around the predicted
//! ring is a fixed part (the wake-up lateness of a sleeping thread) plus twice the observed
//! jitter, doubled after each miss and narrowed again after each hit. A spin then costs about
//! twice the margin per ring instead of the whole silence.
//!
//! Pure logic: time is passed in (nanoseconds on any monotonic clock), so tests drive it.

/// Rings remembered per doorbell.
const HISTORY: usize = 8;
/// Most doublings of the margin after consecutive misses.
const MAX_WIDEN: u32 = 4;

/// The tunables of the policy (from the settings table in the watcher).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Policy {
    /// Fixed part of the margin (ns): the spin starts this long before the predicted ring and
    /// lasts this long after it, at the least.
    pub(crate) margin: u64,
    /// Longest one spin may last (ns).
    pub(crate) max_spin: u64,
}

/// One past ring: it came between `at` and `at + unsure` ns after its wait started (the last
/// look that found nothing, and the look that found it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Sample {
    at: u64,
    unsure: u64,
}

/// When to spin for the next ring: from `from` to `until`, in the caller's clock (ns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) from: u64,
    pub(crate) until: u64,
}

/// One doorbell's ring history and the wait in progress.
#[derive(Debug, Default)]
pub(crate) struct Predictor {
    /// The last `len` rings, oldest first from `next` (a ring buffer).
    samples: [Sample; HISTORY],
    len: usize,
    next: usize,
    /// Consecutive misses, less hits since (each doubles the margin, up to `MAX_WIDEN`).
    misses: u32,
    /// When the wait in progress started; `None` while nothing is armed.
    since: Option<u64>,
    /// The last look during this wait that found no ring.
    last_look: u64,
}

impl Predictor {
    /// Something was armed at `now`: a wait starts unless one is in progress.
    pub(crate) fn armed(&mut self, now: u64) {
        if self.since.is_none() {
            self.since = Some(now);
            self.last_look = now;
        }
    }

    /// A look at `now` found no ring.
    pub(crate) fn looked(&mut self, now: u64) {
        if self.since.is_some() {
            self.last_look = self.last_look.max(now);
        }
    }

    /// Everything armed was canceled: no wait is in progress, and none is measured.
    pub(crate) fn disarmed(&mut self) {
        self.since = None;
    }

    /// A look at `now` found a ring; `more`: operations stay armed, so the next wait starts
    /// now. Records when the ring came, and whether it came within the window planned for it
    /// (a hit narrows the margin again, a miss widens it). Returns whether it was a hit (`None`
    /// when no window was planned).
    ///
    /// A hit needs the look before this one inside the window too: a ring found by the first
    /// look of a window may have come before it opened, while the watcher slept toward it
    /// (found late by up to the sleep), which is a miss. Judged by the finding look alone, a
    /// ring that comes early every time would count as a hit forever and keep the window
    /// where it is, each ring waiting for the window to open.
    pub(crate) fn rang(&mut self, now: u64, more: bool, p: &Policy) -> Option<bool> {
        let last_look = self.last_look;
        let hit = self
            .window(p)
            .map(|w| (w.from..=w.until).contains(&now) && last_look >= w.from);
        match hit {
            Some(true) => self.misses = self.misses.saturating_sub(1),
            Some(false) => self.misses = (self.misses + 1).min(MAX_WIDEN),
            None => {}
        }
        if let Some(since) = self.since {
            let lo = self.last_look.max(since).min(now);
            self.push(Sample {
                at: lo.saturating_sub(since),
                unsure: now.saturating_sub(lo),
            });
        }
        self.since = more.then_some(now);
        self.last_look = now;
        hit
    }

    /// A ring at `now` that no wait was planned for and whose time teaches nothing (a CPU
    /// XPU's announced ring): the next wait starts now if `more` stays armed; the history is
    /// left as it was.
    pub(crate) fn restart(&mut self, now: u64, more: bool) {
        self.since = more.then_some(now);
        self.last_look = now;
    }

    fn push(&mut self, s: Sample) {
        self.samples[self.next] = s;
        self.next = (self.next + 1) % HISTORY;
        self.len = (self.len + 1).min(HISTORY);
    }

    /// The samples, oldest first.
    fn history(&self) -> impl Iterator<Item = Sample> + '_ {
        let start = (self.next + HISTORY - self.len) % HISTORY;
        (0..self.len).map(move |i| self.samples[(start + i) % HISTORY])
    }

    /// The jitter of the history: the median change from one ring's time to the next (robust
    /// to one change of pace, which is one large change among small ones); 0 with fewer than
    /// two rings.
    fn jitter(&self) -> u64 {
        let mut d = [0u64; HISTORY];
        let mut n = 0;
        let mut prev: Option<Sample> = None;
        for s in self.history() {
            if let Some(q) = prev {
                d[n] = s.at.abs_diff(q.at);
                n += 1;
            }
            prev = Some(s);
        }
        if n == 0 {
            return 0;
        }
        let d = &mut d[..n];
        d.sort_unstable();
        d[n / 2]
    }

    /// The margin now: the fixed part plus twice the jitter, doubled per recent miss.
    pub(crate) fn margin(&self, p: &Policy) -> u64 {
        p.margin
            .saturating_add(self.jitter().saturating_mul(2))
            .saturating_mul(1 << self.misses)
    }

    /// When to spin for the ring of the wait in progress: around the time after its start
    /// that the last ring came (the span that ring was unsure of included), widened by the
    /// margin on both sides, never before the wait started, and at most `max_spin` long.
    /// `None` while nothing is armed or before the first ring (no history).
    pub(crate) fn window(&self, p: &Policy) -> Option<Window> {
        let since = self.since?;
        let last = self.history().last()?;
        // Past `max_spin`, the margin gives way first, evenly on both sides, then the end
        // of the span the last ring was unsure of.
        let m = self
            .margin(p)
            .min(p.max_spin.saturating_sub(last.unsure) / 2);
        let due = since.saturating_add(last.at);
        let from = due.saturating_sub(m).max(since);
        let until = due
            .saturating_add(last.unsure)
            .saturating_add(m)
            .min(from.saturating_add(p.max_spin));
        Some(Window { from, until })
    }

    /// True while a wait is in progress.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> bool {
        self.since.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;
    const P: Policy = Policy {
        margin: 300 * US,
        max_spin: 5 * MS,
    };

    /// A predictor that saw `gaps` (ns) between arming and a ring found by a look 1 us after it
    /// (the previous look 1 us before), one at a time, each 100 ms after the previous.
    fn seen(gaps: &[u64]) -> (Predictor, u64) {
        let mut p = Predictor::default();
        let mut t = 1_000 * MS;
        for &g in gaps {
            p.armed(t);
            p.looked(t + g - US);
            p.rang(t + g + US, false, &P);
            t += 100 * MS;
        }
        (p, t)
    }

    #[test]
    fn no_history_no_window() {
        let mut p = Predictor::default();
        assert_eq!(p.window(&P), None);
        p.armed(10);
        assert_eq!(p.window(&P), None);
        assert!(p.waiting());
    }

    #[test]
    fn a_steady_gap_sleeps_until_the_margin_before_it() {
        let (mut p, t) = seen(&[50 * MS, 50 * MS, 50 * MS]);
        p.armed(t);
        let w = p.window(&P).unwrap();
        // Jitter 0: the margin is the fixed part; the last ring was within [g - 1us, g + 1us].
        assert_eq!(w.from, t + 50 * MS - US - 300 * US);
        assert_eq!(w.until, t + 50 * MS - US + 2 * US + 300 * US);
        assert_eq!(p.margin(&P), 300 * US);
    }

    #[test]
    fn jitter_widens_the_margin() {
        // Changes of 100 us between rings: the margin grows by twice that.
        let (mut p, t) = seen(&[50 * MS, 50 * MS + 100 * US, 50 * MS, 50 * MS + 100 * US]);
        assert_eq!(p.margin(&P), 500 * US);
        p.armed(t);
        let w = p.window(&P).unwrap();
        assert_eq!(w.from, t + 50 * MS + 100 * US - US - 500 * US);
    }

    #[test]
    fn one_change_of_pace_is_not_jitter() {
        // Many rings at 5 ms, then at 50 ms: the median change is 0, so the margin is only
        // doubled for the one miss, and the window follows the last ring.
        let (mut p, t) = seen(&[5 * MS, 5 * MS, 5 * MS, 5 * MS, 50 * MS]);
        assert_eq!(p.margin(&P), 2 * 300 * US);
        p.armed(t);
        assert_eq!(p.window(&P).unwrap().from, t + 50 * MS - US - 600 * US);
    }

    #[test]
    fn a_miss_widens_and_a_hit_narrows() {
        let (mut p, t) = seen(&[50 * MS, 50 * MS]);
        p.armed(t);
        let w = p.window(&P).unwrap();
        // The ring comes 3 ms late: found by a periodic look after the window.
        p.looked(w.until + MS);
        assert_eq!(p.rang(t + 53 * MS, false, &P), Some(false));
        let wide = p.margin(&P);
        assert!(wide >= 2 * 300 * US, "{wide}");
        // The next window covers the span the late ring was unsure of, whole, and the margin
        // on both sides of it.
        let t = t + 100 * MS;
        p.armed(t);
        let w = p.window(&P).unwrap();
        assert!(
            w.from <= t + 51 * MS && w.until >= t + 53 * MS + wide.min(MS),
            "{w:?}"
        );
        // A hit (the watcher spinning through the window: a look inside it found nothing,
        // the next found the ring) narrows again.
        p.looked(t + 53 * MS - US);
        assert_eq!(p.rang(t + 53 * MS, false, &P), Some(true));
        assert!(p.margin(&P) < wide);
    }

    #[test]
    fn a_ring_found_by_the_first_look_of_its_window_is_a_miss() {
        // Rings every 50 ms, then one comes 2 ms early, while the watcher sleeps toward its
        // window: the window's first look finds it. It may have come any time since the last
        // look before the window, so it is a miss, and the next window starts from there.
        let (mut p, t) = seen(&[50 * MS, 50 * MS]);
        p.armed(t);
        let w = p.window(&P).unwrap();
        p.looked(t + 45 * MS);
        let narrow = p.margin(&P);
        assert_eq!(p.rang(w.from, false, &P), Some(false));
        assert!(p.margin(&P) >= 2 * narrow);
        let t = t + 100 * MS;
        p.armed(t);
        assert!(p.window(&P).unwrap().from <= t + 45 * MS);
    }

    #[test]
    fn an_early_ring_is_a_miss() {
        let (mut p, t) = seen(&[50 * MS, 50 * MS]);
        p.armed(t);
        let narrow = p.margin(&P);
        assert_eq!(p.rang(t + 10 * MS, false, &P), Some(false));
        assert!(p.margin(&P) >= 2 * narrow);
        // The next wait spins from its start: the last ring came 10 ms in, within the margin.
        p.armed(t + 100 * MS);
        assert_eq!(p.window(&P).unwrap().from, t + 100 * MS);
    }

    #[test]
    fn misses_widen_only_so_far_and_spins_are_bounded() {
        let (mut p, mut t) = seen(&[50 * MS, 50 * MS]);
        for _ in 0..20 {
            p.armed(t);
            let w = p.window(&P).unwrap();
            assert!(w.until - w.from <= P.max_spin);
            assert!(w.from >= t);
            p.rang(w.until + 10 * MS, false, &P);
            t += 200 * MS;
        }
        assert_eq!(p.misses, MAX_WIDEN);
    }

    #[test]
    fn a_ring_with_more_armed_starts_the_next_wait() {
        let mut p = Predictor::default();
        p.armed(0);
        p.rang(10 * MS, true, &P);
        assert!(p.waiting());
        let w = p.window(&P).unwrap();
        // 10 ms after the ring at 10 ms, found with no look in between: unsure of all of it.
        assert_eq!(w.from, 10 * MS);
        p.rang(20 * MS, false, &P);
        assert!(!p.waiting());
        assert_eq!(p.window(&P), None);
    }

    #[test]
    fn times_at_the_ends_of_the_clock_do_not_overflow() {
        let mut p = Predictor::default();
        p.armed(u64::MAX - 5);
        p.looked(u64::MAX);
        p.rang(u64::MAX, true, &P);
        let w = p.window(&P).unwrap();
        assert!(w.from <= w.until);
        // A clock that went backwards (a caller's mistake) saturates rather than wraps.
        p.looked(3);
        p.rang(2, false, &P);
        p.armed(0);
        let _ = p.window(&P);
        p.disarmed();
        assert!(!p.waiting());
    }
}
