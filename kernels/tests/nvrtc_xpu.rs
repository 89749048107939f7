//! The device API's header (`xfabric/fi_xpu_device.h`, with `fi_xpu_abi.h`) through NVRTC,
//! wherever libnvrtc loads (no GPU needed): a kernel calling every device call at every scope
//! compiles for the oldest architecture CUDA 13 supports and for Hopper, and the PTX has the
//! system-scope atomics and fences, the warp shuffle and the block barrier the protocol and
//! the scopes need. Skipped with the reason where libnvrtc is absent
//! (scripts/nvrtc-check.sh puts one on the path; `--test nvrtc_xpu` after it).

#![cfg(feature = "cuda")]

use xfabric_kernels::nvrtc::{self, CompileOptions, Header};

const ABI: &str = include_str!("../cuda/xfabric/fi_xpu_abi.h");
const DEVICE: &str = include_str!("../cuda/xfabric/fi_xpu_device.h");

/// Every call, each scope, run-time sizes, peers and tags.
const USER: &str = r#"
#include "xfabric/fi_xpu_device.h"

extern "C" __global__ void xpu_calls(struct fid_xpu_ep *ep, struct fid_xpu_cq *cq,
                                     struct fid_xpu_cntr *cntr, char *buf, void *desc,
                                     void *peers, unsigned long long raddr,
                                     unsigned long long rkey, long long *out)
{
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    void *peer = (char *)peers + 8 * (i % 4);
    long long r = 0;
    r += fi_xpu_tsend(ep, buf + i, 1 + i % 7, desc, 0, peer, 0x100 + i, 0, 0, FI_XPU_WORK_ITEM);
    r += fi_xpu_send(ep, buf, 64, desc, 0, peer, 0, 0, FI_XPU_SUBGROUP);
    r += fi_xpu_recv(ep, buf, 64, desc, 0, 0, 0, FI_XPU_WORK_GROUP);
    r += fi_xpu_trecv(ep, buf, 64, desc, peer, 7, 0, 0, 0, FI_XPU_WORK_ITEM);
    r += fi_xpu_write(ep, buf, 8, desc, i, peer, raddr + 8 * i, rkey, 0, 1ULL << 11,
                      FI_XPU_WORK_ITEM);
    r += fi_xpu_read(ep, buf, 8, desc, peer, raddr, rkey, 0, 0, FI_XPU_WORK_ITEM);
    r += fi_xpu_atomic(ep, buf, 1, desc, peer, raddr, rkey, 7, 2, 0, 0, FI_XPU_WORK_ITEM);
    r += fi_xpu_fetch_atomic(ep, buf, 1, desc, buf + 8, desc, peer, raddr, rkey, 7, 2, 0, 0,
                             FI_XPU_SUBGROUP);
    r += fi_xpu_compare_atomic(ep, buf, 1, desc, buf + 16, desc, buf + 24, desc, peer, raddr,
                               rkey, 7, 17, 0, 0, FI_XPU_WORK_GROUP);
    r += fi_xpu_tx_flush(ep, 0, FI_XPU_WORK_ITEM);
    r += fi_xpu_cntr_add(cntr, 1, FI_XPU_WORK_GROUP);
    r += fi_xpu_cntr_set(cntr, 2, FI_XPU_WORK_ITEM);
    r += fi_xpu_cntr_adderr(cntr, 1, FI_XPU_SUBGROUP);
    r += fi_xpu_cntr_seterr(cntr, 0, FI_XPU_WORK_ITEM);
    r += (long long)fi_xpu_cntr_read(cntr, FI_XPU_SUBGROUP);
    r += (long long)fi_xpu_cntr_readerr(cntr, FI_XPU_WORK_ITEM);
    r += fi_xpu_cntr_wait(cntr, 3, 10, FI_XPU_WORK_GROUP);
    struct xf_xpu_cq_tagged_entry e[4];
    unsigned long long src[4];
    struct xf_xpu_cq_err_entry err;
    r += fi_xpu_cq_read(cq, e, 4, FI_XPU_WORK_GROUP);
    r += fi_xpu_cq_readfrom(cq, e, 4, src, FI_XPU_SUBGROUP);
    r += fi_xpu_cq_readerr(cq, &err, 0, FI_XPU_WORK_ITEM);
    r += fi_xpu_send(ep, buf, 1, desc, 0, peer, 0, 0, FI_XPU_DEVICE); /* -FI_EOPNOTSUPP */
    out[i] = r + (long long)e[0].tag + (long long)err.prov_errno + (long long)src[0];
}
"#;

#[test]
fn device_header_compiles_with_nvrtc() {
    let version = match nvrtc::probe() {
        Ok(v) => v,
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
    };
    println!("NVRTC {}.{}", version.0, version.1);
    let headers = [
        Header {
            name: "xfabric/fi_xpu_device.h",
            source: DEVICE,
        },
        Header {
            name: "fi_xpu_abi.h",
            source: ABI,
        },
    ];
    for (major, minor) in [(7, 5), (9, 0)] {
        let opts = CompileOptions::for_compute_capability(major, minor);
        let ptx = nvrtc::compile("xpu_calls.cu", USER, &headers, &opts)
            .unwrap_or_else(|e| panic!("sm_{major}{minor}: {e}"));
        assert_eq!(ptx.entry_points(), ["xpu_calls"]);
        let text = ptx.as_str();
        // Credit, tail and the CQ head's claim: system-scope atomics.
        assert!(
            text.contains("atom.sys") || text.contains(".sys.global"),
            "sm_{major}{minor}"
        );
        assert!(text.contains("cas"), "the CQ head's compare-and-swap");
        // The publishing store's fence, the scopes' shuffle and barrier, the wait's clock.
        assert!(text.contains("membar.sys") || text.contains("fence.sc.sys"));
        assert!(text.contains("shfl.sync"));
        assert!(text.contains("bar.sync") || text.contains("barrier.sync"));
        assert!(text.contains("globaltimer"));
    }
}

/// xfabric's own device-API kernels (what `GpuXpuApi` launches): they compile for the oldest
/// architecture and for Hopper, every entry point is there, and their posts are the header's
/// (system-scope atomics, the fence before publishing, the clock for retries and waits).
#[test]
fn device_api_kernels_compile_with_nvrtc() {
    if let Err(e) = nvrtc::probe() {
        println!("skipped: {e}");
        return;
    }
    for (major, minor) in [(7, 5), (9, 0)] {
        let opts = CompileOptions::for_compute_capability(major, minor);
        let ptx = nvrtc::compile(
            xfabric_kernels::XPU_KERNELS_SOURCE_NAME,
            xfabric_kernels::XPU_KERNELS_SOURCE,
            &xfabric_kernels::device_api_headers(),
            &opts,
        )
        .unwrap_or_else(|e| panic!("sm_{major}{minor}: {e}"));
        let mut entries = ptx.entry_points();
        entries.sort_unstable();
        let mut want = xfabric_kernels::XPU_ENTRY_POINTS.to_vec();
        want.sort_unstable();
        assert_eq!(entries, want, "sm_{major}{minor}");
        let text = ptx.as_str();
        assert!(text.contains("atom.sys") || text.contains(".sys.global"));
        assert!(text.contains("membar.sys") || text.contains("fence.sc.sys"));
        assert!(text.contains("globaltimer"));
    }
}
