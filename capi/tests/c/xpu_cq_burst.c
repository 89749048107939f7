/* A burst of completions larger than an exported CQ's ring, read by a CPU XPU through the
 * header's fi_xpu_cq_read while the host only drives progress (fi_cq_read of 0 entries): the
 * ring has 2 slots, the burst 8 entries, so 6 wait in the host queue and must move into the
 * ring as the XPU makes room. Every entry must reach the XPU, each once, in order. */
#include "two.h"
#include <xfabric/fi_xpu.h>
#include <xfabric/fi_xpu_device.h>

#define N 4 /* receives, and sends to self: 2 N completions */

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
	struct xf_xpu_attr small = { .iface = FI_HMEM_SYSTEM, .slots = 2 };
	struct fid_xpu_cq xcq;
	CHECK(xf_cq_export_xpu(cq, &small, 0, &xcq));
	char name[64];
	size_t len = sizeof name;
	CHECK(fi_getname(&ep->fid, name, &len));
	fi_addr_t self;
	REQUIRE(fi_av_insert(av, name, 1, &self, 0, NULL) == 1);

	static char rx[N][8], tx[N][8];
	static struct fi_context2 ctx[2 * N];
	for (int i = 0; i < N; i++)
		CHECK(fi_recv(ep, rx[i], sizeof rx[i], NULL, self, &ctx[i]));
	for (int i = 0; i < N; i++) {
		snprintf(tx[i], sizeof tx[i], "m%d", i);
		CHECK(fi_send(ep, tx[i], sizeof tx[i], NULL, self, &ctx[N + i]));
	}
	int seen[2 * N] = { 0 };
	int got = 0;
	for (long spins = 0; got < 2 * N; spins++) {
		if (spins > 10000000)
			FAIL("the XPU got %d of %d completions", got, 2 * N);
		struct fi_cq_data_entry e[4];
		int64_t r = fi_xpu_cq_read(&xcq, e, 4, FI_XPU_WORK_ITEM);
		if (r == -FI_EAGAIN) {
			struct fi_cq_data_entry none;
			/* count 0 only drives progress: the entries stay for the XPU's ring. */
			fi_cq_read(cq, &none, 0);
			continue;
		}
		REQUIRE(r > 0 && r <= 2);
		for (int i = 0; i < r; i++) {
			long k = (struct fi_context2 *)e[i].op_context - ctx;
			REQUIRE(k >= 0 && k < 2 * N && !seen[k]);
			seen[k] = 1;
		}
		got += (int)r;
	}
	for (int i = 0; i < N; i++)
		REQUIRE(strcmp(rx[i], tx[i]) == 0);
	printf("the XPU read %d completions through a ring of 2\n", got);
	CHECK(fi_close(&ep->fid));
	CHECK(fi_close(&av->fid));
	CHECK(fi_close(&cq->fid));
	close_domain(info, fabric, domain);
	return 0;
}
