//! Level Zero device memory between two real processes over the provider under test
//! (`XFABRIC_TEST_PROVIDER`: shm, tcp): getinfo offers FI_HMEM and `xfabric info` reports
//! FI_HMEM_ZE; registrations naming iface ZE are checked against the memory's owner; a send from ZE
//! memory into a peer's host buffer and from host memory into a peer's ZE receive buffer; RMA
//! writes with remote CQ data into a peer's ZE-registered window, read back into local ZE memory; a
//! fetch-add on a word of that window. Every byte that lands in device memory is checked through
//! the ZE interface.
//!
//! Level Zero here is the TEST DOUBLE of the loader (hmem/tests/doubles/ze_double.c, loaded
//! through XFABRIC_ZE_LOADER; see tests/common/ze_double.rs): two fake devices whose memory is
//! host memory, copies by memcpy. Its copy counters show that device memory was reached only
//! through the driver's copies, as it must be on a GPU. These tests have no real-GPU variant.
//! The parent starts the initiator, which starts the target (inheriting XFABRIC_ZE_LOADER).

#![cfg(feature = "ze")]

mod common;

use std::process::Command;

use common::ze_double::*;
use common::*;
use xfabric::atomic::{AtomicOp, Datatype};
use xfabric::hmem::{Hmem, HmemIface};
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_RMA | FI_ATOMIC | FI_HMEM;
/// Eager, rendezvous (cross-memory attach or fragments), split copy.
const SIZES: [usize; 4] = [100, 8192, 100_000, 1 << 20];
const MAX: usize = 1 << 20;
const WIN: usize = 2 << 20;
/// The target's memory is on the double's second device, the initiator's sources on its first
/// and its read destinations on its second: device numbers must travel through every path.
const TARGET_DEV: u64 = 1;
/// The word the fetch-add works on, before it.
const WORD_START: u64 = 1000;
const ADD: u64 = 7;

/// Where the `i`th write lands in the window: disjoint, page-aligned ranges.
fn win_off(i: usize) -> usize {
    SIZES[..i].iter().map(|l| l.next_multiple_of(4096)).sum()
}

/// Where the fetch-add's word is in the window: past every write.
fn word_off() -> usize {
    win_off(SIZES.len())
}

fn word(b: &[u8]) -> u64 {
    u64::from_ne_bytes(b[..8].try_into().unwrap())
}

/// Runs `op`; on the double, checks that it copied out of and into device memory through the
/// driver as often as `want` (out of, into) says: device buffers are staged, never reached
/// through a host pointer (which the double, unlike a GPU, would allow).
fn copying<T>(what: &str, want: (i32, i32), op: impl FnOnce() -> T) -> T {
    let before = ze_copies();
    let out = op();
    if let (Some(b), Some(a)) = (before, ze_copies()) {
        assert_eq!(
            (a.0 - b.0, a.1 - b.1),
            want,
            "{what}: copies (out of, into) device memory"
        );
    }
    out
}

/// The double's live objects once each device's copy list exists (lists live as long as the
/// process): what `ze_double_live` must come back to when every allocation is freed.
fn live_baseline() -> Option<i32> {
    for d in 0..ZE_DEVICES {
        let b = ze().alloc_device(d, 64).expect("a warm-up allocation");
        to_device(&b, &[0u8; 64]);
    }
    ze_counter("ze_double_live")
}

/// Checks that every allocation and mapping this process made is gone, freed without error.
fn no_leaks(baseline: Option<i32>) {
    assert!(ze().take_drop_errors().is_empty());
    assert_eq!(
        ze_counter("ze_double_live"),
        baseline,
        "Level Zero allocations left behind"
    );
}

