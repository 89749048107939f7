//! Reads and atomics on device memory between two real processes over the provider under test
//! (`XFABRIC_TEST_PROVIDER`: shm, tcp): RMA reads of a peer's region registered as CUDA memory
//! (every read path: inline data, cross-memory attach, split copy) into host and into local CUDA
//! memory; atomics on the peer's CUDA region, with fetched values and the final device contents
//! checked; atomics whose operand, compare or result buffers are local CUDA memory; and a failed
//! device copy reported as `FI_EIO`.
//!
//! CUDA is the TEST DOUBLE (tests/common/cuda_double.rs) in the `cuda_double_*` tests, the real
//! driver in `gpu_rma_device_memory` (with `XFABRIC_GPU_TESTS=1`, skipped with a reason
//! otherwise). The parent starts the initiator, which starts the target.

#![cfg(feature = "cuda")]

mod common;

use common::cuda_double::*;
use common::*;
use xfabric::atomic::{AtomicOp, Datatype};
use xfabric::hmem::DeviceBuffer;
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_RMA | FI_ATOMIC | FI_HMEM;
/// Inline data, rendezvous and split copies, up to several split chunks.
const READS: [usize; 6] = [8, 100, 8192, 100_000, 1 << 20, 4 << 20];
/// The read window at the target, filled with `pattern(WIN, SEED)`.
const WIN: usize = (4 << 20) + (64 << 10);
const SEED: u64 = 7;
/// The atomics' target words at the target.
const AREA: usize = 4096;

/// Where the `i`th read starts in the window: odd offsets, never on a page boundary.
fn read_off(i: usize) -> usize {
    1 + 4093 * i
}

/// A registration of `len` bytes of device memory at `buf`; with its base as the initiator
/// addresses it (shm addresses offsets, unless it asks for FI_MR_VIRT_ADDR).
fn register(n: &Node, buf: &DeviceBuffer, len: usize, key: u64) -> (MemoryRegion, u64) {
    let attr = MrAttr {
        addr: buf.as_ptr() as usize,
        len,
        access: FI_REMOTE_WRITE | FI_REMOTE_READ,
        requested_key: key,
        iface: Iface::Cuda,
        device: 0,
        ..Default::default()
    };
    // SAFETY: the target drops every registration before the memory it names; the one
    // registered past its allocation (`short`) is only reached through the driver's copies.
    let mr = unsafe { n.domain.mr_regattr(&attr, FI_HMEM_DEVICE_ONLY) }.expect("register");
    let virt = n.info.domain_attr.mr_mode & FI_MR_VIRT_ADDR != 0;
    let base = if virt { buf.as_ptr() as u64 } else { 0 };
    (mr, base)
}

