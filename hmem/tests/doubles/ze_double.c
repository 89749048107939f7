/*
 * TEST DOUBLE -- this is NOT Level Zero and drives no hardware.
 *
 * A stand-in for libze_loader.so.1 that xfabric-hmem's tests compile with `cc -shared -fPIC`
 * and load through XFABRIC_ZE_LOADER / Ze::with_loader, so the real Rust FFI path (symbol
 * resolution, struct layouts, by-value handles, error codes) runs on machines without an Intel
 * GPU. It fakes ZE_DOUBLE_DEVICES devices (default 2) whose "device memory" is ordinary host
 * memory: every allocation is a memfd mapped MAP_SHARED, an IPC handle carries that memfd's
 * descriptor in its first four bytes (as Intel's driver carries a dma-buf fd), and opening a
 * handle maps the descriptor again at a new address. Copies are memcpy.
 *
 * It checks what a real driver would reject (structure types, unknown handles and pointers,
 * overlapping copies), and more: a copy must use the command list of the device that owns
 * the allocation it touches. It counts live objects so tests can assert that nothing leaked:
 * ze_double_live() is not a Level Zero call. Nor are ze_double_copies_to_device() and
 * ze_double_copies_from_device(), which count the copies whose destination (source) is device
 * memory: the double's device memory is host memory, so only they show that code which must
 * not dereference device pointers went through the driver instead.
 *
 * Build with -DZE_DOUBLE_FAIL_INIT to get a loader whose zeInit fails, as on a machine with
 * the loader installed but no GPU.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef ZE_DOUBLE_DEVICES
#define ZE_DOUBLE_DEVICES 2
#endif

typedef uint32_t ze_result_t;
#define ZE_RESULT_SUCCESS 0u
#define ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY 0x70000002u
#define ZE_RESULT_ERROR_UNINITIALIZED 0x78000001u
#define ZE_RESULT_ERROR_INVALID_ARGUMENT 0x78000004u
#define ZE_RESULT_ERROR_INVALID_NULL_HANDLE 0x78000005u
#define ZE_RESULT_ERROR_INVALID_NULL_POINTER 0x78000007u
#define ZE_RESULT_ERROR_INVALID_SIZE 0x78000008u
#define ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT 0x7800000au
#define ZE_RESULT_ERROR_OVERLAPPING_REGIONS 0x7800001au

enum { MEM_UNKNOWN = 0, MEM_HOST = 1, MEM_DEVICE = 2 };

/* The double's own declarations of the structures it reads or writes (ze_api.h layouts). */
struct desc_base { uint32_t stype; const void *pNext; };
struct ctx_desc { uint32_t stype; const void *pNext; uint32_t flags; };
struct host_desc { uint32_t stype; const void *pNext; uint32_t flags; };
struct dev_desc { uint32_t stype; const void *pNext; uint32_t flags; uint32_t ordinal; };
struct alloc_props { uint32_t stype; void *pNext; uint32_t type; uint64_t id; uint64_t pageSize; };
struct queue_desc {
	uint32_t stype; const void *pNext; uint32_t ordinal, index, flags, mode, priority;
};
struct dev_props {
	uint32_t stype; void *pNext; uint32_t type, vendorId, deviceId, flags, subdeviceId;
	uint32_t coreClockRate; uint64_t maxMemAllocSize; uint32_t maxHardwareContexts;
	uint32_t maxCommandQueuePriority, numThreadsPerEU, physicalEUSimdWidth, numEUsPerSubslice;
	uint32_t numSubslicesPerSlice, numSlices; uint64_t timerResolution;
	uint32_t timestampValidBits, kernelTimestampValidBits; uint8_t uuid[16]; char name[256];
};
typedef struct { char data[64]; } ipc_handle;

#define IPC_MAGIC "ZEDBL"

struct object { uint32_t magic; int device; };
#define CTX_MAGIC 0xc0c0c0c0u
#define LIST_MAGIC 0x11511511u

struct region {
	void *base;
	size_t len;
	uint32_t type;
	int device;
	int fd;     /* -1 for opened IPC mappings */
	int opened; /* 1: made by zeMemOpenIpcHandle */
};

