//! Capability and operation flag bits, enum values and error numbers, equal to libfabric 1.17's
//! `fabric.h`, `fi_domain.h`, `fi_eq.h`, `fi_endpoint.h` and `fi_errno.h`. The names are
//! libfabric's, so a reader can move between this crate and the man pages without a table.
//! `tests/c_layout.rs` compiles a C program against `/usr/include/rdma` and checks every value here.

#![allow(missing_docs)]

/// Version of the libfabric API these values follow.
pub const FI_MAJOR_VERSION: u32 = 1;
pub const FI_MINOR_VERSION: u32 = 17;

/// `FI_VERSION(major, minor)`.
pub const fn fi_version(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

// Primary and secondary capabilities, operation flags (fabric.h).
pub const FI_MSG: u64 = 1 << 1;
pub const FI_RMA: u64 = 1 << 2;
pub const FI_TAGGED: u64 = 1 << 3;
pub const FI_ATOMIC: u64 = 1 << 4;
pub const FI_MULTICAST: u64 = 1 << 5;
pub const FI_COLLECTIVE: u64 = 1 << 6;
pub const FI_READ: u64 = 1 << 8;
pub const FI_WRITE: u64 = 1 << 9;
pub const FI_RECV: u64 = 1 << 10;
pub const FI_SEND: u64 = 1 << 11;
pub const FI_TRANSMIT: u64 = FI_SEND;
pub const FI_REMOTE_READ: u64 = 1 << 12;
pub const FI_REMOTE_WRITE: u64 = 1 << 13;
pub const FI_MULTI_RECV: u64 = 1 << 16;
pub const FI_REMOTE_CQ_DATA: u64 = 1 << 17;
pub const FI_MORE: u64 = 1 << 18;
pub const FI_PEEK: u64 = 1 << 19;
pub const FI_TRIGGER: u64 = 1 << 20;
pub const FI_FENCE: u64 = 1 << 21;
pub const FI_PRIORITY: u64 = 1 << 22;
pub const FI_COMPLETION: u64 = 1 << 24;
pub const FI_EVENT: u64 = FI_COMPLETION;
pub const FI_INJECT: u64 = 1 << 25;
pub const FI_INJECT_COMPLETE: u64 = 1 << 26;
pub const FI_TRANSMIT_COMPLETE: u64 = 1 << 27;
pub const FI_DELIVERY_COMPLETE: u64 = 1 << 28;
pub const FI_AFFINITY: u64 = 1 << 29;
pub const FI_COMMIT_COMPLETE: u64 = 1 << 30;
pub const FI_MATCH_COMPLETE: u64 = 1 << 31;
pub const FI_PEER_TRANSFER: u64 = 1 << 36;
pub const FI_AV_USER_ID: u64 = 1 << 41;
pub const FI_PEER: u64 = 1 << 43;
pub const FI_XPU_TRIGGER: u64 = 1 << 44;
pub const FI_HMEM_HOST_ALLOC: u64 = 1 << 45;
pub const FI_HMEM_DEVICE_ONLY: u64 = 1 << 46;
pub const FI_HMEM: u64 = 1 << 47;
pub const FI_VARIABLE_MSG: u64 = 1 << 48;
pub const FI_RMA_PMEM: u64 = 1 << 49;
pub const FI_SOURCE_ERR: u64 = 1 << 50;
pub const FI_LOCAL_COMM: u64 = 1 << 51;
pub const FI_REMOTE_COMM: u64 = 1 << 52;
pub const FI_SHARED_AV: u64 = 1 << 53;
pub const FI_PROV_ATTR_ONLY: u64 = 1 << 54;
pub const FI_NUMERICHOST: u64 = 1 << 55;
pub const FI_RMA_EVENT: u64 = 1 << 56;
pub const FI_SOURCE: u64 = 1 << 57;
pub const FI_NAMED_RX_CTX: u64 = 1 << 58;
pub const FI_DIRECTED_RECV: u64 = 1 << 59;
/// Tagged receive flags: these reuse capability bits, as in fabric.h.
pub const FI_CLAIM: u64 = 1 << 59;
pub const FI_DISCARD: u64 = 1 << 58;
/// `bind` flag: only operations carrying `FI_COMPLETION` write a CQ entry.
pub const FI_SELECTIVE_COMPLETION: u64 = 1 << 59;
/// Mode bits.
pub const FI_CONTEXT: u64 = 1 << 59;
pub const FI_MSG_PREFIX: u64 = 1 << 58;
pub const FI_ASYNC_IOV: u64 = 1 << 57;
pub const FI_RX_CQ_DATA: u64 = 1 << 56;
pub const FI_LOCAL_MR: u64 = 1 << 55;
pub const FI_NOTIFY_FLAGS_ONLY: u64 = 1 << 54;
pub const FI_RESTRICTED_COMP: u64 = 1 << 53;
pub const FI_CONTEXT2: u64 = 1 << 52;
pub const FI_BUFFERED_RECV: u64 = 1 << 51;

/// Capabilities that name a class of operation; the rest are secondary.
pub const FI_PRIMARY_CAPS: u64 = FI_MSG
    | FI_RMA
    | FI_TAGGED
    | FI_ATOMIC
    | FI_MULTICAST
    | FI_NAMED_RX_CTX
    | FI_DIRECTED_RECV
    | FI_VARIABLE_MSG
    | FI_HMEM
    | FI_COLLECTIVE
    | FI_XPU_TRIGGER
    | FI_READ
    | FI_WRITE
    | FI_RECV
    | FI_SEND
    | FI_REMOTE_READ
    | FI_REMOTE_WRITE;
pub const FI_SECONDARY_CAPS: u64 = FI_MULTI_RECV
    | FI_SOURCE
    | FI_RMA_EVENT
    | FI_SHARED_AV
    | FI_TRIGGER
    | FI_FENCE
    | FI_LOCAL_COMM
    | FI_REMOTE_COMM
    | FI_SOURCE_ERR
    | FI_RMA_PMEM;

/// Secondary capabilities that change what an endpoint does or costs (error entries for unknown
/// sources, completions for remote accesses, durability tracking of remote writes, triggered
/// operations in every progress call, doorbells watched for XPU triggers): getinfo returns them
/// only when asked.
pub const FI_OPT_IN_CAPS: u64 =
    FI_SOURCE_ERR | FI_RMA_EVENT | FI_RMA_PMEM | FI_TRIGGER | FI_XPU_TRIGGER;

/// Capabilities getinfo returns only when the hints ask for them, even to empty hints:
/// FI_HMEM makes an endpoint look up who owns every buffer it is given, and FI_XPU_TRIGGER is a
/// primary capability no fabtests-era application expects unasked (fi_getinfo(3): primary
/// capabilities are returned when requested).
pub const FI_ASKED_ONLY_CAPS: u64 = FI_HMEM | FI_XPU_TRIGGER;

/// Capabilities that describe a domain (`domain_attr->caps`).
pub const FI_DOMAIN_CAPS: u64 = FI_LOCAL_COMM | FI_REMOTE_COMM | FI_SHARED_AV;

/// The mr_mode bits `FI_MR_BASIC` stands for (fi_mr(3)): virtual addresses, provider keys,
/// allocated memory. `FI_MR_SCALABLE` stands for none of them.
pub const FI_MR_BASIC_MAP: u32 = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED;

/// An `mr_mode` as bits: `FI_MR_BASIC` and `FI_MR_SCALABLE` (the 1.0 enumeration, still
/// accepted) translated, anything else as is.
pub fn mr_mode_bits(mode: u32) -> u32 {
    match mode {
        FI_MR_BASIC => FI_MR_BASIC_MAP,
        FI_MR_SCALABLE => 0,
        m => m,
    }
}

/// Whether an address format asked for (`want`) accepts one a provider uses (`have`):
/// `FI_FORMAT_UNSPEC` any, `FI_SOCKADDR` any socket address (fi_getinfo(3)), else the same.
pub fn addr_format_fits(want: u32, have: u32) -> bool {
    want == FI_FORMAT_UNSPEC
        || want == have
        || (want == FI_SOCKADDR
            && matches!(have, FI_SOCKADDR_IN | FI_SOCKADDR_IN6 | FI_SOCKADDR_IB))
}

/// Special addresses and keys.
pub const FI_ADDR_UNSPEC: u64 = u64::MAX;
pub const FI_ADDR_NOTAVAIL: u64 = u64::MAX;
pub const FI_KEY_NOTAVAIL: u64 = u64::MAX;

/// Address formats (`fi_info::addr_format`).
pub const FI_FORMAT_UNSPEC: u32 = 0;
pub const FI_SOCKADDR: u32 = 1;
pub const FI_SOCKADDR_IN: u32 = 2;
pub const FI_SOCKADDR_IN6: u32 = 3;
pub const FI_SOCKADDR_IB: u32 = 4;
pub const FI_ADDR_STR: u32 = 9;

/// Memory registration modes (`fi_domain_attr::mr_mode`).
pub const FI_MR_UNSPEC: u32 = 0;
pub const FI_MR_BASIC: u32 = 1;
pub const FI_MR_SCALABLE: u32 = 2;
pub const FI_MR_LOCAL: u32 = 1 << 2;
pub const FI_MR_RAW: u32 = 1 << 3;
pub const FI_MR_VIRT_ADDR: u32 = 1 << 4;
pub const FI_MR_ALLOCATED: u32 = 1 << 5;
pub const FI_MR_PROV_KEY: u32 = 1 << 6;
pub const FI_MR_MMU_NOTIFY: u32 = 1 << 7;
pub const FI_MR_RMA_EVENT: u32 = 1 << 8;
pub const FI_MR_ENDPOINT: u32 = 1 << 9;
pub const FI_MR_HMEM: u32 = 1 << 10;
pub const FI_MR_COLLECTIVE: u32 = 1 << 11;

/// Message ordering bits.
pub const FI_ORDER_NONE: u64 = 0;
pub const FI_ORDER_RAR: u64 = 1 << 0;
pub const FI_ORDER_RAW: u64 = 1 << 1;
pub const FI_ORDER_RAS: u64 = 1 << 2;
pub const FI_ORDER_WAR: u64 = 1 << 3;
pub const FI_ORDER_WAW: u64 = 1 << 4;
pub const FI_ORDER_WAS: u64 = 1 << 5;
pub const FI_ORDER_SAR: u64 = 1 << 6;
pub const FI_ORDER_SAW: u64 = 1 << 7;
pub const FI_ORDER_SAS: u64 = 1 << 8;
pub const FI_ORDER_STRICT: u64 = 0x1FF;
pub const FI_ORDER_DATA: u64 = 1 << 16;
pub const FI_ORDER_RMA_RAR: u64 = 1 << 32;
pub const FI_ORDER_RMA_RAW: u64 = 1 << 33;
pub const FI_ORDER_RMA_WAR: u64 = 1 << 34;
pub const FI_ORDER_RMA_WAW: u64 = 1 << 35;
pub const FI_ORDER_ATOMIC_RAR: u64 = 1 << 36;
pub const FI_ORDER_ATOMIC_RAW: u64 = 1 << 37;
pub const FI_ORDER_ATOMIC_WAR: u64 = 1 << 38;
pub const FI_ORDER_ATOMIC_WAW: u64 = 1 << 39;

/// Endpoint protocols (`fi_ep_attr::protocol`).
pub const FI_PROTO_UNSPEC: u32 = 0;
pub const FI_PROTO_SOCK_TCP: u32 = 6;
pub const FI_PROTO_SHM: u32 = 16;

/// Endpoint option levels and names (fi_endpoint.h).
pub const FI_OPT_ENDPOINT: i32 = 0;
pub const FI_OPT_MIN_MULTI_RECV: i32 = 0;
pub const FI_OPT_CM_DATA_SIZE: i32 = 1;
pub const FI_OPT_BUFFERED_MIN: i32 = 2;
pub const FI_OPT_BUFFERED_LIMIT: i32 = 3;
pub const FI_OPT_SEND_BUF_SIZE: i32 = 4;
pub const FI_OPT_RECV_BUF_SIZE: i32 = 5;
pub const FI_OPT_TX_SIZE: i32 = 6;
pub const FI_OPT_RX_SIZE: i32 = 7;
pub const FI_OPT_FI_HMEM_P2P: i32 = 8;
pub const FI_OPT_XPU_TRIGGER: i32 = 9;

/// Event queue event codes (fi_eq.h).
pub const FI_NOTIFY: u32 = 0;
pub const FI_CONNREQ: u32 = 1;
pub const FI_CONNECTED: u32 = 2;
pub const FI_SHUTDOWN: u32 = 3;
pub const FI_MR_COMPLETE: u32 = 4;
pub const FI_AV_COMPLETE: u32 = 5;
pub const FI_JOIN_COMPLETE: u32 = 6;

/// `fi_control` commands of the deferred work queue (fabric.h's control enum): a domain's
/// `queue_work`, `cancel_work` and `flush_work` are these.
pub const FI_QUEUE_WORK: i32 = 11;
pub const FI_CANCEL_WORK: i32 = 12;
pub const FI_FLUSH_WORK: i32 = 13;

/// Error numbers (fi_errno.h). Values below 256 are the host's errno values.
pub mod errno {
    pub const FI_SUCCESS: i32 = 0;
    pub const FI_EPERM: i32 = libc::EPERM;
    pub const FI_ENOENT: i32 = libc::ENOENT;
    pub const FI_EINTR: i32 = libc::EINTR;
    pub const FI_EIO: i32 = libc::EIO;
    pub const FI_E2BIG: i32 = libc::E2BIG;
    pub const FI_EBADF: i32 = libc::EBADF;
    pub const FI_EAGAIN: i32 = libc::EAGAIN;
    pub const FI_ENOMEM: i32 = libc::ENOMEM;
    pub const FI_EACCES: i32 = libc::EACCES;
    pub const FI_EFAULT: i32 = libc::EFAULT;
    pub const FI_EBUSY: i32 = libc::EBUSY;
    pub const FI_ENODEV: i32 = libc::ENODEV;
    pub const FI_EINVAL: i32 = libc::EINVAL;
    pub const FI_EMFILE: i32 = libc::EMFILE;
    pub const FI_ENOSPC: i32 = libc::ENOSPC;
    pub const FI_ENOSYS: i32 = libc::ENOSYS;
    pub const FI_ENOMSG: i32 = libc::ENOMSG;
    pub const FI_ENODATA: i32 = libc::ENODATA;
    pub const FI_EOVERFLOW: i32 = libc::EOVERFLOW;
    pub const FI_EMSGSIZE: i32 = libc::EMSGSIZE;
    pub const FI_ENOPROTOOPT: i32 = libc::ENOPROTOOPT;
    pub const FI_EOPNOTSUPP: i32 = libc::EOPNOTSUPP;
    pub const FI_EADDRINUSE: i32 = libc::EADDRINUSE;
    pub const FI_EADDRNOTAVAIL: i32 = libc::EADDRNOTAVAIL;
    pub const FI_ENETDOWN: i32 = libc::ENETDOWN;
    pub const FI_ENETUNREACH: i32 = libc::ENETUNREACH;
    pub const FI_ECONNABORTED: i32 = libc::ECONNABORTED;
    pub const FI_ECONNRESET: i32 = libc::ECONNRESET;
    pub const FI_ENOBUFS: i32 = libc::ENOBUFS;
    pub const FI_EISCONN: i32 = libc::EISCONN;
    pub const FI_ENOTCONN: i32 = libc::ENOTCONN;
    pub const FI_ESHUTDOWN: i32 = libc::ESHUTDOWN;
    pub const FI_ETIMEDOUT: i32 = libc::ETIMEDOUT;
    pub const FI_ECONNREFUSED: i32 = libc::ECONNREFUSED;
    pub const FI_EHOSTDOWN: i32 = libc::EHOSTDOWN;
    pub const FI_EHOSTUNREACH: i32 = libc::EHOSTUNREACH;
    pub const FI_EALREADY: i32 = libc::EALREADY;
    pub const FI_EINPROGRESS: i32 = libc::EINPROGRESS;
    pub const FI_EREMOTEIO: i32 = libc::EREMOTEIO;
    pub const FI_ECANCELED: i32 = libc::ECANCELED;
    pub const FI_EKEYREJECTED: i32 = libc::EKEYREJECTED;
    pub const FI_ERRNO_OFFSET: i32 = 256;
    pub const FI_EOTHER: i32 = 256;
    pub const FI_ETOOSMALL: i32 = 257;
    pub const FI_EOPBADSTATE: i32 = 258;
    pub const FI_EAVAIL: i32 = 259;
    pub const FI_EBADFLAGS: i32 = 260;
    pub const FI_ENOEQ: i32 = 261;
    pub const FI_EDOMAIN: i32 = 262;
    pub const FI_ENOCQ: i32 = 263;
    pub const FI_ECRC: i32 = 264;
    pub const FI_ETRUNC: i32 = 265;
    pub const FI_ENOKEY: i32 = 266;
    pub const FI_ENOAV: i32 = 267;
    pub const FI_EOVERRUN: i32 = 268;
    pub const FI_ENORX: i32 = 269;
}

/// Declares an enum mirroring a libfabric C enum: the same values, libfabric's names
/// (`c_name`), conversion from the raw integer (`from_raw`) and every value (`ALL`). The first
/// variant is the default, like a zeroed C struct's field.
macro_rules! c_enum {
    ($(#[$m:meta])* $name:ident : $repr:ty { $($(#[$vm:meta])* $var:ident = $val:expr => $cname:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        #[repr($repr)]
        pub enum $name {
            #[default]
            $($(#[$vm])* $var = $val),*
        }
        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$var),*];
            /// libfabric's name for the value, as `fi_tostr` prints it.
            pub fn c_name(self) -> &'static str {
                match self { $(Self::$var => $cname),* }
            }
            /// The value for a raw C integer, if it is one.
            pub fn from_raw(v: $repr) -> Option<Self> {
                match v { $(x if x == $val => Some(Self::$var),)* _ => None }
            }
        }
    };
}
pub(crate) use c_enum;

