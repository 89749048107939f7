/* The C ABI's own cost: examples/pingpong's message loop, call for call, written in C against
 * libfabric 1.17's headers. bench.sh runs it on xfabric's libfabric.so.1 beside the Rust
 * pingpong and Debian's fi_pingpong, so that C-probe/Rust is what crossing the ABI costs and
 * fi_pingpong/C-probe is what fi_pingpong's own choices cost (two completion queues of the
 * context format, receives of at least 64 bytes, ...).
 *
 * Like the Rust pingpong: FI_MSG over an RDM endpoint with manual progress, one completion
 * queue of the data format bound for both directions (wait object none), the AV's defaults,
 * receives posted with no descriptor, sends below the inject size injected, completions read
 * eight at a time, the next receive posted before the answer goes, a tenth of the iterations
 * (at most 100) as warm-up. The echoing process runs on SERVER_CPU, the timing one on
 * CLIENT_CPU; names go through pipes (a fork, so no out-of-band socket). Prints usec per
 * one-way transfer (half a round trip) and MB/s, as fi_pingpong does.
 *   cc -O2 -o capi_pingpong scripts/probes/capi_pingpong.c -lfabric &&
 *   LD_LIBRARY_PATH=<dir of xfabric's libfabric.so.1> ./capi_pingpong PROVIDER SIZE ITERS \
 *       [SERVER_CPU CLIENT_CPU | one-thread]
 * With one-thread, one thread drives both endpoints (see one_round_trip). */
#define _GNU_SOURCE
#include "pin.h"
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RX_CTX ((void *)1)
#define TX_CTX ((void *)2)

struct node {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_cq *cq;
    struct fid_av *av;
    struct fid_ep *ep;
    fi_addr_t peer;
    int rx_posted, tx_outstanding;
    struct fi_cq_data_entry entries[8];
};

static void die(const char *what, long rc) {
    fprintf(stderr, "capi_pingpong: %s: %s (%ld)\n", what, fi_strerror((int)-rc), rc);
    exit(1);
}

static void open_node(struct node *n, const char *provider) {
    struct fi_info *hints = fi_allocinfo();
    if (!hints)
        die("fi_allocinfo", -FI_ENOMEM);
    hints->caps = FI_MSG;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup(provider);
    long rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &n->info);
    fi_freeinfo(hints);
    if (rc)
        die("fi_getinfo", rc);
    if ((rc = fi_fabric(n->info->fabric_attr, &n->fabric, NULL)))
        die("fi_fabric", rc);
    if ((rc = fi_domain(n->fabric, n->info, &n->domain, NULL)))
        die("fi_domain", rc);
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_NONE, .size = 64};
    if ((rc = fi_cq_open(n->domain, &cq_attr, &n->cq, NULL)))
        die("fi_cq_open", rc);
    struct fi_av_attr av_attr = {0};
    if ((rc = fi_av_open(n->domain, &av_attr, &n->av, NULL)))
        die("fi_av_open", rc);
    if ((rc = fi_endpoint(n->domain, n->info, &n->ep, NULL)))
        die("fi_endpoint", rc);
    if ((rc = fi_ep_bind(n->ep, &n->cq->fid, FI_TRANSMIT | FI_RECV)))
        die("fi_ep_bind cq", rc);
    if ((rc = fi_ep_bind(n->ep, &n->av->fid, 0)))
        die("fi_ep_bind av", rc);
    if ((rc = fi_enable(n->ep)))
        die("fi_enable", rc);
}

static void close_node(struct node *n) {
    fi_close(&n->ep->fid);
    fi_close(&n->av->fid);
    fi_close(&n->cq->fid);
    fi_close(&n->domain->fid);
    fi_close(&n->fabric->fid);
    fi_freeinfo(n->info);
}

