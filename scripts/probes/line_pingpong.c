/* The physical limit for the shm provider on this machine: two processes ping-ponging SIZE
 * bytes through shared memory with no library, each direction one buffer whose first word is
 * the sequence number the reader spins on (written last, with release) and whose bytes follow
 * it in the same and the next cache lines, as a small message shares its ring slot with its
 * sequence word. The reader copies the bytes out. Prints usec per one-way transfer (half a
 * round trip) and MB/s, as fi_pingpong does. At 8 B this is one cache line handed from core to
 * core and back: no ring protocol, completion queue or liveness check can go below it.
 * With SERVER_CPU and CLIENT_CPU, the echoing process runs on the first, the timing one on the
 * second.
 *   cc -O2 -o line_pingpong scripts/probes/line_pingpong.c &&
 *   ./line_pingpong SIZE ITERS [SERVER_CPU CLIENT_CPU] */
#define _GNU_SOURCE
#include "pin.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct dir {
    _Alignas(64) uint64_t seq;
    unsigned char bytes[];
};

static size_t stride(size_t size) { return (sizeof(uint64_t) + size + 63) / 64 * 64; }

static void put(struct dir *d, const unsigned char *src, size_t size, uint64_t seq) {
    memcpy(d->bytes, src, size);
    __atomic_store_n(&d->seq, seq, __ATOMIC_RELEASE);
}

static void take(struct dir *d, unsigned char *dst, size_t size, uint64_t seq) {
    while (__atomic_load_n(&d->seq, __ATOMIC_ACQUIRE) != seq)
        __builtin_ia32_pause();
    memcpy(dst, d->bytes, size);
}

int main(int argc, char **argv) {
    size_t size = argc > 1 ? strtoul(argv[1], 0, 0) : 8;
    long iters = argc > 2 ? strtol(argv[2], 0, 0) : 10000;
    if (argc == 4 || argc > 5 || iters < 10) {
        fprintf(stderr, "usage: %s [SIZE [ITERS>=10 [SERVER_CPU CLIENT_CPU]]]\n", argv[0]);
        return 2;
    }
    const char *server_cpu = argc == 5 ? argv[3] : NULL, *client_cpu = argc == 5 ? argv[4] : NULL;
    size_t s = stride(size);
    unsigned char *shared = mmap(0, 2 * s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) { perror("mmap"); return 1; }
    struct dir *ping = (struct dir *)shared, *pong = (struct dir *)(shared + s);
    unsigned char *buf = malloc(size ? size : 1);
    memset(buf, 0xa5, size);
    pid_t pid = fork();
    if (pid == 0) {
        pin_to(server_cpu);
        for (long i = 1; i <= iters; i++) { take(ping, buf, size, i); put(pong, buf, size, i); }
        return 0;
    }
    pin_to(client_cpu);
    struct timespec t0, t1;
    long warm = iters / 10;
    for (long i = 1; i <= iters; i++) {
        if (i == warm + 1) clock_gettime(CLOCK_MONOTONIC, &t0);
        put(ping, buf, size, i);
        take(pong, buf, size, i);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    waitpid(pid, 0, 0);
    double us = ((t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3);
    long n = iters - warm;
    printf("%zu bytes: %.3f usec/xfer %.2f MB/s\n", size, us / n / 2, size * 2.0 * n / us);
    return 0;
}
