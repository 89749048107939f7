//! The safe layer over `sys`: a device opened once per process (`Device`), a protection domain
//! of it for each fabric domain (`Nic`), completion channels and queues, memory regions and RC
//! queue pairs, each holding its parent alive (`Arc`) and destroyed in `Drop`. Errors name the
//! verb and carry errno.

use std::ffi::{c_int, CStr};
use std::net::Ipv4Addr;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use xfabric_core::{Error, Result};

use super::sys::{self, Verbs};

fn os_err(what: &str) -> Error {
    Error::from_io(format!("verbs: {what}"), std::io::Error::last_os_error())
}

/// An opened RDMA device, with the port and GID endpoints use: one per process.
pub struct Device {
    pub v: &'static Verbs,
    pub ctx: NonNull<sys::ibv_context>,
    /// Device name (`rxe0`).
    pub name: String,
    pub port: u8,
    /// The GID table index of the IPv4-mapped (RoCE v2) GID.
    pub gid_index: u8,
    pub gid: [u8; 16],
    /// The IPv4 address that GID maps: what endpoints bind their side channel to.
    pub ip: Ipv4Addr,
}

/// A device's protection domain, one per fabric domain: regions registered in it and queue
/// pairs created in it reach each other and nothing of another domain's, so a peer connected
/// to one domain's endpoint cannot use another domain's keys through the NIC (as libfabric's
/// verbs domains each allocate their own). Its device's fields are read through it.
pub struct Nic {
    pub dev: Arc<Device>,
    pub pd: NonNull<sys::ibv_pd>,
}

// SAFETY: verbs objects may be used from any thread (libibverbs locks internally where needed);
// the pointers are only freed in Drop.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}
// SAFETY: as above.
unsafe impl Send for Nic {}
// SAFETY: as above.
unsafe impl Sync for Nic {}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: ours, closed once; every protection domain holds an Arc of this device.
        unsafe { (self.v.close_device)(self.ctx.as_ptr()) };
    }
}

impl Drop for Nic {
    fn drop(&mut self) {
        // SAFETY: ours, freed once; every child holds an Arc of this Nic so none is left.
        unsafe { (self.v.dealloc_pd)(self.pd.as_ptr()) };
    }
}

impl std::ops::Deref for Nic {
    type Target = Device;

    fn deref(&self) -> &Device {
        &self.dev
    }
}

impl Nic {
    /// A new protection domain of `dev`.
    pub fn open(dev: &Arc<Device>) -> std::result::Result<Arc<Nic>, String> {
        // SAFETY: an open context.
        let pd = NonNull::new(unsafe { (dev.v.alloc_pd)(dev.ctx.as_ptr()) })
            .ok_or_else(|| format!("ibv_alloc_pd: {}", std::io::Error::last_os_error()))?;
        Ok(Arc::new(Nic {
            dev: dev.clone(),
            pd,
        }))
    }
}

/// The first device with an IPv4-mapped GID on port 1 (devices are opened once per
/// process); the error says why there is none ("libibverbs.so.1 not found", "no RDMA device").
pub fn nic() -> std::result::Result<Arc<Device>, String> {
    nics().map(|v| v[0].clone())
}

/// Every usable device (at least one), opened once per process, in the library's order.
pub fn nics() -> std::result::Result<Vec<Arc<Device>>, String> {
    static N: OnceLock<std::result::Result<Vec<Arc<Device>>, String>> = OnceLock::new();
    N.get_or_init(open_all).clone()
}

/// The device whose IPv4 GID is `ip`.
pub fn nic_for(ip: Ipv4Addr) -> std::result::Result<Arc<Device>, String> {
    nics()?
        .into_iter()
        .find(|n| n.ip == ip)
        .ok_or_else(|| format!("no RDMA device has address {ip}"))
}

/// The device named `name`.
pub fn nic_named(name: &str) -> std::result::Result<Arc<Device>, String> {
    nics()?
        .into_iter()
        .find(|n| n.name == name)
        .ok_or_else(|| format!("no RDMA device named {name:?}"))
}

