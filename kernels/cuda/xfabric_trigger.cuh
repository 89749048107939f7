/*
 * xfabric_trigger.cuh: ring XPU triggers from CUDA device code.
 *
 * A provider hands the host a list of `struct fi_trigger_var` (fi_trigger(3), XPU TRIGGERS):
 * addresses in memory this GPU can store to, and the values to store there. Copy the list to
 * device memory, and once a kernel's data is written, one thread calls xf_ring() on it. The
 * transfer starts without the CPU having to notice the kernel finished.
 *
 * Works with nvcc and with NVRTC (no system headers are included).
 */
#ifndef XFABRIC_TRIGGER_CUH
#define XFABRIC_TRIGGER_CUH

typedef unsigned char xf_u8;
typedef unsigned short xf_u16;
typedef unsigned int xf_u32;
typedef unsigned long long xf_u64;

/* enum fi_datatype values a trigger variable may carry (fi_domain.h, libfabric 1.17). */
#define XF_UINT8 1
#define XF_UINT16 3
#define XF_UINT32 5
#define XF_UINT64 7

/* struct fi_trigger_var exactly as fi_trigger.h declares it, unless that header came first. */
#ifndef FI_TRIGGER_H
struct fi_trigger_var {
    int datatype; /* enum fi_datatype */
    int count;
    void *addr;
    union {
        xf_u8 val8;
        xf_u16 val16;
        xf_u32 val32;
        xf_u64 val64;
        xf_u8 *data;
    } value;
};
#endif

static_assert(sizeof(struct fi_trigger_var) == 24, "struct fi_trigger_var is 24 bytes on LP64");
static_assert(sizeof(void *) == 8, "xfabric triggers assume 64-bit device pointers");

/*
 * Store one variable's value. Volatile stores of the variable's exact width: the provider
 * polls that word, so a wider store would clobber its neighbours and a torn or cached one would
 * be missed. Returns 0 for a variable that is not one of fi_trigger(3)'s four forms (nothing is
 * stored then).
 */
static __device__ __forceinline__ int xf_store_var(const struct fi_trigger_var *v)
{
    if (v->addr == 0)
        return 0;
    switch (v->datatype) {
    case XF_UINT8:
        if (v->count == 1) {
            *(volatile xf_u8 *)v->addr = v->value.val8;
        } else if (v->count > 1 && v->value.data != 0) {
            /* More than 64 bits: the bytes in order (the data array must be device-visible). */
            volatile xf_u8 *dst = (volatile xf_u8 *)v->addr;
            for (int i = 0; i < v->count; i++)
                dst[i] = v->value.data[i];
        } else {
            return 0;
        }
        return 1;
    case XF_UINT16:
        if (v->count != 1)
            return 0;
        *(volatile xf_u16 *)v->addr = v->value.val16;
        return 1;
    case XF_UINT32:
        if (v->count != 1)
            return 0;
        *(volatile xf_u32 *)v->addr = v->value.val32;
        return 1;
    case XF_UINT64:
        if (v->count != 1)
            return 0;
        *(volatile xf_u64 *)v->addr = v->value.val64;
        return 1;
    default:
        return 0;
    }
}

/*
 * Ring a trigger list: `n` variables, in order. Called by ONE thread, after the data the
 * transfer reads is written (see xf_publish_block for data written by a whole block).
 *
 * The fence before each store is what makes the trigger safe: __threadfence_system() is a
 * sequentially consistent system-scope fence, so everything this thread wrote or observed
 * before it (the payload, made visible to this thread by xf_publish_block) is visible to the
 * host and to peer devices before the variable's store is. The fence between variables keeps
 * them landing in the order fi_trigger(3) requires ("If multiple variables are specified, they
 * must be updated in order").
 *
 * Returns how many variables were stored: n, or the index of the first malformed variable
 * (the ones after it are not stored either, since a later variable must not land alone).
 */
static __device__ __forceinline__ int xf_ring(const struct fi_trigger_var *vars, int n)
{
    for (int i = 0; i < n; i++) {
        __threadfence_system();
        if (!xf_store_var(&vars[i]))
            return i;
    }
    return n;
}

/*
 * Every thread of the block calls this after its last data store and before one of them
 * rings: each thread fences its own stores at system scope, then the block meets. After it the
 * ringing thread's fence in xf_ring orders the whole block's data before the doorbell store,
 * whatever the compiler and the memory model would make of a barrier alone.
 */
static __device__ __forceinline__ void xf_publish_block(void)
{
    __threadfence_system();
    __syncthreads();
}

#endif /* XFABRIC_TRIGGER_CUH */
