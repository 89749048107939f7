/*
 * Kernels that call the device API (xfabric/fi_xpu_device.h) on exported handles: what a GPU
 * application's own kernels do, and what the GPU tests measure. Compiled at run time by NVRTC
 * (xfabric-kernels' GpuXpuApi). Handles arrive as the `prov_ctx` of each (the launcher checks
 * their class and provider on the host); buffers as device addresses of mapped host memory
 * registered with the domain; `desc` and `peer` as the raw values fi_mr_get_xpu_desc and
 * fi_av_get_xpu_addr gave.
 *
 * Message i's length, tag and bytes are computed here and checked by the receiver's host with
 * the same formulas (xfabric_kernels::gpu_xpu::{burst_len, burst_tag, burst_byte}).
 */
#include "xfabric/fi_xpu_device.h"

typedef unsigned long long xf_ull;

/* How long a thread retries a full ring before giving up (ns). */
#define XF_RETRY_NS 10000000000ULL

static __device__ __forceinline__ xf_ull xf_now(void)
{
	xf_ull t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

static __device__ __forceinline__ struct fid_xpu_ep xf_ep(xf_ull ctx)
{
	struct fid_xpu_ep ep;
	ep.fid.fclass = 3; /* FI_CLASS_EP */
	ep.fid.prov_id = FI_XPU_PROV_XFABRIC;
	ep.fid.prov_ctx = ctx;
	return ep;
}

static __device__ __forceinline__ struct fid_xpu_cntr xf_cntr(xf_ull ctx)
{
	struct fid_xpu_cntr c;
	c.fid.fclass = 15; /* FI_CLASS_CNTR */
	c.fid.prov_id = FI_XPU_PROV_XFABRIC;
	c.fid.prov_ctx = ctx;
	return c;
}

static __device__ __forceinline__ unsigned xf_burst_len(xf_ull i, unsigned max_len)
{
	return 8u + (unsigned)((i * 37ULL) % (xf_ull)(max_len - 8u));
}

static __device__ __forceinline__ xf_ull xf_burst_tag(xf_ull i)
{
	return (i * 0x9e3779b9ULL) ^ 0xc0daULL;
}

static __device__ __forceinline__ unsigned char xf_burst_byte(xf_ull i, unsigned k)
{
	return (unsigned char)(i * 131ULL + k * 7ULL + 1ULL);
}

/* Keeps the first error a thread met (0 stays 0 until one comes). */
static __device__ __forceinline__ void xf_note(long long *rc, int e)
{
	if (e != 0)
		atomicCAS((unsigned long long *)rc, 0ULL, (unsigned long long)(long long)e);
}

/*
 * The send path: block b posts messages b * per_block .. (b + 1) * per_block - 1, its threads
 * sharing them; each thread writes its message's bytes into its slot of `buf` (max_len bytes
 * each), then posts a tagged send of the computed length and tag, context i, retrying while
 * the ring is full. rc[b]: 0, or the first error a thread of block b met.
 */
extern "C" __global__ void xf_xpu_send_burst(xf_ull ep_ctx, char *buf, xf_ull desc, xf_ull peer,
					     unsigned per_block, unsigned max_len, long long *rc)
{
	struct fid_xpu_ep ep = xf_ep(ep_ctx);
	for (unsigned j = threadIdx.x; j < per_block; j += blockDim.x) {
		xf_ull i = (xf_ull)blockIdx.x * per_block + j;
		unsigned len = xf_burst_len(i, max_len);
		char *slot = buf + i * max_len;
		for (unsigned k = 0; k < len; k++)
			slot[k] = (char)xf_burst_byte(i, k);
		/* fi_xpu_tsend fences (system scope) before it publishes: the bytes go first. */
		xf_ull until = xf_now() + XF_RETRY_NS;
		int r;
		while ((r = fi_xpu_tsend(&ep, slot, len, &desc, 0, &peer, xf_burst_tag(i),
					 (void *)(size_t)i, 0, FI_XPU_WORK_ITEM)) == -XF_XPU_EAGAIN &&
		       xf_now() < until)
			;
		if (r != 0) {
			/* Stop at the first error: a ring that never drains must not hold the
			 * kernel for every message's retry bound. */
			xf_note(&rc[blockIdx.x], r);
			return;
		}
	}
}

/*
 * Put with signal, two blocks of one thread each, in one launch (both resident):
 * block 0 writes n messages of len bytes from `src` to the peer's region at raddr, each with
 * remote CQ data i and `flags` (FI_REMOTE_CQ_DATA | FI_DELIVERY_COMPLETE, from the host); block 1 is the peer's kernel: it waits on its
 * exported remote-write counter until n writes landed, then checks every byte in its region
 * (`dst`, the same memory the writes target). out[0]: the initiator's first error; out[1]:
 * the wait's answer; out[2]: bytes that differ; out[3], out[4]: the clock (ns) before the
 * first write was posted and when the signal was seen.
 */
extern "C" __global__ void xf_xpu_put_signal(xf_ull ep_ctx, char *src, xf_ull desc, xf_ull peer,
					     xf_ull raddr, xf_ull rkey, unsigned n, unsigned len,
					     xf_ull flags, xf_ull cntr_ctx, const char *dst,
					     long long *out)
{
	if (threadIdx.x != 0)
		return;
	if (blockIdx.x == 0) {
		struct fid_xpu_ep ep = xf_ep(ep_ctx);
		int first = 0;
		for (unsigned i = 0; i < n; i++) {
			char *s = src + (xf_ull)i * len;
			for (unsigned k = 0; k < len; k++)
				s[k] = (char)xf_burst_byte(i, k);
			if (i == 0)
				out[3] = (long long)xf_now();
			xf_ull until = xf_now() + XF_RETRY_NS;
			int r;
			while ((r = fi_xpu_write(&ep, s, len, &desc, i, &peer, raddr + (xf_ull)i * len,
						 rkey, (void *)(size_t)i, flags, FI_XPU_WORK_ITEM)) ==
				       -XF_XPU_EAGAIN &&
			       xf_now() < until)
				;
			if (r != 0) {
				first = r;
				break;
			}
		}
		out[0] = first;
	} else if (blockIdx.x == 1) {
		struct fid_xpu_cntr c = xf_cntr(cntr_ctx);
		int w = fi_xpu_cntr_wait(&c, n, 20000, FI_XPU_WORK_ITEM);
		xf_ull t1 = xf_now();
		long long bad = 0;
		for (unsigned i = 0; i < n && w == 0; i++)
			for (unsigned k = 0; k < len; k++)
				bad += (unsigned char)dst[(xf_ull)i * len + k] != xf_burst_byte(i, k);
		out[1] = w;
		out[2] = bad;
		/* Block 0 wrote out[3] before its first post; the signal came after the last. */
		__threadfence_system();
		out[4] = (long long)t1;
	}
}

/*
 * The rate: one block posts n 8-byte writes (the peer's region at raddr, no remote data) as
 * fast as its threads can, each thread its share, retrying while the ring is full. out[0]:
 * ns from the block's start to its last post; out[1]: full-ring answers; out[2]: first error.
 */
extern "C" __global__ void xf_xpu_rate(xf_ull ep_ctx, char *src, xf_ull desc, xf_ull peer,
				       xf_ull raddr, xf_ull rkey, unsigned n, long long *out)
{
	__shared__ xf_ull t0;
	__shared__ long long first;
	__shared__ unsigned long long again;
	struct fid_xpu_ep ep = xf_ep(ep_ctx);
	if (threadIdx.x == 0) {
		first = 0;
		again = 0;
	}
	__syncthreads();
	if (threadIdx.x == 0)
		t0 = xf_now();
	__syncthreads();
	unsigned long long my_again = 0;
	for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
		xf_ull until = xf_now() + XF_RETRY_NS;
		int r;
		while ((r = fi_xpu_write(&ep, src + 8ULL * (i % 64), 8, &desc, 0, &peer,
					 raddr + 8ULL * (i % 64), rkey, (void *)(size_t)i, 0,
					 FI_XPU_WORK_ITEM)) == -XF_XPU_EAGAIN) {
			my_again++;
			if (xf_now() >= until)
				break;
		}
		if (r != 0) {
			xf_note(&first, r);
			break;
		}
	}
	atomicAdd(&again, my_again);
	__syncthreads();
	if (threadIdx.x == 0) {
		out[0] = (long long)(xf_now() - t0);
		out[1] = (long long)again;
		out[2] = first;
	}
}

