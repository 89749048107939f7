//! The NIC's own one-sided operations on a connection: RDMA writes (always with immediate
//! data, so the target reports them as the engine would), RDMA reads, and the two 8-byte
//! atomics, posted on the connection's QP in order with the chunks that carry frames.
//!
//! Which operations come here is decided in two places: the engine (only when nothing framed
//! toward the peer is outstanding: see `core::rdm::engine::native`) and [`VerbsOneSided`]
//! (only where the key is one this provider made, with the access the operation needs, the
//! local memory is registered or small enough to bounce through a send buffer, the remote CQ
//! data fits the immediate, and, for reads and atomics, the peer said it does not report
//! remote reads, which its NIC would do unseen).
//!
//! Completion levels: a write's work completion on RC means the target's NIC acknowledged
//! the data placed in its memory, which is what `FI_DELIVERY_COMPLETE` (and, a fortiori,
//! `FI_TRANSMIT_COMPLETE`) promise; `FI_COMMIT_COMPLETE` (durability) never comes here — the
//! target's engine makes that write durable before it acknowledges. Reads and atomics complete
//! when their data is here.
//!
//! Errors: the target's NIC refusing a key, a range or the access (a remote access error),
//! or an invalid request, fails that operation with `FI_EACCES` (`FI_EINVAL`); the QP is then
//! in the error state, so the connection is dropped and every other operation outstanding
//! toward that peer ends with `FI_ECANCELED` (nothing is retried: a flushed atomic or write
//! may be one the application wants to reconsider). The next operation to the peer connects
//! again. Any other error is the peer lost, as for chunks.

use std::sync::RwLock;

use xfabric_core::consts::errno::*;
use xfabric_core::consts::*;
use xfabric_core::rdm::{Desc, Dir, NativeKind, OneSided};
use xfabric_core::rxq::IovList;
use xfabric_core::settings;
use xfabric_core::CntrClass;

use super::super::mr::{NicKey, Registry};
use super::pieces::{read_room, split, Owner, Transfer, PIECE, READ_DEPTH};
use super::*;

/// One-sided operations one connection may have posted at once (`MAX_LINKS` counts them).
pub const NATIVE_MAX: usize = 64;
/// Set in a work request's slot number for one-sided operations.
pub const NATIVE_BIT: usize = 1 << 31;
/// Local memory not registered with the NIC bounces through a send buffer up to this size.
pub const BOUNCE_MAX: usize = CHUNK;
/// Bit 31 of the immediate: the write carries remote CQ data (in bits 30..0).
const IMM_DATA: u32 = 1 << 31;

/// What the endpoint's engine (its `native` decisions) and its connections share.
#[derive(Default)]
pub struct Shared {
    /// The domain's NIC registrations.
    pub reg: Arc<Registry>,
    /// By peer: whether it said it does not report remote reads (its hello).
    quiet: RwLock<Vec<bool>>,
}

impl Shared {
    /// For the endpoints of a domain whose registrations are `reg`.
    pub fn new(reg: Arc<Registry>) -> Arc<Shared> {
        Arc::new(Shared {
            reg,
            quiet: RwLock::default(),
        })
    }

    fn quiet(&self, peer: PeerId) -> bool {
        let q = self.quiet.read().unwrap_or_else(|e| e.into_inner());
        q.get(peer).copied().unwrap_or(false)
    }

    pub(super) fn set_quiet(&self, peer: PeerId, quiet: bool) {
        let mut q = self.quiet.write().unwrap_or_else(|e| e.into_inner());
        if q.len() <= peer {
            if peer > 1 << 20 {
                return;
            }
            q.resize(peer + 1, false);
        }
        q[peer] = quiet;
    }
}

/// Whether `core` reports remote reads or atomics (`FI_RMA_EVENT`, a remote counter): its
/// peers' NICs must then leave them to its engine.
pub fn reports_remote(core: &EpCore) -> bool {
    if core.caps & FI_RMA_EVENT != 0 {
        return true;
    }
    core.bound().is_some_and(|b| {
        b.cntr[CntrClass::RemoteRead as usize].is_some()
            || b.cntr[CntrClass::RemoteWrite as usize].is_some()
    })
}

/// The remote CQ data an immediate carries.
pub fn imm_data(imm: u32) -> Option<u64> {
    (imm & IMM_DATA != 0).then_some(u64::from(imm & !IMM_DATA))
}

/// The immediate for a write with `data`; `None`: it does not fit (bits above 30 set).
fn imm_for(data: Option<u64>) -> Option<u32> {
    match data {
        None => Some(0),
        Some(d) if d < u64::from(IMM_DATA) => Some(IMM_DATA | d as u32),
        Some(_) => None,
    }
}

