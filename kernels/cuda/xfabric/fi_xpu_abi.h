/*
 * xfabric/fi_xpu_abi.h: what an XPU and xfabric's host both read and write for the device API
 * (fi_xpu(3)): the handles, the descriptor an XPU posts, the descriptor ring's header, the
 * exported CQ's slot and header, and the exported counter's mirror.
 *
 * One definition of each, the C twin of core/src/xpu/abi.rs: every size and offset is
 * asserted below, and xfabric's tests check the same numbers against the Rust definitions
 * (capi/tests/xpu_header.rs). Self-contained: it compiles as C11, C++11, under nvcc and under
 * NVRTC (no system header is included there).
 *
 * Included by xfabric/fi_xpu.h (host) and xfabric/fi_xpu_device.h (device); a program
 * includes one of those.
 */
#ifndef XFABRIC_FI_XPU_ABI_H
#define XFABRIC_FI_XPU_ABI_H

#if defined(__CUDACC_RTC__)
typedef unsigned char xf_u8;
typedef unsigned int xf_u32;
typedef int xf_i32;
typedef unsigned long long xf_u64;
typedef long long xf_i64;
#else
#include <stdint.h>
typedef uint8_t xf_u8;
typedef uint32_t xf_u32;
typedef int32_t xf_i32;
typedef uint64_t xf_u64;
typedef int64_t xf_i64;
#endif

#if defined(__cplusplus)
#define XF_XPU_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define XF_XPU_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif
#define XF_XPU_OFFSET(type, field) __builtin_offsetof(type, field)
/* NVRTC has no offsetof that a static_assert takes: there the sizes are asserted, and the
 * offsets by every other compiler of this same text. */
#if defined(__CUDACC_RTC__)
#define XF_XPU_ASSERT_OFFSET(type, field, value, msg)
#else
#define XF_XPU_ASSERT_OFFSET(type, field, value, msg) \
	XF_XPU_ASSERT(XF_XPU_OFFSET(type, field) == (value), msg)
#endif
#define XF_XPU_ALIGN64 __attribute__((aligned(64)))

/* enum fi_xpu_provider value of xfabric: "xf" in ASCII, far outside upstream's small dense
 * range (FI_XPU_PROV_EFA = 1), so a dispatch switch built against upstream's header never
 * takes an xfabric handle for another provider's. */
#define FI_XPU_PROV_XFABRIC 0x7866

/* fabric.h's FI_CLASS_* values an exported handle's fclass holds. */
#define XF_XPU_CLASS_EP 3
#define XF_XPU_CLASS_CQ 14
#define XF_XPU_CLASS_CNTR 15

/* Upstream's fi_xpu.h declares these too: its definitions win when it came first. */
#ifndef FI_XPU_H
/* Who issues a device call together (fi_xpu(3), Scope). */
enum {
	FI_XPU_WORK_ITEM,  /* the calling thread */
	FI_XPU_SUBGROUP,   /* the warp (subgroup) */
	FI_XPU_WORK_GROUP, /* the block (work group) */
	FI_XPU_DEVICE,     /* the device */
};

/* The first member of every exported handle: fclass, prov_id (FI_XPU_PROV_XFABRIC) and the
 * device-visible address of the object's shared block (prov_ctx). */
struct fid_xpu {
	xf_u32 fclass;
	xf_u32 prov_id;
	xf_u64 prov_ctx;
};

/* The handles the export calls fill (the caller owns them); prov_ctx points at a
 * struct xf_xpu_ring, a struct xf_xpu_cq_ring or a struct xf_xpu_cntr_mirror. */
struct fid_xpu_ep {
	struct fid_xpu fid;
};

struct fid_xpu_cq {
	struct fid_xpu fid;
};

struct fid_xpu_cntr {
	struct fid_xpu fid;
};
#endif /* FI_XPU_H */

/* libfabric's error numbers the device calls answer (negated), for code that cannot include
 * rdma/fi_errno.h (NVRTC). xfabric/fi_xpu.h checks them against that header. */
#define XF_XPU_EAGAIN 11
#define XF_XPU_EINVAL 22
#define XF_XPU_ENOSYS 38
#define XF_XPU_EOPNOTSUPP 95
#define XF_XPU_ESHUTDOWN 108
#define XF_XPU_ETIMEDOUT 110
#define XF_XPU_EAVAIL 259
#define XF_XPU_EOVERRUN 268

/* FI_ADDR_UNSPEC: a receive from anyone. */
#define XF_XPU_ADDR_UNSPEC (~(xf_u64)0)

