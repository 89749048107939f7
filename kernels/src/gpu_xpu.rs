//! The device API's kernels on a CUDA device (`xfabric_xpu_kernels.cu`): a GPU posting its own
//! operations through exported handles (`Endpoint::export_xpu` to `Iface::Cuda`), compiled by
//! NVRTC for the device with the device header (`xfabric/fi_xpu_device.h`), launched on a
//! stream of their own.
//!
//! The launchers take handles as `FidXpu` (checked: class and provider) and pass their
//! `prov_ctx`, the device address of the shared block. Buffers are device addresses of memory
//! the GPU reaches and the domain registered (mapped host memory); descriptors carry them as
//! the host validates them, so they must be the registered addresses too (CUDA's unified
//! addressing makes a mapped allocation's device address its host address).

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use xfabric_core::xpu::abi::{FI_CLASS_CNTR, FI_CLASS_EP};
use xfabric_core::xpu::{FidXpu, FI_XPU_PROV_XFABRIC};

use crate::gpu::{guarded, GpuXpu};
use crate::nvrtc::{self, CompileOptions};
use crate::{device_api_headers, KernelError, XPU_KERNELS_SOURCE, XPU_KERNELS_SOURCE_NAME};

/// The device API's kernels loaded on one device (`GpuXpu::device_api`).
pub struct GpuXpuApi {
    // Field order is drop order: functions and module before the stream and context.
    send_burst: CudaFunction,
    put_signal: CudaFunction,
    rate: CudaFunction,
    pingpong: CudaFunction,
    _module: Arc<CudaModule>,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
}

impl std::fmt::Debug for GpuXpuApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuXpuApi").finish_non_exhaustive()
    }
}

/// 64-bit words in device memory a kernel writes its results to.
pub struct DeviceOut {
    buf: CudaSlice<i64>,
    ctx: Arc<CudaContext>,
}

impl DeviceOut {
    /// How many words.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Never: empty outputs are refused.
    pub fn is_empty(&self) -> bool {
        self.buf.len() == 0
    }
}

fn ctx_of(op: &'static str, h: &FidXpu, fclass: u32) -> Result<u64, KernelError> {
    if h.prov_id != FI_XPU_PROV_XFABRIC || h.fclass != fclass || h.prov_ctx == 0 {
        return Err(KernelError::inval(
            op,
            format!("not an xfabric handle of class {fclass}: {h:?}"),
        ));
    }
    Ok(h.prov_ctx)
}

