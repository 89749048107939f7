/* A CPU thread's counter add through the C device header while nobody drives progress
 * (manual progress; the host thread only waits for it): the thread announces the add
 * (xf_xpu_notify, which the header's counter calls and fi_xpu_tx_flush make on a CPU thread)
 * and so applies it itself, and its wait on the counter ends. Before, the C header announced
 * nothing, and the add waited for a host read that never came. */
#include "two.h"
#include <pthread.h>
#include <xfabric/fi_xpu.h>
#include <xfabric/fi_xpu_device.h>

struct args {
	struct fid_xpu_ep ep;
	struct fid_xpu_cntr cntr;
	int add, flush, wait;
};

static void *xpu(void *p)
{
	struct args *a = p;
	a->add = fi_xpu_cntr_add(&a->cntr, 5, FI_XPU_WORK_ITEM);
	a->flush = fi_xpu_tx_flush(&a->ep, 0, FI_XPU_WORK_ITEM);
	a->wait = fi_xpu_cntr_wait(&a->cntr, 5, 10000, FI_XPU_WORK_ITEM);
	return NULL;
}

int main(void)
{
	alarm(60);
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	/* Nothing drives progress but the application's own calls, which it does not make. */
	open_domain_progress(FI_MSG | FI_TRIGGER | FI_XPU_TRIGGER, FI_CONTEXT | FI_CONTEXT2,
			     FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY,
			     FI_PROGRESS_MANUAL, &info, &fabric, &domain);
	struct fid_cq *cq;
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_DATA, .size = 16 };
	CHECK(fi_cq_open(domain, &cq_attr, &cq, NULL));
	struct fid_cntr *cntr;
	struct fi_cntr_attr cntr_attr = { .events = FI_CNTR_EVENTS_COMP };
	CHECK(fi_cntr_open(domain, &cntr_attr, &cntr, NULL));
	struct fid_av *av;
	struct fid_ep *ep;
	open_ep(domain, info, cq, &av, &ep);

	struct args a = { .add = 1, .flush = 1, .wait = 1 };
	CHECK(fi_ep_export_xpu(ep, 0, &a.ep));
	CHECK(fi_cntr_export_xpu(cntr, 0, &a.cntr));
	pthread_t t;
	if (pthread_create(&t, NULL, xpu, &a))
		FAIL("pthread_create");
	pthread_join(t, NULL);
	REQUIRE(a.add == 0);
	REQUIRE(a.flush == 0);
	if (a.wait != 0)
		FAIL("the XPU's wait on its own add ended %d", a.wait);
	REQUIRE(fi_cntr_read(cntr) == 5);

	CHECK(fi_close(&ep->fid));
	CHECK(fi_close(&av->fid));
	CHECK(fi_close(&cntr->fid));
	CHECK(fi_close(&cq->fid));
	close_domain(info, fabric, domain);
	printf("a CPU thread's counter add applied with nobody driving progress\n");
	return 0;
}
