//! Address vectors: fi_av(3), table and map. The AV stores each peer's raw name (what the peer's
//! `getname` returned) and hands out `fi_addr_t` values; providers resolve those to their own
//! per-peer state by index and keep a reverse map for `FI_SOURCE`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use crate::consts::*;
use crate::entry::{Context, FiAddr};
use crate::eq::{EqEntry, EqErrEntry, EqInner};
use crate::error::{Error, Result};

/// Marks map-type addresses so that a table index passed to a map AV (or a stale value) is caught.
const MAP_TAG: u64 = 0x5846_0000_0000_0000;
const MAP_MASK: u64 = 0xFFFF_0000_0000_0000;

/// `struct fi_av_attr`.
#[derive(Clone, Debug, Default)]
pub struct AvAttr {
    /// Table or map; `Unspec` picks table.
    pub av_type: AvType,
    /// Bits in an rx context index (`FI_NAMED_RX_CTX`); must be 0 here.
    pub rx_ctx_bits: i32,
    /// Expected number of addresses (a sizing hint).
    pub count: usize,
    /// Endpoints per node, a hint.
    pub ep_per_node: usize,
    /// Name of a shared AV (`FI_SHARED_AV`); unsupported.
    pub name: Option<String>,
    /// `FI_EVENT` (inserts report `FI_AV_COMPLETE` on the bound EQ), `FI_SYMMETRIC`.
    pub flags: u64,
}

/// Checks a raw address for a provider and prints it for `av_straddr`.
pub trait AddrFormat: Send + Sync {
    /// `Ok` if `addr` is a well-formed address of this provider.
    fn validate(&self, addr: &[u8]) -> Result<()>;
    /// Human-readable form.
    fn to_string(&self, addr: &[u8]) -> String;
    /// The one spelling of an address that the AV stores and looks up (for example without a
    /// C string's trailing NUL), so that equal addresses compare equal.
    fn canonical(&self, addr: &[u8]) -> Vec<u8> {
        addr.to_vec()
    }
    /// Whether C callers pass this provider's addresses as `struct sockaddr`s (their length
    /// told by the family) rather than NUL-terminated strings: `fi_av_insert` and
    /// `fi_av_straddr` take no lengths.
    fn sockaddr(&self) -> bool {
        false
    }
}

/// The length of the sockaddr starting with `head` (at least its two family bytes):
/// `sockaddr_in` or `sockaddr_in6`, else `None`.
pub fn sockaddr_len(head: [u8; 2]) -> Option<usize> {
    match u16::from_ne_bytes(head) as i32 {
        libc::AF_INET => Some(16),
        libc::AF_INET6 => Some(28),
        _ => None,
    }
}

struct Table {
    slots: Vec<Option<Vec<u8>>>,
    by_name: HashMap<Vec<u8>, usize>,
    /// Removed slots, reused lowest first (fi_av(3): an address goes into the lowest unused
    /// table location, which an application inserting without `fi_addr` relies on).
    free: std::collections::BTreeSet<usize>,
}

/// Shared state of an AV.
pub struct AvInner {
    av_type: AvType,
    flags: u64,
    fmt: Arc<dyn AddrFormat>,
    /// The domain's `addr_format` is `FI_ADDR_STR`: C callers pass NUL-terminated strings,
    /// whatever the provider's binary form.
    strings: std::sync::atomic::AtomicBool,
    t: RwLock<Table>,
    generation: AtomicU64,
    bound: AtomicUsize,
    /// The EQ of an `FI_EVENT` AV, with the fid its events carry.
    eq: RwLock<Option<(crate::eq::EqBinding, usize)>>,
    /// The domain it was opened in.
    pub domain: crate::tag::DomainTag,
}

/// `fid_av`.
#[derive(Clone)]
pub struct AddressVector {
    inner: Arc<AvInner>,
}

