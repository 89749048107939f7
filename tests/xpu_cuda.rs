//! The device API with a GPU XPU across two real processes over the provider under test
//! (shm by default). The sender exports its endpoint, its CQ and its send counter to CUDA
//! device 0 (or Level Zero device 0): their shared blocks must be mapped page-locked memory
//! (`cuMemHostAlloc`; `zeMemAllocHost`), each handle's `prov_ctx` and every address inside a
//! block the device follows the driver's device address of that memory. A thread then plays the GPU: it stores descriptors through
//! those device addresses (tagged sends, sizes and tags computed as it goes), waits on the
//! counter's mirror and reads every completion from the exported CQ's ring, while the host
//! only drives progress; the receiver checks every tag, length and byte. Closing frees every
//! block (the double's count of live allocations).
//!
//! CUDA and Level Zero are the test doubles (hmem/tests/doubles/cuda_double.c, ze_double.c):
//! device addresses of mapped memory are the host's there (unified addressing, as on every
//! 64-bit CUDA platform; one address for a Level Zero host allocation), so the thread's stores
//! through them are exactly a GPU's as the host sees them.

#![cfg(feature = "cuda")]

mod common;

use std::ffi::{c_void, CString};

use common::cuda_double::{cuda, double_counter, double_env, DOUBLE_ENV};
use common::ze_double::{ze, ze_counter, ze_double_env};
use common::*;
use xfabric::hmem::HmemIface;
use xfabric::xpu::abi::{CntrMirror, RingHeader, CNTR_MAGIC, CQ_RING_MAGIC, RING_MAGIC};
use xfabric::xpu::device as dev;
use xfabric::xpu::*;
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_TAGGED | FI_TRIGGER | FI_XPU_TRIGGER;
const W: i32 = FI_XPU_WORK_ITEM;
const EAGAIN: i32 = -(errno::FI_EAGAIN);
/// The XPU the sender exports to: `XF_XPU` is "cuda" or "ze".
fn gpu_xpu() -> Xpu {
    let iface = match std::env::var("XF_XPU").as_deref() {
        Ok("ze") => Iface::Ze,
        _ => Iface::Cuda,
    };
    Xpu { iface, device: 0 }
}

/// The double's interface and its count of live allocations.
fn double_of(xpu: Xpu) -> (&'static dyn HmemIface, i32) {
    match xpu.iface {
        Iface::Ze => (ze(), ze_counter("ze_double_live").expect("on the double")),
        _ => (
            cuda(),
            double_counter("cuda_double_live").expect("on the double"),
        ),
    }
}
const N: usize = 600;
const MAX: usize = 256;

fn tag_of(i: usize) -> u64 {
    (i as u64).wrapping_mul(0x9e37_79b9) ^ 0xc0da
}

/// Message `i`'s length, as a kernel would compute it.
fn len_of(i: usize) -> usize {
    8 + (i * 37) % (MAX - 8)
}

fn xnode(before_enable: impl FnOnce(&Domain, &Endpoint)) -> Node {
    node_custom(
        CAPS,
        Progress::Manual,
        |i| i.domain_attr.mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY,
        4096,
        before_enable,
    )
}

/// The double's `cuMemHostGetDevicePointer` of `host`: `Some` only for an address inside memory
/// from `cuMemHostAlloc` (or registered), with the device address the driver gives it.
fn double_device_pointer(host: u64) -> Option<u64> {
    let lib = CString::new(std::env::var(DOUBLE_ENV).ok()?).ok()?;
    let sym = CString::new("cuMemHostGetDevicePointer_v2").unwrap();
    // SAFETY: the double is loaded in this process (RTLD_NOLOAD); the symbol is
    // `CUresult f(CUdeviceptr *, void *, unsigned)`, which only looks the address up.
    unsafe {
        let h = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        assert!(!h.is_null(), "the double is not loaded");
        let f = libc::dlsym(h, sym.as_ptr());
        assert!(!f.is_null());
        let f: extern "C" fn(*mut u64, *mut c_void, u32) -> i32 = std::mem::transmute(f);
        let mut d = 0u64;
        let rc = f(&mut d, host as usize as *mut c_void, 0);
        libc::dlclose(h);
        (rc == 0).then_some(d)
    }
}

