/* MPI ping-pong between ranks 0 and 1 with checked contents: rank 1 adds one to every byte it
 * receives and sends the buffer back; rank 0 checks each reply. Sizes 1 B to 4 MiB by powers of
 * 4, or those given after the iteration count (each at most 4 MiB; scripts/bench-mpi.sh).
 * Prints "size usec" per size (one-way, half the round trip) and "pingpong ok" at the end.
 *
 *   mpi_pingpong [ITERS [SIZE...]] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_LEN (4 << 20)

int main(int argc, char **argv)
{
	int rank, size;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	int iters = argc > 1 ? atoi(argv[1]) : 50;
	unsigned char *buf = malloc(MAX_LEN);
	if (!buf || size < 2)
		MPI_Abort(MPI_COMM_WORLD, 2);
	int nsizes = argc > 2 ? argc - 2 : 0;
	for (int k = 0, len = 1; nsizes ? k < nsizes : len <= MAX_LEN; k++, len *= 4) {
		if (nsizes)
			len = atoi(argv[2 + k]);
		if (len < 1 || len > MAX_LEN)
			MPI_Abort(MPI_COMM_WORLD, 2);
		double t0 = 0;
		for (int it = 0; it < iters + 1; it++) {
			if (it == 1)
				t0 = MPI_Wtime(); /* the first exchange is a warm-up */
			unsigned char seed = (unsigned char)(len + it);
			if (rank == 0) {
				for (int i = 0; i < len; i++)
					buf[i] = (unsigned char)(seed + i * 7);
				MPI_Send(buf, len, MPI_BYTE, 1, it, MPI_COMM_WORLD);
				MPI_Recv(buf, len, MPI_BYTE, 1, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				for (int i = 0; i < len; i++) {
					if (buf[i] != (unsigned char)(seed + i * 7 + 1)) {
						fprintf(stderr, "mpi_pingpong: size %d byte %d is %u, not %u\n",
							len, i, buf[i], (unsigned char)(seed + i * 7 + 1));
						MPI_Abort(MPI_COMM_WORLD, 1);
					}
				}
			} else if (rank == 1) {
				MPI_Recv(buf, len, MPI_BYTE, 0, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				for (int i = 0; i < len; i++)
					buf[i]++;
				MPI_Send(buf, len, MPI_BYTE, 0, it, MPI_COMM_WORLD);
			}
		}
		if (rank == 0)
			printf("%d %.2f\n", len, (MPI_Wtime() - t0) * 1e6 / iters / 2);
	}
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0)
		printf("pingpong ok\n");
	free(buf);
	MPI_Finalize();
	return 0;
}
