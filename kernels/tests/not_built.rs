//! A build without the `cuda` feature (`cargo test -p xfabric-kernels --no-default-features`):
//! the GPU entry points exist and answer the typed error that names the feature, and the CPU
//! XPU still works.

#![cfg(not(feature = "cuda"))]

use xfabric_kernels::{nvrtc, CompileOptions, GpuXpu, KernelError};

#[test]
fn gpu_entry_points_answer_not_built() {
    let text = "GPU kernels are unavailable: built without CUDA support (feature `cuda`)";
    let e = GpuXpu::open(0).unwrap_err();
    assert_eq!(e, KernelError::NotBuilt);
    assert_eq!(e.to_string(), text);
    assert_eq!(e.errno(), xfabric_core::consts::errno::FI_ENOSYS);
    assert!(matches!(xfabric_core::Error::from(e), xfabric_core::Error::NoSys(m) if m == text));
    assert_eq!(nvrtc::probe(), Err(KernelError::NotBuilt));
    let compiled = nvrtc::compile("k.cu", "", &[], &CompileOptions::default());
    assert_eq!(compiled.unwrap_err(), KernelError::NotBuilt);
}
