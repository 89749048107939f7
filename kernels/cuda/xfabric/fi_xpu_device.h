/*
 * xfabric/fi_xpu_device.h: the device calls of fi_xpu(3) (upstream's rdma/fi_xpu_device.h)
 * for handles exported by xfabric, as static inline functions that read and write only the
 * shared blocks a handle names (xfabric/fi_xpu_abi.h).
 *
 * One implementation, two targets, chosen by the compiler:
 *   - CUDA (nvcc, NVRTC): __device__ functions; system-scope atomics (atomicAdd_system,
 *     atomicCAS_system: sm_60 or newer; __nanosleep between looks from sm_70) and
 *     __threadfence_system() around the publishing store; scope FI_XPU_SUBGROUP and
 *     FI_XPU_WORK_GROUP elect one lane to post and broadcast its answer (__shfl_sync, shared
 *     memory with __syncthreads). With those scopes every lane of the warp, or every thread
 *     of the block, makes the call. FI_XPU_DEVICE needs a grid-wide barrier and answers
 *     -FI_EOPNOTSUPP there.
 *   - C11 or C++ on a CPU thread (the CPU XPU, FI_HMEM_SYSTEM): GCC's __atomic builtins. A
 *     thread is a group of one: it posts whatever the scope.
 *
 * The calls take upstream's arguments. desc, dest_addr and src_addr point at the raw values
 * fi_mr_get_xpu_desc and fi_av_get_xpu_addr wrote (8 bytes each, in memory the XPU reads),
 * as fi_xpu(3) describes; a null desc is no descriptor (0), a null src_addr receives from
 * anyone. Return values are libfabric's: 0 or a count, or a negative FI_E* number (the
 * XF_XPU_E* values here equal them): -FI_EAGAIN the ring is full or nothing is there (call
 * again), -FI_EAVAIL an error entry is next, -FI_ESHUTDOWN the endpoint closed,
 * -FI_ETIMEDOUT, -FI_EINVAL for a bad scope or flags, -FI_ENOSYS for a handle xfabric did not
 * export (upstream's answer for a provider it does not know). Nothing blocks but
 * fi_xpu_cntr_wait, which returns int where upstream's returns void (0, -FI_EAVAIL when the
 * error count moved, -FI_ETIMEDOUT).
 *
 * Not here: fi_xpu_wr_* (work requests), fi_xpu_recv_flush / trecv_flush and
 * fi_xpu_cq_sread / sreadfrom answer -FI_ENOSYS.
 *
 * The producer protocol is core/src/xpu/ring.rs's: read head, reserve room (a fetch-and-add
 * of 1 on claimed; its old value - head >= slots: give it back, -FI_EAGAIN), claim a position
 * (fetch-and-add on tail), look at state again across a full fence (closed: the slot is
 * published as XF_XPU_OP_WITHDRAWN and the call answers -FI_ESHUTDOWN), write every word of
 * the slot but seq (check included), then store seq = position + 1 with release. The device
 * read-modify-writes only words the host never writes (claimed, tail): over PCIe a GPU's
 * atomics on host memory are not atomic against the host's.
 */
#ifndef XFABRIC_FI_XPU_DEVICE_H
#define XFABRIC_FI_XPU_DEVICE_H

#include "fi_xpu_abi.h"

#if !defined(__CUDACC_RTC__)
#include <stddef.h>
#endif
#if !defined(__CUDACC__)
#include <sched.h>
#include <time.h>
#endif

/* ---- the target layer: the only part that differs between CUDA and a CPU thread ---- */

#if defined(__CUDACC__)
#define XF_XPU_FN static __device__ __forceinline__

XF_XPU_FN xf_u64 xf_xpu_ld_acq(const xf_u64 *p)
{
	xf_u64 v = *(const volatile xf_u64 *)p;
	__threadfence_system();
	return v;
}
XF_XPU_FN xf_u32 xf_xpu_ld_acq32(const xf_u32 *p)
{
	xf_u32 v = *(const volatile xf_u32 *)p;
	__threadfence_system();
	return v;
}
XF_XPU_FN xf_u64 xf_xpu_ld(const xf_u64 *p)
{
	return *(const volatile xf_u64 *)p;
}
XF_XPU_FN void xf_xpu_st(xf_u64 *p, xf_u64 v)
{
	*(volatile xf_u64 *)p = v;
}
XF_XPU_FN void xf_xpu_st_rel(xf_u64 *p, xf_u64 v)
{
	/* Everything this thread wrote is visible to the host before the publishing word. */
	__threadfence_system();
	*(volatile xf_u64 *)p = v;
}
XF_XPU_FN xf_u64 xf_xpu_fadd(xf_u64 *p, xf_u64 v)
{
	return (xf_u64)atomicAdd_system((unsigned long long *)p, (unsigned long long)v);
}
XF_XPU_FN void xf_xpu_fence(void)
{
	/* Over PCIe a read does not pass the device's earlier posted writes either. */
	__threadfence_system();
}
/* A GPU's stores wake no one: the watcher finds them when it looks. */
XF_XPU_FN void xf_xpu_announce(void)
{
}
XF_XPU_FN int xf_xpu_cas(xf_u64 *p, xf_u64 expect, xf_u64 want)
{
	__threadfence_system();
	unsigned long long old = atomicCAS_system((unsigned long long *)p,
						  (unsigned long long)expect,
						  (unsigned long long)want);
	__threadfence_system();
	return old == (unsigned long long)expect;
}
XF_XPU_FN xf_u64 xf_xpu_now_ns(void)
{
	xf_u64 t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}