/*
 * Latency: ping-pong between two endpoints of one process, two blocks of one thread each in
 * one launch. Block 0 (endpoint A) sends 8 bytes to B and waits on A's exported receive
 * counter for B's answer; block 1 (endpoint B) waits on B's receive counter, then answers.
 * Receives are posted by the host beforehand. rtt[i]: ns of round trip i (block 0's clock);
 * out[0]: A's first error, out[1]: B's first error.
 */
extern "C" __global__ void xf_xpu_pingpong(xf_ull ep_a, xf_ull ep_b, xf_ull rx_a, xf_ull rx_b,
					   char *buf_a, char *buf_b, xf_ull desc_a, xf_ull desc_b,
					   xf_ull peer_b, xf_ull peer_a, unsigned iters,
					   long long *rtt, long long *out)
{
	if (threadIdx.x != 0 || blockIdx.x > 1)
		return;
	int a = blockIdx.x == 0;
	struct fid_xpu_ep ep = xf_ep(a ? ep_a : ep_b);
	struct fid_xpu_cntr rx = xf_cntr(a ? rx_a : rx_b);
	char *buf = a ? buf_a : buf_b;
	xf_ull desc = a ? desc_a : desc_b;
	xf_ull peer = a ? peer_b : peer_a;
	int first = 0;
	for (unsigned i = 0; i < iters && first == 0; i++) {
		xf_ull t0 = xf_now();
		if (!a) {
			int w = fi_xpu_cntr_wait(&rx, i + 1, 10000, FI_XPU_WORK_ITEM);
			if (w != 0) {
				first = w;
				break;
			}
		}
		xf_ull until = xf_now() + XF_RETRY_NS;
		int r;
		while ((r = fi_xpu_tsend(&ep, buf, 8, &desc, 0, &peer, 1, (void *)(size_t)i, 0,
					 FI_XPU_WORK_ITEM)) == -XF_XPU_EAGAIN &&
		       xf_now() < until)
			;
		if (r != 0) {
			first = r;
			break;
		}
		if (a) {
			int w = fi_xpu_cntr_wait(&rx, i + 1, 10000, FI_XPU_WORK_ITEM);
			if (w != 0) {
				first = w;
				break;
			}
			rtt[i] = (long long)(xf_now() - t0);
		}
	}
	out[a ? 0 : 1] = first;
}
