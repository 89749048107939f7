/* fi_cq_readerr's error data: with err_data_size 0 on input the entry points at the queue's
 * own copy (fi_cq(3)'s compatibility rule: valid until the next read), with a buffer of the
 * caller's the data is copied there, cut to its size. The error: a descriptor with an opcode
 * nobody defines, posted through an exported endpoint whose CQ is the host's. Before, a
 * caller that gave no room got no error data at all. */
#include "two.h"
#include <xfabric/fi_xpu.h>
#include <xfabric/fi_xpu_device.h>

#define HOSTILE 0x77

/* Posts a descriptor with an undefined opcode under `ctx` and waits for its error entry. */
static void fault(struct fid_xpu_ep *xep, struct fid_cq *cq, void *ctx)
{
	struct xf_xpu_desc d;
	memset(&d, 0, sizeof d);
	d.opcode = HOSTILE;
	d.context = (uint64_t)(uintptr_t)ctx;
	REQUIRE(xf_xpu_post_desc(xep, &d, FI_XPU_WORK_ITEM) == 0);
	await_error(cq);
}

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
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_DATA, .size = 64 };
	CHECK(fi_cq_open(domain, &cq_attr, &cq, NULL));
	struct fid_av *av;
	struct fid_ep *ep;
	open_ep(domain, info, cq, &av, &ep);
	struct xf_xpu_attr attr = { .iface = FI_HMEM_SYSTEM, .slots = 16 };
	struct fid_xpu_ep xep;
	CHECK(xf_ep_export_xpu(ep, &attr, 0, &xep));
	int ctx[2];

	/* No room given: the queue's own copy. */
	fault(&xep, cq, &ctx[0]);
	struct fi_cq_err_entry err;
	memset(&err, 0, sizeof err);
	REQUIRE(fi_cq_readerr(cq, &err, 0) == 1);
	REQUIRE(err.op_context == &ctx[0]);
	REQUIRE(err.err_data != NULL);
	REQUIRE(err.err_data_size > 0);
	REQUIRE(memmem(err.err_data, err.err_data_size, "opcode", 6) != NULL);

	/* A buffer of 8 bytes: the data copied there, cut to 8. */
	fault(&xep, cq, &ctx[1]);
	char mine[8];
	memset(&err, 0, sizeof err);
	err.err_data = mine;
	err.err_data_size = sizeof mine;
	REQUIRE(fi_cq_readerr(cq, &err, 0) == 1);
	REQUIRE(err.op_context == &ctx[1]);
	REQUIRE(err.err_data == mine);
	REQUIRE(err.err_data_size == sizeof mine);

	CHECK(fi_close(&ep->fid));
	CHECK(fi_close(&av->fid));
	CHECK(fi_close(&cq->fid));
	close_domain(info, fabric, domain);
	printf("error data given back both ways\n");
	return 0;
}