/// Whether an operation's local memory can be handed to the NIC: registered, or small.
fn local_ok(reg: &Registry, local: &IovList, len: usize) -> bool {
    if len <= BOUNCE_MAX {
        return true;
    }
    matches!(local.segs(), [s] if reg.lkey(s.addr, s.len).is_some())
}

/// The verbs transport's answer to the engine: which operations its NIC carries out, and
/// the memory large messages offer for the peer's NIC to read (`pull`).
pub struct VerbsOneSided {
    shared: Arc<Shared>,
    offers: super::pull::Offers,
    pull_min: usize,
    /// `XFABRIC_VERBS_NATIVE`.
    enabled: bool,
    /// `XFABRIC_VERBS_NATIVE_ATOMICS`.
    atomics: bool,
}

impl VerbsOneSided {
    pub fn new(shared: Arc<Shared>, nic: &Arc<Nic>) -> Self {
        let pull_min = match settings::VERBS_PULL_MIN.usize() {
            0 => usize::MAX,
            n => n,
        };
        VerbsOneSided {
            shared,
            offers: super::pull::Offers::new(nic),
            pull_min,
            enabled: settings::VERBS_NATIVE.flag(),
            atomics: settings::VERBS_NATIVE_ATOMICS.flag(),
        }
    }
}

impl OneSided for VerbsOneSided {
    fn pull_min(&self) -> usize {
        self.pull_min
    }

    fn describe(&self, _peer: PeerId, iov: &IovList, dir: Dir) -> Option<Desc> {
        self.offers.describe(iov, dir)
    }

    fn offer_ended(&self, _peer: PeerId, iov: &IovList, dir: Dir) {
        self.offers.ended(iov, dir)
    }

    fn native(&self, peer: PeerId, n: &Native) -> bool {
        if !self.enabled {
            return false;
        }
        let Some(k) = NicKey::decode(n.key) else {
            return false;
        };
        let kind_ok = match n.kind {
            NativeKind::Write { data } => k.write && imm_for(data).is_some(),
            // A read above `pieces::PIECE` goes as several work requests (`pieces`).
            NativeKind::Read => k.read && self.shared.quiet(peer),
            // Only where asked for (`XFABRIC_VERBS_NATIVE_ATOMICS`): one process's atomic on
            // a word may go through the NIC while another's, on a busy link or of another
            // operation, goes through the target's CPU, and the two are not atomic together.
            NativeKind::FetchAdd { .. } | NativeKind::CompareSwap { .. } if self.atomics => {
                // The NIC grants its atomics only on regions open to remote reads and writes
                // both (`mr::ib_access`: each of them returns the old value); the NIC needs
                // the word aligned. Other atomics go through the target's engine.
                k.write && k.read && n.addr.is_multiple_of(8) && self.shared.quiet(peer)
            }
            NativeKind::FetchAdd { .. } | NativeKind::CompareSwap { .. } => false,
        };
        kind_ok && u32::try_from(n.len).is_ok() && local_ok(&self.shared.reg, &n.local, n.len)
    }
}

/// A one-sided operation posted on a connection (or a piece of a larger one: `pieces`).
pub(super) struct Inflight {
    token: u64,
    kind: NativeKind,
    local: IovList,
    /// The send buffer it bounces through, if its memory is not registered.
    bounce: Option<usize>,
    /// A piece of this transfer, not an operation of its own.
    part: Option<Owner>,
    /// Bytes it reads (`Link::read_bytes`).
    reads: u64,
}

impl Inflight {
    /// A piece of `owner`'s transfer: a read of `len` bytes of the peer's memory, or a write
    /// into it.
    pub(super) fn piece(owner: Owner, read: bool, len: u32) -> Inflight {
        Inflight {
            token: 0,
            kind: if read {
                NativeKind::Read
            } else {
                NativeKind::Write { data: None }
            },
            local: IovList::default(),
            bounce: None,
            part: Some(owner),
            reads: if read { u64::from(len) } else { 0 },
        }
    }
}

/// What posting one operation came to.
pub enum Posted {
    Yes,
    /// Not now (the connection's budget, credits or buffers): it stays first in line.
    NoRoom,
    /// It cannot be done (its memory is no longer registered); it ends with this errno.
    Failed(i32),
    /// The QP refused the post: the connection is broken.
    Broken(Error),
}

