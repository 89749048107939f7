//! A CUDA device as XPU: xfabric's kernels compiled by NVRTC for it, loaded into its primary
//! context (the one xfabric-hmem's allocations live in), and launched on a stream of its own.
//!
//! Built on cudarc's safe driver layer (context, stream, module, launch builder, device slices
//! whose drops wait for the kernels using them). cudarc panics where the driver lacks a symbol
//! it calls; [`GpuXpu::open`] probes the libraries first and, as a last guard, turns a panic
//! during bring-up into `Unavailable`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchConfig,
    PushKernelArg,
};
use xfabric_xpu_trigger::{Signal, TriggerVar};

use crate::cpu::{check_buckets, validate};
use crate::nvrtc::{self, CompileOptions, Header, Ptx};
use crate::{
    KernelError, Work, KERNELS_SOURCE, KERNELS_SOURCE_NAME, TRIGGER_HEADER, TRIGGER_HEADER_NAME,
};

/// Driver symbols the safe layer calls beyond the ones xfabric-hmem's probe checks.
const EXTRA_DRIVER_SYMBOLS: &[&str] = &[
    "cuCtxSetCurrent",
    "cuDeviceGetAttribute",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventDestroy_v2",
    "cuStreamWaitEvent",
    "cuMemsetD8Async",
];

/// Threads per block of `xf_compute_and_trigger` and `xf_compute`.
const BLOCK: u32 = 256;

/// The launch shape both compute kernels use: one block per bucket.
fn bucket_grid(bucket_elems: u32, nbuckets: u32) -> LaunchConfig {
    let block = bucket_elems.div_ceil(32).saturating_mul(32).min(BLOCK);
    LaunchConfig {
        grid_dim: (nbuckets, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn check_out(op: &'static str, out_dev_ptr: u64) -> Result<(), KernelError> {
    if out_dev_ptr == 0 || !out_dev_ptr.is_multiple_of(4) {
        return Err(KernelError::inval(
            op,
            "out must be a non-null, 4-byte aligned address",
        ));
    }
    Ok(())
}

/// One CUDA device as an XPU: its primary context, a stream, xfabric's kernels loaded.
pub struct GpuXpu {
    device: usize,
    compute_capability: (i32, i32),
    ptx: Ptx,
    // Field order is drop order: functions and module before the stream and context.
    signal_fn: CudaFunction,
    compute_fn: CudaFunction,
    compute_only_fn: CudaFunction,
    _module: Arc<CudaModule>,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
}

impl std::fmt::Debug for GpuXpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuXpu")
            .field("device", &self.device)
            .field("compute_capability", &self.compute_capability)
            .finish_non_exhaustive()
    }
}

/// A trigger list copied to device memory (byte-array values included), for one [`GpuXpu`].
pub struct DeviceVars {
    buf: CudaSlice<u8>,
    count: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceVars {
    /// How many variables.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are none (never: uploads of empty lists are refused).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

fn probe_driver() -> Result<(), KernelError> {
    xfabric_hmem::cuda::result::probe_library().map_err(KernelError::unavailable)?;
    // SAFETY: probe_library loaded libcuda, so culib() finds it instead of panicking.
    let lib = unsafe { cudarc::driver::sys::culib() };
    let missing: Vec<&str> = EXTRA_DRIVER_SYMBOLS
        .iter()
        .copied()
        // SAFETY: looking a symbol up runs no code.
        .filter(|n| unsafe { lib.get::<*const std::ffi::c_void>(n.as_bytes()) }.is_err())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(KernelError::unavailable(format!(
            "libcuda lacks {}",
            missing.join(", ")
        )))
    }
}

/// Runs `f`, turning a panic inside cudarc into `Unavailable`.
pub(crate) fn guarded<T>(
    what: &str,
    f: impl FnOnce() -> Result<T, KernelError>,
) -> Result<T, KernelError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("(no message)");
        Err(KernelError::unavailable(format!(
            "{what}: cudarc panicked: {msg}"
        )))
    })
}

impl GpuXpu {
    /// Opens CUDA device `device`: probes libcuda and libnvrtc, compiles (or finds cached) PTX
    /// for the device's compute capability, loads it. Without a driver, NVRTC or the device
    /// this is `Unavailable` with the reason; it never panics. Leaves the device's primary
    /// context current on the calling thread.
    pub fn open(device: usize) -> Result<GpuXpu, KernelError> {
        probe_driver()?;
        nvrtc::probe()?;
        guarded("GpuXpu::open", || Self::open_probed(device))
    }

