//! The one error type of xfabric-hmem. It stays separate from `xfabric_core::Error` because the
//! causes here are the drivers' own (a `CUresult`, a `ze_result_t`, a library that would not
//! load) and callers such as `xfabric info` want them whole; `From<HmemError> for
//! xfabric_core::Error` folds each into libfabric's vocabulary at the crate boundary.

use std::sync::Mutex;

use xfabric_core::consts::errno::{FI_EINVAL, FI_EIO, FI_ENOMEM, FI_ENOSYS, FI_EOPNOTSUPP};
use xfabric_core::error::OsError;

use crate::Iface;

/// An interface that cannot be used on this machine, and why (library missing, no device,
/// driver refused to initialise, not implemented by xfabric).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} is unavailable: {reason}", iface.c_name())]
pub struct Unavailable {
    /// The interface.
    pub iface: Iface,
    /// What the probe found.
    pub reason: String,
}

/// What went wrong in a heterogeneous-memory call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HmemError {
    /// The interface is not usable here (`-FI_ENOSYS`, as libfabric answers for an
    /// uninitialised hmem interface).
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// The interface exists but does not do this operation (`-FI_EOPNOTSUPP`).
    #[error("{}: {op} is not supported: {reason}", iface.c_name())]
    Unsupported {
        /// The interface.
        iface: Iface,
        /// The operation asked for.
        op: &'static str,
        /// Why not.
        reason: String,
    },
    /// An argument is wrong for this call (`-FI_EINVAL`).
    #[error("{op}: invalid argument: {reason}")]
    Inval {
        /// The operation.
        op: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// A CUDA driver call failed.
    #[error("{op} failed: {name} (CUresult {code})")]
    Cuda {
        /// The driver call.
        op: &'static str,
        /// The `CUresult` value.
        code: u32,
        /// Its name, e.g. `CUDA_ERROR_INVALID_VALUE`.
        name: String,
    },
    /// A Level Zero call failed.
    #[error("{op} failed: {name} (ze_result_t {code:#x})")]
    Ze {
        /// The Level Zero call.
        op: &'static str,
        /// The `ze_result_t` value.
        code: u32,
        /// Its name, e.g. `ZE_RESULT_ERROR_INVALID_ARGUMENT`.
        name: &'static str,
    },
    /// The interface's code was left out when xfabric was compiled (cargo feature `feature`
    /// off): the interface exists in `enum fi_hmem_iface`, every call answers this
    /// (`-FI_ENOSYS`, as for an unavailable interface).
    #[error("{} is unavailable: built without {support} support (feature `{feature}`)", iface.c_name())]
    NotBuilt {
        /// The interface.
        iface: Iface,
        /// What the feature brings, e.g. `CUDA`.
        support: &'static str,
        /// The cargo feature of xfabric-hmem (and of xfabric) that brings it, e.g. `cuda`.
        feature: &'static str,
    },
    /// An operating-system call failed.
    #[error("{op}: {source}")]
    Os {
        /// What was attempted.
        op: &'static str,
        /// The OS error.
        #[source]
        source: OsError,
    },
}

/// `CUDA_ERROR_INVALID_VALUE` and `CUDA_ERROR_OUT_OF_MEMORY` (cuda.h).
const CUDA_ERROR_INVALID_VALUE: u32 = 1;
const CUDA_ERROR_OUT_OF_MEMORY: u32 = 2;
/// `ZE_RESULT_ERROR_OUT_OF_{HOST,DEVICE}_MEMORY`, `ZE_RESULT_ERROR_INVALID_ARGUMENT` (ze_api.h).
const ZE_OUT_OF_HOST_MEMORY: u32 = 0x7000_0002;
const ZE_OUT_OF_DEVICE_MEMORY: u32 = 0x7000_0003;
const ZE_INVALID_ARGUMENT: u32 = 0x7800_0004;

impl HmemError {
    /// An `Inval` error.
    pub fn inval(op: &'static str, reason: impl Into<String>) -> Self {
        HmemError::Inval {
            op,
            reason: reason.into(),
        }
    }

    /// An `Unsupported` error.
    pub fn unsupported(iface: Iface, op: &'static str, reason: impl Into<String>) -> Self {
        HmemError::Unsupported {
            iface,
            op,
            reason: reason.into(),
        }
    }