/* Descriptor opcodes (struct xf_xpu_desc.opcode); 0 is never valid. */
#define XF_XPU_OP_SEND 1
#define XF_XPU_OP_TSEND 2
#define XF_XPU_OP_RECV 3
#define XF_XPU_OP_TRECV 4
#define XF_XPU_OP_WRITE 5
#define XF_XPU_OP_READ 6
#define XF_XPU_OP_ATOMIC 7
#define XF_XPU_OP_FETCH_ATOMIC 8
#define XF_XPU_OP_COMPARE_ATOMIC 9
#define XF_XPU_OP_CNTR_ADD 32 /* a counter's ring only; data is the value */
#define XF_XPU_OP_CNTR_SET 33
#define XF_XPU_OP_CNTR_ADDERR 34
#define XF_XPU_OP_CNTR_SETERR 35
/* A position claimed by a post that then found its ring closed (the post answered
 * -FI_ESHUTDOWN): published so that the close does not wait for it; never started or
 * reported. */
#define XF_XPU_OP_WITHDRAWN 63

/* prov_errno of the error completion a faulty descriptor gets (docs/xpu-device-api.md). */
#define XF_XPU_FAULT_OPCODE 16
#define XF_XPU_FAULT_ADDR 17
#define XF_XPU_FAULT_DESC 18
#define XF_XPU_FAULT_RANGE 19
#define XF_XPU_FAULT_FLAGS 20
#define XF_XPU_FAULT_TORN 21
#define XF_XPU_FAULT_ARGS 22
#define XF_XPU_FAULT_UNPUBLISHED 23
#define XF_XPU_FAULT_ROOM 24

/* Magic words and layout version of the shared blocks. */
#define XF_XPU_RING_MAGIC 0x58465852u    /* "XFXR" */
#define XF_XPU_CQ_RING_MAGIC 0x58465143u /* "XFQC" */
#define XF_XPU_CNTR_MAGIC 0x58464e43u    /* "XFCN" */
#define XF_XPU_ABI_VERSION 3u

/* struct xf_xpu_ring.state. */
#define XF_XPU_RING_OPEN 0u
#define XF_XPU_RING_CLOSED 1u

/* struct xf_xpu_cq_entry.kind. */
#define XF_XPU_CQ_KIND_OK 0u
#define XF_XPU_CQ_KIND_ERR 1u

/* enum fi_cq_format values struct xf_xpu_cq_ring.format holds. */
#define XF_XPU_CQ_FORMAT_UNSPEC 0u
#define XF_XPU_CQ_FORMAT_CONTEXT 1u
#define XF_XPU_CQ_FORMAT_MSG 2u
#define XF_XPU_CQ_FORMAT_DATA 3u
#define XF_XPU_CQ_FORMAT_TAGGED 4u

/* One operation an XPU posts: 192 bytes, every field an integer. Every word but seq is
 * written first (check = low 32 bits of position + 1), then seq = position + 1 with a
 * release store (system scope on a GPU): the host takes a slot only when seq is the position
 * it waits for, and reports a slot whose check disagrees as torn. */
struct xf_xpu_desc {
	xf_u64 seq;
	xf_u32 opcode;   /* XF_XPU_OP_* */
	xf_i32 op;       /* enum fi_op of an atomic */
	xf_i32 datatype; /* enum fi_datatype of an atomic */
	xf_u32 check;
	xf_u64 flags;   /* FI_COMPLETION, FI_REMOTE_CQ_DATA, completion levels, FI_FENCE, FI_MORE */
	xf_u64 len;     /* bytes, or elements of an atomic */
	xf_u64 buf;     /* local memory */
	xf_u64 desc;    /* its fi_mr_get_xpu_desc value */
	xf_u64 peer;    /* fi_av_get_xpu_addr value, or XF_XPU_ADDR_UNSPEC */
	xf_u64 context; /* completion context */
	xf_u64 data;    /* remote CQ data; a counter descriptor's value */
	xf_u64 tag;
	xf_u64 ignore;
	xf_u64 raddr;
	xf_u64 rkey;
	xf_u64 compare;
	xf_u64 compare_desc;
	xf_u64 result;
	xf_u64 result_desc;
	xf_u64 reserved[6];
};

/* Words of one descriptor slot. */
#define XF_XPU_DESC_WORDS 24

/* A descriptor ring's shared header (an exported endpoint's prov_ctx; a counter mirror's
 * ring). tail, claimed and head each have a cache line. Each word has one writing side:
 * tail and claimed the producers' (read-modify-writes), head and state the host's (stores). */