fn open_all() -> std::result::Result<Vec<Arc<Device>>, String> {
    let v = sys::verbs()?;
    let mut n: c_int = 0;
    // SAFETY: plain call; the list is freed below.
    let list = unsafe { (v.get_device_list)(&mut n) };
    if list.is_null() {
        return Err(format!(
            "no RDMA device (ibv_get_device_list: {})",
            std::io::Error::last_os_error()
        ));
    }
    let mut why = Vec::new();
    let mut found = Vec::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: the list holds n device pointers.
        let dev = unsafe { *list.add(i) };
        // SAFETY: a device of the list; the name is a C string it owns.
        let name = unsafe { CStr::from_ptr((v.get_device_name)(dev)) }
            .to_string_lossy()
            .into_owned();
        match open_one(v, dev, &name) {
            Ok(nic) => found.push(Arc::new(nic)),
            Err(e) => why.push(format!("{name}: {e}")),
        }
    }
    // SAFETY: the list from ibv_get_device_list, freed once; opened contexts stay valid.
    unsafe { (v.free_device_list)(list) };
    if !found.is_empty() {
        return Ok(found);
    }
    if why.is_empty() {
        Err("no RDMA device".into())
    } else {
        Err(format!("no usable RDMA device ({})", why.join("; ")))
    }
}

fn open_one(
    v: &'static Verbs,
    dev: *mut sys::ibv_device,
    name: &str,
) -> std::result::Result<Device, String> {
    // SAFETY: a device from the current list.
    let ctx = NonNull::new(unsafe { (v.open_device)(dev) })
        .ok_or_else(|| format!("ibv_open_device: {}", std::io::Error::last_os_error()))?;
    let port = 1u8;
    let mut pick = None;
    for idx in 0..16 {
        let mut gid = [0u8; 16];
        // SAFETY: an open context and a 16-byte buffer.
        if unsafe { (v.query_gid)(ctx.as_ptr(), port, idx, &mut gid) } != 0 {
            break;
        }
        if gid[..10].iter().all(|b| *b == 0) && gid[10..12] == [0xff, 0xff] {
            pick = Some((idx as u8, gid));
            break;
        }
    }
    let Some((gid_index, gid)) = pick else {
        // SAFETY: opened above, closed once.
        unsafe { (v.close_device)(ctx.as_ptr()) };
        return Err("port 1 has no IPv4 (RoCE v2) GID".into());
    };
    // A protection domain, allocated and freed at once: a device that cannot give one is no
    // use to any domain.
    // SAFETY: an open context.
    match NonNull::new(unsafe { (v.alloc_pd)(ctx.as_ptr()) }) {
        // SAFETY: just allocated, freed once.
        Some(pd) => unsafe {
            (v.dealloc_pd)(pd.as_ptr());
        },
        None => {
            let e = std::io::Error::last_os_error();
            // SAFETY: opened above, closed once.
            unsafe { (v.close_device)(ctx.as_ptr()) };
            return Err(format!("ibv_alloc_pd: {e}"));
        }
    }
    Ok(Device {
        v,
        ctx,
        name: name.to_string(),
        port,
        gid_index,
        gid,
        ip: Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]),
    })
}

/// A completion channel and one CQ reporting to it.
pub struct Cq {
    nic: Arc<Nic>,
    ch: NonNull<sys::ibv_comp_channel>,
    pub cq: NonNull<sys::ibv_cq>,
    /// Events taken from the channel and not yet acknowledged.
    unacked: u32,
}

// SAFETY: see Nic; the Cq is used under its endpoint's lock.
unsafe impl Send for Cq {}

