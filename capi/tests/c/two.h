/* What the C tests of capi share, through the libfabric C API: failing with a message, one
 * process's fabric and domain on the provider FI_PROVIDER names, and two processes with one
 * RDM endpoint each. For two, the parent forks; each side opens a fabric, domain, CQ, AV and
 * endpoint with the caps asked for, and the two swap endpoint names (and any blob a test
 * adds) over pipes. */
#ifndef XFABRIC_TWO_H
#define XFABRIC_TWO_H

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

struct side {
	int child;                /* 1 in the forked process */
	pid_t pid;                /* the child's, in the parent */
	int in, out;              /* pipe ends towards the other side */
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_cq *cq;
	struct fid_av *av;
	struct fid_ep *ep;
	fi_addr_t peer;
};

#define FAIL(...)                                                                           \
	do {                                                                                \
		fprintf(stderr, "%s: ", __FILE__);                                          \
		fprintf(stderr, __VA_ARGS__);                                               \
		fprintf(stderr, "\n");                                                      \
		exit(1);                                                                    \
	} while (0)

#define CHECK(call)                                                                         \
	do {                                                                                \
		long long _r = (long long)(call);                                           \
		if (_r < 0)                                                                 \
			FAIL("%s: %s (%lld)", #call, fi_strerror((int)-_r), _r);            \
	} while (0)

/* Fails the test when `cond` does not hold, naming its line and the condition. */
#define REQUIRE(cond)                                                                       \
	do {                                                                                \
		if (!(cond))                                                                \
			FAIL("line %d: %s", __LINE__, #cond);                               \
	} while (0)

/* Whether `fd` becomes readable within `ms` milliseconds (0: now). */
static inline int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, ms) == 1;
}

/* open_domain, asking for `progress` (FI_PROGRESS_UNSPEC: the provider's) for data and
 * control alike. */
static inline void open_domain_progress(uint64_t caps, uint64_t mode, int mr_mode,
					enum fi_progress progress, struct fi_info **info,
					struct fid_fabric **fabric, struct fid_domain **domain)
{
	struct fi_info *hints = fi_allocinfo();
	if (!hints)
		FAIL("fi_allocinfo");
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = caps;
	hints->mode = mode;
	hints->domain_attr->mr_mode = mr_mode;
	hints->domain_attr->data_progress = progress;
	hints->domain_attr->control_progress = progress;
	if (getenv("XF_TEST_ADDR_STR"))
		hints->addr_format = FI_ADDR_STR;
	const char *prov = getenv("FI_PROVIDER");
	if (prov)
		hints->fabric_attr->prov_name = strdup(prov);
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, info));
	fi_freeinfo(hints);
	CHECK(fi_fabric((*info)->fabric_attr, fabric, NULL));
	CHECK(fi_domain(*fabric, *info, domain, NULL));
}

/* Opens a fabric and domain for RDM endpoints with `caps`, `mode` and `mr_mode` on the
 * provider FI_PROVIDER names (getinfo's first answer when it is unset), its addresses
 * FI_ADDR_STR strings where XF_TEST_ADDR_STR is set. */
static inline void open_domain(uint64_t caps, uint64_t mode, int mr_mode, struct fi_info **info,
			       struct fid_fabric **fabric, struct fid_domain **domain)
{
	open_domain_progress(caps, mode, mr_mode, FI_PROGRESS_UNSPEC, info, fabric, domain);
}

/* Closes what open_domain opened; a domain or fabric that refuses (something of it still
 * open) fails the test. */
static inline void close_domain(struct fi_info *info, struct fid_fabric *fabric,
				struct fid_domain *domain)
{
	CHECK(fi_close(&domain->fid));
	CHECK(fi_close(&fabric->fid));
	fi_freeinfo(info);
}

/* Reads `cq` (bounded) until its next entry is an error: a success there fails the test. */
static inline void await_error(struct fid_cq *cq)
{
	struct fi_cq_tagged_entry e; /* the widest format: room for any */
	for (long i = 0;; i++) {
		ssize_t r = fi_cq_read(cq, &e, 1);
		if (r == -FI_EAVAIL)
			return;
		REQUIRE(r == -FI_EAGAIN);
		REQUIRE(i < 10000000);
	}
}