c_enum!(
    /// `enum fi_ep_type`.
    EpType: i32 {
        Unspec = 0 => "FI_EP_UNSPEC",
        Msg = 1 => "FI_EP_MSG",
        Dgram = 2 => "FI_EP_DGRAM",
        Rdm = 3 => "FI_EP_RDM",
        SockStream = 4 => "FI_EP_SOCK_STREAM",
        SockDgram = 5 => "FI_EP_SOCK_DGRAM",
    }
);

c_enum!(
    /// `enum fi_av_type`.
    AvType: i32 {
        Unspec = 0 => "FI_AV_UNSPEC",
        Map = 1 => "FI_AV_MAP",
        Table = 2 => "FI_AV_TABLE",
    }
);

c_enum!(
    /// `enum fi_progress`.
    Progress: i32 {
        Unspec = 0 => "FI_PROGRESS_UNSPEC",
        Auto = 1 => "FI_PROGRESS_AUTO",
        Manual = 2 => "FI_PROGRESS_MANUAL",
    }
);

c_enum!(
    /// `enum fi_threading`.
    Threading: i32 {
        Unspec = 0 => "FI_THREAD_UNSPEC",
        Safe = 1 => "FI_THREAD_SAFE",
        Fid = 2 => "FI_THREAD_FID",
        Domain = 3 => "FI_THREAD_DOMAIN",
        Completion = 4 => "FI_THREAD_COMPLETION",
        Endpoint = 5 => "FI_THREAD_ENDPOINT",
    }
);

