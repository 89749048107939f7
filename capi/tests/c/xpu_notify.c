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
	struct fi_info *hints = fi_allocinfo(), *info;
	if (!hints)
		FAIL("fi_allocinfo");
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG | FI_TRIGGER | FI_XPU_TRIGGER;
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
				      FI_MR_PROV_KEY;
	/* Nothing drives progress but the application's own calls, which it does not make. */
	hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
	hints->domain_attr->control_progress = FI_PROGRESS_MANUAL;
	const char *prov = getenv("FI_PROVIDER");
	if (prov)
		hints->fabric_attr->prov_name = strdup(prov);
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
	fi_freeinfo(hints);
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
	CHECK(fi_domain(fabric, info, &domain, NULL));
	struct fid_cq *cq;
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_DATA, .size = 16 };
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
	CHECK(fi_enable(ep));

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
	CHECK(fi_close(&domain->fid));
	CHECK(fi_close(&fabric->fid));
	fi_freeinfo(info);
	printf("a CPU thread's counter add applied with nobody driving progress\n");
	return 0;
}
