/* fi_av_insert as fi_av(3) says, on the provider FI_PROVIDER names: a bad address among good
 * ones is counted as not inserted (FI_ADDR_NOTAVAIL in its slot), never a failed call;
 * FI_SYNC_ERR writes each address's status; an AV opened with FI_EVENT refuses inserts until
 * an EQ is bound, then returns 0 and reports one error event per bad address (its index as
 * data, the AV's fid, the insert's context) followed by FI_AV_COMPLETE with the count. The
 * good address is an endpoint's own name; the bad one 16 zero bytes (a sockaddr of no
 * family) or a string naming nothing. */
#include "two.h"
#include <rdma/fi_eq.h>

int main(void)
{
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	open_domain(FI_MSG, 0, 0, &info, &fabric, &domain);

	/* The good address: an enabled endpoint's name. */
	struct fi_av_attr attr = { .type = FI_AV_TABLE };
	struct fid_av *own_av;
	struct fid_ep *ep;
	REQUIRE(fi_av_open(domain, &attr, &own_av, NULL) == 0);
	REQUIRE(fi_endpoint(domain, info, &ep, NULL) == 0);
	REQUIRE(fi_ep_bind(ep, &own_av->fid, 0) == 0);
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_CONTEXT };
	struct fid_cq *cq;
	REQUIRE(fi_cq_open(domain, &cq_attr, &cq, NULL) == 0);
	REQUIRE(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV) == 0);
	REQUIRE(fi_enable(ep) == 0);
	char addrs[512];
	size_t namelen = 256;
	REQUIRE(fi_getname(&ep->fid, addrs, &namelen) == 0 && namelen <= 256);
	int sockaddr = info->addr_format != FI_ADDR_STR;
	if (sockaddr)
		memset(addrs + namelen, 0, 16);
	else
		strcpy(addrs + namelen, "nothing-at-all");

	/* Synchronous: good then bad. */
	struct fid_av *av;
	fi_addr_t out[2] = { 77, 77 };
	REQUIRE(fi_av_open(domain, &attr, &av, NULL) == 0);
	REQUIRE(fi_av_insert(av, addrs, 2, out, 0, NULL) == 1);
	REQUIRE(out[0] != FI_ADDR_NOTAVAIL && out[1] == FI_ADDR_NOTAVAIL);
	/* The good one printed, and looked up as it was inserted. */
	char text[256], back[256];
	size_t tlen = sizeof text, blen = sizeof back;
	REQUIRE(fi_av_straddr(av, addrs, text, &tlen) == text && !strstr(text, "invalid"));
	REQUIRE(fi_av_lookup(av, out[0], back, &blen) == 0);
	if (blen != namelen)
		FAIL("lookup gave %zu bytes, the name has %zu", blen, namelen);
	REQUIRE(memcmp(back, addrs, namelen) == 0);
	/* The bad one alone: 0 inserted, not an error. */
	out[0] = 77;
	REQUIRE(fi_av_insert(av, addrs + namelen, 1, out, 0, NULL) == 0);
	REQUIRE(out[0] == FI_ADDR_NOTAVAIL);
	/* FI_SYNC_ERR: each address's status. */
	int errs[2] = { -1, 0 };
	REQUIRE(fi_av_insert(av, addrs, 2, NULL, FI_SYNC_ERR, errs) == 1);
	REQUIRE(errs[0] == 0 && errs[1] > 0);
	REQUIRE(fi_av_insert(av, addrs, 2, NULL, FI_SYNC_ERR, NULL) == -FI_EINVAL);
	REQUIRE(fi_av_insert(av, addrs, 1, NULL, FI_INJECT, NULL) == -FI_EBADFLAGS);

	/* An EQ binds only to an AV opened with FI_EVENT. */
	struct fi_eq_attr eq_attr = { .size = 4, .wait_obj = FI_WAIT_UNSPEC };
	struct fid_eq *eq;
	REQUIRE(fi_eq_open(fabric, &eq_attr, &eq, NULL) == 0);
	REQUIRE(fi_av_bind(av, &eq->fid, 0) == -FI_EINVAL);
	REQUIRE(fi_close(&av->fid) == 0);

	/* Asynchronous. */
	attr.flags = FI_EVENT;
	REQUIRE(fi_av_open(domain, &attr, &av, NULL) == 0);
	REQUIRE(fi_av_insert(av, addrs, 2, out, 0, NULL) == -FI_ENOEQ);
	REQUIRE(fi_av_bind(av, &eq->fid, 0) == 0);
	REQUIRE(fi_av_insert(av, addrs, 2, NULL, FI_SYNC_ERR, errs) == -FI_EBADFLAGS);
	int ctx;
	out[0] = out[1] = 77;
	REQUIRE(fi_av_insert(av, addrs, 2, out, 0, &ctx) == 0);
	REQUIRE(out[0] != FI_ADDR_NOTAVAIL && out[1] == FI_ADDR_NOTAVAIL);
	uint32_t event = 0;
	struct fi_eq_entry entry;
	REQUIRE(fi_eq_sread(eq, &event, &entry, sizeof entry, 1000, 0) == -FI_EAVAIL);
	struct fi_eq_err_entry err = { 0 };
	REQUIRE(fi_eq_readerr(eq, &err, 0) == sizeof err);
	REQUIRE(err.fid == &av->fid && err.context == &ctx && err.data == 1 && err.err > 0);
	REQUIRE(fi_eq_sread(eq, &event, &entry, sizeof entry, 1000, 0) == sizeof entry);
	REQUIRE(event == FI_AV_COMPLETE && entry.fid == &av->fid && entry.context == &ctx);
	REQUIRE(entry.data == 1);
	/* All good, more inserts than the EQ holds: every completion still arrives. */
	for (int i = 0; i < 6; i++)
		REQUIRE(fi_av_insert(av, addrs, 1, NULL, 0, &ctx) == 0);
	for (int i = 0; i < 6; i++) {
		REQUIRE(fi_eq_read(eq, &event, &entry, sizeof entry, 0) == sizeof entry);
		REQUIRE(event == FI_AV_COMPLETE && entry.data == 1);
	}
	REQUIRE(fi_eq_read(eq, &event, &entry, sizeof entry, 0) == -FI_EAGAIN);

	REQUIRE(fi_close(&av->fid) == 0 && fi_close(&eq->fid) == 0);
	REQUIRE(fi_close(&ep->fid) == 0 && fi_close(&cq->fid) == 0);
	REQUIRE(fi_close(&own_av->fid) == 0);
	close_domain(info, fabric, domain);
	printf("av_insert: ok (%s)\n", sockaddr ? "sockaddr" : "string");
	return 0;
}