/// Device memory on ZE device `TARGET_DEV`, registered with (Ze, TARGET_DEV): received into,
/// written, read and updated by the initiator.
fn target() {
    let n = node(CAPS | FI_RMA_EVENT, Progress::Manual);
    let baseline = live_baseline();
    let parent = connect_parent(&n);
    let win = ze().alloc_device(TARGET_DEV, WIN).expect("device window");
    to_device(&win, &vec![0u8; WIN]);
    to_device_at(&win, word_off(), &WORD_START.to_ne_bytes());
    let attr = MrAttr {
        addr: win.as_ptr() as usize,
        len: WIN,
        access: FI_REMOTE_WRITE | FI_REMOTE_READ,
        requested_key: 5,
        iface: Iface::Ze,
        device: TARGET_DEV,
        ..Default::default()
    };
    // SAFETY: the window outlives the registration (dropped first, below).
    let mr = unsafe { n.domain.mr_regattr(&attr, FI_HMEM_DEVICE_ONLY) }.expect("register");
    assert_eq!((mr.iface(), mr.device()), (Iface::Ze, TARGET_DEV));
    // shm addresses offsets into a region (no FI_MR_VIRT_ADDR): the window starts at 0.
    let virt = n.info.domain_attr.mr_mode & FI_MR_VIRT_ADDR != 0;
    let base = if virt { win.as_ptr() as usize } else { 0 };
    say(&format!("{} {base}", mr.key()));

    // 1: sends from the peer's device memory, into host memory.
    for (i, &len) in SIZES.iter().enumerate() {
        let mut buf = vec![0u8; len];
        // A message that came first is matched (and completed) in the call that posts its
        // receive: the copies are counted over both.
        let c = copying("receive into host memory", (0, 0), || {
            // SAFETY: buf outlives the completion awaited here.
            unsafe { n.ep.recv(&mut buf, None, parent, 10) }.unwrap();
            n.wait_one()
        });
        assert_eq!((c.op_context, c.len), (10, len));
        assert!(
            buf == pattern(len, i as u64),
            "host receive differs at {len}"
        );
    }
    say("host-received");

    // 2: into device memory: at the completion the data is on the device.
    let rx = ze().alloc_device(TARGET_DEV, MAX).unwrap();
    for (i, &len) in SIZES.iter().enumerate() {
        to_device(&rx, &vec![0u8; len]);
        // SAFETY: rx outlives the completion; the raw view is only handed to the endpoint.
        let view = unsafe { std::slice::from_raw_parts_mut(rx.as_ptr(), len) };
        let c = copying("receive into device memory", (0, 1), || {
            // SAFETY: as above.
            unsafe { n.ep.recv(view, None, parent, 20 + i) }.unwrap();
            n.wait_one()
        });
        assert_eq!(c.op_context, 20 + i, "the application's context");
        assert_eq!((c.len, c.buf), (len, rx.as_ptr() as usize));
        assert!(
            from_device(&rx, len) == pattern(len, 100 + i as u64),
            "device receive of {len} bytes differs"
        );
    }
    say("device-received");

    // 3: the peer writes into the window with remote CQ data: the entry comes after the data
    // is on the device.
    for (i, &len) in SIZES.iter().enumerate() {
        let c = copying("remote write into device memory", (0, 1), || n.wait_one());
        assert_eq!(c.flags & FI_REMOTE_CQ_DATA, FI_REMOTE_CQ_DATA);
        assert_eq!((c.data, c.len), (i as u64, len));
        assert!(
            from_device_at(&win, win_off(i), len) == pattern(len, 200 + i as u64),
            "device window differs after a write of {len} bytes"
        );
    }
    say("written");

    // 4: serve the peer's reads and its fetch-add until it is done.
    serve_until(&n, "done");
    assert_eq!(
        word(&from_device_at(&win, word_off(), 8)),
        WORD_START + ADD,
        "the fetch-add's word on the device"
    );
    for (i, &len) in SIZES.iter().enumerate() {
        assert!(
            from_device_at(&win, win_off(i), len) == pattern(len, 200 + i as u64),
            "reads changed the window"
        );
    }
    drop(mr);
    drop((win, rx));
    no_leaks(baseline);
}

