/* An XPU-triggered send across two processes, rung by a CPU thread (fi_trigger(3),
 * FI_TRIGGER_XPU; fi_endpoint(3), FI_OPT_XPU_TRIGGER). The sender asks fi_getopt how many
 * trigger variables a CPU XPU (FI_HMEM_SYSTEM) needs and of which types, arms a send with
 * FI_TRIGGER and struct fi_triggered_context2, checks that nothing starts before the ring,
 * then a thread stores each variable's value at its address (each at its width, release
 * order) as a device kernel would. The receiver checks the message. */
#include "two.h"
#include <pthread.h>
#include <rdma/fi_trigger.h>

#define LEN 256
#define MAX_VARS 8

static struct fi_trigger_var vars[MAX_VARS];
static int nvars;

/* What a device kernel does: the data is ready, store each variable's value. */
static void *xpu_thread(void *arg)
{
	uint8_t *data = arg;
	for (int i = 0; i < LEN; i++)
		data[i] = (uint8_t)(i * 5 + 3);
	for (int i = 0; i < nvars; i++) {
		struct fi_trigger_var *v = &vars[i];
		switch (v->datatype) {
		case FI_UINT8:
			if (v->count == 1)
				__atomic_store_n((uint8_t *)v->addr, v->value.val8, __ATOMIC_RELEASE);
			else {
				__atomic_thread_fence(__ATOMIC_RELEASE);
				memcpy(v->addr, v->value.data, (size_t)v->count);
			}
			break;
		case FI_UINT16:
			__atomic_store_n((uint16_t *)v->addr, v->value.val16, __ATOMIC_RELEASE);
			break;
		case FI_UINT32:
			__atomic_store_n((uint32_t *)v->addr, v->value.val32, __ATOMIC_RELEASE);
			break;
		case FI_UINT64:
			__atomic_store_n((uint64_t *)v->addr, v->value.val64, __ATOMIC_RELEASE);
			break;
		default:
			fprintf(stderr, "xpu_send: variable %d has datatype %d\n", i, v->datatype);
			exit(1);
		}
	}
	return NULL;
}

int main(void)
{
	struct side s;
	two_sides(&s, FI_MSG | FI_TRIGGER | FI_XPU_TRIGGER);
	static uint8_t buf[LEN];
	struct fi_cq_data_entry e;

	if (s.child) {
		two_connect(&s);
		static struct fi_context2 rctx;
		CHECK(fi_recv(s.ep, buf, LEN, NULL, s.peer, &rctx));
		one_completion(&s, &e);
		if (!(e.flags & FI_RECV) || e.len != LEN)
			FAIL("receive: flags %#llx len %zu", (unsigned long long)e.flags, e.len);
		for (int i = 0; i < LEN; i++)
			if (buf[i] != (uint8_t)(i * 5 + 3))
				FAIL("byte %d is %u: the send started before the XPU's data", i,
				     buf[i]);
		printf("receiver: the XPU-triggered message arrived whole\n");
		return two_finish(&s, 0);
	}

	two_connect(&s);

	/* How many variables, of which types: count 0 asks for the number only. */
	struct fi_trigger_xpu q = { .count = 0, .iface = FI_HMEM_SYSTEM, .var = NULL };
	size_t len = sizeof q;
	CHECK(fi_getopt(&s.ep->fid, FI_OPT_ENDPOINT, FI_OPT_XPU_TRIGGER, &q, &len));
	if (q.count < 1 || q.count > MAX_VARS)
		FAIL("fi_getopt(FI_OPT_XPU_TRIGGER) asks for %d variables", q.count);
	nvars = q.count;
	q.var = vars;
	CHECK(fi_getopt(&s.ep->fid, FI_OPT_ENDPOINT, FI_OPT_XPU_TRIGGER, &q, &len));
	for (int i = 0; i < nvars; i++)
		if (vars[i].count < 1)
			FAIL("variable %d has count %d", i, vars[i].count);

	static struct fi_triggered_context2 tctx;
	tctx.event_type = FI_TRIGGER_XPU;
	tctx.trigger.xpu.count = MAX_VARS; /* the array's length: the number filled comes back */
	tctx.trigger.xpu.iface = FI_HMEM_SYSTEM;
	tctx.trigger.xpu.device.reserved = 0;
	tctx.trigger.xpu.var = vars;
	struct iovec iov = { .iov_base = buf, .iov_len = LEN };
	struct fi_msg msg = { .msg_iov = &iov, .iov_count = 1, .addr = s.peer, .context = &tctx };

	/* Misaligned pointers are refused, not used in place (a careless caller's packed
	 * structures): the variables, the triggered context, getopt's optlen. */
	static union { uint64_t align; unsigned char b[4 + sizeof tctx]; } odd;
	static union { uint64_t align; unsigned char b[4 + sizeof vars]; } odd_vars;
	tctx.trigger.xpu.var = (struct fi_trigger_var *)(odd_vars.b + 4);
	if (fi_sendmsg(s.ep, &msg, FI_TRIGGER) != -FI_EINVAL)
		FAIL("misaligned trigger variables were not refused");
	tctx.trigger.xpu.var = vars;
	memcpy(odd.b + 4, &tctx, sizeof tctx);
	msg.context = odd.b + 4;
	if (fi_sendmsg(s.ep, &msg, FI_TRIGGER) != -FI_EINVAL)
		FAIL("a misaligned fi_triggered_context was not refused");
	msg.context = &tctx;
	static union { uint64_t align; unsigned char b[1 + sizeof(size_t)]; } odd_len;
	size_t want = sizeof q;
	memcpy(odd_len.b + 1, &want, sizeof want);
	if (fi_getopt(&s.ep->fid, FI_OPT_ENDPOINT, FI_OPT_XPU_TRIGGER, &q,
		      (size_t *)(odd_len.b + 1)) != -FI_EINVAL)
		FAIL("a misaligned optlen was not refused");

	CHECK(fi_sendmsg(s.ep, &msg, FI_TRIGGER));
	if (tctx.trigger.xpu.count != nvars)
		FAIL("the post left count %d, not the %d variables it filled",
		     tctx.trigger.xpu.count, nvars);
	for (int i = 0; i < nvars; i++)
		if (!vars[i].addr)
			FAIL("the provider left variable %d without an address", i);

	/* Armed, not started: reading the CQ drives progress and must find nothing. */
	for (int i = 0; i < 100000; i++) {
		ssize_t r = fi_cq_read(s.cq, &e, 1);
		if (r != -FI_EAGAIN)
			FAIL("fi_cq_read before the ring answered %zd", r);
	}

	pthread_t xpu;
	if (pthread_create(&xpu, NULL, xpu_thread, buf))
		FAIL("pthread_create");
	pthread_join(xpu, NULL);
	one_completion(&s, &e);
	if (!(e.flags & FI_SEND) || e.op_context != &tctx)
		FAIL("send completion: flags %#llx context %p", (unsigned long long)e.flags,
		     e.op_context);
	printf("sender: %d trigger variable(s), rung by a CPU thread\n", nvars);
	return two_finish(&s, 0);
}
