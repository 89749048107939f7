//! The ops tables handed to C, all of them: one `static` per table, each the all-ENOSYS layout
//! of `ops` with the members this library translates filled in, and each class's [`Class`]
//! implementation, which ties a Rust object to its fid class, its `fi_ops` (whose address
//! identifies the class when a fid comes back) and the tables of a new object's head.
//!
//! This is the top of the crate's imports: it names the translations' entry points, and no
//! translation names a table (an open asks its class for the head, [`Class::new_head`]).

use std::ffi::c_void;

use xfabric::{
    AddressVector, CompletionQueue, Counter, Domain, Error, EventQueue, Fabric, MemoryRegion,
    PollSet, WaitSet,
};

use crate::consts::*;
use crate::ffi::{close, fid_of, CEndpoint, Class};
use crate::header::{DomainHead, EpHead, FabricHead, Fid, MrHead, OpsHead};
use crate::ops::*;
use crate::{atomic, data, eq, objects, rma, trigger};

/// `impl Class for $t`: its fid class, its `fi_ops` (its close, then the members given), the
/// head a new object gets (`$make` builds it from the fid), and its close if not the default.
macro_rules! class {
    (
        $t:ty, $fclass:expr,
        $fi_ops:ident { $($member:ident: $f:expr),* $(,)? },
        $head:ty = $make:expr
        $(, close = $close:expr)?
        $(, busy = $busy:expr)? $(,)?
    ) => {
        static $fi_ops: FiOps = FiOps {
            close: close::<$t>,
            $($member: $f,)*
            ..FiOps::ENOSYS
        };
        impl Class for $t {
            const FCLASS: usize = $fclass;
            type Head = $head;
            fn fi_ops() -> &'static FiOps {
                &$fi_ops
            }
            fn new_head(context: *mut c_void) -> $head {
                let make: fn(Fid) -> $head = $make;
                make(fid_of::<$t>(context))
            }
            $(fn close(self) -> Result<(), (Self, Error)> {
                ($close)(self)
            })?
            $(fn busy(&self) -> Option<Error> {
                ($busy)(self)
            })?
        }
    };
}

class!(
    Fabric,
    FI_CLASS_FABRIC,
    FABRIC_FI_OPS {},
    // fi_fabric replaces the version with the one its attribute asks for, if any.
    FabricHead = |fid| FabricHead {
        fid,
        ops: &FABRIC_OPS,
        api_version: FI_VERSION_1_17,
    },
);
class!(
    Domain,
    FI_CLASS_DOMAIN,
    DOMAIN_FI_OPS {
        control: trigger::domain_control,
    },
    DomainHead = |fid| DomainHead {
        fid,
        ops: &DOMAIN_OPS,
        mr: &MR_OPS,
    },
);
class!(
    AddressVector,
    FI_CLASS_AV,
    AV_FI_OPS { bind: data::av_bind },
    OpsHead<FiOpsAv> = |fid| OpsHead { fid, ops: &AV_OPS },
    close = AddressVector::close,
    busy = AddressVector::busy,
);
class!(
    CompletionQueue,
    FI_CLASS_CQ,
    CQ_FI_OPS {
        control: objects::cq_control,
    },
    OpsHead<FiOpsCq> = |fid| OpsHead { fid, ops: &CQ_OPS },
    close = CompletionQueue::close,
    busy = CompletionQueue::busy,
);
class!(
    Counter,
    FI_CLASS_CNTR,
    CNTR_FI_OPS {
        control: objects::cntr_control,
    },
    OpsHead<FiOpsCntr> = |fid| OpsHead {
        fid,
        ops: &CNTR_OPS,
    },
    close = Counter::close,
    busy = Counter::busy,
);
class!(
    EventQueue,
    FI_CLASS_EQ,
    EQ_FI_OPS {
        control: objects::eq_control,
    },
    OpsHead<FiOpsEq> = |fid| OpsHead { fid, ops: &EQ_OPS },
    close = EventQueue::close,
);
class!(
    WaitSet,
    FI_CLASS_WAIT,
    WAIT_FI_OPS {
        control: objects::wait_control,
    },
    OpsHead<FiOpsWait> = |fid| OpsHead {
        fid,
        ops: &WAIT_OPS,
    },
    close = WaitSet::close,
);
class!(
    PollSet,
    FI_CLASS_POLL,
    POLL_FI_OPS {},
    OpsHead<FiOpsPoll> = |fid| OpsHead {
        fid,
        ops: &POLL_OPS,
    },
);
class!(
    MemoryRegion,
    FI_CLASS_MR,
    MR_FI_OPS {},
    // The registration writes its key, and its descriptor once it has an address.
    MrHead = |fid| MrHead {
        fid,
        mem_desc: std::ptr::null_mut(),
        key: 0,
    },
);
// The endpoint's `fi_ops` is its own (bind and control, besides close), unlike the other
// classes', and so is its close.
static EP_FI_OPS: FiOps = FiOps {
    close: close::<CEndpoint>,
    bind: data::ep_bind,
    control: data::ep_control,
    ..FiOps::ENOSYS
};
impl Class for CEndpoint {
    const FCLASS: usize = FI_CLASS_EP;
    type Head = EpHead;
    fn fi_ops() -> &'static FiOps {
        &EP_FI_OPS
    }
    fn new_head(context: *mut c_void) -> EpHead {
        EpHead {
            fid: fid_of::<Self>(context),
            ops: &EP_OPS,
            cm: &CM_OPS,
            msg: &MSG_OPS,
            rma: &RMA_OPS,
            tagged: &TAGGED_OPS,
            atomic: &ATOMIC_OPS,
            // Collectives are not part of xfabric: null, which fi_collective.h's calls check
            // for.
            collective: std::ptr::null(),
        }
    }
    // An endpoint's close always finishes (it shuts the endpoint down first).
    fn close(self) -> Result<(), (Self, Error)> {
        if let Err(e) = self.ep.close() {
            tracing::warn!("fi_close(ep): {e}");
        }
        Ok(())
    }
}

