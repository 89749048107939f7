/* An XPU still using its handles after the host closed their objects (fi_xpu(3) asks it to
 * stop first; a kernel still running when the host tears down does not). The endpoint and the
 * CQ are exported with large rings (several MiB each, which the allocator maps and unmaps on
 * its own), a counter with its own, then all three are closed while the handles stay. Calls
 * through them must still find the shared memory: a post and a counter add answer
 * -FI_ESHUTDOWN (their rings are closed), a CQ read finds what the ring held. Before the memory was kept
 * until the domain closed, the first call read unmapped memory and the process died. The
 * domain then closes, and with it what was kept. */
#include "two.h"
#include <xfabric/fi_xpu.h>
#include <xfabric/fi_xpu_device.h>

int main(void)
{
	alarm(60);
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	uint64_t caps = FI_MSG | FI_TAGGED | FI_TRIGGER | FI_XPU_TRIGGER;
	open_domain(caps, FI_CONTEXT | FI_CONTEXT2,
		    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY, &info, &fabric,
		    &domain);
	struct fid_cq *cq;
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_DATA, .size = 256 };
	CHECK(fi_cq_open(domain, &cq_attr, &cq, NULL));
	struct fid_cntr *cntr;
	struct fi_cntr_attr cntr_attr = { .events = FI_CNTR_EVENTS_COMP };
	CHECK(fi_cntr_open(domain, &cntr_attr, &cntr, NULL));
	struct fid_av *av;
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	CHECK(fi_av_open(domain, &av_attr, &av, NULL));
	struct fid_ep *ep;
	CHECK(fi_endpoint(domain, info, &ep, NULL));
	CHECK(fi_ep_bind(ep, &av->fid, 0));
	CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
	CHECK(fi_ep_bind(ep, &cntr->fid, FI_SEND));
	CHECK(fi_enable(ep));

	/* 65536 slots of 64 bytes: 4 MiB each, above any allocator's threshold for a mapping
	 * of its own, so memory handed back is unmapped, not kept in a free list. */
	struct xf_xpu_attr big = { .iface = FI_HMEM_SYSTEM, .slots = 65536 };
	struct fid_xpu_ep xep;
	struct fid_xpu_cq xcq;
	struct fid_xpu_cntr xcntr;
	CHECK(xf_ep_export_xpu(ep, &big, 0, &xep));
	CHECK(xf_cq_export_xpu(cq, &big, 0, &xcq));
	CHECK(fi_cntr_export_xpu(cntr, 0, &xcntr));
	char name[64];
	size_t len = sizeof name;
	CHECK(fi_getname(&ep->fid, name, &len));
	fi_addr_t self;
	REQUIRE(fi_av_insert(av, name, 1, &self, 0, NULL) == 1);
	uint64_t peer = 0, desc = 0;
	len = sizeof peer;
	CHECK(fi_av_get_xpu_addr(av, self, &peer, &len));
	char buf[8] = "late";

	/* Open: a send posts. */
	REQUIRE(fi_xpu_send(&xep, buf, 0, &desc, 0, &peer, NULL, 0, FI_XPU_WORK_ITEM) == 0);

	CHECK(fi_close(&ep->fid));
	CHECK(fi_close(&av->fid));
	CHECK(fi_close(&cq->fid));
	CHECK(fi_close(&cntr->fid));

	/* Closed, every object: the handles still reach memory that is there. */
	REQUIRE(fi_xpu_send(&xep, buf, 0, &desc, 0, &peer, NULL, 0, FI_XPU_WORK_ITEM) ==
		-FI_ESHUTDOWN);
	struct fi_cq_data_entry e[4];
	/* What the ring held: the send's completion or its cancellation at close, or nothing. */
	int64_t r = fi_xpu_cq_read(&xcq, e, 4, FI_XPU_WORK_ITEM);
	if (!(r == -FI_EAGAIN || r == -FI_EAVAIL || r >= 0))
		FAIL("fi_xpu_cq_read after close: %lld", (long long)r);
	r = fi_xpu_cntr_add(&xcntr, 1, FI_XPU_WORK_ITEM);
	if (r != -FI_ESHUTDOWN)
		FAIL("fi_xpu_cntr_add after close: %lld", (long long)r);
	(void)fi_xpu_cntr_read(&xcntr, FI_XPU_WORK_ITEM);

	close_domain(info, fabric, domain);
	printf("late calls after close: closed rings, a CQ ring still there\n");
	return 0;
}