/// `IBV_SEND_FENCE` where reads or atomics are still outstanding on the connection: what is
/// posted now (a send, a write, an atomic) must not pass them.
pub(super) fn fence(l: &Link) -> u32 {
    if l.reads_out > 0 {
        sys::IBV_SEND_FENCE
    } else {
        0
    }
}

/// `IBV_SEND_FENCE` for a read where atomics are outstanding: a read must see what an earlier
/// atomic stored. Reads after reads change nothing and go unfenced, so that a large read's
/// pieces are in flight together.
pub(super) fn read_fence(l: &Link) -> u32 {
    if l.atomics_out > 0 {
        sys::IBV_SEND_FENCE
    } else {
        0
    }
}

/// The transfer that posts a read of more than `PIECE` bytes into registered local memory.
pub(super) fn read_transfer(id: usize, n: &Native, shared: &Shared) -> Result<Transfer, i32> {
    let k = NicKey::decode(n.key).ok_or(FI_EINVAL)?;
    let [s] = n.local.segs() else {
        return Err(FI_EINVAL);
    };
    if s.len != n.len {
        return Err(FI_EINVAL);
    }
    let lkey = shared.reg.lkey(s.addr, s.len).ok_or(FI_EINVAL)?;
    let pieces = split(s.addr as u64, lkey, n.addr, k.rkey, n.len as u64);
    Ok(Transfer::new(id, true, pieces, Vec::new()))
}

/// Whether `n` goes as a transfer of several work requests (`pieces`).
pub(super) fn in_pieces(n: &Native) -> bool {
    matches!(n.kind, NativeKind::Read) && n.len as u64 > PIECE
}

/// How long a closed side channel waits for outstanding one-sided operations' completions.
const NAK_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

/// Whether a connection whose side channel just closed should wait for its one-sided
/// operations' completions first (at most `NAK_GRACE`): a peer whose NIC refused an access
/// closes after answering, and the refusal names the operation that caused it.
pub(super) fn nak_pending(l: &mut Link) -> bool {
    if l.natives.is_empty() {
        return false;
    }
    let since = *l.closing.get_or_insert_with(std::time::Instant::now);
    since.elapsed() < NAK_GRACE
}

/// Posts `n` on connection `id` (`l`), if it has room.
pub(super) fn post(l: &mut Link, id: usize, n: &Native, shared: &Shared) -> Posted {
    let write = matches!(n.kind, NativeKind::Write { .. });
    let read = matches!(n.kind, NativeKind::Read);
    if l.natives.len() >= NATIVE_MAX || (write && l.credits == 0) {
        return Posted::NoRoom;
    }
    if (read && !read_room(l, n.len as u64)) || (!write && l.reads_out >= READ_DEPTH) {
        return Posted::NoRoom;
    }
    let Some(k) = NicKey::decode(n.key) else {
        return Posted::Failed(FI_EINVAL);
    };
    let Ok(len32) = u32::try_from(n.len) else {
        return Posted::Failed(FI_EINVAL);
    };
    let registered = match n.local.segs() {
        [s] if s.len == n.len => shared.reg.lkey(s.addr, s.len).map(|lkey| (s.addr, lkey)),
        _ => None,
    };
    let (mut sge, bounce) = match registered {
        _ if n.len == 0 => (sys::ibv_sge::default(), None),
        Some((addr, lkey)) => (
            sys::ibv_sge {
                addr: addr as u64,
                length: len32,
                lkey,
            },
            None,
        ),
        None if n.len > BOUNCE_MAX => return Posted::Failed(FI_EINVAL),
        None => {
            let Some(slot) = l.free_tx.pop() else {
                return Posted::NoRoom;
            };
            let at = slot * CHUNK;
            if write {
                // SAFETY: the engine keeps a native operation's local memory valid until
                // on_native (the `Native` contract); the slot is ours until its completion.
                unsafe { n.local.copy_out(0, &mut l.buf[at..at + n.len]) };
            }
            (
                sys::ibv_sge {
                    addr: l.buf[at..].as_mut_ptr() as u64,
                    length: len32,
                    lkey: l.mr.lkey(),
                },
                Some(slot),
            )
        }
    };
    let seq = l.next_native & !(NATIVE_BIT as u32);
    l.next_native = l.next_native.wrapping_add(1);
    let mut wr = sys::ibv_send_wr {
        wr_id: wr_id(id, NATIVE_BIT | seq as usize),
        sg_list: &mut sge,
        num_sge: i32::from(n.len > 0),
        send_flags: sys::IBV_SEND_SIGNALED | if read { read_fence(l) } else { fence(l) },
        ..Default::default()
    };
    match n.kind {
        NativeKind::Write { data } => {
            wr.opcode = sys::IBV_WR_RDMA_WRITE_WITH_IMM;
            wr.imm_data = imm_for(data).unwrap_or(0).to_be();
            wr.set_rdma(n.addr, k.rkey);
        }
        NativeKind::Read => {
            wr.opcode = sys::IBV_WR_RDMA_READ;
            wr.set_rdma(n.addr, k.rkey);
        }
        NativeKind::FetchAdd { add } => {
            wr.opcode = sys::IBV_WR_ATOMIC_FETCH_AND_ADD;
            wr.wr.remote_addr = n.addr;
            wr.wr.compare_add = add;
            wr.wr.rkey = k.rkey;
        }
        NativeKind::CompareSwap { compare, swap } => {
            wr.opcode = sys::IBV_WR_ATOMIC_CMP_AND_SWP;
            wr.wr.remote_addr = n.addr;
            wr.wr.compare_add = compare;
            wr.wr.swap = swap;
            wr.wr.rkey = k.rkey;
        }
    }
    // SAFETY: the scatter entry names registered memory that stays valid until the
    // completion (the application's, kept by the engine; or our slot); the remote range is
    // the peer's NIC's to check.
    if let Err(e) = unsafe { l.qp.post_send(&mut wr) } {
        if let Some(s) = bounce {
            l.free_tx.push(s);
        }
        return Posted::Broken(e);
    }
    if write {
        // Its immediate takes one of the peer's receive buffers.
        l.credits -= 1;
    } else {
        l.reads_out += 1;
    }
    if read {
        l.read_bytes += n.len as u64;
    } else if !write {
        l.atomics_out += 1;
    }
    l.natives.insert(
        seq,
        Inflight {
            token: n.token,
            kind: n.kind,
            local: n.local,
            bounce,
            part: None,
            reads: if read { n.len as u64 } else { 0 },
        },
    );
    Posted::Yes
}

