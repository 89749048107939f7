//! Device memory between two real processes over the provider under test (`XFABRIC_TEST_PROVIDER`:
//! shm, tcp): a send from CUDA memory into a peer's host buffer, a receive into CUDA memory, and
//! RMA writes into a peer's CUDA buffer registered with `iface` CUDA, data checked each time;
//! registration checks; getinfo's FI_HMEM both ways.
//!
//! CUDA here is the TEST DOUBLE of libcuda (hmem/tests/doubles/cuda_double.c: "device memory"
//! that is host memory the double tracks, and host-to-device copies that land only when their
//! stream is synchronized). Processes that load it are children started with the double first
//! on LD_LIBRARY_PATH: the parent starts the initiator, which starts the target. The same
//! checks run on a real GPU with `XFABRIC_GPU_TESTS=1` (skipped with a reason otherwise).

#![cfg(feature = "cuda")]

mod common;

use std::process::Command;

use common::cuda_double::*;
use common::*;
use xfabric::hmem::{DeviceBuffer, Hmem};
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_RMA | FI_HMEM;
/// Eager, rendezvous (cross-memory attach or fragments), split copy.
const SIZES: [usize; 4] = [100, 8192, 100_000, 1 << 20];
const WIN: usize = 2 << 20;

/// Where the `i`th write lands in the window: disjoint, page-aligned ranges.
fn win_off(i: usize) -> usize {
    SIZES[..i].iter().map(|l| l.next_multiple_of(4096)).sum()
}

/// Device memory registered with (CUDA, 0) at the target: written by the initiator.
fn target() {
    let n = node(CAPS | FI_RMA_EVENT, Progress::Manual);
    let parent = connect_parent(&n);
    let dev = cuda().alloc_device(0, WIN).expect("device window");
    to_device(&dev, &vec![0u8; WIN]);
    let attr = MrAttr {
        addr: dev.as_ptr() as usize,
        len: WIN,
        access: FI_REMOTE_WRITE | FI_REMOTE_READ,
        requested_key: 5,
        iface: Iface::Cuda,
        device: 0,
        ..Default::default()
    };
    // SAFETY: the window outlives the registration (dropped first, below).
    let mr = unsafe { n.domain.mr_regattr(&attr, FI_HMEM_DEVICE_ONLY) }.expect("register");
    assert_eq!((mr.iface(), mr.device()), (Iface::Cuda, 0));
    // shm addresses offsets into a region (no FI_MR_VIRT_ADDR): the window starts at 0.
    let virt = n.info.domain_attr.mr_mode & FI_MR_VIRT_ADDR != 0;
    let base = if virt { dev.as_ptr() as usize } else { 0 };
    say(&format!("{} {base}", mr.key()));

    // 1: receive a send from the peer's device memory into host memory.
    for (i, &len) in SIZES.iter().enumerate() {
        let mut buf = vec![0u8; len];
        // SAFETY: buf outlives the completion awaited below.
        unsafe { n.ep.recv(&mut buf, None, parent, 10) }.unwrap();
        let c = n.wait_one();
        assert_eq!((c.op_context, c.len), (10, len));
        assert!(
            buf == pattern(len, i as u64),
            "host receive differs at {len}"
        );
    }
    say("host-received");

    // 2: receive into device memory; at the completion the data is on the device (the
    // double holds host-to-device copies until a synchronize: none may be pending).
    let rx = cuda()
        .alloc_device(0, *SIZES.iter().max().unwrap())
        .unwrap();
    for (i, &len) in SIZES.iter().enumerate() {
        // SAFETY: rx outlives the completion; the raw view is only handed to the endpoint.
        let view = unsafe { std::slice::from_raw_parts_mut(rx.as_ptr(), len) };
        // SAFETY: as above.
        unsafe { n.ep.recv(view, None, parent, 20 + i) }.unwrap();
        let c = n.wait_one();
        assert_eq!(c.op_context, 20 + i, "the application's context");
        assert_eq!((c.len, c.buf), (len, rx.as_ptr() as usize));
        if let Some(pending) = double_counter("cuda_double_htod_pending") {
            assert_eq!(
                pending, 0,
                "completion reported before the device copy landed"
            );
        }
        assert!(
            from_device(&rx, len) == pattern(len, 100 + i as u64),
            "device receive differs at {len}"
        );
    }
    say("device-received");

    // 3: the peer writes into the registered window with remote CQ data: the entry comes
    // after the data is on the device.
    for (i, &len) in SIZES.iter().enumerate() {
        let c = n.wait_one();
        assert_eq!(c.flags & FI_REMOTE_CQ_DATA, FI_REMOTE_CQ_DATA);
        assert_eq!((c.data, c.len), (i as u64, len));
        if let Some(pending) = double_counter("cuda_double_htod_pending") {
            assert_eq!(
                pending, 0,
                "remote write reported before the device copy landed"
            );
        }
        let off = win_off(i);
        let got = from_device(&dev, off + len);
        let want = pattern(len, 200 + i as u64);
        assert!(got[off..] == want[..], "device window differs at {len}");
    }
    say("written");
    // Serve (the peer's read back) until told to stop.
    serve_until(&n, "done");
    drop(mr);
    drop(dev);
    assert!(cuda().take_drop_errors().is_empty());
}