    fn open_probed(device: usize) -> Result<GpuXpu, KernelError> {
        let count = CudaContext::device_count()
            .map_err(|e| KernelError::unavailable(format!("cuInit/cuDeviceGetCount: {:?}", e.0)))?;
        if count <= 0 {
            return Err(KernelError::unavailable(
                "the driver reports no CUDA devices",
            ));
        }
        if device >= count as usize {
            return Err(KernelError::inval(
                "GpuXpu::open",
                format!("no CUDA device {device} ({count} present)"),
            ));
        }
        let ctx = CudaContext::new(device)
            .map_err(|e| KernelError::cuda("cuDevicePrimaryCtxRetain", e))?;
        let cc = ctx
            .compute_capability()
            .map_err(|e| KernelError::cuda("cuDeviceGetAttribute(COMPUTE_CAPABILITY)", e))?;
        let ptx = nvrtc::compile(
            KERNELS_SOURCE_NAME,
            KERNELS_SOURCE,
            &[Header {
                name: TRIGGER_HEADER_NAME,
                source: TRIGGER_HEADER,
            }],
            &CompileOptions::for_compute_capability(cc.0, cc.1),
        )?;
        let module = ctx
            .load_module(ptx.to_cudarc())
            .map_err(|e| KernelError::cuda("cuModuleLoadData", e))?;
        let signal_fn = module
            .load_function("xf_signal")
            .map_err(|e| KernelError::cuda("cuModuleGetFunction(xf_signal)", e))?;
        let compute_fn = module
            .load_function("xf_compute_and_trigger")
            .map_err(|e| KernelError::cuda("cuModuleGetFunction(xf_compute_and_trigger)", e))?;
        let compute_only_fn = module
            .load_function("xf_compute")
            .map_err(|e| KernelError::cuda("cuModuleGetFunction(xf_compute)", e))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| KernelError::cuda("cuStreamCreate", e))?;
        Ok(GpuXpu {
            device,
            compute_capability: cc,
            ptx,
            signal_fn,
            compute_fn,
            compute_only_fn,
            _module: module,
            stream,
            ctx,
        })
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device ordinal.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The device's compute capability, e.g. `(9, 0)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// The PTX loaded (and where it came from: compiled now, or a cache).
    pub fn ptx(&self) -> &Ptx {
        &self.ptx
    }

    /// Copies a trigger list to device memory for [`signal`](Self::signal) and
    /// [`compute_and_trigger`](Self::compute_and_trigger). Byte-array values (`FI_UINT8` with a
    /// count above 1) are copied too, and the copies' device addresses replace `value.data`: the kernel
    /// cannot read the host's array.
    ///
    /// # Safety
    /// As [`TriggerVar::signal`]: for `FI_UINT8` with count > 1, `value.data` points to `count`
    /// readable bytes.
    pub unsafe fn upload_vars(&self, vars: &[TriggerVar]) -> Result<DeviceVars, KernelError> {
        if vars.is_empty() {
            return Err(KernelError::inval("upload_vars", "no trigger variables"));
        }
        // SAFETY: the caller's contract.
        unsafe { validate(vars) }?;
        let var_bytes = std::mem::size_of_val(vars);
        let mut payload_len = 0usize;
        for v in vars {
            // SAFETY: the caller's contract; validated above.
            if let Some(Signal::Bytes(b)) = unsafe { v.signal() } {
                payload_len += b.len();
            }
        }
        guarded("upload_vars", || {
            let total = var_bytes + payload_len;
            let mut buf = self
                .stream
                .alloc_zeros::<u8>(total)
                .map_err(|e| KernelError::cuda("cuMemAlloc", e))?;
            let base = {
                let (ptr, _record) = buf.device_ptr(&self.stream);
                ptr
            };
            let mut image = vec![0u8; total];
            let mut off = var_bytes;
            for (i, v) in vars.iter().enumerate() {
                let mut dv = *v;
                // SAFETY: the caller's contract; validated above.
                if let Some(Signal::Bytes(b)) = unsafe { v.signal() } {
                    image[off..off + b.len()].copy_from_slice(b);
                    dv.value.data = (base + off as u64) as *mut u8;
                    off += b.len();
                }
                let at = i * std::mem::size_of::<TriggerVar>();
                // SAFETY: TriggerVar is repr(C) plain data (24 bytes, no padding); its bytes are
                // what the kernel reads as struct fi_trigger_var.
                let raw = unsafe {
                    std::slice::from_raw_parts(
                        (&dv as *const TriggerVar).cast::<u8>(),
                        std::mem::size_of::<TriggerVar>(),
                    )
                };
                image[at..at + raw.len()].copy_from_slice(raw);
            }
            self.stream
                .memcpy_htod(&image, &mut buf)
                .map_err(|e| KernelError::cuda("cuMemcpyHtoDAsync", e))?;
            Ok(DeviceVars {
                buf,
                count: vars.len(),
                ctx: self.ctx.clone(),
            })
        })
    }

    fn check_vars(&self, op: &'static str, vars: &DeviceVars) -> Result<(), KernelError> {
        if Arc::ptr_eq(&vars.ctx, &self.ctx) {
            Ok(())
        } else {
            Err(KernelError::inval(
                op,
                "the variables were uploaded by another GpuXpu",
            ))
        }
    }

