/* Calls a careless or hostile C caller makes, each answered with an error code or the right
 * result instead of a crash:
 * - objects closed out of order: a domain or fabric with objects still open, a CQ, counter
 *   or AV bound to an endpoint not yet enabled: -FI_EBUSY, as libfabric answers;
 * - fi_cq_sread with its threshold passed as the value of `cond`, as fi_cq(3) says and
 *   libfabric's providers read it ((void *)1, (void *)4): it was read through as a pointer,
 *   a SIGSEGV at address 1;
 * - lengths and counts no buffer can have (SIZE_MAX for a send, (size_t)-1 entries for a CQ
 *   read): a slice past isize::MAX aborted the process before any check ran;
 * - hints whose src_addrlen is 2^45: the copy's allocation aborted the process (and a failed
 *   fi_getinfo hands back no list);
 * - fi_mr_reg of a NULL buffer with a length, for remote write: it was accepted, and a
 *   peer's write with its key would have landed at address 0; FI_RMA_EVENT as a flag and
 *   FI_COLLECTIVE as access, which fi_mr(3) allows on any registration, were refused;
 * - fi_getopt(FI_OPT_XPU_TRIGGER) with a short optlen: -FI_ETOOSMALL, and the size it takes
 *   written back;
 * - an FI_SYNC_ERR status array not aligned for int: it was written as aligned (an abort in
 *   a debug build). */
#include "two.h"
#include <netinet/in.h>
#include <rdma/fi_trigger.h>

