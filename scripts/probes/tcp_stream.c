/* The bandwidth limit for the tcp provider on this machine: one process streams ITERS
 * messages of SIZE bytes over loopback TCP to another, which reads them into one buffer; no
 * protocol, no waiting for answers, so no ping-pong of any library can move SIZE bytes one way
 * faster. Busy-polled non-blocking calls (MSG_DONTWAIT: no sleep and wake-up per buffer, as
 * the providers poll), TCP_NODELAY, the kernel's buffer autotuning.
 * Prints usec per message and MB/s. With SERVER_CPU and CLIENT_CPU, the receiver runs on the
 * first, the sender on the second.
 *   cc -O2 -o tcp_stream scripts/probes/tcp_stream.c &&
 *   ./tcp_stream SIZE ITERS [SERVER_CPU CLIENT_CPU] */
#define _GNU_SOURCE
#include "pin.h"
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void tune(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 5) {
        fprintf(stderr, "usage: %s SIZE ITERS [SERVER_CPU CLIENT_CPU]\n", argv[0]);
        return 2;
    }
    const char *server_cpu = argc == 5 ? argv[3] : NULL, *client_cpu = argc == 5 ? argv[4] : NULL;
    size_t size = strtoull(argv[1], NULL, 10);
    long iters = strtol(argv[2], NULL, 10);
    if (size == 0 || iters <= 0) {
        fprintf(stderr, "SIZE and ITERS must be positive\n");
        return 2;
    }
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) ||
        getsockname(ls, (struct sockaddr *)&a, &al)) {
        perror("listen");
        return 1;
    }
    char *buf = malloc(size);
    if (!buf) {
        perror("malloc");
        return 1;
    }
    memset(buf, 0x5a, size);
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    if (child == 0) {
        /* The receiver: reads everything, then answers one byte. Killed if the sender dies
         * first, so that it never waits in accept or recv for nobody. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1)
            _exit(1);
        pin_to(server_cpu);
        int fd = accept(ls, NULL, NULL);
        if (fd < 0) {
            perror("accept");
            _exit(1);
        }
        tune(fd);
        size_t left = size * (size_t)iters;
        while (left) {
            size_t want = left < size ? left : size;
            ssize_t k = recv(fd, buf, want, MSG_DONTWAIT);
            if (k > 0)
                left -= (size_t)k;
            else if (k == 0) {
                fprintf(stderr, "the sender closed early\n");
                _exit(1);
            } else if (errno != EINTR && errno != EAGAIN) {
                perror("recv");
                _exit(1);
            }
        }
        char one = 1;
        if (send(fd, &one, 1, MSG_NOSIGNAL) != 1)
            _exit(1);
        _exit(0);
    }
    pin_to(client_cpu);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        perror("connect");
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        return 1;
    }
    tune(fd);
    double t0 = now();
    for (long i = 0; i < iters; i++) {
        size_t off = 0;
        while (off < size) {
            ssize_t k = send(fd, buf + off, size - off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k > 0)
                off += (size_t)k;
            else if (errno != EINTR && errno != EAGAIN) {
                perror("send");
                return 1;
            }
        }
    }
    char one;
    if (recv(fd, &one, 1, MSG_WAITALL) != 1) {
        fprintf(stderr, "no answer from the receiver\n");
        return 1;
    }
    double t = now() - t0;
    int st = 0;
    waitpid(child, &st, 0);
    printf("%zu bytes x %ld: usec/msg %.2f MB/s %.1f\n", size, iters, t * 1e6 / iters,
           size * (double)iters / t / 1e6);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
