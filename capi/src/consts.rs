//! The numbers of libfabric 1.17's headers that more than one part of this library uses: the
//! API version, the error codes it answers with, and the fid classes. A number only one
//! translation reads (a flag, a command, an option name) stays beside that translation.

use std::ffi::c_int;

/// `FI_VERSION(1, 17)`: the API this library implements.
pub const FI_VERSION_1_17: u32 = (1 << 16) | 17;
/// `FI_VERSION(1, 5)`: from this version on `mr_mode` is a bit mask (before it an enum, and
/// domain attributes carried no authorization key), and `struct fi_cq_err_entry` carries
/// `err_data_size`, with `err_data` a buffer the caller may hand in.
pub const FI_VERSION_1_5: u32 = (1 << 16) | 5;
/// `FI_VERSION(1, 10)`: from this version on `struct fi_mr_attr` ends with `iface` and
/// `device` (heterogeneous memory).
pub const FI_VERSION_1_10: u32 = (1 << 16) | 10;

// Error codes (fi_errno.h): the system's errno values, then libfabric's own from 256.
/// `FI_EINVAL`: an argument was wrong.
pub const FI_EINVAL: c_int = libc::EINVAL;
/// `FI_ENOSYS`: xfabric does not do this.
pub const FI_ENOSYS: c_int = libc::ENOSYS;
/// `FI_EBUSY`: an object still in use by others (fi_close of a parent with children open).
pub const FI_EBUSY: c_int = libc::EBUSY;
/// `FI_ENODATA`: nothing matched (getinfo).
pub const FI_ENODATA: c_int = libc::ENODATA;
/// `FI_ENOMEM`: an allocation failed.
pub const FI_ENOMEM: c_int = libc::ENOMEM;
/// `FI_EOPNOTSUPP`: a defined operation this object does not take.
pub const FI_EOPNOTSUPP: c_int = libc::EOPNOTSUPP;
/// `FI_EOTHER`: an unspecified error (and what a caught panic becomes).
pub const FI_EOTHER: c_int = 256;
/// `FI_ETOOSMALL`: the caller's buffer is too small.
pub const FI_ETOOSMALL: c_int = 257;
/// `FI_EBADFLAGS`: flags the call does not take.
pub const FI_EBADFLAGS: c_int = 260;

// `enum fi_class` values of the objects translated here.
/// `FI_CLASS_FABRIC`: a fabric.
pub const FI_CLASS_FABRIC: usize = 1;
/// `FI_CLASS_DOMAIN`: a domain.
pub const FI_CLASS_DOMAIN: usize = 2;
/// `FI_CLASS_EP`: an endpoint.
pub const FI_CLASS_EP: usize = 3;
/// `FI_CLASS_AV`: an address vector.
pub const FI_CLASS_AV: usize = 11;
/// `FI_CLASS_MR`: a memory region.
pub const FI_CLASS_MR: usize = 12;
/// `FI_CLASS_EQ`: an event queue.
pub const FI_CLASS_EQ: usize = 13;
/// `FI_CLASS_CQ`: a completion queue.
pub const FI_CLASS_CQ: usize = 14;
/// `FI_CLASS_CNTR`: a counter.
pub const FI_CLASS_CNTR: usize = 15;
/// `FI_CLASS_WAIT`: a wait set.
pub const FI_CLASS_WAIT: usize = 16;
/// `FI_CLASS_POLL`: a poll set.
pub const FI_CLASS_POLL: usize = 17;
