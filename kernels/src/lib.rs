//! xfabric-kernels: the XPU's side of an XPU trigger.
//!
//! A provider arms a transfer and hands back `fi_trigger_var`s (an address and a value); the
//! XPU starts the transfer by storing the values, after making its data visible. Here:
//!
//! - [`trigger_header`]: `xfabric_trigger.cuh`, the device function (`xf_ring`) a user kernel
//!   includes to ring a list, for nvcc or for NVRTC through [`nvrtc::compile`];
//! - [`GpuXpu`]: xfabric's own kernels (`xf_signal`, `xf_compute_and_trigger`, `xf_compute`) compiled at run
//!   time by NVRTC (cached in memory and on disk), loaded and launched on a CUDA device. Needs
//!   libcuda and libnvrtc at run time only; without them it reports `Unavailable`;
//! - [`cpu`]: the same, done by a host thread, wherever no GPU is;
//! - `GpuXpuApi` (`GpuXpu::device_api`): kernels calling the device API (`fi_xpu_tsend`,
//!   `fi_xpu_write`, `fi_xpu_cntr_wait`... from `xfabric/fi_xpu_device.h`) on endpoints,
//!   counters and CQs exported to the GPU: a send burst, put with signal, a rate and a
//!   ping-pong, for the GPU tests and as examples.
//!
//! The GPU side is the cargo feature `cuda`, on by default. Built without it, cudarc is left
//! out, and [`GpuXpu::open`], [`nvrtc::probe`] and [`compile`] answer
//! [`KernelError::NotBuilt`]; the CPU XPU is always there.

#![warn(missing_docs)]

mod cache;
pub mod cpu;
mod error;
#[cfg(feature = "cuda")]
pub mod gpu;
#[cfg(not(feature = "cuda"))]
#[path = "off/gpu.rs"]
pub mod gpu;
#[cfg(feature = "cuda")]
pub mod gpu_xpu;
pub mod nvrtc;

pub use cache::cache_dir;
pub use cpu::{CpuWork, CpuXpu, CpuXpuStream, RingProfile};
pub use error::KernelError;
pub use gpu::{DeviceVars, GpuXpu};
#[cfg(feature = "cuda")]
pub use gpu_xpu::{DeviceOut, GpuXpuApi};
pub use nvrtc::{compile, CompileOptions, Header, Ptx, PtxOrigin};

/// How much compute a bucket gets from [`GpuXpu::compute_and_trigger`] and
/// `GpuXpu::compute`: the same bytes whatever the work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Work {
    /// Times each element is computed over (at least once; 0 counts as 1).
    pub passes: u32,
    /// Bucket k computed `passes * (k + 1)` times over: bucket k is ready k + 1 bucket-times
    /// after the launch, as on an XPU computing the buckets one after the other, although
    /// every block runs at once.
    pub staggered: bool,
}

impl Work {
    /// One pass, not staggered: the pattern and nothing more.
    pub const ONCE: Work = Work {
        passes: 1,
        staggered: false,
    };
}

/// The name `#include` uses for [`TRIGGER_HEADER`].
pub const TRIGGER_HEADER_NAME: &str = "xfabric_trigger.cuh";

/// `xfabric_trigger.cuh`: `struct fi_trigger_var`, `xf_ring`, `xf_publish_block`.
pub const TRIGGER_HEADER: &str = include_str!("../cuda/xfabric_trigger.cuh");

/// The name NVRTC gives [`KERNELS_SOURCE`] in diagnostics.
pub const KERNELS_SOURCE_NAME: &str = "xfabric_kernels.cu";

/// xfabric's kernels: `xf_signal`, `xf_compute_and_trigger` and `xf_compute`.
pub const KERNELS_SOURCE: &str = include_str!("../cuda/xfabric_kernels.cu");

/// The kernels [`KERNELS_SOURCE`] defines.
pub const ENTRY_POINTS: &[&str] = &["xf_signal", "xf_compute_and_trigger", "xf_compute"];

/// The name `#include` uses for [`DEVICE_API_HEADER`].
pub const DEVICE_API_HEADER_NAME: &str = "xfabric/fi_xpu_device.h";

/// `xfabric/fi_xpu_device.h`: the device API's calls (`fi_xpu_tsend`...) for CUDA and C11.
pub const DEVICE_API_HEADER: &str = include_str!("../cuda/xfabric/fi_xpu_device.h");

/// `fi_xpu_abi.h`, which [`DEVICE_API_HEADER`] includes: the shared layouts.
pub const DEVICE_API_ABI_HEADER: &str = include_str!("../cuda/xfabric/fi_xpu_abi.h");

/// The name NVRTC gives [`XPU_KERNELS_SOURCE`] in diagnostics.
pub const XPU_KERNELS_SOURCE_NAME: &str = "xfabric_xpu_kernels.cu";

/// Kernels that call the device API: `xf_xpu_send_burst`, `xf_xpu_put_signal`,
/// `xf_xpu_rate`, `xf_xpu_pingpong` (`GpuXpuApi` launches them).
pub const XPU_KERNELS_SOURCE: &str = include_str!("../cuda/xfabric_xpu_kernels.cu");

/// The kernels [`XPU_KERNELS_SOURCE`] defines.
pub const XPU_ENTRY_POINTS: &[&str] = &[
    "xf_xpu_send_burst",
    "xf_xpu_put_signal",
    "xf_xpu_rate",
    "xf_xpu_pingpong",
];

/// The device API's headers as NVRTC include names ([`DEVICE_API_HEADER_NAME`] and the ABI
/// header it includes).
pub fn device_api_headers() -> [Header<'static>; 2] {
    [
        Header {
            name: DEVICE_API_HEADER_NAME,
            source: DEVICE_API_HEADER,
        },
        Header {
            name: "fi_xpu_abi.h",
            source: DEVICE_API_ABI_HEADER,
        },
    ]
}

/// Length of message `i` of `xf_xpu_send_burst` with slots of `max_len` (> 8) bytes.
pub fn burst_len(i: u64, max_len: u32) -> usize {
    let span = u64::from(max_len.max(9) - 8);
    (8 + (i.wrapping_mul(37) % span)) as usize
}

/// Tag of message `i` of `xf_xpu_send_burst`.
pub fn burst_tag(i: u64) -> u64 {
    i.wrapping_mul(0x9e37_79b9) ^ 0xc0da
}

/// Byte `k` of message `i` of `xf_xpu_send_burst` and `xf_xpu_put_signal`.
pub fn burst_byte(i: u64, k: u64) -> u8 {
    i.wrapping_mul(131)
        .wrapping_add(k.wrapping_mul(7))
        .wrapping_add(1) as u8
}

/// The trigger header, to pass to NVRTC as a [`Header`] named [`TRIGGER_HEADER_NAME`] (or to
/// write next to a `.cu` file for nvcc).
pub fn trigger_header() -> &'static str {
    TRIGGER_HEADER
}

/// [`trigger_header`] as an NVRTC header.
pub fn trigger_header_for_nvrtc() -> Header<'static> {
    Header {
        name: TRIGGER_HEADER_NAME,
        source: TRIGGER_HEADER,
    }
}
