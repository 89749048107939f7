/* The probes' optional SERVER_CPU CLIENT_CPU arguments: bench.sh pins a probe's two processes
 * as it pins the server and the client of a library's ping-pong, so that both figures come
 * from the same placement. A probe includes this after defining _GNU_SOURCE (for CPU_SET). */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

/* Pins the calling process to CPU `cpu` (a decimal number); NULL leaves it where it is. */
static void pin_to(const char *cpu) {
    if (!cpu)
        return;
    char *end;
    long c = strtol(cpu, &end, 10);
    if (end == cpu || *end || c < 0 || c >= CPU_SETSIZE) {
        fprintf(stderr, "not a CPU number: '%s'\n", cpu);
        exit(2);
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)c, &set);
    if (sched_setaffinity(0, sizeof set, &set)) {
        perror("sched_setaffinity");
        exit(1);
    }
}
