/* A wait set opened with FI_WAIT_FD: fi_control(FI_GETWAIT) gives a descriptor that becomes
 * readable when a counter waiting on the set changes; fi_trywait on the set says -FI_EAGAIN
 * once for that change, then 0. */
#include "two.h"
#include <rdma/fi_eq.h>

int main(void)
{
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	open_domain(FI_MSG, 0, 0, &info, &fabric, &domain);
	struct fi_wait_attr wattr = { .wait_obj = FI_WAIT_FD };
	struct fid_wait *ws;
	REQUIRE(fi_wait_open(fabric, &wattr, &ws) == 0);
	int fd = -1;
	REQUIRE(fi_control(&ws->fid, FI_GETWAIT, &fd) == 0 && fd >= 0);
	struct fi_cntr_attr cattr = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_SET,
				      .wait_set = ws };
	struct fid_cntr *cntr;
	REQUIRE(fi_cntr_open(domain, &cattr, &cntr, NULL) == 0);
	struct fid *fids[1] = { &ws->fid };
	REQUIRE(fi_trywait(fabric, fids, 1) == 0);
	REQUIRE(!readable(fd, 0));
	REQUIRE(fi_cntr_add(cntr, 1) == 0);
	REQUIRE(readable(fd, 1000));
	REQUIRE(fi_trywait(fabric, fids, 1) == -FI_EAGAIN);
	REQUIRE(fi_trywait(fabric, fids, 1) == 0);
	REQUIRE(!readable(fd, 0));
	REQUIRE(fi_close(&cntr->fid) == 0 && fi_close(&ws->fid) == 0);
	close_domain(info, fabric, domain);
	printf("wait_set_fd: ok\n");
	return 0;
}