fn u64s(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

fn word(b: &[u8], i: usize) -> u64 {
    u64::from_ne_bytes(b[8 * i..8 * i + 8].try_into().unwrap())
}

/// The atomics' target words before and (expected) after the initiator's operations.
fn area(after: bool, short_checked: bool) -> Vec<u8> {
    let mut a = vec![0u8; AREA];
    let words: [u64; 13] = if after {
        let last = if short_checked { 1001 } else { 1000 };
        [
            115,
            1014,
            99,
            4.0f64.to_bits(),
            0,
            58,
            70,
            3,
            11,
            6,
            12,
            last,
            0,
        ]
    } else {
        [
            100,
            1000,
            42,
            1.5f64.to_bits(),
            0,
            50,
            7,
            1,
            0,
            5,
            9,
            1000,
            0,
        ]
    };
    a[..13 * 8].copy_from_slice(&u64s(&words));
    // Word 4: two i32s.
    let pair: [i32; 2] = if after { [7, 24] } else { [10, 20] };
    a[32..36].copy_from_slice(&pair[0].to_ne_bytes());
    a[36..40].copy_from_slice(&pair[1].to_ne_bytes());
    a
}

/// The target: a read window and the atomics' words in CUDA memory, registered; on the double
/// also a region registered past the end of its allocation: the driver refuses copies that
/// cross that end.
fn target() {
    let n = node(CAPS, Progress::Manual);
    let _parent = connect_parent(&n);
    let win = cuda().alloc_device(0, WIN).expect("device window");
    to_device(&win, &pattern(WIN, SEED));
    let words = cuda().alloc_device(0, AREA).expect("device words");
    to_device(&words, &area(false, false));
    let (mr_win, base_win) = register(&n, &win, WIN, 5);
    let (mr_words, base_words) = register(&n, &words, AREA, 6);
    let short = on_double().then(|| cuda().alloc_device(0, 4096).expect("short"));
    let short_mr = short.as_ref().map(|s| register(&n, s, 8192, 7));
    let (short_key, short_base) = short_mr.as_ref().map_or((0, 0), |(m, b)| (m.key(), *b));
    say(&format!(
        "{} {base_win} {} {base_words} {short_key} {short_base}",
        mr_win.key(),
        mr_words.key()
    ));
    // Serve until the initiator is done.
    serve_until(&n, "done");
    // What the atomics left on the device.
    say(&hex(&from_device(&words, AREA)));
    drop((mr_win, mr_words, short_mr));
    drop((win, words, short));
    assert!(cuda().take_drop_errors().is_empty());
}

/// Reads of every size from the peer's device window into host and into CUDA memory; a read
/// with two remote ranges into a host and a CUDA segment; a read the driver fails.
fn reads(n: &Node, peer: FiAddr, key: u64, base: u64, short: Option<(u64, u64)>) {
    let window = pattern(WIN, SEED);
    let max = *READS.iter().max().unwrap();
    let dst = cuda().alloc_device(0, max).expect("local device buffer");
    for (i, &len) in READS.iter().enumerate() {
        let off = read_off(i);
        let want = &window[off..off + len];
        let addr = base + off as u64;
        let mut host = vec![0u8; len];
        // SAFETY: host outlives the completion awaited below.
        unsafe { n.ep.read(&mut host, None, peer, addr, key, 10 + i) }.unwrap();
        assert_eq!(n.wait_one().op_context, 10 + i);
        assert!(host == want, "host read of {len} bytes differs");

        to_device(&dst, &vec![0u8; len]);
        // SAFETY: dst outlives the completion; the raw view is only handed to the endpoint.
        let view = unsafe { std::slice::from_raw_parts_mut(dst.as_ptr(), len) };
        copying("device read", (0, 1), || {
            // SAFETY: as above.
            unsafe { n.ep.read(view, None, peer, addr, key, 20 + i) }.unwrap();
            assert_eq!(n.wait_one().op_context, 20 + i);
        });
        if let Some(pending) = double_counter("cuda_double_htod_pending") {
            assert_eq!(
                pending, 0,
                "read reported before its data reached the device"
            );
        }
        assert!(
            from_device(&dst, len) == want,
            "device read of {len} bytes differs"
        );
    }

    // Two remote ranges (60 000 bytes each) into 50 000 host bytes and 70 000 device bytes.
    let (a, b) = (3usize, 2_000_003usize);
    let mut want = window[a..a + 60_000].to_vec();
    want.extend_from_slice(&window[b..b + 60_000]);
    let mut host = vec![0u8; 50_000];
    to_device(&dst, &vec![0u8; 70_000]);
    let iov = [
        RawIov::of_mut(&mut host),
        RawIov {
            addr: dst.as_ptr() as usize,
            len: 70_000,
        },
    ];
    let rma_iov = [
        RmaIov {
            addr: base + a as u64,
            len: 60_000,
            key,
        },
        RmaIov {
            addr: base + b as u64,
            len: 60_000,
            key,
        },
    ];
    let msg = MsgRma {
        iov: &iov,
        desc: &[],
        addr: peer,
        rma_iov: &rma_iov,
        context: 30,
        data: 0,
    };
    // SAFETY: both local segments outlive the completion.
    unsafe { n.ep.readmsg(&msg, 0) }.unwrap();
    assert_eq!(n.wait_one().op_context, 30);
    assert!(host[..] == want[..50_000], "readmsg: host part differs");
    assert!(
        from_device(&dst, 70_000) == want[50_000..],
        "readmsg: device part differs"
    );

    // The target's copy out of its device memory fails: an FI_EIO completion, not a panic.
    if let Some((skey, sbase)) = short {
        let mut host = [0u8; 200];
        // SAFETY: host outlives the completion.
        unsafe { n.ep.read(&mut host, None, peer, sbase + 4000, skey, 31) }.unwrap();
        let e = n.wait_err();
        assert_eq!((e.op_context, e.err), (31, libc::EIO), "{e:?}");
    }
    drop(dst);
}

/// Posts with `post` (retrying while it says Again) and waits for its completion.
fn done(n: &Node, ctx: Context, post: impl FnMut() -> Result<()>) {
    n.retry(post);
    assert_eq!(n.wait_one().op_context, ctx);
}

/// The double's counts of device-to-host copies and of host-to-device copies landed; `None` on
/// a real driver.
fn copies() -> Option<(i32, i32)> {
    Some((
        double_counter("cuda_double_dtoh_copies")?,
        double_counter("cuda_double_htod_landed")?,
    ))
}

/// Runs `op`, and on the double checks that it copied out of and into device memory through
/// the driver as often as `want` says: device buffers are staged, never reached through a
/// host pointer (which the double, unlike a GPU, would allow).
fn copying(what: &str, want: (i32, i32), op: impl FnOnce()) {
    let before = copies();
    op();
    if let (Some(b), Some(a)) = (before, copies()) {
        assert_eq!(
            (a.0 - b.0, a.1 - b.1),
            want,
            "{what}: (out of, into) the device"
        );
    }
}

/// Atomics on the peer's device words (key `key` at `base`), with operands and results in host
/// memory and in local CUDA memory. Returns whether the failing-copy cases ran (the double).
fn atomics(n: &Node, peer: FiAddr, key: u64, base: u64, short: Option<(u64, u64)>) -> bool {
    use AtomicOp::*;
    use Datatype::*;
    let at = |w: usize| base + 8 * w as u64;
    let local = cuda().alloc_device(0, 4096).expect("local device buffer");
    // Device views of `len` bytes at `off` in `local`; only handed to the endpoint.
    // SAFETY (both): `local` outlives every operation below.
    let dev = |off: usize, len: usize| unsafe {
        std::slice::from_raw_parts(local.as_ptr().wrapping_add(off), len)
    };
    let dev_mut = |off: usize, len: usize| unsafe {
        std::slice::from_raw_parts_mut(local.as_ptr().wrapping_add(off), len)
    };
    let local_word = |off: usize| word(&from_device(&local, off + 8)[off..], 0);
    let mut res = [0u8; 8];

    // Host operands and results on device words: sum, fetch-add, compare-swap, f64, i32 x 2.
    let (five, seven) = (u64s(&[5]), u64s(&[7]));
    for _ in 0..3 {
        // SAFETY: the operand outlives the completion.
        done(n, 40, || unsafe {
            n.ep.atomic(&five, 1, None, peer, at(0), key, UInt64, Sum, 40)
        });
    }
    for want in [1000, 1007] {
        // SAFETY: operand and result outlive the completion.
        done(n, 41, || unsafe {
            n.ep.fetch_atomic(&seven, 1, &mut res, peer, at(1), key, UInt64, Sum, 41)
        });
        assert_eq!(u64::from_ne_bytes(res), want, "fetch-add");
    }
    for (compare, operand, want) in [(42, 99, 42), (42, 1, 99)] {
        let (operand, compare) = (u64s(&[operand]), u64s(&[compare]));
        // SAFETY: as above.
        done(n, 42, || unsafe {
            n.ep.compare_atomic(
                &operand,
                1,
                &compare,
                &mut res,
                peer,
                at(2),
                key,
                UInt64,
                Cswap,
                42,
            )
        });
        assert_eq!(u64::from_ne_bytes(res), want, "compare-swap");
    }
    let (f1, f2) = (2.25f64.to_ne_bytes(), 0.25f64.to_ne_bytes());
    // SAFETY: as above.
    done(n, 43, || unsafe {
        n.ep.atomic(&f1, 1, None, peer, at(3), key, Double, Sum, 43)
    });
    // SAFETY: as above.
    done(n, 43, || unsafe {
        n.ep.fetch_atomic(&f2, 1, &mut res, peer, at(3), key, Double, Sum, 43)
    });
    assert_eq!(f64::from_ne_bytes(res), 3.75, "f64 fetch-add");
    let mut pair = [0u8; 8];
    let ops: Vec<u8> = [-3i32, 4].iter().flat_map(|v| v.to_ne_bytes()).collect();
    // SAFETY: as above.
    done(n, 44, || unsafe {
        n.ep.fetch_atomic(&ops, 2, &mut pair, peer, at(4), key, Int32, Sum, 44)
    });
    let got = [0, 4].map(|o| i32::from_ne_bytes(pair[o..o + 4].try_into().unwrap()));
    assert_eq!(got, [10, 20], "i32 fetch-add");

    // Local device buffers: an atomic read into one, then operands, compares and results.
    copying("atomic read into device memory", (0, 1), || {
        // SAFETY: the result outlives the completion.
        done(n, 50, || unsafe {
            n.ep.fetch_atomic(&[], 1, dev_mut(0, 8), peer, at(0), key, UInt64, Read, 50)
        });
    });
    assert_eq!(local_word(0), 115, "atomic read into device memory");
    to_device_at(&local, 64, &u64s(&[8]));
    copying("device operand and result", (1, 1), || {
        // SAFETY: as above.
        done(n, 51, || unsafe {
            n.ep.fetch_atomic(
                dev(64, 8),
                1,
                dev_mut(72, 8),
                peer,
                at(5),
                key,
                UInt64,
                Sum,
                51,
            )
        });
    });
    assert_eq!(local_word(72), 50, "fetch-add, device operand and result");
    to_device_at(&local, 128, &u64s(&[70, 7]));
    copying("device operand, compare and result", (2, 1), || {
        // SAFETY: as above.
        done(n, 52, || unsafe {
            n.ep.compare_atomic(
                dev(128, 8),
                1,
                dev(136, 8),
                dev_mut(144, 8),
                peer,
                at(6),
                key,
                UInt64,
                Cswap,
                52,
            )
        });
    });
    assert_eq!(local_word(144), 7, "compare-swap, device buffers");
    to_device_at(&local, 192, &u64s(&[2, 11]));
    copying("device operand", (1, 0), || {
        // SAFETY: as above.
        done(n, 53, || unsafe {
            n.ep.atomic(dev(192, 8), 1, None, peer, at(7), key, UInt64, Sum, 53)
        });
    });
    // An inject copies its device operand during the call; the read behind it sees it.
    copying("inject", (1, 0), || {
        n.retry(|| {
            n.ep.inject_atomic(dev(200, 8), 1, peer, at(8), key, UInt64, Sum)
        })
    });
    copying("read behind the inject", (0, 0), || {
        // SAFETY: as above.
        done(n, 54, || unsafe {
            n.ep.fetch_atomic(&[], 1, &mut res, peer, at(8), key, UInt64, Read, 54)
        });
    });
    assert_eq!(u64::from_ne_bytes(res), 11, "inject with a device operand");
    let one = u64s(&[1]);
    copying("device result", (0, 1), || {
        // SAFETY: as above.
        done(n, 55, || unsafe {
            n.ep.fetch_atomic(&one, 1, dev_mut(256, 8), peer, at(9), key, UInt64, Sum, 55)
        });
    });
    assert_eq!(local_word(256), 5, "host operand, device result");
    to_device_at(&local, 320, &u64s(&[3]));
    copying("device operand, host result", (1, 0), || {
        // SAFETY: as above.
        done(n, 56, || unsafe {
            n.ep.fetch_atomic(dev(320, 8), 1, &mut res, peer, at(10), key, UInt64, Sum, 56)
        });
    });
    assert_eq!(u64::from_ne_bytes(res), 9, "device operand, host result");

    let Some((skey, sbase)) = short else {
        return false;
    };
    // Copies the driver refuses (8 bytes across the end of an allocation).
    // The fetched value cannot land: the completion is FI_EIO, and the driver's reason is kept.
    // SAFETY: the result view is only handed to the endpoint (and to the driver).
    unsafe {
        n.ep.fetch_atomic(
            &one,
            1,
            dev_mut(4092, 8),
            peer,
            at(11),
            key,
            UInt64,
            Sum,
            57,
        )
    }
    .unwrap();
    let e = n.wait_err();
    assert_eq!((e.op_context, e.err), (57, libc::EIO), "{e:?}");
    assert!(!n.ep.core().take_staging_errors().is_empty());
    // An operand that cannot be read is refused at the call.
    // SAFETY: as above.
    let r = unsafe {
        n.ep.atomic(dev(4092, 8), 1, None, peer, at(12), key, UInt64, Sum, 58)
    };
    assert!(r.is_err(), "an unreadable device operand was posted");
    // The target's copy of its device words fails: FI_EIO, and the target lives on.
    // SAFETY: the operand outlives the completion.
    unsafe {
        n.ep.atomic(&one, 1, None, peer, sbase + 4092, skey, UInt64, Sum, 59)
    }
    .unwrap();
    let e = n.wait_err();
    assert_eq!((e.op_context, e.err), (59, libc::EIO), "{e:?}");
    drop(local);
    true
}

/// Writes into the peer's device window and reads the range back at once, without waiting
/// for the write: with FI_ORDER_RAW (which shm offers) the read sees the write.
fn read_after_write(n: &Node, peer: FiAddr, key: u64, base: u64) {
    for (i, len) in [100, 100_000, 1 << 20].into_iter().enumerate() {
        let addr = base + 8192;
        let out = pattern(len, 500 + i as u64);
        let mut back = vec![0u8; len];
        // SAFETY: both buffers outlive the completions awaited below.
        unsafe { n.ep.write(&out, None, peer, addr, key, 60) }.unwrap();
        // SAFETY: as above.
        unsafe { n.ep.read(&mut back, None, peer, addr, key, 61) }.unwrap();
        n.wait_n(2);
        assert!(
            back == out,
            "a read of {len} bytes did not see the write before it"
        );
    }
}

fn initiator(test: &str) {
    let n = node(CAPS, Progress::Manual);
    let mut child = spawn(test, "target", &[]);
    let peer = connect(&mut child, &n);
    let f: Vec<u64> = child
        .hear()
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    let short = (f[4] != 0).then_some((f[4], f[5]));
    let raw_only = test == RAW_NAME;
    let short_checked = if raw_only {
        read_after_write(&n, peer, f[0], f[1]);
        false
    } else {
        reads(&n, peer, f[0], f[1], short);
        atomics(&n, peer, f[2], f[3], short)
    };
    child.tell("done");
    let words = unhex(&child.hear());
    let want = area(!raw_only, short_checked);
    for w in 0..13 {
        assert_eq!(
            word(&words, w),
            word(&want, w),
            "device word {w} at the target"
        );
    }
    assert!(words == want, "the target's device words differ");
    assert_eq!(child.hear(), "OK");
    child.join();
    assert!(cuda().take_drop_errors().is_empty());
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
fn cuda_double_rma_device_memory() {
    const NAME: &str = "cuda_double_rma_device_memory";
    if run_roles(NAME) {
        return;
    }
    run_child(NAME, "initiator", &double_env(), &[]);
}

/// Without cross-memory attach every read comes back through the ring (RDATA).
#[test]
fn cuda_double_rma_device_memory_without_cma() {
    const NAME: &str = "cuda_double_rma_device_memory_without_cma";
    if run_roles(NAME) {
        return;
    }
    run_child(
        NAME,
        "initiator",
        &double_env(),
        &[("XFABRIC_SHM_CMA", "0")],
    );
}

const RAW_NAME: &str = "cuda_double_device_read_after_write";

#[test]
fn cuda_double_device_read_after_write() {
    if run_roles(RAW_NAME) {
        return;
    }
    run_child(RAW_NAME, "initiator", &double_env(), &[]);
    run_child(
        RAW_NAME,
        "initiator",
        &double_env(),
        &[("XFABRIC_SHM_CMA", "0")],
    );
}

#[test]
#[cfg_attr(
    not(xfabric_gpu_tests),
    ignore = "needs an NVIDIA GPU (and libnvrtc): run with XFABRIC_GPU_TESTS=1 cargo test"
)]
fn gpu_rma_device_memory() {
    const NAME: &str = "gpu_rma_device_memory";
    if run_roles(NAME) {
        return;
    }
    run_child(NAME, "initiator", &[], &[]);
}
