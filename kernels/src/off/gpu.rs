//! The GPU XPU in a build without the `cuda` feature: the types exist so that an application
//! written for a GPU builds either way, [`GpuXpu::open`] answers
//! [`KernelError::NotBuilt`], and no value of either type can
//! exist, so their methods are never reached.

use std::convert::Infallible;

use xfabric_xpu_trigger::TriggerVar;

use crate::nvrtc::Ptx;
use crate::{KernelError, Work};

/// One CUDA device as an XPU; this build has none (feature `cuda` off).
#[derive(Debug)]
pub struct GpuXpu {
    never: Infallible,
}

/// A trigger list copied to device memory; this build has none (feature `cuda` off).
#[derive(Debug)]
pub struct DeviceVars {
    never: Infallible,
}

impl DeviceVars {
    /// How many variables.
    pub fn len(&self) -> usize {
        match self.never {}
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        match self.never {}
    }
}

impl GpuXpu {
    /// Always `KernelError::NotBuilt`: "built without CUDA support (feature `cuda`)".
    pub fn open(_device: usize) -> Result<GpuXpu, KernelError> {
        Err(KernelError::not_built())
    }

    /// The device ordinal.
    pub fn device(&self) -> usize {
        match self.never {}
    }

    /// The device's compute capability.
    pub fn compute_capability(&self) -> (i32, i32) {
        match self.never {}
    }

    /// The PTX loaded.
    pub fn ptx(&self) -> &Ptx {
        match self.never {}
    }

    /// Copies a trigger list to device memory.
    ///
    /// # Safety
    /// As in a build with the `cuda` feature; no value of `GpuXpu` exists here.
    pub unsafe fn upload_vars(&self, _vars: &[TriggerVar]) -> Result<DeviceVars, KernelError> {
        match self.never {}
    }

    /// Launches `xf_signal`.
    ///
    /// # Safety
    /// As in a build with the `cuda` feature; no value of `GpuXpu` exists here.
    pub unsafe fn signal(&self, _vars: &DeviceVars) -> Result<(), KernelError> {
        match self.never {}
    }

    /// Launches `xf_compute_and_trigger`.
    ///
    /// # Safety
    /// As in a build with the `cuda` feature; no value of `GpuXpu` exists here.
    pub unsafe fn compute_and_trigger(
        &self,
        _out_dev_ptr: u64,
        _bucket_elems: u32,
        _nbuckets: u32,
        _seed: u32,
        _work: Work,
        _vars: &DeviceVars,
    ) -> Result<(), KernelError> {
        match self.never {}
    }

    /// Launches `xf_compute`.
    ///
    /// # Safety
    /// As in a build with the `cuda` feature; no value of `GpuXpu` exists here.
    pub unsafe fn compute(
        &self,
        _out_dev_ptr: u64,
        _bucket_elems: u32,
        _nbuckets: u32,
        _seed: u32,
        _work: Work,
    ) -> Result<(), KernelError> {
        match self.never {}
    }

    /// Waits for everything launched on this XPU.
    pub fn synchronize(&self) -> Result<(), KernelError> {
        match self.never {}
    }
}