impl Cq {
    /// A CQ of `depth` entries with its channel (non-blocking fd).
    pub fn new(nic: &Arc<Nic>, depth: i32) -> Result<Cq> {
        let v = nic.v;
        // SAFETY: an open context.
        let ch = NonNull::new(unsafe { (v.create_comp_channel)(nic.ctx.as_ptr()) })
            .ok_or_else(|| os_err("ibv_create_comp_channel"))?;
        // SAFETY: the channel's fd is ours to set non-blocking.
        unsafe {
            let fd = (*ch.as_ptr()).fd;
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        // SAFETY: an open context and our channel.
        let cq = unsafe {
            (v.create_cq)(
                nic.ctx.as_ptr(),
                depth,
                std::ptr::null_mut(),
                ch.as_ptr(),
                0,
            )
        };
        let Some(cq) = NonNull::new(cq) else {
            let e = os_err("ibv_create_cq");
            // SAFETY: created above, no CQ uses it.
            unsafe { (v.destroy_comp_channel)(ch.as_ptr()) };
            return Err(e);
        };
        Ok(Cq {
            nic: nic.clone(),
            ch,
            cq,
            unacked: 0,
        })
    }

    /// The channel's fd: readable once an armed CQ got a completion.
    pub fn fd(&self) -> i32 {
        // SAFETY: our channel, alive while self is.
        unsafe { (*self.ch.as_ptr()).fd }
    }

    /// Up to `wc.len()` completions.
    pub fn poll(&mut self, wc: &mut [sys::ibv_wc]) -> usize {
        let cq = self.cq.as_ptr();
        // SAFETY: our CQ; its context's ops table is filled by the driver.
        let n = unsafe {
            let f = (*(*cq).context)
                .ops
                .poll_cq
                .expect("driver without poll_cq");
            f(
                cq,
                wc.len().min(i32::MAX as usize) as c_int,
                wc.as_mut_ptr(),
            )
        };
        usize::try_from(n).unwrap_or(0)
    }

    /// Asks for an event on the channel at the next completion; drains events already there.
    pub fn arm(&mut self) {
        let cq = self.cq.as_ptr();
        loop {
            let mut got: *mut sys::ibv_cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: our channel (non-blocking): returns -1 when no event is pending.
            if unsafe { (self.nic.v.get_cq_event)(self.ch.as_ptr(), &mut got, &mut ctx) } != 0 {
                break;
            }
            self.unacked += 1;
        }
        if self.unacked >= 64 {
            // SAFETY: acknowledging events taken from this CQ's channel.
            unsafe { (self.nic.v.ack_cq_events)(cq, self.unacked) };
            self.unacked = 0;
        }
        // SAFETY: our CQ.
        unsafe {
            let f = (*(*cq).context)
                .ops
                .req_notify_cq
                .expect("driver without req_notify_cq");
            f(cq, 0);
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: ours; every QP using it was dropped first (they hold no Arc, so the owner
        // orders the drops: see `ep`). Events are acknowledged before destroying.
        unsafe {
            if self.unacked > 0 {
                (self.nic.v.ack_cq_events)(self.cq.as_ptr(), self.unacked);
            }
            (self.nic.v.destroy_cq)(self.cq.as_ptr());
            (self.nic.v.destroy_comp_channel)(self.ch.as_ptr());
        }
    }
}

/// Registered memory.
pub struct Mr {
    nic: Arc<Nic>,
    mr: NonNull<sys::ibv_mr>,
}

// SAFETY: see Nic.
unsafe impl Send for Mr {}
// SAFETY: see Nic; an MR is read-only after registration.
unsafe impl Sync for Mr {}

impl Mr {
    /// Registers `len` bytes at `addr` with `access` (IBV_ACCESS_* bits).
    ///
    /// # Safety
    /// The range must stay mapped while the region lives.
    pub unsafe fn new(nic: &Arc<Nic>, addr: *mut u8, len: usize, access: i32) -> Result<Mr> {
        // SAFETY: the caller keeps the range mapped.
        let mr = unsafe { (nic.v.reg_mr)(nic.pd.as_ptr(), addr.cast(), len, access) };
        let mr = NonNull::new(mr).ok_or_else(|| os_err("ibv_reg_mr"))?;
        Ok(Mr {
            nic: nic.clone(),
            mr,
        })
    }

    /// Registers `len` bytes at `addr` whose remote addresses start at `iova` (where the
    /// library can; `None` where it is too old for that).
    ///
    /// # Safety
    /// As `new`.
    pub unsafe fn with_iova(
        nic: &Arc<Nic>,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: i32,
    ) -> Option<Result<Mr>> {
        let f = nic.v.reg_mr_iova2?;
        // SAFETY: the caller keeps the range mapped.
        let mr = unsafe { f(nic.pd.as_ptr(), addr.cast(), len, iova, access as u32) };
        Some(
            NonNull::new(mr)
                .map(|mr| Mr {
                    nic: nic.clone(),
                    mr,
                })
                .ok_or_else(|| os_err("ibv_reg_mr_iova2")),
        )
    }

    /// Registers `len` bytes at `offset` of the dma-buf `fd` (device memory), known to peers
    /// from `iova`. `None` where the library is too old for dma-bufs; the error is the
    /// device's answer (rxe: `EOPNOTSUPP`).
    ///
    /// # Safety
    /// The dma-buf's memory must stay allocated while the region lives (the registration
    /// holds its own reference to the dma-buf, not to the allocation behind it).
    pub unsafe fn from_dmabuf(
        nic: &Arc<Nic>,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        access: i32,
    ) -> Option<Result<Mr>> {
        use std::os::fd::AsRawFd;
        let f = nic.v.reg_dmabuf_mr?;
        // SAFETY: our PD and an open descriptor; the caller keeps the memory allocated.
        let mr = unsafe { f(nic.pd.as_ptr(), offset, len, iova, fd.as_raw_fd(), access) };
        Some(
            NonNull::new(mr)
                .map(|mr| Mr {
                    nic: nic.clone(),
                    mr,
                })
                .ok_or_else(|| os_err("ibv_reg_dmabuf_mr")),
        )
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: ours, alive.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: ours, alive.
        unsafe { (*self.mr.as_ptr()).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: ours, deregistered once.
        unsafe { (self.nic.v.dereg_mr)(self.mr.as_ptr()) };
    }
}

/// What one side of an RC connection tells the other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpInfo {
    /// The queue pair's number (24 bits).
    pub qpn: u32,
    /// The packet sequence number its sends start at (24 bits).
    pub psn: u32,
    /// The port's GID (RoCE v2: the IPv4 address, mapped).
    pub gid: [u8; 16],
}

/// An RC queue pair on a `Cq` (send and receive).
pub struct Qp {
    nic: Arc<Nic>,
    qp: NonNull<sys::ibv_qp>,
}

// SAFETY: see Nic; used under its endpoint's lock.
unsafe impl Send for Qp {}

/// Send and receive queue depths of every QP.
pub const SQ_DEPTH: u32 = 256;
/// Reads and atomics a QP has outstanding at most, as initiator and as responder (what
/// `connect` sets: rxe allows 128, common hardware 16).
pub const RD_ATOMIC: u8 = 16;

impl Qp {
    /// A new RC QP in INIT, its receive queue `rq_depth` deep.
    pub fn new(nic: &Arc<Nic>, cq: &Cq, rq_depth: u32) -> Result<Qp> {
        let mut init = sys::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq.cq.as_ptr(),
            recv_cq: cq.cq.as_ptr(),
            srq: std::ptr::null_mut(),
            cap: sys::ibv_qp_cap {
                max_send_wr: SQ_DEPTH,
                max_recv_wr: rq_depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: sys::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: our PD and CQ; init is a valid attribute block.
        let qp = unsafe { (nic.v.create_qp)(nic.pd.as_ptr(), &mut init) };
        let qp = Qp {
            nic: nic.clone(),
            qp: NonNull::new(qp).ok_or_else(|| os_err("ibv_create_qp"))?,
        };
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: nic.port,
            qp_access_flags: (sys::IBV_ACCESS_REMOTE_WRITE
                | sys::IBV_ACCESS_REMOTE_READ
                | sys::IBV_ACCESS_REMOTE_ATOMIC) as u32,
            ..Default::default()
        };
        qp.modify(
            &mut a,
            sys::IBV_QP_STATE
                | sys::IBV_QP_PKEY_INDEX
                | sys::IBV_QP_PORT
                | sys::IBV_QP_ACCESS_FLAGS,
            "INIT",
        )?;
        Ok(qp)
    }

    pub fn num(&self) -> u32 {
        // SAFETY: ours, alive.
        unsafe { (*self.qp.as_ptr()).qp_num }
    }

    fn modify(&self, a: &mut sys::ibv_qp_attr, mask: c_int, to: &str) -> Result<()> {
        // SAFETY: ours; a valid attribute block for mask.
        let r = unsafe { (self.nic.v.modify_qp)(self.qp.as_ptr(), a, mask) };
        if r != 0 {
            return Err(Error::from_io(
                format!("verbs: ibv_modify_qp to {to}"),
                std::io::Error::from_raw_os_error(r),
            ));
        }
        Ok(())
    }

    /// INIT -> RTR -> RTS toward `remote`, starting our sends at `psn`.
    pub fn connect(&self, psn: u32, remote: &QpInfo) -> Result<()> {
        let nic = &self.nic;
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTR,
            path_mtu: sys::IBV_MTU_1024,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: RD_ATOMIC,
            min_rnr_timer: 12,
            ah_attr: sys::ibv_ah_attr {
                grh: sys::ibv_global_route {
                    dgid: remote.gid,
                    sgid_index: nic.gid_index,
                    hop_limit: 64,
                    ..Default::default()
                },
                is_global: 1,
                port_num: nic.port,
                ..Default::default()
            },
            ..Default::default()
        };
        self.modify(
            &mut a,
            sys::IBV_QP_STATE
                | sys::IBV_QP_AV
                | sys::IBV_QP_PATH_MTU
                | sys::IBV_QP_DEST_QPN
                | sys::IBV_QP_RQ_PSN
                | sys::IBV_QP_MAX_DEST_RD_ATOMIC
                | sys::IBV_QP_MIN_RNR_TIMER,
            "RTR",
        )?;
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_RTS,
            sq_psn: psn,
            // 4.096 us * 2^14 = 67 ms per try, 6 retries: a dead peer shows within about
            // 0.5 s even when its side channel does not say so. Not 7: Soft-RoCE takes 7 as
            // "retry forever" (its completer never counts it down), so a peer whose QP went
            // away would never show.
            timeout: 14,
            retry_cnt: 6,
            // Never relied on (credits keep receives posted): a bug shows as an error.
            rnr_retry: 3,
            max_rd_atomic: RD_ATOMIC,
            ..Default::default()
        };
        self.modify(
            &mut a,
            sys::IBV_QP_STATE
                | sys::IBV_QP_SQ_PSN
                | sys::IBV_QP_TIMEOUT
                | sys::IBV_QP_RETRY_CNT
                | sys::IBV_QP_RNR_RETRY
                | sys::IBV_QP_MAX_QP_RD_ATOMIC,
            "RTS",
        )
    }

    /// Moves the QP to the error state: everything outstanding completes flushed.
    pub fn to_error(&self) -> Result<()> {
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_ERR,
            ..Default::default()
        };
        self.modify(&mut a, sys::IBV_QP_STATE, "ERR")
    }