#define MAX_REGIONS 256
static struct region regions[MAX_REGIONS];
static int nregions;
static int live_objects; /* contexts and command lists */
static int copies_to_device, copies_from_device;
static int initialized;
static int driver_tag;
static int device_tags[ZE_DOUBLE_DEVICES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int device_index(const void *h)
{
	for (int i = 0; i < ZE_DOUBLE_DEVICES; i++)
		if (h == &device_tags[i])
			return i;
	return -1;
}

static int is_ctx(const void *c)
{
	return c && ((const struct object *)c)->magic == CTX_MAGIC;
}

/* The region containing p, or NULL. Caller holds the lock. */
static struct region *find(const void *p)
{
	for (int i = 0; i < nregions; i++) {
		const char *b = regions[i].base;
		if ((const char *)p >= b && (const char *)p < b + regions[i].len)
			return &regions[i];
	}
	return NULL;
}

static void drop_region(struct region *r)
{
	*r = regions[--nregions];
}

/* Exported for tests only: live allocations, mappings, contexts and command lists. */
int ze_double_live(void)
{
	pthread_mutex_lock(&lock);
	int n = nregions + live_objects;
	pthread_mutex_unlock(&lock);
	return n;
}

/* Exported for tests only: copies into device memory so far. */
int ze_double_copies_to_device(void)
{
	pthread_mutex_lock(&lock);
	int n = copies_to_device;
	pthread_mutex_unlock(&lock);
	return n;
}

/* Exported for tests only: copies out of device memory so far. */
int ze_double_copies_from_device(void)
{
	pthread_mutex_lock(&lock);
	int n = copies_from_device;
	pthread_mutex_unlock(&lock);
	return n;
}

ze_result_t zeInit(uint32_t flags)
{
	(void)flags;
#ifdef ZE_DOUBLE_FAIL_INIT
	return ZE_RESULT_ERROR_UNINITIALIZED;
#else
	initialized = 1;
	return ZE_RESULT_SUCCESS;
#endif
}

ze_result_t zeDriverGet(uint32_t *count, void **drivers)
{
	if (!initialized)
		return ZE_RESULT_ERROR_UNINITIALIZED;
	if (!count)
		return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
	if (*count == 0 || !drivers) {
		*count = 1;
		return ZE_RESULT_SUCCESS;
	}
	drivers[0] = &driver_tag;
	*count = 1;
	return ZE_RESULT_SUCCESS;
}

ze_result_t zeDeviceGet(void *driver, uint32_t *count, void **devices)
{
	if (driver != &driver_tag)
		return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
	if (!count)
		return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
	if (*count == 0 || !devices) {
		*count = ZE_DOUBLE_DEVICES;
		return ZE_RESULT_SUCCESS;
	}
	uint32_t n = *count < ZE_DOUBLE_DEVICES ? *count : ZE_DOUBLE_DEVICES;
	for (uint32_t i = 0; i < n; i++)
		devices[i] = &device_tags[i];
	*count = n;
	return ZE_RESULT_SUCCESS;
}

ze_result_t zeDeviceGetProperties(void *device, struct dev_props *p)
{
	int d = device_index(device);
	if (d < 0)
		return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
	if (!p || p->stype != 0x3)
		return ZE_RESULT_ERROR_INVALID_ARGUMENT;
	p->type = 1; /* ZE_DEVICE_TYPE_GPU */
	p->vendorId = 0x8086;
	p->maxMemAllocSize = 1ull << 30;
	p->timestampValidBits = 0xdead;
	p->kernelTimestampValidBits = 0xbeef;
	memset(p->uuid, d, sizeof p->uuid);
	snprintf(p->name, sizeof p->name, "xfabric test double ze device %d", d);
	return ZE_RESULT_SUCCESS;
}

ze_result_t zeContextCreate(void *driver, const struct ctx_desc *desc, void **ctx)
{
	if (driver != &driver_tag)
		return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
	if (!desc || desc->stype != 0xd || !ctx)
		return ZE_RESULT_ERROR_INVALID_ARGUMENT;
	struct object *o = malloc(sizeof *o);
	if (!o)
		return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
	o->magic = CTX_MAGIC;
	o->device = -1;
	pthread_mutex_lock(&lock);
	live_objects++;
	pthread_mutex_unlock(&lock);
	*ctx = o;
	return ZE_RESULT_SUCCESS;
}

ze_result_t zeContextDestroy(void *ctx)
{
	if (!is_ctx(ctx))
		return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
	((struct object *)ctx)->magic = 0;
	free(ctx);
	pthread_mutex_lock(&lock);
	live_objects--;
	pthread_mutex_unlock(&lock);
	return ZE_RESULT_SUCCESS;
}

static ze_result_t alloc(void *ctx, size_t len, size_t align, int device, uint32_t type, void **out)
{
	if (!is_ctx(ctx))
		return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
	if (!out)
		return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
	if (len == 0)
		return ZE_RESULT_ERROR_INVALID_SIZE;
	if (align & (align - 1))
		return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
	int fd = (int)syscall(SYS_memfd_create, "ze-double", 0);
	if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
		if (fd >= 0)
			close(fd);
		return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
	}
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		close(fd);
		return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
	}
	pthread_mutex_lock(&lock);
	if (nregions == MAX_REGIONS) {
		pthread_mutex_unlock(&lock);
		munmap(p, len);
		close(fd);
		return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
	}
	regions[nregions++] = (struct region){ p, len, type, device, fd, 0 };
	pthread_mutex_unlock(&lock);
	*out = p;
	return ZE_RESULT_SUCCESS;
}

