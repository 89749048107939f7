//! What a descriptor an XPU posted may ask, judged before anything starts: every field is
//! untrusted. A descriptor either becomes the operation the matching host call would post
//! (an `Action`, started through the same path) or a `Fault` that says what was wrong and is
//! reported as an error completion; nothing of a faulty descriptor starts.

use super::abi::{opcode, XpuDesc};
use crate::atomic::{self, AtomicOp, Datatype};
use crate::consts::errno::{FI_EACCES, FI_EAGAIN, FI_EINVAL, FI_EMSGSIZE, FI_EOPNOTSUPP};
use crate::consts::*;
use crate::ep::atomic::ATOMIC_MAX;
use crate::ep::EpCore;
use crate::mr::{XpuMrFault, XpuRegion};
use crate::op::{AtomicReq, RmaIov, RmaIovList, RmaOp, TxOp};
use crate::rxq::{IovList, PostedRecv};
use crate::trigger::Action;

/// `prov_errno` of an error entry for a descriptor: its opcode is none of the known ones.
pub const XPU_FAULT_OPCODE: i32 = 16;
/// `prov_errno`: its peer is not an address of the endpoint's AV (`get_xpu_addr`).
pub const XPU_FAULT_ADDR: i32 = 17;
/// `prov_errno`: a memory descriptor it names was never exported (`get_xpu_desc`) or its
/// region closed.
pub const XPU_FAULT_DESC: i32 = 18;
/// `prov_errno`: a local range lies outside its region, wraps, or lacks the access.
pub const XPU_FAULT_RANGE: i32 = 19;
/// `prov_errno`: it carries flags the operation does not take.
pub const XPU_FAULT_FLAGS: i32 = 20;
/// `prov_errno`: the slot was torn (its check word disagrees with its sequence word).
pub const XPU_FAULT_TORN: i32 = 21;
/// `prov_errno`: another argument is invalid (length past `max_msg_size`, an atomic's type,
/// operation or count, a capability the endpoint was opened without).
pub const XPU_FAULT_ARGS: i32 = 22;
/// `prov_errno` of the `FI_ECANCELED` entry for a position claimed on a ring but never
/// published when its endpoint closed (context 0: the descriptor never existed).
pub const XPU_FAULT_UNPUBLISHED: i32 = 23;
/// `prov_errno` of the `FI_EAGAIN` entry for a receive descriptor found when the receives
/// descriptors posted, not yet matched, fill the receive context (`rx_attr.size`): nothing
/// was posted; post it again once some complete.
pub const XPU_FAULT_ROOM: i32 = 24;

/// What was wrong with a descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fault {
    /// `XPU_FAULT_*`.
    pub(crate) code: i32,
    /// The errno of the error entry.
    pub(crate) err: i32,
    /// In words, kept as the entry's error data.
    pub(crate) why: String,
}

fn fault(code: i32, err: i32, why: String) -> Fault {
    Fault { code, err, why }
}

/// Whether `opcode` posts a receive (its faults are reported on the receive side).
pub(crate) fn is_recv(op: u32) -> bool {
    matches!(op, opcode::RECV | opcode::TRECV)
}

/// The completion flags an error entry for a descriptor with `op` carries.
pub(crate) fn entry_flags(op: u32) -> u64 {
    match op {
        opcode::SEND => FI_SEND | FI_MSG,
        opcode::TSEND => FI_SEND | FI_TAGGED,
        opcode::RECV => FI_RECV | FI_MSG,
        opcode::TRECV => FI_RECV | FI_TAGGED,
        opcode::WRITE => FI_RMA | FI_WRITE,
        opcode::READ => FI_RMA | FI_READ,
        opcode::ATOMIC => FI_ATOMIC | FI_WRITE,
        opcode::FETCH_ATOMIC | opcode::COMPARE_ATOMIC => FI_ATOMIC | FI_READ,
        _ => 0,
    }
}

/// Flags a transmit descriptor may carry.
const TX_FLAGS: u64 = FI_COMPLETION
    | FI_MORE
    | FI_FENCE
    | FI_INJECT_COMPLETE
    | FI_TRANSMIT_COMPLETE
    | FI_DELIVERY_COMPLETE;
/// Flags a receive descriptor may carry.
const RX_FLAGS: u64 = FI_COMPLETION | FI_MORE;