c_enum!(
    /// `enum fi_resource_mgmt`.
    ResourceMgmt: i32 {
        Unspec = 0 => "FI_RM_UNSPEC",
        Disabled = 1 => "FI_RM_DISABLED",
        Enabled = 2 => "FI_RM_ENABLED",
    }
);

c_enum!(
    /// `enum fi_cq_format`.
    CqFormat: i32 {
        Unspec = 0 => "FI_CQ_FORMAT_UNSPEC",
        Context = 1 => "FI_CQ_FORMAT_CONTEXT",
        Msg = 2 => "FI_CQ_FORMAT_MSG",
        Data = 3 => "FI_CQ_FORMAT_DATA",
        Tagged = 4 => "FI_CQ_FORMAT_TAGGED",
    }
);

c_enum!(
    /// `enum fi_wait_obj`.
    WaitObj: i32 {
        None = 0 => "FI_WAIT_NONE",
        Unspec = 1 => "FI_WAIT_UNSPEC",
        Set = 2 => "FI_WAIT_SET",
        Fd = 3 => "FI_WAIT_FD",
        MutexCond = 4 => "FI_WAIT_MUTEX_COND",
        Yield = 5 => "FI_WAIT_YIELD",
        PollFd = 6 => "FI_WAIT_POLLFD",
    }
);

