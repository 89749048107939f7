//! What every RDM provider here describes alike: the attributes of its `fi_info`, the
//! orderings its one-channel-per-peer design gives, and when `FI_HMEM` is offered. Each
//! provider says only what differs (name, capabilities, address format, protocol).

use xfabric_core::consts::*;
use xfabric_core::info::*;
use xfabric_core::{Error, Result};

use crate::hmem::GlobalHmem;

/// Capabilities the engine gives an endpoint over any transport (a network transport adds
/// `FI_REMOTE_COMM`; `FI_HMEM` is added where a device interface works).
pub(crate) const RDM_CAPS: u64 = FI_MSG
    | FI_TAGGED
    | FI_RMA
    | FI_ATOMIC
    | FI_READ
    | FI_WRITE
    | FI_REMOTE_READ
    | FI_REMOTE_WRITE
    | FI_RMA_EVENT
    | FI_RMA_PMEM
    | FI_FENCE
    | FI_SEND
    | FI_RECV
    | FI_MULTI_RECV
    | FI_SOURCE
    | FI_SOURCE_ERR
    | FI_DIRECTED_RECV
    | FI_TRIGGER
    | FI_XPU_TRIGGER
    | FI_LOCAL_COMM;

/// Capabilities that describe a transmit context.
const TX_CAPS: u64 = FI_MSG
    | FI_TAGGED
    | FI_RMA
    | FI_ATOMIC
    | FI_SEND
    | FI_READ
    | FI_WRITE
    | FI_FENCE
    | FI_TRIGGER
    | FI_XPU_TRIGGER
    | FI_HMEM;

/// Capabilities that describe a receive context. The target side of RMA and atomics is
/// receive-side too (fi_getinfo(3)): without them a -v listing says the endpoint accepts none.
const RX_CAPS: u64 = FI_MSG
    | FI_TAGGED
    | FI_RMA
    | FI_ATOMIC
    | FI_REMOTE_READ
    | FI_REMOTE_WRITE
    | FI_RMA_EVENT
    | FI_RMA_PMEM
    | FI_RECV
    | FI_MULTI_RECV
    | FI_SOURCE
    | FI_SOURCE_ERR
    | FI_DIRECTED_RECV
    | FI_TRIGGER
    | FI_HMEM;

/// One ordered channel per peer (a ring, a stream), and a target that carries out one peer's
/// requests in the order they came; a large RMA write still landing holds that peer's later
/// requests until it has (so reads, writes, atomics and messages after it see it). Not
/// claimed: RAS and WAS (an RMA against a large message's receive buffer before the message
/// has landed). Completions may finish out of order at the initiator.
const ORDER: u64 = FI_ORDER_SAS
    | FI_ORDER_RAR
    | FI_ORDER_RAW
    | FI_ORDER_WAR
    | FI_ORDER_WAW
    | FI_ORDER_SAR
    | FI_ORDER_SAW
    | FI_ORDER_RMA_RAR
    | FI_ORDER_RMA_RAW
    | FI_ORDER_RMA_WAR
    | FI_ORDER_RMA_WAW
    | FI_ORDER_ATOMIC_RAR
    | FI_ORDER_ATOMIC_RAW
    | FI_ORDER_ATOMIC_WAR
    | FI_ORDER_ATOMIC_WAW;

/// What differs between the providers' descriptions.
pub(crate) struct RdmDesc {
    pub name: &'static str,
    /// Capabilities without `FI_HMEM` (added where a device interface works).
    pub caps: u64,
    pub addr_format: u32,
    pub protocol: u32,
    pub inject_size: usize,
}

/// `FI_HMEM` where some device interface works: device memory moves through host bounce
/// buffers (core's hmem_stage); FI_MR_HMEM is not required (owners are looked up), so
/// registering device buffers for local use is optional.
fn hmem() -> u64 {
    if GlobalHmem::get().no_devices_reason().is_none() {
        FI_HMEM
    } else {
        0
    }
}

/// `Err(NoData)` when the hints ask for `FI_HMEM` and no device interface works.
pub(crate) fn check_hmem(name: &str, hints: &Info) -> Result<()> {
    if hints.caps & FI_HMEM != 0 {
        if let Some(why) = GlobalHmem::get().no_devices_reason() {
            return Err(Error::NoData(format!(
                "provider {name}: FI_HMEM requested, but {why}"
            )));
        }
    }
    Ok(())
}

/// The one `fi_info` an RDM provider offers.
pub(crate) fn rdm_info(d: &RdmDesc) -> Info {
    let caps = d.caps | hmem();
    Info {
        caps,
        mode: 0,
        addr_format: d.addr_format,
        src_addr: None,
        dest_addr: None,
        tx_attr: TxAttr {
            caps: caps & TX_CAPS,
            mode: 0,
            op_flags: 0,
            msg_order: ORDER,
            comp_order: FI_ORDER_NONE,
            inject_size: d.inject_size,
            size: 1024,
            iov_limit: xfabric_core::rxq::IOV_LIMIT,
            rma_iov_limit: xfabric_core::rxq::IOV_LIMIT,
            tclass: 0,
        },
        rx_attr: RxAttr {
            caps: caps & RX_CAPS,
            mode: 0,
            op_flags: 0,
            msg_order: ORDER,
            comp_order: FI_ORDER_NONE,
            total_buffered_recv: 0,
            size: 1024,
            iov_limit: xfabric_core::rxq::IOV_LIMIT,
        },
        ep_attr: EpAttr {
            ep_type: EpType::Rdm,
            protocol: d.protocol,
            protocol_version: 1,
            max_msg_size: isize::MAX as usize,
            mem_tag_format: 0xaaaa_aaaa_aaaa_aaaa,
            // RAW, WAR and WAW hold for RMA of any size (`ORDER`): up to the largest message.
            max_order_raw_size: isize::MAX as usize,
            max_order_war_size: isize::MAX as usize,
            max_order_waw_size: isize::MAX as usize,
            tx_ctx_cnt: 1,
            rx_ctx_cnt: 1,
            ..Default::default()
        },
        domain_attr: DomainAttr {
            name: Some(d.name.into()),
            threading: Threading::Safe,
            control_progress: Progress::Auto,
            data_progress: Progress::Manual,
            resource_mgmt: ResourceMgmt::Enabled,
            av_type: AvType::Unspec,
            mr_mode: 0,
            mr_key_size: 8,
            cq_data_size: 8,
            cq_cnt: 1024,
            ep_cnt: 256,
            tx_ctx_cnt: 1024,
            rx_ctx_cnt: 1024,
            max_ep_tx_ctx: 1,
            max_ep_rx_ctx: 1,
            cntr_cnt: 1024,
            mr_iov_limit: 1,
            max_err_data: 256,
            mr_cnt: 65536,
            caps: caps & FI_DOMAIN_CAPS,
            ..Default::default()
        },
        fabric_attr: FabricAttr {
            name: Some(d.name.into()),
            prov_name: Some(d.name.into()),
            prov_version: fi_version(1, 0),
            api_version: fi_version(FI_MAJOR_VERSION, FI_MINOR_VERSION),
        },
    }
}
