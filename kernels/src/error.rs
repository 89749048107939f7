//! The one error type of xfabric-kernels. Compiler logs and driver result names are kept whole
//! (a failed kernel build is read by a person); `From<KernelError> for xfabric_core::Error` folds
//! them into libfabric's vocabulary for callers that speak only that.

use xfabric_core::consts::errno::{FI_EINVAL, FI_EIO, FI_ENOSYS};
use xfabric_core::error::OsError;

/// What went wrong building or launching device code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// No GPU path here: libcuda or libnvrtc missing or incomplete, no device, or the driver
    /// refused to start (`-FI_ENOSYS`).
    #[error("GPU kernels are unavailable: {reason}")]
    Unavailable {
        /// What the probe found.
        reason: String,
    },
    /// The GPU side was left out when xfabric-kernels was compiled (cargo feature `cuda` off;
    /// `-FI_ENOSYS`).
    #[error("GPU kernels are unavailable: built without CUDA support (feature `cuda`)")]
    NotBuilt,
    /// NVRTC rejected the program; `log` is the compiler's (`-FI_EINVAL`).
    #[error("NVRTC could not compile {program} (options: {}):\n{log}", options.join(" "))]
    Compile {
        /// The program's name.
        program: String,
        /// The options it was compiled with.
        options: Vec<String>,
        /// The compiler log.
        log: String,
    },
    /// An NVRTC call other than the compilation itself failed (`-FI_EIO`).
    #[error("{op} failed: {name}")]
    Nvrtc {
        /// The NVRTC call.
        op: &'static str,
        /// Its `nvrtcResult`, by name.
        name: String,
    },
    /// A CUDA driver call failed (`-FI_EIO`).
    #[error("{op} failed: {name}{hint}")]
    Cuda {
        /// The driver call, or the step that made it.
        op: &'static str,
        /// The `CUresult`, by name.
        name: String,
        /// What probably caused it, when that is known (empty otherwise).
        hint: String,
    },
    /// A trigger variable is not one of fi_trigger(3)'s forms (`-FI_EINVAL`).
    #[error("trigger variable {index}: {reason}")]
    InvalidVar {
        /// Its position in the list.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// Another argument is wrong for the call (`-FI_EINVAL`).
    #[error("{op}: invalid argument: {reason}")]
    Inval {
        /// The call.
        op: &'static str,
        /// What was wrong.
        reason: String,
    },
}

impl KernelError {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn unavailable(reason: impl Into<String>) -> Self {
        KernelError::Unavailable {
            reason: reason.into(),
        }
    }

    #[cfg_attr(feature = "cuda", allow(dead_code))]
    pub(crate) fn not_built() -> Self {
        KernelError::NotBuilt
    }

    pub(crate) fn inval(op: &'static str, reason: impl Into<String>) -> Self {
        KernelError::Inval {
            op,
            reason: reason.into(),
        }
    }

    #[cfg(feature = "cuda")]
    pub(crate) fn cuda(op: &'static str, e: cudarc::driver::DriverError) -> Self {
        use cudarc::driver::sys::CUresult;
        let hint = match e.0 {
            CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION => {
                " (libnvrtc is newer than the driver: install an NVRTC no newer than the driver's \
                 CUDA version)"
            }
            CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU | CUresult::CUDA_ERROR_INVALID_PTX => {
                " (the PTX targets an architecture this device cannot run)"
            }
            _ => "",
        };
        KernelError::Cuda {
            op,
            name: format!("{:?}", e.0),
            hint: hint.to_string(),
        }
    }

    /// libfabric's positive error number for this error.
    pub fn errno(&self) -> i32 {
        match self {
            KernelError::Unavailable { .. } | KernelError::NotBuilt => FI_ENOSYS,
            KernelError::Compile { .. }
            | KernelError::InvalidVar { .. }
            | KernelError::Inval { .. } => FI_EINVAL,
            KernelError::Nvrtc { .. } | KernelError::Cuda { .. } => FI_EIO,
        }
    }
}

impl From<KernelError> for xfabric_core::Error {
    fn from(e: KernelError) -> Self {
        use xfabric_core::Error;
        let text = e.to_string();
        match &e {
            KernelError::Unavailable { .. } | KernelError::NotBuilt => Error::NoSys(text),
            KernelError::Compile { .. }
            | KernelError::InvalidVar { .. }
            | KernelError::Inval { .. } => Error::Inval(text),
            KernelError::Nvrtc { op, .. } | KernelError::Cuda { op, .. } => Error::Os {
                op: (*op).to_string(),
                source: OsError { code: FI_EIO, text },
            },
        }
    }
}