impl AddressVector {
    /// Opens an AV; `Domain::av_open` calls this with the provider's address format.
    pub fn open(attr: &AvAttr, fmt: Arc<dyn AddrFormat>) -> Result<Self> {
        if attr.rx_ctx_bits != 0 {
            return Err(Error::OpNotSupp(
                "av_open: rx_ctx_bits != 0 (FI_NAMED_RX_CTX) is not supported".into(),
            ));
        }
        if attr.name.is_some() {
            return Err(Error::OpNotSupp(
                "av_open: shared (named) AVs are not supported".into(),
            ));
        }
        let known = FI_EVENT | FI_SYMMETRIC_AV;
        if attr.flags & !known != 0 {
            return Err(Error::BadFlags(format!(
                "av_open: unknown flags {:#x}",
                attr.flags & !known
            )));
        }
        let av_type = match attr.av_type {
            AvType::Unspec => AvType::Table,
            t => t,
        };
        Ok(AddressVector {
            inner: Arc::new(AvInner {
                av_type,
                flags: attr.flags,
                fmt,
                strings: std::sync::atomic::AtomicBool::new(false),
                t: RwLock::new(Table {
                    slots: Vec::with_capacity(attr.count),
                    by_name: HashMap::new(),
                    free: Default::default(),
                }),
                generation: AtomicU64::new(0),
                bound: AtomicUsize::new(0),
                eq: RwLock::new(None),
                domain: Default::default(),
            }),
        })
    }

    /// The shared state, for binding to endpoints.
    pub fn inner(&self) -> &Arc<AvInner> {
        &self.inner
    }

    /// `fi_av_bind` to an event queue. Only an AV opened with `FI_EVENT` takes one (as
    /// libfabric's): its inserts then complete through the EQ. `fid` is what the EQ's entries
    /// name the AV by (C: its `struct fid`; 0 when the caller has no use for it).
    pub fn bind_eq(&self, eq: &crate::eq::EventQueue, fid: usize) -> Result<()> {
        if self.inner.flags & FI_EVENT == 0 {
            return Err(Error::Inval(
                "av bind: an EQ binds only to an AV opened with FI_EVENT".into(),
            ));
        }
        *self.inner.eq.write().unwrap_or_else(|e| e.into_inner()) = Some((eq.inner().bind(), fid));
        Ok(())
    }

    /// `fi_av_insert`: inserts each raw address, writing its `fi_addr_t` into `out`
    /// (`FI_ADDR_NOTAVAIL` for an address that is not valid). Synchronous AV: returns how many
    /// were inserted. AV opened with `FI_EVENT` (fi_av(3)'s asynchronous mode): each failed
    /// address is an error event on the bound EQ (its index as data, its errno), then one
    /// `FI_AV_COMPLETE` event carries the count, and the call returns 0; without a bound EQ
    /// it is `NoEq` and nothing is inserted.
    pub fn insert(&self, addrs: &[&[u8]], out: &mut [FiAddr], context: Context) -> Result<usize> {
        let eq = self.event_eq()?;
        let (n, failed) = self.insert_each(addrs, out)?;
        let Some((eq, fid)) = eq else {
            return Ok(n);
        };
        for (index, e) in failed {
            eq.push_err(EqErrEntry {
                fid,
                context,
                data: index as u64,
                err: e.errno(),
                prov_errno: 0,
            });
        }
        let done = EqEntry {
            event: FI_AV_COMPLETE,
            fid,
            context,
            data: n as u64,
            bytes: None,
        };
        // fi_av(3): every insert has its completion, so a full queue still takes it.
        eq.push_past_cap(done);
        Ok(0)
    }

    /// `fi_av_insert` with `FI_SYNC_ERR`: as the synchronous `insert`, and each address's
    /// outcome written to `errs` (0 inserted, else a positive errno). An AV opened with
    /// `FI_EVENT` refuses it (`BadFlags`), as fi_av(3) makes the flag synchronous only.
    pub fn insert_sync_err(
        &self,
        addrs: &[&[u8]],
        out: &mut [FiAddr],
        errs: &mut [i32],
    ) -> Result<usize> {
        if self.inner.flags & FI_EVENT != 0 {
            return Err(Error::BadFlags(
                "av insert: FI_SYNC_ERR on an AV opened with FI_EVENT".into(),
            ));
        }
        if errs.len() < addrs.len() {
            return Err(Error::Inval(format!(
                "av insert: {} error slots for {} addresses",
                errs.len(),
                addrs.len()
            )));
        }
        let (n, failed) = self.insert_each(addrs, out)?;
        errs[..addrs.len()].fill(0);
        for (index, e) in failed {
            errs[index] = e.errno();
        }
        Ok(n)
    }

