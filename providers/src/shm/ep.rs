//! The shm endpoint: core's RDM engine over `net`'s rings, through the endpoint every provider
//! on the engine shares (crate::rdm). What is shm's here: the segment the endpoint is named
//! after, the hooks of the seam only rings need (a frame written in place in a ring slot, a
//! room check before a post, a peer found dead while its ring stays full), and its bell: a
//! lock-free look at its own segment for work, a futex sleep on its doorbell, and a wake
//! socket for a sleeper on a descriptor.

use std::os::fd::RawFd;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use xfabric_core::consts::*;
use xfabric_core::ep::TxOp;
use xfabric_core::rdm::{self, Engine, PeerId};
use xfabric_core::settings;
use xfabric_core::{EpCore, Error, Join, Result};

use super::addr::{seg_name, ADDR_PREFIX};
use super::fdwake::WakeSock;
use super::net::{Idle, Net, ShmOneSided, SWEEP_EVERY_MS};
use super::ring;
use super::segment::Segment;
use crate::rdm::{Bell, Glue, RdmEndpoint, Wire};

/// An shm endpoint.
pub type ShmEndpoint = RdmEndpoint<Net>;

/// How long a closing endpoint waits for a peer that claimed its part of a split copy into
/// one of its buffers to say it is done (or to die) before handing the buffer back.
const CLOSE_SPLIT: Duration = Duration::from_secs(5);

/// Largest message sent eagerly (through the ring). Larger ones go by rendezvous, copied by
/// cross-memory attach from the pull threshold on (`XFABRIC_SHM_CMA_MIN`, by default every
/// one of them), else through the ring as an eager body would be, after one more round trip.
/// Measured on 2026-11-30, pinned, alternating with libfabric 1.17's shm run after run for a
/// few minutes (usec one-way, median and the slowest): past 32 KiB the ring is no faster in
/// the VM's usual phase and three to four times slower in another that comes and goes (48
/// KiB: ring 7-9, a quarter of the runs 25-32; cross-memory attach 6.0-8.9 in every run;
/// libfabric 5.3-8.8); at 16-24 KiB the ring's median is the best of the three (16 KiB 3.55
/// against cross-memory attach's 4.69 and libfabric's 3.94) but 13-27% of runs fall into
/// that phase (9-16), which cross-memory attach and libfabric never did.
const EAGER_MAX: usize = 32768;

