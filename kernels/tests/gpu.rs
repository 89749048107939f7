//! xfabric's kernels on a real GPU, selected with `XFABRIC_GPU_TESTS=1` (skipped with the
//! reason otherwise): doorbells in mapped host memory (xfabric-hmem), rung by `xf_signal` and by
//! `xf_compute_and_trigger`, observed from the host as a provider's watcher observes them.
//! Without a GPU, opening one must say why and not panic.

#![cfg(feature = "cuda")]

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use xfabric_core::{Datatype, TriggerValue, TriggerVar};
use xfabric_hmem::{Cuda, HmemIface};
use xfabric_kernels::cpu::pattern;
use xfabric_kernels::{GpuXpu, KernelError, Work};

const GPU_ENV: &str = "XFABRIC_GPU_TESTS";
const DEADLINE: Duration = Duration::from_secs(30);

/// The GPU and the mapped-memory interface (these tests run only where one is: see build.rs).
fn open() -> (GpuXpu, Cuda) {
    let gpu = GpuXpu::open(0).unwrap_or_else(|e| panic!("{GPU_ENV}=1 but {e}"));
    let cuda = Cuda::new();
    cuda.available()
        .unwrap_or_else(|u| panic!("{GPU_ENV}=1 but {u}"));
    println!(
        "GPU 0: compute capability {:?}, PTX {:?}",
        gpu.compute_capability(),
        gpu.ptx().origin()
    );
    (gpu, cuda)
}

fn var(datatype: Datatype, count: i32, addr: u64, value: TriggerValue) -> TriggerVar {
    TriggerVar {
        datatype: datatype as i32,
        count,
        addr: addr as *mut c_void,
        value,
    }
}

#[test]
fn without_a_gpu_open_is_unavailable_and_nothing_panics() {
    match GpuXpu::open(0) {
        Ok(g) => println!("skipped: a GPU is present here ({g:?})"),
        Err(e) => {
            println!("GPU unavailable as expected: {e}");
            assert!(
                matches!(e, KernelError::Unavailable { .. }),
                "no GPU should read as unavailable: {e}"
            );
            assert!(matches!(
                xfabric_core::Error::from(e),
                xfabric_core::Error::NoSys(_)
            ));
        }
    }
}

#[test]
#[cfg_attr(
    not(xfabric_gpu_tests),
    ignore = "needs an NVIDIA GPU (and libnvrtc): run with XFABRIC_GPU_TESTS=1 cargo test"
)]
fn gpu_signal_stores_each_width_in_mapped_memory() {
    let (gpu, cuda) = open();
    let bells = cuda.alloc_host_mapped(0, 64).unwrap();
    let d = bells.device_addr();
    let mut payload = *b"fedcba9876543210";
    // The u64 goes last: once the host sees it, every earlier variable has landed.
    let vars = [
        var(Datatype::UInt8, 1, d + 14, TriggerValue { val8: 0x5a }),
        var(Datatype::UInt16, 1, d + 12, TriggerValue { val16: 0xbeef }),
        var(
            Datatype::UInt32,
            1,
            d + 8,
            TriggerValue { val32: 0xdead_beef },
        ),
        var(
            Datatype::UInt8,
            16,
            d + 16,
            TriggerValue {
                data: payload.as_mut_ptr(),
            },
        ),
        var(Datatype::UInt64, 1, d, TriggerValue { val64: 7 }),
    ];
    // SAFETY: the byte array is live.
    let dv = unsafe { gpu.upload_vars(&vars) }.unwrap();
    assert_eq!(dv.len(), 5);
    // SAFETY: every address is inside `bells`, which outlives the synchronize below.
    unsafe { gpu.signal(&dv) }.unwrap();
    let last = bells.atomic_u64(0).unwrap();
    let start = Instant::now();
    while last.load(Ordering::Acquire) != 7 {
        assert!(start.elapsed() < DEADLINE, "the doorbell was never rung");
        std::hint::spin_loop();
    }
    let host = bells.as_ptr();
    // SAFETY: the kernel's stores were fenced before the last doorbell, which was seen.
    unsafe {
        assert_eq!(host.add(14).read_volatile(), 0x5a);
        assert_eq!(host.add(12).cast::<u16>().read_volatile(), 0xbeef);
        assert_eq!(host.add(8).cast::<u32>().read_volatile(), 0xdead_beef);
        let bytes: Vec<u8> = (0..16).map(|i| host.add(16 + i).read_volatile()).collect();
        assert_eq!(bytes, b"fedcba9876543210");
        assert_eq!(
            host.add(15).read_volatile(),
            0,
            "a byte store touched its neighbour"
        );
    }
    gpu.synchronize().unwrap();
    drop(dv);
    bells.free().unwrap();
}