static FABRIC_OPS: FiOpsFabric = FiOpsFabric {
    domain: objects::fabric_domain,
    eq_open: objects::fabric_eq_open,
    wait_open: objects::fabric_wait_open,
    trywait: objects::fabric_trywait,
    ..FiOpsFabric::ENOSYS
};
static DOMAIN_OPS: FiOpsDomain = FiOpsDomain {
    av_open: objects::domain_av_open,
    cq_open: objects::domain_cq_open,
    endpoint: objects::domain_endpoint,
    cntr_open: objects::domain_cntr_open,
    poll_open: objects::domain_poll_open,
    query_atomic: atomic::domain_query_atomic,
    ..FiOpsDomain::ENOSYS
};
static MR_OPS: FiOpsMr = FiOpsMr {
    reg: objects::mr_reg,
    regv: objects::mr_regv,
    regattr: objects::mr_regattr,
    ..FiOpsMr::ENOSYS
};
static AV_OPS: FiOpsAv = FiOpsAv {
    insert: data::av_insert,
    remove: data::av_remove,
    lookup: data::av_lookup,
    straddr: data::av_straddr,
    ..FiOpsAv::ENOSYS
};
static CQ_OPS: FiOpsCq = FiOpsCq {
    read: data::cq_read,
    readfrom: data::cq_readfrom,
    readerr: data::cq_readerr,
    sread: data::cq_sread,
    sreadfrom: data::cq_sreadfrom,
    signal: data::cq_signal,
    strerror: eq::cq_strerror,
    ..FiOpsCq::ENOSYS
};
static CNTR_OPS: FiOpsCntr = FiOpsCntr {
    read: data::cntr_read,
    readerr: data::cntr_readerr,
    add: data::cntr_add,
    set: data::cntr_set,
    wait: data::cntr_wait,
    adderr: data::cntr_adderr,
    seterr: data::cntr_seterr,
    ..FiOpsCntr::ENOSYS
};
static EQ_OPS: FiOpsEq = FiOpsEq {
    read: eq::eq_read,
    write: eq::eq_write,
    sread: eq::eq_sread,
    readerr: eq::eq_readerr,
    strerror: eq::eq_strerror,
    ..FiOpsEq::ENOSYS
};
static WAIT_OPS: FiOpsWait = FiOpsWait {
    wait: eq::wait_wait,
    ..FiOpsWait::ENOSYS
};
static POLL_OPS: FiOpsPoll = FiOpsPoll {
    poll: eq::poll_poll,
    poll_add: eq::poll_add,
    poll_del: eq::poll_del,
    ..FiOpsPoll::ENOSYS
};
static EP_OPS: FiOpsEp = FiOpsEp {
    cancel: data::ep_cancel,
    getopt: trigger::ep_getopt,
    setopt: trigger::ep_setopt,
    ..FiOpsEp::ENOSYS
};
static CM_OPS: FiOpsCm = FiOpsCm {
    getname: data::ep_getname,
    ..FiOpsCm::ENOSYS
};
static MSG_OPS: FiOpsMsg = FiOpsMsg {
    recv: data::ep_recv,
    recvv: data::ep_recvv,
    recvmsg: data::ep_recvmsg,
    send: data::ep_send,
    sendv: data::ep_sendv,
    sendmsg: data::ep_sendmsg,
    inject: data::ep_inject,
    senddata: data::ep_senddata,
    injectdata: data::ep_injectdata,
    ..FiOpsMsg::ENOSYS
};
static TAGGED_OPS: FiOpsTagged = FiOpsTagged {
    recv: data::ep_trecv,
    recvv: data::ep_trecvv,
    recvmsg: data::ep_trecvmsg,
    send: data::ep_tsend,
    sendv: data::ep_tsendv,
    sendmsg: data::ep_tsendmsg,
    inject: data::ep_tinject,
    senddata: data::ep_tsenddata,
    injectdata: data::ep_tinjectdata,
    ..FiOpsTagged::ENOSYS
};
static RMA_OPS: FiOpsRma = FiOpsRma {
    read: rma::rma_read,
    readv: rma::rma_readv,
    readmsg: rma::rma_readmsg,
    write: rma::rma_write,
    writev: rma::rma_writev,
    writemsg: rma::rma_writemsg,
    inject: rma::rma_inject,
    writedata: rma::rma_writedata,
    injectdata: rma::rma_injectdata,
    ..FiOpsRma::ENOSYS
};
static ATOMIC_OPS: FiOpsAtomic = FiOpsAtomic {
    write: atomic::atomic_write,
    writev: atomic::atomic_writev,
    writemsg: atomic::atomic_writemsg,
    inject: atomic::atomic_inject,
    readwrite: atomic::atomic_readwrite,
    readwritev: atomic::atomic_readwritev,
    readwritemsg: atomic::atomic_readwritemsg,
    compwrite: atomic::atomic_compwrite,
    compwritev: atomic::atomic_compwritev,
    compwritemsg: atomic::atomic_compwritemsg,
    writevalid: atomic::atomic_writevalid,
    readwritevalid: atomic::atomic_readwritevalid,
    compwritevalid: atomic::atomic_compwritevalid,
    ..FiOpsAtomic::ENOSYS
};
