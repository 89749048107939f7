/* What a careless caller of wait objects and event queues gets, each as libfabric gives it:
 * fi_cq_signal wakes a thread on the queue's descriptor and one in fi_wait on its wait set;
 * an attribute's wait_set is ignored unless wait_obj is FI_WAIT_SET (a set closed since, or
 * garbage, is never looked at); fi_eq_write keeps any event structure whole, and a read
 * gets as much of it as its buffer holds (fi_eq(3)); fi_eq_sread on a queue without a
 * wait object is -FI_ENOSYS; a wait set of FI_WAIT_NONE, or with flags, is -FI_EINVAL;
 * FI_GETWAITOBJ says what an object waits with, and a set's member's FI_GETWAIT is its
 * set's descriptor. */
#include "two.h"
#include <rdma/fi_eq.h>

int main(void)
{
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	open_domain(FI_MSG, 0, 0, &info, &fabric, &domain);

	/* fi_cq_signal on a queue waited on through its descriptor. */
	struct fi_cq_attr qattr = { .format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_FD };
	struct fid_cq *cq;
	REQUIRE(fi_cq_open(domain, &qattr, &cq, NULL) == 0);
	int fd = -1;
	REQUIRE(fi_control(&cq->fid, FI_GETWAIT, &fd) == 0 && fd >= 0);
	enum fi_wait_obj kind = FI_WAIT_NONE;
	REQUIRE(fi_control(&cq->fid, FI_GETWAITOBJ, &kind) == 0 && kind == FI_WAIT_FD);
	struct fid *fids[1] = { &cq->fid };
	REQUIRE(fi_trywait(fabric, fids, 1) == 0);
	REQUIRE(!readable(fd, 0));
	REQUIRE(fi_cq_signal(cq) == 0);
	REQUIRE(readable(fd, 1000));
	REQUIRE(fi_close(&cq->fid) == 0);

	/* fi_cq_signal on a queue waited on through its wait set. */
	struct fi_wait_attr wattr = { .wait_obj = FI_WAIT_UNSPEC };
	struct fid_wait *ws;
	REQUIRE(fi_wait_open(fabric, &wattr, &ws) == 0);
	struct fi_cq_attr sattr = { .format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_SET,
				    .wait_set = ws };
	REQUIRE(fi_cq_open(domain, &sattr, &cq, NULL) == 0);
	REQUIRE(fi_wait(ws, 0) == -FI_ETIMEDOUT);
	REQUIRE(fi_cq_signal(cq) == 0);
	REQUIRE(fi_wait(ws, 1000) == 0);
	REQUIRE(fi_wait(ws, 0) == -FI_ETIMEDOUT);
	REQUIRE(fi_control(&cq->fid, FI_GETWAITOBJ, &kind) == 0 && kind == FI_WAIT_UNSPEC);
	REQUIRE(fi_control(&cq->fid, FI_GETWAIT, &fd) < 0);
	REQUIRE(fi_close(&cq->fid) == 0 && fi_close(&ws->fid) == 0);

	/* A member of a set waited on through a descriptor: FI_GETWAIT gives the set's, which the
	 * member's events ring, and FI_GETWAITOBJ says FI_WAIT_FD (libfabric forwards both). */
	struct fi_wait_attr fdattr = { .wait_obj = FI_WAIT_FD };
	REQUIRE(fi_wait_open(fabric, &fdattr, &ws) == 0);
	int setfd = -1, memberfd = -1;
	REQUIRE(fi_control(&ws->fid, FI_GETWAIT, &setfd) == 0 && setfd >= 0);
	REQUIRE(fi_control(&ws->fid, FI_GETWAITOBJ, &kind) == 0 && kind == FI_WAIT_FD);
	sattr.wait_set = ws;
	REQUIRE(fi_cq_open(domain, &sattr, &cq, NULL) == 0);
	REQUIRE(fi_control(&cq->fid, FI_GETWAIT, &memberfd) == 0 && memberfd == setfd);
	REQUIRE(fi_control(&cq->fid, FI_GETWAITOBJ, &kind) == 0 && kind == FI_WAIT_FD);
	struct fid *sfids[1] = { &ws->fid };
	REQUIRE(fi_trywait(fabric, sfids, 1) == 0);
	REQUIRE(!readable(setfd, 0));
	REQUIRE(fi_cq_signal(cq) == 0);
	REQUIRE(readable(setfd, 1000));
	REQUIRE(fi_close(&cq->fid) == 0 && fi_close(&ws->fid) == 0);

	/* A wait_set field left over (here garbage) with another wait object: ignored. */
	static uint64_t junk[8] = { 0xdeadbeef, 0xdeadbeef, 0xdeadbeef, 0xdeadbeef };
	struct fi_cq_attr jq = { .format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_UNSPEC,
				 .wait_set = (struct fid_wait *)junk };
	REQUIRE(fi_cq_open(domain, &jq, &cq, NULL) == 0);
	REQUIRE(fi_close(&cq->fid) == 0);
	struct fi_cntr_attr jc = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_UNSPEC,
				   .wait_set = (struct fid_wait *)junk };
	struct fid_cntr *cntr;
	REQUIRE(fi_cntr_open(domain, &jc, &cntr, NULL) == 0);
	REQUIRE(fi_close(&cntr->fid) == 0);
	struct fi_eq_attr je = { .wait_obj = FI_WAIT_UNSPEC, .wait_set = (struct fid_wait *)junk };
	struct fid_eq *eq;
	REQUIRE(fi_eq_open(fabric, &je, &eq, NULL) == 0);

	/* Events of any structure and length, back whole. */
	unsigned char big[64], got[64];
	for (int i = 0; i < 64; i++)
		big[i] = (unsigned char)(i * 7 + 1);
	uint32_t event = 0;
	REQUIRE(fi_eq_write(eq, FI_NOTIFY, big, sizeof big, 0) == sizeof big);
	memset(got, 0, sizeof got);
	REQUIRE(fi_eq_read(eq, &event, got, sizeof got, 0) == sizeof big);
	REQUIRE(event == FI_NOTIFY && memcmp(big, got, sizeof big) == 0);
	REQUIRE(fi_eq_write(eq, FI_NOTIFY, big, sizeof big, 0) == sizeof big);
	memset(got, 0, sizeof got);
	REQUIRE(fi_eq_read(eq, &event, got, 32, 0) == 32);
	REQUIRE(memcmp(big, got, 32) == 0 && got[32] == 0);
	struct fi_eq_cm_entry cm = { .fid = &eq->fid };
	REQUIRE(fi_eq_write(eq, FI_SHUTDOWN, &cm, sizeof cm, 0) == sizeof cm);
	struct fi_eq_cm_entry cm_got;
	memset(&cm_got, 0, sizeof cm_got);
	REQUIRE(fi_eq_sread(eq, &event, &cm_got, sizeof cm_got, 1000, 0) == sizeof cm);
	REQUIRE(event == FI_SHUTDOWN && cm_got.fid == &eq->fid);
	REQUIRE(fi_eq_read(eq, &event, got, sizeof got, 0) == -FI_EAGAIN);
	REQUIRE(fi_close(&eq->fid) == 0);

	struct fi_eq_attr none = { .wait_obj = FI_WAIT_NONE };
	REQUIRE(fi_eq_open(fabric, &none, &eq, NULL) == 0);
	REQUIRE(fi_eq_sread(eq, &event, got, sizeof got, 0, 0) == -FI_ENOSYS);
	REQUIRE(fi_close(&eq->fid) == 0);

	struct fi_wait_attr wnone = { .wait_obj = FI_WAIT_NONE };
	REQUIRE(fi_wait_open(fabric, &wnone, &ws) == -FI_EINVAL);
	struct fi_wait_attr wflags = { .wait_obj = FI_WAIT_UNSPEC, .flags = 1 };
	REQUIRE(fi_wait_open(fabric, &wflags, &ws) == -FI_EINVAL);

	close_domain(info, fabric, domain);
	printf("wait_careless: ok\n");
	return 0;
}