    /// Inserts what is valid; the count inserted and each failure with its index.
    fn insert_each(
        &self,
        addrs: &[&[u8]],
        out: &mut [FiAddr],
    ) -> Result<(usize, Vec<(usize, Error)>)> {
        if out.len() < addrs.len() {
            return Err(Error::Inval(format!(
                "av insert: {} output slots for {} addresses",
                out.len(),
                addrs.len()
            )));
        }
        let mut n = 0;
        let mut failed = Vec::new();
        {
            let mut t = self.inner.t.write().unwrap_or_else(|e| e.into_inner());
            for (i, a) in addrs.iter().enumerate() {
                if let Err(e) = self.inner.fmt.validate(a) {
                    out[i] = FI_ADDR_NOTAVAIL;
                    failed.push((i, e));
                    continue;
                }
                let canon = self.inner.fmt.canonical(a);
                let a = &canon.as_slice();
                let idx = if let Some(&idx) = t.by_name.get(*a) {
                    idx
                } else {
                    let idx = match t.free.pop_first() {
                        Some(i) => {
                            t.slots[i] = Some(a.to_vec());
                            i
                        }
                        None => {
                            t.slots.push(Some(a.to_vec()));
                            t.slots.len() - 1
                        }
                    };
                    t.by_name.insert(a.to_vec(), idx);
                    idx
                };
                out[i] = self.inner.encode(idx);
                n += 1;
            }
        }
        if n > 0 {
            // Inserts change what reverse lookups find: cached misses must be retried.
            self.inner.generation.fetch_add(1, Ordering::Release);
        }
        Ok((n, failed))
    }

    /// Inserts one address, returning its `fi_addr_t` or the reason it is not valid. On an AV
    /// opened with `FI_EVENT` the bound EQ also gets the insert's events.
    pub fn insert_one(&self, addr: &[u8]) -> Result<FiAddr> {
        self.inner.fmt.validate(addr)?;
        let mut out = [FI_ADDR_NOTAVAIL];
        self.insert(&[addr], &mut out, 0)?;
        Ok(out[0])
    }

    /// The EQ and fid events go to, for an AV opened with `FI_EVENT`.
    fn event_eq(&self) -> Result<Option<(Arc<EqInner>, usize)>> {
        if self.inner.flags & FI_EVENT == 0 {
            return Ok(None);
        }
        let eq = self
            .inner
            .eq
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(b, fid)| (b.eq().clone(), *fid));
        eq.map(Some)
            .ok_or_else(|| Error::NoEq("av insert: AV opened with FI_EVENT but no EQ bound".into()))
    }

    /// `fi_av_remove`. The addresses before a bad one are removed all the same (as
    /// libfabric's providers do), and every cache of this AV's peers learns of it.
    pub fn remove(&self, addrs: &[FiAddr]) -> Result<()> {
        let mut t = self.inner.t.write().unwrap_or_else(|e| e.into_inner());
        let mut removed = false;
        let r = addrs.iter().try_for_each(|&a| {
            let idx = self.inner.decode(a).ok_or_else(|| {
                Error::Inval(format!("av remove: {a:#x} is not an address of this AV"))
            })?;
            let name = t.slots.get_mut(idx).and_then(|s| s.take()).ok_or_else(|| {
                Error::NoEntry(format!("av remove: address {a:#x} is not in use"))
            })?;
            t.by_name.remove(&name);
            t.free.insert(idx);
            removed = true;
            Ok(())
        });
        if removed {
            // Under the write lock: a cache that reads the old generation read the old slots.
            self.inner.generation.fetch_add(1, Ordering::Release);
        }
        r
    }

    /// `fi_av_lookup`: the raw address stored for `fi_addr`.
    pub fn lookup(&self, fi_addr: FiAddr) -> Result<Vec<u8>> {
        self.inner
            .name(fi_addr)
            .ok_or_else(|| Error::NoEntry(format!("av lookup: no address at {fi_addr:#x}")))
    }

    /// Whether C callers lay this AV's addresses out as sockaddrs (`AddrFormat::sockaddr`),
    /// not as strings (every provider's in a domain whose `addr_format` is `FI_ADDR_STR`).
    pub fn sockaddr(&self) -> bool {
        self.inner.fmt.sockaddr() && !self.inner.strings.load(Ordering::Relaxed)
    }

    /// Whether the provider keeps its addresses as sockaddrs (and prints them as strings for
    /// an `FI_ADDR_STR` caller: `straddr`).
    pub fn binary(&self) -> bool {
        self.inner.fmt.sockaddr()
    }

    /// Callers name its addresses as `FI_ADDR_STR` strings (`Domain::av_open`, from the
    /// domain's `addr_format`).
    pub(crate) fn take_strings(&self) {
        self.inner.strings.store(true, Ordering::Relaxed);
    }

    /// `fi_av_straddr`.
    pub fn straddr(&self, addr: &[u8]) -> String {
        self.inner.fmt.to_string(addr)
    }

    /// Number of addresses in use.
    pub fn count(&self) -> usize {
        let t = self.inner.t.read().unwrap_or_else(|e| e.into_inner());
        t.by_name.len()
    }

    /// Why `close` would refuse now (an endpoint is bound), if it would.
    pub fn busy(&self) -> Option<Error> {
        let n = self.inner.bound.load(Ordering::Acquire);
        (n > 0).then(|| Error::Busy(format!("av close: {n} endpoint binding(s) left")))
    }

    /// `fi_close`: `Busy` while an endpoint is bound. Its event queue is free to close then.
    pub fn close(self) -> std::result::Result<(), (Self, Error)> {
        match self.busy() {
            Some(e) => Err((self, e)),
            None => {
                self.inner
                    .eq
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                Ok(())
            }
        }
    }
}

