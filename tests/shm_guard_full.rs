//! The table of guarded segment mappings full (a process that mapped as many segments as it
//! guards, say by peers naming planted segments): no further segment is mapped unguarded, where
//! one truncated by its owner would have killed this process with SIGBUS. A segment mapped
//! while the table is full is refused, with nothing left in /dev/shm; once slots come back,
//! mapping works again. Its own test binary: the table is the process's.

mod common;

use common::*;
use xfabric::providers::shm::raw::{GuardFiller, RawPeer};
use xfabric::providers::shm::segment::{PREFIX, SHM_DIR};
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_TAGGED;

/// This process's segments in /dev/shm (named with its pid: other processes' segments, a
/// test or a benchmark running beside this one, come and go as they like).
fn ours() -> usize {
    let mine = format!("{PREFIX}{}-", std::process::id());
    std::fs::read_dir(SHM_DIR)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with(&mine))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn a_full_guard_table_maps_no_segment_unguarded() {
    let n = node(CAPS, Progress::Manual);
    let addr = n.ep.getname().expect("getname");
    let before = ours();
    let full = GuardFiller::fill();
    match RawPeer::connect(&addr, None) {
        Err(Error::Again(why)) => assert!(why.contains("guarded"), "{why}"),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a segment was mapped with the guard table full"),
    }
    assert_eq!(ours(), before, "a refused segment was left in {SHM_DIR}");
    drop(full);
    let raw = RawPeer::connect(&addr, None).expect("a segment once slots came back");
    drop(raw);
}
