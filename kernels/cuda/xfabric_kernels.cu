/*
 * xfabric's kernels: a plain signal, and "compute, then trigger each bucket as it is ready".
 * Compiled at run time by NVRTC (xfabric-kernels' Rust side supplies the header).
 */
#include "xfabric_trigger.cuh"

/* Ring `n` variables from one thread. Launch with one block of one thread. */
extern "C" __global__ void xf_signal(const struct fi_trigger_var *vars, int n)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        xf_ring(vars, n);
}

/* A relaxed load that the compiler must reissue: ready flags and `next` change under us. */
static __device__ __forceinline__ unsigned xf_load(const unsigned *p)
{
    return *(const volatile unsigned *)p;
}

/*
 * Ring every bucket whose data is ready, in bucket order, from whichever block gets there
 * first. Called by one thread per block, after that block set its own ready flag.
 *
 * Why this shape: the triggers of one endpoint share one doorbell whose value only grows, so
 * bucket k's variable must be stored after bucket k-1's. Blocks finish in any order, and a
 * block must never wait for another one: a block not yet scheduled (more buckets than the GPU
 * holds at once) would never arrive, and the waiter would hold its SM forever. So nobody waits.
 * A block sets ready[k], then tries (once) to take a lock; the holder rings bucket `next` while
 * it is ready, advancing `next`. A block that finds the lock taken simply leaves: the holder
 * will ring its bucket.
 *
 * The lost wake-up: the holder may check ready[next] just before block k sets it, and block k
 * may try the lock just before the holder frees it. So after freeing the lock the holder looks
 * at ready[next] once more and, if it is set, tries the lock again. Store-buffering argument,
 * with __threadfence() being a sequentially consistent gpu-scope fence:
 *     block k:  store ready[k]=1; fence; CAS(lock) sees 1
 *     holder:   store lock=0;     fence; load ready[next]
 * the two fences are ordered one way or the other: either block k's CAS sees the lock free (and
 * block k drains), or the holder's load sees ready[k] (and the holder goes round again). If the
 * lock block k saw taken belongs to a later holder, the same holds for that one.
 *
 * Each bucket's data reached system scope before its ready flag was set (xf_publish_block in
 * the computing block), and xf_ring fences at system scope before every store, so the data is
 * visible to the host before the doorbell that starts its transfer. Only the lock holder
 * touches `next` and the doorbells; the fences around the lock make its `next` visible to the
 * following holder.
 */
static __device__ void xf_ring_ready_in_order(const struct fi_trigger_var *vars, unsigned nvars,
                                              unsigned *ready, unsigned *ring_state)
{
    unsigned *lock = &ring_state[0];
    unsigned *next = &ring_state[1];
    for (;;) {
        if (atomicCAS(lock, 0u, 1u) != 0u)
            return; /* the holder will see our flag (above) */
        __threadfence(); /* acquire: the previous holder's `next` and the flags it read */
        unsigned k = xf_load(next);
        while (k < nvars && xf_load(&ready[k]) != 0u) {
            if (xf_ring(&vars[k], 1) != 1) {
                /* A malformed variable: later doorbells must not pass it, and nobody may
                 * come back to it (ready[k] stays set, so the look after the unlock below
                 * would take the lock again for ever): `next` goes past every bucket. */
                k = nvars;
                break;
            }
            k++;
        }
        *(volatile unsigned *)next = k;
        __threadfence(); /* release: `next` before the lock is seen free */
        atomicExch(lock, 0u);
        __threadfence(); /* the store-buffering fence of the argument above */
        if (k >= nvars || xf_load(&ready[k]) == 0u)
            return;
        /* ready[k] was set after our last look: go round, unless someone else holds it now. */
    }
}

/*
 * Bucket k's compute: each of the block's threads writes its elements of bucket k,
 *     out[i] = (uint32_t)(i * 2654435761u) ^ seed   for i in [k*bucket_elems, (k+1)*bucket_elems)
 * (global index i; the host checks the same formula), computing each one `passes` times over,
 * times k + 1 when `staggered`. The extra passes are work and nothing else (a xorshift chain
 * the compiler cannot fold, whose state is never 0, so the bytes stored are the pattern's):
 * they give a bucket a compute time of the caller's choosing. Staggered, bucket k is ready
 * k + 1 bucket-times after the launch, as on an XPU that computes the buckets one after the
 * other (layers in order), although every block runs at once and none waits for another.
 */
static __device__ __forceinline__ void xf_compute_bucket(xf_u32 *out, unsigned k,
                                                         unsigned bucket_elems, xf_u32 seed,
                                                         unsigned passes, unsigned staggered)
{
    const xf_u64 base = (xf_u64)k * bucket_elems;
    const xf_u64 rounds = (xf_u64)(passes > 0u ? passes : 1u) * (staggered ? (xf_u64)k + 1 : 1);
    for (unsigned j = threadIdx.x; j < bucket_elems; j += blockDim.x) {
        const xf_u64 i = base + j;
        const xf_u32 v = (xf_u32)(i * 2654435761ull) ^ seed;
        xf_u32 x = v | 1u;
        for (xf_u64 p = 1; p < rounds; p++) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
        }
        out[i] = x != 0u ? v : ~v; /* always v: xorshift keeps a non-zero state non-zero */
    }
}

/*
 * Compute then trigger. Block k computes bucket k (xf_compute_bucket), then bucket k's doorbell
 * variable vars[k] is rung, buckets strictly in order. `out` is pinned host memory mapped into
 * the device, so the host-side send reads it in place. `ready` (nbuckets words) and
 * `ring_state` ([lock, next]) are device memory, zeroed before the launch.
 */
extern "C" __global__ void xf_compute_and_trigger(xf_u32 *out, unsigned bucket_elems,
                                                  unsigned nbuckets, xf_u32 seed,
                                                  unsigned passes, unsigned staggered,
                                                  const struct fi_trigger_var *vars,
                                                  unsigned *ready, unsigned *ring_state)
{
    const unsigned k = blockIdx.x;
    if (k >= nbuckets)
        return;
    xf_compute_bucket(out, k, bucket_elems, seed, passes, staggered);
    xf_publish_block();
    if (threadIdx.x != 0)
        return;
    atomicExch(&ready[k], 1u);
    __threadfence(); /* ready[k] before the lock attempt (the argument above) */
    xf_ring_ready_in_order(vars, nbuckets, ready, ring_state);
}

/*
 * The same compute with no trigger (the ordinary way: the host waits for the kernel, then
 * posts the sends). Block k computes bucket k.
 */
extern "C" __global__ void xf_compute(xf_u32 *out, unsigned bucket_elems, unsigned nbuckets,
                                      xf_u32 seed, unsigned passes, unsigned staggered)
{
    const unsigned k = blockIdx.x;
    if (k >= nbuckets)
        return;
    xf_compute_bucket(out, k, bucket_elems, seed, passes, staggered);
}