int main(void)
{
	alarm(60);
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	open_domain(FI_MSG | FI_RMA | FI_TRIGGER | FI_XPU_TRIGGER, FI_CONTEXT | FI_CONTEXT2,
		    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY, &info, &fabric,
		    &domain);

	/* A CQ with a threshold condition, and one without, each with a wait object. */
	struct fid_cq *cq, *cq_none;
	struct fi_cq_attr attr = { .format = FI_CQ_FORMAT_CONTEXT,
				   .size = 64,
				   .wait_obj = FI_WAIT_UNSPEC,
				   .wait_cond = FI_CQ_COND_THRESHOLD };
	CHECK(fi_cq_open(domain, &attr, &cq, NULL));
	attr.wait_cond = FI_CQ_COND_NONE;
	CHECK(fi_cq_open(domain, &attr, &cq_none, NULL));
	struct fid_av *av;
	struct fid_ep *ep;
	open_ep(domain, info, cq, &av, &ep);
	char name[64];
	size_t len = sizeof name;
	CHECK(fi_getname(&ep->fid, name, &len));
	fi_addr_t self;
	REQUIRE(fi_av_insert(av, name, 1, &self, 0, NULL) == 1);

	/* Two messages to itself, then a blocking read with a threshold of 1, then of 4 with
	 * one left (it returns at the timeout with what there is). */
	struct fi_context2 ctx[4];
	char rx[2][8], tx[2][8] = { "one", "two" };
	for (int i = 0; i < 2; i++)
		CHECK(fi_recv(ep, rx[i], sizeof rx[i], NULL, FI_ADDR_UNSPEC, &ctx[i]));
	for (int i = 0; i < 2; i++)
		CHECK(fi_send(ep, tx[i], sizeof tx[i], NULL, self, &ctx[2 + i]));
	struct fi_cq_entry e[8];
	int got = 0;
	while (got < 4) {
		ssize_t n = fi_cq_sread(cq, e, 1, (void *)1, 1000);
		REQUIRE(n == 1 || n == -FI_EAGAIN);
		if (n > 0)
			got += (int)n;
	}
	/* Nothing left: a threshold of 4 passed as a value waits its 10 ms and says so. */
	ssize_t n = fi_cq_sread(cq, e, 8, (void *)4, 10);
	REQUIRE(n == -FI_EAGAIN);
	/* Under FI_CQ_COND_NONE cond is ignored, whatever it holds. */
	n = fi_cq_sread(cq_none, e, 1, (void *)0x10, 10);
	REQUIRE(n == -FI_EAGAIN);

	/* No entries asked for, as libfabric answers it: -FI_EAGAIN on an empty queue, with
	 * no buffer at all too. */
	n = fi_cq_read(cq, NULL, 0);
	REQUIRE(n == -FI_EAGAIN);

	/* Counts and lengths past any buffer. */
	n = fi_cq_read(cq, e, (size_t)-1);
	REQUIRE(n == -FI_EAGAIN);
	n = fi_send(ep, tx[0], SIZE_MAX, NULL, self, &ctx[0]);
	REQUIRE(n == -FI_EMSGSIZE);
	n = fi_recv(ep, rx[0], SIZE_MAX, NULL, FI_ADDR_UNSPEC, &ctx[0]);
	REQUIRE(n == -FI_EMSGSIZE);
	REQUIRE(fi_av_remove(av, &self, (size_t)1 << 60, 0) < 0);

	/* An FI_SYNC_ERR status array that is not aligned for int: the statuses written. */
	char statuses[1 + sizeof(int)];
	fi_addr_t again;
	REQUIRE(fi_av_insert(av, name, 1, &again, FI_SYNC_ERR, statuses + 1) == 1);
	int status;
	memcpy(&status, statuses + 1, sizeof status);
	REQUIRE(status == 0);

	/* Hints with an address length no address has. */
	struct fi_info *hints = fi_allocinfo(), *out = NULL;
	REQUIRE(hints);
	struct sockaddr_in sin = { .sin_family = AF_INET };
	hints->ep_attr->type = FI_EP_RDM;
	hints->addr_format = FI_SOCKADDR_IN;
	hints->src_addr = malloc(sizeof sin);
	memcpy(hints->src_addr, &sin, sizeof sin);
	hints->src_addrlen = (size_t)1 << 45;
	/* A failed call hands back no list (a stale pointer would be freed twice). */
	out = (struct fi_info *)1;
	REQUIRE(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &out) == -FI_EINVAL);
	REQUIRE(out == NULL);
	hints->src_addrlen = sizeof sin;
	fi_freeinfo(hints);

	/* A NULL buffer with a length, for a peer to write. */
	struct fid_mr *mr = NULL;
	REQUIRE(fi_mr_reg(domain, NULL, 4096, FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL) == -FI_EINVAL);
	REQUIRE(mr == NULL);
	/* fi_fabric without a provider's name, or with one this library has not. */
	struct fi_fabric_attr fa = *info->fabric_attr;
	struct fid_fabric *fab2;
	fa.prov_name = NULL;
	REQUIRE(fi_fabric(&fa, &fab2, NULL) == -FI_EINVAL);
	fa.prov_name = "no-such-provider";
	REQUIRE(fi_fabric(&fa, &fab2, NULL) == -FI_ENODEV);
	/* Flags and access fi_mr(3) allows on any registration. */
	static char region[4096];
	REQUIRE(fi_mr_reg(domain, region, sizeof region, FI_REMOTE_WRITE, 0, 0, FI_RMA_EVENT, &mr,
			  NULL) == 0);
	REQUIRE(fi_close(&mr->fid) == 0);
	REQUIRE(fi_mr_reg(domain, region, sizeof region, FI_SEND | FI_COLLECTIVE, 0, 0, 0, &mr,
			  NULL) == 0);
	REQUIRE(fi_close(&mr->fid) == 0);
	/* fi_mr_regattr with the device fields left unset (garbage), in a domain without
	 * FI_HMEM: host memory, as libfabric reads it. */
	struct fi_mr_attr ma;
	memset(&ma, 0xa5, sizeof ma);
	struct iovec riov = { .iov_base = region, .iov_len = sizeof region };
	ma.mr_iov = &riov;
	ma.iov_count = 1;
	ma.access = FI_REMOTE_READ;
	ma.offset = 0;
	ma.requested_key = 0;
	ma.context = NULL;
	ma.auth_key_size = 0;
	ma.auth_key = NULL;
	if (!(info->caps & FI_HMEM)) {
		REQUIRE(fi_mr_regattr(domain, &ma, 0, &mr) == 0);
		REQUIRE(fi_close(&mr->fid) == 0);
	}
	mr = NULL;

	/* FI_OPT_MIN_MULTI_RECV reads back what was set (it was -FI_ENOPROTOOPT), and a short
	 * optlen gets the size it takes. */
	size_t min = 100, min_got = 0, glen = sizeof min_got;
	CHECK(fi_setopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min, sizeof min));
	CHECK(fi_getopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min_got, &glen));
	REQUIRE(min_got == 100 && glen == sizeof min_got);
	glen = 1;
	REQUIRE(fi_getopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min_got, &glen) ==
		-FI_ETOOSMALL);
	REQUIRE(glen == sizeof min_got);

	/* fi_getopt with a short optlen: the size it takes comes back. */
	struct fi_trigger_xpu t;
	size_t optlen = 1;
	REQUIRE(fi_getopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_XPU_TRIGGER, &t, &optlen) ==
		-FI_ETOOSMALL);
	REQUIRE(optlen == sizeof t);

	/* Closing out of order: a parent with objects still open answers -FI_EBUSY and stays
	 * usable, as libfabric's do (it used to close, leaving the endpoint without the domain's
	 * progress); a CQ, counter or AV bound to an endpoint not enabled yet is held from the
	 * bind, not the enable. */
	REQUIRE(fi_close(&domain->fid) == -FI_EBUSY);
	REQUIRE(fi_close(&fabric->fid) == -FI_EBUSY);
	struct fid_ep *later;
	struct fid_cntr *cntr;
	struct fid_cq *cq_later;
	struct fid_av *av_later;
	struct fi_cntr_attr cattr = { .events = FI_CNTR_EVENTS_COMP };
	struct fi_av_attr aattr = { .type = FI_AV_UNSPEC };
	attr.wait_obj = FI_WAIT_NONE;
	CHECK(fi_endpoint(domain, info, &later, NULL));
	CHECK(fi_cq_open(domain, &attr, &cq_later, NULL));
	CHECK(fi_cntr_open(domain, &cattr, &cntr, NULL));
	CHECK(fi_av_open(domain, &aattr, &av_later, NULL));
	CHECK(fi_ep_bind(later, &cq_later->fid, FI_TRANSMIT | FI_RECV));
	CHECK(fi_ep_bind(later, &cntr->fid, FI_SEND));
	CHECK(fi_ep_bind(later, &av_later->fid, 0));
	REQUIRE(fi_close(&cq_later->fid) == -FI_EBUSY);
	REQUIRE(fi_close(&cntr->fid) == -FI_EBUSY);
	REQUIRE(fi_close(&av_later->fid) == -FI_EBUSY);
	CHECK(fi_close(&later->fid));
	CHECK(fi_close(&cq_later->fid));
	CHECK(fi_close(&cntr->fid));
	CHECK(fi_close(&av_later->fid));

	CHECK(fi_close(&ep->fid));
	CHECK(fi_close(&av->fid));
	CHECK(fi_close(&cq->fid));
	REQUIRE(fi_close(&domain->fid) == -FI_EBUSY);
	CHECK(fi_close(&cq_none->fid));
	close_domain(info, fabric, domain);
	printf("careless calls answered without a crash\n");
	return 0;
}
