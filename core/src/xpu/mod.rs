//! The device API (`FI_XPU`): kernels post their own operations.
//!
//! An XPU trigger (`trigger::xpu`) fires an operation the host armed in advance. Here the
//! XPU decides the operation itself — its size, peer, tag, remote address — at run time, as
//! upstream libfabric's `fi_xpu_*` device calls do. Host calls export an enabled endpoint,
//! completion queue or counter to an XPU (`Endpoint::export_xpu`, `CompletionQueue::export_xpu`,
//! `Counter::export_xpu`) and give the raw values a descriptor may name
//! (`AddressVector::get_xpu_addr`, `MemoryRegion::get_xpu_desc`); device calls (`device`)
//! take the exported handles.
//!
//! - An exported endpoint has one descriptor ring per XPU (`ring`) in memory both reach. An
//!   XPU thread claims a slot, writes a fixed-size descriptor (`abi::XpuDesc`) and publishes it
//!   with a release store of its sequence word; a full ring answers `-FI_EAGAIN`.
//! - The endpoint's XPU watcher — the same one that watches doorbells, with the same
//!   prediction and sleeps (`trigger::XpuWatch`) — drains the ring, validates each descriptor
//!   (`validate`: every field is untrusted) and starts it through the endpoint's link exactly
//!   as the host call would (reserve, provider, release), so completions, counters, ordering
//!   and fences are the host call's. A faulty descriptor is an error completion naming the
//!   fault (`XPU_FAULT_*` in `prov_errno`, the reason as error data) and starts nothing.
//!   Closing the endpoint reports every descriptor still in a ring `FI_ECANCELED`.
//! - An exported counter's values are mirrored into memory the XPU reads on every change
//!   (`cntr`), so `cntr_wait` spins locally; its adds and sets go through a ring of their own.
//! - An exported CQ's entries are copied into a ring the XPU consumes (`cq`); what does not
//!   fit waits in the host queue until the XPU makes room.
//!
//! The layouts are in `abi`, asserted field by field for the CUDA header to be checked
//! against. Shared blocks live where both sides reach them (`mem`): heap memory for the CPU
//! XPU (`FI_HMEM_SYSTEM`), device-visible host memory for a CUDA or Level Zero XPU, from the
//! domain's allocator; handles carry the XPU's addresses. docs/xpu-device-api.md says what is
//! tested.

pub mod abi;
pub(crate) mod cntr;
pub(crate) mod cq;
pub mod device;
pub(crate) mod ep;
mod exports;
pub mod mem;
pub(crate) mod ring;
mod validate;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_gpu_ring;

pub use abi::{FidXpu, XpuCqEntry, XpuDesc, FI_XPU_PROV_XFABRIC};
pub use abi::{FI_XPU_DEVICE, FI_XPU_SUBGROUP, FI_XPU_WORK_GROUP, FI_XPU_WORK_ITEM};
pub use cntr::XpuCntr;
pub use cq::XpuCq;
pub use ep::XpuEp;
pub use mem::{Retired, XpuMem, XpuMemAlloc, XPU_MEM_ALIGN};
pub use ring::{Claim, RING_DEFAULT_SLOTS, RING_MAX_SLOTS, RING_MIN_SLOTS};
pub(crate) use validate::{action, entry_flags, is_recv, room_fault, Checked, Fault};
pub use validate::{
    XPU_FAULT_ADDR, XPU_FAULT_ARGS, XPU_FAULT_DESC, XPU_FAULT_FLAGS, XPU_FAULT_OPCODE,
    XPU_FAULT_RANGE, XPU_FAULT_ROOM, XPU_FAULT_TORN, XPU_FAULT_UNPUBLISHED,
};
