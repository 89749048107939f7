// Generated from the fi_ops_* declarations of libfabric 1.17's headers (member order and
// C types); regenerate rather than edit. Every member defaults to a function of its signature
// answering -FI_ENOSYS (null or an empty string where it returns a pointer).

use std::ffi::{c_char, c_int, c_void};

use crate::consts::FI_ENOSYS;

/// A function of the given signature that ignores its arguments and answers `$v`.
macro_rules! stub {
    (($($a:ty),*) -> $r:ty = $v:expr) => {{
        unsafe extern "C" fn f($(_: $a),*) -> $r {
            $v
        }
        f
    }};
}

/// `struct fi_ops`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiOps {
    pub size: usize,
    pub close: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub bind: unsafe extern "C" fn(*mut c_void, *mut c_void, u64) -> c_int,
    pub control: unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> c_int,
    pub ops_open: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        u64,
        *mut *mut c_void,
        *mut c_void,
    ) -> c_int,
    pub tostr: unsafe extern "C" fn(*const c_void, *mut c_void, usize) -> c_int,
    pub ops_set:
        unsafe extern "C" fn(*mut c_void, *const c_void, u64, *mut c_void, *mut c_void) -> c_int,
}

impl FiOps {
    /// Every member answering -FI_ENOSYS.
    pub const ENOSYS: Self = Self {
        size: size_of::<Self>(),
        close: stub!((*mut c_void) -> c_int = -FI_ENOSYS),
        bind: stub!((*mut c_void, *mut c_void, u64) -> c_int = -FI_ENOSYS),
        control: stub!((*mut c_void, c_int, *mut c_void) -> c_int = -FI_ENOSYS),
        ops_open: stub!((*mut c_void, *const c_void, u64, *mut *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        tostr: stub!((*const c_void, *mut c_void, usize) -> c_int = -FI_ENOSYS),
        ops_set: stub!((*mut c_void, *const c_void, u64, *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
    };
}

/// `struct fi_ops_fabric`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiOpsFabric {
    pub size: usize,
    pub domain:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int,
    pub passive_ep:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int,
    pub eq_open:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int,
    pub wait_open: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void) -> c_int,
    pub trywait: unsafe extern "C" fn(*mut c_void, *mut *mut c_void, c_int) -> c_int,
    pub domain2:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void, u64, *mut c_void) -> c_int,
}

impl FiOpsFabric {
    /// Every member answering -FI_ENOSYS.
    pub const ENOSYS: Self = Self {
        size: size_of::<Self>(),
        domain: stub!((*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        passive_ep: stub!((*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        eq_open: stub!((*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        wait_open: stub!((*mut c_void, *mut c_void, *mut *mut c_void) -> c_int = -FI_ENOSYS),
        trywait: stub!((*mut c_void, *mut *mut c_void, c_int) -> c_int = -FI_ENOSYS),
        domain2: stub!((*mut c_void, *mut c_void, *mut *mut c_void, u64, *mut c_void) -> c_int = -FI_ENOSYS),
    };
}

/// `struct fi_ops_domain`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiOpsDomain {
    pub size: usize,
    pub av_open:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int,
    pub cq_open:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int,
    pub endpoint:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int,
    pub scalable_ep:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int,
    pub cntr_open:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int,
    pub poll_open: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void) -> c_int,
    pub stx_ctx:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int,
    pub srx_ctx:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int,
    pub query_atomic: unsafe extern "C" fn(*mut c_void, c_int, c_int, *mut c_void, u64) -> c_int,
    pub query_collective: unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, u64) -> c_int,
    pub endpoint2:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void, u64, *mut c_void) -> c_int,
}

impl FiOpsDomain {
    /// Every member answering -FI_ENOSYS.
    pub const ENOSYS: Self = Self {
        size: size_of::<Self>(),
        av_open: stub!((*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        cq_open: stub!((*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        endpoint: stub!((*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        scalable_ep: stub!((*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        cntr_open: stub!((*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        poll_open: stub!((*mut c_void, *mut c_void, *mut *mut c_void) -> c_int = -FI_ENOSYS),
        stx_ctx: stub!((*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        srx_ctx: stub!((*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        query_atomic: stub!((*mut c_void, c_int, c_int, *mut c_void, u64) -> c_int = -FI_ENOSYS),
        query_collective: stub!((*mut c_void, c_int, *mut c_void, u64) -> c_int = -FI_ENOSYS),
        endpoint2: stub!((*mut c_void, *mut c_void, *mut *mut c_void, u64, *mut c_void) -> c_int = -FI_ENOSYS),
    };
}

/// `struct fi_ops_mr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiOpsMr {
    pub size: usize,
    pub reg: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        usize,
        u64,
        u64,
        u64,
        u64,
        *mut *mut c_void,
        *mut c_void,
    ) -> c_int,
    pub regv: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        usize,
        u64,
        u64,
        u64,
        u64,
        *mut *mut c_void,
        *mut c_void,
    ) -> c_int,
    pub regattr: unsafe extern "C" fn(*mut c_void, *const c_void, u64, *mut *mut c_void) -> c_int,
}

impl FiOpsMr {
    /// Every member answering -FI_ENOSYS.
    pub const ENOSYS: Self = Self {
        size: size_of::<Self>(),
        reg: stub!((*mut c_void, *const c_void, usize, u64, u64, u64, u64, *mut *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        regv: stub!((*mut c_void, *const c_void, usize, u64, u64, u64, u64, *mut *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        regattr: stub!((*mut c_void, *const c_void, u64, *mut *mut c_void) -> c_int = -FI_ENOSYS),
    };
}

/// `struct fi_ops_av`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiOpsAv {
    pub size: usize,
    pub insert: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        usize,
        *mut c_void,
        u64,
        *mut c_void,
    ) -> c_int,
    pub insertsvc: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        *const c_void,
        *mut c_void,
        u64,
        *mut c_void,
    ) -> c_int,
    pub insertsym: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        usize,
        *const c_void,
        usize,
        *mut c_void,
        u64,
        *mut c_void,
    ) -> c_int,
    pub remove: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, u64) -> c_int,
    pub lookup: unsafe extern "C" fn(*mut c_void, u64, *mut c_void, *mut c_void) -> c_int,
    pub straddr:
        unsafe extern "C" fn(*mut c_void, *const c_void, *mut c_void, *mut c_void) -> *const c_char,
    pub av_set:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int,
}

impl FiOpsAv {
    /// Every member answering -FI_ENOSYS.
    pub const ENOSYS: Self = Self {
        size: size_of::<Self>(),
        insert: stub!((*mut c_void, *const c_void, usize, *mut c_void, u64, *mut c_void) -> c_int = -FI_ENOSYS),
        insertsvc: stub!((*mut c_void, *const c_void, *const c_void, *mut c_void, u64, *mut c_void) -> c_int = -FI_ENOSYS),
        insertsym: stub!((*mut c_void, *const c_void, usize, *const c_void, usize, *mut c_void, u64, *mut c_void) -> c_int = -FI_ENOSYS),
        remove: stub!((*mut c_void, *mut c_void, usize, u64) -> c_int = -FI_ENOSYS),
        lookup: stub!((*mut c_void, u64, *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        straddr: stub!((*mut c_void, *const c_void, *mut c_void, *mut c_void) -> *const c_char = c"".as_ptr()),
        av_set: stub!((*mut c_void, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
    };
}

/// `struct fi_ops_cq`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiOpsCq {
    pub size: usize,
    pub read: unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> isize,
    pub readfrom: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, *mut c_void) -> isize,
    pub readerr: unsafe extern "C" fn(*mut c_void, *mut c_void, u64) -> isize,
    pub sread: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, *const c_void, c_int) -> isize,
    pub sreadfrom: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        usize,
        *mut c_void,
        *const c_void,
        c_int,
    ) -> isize,
    pub signal: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub strerror: unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *const c_void,
        *mut c_void,
        usize,
    ) -> *const c_char,
}

impl FiOpsCq {
    /// Every member answering -FI_ENOSYS.
    pub const ENOSYS: Self = Self {
        size: size_of::<Self>(),
        read: stub!((*mut c_void, *mut c_void, usize) -> isize = -(FI_ENOSYS as isize)),
        readfrom: stub!((*mut c_void, *mut c_void, usize, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        readerr: stub!((*mut c_void, *mut c_void, u64) -> isize = -(FI_ENOSYS as isize)),
        sread: stub!((*mut c_void, *mut c_void, usize, *const c_void, c_int) -> isize = -(FI_ENOSYS as isize)),
        sreadfrom: stub!((*mut c_void, *mut c_void, usize, *mut c_void, *const c_void, c_int) -> isize = -(FI_ENOSYS as isize)),
        signal: stub!((*mut c_void) -> c_int = -FI_ENOSYS),
        strerror: stub!((*mut c_void, c_int, *const c_void, *mut c_void, usize) -> *const c_char = c"".as_ptr()),
    };
}

/// `struct fi_ops_cntr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiOpsCntr {
    pub size: usize,
    pub read: unsafe extern "C" fn(*mut c_void) -> u64,
    pub readerr: unsafe extern "C" fn(*mut c_void) -> u64,
    pub add: unsafe extern "C" fn(*mut c_void, u64) -> c_int,
    pub set: unsafe extern "C" fn(*mut c_void, u64) -> c_int,
    pub wait: unsafe extern "C" fn(*mut c_void, u64, c_int) -> c_int,
    pub adderr: unsafe extern "C" fn(*mut c_void, u64) -> c_int,
    pub seterr: unsafe extern "C" fn(*mut c_void, u64) -> c_int,
}

impl FiOpsCntr {
    /// Every member answering -FI_ENOSYS.
    pub const ENOSYS: Self = Self {
        size: size_of::<Self>(),
        read: stub!((*mut c_void) -> u64 = 0),
        readerr: stub!((*mut c_void) -> u64 = 0),
        add: stub!((*mut c_void, u64) -> c_int = -FI_ENOSYS),
        set: stub!((*mut c_void, u64) -> c_int = -FI_ENOSYS),
        wait: stub!((*mut c_void, u64, c_int) -> c_int = -FI_ENOSYS),
        adderr: stub!((*mut c_void, u64) -> c_int = -FI_ENOSYS),
        seterr: stub!((*mut c_void, u64) -> c_int = -FI_ENOSYS),
    };
}

/// `struct fi_ops_eq`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiOpsEq {
    pub size: usize,
    pub read: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void, usize, u64) -> isize,
    pub readerr: unsafe extern "C" fn(*mut c_void, *mut c_void, u64) -> isize,
    pub write: unsafe extern "C" fn(*mut c_void, u32, *const c_void, usize, u64) -> isize,
    pub sread:
        unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void, usize, c_int, u64) -> isize,
    pub strerror: unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *const c_void,
        *mut c_void,
        usize,
    ) -> *const c_char,
}

impl FiOpsEq {
    /// Every member answering -FI_ENOSYS.
    pub const ENOSYS: Self = Self {
        size: size_of::<Self>(),
        read: stub!((*mut c_void, *mut c_void, *mut c_void, usize, u64) -> isize = -(FI_ENOSYS as isize)),
        readerr: stub!((*mut c_void, *mut c_void, u64) -> isize = -(FI_ENOSYS as isize)),
        write: stub!((*mut c_void, u32, *const c_void, usize, u64) -> isize = -(FI_ENOSYS as isize)),
        sread: stub!((*mut c_void, *mut c_void, *mut c_void, usize, c_int, u64) -> isize = -(FI_ENOSYS as isize)),
        strerror: stub!((*mut c_void, c_int, *const c_void, *mut c_void, usize) -> *const c_char = c"".as_ptr()),
    };
}

/// `struct fi_ops_wait`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiOpsWait {
    pub size: usize,
    pub wait: unsafe extern "C" fn(*mut c_void, c_int) -> c_int,
}

impl FiOpsWait {
    /// Every member answering -FI_ENOSYS.
    pub const ENOSYS: Self = Self {
        size: size_of::<Self>(),
        wait: stub!((*mut c_void, c_int) -> c_int = -FI_ENOSYS),
    };
}

/// `struct fi_ops_poll`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiOpsPoll {
    pub size: usize,
    pub poll: unsafe extern "C" fn(*mut c_void, *mut *mut c_void, c_int) -> c_int,
    pub poll_add: unsafe extern "C" fn(*mut c_void, *mut c_void, u64) -> c_int,
    pub poll_del: unsafe extern "C" fn(*mut c_void, *mut c_void, u64) -> c_int,
}

impl FiOpsPoll {
    /// Every member answering -FI_ENOSYS.
    pub const ENOSYS: Self = Self {
        size: size_of::<Self>(),
        poll: stub!((*mut c_void, *mut *mut c_void, c_int) -> c_int = -FI_ENOSYS),
        poll_add: stub!((*mut c_void, *mut c_void, u64) -> c_int = -FI_ENOSYS),
        poll_del: stub!((*mut c_void, *mut c_void, u64) -> c_int = -FI_ENOSYS),
    };
}

/// `struct fi_ops_ep`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiOpsEp {
    pub size: usize,
    pub cancel: unsafe extern "C" fn(*mut c_void, *mut c_void) -> isize,
    pub getopt: unsafe extern "C" fn(*mut c_void, c_int, c_int, *mut c_void, *mut c_void) -> c_int,
    pub setopt: unsafe extern "C" fn(*mut c_void, c_int, c_int, *const c_void, usize) -> c_int,
    pub tx_ctx: unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *mut c_void,
        *mut *mut c_void,
        *mut c_void,
    ) -> c_int,
    pub rx_ctx: unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *mut c_void,
        *mut *mut c_void,
        *mut c_void,
    ) -> c_int,
    pub rx_size_left: unsafe extern "C" fn(*mut c_void) -> isize,
    pub tx_size_left: unsafe extern "C" fn(*mut c_void) -> isize,
}

impl FiOpsEp {
    /// Every member answering -FI_ENOSYS.
    pub const ENOSYS: Self = Self {
        size: size_of::<Self>(),
        cancel: stub!((*mut c_void, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        getopt: stub!((*mut c_void, c_int, c_int, *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        setopt: stub!((*mut c_void, c_int, c_int, *const c_void, usize) -> c_int = -FI_ENOSYS),
        tx_ctx: stub!((*mut c_void, c_int, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        rx_ctx: stub!((*mut c_void, c_int, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        rx_size_left: stub!((*mut c_void) -> isize = -(FI_ENOSYS as isize)),
        tx_size_left: stub!((*mut c_void) -> isize = -(FI_ENOSYS as isize)),
    };
}

/// `struct fi_ops_msg`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiOpsMsg {
    pub size: usize,
    pub recv: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        usize,
        *mut c_void,
        u64,
        *mut c_void,
    ) -> isize,
    pub recvv: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        *mut *mut c_void,
        usize,
        u64,
        *mut c_void,
    ) -> isize,
    pub recvmsg: unsafe extern "C" fn(*mut c_void, *const c_void, u64) -> isize,
    pub send: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        usize,
        *mut c_void,
        u64,
        *mut c_void,
    ) -> isize,
    pub sendv: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        *mut *mut c_void,
        usize,
        u64,
        *mut c_void,
    ) -> isize,
    pub sendmsg: unsafe extern "C" fn(*mut c_void, *const c_void, u64) -> isize,
    pub inject: unsafe extern "C" fn(*mut c_void, *const c_void, usize, u64) -> isize,
    pub senddata: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        usize,
        *mut c_void,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub injectdata: unsafe extern "C" fn(*mut c_void, *const c_void, usize, u64, u64) -> isize,
}

impl FiOpsMsg {
    /// Every member answering -FI_ENOSYS.
    pub const ENOSYS: Self = Self {
        size: size_of::<Self>(),
        recv: stub!((*mut c_void, *mut c_void, usize, *mut c_void, u64, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        recvv: stub!((*mut c_void, *const c_void, *mut *mut c_void, usize, u64, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        recvmsg: stub!((*mut c_void, *const c_void, u64) -> isize = -(FI_ENOSYS as isize)),
        send: stub!((*mut c_void, *const c_void, usize, *mut c_void, u64, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        sendv: stub!((*mut c_void, *const c_void, *mut *mut c_void, usize, u64, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        sendmsg: stub!((*mut c_void, *const c_void, u64) -> isize = -(FI_ENOSYS as isize)),
        inject: stub!((*mut c_void, *const c_void, usize, u64) -> isize = -(FI_ENOSYS as isize)),
        senddata: stub!((*mut c_void, *const c_void, usize, *mut c_void, u64, u64, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        injectdata: stub!((*mut c_void, *const c_void, usize, u64, u64) -> isize = -(FI_ENOSYS as isize)),
    };
}

/// `struct fi_ops_tagged`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiOpsTagged {
    pub size: usize,
    pub recv: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        usize,
        *mut c_void,
        u64,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub recvv: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        *mut *mut c_void,
        usize,
        u64,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub recvmsg: unsafe extern "C" fn(*mut c_void, *const c_void, u64) -> isize,
    pub send: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        usize,
        *mut c_void,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub sendv: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        *mut *mut c_void,
        usize,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub sendmsg: unsafe extern "C" fn(*mut c_void, *const c_void, u64) -> isize,
    pub inject: unsafe extern "C" fn(*mut c_void, *const c_void, usize, u64, u64) -> isize,
    pub senddata: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        usize,
        *mut c_void,
        u64,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub injectdata: unsafe extern "C" fn(*mut c_void, *const c_void, usize, u64, u64, u64) -> isize,
}

impl FiOpsTagged {
    /// Every member answering -FI_ENOSYS.
    pub const ENOSYS: Self = Self {
        size: size_of::<Self>(),
        recv: stub!((*mut c_void, *mut c_void, usize, *mut c_void, u64, u64, u64, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        recvv: stub!((*mut c_void, *const c_void, *mut *mut c_void, usize, u64, u64, u64, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        recvmsg: stub!((*mut c_void, *const c_void, u64) -> isize = -(FI_ENOSYS as isize)),
        send: stub!((*mut c_void, *const c_void, usize, *mut c_void, u64, u64, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        sendv: stub!((*mut c_void, *const c_void, *mut *mut c_void, usize, u64, u64, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        sendmsg: stub!((*mut c_void, *const c_void, u64) -> isize = -(FI_ENOSYS as isize)),
        inject: stub!((*mut c_void, *const c_void, usize, u64, u64) -> isize = -(FI_ENOSYS as isize)),
        senddata: stub!((*mut c_void, *const c_void, usize, *mut c_void, u64, u64, u64, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        injectdata: stub!((*mut c_void, *const c_void, usize, u64, u64, u64) -> isize = -(FI_ENOSYS as isize)),
    };
}

/// `struct fi_ops_rma`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiOpsRma {
    pub size: usize,
    pub read: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        usize,
        *mut c_void,
        u64,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub readv: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        *mut *mut c_void,
        usize,
        u64,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub readmsg: unsafe extern "C" fn(*mut c_void, *const c_void, u64) -> isize,
    pub write: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        usize,
        *mut c_void,
        u64,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub writev: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        *mut *mut c_void,
        usize,
        u64,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub writemsg: unsafe extern "C" fn(*mut c_void, *const c_void, u64) -> isize,
    pub inject: unsafe extern "C" fn(*mut c_void, *const c_void, usize, u64, u64, u64) -> isize,
    pub writedata: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        usize,
        *mut c_void,
        u64,
        u64,
        u64,
        u64,
        *mut c_void,
    ) -> isize,
    pub injectdata:
        unsafe extern "C" fn(*mut c_void, *const c_void, usize, u64, u64, u64, u64) -> isize,
}

impl FiOpsRma {
    /// Every member answering -FI_ENOSYS.
    pub const ENOSYS: Self = Self {
        size: size_of::<Self>(),
        read: stub!((*mut c_void, *mut c_void, usize, *mut c_void, u64, u64, u64, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        readv: stub!((*mut c_void, *const c_void, *mut *mut c_void, usize, u64, u64, u64, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        readmsg: stub!((*mut c_void, *const c_void, u64) -> isize = -(FI_ENOSYS as isize)),
        write: stub!((*mut c_void, *const c_void, usize, *mut c_void, u64, u64, u64, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        writev: stub!((*mut c_void, *const c_void, *mut *mut c_void, usize, u64, u64, u64, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        writemsg: stub!((*mut c_void, *const c_void, u64) -> isize = -(FI_ENOSYS as isize)),
        inject: stub!((*mut c_void, *const c_void, usize, u64, u64, u64) -> isize = -(FI_ENOSYS as isize)),
        writedata: stub!((*mut c_void, *const c_void, usize, *mut c_void, u64, u64, u64, u64, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        injectdata: stub!((*mut c_void, *const c_void, usize, u64, u64, u64, u64) -> isize = -(FI_ENOSYS as isize)),
    };
}

/// `struct fi_ops_atomic`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiOpsAtomic {
    pub size: usize,
    pub write: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        usize,
        *mut c_void,
        u64,
        u64,
        u64,
        c_int,
        c_int,
        *mut c_void,
    ) -> isize,
    pub writev: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        *mut *mut c_void,
        usize,
        u64,
        u64,
        u64,
        c_int,
        c_int,
        *mut c_void,
    ) -> isize,
    pub writemsg: unsafe extern "C" fn(*mut c_void, *const c_void, u64) -> isize,
    pub inject: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        usize,
        u64,
        u64,
        u64,
        c_int,
        c_int,
    ) -> isize,
    pub readwrite: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        usize,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        u64,
        u64,
        u64,
        c_int,
        c_int,
        *mut c_void,
    ) -> isize,
    pub readwritev: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        *mut *mut c_void,
        usize,
        *mut c_void,
        *mut *mut c_void,
        usize,
        u64,
        u64,
        u64,
        c_int,
        c_int,
        *mut c_void,
    ) -> isize,
    pub readwritemsg: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        *mut c_void,
        *mut *mut c_void,
        usize,
        u64,
    ) -> isize,
    pub compwrite: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        usize,
        *mut c_void,
        *const c_void,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        u64,
        u64,
        u64,
        c_int,
        c_int,
        *mut c_void,
    ) -> isize,
    pub compwritev: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        *mut *mut c_void,
        usize,
        *const c_void,
        *mut *mut c_void,
        usize,
        *mut c_void,
        *mut *mut c_void,
        usize,
        u64,
        u64,
        u64,
        c_int,
        c_int,
        *mut c_void,
    ) -> isize,
    pub compwritemsg: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        *const c_void,
        *mut *mut c_void,
        usize,
        *mut c_void,
        *mut *mut c_void,
        usize,
        u64,
    ) -> isize,
    pub writevalid: unsafe extern "C" fn(*mut c_void, c_int, c_int, *mut c_void) -> c_int,
    pub readwritevalid: unsafe extern "C" fn(*mut c_void, c_int, c_int, *mut c_void) -> c_int,
    pub compwritevalid: unsafe extern "C" fn(*mut c_void, c_int, c_int, *mut c_void) -> c_int,
}

impl FiOpsAtomic {
    /// Every member answering -FI_ENOSYS.
    pub const ENOSYS: Self = Self {
        size: size_of::<Self>(),
        write: stub!((*mut c_void, *const c_void, usize, *mut c_void, u64, u64, u64, c_int, c_int, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        writev: stub!((*mut c_void, *const c_void, *mut *mut c_void, usize, u64, u64, u64, c_int, c_int, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        writemsg: stub!((*mut c_void, *const c_void, u64) -> isize = -(FI_ENOSYS as isize)),
        inject: stub!((*mut c_void, *const c_void, usize, u64, u64, u64, c_int, c_int) -> isize = -(FI_ENOSYS as isize)),
        readwrite: stub!((*mut c_void, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, u64, u64, u64, c_int, c_int, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        readwritev: stub!((*mut c_void, *const c_void, *mut *mut c_void, usize, *mut c_void, *mut *mut c_void, usize, u64, u64, u64, c_int, c_int, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        readwritemsg: stub!((*mut c_void, *const c_void, *mut c_void, *mut *mut c_void, usize, u64) -> isize = -(FI_ENOSYS as isize)),
        compwrite: stub!((*mut c_void, *const c_void, usize, *mut c_void, *const c_void, *mut c_void, *mut c_void, *mut c_void, u64, u64, u64, c_int, c_int, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        compwritev: stub!((*mut c_void, *const c_void, *mut *mut c_void, usize, *const c_void, *mut *mut c_void, usize, *mut c_void, *mut *mut c_void, usize, u64, u64, u64, c_int, c_int, *mut c_void) -> isize = -(FI_ENOSYS as isize)),
        compwritemsg: stub!((*mut c_void, *const c_void, *const c_void, *mut *mut c_void, usize, *mut c_void, *mut *mut c_void, usize, u64) -> isize = -(FI_ENOSYS as isize)),
        writevalid: stub!((*mut c_void, c_int, c_int, *mut c_void) -> c_int = -FI_ENOSYS),
        readwritevalid: stub!((*mut c_void, c_int, c_int, *mut c_void) -> c_int = -FI_ENOSYS),
        compwritevalid: stub!((*mut c_void, c_int, c_int, *mut c_void) -> c_int = -FI_ENOSYS),
    };
}

/// `struct fi_ops_cm`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FiOpsCm {
    pub size: usize,
    pub setname: unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> c_int,
    pub getname: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void) -> c_int,
    pub getpeer: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void) -> c_int,
    pub connect: unsafe extern "C" fn(*mut c_void, *const c_void, *const c_void, usize) -> c_int,
    pub listen: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub accept: unsafe extern "C" fn(*mut c_void, *const c_void, usize) -> c_int,
    pub reject: unsafe extern "C" fn(*mut c_void, *mut c_void, *const c_void, usize) -> c_int,
    pub shutdown: unsafe extern "C" fn(*mut c_void, u64) -> c_int,
    pub join: unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        u64,
        *mut *mut c_void,
        *mut c_void,
    ) -> c_int,
}

impl FiOpsCm {
    /// Every member answering -FI_ENOSYS.
    pub const ENOSYS: Self = Self {
        size: size_of::<Self>(),
        setname: stub!((*mut c_void, *mut c_void, usize) -> c_int = -FI_ENOSYS),
        getname: stub!((*mut c_void, *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        getpeer: stub!((*mut c_void, *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
        connect: stub!((*mut c_void, *const c_void, *const c_void, usize) -> c_int = -FI_ENOSYS),
        listen: stub!((*mut c_void) -> c_int = -FI_ENOSYS),
        accept: stub!((*mut c_void, *const c_void, usize) -> c_int = -FI_ENOSYS),
        reject: stub!((*mut c_void, *mut c_void, *const c_void, usize) -> c_int = -FI_ENOSYS),
        shutdown: stub!((*mut c_void, u64) -> c_int = -FI_ENOSYS),
        join: stub!((*mut c_void, *const c_void, u64, *mut *mut c_void, *mut c_void) -> c_int = -FI_ENOSYS),
    };
}
