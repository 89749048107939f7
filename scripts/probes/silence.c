/* A plain 8-byte send after a silence, through the libfabric C API: the anchor for
 * `xpu_bench silence`. The parent sleeps GAP ms, stamps CLOCK_MONOTONIC into the message and
 * sends it; the child busy-polls its CQ and reports the time from the stamp to its receive
 * completion. Built against Debian's libfabric (and, with LD_LIBRARY_PATH, runnable on any
 * libfabric.so.1).
 *
 * usage: silence PROVIDER SAMPLES GAP_MS...
 * prints one line per gap: gap, samples, p50, p99 and max in microseconds. */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void check(int ret, const char *what)
{
	if (ret) {
		fprintf(stderr, "silence: %s: %s\n", what, fi_strerror(-ret));
		exit(1);
	}
}

static struct fid_ep *ep;
static struct fid_cq *cq;
static struct fid_av *av;
static struct fid_domain *domain;
static struct fid_fabric *fabric;

/* Closed before exit: a provider may keep a segment in /dev/shm until its endpoint closes. */
static void close_endpoint(void)
{
	fi_close(&ep->fid);
	fi_close(&av->fid);
	fi_close(&cq->fid);
	fi_close(&domain->fid);
	fi_close(&fabric->fid);
}

static void open_endpoint(const char *prov)
{
	struct fi_info *hints = fi_allocinfo(), *info;
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_CONTEXT, .size = 64 };
	struct fi_av_attr av_attr = { .type = FI_AV_MAP };

	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG;
	hints->mode = FI_CONTEXT;
	hints->fabric_attr->prov_name = strdup(prov);
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	check(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info), "fi_getinfo");
	check(fi_fabric(info->fabric_attr, &fabric, NULL), "fi_fabric");
	check(fi_domain(fabric, info, &domain, NULL), "fi_domain");
	check(fi_cq_open(domain, &cq_attr, &cq, NULL), "fi_cq_open");
	check(fi_av_open(domain, &av_attr, &av, NULL), "fi_av_open");
	check(fi_endpoint(domain, info, &ep, NULL), "fi_endpoint");
	check(fi_ep_bind(ep, &av->fid, 0), "fi_ep_bind av");
	check(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind cq");
	check(fi_enable(ep), "fi_enable");
	fi_freeinfo(hints);
	fi_freeinfo(info);
}

static void one_completion(void)
{
	struct fi_cq_entry e;
	for (;;) {
		ssize_t r = fi_cq_read(cq, &e, 1);
		if (r == 1)
			return;
		if (r != -FI_EAGAIN)
			check((int)r, "fi_cq_read");
	}
}

static void post_recv(void *buf, fi_addr_t from, struct fi_context *ctx)
{
	ssize_t r;
	while ((r = fi_recv(ep, buf, 8, NULL, from, ctx)) == -FI_EAGAIN)
		fi_cq_read(cq, NULL, 0);
	check((int)r, "fi_recv");
}

static void post_send(void *buf, fi_addr_t to, struct fi_context *ctx)
{
	ssize_t r;
	while ((r = fi_send(ep, buf, 8, NULL, to, ctx)) == -FI_EAGAIN)
		fi_cq_read(cq, NULL, 0);
	check((int)r, "fi_send");
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: silence PROVIDER SAMPLES GAP_MS...\n");
		return 2;
	}
	int samples = atoi(argv[2]), gaps = argc - 3;
	if (samples < 1 || samples > 100000) {
		fprintf(stderr, "silence: SAMPLES must be 1..100000\n");
		return 2;
	}
	int down[2], up[2];
	if (pipe(down) || pipe(up))
		return 1;
	pid_t pid = fork();
	int child = pid == 0;
	open_endpoint(argv[1]);

	/* Exchange names: each side writes its own, then reads the other's. */
	char name[256], peer_name[256];
	size_t len = sizeof name, peer_len;
	check(fi_getname(&ep->fid, name, &len), "fi_getname");
	int out = child ? up[1] : down[1], in = child ? down[0] : up[0];
	if (write(out, &len, sizeof len) != sizeof len || write(out, name, len) != (ssize_t)len ||
	    read(in, &peer_len, sizeof peer_len) != sizeof peer_len || peer_len > sizeof peer_name ||
	    read(in, peer_name, peer_len) != (ssize_t)peer_len) {
		fprintf(stderr, "silence: name exchange failed\n");
		return 1;
	}
	fi_addr_t peer;
	if (fi_av_insert(av, peer_name, 1, &peer, 0, NULL) != 1) {
		fprintf(stderr, "silence: fi_av_insert failed\n");
		return 1;
	}

	uint64_t msg = 0, ack = 0;
	struct fi_context rctx, sctx;
	int total = 1 + gaps * samples; /* one warm-up exchange first */
	double *lat = calloc((size_t)total, sizeof *lat);
	for (int i = 0; i < total; i++) {
		if (child) {
			post_recv(&msg, peer, &rctx);
			one_completion();
			lat[i] = (double)(now_ns() - msg) / 1e3;
			post_send(&ack, peer, &sctx);
			one_completion();
		} else {
			post_recv(&ack, peer, &rctx);
			int gap = i == 0 ? 0 : atoi(argv[3 + (i - 1) / samples]);
			struct timespec ts = { gap / 1000, (gap % 1000) * 1000000L };
			nanosleep(&ts, NULL);
			msg = now_ns();
			post_send(&msg, peer, &sctx);
			one_completion();
			one_completion();
		}
	}
	close_endpoint();
	if (!child) {
		int status;
		waitpid(pid, &status, 0);
		return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
	}
	printf("gap ms  samples      p50      p99      max   (usec, plain send after the gap, %s)\n",
	       argv[1]);
	for (int g = 0; g < gaps; g++) {
		double *v = lat + 1 + g * samples;
		qsort(v, (size_t)samples, sizeof *v, by_value);
		int p99 = (int)((samples - 1) * 0.99 + 0.5);
		printf("%6s %8d %8.2f %8.2f %8.2f\n", argv[3 + g], samples, v[(samples - 1) / 2], v[p99],
		       v[samples - 1]);
	}
	return 0;
}