/// `FI_SYMMETRIC` as an AV open flag (fi_domain.h).
pub const FI_SYMMETRIC_AV: u64 = 1 << 59;

impl AvInner {
    /// `addr` (a provider's bytes) as this AV's callers name addresses, which `fi_av_insert`
    /// takes back: a NUL-terminated string where they use strings (`FI_ADDR_STR`, every shm
    /// address), else the provider's own bytes (a sockaddr). What an `FI_SOURCE_ERR` entry
    /// carries (fi_cq(3): it may be passed directly into an `fi_av_insert` call).
    pub fn insertable(&self, addr: &[u8]) -> Vec<u8> {
        if self.fmt.sockaddr() && !self.strings.load(Ordering::Relaxed) {
            return addr.to_vec();
        }
        let mut s = self.fmt.to_string(addr).into_bytes();
        s.push(0);
        s
    }

    fn encode(&self, idx: usize) -> FiAddr {
        match self.av_type {
            AvType::Map => MAP_TAG | idx as u64,
            _ => idx as u64,
        }
    }

    /// The slot index of an `fi_addr_t`, if it is one of this AV's.
    pub fn decode(&self, a: FiAddr) -> Option<usize> {
        match self.av_type {
            AvType::Map => (a & MAP_MASK == MAP_TAG).then_some((a & !MAP_MASK) as usize),
            _ => (a < (1 << 48)).then_some(a as usize),
        }
    }

    /// Whether `fi_addr` names an address in use (`name` without the copy).
    pub fn contains(&self, a: FiAddr) -> bool {
        let Some(idx) = self.decode(a) else {
            return false;
        };
        let t = self.t.read().unwrap_or_else(|e| e.into_inner());
        t.slots.get(idx).is_some_and(|s| s.is_some())
    }

    /// The raw address at `fi_addr`.
    pub fn name(&self, a: FiAddr) -> Option<Vec<u8>> {
        let idx = self.decode(a)?;
        let t = self.t.read().unwrap_or_else(|e| e.into_inner());
        t.slots.get(idx).and_then(|s| s.clone())
    }

    /// Reverse lookup for `FI_SOURCE`: the `fi_addr_t` of a raw address, if inserted.
    pub fn reverse(&self, name: &[u8]) -> Option<FiAddr> {
        let canon = self.fmt.canonical(name);
        let t = self.t.read().unwrap_or_else(|e| e.into_inner());
        t.by_name.get(&canon).map(|&i| self.encode(i))
    }

    /// Changes whenever addresses are inserted or removed, so cached resolutions can be checked.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Counts an endpoint's binding (`fi_ep_bind`, whether or not the endpoint is enabled
    /// yet): closing the AV answers `Busy` until it is released.
    pub(crate) fn hold(&self) {
        self.bound.fetch_add(1, Ordering::AcqRel);
    }