    /// Posts one work request.
    ///
    /// # Safety
    /// The memory its scatter list names must stay valid (and registered) until its
    /// completion is polled, and the remote range is the peer's to check.
    pub unsafe fn post_send(&self, wr: &mut sys::ibv_send_wr) -> Result<()> {
        let qp = self.qp.as_ptr();
        let mut bad = std::ptr::null_mut();
        // SAFETY: our QP; the caller keeps the memory valid.
        let r = unsafe {
            let f = (*(*qp).context)
                .ops
                .post_send
                .expect("driver without post_send");
            f(qp, wr, &mut bad)
        };
        if r != 0 {
            return Err(Error::from_io(
                "verbs: ibv_post_send".to_string(),
                std::io::Error::from_raw_os_error(r),
            ));
        }
        Ok(())
    }

    /// Posts one receive of `sge`.
    ///
    /// # Safety
    /// As `post_send`, for the receive buffer.
    pub unsafe fn post_recv(&self, wr_id: u64, sge: &mut sys::ibv_sge) -> Result<()> {
        let qp = self.qp.as_ptr();
        let mut wr = sys::ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: sge,
            num_sge: 1,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: our QP; the caller keeps the memory valid.
        let r = unsafe {
            let f = (*(*qp).context)
                .ops
                .post_recv
                .expect("driver without post_recv");
            f(qp, &mut wr, &mut bad)
        };
        if r != 0 {
            return Err(Error::from_io(
                "verbs: ibv_post_recv".to_string(),
                std::io::Error::from_raw_os_error(r),
            ));
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: ours, destroyed once.
        unsafe { (self.nic.v.destroy_qp)(self.qp.as_ptr()) };
    }
}