c_enum!(
    /// `enum fi_cq_wait_cond`.
    CqWaitCond: i32 {
        None = 0 => "FI_CQ_COND_NONE",
        Threshold = 1 => "FI_CQ_COND_THRESHOLD",
    }
);

c_enum!(
    /// `enum fi_cntr_events`.
    CntrEvents: i32 {
        Comp = 0 => "FI_CNTR_EVENTS_COMP",
    }
);

c_enum!(
    /// `enum fi_trigger_event` (fi_trigger.h): what starts a triggered operation.
    TriggerEvent: i32 {
        Threshold = 0 => "FI_TRIGGER_THRESHOLD",
        Xpu = 1 => "FI_TRIGGER_XPU",
    }
);

c_enum!(
    /// `enum fi_op_type` (fi_trigger.h): the operation of a deferred work request.
    WorkOpType: i32 {
        Recv = 0 => "FI_OP_RECV",
        Send = 1 => "FI_OP_SEND",
        TRecv = 2 => "FI_OP_TRECV",
        TSend = 3 => "FI_OP_TSEND",
        Read = 4 => "FI_OP_READ",
        Write = 5 => "FI_OP_WRITE",
        Atomic = 6 => "FI_OP_ATOMIC",
        FetchAtomic = 7 => "FI_OP_FETCH_ATOMIC",
        CompareAtomic = 8 => "FI_OP_COMPARE_ATOMIC",
        CntrSet = 9 => "FI_OP_CNTR_SET",
        CntrAdd = 10 => "FI_OP_CNTR_ADD",
    }
);