/* One non-blocking CQ read (which drives progress); 1 when it returned something. */
static int poll_cq(struct node *n) {
    ssize_t k = fi_cq_read(n->cq, n->entries, 8);
    if (k == -FI_EAGAIN)
        return 0;
    if (k < 0) {
        struct fi_cq_err_entry err = {0};
        if (k == -FI_EAVAIL && fi_cq_readerr(n->cq, &err, 0) == 1)
            die("operation failed", -err.err);
        die("fi_cq_read", k);
    }
    for (ssize_t i = 0; i < k; i++) {
        if (n->entries[i].op_context == RX_CTX)
            n->rx_posted = 0;
        else if (n->entries[i].op_context == TX_CTX && n->tx_outstanding > 0)
            n->tx_outstanding--;
        else
            die("unexpected completion", -FI_EOTHER);
    }
    return k > 0;
}

/* Polls until the sends and, with rx, the posted receive have completed. */
static void wait_for(struct node *n, int rx) {
    while (n->tx_outstanding > 0 || (rx && n->rx_posted))
        poll_cq(n);
}

static void post_recv(struct node *n, void *buf, size_t size) {
    for (;;) {
        ssize_t rc = fi_recv(n->ep, buf, size, NULL, n->peer, RX_CTX);
        if (rc == 0) {
            n->rx_posted = 1;
            return;
        }
        if (rc != -FI_EAGAIN)
            die("fi_recv", rc);
        poll_cq(n);
    }
}

static void post_send(struct node *n, void *buf, size_t size) {
    int inject = size < n->info->tx_attr->inject_size;
    for (;;) {
        ssize_t rc = inject ? fi_inject(n->ep, buf, size, n->peer)
                            : fi_send(n->ep, buf, size, NULL, n->peer, TX_CTX);
        if (rc == 0) {
            n->tx_outstanding += !inject;
            return;
        }
        if (rc != -FI_EAGAIN)
            die(inject ? "fi_inject" : "fi_send", rc);
        poll_cq(n);
    }
}

/* count round trips, the first receive already posted; the client sends first. */
static void pingpong(struct node *n, int client, void *tx, void *rx, size_t size, long count) {
    for (long i = 0; i < count; i++) {
        if (client) {
            post_send(n, tx, size);
            wait_for(n, 1);
            if (i + 1 < count)
                post_recv(n, rx, size);
        } else {
            wait_for(n, 1);
            if (i + 1 < count)
                post_recv(n, rx, size);
            post_send(n, tx, size);
        }
    }
    wait_for(n, 0);
}

static void put(int fd, const void *p, size_t len) {
    if (write(fd, p, len) != (ssize_t)len)
        die("write to the other process", -FI_EIO);
}

static void get(int fd, void *p, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(fd, (char *)p + got, len - got);
        if (r <= 0)
            die("read from the other process", -FI_EIO);
        got += (size_t)r;
    }
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int run(int client, int to_peer, int from_peer, const char *provider, size_t size,
               long iters) {
    struct node n = {0};
    open_node(&n, provider);
    char name[256], peer_name[256];
    size_t len = sizeof name;
    long rc = fi_getname(&n.ep->fid, name, &len);
    if (rc)
        die("fi_getname", rc);
    put(to_peer, &len, sizeof len);
    put(to_peer, name, len);
    size_t peer_len;
    get(from_peer, &peer_len, sizeof peer_len);
    if (peer_len > sizeof peer_name)
        die("the peer's name", -FI_ETOOSMALL);
    get(from_peer, peer_name, peer_len);
    if ((rc = fi_av_insert(n.av, peer_name, 1, &n.peer, 0, NULL)) != 1)
        die("fi_av_insert", rc < 0 ? rc : -FI_EINVAL);
    void *tx = calloc(1, size ? size : 1), *rx = calloc(1, size ? size : 1);
    if (!tx || !rx)
        die("calloc", -FI_ENOMEM);
    memset(tx, client ? 0x5a : 0xa5, size);
    long warmup = iters / 10 < 1 ? 1 : iters / 10 > 100 ? 100 : iters / 10;
    double elapsed = 0;
    for (int phase = 0; phase < 2; phase++) {
        long count = phase ? iters : warmup;
        post_recv(&n, rx, size);
        /* A barrier: both have posted their first receive. */
        char b = 1;
        put(to_peer, &b, 1);
        get(from_peer, &b, 1);
        double t0 = now_s();
        pingpong(&n, client, tx, rx, size, count);
        elapsed = now_s() - t0;
    }
    if (client) {
        double usec = elapsed * 1e6 / (double)iters / 2;
        printf("usec/xfer %.4f MB/sec %.2f\n", usec, size ? (double)size / usec : 0);
    }
    /* Both done before either closes: a close must not cut the other's last answer. */
    char b = 2;
    put(to_peer, &b, 1);
    get(from_peer, &b, 1);
    free(tx);
    free(rx);
    close_node(&n);
    return 0;
}

