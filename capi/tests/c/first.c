/* A first C program: two endpoints of the shm provider in one process; one sends "hello", the
 * other receives it. Plain libfabric 1.17, built against /usr/include/rdma. README.md shows
 * this file as it is; capi/tests/c_first.rs runs it on xfabric's libfabric.so.1. */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                                         \
	do {                                                                                \
		ssize_t _r = (call);                                                        \
		if (_r < 0) {                                                               \
			fprintf(stderr, "%s: %s\n", #call, fi_strerror((int)-_r));          \
			return 1;                                                           \
		}                                                                           \
	} while (0)

struct node {
	struct fid_ep *ep;
	struct fid_cq *cq;
	struct fid_av *av;
};

/* An endpoint with its completion queue and address vector, enabled. */
static int open_node(struct fid_domain *domain, struct fi_info *info, struct node *n)
{
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_MSG };
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	CHECK(fi_cq_open(domain, &cq_attr, &n->cq, NULL));
	CHECK(fi_av_open(domain, &av_attr, &n->av, NULL));
	CHECK(fi_endpoint(domain, info, &n->ep, NULL));
	CHECK(fi_ep_bind(n->ep, &n->cq->fid, FI_TRANSMIT | FI_RECV));
	CHECK(fi_ep_bind(n->ep, &n->av->fid, 0));
	CHECK(fi_enable(n->ep));
	return 0;
}

/* Reads `cq` until one completion comes; each read also drives progress. */
static int wait_one(struct fid_cq *cq)
{
	struct fi_cq_msg_entry entry;
	for (;;) {
		ssize_t r = fi_cq_read(cq, &entry, 1);
		if (r == 1)
			return 0;
		if (r == -FI_EAVAIL) {
			struct fi_cq_err_entry err = { 0 };
			fi_cq_readerr(cq, &err, 0);
			fprintf(stderr, "the operation failed: %s\n", fi_strerror(err.err));
			return 1;
		}
		if (r != -FI_EAGAIN)
			CHECK(r);
	}
}

int main(void)
{
	struct fi_info *hints = fi_allocinfo(), *info;
	hints->caps = FI_MSG;
	hints->ep_attr->type = FI_EP_RDM;
	hints->fabric_attr->prov_name = strdup("shm");
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
	fi_freeinfo(hints);

	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct node tx, rx;
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
	CHECK(fi_domain(fabric, info, &domain, NULL));
	if (open_node(domain, info, &tx) || open_node(domain, info, &rx))
		return 1;

	/* The receiver's name would travel out of band; here it is at hand. */
	char name[256];
	size_t len = sizeof name;
	fi_addr_t to;
	CHECK(fi_getname(&rx.ep->fid, name, &len));
	if (fi_av_insert(tx.av, name, 1, &to, 0, NULL) != 1)
		return 1;

	char inbox[6] = "", hello[] = "hello";
	CHECK(fi_recv(rx.ep, inbox, 5, NULL, FI_ADDR_UNSPEC, NULL));
	/* -FI_EAGAIN: not now (the peer not reached yet, or no room). Reading a CQ drives its
	 * endpoint's progress, and the receiver's may be what the sender waits for; nothing can
	 * complete before the send, so these reads find no entry. */
	ssize_t r;
	struct fi_cq_msg_entry none;
	while ((r = fi_send(tx.ep, hello, 5, NULL, to, NULL)) == -FI_EAGAIN) {
		fi_cq_read(tx.cq, &none, 1);
		fi_cq_read(rx.cq, &none, 1);
	}
	CHECK(r);
	if (wait_one(tx.cq) || wait_one(rx.cq))
		return 1;
	printf("received \"%s\"\n", inbox);

	struct node *nodes[] = { &tx, &rx };
	for (int i = 0; i < 2; i++) {
		CHECK(fi_close(&nodes[i]->ep->fid));
		CHECK(fi_close(&nodes[i]->av->fid));
		CHECK(fi_close(&nodes[i]->cq->fid));
	}
	CHECK(fi_close(&domain->fid));
	CHECK(fi_close(&fabric->fid));
	fi_freeinfo(info);
	return strcmp(inbox, "hello") != 0;
}