/// Names of the capability and flag bits, in the order `fi_tostr` prints them.
const CAP_NAMES: &[(u64, &str)] = &[
    (FI_MSG, "FI_MSG"),
    (FI_RMA, "FI_RMA"),
    (FI_TAGGED, "FI_TAGGED"),
    (FI_ATOMIC, "FI_ATOMIC"),
    (FI_MULTICAST, "FI_MULTICAST"),
    (FI_COLLECTIVE, "FI_COLLECTIVE"),
    (FI_READ, "FI_READ"),
    (FI_WRITE, "FI_WRITE"),
    (FI_RECV, "FI_RECV"),
    (FI_SEND, "FI_SEND"),
    (FI_REMOTE_READ, "FI_REMOTE_READ"),
    (FI_REMOTE_WRITE, "FI_REMOTE_WRITE"),
    (FI_MULTI_RECV, "FI_MULTI_RECV"),
    (FI_REMOTE_CQ_DATA, "FI_REMOTE_CQ_DATA"),
    (FI_MORE, "FI_MORE"),
    (FI_PEEK, "FI_PEEK"),
    (FI_TRIGGER, "FI_TRIGGER"),
    (FI_FENCE, "FI_FENCE"),
    (FI_COMPLETION, "FI_COMPLETION"),
    (FI_INJECT, "FI_INJECT"),
    (FI_INJECT_COMPLETE, "FI_INJECT_COMPLETE"),
    (FI_TRANSMIT_COMPLETE, "FI_TRANSMIT_COMPLETE"),
    (FI_DELIVERY_COMPLETE, "FI_DELIVERY_COMPLETE"),
    (FI_AFFINITY, "FI_AFFINITY"),
    (FI_COMMIT_COMPLETE, "FI_COMMIT_COMPLETE"),
    (FI_MATCH_COMPLETE, "FI_MATCH_COMPLETE"),
    (FI_XPU_TRIGGER, "FI_XPU_TRIGGER"),
    (FI_HMEM_HOST_ALLOC, "FI_HMEM_HOST_ALLOC"),
    (FI_HMEM_DEVICE_ONLY, "FI_HMEM_DEVICE_ONLY"),
    (FI_VARIABLE_MSG, "FI_VARIABLE_MSG"),
    (FI_RMA_PMEM, "FI_RMA_PMEM"),
    (FI_SOURCE_ERR, "FI_SOURCE_ERR"),
    (FI_LOCAL_COMM, "FI_LOCAL_COMM"),
    (FI_REMOTE_COMM, "FI_REMOTE_COMM"),
    (FI_SHARED_AV, "FI_SHARED_AV"),
    (FI_RMA_EVENT, "FI_RMA_EVENT"),
    (FI_SOURCE, "FI_SOURCE"),
    (FI_NAMED_RX_CTX, "FI_NAMED_RX_CTX"),
    (FI_DIRECTED_RECV, "FI_DIRECTED_RECV"),
    (FI_HMEM, "FI_HMEM"),
];

