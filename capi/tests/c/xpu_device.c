/* The device API through the C ABI (fi_xpu(3); xfabric/fi_xpu.h and fi_xpu_device.h) over
 * shm, two processes. The parent exports its endpoint (a ring of 2 descriptors, so that it
 * fills), CQ and a write counter; a pthread acting as the CPU XPU posts with the header's
 * inline device calls: hostile descriptors until the ring answers -FI_EAGAIN (each an error
 * completion it reads back), tagged sends whose tags it computes, a send, an RMA write
 * with remote CQ data plus a counter add it waits on, an atomic, all completions read from
 * the XPU. The child is the target: its own XPU thread waits on its exported remote-write
 * counter, then checks the bytes. First, each export call's misuse answers -FI_EINVAL. */
#include "two.h"
#include <poll.h>
#include <pthread.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_trigger.h>
#include <sched.h>
#include <xfabric/fi_xpu.h>
#include <xfabric/fi_xpu_device.h>

#define K 8         /* tagged sends */
#define LEN 16      /* bytes each */
#define WLEN 64     /* the write's bytes */
#define START 100   /* the atomic's word before */
#define ADD 5       /* what the atomic adds */
#define HOSTILE 0x77 /* an opcode nobody defines */

static uint64_t tag_of(int i)
{
	return 0x1000 + (uint64_t)(i * i);
}

static uint8_t byte_of(int msg, int i)
{
	return (uint8_t)(msg * 31 + i * 7 + 1);
}

/* Driving progress (manual progress: the watcher drains when the host reads) until `flag`. */
static int done_flag;
static int drive_flag;

static void drive(struct side *s, struct fid_cntr *c)
{
	struct fi_cq_data_entry e;
	/* count 0 only drives progress: the entries stay for the XPU's ring. */
	fi_cq_read(s->cq, &e, 0);
	if (c)
		fi_cntr_read(c);
}

struct xpu_args {
	struct fid_xpu_ep ep;
	struct fid_xpu_cq cq;
	struct fid_xpu_cntr cntr;
	uint64_t desc;   /* raw, from fi_mr_get_xpu_desc */
	uint64_t peer;   /* raw, from fi_av_get_xpu_addr */
	uint64_t raddr, rkey;
	uint8_t *buf;
	int contexts[K + 4];
};