#[test]
#[cfg_attr(
    not(xfabric_gpu_tests),
    ignore = "needs an NVIDIA GPU (and libnvrtc): run with XFABRIC_GPU_TESTS=1 cargo test"
)]
fn gpu_compute_and_trigger_rings_buckets_in_order_after_their_data() {
    const BUCKETS: u32 = 64;
    const ELEMS: u32 = 4096;
    const SEED: u32 = 0x00c0_ffee;
    let (gpu, cuda) = open();
    let out = cuda
        .alloc_host_mapped(0, (BUCKETS * ELEMS) as usize * 4)
        .unwrap();
    let bell_mem = cuda.alloc_host_mapped(0, 8).unwrap();
    let bell: &AtomicU64 = bell_mem.atomic_u64(0).unwrap();
    // One doorbell for the endpoint: bucket k's trigger stores k + 1.
    let vars: Vec<TriggerVar> = (0..BUCKETS)
        .map(|k| {
            var(
                Datatype::UInt64,
                1,
                bell_mem.device_addr(),
                TriggerValue {
                    val64: k as u64 + 1,
                },
            )
        })
        .collect();
    // SAFETY: no byte arrays.
    let dv = unsafe { gpu.upload_vars(&vars) }.unwrap();
    // SAFETY: `out` holds BUCKETS * ELEMS u32s and is read only per rung bucket; the doorbell
    // outlives the synchronize below.
    unsafe { gpu.compute_and_trigger(out.device_addr(), ELEMS, BUCKETS, SEED, Work::ONCE, &dv) }
        .unwrap();

    let host = out.as_ptr().cast::<u32>();
    let start = Instant::now();
    let mut seen = 0u64;
    let mut steps = 0;
    while seen < BUCKETS as u64 {
        let now = bell.load(Ordering::Acquire);
        assert!(now >= seen, "doorbell went backwards: {now} after {seen}");
        assert!(
            now <= BUCKETS as u64,
            "doorbell beyond what was armed: {now}"
        );
        if now > seen {
            steps += 1;
        }
        for k in seen..now {
            let base = k as usize * ELEMS as usize;
            for j in 0..ELEMS as usize {
                // SAFETY: bucket k's doorbell was seen, so its data is visible and final.
                let x = unsafe { host.add(base + j).read_volatile() };
                assert_eq!(
                    x,
                    pattern((base + j) as u64, SEED),
                    "bucket {k} element {j}"
                );
            }
        }
        seen = now;
        assert!(start.elapsed() < DEADLINE, "stuck at doorbell {seen}");
        std::hint::spin_loop();
    }
    println!("doorbell reached {BUCKETS} in {steps} observed steps");
    gpu.synchronize().unwrap();

    // A second launch with fresh values reuses nothing stale (scratch is per launch).
    let vars2: Vec<TriggerVar> = (0..BUCKETS)
        .map(|k| {
            var(
                Datatype::UInt64,
                1,
                bell_mem.device_addr(),
                TriggerValue {
                    val64: BUCKETS as u64 + k as u64 + 1,
                },
            )
        })
        .collect();
    // SAFETY: as above.
    let dv2 = unsafe { gpu.upload_vars(&vars2) }.unwrap();
    // SAFETY: as above.
    unsafe {
        gpu.compute_and_trigger(
            out.device_addr(),
            ELEMS,
            BUCKETS,
            SEED ^ 1,
            Work::ONCE,
            &dv2,
        )
    }
    .unwrap();
    gpu.synchronize().unwrap();
    assert_eq!(bell.load(Ordering::Acquire), 2 * BUCKETS as u64);
    drop((dv, dv2));
    out.free().unwrap();
    bell_mem.free().unwrap();

    // Shapes are checked before anything is launched.
    // SAFETY: no byte arrays.
    let one = unsafe { gpu.upload_vars(&vars[..1]) }.unwrap();
    // SAFETY: refused before launching.
    let e = unsafe { gpu.compute_and_trigger(4096, ELEMS, 2, SEED, Work::ONCE, &one) }.unwrap_err();
    assert!(matches!(e, KernelError::Inval { .. }), "{e}");
}

#[test]
#[cfg_attr(
    not(xfabric_gpu_tests),
    ignore = "needs an NVIDIA GPU (and libnvrtc): run with XFABRIC_GPU_TESTS=1 cargo test"
)]
fn gpu_compute_passes_write_the_same_bytes_and_take_longer() {
    const BUCKETS: u32 = 16;
    const ELEMS: u32 = 2048;
    const SEED: u32 = 0x5eed;
    let (gpu, cuda) = open();
    let out = cuda
        .alloc_host_mapped(0, (BUCKETS * ELEMS) as usize * 4)
        .unwrap();
    let host = out.as_ptr().cast::<u32>();
    let mut times = Vec::new();
    for work in [
        Work::ONCE,
        Work {
            passes: 64,
            staggered: false,
        },
        Work {
            passes: 64,
            staggered: true,
        },
    ] {
        // SAFETY: nothing else touches `out` until the kernel ran; it outlives the synchronize.
        unsafe { std::ptr::write_bytes(host, 0, (BUCKETS * ELEMS) as usize) };
        let t0 = Instant::now();
        // SAFETY: as above.
        unsafe { gpu.compute(out.device_addr(), ELEMS, BUCKETS, SEED, work) }.unwrap();
        gpu.synchronize().unwrap();
        times.push(t0.elapsed());
        for i in 0..(BUCKETS * ELEMS) as usize {
            // SAFETY: the kernel finished.
            let x = unsafe { host.add(i).read_volatile() };
            assert_eq!(x, pattern(i as u64, SEED), "{work:?}: element {i}");
        }
    }
    println!("xf_compute once / 64 passes / 64 staggered: {times:?}");
    assert!(
        times[2] > times[1],
        "the staggered passes took no longer: {times:?}"
    );
    out.free().unwrap();
}