    /// Launches `xf_signal`: one device thread rings the list, in order. Asynchronous: it runs
    /// after the work already on this XPU's stream.
    ///
    /// # Safety
    /// Every variable's `addr` must be device-writable memory (mapped host memory, device
    /// memory) valid until the kernel has run, that nothing reads non-atomically meanwhile.
    pub unsafe fn signal(&self, vars: &DeviceVars) -> Result<(), KernelError> {
        self.check_vars("signal", vars)?;
        let n = i32::try_from(vars.count)
            .map_err(|_| KernelError::inval("signal", "more than i32::MAX variables"))?;
        guarded("signal", || {
            let mut launch = self.stream.launch_builder(&self.signal_fn);
            launch.arg(&vars.buf).arg(&n);
            let cfg = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (1, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the argument list matches xf_signal(const fi_trigger_var*, int); the
            // stores it makes are the caller's contract.
            unsafe { launch.launch(cfg) }
                .map_err(|e| KernelError::cuda("cuLaunchKernel(xf_signal)", e))?;
            Ok(())
        })
    }

    /// Launches `xf_compute_and_trigger`: block k writes `pattern(i, seed)` for bucket k's
    /// elements of `out` (at device address `out_dev_ptr`), computing them as `work` says, then
    /// bucket k's variable `vars[k]` is rung, buckets strictly in order whatever order the
    /// blocks finish in. Asynchronous.
    ///
    /// # Safety
    /// `out_dev_ptr` must be the device address of `bucket_elems * nbuckets` writable `u32`s
    /// (pinned host memory mapped into this device, typically), not read before their bucket's
    /// variable is seen rung and valid until the kernel has run; the variables' addresses as for
    /// [`signal`](Self::signal).
    pub unsafe fn compute_and_trigger(
        &self,
        out_dev_ptr: u64,
        bucket_elems: u32,
        nbuckets: u32,
        seed: u32,
        work: Work,
        vars: &DeviceVars,
    ) -> Result<(), KernelError> {
        const OP: &str = "compute_and_trigger";
        self.check_vars(OP, vars)?;
        check_buckets(OP, bucket_elems, nbuckets, vars.count)?;
        check_out(OP, out_dev_ptr)?;
        let staggered = u32::from(work.staggered);
        guarded(OP, || {
            // Scratch for the in-order ringing; dropping these slices right after the launch is
            // safe: cudarc makes their frees wait for the kernel.
            let ready = self
                .stream
                .alloc_zeros::<u32>(nbuckets as usize)
                .map_err(|e| KernelError::cuda("cuMemAlloc(ready)", e))?;
            let state = self
                .stream
                .alloc_zeros::<u32>(2)
                .map_err(|e| KernelError::cuda("cuMemAlloc(ring_state)", e))?;
            let mut launch = self.stream.launch_builder(&self.compute_fn);
            launch
                .arg(&out_dev_ptr)
                .arg(&bucket_elems)
                .arg(&nbuckets)
                .arg(&seed)
                .arg(&work.passes)
                .arg(&staggered)
                .arg(&vars.buf)
                .arg(&ready)
                .arg(&state);
            // SAFETY: the argument list matches xf_compute_and_trigger's; `out` and the
            // variables' addresses are the caller's contract.
            unsafe { launch.launch(bucket_grid(bucket_elems, nbuckets)) }
                .map_err(|e| KernelError::cuda("cuLaunchKernel(xf_compute_and_trigger)", e))?;
            Ok(())
        })
    }

    /// Launches `xf_compute`: the compute of [`compute_and_trigger`](Self::compute_and_trigger)
    /// with no trigger, for a host that waits for the kernel ([`synchronize`](Self::synchronize))
    /// and then posts the sends itself. Asynchronous.
    ///
    /// # Safety
    /// `out_dev_ptr` must be the device address of `bucket_elems * nbuckets` writable `u32`s
    /// that nothing else touches until the kernel has run, and valid until then.
    pub unsafe fn compute(
        &self,
        out_dev_ptr: u64,
        bucket_elems: u32,
        nbuckets: u32,
        seed: u32,
        work: Work,
    ) -> Result<(), KernelError> {
        const OP: &str = "compute";
        if bucket_elems == 0 || nbuckets == 0 {
            return Err(KernelError::inval(OP, "no elements to compute"));
        }
        check_out(OP, out_dev_ptr)?;
        let staggered = u32::from(work.staggered);
        guarded(OP, || {
            let mut launch = self.stream.launch_builder(&self.compute_only_fn);
            launch
                .arg(&out_dev_ptr)
                .arg(&bucket_elems)
                .arg(&nbuckets)
                .arg(&seed)
                .arg(&work.passes)
                .arg(&staggered);
            // SAFETY: the argument list matches xf_compute's; `out` is the caller's contract.
            unsafe { launch.launch(bucket_grid(bucket_elems, nbuckets)) }
                .map_err(|e| KernelError::cuda("cuLaunchKernel(xf_compute)", e))?;
            Ok(())
        })
    }

    /// Waits for everything launched on this XPU's stream, and reports any error the driver
    /// recorded meanwhile (frees in drops included).
    pub fn synchronize(&self) -> Result<(), KernelError> {
        guarded("synchronize", || {
            self.stream
                .synchronize()
                .map_err(|e| KernelError::cuda("cuStreamSynchronize", e))?;
            self.ctx
                .check_err()
                .map_err(|e| KernelError::cuda("an earlier asynchronous call", e))
        })
    }
}
