/* fi_av_insert as fi_av(3) says, on the provider FI_PROVIDER names: a bad address among good
 * ones is counted as not inserted (FI_ADDR_NOTAVAIL in its slot), never a failed call;
 * FI_SYNC_ERR writes each address's status; an AV opened with FI_EVENT refuses inserts until
 * an EQ is bound, then returns 0 and reports one error event per bad address (its index as
 * data, the AV's fid, the insert's context) followed by FI_AV_COMPLETE with the count. The
 * good address is an endpoint's own name; the bad one 16 zero bytes (a sockaddr of no
 * family) or a string naming nothing. */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPECT(cond)                                                                        \
	do {                                                                                \
		if (!(cond)) {                                                              \
			fprintf(stderr, "av_insert: line %d: %s\n", __LINE__, #cond);       \
			return 1;                                                           \
		}                                                                           \
	} while (0)

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

	/* The good address: an enabled endpoint's name. */
	struct fi_av_attr attr = { .type = FI_AV_TABLE };
	struct fid_av *own_av;
	struct fid_ep *ep;
	EXPECT(fi_av_open(domain, &attr, &own_av, NULL) == 0);
	EXPECT(fi_endpoint(domain, info, &ep, NULL) == 0);
	EXPECT(fi_ep_bind(ep, &own_av->fid, 0) == 0);
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_CONTEXT };
	struct fid_cq *cq;
	EXPECT(fi_cq_open(domain, &cq_attr, &cq, NULL) == 0);
	EXPECT(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV) == 0);
	EXPECT(fi_enable(ep) == 0);
	char addrs[512];
	size_t namelen = 256;
	EXPECT(fi_getname(&ep->fid, addrs, &namelen) == 0 && namelen <= 256);
	int sockaddr = info->addr_format != FI_ADDR_STR;
	if (sockaddr)
		memset(addrs + namelen, 0, 16);
	else
		strcpy(addrs + namelen, "nothing-at-all");

	/* Synchronous: good then bad. */
	struct fid_av *av;
	fi_addr_t out[2] = { 77, 77 };
	EXPECT(fi_av_open(domain, &attr, &av, NULL) == 0);
	EXPECT(fi_av_insert(av, addrs, 2, out, 0, NULL) == 1);
	EXPECT(out[0] != FI_ADDR_NOTAVAIL && out[1] == FI_ADDR_NOTAVAIL);
	/* The bad one alone: 0 inserted, not an error. */
	out[0] = 77;
	EXPECT(fi_av_insert(av, addrs + namelen, 1, out, 0, NULL) == 0);
	EXPECT(out[0] == FI_ADDR_NOTAVAIL);
	/* FI_SYNC_ERR: each address's status. */
	int errs[2] = { -1, 0 };
	EXPECT(fi_av_insert(av, addrs, 2, NULL, FI_SYNC_ERR, errs) == 1);
	EXPECT(errs[0] == 0 && errs[1] > 0);
	EXPECT(fi_av_insert(av, addrs, 2, NULL, FI_SYNC_ERR, NULL) == -FI_EINVAL);
	EXPECT(fi_av_insert(av, addrs, 1, NULL, FI_INJECT, NULL) == -FI_EBADFLAGS);

	/* An EQ binds only to an AV opened with FI_EVENT. */
	struct fi_eq_attr eq_attr = { .size = 4, .wait_obj = FI_WAIT_UNSPEC };
	struct fid_eq *eq;
	EXPECT(fi_eq_open(fabric, &eq_attr, &eq, NULL) == 0);
	EXPECT(fi_av_bind(av, &eq->fid, 0) == -FI_EINVAL);
	EXPECT(fi_close(&av->fid) == 0);

	/* Asynchronous. */
	attr.flags = FI_EVENT;
	EXPECT(fi_av_open(domain, &attr, &av, NULL) == 0);
	EXPECT(fi_av_insert(av, addrs, 2, out, 0, NULL) == -FI_ENOEQ);
	EXPECT(fi_av_bind(av, &eq->fid, 0) == 0);
	EXPECT(fi_av_insert(av, addrs, 2, NULL, FI_SYNC_ERR, errs) == -FI_EBADFLAGS);
	int ctx;
	out[0] = out[1] = 77;
	EXPECT(fi_av_insert(av, addrs, 2, out, 0, &ctx) == 0);
	EXPECT(out[0] != FI_ADDR_NOTAVAIL && out[1] == FI_ADDR_NOTAVAIL);
	uint32_t event = 0;
	struct fi_eq_entry entry;
	EXPECT(fi_eq_sread(eq, &event, &entry, sizeof entry, 1000, 0) == -FI_EAVAIL);
	struct fi_eq_err_entry err = { 0 };
	EXPECT(fi_eq_readerr(eq, &err, 0) == sizeof err);
	EXPECT(err.fid == &av->fid && err.context == &ctx && err.data == 1 && err.err > 0);
	EXPECT(fi_eq_sread(eq, &event, &entry, sizeof entry, 1000, 0) == sizeof entry);
	EXPECT(event == FI_AV_COMPLETE && entry.fid == &av->fid && entry.context == &ctx);
	EXPECT(entry.data == 1);
	/* All good, more inserts than the EQ holds: every completion still arrives. */
	for (int i = 0; i < 6; i++)
		EXPECT(fi_av_insert(av, addrs, 1, NULL, 0, &ctx) == 0);
	for (int i = 0; i < 6; i++) {
		EXPECT(fi_eq_read(eq, &event, &entry, sizeof entry, 0) == sizeof entry);
		EXPECT(event == FI_AV_COMPLETE && entry.data == 1);
	}
	EXPECT(fi_eq_read(eq, &event, &entry, sizeof entry, 0) == -FI_EAGAIN);

	EXPECT(fi_close(&av->fid) == 0 && fi_close(&eq->fid) == 0);
	EXPECT(fi_close(&ep->fid) == 0 && fi_close(&cq->fid) == 0);
	EXPECT(fi_close(&own_av->fid) == 0);
	EXPECT(fi_close(&domain->fid) == 0 && fi_close(&fabric->fid) == 0);
	fi_freeinfo(info);
	fi_freeinfo(hints);
	printf("av_insert: ok (%s)\n", sockaddr ? "sockaddr" : "string");
	return 0;
}
