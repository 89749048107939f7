/* Deferred work through fi_control(domain, FI_QUEUE_WORK / FI_CANCEL_WORK / FI_FLUSH_WORK)
 * with struct fi_deferred_work, across two processes (fi_trigger(3)).
 *
 * The initiator queues, all on one triggering counter:
 *   - at 1: FI_OP_CNTR_ADD of 5 to counter `added`;
 *   - at 2: FI_OP_WRITE of a pattern into the target's registered buffer, completion counted
 *     on `done`;
 *   - at 3: FI_OP_CNTR_SET of `added` to 999, then cancelled before the counter gets there;
 *   - at 100: FI_OP_CNTR_SET of `added` to 777, flushed with FI_FLUSH_WORK.
 * It then raises the triggering counter step by step and checks each effect (and that the
 * cancelled and flushed work did nothing); the target checks its memory once told. */
#include "two.h"
#include <rdma/fi_rma.h>
#include <rdma/fi_trigger.h>

#define LEN 4096

struct target {
	uint64_t addr;
	uint64_t key;
};

int main(void)
{
	struct side s;
	two_sides(&s, FI_MSG | FI_RMA | FI_TRIGGER);
	static uint8_t mem[LEN];
	uint8_t note = 0;
	struct fi_cq_data_entry e;
	int virt = (s.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;

	if (s.child) {
		struct fid_mr *mr;
		CHECK(fi_mr_reg(s.domain, mem, LEN, FI_REMOTE_WRITE, 0, 7, 0, &mr, NULL));
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
		for (int i = 0; i < LEN; i++)
			if (mem[i] != (uint8_t)(i * 13 + 1))
				FAIL("target byte %d is %u after the deferred write", i, mem[i]);
		printf("target: the deferred write landed\n");
		CHECK(fi_close(&mr->fid));
		return two_finish(&s, 0);
	}

	struct fid_cntr *trig, *added, *done;
	struct fi_cntr_attr attr = { .events = FI_CNTR_EVENTS_COMP };
	CHECK(fi_cntr_open(s.domain, &attr, &trig, NULL));
	CHECK(fi_cntr_open(s.domain, &attr, &added, NULL));
	CHECK(fi_cntr_open(s.domain, &attr, &done, NULL));
	CHECK(fi_ep_bind(s.ep, &done->fid, FI_WRITE));
	two_connect(&s);
	struct target t, mine = { 0, 0 };
	swap_blob(&s, &mine, sizeof mine, &t, sizeof t);

	static uint8_t src[LEN];
	for (int i = 0; i < LEN; i++)
		src[i] = (uint8_t)(i * 13 + 1);
	struct fid_mr *src_mr;
	CHECK(fi_mr_reg(s.domain, src, LEN, FI_WRITE, 0, 8, 0, &src_mr, NULL));
	void *desc = fi_mr_desc(src_mr);

	struct fi_op_cntr add = { .cntr = added, .value = 5 };
	struct fi_deferred_work w_add = { .threshold = 1, .triggering_cntr = trig,
					  .completion_cntr = NULL, .op_type = FI_OP_CNTR_ADD };
	w_add.op.cntr = &add;

	/* The write's segment arrays sit 4 bytes off their alignment, as a careless caller's
	 * packed structure may leave them: read all the same. */
	static union { uint64_t align; unsigned char b[4 + sizeof(struct iovec) +
							 sizeof(struct fi_rma_iov)]; } packed;
	struct iovec iov = { .iov_base = src, .iov_len = LEN };
	struct fi_rma_iov riov = { .addr = t.addr, .len = LEN, .key = t.key };
	memcpy(packed.b + 4, &iov, sizeof iov);
	memcpy(packed.b + 4 + sizeof iov, &riov, sizeof riov);
	struct fi_op_rma write = { .ep = s.ep, .flags = 0 };
	write.msg = (struct fi_msg_rma){ .msg_iov = (struct iovec *)(packed.b + 4), .desc = &desc,
					 .iov_count = 1, .addr = s.peer,
					 .rma_iov = (struct fi_rma_iov *)(packed.b + 4 + sizeof iov),
					 .rma_iov_count = 1 };
	struct fi_deferred_work w_write = { .threshold = 2, .triggering_cntr = trig,
					    .completion_cntr = done, .op_type = FI_OP_WRITE };
	w_write.op.rma = &write;
	static struct fi_context2 write_ctx;
	write.msg.context = &write_ctx;

	struct fi_op_cntr set999 = { .cntr = added, .value = 999 };
	struct fi_deferred_work w_cancel = { .threshold = 3, .triggering_cntr = trig,
					     .op_type = FI_OP_CNTR_SET };
	w_cancel.op.cntr = &set999;

	struct fi_op_cntr set777 = { .cntr = added, .value = 777 };
	struct fi_deferred_work w_flush = { .threshold = 100, .triggering_cntr = trig,
					    .op_type = FI_OP_CNTR_SET };
	w_flush.op.cntr = &set777;

	/* A misaligned struct fi_deferred_work (or op) is refused, not read. */
	static union { uint64_t align; unsigned char b[1 + sizeof(struct fi_deferred_work)]; } odd;
	memcpy(odd.b + 1, &w_add, sizeof w_add);
	if (fi_control(&s.domain->fid, FI_QUEUE_WORK, odd.b + 1) != -FI_EINVAL)
		FAIL("a misaligned fi_deferred_work was not refused");
	struct fi_deferred_work w_odd_op = w_add;
	static union { uint64_t align; unsigned char b[1 + sizeof(struct fi_op_cntr)]; } odd_op;
	memcpy(odd_op.b + 1, &add, sizeof add);
	w_odd_op.op.cntr = (struct fi_op_cntr *)(odd_op.b + 1);
	if (fi_control(&s.domain->fid, FI_QUEUE_WORK, &w_odd_op) != -FI_EINVAL)
		FAIL("a misaligned op was not refused");

	CHECK(fi_control(&s.domain->fid, FI_QUEUE_WORK, &w_add));
	CHECK(fi_control(&s.domain->fid, FI_QUEUE_WORK, &w_write));
	CHECK(fi_control(&s.domain->fid, FI_QUEUE_WORK, &w_cancel));
	CHECK(fi_control(&s.domain->fid, FI_QUEUE_WORK, &w_flush));
	if (fi_cntr_read(added) != 0 || fi_cntr_read(done) != 0)
		FAIL("deferred work ran before its threshold");

	CHECK(fi_cntr_add(trig, 1));
	CHECK(fi_cntr_wait(added, 5, 10000));
	if (fi_cntr_read(done) != 0)
		FAIL("the write ran at threshold 1");

	CHECK(fi_control(&s.domain->fid, FI_CANCEL_WORK, &w_cancel));
	CHECK(fi_cntr_add(trig, 1));
	CHECK(fi_cntr_wait(done, 1, 10000));

	CHECK(fi_cntr_add(trig, 1)); /* 3: the cancelled work must not run */
	CHECK(fi_control(&s.domain->fid, FI_FLUSH_WORK, NULL));
	CHECK(fi_cntr_add(trig, 200)); /* past 100: the flushed work must not run */
	if (fi_cntr_read(added) != 5)
		FAIL("counter `added` is %llu, not 5 (cancelled or flushed work ran)",
		     (unsigned long long)fi_cntr_read(added));

	static struct fi_context2 sctx;
	CHECK(fi_send(s.ep, &note, 1, NULL, s.peer, &sctx));
	one_completion(&s, &e);
	printf("initiator: counter add, RMA write (its segments misaligned), cancel and flush as "
	       "queued; misaligned work refused\n");
	CHECK(fi_close(&src_mr->fid));
	return two_finish(&s, 0);
}