/// Checks that `addr` is the device address of mapped page-locked memory (CUDA: the driver
/// says so; Level Zero's host allocations have one address, counted by `live` instead).
fn is_mapped(xpu: Xpu, what: &str, addr: u64) {
    if xpu.iface != Iface::Cuda {
        return;
    }
    assert_eq!(
        double_device_pointer(addr),
        Some(addr),
        "{what} {addr:#x} is not the device address of cuMemHostAlloc memory"
    );
}

fn rx() {
    let n = xnode(|_, _| {});
    let peer = connect_parent(&n);
    let mut bufs: Vec<Vec<u8>> = (0..N).map(|_| vec![0u8; MAX]).collect();
    let ptrs: Vec<usize> = bufs.iter_mut().map(|b| b.as_mut_ptr() as usize).collect();
    // In reverse: only the tags the XPU computed match them.
    for i in (0..N).rev() {
        // SAFETY: `bufs` outlives every receive (all complete below).
        let b = unsafe { std::slice::from_raw_parts_mut(ptrs[i] as *mut u8, MAX) };
        n.retry(|| unsafe { n.ep.trecv(&mut *b, None, peer, tag_of(i), 0, i) });
    }
    say("ready");
    for e in n.wait_n(N) {
        let i = e.op_context;
        assert_eq!(e.tag, tag_of(i), "tag of message {i}");
        assert_eq!(e.len, len_of(i), "length of message {i}");
        assert!(
            bufs[i][..len_of(i)] == pattern(len_of(i), i as u64)[..],
            "bytes of message {i}"
        );
    }
    say("ok");
}

