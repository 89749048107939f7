/* Atomics through the C API (fi_atomic(3)) across two processes: the target registers eight
 * u64s; the initiator asks the valid queries and fi_query_atomic, writes a vector with
 * fi_atomicv, fetch-adds and compare-swaps with checked results (a failing compare included),
 * injects an add, posts a threshold-triggered fi_atomicmsg and fires it, queues the three
 * atomic kinds as deferred work (fi_control FI_QUEUE_WORK) and fires them, and reads the whole
 * array back with a fenced fi_fetch_atomicmsg. Invalid pairs answer -FI_EOPNOTSUPP (the core's
 * answer), values outside the C enums and a zero count -FI_EINVAL. The target then checks its
 * memory. */
#include "two.h"
#include <rdma/fi_atomic.h>
#include <rdma/fi_trigger.h>

#define N 8

struct target {
	uint64_t addr;
	uint64_t key;
};

#define EXPECT(cond, ...)                                                                   \
	do {                                                                                \
		if (!(cond))                                                                \
			FAIL(__VA_ARGS__);                                                  \
	} while (0)

int main(void)
{
	struct side s;
	two_sides(&s, FI_MSG | FI_ATOMIC | FI_TRIGGER);
	static uint64_t mem[N];
	uint8_t note = 0;
	struct fi_cq_data_entry e;
	int virt = (s.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;

	if (s.child) {
		for (int i = 0; i < N; i++)
			mem[i] = 100 + i;
		struct fid_mr *mr;
		CHECK(fi_mr_reg(s.domain, mem, sizeof mem, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 7,
				0, &mr, NULL));
		if (s.info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
			CHECK(fi_mr_bind(mr, &s.ep->fid, 0));
			CHECK(fi_mr_enable(mr));
		}
		two_connect(&s);
		struct target t = { virt ? (uint64_t)(uintptr_t)mem : 0, fi_mr_key(mr) }, unused;
		swap_blob(&s, &t, sizeof t, &unused, sizeof unused);
		static struct fi_context2 rctx;
		CHECK(fi_recv(s.ep, &note, 1, NULL, s.peer, &rctx));
		one_completion(&s, &e);
		const uint64_t want[N] = { 8, 102, 102 | 0x10, 1103, 1000, 1002, 1007, 9 };
		for (int i = 0; i < N; i++)
			EXPECT(mem[i] == want[i], "target mem[%d] is %llu, not %llu", i,
			       (unsigned long long)mem[i], (unsigned long long)want[i]);
		printf("target: every atomic landed\n");
		CHECK(fi_close(&mr->fid));
		return two_finish(&s, 0);
	}

	struct fid_cntr *trig;
	struct fi_cntr_attr cattr = { .events = FI_CNTR_EVENTS_COMP };
	CHECK(fi_cntr_open(s.domain, &cattr, &trig, NULL));
	two_connect(&s);
	struct target t, mine = { 0, 0 };
	swap_blob(&s, &mine, sizeof mine, &t, sizeof t);
	uint64_t at = t.addr; /* mem[i] is at + 8 * i */

	/* The valid queries: the core's tables and its 4096-byte operand limit. */
	size_t count = 0;
	CHECK(fi_atomicvalid(s.ep, FI_UINT64, FI_SUM, &count));
	EXPECT(count == 4096 / 8, "fi_atomicvalid count %zu", count);
	count = 0;
	CHECK(fi_fetch_atomicvalid(s.ep, FI_UINT8, FI_ATOMIC_READ, &count));
	EXPECT(count == 4096, "fi_fetch_atomicvalid count %zu", count);
	CHECK(fi_compare_atomicvalid(s.ep, FI_INT32, FI_MSWAP, &count));
	EXPECT(count == 1024, "fi_compare_atomicvalid count %zu", count);
	EXPECT(fi_atomicvalid(s.ep, FI_UINT64, FI_ATOMIC_READ, &count) == -FI_EOPNOTSUPP,
	       "FI_ATOMIC_READ is fetch-only");
	EXPECT(fi_compare_atomicvalid(s.ep, FI_DOUBLE, FI_MSWAP, &count) == -FI_EOPNOTSUPP,
	       "FI_MSWAP on a double");
	EXPECT(fi_atomicvalid(s.ep, 99, FI_SUM, &count) == -FI_EINVAL, "datatype 99");
	EXPECT(fi_atomicvalid(s.ep, FI_UINT64, FI_SUM, NULL) == -FI_EINVAL, "null count");
	struct fi_atomic_attr attr = { 0, 0 };
	CHECK(fi_query_atomic(s.domain, FI_UINT64, FI_CSWAP, &attr, FI_COMPARE_ATOMIC));
	EXPECT(attr.size == 8 && attr.count == 512, "fi_query_atomic %zu x %zu", attr.count,
	       attr.size);
	EXPECT(fi_query_atomic(s.domain, FI_UINT64, FI_CSWAP, &attr, 0) == -FI_EOPNOTSUPP,
	       "FI_CSWAP as a base atomic");
	/* Atomics into tagged receive buffers: none, as the posts say (they refuse FI_TAGGED). */
	EXPECT(fi_query_atomic(s.domain, FI_UINT64, FI_SUM, &attr, FI_TAGGED) == -FI_EOPNOTSUPP,
	       "FI_TAGGED atomics");

	/* Invalid requests, refused at the call. */
	static uint64_t src[N], res[N], cmp[N];
	static struct fi_context2 ctx;
	EXPECT(fi_atomic(s.ep, src, 1, NULL, s.peer, at, t.key, FI_DOUBLE, FI_BOR, &ctx) ==
		       -FI_EOPNOTSUPP,
	       "FI_BOR on a double");
	EXPECT(fi_atomic(s.ep, src, 1, NULL, s.peer, at, t.key, FI_UINT64, 77, &ctx) == -FI_EINVAL,
	       "op 77");
	EXPECT(fi_atomic(s.ep, src, 0, NULL, s.peer, at, t.key, FI_UINT64, FI_SUM, &ctx) ==
		       -FI_EINVAL,
	       "count 0");
	EXPECT(fi_atomic(s.ep, NULL, 1, NULL, s.peer, at, t.key, FI_UINT64, FI_SUM, &ctx) ==
		       -FI_EINVAL,
	       "null operand");
	/* More elements than one operation carries (fi_atomicvalid's count): fi_atomic(3)'s
	 * -FI_EMSGSIZE. */
	EXPECT(fi_atomic(s.ep, src, 4096 / 8 + 1, NULL, s.peer, at, t.key, FI_UINT64, FI_SUM,
			 &ctx) == -FI_EMSGSIZE,
	       "count past the limit");

	/* A vector write into mem[4..8]. */
	for (int i = 0; i < 4; i++)
		src[i] = 1000 + i;
	struct fi_ioc ioc = { src, 4 };
	CHECK(fi_atomicv(s.ep, &ioc, NULL, 1, s.peer, at + 32, t.key, FI_UINT64,
			 FI_ATOMIC_WRITE, &ctx));
	one_completion(&s, &e);

	/* Fetch-add twice on mem[0]: 100, then 105; mem[0] ends 110. */
	src[0] = 5;
	for (uint64_t want = 100; want <= 105; want += 5) {
		res[0] = 0;
		CHECK(fi_fetch_atomic(s.ep, src, 1, NULL, res, NULL, s.peer, at, t.key, FI_UINT64,
				      FI_SUM, &ctx));
		one_completion(&s, &e);
		EXPECT(res[0] == want, "fetch-add returned %llu, not %llu",
		       (unsigned long long)res[0], (unsigned long long)want);
	}
	/* Compare-swap: 110 -> 7 succeeds, then 999 -> 1 fails and leaves 7. */
	src[0] = 7, cmp[0] = 110, res[0] = 0;
	CHECK(fi_compare_atomic(s.ep, src, 1, NULL, cmp, NULL, res, NULL, s.peer, at, t.key,
				FI_UINT64, FI_CSWAP, &ctx));
	one_completion(&s, &e);
	EXPECT(res[0] == 110, "cswap returned %llu", (unsigned long long)res[0]);
	src[0] = 1, cmp[0] = 999, res[0] = 0;
	CHECK(fi_compare_atomic(s.ep, src, 1, NULL, cmp, NULL, res, NULL, s.peer, at, t.key,
				FI_UINT64, FI_CSWAP, &ctx));
	one_completion(&s, &e);
	EXPECT(res[0] == 7, "failed cswap returned %llu", (unsigned long long)res[0]);

	/* Injected add on mem[1] (no completion), a message-form OR on mem[2]. */
	src[0] = 1;
	CHECK(fi_inject_atomic(s.ep, src, 1, s.peer, at + 8, t.key, FI_UINT64, FI_SUM));
	src[1] = 0x10;
	struct fi_ioc one = { &src[1], 1 };
	struct fi_rma_ioc rone = { at + 16, 1, t.key };
	struct fi_msg_atomic m = { .msg_iov = &one, .iov_count = 1, .addr = s.peer,
				   .rma_iov = &rone, .rma_iov_count = 1, .datatype = FI_UINT64,
				   .op = FI_BOR, .context = &ctx };
	CHECK(fi_atomicmsg(s.ep, &m, 0));
	one_completion(&s, &e);

	/* A threshold-triggered add of 1000 on mem[3], fired by the counter. */
	static struct fi_triggered_context2 tctx;
	tctx.event_type = FI_TRIGGER_THRESHOLD;
	tctx.trigger.threshold.cntr = trig;
	tctx.trigger.threshold.threshold = 1;
	src[2] = 1000;
	struct fi_ioc trig_ioc = { &src[2], 1 };
	struct fi_rma_ioc rthree = { at + 24, 1, t.key };
	struct fi_msg_atomic tm = { .msg_iov = &trig_ioc, .iov_count = 1, .addr = s.peer,
				    .rma_iov = &rthree, .rma_iov_count = 1,
				    .datatype = FI_UINT64, .op = FI_SUM, .context = &tctx };
	CHECK(fi_atomicmsg(s.ep, &tm, FI_TRIGGER));
	CHECK(fi_cntr_add(trig, 1));
	one_completion(&s, &e);
	EXPECT(e.op_context == &tctx, "the triggered atomic's completion");

	/* Deferred work at threshold 2: add 1 to mem[5], read mem[4], swap mem[0] 7 -> 8. */
	struct fid_cntr *done;
	CHECK(fi_cntr_open(s.domain, &cattr, &done, NULL));
	static uint64_t d_src[2] = { 1, 8 }, d_cmp = 7, d_res[2];
	static struct fi_context2 d_ctx[3];
	struct fi_ioc d_add = { &d_src[0], 1 }, d_swap = { &d_src[1], 1 }, d_read = { NULL, 1 };
	struct fi_ioc d_fetched = { &d_res[0], 1 }, d_old = { &d_res[1], 1 }, d_cmpv = { &d_cmp, 1 };
	struct fi_rma_ioc d_r5 = { at + 40, 1, t.key }, d_r4 = { at + 32, 1, t.key },
			  d_r0 = { at, 1, t.key };
	struct fi_op_atomic op_add = { .ep = s.ep, .flags = 0 };
	op_add.msg = (struct fi_msg_atomic){ .msg_iov = &d_add, .iov_count = 1, .addr = s.peer,
					     .rma_iov = &d_r5, .rma_iov_count = 1,
					     .datatype = FI_UINT64, .op = FI_SUM,
					     .context = &d_ctx[0] };
	struct fi_op_fetch_atomic op_read = { .ep = s.ep, .flags = 0 };
	op_read.msg = (struct fi_msg_atomic){ .msg_iov = &d_read, .iov_count = 1, .addr = s.peer,
					      .rma_iov = &d_r4, .rma_iov_count = 1,
					      .datatype = FI_UINT64, .op = FI_ATOMIC_READ,
					      .context = &d_ctx[1] };
	op_read.fetch = (struct fi_msg_fetch){ .msg_iov = &d_fetched, .iov_count = 1 };
	struct fi_op_compare_atomic op_swap = { .ep = s.ep, .flags = 0 };
	op_swap.msg = (struct fi_msg_atomic){ .msg_iov = &d_swap, .iov_count = 1, .addr = s.peer,
					      .rma_iov = &d_r0, .rma_iov_count = 1,
					      .datatype = FI_UINT64, .op = FI_CSWAP,
					      .context = &d_ctx[2] };
	op_swap.fetch = (struct fi_msg_fetch){ .msg_iov = &d_old, .iov_count = 1 };
	op_swap.compare = (struct fi_msg_compare){ .msg_iov = &d_cmpv, .iov_count = 1 };
	struct fi_deferred_work w[3] = {
		{ .threshold = 2, .triggering_cntr = trig, .completion_cntr = done,
		  .op_type = FI_OP_ATOMIC },
		{ .threshold = 2, .triggering_cntr = trig, .completion_cntr = done,
		  .op_type = FI_OP_FETCH_ATOMIC },
		{ .threshold = 2, .triggering_cntr = trig, .completion_cntr = done,
		  .op_type = FI_OP_COMPARE_ATOMIC },
	};
	w[0].op.atomic = &op_add;
	w[1].op.fetch_atomic = &op_read;
	w[2].op.compare_atomic = &op_swap;
	for (int i = 0; i < 3; i++)
		CHECK(fi_control(&s.domain->fid, FI_QUEUE_WORK, &w[i]));
	CHECK(fi_cntr_add(trig, 1));
	CHECK(fi_cntr_wait(done, 3, 10000));
	EXPECT(d_res[0] == 1000 && d_res[1] == 7, "deferred read %llu, swap %llu",
	       (unsigned long long)d_res[0], (unsigned long long)d_res[1]);

	/* Everything before it has landed when a fenced read completes: read all eight. */
	memset(res, 0, sizeof res);
	struct fi_ioc rd = { src, N }, rres = { res, N };
	struct fi_rma_ioc rall = { at, N, t.key };
	struct fi_msg_atomic rm = { .msg_iov = &rd, .iov_count = 1, .addr = s.peer,
				    .rma_iov = &rall, .rma_iov_count = 1, .datatype = FI_UINT64,
				    .op = FI_ATOMIC_READ, .context = &ctx };
	static struct fi_context2 rctx;
	rm.context = &rctx;
	CHECK(fi_fetch_atomicmsg(s.ep, &rm, &rres, NULL, 1, FI_FENCE));
	/* The deferred operations' own completions may come first. */
	do
		one_completion(&s, &e);
	while (e.op_context != &rctx);
	const uint64_t want[N] = { 8, 102, 102 | 0x10, 1103, 1000, 1002, 1002, 1003 };
	for (int i = 0; i < N; i++)
		EXPECT(res[i] == want[i], "read back mem[%d] = %llu, not %llu", i,
		       (unsigned long long)res[i], (unsigned long long)want[i]);
	/* Two result segments are more than the core's one. */
	struct fi_ioc two_res[2] = { { res, 1 }, { res + 1, 1 } };
	struct fi_ioc one_src = { src, 2 };
	rm.msg_iov = &one_src;
	EXPECT(fi_fetch_atomicmsg(s.ep, &rm, two_res, NULL, 2, 0) == -FI_EINVAL, "two results");

	/* A threshold-triggered fetch-add (+5 on mem[6], which holds 1002) and compare-swap
	 * (mem[7] 1003 -> 9), both fired by the counter reaching 3. */
	static struct fi_triggered_context2 fctx, cctx;
	fctx.event_type = cctx.event_type = FI_TRIGGER_THRESHOLD;
	fctx.trigger.threshold.cntr = cctx.trigger.threshold.cntr = trig;
	fctx.trigger.threshold.threshold = cctx.trigger.threshold.threshold = 3;
	static uint64_t f_src = 5, f_res, c_src = 9, c_cmp = 1003, c_res;
	struct fi_ioc f_io = { &f_src, 1 }, f_out = { &f_res, 1 };
	struct fi_ioc c_io = { &c_src, 1 }, c_cmpv = { &c_cmp, 1 }, c_out = { &c_res, 1 };
	struct fi_rma_ioc r6 = { at + 48, 1, t.key }, r7 = { at + 56, 1, t.key };
	struct fi_msg_atomic fm = { .msg_iov = &f_io, .iov_count = 1, .addr = s.peer,
				    .rma_iov = &r6, .rma_iov_count = 1, .datatype = FI_UINT64,
				    .op = FI_SUM, .context = &fctx };
	struct fi_msg_atomic cm = { .msg_iov = &c_io, .iov_count = 1, .addr = s.peer,
				    .rma_iov = &r7, .rma_iov_count = 1, .datatype = FI_UINT64,
				    .op = FI_CSWAP, .context = &cctx };
	CHECK(fi_fetch_atomicmsg(s.ep, &fm, &f_out, NULL, 1, FI_TRIGGER));
	CHECK(fi_compare_atomicmsg(s.ep, &cm, &c_cmpv, NULL, 1, &c_out, NULL, 1, FI_TRIGGER));
	EXPECT(f_res == 0 && c_res == 0, "a triggered fetch ran before its trigger");
	CHECK(fi_cntr_add(trig, 1));
	one_completion(&s, &e);
	one_completion(&s, &e);
	EXPECT(f_res == 1002 && c_res == 1003, "triggered fetch-add %llu, compare-swap %llu",
	       (unsigned long long)f_res, (unsigned long long)c_res);

	static struct fi_context2 sctx;
	CHECK(fi_send(s.ep, &note, 1, NULL, s.peer, &sctx));
	one_completion(&s, &e);
	printf("initiator: valid queries, vector write, fetch-add, compare-swap, inject, "
	       "triggered atomicmsg, deferred atomics, fenced read back, triggered fetch and "
	       "compare\n");
	CHECK(fi_close(&trig->fid));
	/* The deferred work's completion counter stays tied to the endpoint that ran it (closing
	 * it answers -FI_EBUSY while the endpoint is open): released with the process. */
	return two_finish(&s, 0);
}
