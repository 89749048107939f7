/* The physical limit for the tcp provider on this machine: two processes ping-ponging SIZE
 * bytes over loopback TCP, busy-polling non-blocking sockets (TCP_NODELAY), no library.
 * Prints usec per one-way transfer (half a round trip) and MB/s, as fi_pingpong does. With
 * SERVER_CPU and CLIENT_CPU, the echoing process runs on the first, the timing one on the second.
 *   cc -O2 -o tcp_pingpong scripts/probes/tcp_pingpong.c &&
 *   ./tcp_pingpong SIZE ITERS [SERVER_CPU CLIENT_CPU] */
#define _GNU_SOURCE
#include "pin.h"
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

static void full_send(int fd, const char *b, size_t n) {
    while (n) {
        ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
        if (k > 0) { b += k; n -= (size_t)k; }
        else if (k < 0 && errno != EAGAIN && errno != EINTR) { perror("send"); exit(1); }
    }
}

static void full_recv(int fd, char *b, size_t n) {
    while (n) {
        ssize_t k = recv(fd, b, n, 0);
        if (k > 0) { b += k; n -= (size_t)k; }
        else if (k == 0) { fprintf(stderr, "peer closed\n"); exit(1); }
        else if (errno != EAGAIN && errno != EINTR) { perror("recv"); exit(1); }
    }
}

static void tune(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

int main(int argc, char **argv) {
    size_t size = argc > 1 ? strtoul(argv[1], 0, 0) : 8;
    long iters = argc > 2 ? strtol(argv[2], 0, 0) : 10000;
    if (argc == 4 || argc > 5) {
        fprintf(stderr, "usage: %s [SIZE [ITERS [SERVER_CPU CLIENT_CPU]]]\n", argv[0]);
        return 2;
    }
    const char *server_cpu = argc == 5 ? argv[3] : NULL, *client_cpu = argc == 5 ? argv[4] : NULL;
    char *buf = malloc(size ? size : 1);
    memset(buf, 0xa5, size);
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) ||
        getsockname(ls, (struct sockaddr *)&a, &al)) { perror("listen"); return 1; }
    pid_t pid = fork();
    if (pid == 0) {
        pin_to(server_cpu);
        int fd = accept(ls, 0, 0);
        tune(fd);
        for (long i = 0; i < iters; i++) { full_recv(fd, buf, size); full_send(fd, buf, size); }
        return 0;
    }
    pin_to(client_cpu);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) { perror("connect"); return 1; }
    tune(fd);
    for (long i = 0; i < iters / 10; i++) { full_send(fd, buf, size); full_recv(fd, buf, size); }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = iters / 10; i < iters; i++) { full_send(fd, buf, size); full_recv(fd, buf, size); }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    waitpid(pid, 0, 0);
    double us = ((t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3);
    long n = iters - iters / 10;
    printf("%zu bytes: %.2f usec/xfer %.2f MB/s\n", size, us / n / 2, size * 2.0 * n / us);
    return 0;
}