/// `fi_tostr(FI_TYPE_CAPS)`: the set bits of a capability or flag word as libfabric names them,
/// joined by " | ". Unknown bits are printed in hex.
pub fn caps_str(caps: u64) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut rest = caps;
    for &(bit, name) in CAP_NAMES {
        if caps & bit != 0 {
            parts.push(name.to_string());
            rest &= !bit;
        }
    }
    if rest != 0 {
        parts.push(format!("0x{rest:x}"));
    }
    parts.join(" | ")
}

/// The bit libfabric names `name` (`"FI_TAGGED"`) in `caps_str`'s table; the inverse of
/// `caps_str` for one name.
pub fn cap_from_str(name: &str) -> Option<u64> {
    CAP_NAMES
        .iter()
        .find(|&&(_, n)| n == name)
        .map(|&(bit, _)| bit)
}

const MODE_NAMES: &[(u64, &str)] = &[
    (FI_CONTEXT, "FI_CONTEXT"),
    (FI_MSG_PREFIX, "FI_MSG_PREFIX"),
    (FI_ASYNC_IOV, "FI_ASYNC_IOV"),
    (FI_RX_CQ_DATA, "FI_RX_CQ_DATA"),
    (FI_LOCAL_MR, "FI_LOCAL_MR"),
    (FI_NOTIFY_FLAGS_ONLY, "FI_NOTIFY_FLAGS_ONLY"),
    (FI_RESTRICTED_COMP, "FI_RESTRICTED_COMP"),
    (FI_CONTEXT2, "FI_CONTEXT2"),
    (FI_BUFFERED_RECV, "FI_BUFFERED_RECV"),
];

