//! Data integrity across two real processes at every power-of-two size up to 64 MiB, through
//! both the cross-memory-attach path and the pipelined ring path.

mod common;
use common::*;
use xfabric::*;

const MAX_LOG: u32 = 26; // 64 MiB

fn sizes() -> Vec<usize> {
    let mut v = vec![0usize, 1, 7];
    v.extend((0..=MAX_LOG).map(|i| 1usize << i));
    v.extend([4095, 8193, 16384, 16385, 100_000]);
    v
}

/// Child: receives every size, checks the pattern, and echoes it back.
fn echo_role() {
    let n = node(FI_MSG | FI_TAGGED, Progress::Manual);
    say(&hex(&n.ep.getname().unwrap()));
    let peer = n.add_peer(&unhex(&listen()));
    for (i, &len) in sizes().iter().enumerate() {
        let mut buf = vec![0u8; len];
        // SAFETY: buf lives until the completion below.
        unsafe { n.ep.trecv(&mut buf, None, peer, i as u64, 0, 1) }.unwrap();
        let c = n.wait_one();
        assert_eq!(c.len, len);
        assert_eq!(c.tag, i as u64);
        assert!(buf == pattern(len, i as u64), "corrupt data at {len} bytes");
        // SAFETY: buf lives until the completion below.
        unsafe { n.ep.tsend(&buf, None, peer, i as u64, 2) }.unwrap();
        n.wait_one();
    }
}

fn run(test: &str, envs: &[(&str, &str)]) {
    let mut child = spawn(test, "echo", envs);
    let n = node(FI_MSG | FI_TAGGED, Progress::Manual);
    let peer = n.add_peer(&unhex(&child.hear()));
    child.tell(&hex(&n.ep.getname().unwrap()));
    for (i, &len) in sizes().iter().enumerate() {
        let out = pattern(len, i as u64);
        let mut back = vec![0u8; len];
        // SAFETY: both buffers live until both completions are read.
        unsafe {
            n.ep.trecv(&mut back, None, peer, i as u64, 0, 10).unwrap();
            n.ep.tsend(&out, None, peer, i as u64, 11).unwrap();
        }
        let done = n.wait_n(2);
        assert!(done.iter().any(|c| c.op_context == 10 && c.len == len));
        assert!(back == out, "echo differs at {len} bytes");
    }
    child.join();
}

#[test]
fn every_size_cross_memory_attach() {
    if role().is_some() {
        return echo_role();
    }
    run("every_size_cross_memory_attach", &[]);
}

#[test]
fn every_size_pipelined_without_cma() {
    if role().is_some() {
        return echo_role();
    }
    run(
        "every_size_pipelined_without_cma",
        &[("XFABRIC_SHM_CMA", "0")],
    );
}