/// Registrations naming iface ZE: refused with a typed error that says why where the memory's
/// owner is not what they name.
fn registration_errors(n: &Node) {
    let dev0 = ze().alloc_device(0, 4096).unwrap();
    let dev1 = ze().alloc_device(1, 4096).unwrap();
    let mapped = ze().alloc_host_mapped(0, 4096).unwrap();
    let host = vec![0u8; 4096];
    let reg = |addr: usize, iface: Iface, device: u64, flags: u64| {
        let attr = MrAttr {
            addr,
            len: 4096,
            access: FI_REMOTE_WRITE,
            requested_key: 77,
            iface,
            device,
            ..Default::default()
        };
        // SAFETY: refused registrations touch nothing; accepted ones are dropped at once.
        unsafe { n.domain.mr_regattr(&attr, flags) }.map(drop)
    };
    let inval = |r: Result<()>, parts: &[&str]| match r {
        Err(Error::Inval(m)) if parts.iter().all(|p| m.contains(p)) => {}
        other => panic!("expected Inval saying {parts:?}, got {other:?}"),
    };
    let host_addr = host.as_ptr() as usize;
    let (d0, d1) = (dev0.as_ptr() as usize, dev1.as_ptr() as usize);
    let mapped_addr = mapped.as_ptr() as usize;

    inval(
        reg(host_addr, Iface::Ze, 0, 0),
        &["iface ze device 0 given", "is host memory"],
    );
    inval(reg(d0, Iface::System, 0, 0), &["is ze device 0 memory"]);
    inval(
        reg(d0, Iface::Ze, 1, 0),
        &["iface ze device 1 given", "is ze device 0 memory"],
    );
    inval(
        reg(d1, Iface::Ze, 0, 0),
        &["iface ze device 0 given", "is ze device 1 memory"],
    );
    // ZE memory named as CUDA memory: refused as unusable here, or (where a CUDA driver
    // works) as not CUDA's.
    let as_cuda = reg(d0, Iface::Cuda, 0, 0);
    if Hmem::global().cuda().available().is_ok() {
        inval(
            as_cuda,
            &["iface cuda device 0 given", "is ze device 0 memory"],
        );
    } else {
        assert!(
            matches!(&as_cuda, Err(Error::NoSys(m)) if m.contains("FI_HMEM_CUDA")),
            "{as_cuda:?}"
        );
    }
    // zeMemAllocHost memory is host memory: registered as a ZE host allocation (any device),
    // never as device memory.
    reg(mapped_addr, Iface::Ze, 1, FI_HMEM_HOST_ALLOC).unwrap();
    inval(
        reg(mapped_addr, Iface::Ze, 0, 0),
        &["iface ze device 0 given", "is host memory"],
    );
    inval(reg(mapped_addr, Iface::Ze, 0, FI_HMEM_DEVICE_ONLY), &[]);
    inval(reg(host_addr, Iface::Ze, 0, FI_HMEM_DEVICE_ONLY), &[]);
    // What each allocation is: accepted.
    reg(d0, Iface::Ze, 0, FI_HMEM_DEVICE_ONLY).unwrap();
    reg(d1, Iface::Ze, 1, 0).unwrap();
    reg(host_addr, Iface::System, 0, 0).unwrap();
    reg(mapped_addr, Iface::System, 0, 0).unwrap();

    // A domain without FI_HMEM takes no ZE registration.
    let plain = node(FI_MSG | FI_RMA, Progress::Manual);
    assert_eq!(plain.info.caps & FI_HMEM, 0);
    let attr = MrAttr {
        addr: d0,
        len: 4096,
        access: FI_REMOTE_WRITE,
        iface: Iface::Ze,
        ..Default::default()
    };
    // SAFETY: refused.
    let e = unsafe { plain.domain.mr_regattr(&attr, 0) }
        .map(drop)
        .unwrap_err();
    assert!(
        matches!(&e, Error::OpNotSupp(m) if m.contains("iface ze") && m.contains("without FI_HMEM")),
        "{e}"
    );
}

/// Posts with `post` (retrying while it says Again) and waits for its completion.
fn done(n: &Node, ctx: Context, post: impl FnMut() -> Result<()>) {
    n.retry(post);
    assert_eq!(n.wait_one().op_context, ctx);
}