struct XF_XPU_ALIGN64 xf_xpu_ring {
	xf_u32 magic;   /* XF_XPU_RING_MAGIC */
	xf_u32 version; /* XF_XPU_ABI_VERSION */
	xf_u64 slots;   /* address of slot 0 as the XPU sees it */
	xf_u64 mask;    /* slots - 1 */
	xf_u32 state;   /* XF_XPU_RING_OPEN or XF_XPU_RING_CLOSED */
	xf_u8 pad0[36];
	xf_u64 tail; /* next position to claim (producers: fetch-add) */
	xf_u8 pad1[56];
	xf_u64 claimed; /* reservations taken (producers only); room while claimed - head < slots */
	xf_u8 pad2[56];
	xf_u64 head; /* next position the host takes (host only) */
	xf_u8 pad3[56];
};

/* One completion in an exported CQ's ring: 128 bytes, seq (position + 1) stored last. */
struct xf_xpu_cq_entry {
	xf_u64 seq;
	xf_u32 kind; /* XF_XPU_CQ_KIND_OK or _ERR */
	xf_i32 err;  /* positive errno of an error entry */
	xf_u64 op_context;
	xf_u64 flags;
	xf_u64 len;
	xf_u64 buf;
	xf_u64 data;
	xf_u64 tag;
	xf_u64 src; /* source address, FI_ADDR_NOTAVAIL when unknown */
	xf_u64 olen;
	xf_i32 prov_errno;
	xf_u32 pad;
	xf_u64 reserved[5];
};

/* Words of one CQ slot. */
#define XF_XPU_CQ_WORDS 16

/* An exported CQ's shared header (its prov_ctx). The host writes slots at tail; XPU threads
 * copy published slots from head and advance it with a compare-and-swap. */
struct XF_XPU_ALIGN64 xf_xpu_cq_ring {
	xf_u32 magic;   /* XF_XPU_CQ_RING_MAGIC */
	xf_u32 version; /* XF_XPU_ABI_VERSION */
	xf_u64 slots;   /* address of slot 0 as the XPU sees it */
	xf_u64 mask;    /* slots - 1 */
	xf_u32 format;  /* the queue's enum fi_cq_format: what fi_xpu_cq_read writes */
	xf_u32 overrun; /* 1 once the queue overran, written after every entry from before it */
	xf_u8 pad0[32];
	xf_u64 tail; /* next position the host writes (host only) */
	xf_u8 pad1[56];
	xf_u64 head; /* next position an XPU reads (compare-and-swap) */
	xf_u8 pad2[56];
};

/* An exported counter's shared block (its prov_ctx): the values as last changed, and the
 * address of the ring its adds and sets are posted on. */
struct XF_XPU_ALIGN64 xf_xpu_cntr_mirror {
	xf_u64 value;
	xf_u64 err;
	xf_u32 magic;   /* XF_XPU_CNTR_MAGIC */
	xf_u32 version; /* XF_XPU_ABI_VERSION */
	xf_u64 ring;    /* address of a struct xf_xpu_ring */
	xf_u8 pad[32];
};

/* struct fi_cq_tagged_entry and struct fi_cq_err_entry of libfabric 1.17 as a 64-bit XPU
 * writes them (xfabric/fi_xpu.h checks them against rdma/fi_eq.h); the context, msg and data
 * formats are the first 1, 3 and 5 words of the tagged one. */
struct xf_xpu_cq_tagged_entry {
	xf_u64 op_context;
	xf_u64 flags;
	xf_u64 len;
	xf_u64 buf;
	xf_u64 data;
	xf_u64 tag;
};

struct xf_xpu_cq_err_entry {
	xf_u64 op_context;
	xf_u64 flags;
	xf_u64 len;
	xf_u64 buf;
	xf_u64 data;
	xf_u64 tag;
	xf_u64 olen;
	xf_i32 err;
	xf_i32 prov_errno;
	xf_u64 err_data; /* always 0 from an XPU: error data stays on the host */
	xf_u64 err_data_size;
};

XF_XPU_ASSERT(sizeof(void *) == 8, "xfabric's device API assumes 64-bit addresses");
XF_XPU_ASSERT(sizeof(struct fid_xpu) == 16, "struct fid_xpu");
XF_XPU_ASSERT_OFFSET(struct fid_xpu, prov_id, 4, "fid_xpu.prov_id");
XF_XPU_ASSERT_OFFSET(struct fid_xpu, prov_ctx, 8, "fid_xpu.prov_ctx");
XF_XPU_ASSERT(sizeof(struct fid_xpu_ep) == 16 && sizeof(struct fid_xpu_cq) == 16 &&
		      sizeof(struct fid_xpu_cntr) == 16,
	      "struct fid_xpu_ep/cq/cntr");

