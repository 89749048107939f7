/* A wait set opened with FI_WAIT_FD: fi_control(FI_GETWAIT) gives a descriptor that becomes
 * readable when a counter waiting on the set changes; fi_trywait on the set says -FI_EAGAIN
 * once for that change, then 0. */
#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPECT(cond)                                                                        \
	do {                                                                                \
		if (!(cond)) {                                                              \
			fprintf(stderr, "wait_set_fd: line %d: %s\n", __LINE__, #cond);     \
			return 1;                                                           \
		}                                                                           \
	} while (0)

static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, ms) == 1;
}

int main(void)
{
	struct fi_info *hints = fi_allocinfo(), *info;
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG;
	const char *prov = getenv("FI_PROVIDER");
	if (prov)
		hints->fabric_attr->prov_name = strdup(prov);
	EXPECT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info) == 0);
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	EXPECT(fi_fabric(info->fabric_attr, &fabric, NULL) == 0);
	EXPECT(fi_domain(fabric, info, &domain, NULL) == 0);
	struct fi_wait_attr wattr = { .wait_obj = FI_WAIT_FD };
	struct fid_wait *ws;
	EXPECT(fi_wait_open(fabric, &wattr, &ws) == 0);
	int fd = -1;
	EXPECT(fi_control(&ws->fid, FI_GETWAIT, &fd) == 0 && fd >= 0);
	struct fi_cntr_attr cattr = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_SET,
				      .wait_set = ws };
	struct fid_cntr *cntr;
	EXPECT(fi_cntr_open(domain, &cattr, &cntr, NULL) == 0);
	struct fid *fids[1] = { &ws->fid };
	EXPECT(fi_trywait(fabric, fids, 1) == 0);
	EXPECT(!readable(fd, 0));
	EXPECT(fi_cntr_add(cntr, 1) == 0);
	EXPECT(readable(fd, 1000));
	EXPECT(fi_trywait(fabric, fids, 1) == -FI_EAGAIN);
	EXPECT(fi_trywait(fabric, fids, 1) == 0);
	EXPECT(!readable(fd, 0));
	EXPECT(fi_close(&cntr->fid) == 0 && fi_close(&ws->fid) == 0);
	EXPECT(fi_close(&domain->fid) == 0 && fi_close(&fabric->fid) == 0);
	fi_freeinfo(info);
	fi_freeinfo(hints);
	printf("wait_set_fd: ok\n");
	return 0;
}