/// `fi_tostr(FI_TYPE_MODE)`.
pub fn mode_str(mode: u64) -> String {
    bits_str(mode, MODE_NAMES)
}

const ORDER_NAMES: &[(u64, &str)] = &[
    (FI_ORDER_RAR, "FI_ORDER_RAR"),
    (FI_ORDER_RAW, "FI_ORDER_RAW"),
    (FI_ORDER_RAS, "FI_ORDER_RAS"),
    (FI_ORDER_WAR, "FI_ORDER_WAR"),
    (FI_ORDER_WAW, "FI_ORDER_WAW"),
    (FI_ORDER_WAS, "FI_ORDER_WAS"),
    (FI_ORDER_SAR, "FI_ORDER_SAR"),
    (FI_ORDER_SAW, "FI_ORDER_SAW"),
    (FI_ORDER_SAS, "FI_ORDER_SAS"),
    (FI_ORDER_DATA, "FI_ORDER_DATA"),
    (FI_ORDER_RMA_RAR, "FI_ORDER_RMA_RAR"),
    (FI_ORDER_RMA_RAW, "FI_ORDER_RMA_RAW"),
    (FI_ORDER_RMA_WAR, "FI_ORDER_RMA_WAR"),
    (FI_ORDER_RMA_WAW, "FI_ORDER_RMA_WAW"),
    (FI_ORDER_ATOMIC_RAR, "FI_ORDER_ATOMIC_RAR"),
    (FI_ORDER_ATOMIC_RAW, "FI_ORDER_ATOMIC_RAW"),
    (FI_ORDER_ATOMIC_WAR, "FI_ORDER_ATOMIC_WAR"),
    (FI_ORDER_ATOMIC_WAW, "FI_ORDER_ATOMIC_WAW"),
];

