/* A CQ, a counter, an EQ and a wait set closed by one thread while another waits in
 * fi_cq_sread, fi_cntr_wait, fi_eq_sread or fi_wait with no timeout (-1): the waiter returns (-FI_EOPBADSTATE: closed meanwhile) instead of
 * sleeping forever on memory the close freed. libfabric leaves a close racing a call
 * undefined; xfabric's waiters hold the object through a handle of their own, and a close
 * ends their wait.
 *
 * The main thread closes only once the waiter is asleep (its thread's state in
 * /proc/self/task/TID/stat is S), so the close cannot come before the wait began. */
#define _GNU_SOURCE
#include "two.h"
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>

struct waiter {
	struct fid_cq *cq;
	struct fid_cntr *cntr;
	struct fid_eq *eq;
	struct fid_wait *ws;
	volatile pid_t tid;
	volatile long ret;
};

static void *wait_cq(void *arg)
{
	struct waiter *w = arg;
	struct fi_cq_entry e;
	w->tid = (pid_t)syscall(SYS_gettid);
	w->ret = fi_cq_sread(w->cq, &e, 1, NULL, -1);
	return NULL;
}

static void *wait_cntr(void *arg)
{
	struct waiter *w = arg;
	w->tid = (pid_t)syscall(SYS_gettid);
	w->ret = fi_cntr_wait(w->cntr, 1, -1);
	return NULL;
}

static void *wait_eq(void *arg)
{
	struct waiter *w = arg;
	uint32_t event;
	char buf[64];
	w->tid = (pid_t)syscall(SYS_gettid);
	w->ret = fi_eq_sread(w->eq, &event, buf, sizeof buf, -1, 0);
	return NULL;
}

static void *wait_set(void *arg)
{
	struct waiter *w = arg;
	w->tid = (pid_t)syscall(SYS_gettid);
	w->ret = fi_wait(w->ws, -1);
	return NULL;
}

/* Whether thread `tid` of this process is sleeping now. */
static int asleep(pid_t tid)
{
	char path[64], buf[256];
	snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	char *p = strrchr(buf, ')');
	return p && p[1] == ' ' && p[2] == 'S';
}

/* Starts `fn` on `w`, closes `fid` once that thread sleeps in its wait, and checks that the
 * wait then returned, within 10 s. */
static void close_under(void *(*fn)(void *), struct waiter *w, struct fid *fid, const char *what)
{
	pthread_t t;
	w->tid = 0;
	w->ret = 1;
	if (pthread_create(&t, NULL, fn, w))
		FAIL("pthread_create");
	for (int i = 0; !(w->tid && asleep(w->tid)); i++) {
		if (i > 100000)
			FAIL("%s: the waiter never slept", what);
		usleep(100);
	}
	CHECK(fi_close(fid));
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 10;
	if (pthread_timedjoin_np(t, NULL, &until))
		FAIL("%s: the waiter still waits 10 s after the close", what);
	if (w->ret != -FI_EOPBADSTATE)
		FAIL("%s: the wait returned %ld, not -FI_EOPBADSTATE", what, w->ret);
}

int main(void)
{
	alarm(60);
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	open_domain(FI_MSG, FI_CONTEXT | FI_CONTEXT2, FI_MR_LOCAL | FI_MR_VIRT_ADDR |
		    FI_MR_ALLOCATED | FI_MR_PROV_KEY, &info, &fabric, &domain);
	struct waiter w = { 0 };
	struct fi_cq_attr cattr = { .format = FI_CQ_FORMAT_CONTEXT, .size = 8,
				    .wait_obj = FI_WAIT_UNSPEC };
	CHECK(fi_cq_open(domain, &cattr, &w.cq, NULL));
	close_under(wait_cq, &w, &w.cq->fid, "fi_cq_sread");
	struct fi_cntr_attr nattr = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_UNSPEC };
	CHECK(fi_cntr_open(domain, &nattr, &w.cntr, NULL));
	close_under(wait_cntr, &w, &w.cntr->fid, "fi_cntr_wait");
	struct fi_eq_attr eattr = { .size = 8, .wait_obj = FI_WAIT_UNSPEC };
	CHECK(fi_eq_open(fabric, &eattr, &w.eq, NULL));
	close_under(wait_eq, &w, &w.eq->fid, "fi_eq_sread");
	struct fi_wait_attr wattr = { .wait_obj = FI_WAIT_UNSPEC };
	CHECK(fi_wait_open(fabric, &wattr, &w.ws));
	close_under(wait_set, &w, &w.ws->fid, "fi_wait");
	close_domain(info, fabric, domain);
	printf("close_while_waiting: ok\n");
	return 0;
}