    /// Undoes `hold` when the endpoint closes.
    pub(crate) fn release(&self) {
        self.bound.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Plain;
    impl AddrFormat for Plain {
        fn validate(&self, a: &[u8]) -> Result<()> {
            if a.starts_with(b"ok:") {
                Ok(())
            } else {
                Err(Error::Inval("not ok".into()))
            }
        }
        fn to_string(&self, a: &[u8]) -> String {
            String::from_utf8_lossy(a).into_owned()
        }
    }

    #[test]
    fn table_insert_lookup_remove_reuse() {
        let av = AddressVector::open(&Default::default(), Arc::new(Plain)).unwrap();
        let mut out = [0u64; 3];
        let n = av.insert(&[b"ok:a", b"bad", b"ok:b"], &mut out, 0).unwrap();
        assert_eq!(n, 2);
        assert_eq!(out, [0, FI_ADDR_NOTAVAIL, 1]);
        assert_eq!(av.lookup(1).unwrap(), b"ok:b");
        assert_eq!(av.inner().reverse(b"ok:a"), Some(0));
        av.remove(&[0]).unwrap();
        assert!(av.lookup(0).is_err());
        assert!(matches!(av.remove(&[0]), Err(Error::NoEntry(_))));
        assert_eq!(av.insert_one(b"ok:c").unwrap(), 0);
        assert_eq!(av.straddr(b"ok:c"), "ok:c");
        // Removed slots are reused lowest first, whatever the order they were removed in.
        for n in [b"ok:d", b"ok:e", b"ok:f"] {
            av.insert_one(n).unwrap();
        }
        av.remove(&[2, 4]).unwrap();
        assert_eq!(av.insert_one(b"ok:g").unwrap(), 2);
        assert_eq!(av.insert_one(b"ok:h").unwrap(), 4);
        assert_eq!(av.insert_one(b"ok:i").unwrap(), 5);
    }

    /// A remove that fails part way removed what came before the bad address, and the
    /// generation moved: a cache of this AV's peers (`PeerCache`) drops the removed one.
    #[test]
    fn a_partly_failed_remove_moves_the_generation() {
        let av = AddressVector::open(&Default::default(), Arc::new(Plain)).unwrap();
        let a = av.insert_one(b"ok:a").unwrap();
        let mut cache = PeerCache::default();
        let peer = |c: &mut PeerCache| c.lookup(Some(av.inner()), a, |_| Ok(7));
        assert_eq!(peer(&mut cache).unwrap(), 7);
        let gen = av.inner().generation();
        assert!(av.remove(&[a, 0x55]).is_err(), "0x55 is not in use");
        assert!(
            av.lookup(a).is_err(),
            "the address before the bad one stays removed"
        );
        assert_ne!(av.inner().generation(), gen);
        assert!(
            peer(&mut cache).is_err(),
            "the cache still names the removed peer"
        );
        // Nothing removed: the generation stays.
        let gen = av.inner().generation();
        assert!(av.remove(&[0x55]).is_err());
        assert_eq!(av.inner().generation(), gen);
    }

    #[test]
    fn sync_err_writes_each_status() {
        let av = AddressVector::open(&Default::default(), Arc::new(Plain)).unwrap();
        let mut out = [0u64; 3];
        let mut errs = [-1i32; 3];
        let n = av
            .insert_sync_err(&[b"bad", b"ok:a", b"worse"], &mut out, &mut errs)
            .unwrap();
        assert_eq!(n, 1);
        assert_eq!(out, [FI_ADDR_NOTAVAIL, 0, FI_ADDR_NOTAVAIL]);
        assert_eq!(errs[1], 0);
        assert!(errs[0] > 0 && errs[2] > 0);
    }

    #[test]
    fn event_av_reports_failures_then_the_count() {
        use crate::eq::{EqAttr, EventQueue};
        let eq = EventQueue::open(&EqAttr {
            size: 1,
            ..Default::default()
        })
        .unwrap();
        let plain = AddressVector::open(&Default::default(), Arc::new(Plain)).unwrap();
        assert!(matches!(plain.bind_eq(&eq, 1), Err(Error::Inval(_))));
        let attr = AvAttr {
            flags: FI_EVENT,
            ..Default::default()
        };
        let av = AddressVector::open(&attr, Arc::new(Plain)).unwrap();
        let mut out = [0u64; 2];
        assert!(matches!(
            av.insert(&[b"ok:a"], &mut out, 5),
            Err(Error::NoEq(_))
        ));
        assert_eq!(av.count(), 0, "nothing inserted without an EQ");
        av.bind_eq(&eq, 0xf1d).unwrap();
        assert!(matches!(
            av.insert_sync_err(&[b"ok:a"], &mut out, &mut [0]),
            Err(Error::BadFlags(_))
        ));
        assert_eq!(av.insert(&[b"bad", b"ok:a"], &mut out, 5), Ok(0));
        assert_eq!(out, [FI_ADDR_NOTAVAIL, 0]);
        assert_eq!(eq.read(0), Err(Error::Avail));
        let e = eq.readerr().unwrap();
        assert_eq!((e.fid, e.context, e.data), (0xf1d, 5, 0));
        assert!(e.err > 0);
        // The queue holds one event; a second insert's completion is kept beyond it.
        assert_eq!(av.insert(&[b"ok:b"], &mut out, 6), Ok(0));
        for (ctx, n) in [(5, 1), (6, 1)] {
            let done = eq.read(0).unwrap();
            assert_eq!(done.event, FI_AV_COMPLETE);
            assert_eq!((done.fid, done.context, done.data), (0xf1d, ctx, n));
        }
        assert!(eq.read(0).is_err());
        // The queue does not close while the AV is bound to it (its inserts' events would go
        // where nothing reads them); once the AV closes, it does.
        let eq = match eq.close() {
            Err((eq, Error::Busy(_))) => eq,
            r => panic!("an EQ with an AV bound closed: {:?}", r.err().map(|e| e.1)),
        };
        av.close().map_err(|e| e.1).unwrap();
        assert!(eq.close().is_ok());
    }

    #[test]
    fn map_addresses_are_tagged() {
        let av = AddressVector::open(
            &AvAttr {
                av_type: AvType::Map,
                ..Default::default()
            },
            Arc::new(Plain),
        )
        .unwrap();
        let a = av.insert_one(b"ok:x").unwrap();
        assert_ne!(a, 0);
        assert_eq!(av.inner().decode(a), Some(0));
        assert_eq!(av.inner().decode(0), None);
        assert!(av.lookup(0).is_err());
    }
}

/// A provider's peers by AV index, valid for one AV generation: after the first send to an
/// `fi_addr_t`, finding its peer is a vector lookup. Every provider keeps one per endpoint.
#[derive(Debug)]
pub struct PeerCache {
    by_idx: Vec<Option<usize>>,
    gen: u64,
}

impl Default for PeerCache {
    fn default() -> Self {
        PeerCache {
            by_idx: Vec::new(),
            gen: u64::MAX,
        }
    }
}

impl PeerCache {
    /// The peer `dest` names in `av` (the endpoint's bound AV, if any): cached, or
    /// `resolve`d from the address the AV holds for it and remembered.
    #[inline]
    pub fn lookup(
        &mut self,
        av: Option<&Arc<AvInner>>,
        dest: FiAddr,
        resolve: impl FnOnce(&[u8]) -> Result<usize>,
    ) -> Result<usize> {
        // Every operation but the first to a destination in a generation: the cached peer,
        // inline.
        if let Some(av) = av {
            if let Some(idx) = av.decode(dest) {
                if av.generation() == self.gen {
                    if let Some(Some(p)) = self.by_idx.get(idx) {
                        return Ok(*p);
                    }
                }
            }
        }
        self.resolve(av, dest, resolve)
    }

    /// `lookup` of a destination not cached: checked, named by the AV, resolved and kept.
    #[inline(never)]
    fn resolve(
        &mut self,
        av: Option<&Arc<AvInner>>,
        dest: FiAddr,
        resolve: impl FnOnce(&[u8]) -> Result<usize>,
    ) -> Result<usize> {
        let av = av.ok_or_else(|| Error::NoAv("no address vector bound".into()))?;
        let idx = av.decode(dest).ok_or_else(|| {
            Error::Inval(format!(
                "destination {dest:#x} is not an address of the bound AV"
            ))
        })?;
        let gen = av.generation();
        if gen != self.gen {
            self.by_idx.clear();
            self.gen = gen;
        }
        if let Some(Some(p)) = self.by_idx.get(idx) {
            return Ok(*p);
        }
        let raw = av
            .name(dest)
            .ok_or_else(|| Error::Inval(format!("destination {dest:#x} is not in the AV")))?;
        let p = resolve(&raw)?;
        if self.by_idx.len() <= idx {
            self.by_idx.resize(idx + 1, None);
        }
        self.by_idx[idx] = Some(p);
        Ok(p)
    }
}
