//! `fi_info` and its attribute structures, and the hint matching every provider shares: a
//! provider describes what it can do once, and `Info::fit` narrows that to what a caller asked
//! for or says why it cannot.

use crate::consts::*;
use crate::error::{Error, Result};

/// Transmit operation flags an endpoint takes as defaults (`tx_attr.op_flags`), besides
/// `FI_COMMIT_COMPLETE` on a persistent-memory endpoint.
pub const TX_OP_FLAGS: u64 = FI_COMPLETION
    | FI_INJECT
    | FI_INJECT_COMPLETE
    | FI_TRANSMIT_COMPLETE
    | FI_DELIVERY_COMPLETE
    | FI_MATCH_COMPLETE;
/// Receive operation flags an endpoint takes as defaults (`rx_attr.op_flags`).
pub const RX_OP_FLAGS: u64 = FI_COMPLETION | FI_MULTI_RECV;

/// `struct fi_tx_attr`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxAttr {
    /// Capabilities (`FI_MSG`, `FI_TAGGED`, `FI_RMA`, ...) of this transmit side; a subset of the
    /// endpoint's.
    pub caps: u64,
    /// Mode bits (`FI_CONTEXT`, ...) the provider requires of transmit operations.
    pub mode: u64,
    /// Default operation flags for transmit operations (`FI_COMPLETION`, `FI_INJECT_COMPLETE`,
    /// ...), as set by `fi_control(FI_SETOPSFLAG)`.
    pub op_flags: u64,
    /// Ordering kept between messages (`FI_ORDER_*` bits).
    pub msg_order: u64,
    /// Ordering of completions (`FI_ORDER_NONE` or `FI_ORDER_STRICT`).
    pub comp_order: u64,
    /// Largest message, in bytes, that the inject calls and `FI_INJECT` accept.
    pub inject_size: usize,
    /// Number of transmit operations that may be outstanding at once.
    pub size: usize,
    /// Most data segments one transmit operation may have.
    pub iov_limit: usize,
    /// Most remote segments one RMA or atomic operation may name.
    pub rma_iov_limit: usize,
    /// Traffic class (`FI_TC_*`); 0 is unspecified.
    pub tclass: u32,
}

/// `struct fi_rx_attr`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RxAttr {
    /// Capabilities (`FI_MSG`, `FI_TAGGED`, `FI_RMA`, ...) of this receive side; a subset of the
    /// endpoint's.
    pub caps: u64,
    /// Mode bits the provider requires of receive operations.
    pub mode: u64,
    /// Default operation flags for receive operations (`FI_COMPLETION`, `FI_MULTI_RECV`, ...).
    pub op_flags: u64,
    /// Ordering kept between received messages (`FI_ORDER_*` bits).
    pub msg_order: u64,
    /// Ordering of receive completions (`FI_ORDER_NONE`, `FI_ORDER_STRICT` or `FI_ORDER_DATA`).
    pub comp_order: u64,
    /// Bytes the provider may buffer for messages that arrive before a matching receive (deprecated
    /// in libfabric; 0 is unspecified).
    pub total_buffered_recv: usize,
    /// Number of receive operations that may be posted at once.
    pub size: usize,
    /// Most data segments one receive may have.
    pub iov_limit: usize,
}

/// `struct fi_ep_attr`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EpAttr {
    /// Endpoint type (`FI_EP_RDM`, `FI_EP_MSG`, `FI_EP_DGRAM`).
    pub ep_type: EpType,
    /// Wire protocol (`FI_PROTO_*`); `FI_PROTO_UNSPEC` in hints accepts any.
    pub protocol: u32,
    /// Version of `protocol`.
    pub protocol_version: u32,
    /// Largest message, in bytes, one operation may carry.
    pub max_msg_size: usize,
    /// Bytes of prefix space the caller must leave before message data under `FI_MSG_PREFIX` (0
    /// when that mode is not used).
    pub msg_prefix_size: usize,
    /// Largest RMA read after write, in bytes, whose order is kept.
    pub max_order_raw_size: usize,
    /// Largest RMA write after read, in bytes, whose order is kept.
    pub max_order_war_size: usize,
    /// Largest RMA write after write, in bytes, whose order is kept.
    pub max_order_waw_size: usize,
    /// How tag bits are used (`mem_tag_format` of `fi_endpoint(3)`); 0 lets the provider choose.
    pub mem_tag_format: u64,
    /// Number of transmit contexts (scalable endpoints; 1 for a plain endpoint).
    pub tx_ctx_cnt: usize,
    /// Number of receive contexts (scalable endpoints; 1 for a plain endpoint).
    pub rx_ctx_cnt: usize,
    /// Authorization key limiting which peers may talk to the endpoint; `None` uses the domain's.
    pub auth_key: Option<Vec<u8>>,
}