/// Creates the endpoint's segment and engine.
pub fn open(core: Arc<EpCore>) -> Result<Arc<ShmEndpoint>> {
    let net = Net::open(core.caps & FI_DIRECTED_RECV != 0)?;
    let name = format!("{ADDR_PREFIX}{}", net.name).into_bytes();
    let cfg = rdm::Config {
        eager_max: EAGER_MAX,
        unexp_msgs: settings::SHM_UNEXP_MSGS.usize(),
        unexp_bytes: settings::SHM_UNEXP_BYTES.usize(),
        // Peers on this host, each bounded by its ring: the endpoint's bound is theirs.
        unexp_peer_bytes: settings::SHM_UNEXP_BYTES.usize(),
        tx_max: crate::rdm::tx_max(&core),
        // A frame the ring takes is in the receiver's segment: delivered.
        delivered_on_take: true,
    };
    let mut net = net;
    let mut one_sided = ShmOneSided::new(net.cma.clone());
    // CUDA IPC: sends from device memory offered unstaged, copied by the receiver (net::ipc).
    if core.caps & FI_HMEM != 0 && core.hmem.is_some() {
        let cuda = xfabric_hmem::Hmem::global().get(xfabric_core::Iface::Cuda);
        if cuda.available().is_ok() {
            one_sided.cuda_ipc = true;
            one_sided.book = net.book.clone();
            net.keep_pidfds = true;
            // Where peers pass their VMM allocations' descriptors; without it they send
            // from such memory staged.
            match super::net::fdpass_inbox(&net.name) {
                Ok(inbox) => net.fds = Some(inbox),
                Err(why) => tracing::warn!(
                    "shm: no descriptor socket ({why}): peers' CUDA VMM memory comes staged"
                ),
            }
            core.device_offer_min.store(
                settings::SHM_IPC_MIN.usize(),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
    }
    net.core = Some(core.clone());
    RdmEndpoint::open(core, net, name, cfg, Some(Box::new(one_sided)))
}

/// The shm endpoint's bell: a second mapping of its own segment and the lock-free mirrors
/// of its rings' state (`Net::publish`).
pub struct ShmBell {
    seg: Segment,
    idle: Arc<Idle>,
    /// Bound when a wait object first asks for this endpoint's descriptors (`None` if that
    /// failed: such a sleeper is then woken only by its completions).
    wake_sock: OnceLock<Option<WakeSock>>,
    /// A wake from this process (`wake`: an XPU export or arm, a progress list's change) not
    /// yet taken by a sleep: kept, as tcp's eventfd keeps one, so that a thread that decided
    /// to sleep just before it, and counts itself asleep just after, does not sleep through
    /// it (peers' frames need no such flag: `has_work` sees them).
    kicked: std::sync::atomic::AtomicBool,
    /// Joint sleeps on this endpoint now (`join_sleep`): what the `fd_sleeping` word's count
    /// must say (`ring::OFF_FD_SLEEPING`), restored by `awake` if anyone else wrote it.
    joint: AtomicU32,
}

impl ShmBell {
    /// `awake`'s work on a word that is not zero (`v`): back to what this endpoint counts.
    /// A count that moved while we wrote (the sleeping thread left and joined again between
    /// our reads and our exchange, which then wrote its old count) is written again.
    #[inline(never)]
    fn restore_word(&self, mut v: u32) {
        let word = ring::fd_sleeping(&self.seg);
        loop {
            let joint = self.joint.load(Ordering::SeqCst);
            let want = (v & ring::FD_UNREACHABLE) | joint.wrapping_mul(ring::FD_JOINT);
            if v == want
                || word
                    .compare_exchange(v, want, Ordering::SeqCst, Ordering::Relaxed)
                    .is_err()
                || self.joint.load(Ordering::SeqCst) == joint
            {
                // Right, or moved by someone else (left for the next call), or written
                // with a count that still holds.
                return;
            }
            v = want;
        }
    }

    /// The wake socket, bound on first use under a random name, which the header then
    /// publishes to senders (`fdwake`).
    fn wake_sock(&self) -> Option<&WakeSock> {
        self.wake_sock
            .get_or_init(|| {
                let bound = getrandom::u64()
                    .map_err(|e| Error::Inval(format!("shm: no random number from the OS: {e}")))
                    .map(|n| n.max(1))
                    .and_then(|nonce| Ok((WakeSock::bind(self.seg.name(), nonce)?, nonce)));
                match bound {
                    Ok((s, nonce)) => {
                        ring::wake_nonce(&self.seg).store(nonce, Ordering::Release);
                        Some(s)
                    }
                    Err(e) => {
                        tracing::warn!(
                            "shm: no wake socket, this endpoint's waits on descriptors do not \
                             sleep: {e}"
                        );
                        None
                    }
                }
            })
            .as_ref()
    }
}

impl Bell for ShmBell {
    const LOOKS: bool = true;

    fn has_work(&self) -> bool {
        // Idle, take the full path only when a sweep is due and something waits on a peer: a
        // dead one must be noticed by time, however slowly (or fast) the application polls.
        let sweep = || {
            if !self.idle.watch.load(Ordering::Relaxed) {
                return false;
            }
            // This look pays one a progress call that took messages in left owed.
            if self.idle.clock_owed.load(Ordering::Relaxed) {
                self.idle.clock_owed.store(false, Ordering::Relaxed);
            }
            crate::clock::coarse_ms() >= self.idle.next_sweep.load(Ordering::Relaxed)
        };
        Net::has_work(&self.seg, &self.idle) || sweep()
    }

    fn awake(&self) {
        // Awake: senders need not ring the wake socket until the next fd sleep, except for
        // the joint sleeps still going on (a thread asleep on several endpoints sleeps on,
        // whoever else progresses meanwhile). So the word goes back to what this endpoint
        // itself counts, whatever else wrote it (a peer can: it is in our segment). The word
        // is read first: one showing a joint sleep's count was written after that sleep
        // counted itself here. Exchanged, not stored: a word that moved since (a sleep
        // counted, a sender's mark) is left for the next call.
        // A zero word is left alone, the polling loop's case (one load): only a peer that
        // clears it under a joint sleep makes it wrong, and then no sender rings the socket
        // until that sleep ends (its timeout: a peer that can write our header can as well
        // stop ringing).
        let v = ring::fd_sleeping(&self.seg).load(Ordering::SeqCst);
        if v != 0 {
            self.restore_word(v);
        }
    }

    fn nap(&self, timeout: Duration) -> Option<Duration> {
        // A dead peer rings no doorbell: while work waits on peers, wake in time to sweep.
        Some(if self.idle.watch.load(Ordering::Relaxed) {
            timeout.min(Duration::from_millis(SWEEP_EVERY_MS))
        } else {
            timeout
        })
    }

    fn ticket(&self) -> u64 {
        ring::doorbell(&self.seg).load(Ordering::SeqCst).into()
    }

    fn sleep(&self, ticket: u64, timeout: Duration, _fds: &[(RawFd, i16)]) {
        let sleepers = ring::sleeping(&self.seg);
        sleepers.fetch_add(1, Ordering::SeqCst);
        // Counted as asleep first, then looked: a sender that wrote after the look saw the
        // count and rings the doorbell, moving it past the ticket. A local wake before the
        // count is the flag's (SeqCst both sides: we see it, or it sees us).
        let kicked = self.kicked.swap(false, Ordering::SeqCst);
        if !kicked && !Net::has_work(&self.seg, &self.idle) {
            super::futex::wait(ring::doorbell(&self.seg), ticket as u32, timeout);
        }
        sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    fn wake(&self) {
        self.kicked.store(true, Ordering::SeqCst);
        Net::wake(&self.seg);
    }

    fn wait_fds(&self, out: &mut Vec<(RawFd, i16)>) {
        if let Some(s) = self.wake_sock() {
            out.push((s.raw(), libc::POLLIN));
        }
    }

    fn arm_fds(&self) {
        let Some(s) = self.wake_sock() else {
            return;
        };
        // Flag, then drain, then look: a sender that wrote after the look saw the flag (the
        // fences pair with `Net::wake`'s) and rings after the drain. A peer that dies while
        // we sleep is noticed at the next wake-up: no descriptor announces it.
        // Release: a sender that sees the flag sees the wake socket's nonce, stored before it.
        ring::fd_sleeping(&self.seg).fetch_or(ring::FD_TRYWAIT, Ordering::Release);
        fence(Ordering::SeqCst);
        s.drain();
    }

    fn join_sleep(
        &self,
        timeout: Duration,
        _fds: &[(RawFd, i16)],
        out: &mut Vec<(RawFd, i16)>,
    ) -> Join {
        // The futex is one word: a sleep shared with other endpoints is taken on the wake
        // socket, as a sleep on descriptors is (`arm_fds`, `quiet`).
        let Some(s) = self.wake_sock() else {
            return Join::Cannot;
        };
        // Only sweeps read a CONNECT waiting for its segment, and a peer whose datagram could
        // not reach the socket (another network namespace) rings only the futex: a sleep that
        // keeps to a millisecond (the caller's other way) rather than one on the socket. Such
        // a peer's first frame to find a joint sleep waits for its end (up to 100 ms, once).
        let word = ring::fd_sleeping(&self.seg);
        if self.idle.connect_waits.load(Ordering::Relaxed)
            || word.load(Ordering::Relaxed) & ring::FD_UNREACHABLE != 0
        {
            return Join::Cannot;
        }
        // Counted (ours first: `awake`), then looked (as `arm_fds`): a sender that wrote
        // after the look sees the count and rings after the drain.
        self.joint.fetch_add(1, Ordering::SeqCst);
        word.fetch_add(ring::FD_JOINT, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        s.drain();
        if self.kicked.swap(false, Ordering::SeqCst) || Net::has_work(&self.seg, &self.idle) {
            self.leave_sleep();
            return Join::Ready;
        }
        out.push((s.raw(), libc::POLLIN));
        Join::Joined(timeout)
    }

    fn leave_sleep(&self) {
        self.joint.fetch_sub(1, Ordering::SeqCst);
        // The count alone, saturating; fi_trywait's bit and the mark kept: a peer may have
        // written the word meanwhile (`awake` puts back what we count).
        let _ =
            ring::fd_sleeping(&self.seg).fetch_update(Ordering::SeqCst, Ordering::Relaxed, |v| {
                let kept = v & (ring::FD_TRYWAIT | ring::FD_UNREACHABLE);
                let count = (v & !kept).saturating_sub(ring::FD_JOINT);
                Some(kept | count)
            });
    }

    fn quiet(&self) -> bool {
        // Without a wake socket no peer's frame would end a sleep on descriptors: none begins
        // (fi_trywait answers again, and the application polls).
        if self.wake_sock().is_none() {
            return false;
        }
        // A local wake not yet taken ends a sleep on descriptors before it begins, as it ends
        // the doorbell's (`sleep`): taken here.
        // Nor while a peer's CONNECT waits for its segment to map: only the sweeps of later
        // progress calls read it again, and a sleep on descriptors has no timeout.
        !self.kicked.swap(false, Ordering::SeqCst)
            && !Net::has_work(&self.seg, &self.idle)
            && !self.idle.connect_waits.load(Ordering::Relaxed)
    }
}

impl Wire for Net {
    const PROVIDER: &'static str = "shm";
    const WATCHES_SOURCES: bool = true;
    const PREARMS: bool = true;
    type Bell = ShmBell;

    fn bell(&self) -> Result<ShmBell> {
        Ok(ShmBell {
            // The file we own, not what has its name by now.
            seg: self.seg.reopen()?,
            idle: self.idle.clone(),
            wake_sock: OnceLock::new(),
            kicked: std::sync::atomic::AtomicBool::new(false),
            joint: AtomicU32::new(0),
        })
    }

    fn peer(&mut self, raw: &[u8]) -> Result<PeerId> {
        let name = seg_name(raw)?;
        self.peer_by_name(&name)
    }

    fn alive(&self, p: PeerId) -> Result<()> {
        if self.dead(p) {
            return Err(Error::PeerLost(format!(
                "peer {} is gone",
                self.peer_name(p)
            )));
        }
        Ok(())
    }

    fn reach(&mut self, p: PeerId) -> Result<()> {
        self.alive(p)?;
        self.ensure_lane(p)
    }

    fn room(&mut self, engine: &Engine, p: PeerId, len: usize) -> bool {
        // As on shm's own protocol, a post toward a full ring answers `Again` rather than
        // queueing; behind a frame still being written, posts queue in the engine (bounded
        // by `tx_max`) and go out as its pieces do.
        self.writing_to(p) || (engine.blocked(p) == 0 && self.fits(p, len))
    }

    fn stuck(&mut self, g: &mut Glue<'_>, p: PeerId) -> Result<()> {
        if self.broken(p) {
            self.lose(g, p, "its ring is corrupt");
        } else if !self.check(g, p) {
            return Ok(());
        }
        self.alive(p)
    }

    #[inline]
    unsafe fn send_in_place(&mut self, engine: &mut Engine, p: PeerId, op: &TxOp) -> Result<bool> {
        // SAFETY: forwarded from the caller.
        unsafe { engine.write_in_place(p, op, self) }
    }

    fn prearm(&mut self, p: PeerId, ctrl: &[u8]) -> Option<u32> {
        Net::prearm(self, p, ctrl)
    }

    fn release(&mut self, p: PeerId, slot: u32, token: u64) -> bool {
        Net::release(self, p, slot, token)
    }

    fn unarm(&mut self, slot: u32) {
        Net::unarm(self, slot)
    }

    fn progress(&mut self, g: &mut Glue<'_>) -> usize {
        let n = Net::progress(self, g);
        if self.sweep_look(n) {
            self.sweep(g);
        }
        n
    }

    fn push(&mut self, g: &mut Glue<'_>) {
        Net::push(self, g)
    }

    fn published_current(&self, engine: &Engine) -> bool {
        Net::published_current(self, engine)
    }

    fn publish(&self, engine: &Engine, bell: &ShmBell) {
        // The bell reads the mirrors `Net` shares with it.
        if Net::publish(self, engine) {
            bell.wake();
        }
    }

    fn held(&self) -> usize {
        Net::held(self)
    }

    fn cut_region(&mut self, _: &mut Glue<'_>, addr: usize, len: usize, cut: &rdm::Cut) {
        // Its copies (split, CUDA IPC) are under way in the peer or the device: they end
        // failed when they report (`Cut::copies`).
        Net::cut_region(self, addr, len, &cut.sinks)
    }

    fn shutdown(&mut self, g: &mut Glue<'_>, deadline: Instant) {
        let start = Instant::now();
        loop {
            Net::push(self, g);
            // A split copy's peer may still be writing into a buffer about to be handed back:
            // it is given longer (a claimed part is one system call away from done, but its
            // process may not be scheduled), as shm's first protocol gave it.
            let now = Instant::now();
            let owing = (g.engine.owes() || self.writing() || self.ipc_busy()) && now < deadline;
            let splitting = self.splitting() && now.duration_since(start) < CLOSE_SPLIT;
            if !(owing || splitting) {
                break;
            }
            Wire::progress(self, g);
            std::thread::yield_now();
        }
        // Past the bound: a peer that neither answers nor dies is given up on.
        self.end_splits(g.engine, None, errno::FI_ECANCELED);
        self.abandon_ipc(g.engine);
        self.bye();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wake from this process that comes before the sleep it is for (the sleeper decided,
    /// took its ticket and progressed, but had not counted itself asleep yet) ends that sleep
    /// at once: it was lost, and the sleep lasted its timeout (100 ms in a progress thread).
    #[test]
    fn a_local_wake_before_the_sleep_is_kept_for_it() {
        let net = Net::open(false).unwrap();
        let bell = net.bell().unwrap();
        let ticket = bell.ticket();
        bell.wake();
        let t = std::time::Instant::now();
        bell.sleep(ticket, Duration::from_secs(30), &[]);
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "slept {:?} through a wake",
            t.elapsed()
        );
        assert!(
            !bell.kicked.load(Ordering::SeqCst),
            "taken by that sleep, not left for the next"
        );
        // The same for a sleep on descriptors (a wait object's): not quiet once, then quiet.
        bell.wake();
        assert!(!bell.quiet(), "a sleep on descriptors would miss the wake");
        assert!(bell.quiet());
    }

    /// The `fd_sleeping` word senders read goes back to zero after every kind of sleep on the
    /// wake socket (left raised, every later send would pay a system call), keeps a joint
    /// sleep's count through another thread's progress call, comes back from what a peer
    /// wrote into it, and carries a sender's mark that the socket cannot be reached, after
    /// which no joint sleep begins and senders stop trying.
    #[test]
    fn the_wake_word_counts_only_sleeps_going_on() {
        let net = Net::open(false).unwrap();
        let bell = net.bell().unwrap();
        let word = || ring::fd_sleeping(&bell.seg).load(Ordering::SeqCst);
        let mut fds = Vec::new();
        let joined =
            |fds: &mut Vec<(RawFd, i16)>| bell.join_sleep(Duration::from_secs(1), &[], fds);
        // Joined, then left.
        assert_eq!(joined(&mut fds), Join::Joined(Duration::from_secs(1)));
        assert_eq!((word(), fds.len()), (ring::FD_JOINT, 1));
        bell.leave_sleep();
        assert_eq!(word(), 0);
        // A wake waiting: not joined, and nothing left raised.
        bell.wake();
        assert_eq!(joined(&mut fds), Join::Ready);
        assert_eq!(word(), 0);
        // fi_trywait's bit and a joint sleep: a progress call (another thread's) clears the
        // first and keeps the second.
        bell.arm_fds();
        assert_eq!(joined(&mut fds), Join::Joined(Duration::from_secs(1)));
        assert_eq!(word(), ring::FD_TRYWAIT | ring::FD_JOINT);
        bell.awake();
        assert_eq!(word(), ring::FD_JOINT);
        // A peer's scribble, put back to our count by the next progress call.
        ring::fd_sleeping(&bell.seg).store(0x7000_0001, Ordering::SeqCst);
        bell.awake();
        assert_eq!(word(), ring::FD_JOINT);
        bell.leave_sleep();
        assert_eq!(word(), 0);
        ring::fd_sleeping(&bell.seg).store(0x00ff_ff00, Ordering::SeqCst);
        bell.awake();
        assert_eq!(word(), 0);
        // fi_trywait's bit outlives a joint sleep's end, even one whose count a peer wiped.
        assert_eq!(joined(&mut fds), Join::Joined(Duration::from_secs(1)));
        bell.arm_fds();
        ring::fd_sleeping(&bell.seg).store(ring::FD_TRYWAIT, Ordering::SeqCst);
        bell.leave_sleep();
        assert_eq!(word(), ring::FD_TRYWAIT);
        bell.awake();
        assert_eq!(word(), 0);
        // A socket no datagram reaches: a sender marks the word (here the nonce names none).
        let sock = fds[0].0;
        let readable = || {
            let mut p = libc::pollfd {
                fd: sock,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd; no wait.
            unsafe { libc::poll(&mut p, 1, 0) == 1 }
        };
        ring::wake_nonce(&bell.seg).fetch_add(1, Ordering::SeqCst);
        assert_eq!(joined(&mut fds), Join::Joined(Duration::from_secs(1)));
        Net::wake(&bell.seg);
        assert!(!readable(), "no socket of that name");
        assert_eq!(word(), ring::FD_UNREACHABLE | ring::FD_JOINT);
        bell.leave_sleep();
        bell.awake();
        assert_eq!(word(), ring::FD_UNREACHABLE, "the mark stays");
        assert_eq!(joined(&mut fds), Join::Cannot);
        assert_eq!(word(), ring::FD_UNREACHABLE);
        // With only the mark, a sender does not try the socket (which its name now reaches).
        ring::wake_nonce(&bell.seg).fetch_sub(1, Ordering::SeqCst);
        Net::wake(&bell.seg);
        assert!(!readable());
    }
}