/// Registration checks: each refused with a typed error that says why.
fn registration_errors(n: &Node) {
    let dev = cuda().alloc_device(0, 4096).unwrap();
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
    let host_addr = host.as_ptr() as usize;
    let dev_addr = dev.as_ptr() as usize;
    let e = reg(host_addr, Iface::Cuda, 0, 0).unwrap_err();
    assert!(
        matches!(&e, Error::Inval(m) if m.contains("iface cuda device 0 given") && m.contains("is host memory")),
        "{e}"
    );
    let e = reg(dev_addr, Iface::System, 0, 0).unwrap_err();
    assert!(
        matches!(&e, Error::Inval(m) if m.contains("is cuda device 0 memory")),
        "{e}"
    );
    let e = reg(dev_addr, Iface::Cuda, 1, 0).unwrap_err();
    assert!(
        matches!(&e, Error::Inval(m) if m.contains("device 1 given")),
        "{e}"
    );
    let e = reg(dev_addr, Iface::Rocr, 0, 0).unwrap_err();
    assert!(
        matches!(&e, Error::NoSys(m) if m.contains("FI_HMEM_ROCR")),
        "{e}"
    );
    let e = reg(host_addr, Iface::Ze, 0, 0).unwrap_err();
    assert!(
        matches!(&e, Error::NoSys(m) if m.contains("FI_HMEM_ZE")),
        "{e}"
    );
    let e = reg(host_addr, Iface::Cuda, 0, FI_HMEM_DEVICE_ONLY).unwrap_err();
    assert!(matches!(e, Error::Inval(_)), "{e}");
    // Host memory: as System, or as a CUDA host allocation (device ignored).
    reg(host_addr, Iface::System, 0, 0).unwrap();
    reg(host_addr, Iface::Cuda, 3, FI_HMEM_HOST_ALLOC).unwrap();
    reg(dev_addr, Iface::Cuda, 0, 0).unwrap();
    // A domain without FI_HMEM takes no device registration.
    let plain = node(FI_MSG | FI_RMA, Progress::Manual);
    assert_eq!(plain.info.caps & FI_HMEM, 0);
    let attr = MrAttr {
        addr: dev_addr,
        len: 4096,
        access: FI_REMOTE_WRITE,
        iface: Iface::Cuda,
        ..Default::default()
    };
    // SAFETY: refused.
    let e = unsafe { plain.domain.mr_regattr(&attr, 0) }
        .map(drop)
        .unwrap_err();
    assert!(
        matches!(&e, Error::OpNotSupp(m) if m.contains("without FI_HMEM")),
        "{e}"
    );
}