/// `struct fi_domain_attr`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DomainAttr {
    /// Domain name; in hints, `None` accepts any.
    pub name: Option<String>,
    /// Threading model the application promises (`FI_THREAD_SAFE`, `FI_THREAD_DOMAIN`, ...).
    pub threading: Threading,
    /// Who drives progress of control operations (`FI_PROGRESS_AUTO` or `FI_PROGRESS_MANUAL`).
    pub control_progress: Progress,
    /// Who drives progress of data transfers: the provider (`FI_PROGRESS_AUTO`) or the
    /// application's calls on CQs, counters and endpoints (`FI_PROGRESS_MANUAL`).
    pub data_progress: Progress,
    /// Whether the provider protects queues from overrun (`FI_RM_ENABLED`).
    pub resource_mgmt: ResourceMgmt,
    /// Address vector type the domain prefers (`FI_AV_MAP` or `FI_AV_TABLE`).
    pub av_type: AvType,
    /// Memory registration mode bits (`FI_MR_LOCAL`, `FI_MR_VIRT_ADDR`, ...).
    pub mr_mode: u32,
    /// Size, in bytes, of a memory region's protection key.
    pub mr_key_size: usize,
    /// Bytes of remote CQ data (`FI_REMOTE_CQ_DATA`) an operation can carry.
    pub cq_data_size: usize,
    /// Number of completion queues the domain can open.
    pub cq_cnt: usize,
    /// Number of endpoints the domain can open.
    pub ep_cnt: usize,
    /// Number of transmit contexts the domain can provide.
    pub tx_ctx_cnt: usize,
    /// Number of receive contexts the domain can provide.
    pub rx_ctx_cnt: usize,
    /// Most transmit contexts one scalable endpoint can have.
    pub max_ep_tx_ctx: usize,
    /// Most receive contexts one scalable endpoint can have.
    pub max_ep_rx_ctx: usize,
    /// Most endpoints that can share one transmit context.
    pub max_ep_stx_ctx: usize,
    /// Most endpoints that can share one receive context.
    pub max_ep_srx_ctx: usize,
    /// Number of counters the domain can open.
    pub cntr_cnt: usize,
    /// Most segments one memory registration may have.
    pub mr_iov_limit: usize,
    /// Domain-level capabilities (`FI_LOCAL_COMM`, `FI_REMOTE_COMM`, `FI_SHARED_AV`, ...).
    pub caps: u64,
    /// Domain-level mode bits the provider requires.
    pub mode: u64,
    /// Default authorization key of the domain's endpoints; `None` for none.
    pub auth_key: Option<Vec<u8>>,
    /// `auth_key_size` where no key is given: in a getinfo answer, nonzero says the provider
    /// takes authorization keys, of this size as a suggestion (fi_domain(3): 0 when keys are
    /// not available). With `auth_key`, its length is the size.
    pub auth_key_size: usize,
    /// Largest provider error data, in bytes, an error completion can carry.
    pub max_err_data: usize,
    /// Number of memory regions the domain can register.
    pub mr_cnt: usize,
    /// Default traffic class (`FI_TC_*`) of the domain's endpoints; 0 is unspecified.
    pub tclass: u32,
}

/// `struct fi_fabric_attr`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FabricAttr {
    /// Fabric name; in hints, `None` accepts any.
    pub name: Option<String>,
    /// Provider name (`"shm"`); in hints, `None` accepts any, and several names may be given
    /// separated by `;`.
    pub prov_name: Option<String>,
    /// Provider version (`FI_VERSION(major, minor)`).
    pub prov_version: u32,
    /// API version the fabric was opened for (`FI_VERSION(1, 17)`).
    pub api_version: u32,
}