impl Net {
    /// Queues a one-sided operation for the NIC, in order with the frames to its peer.
    pub fn native(&mut self, n: Native) {
        // A peer lost and not yet reported takes nothing more (see `Transport::send`): the
        // engine fails the operation with the rest when it hears.
        let Some(p) = self.peers.get_mut(n.peer).filter(|p| p.losing == 0) else {
            return;
        };
        p.out.push_back(Out::Native(n));
        self.connect_if_idle(n.peer);
    }

    /// A one-sided operation's work completion (slot `slot` of connection `id`).
    pub(super) fn native_done<H: Handler>(
        &mut self,
        id: usize,
        slot: usize,
        wc: &sys::ibv_wc,
        h: &mut H,
    ) {
        let Some(l) = self.links.get_mut(&id) else {
            return;
        };
        let Some(f) = l.natives.remove(&((slot & !NATIVE_BIT) as u32)) else {
            return;
        };
        match f.kind {
            NativeKind::Write { .. } => {}
            NativeKind::Read => {
                l.reads_out = l.reads_out.saturating_sub(1);
                l.read_bytes = l.read_bytes.saturating_sub(f.reads);
            }
            NativeKind::FetchAdd { .. } | NativeKind::CompareSwap { .. } => {
                l.reads_out = l.reads_out.saturating_sub(1);
                l.atomics_out = l.atomics_out.saturating_sub(1);
            }
        }
        let ok = wc.status == sys::IBV_WC_SUCCESS;
        if !ok {
            tracing::debug!(
                link = id,
                status = wc.status,
                vendor_err = wc.vendor_err,
                part = ?f.part,
                "verbs: one-sided operation failed"
            );
        }
        let refused = match wc.status {
            sys::IBV_WC_REM_ACCESS_ERR => Some(FI_EACCES),
            sys::IBV_WC_REM_INV_REQ_ERR => Some(FI_EINVAL),
            _ => None,
        };
        if let Some(owner) = f.part {
            let errno = match (ok, refused, wc.status) {
                (true, _, _) => 0,
                (false, Some(e), _) => e,
                (false, None, sys::IBV_WC_WR_FLUSH_ERR) => libc::ECANCELED,
                (false, None, _) => FI_ECONNRESET,
            };
            self.piece_done(owner, errno, refused.is_some(), h);
            if !ok {
                // The others toward the peer end with the connection (its QP is in the
                // error state now).
                let why = "a piece of a one-sided transfer failed";
                self.fail_link(id, refused.map_or(errno, |_| libc::ECANCELED), why);
            }
            return;
        }
        if let Some(s) = f.bounce {
            if ok && !matches!(f.kind, NativeKind::Write { .. }) && f.local.total() > 0 {
                let at = s * CHUNK;
                let n = f.local.total().min(CHUNK);
                // SAFETY: the engine keeps the local memory writable until on_native.
                unsafe { f.local.copy_in(0, &l.buf[at..at + n]) };
            }
            l.free_tx.push(s);
        }
        if ok {
            super::super::stats::NATIVE_DONE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            h.on_native(f.token, 0);
            return;
        }
        match refused {
            Some(errno) => {
                // This operation was refused; the others toward the peer are canceled with
                // the connection (the QP is in the error state now).
                super::super::stats::NATIVE_REFUSED
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                h.on_native(f.token, errno);
                self.fail_link(id, libc::ECANCELED, "the peer's NIC refused an access");
            }
            None => {
                let errno = match wc.status {
                    sys::IBV_WC_WR_FLUSH_ERR => libc::ECANCELED,
                    _ => libc::ECONNRESET,
                };
                self.fail_link(id, errno, "one-sided operation failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediates_carry_small_cq_data_only() {
        assert_eq!(imm_for(None), Some(0));
        assert_eq!(imm_data(0), None);
        for d in [0u64, 1, 0x1234, (1 << 31) - 1] {
            let imm = imm_for(Some(d)).unwrap();
            assert_eq!(imm_data(imm), Some(d));
        }
        assert_eq!(imm_for(Some(1 << 31)), None);
        assert_eq!(imm_for(Some(u64::MAX)), None);
    }

    #[test]
    fn local_memory_registered_or_small() {
        let reg = Registry::default();
        let big = vec![0u8; BOUNCE_MAX + 1];
        let iov = IovList::one(big.as_ptr() as usize, big.len());
        assert!(local_ok(&reg, &iov, 64));
        assert!(!local_ok(&reg, &iov, big.len()));
        assert!(local_ok(&reg, &IovList::default(), 0));
    }

    #[test]
    fn only_our_keys_with_the_access_go_to_the_nic() {
        let shared = Shared::new(Arc::default());
        let mut os = VerbsOneSided {
            shared: shared.clone(),
            offers: super::super::pull::Offers::detached(),
            pull_min: usize::MAX,
            enabled: true,
            atomics: true,
        };
        let mut word = 0u64;
        let key = |read, write| {
            NicKey {
                rkey: 5,
                read,
                write,
                salt: 0x2a << 32,
            }
            .encode()
        };
        let op = |kind, key, local| Native {
            peer: 0,
            token: 0,
            kind,
            local,
            addr: 64,
            key,
            len: 8,
            flags: 0,
        };
        let here = IovList::one(&mut word as *mut u64 as usize, 8);
        let w = |data| NativeKind::Write { data };
        assert!(os.native(0, &op(w(None), key(false, true), here)));
        assert!(os.native(0, &op(w(Some(7)), key(false, true), here)));
        assert!(!os.native(0, &op(w(Some(1 << 40)), key(false, true), here)));
        assert!(!os.native(0, &op(w(None), key(true, false), here)));
        assert!(!os.native(0, &op(w(None), 7, here)), "a core key");
        // Reads and atomics only once the peer said it does not report them.
        let fa = NativeKind::FetchAdd { add: 1 };
        assert!(!os.native(0, &op(NativeKind::Read, key(true, false), here)));
        shared.set_quiet(0, true);
        assert!(os.native(0, &op(NativeKind::Read, key(true, false), here)));
        assert!(os.native(0, &op(fa, key(true, true), here)));
        // The NIC grants its atomics only on regions open to reads and writes both: on a
        // write-only one, even an atomic that fetches nothing goes through the engine.
        assert!(
            !os.native(0, &op(fa, key(false, true), IovList::default())),
            "an atomic on a write-only region"
        );
        assert!(
            !os.native(0, &op(fa, key(false, true), here)),
            "fetch needs read"
        );
        let mut odd = op(fa, key(true, true), here);
        odd.addr = 65;
        assert!(!os.native(0, &odd));
        shared.set_quiet(0, false);
        assert!(!os.native(0, &op(fa, key(true, true), here)));
        // The NIC's atomics only where asked for (`XFABRIC_VERBS_NATIVE_ATOMICS`); RMA the same.
        shared.set_quiet(0, true);
        os.atomics = false;
        assert!(!os.native(0, &op(fa, key(true, true), here)));
        let cas = NativeKind::CompareSwap {
            compare: 1,
            swap: 2,
        };
        assert!(!os.native(0, &op(cas, key(true, true), here)));
        assert!(os.native(0, &op(NativeKind::Read, key(true, false), here)));
        assert!(os.native(0, &op(w(None), key(false, true), here)));
    }
}
