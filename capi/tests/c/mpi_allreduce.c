/* MPI_Allreduce with checked results on every rank: sums of int64 and double vectors whose
 * elements depend on the rank and the index, counts from 1 to 1 Mi elements, and a max.
 * Prints "allreduce ok N" from rank 0. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
	int rank, size;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	const int max_count = 1 << 20;
	int64_t *in = malloc(sizeof *in * max_count), *out = malloc(sizeof *out * max_count);
	double *din = malloc(sizeof *din * max_count), *dout = malloc(sizeof *dout * max_count);
	if (!in || !out || !din || !dout)
		MPI_Abort(MPI_COMM_WORLD, 2);
	for (int count = 1; count <= max_count; count *= 8) {
		for (int i = 0; i < count; i++) {
			in[i] = (int64_t)(rank + 1) * (i + 1);
			din[i] = (double)rank + 0.5 * i;
		}
		MPI_Allreduce(in, out, count, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
		MPI_Allreduce(din, dout, count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
		int64_t ranks = (int64_t)size * (size + 1) / 2;
		for (int i = 0; i < count; i++) {
			/* Every term is an integer or a half: the sums are exact in a double. */
			double want = (double)size * (size - 1) / 2 + (double)size * 0.5 * i;
			if (out[i] != ranks * (i + 1) || dout[i] != want) {
				fprintf(stderr, "mpi_allreduce: rank %d count %d element %d: %lld and %g\n",
					rank, count, i, (long long)out[i], dout[i]);
				MPI_Abort(MPI_COMM_WORLD, 1);
			}
		}
	}
	int mine = rank * 3 + 1, top = 0;
	MPI_Allreduce(&mine, &top, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (top != (size - 1) * 3 + 1) {
		fprintf(stderr, "mpi_allreduce: max is %d\n", top);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	if (rank == 0)
		printf("allreduce ok %d\n", size);
	free(in);
	free(out);
	free(din);
	free(dout);
	MPI_Finalize();
	return 0;
}