fn initiator(test: &str) {
    let hints = Info {
        caps: CAPS,
        ..Default::default()
    };
    let infos = getinfo(fi_version(1, 17), None, None, 0, Some(&hints)).expect("FI_HMEM offered");
    assert!(infos.iter().all(|i| i.caps & FI_HMEM != 0));
    // Without asking, FI_HMEM is not given (it costs an owner lookup per transfer).
    let plain = getinfo(fi_version(1, 17), None, None, 0, None).unwrap();
    assert!(plain.iter().all(|i| i.caps & FI_HMEM == 0));

    let n = node(CAPS, Progress::Manual);
    registration_errors(&n);
    let mut child = spawn(test, "target", &[]);
    let peer = connect(&mut child, &n);
    let f: Vec<usize> = child
        .hear()
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    let (key, base) = (f[0] as u64, f[1] as u64);

    // 1: send from device memory into the peer's host buffer.
    let src = cuda()
        .alloc_device(0, *SIZES.iter().max().unwrap())
        .unwrap();
    for (i, &len) in SIZES.iter().enumerate() {
        to_device(&src, &pattern(len, i as u64));
        // SAFETY: src outlives the completion; the view is only handed to the endpoint.
        let view = unsafe { std::slice::from_raw_parts(src.as_ptr(), len) };
        // SAFETY: as above.
        unsafe { n.ep.send(view, None, peer, 1) }.unwrap();
        assert_eq!(n.wait_one().op_context, 1);
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

    // 3: RMA writes (from device memory, too) into the peer's registered device window.
    for (i, &len) in SIZES.iter().enumerate() {
        let off = win_off(i);
        let len_in = len;
        let out = pattern(len_in, 200 + i as u64);
        let from_dev = i % 2 == 1;
        if from_dev {
            to_device(&src, &out);
        }
        let buf: &[u8] = if from_dev {
            // SAFETY: src outlives the completion awaited below.
            unsafe { std::slice::from_raw_parts(src.as_ptr(), len_in) }
        } else {
            &out
        };
        // SAFETY: buf outlives the completion.
        unsafe {
            n.ep.writedata(buf, None, i as u64, peer, base + off as u64, key, 3)
        }
        .unwrap();
        assert_eq!(n.wait_one().op_context, 3);
    }
    assert_eq!(child.hear(), "written");
    // Reading the peer's device memory back (tests/hmem_rma.rs reads every size).
    let mut back = [0u8; 64];
    // SAFETY: back outlives the completion.
    unsafe { n.ep.read(&mut back, None, peer, base, key, 4) }.unwrap();
    assert_eq!(n.wait_one().op_context, 4);
    assert!(
        back[..] == pattern(SIZES[0], 200)[..64],
        "read back differs"
    );
    child.tell("done");
    child.join();
    drop(src);
    assert!(cuda().take_drop_errors().is_empty());
    if let Some(landed) = double_counter("cuda_double_htod_landed") {
        assert!(landed > 0);
    }
}

/// Sizes of the delivery-complete check: eager, rendezvous, split copy.
const DC_SIZES: [usize; 3] = [100, 100_000, 1 << 20];

/// Messages into one FI_MULTI_RECV buffer in device memory: 53,100 of its 64 KiB, leaving
/// less than the minimum of 16 KiB, so the last one releases it.
const MULTI_LENS: [usize; 4] = [100, 3000, 20_000, 30_000];
const MULTI_BUF: usize = 64 * 1024;

/// Where the `i`th delivery-complete write lands in the window.
fn dc_off(i: usize) -> usize {
    DC_SIZES[..i].iter().map(|l| l.next_multiple_of(4096)).sum()
}

/// The delivery-complete target: its device takes `LAND_DELAY` to land each copy, and it
/// checks its device memory only when the initiator's completions are all in, without
/// reading its own completion queue first.
fn dc_target() {
    let n = node(CAPS | FI_RMA_EVENT | FI_MULTI_RECV, Progress::Auto);
    n.ep.setopt(FI_OPT_MIN_MULTI_RECV, 16 * 1024).unwrap();
    let parent = connect_parent(&n);
    let win = cuda().alloc_device(0, WIN).expect("device window");
    to_device(&win, &vec![0u8; WIN]);
    let attr = MrAttr {
        addr: win.as_ptr() as usize,
        len: WIN,
        access: FI_REMOTE_WRITE,
        requested_key: 9,
        iface: Iface::Cuda,
        device: 0,
        ..Default::default()
    };
    // SAFETY: the window outlives the registration (dropped first, below).
    let mr = unsafe { n.domain.mr_regattr(&attr, 0) }.expect("register");
    let virt = n.info.domain_attr.mr_mode & FI_MR_VIRT_ADDR != 0;
    let base = if virt { win.as_ptr() as usize } else { 0 };
    let rx: Vec<DeviceBuffer> = DC_SIZES
        .iter()
        .map(|&len| cuda().alloc_device(0, len).unwrap())
        .collect();
    for (i, (b, &len)) in rx.iter().zip(&DC_SIZES).enumerate() {
        to_device(b, &vec![0u8; len]);
        // SAFETY: the buffers outlive the completions read below.
        let view = unsafe { std::slice::from_raw_parts_mut(b.as_ptr(), len) };
        // SAFETY: as above.
        unsafe { n.ep.recv(view, None, parent, 30 + i) }.unwrap();
    }
    // Then one multi-receive buffer in device memory for the next messages.
    let multi = cuda().alloc_device(0, MULTI_BUF).unwrap();
    to_device(&multi, &vec![0u8; MULTI_BUF]);
    let iov = [RawIov {
        addr: multi.as_ptr() as usize,
        len: MULTI_BUF,
    }];
    let m = Msg {
        iov: &iov,
        desc: &[],
        addr: parent,
        context: 40,
        data: 0,
        tag: 0,
        ignore: 0,
    };
    // SAFETY: the buffer outlives the completions read below.
    unsafe { n.ep.recvmsg(&m, FI_MULTI_RECV) }.unwrap();
    say(&format!("{} {base}", mr.key()));
    assert_eq!(listen(), "all complete");
    // The double's device memory is host memory of this process: look at it directly, not
    // through a copy that would wait for the device.
    let raw = |b: &DeviceBuffer, off: usize, len: usize| {
        // SAFETY: the double's device memory is mapped host memory of at least off + len.
        unsafe { std::slice::from_raw_parts(b.as_ptr().add(off), len) }.to_vec()
    };
    for (i, (b, &len)) in rx.iter().zip(&DC_SIZES).enumerate() {
        assert!(
            raw(b, 0, len) == pattern(len, 300 + i as u64),
            "a delivery-complete send of {len} bytes completed before the data was on the device"
        );
    }
    for (i, &len) in DC_SIZES.iter().enumerate() {
        assert!(
            raw(&win, dc_off(i), len) == pattern(len, 400 + i as u64),
            "an RMA write of {len} bytes completed before the data was on the device"
        );
    }
    let mut off = 0;
    for (i, &len) in MULTI_LENS.iter().enumerate() {
        assert!(
            raw(&multi, off, len) == pattern(len, 500 + i as u64),
            "a delivery-complete send of {len} bytes into a multi-receive buffer completed \
             before the data was on the device"
        );
        off += len;
    }
    assert_eq!(double_counter("cuda_double_htod_pending"), Some(0));
    let got = n.wait_n(DC_SIZES.len() + MULTI_LENS.len());
    for (i, c) in got[..DC_SIZES.len()].iter().enumerate() {
        assert_eq!((c.op_context, c.len), (30 + i, DC_SIZES[i]));
    }
    // Each message's entry names its place in the application's device buffer.
    let mut off = 0;
    for (c, &len) in got[DC_SIZES.len()..].iter().zip(&MULTI_LENS) {
        assert_eq!(c.op_context, 40);
        assert_eq!((c.buf, c.len), (multi.as_ptr() as usize + off, len));
        let releases = len == MULTI_LENS[MULTI_LENS.len() - 1];
        assert_eq!(c.flags & FI_MULTI_RECV != 0, releases, "{len} bytes");
        off += len;
    }
    say("checked");
    assert_eq!(listen(), "bye");
    drop(mr);
}

/// Sends with FI_DELIVERY_COMPLETE and RMA writes (acknowledged by the target) into a peer's
/// device memory, whose copies land slowly: each completion here must mean the data is on
/// the peer's device (fi_cq(3), heterogeneous memory).
fn dc_initiator(test: &str) {
    let n = node(CAPS, Progress::Manual);
    let delay = [("CUDA_DOUBLE_LAND_DELAY_US", "100000")];
    let mut child = spawn(test, "dc-target", &delay);
    let peer = connect(&mut child, &n);
    let f: Vec<u64> = child
        .hear()
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    let (key, base) = (f[0], f[1]);
    for (i, &len) in DC_SIZES.iter().enumerate() {
        let out = pattern(len, 300 + i as u64);
        let iov = [RawIov {
            addr: out.as_ptr() as usize,
            len,
        }];
        let msg = Msg {
            iov: &iov,
            desc: &[],
            addr: peer,
            context: 5,
            data: 0,
            tag: 0,
            ignore: 0,
        };
        // SAFETY: out outlives the completion awaited next.
        unsafe { n.ep.sendmsg(&msg, FI_DELIVERY_COMPLETE) }.unwrap();
        assert_eq!(n.wait_one().op_context, 5);
    }
    for (i, &len) in MULTI_LENS.iter().enumerate() {
        let out = pattern(len, 500 + i as u64);
        let iov = [RawIov {
            addr: out.as_ptr() as usize,
            len,
        }];
        let msg = Msg {
            iov: &iov,
            desc: &[],
            addr: peer,
            context: 7,
            data: 0,
            tag: 0,
            ignore: 0,
        };
        // SAFETY: out outlives the completion awaited next.
        unsafe { n.ep.sendmsg(&msg, FI_DELIVERY_COMPLETE) }.unwrap();
        assert_eq!(n.wait_one().op_context, 7);
    }
    for (i, &len) in DC_SIZES.iter().enumerate() {
        let out = pattern(len, 400 + i as u64);
        let at = base + dc_off(i) as u64;
        // SAFETY: out outlives the completion awaited next.
        unsafe { n.ep.write(&out, None, peer, at, key, 6) }.unwrap();
        assert_eq!(n.wait_one().op_context, 6);
    }
    child.tell("all complete");
    assert_eq!(child.hear(), "checked");
    child.tell("bye");
    child.join();
}

fn run_roles(test: &str) -> bool {
    match role().as_deref() {
        Some("initiator") => initiator(test),
        Some("target") => target(),
        Some("dc-initiator") => dc_initiator(test),
        Some("dc-target") => dc_target(),
        Some(r) => panic!("unknown role {r}"),
        None => return false,
    }
    say("OK");
    true
}

#[test]
fn cuda_double_device_memory() {
    const NAME: &str = "cuda_double_device_memory";
    if run_roles(NAME) {
        return;
    }
    run_child(NAME, "initiator", &double_env(), &[]);
}

#[test]
fn cuda_double_delivery_complete_means_on_the_device() {
    const NAME: &str = "cuda_double_delivery_complete_means_on_the_device";
    if run_roles(NAME) {
        return;
    }
    run_child(NAME, "dc-initiator", &double_env(), &[]);
}

#[test]
#[cfg_attr(
    not(xfabric_gpu_tests),
    ignore = "needs an NVIDIA GPU (and libnvrtc): run with XFABRIC_GPU_TESTS=1 cargo test"
)]
fn gpu_device_memory() {
    const NAME: &str = "gpu_device_memory";
    if run_roles(NAME) {
        return;
    }
    run_child(NAME, "initiator", &[], &[]);
}

