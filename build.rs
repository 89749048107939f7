//! GPU tests are ignored, with the reason, unless `XFABRIC_GPU_TESTS=1` is set when they are
//! built: `XFABRIC_GPU_TESTS=1 cargo test` runs them on a machine with an NVIDIA GPU (cfg
//! `xfabric_gpu_tests`).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(xfabric_gpu_tests)");
    println!("cargo::rerun-if-env-changed=XFABRIC_GPU_TESTS");
    if std::env::var("XFABRIC_GPU_TESTS").is_ok_and(|v| v == "1") {
        println!("cargo::rustc-cfg=xfabric_gpu_tests");
    }
}
