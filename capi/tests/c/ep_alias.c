/* fi_ep_alias through the C ABI: an alias of an endpoint whose transmit CQ is bound with
 * FI_SELECTIVE_COMPLETION, opened with FI_TRANSMIT | FI_COMPLETION, gives completions for
 * its sends while the endpoint's own sends give none; both reach the peer. The alias is an
 * FI_CLASS_EP fid answering to the endpoint's context; flags naming no direction are
 * -FI_EINVAL; closing the alias leaves the endpoint working. */
#include "two.h"
#include <time.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The next entry of cq within 5 s: 1, or 0 when none came (-1 on an error). */
static int next(struct fid_cq *cq, struct fi_cq_entry *e, double within)
{
	double end = now() + within;
	do {
		ssize_t r = fi_cq_read(cq, e, 1);
		if (r == 1)
			return 1;
		if (r != -FI_EAGAIN)
			return -1;
	} while (now() < end);
	return 0;
}

int main(void)
{
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	open_domain(FI_MSG, 0, FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY,
		    &info, &fabric, &domain);
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	struct fid_av *av;
	REQUIRE(fi_av_open(domain, &av_attr, &av, NULL) == 0);
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_CONTEXT };
	struct fid_cq *txcq, *rxcq;
	REQUIRE(fi_cq_open(domain, &cq_attr, &txcq, NULL) == 0);
	REQUIRE(fi_cq_open(domain, &cq_attr, &rxcq, NULL) == 0);

	int a_ctx, b_ctx;
	struct fid_ep *a, *b;
	REQUIRE(fi_endpoint(domain, info, &a, &a_ctx) == 0);
	REQUIRE(fi_endpoint(domain, info, &b, &b_ctx) == 0);
	REQUIRE(fi_ep_bind(a, &av->fid, 0) == 0 && fi_ep_bind(b, &av->fid, 0) == 0);
	REQUIRE(fi_ep_bind(a, &txcq->fid, FI_TRANSMIT | FI_SELECTIVE_COMPLETION) == 0);
	REQUIRE(fi_ep_bind(a, &rxcq->fid, FI_RECV) == 0);
	REQUIRE(fi_ep_bind(b, &rxcq->fid, FI_TRANSMIT | FI_RECV) == 0);
	REQUIRE(fi_enable(a) == 0 && fi_enable(b) == 0);
	char name[256];
	size_t len = sizeof name;
	REQUIRE(fi_getname(&b->fid, name, &len) == 0);
	fi_addr_t to_b;
	REQUIRE(fi_av_insert(av, name, 1, &to_b, 0, NULL) == 1);

	struct fid_ep *alias = NULL;
	REQUIRE(fi_ep_alias(a, &alias, 0) == -FI_EINVAL);
	REQUIRE(fi_ep_alias(a, &alias, FI_TRANSMIT | FI_COMPLETION) == 0 && alias);
	REQUIRE(alias->fid.fclass == FI_CLASS_EP && alias->fid.context == &a_ctx);

	static char rx[3][8];
	for (int i = 0; i < 3; i++)
		REQUIRE(fi_recv(b, rx[i], sizeof rx[i], NULL, FI_ADDR_UNSPEC, &rx[i]) == 0);
	static char m0[8] = "plain", m1[8] = "alias", m2[8] = "after";
	struct fi_cq_entry e;

	/* The endpoint's own send: delivered, no transmit completion (selective). */
	REQUIRE(fi_send(a, m0, sizeof m0, NULL, to_b, m0) == 0);
	REQUIRE(next(rxcq, &e, 5) == 1 && e.op_context == rx[0] && !strcmp(rx[0], "plain"));
	REQUIRE(next(txcq, &e, 0.2) == 0);

	/* Through the alias: FI_COMPLETION is its default, so its send completes. */
	REQUIRE(fi_send(alias, m1, sizeof m1, NULL, to_b, m1) == 0);
	REQUIRE(next(rxcq, &e, 5) == 1 && e.op_context == rx[1] && !strcmp(rx[1], "alias"));
	REQUIRE(next(txcq, &e, 5) == 1 && e.op_context == m1);

	/* Closing the alias leaves the endpoint open. */
	REQUIRE(fi_close(&alias->fid) == 0);
	REQUIRE(fi_send(a, m2, sizeof m2, NULL, to_b, m2) == 0);
	REQUIRE(next(rxcq, &e, 5) == 1 && e.op_context == rx[2] && !strcmp(rx[2], "after"));
	REQUIRE(next(txcq, &e, 0.2) == 0);

	REQUIRE(fi_close(&a->fid) == 0 && fi_close(&b->fid) == 0);
	REQUIRE(fi_close(&txcq->fid) == 0 && fi_close(&rxcq->fid) == 0);
	REQUIRE(fi_close(&av->fid) == 0);
	close_domain(info, fabric, domain);
	printf("ep_alias: ok\n");
	return 0;
}