ze_result_t zeMemAllocHost(void *ctx, const struct host_desc *desc, size_t len, size_t align, void **out)
{
	if (!desc || desc->stype != 0x16)
		return ZE_RESULT_ERROR_INVALID_ARGUMENT;
	return alloc(ctx, len, align, -1, MEM_HOST, out);
}

ze_result_t zeMemAllocDevice(void *ctx, const struct dev_desc *desc, size_t len, size_t align,
			     void *device, void **out)
{
	if (!desc || desc->stype != 0x15)
		return ZE_RESULT_ERROR_INVALID_ARGUMENT;
	int d = device_index(device);
	if (d < 0)
		return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
	return alloc(ctx, len, align, d, MEM_DEVICE, out);
}

ze_result_t zeMemFree(void *ctx, void *p)
{
	if (!is_ctx(ctx))
		return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
	pthread_mutex_lock(&lock);
	struct region *r = find(p);
	if (!r || r->base != p || r->opened) {
		pthread_mutex_unlock(&lock);
		return ZE_RESULT_ERROR_INVALID_ARGUMENT;
	}
	munmap(r->base, r->len);
	close(r->fd);
	drop_region(r);
	pthread_mutex_unlock(&lock);
	return ZE_RESULT_SUCCESS;
}

ze_result_t zeMemGetAllocProperties(void *ctx, const void *p, struct alloc_props *props, void **device)
{
	if (!is_ctx(ctx))
		return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
	if (!p || !props)
		return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
	if (props->stype != 0x17)
		return ZE_RESULT_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&lock);
	struct region *r = find(p);
	props->type = r ? r->type : MEM_UNKNOWN;
	props->id = r ? (uint64_t)(uintptr_t)r->base : 0;
	props->pageSize = r ? 4096 : 0;
	if (device)
		*device = (r && r->device >= 0) ? &device_tags[r->device] : NULL;
	pthread_mutex_unlock(&lock);
	return ZE_RESULT_SUCCESS;
}

ze_result_t zeMemGetAddressRange(void *ctx, const void *p, void **base, size_t *size)
{
	if (!is_ctx(ctx))
		return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
	pthread_mutex_lock(&lock);
	struct region *r = find(p);
	if (r) {
		if (base)
			*base = r->base;
		if (size)
			*size = r->len;
	}
	pthread_mutex_unlock(&lock);
	return r ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_ARGUMENT;
}

ze_result_t zeMemGetIpcHandle(void *ctx, const void *p, ipc_handle *h)
{
	if (!is_ctx(ctx))
		return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
	if (!h)
		return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
	pthread_mutex_lock(&lock);
	struct region *r = find(p);
	if (!r || r->base != p || r->type != MEM_DEVICE || r->opened) {
		pthread_mutex_unlock(&lock);
		return ZE_RESULT_ERROR_INVALID_ARGUMENT;
	}
	uint64_t len = r->len;
	int32_t dev = r->device;
	memset(h, 0, sizeof *h);
	memcpy(h->data, &r->fd, 4);
	memcpy(h->data + 4, IPC_MAGIC, 5);
	memcpy(h->data + 16, &len, 8);
	memcpy(h->data + 24, &dev, 4);
	pthread_mutex_unlock(&lock);
	return ZE_RESULT_SUCCESS;
}

