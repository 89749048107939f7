//! The CPU XPU through the public API, and the CUDA header agreeing with Rust's view of the ABI.
//! Always runs.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use xfabric_core::{Datatype, TriggerValue, TriggerVar};
use xfabric_kernels::cpu::{pattern, ring};
use xfabric_kernels::{trigger_header, CpuXpu, ENTRY_POINTS, KERNELS_SOURCE};

#[test]
fn header_constants_match_fi_datatype() {
    let h = trigger_header();
    for (name, d) in [
        ("XF_UINT8", Datatype::UInt8),
        ("XF_UINT16", Datatype::UInt16),
        ("XF_UINT32", Datatype::UInt32),
        ("XF_UINT64", Datatype::UInt64),
    ] {
        let line = format!("#define {name} {}", d as i32);
        assert!(h.contains(&line), "header lacks `{line}`");
    }
    assert!(h.contains("struct fi_trigger_var {"));
    assert!(h.contains("sizeof(struct fi_trigger_var) == 24"));
    assert_eq!(std::mem::size_of::<TriggerVar>(), 24);
    for entry in ENTRY_POINTS {
        assert!(
            KERNELS_SOURCE.contains(&format!("extern \"C\" __global__ void {entry}(")),
            "{entry}"
        );
    }
}

/// A watcher thread sees a 32-bit doorbell rise through every value, in order, with each
/// bucket's data in place by then: the provider's view of a CPU XPU.
#[test]
fn a_watcher_sees_every_bucket_in_order() {
    const BUCKETS: u32 = 16;
    const ELEMS: u32 = 4096;
    let mut out = vec![0u32; (BUCKETS * ELEMS) as usize];
    let bell = AtomicU32::new(0);
    let vars: Vec<TriggerVar> = (0..BUCKETS)
        .map(|k| TriggerVar {
            datatype: Datatype::UInt32 as i32,
            count: 1,
            addr: bell.as_ptr().cast(),
            value: TriggerValue { val32: k + 1 },
        })
        .collect();
    let outp = out.as_mut_ptr();
    // SAFETY: `out` and `bell` outlive the join; buckets are read only once rung.
    let worker =
        unsafe { CpuXpu::new().compute_and_trigger(outp, ELEMS, BUCKETS, 99, vars) }.unwrap();
    let start = Instant::now();
    let mut seen = 0;
    while seen < BUCKETS {
        let now = bell.load(Ordering::Acquire);
        assert!(now >= seen);
        for k in seen..now {
            let i = ((k + 1) * ELEMS - 1) as usize;
            // SAFETY: bucket k was rung; its last element is final.
            assert_eq!(unsafe { outp.add(i).read() }, pattern(i as u64, 99));
        }
        seen = now;
        assert!(start.elapsed() < Duration::from_secs(30), "stuck at {seen}");
        std::thread::yield_now();
    }
    worker.join().unwrap().unwrap();
    assert_eq!(out[5], pattern(5, 99));
}

#[test]
fn ring_runs_in_list_order() {
    // Two variables on one word: the later one wins, as in-order stores must leave it.
    let bell = AtomicU32::new(0);
    let v = |x: u32| TriggerVar {
        datatype: Datatype::UInt32 as i32,
        count: 1,
        addr: bell.as_ptr().cast(),
        value: TriggerValue { val32: x },
    };
    // SAFETY: `bell` is live and only accessed atomically.
    unsafe { ring(&[v(1), v(2), v(3)]) }.unwrap();
    assert_eq!(bell.load(Ordering::Acquire), 3);
}