/* One round trip of two endpoints driven by one thread, as benches/pingpong.rs's round_trip
 * (inject/8 there: a injects to b, both CQs polled until b has it, b reposts and injects
 * back): deterministic, for callgrind (--toggle-collect='*one_round_trip*'), so that its
 * instructions per round trip set against scripts/bench-instr.sh's say what the C ABI adds. */
__attribute__((noinline)) static void one_round_trip(struct node *a, struct node *b, void *tx,
                                                     void *rx_a, void *rx_b, size_t size) {
    post_send(a, tx, size);
    wait_for(b, 1);
    post_recv(b, rx_b, size);
    post_send(b, tx, size);
    wait_for(a, 1);
    post_recv(a, rx_a, size);
}

static int one_thread(const char *provider, size_t size, long iters) {
    struct node a = {0}, b = {0};
    open_node(&a, provider);
    open_node(&b, provider);
    char name[256];
    size_t len = sizeof name;
    long rc = fi_getname(&b.ep->fid, name, &len);
    if (rc || (rc = fi_av_insert(a.av, name, 1, &a.peer, 0, NULL)) != 1)
        die("a's address of b", rc < 0 ? rc : -FI_EINVAL);
    len = sizeof name;
    rc = fi_getname(&a.ep->fid, name, &len);
    if (rc || (rc = fi_av_insert(b.av, name, 1, &b.peer, 0, NULL)) != 1)
        die("b's address of a", rc < 0 ? rc : -FI_EINVAL);
    void *tx = calloc(1, size ? size : 1), *rx_a = calloc(1, size ? size : 1),
         *rx_b = calloc(1, size ? size : 1);
    if (!tx || !rx_a || !rx_b)
        die("calloc", -FI_ENOMEM);
    post_recv(&a, rx_a, size);
    post_recv(&b, rx_b, size);
    double t0 = now_s();
    for (long i = 0; i < iters; i++)
        one_round_trip(&a, &b, tx, rx_a, rx_b, size);
    double usec = (now_s() - t0) * 1e6 / (double)iters / 2;
    printf("usec/xfer %.4f MB/sec %.2f (one thread)\n", usec, size ? (double)size / usec : 0);
    free(tx);
    free(rx_a);
    free(rx_b);
    close_node(&a);
    close_node(&b);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5 && argc != 6) {
        fprintf(stderr,
                "usage: %s PROVIDER SIZE ITERS [SERVER_CPU CLIENT_CPU | one-thread]\n",
                argv[0]);
        return 2;
    }
    const char *provider = argv[1];
    size_t size = strtoul(argv[2], NULL, 0);
    long iters = strtol(argv[3], NULL, 0);
    if (iters < 1) {
        fprintf(stderr, "ITERS must be at least 1\n");
        return 2;
    }
    if (argc == 5) {
        if (strcmp(argv[4], "one-thread")) {
            fprintf(stderr, "a lone fourth argument must be one-thread\n");
            return 2;
        }
        return one_thread(provider, size, iters);
    }
    const char *server_cpu = argc == 6 ? argv[4] : NULL, *client_cpu = argc == 6 ? argv[5] : NULL;
    int down[2], up[2];
    if (pipe(down) || pipe(up)) {
        perror("pipe");
        return 1;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        pin_to(server_cpu);
        close(down[1]);
        close(up[0]);
        return run(0, up[1], down[0], provider, size, iters);
    }
    pin_to(client_cpu);
    close(down[0]);
    close(up[1]);
    int rc = run(1, down[1], up[0], provider, size, iters);
    int status;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
        rc = 1;
    return rc;
}
