//! The completion queue's own cost: a provider's push followed by the application's read, one
//! entry at a time and in batches, with no endpoint bound (so no progress runs).
//!
//! ```text
//! cargo bench --bench cq
//! ```

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use xfabric::*;

fn open(format: CqFormat) -> CompletionQueue {
    CompletionQueue::open(&CqAttr {
        format,
        size: 1024,
        ..Default::default()
    })
    .expect("cq open")
}

fn entry(i: usize) -> CqTaggedEntry {
    CqTaggedEntry {
        op_context: i,
        flags: FI_RECV | FI_MSG,
        len: 8,
        ..Default::default()
    }
}

fn push_read(c: &mut Criterion) {
    let mut g = c.benchmark_group("cq_push_read");
    for batch in [1usize, 16] {
        g.throughput(Throughput::Elements(batch as u64));

        let cq = open(CqFormat::Tagged);
        let mut out = vec![CqTaggedEntry::default(); batch];
        g.bench_with_input(BenchmarkId::new("tagged", batch), &batch, |b, &n| {
            b.iter(|| {
                for i in 0..n {
                    assert!(cq.inner().push(entry(i), FI_ADDR_NOTAVAIL));
                }
                let got = cq.read(black_box(&mut out[..])).expect("read");
                assert_eq!(got, n);
            })
        });

        // The narrowest format, so the cost of narrowing shows against the tagged read.
        let cq = open(CqFormat::Context);
        let mut out = vec![CqEntry::default(); batch];
        g.bench_with_input(BenchmarkId::new("context", batch), &batch, |b, &n| {
            b.iter(|| {
                for i in 0..n {
                    assert!(cq.inner().push(entry(i), FI_ADDR_NOTAVAIL));
                }
                let got = cq.read(black_box(&mut out[..])).expect("read");
                assert_eq!(got, n);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, push_read);
criterion_main!(benches);