#[test]
fn without_devices_fi_hmem_is_not_offered() {
    if role().is_some() {
        return;
    }
    if !Hmem::global().device_ifaces().is_empty() {
        println!("skipped: a device interface is available here; the no-device check needs none");
        return;
    }
    let hints = Info {
        caps: FI_MSG | FI_HMEM,
        ..Default::default()
    };
    let e = getinfo(fi_version(1, 17), None, None, 0, Some(&hints)).unwrap_err();
    let m = e.to_string();
    assert!(matches!(e, Error::NoData(_)), "{m}");
    assert!(
        m.contains("FI_HMEM requested") && m.contains("FI_HMEM_CUDA: unavailable"),
        "{m}"
    );
    // Without FI_HMEM, device registrations are refused, naming the capability.
    let n = node(FI_MSG, Progress::Manual);
    let buf = [0u8; 64];
    let attr = MrAttr {
        addr: buf.as_ptr() as usize,
        len: 64,
        iface: Iface::Cuda,
        ..Default::default()
    };
    // SAFETY: refused.
    let e = unsafe { n.domain.mr_regattr(&attr, 0) }
        .map(drop)
        .unwrap_err();
    assert!(matches!(e, Error::OpNotSupp(_)), "{e}");
}

#[test]
fn cuda_double_makes_info_report_cuda() {
    if role().is_some() {
        return;
    }
    let env = double_env();
    let out = Command::new(env!("CARGO_BIN_EXE_xfabric"))
        .args(["info", "--hmem"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run xfabric");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains("FI_HMEM_CUDA: available, 2 device(s)"),
        "{text}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_xfabric"))
        .args(["info", "-p", "shm", "-c", "FI_MSG|FI_HMEM"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run xfabric");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
