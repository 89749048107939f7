/* A poll set through the C API, as fabtests' fi_poll uses one: a CQ and a counter added with
 * fi_poll_add come back from fi_poll as their fids' contexts when they have something (the
 * CQ while an entry waits to be read, the counter once per change), a full context array
 * leaves the rest for the next call, fi_poll_del takes a member out (-FI_ENOENT the second
 * time), and a member closed while in the set is forgotten. Two processes: the child sends,
 * the parent's poll set sees the receive's completion arrive. */
#include "two.h"
#include <rdma/fi_eq.h>

int main(void)
{
	struct side s;
	two_sides(&s, FI_MSG);
	two_connect(&s);
	struct fi_cq_data_entry e;
	if (s.child) {
		char msg[8] = "polled";
		CHECK(fi_send(s.ep, msg, sizeof msg, NULL, s.peer, NULL));
		one_completion(&s, &e);
		return two_finish(&s, 0);
	}
	struct fi_poll_attr pattr = { 0 };
	struct fid_poll *ps;
	REQUIRE(fi_poll_open(s.domain, &pattr, &ps) == 0);
	struct fi_cntr_attr cattr = { .events = FI_CNTR_EVENTS_COMP };
	struct fid_cntr *cntr;
	int cq_ctx, cntr_ctx;
	REQUIRE(fi_cntr_open(s.domain, &cattr, &cntr, &cntr_ctx) == 0);
	s.cq->fid.context = &cq_ctx;
	REQUIRE(fi_poll_add(ps, &s.cq->fid, 0) == 0);
	REQUIRE(fi_poll_add(ps, &cntr->fid, 0) == 0);
	REQUIRE(fi_poll_add(ps, &s.domain->fid, 0) == -FI_EINVAL);
	void *ctx[4];
	REQUIRE(fi_poll(ps, ctx, 4) == 0);

	char buf[8] = { 0 };
	CHECK(fi_recv(s.ep, buf, sizeof buf, NULL, s.peer, NULL));
	/* fi_poll drives the queue's progress: the child's message arrives through it. */
	int n;
	for (int i = 0; (n = fi_poll(ps, ctx, 4)) == 0; i++)
		REQUIRE(i < 10000000);
	REQUIRE(n == 1 && ctx[0] == &cq_ctx);
	REQUIRE(fi_poll(ps, ctx, 4) == 1 && ctx[0] == &cq_ctx);
	REQUIRE(fi_cq_read(s.cq, &e, 1) == 1 && strcmp(buf, "polled") == 0);
	REQUIRE(fi_poll(ps, ctx, 4) == 0);

	REQUIRE(fi_cntr_add(cntr, 1) == 0);
	REQUIRE(fi_poll(ps, ctx, 4) == 1 && ctx[0] == &cntr_ctx);
	REQUIRE(fi_poll(ps, ctx, 4) == 0);
	REQUIRE(fi_poll(ps, NULL, 0) == 0);
	REQUIRE(fi_poll(ps, NULL, 1) == -FI_EINVAL);

	REQUIRE(fi_poll_del(ps, &cntr->fid, 0) == 0);
	REQUIRE(fi_poll_del(ps, &cntr->fid, 0) == -FI_ENOENT);
	REQUIRE(fi_cntr_add(cntr, 1) == 0);
	REQUIRE(fi_poll(ps, ctx, 4) == 0);
	REQUIRE(fi_poll_add(ps, &cntr->fid, 0) == 0);
	REQUIRE(fi_close(&cntr->fid) == 0);
	REQUIRE(fi_poll(ps, ctx, 4) == 0);
	REQUIRE(fi_close(&ps->fid) == 0);
	two_finish(&s, 0);
	printf("poll_set: ok\n");
	return 0;
}
