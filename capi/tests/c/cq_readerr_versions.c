/* fi_cq_readerr and fi_cq_readfrom as a caller of each API version sees them.
 *  - Before API 1.5 the error entry ends at err_data, which is an output only: the library
 *    must read nothing of the caller's there and write no byte past that layout (a canary
 *    just after it must survive).
 *  - From 1.5, an error without data leaves the caller's err_data pointer as it was, with
 *    err_data_size 0 (libfabric keeps it; clearing it loses the caller's buffer).
 *  - fi_cq_readfrom with a null src_addr reads as fi_cq_read does. */
#include "two.h"

/* struct fi_cq_err_entry before API 1.5 (fi_cq_err_entry_1_0). */
struct err_1_0 {
	void *op_context;
	uint64_t flags;
	size_t len;
	void *buf;
	uint64_t data;
	uint64_t tag;
	size_t olen;
	int err;
	int prov_errno;
	void *err_data;
};

#define CANARY 0x1122334455667788ULL

/* Posts a receive under `ctx`, cancels it, and waits until the CQ holds its error. */
static void canceled_recv(struct fid_ep *ep, struct fid_cq *cq, struct fi_context *ctx)
{
	static char buf[64];
	CHECK(fi_recv(ep, buf, sizeof buf, NULL, FI_ADDR_UNSPEC, ctx));
	CHECK(fi_cancel(&ep->fid, ctx));
	await_error(cq);
}

/* A fabric, domain, CQ and endpoint opened under API `version`. */
static void open_all(uint32_t version, int mr_mode, struct fi_info **info,
		     struct fid_fabric **fabric, struct fid_domain **domain, struct fid_cq **cq,
		     struct fid_av **av, struct fid_ep **ep)
{
	struct fi_info *hints = fi_allocinfo();
	REQUIRE(hints);
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG;
	hints->mode = FI_CONTEXT;
	hints->domain_attr->mr_mode = mr_mode;
	const char *prov = getenv("FI_PROVIDER");
	if (prov)
		hints->fabric_attr->prov_name = strdup(prov);
	CHECK(fi_getinfo(version, NULL, NULL, 0, hints, info));
	fi_freeinfo(hints);
	CHECK(fi_fabric((*info)->fabric_attr, fabric, NULL));
	CHECK(fi_domain(*fabric, *info, domain, NULL));
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_CONTEXT, .size = 16 };
	CHECK(fi_cq_open(*domain, &cq_attr, cq, NULL));
	open_ep(*domain, *info, *cq, av, ep);
}

static void close_all(struct fi_info *info, struct fid_fabric *fabric, struct fid_domain *domain,
		      struct fid_cq *cq, struct fid_av *av, struct fid_ep *ep)
{
	CHECK(fi_close(&ep->fid));
	CHECK(fi_close(&av->fid));
	CHECK(fi_close(&cq->fid));
	close_domain(info, fabric, domain);
}

int main(void)
{
	alarm(60);
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_cq *cq;
	struct fid_av *av;
	struct fid_ep *ep;
	struct fi_context ctx;

	/* API 1.4: the old entry, and nothing written past it. */
	open_all(FI_VERSION(1, 4), FI_MR_SCALABLE, &info, &fabric, &domain, &cq, &av, &ep);
	canceled_recv(ep, cq, &ctx);
	struct {
		struct err_1_0 e;
		uint64_t canary;
	} old;
	memset(&old, 0xa5, sizeof old);
	old.canary = CANARY;
	REQUIRE(fi_cq_readerr(cq, (struct fi_cq_err_entry *)(void *)&old, 0) == 1);
	REQUIRE(old.canary == CANARY);
	REQUIRE(old.e.op_context == &ctx);
	REQUIRE(old.e.err == FI_ECANCELED);
	REQUIRE(old.e.err_data == NULL);
	close_all(info, fabric, domain, cq, av, ep);

	/* API 1.17: the caller's buffer stays its own when the error has no data. */
	open_all(FI_VERSION(1, 17), FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY,
		 &info, &fabric, &domain, &cq, &av, &ep);
	struct fi_cq_entry e;
	REQUIRE(fi_cq_readfrom(cq, &e, 1, NULL) == -FI_EAGAIN);
	canceled_recv(ep, cq, &ctx);
	char mine[32];
	struct fi_cq_err_entry err;
	memset(&err, 0, sizeof err);
	err.err_data = mine;
	err.err_data_size = sizeof mine;
	REQUIRE(fi_cq_readerr(cq, &err, 0) == 1);
	REQUIRE(err.op_context == &ctx);
	REQUIRE(err.err == FI_ECANCELED);
	REQUIRE(err.err_data == mine);
	REQUIRE(err.err_data_size == 0);
	/* The queue read empty again, through fi_cq_readfrom without a src_addr. */
	REQUIRE(fi_cq_readfrom(cq, &e, 1, NULL) == -FI_EAGAIN);
	close_all(info, fabric, domain, cq, av, ep);
	printf("cq_readerr_versions: ok\n");
	return 0;
}