fn one_block(threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn two_blocks() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (2, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl GpuXpu {
    /// Compiles (or finds cached) and loads the device API's kernels for this device.
    pub fn device_api(&self) -> Result<GpuXpuApi, KernelError> {
        guarded("GpuXpu::device_api", || {
            let (major, minor) = self.compute_capability();
            let ptx = nvrtc::compile(
                XPU_KERNELS_SOURCE_NAME,
                XPU_KERNELS_SOURCE,
                &device_api_headers(),
                &CompileOptions::for_compute_capability(major, minor),
            )?;
            let ctx = self.context().clone();
            let module = ctx
                .load_module(ptx.to_cudarc())
                .map_err(|e| KernelError::cuda("cuModuleLoadData", e))?;
            let f = |name: &'static str| {
                module
                    .load_function(name)
                    .map_err(|e| KernelError::cuda("cuModuleGetFunction", e))
            };
            let stream = ctx
                .new_stream()
                .map_err(|e| KernelError::cuda("cuStreamCreate", e))?;
            Ok(GpuXpuApi {
                send_burst: f("xf_xpu_send_burst")?,
                put_signal: f("xf_xpu_put_signal")?,
                rate: f("xf_xpu_rate")?,
                pingpong: f("xf_xpu_pingpong")?,
                _module: module,
                stream,
                ctx,
            })
        })
    }
}

impl GpuXpuApi {
    /// `n` zeroed words of device memory for a kernel's results.
    pub fn alloc_out(&self, n: usize) -> Result<DeviceOut, KernelError> {
        if n == 0 {
            return Err(KernelError::inval("alloc_out", "no words"));
        }
        guarded("alloc_out", || {
            let buf = self
                .stream
                .alloc_zeros::<i64>(n)
                .map_err(|e| KernelError::cuda("cuMemAlloc", e))?;
            Ok(DeviceOut {
                buf,
                ctx: self.ctx.clone(),
            })
        })
    }

    /// Waits for every kernel launched here, then copies `out` back.
    pub fn read_out(&self, out: &DeviceOut) -> Result<Vec<i64>, KernelError> {
        self.check_out("read_out", out)?;
        guarded("read_out", || {
            self.synchronize()?;
            self.stream
                .clone_dtoh(&out.buf)
                .map_err(|e| KernelError::cuda("cuMemcpyDtoH", e))
        })
    }

    /// Whether every kernel launched here has finished (without waiting).
    pub fn finished(&self) -> Result<bool, KernelError> {
        guarded("finished", || {
            let ev = self
                .stream
                .record_event(None)
                .map_err(|e| KernelError::cuda("cuEventRecord", e))?;
            ev.try_is_complete()
                .map_err(|e| KernelError::cuda("cuEventQuery", e))
        })
    }

    /// Waits for every kernel launched here and reports an error the driver recorded.
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

    fn check_out(&self, op: &'static str, out: &DeviceOut) -> Result<(), KernelError> {
        if Arc::ptr_eq(&out.ctx, &self.ctx) {
            Ok(())
        } else {
            Err(KernelError::inval(
                op,
                "the output belongs to another device",
            ))
        }
    }

    /// Launches `xf_xpu_send_burst`: `blocks` blocks of `threads` threads; block b posts
    /// messages `b * per_block ..` as tagged sends to `peer`, message i of `burst_len(i,
    /// max_len)` bytes with tag `burst_tag(i)` and context i, its bytes (`burst_byte`) written
    /// into slot i of `buf` (`max_len` bytes each) first. `rc[b]`: 0 or block b's first error.
    ///
    /// # Safety
    /// `buf` is the device address of `blocks * per_block * max_len` bytes the GPU may write,
    /// registered with `ep`'s domain under `desc` (its `get_xpu_desc`), alive and unread until
    /// the sends completed; `ep` is a live exported endpoint whose ring the GPU reaches.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn send_burst(
        &self,
        ep: &FidXpu,
        buf: u64,
        desc: u64,
        peer: u64,
        blocks: u32,
        threads: u32,
        per_block: u32,
        max_len: u32,
        rc: &DeviceOut,
    ) -> Result<(), KernelError> {
        const OP: &str = "send_burst";
        let ctx = ctx_of(OP, ep, FI_CLASS_EP)?;
        self.check_out(OP, rc)?;
        if blocks == 0 || threads == 0 || threads > 1024 || max_len <= 8 {
            return Err(KernelError::inval(
                OP,
                "blocks, 1..=1024 threads, max_len > 8",
            ));
        }
        if rc.len() < blocks as usize {
            return Err(KernelError::inval(OP, "rc needs a word per block"));
        }
        guarded(OP, || {
            let mut l = self.stream.launch_builder(&self.send_burst);
            l.arg(&ctx)
                .arg(&buf)
                .arg(&desc)
                .arg(&peer)
                .arg(&per_block)
                .arg(&max_len)
                .arg(&rc.buf);
            let cfg = LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the arguments match the kernel's; the memory is the caller's contract.
            unsafe { l.launch(cfg) }.map_err(|e| KernelError::cuda("cuLaunchKernel", e))?;
            Ok(())
        })
    }

    /// Launches `xf_xpu_put_signal` (two single-thread blocks): block 0 writes `n` messages of
    /// `len` bytes from `src` to `raddr`/`rkey` at `peer` with remote CQ data i and `flags`;
    /// block 1, the target's kernel, waits on the exported counter `cntr` for `n`, then checks
    /// every byte at `dst`. `out` (5 words): the initiator's first error, the wait's answer,
    /// bytes that differ, the clock before the first write and when the signal was seen (ns).
    ///
    /// # Safety
    /// `src`: `n * len` GPU-writable bytes registered under `desc`; `dst`: the device address
    /// of the target region (`n * len` bytes, registered for remote writes at `raddr`); both
    /// alive until the kernel and the writes finished; the handles live.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn put_signal(
        &self,
        ep: &FidXpu,
        src: u64,
        desc: u64,
        peer: u64,
        raddr: u64,
        rkey: u64,
        n: u32,
        len: u32,
        flags: u64,
        cntr: &FidXpu,
        dst: u64,
        out: &DeviceOut,
    ) -> Result<(), KernelError> {
        const OP: &str = "put_signal";
        let ep = ctx_of(OP, ep, FI_CLASS_EP)?;
        let cntr = ctx_of(OP, cntr, FI_CLASS_CNTR)?;
        self.check_out(OP, out)?;
        if out.len() < 5 || len == 0 {
            return Err(KernelError::inval(OP, "out needs 5 words; len > 0"));
        }
        guarded(OP, || {
            let mut l = self.stream.launch_builder(&self.put_signal);
            l.arg(&ep)
                .arg(&src)
                .arg(&desc)
                .arg(&peer)
                .arg(&raddr)
                .arg(&rkey)
                .arg(&n)
                .arg(&len)
                .arg(&flags)
                .arg(&cntr)
                .arg(&dst)
                .arg(&out.buf);
            // SAFETY: the arguments match the kernel's; the memory is the caller's contract.
            unsafe { l.launch(two_blocks()) }
                .map_err(|e| KernelError::cuda("cuLaunchKernel", e))?;
            Ok(())
        })
    }

    /// Launches `xf_xpu_rate`: one block of `threads` threads posts `n` 8-byte writes from the
    /// first 512 bytes of `src` to the first 512 of `raddr`. `out` (3 words): ns from the
    /// block's start to its last post, full-ring answers, the first error.
    ///
    /// # Safety
    /// `src`: 512 bytes registered under `desc`; `raddr`/`rkey`: 512 bytes the peer registered
    /// for remote writes; the handle lives until the writes completed.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rate(
        &self,
        ep: &FidXpu,
        src: u64,
        desc: u64,
        peer: u64,
        raddr: u64,
        rkey: u64,
        n: u32,
        threads: u32,
        out: &DeviceOut,
    ) -> Result<(), KernelError> {
        const OP: &str = "rate";
        let ep = ctx_of(OP, ep, FI_CLASS_EP)?;
        self.check_out(OP, out)?;
        if out.len() < 3 || threads == 0 || threads > 1024 {
            return Err(KernelError::inval(
                OP,
                "out needs 3 words; 1..=1024 threads",
            ));
        }
        guarded(OP, || {
            let mut l = self.stream.launch_builder(&self.rate);
            l.arg(&ep)
                .arg(&src)
                .arg(&desc)
                .arg(&peer)
                .arg(&raddr)
                .arg(&rkey)
                .arg(&n)
                .arg(&out.buf);
            // SAFETY: the arguments match the kernel's; the memory is the caller's contract.
            unsafe { l.launch(one_block(threads)) }
                .map_err(|e| KernelError::cuda("cuLaunchKernel", e))?;
            Ok(())
        })
    }

    /// Launches `xf_xpu_pingpong` (two single-thread blocks): endpoint A sends 8 bytes (tag 1)
    /// to B and waits on A's exported receive counter `rx_a`; B waits on `rx_b` and answers,
    /// `iters` times. `rtt` (`iters` words): each round trip's ns; `out` (2 words): A's and
    /// B's first errors.
    ///
    /// # Safety
    /// `buf_a`/`buf_b`: 8 bytes each registered under `desc_a`/`desc_b`; every receive posted
    /// beforehand; handles live until the kernel finished.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn pingpong(
        &self,
        ep_a: &FidXpu,
        ep_b: &FidXpu,
        rx_a: &FidXpu,
        rx_b: &FidXpu,
        bufs: (u64, u64),
        descs: (u64, u64),
        peers: (u64, u64),
        iters: u32,
        rtt: &DeviceOut,
        out: &DeviceOut,
    ) -> Result<(), KernelError> {
        const OP: &str = "pingpong";
        let (ea, eb) = (
            ctx_of(OP, ep_a, FI_CLASS_EP)?,
            ctx_of(OP, ep_b, FI_CLASS_EP)?,
        );
        let (ra, rb) = (
            ctx_of(OP, rx_a, FI_CLASS_CNTR)?,
            ctx_of(OP, rx_b, FI_CLASS_CNTR)?,
        );
        self.check_out(OP, rtt)?;
        self.check_out(OP, out)?;
        if rtt.len() < iters as usize || out.len() < 2 {
            return Err(KernelError::inval(OP, "rtt needs iters words, out 2"));
        }
        guarded(OP, || {
            let mut l = self.stream.launch_builder(&self.pingpong);
            // peers: (A's address of B, B's address of A).
            l.arg(&ea)
                .arg(&eb)
                .arg(&ra)
                .arg(&rb)
                .arg(&bufs.0)
                .arg(&bufs.1)
                .arg(&descs.0)
                .arg(&descs.1)
                .arg(&peers.0)
                .arg(&peers.1)
                .arg(&iters)
                .arg(&rtt.buf)
                .arg(&out.buf);
            // SAFETY: the arguments match the kernel's; the memory is the caller's contract.
            unsafe { l.launch(two_blocks()) }
                .map_err(|e| KernelError::cuda("cuLaunchKernel", e))?;
            Ok(())
        })
    }
}