    /// Wraps the calling thread's `errno` after a failed libc call.
    pub fn last_os(op: &'static str) -> Self {
        let e = std::io::Error::last_os_error();
        HmemError::Os {
            op,
            source: OsError {
                code: e.raw_os_error().unwrap_or(FI_EIO),
                text: e.to_string(),
            },
        }
    }

    /// libfabric's positive error number for this error.
    pub fn errno(&self) -> i32 {
        match self {
            HmemError::Unavailable(_) | HmemError::NotBuilt { .. } => FI_ENOSYS,
            HmemError::Unsupported { .. } => FI_EOPNOTSUPP,
            HmemError::Inval { .. } => FI_EINVAL,
            HmemError::Cuda { code, .. } => match *code {
                CUDA_ERROR_INVALID_VALUE => FI_EINVAL,
                CUDA_ERROR_OUT_OF_MEMORY => FI_ENOMEM,
                _ => FI_EIO,
            },
            HmemError::Ze { code, .. } => match *code {
                ZE_INVALID_ARGUMENT => FI_EINVAL,
                ZE_OUT_OF_HOST_MEMORY | ZE_OUT_OF_DEVICE_MEMORY => FI_ENOMEM,
                _ => FI_EIO,
            },
            HmemError::Os { source, .. } => source.code,
        }
    }
}

impl From<HmemError> for xfabric_core::Error {
    fn from(e: HmemError) -> Self {
        use xfabric_core::Error;
        let text = e.to_string();
        match e.errno() {
            FI_ENOSYS => Error::NoSys(text),
            FI_EOPNOTSUPP => Error::OpNotSupp(text),
            FI_EINVAL => Error::Inval(text),
            FI_ENOMEM => Error::NoMem(text),
            code => {
                let op = match &e {
                    HmemError::Cuda { op, .. } | HmemError::Ze { op, .. } => op,
                    HmemError::Os { op, .. } => op,
                    _ => "hmem",
                };
                Error::Os {
                    op: (*op).to_string(),
                    source: OsError { code, text },
                }
            }
        }
    }
}

/// Errors met while freeing or closing something in `Drop`, kept for the owner to collect
/// (`HmemIface::take_drop_errors`) instead of panicking or vanishing.
#[derive(Debug, Default)]
pub struct DropErrors(Mutex<Vec<HmemError>>);

impl DropErrors {
    /// Keeps `e` for a later `take`.
    pub fn record(&self, e: HmemError) {
        // A poisoned lock only means another thread panicked while pushing; the list is
        // still a list.
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(e);
    }

    /// Returns and clears the errors recorded so far.
    pub fn take(&self) -> Vec<HmemError> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_and_core_conversion() {
        let u: HmemError = Unavailable {
            iface: Iface::Cuda,
            reason: "libcuda not found".into(),
        }
        .into();
        assert_eq!(u.errno(), FI_ENOSYS);
        assert!(u
            .to_string()
            .contains("FI_HMEM_CUDA is unavailable: libcuda not found"));
        assert!(
            matches!(xfabric_core::Error::from(u), xfabric_core::Error::NoSys(m) if m.contains("libcuda"))
        );

        let oom = HmemError::Cuda {
            op: "cuMemAlloc",
            code: CUDA_ERROR_OUT_OF_MEMORY,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
        };
        assert!(matches!(
            xfabric_core::Error::from(oom),
            xfabric_core::Error::NoMem(_)
        ));

        let other = HmemError::Ze {
            op: "zeMemFree",
            code: 0x7000_0001,
            name: "ZE_RESULT_ERROR_DEVICE_LOST",
        };
        match xfabric_core::Error::from(other) {
            xfabric_core::Error::Os { op, source } => {
                assert_eq!(op, "zeMemFree");
                assert_eq!(source.code, FI_EIO);
                assert!(source.text.contains("DEVICE_LOST"));
            }
            e => panic!("unexpected {e:?}"),
        }
    }

    #[test]
    fn drop_errors_are_kept_until_taken() {
        let d = DropErrors::default();
        d.record(HmemError::inval("x", "y"));
        assert_eq!(d.take().len(), 1);
        assert!(d.take().is_empty());
    }
}