fn initiator(test: &str) {
    let hints = Info {
        caps: CAPS,
        ..Default::default()
    };
    let infos = getinfo(fi_version(1, 17), None, None, 0, Some(&hints)).expect("FI_HMEM offered");
    assert!(infos.iter().all(|i| i.caps & FI_HMEM != 0));
    assert!(infos
        .iter()
        .any(|i| i.fabric_attr.prov_name.as_deref() == Some("shm")));
    // Without asking, FI_HMEM is not given (it costs an owner lookup per transfer).
    let plain = getinfo(fi_version(1, 17), None, None, 0, None).unwrap();
    assert!(plain.iter().all(|i| i.caps & FI_HMEM == 0));

    let n = node(CAPS, Progress::Manual);
    let baseline = live_baseline();
    registration_errors(&n);
    let mut child = spawn(test, "target", &[]);
    let peer = connect(&mut child, &n);
    let f: Vec<u64> = child
        .hear()
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    let (key, base) = (f[0], f[1]);

    // 1: sends from device memory (device 0) into the peer's host buffers.
    let src = ze().alloc_device(0, MAX).unwrap();
    for (i, &len) in SIZES.iter().enumerate() {
        to_device(&src, &pattern(len, i as u64));
        // SAFETY: src outlives the completion; the view is only handed to the endpoint.
        let view = unsafe { std::slice::from_raw_parts(src.as_ptr(), len) };
        copying("send from device memory", (1, 0), || {
            // SAFETY: as above.
            unsafe { n.ep.send(view, None, peer, 1) }.unwrap();
            assert_eq!(n.wait_one().op_context, 1);
        });
    }
    assert_eq!(child.hear(), "host-received");

    // 2: host memory into the peer's device buffer.
    for (i, &len) in SIZES.iter().enumerate() {
        let out = pattern(len, 100 + i as u64);
        // SAFETY: out outlives the completion.
        unsafe { n.ep.send(&out, None, peer, 2) }.unwrap();
        assert_eq!(n.wait_one().op_context, 2);
    }
    assert_eq!(child.hear(), "device-received");

    // 3: RMA writes with remote CQ data into the peer's window, every other one from device
    // memory.
    for (i, &len) in SIZES.iter().enumerate() {
        let out = pattern(len, 200 + i as u64);
        let from_dev = i % 2 == 1;
        if from_dev {
            to_device(&src, &out);
        }
        let buf: &[u8] = if from_dev {
            // SAFETY: src outlives the completion awaited below.
            unsafe { std::slice::from_raw_parts(src.as_ptr(), len) }
        } else {
            &out
        };
        let at = base + win_off(i) as u64;
        copying("RMA write", (i32::from(from_dev), 0), || {
            // SAFETY: buf outlives the completion.
            unsafe { n.ep.writedata(buf, None, i as u64, peer, at, key, 3) }.unwrap();
            assert_eq!(n.wait_one().op_context, 3);
        });
    }
    assert_eq!(child.hear(), "written");

    // 4: every write read back into device memory (device 1).
    let dst = ze().alloc_device(1, MAX).unwrap();
    for (i, &len) in SIZES.iter().enumerate() {
        to_device(&dst, &vec![0u8; len]);
        // SAFETY: dst outlives the completion; the view is only handed to the endpoint.
        let view = unsafe { std::slice::from_raw_parts_mut(dst.as_ptr(), len) };
        let at = base + win_off(i) as u64;
        copying("RMA read into device memory", (0, 1), || {
            // SAFETY: as above.
            unsafe { n.ep.read(view, None, peer, at, key, 4) }.unwrap();
            assert_eq!(n.wait_one().op_context, 4);
        });
        assert!(
            from_device(&dst, len) == pattern(len, 200 + i as u64),
            "read of {len} bytes into device memory differs"
        );
    }

    // 5: a fetch-add on the peer's device word, operand and result in device memory.
    let local = ze().alloc_device(0, 4096).unwrap();
    to_device_at(&local, 0, &ADD.to_ne_bytes());
    to_device_at(&local, 8, &[0xff; 8]);
    // SAFETY (both): `local` outlives the completion; the views are only handed to the
    // endpoint.
    let operand = unsafe { std::slice::from_raw_parts(local.as_ptr(), 8) };
    let result = unsafe { std::slice::from_raw_parts_mut(local.as_ptr().add(8), 8) };
    let at = base + word_off() as u64;
    copying("fetch-add, device operand and result", (1, 1), || {
        // SAFETY: as above.
        done(&n, 5, || unsafe {
            n.ep.fetch_atomic(
                operand,
                1,
                result,
                peer,
                at,
                key,
                Datatype::UInt64,
                AtomicOp::Sum,
                5,
            )
        });
    });
    assert_eq!(
        word(&from_device_at(&local, 8, 8)),
        WORD_START,
        "the fetched value"
    );

    child.tell("done");
    assert_eq!(child.hear(), "OK");
    let pid = child.pid();
    child.join();
    assert_eq!(segments_of(pid), 0, "the target left a segment");
    assert!(n.ep.core().take_staging_errors().is_empty());
    drop((src, dst, local));
    no_leaks(baseline);
}

fn run_roles(test: &str) -> bool {
    match role().as_deref() {
        Some("initiator") => initiator(test),
        Some("target") => target(),
        Some(r) => panic!("unknown role {r}"),
        None => return false,
    }
    say("OK");
    true
}

#[test]
fn ze_double_device_memory() {
    const NAME: &str = "ze_double_device_memory";
    if run_roles(NAME) {
        return;
    }
    run_child(NAME, "initiator", &ze_double_env(), &[]);
}

/// Without cross-memory attach, large messages and writes come in fragments and reads come
/// back through the ring.
#[test]
fn ze_double_device_memory_without_cma() {
    const NAME: &str = "ze_double_device_memory_without_cma";
    if run_roles(NAME) {
        return;
    }
    run_child(
        NAME,
        "initiator",
        &ze_double_env(),
        &[("XFABRIC_SHM_CMA", "0")],
    );
}

#[test]
fn ze_double_makes_info_report_ze() {
    if role().is_some() {
        return;
    }
    let env = ze_double_env();
    let info = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_xfabric"))
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .expect("run xfabric");
        assert!(
            out.status.success(),
            "xfabric {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = info(&["info", "--hmem"]);
    assert!(
        text.contains("FI_HMEM_ZE: available, 2 device(s)")
            && text.contains("1: xfabric test double ze device 1"),
        "{text}"
    );
    let text = info(&["info", "-p", "shm", "-c", "FI_MSG|FI_HMEM", "-v"]);
    assert!(text.contains("FI_HMEM_ZE: available"), "{text}");
}
