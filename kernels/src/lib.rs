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
//! - [`cpu`]: the same, done by a host thread, wherever no GPU is.
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
pub mod nvrtc;

pub use cache::cache_dir;
pub use cpu::{CpuXpu, CpuXpuStream, RingProfile};
pub use error::KernelError;
pub use gpu::{DeviceVars, GpuXpu};
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
