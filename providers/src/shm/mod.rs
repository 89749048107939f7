//! The shm provider: RDM endpoints between processes on one host through shared memory.
//! See `ring` for the wire layout and `ep` for the protocols.

mod cma;
mod ep;
#[doc(hidden)]
pub mod raw;
mod ring;
pub mod segment;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use xfabric_core::av::AddrFormat;
use xfabric_core::consts::*;
use xfabric_core::info::*;
use xfabric_core::{
    DomainOps, DoorbellAlloc, EndpointOps, EpCore, Error, HmemOps, Provider, Result,
};

use crate::hmem::GlobalHmem;

pub use ep::{futex_wakes, EAGER_MAX, FRAG, INJECT_SIZE};

/// Every shm address starts with this, followed by the endpoint's segment name.
pub const ADDR_PREFIX: &str = "fi_shm://";

/// Capabilities the shm provider offers.
pub const SHM_CAPS: u64 = FI_MSG
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

/// The shm provider.
#[derive(Debug, Default)]
pub struct Shm;

impl Provider for Shm {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn version(&self) -> u32 {
        fi_version(1, 0)
    }

    fn getinfo(
        &self,
        _node: Option<&str>,
        _service: Option<&str>,
        _flags: u64,
        hints: &Info,
    ) -> Result<Vec<Info>> {
        if hints.caps & FI_HMEM != 0 {
            if let Some(why) = GlobalHmem::get().no_devices_reason() {
                return Err(Error::NoData(format!(
                    "provider shm: FI_HMEM requested, but {why}"
                )));
            }
        }
        let info = self.info();
        let mut why = None;
        let mut out = Vec::new();
        for i in info {
            match i.fit(hints) {
                Ok(i) => out.push(i),
                Err(e) => why = why.or(Some(e)),
            }
        }
        if out.is_empty() {
            return Err(
                why.unwrap_or_else(|| Error::NoData("provider shm: nothing offered".into()))
            );
        }
        Ok(out)
    }

    fn info(&self) -> Vec<Info> {
        // Device memory moves through host bounce buffers (core's hmem_stage), so FI_HMEM is
        // offered wherever some device interface works; FI_MR_HMEM is not required (owners are
        // looked up), so registering device buffers for local use is optional.
        let hmem = if GlobalHmem::get().no_devices_reason().is_none() {
            FI_HMEM
        } else {
            0
        };
        // One ring per peer, and the target carries out requests from one peer in ring
        // order; a large RMA write still landing holds that peer's later requests until it has
        // (so reads, writes, atomics and messages after it see it). Not claimed: RAS and WAS
        // (an RMA against a large message's receive buffer before the message has landed).
        // Completions may finish out of order at the initiator.
        let order = FI_ORDER_SAS
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
        vec![Info {
            caps: SHM_CAPS | hmem,
            mode: 0,
            addr_format: FI_ADDR_STR,
            src_addr: None,
            dest_addr: None,
            tx_attr: TxAttr {
                caps: FI_MSG
                    | FI_TAGGED
                    | FI_RMA
                    | FI_ATOMIC
                    | FI_SEND
                    | FI_READ
                    | FI_WRITE
                    | FI_FENCE
                    | FI_TRIGGER
                    | FI_XPU_TRIGGER
                    | hmem,
                mode: 0,
                op_flags: 0,
                msg_order: order,
                comp_order: FI_ORDER_NONE,
                inject_size: INJECT_SIZE,
                size: 1024,
                iov_limit: xfabric_core::rxq::IOV_LIMIT,
                rma_iov_limit: xfabric_core::rxq::IOV_LIMIT,
                tclass: 0,
            },
            rx_attr: RxAttr {
                // The target side of RMA and atomics is receive-side too (fi_getinfo(3)):
                // without them a -v listing says the endpoint accepts none.
                caps: FI_MSG
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
                    | hmem,
                mode: 0,
                op_flags: 0,
                msg_order: order,
                comp_order: FI_ORDER_NONE,
                total_buffered_recv: 0,
                size: 1024,
                iov_limit: xfabric_core::rxq::IOV_LIMIT,
            },
            ep_attr: EpAttr {
                ep_type: EpType::Rdm,
                protocol: FI_PROTO_SHM,
                protocol_version: 1,
                max_msg_size: isize::MAX as usize,
                mem_tag_format: 0xaaaa_aaaa_aaaa_aaaa,
                tx_ctx_cnt: 1,
                rx_ctx_cnt: 1,
                ..Default::default()
            },
            domain_attr: DomainAttr {
                name: Some("shm".into()),
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
                ..Default::default()
            },
            fabric_attr: FabricAttr {
                name: Some("shm".into()),
                prov_name: Some("shm".into()),
                prov_version: fi_version(1, 0),
                api_version: fi_version(FI_MAJOR_VERSION, FI_MINOR_VERSION),
            },
        }]
    }

    fn domain(&self, _info: &Info) -> Result<Arc<dyn DomainOps>> {
        reclaim_now_and_then();
        Ok(Arc::new(ShmDomain))
    }
}

/// Shortest time between two reclaim passes of one process.
const RECLAIM_EVERY: Duration = Duration::from_secs(1);

/// Unlinks segments of dead processes, at most once per `RECLAIM_EVERY`: a long-running
/// process opening endpoints now and then also cleans up after peers that died since it
/// started, without a directory scan on every open.
fn reclaim_now_and_then() {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if last.is_some_and(|t| t.elapsed() < RECLAIM_EVERY) {
        return;
    }
    *last = Some(Instant::now());
    drop(last);
    segment::reclaim_stale();
}

struct ShmDomain;

impl DomainOps for ShmDomain {
    fn addr_format(&self) -> Arc<dyn AddrFormat> {
        Arc::new(ShmAddr)
    }

    fn endpoint(&self, info: &Info, core: Arc<EpCore>) -> Result<Arc<dyn EndpointOps>> {
        if info.caps & !(SHM_CAPS | FI_HMEM) != 0 {
            return Err(Error::OpNotSupp(format!(
                "shm endpoint: capabilities {} are not supported",
                caps_str(info.caps & !(SHM_CAPS | FI_HMEM))
            )));
        }
        reclaim_now_and_then();
        Ok(ep::ShmEndpoint::open(core)?)
    }

    fn hmem(&self) -> Option<Arc<dyn HmemOps>> {
        Some(GlobalHmem::ops())
    }

    fn xpu_doorbells(&self) -> Option<Arc<dyn DoorbellAlloc>> {
        Some(xfabric_xpu_trigger::doorbells())
    }
}

struct ShmAddr;

impl AddrFormat for ShmAddr {
    fn validate(&self, addr: &[u8]) -> Result<()> {
        ep::seg_name(addr).map(|_| ())
    }

    fn to_string(&self, addr: &[u8]) -> String {
        String::from_utf8_lossy(addr)
            .trim_end_matches('\0')
            .to_string()
    }

    fn canonical(&self, addr: &[u8]) -> Vec<u8> {
        let end = addr.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        addr[..end].to_vec()
    }
}