/// `struct fi_info`: one way to use one provider. Also the type of getinfo hints, where zero
/// and `None` fields mean "no preference", as in C.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Info {
    /// Capabilities (`FI_MSG`, `FI_TAGGED`, `FI_RMA`, `FI_ATOMIC`, `FI_TRIGGER`, `FI_HMEM`, ...):
    /// in hints, what the caller needs; in an answer, what the endpoint will do.
    pub caps: u64,
    /// Mode bits: in hints, those the caller can handle (0 accepts any); in an answer, those the
    /// provider requires.
    pub mode: u64,
    /// Address format (`FI_ADDR_*`, `FI_FORMAT_UNSPEC`) of `src_addr`, `dest_addr` and the
    /// endpoint's names.
    pub addr_format: u32,
    /// Local address to bind to, in `addr_format`; `None` lets the provider choose.
    pub src_addr: Option<Vec<u8>>,
    /// Peer address, in `addr_format`, for connected endpoints; `None` for none.
    pub dest_addr: Option<Vec<u8>>,
    /// Transmit attributes (`fi_info::tx_attr`).
    pub tx_attr: TxAttr,
    /// Receive attributes (`fi_info::rx_attr`).
    pub rx_attr: RxAttr,
    /// Endpoint attributes (`fi_info::ep_attr`).
    pub ep_attr: EpAttr,
    /// Domain attributes (`fi_info::domain_attr`).
    pub domain_attr: DomainAttr,
    /// Fabric attributes (`fi_info::fabric_attr`).
    pub fabric_attr: FabricAttr,
}

impl Info {
    /// The provider's name (`fabric_attr.prov_name`), or "".
    pub fn provider(&self) -> &str {
        self.fabric_attr.prov_name.as_deref().unwrap_or("")
    }

    /// `fit` for each of a provider's offers: those the hints allow, or (none fitting) the
    /// first reason why not.
    pub fn fit_each(prov: &str, offers: Vec<Info>, hints: &Info) -> Result<Vec<Info>> {
        let mut out = Vec::new();
        let mut why = None;
        for i in offers {
            match i.fit(hints) {
                Ok(i) => out.push(i),
                Err(e) => why = why.or(Some(e)),
            }
        }
        if out.is_empty() {
            return Err(
                why.unwrap_or_else(|| Error::NoData(format!("provider {prov}: nothing offered")))
            );
        }
        Ok(out)
    }

    /// Whether these hints let provider `prov` answer: they name no provider, or name it
    /// among their `;`-separated names (a provider whose probing is costly asks this before
    /// probing; `fit` asks it of every answer).
    pub fn allows_provider(&self, prov: &str) -> bool {
        self.fabric_attr
            .prov_name
            .as_deref()
            .is_none_or(|p| p.split(';').any(|n| n.eq_ignore_ascii_case(prov)))
    }

