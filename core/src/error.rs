//! The one error type of xfabric-core. Every variant says what failed and why; `errno()` maps it
//! to libfabric's number so the C ABI is a translation, not a second vocabulary.

use crate::consts::errno::*;

/// Result alias used across xfabric: `Ok`, or the negative return code libfabric's C call
/// would give, as an [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An xfabric error: libfabric's negative return codes (`-FI_EAGAIN`, `-FI_EINVAL`, ...) as a
/// type, with a message saying what was wrong; `errno` gives the number. `Again` never allocates: it is returned on hot paths (a full ring, an empty
/// CQ) and the caller simply retries after driving progress.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Nothing to return now, or no room now: drive progress and try again (`-FI_EAGAIN`).
    #[error("{0}: resource temporarily unavailable, try again")]
    Again(&'static str),
    /// An error completion is waiting in the queue's error queue (`-FI_EAVAIL`).
    #[error("an error entry is available: read it with readerr")]
    Avail,
    /// An argument is not valid for this call (`-FI_EINVAL`).
    #[error("invalid argument: {0}")]
    Inval(String),
    /// Nothing matched the request, e.g. getinfo hints no provider satisfies (`-FI_ENODATA`).
    #[error("no data: {0}")]
    NoData(String),
    /// The object is still in use (`-FI_EBUSY`).
    #[error("busy: {0}")]
    Busy(String),
    /// The provider does not implement this (`-FI_ENOSYS`).
    #[error("not implemented: {0}")]
    NoSys(String),
    /// The operation is not supported for these arguments or this object (`-FI_EOPNOTSUPP`).
    #[error("operation not supported: {0}")]
    OpNotSupp(String),
    /// The object is in the wrong state for this call, e.g. not enabled (`-FI_EOPBADSTATE`).
    #[error("operation not permitted in the current state: {0}")]
    OpBadState(String),
    /// Endpoint has no completion queue bound for this operation (`-FI_ENOCQ`).
    #[error("no completion queue: {0}")]
    NoCq(String),
    /// Endpoint has no address vector bound (`-FI_ENOAV`).
    #[error("no address vector: {0}")]
    NoAv(String),
    /// Endpoint has no event queue bound (`-FI_ENOEQ`).
    #[error("no event queue: {0}")]
    NoEq(String),
    /// Flags that this call does not accept (`-FI_EBADFLAGS`).
    #[error("unsupported flags: {0}")]
    BadFlags(String),
    /// A buffer given to the call is too small (`-FI_ETOOSMALL`).
    #[error("buffer too small: {0}")]
    TooSmall(String),
    /// Message larger than the endpoint allows (`-FI_EMSGSIZE`).
    #[error("message too long: {0}")]
    MsgSize(String),
    /// The completion queue was overrun; it is no longer usable (`-FI_EOVERRUN`).
    #[error("completion queue overrun: completions were lost and the queue is unusable")]
    Overrun,
    /// A blocking call reached its timeout (`-FI_ETIMEDOUT`).
    #[error("{0}: timed out")]
    TimedOut(&'static str),
    /// A blocking call was woken by a signal call (`-FI_EINTR` in spirit; libfabric returns EAGAIN).
    #[error("{0}: interrupted by a signal call")]
    Interrupted(&'static str),
    /// Nothing was found for a key or address (`-FI_ENOENT`).
    #[error("not found: {0}")]
    NoEntry(String),
    /// Out of memory or of a fixed-size resource (`-FI_ENOMEM`).
    #[error("out of memory: {0}")]
    NoMem(String),
    /// Access denied, e.g. a memory key without the right access (`-FI_EACCES`).
    #[error("access denied: {0}")]
    Access(String),
    /// A key is already in use (`-FI_ENOKEY`).
    #[error("key not available: {0}")]
    NoKey(String),
    /// The peer is gone: its process died or closed its endpoint (`-FI_ECONNRESET`).
    #[error("peer lost: {0}")]
    PeerLost(String),
    /// The operation was canceled (`-FI_ECANCELED`).
    #[error("canceled")]
    Canceled,
    /// An operating-system call failed.
    #[error("{op}: {source}")]
    Os {
        /// What was being attempted.
        op: String,
        /// The OS error.
        #[source]
        source: OsError,
    },
}

/// `std::io::Error` is not `Clone`/`PartialEq`; this keeps the errno and its text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text} (os error {code})")]
pub struct OsError {
    /// The raw errno.
    pub code: i32,
    /// Its description.
    pub text: String,
}

impl Error {
    /// Wraps the calling thread's `errno` after a failed libc call.
    pub fn last_os(op: impl Into<String>) -> Self {
        Self::from_io(op, std::io::Error::last_os_error())
    }

    /// Wraps an `io::Error`.
    pub fn from_io(op: impl Into<String>, e: std::io::Error) -> Self {
        Error::Os {
            op: op.into(),
            source: OsError {
                code: e.raw_os_error().unwrap_or(FI_EIO),
                text: e.to_string(),
            },
        }
    }

    /// libfabric's positive error number for this error (the C ABI returns its negation).
    pub fn errno(&self) -> i32 {
        match self {
            Error::Again(_) => FI_EAGAIN,
            Error::Avail => FI_EAVAIL,
            Error::Inval(_) => FI_EINVAL,
            Error::NoData(_) => FI_ENODATA,
            Error::Busy(_) => FI_EBUSY,
            Error::NoSys(_) => FI_ENOSYS,
            Error::OpNotSupp(_) => FI_EOPNOTSUPP,
            Error::OpBadState(_) => FI_EOPBADSTATE,
            Error::NoCq(_) => FI_ENOCQ,
            Error::NoAv(_) => FI_ENOAV,
            Error::NoEq(_) => FI_ENOEQ,
            Error::BadFlags(_) => FI_EBADFLAGS,
            Error::TooSmall(_) => FI_ETOOSMALL,
            Error::MsgSize(_) => FI_EMSGSIZE,
            Error::Overrun => FI_EOVERRUN,
            Error::TimedOut(_) => FI_ETIMEDOUT,
            Error::Interrupted(_) => FI_EAGAIN,
            Error::NoEntry(_) => FI_ENOENT,
            Error::NoMem(_) => FI_ENOMEM,
            Error::Access(_) => FI_EACCES,
            Error::NoKey(_) => FI_ENOKEY,
            Error::PeerLost(_) => FI_ECONNRESET,
            Error::Canceled => FI_ECANCELED,
            Error::Os { source, .. } => source.code,
        }
    }

    /// True for `Again`: the caller should drive progress and retry.
    pub fn is_again(&self) -> bool {
        matches!(self, Error::Again(_))
    }
}

/// `fi_strerror`: text for a libfabric error number (positive or negative). Any `i32` has an
/// answer: `i32::MIN` has no positive counterpart in `i32`, so the magnitude is taken unsigned.
pub fn strerror(errnum: i32) -> String {
    let Ok(e) = i32::try_from(errnum.unsigned_abs()) else {
        return format!("Unknown error {}", errnum.unsigned_abs());
    };
    let s = match e {
        FI_SUCCESS => "Success",
        FI_EOTHER => "Unspecified error",
        FI_ETOOSMALL => "Provided buffer is too small",
        FI_EOPBADSTATE => "Operation not permitted in current state",
        FI_EAVAIL => "Error available",
        FI_EBADFLAGS => "Flags not supported",
        FI_ENOEQ => "Missing or unavailable event queue",
        FI_EDOMAIN => "Invalid resource domain",
        FI_ENOCQ => "Missing or unavailable completion queue",
        FI_ECRC => "CRC error",
        FI_ETRUNC => "Truncation error",
        FI_ENOKEY => "Required key not available",
        FI_ENOAV => "Missing or unavailable address vector",
        FI_EOVERRUN => "Queue has been overrun",
        FI_ENORX => "Receiver not ready, no receive buffers available",
        _ => return std::io::Error::from_raw_os_error(e).to_string(),
    };
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping_and_text() {
        assert_eq!(Error::Again("cq read").errno(), libc::EAGAIN);
        assert_eq!(Error::Overrun.errno(), 268);
        assert_eq!(strerror(-265), "Truncation error");
    }

    #[test]
    fn strerror_answers_every_i32() {
        assert_eq!(strerror(0), "Success");
        assert_eq!(strerror(i32::MIN), "Unknown error 2147483648");
        assert!(!strerror(i32::MAX).is_empty());
        assert!(!strerror(i32::MIN + 1).is_empty());
        assert!(Error::Inval("bad count".into())
            .to_string()
            .contains("bad count"));
    }
}