/* The handle arrives by value, as in ze_api.h; a caller passing a pointer fails the magic. */
ze_result_t zeMemOpenIpcHandle(void *ctx, void *device, ipc_handle h, uint32_t flags, void **out)
{
	(void)flags;
	if (!is_ctx(ctx) || device_index(device) < 0)
		return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
	if (!out)
		return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
	if (memcmp(h.data + 4, IPC_MAGIC, 5) != 0)
		return ZE_RESULT_ERROR_INVALID_ARGUMENT;
	int fd;
	uint64_t len;
	int32_t dev;
	memcpy(&fd, h.data, 4);
	memcpy(&len, h.data + 16, 8);
	memcpy(&dev, h.data + 24, 4);
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return ZE_RESULT_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&lock);
	if (nregions == MAX_REGIONS) {
		pthread_mutex_unlock(&lock);
		munmap(p, len);
		return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
	}
	regions[nregions++] = (struct region){ p, len, MEM_DEVICE, dev, -1, 1 };
	pthread_mutex_unlock(&lock);
	*out = p;
	return ZE_RESULT_SUCCESS;
}

ze_result_t zeMemCloseIpcHandle(void *ctx, const void *p)
{
	if (!is_ctx(ctx))
		return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
	pthread_mutex_lock(&lock);
	struct region *r = find(p);
	if (!r || r->base != p || !r->opened) {
		pthread_mutex_unlock(&lock);
		return ZE_RESULT_ERROR_INVALID_ARGUMENT;
	}
	munmap(r->base, r->len);
	drop_region(r);
	pthread_mutex_unlock(&lock);
	return ZE_RESULT_SUCCESS;
}

ze_result_t zeCommandListCreateImmediate(void *ctx, void *device, const struct queue_desc *desc, void **list)
{
	int d = device_index(device);
	if (!is_ctx(ctx) || d < 0)
		return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
	if (!desc || desc->stype != 0xe || !list)
		return ZE_RESULT_ERROR_INVALID_ARGUMENT;
	struct object *o = malloc(sizeof *o);
	if (!o)
		return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
	o->magic = LIST_MAGIC;
	o->device = d;
	pthread_mutex_lock(&lock);
	live_objects++;
	pthread_mutex_unlock(&lock);
	*list = o;
	return ZE_RESULT_SUCCESS;
}

ze_result_t zeCommandListAppendMemoryCopy(void *list, void *dst, const void *src, size_t len,
					  void *signal, uint32_t nwait, void **waits)
{
	(void)signal;
	(void)waits;
	if (!list || ((struct object *)list)->magic != LIST_MAGIC)
		return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
	if (!dst || !src)
		return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
	if (nwait != 0)
		return ZE_RESULT_ERROR_INVALID_ARGUMENT;
	const char *d = dst, *s = src;
	if (d < s + len && s < d + len)
		return ZE_RESULT_ERROR_OVERLAPPING_REGIONS;
	/* A device allocation is copied by its own device's list: xfabric never relies on peer
	 * access (which a real driver grants only between some devices). Opened IPC mappings are
	 * left out: they may be opened on any device. */
	int dev = ((struct object *)list)->device;
	pthread_mutex_lock(&lock);
	struct region *rd = find(dst), *rs = find(src);
	if ((rd && rd->type == MEM_DEVICE && !rd->opened && rd->device != dev) ||
	    (rs && rs->type == MEM_DEVICE && !rs->opened && rs->device != dev)) {
		pthread_mutex_unlock(&lock);
		return ZE_RESULT_ERROR_INVALID_ARGUMENT;
	}
	copies_to_device += rd && rd->type == MEM_DEVICE;
	copies_from_device += rs && rs->type == MEM_DEVICE;
	pthread_mutex_unlock(&lock);
	memcpy(dst, src, len);
	return ZE_RESULT_SUCCESS;
}

ze_result_t zeCommandListDestroy(void *list)
{
	if (!list || ((struct object *)list)->magic != LIST_MAGIC)
		return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
	((struct object *)list)->magic = 0;
	free(list);
	pthread_mutex_lock(&lock);
	live_objects--;
	pthread_mutex_unlock(&lock);
	return ZE_RESULT_SUCCESS;
}