fn sender(test: &str) {
    let mut peer = spawn(test, "rx", &[]);
    let mut counter = None;
    let n = xnode(|d, ep| {
        let c = d.cntr_open(&CntrAttr::default()).unwrap();
        ep.bind_cntr(&c, FI_SEND).unwrap();
        counter = Some(c);
    });
    let c = counter.expect("the send counter");
    let to = connect(&mut peer, &n);
    let gpu = gpu_xpu();
    let live = || double_of(gpu).1;
    // Device 0's context (and stream) are the interface's for the process: made first, so
    // that what is counted from here is the blocks.
    drop(
        double_of(gpu)
            .0
            .alloc_host_mapped(0, 4096)
            .expect("mapped memory"),
    );
    let live_before = live();

    let x = n.ep.export_xpu(gpu).expect("export the endpoint");
    let q = n.cq.export_xpu(gpu).expect("export the CQ");
    let xc = c.export_xpu(gpu).expect("export the counter");
    assert_eq!(x.xpu(), gpu);
    assert_eq!(x.fid().fclass, 3);
    assert_eq!(x.fid().prov_id, FI_XPU_PROV_XFABRIC);
    // Every handle names mapped memory by its device address, and so does every address
    // inside a block that the device follows.
    let ring = x.fid().prov_ctx;
    is_mapped(gpu, "the ring header", ring);
    // SAFETY: on the double the device address is the host's; the handle keeps it alive.
    let h = unsafe { &*(ring as usize as *const RingHeader) };
    assert_eq!((h.magic, h.mask), (RING_MAGIC, 1023));
    assert_eq!(h.slots, ring + 256, "slots right after the header");
    is_mapped(gpu, "the ring's slots", h.slots);
    let cq = q.fid().prov_ctx;
    is_mapped(gpu, "the CQ ring header", cq);
    // SAFETY: as above; the magic is the header's first word.
    assert_eq!(unsafe { *(cq as usize as *const u32) }, CQ_RING_MAGIC);
    let mirror = xc.fid().prov_ctx;
    is_mapped(gpu, "the counter mirror", mirror);
    // SAFETY: as above.
    let m = unsafe { &*(mirror as usize as *const CntrMirror) };
    assert_eq!(m.magic, CNTR_MAGIC);
    is_mapped(gpu, "the counter's ring", m.ring);
    // The endpoint's ring, the CQ's, the counter's mirror and its ring.
    assert_eq!(
        live(),
        live_before + 4,
        "the blocks are the double's allocations"
    );
    // Exporting again: the same blocks. To another XPU: refused.
    assert_eq!(n.ep.export_xpu(gpu).unwrap().fid(), x.fid());
    let e = n.cq.export_xpu(Xpu::CPU).err().expect("one XPU per CQ");
    assert!(matches!(e, Error::Inval(_)), "{e}");
    let e = c.export_xpu(Xpu::CPU).err().expect("one XPU per counter");
    assert!(matches!(e, Error::Inval(_)), "{e}");
    let rocr = Xpu {
        iface: Iface::Rocr,
        device: 0,
    };
    let e = n.ep.export_xpu(rocr).err().expect("no ROCr device API");
    assert!(matches!(e, Error::OpNotSupp(_)), "{e}");
    let e =
        n.ep.export_xpu(Xpu {
            iface: gpu.iface,
            device: 7,
        })
        .err()
        .expect("the double has 2 devices");
    assert!(matches!(e, Error::OpNotSupp(_)), "{e}");

    let dest = n.av.get_xpu_addr(to).unwrap();
    let data = vec![0u8; N * MAX];
    // SAFETY: `data` outlives the region (dropped first).
    let mr = unsafe { n.domain.mr_reg(&data, FI_SEND, 0, 0) }.unwrap();
    let desc = mr.get_xpu_desc().unwrap();
    assert_eq!(peer.hear(), "ready");
    let base = data.as_ptr() as usize;
    let thread = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + completion_bound();
        for i in 0..N {
            let slot = base + i * MAX;
            let bytes = pattern(len_of(i), i as u64);
            // SAFETY: slot i of `data`, alive until every send completed, read by nothing
            // before its descriptor is published.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), slot as *mut u8, bytes.len()) };
            loop {
                let rc = dev::tsend(
                    &x,
                    slot as *const c_void,
                    len_of(i),
                    desc,
                    0,
                    dest,
                    tag_of(i),
                    i,
                    0,
                    W,
                );
                match rc {
                    0 => break,
                    EAGAIN => std::thread::yield_now(),
                    e => panic!("fi_xpu_tsend: {e}"),
                }
                assert!(std::time::Instant::now() < deadline, "the ring stayed full");
            }
        }
        // A GPU announces nothing: the watcher finds descriptors by looking.
        assert_eq!(
            dev::cntr_wait(&xc, N as u64, 60_000, W),
            0,
            "the send counter"
        );
        let mut seen = vec![false; N];
        let mut entries = [CqTaggedEntry::default(); 16];
        let mut got = 0;
        while got < N {
            let k = dev::cq_read(&q, &mut entries, W);
            if k == EAGAIN as isize {
                assert!(std::time::Instant::now() < deadline, "completions missing");
                std::thread::yield_now();
                continue;
            }
            assert!(k > 0, "fi_xpu_cq_read: {k}");
            for e in &entries[..k as usize] {
                assert!(!seen[e.op_context], "send {} completed twice", e.op_context);
                seen[e.op_context] = true;
            }
            got += k as usize;
        }
        (x, q, xc)
    });
    let deadline = std::time::Instant::now() + completion_bound();
    while !thread.is_finished() {
        n.ep.progress();
        assert!(
            std::time::Instant::now() < deadline,
            "XPU thread still running"
        );
    }
    let (x, q, xc) = thread.join().expect("XPU thread");
    assert_eq!(peer.hear_progressing(&n), "ok");
    peer.join();
    drop((x, q, xc, mr));
    drop(c);
    drop(n);
    assert_eq!(live(), live_before, "closing freed every shared block");
}

#[test]
fn cuda_double_xpu_exports_in_mapped_memory_and_drain_as_the_cpus() {
    const NAME: &str = "cuda_double_xpu_exports_in_mapped_memory_and_drain_as_the_cpus";
    match role().as_deref() {
        Some("sender") => {
            sender(NAME);
            say("OK");
        }
        Some("rx") => rx(),
        Some(r) => panic!("unknown role {r}"),
        None => run_child(NAME, "sender", &double_env(), &[("XF_XPU", "cuda")]),
    }
}

#[test]
fn ze_double_xpu_exports_in_host_memory_and_drain_as_the_cpus() {
    const NAME: &str = "ze_double_xpu_exports_in_host_memory_and_drain_as_the_cpus";
    match role().as_deref() {
        Some("sender") => {
            sender(NAME);
            say("OK");
        }
        Some("rx") => rx(),
        Some(r) => panic!("unknown role {r}"),
        None => run_child(NAME, "sender", &ze_double_env(), &[("XF_XPU", "ze")]),
    }
}