/// What one ring's watcher validated last, reused while what it depends on has not changed:
/// the last local region (by exported descriptor, for one generation of the domain's
/// registrations: a region closed since is looked up again) and the last peer (for one
/// generation of the endpoint's AV: an address removed since is looked up again). Every
/// other check runs on every descriptor; a region's range and access too.
#[derive(Default)]
pub(crate) struct Checked {
    mr: Option<XpuRegion>,
    peer: Option<(u64, u64)>,
}

fn mr_fault(f: XpuMrFault, what: &str) -> Fault {
    match f {
        XpuMrFault::NotExported(s) => fault(XPU_FAULT_DESC, FI_EACCES, format!("{what}: {s}")),
        XpuMrFault::Range(s) => fault(XPU_FAULT_RANGE, FI_EACCES, format!("{what}: {s}")),
    }
}

/// Checks local memory a descriptor names; an empty range names none.
#[inline]
fn local(
    core: &EpCore,
    seen: &mut Checked,
    what: &str,
    desc: u64,
    addr: u64,
    len: u64,
    access: u64,
) -> Result<(), Fault> {
    if len == 0 {
        return Ok(());
    }
    core.mr
        .check_xpu_local_cached(&mut seen.mr, desc, addr, len, access)
        .map_err(|f| mr_fault(f, what))?;
    // A device's memory goes through the heterogeneous-memory layer, which only an `FI_HMEM`
    // endpoint has: elsewhere the provider would read or write it as host memory.
    if core.caps & FI_HMEM == 0 && seen.mr.is_some_and(|r| r.is_device()) {
        return Err(device_without_hmem(what, desc));
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn device_without_hmem(what: &str, desc: u64) -> Fault {
    fault(
        XPU_FAULT_RANGE,
        FI_EINVAL,
        format!(
            "{what}: descriptor {desc:#x} names a device's memory, and the endpoint was \
             opened without FI_HMEM"
        ),
    )
}

/// Checks the peer: an entry of the endpoint's AV; `FI_ADDR_UNSPEC` only where `any` (a
/// receive from anyone).
#[inline]
fn peer(core: &EpCore, seen: &mut Checked, peer: u64, any: bool) -> Result<FiAddrChecked, Fault> {
    if any && peer == FI_ADDR_UNSPEC {
        return Ok(FiAddrChecked(peer));
    }
    let av = core.bound().and_then(|b| b.av.as_ref());
    let known = av.is_some_and(|av| {
        // Read before the lookup: a removal after it moves the generation.
        let gen = av.generation();
        if seen.peer == Some((peer, gen)) {
            return true;
        }
        let known = av.contains(peer);
        seen.peer = known.then_some((peer, gen));
        known
    });
    if !known {
        return Err(unknown_peer(peer));
    }
    Ok(FiAddrChecked(peer))
}

// The faults' wording is out of line (cold), so that the checks inline into the watcher's
// loop: a descriptor that passes pays for no formatting code in its path.

/// The fault of a receive descriptor found when `posted` receives of descriptors wait,
/// `bound` being the receive context's size.
#[cold]
#[inline(never)]
pub(crate) fn room_fault(op: u32, posted: usize, bound: usize) -> Fault {
    let what = if op == opcode::TRECV {
        "fi_xpu_trecv"
    } else {
        "fi_xpu_recv"
    };
    fault(
        XPU_FAULT_ROOM,
        FI_EAGAIN,
        format!(
            "{what}: {posted} receives posted by descriptors wait unmatched, the receive \
             context's size (rx_attr.size {bound}); nothing was posted, post it again once \
             some complete"
        ),
    )
}

#[cold]
#[inline(never)]
fn unknown_peer(peer: u64) -> Fault {
    fault(
        XPU_FAULT_ADDR,
        FI_EINVAL,
        format!("peer {peer:#x} is not an address of the endpoint's AV (get_xpu_addr)"),
    )
}

/// A peer address that passed `peer`.
struct FiAddrChecked(u64);

fn usize_of(v: u64, what: &str) -> Result<usize, Fault> {
    usize::try_from(v).map_err(|_| {
        fault(
            XPU_FAULT_ARGS,
            FI_EINVAL,
            format!("{what} {v:#x} does not fit this host's addresses"),
        )
    })
}

#[inline]
fn flags_ok(d: &XpuDesc, allowed: u64, what: &str) -> Result<(), Fault> {
    let bad = d.flags & !allowed;
    if bad != 0 {
        return Err(bad_flags(bad, what));
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn bad_flags(bad: u64, what: &str) -> Fault {
    fault(
        XPU_FAULT_FLAGS,
        FI_EINVAL,
        format!(
            "{what}: flags {} ({bad:#x}) are not taken from an XPU",
            caps_str(bad)
        ),
    )
}

#[inline]
fn need_caps(core: &EpCore, need: u64, what: &str) -> Result<(), Fault> {
    if core.caps & need != need {
        return Err(missing_caps(need & !core.caps, what));
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn missing_caps(missing: u64, what: &str) -> Fault {
    fault(
        XPU_FAULT_ARGS,
        FI_EOPNOTSUPP,
        format!("{what}: endpoint was opened without {}", caps_str(missing)),
    )
}

#[inline]
fn msg_len(core: &EpCore, d: &XpuDesc, what: &str) -> Result<usize, Fault> {
    let len = usize_of(d.len, "length")?;
    if len > core.max_msg_size {
        return Err(too_long(len, core.max_msg_size, what));
    }
    Ok(len)
}

#[cold]
#[inline(never)]
fn too_long(len: usize, max: usize, what: &str) -> Fault {
    fault(
        XPU_FAULT_ARGS,
        FI_EMSGSIZE,
        format!("{what}: {len} bytes, max_msg_size is {max}"),
    )
}

#[cold]
#[inline(never)]
fn reserved_context(context: u64) -> Fault {
    fault(
        XPU_FAULT_ARGS,
        FI_EINVAL,
        format!(
            "context {context:#x}: a context with bit {} set is reserved for the endpoint's own keys",
            usize::BITS - 1
        ),
    )
}

/// The operation descriptor `d` asks of the endpoint whose core is `core`, or what is wrong
/// with it.
pub(crate) fn action(core: &EpCore, seen: &mut Checked, d: &XpuDesc) -> Result<Action, Fault> {
    if d.context as usize & crate::entry::INTERNAL_CTX != 0 {
        return Err(reserved_context(d.context));
    }
    match d.opcode {
        opcode::SEND | opcode::TSEND => {
            let tagged = d.opcode == opcode::TSEND;
            let what = if tagged {
                "fi_xpu_tsend"
            } else {
                "fi_xpu_send"
            };
            let kind = if tagged { FI_TAGGED } else { FI_MSG };
            let mut allowed = TX_FLAGS | FI_REMOTE_CQ_DATA;
            if tagged {
                allowed |= FI_MATCH_COMPLETE;
            }
            flags_ok(d, allowed, what)?;
            need_caps(core, kind, what)?;
            let len = msg_len(core, d, what)?;
            let dest = peer(core, seen, d.peer, false)?;
            local(core, seen, what, d.desc, d.buf, d.len, FI_SEND)?;
            Ok(Action::Send(TxOp {
                ctx: d.context as usize,
                iov: IovList::one(usize_of(d.buf, "buffer")?, len),
                dest: dest.0,
                tag: if tagged { d.tag } else { 0 },
                data: d.data,
                flags: d.flags | kind,
            }))
        }
        opcode::RECV | opcode::TRECV => {
            let tagged = d.opcode == opcode::TRECV;
            let what = if tagged {
                "fi_xpu_trecv"
            } else {
                "fi_xpu_recv"
            };
            let kind = if tagged { FI_TAGGED } else { FI_MSG };
            flags_ok(d, RX_FLAGS, what)?;
            need_caps(core, kind, what)?;
            let len = usize_of(d.len, "length")?;
            let src = peer(core, seen, d.peer, true)?;
            local(core, seen, what, d.desc, d.buf, d.len, FI_RECV)?;
            Ok(Action::Recv(PostedRecv {
                ctx: d.context as usize,
                iov: IovList::one(usize_of(d.buf, "buffer")?, len),
                src: src.0,
                tag: if tagged { d.tag } else { 0 },
                ignore: if tagged { d.ignore } else { 0 },
                flags: d.flags | kind,
                used: 0,
                from_xpu: true,
            }))
        }
        opcode::WRITE | opcode::READ => {
            let write = d.opcode == opcode::WRITE;
            let what = if write { "fi_xpu_write" } else { "fi_xpu_read" };
            let dir = if write { FI_WRITE } else { FI_READ };
            let allowed = if write {
                TX_FLAGS | FI_REMOTE_CQ_DATA
            } else {
                TX_FLAGS
            };
            flags_ok(d, allowed, what)?;
            need_caps(core, FI_RMA, what)?;
            if core.caps & (FI_READ | FI_WRITE) != 0 {
                need_caps(core, dir, what)?;
            }
            let len = msg_len(core, d, what)?;
            let dest = peer(core, seen, d.peer, false)?;
            // A write reads the local range (FI_WRITE access), a read fills it (FI_READ).
            local(core, seen, what, d.desc, d.buf, d.len, dir)?;
            let rma = RmaIov {
                addr: d.raddr,
                len,
                key: d.rkey,
            };
            Ok(Action::Rma(Box::new(RmaOp {
                ctx: d.context as usize,
                iov: IovList::one(usize_of(d.buf, "buffer")?, len),
                dest: dest.0,
                rma: RmaIovList::from_segs(&[rma]).unwrap_or_default(),
                data: d.data,
                flags: d.flags | FI_RMA | dir,
            })))
        }
        opcode::ATOMIC | opcode::FETCH_ATOMIC | opcode::COMPARE_ATOMIC => {
            let what = match d.opcode {
                opcode::ATOMIC => "fi_xpu_atomic",
                opcode::FETCH_ATOMIC => "fi_xpu_fetch_atomic",
                _ => "fi_xpu_compare_atomic",
            };
            flags_ok(d, TX_FLAGS, what)?;
            need_caps(core, FI_ATOMIC, what)?;
            let (Some(dt), Some(op)) = (Datatype::from_raw(d.datatype), AtomicOp::from_raw(d.op))
            else {
                return Err(fault(
                    XPU_FAULT_ARGS,
                    FI_EINVAL,
                    format!(
                        "{what}: datatype {} / op {} are not enum fi_datatype / fi_op values",
                        d.datatype, d.op
                    ),
                ));
            };
            let family_ok = match d.opcode {
                opcode::ATOMIC => atomic::valid(op, dt),
                opcode::FETCH_ATOMIC => atomic::fetch_valid(op, dt),
                _ => atomic::compare_valid(op, dt),
            };
            if !family_ok {
                return Err(fault(
                    XPU_FAULT_ARGS,
                    FI_EOPNOTSUPP,
                    format!(
                        "{what}: {} on {} is not defined for this call",
                        op.c_name(),
                        dt.c_name()
                    ),
                ));
            }
            let count = usize_of(d.len, "count")?;
            let bytes = count
                .checked_mul(dt.size())
                .filter(|b| *b > 0 && *b <= ATOMIC_MAX);
            let Some(bytes) = bytes else {
                return Err(fault(
                    XPU_FAULT_ARGS,
                    FI_EINVAL,
                    format!(
                        "{what}: count {count} of {} (1 to {} elements)",
                        dt.c_name(),
                        ATOMIC_MAX / dt.size()
                    ),
                ));
            };
            let dest = peer(core, seen, d.peer, false)?;
            let b = bytes as u64;
            let fetch = d.opcode != opcode::ATOMIC;
            if op != AtomicOp::Read {
                local(core, seen, what, d.desc, d.buf, b, FI_WRITE)?;
            }
            let mut compare = 0;
            if d.opcode == opcode::COMPARE_ATOMIC {
                local(core, seen, what, d.compare_desc, d.compare, b, FI_WRITE)?;
                compare = usize_of(d.compare, "compare buffer")?;
                if compare == 0 {
                    return Err(fault(
                        XPU_FAULT_RANGE,
                        FI_EACCES,
                        format!("{what}: no compare buffer"),
                    ));
                }
            }
            let mut result = 0;
            if fetch {
                local(core, seen, what, d.result_desc, d.result, b, FI_READ)?;
                result = usize_of(d.result, "result buffer")?;
                if result == 0 {
                    return Err(fault(
                        XPU_FAULT_RANGE,
                        FI_EACCES,
                        format!("{what}: no result buffer"),
                    ));
                }
            }
            let dir = if fetch { FI_READ } else { FI_WRITE };
            Ok(Action::Atomic(Box::new(AtomicReq {
                ctx: d.context as usize,
                dest: dest.0,
                addr: d.raddr,
                key: d.rkey,
                dt,
                op,
                count,
                operand: usize_of(d.buf, "operand buffer")?,
                compare,
                result,
                flags: d.flags | FI_ATOMIC | dir | (core.tx_op_flags & !FI_INJECT),
            })))
        }
        other => Err(fault(
            XPU_FAULT_OPCODE,
            FI_EINVAL,
            format!("opcode {other} is not an operation an endpoint's ring takes"),
        )),
    }
}