/* Opens a table AV and an RDM endpoint on `domain` bound to it and to `cq` for both
 * directions, and enables it. */
static inline void open_ep(struct fid_domain *domain, struct fi_info *info, struct fid_cq *cq,
			   struct fid_av **av, struct fid_ep **ep)
{
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	CHECK(fi_av_open(domain, &av_attr, av, NULL));
	CHECK(fi_endpoint(domain, info, ep, NULL));
	CHECK(fi_ep_bind(*ep, &(*av)->fid, 0));
	CHECK(fi_ep_bind(*ep, &cq->fid, FI_TRANSMIT | FI_RECV));
	CHECK(fi_enable(*ep));
}

static inline void swap_blob(struct side *s, const void *mine, size_t len, void *theirs,
			     size_t cap)
{
	size_t got;
	if (write(s->out, &len, sizeof len) != (ssize_t)sizeof len ||
	    write(s->out, mine, len) != (ssize_t)len)
		FAIL("writing to the other side");
	if (read(s->in, &got, sizeof got) != (ssize_t)sizeof got || got != cap ||
	    read(s->in, theirs, got) != (ssize_t)got)
		FAIL("reading from the other side");
}

/* Forks, then opens everything on both sides with `caps` (mode FI_CONTEXT|FI_CONTEXT2) and
 * inserts the other side's address. */
static inline void two_sides(struct side *s, uint64_t caps)
{
	int down[2], up[2];
	if (pipe(down) || pipe(up))
		FAIL("pipe");
	fflush(NULL);
	s->pid = fork();
	if (s->pid < 0)
		FAIL("fork");
	s->child = s->pid == 0;
	/* A child whose parent failed must not wait for it forever. */
	if (s->child && prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
		FAIL("prctl");
	s->in = s->child ? down[0] : up[0];
	s->out = s->child ? up[1] : down[1];

	open_domain(caps, FI_CONTEXT | FI_CONTEXT2,
		    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY, &s->info,
		    &s->fabric, &s->domain);
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_DATA, .size = 256 };
	CHECK(fi_cq_open(s->domain, &cq_attr, &s->cq, NULL));
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	CHECK(fi_av_open(s->domain, &av_attr, &s->av, NULL));
	CHECK(fi_endpoint(s->domain, s->info, &s->ep, NULL));
	CHECK(fi_ep_bind(s->ep, &s->av->fid, 0));
	CHECK(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV));
}

/* Enables the endpoint (after any counter binds) and swaps names with the other side. */
static inline void two_connect(struct side *s)
{
	CHECK(fi_enable(s->ep));
	char name[256], theirs[256];
	size_t len = sizeof name;
	CHECK(fi_getname(&s->ep->fid, name, &len));
	swap_blob(s, name, len, theirs, len);
	if (fi_av_insert(s->av, theirs, 1, &s->peer, 0, NULL) != 1)
		FAIL("fi_av_insert of the other side's name");
}

/* Reads one completion, spinning; an error entry fails the test. */
static inline void one_completion(struct side *s, struct fi_cq_data_entry *e)
{
	for (;;) {
		ssize_t r = fi_cq_read(s->cq, e, 1);
		if (r == 1)
			return;
		if (r == -FI_EAVAIL) {
			struct fi_cq_err_entry err = { 0 };
			fi_cq_readerr(s->cq, &err, 0);
			FAIL("error completion: %s (prov_errno %d)", fi_strerror(err.err),
			     err.prov_errno);
		}
		if (r != -FI_EAGAIN)
			CHECK(r);
	}
}

/* Closes what two_sides opened (best effort: a domain with the test's counters or MRs still
 * open may refuse), so that no provider keeps a segment past the test. The parent then waits
 * for the child and fails if it failed. */
static inline int two_finish(struct side *s, int mine)
{
	fi_close(&s->ep->fid);
	fi_close(&s->av->fid);
	fi_close(&s->cq->fid);
	fi_close(&s->domain->fid);
	fi_close(&s->fabric->fid);
	fi_freeinfo(s->info);
	if (s->child)
		return mine;
	int status = 0;
	if (waitpid(s->pid, &status, 0) != s->pid)
		FAIL("waitpid");
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		FAIL("the child failed (status %d)", status);
	return mine;
}

#endif
