/* MPI one-sided communication with checked results on every rank: each rank exposes a window
 * of int64 counters; in fence epochs every rank puts a block into its right neighbour and gets
 * one back from its left; under passive target locks every rank adds to rank 0's counters
 * (MPI_Accumulate), takes tickets (MPI_Fetch_and_op), and every other rank tries to swap its
 * value into one slot (MPI_Compare_and_swap: exactly one wins). The window is the
 * application's memory (MPI_Win_create), so Open MPI moves every access through its osc
 * component over libfabric's RMA and atomics, none through shared memory. (Rank 0 does not
 * compare-and-swap on itself: Open MPI 4.1.4's osc rdma hands btl ofi a NULL registration for
 * that, which btl ofi dereferences before libfabric is called.) Prints "rma ok N" from rank
 * 0. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define BLOCK 4096 /* int64s per put: 32 KiB */

static void check(int ok, int rank, const char *what, long long got, long long want)
{
	if (!ok) {
		fprintf(stderr, "mpi_rma: rank %d: %s: %lld, expected %lld\n", rank, what, got, want);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
}

int main(int argc, char **argv)
{
	int rank, size;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	/* [0, BLOCK): what the left neighbour puts; [BLOCK]: accumulate target; [BLOCK+1]:
	 * ticket counter; [BLOCK+2]: compare-and-swap target. */
	const MPI_Aint n = BLOCK + 3;
	int64_t *base = malloc(n * sizeof(int64_t));
	if (!base)
		MPI_Abort(MPI_COMM_WORLD, 2);
	MPI_Win win;
	MPI_Win_create(base, n * sizeof(int64_t), sizeof(int64_t), MPI_INFO_NULL, MPI_COMM_WORLD,
		       &win);
	for (MPI_Aint i = 0; i < n; i++)
		base[i] = -1;
	base[BLOCK] = 0;
	base[BLOCK + 1] = 0;
	base[BLOCK + 2] = -1;
	int right = (rank + 1) % size, left = (rank + size - 1) % size;
	int64_t *out = malloc(BLOCK * sizeof *out), *back = malloc(BLOCK * sizeof *back);
	if (!out || !back)
		MPI_Abort(MPI_COMM_WORLD, 2);

	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < BLOCK; i++)
			out[i] = (int64_t)rank * 1000000 + round * 10000 + i;
		MPI_Win_fence(0, win);
		MPI_Put(out, BLOCK, MPI_INT64_T, right, 0, BLOCK, MPI_INT64_T, win);
		MPI_Win_fence(0, win);
		for (int i = 0; i < BLOCK; i++)
			check(base[i] == (int64_t)left * 1000000 + round * 10000 + i, rank, "put",
			      (long long)base[i], (long long)left * 1000000 + round * 10000 + i);
		/* What our right neighbour now holds is what we put there. */
		MPI_Get(back, BLOCK, MPI_INT64_T, right, 0, BLOCK, MPI_INT64_T, win);
		MPI_Win_fence(0, win);
		for (int i = 0; i < BLOCK; i++)
			check(back[i] == out[i], rank, "get", (long long)back[i], (long long)out[i]);
	}

	/* Passive target: everyone works on rank 0's counters at once. */
	const int adds = 50;
	int64_t one = 1, ticket = 0;
	MPI_Win_lock_all(0, win);
	for (int i = 0; i < adds; i++) {
		int64_t v = rank + 1;
		MPI_Accumulate(&v, 1, MPI_INT64_T, 0, BLOCK, 1, MPI_INT64_T, MPI_SUM, win);
		MPI_Fetch_and_op(&one, &ticket, MPI_INT64_T, 0, BLOCK + 1, MPI_SUM, win);
		MPI_Win_flush(0, win);
		check(ticket >= 0 && ticket < (int64_t)adds * size, rank, "ticket", (long long)ticket,
		      0);
	}
	/* Exactly one of the other ranks finds -1 and installs its value. */
	int64_t mine = rank + 1, expect = -1, prior = 0;
	if (rank != 0) {
		MPI_Compare_and_swap(&mine, &expect, &prior, MPI_INT64_T, 0, BLOCK + 2, win);
		MPI_Win_flush(0, win);
	}
	MPI_Win_unlock_all(win);
	int won = rank != 0 && prior == -1, winners = 0;
	MPI_Allreduce(&won, &winners, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	check(winners == 1, rank, "compare-and-swap winners", winners, 1);
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0) {
		int64_t sum = (int64_t)adds * size * (size + 1) / 2;
		MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
		int64_t acc = base[BLOCK], tk = base[BLOCK + 1], cas = base[BLOCK + 2];
		MPI_Win_unlock(0, win);
		check(acc == sum, rank, "accumulated", (long long)acc, (long long)sum);
		check(tk == (int64_t)adds * size, rank, "tickets", (long long)tk,
		      (long long)adds * size);
		check(cas >= 2 && cas <= size, rank, "swapped in", (long long)cas, 2);
		printf("rma ok %d\n", size);
	}
	free(out);
	free(back);
	MPI_Win_free(&win);
	free(base);
	MPI_Finalize();
	return 0;
}
