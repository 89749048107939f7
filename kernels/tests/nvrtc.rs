//! The CUDA sources through NVRTC, wherever libnvrtc loads (no GPU needed): they compile, the
//! PTX defines the kernels, a user program including the header compiles, a broken one reports
//! the compiler log, and the caches answer a second time. Skipped with the reason where
//! libnvrtc is absent (put one on LD_LIBRARY_PATH to run it; scripts/nvrtc-check.sh does).

#![cfg(feature = "cuda")]

use xfabric_kernels::nvrtc::{self, CompileOptions, Header, PtxOrigin};
use xfabric_kernels::{
    compile, trigger_header_for_nvrtc, KernelError, ENTRY_POINTS, KERNELS_SOURCE,
    KERNELS_SOURCE_NAME,
};

/// Architectures the kernels must build for: the oldest CUDA 13 supports, and Hopper.
const ARCHES: &[(i32, i32)] = &[(7, 5), (9, 0)];

#[test]
fn sources_compile_with_nvrtc() {
    let version = match nvrtc::probe() {
        Ok(v) => v,
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
    };
    println!("NVRTC {}.{}", version.0, version.1);
    // This is the only test in this binary that compiles, so pointing the disk cache at a
    // fresh directory here races with nothing.
    let dir = std::env::temp_dir().join(format!("xfabric-kernels-nvrtc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var("XDG_CACHE_HOME", &dir);

    for &(major, minor) in ARCHES {
        let opts = CompileOptions::for_compute_capability(major, minor);
        let ptx = compile(
            KERNELS_SOURCE_NAME,
            KERNELS_SOURCE,
            &[trigger_header_for_nvrtc()],
            &opts,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ptx.origin(), PtxOrigin::Compiled);
        assert_eq!(ptx.entry_points(), ENTRY_POINTS, "sm_{major}{minor}");
        let text = ptx.as_str();
        assert!(text.contains(&format!(".target sm_{major}{minor}")));
        // The system-scope fences and the lock's atomics made it through.
        assert!(text.contains("membar.sys") || text.contains("fence.sc.sys"));
        assert!(text.contains("atom.global.cas") || text.contains("atom.cas"));
        // The compute's extra passes (a xorshift chain) were not folded away.
        for (name, body) in kernel_bodies(text) {
            if name.starts_with("xf_compute") {
                assert!(
                    body.contains("shl.b32") && body.contains("shr.u32"),
                    "sm_{major}{minor}: {name} lost its passes"
                );
            }
        }
        let again = compile(
            KERNELS_SOURCE_NAME,
            KERNELS_SOURCE,
            &[trigger_header_for_nvrtc()],
            &opts,
        )
        .unwrap();
        assert_eq!(again.origin(), PtxOrigin::Memory);
        assert_eq!(again.as_str(), text);
    }
    let files = std::fs::read_dir(dir.join("xfabric").join("kernels"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(files, ARCHES.len(), "one cached PTX file per architecture");

    // A user kernel that rings a list with the shipped header.
    let user = r#"
        #include "xfabric_trigger.cuh"
        extern "C" __global__ void scale_then_ring(float *x, unsigned n,
                                                   const struct fi_trigger_var *vars, int nvars) {
            unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) x[i] *= 2.0f;
            xf_publish_block();
            if (threadIdx.x == 0) xf_ring(vars, nvars);
        }
    "#;
    let ptx = compile(
        "user.cu",
        user,
        &[trigger_header_for_nvrtc()],
        &CompileOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ptx.entry_points(), ["scale_then_ring"]);

    // A broken program: the error carries NVRTC's log and the options.
    let broken = "extern \"C\" __global__ void k() { this_is_not_declared(); }";
    let opts = CompileOptions {
        arch: None,
        extra: vec!["-lineinfo".into()],
    };
    match compile("broken.cu", broken, &[], &opts) {
        Err(KernelError::Compile {
            program,
            options,
            log,
        }) => {
            assert_eq!(program, "broken.cu");
            assert!(options.iter().any(|o| o == "-lineinfo"));
            assert!(log.contains("this_is_not_declared"), "{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    // Without the header the kernels cannot build: the header really is what is included.
    let e = compile(
        KERNELS_SOURCE_NAME,
        KERNELS_SOURCE,
        &[],
        &CompileOptions::default(),
    );
    assert!(matches!(e, Err(KernelError::Compile { .. })));
    // Options with a NUL are refused, not handed to cudarc (which would panic).
    let nul = CompileOptions {
        arch: None,
        extra: vec!["-D\0X".into()],
    };
    assert!(matches!(
        compile(
            "nul.cu",
            "",
            &[Header {
                name: "h",
                source: ""
            }],
            &nul
        ),
        Err(KernelError::Inval { .. })
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_libnvrtc_compile_is_unavailable_and_nothing_panics() {
    let e = match nvrtc::probe() {
        Ok(v) => {
            println!("skipped: libnvrtc {}.{} is present here", v.0, v.1);
            return;
        }
        Err(e) => e,
    };
    assert!(matches!(e, KernelError::Unavailable { .. }), "{e}");
    let again = compile(
        "k.cu",
        "extern \"C\" __global__ void k() {}",
        &[],
        &CompileOptions::default(),
    );
    assert_eq!(again.unwrap_err(), e);
    assert_eq!(e.errno(), libc_enosys());
    assert!(matches!(
        xfabric_core::Error::from(e),
        xfabric_core::Error::NoSys(_)
    ));
}

fn libc_enosys() -> i32 {
    xfabric_core::consts::errno::FI_ENOSYS
}

/// Each `.entry` of the PTX with its text up to the next one.
fn kernel_bodies(ptx: &str) -> Vec<(String, &str)> {
    let starts: Vec<usize> = ptx.match_indices(".entry ").map(|(i, _)| i).collect();
    starts
        .iter()
        .enumerate()
        .map(|(n, &at)| {
            let end = starts.get(n + 1).copied().unwrap_or(ptx.len());
            let body = &ptx[at..end];
            let name = body[".entry ".len()..]
                .split(|c: char| c == '(' || c.is_whitespace())
                .next()
                .unwrap_or_default()
                .to_string();
            (name, body)
        })
        .collect()
}