/// `fi_tostr(FI_TYPE_MSG_ORDER)`.
pub fn order_str(order: u64) -> String {
    bits_str(order, ORDER_NAMES)
}

const MR_MODE_NAMES: &[(u64, &str)] = &[
    (FI_MR_BASIC as u64, "FI_MR_BASIC"),
    (FI_MR_SCALABLE as u64, "FI_MR_SCALABLE"),
    (FI_MR_LOCAL as u64, "FI_MR_LOCAL"),
    (FI_MR_RAW as u64, "FI_MR_RAW"),
    (FI_MR_VIRT_ADDR as u64, "FI_MR_VIRT_ADDR"),
    (FI_MR_ALLOCATED as u64, "FI_MR_ALLOCATED"),
    (FI_MR_PROV_KEY as u64, "FI_MR_PROV_KEY"),
    (FI_MR_MMU_NOTIFY as u64, "FI_MR_MMU_NOTIFY"),
    (FI_MR_RMA_EVENT as u64, "FI_MR_RMA_EVENT"),
    (FI_MR_ENDPOINT as u64, "FI_MR_ENDPOINT"),
    (FI_MR_HMEM as u64, "FI_MR_HMEM"),
    (FI_MR_COLLECTIVE as u64, "FI_MR_COLLECTIVE"),
];

/// `fi_tostr(FI_TYPE_MR_MODE)`.
pub fn mr_mode_str(mode: u32) -> String {
    if mode == 0 {
        return "FI_MR_UNSPEC".into();
    }
    bits_str(mode as u64, MR_MODE_NAMES)
}

/// Name of an address format value.
pub fn addr_format_str(fmt: u32) -> &'static str {
    match fmt {
        FI_FORMAT_UNSPEC => "FI_FORMAT_UNSPEC",
        FI_SOCKADDR => "FI_SOCKADDR",
        FI_SOCKADDR_IN => "FI_SOCKADDR_IN",
        FI_SOCKADDR_IN6 => "FI_SOCKADDR_IN6",
        FI_SOCKADDR_IB => "FI_SOCKADDR_IB",
        FI_ADDR_STR => "FI_ADDR_STR",
        _ => "FI_FORMAT_UNKNOWN",
    }
}

/// Name of a protocol value.
pub fn protocol_str(proto: u32) -> &'static str {
    match proto {
        FI_PROTO_UNSPEC => "FI_PROTO_UNSPEC",
        FI_PROTO_SOCK_TCP => "FI_PROTO_SOCK_TCP",
        FI_PROTO_SHM => "FI_PROTO_SHM",
        _ => "FI_PROTO_UNKNOWN",
    }
}

fn bits_str(v: u64, names: &[(u64, &str)]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut rest = v;
    for &(bit, name) in names {
        if v & bit != 0 {
            parts.push(name.to_string());
            rest &= !bit;
        }
    }
    if rest != 0 {
        parts.push(format!("0x{rest:x}"));
    }
    parts.join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_print_with_libfabric_names() {
        assert_eq!(caps_str(FI_MSG | FI_TAGGED), "FI_MSG | FI_TAGGED");
        assert_eq!(caps_str(0), "");
        assert_eq!(caps_str(1 << 62), "0x4000000000000000");
        assert_eq!(mr_mode_str(0), "FI_MR_UNSPEC");
        assert_eq!(EpType::from_raw(3), Some(EpType::Rdm));
        assert_eq!(EpType::Rdm.c_name(), "FI_EP_RDM");
    }
}