/* Spins on -FI_EAGAIN: the ring is full until the watcher takes one. */
#define POST(call)                                                                          \
	do {                                                                                \
		int _rc;                                                                    \
		while ((_rc = (call)) == -FI_EAGAIN)                                        \
			sched_yield();                                                      \
		if (_rc != 0)                                                               \
			FAIL("%s: %d", #call, _rc);                                         \
	} while (0)

/* `n` success completions read from the XPU; each must be one of `ctx`'s and carry `flags`. */
static void xpu_completions(struct xpu_args *a, int n, uint64_t flags)
{
	struct fi_cq_data_entry e[4];
	int got = 0;
	while (got < n) {
		int64_t r = fi_xpu_cq_read(&a->cq, e, 4, FI_XPU_WORK_ITEM);
		if (r == -FI_EAGAIN) {
			sched_yield();
			continue;
		}
		if (r == -FI_EAVAIL) {
			struct fi_cq_err_entry err = { 0 };
			fi_xpu_cq_readerr(&a->cq, &err, 0, FI_XPU_WORK_ITEM);
			FAIL("error completion: err %d prov_errno %d", err.err, err.prov_errno);
		}
		REQUIRE(r > 0 && r <= 4);
		for (int i = 0; i < r; i++) {
			REQUIRE((e[i].flags & flags) == flags);
			int *c = e[i].op_context;
			REQUIRE(c >= a->contexts && c < a->contexts + K + 4);
		}
		got += (int)r;
	}
	REQUIRE(got == n);
}

/* Handles whose shared blocks are copies of the real ones with another layout version (as a
 * library built with other headers would export) or no magic: every call answers -FI_ENOSYS
 * (a counter read 0) and follows none of their addresses. */
static void other_layouts(struct xpu_args *a)
{
	static struct xf_xpu_ring ring;
	static struct xf_xpu_cq_ring cqr;
	static struct xf_xpu_cntr_mirror mirror;
	memcpy(&ring, (void *)(uintptr_t)a->ep.fid.prov_ctx, sizeof ring);
	memcpy(&cqr, (void *)(uintptr_t)a->cq.fid.prov_ctx, sizeof cqr);
	memcpy(&mirror, (void *)(uintptr_t)a->cntr.fid.prov_ctx, sizeof mirror);
	REQUIRE(ring.magic == XF_XPU_RING_MAGIC && ring.version == XF_XPU_ABI_VERSION);
	REQUIRE(cqr.magic == XF_XPU_CQ_RING_MAGIC && cqr.version == XF_XPU_ABI_VERSION);
	REQUIRE(mirror.magic == XF_XPU_CNTR_MAGIC && mirror.version == XF_XPU_ABI_VERSION);
	ring.slots = cqr.slots = mirror.ring = 8; /* never followed */
	struct fid_xpu_ep ep = a->ep;
	struct fid_xpu_cq cq = a->cq;
	struct fid_xpu_cntr cntr = a->cntr;
	ep.fid.prov_ctx = (uint64_t)(uintptr_t)&ring;
	cq.fid.prov_ctx = (uint64_t)(uintptr_t)&cqr;
	cntr.fid.prov_ctx = (uint64_t)(uintptr_t)&mirror;
	for (int i = 0; i < 2; i++) {
		ring.version = cqr.version = mirror.version = XF_XPU_ABI_VERSION + (i ? 0 : 1);
		ring.magic = i ? 0 : XF_XPU_RING_MAGIC;
		cqr.magic = i ? 0 : XF_XPU_CQ_RING_MAGIC;
		mirror.magic = i ? 0 : XF_XPU_CNTR_MAGIC;
		mirror.value = 7;
		REQUIRE(fi_xpu_send(&ep, a->buf, 1, &a->desc, 0, &a->peer, NULL, 0,
				    FI_XPU_WORK_ITEM) == -FI_ENOSYS);
		REQUIRE(fi_xpu_cq_read(&cq, a->buf, 1, FI_XPU_WORK_ITEM) == -FI_ENOSYS);
		REQUIRE(fi_xpu_cntr_read(&cntr, FI_XPU_WORK_ITEM) == 0);
		REQUIRE(fi_xpu_cntr_wait(&cntr, 1, -1, FI_XPU_WORK_ITEM) == -FI_ENOSYS);
		REQUIRE(fi_xpu_cntr_add(&cntr, 1, FI_XPU_WORK_ITEM) == -FI_ENOSYS);
	}
}

static void *xpu_parent(void *arg)
{
	struct xpu_args *a = arg;
	int64_t r;

	/* A scope that is none, a handle that is not xfabric's. */
	REQUIRE(fi_xpu_tx_flush(&a->ep, 0, 9) == -FI_EINVAL);
	struct fid_xpu_ep foreign = a->ep;
	foreign.fid.prov_id = 1;
	REQUIRE(fi_xpu_send(&foreign, a->buf, 1, &a->desc, 0, &a->peer, NULL, 0,
			    FI_XPU_WORK_ITEM) == -FI_ENOSYS);
	other_layouts(a);
	REQUIRE(fi_xpu_cq_read(&a->cq, NULL, 0, FI_XPU_WORK_ITEM) == -FI_EINVAL);
	REQUIRE(fi_xpu_cq_read(&a->cq, a->buf, 1, FI_XPU_WORK_ITEM) == -FI_EAGAIN);

	REQUIRE(xf_xpu_post_desc(&a->ep, NULL, FI_XPU_WORK_ITEM) == -FI_EINVAL);
	/* Hostile descriptors until the ring of 2 is full: nothing drains yet. */
	struct xf_xpu_desc d;
	memset(&d, 0, sizeof d);
	d.opcode = HOSTILE;
	d.context = (uint64_t)(uintptr_t)&a->contexts[K + 3];
	int posted = 0, rc;
	while ((rc = xf_xpu_post_desc(&a->ep, &d, FI_XPU_WORK_ITEM)) == 0 && posted < 100)
		posted++;
	REQUIRE(rc == -FI_EAGAIN);
	REQUIRE(posted == 2);
	__atomic_store_n(&drive_flag, 1, __ATOMIC_RELEASE);

	/* Each is an error completion naming the fault; a read finds it first. */
	for (int i = 0; i < posted; i++) {
		struct fi_cq_err_entry err = { 0 };
		for (;;) {
			r = fi_xpu_cq_readerr(&a->cq, &err, 0, FI_XPU_WORK_ITEM);
			if (r == 1)
				break;
			REQUIRE(r == -FI_EAGAIN);
			struct fi_cq_tagged_entry t;
			int64_t rr = fi_xpu_cq_read(&a->cq, &t, 1, FI_XPU_WORK_ITEM);
			REQUIRE(rr == -FI_EAGAIN || rr == -FI_EAVAIL);
			sched_yield();
		}
		REQUIRE(err.err == FI_EINVAL);
		REQUIRE(err.prov_errno == XF_XPU_FAULT_OPCODE);
		REQUIRE(err.op_context == &a->contexts[K + 3]);
		REQUIRE(err.err_data == NULL);
	}

	/* Tagged sends whose size, tag and buffer the XPU chooses now, and one send. */
	for (int m = 0; m < K; m++) {
		uint8_t *b = a->buf + m * LEN;
		for (int i = 0; i < LEN; i++)
			b[i] = byte_of(m, i);
		POST(fi_xpu_tsend(&a->ep, b, LEN, &a->desc, 0, &a->peer, tag_of(m), &a->contexts[m],
				  0, FI_XPU_WORK_ITEM));
	}
	uint8_t *b = a->buf + K * LEN;
	for (int i = 0; i < LEN; i++)
		b[i] = byte_of(K, i);
	POST(fi_xpu_send(&a->ep, b, LEN, &a->desc, 0, &a->peer, &a->contexts[K], 0,
			 FI_XPU_SUBGROUP));
	REQUIRE(fi_xpu_tx_flush(&a->ep, 0, FI_XPU_WORK_ITEM) == 0);
	xpu_completions(a, K + 1, FI_SEND);

	/* A write with remote CQ data, then the counter: one write completion counted, plus 10
	 * the XPU adds itself. */
	uint8_t *w = a->buf + (K + 1) * LEN;
	for (int i = 0; i < WLEN; i++)
		w[i] = (uint8_t)(0xA0 ^ i);
	POST(fi_xpu_write(&a->ep, w, WLEN, &a->desc, 0xD00D, &a->peer, a->raddr, a->rkey,
			  &a->contexts[K + 1], FI_REMOTE_CQ_DATA | FI_DELIVERY_COMPLETE,
			  FI_XPU_WORK_GROUP));
	xpu_completions(a, 1, FI_WRITE | FI_RMA);
	REQUIRE(fi_xpu_cntr_wait(&a->cntr, 1, 30000, FI_XPU_WORK_ITEM) == 0);
	POST(fi_xpu_cntr_add(&a->cntr, 10, FI_XPU_WORK_ITEM));
	REQUIRE(fi_xpu_cntr_wait(&a->cntr, 11, 30000, FI_XPU_WORK_ITEM) == 0);
	REQUIRE(fi_xpu_cntr_read(&a->cntr, FI_XPU_WORK_ITEM) == 11);
	REQUIRE(fi_xpu_cntr_readerr(&a->cntr, FI_XPU_WORK_ITEM) == 0);
	REQUIRE(fi_xpu_cntr_wait(&a->cntr, 1000, 10, FI_XPU_WORK_ITEM) == -FI_ETIMEDOUT);

	/* An atomic on the target's word. */
	uint64_t *operand = (uint64_t *)(a->buf + (K + 1) * LEN + WLEN);
	*operand = ADD;
	POST(fi_xpu_atomic(&a->ep, operand, 1, &a->desc, &a->peer, a->raddr + WLEN, a->rkey,
			   FI_UINT64, FI_SUM, &a->contexts[K + 2], FI_DELIVERY_COMPLETE,
			   FI_XPU_WORK_ITEM));
	xpu_completions(a, 1, FI_ATOMIC);

	__atomic_store_n(&done_flag, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* Every export call refuses what a C caller can get wrong. */
static void misuse(struct side *s, struct fid_cntr *cntr, struct fid_mr *mr)
{
	struct fid_xpu_ep xe;
	struct fid_xpu_cq xq;
	struct fid_xpu_cntr xc;
	uint64_t raw;
	size_t len = sizeof raw;

	REQUIRE(fi_ep_export_xpu(NULL, 0, &xe) == -FI_EINVAL);
	REQUIRE(fi_ep_export_xpu((struct fid_ep *)s->cq, 0, &xe) == -FI_EINVAL);
	REQUIRE(fi_ep_export_xpu(s->ep, 0, NULL) == -FI_EINVAL);
	REQUIRE(fi_ep_export_xpu(s->ep, 1, &xe) == -FI_EBADFLAGS);
	REQUIRE(fi_ep_export_xpu(NULL, 1, &xe) == -FI_EINVAL); /* the fid first */
	REQUIRE(fi_cq_export_xpu(NULL, 1, &xq) == -FI_EINVAL);
	REQUIRE(fi_cq_export_xpu(NULL, 0, &xq) == -FI_EINVAL);
	REQUIRE(fi_cq_export_xpu((struct fid_cq *)s->ep, 0, &xq) == -FI_EINVAL);
	REQUIRE(fi_cq_export_xpu(s->cq, 0, NULL) == -FI_EINVAL);
	REQUIRE(fi_cntr_export_xpu(NULL, 0, &xc) == -FI_EINVAL);
	REQUIRE(fi_cntr_export_xpu((struct fid_cntr *)s->av, 0, &xc) == -FI_EINVAL);
	REQUIRE(fi_cntr_export_xpu(cntr, 0, NULL) == -FI_EINVAL);
	REQUIRE(fi_av_get_xpu_addr(NULL, s->peer, &raw, &len) == -FI_EINVAL);
	REQUIRE(fi_av_get_xpu_addr((struct fid_av *)s->cq, s->peer, &raw, &len) == -FI_EINVAL);
	REQUIRE(fi_av_get_xpu_addr(s->av, s->peer, &raw, NULL) == -FI_EINVAL);
	REQUIRE(fi_av_get_xpu_addr(s->av, 12345, &raw, &len) == -FI_EINVAL);
	len = 100; /* a failing call leaves it */
	REQUIRE(fi_av_get_xpu_addr(s->av, s->peer, NULL, &len) == -FI_EINVAL);
	REQUIRE(len == 100);
	len = sizeof raw;
	len = 4;
	REQUIRE(fi_av_get_xpu_addr(s->av, s->peer, &raw, &len) == -FI_ETOOSMALL);
	REQUIRE(len == XF_XPU_KEY_SIZE);
	REQUIRE(fi_mr_get_xpu_desc(NULL, &raw, &len) == -FI_EINVAL);
	REQUIRE(fi_mr_get_xpu_desc((struct fid_mr *)s->av, &raw, &len) == -FI_EINVAL);
	len = 0;
	REQUIRE(fi_mr_get_xpu_desc(mr, &raw, &len) == -FI_ETOOSMALL);
	REQUIRE(len == XF_XPU_KEY_SIZE);
	/* Another XPU than the CPU is not served yet; a ring size that is no power of two. */
	struct xf_xpu_attr cuda = { .iface = FI_HMEM_CUDA };
	REQUIRE(xf_ep_export_xpu(s->ep, &cuda, 0, &xe) == -FI_EOPNOTSUPP);
	struct xf_xpu_attr three = { .iface = FI_HMEM_SYSTEM, .slots = 3 };
	REQUIRE(xf_ep_export_xpu(s->ep, &three, 0, &xe) == -FI_EINVAL);
	struct xf_xpu_attr bad = { .iface = 77 };
	REQUIRE(xf_cq_export_xpu(s->cq, &bad, 0, &xq) == -FI_EINVAL);
	/* getopt's count is the caller's array's length: a negative one is refused. */
	struct fi_trigger_xpu tq = { .count = -5, .iface = FI_HMEM_SYSTEM };
	size_t tlen = sizeof tq;
	REQUIRE(fi_getopt(&s->ep->fid, FI_OPT_ENDPOINT, FI_OPT_XPU_TRIGGER, &tq, &tlen) ==
		-FI_EINVAL);
	/* One CPU XPU: device 0 of FI_HMEM_SYSTEM. */
	struct xf_xpu_attr cpu7 = { .iface = FI_HMEM_SYSTEM, .device = 7 };
	REQUIRE(xf_ep_export_xpu(s->ep, &cpu7, 0, &xe) == -FI_EINVAL);
	REQUIRE(xf_cq_export_xpu(s->cq, &cpu7, 0, &xq) == -FI_EINVAL);
}

static int parent(struct side *s, uint64_t caps)
{
	struct fid_cntr *cntr;
	struct fi_cntr_attr cattr = { .events = FI_CNTR_EVENTS_COMP };
	CHECK(fi_cntr_open(s->domain, &cattr, &cntr, NULL));
	CHECK(fi_ep_bind(s->ep, &cntr->fid, FI_WRITE));
	/* Not enabled yet: nothing to export. */
	struct xpu_args *a = calloc(1, sizeof *a);
	REQUIRE(a);
	REQUIRE(fi_ep_export_xpu(s->ep, 0, &a->ep) < 0);
	two_connect(s);
	REQUIRE((s->info->caps & FI_XPU) == FI_XPU && FI_XPU == FI_XPU_TRIGGER);
	(void)caps;

	static uint8_t buf[(K + 1) * LEN + WLEN + 8];
	struct fid_mr *mr;
	CHECK(fi_mr_reg(s->domain, buf, sizeof buf, FI_SEND | FI_WRITE | FI_READ, 0, 0, 0, &mr,
			NULL));
	misuse(s, cntr, mr);

	struct xf_xpu_attr two = { .iface = FI_HMEM_SYSTEM, .slots = 2 };
	CHECK(xf_ep_export_xpu(s->ep, &two, 0, &a->ep));
	REQUIRE(a->ep.fid.fclass == FI_CLASS_EP && a->ep.fid.prov_id == FI_XPU_PROV_XFABRIC);
	struct fid_xpu_ep again;
	CHECK(fi_ep_export_xpu(s->ep, 0, &again));
	REQUIRE(again.fid.prov_ctx == a->ep.fid.prov_ctx);
	CHECK(fi_cq_export_xpu(s->cq, 0, &a->cq));
	REQUIRE(a->cq.fid.fclass == FI_CLASS_CQ && a->cq.fid.prov_ctx != 0);
	CHECK(fi_cntr_export_xpu(cntr, 0, &a->cntr));
	REQUIRE(a->cntr.fid.fclass == FI_CLASS_CNTR);
	size_t len = XF_XPU_KEY_SIZE;
	CHECK(fi_mr_get_xpu_desc(mr, &a->desc, &len));
	len = XF_XPU_KEY_SIZE;
	CHECK(fi_av_get_xpu_addr(s->av, s->peer, &a->peer, &len));
	REQUIRE(len == XF_XPU_KEY_SIZE);
	a->buf = buf;

	uint64_t target[2];
	swap_blob(s, "go", 3, target, sizeof target);
	a->raddr = target[0];
	a->rkey = target[1];

	pthread_t xpu;
	if (pthread_create(&xpu, NULL, xpu_parent, a))
		FAIL("pthread_create");
	/* Manual progress: nothing drains the ring until the host reads, so the XPU finds it full
	 * first; then the host drives progress until the XPU is done. */
	while (!__atomic_load_n(&drive_flag, __ATOMIC_ACQUIRE))
		sched_yield();
	while (!__atomic_load_n(&done_flag, __ATOMIC_ACQUIRE))
		drive(s, cntr);
	pthread_join(xpu, NULL);
	char ok[3];
	swap_blob(s, "ok", 3, ok, sizeof ok);
	printf("parent: full ring, hostile descriptors, %d tagged sends, a send, a write with "
	       "data and counter, an atomic, completions read by the XPU\n",
	       K);
	/* The exports go with their objects: two_finish closes the endpoint and the CQ. */
	CHECK(fi_close(&mr->fid));
	free(a);
	return 0;
}

struct target_args {
	struct fid_xpu_cntr cntr;
	uint64_t *words;
	int ok;
};

static void *xpu_child(void *arg)
{
	struct target_args *t = arg;
	/* The XPU waits on the remote-write counter, then reads what the write put there. */
	if (fi_xpu_cntr_wait(&t->cntr, 1, 30000, FI_XPU_WORK_ITEM) != 0)
		return NULL;
	const uint8_t *b = (const uint8_t *)t->words;
	for (int i = 0; i < WLEN; i++)
		if (b[i] != (uint8_t)(0xA0 ^ i))
			return NULL;
	t->ok = fi_xpu_cntr_read(&t->cntr, FI_XPU_WORK_ITEM) >= 1;
	__atomic_store_n(&done_flag, 1, __ATOMIC_RELEASE);
	return NULL;
}

static int child(struct side *s)
{
	struct fid_cntr *cntr;
	struct fi_cntr_attr cattr = { .events = FI_CNTR_EVENTS_COMP };
	CHECK(fi_cntr_open(s->domain, &cattr, &cntr, NULL));
	CHECK(fi_ep_bind(s->ep, &cntr->fid, FI_REMOTE_WRITE));
	two_connect(s);

	static uint64_t words[WLEN / 8 + 1];
	words[WLEN / 8] = START;
	struct fid_mr *tmr;
	CHECK(fi_mr_reg(s->domain, words, sizeof words, FI_REMOTE_WRITE | FI_REMOTE_READ, 0, 0, 0,
			&tmr, NULL));
	static uint8_t rbuf[(K + 1) * LEN];
	static struct fi_context2 rctx[K + 1];
	for (int m = 0; m < K; m++)
		CHECK(fi_trecv(s->ep, rbuf + m * LEN, LEN, NULL, s->peer, tag_of(m), 0, &rctx[m]));
	CHECK(fi_recv(s->ep, rbuf + K * LEN, LEN, NULL, s->peer, &rctx[K]));

	static struct target_args t;
	CHECK(fi_cntr_export_xpu(cntr, 0, &t.cntr));
	t.words = words;
	pthread_t xpu;
	if (pthread_create(&xpu, NULL, xpu_child, &t))
		FAIL("pthread_create");

	uint64_t mine[2] = { (uint64_t)(uintptr_t)words, fi_mr_key(tmr) };
	char go[3];
	swap_blob(s, mine, sizeof mine, go, sizeof go);

	int msgs = 0, data = 0;
	while (msgs < K + 1 || !data) {
		struct fi_cq_data_entry e;
		one_completion(s, &e);
		if (e.flags & FI_REMOTE_CQ_DATA) {
			REQUIRE(e.data == 0xD00D);
			data = 1;
			continue;
		}
		REQUIRE(e.flags & FI_RECV);
		int m = (struct fi_context2 *)e.op_context - rctx;
		REQUIRE(m >= 0 && m <= K && e.len == LEN);
		/* Matched by tag: each lands in the buffer of the receive with its tag. */
		if (m < K)
			REQUIRE(e.flags & FI_TAGGED);
		for (int i = 0; i < LEN; i++)
			REQUIRE(rbuf[m * LEN + i] == byte_of(m, i));
		msgs++;
	}
	/* Progress until the XPU saw the write and the atomic landed, then until the parent is
	 * done (its atomic's completion may need this side). */
	struct pollfd p = { .fd = s->in, .events = POLLIN };
	while (!__atomic_load_n(&done_flag, __ATOMIC_ACQUIRE) ||
	       __atomic_load_n(&words[WLEN / 8], __ATOMIC_ACQUIRE) != START + ADD ||
	       poll(&p, 1, 0) == 0)
		drive(s, cntr);
	pthread_join(xpu, NULL);
	REQUIRE(t.ok);
	char ok[3];
	swap_blob(s, "ok", 3, ok, sizeof ok);
	printf("target: %d messages with the XPU's tags, the write's data, the atomic; its XPU "
	       "waited on the counter\n",
	       K + 1);
	CHECK(fi_close(&tmr->fid));
	return 0;
}

int main(void)
{
	/* Bounded: a hang is a failure. */
	alarm(60);
	struct side s;
	uint64_t caps = FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_RMA_EVENT | FI_TRIGGER |
			FI_XPU_TRIGGER;
	two_sides(&s, caps);
	int r = s.child ? child(&s) : parent(&s, caps);
	return two_finish(&s, r);
}
