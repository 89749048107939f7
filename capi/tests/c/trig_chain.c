/* A chain of counter-triggered sends across two processes (fi_trigger(3), FI_TRIGGER with
 * struct fi_triggered_context, FI_TRIGGER_THRESHOLD). The sender binds a counter to its
 * sends and posts messages 1..N-1 triggered at thresholds 1..N-1, then message 0 as a plain
 * send: each completion starts the next. The receiver checks that all N arrive, in order,
 * with their contents; the sender that its counter ends at N and that every triggered
 * operation reported its own context. */
#include "two.h"
#include <rdma/fi_trigger.h>

#define N 16
#define LEN 64

int main(void)
{
	struct side s;
	two_sides(&s, FI_MSG | FI_TRIGGER);
	static uint8_t buf[N][LEN];
	struct fi_cq_data_entry e;

	if (s.child) {
		two_connect(&s);
		static struct fi_context2 rctx[N];
		for (int k = 0; k < N; k++)
			CHECK(fi_recv(s.ep, buf[k], LEN, NULL, s.peer, &rctx[k]));
		for (int k = 0; k < N; k++) {
			one_completion(&s, &e);
			if (!(e.flags & FI_RECV) || e.op_context != &rctx[k] || e.len != LEN)
				FAIL("receive %d: flags %#llx context %p len %zu", k,
				     (unsigned long long)e.flags, e.op_context, e.len);
			for (int i = 0; i < LEN; i++)
				if (buf[k][i] != (uint8_t)(k * 31 + i))
					FAIL("message %d byte %d is %u", k, i, buf[k][i]);
		}
		printf("receiver: %d messages in order\n", N);
		return two_finish(&s, 0);
	}

	struct fid_cntr *cntr;
	struct fi_cntr_attr cntr_attr = { .events = FI_CNTR_EVENTS_COMP };
	CHECK(fi_cntr_open(s.domain, &cntr_attr, &cntr, NULL));
	CHECK(fi_ep_bind(s.ep, &cntr->fid, FI_SEND));
	two_connect(&s);
	for (int k = 0; k < N; k++)
		for (int i = 0; i < LEN; i++)
			buf[k][i] = (uint8_t)(k * 31 + i);

	/* fi_triggered_context must be the operation's context (it is the size of fi_context2). */
	static struct fi_triggered_context2 tctx[N];
	for (int k = 1; k < N; k++) {
		tctx[k].event_type = FI_TRIGGER_THRESHOLD;
		tctx[k].trigger.threshold.cntr = cntr;
		tctx[k].trigger.threshold.threshold = (size_t)k;
		struct iovec iov = { .iov_base = buf[k], .iov_len = LEN };
		struct fi_msg msg = { .msg_iov = &iov, .iov_count = 1, .addr = s.peer,
				      .context = &tctx[k] };
		CHECK(fi_sendmsg(s.ep, &msg, FI_TRIGGER));
	}
	/* Nothing may have started: the counter is still 0. */
	if (fi_cntr_read(cntr) != 0)
		FAIL("the counter is %llu before the first send",
		     (unsigned long long)fi_cntr_read(cntr));
	static struct fi_context2 first;
	CHECK(fi_send(s.ep, buf[0], LEN, NULL, s.peer, &first));
	for (int k = 0; k < N; k++) {
		one_completion(&s, &e);
		void *want = k == 0 ? (void *)&first : (void *)&tctx[k];
		if (!(e.flags & FI_SEND) || e.op_context != want)
			FAIL("send completion %d: flags %#llx context %p, not %p", k,
			     (unsigned long long)e.flags, e.op_context, want);
	}
	CHECK(fi_cntr_wait(cntr, N, 10000));
	if (fi_cntr_read(cntr) != N)
		FAIL("the counter is %llu, not %d", (unsigned long long)fi_cntr_read(cntr), N);
	printf("sender: %d sends, each started by the one before\n", N);
	return two_finish(&s, 0);
}