XF_XPU_ASSERT(sizeof(struct xf_xpu_desc) == XF_XPU_DESC_WORDS * 8, "struct xf_xpu_desc");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, opcode, 8, "xf_xpu_desc.opcode");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, op, 12, "xf_xpu_desc.op");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, datatype, 16, "xf_xpu_desc.datatype");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, check, 20, "xf_xpu_desc.check");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, flags, 24, "xf_xpu_desc.flags");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, len, 32, "xf_xpu_desc.len");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, buf, 40, "xf_xpu_desc.buf");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, desc, 48, "xf_xpu_desc.desc");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, peer, 56, "xf_xpu_desc.peer");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, context, 64, "xf_xpu_desc.context");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, data, 72, "xf_xpu_desc.data");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, tag, 80, "xf_xpu_desc.tag");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, ignore, 88, "xf_xpu_desc.ignore");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, raddr, 96, "xf_xpu_desc.raddr");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, rkey, 104, "xf_xpu_desc.rkey");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, compare, 112, "xf_xpu_desc.compare");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, compare_desc, 120, "xf_xpu_desc.compare_desc");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, result, 128, "xf_xpu_desc.result");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, result_desc, 136, "xf_xpu_desc.result_desc");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_desc, reserved, 144, "xf_xpu_desc.reserved");

XF_XPU_ASSERT(sizeof(struct xf_xpu_ring) == 256, "struct xf_xpu_ring");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_ring, slots, 8, "xf_xpu_ring.slots");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_ring, mask, 16, "xf_xpu_ring.mask");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_ring, state, 24, "xf_xpu_ring.state");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_ring, tail, 64, "xf_xpu_ring.tail");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_ring, claimed, 128, "xf_xpu_ring.claimed");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_ring, head, 192, "xf_xpu_ring.head");

XF_XPU_ASSERT(sizeof(struct xf_xpu_cq_entry) == XF_XPU_CQ_WORDS * 8, "struct xf_xpu_cq_entry");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_entry, kind, 8, "xf_xpu_cq_entry.kind");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_entry, err, 12, "xf_xpu_cq_entry.err");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_entry, op_context, 16, "cq_entry.op_context");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_entry, flags, 24, "xf_xpu_cq_entry.flags");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_entry, len, 32, "xf_xpu_cq_entry.len");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_entry, buf, 40, "xf_xpu_cq_entry.buf");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_entry, data, 48, "xf_xpu_cq_entry.data");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_entry, tag, 56, "xf_xpu_cq_entry.tag");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_entry, src, 64, "xf_xpu_cq_entry.src");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_entry, olen, 72, "xf_xpu_cq_entry.olen");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_entry, prov_errno, 80, "cq_entry.prov_errno");

XF_XPU_ASSERT(sizeof(struct xf_xpu_cq_ring) == 192, "struct xf_xpu_cq_ring");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_ring, slots, 8, "xf_xpu_cq_ring.slots");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_ring, mask, 16, "xf_xpu_cq_ring.mask");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_ring, format, 24, "xf_xpu_cq_ring.format");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_ring, overrun, 28, "xf_xpu_cq_ring.overrun");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_ring, tail, 64, "xf_xpu_cq_ring.tail");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_ring, head, 128, "xf_xpu_cq_ring.head");

XF_XPU_ASSERT(sizeof(struct xf_xpu_cntr_mirror) == 64, "struct xf_xpu_cntr_mirror");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cntr_mirror, err, 8, "xf_xpu_cntr_mirror.err");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cntr_mirror, magic, 16, "cntr_mirror.magic");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cntr_mirror, ring, 24, "xf_xpu_cntr_mirror.ring");

XF_XPU_ASSERT(sizeof(struct xf_xpu_cq_tagged_entry) == 48, "struct xf_xpu_cq_tagged_entry");
XF_XPU_ASSERT(sizeof(struct xf_xpu_cq_err_entry) == 80, "struct xf_xpu_cq_err_entry");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_err_entry, err, 56, "xf_xpu_cq_err_entry.err");
XF_XPU_ASSERT_OFFSET(struct xf_xpu_cq_err_entry, err_data, 64, "cq_err_entry.err_data");

#endif /* XFABRIC_FI_XPU_ABI_H */