    /// Narrows a provider's full description (`self`) to `hints`. Returns the info the caller
    /// gets, or `NoData` naming the first thing the provider cannot do.
    pub fn fit(&self, hints: &Info) -> Result<Info> {
        let prov = self.provider().to_string();
        let no = |what: String| Error::NoData(format!("provider {prov}: {what}"));
        let mut out = self.clone();

        if !hints.allows_provider(&prov) {
            let p = hints.fabric_attr.prov_name.as_deref().unwrap_or_default();
            return Err(no(format!("provider name {p:?} requested")));
        }
        if let Some(f) = hints.fabric_attr.name.as_deref() {
            if Some(f) != self.fabric_attr.name.as_deref() {
                return Err(no(format!("fabric name {f:?} requested")));
            }
        }
        if let Some(d) = hints.domain_attr.name.as_deref() {
            if Some(d) != self.domain_attr.name.as_deref() {
                return Err(no(format!("domain name {d:?} requested")));
            }
        }
        // Keys: a provider that takes none (auth_key_size 0 in its description) must not
        // answer a caller that gives one, as if it were isolated by it (fi_domain(3)).
        let keyed = hints.domain_attr.auth_key.is_some()
            || hints.domain_attr.auth_key_size > 0
            || hints.ep_attr.auth_key.is_some();
        if keyed && self.domain_attr.auth_key_size == 0 {
            return Err(no(
                "authorization keys requested; this provider takes none".into()
            ));
        }
        if hints.domain_attr.caps & !self.domain_attr.caps != 0 {
            return Err(no(format!(
                "domain capabilities not supported: {}",
                caps_str(hints.domain_attr.caps & !self.domain_attr.caps)
            )));
        }
        if hints.caps & !self.caps != 0 {
            return Err(no(format!(
                "capabilities not supported: {}",
                caps_str(hints.caps & !self.caps)
            )));
        }
        for (side, want) in [
            ("transmit", hints.tx_attr.caps),
            ("receive", hints.rx_attr.caps),
        ] {
            if want & !self.caps != 0 {
                return Err(no(format!(
                    "{side} capabilities not supported: {}",
                    caps_str(want & !self.caps)
                )));
            }
        }
        if hints.caps != 0 {
            // Requested primary capabilities plus the secondary ones the provider has (those
            // that change behaviour only if asked for); if only secondary bits were asked
            // for, keep the provider's primaries.
            let prim = if hints.caps & FI_PRIMARY_CAPS != 0 {
                hints.caps & FI_PRIMARY_CAPS
            } else {
                self.caps & FI_PRIMARY_CAPS
            };
            out.caps = prim | (self.caps & FI_SECONDARY_CAPS & !FI_OPT_IN_CAPS) | hints.caps;
        }
        let unasked = FI_ASKED_ONLY_CAPS & !hints.caps;
        out.caps &= !unasked;
        // The transmit and receive sides describe the endpoint's capabilities, never more
        // (fi_getinfo(3): the attributes' caps are subsets of fi_info's).
        out.tx_attr.caps &= out.caps;
        out.rx_attr.caps &= out.caps;
        // Mode bits the provider needs must be ones the caller can handle (0 = any).
        if hints.mode != 0 && self.mode & !hints.mode != 0 {
            return Err(no(format!(
                "provider requires mode bits {} the hints do not accept",
                mode_str(self.mode & !hints.mode)
            )));
        }
        if !addr_format_fits(hints.addr_format, self.addr_format) {
            return Err(no(format!(
                "address format {} requested, provider uses {}",
                addr_format_str(hints.addr_format),
                addr_format_str(self.addr_format)
            )));
        }
        if hints.ep_attr.ep_type != EpType::Unspec && hints.ep_attr.ep_type != self.ep_attr.ep_type
        {
            return Err(no(format!(
                "endpoint type {} requested, provider offers {}",
                hints.ep_attr.ep_type.c_name(),
                self.ep_attr.ep_type.c_name()
            )));
        }
        if hints.ep_attr.protocol != FI_PROTO_UNSPEC
            && hints.ep_attr.protocol != self.ep_attr.protocol
        {
            return Err(no(format!(
                "protocol {} requested",
                protocol_str(hints.ep_attr.protocol)
            )));
        }
        if hints.ep_attr.max_msg_size > self.ep_attr.max_msg_size {
            return Err(no(format!(
                "max_msg_size {} requested, provider allows {}",
                hints.ep_attr.max_msg_size, self.ep_attr.max_msg_size
            )));
        }
        if hints.tx_attr.inject_size > self.tx_attr.inject_size {
            return Err(no(format!(
                "inject_size {} requested, provider allows {}",
                hints.tx_attr.inject_size, self.tx_attr.inject_size
            )));
        }
        for (side, want, have) in [
            ("transmit", hints.tx_attr.msg_order, self.tx_attr.msg_order),
            ("receive", hints.rx_attr.msg_order, self.rx_attr.msg_order),
        ] {
            if want & !have != 0 {
                return Err(no(format!(
                    "{side} message ordering {} not provided",
                    order_str(want & !have)
                )));
            }
        }
        for (side, want, have) in [
            (
                "transmit",
                hints.tx_attr.comp_order,
                self.tx_attr.comp_order,
            ),
            ("receive", hints.rx_attr.comp_order, self.rx_attr.comp_order),
        ] {
            if want & !have != 0 {
                return Err(no(format!(
                    "{side} completion ordering {} not provided",
                    order_str(want & !have)
                )));
            }
        }
        for (what, want, have) in [
            (
                "max_order_raw_size",
                hints.ep_attr.max_order_raw_size,
                self.ep_attr.max_order_raw_size,
            ),
            (
                "max_order_war_size",
                hints.ep_attr.max_order_war_size,
                self.ep_attr.max_order_war_size,
            ),
            (
                "max_order_waw_size",
                hints.ep_attr.max_order_waw_size,
                self.ep_attr.max_order_waw_size,
            ),
        ] {
            if want > have {
                return Err(no(format!(
                    "{what} {want} requested, provider orders up to {have}"
                )));
            }
        }
        let mr = hints.domain_attr.mr_mode;
        if mr != FI_MR_BASIC && mr != FI_MR_SCALABLE && mr & (FI_MR_BASIC | FI_MR_SCALABLE) != 0 {
            // The 1.0 enumeration's values are whole modes, not bits to mix (fi_mr(3)).
            return Err(no(format!(
                "mr_mode {} mixes FI_MR_BASIC or FI_MR_SCALABLE with other bits",
                mr_mode_str(mr)
            )));
        }
        if mr == FI_MR_BASIC || mr == FI_MR_SCALABLE {
            // The 1.0 enumeration: answered in its own terms (fi_mr(3)), when the provider's
            // needs fit within it; FI_MR_SCALABLE then means offsets and the caller's keys.
            let bits = mr_mode_bits(mr);
            if self.domain_attr.mr_mode & !bits != 0 {
                return Err(no(format!(
                    "provider requires mr_mode {}, more than {} allows",
                    mr_mode_str(self.domain_attr.mr_mode & !bits),
                    mr_mode_str(mr)
                )));
            }
            out.domain_attr.mr_mode = mr;
        } else if mr != FI_MR_UNSPEC {
            // The provider's required mr_mode bits must all be ones the caller supports.
            if self.domain_attr.mr_mode & !mr != 0 {
                return Err(no(format!(
                    "provider requires mr_mode {} the hints do not allow",
                    mr_mode_str(self.domain_attr.mr_mode & !mr)
                )));
            }
            // Narrowed to what the provider needs, plus the two addressing choices it offers
            // both ways: FI_MR_LOCAL, FI_MR_ALLOCATED and FI_MR_ENDPOINT only burden a caller
            // (descriptors to pass, registrations to make, binds) when the provider does not
            // need them, so they are left off; FI_MR_VIRT_ADDR and FI_MR_PROV_KEY, when the
            // caller allows them, select how RMA addresses and keys work, and are kept.
            out.domain_attr.mr_mode =
                mr & (self.domain_attr.mr_mode | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY);
        }
        match hints.domain_attr.data_progress {
            Progress::Unspec => {}
            p => out.domain_attr.data_progress = p,
        }
        match hints.domain_attr.control_progress {
            Progress::Unspec => {}
            p => out.domain_attr.control_progress = p,
        }
        if hints.domain_attr.threading != Threading::Unspec {
            out.domain_attr.threading = hints.domain_attr.threading;
        }
        if hints.domain_attr.resource_mgmt != ResourceMgmt::Unspec {
            out.domain_attr.resource_mgmt = hints.domain_attr.resource_mgmt;
        }
        if hints.domain_attr.av_type != AvType::Unspec {
            out.domain_attr.av_type = hints.domain_attr.av_type;
        }
        if hints.domain_attr.cq_data_size > self.domain_attr.cq_data_size {
            return Err(no(format!(
                "cq_data_size {} requested, provider allows {}",
                hints.domain_attr.cq_data_size, self.domain_attr.cq_data_size
            )));
        }
        for (what, want, have) in [
            ("tx size", hints.tx_attr.size, self.tx_attr.size),
            ("rx size", hints.rx_attr.size, self.rx_attr.size),
            (
                "rma_iov_limit",
                hints.tx_attr.rma_iov_limit,
                self.tx_attr.rma_iov_limit,
            ),
            (
                "total_buffered_recv",
                hints.rx_attr.total_buffered_recv,
                self.rx_attr.total_buffered_recv,
            ),
            // FI_SHARED_CONTEXT is (size_t)-1: past any count, so refused where the provider
            // has no shared contexts (fi_endpoint(3)).
            (
                "ep tx_ctx_cnt",
                hints.ep_attr.tx_ctx_cnt,
                self.ep_attr.tx_ctx_cnt,
            ),
            (
                "ep rx_ctx_cnt",
                hints.ep_attr.rx_ctx_cnt,
                self.ep_attr.rx_ctx_cnt,
            ),
            (
                "protocol_version",
                hints.ep_attr.protocol_version as usize,
                self.ep_attr.protocol_version as usize,
            ),
            (
                "mr_iov_limit",
                hints.domain_attr.mr_iov_limit,
                self.domain_attr.mr_iov_limit,
            ),
            (
                "cntr_cnt",
                hints.domain_attr.cntr_cnt,
                self.domain_attr.cntr_cnt,
            ),
            (
                "max_err_data",
                hints.domain_attr.max_err_data,
                self.domain_attr.max_err_data,
            ),
            ("mr_cnt", hints.domain_attr.mr_cnt, self.domain_attr.mr_cnt),
            (
                "tx iov_limit",
                hints.tx_attr.iov_limit,
                self.tx_attr.iov_limit,
            ),
            (
                "rx iov_limit",
                hints.rx_attr.iov_limit,
                self.rx_attr.iov_limit,
            ),
        ] {
            if want > have {
                return Err(no(format!(
                    "{what} {want} requested, provider allows {have}"
                )));
            }
        }
        // Default operation flags: only those the calls honour as defaults. A commit needs
        // persistent memory; the receive side's are completion and multi-receive buffers.
        let tx_ok = TX_OP_FLAGS
            | if out.caps & FI_RMA_PMEM != 0 {
                FI_COMMIT_COMPLETE
            } else {
                0
            };
        for (side, want, ok) in [
            ("transmit", hints.tx_attr.op_flags, tx_ok),
            ("receive", hints.rx_attr.op_flags, RX_OP_FLAGS),
        ] {
            if want & !ok != 0 {
                return Err(no(format!(
                    "{side} op_flags {} cannot be defaults here",
                    caps_str(want & !ok)
                )));
            }
        }
        if hints.tx_attr.op_flags != 0 {
            out.tx_attr.op_flags = hints.tx_attr.op_flags;
        }
        if hints.rx_attr.op_flags != 0 {
            out.rx_attr.op_flags = hints.rx_attr.op_flags;
        }
        if hints.src_addr.is_some() {
            out.src_addr = hints.src_addr.clone();
        }
        if hints.dest_addr.is_some() {
            out.dest_addr = hints.dest_addr.clone();
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prov() -> Info {
        Info {
            caps: FI_MSG | FI_TAGGED | FI_SEND | FI_RECV | FI_MULTI_RECV | FI_SOURCE,
            addr_format: FI_ADDR_STR,
            ep_attr: EpAttr {
                ep_type: EpType::Rdm,
                max_msg_size: 1 << 30,
                ..Default::default()
            },
            domain_attr: DomainAttr {
                data_progress: Progress::Manual,
                ..Default::default()
            },
            fabric_attr: FabricAttr {
                prov_name: Some("shm".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Every hint libfabric 1.17 checks against a provider's limits and a caller may set:
    /// past them, no answer (`NoData`), never an answer that breaks the hint.
    #[test]
    fn hints_past_the_providers_limits_match_nothing() {
        let mut p = prov();
        p.tx_attr.rma_iov_limit = 4;
        p.ep_attr.tx_ctx_cnt = 1;
        p.ep_attr.rx_ctx_cnt = 1;
        p.ep_attr.protocol_version = 1;
        p.domain_attr.mr_iov_limit = 1;
        p.domain_attr.cntr_cnt = 1024;
        p.domain_attr.max_err_data = 256;
        p.domain_attr.mr_cnt = 65536;
        type Set = fn(&mut Info);
        let refused: Vec<(&str, Set)> = vec![
            ("tx comp_order", |h| h.tx_attr.comp_order = FI_ORDER_STRICT),
            ("rx comp_order", |h| h.rx_attr.comp_order = FI_ORDER_DATA),
            ("shared tx context", |h| h.ep_attr.tx_ctx_cnt = usize::MAX),
            ("rx contexts", |h| h.ep_attr.rx_ctx_cnt = 4),
            ("rma_iov_limit", |h| h.tx_attr.rma_iov_limit = 64),
            ("mr_iov_limit", |h| h.domain_attr.mr_iov_limit = 8),
            ("cntr_cnt", |h| h.domain_attr.cntr_cnt = 1 << 20),
            ("max_err_data", |h| h.domain_attr.max_err_data = 1 << 40),
            ("mr_cnt", |h| h.domain_attr.mr_cnt = 1 << 30),
            ("total_buffered_recv", |h| {
                h.rx_attr.total_buffered_recv = 1 << 20
            }),
            ("protocol_version", |h| h.ep_attr.protocol_version = 99),
            ("tx caps", |h| h.tx_attr.caps = FI_RMA),
            ("rx caps", |h| h.rx_attr.caps = FI_ATOMIC),
            ("tx op_flags", |h| h.tx_attr.op_flags = FI_MULTI_RECV),
            ("commit without pmem", |h| {
                h.tx_attr.op_flags = FI_COMMIT_COMPLETE
            }),
            ("rx op_flags", |h| h.rx_attr.op_flags = FI_TRIGGER),
            ("domain key", |h| {
                h.domain_attr.auth_key = Some(vec![1, 2, 3, 4])
            }),
            ("key size", |h| h.domain_attr.auth_key_size = 4),
            ("endpoint key", |h| {
                h.ep_attr.auth_key = Some(vec![1, 2, 3, 4])
            }),
            ("basic mixed", |h| {
                h.domain_attr.mr_mode = FI_MR_BASIC | FI_MR_LOCAL
            }),
            ("scalable mixed", |h| {
                h.domain_attr.mr_mode = FI_MR_SCALABLE | FI_MR_VIRT_ADDR
            }),
        ];
        for (what, set) in refused {
            let mut h = Info::default();
            set(&mut h);
            assert!(
                matches!(p.fit(&h), Err(Error::NoData(_))),
                "{what}: {:?}",
                p.fit(&h)
            );
        }
        // Within them, answered; the defaults a caller asks for are the answer's.
        let mut h = Info::default();
        h.tx_attr.rma_iov_limit = 4;
        h.ep_attr.tx_ctx_cnt = 1;
        h.domain_attr.mr_iov_limit = 1;
        h.tx_attr.op_flags = FI_DELIVERY_COMPLETE | FI_COMPLETION;
        h.rx_attr.op_flags = FI_MULTI_RECV;
        let out = p.fit(&h).unwrap();
        assert_eq!(out.tx_attr.op_flags, FI_DELIVERY_COMPLETE | FI_COMPLETION);
        assert_eq!(out.rx_attr.op_flags, FI_MULTI_RECV);
        // A provider that takes keys answers a caller that gives one; with FI_RMA_PMEM a
        // commit is a default it takes.
        p.domain_attr.auth_key_size = 32;
        p.caps |= FI_RMA_PMEM;
        let mut h = Info::default();
        h.domain_attr.auth_key = Some(vec![1, 2, 3, 4]);
        h.tx_attr.op_flags = FI_COMMIT_COMPLETE;
        assert!(p.fit(&h).is_ok(), "{:?}", p.fit(&h));
    }

    #[test]
    fn empty_hints_take_everything() {
        assert_eq!(prov().fit(&Info::default()).unwrap(), prov());
    }

    #[test]
    fn caps_narrow_and_mismatches_say_why() {
        let h = Info {
            caps: FI_TAGGED,
            ..Default::default()
        };
        let out = prov().fit(&h).unwrap();
        assert_eq!(out.caps, FI_TAGGED | FI_MULTI_RECV | FI_SOURCE);
        let mut p = prov();
        p.caps |= FI_SOURCE_ERR;
        assert_eq!(
            p.fit(&h).unwrap().caps & FI_SOURCE_ERR,
            0,
            "opt-in caps only when asked"
        );
        let h2 = Info {
            caps: FI_TAGGED | FI_SOURCE_ERR,
            ..Default::default()
        };
        assert_ne!(p.fit(&h2).unwrap().caps & FI_SOURCE_ERR, 0);
        let h = Info {
            caps: FI_RMA,
            ..Default::default()
        };
        let e = prov().fit(&h).unwrap_err().to_string();
        assert!(e.contains("FI_RMA"), "{e}");
        let mut h = Info::default();
        h.fabric_attr.prov_name = Some("tcp".into());
        assert!(matches!(prov().fit(&h), Err(Error::NoData(_))));
        h.fabric_attr.prov_name = Some("tcp;shm".into());
        assert!(prov().fit(&h).is_ok());
        let mut h = Info::default();
        h.domain_attr.data_progress = Progress::Auto;
        assert_eq!(
            prov().fit(&h).unwrap().domain_attr.data_progress,
            Progress::Auto
        );
        let mut p = prov();
        p.caps |= FI_HMEM;
        assert_eq!(p.fit(&Info::default()).unwrap().caps & FI_HMEM, 0);
        let hm = Info {
            caps: FI_MSG | FI_HMEM,
            ..Default::default()
        };
        assert_ne!(p.fit(&hm).unwrap().caps & FI_HMEM, 0);
        assert!(prov().fit(&hm).unwrap_err().to_string().contains("FI_HMEM"));
        h.ep_attr.ep_type = EpType::Msg;
        assert!(prov()
            .fit(&h)
            .unwrap_err()
            .to_string()
            .contains("FI_EP_MSG"));
    }
}