XF_XPU_FN void xf_xpu_relax(unsigned spins)
{
	(void)spins;
#if __CUDA_ARCH__ >= 700
	__nanosleep(64);
#endif
}

/* Who posts for a scope, and how the others learn its answer. */
struct xf_xpu_team {
	unsigned mask;
	int leader;
};
XF_XPU_FN unsigned xf_xpu_linear_tid(void)
{
	return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
/* 1 if this thread makes the call for its scope (FI_XPU_DEVICE is refused before). */
XF_XPU_FN int xf_xpu_team_begin(int scope, struct xf_xpu_team *t)
{
	t->mask = 0;
	t->leader = 0;
	if (scope == FI_XPU_SUBGROUP) {
		/* Every lane of the warp calls (as every thread of a block calls for
		 * FI_XPU_WORK_GROUP): the lanes are the warp's by the block's shape, not by
		 * __activemask(), which names only the lanes that happen to run together at that
		 * moment; a warp split by an earlier branch would elect a leader in each part and
		 * post once per part. __syncwarp brings the lanes back together first. */
		unsigned n = blockDim.x * blockDim.y * blockDim.z;
		unsigned first = xf_xpu_linear_tid() & ~31u;
		unsigned lanes = n - first < 32u ? n - first : 32u;
		t->mask = lanes == 32u ? 0xffffffffu : (1u << lanes) - 1u;
		t->leader = 0;
		__syncwarp(t->mask);
		return (int)(xf_xpu_linear_tid() & 31u) == t->leader;
	}
	if (scope == FI_XPU_WORK_GROUP) {
		__syncthreads();
		return xf_xpu_linear_tid() == 0;
	}
	return 1;
}
XF_XPU_FN xf_i64 xf_xpu_team_end(int scope, const struct xf_xpu_team *t, xf_i64 r)
{
	if (scope == FI_XPU_SUBGROUP)
		return (xf_i64)__shfl_sync(t->mask, (long long)r, t->leader);
	if (scope == FI_XPU_WORK_GROUP) {
		__shared__ long long xf_xpu_result;
		if (xf_xpu_linear_tid() == 0)
			xf_xpu_result = (long long)r;
		__syncthreads();
		r = (xf_i64)xf_xpu_result;
		/* Nobody overwrites the answer before every thread has read it. */
		__syncthreads();
	}
	return r;
}
XF_XPU_FN int xf_xpu_scope_ok(int scope)
{
	return scope >= FI_XPU_WORK_ITEM && scope <= FI_XPU_WORK_GROUP;
}
#define XF_XPU_SCOPE_ERR(scope) \
	((scope) == FI_XPU_DEVICE ? -XF_XPU_EOPNOTSUPP : -XF_XPU_EINVAL)

#else /* a CPU thread */
#define XF_XPU_FN static inline

XF_XPU_FN xf_u64 xf_xpu_ld_acq(const xf_u64 *p)
{
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
XF_XPU_FN xf_u32 xf_xpu_ld_acq32(const xf_u32 *p)
{
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
XF_XPU_FN xf_u64 xf_xpu_ld(const xf_u64 *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}
XF_XPU_FN void xf_xpu_st(xf_u64 *p, xf_u64 v)
{
	__atomic_store_n(p, v, __ATOMIC_RELAXED);
}
XF_XPU_FN void xf_xpu_st_rel(xf_u64 *p, xf_u64 v)
{
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
}
XF_XPU_FN xf_u64 xf_xpu_fadd(xf_u64 *p, xf_u64 v)
{
	return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
XF_XPU_FN void xf_xpu_fence(void)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
}
/* xfabric's libfabric.so: a CPU thread announces what it posted, starting what it can itself
 * and waking a watcher asleep (the Rust device calls' notify_xpu_ring). Weak, so that a
 * program not linked against the library still builds: its posts are then found when the
 * watcher looks, as a GPU's are. */
#if defined(__cplusplus)
extern "C" void xf_xpu_notify(void) __attribute__((weak));
#else
extern void xf_xpu_notify(void) __attribute__((weak));
#endif
XF_XPU_FN void xf_xpu_announce(void)
{
	if (xf_xpu_notify)
		xf_xpu_notify();
}
XF_XPU_FN int xf_xpu_cas(xf_u64 *p, xf_u64 expect, xf_u64 want)
{
	return __atomic_compare_exchange_n(p, &expect, want, 0, __ATOMIC_ACQ_REL,
					   __ATOMIC_ACQUIRE);
}
XF_XPU_FN xf_u64 xf_xpu_now_ns(void)
{
	struct timespec ts;
#if defined(CLOCK_MONOTONIC)
	clock_gettime(CLOCK_MONOTONIC, &ts);
#else
	timespec_get(&ts, TIME_UTC);
#endif
	return (xf_u64)ts.tv_sec * 1000000000u + (xf_u64)ts.tv_nsec;
}
XF_XPU_FN void xf_xpu_relax(unsigned spins)
{
	/* A CPU XPU shares cores with the watcher that serves it: give it the core now and then. */
	if (spins % 64 == 63)
		sched_yield();
}

struct xf_xpu_team {
	int unused;
};
XF_XPU_FN int xf_xpu_team_begin(int scope, struct xf_xpu_team *t)
{
	(void)scope;
	t->unused = 0;
	return 1;
}
XF_XPU_FN xf_i64 xf_xpu_team_end(int scope, const struct xf_xpu_team *t, xf_i64 r)
{
	(void)scope;
	(void)t;
	return r;
}
XF_XPU_FN int xf_xpu_scope_ok(int scope)
{
	return scope >= FI_XPU_WORK_ITEM && scope <= FI_XPU_DEVICE;
}
#define XF_XPU_SCOPE_ERR(scope) (-XF_XPU_EINVAL)
#endif

#ifndef FI_XPU_FUNC
#define FI_XPU_FUNC XF_XPU_FN
#endif

/* ---- the protocol, written once ---- */

XF_XPU_FN xf_u64 xf_xpu_addr(const void *p)
{
	return (xf_u64)(size_t)p;
}

/* Copies `n` bytes without assuming the types of either side (no aliasing through casts):
 * memcpy on a CPU, bytes on a GPU (NVRTC declares no memcpy). */
XF_XPU_FN void xf_xpu_copy(void *dst, const void *src, unsigned n)
{
#if defined(__CUDACC__)
	for (unsigned k = 0; k < n; k++)
		((char *)dst)[k] = ((const char *)src)[k];
#else
	__builtin_memcpy(dst, src, n);
#endif
}
#define XF_XPU_COPY8(dst, src) xf_xpu_copy((dst), (src), 8)

/* The 8-byte raw value fi_mr_get_xpu_desc / fi_av_get_xpu_addr wrote at `p`, or `none`. */
XF_XPU_FN xf_u64 xf_xpu_key(const void *p, xf_u64 none)
{
	xf_u64 v = none;
	if (p)
		XF_XPU_COPY8(&v, p);
	return v;
}

/* The shared block of an xfabric handle of class `fclass`, or null. */
XF_XPU_FN void *xf_xpu_block(const struct fid_xpu *f, xf_u32 fclass)
{
	if (!f || f->prov_id != FI_XPU_PROV_XFABRIC || f->fclass != fclass)
		return 0;
	return (void *)(size_t)f->prov_ctx;
}

/* 1 when the 64-bit word at `w` holds `magic` then XF_XPU_ABI_VERSION (the first two words
 * of a ring's or CQ ring's header, the mirror's third and fourth): a shared block whose layout
 * this header describes. A block from a library built with other headers is refused
 * (-FI_ENOSYS) before any of its other words is followed. Read by the scope's leader only,
 * one load beside the ones its call makes anyway. */
XF_XPU_FN int xf_xpu_layout_ok(const void *w, xf_u32 magic)
{
	return xf_xpu_ld((const xf_u64 *)w) == (((xf_u64)XF_XPU_ABI_VERSION << 32) | magic);
}

/* Word `i` of `d` in a slot (little-endian, as x86-64, aarch64 and every GPU), `check` the
 * position's. */
XF_XPU_FN xf_u64 xf_xpu_desc_word(const struct xf_xpu_desc *d, int i, xf_u32 check)
{
	switch (i) {
	case 0:
		return d->seq;
	case 1:
		return (xf_u64)d->opcode | ((xf_u64)(xf_u32)d->op << 32);
	case 2:
		return (xf_u64)(xf_u32)d->datatype | ((xf_u64)check << 32);
	case 3:
		return d->flags;
	case 4:
		return d->len;
	case 5:
		return d->buf;
	case 6:
		return d->desc;
	case 7:
		return d->peer;
	case 8:
		return d->context;
	case 9:
		return d->data;
	case 10:
		return d->tag;
	case 11:
		return d->ignore;
	case 12:
		return d->raddr;
	case 13:
		return d->rkey;
	case 14:
		return d->compare;
	case 15:
		return d->compare_desc;
	case 16:
		return d->result;
	case 17:
		return d->result_desc;
	default:
		return i >= 18 && i < XF_XPU_DESC_WORDS ? d->reserved[i - 18] : 0;
	}
}

XF_XPU_FN struct xf_xpu_desc xf_xpu_desc_zero(void)
{
#if defined(__cplusplus)
	struct xf_xpu_desc d = {};
#else
	struct xf_xpu_desc d = { 0 };
#endif
	return d;
}

/* Posts `d` on ring `r`: one thread. 0, -FI_EAGAIN (full), -FI_ESHUTDOWN (closed),
 * -FI_ENOSYS (not a ring of this layout). */
XF_XPU_FN int xf_xpu_ring_post(struct xf_xpu_ring *r, const struct xf_xpu_desc *d)
{
	if (!xf_xpu_layout_ok(&r->magic, XF_XPU_RING_MAGIC))
		return -XF_XPU_ENOSYS;
	if (xf_xpu_ld_acq32(&r->state) != XF_XPU_RING_OPEN)
		return -XF_XPU_ESHUTDOWN;
	/* The host frees slots by storing head; a head read early only underestimates room. */
	xf_u64 head = xf_xpu_ld_acq(&r->head);
	if (xf_xpu_fadd(&r->claimed, 1) - head > xf_xpu_ld(&r->mask)) {
		xf_xpu_fadd(&r->claimed, (xf_u64)-1);
		return -XF_XPU_EAGAIN;
	}
	xf_u64 pos = xf_xpu_fadd(&r->tail, 1);
	/* The host's close stores state, then reads tail: either its read counts this position
	 * (and reports what is published there) or this look finds the ring closed. Found closed,
	 * the position is published withdrawn, so that a close that counted it does not wait for
	 * it, and the call answers -FI_ESHUTDOWN. */
	xf_xpu_fence();
	int closed = xf_xpu_ld_acq32(&r->state) != XF_XPU_RING_OPEN;
	struct xf_xpu_desc withdrawn;
	if (closed) {
		withdrawn = xf_xpu_desc_zero();
		withdrawn.opcode = XF_XPU_OP_WITHDRAWN;
		d = &withdrawn;
	}
	xf_u64 *slot = (xf_u64 *)(size_t)(r->slots + (pos & r->mask) * sizeof(struct xf_xpu_desc));
	for (int i = 1; i < XF_XPU_DESC_WORDS; i++)
		xf_xpu_st(&slot[i], xf_xpu_desc_word(d, i, (xf_u32)(pos + 1)));
	xf_xpu_st_rel(&slot[0], pos + 1);
	return closed ? -XF_XPU_ESHUTDOWN : 0;
}

/* Posts `d` on the ring of handle `f` (an endpoint's or a counter's) for `scope`. */
XF_XPU_FN int xf_xpu_post(struct xf_xpu_ring *r, const struct xf_xpu_desc *d, int scope)
{
	if (!r)
		return -XF_XPU_ENOSYS;
	if (!xf_xpu_scope_ok(scope))
		return XF_XPU_SCOPE_ERR(scope);
	struct xf_xpu_team t;
	xf_i64 rc = 0;
	if (xf_xpu_team_begin(scope, &t))
		rc = xf_xpu_ring_post(r, d);
	return (int)xf_xpu_team_end(scope, &t, rc);
}

/* Posts a descriptor exactly as given (seq and check are the ring's): what any XPU can write,
 * for code that builds descriptors itself. */
XF_XPU_FN int xf_xpu_post_desc(struct fid_xpu_ep *ep, const struct xf_xpu_desc *d, int scope)
{
	if (!d)
		return -XF_XPU_EINVAL;
	return xf_xpu_post((struct xf_xpu_ring *)xf_xpu_block(ep ? &ep->fid : 0, XF_XPU_CLASS_EP),
			   d, scope);
}

/* ---- messages, tagged messages, RMA, atomics ---- */

FI_XPU_FUNC int fi_xpu_send(struct fid_xpu_ep *ep, const void *buf, size_t len, void *desc,
			    xf_u64 data, void *dest_addr, void *context, xf_u64 flags, int scope)
{
	struct xf_xpu_desc d = xf_xpu_desc_zero();
	d.opcode = XF_XPU_OP_SEND;
	d.flags = flags;
	d.len = (xf_u64)len;
	d.buf = xf_xpu_addr(buf);
	d.desc = xf_xpu_key(desc, 0);
	d.peer = xf_xpu_key(dest_addr, XF_XPU_ADDR_UNSPEC);
	d.context = xf_xpu_addr(context);
	d.data = data;
	return xf_xpu_post_desc(ep, &d, scope);
}

FI_XPU_FUNC int fi_xpu_tsend(struct fid_xpu_ep *ep, const void *buf, size_t len, void *desc,
			     xf_u64 data, void *dest_addr, xf_u64 tag, void *context,
			     xf_u64 flags, int scope)
{
	struct xf_xpu_desc d = xf_xpu_desc_zero();
	d.opcode = XF_XPU_OP_TSEND;
	d.flags = flags;
	d.len = (xf_u64)len;
	d.buf = xf_xpu_addr(buf);
	d.desc = xf_xpu_key(desc, 0);
	d.peer = xf_xpu_key(dest_addr, XF_XPU_ADDR_UNSPEC);
	d.context = xf_xpu_addr(context);
	d.data = data;
	d.tag = tag;
	return xf_xpu_post_desc(ep, &d, scope);
}

FI_XPU_FUNC int fi_xpu_recv(struct fid_xpu_ep *ep, void *buf, size_t len, void *desc,
			    void *src_addr, void *context, xf_u64 flags, int scope)
{
	struct xf_xpu_desc d = xf_xpu_desc_zero();
	d.opcode = XF_XPU_OP_RECV;
	d.flags = flags;
	d.len = (xf_u64)len;
	d.buf = xf_xpu_addr(buf);
	d.desc = xf_xpu_key(desc, 0);
	d.peer = xf_xpu_key(src_addr, XF_XPU_ADDR_UNSPEC);
	d.context = xf_xpu_addr(context);
	return xf_xpu_post_desc(ep, &d, scope);
}

FI_XPU_FUNC int fi_xpu_trecv(struct fid_xpu_ep *ep, void *buf, size_t len, void *desc,
			     void *src_addr, xf_u64 tag, xf_u64 ignore, void *context,
			     xf_u64 flags, int scope)
{
	struct xf_xpu_desc d = xf_xpu_desc_zero();
	d.opcode = XF_XPU_OP_TRECV;
	d.flags = flags;
	d.len = (xf_u64)len;
	d.buf = xf_xpu_addr(buf);
	d.desc = xf_xpu_key(desc, 0);
	d.peer = xf_xpu_key(src_addr, XF_XPU_ADDR_UNSPEC);
	d.context = xf_xpu_addr(context);
	d.tag = tag;
	d.ignore = ignore;
	return xf_xpu_post_desc(ep, &d, scope);
}

/* With FI_REMOTE_CQ_DATA in flags the target's CQ gets `data`. */
FI_XPU_FUNC int fi_xpu_write(struct fid_xpu_ep *ep, const void *buf, size_t len, void *desc,
			     xf_u64 data, void *dest_addr, xf_u64 addr, xf_u64 key,
			     void *context, xf_u64 flags, int scope)
{
	struct xf_xpu_desc d = xf_xpu_desc_zero();
	d.opcode = XF_XPU_OP_WRITE;
	d.flags = flags;
	d.len = (xf_u64)len;
	d.buf = xf_xpu_addr(buf);
	d.desc = xf_xpu_key(desc, 0);
	d.peer = xf_xpu_key(dest_addr, XF_XPU_ADDR_UNSPEC);
	d.context = xf_xpu_addr(context);
	d.data = data;
	d.raddr = addr;
	d.rkey = key;
	return xf_xpu_post_desc(ep, &d, scope);
}

FI_XPU_FUNC int fi_xpu_read(struct fid_xpu_ep *ep, void *buf, size_t len, void *desc,
			    void *src_addr, xf_u64 addr, xf_u64 key, void *context,
			    xf_u64 flags, int scope)
{
	struct xf_xpu_desc d = xf_xpu_desc_zero();
	d.opcode = XF_XPU_OP_READ;
	d.flags = flags;
	d.len = (xf_u64)len;
	d.buf = xf_xpu_addr(buf);
	d.desc = xf_xpu_key(desc, 0);
	d.peer = xf_xpu_key(src_addr, XF_XPU_ADDR_UNSPEC);
	d.context = xf_xpu_addr(context);
	d.raddr = addr;
	d.rkey = key;
	return xf_xpu_post_desc(ep, &d, scope);
}

XF_XPU_FN struct xf_xpu_desc xf_xpu_atomic_desc(xf_u32 opcode, const void *buf, size_t count,
						 void *desc, void *dest_addr, xf_u64 addr,
						 xf_u64 key, int datatype, int op, void *context,
						 xf_u64 flags)
{
	struct xf_xpu_desc d = xf_xpu_desc_zero();
	d.opcode = opcode;
	d.op = op;
	d.datatype = datatype;
	d.flags = flags;
	d.len = (xf_u64)count;
	d.buf = xf_xpu_addr(buf);
	d.desc = xf_xpu_key(desc, 0);
	d.peer = xf_xpu_key(dest_addr, XF_XPU_ADDR_UNSPEC);
	d.context = xf_xpu_addr(context);
	d.raddr = addr;
	d.rkey = key;
	return d;
}

/* `count` elements of `datatype` (enum fi_datatype); `op` an enum fi_op. */
FI_XPU_FUNC int fi_xpu_atomic(struct fid_xpu_ep *ep, const void *buf, size_t count, void *desc,
			      void *dest_addr, xf_u64 addr, xf_u64 key, int datatype, int op,
			      void *context, xf_u64 flags, int scope)
{
	struct xf_xpu_desc d = xf_xpu_atomic_desc(XF_XPU_OP_ATOMIC, buf, count, desc, dest_addr,
						  addr, key, datatype, op, context, flags);
	return xf_xpu_post_desc(ep, &d, scope);
}

FI_XPU_FUNC int fi_xpu_fetch_atomic(struct fid_xpu_ep *ep, const void *buf, size_t count,
				    void *desc, void *result, void *result_desc,
				    void *dest_addr, xf_u64 addr, xf_u64 key, int datatype,
				    int op, void *context, xf_u64 flags, int scope)
{
	struct xf_xpu_desc d = xf_xpu_atomic_desc(XF_XPU_OP_FETCH_ATOMIC, buf, count, desc,
						  dest_addr, addr, key, datatype, op, context,
						  flags);
	d.result = xf_xpu_addr(result);
	d.result_desc = xf_xpu_key(result_desc, 0);
	return xf_xpu_post_desc(ep, &d, scope);
}

FI_XPU_FUNC int fi_xpu_compare_atomic(struct fid_xpu_ep *ep, const void *buf, size_t count,
				      void *desc, const void *compare, void *compare_desc,
				      void *result, void *result_desc, void *dest_addr,
				      xf_u64 addr, xf_u64 key, int datatype, int op,
				      void *context, xf_u64 flags, int scope)
{
	struct xf_xpu_desc d = xf_xpu_atomic_desc(XF_XPU_OP_COMPARE_ATOMIC, buf, count, desc,
						  dest_addr, addr, key, datatype, op, context,
						  flags);
	d.compare = xf_xpu_addr(compare);
	d.compare_desc = xf_xpu_key(compare_desc, 0);
	d.result = xf_xpu_addr(result);
	d.result_desc = xf_xpu_key(result_desc, 0);
	return xf_xpu_post_desc(ep, &d, scope);
}

/* Every published descriptor is visible already (each publish is a release store); the
 * watcher finds them by looking. On a CPU thread this starts what it can at once and wakes a
 * watcher asleep (xf_xpu_notify). `flags` must be 0. */
FI_XPU_FUNC int fi_xpu_tx_flush(struct fid_xpu_ep *ep, xf_u64 flags, int scope)
{
	if (!xf_xpu_block(ep ? &ep->fid : 0, XF_XPU_CLASS_EP))
		return -XF_XPU_ENOSYS;
	if (flags != 0 || !xf_xpu_scope_ok(scope))
		return flags != 0 ? -XF_XPU_EINVAL : XF_XPU_SCOPE_ERR(scope);
	xf_xpu_announce();
	return 0;
}

FI_XPU_FUNC int fi_xpu_recv_flush(struct fid_xpu_ep *ep, xf_u64 flags, int scope)
{
	(void)ep;
	(void)flags;
	(void)scope;
	return -XF_XPU_ENOSYS;
}

FI_XPU_FUNC int fi_xpu_trecv_flush(struct fid_xpu_ep *ep, xf_u64 flags, int scope)
{
	(void)ep;
	(void)flags;
	(void)scope;
	return -XF_XPU_ENOSYS;
}

/* ---- counters ---- */

XF_XPU_FN struct xf_xpu_cntr_mirror *xf_xpu_mirror(struct fid_xpu_cntr *cntr)
{
	return (struct xf_xpu_cntr_mirror *)xf_xpu_block(cntr ? &cntr->fid : 0,
							 XF_XPU_CLASS_CNTR);
}

/* The value (`err` 0) or the error value as last mirrored, read by the scope's leader; 0 for
 * a handle that is not xfabric's (or whose block has another layout) or a bad scope. */
XF_XPU_FN xf_u64 xf_xpu_cntr_value(struct fid_xpu_cntr *cntr, int err, int scope)
{
	struct xf_xpu_cntr_mirror *m = xf_xpu_mirror(cntr);
	if (!m || !xf_xpu_scope_ok(scope))
		return 0;
	struct xf_xpu_team t;
	xf_i64 v = 0;
	if (xf_xpu_team_begin(scope, &t))
		v = xf_xpu_layout_ok(&m->magic, XF_XPU_CNTR_MAGIC) ?
			    (xf_i64)xf_xpu_ld_acq(err ? &m->err : &m->value) :
			    0;
	return (xf_u64)xf_xpu_team_end(scope, &t, v);
}

FI_XPU_FUNC xf_u64 fi_xpu_cntr_read(struct fid_xpu_cntr *cntr, int scope)
{
	return xf_xpu_cntr_value(cntr, 0, scope);
}

FI_XPU_FUNC xf_u64 fi_xpu_cntr_readerr(struct fid_xpu_cntr *cntr, int scope)
{
	return xf_xpu_cntr_value(cntr, 1, scope);
}

/* The leader's wait on mirror `m`: 0 when the value reaches `threshold`, -FI_EAVAIL when the
 * error value moves, -FI_ESHUTDOWN when the counter closed (its ring's state: its values change
 * no more), -FI_ETIMEDOUT after `timeout` ms (negative: no limit), -FI_ENOSYS for a block of
 * another layout. */
XF_XPU_FN xf_i64 xf_xpu_cntr_spin(struct xf_xpu_cntr_mirror *m, xf_u64 threshold, int timeout)
{
	if (!xf_xpu_layout_ok(&m->magic, XF_XPU_CNTR_MAGIC))
		return -XF_XPU_ENOSYS;
	struct xf_xpu_ring *r = (struct xf_xpu_ring *)(size_t)m->ring;
	if (!xf_xpu_layout_ok(&r->magic, XF_XPU_RING_MAGIC))
		return -XF_XPU_ENOSYS;
	xf_u64 err0 = xf_xpu_ld_acq(&m->err);
	xf_u64 start = timeout >= 0 ? xf_xpu_now_ns() : 0;
	xf_u64 limit = timeout >= 0 ? (xf_u64)timeout * 1000000u : 0;
	for (unsigned spins = 0;; spins++) {
		if (xf_xpu_ld_acq(&m->value) >= threshold)
			return 0;
		if (xf_xpu_ld_acq(&m->err) != err0)
			return -XF_XPU_EAVAIL;
		if (xf_xpu_ld_acq32(&r->state) != XF_XPU_RING_OPEN) {
			/* The last change may have come just before the close. */
			if (xf_xpu_ld_acq(&m->value) >= threshold)
				return 0;
			if (xf_xpu_ld_acq(&m->err) != err0)
				return -XF_XPU_EAVAIL;
			return -XF_XPU_ESHUTDOWN;
		}
		if (timeout >= 0) {
			xf_u64 now = xf_xpu_now_ns();
			/* A clock that steps back (the wall clock, where the monotonic one is not
			 * declared) restarts the wait rather than ending it. */
			if (now < start)
				start = now;
			if (now - start >= limit)
				return -XF_XPU_ETIMEDOUT;
		}
		xf_xpu_relax(spins);
	}
}

/* Spins on the mirror until the value reaches `threshold` (0), the error value moves
 * (-FI_EAVAIL), the counter closes (-FI_ESHUTDOWN) or `timeout` ms pass (-FI_ETIMEDOUT;
 * negative: no limit). */
FI_XPU_FUNC int fi_xpu_cntr_wait(struct fid_xpu_cntr *cntr, xf_u64 threshold, int timeout,
				 int scope)
{
	struct xf_xpu_cntr_mirror *m = xf_xpu_mirror(cntr);
	if (!m)
		return -XF_XPU_ENOSYS;
	if (!xf_xpu_scope_ok(scope))
		return XF_XPU_SCOPE_ERR(scope);
	struct xf_xpu_team t;
	xf_i64 rc = 0;
	if (xf_xpu_team_begin(scope, &t))
		rc = xf_xpu_cntr_spin(m, threshold, timeout);
	return (int)xf_xpu_team_end(scope, &t, rc);
}

XF_XPU_FN int xf_xpu_cntr_post(struct fid_xpu_cntr *cntr, xf_u32 opcode, xf_u64 value,
			       int scope)
{
	struct xf_xpu_cntr_mirror *m = xf_xpu_mirror(cntr);
	/* Every thread reads the mirror's ring address, so every thread checks its layout. */
	if (!m || !xf_xpu_layout_ok(&m->magic, XF_XPU_CNTR_MAGIC))
		return -XF_XPU_ENOSYS;
	struct xf_xpu_desc d = xf_xpu_desc_zero();
	d.opcode = opcode;
	d.data = value;
	int rc = xf_xpu_post((struct xf_xpu_ring *)(size_t)m->ring, &d, scope);
	/* As tx_flush: a CPU thread's add is applied at once, not when the watcher next looks. */
	if (rc == 0)
		xf_xpu_announce();
	return rc;
}

/* Posted on the counter's own ring; the host applies them in order. */
FI_XPU_FUNC int fi_xpu_cntr_add(struct fid_xpu_cntr *cntr, xf_u64 value, int scope)
{
	return xf_xpu_cntr_post(cntr, XF_XPU_OP_CNTR_ADD, value, scope);
}

FI_XPU_FUNC int fi_xpu_cntr_set(struct fid_xpu_cntr *cntr, xf_u64 value, int scope)
{
	return xf_xpu_cntr_post(cntr, XF_XPU_OP_CNTR_SET, value, scope);
}

FI_XPU_FUNC int fi_xpu_cntr_adderr(struct fid_xpu_cntr *cntr, xf_u64 value, int scope)
{
	return xf_xpu_cntr_post(cntr, XF_XPU_OP_CNTR_ADDERR, value, scope);
}

FI_XPU_FUNC int fi_xpu_cntr_seterr(struct fid_xpu_cntr *cntr, xf_u64 value, int scope)
{
	return xf_xpu_cntr_post(cntr, XF_XPU_OP_CNTR_SETERR, value, scope);
}

/* ---- completion queues ---- */

/* Words of one entry of `format` (context, msg, data and tagged entries are word prefixes of
 * the tagged one); 0 for a format an XPU cannot read. */
XF_XPU_FN unsigned xf_xpu_cq_words(xf_u32 format)
{
	switch (format) {
	case XF_XPU_CQ_FORMAT_UNSPEC:
	case XF_XPU_CQ_FORMAT_CONTEXT:
		return 1;
	case XF_XPU_CQ_FORMAT_MSG:
		return 3;
	case XF_XPU_CQ_FORMAT_DATA:
		return 5;
	case XF_XPU_CQ_FORMAT_TAGGED:
		return 6;
	default:
		return 0;
	}
}

/* Copies published entries from the head (success entries only, or exactly one error
 * entry), then claims them by moving the head with a compare-and-swap, copying again when
 * another thread moved it first. One thread. */
XF_XPU_FN xf_i64 xf_xpu_cq_take(struct xf_xpu_cq_ring *h, void *buf, size_t max, void *src,
				int want_err)
{
	if (!xf_xpu_layout_ok(&h->magic, XF_XPU_CQ_RING_MAGIC))
		return -XF_XPU_ENOSYS;
	unsigned words = want_err ? 0 : xf_xpu_cq_words(h->format);
	if (max == 0 || !buf || (!want_err && words == 0))
		return -XF_XPU_EINVAL;
	for (;;) {
		/* Read before the slots: set, it was written after every entry from before the
		 * overrun, so finding no entry then means none of those is left. */
		xf_u32 overrun = xf_xpu_ld_acq32(&h->overrun);
		xf_u64 head = xf_xpu_ld_acq(&h->head);
		size_t n = 0;
		while (n < max) {
			xf_u64 pos = head + n;
			xf_u64 *slot = (xf_u64 *)(size_t)(h->slots + (pos & h->mask) *
								   sizeof(struct xf_xpu_cq_entry));
			if (xf_xpu_ld_acq(&slot[0]) != pos + 1)
				break;
			xf_u64 w[XF_XPU_CQ_WORDS];
			for (int i = 0; i < XF_XPU_CQ_WORDS; i++)
				w[i] = xf_xpu_ld(&slot[i]);
			/* struct xf_xpu_cq_entry's words: kind and err share word 1, prov_errno
			 * is the low half of word 10. */
			int is_err = (xf_u32)w[1] == XF_XPU_CQ_KIND_ERR;
			if (is_err != want_err) {
				if (n == 0 && !want_err)
					return -XF_XPU_EAVAIL;
				break;
			}
			if (want_err) {
				struct xf_xpu_cq_err_entry o;
				o.op_context = w[2];
				o.flags = w[3];
				o.len = w[4];
				o.buf = w[5];
				o.data = w[6];
				o.tag = w[7];
				o.olen = w[9];
				o.err = (xf_i32)(xf_u32)(w[1] >> 32);
				o.prov_errno = (xf_i32)(xf_u32)w[10];
				o.err_data = 0;
				o.err_data_size = 0;
				xf_xpu_copy(buf, &o, (unsigned)sizeof o);
			} else {
				char *o = (char *)buf + n * words * 8;
				for (unsigned i = 0; i < words; i++)
					XF_XPU_COPY8(o + i * 8, &w[2 + i]);
				if (src)
					XF_XPU_COPY8((char *)src + n * 8, &w[8]);
			}
			n++;
			if (want_err)
				break;
		}
		if (n == 0) {
			if (!overrun || want_err)
				return -XF_XPU_EAGAIN;
			/* Only if no other reader moved the head meanwhile: a slot found not yet
			 * written may then be one of a later lap, with entries before it unread. */
			if (xf_xpu_ld_acq(&h->head) != head)
				continue;
			return -XF_XPU_EOVERRUN;
		}
		if (xf_xpu_cas(&h->head, head, head + n))
			return (xf_i64)n;
	}
}

XF_XPU_FN xf_i64 xf_xpu_cq_call(struct fid_xpu_cq *cq, void *buf, size_t count, void *src,
				int want_err, int scope)
{
	struct xf_xpu_cq_ring *h =
		(struct xf_xpu_cq_ring *)xf_xpu_block(cq ? &cq->fid : 0, XF_XPU_CLASS_CQ);
	if (!h)
		return -XF_XPU_ENOSYS;
	if (!xf_xpu_scope_ok(scope))
		return XF_XPU_SCOPE_ERR(scope);
	struct xf_xpu_team t;
	xf_i64 rc = 0;
	if (xf_xpu_team_begin(scope, &t))
		rc = xf_xpu_cq_take(h, buf, count, src, want_err);
	return xf_xpu_team_end(scope, &t, rc);
}

/* Up to `count` success entries in the queue's format; -FI_EAGAIN when none is there,
 * -FI_EAVAIL when an error entry is next (fi_xpu_cq_readerr takes it), -FI_EOVERRUN when none
 * is there and the queue overran (under FI_RM_DISABLED, completions past its size and the
 * ring's were dropped; every entry from before the overrun was read). */
FI_XPU_FUNC xf_i64 fi_xpu_cq_read(struct fid_xpu_cq *cq, void *buf, size_t count, int scope)
{
	return xf_xpu_cq_call(cq, buf, count, 0, 0, scope);
}

/* As fi_xpu_cq_read, with each entry's source (fi_addr_t, FI_ADDR_NOTAVAIL when unknown) in
 * `src_addr`, an array of `count`. */
FI_XPU_FUNC xf_i64 fi_xpu_cq_readfrom(struct fid_xpu_cq *cq, void *buf, size_t count,
				      void *src_addr, int scope)
{
	if (!src_addr)
		return -XF_XPU_EINVAL;
	return xf_xpu_cq_call(cq, buf, count, src_addr, 0, scope);
}

/* The next entry if it is an error (1) into a struct fi_cq_err_entry (err_data 0: error data
 * stays on the host); -FI_EAGAIN otherwise. `flags` must be 0. */
FI_XPU_FUNC xf_i64 fi_xpu_cq_readerr(struct fid_xpu_cq *cq, void *buf, xf_u64 flags, int scope)
{
	if (flags != 0)
		return -XF_XPU_EINVAL;
	return xf_xpu_cq_call(cq, buf, 1, 0, 1, scope);
}

FI_XPU_FUNC xf_i64 fi_xpu_cq_sread(struct fid_xpu_cq *cq, void *buf, size_t count,
				   xf_u64 threshold, int scope)
{
	(void)cq;
	(void)buf;
	(void)count;
	(void)threshold;
	(void)scope;
	return -XF_XPU_ENOSYS;
}

FI_XPU_FUNC xf_i64 fi_xpu_cq_sreadfrom(struct fid_xpu_cq *cq, void *buf, size_t count,
				       void *src_addr, xf_u64 threshold, int scope)
{
	(void)cq;
	(void)buf;
	(void)count;
	(void)src_addr;
	(void)threshold;
	(void)scope;
	return -XF_XPU_ENOSYS;
}

#endif /* XFABRIC_FI_XPU_DEVICE_H */
