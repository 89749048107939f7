/* fi_ep_alias through the C ABI: an alias of an endpoint whose transmit CQ is bound with
 * FI_SELECTIVE_COMPLETION, opened with FI_TRANSMIT | FI_COMPLETION, gives completions for
 * its sends while the endpoint's own sends give none; both reach the peer. The alias is an
 * FI_CLASS_EP fid answering to the endpoint's context; flags naming no direction are
 * -FI_EINVAL; closing the alias leaves the endpoint working. */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPECT(cond)                                                                        \
	do {                                                                                \
		if (!(cond)) {                                                              \
			fprintf(stderr, "ep_alias: line %d: %s\n", __LINE__, #cond);        \
			return 1;                                                           \
		}                                                                           \
	} while (0)

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
	struct fi_info *hints = fi_allocinfo(), *info;
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
				      FI_MR_PROV_KEY;
	const char *prov = getenv("FI_PROVIDER");
	if (prov)
		hints->fabric_attr->prov_name = strdup(prov);
	EXPECT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info) == 0);
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	EXPECT(fi_fabric(info->fabric_attr, &fabric, NULL) == 0);
	EXPECT(fi_domain(fabric, info, &domain, NULL) == 0);
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	struct fid_av *av;
	EXPECT(fi_av_open(domain, &av_attr, &av, NULL) == 0);
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_CONTEXT };
	struct fid_cq *txcq, *rxcq;
	EXPECT(fi_cq_open(domain, &cq_attr, &txcq, NULL) == 0);
	EXPECT(fi_cq_open(domain, &cq_attr, &rxcq, NULL) == 0);

	int a_ctx, b_ctx;
	struct fid_ep *a, *b;
	EXPECT(fi_endpoint(domain, info, &a, &a_ctx) == 0);
	EXPECT(fi_endpoint(domain, info, &b, &b_ctx) == 0);
	EXPECT(fi_ep_bind(a, &av->fid, 0) == 0 && fi_ep_bind(b, &av->fid, 0) == 0);
	EXPECT(fi_ep_bind(a, &txcq->fid, FI_TRANSMIT | FI_SELECTIVE_COMPLETION) == 0);
	EXPECT(fi_ep_bind(a, &rxcq->fid, FI_RECV) == 0);
	EXPECT(fi_ep_bind(b, &rxcq->fid, FI_TRANSMIT | FI_RECV) == 0);
	EXPECT(fi_enable(a) == 0 && fi_enable(b) == 0);
	char name[256];
	size_t len = sizeof name;
	EXPECT(fi_getname(&b->fid, name, &len) == 0);
	fi_addr_t to_b;
	EXPECT(fi_av_insert(av, name, 1, &to_b, 0, NULL) == 1);

	struct fid_ep *alias = NULL;
	EXPECT(fi_ep_alias(a, &alias, 0) == -FI_EINVAL);
	EXPECT(fi_ep_alias(a, &alias, FI_TRANSMIT | FI_COMPLETION) == 0 && alias);
	EXPECT(alias->fid.fclass == FI_CLASS_EP && alias->fid.context == &a_ctx);

	static char rx[3][8];
	for (int i = 0; i < 3; i++)
		EXPECT(fi_recv(b, rx[i], sizeof rx[i], NULL, FI_ADDR_UNSPEC, &rx[i]) == 0);
	static char m0[8] = "plain", m1[8] = "alias", m2[8] = "after";
	struct fi_cq_entry e;

	/* The endpoint's own send: delivered, no transmit completion (selective). */
	EXPECT(fi_send(a, m0, sizeof m0, NULL, to_b, m0) == 0);
	EXPECT(next(rxcq, &e, 5) == 1 && e.op_context == rx[0] && !strcmp(rx[0], "plain"));
	EXPECT(next(txcq, &e, 0.2) == 0);

	/* Through the alias: FI_COMPLETION is its default, so its send completes. */
	EXPECT(fi_send(alias, m1, sizeof m1, NULL, to_b, m1) == 0);
	EXPECT(next(rxcq, &e, 5) == 1 && e.op_context == rx[1] && !strcmp(rx[1], "alias"));
	EXPECT(next(txcq, &e, 5) == 1 && e.op_context == m1);

	/* Closing the alias leaves the endpoint open. */
	EXPECT(fi_close(&alias->fid) == 0);
	EXPECT(fi_send(a, m2, sizeof m2, NULL, to_b, m2) == 0);
	EXPECT(next(rxcq, &e, 5) == 1 && e.op_context == rx[2] && !strcmp(rx[2], "after"));
	EXPECT(next(txcq, &e, 0.2) == 0);

	EXPECT(fi_close(&a->fid) == 0 && fi_close(&b->fid) == 0);
	EXPECT(fi_close(&txcq->fid) == 0 && fi_close(&rxcq->fid) == 0);
	EXPECT(fi_close(&av->fid) == 0);
	EXPECT(fi_close(&domain->fid) == 0 && fi_close(&fabric->fid) == 0);
	fi_freeinfo(info);
	fi_freeinfo(hints);
	printf("ep_alias: ok\n");
	return 0;
}
