/*
 * TEST DOUBLE -- this is NOT the CUDA driver and drives no GPU.
 *
 * A stand-in for libcuda.so that xfabric-hmem's tests compile with `cc -shared -fPIC`, name
 * libcuda.so in a directory of its own, and put first on LD_LIBRARY_PATH of a child test
 * process, so that cudarc's run-time loading and xfabric's CUDA code path (probe, contexts,
 * streams, pointer queries, copies, mapped host memory, registration, IPC) run on machines
 * without an NVIDIA GPU. It exports exactly the driver symbols xfabric calls, under the names
 * cudarc resolves (the _v2 entry points included).
 *
 * It fakes CUDA_DOUBLE_DEVICES devices (default 2) whose "device memory" is host memory: each
 * cuMemAlloc is a memfd mapped MAP_SHARED, an IPC handle records the exporting pid and that
 * memfd's descriptor, and cuIpcOpenMemHandle in another process maps /proc/<pid>/fd/<fd>. It
 * checks what the driver checks (a current context where one is needed, known pointers, host
 * registration overlap, no IPC open in the exporting process) and fills cuMemHostAlloc memory
 * with 0xab so tests can see that xfabric zeroes it. Host-to-device copies land only when
 * their stream is synchronized (as on a device, an async copy is not visible before that).
 * cuda_double_live() is not a CUDA call: it counts live allocations, mappings, registrations,
 * streams and context references; cuda_double_htod_landed() counts host-to-device copies that
 * landed and cuda_double_htod_pending() those still waiting for a synchronize;
 * cuda_double_dtoh_copies() counts device-to-host copies (a test sees that data was staged
 * out of "device memory" the process could otherwise read directly). With
 * CUDA_DOUBLE_LAND_DELAY_US set, a synchronize waits that long before the held copies land,
 * as a busy device would (so a test can see who reports data before it is there).
 *
 * IPC across processes: each cuMemAlloc memfd is named for the allocation's id (the driver's
 * CU_POINTER_ATTRIBUTE_BUFFER_ID, never reused in a process), and the handle carries it; an
 * open checks that /proc/<pid>/fd/<fd> is still that allocation's memfd and refuses a stale
 * handle (the allocation freed, its descriptor number reused) with CUDA_ERROR_INVALID_HANDLE,
 * as the driver refuses a handle to freed memory. CUDA_DOUBLE_IPC_REFUSE=1 makes every open
 * answer CUDA_ERROR_NOT_SUPPORTED (a driver or container without IPC).
 *
 * Asynchronous copies (cuMemcpyAsync) are held on their stream like host-to-device ones and
 * land when an event recorded after them is found complete (cuEventQuery) or the stream is
 * synchronized. An event answers CUDA_ERROR_NOT_READY to its first CUDA_DOUBLE_EVENT_POLLS
 * queries (default 2), so a caller that reports a copy before polling it to completion is
 * caught. cuda_double_async_copies() counts the copies that landed so.
 *
 * Devices without peer access: with CUDA_DOUBLE_NO_PEER=1, an asynchronous copy on one
 * device's stream to or from memory of another device (an allocation, an opened IPC handle:
 * the device whose context opened it, a VMM mapping: the device last given access) answers
 * CUDA_ERROR_INVALID_VALUE, as on GPUs that cannot reach each other's memory.
 *
 * dma-buf: cuMemGetHandleForAddressRange answers CUDA_ERROR_NOT_SUPPORTED, as for a device
 * without dma-buf support, unless CUDA_DOUBLE_DMABUF names a DRM device that makes dumb
 * buffers (vgem's /dev/dri/card0): then every cuMemAlloc is such a buffer, mapped, and
 * exported as a dma-buf (a real one: its pages are the "device memory"), and the call hands
 * out a duplicate of that dma-buf for a whole allocation (the double cannot cut one).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef CUDA_DOUBLE_DEVICES
#define CUDA_DOUBLE_DEVICES 2
#endif

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct { char reserved[64]; } CUipcMemHandle;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713
#define CUDA_ERROR_NOT_SUPPORTED 801

enum kind { DEVICE_ALLOC, HOST_ALLOC, HOST_REGISTERED, IPC_MAPPED, VMM_MAPPED };

struct region {
	char *base;
	size_t len;
	enum kind kind;
	int device;
	int fd; /* DEVICE_ALLOC only: a memfd, or the dma-buf of a DRM dumb buffer */
	unsigned gem; /* that dumb buffer's handle, 0 for a memfd */
	unsigned long long id; /* CU_POINTER_ATTRIBUTE_BUFFER_ID */
	unsigned long long vh; /* VMM_MAPPED only: the allocation handle mapped there */
};

struct ctx { int magic; int device; int refs; };
/* Host-to-device copies are held until the stream is synchronized, as a device would do
 * them later: data reported before cuStreamSynchronize returns is not there yet. */
#define MAX_PENDING 32
struct pending { void *dst; const void *src; size_t n; int htod; };
struct stream { int magic; int device; struct pending pend[MAX_PENDING]; int npend; };
#define CTX_MAGIC 0x0c7c7c7c
#define STREAM_MAGIC 0x5743a3

#define MAX_REGIONS 256
static struct region regions[MAX_REGIONS];
static int nregions;
static int live_streams;
static int htod_landed;
static int htod_pending;
static int dtoh_copies;
static int async_copies;
static int live_events;
static unsigned long long next_id = 1;
static int live_vmm(void);
static struct ctx contexts[CUDA_DOUBLE_DEVICES];
static int initialized;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Each thread's context stack, as the driver keeps one. */
static __thread struct ctx *stack[16];
static __thread int depth;

static struct ctx *current(void)
{
	return depth ? stack[depth - 1] : NULL;
}

static struct region *find(const void *p)
{
	for (int i = 0; i < nregions; i++)
		if ((const char *)p >= regions[i].base && (const char *)p < regions[i].base + regions[i].len)
			return &regions[i];
	return NULL;
}

static CUresult add(char *base, size_t len, enum kind kind, int device, int fd)
{
	if (nregions == MAX_REGIONS)
		return CUDA_ERROR_OUT_OF_MEMORY;
	regions[nregions++] = (struct region){ base, len, kind, device, fd, 0, next_id++, 0 };
	return CUDA_SUCCESS;
}

/* Seals memfd `fd` at its size (no shrinking, no growing, no more seals), as a driver's
 * allocation is fixed: 1 where done. */
static int seal_size(int fd)
{
	return fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0;
}

/* Exported for tests only. */
int cuda_double_live(void)
{
	pthread_mutex_lock(&lock);
	int n = nregions + live_streams + live_events + live_vmm();
	for (int i = 0; i < CUDA_DOUBLE_DEVICES; i++)
		n += contexts[i].refs;
	pthread_mutex_unlock(&lock);
	return n;
}

CUresult cuGetErrorName(CUresult e, const char **s)
{
	(void)e;
	*s = "CUDA_DOUBLE_ERROR";
	return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult e, const char **s)
{
	(void)e;
	*s = "an error from the CUDA test double";
	return CUDA_SUCCESS;
}

CUresult cuInit(unsigned flags)
{
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	if (!initialized)
		for (int i = 0; i < CUDA_DOUBLE_DEVICES; i++)
			contexts[i] = (struct ctx){ CTX_MAGIC, i, 0 };
	initialized = 1;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *v)
{
	*v = 13000;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n)
{
	*n = CUDA_DOUBLE_DEVICES;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
	if (ordinal < 0 || ordinal >= CUDA_DOUBLE_DEVICES)
		return CUDA_ERROR_INVALID_DEVICE;
	*d = ordinal;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
	if (d < 0 || d >= CUDA_DOUBLE_DEVICES)
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(name, (size_t)len, "xfabric test double cuda device %d", d);
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(struct ctx **c, CUdevice d)
{
	if (!initialized || d < 0 || d >= CUDA_DOUBLE_DEVICES)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&lock);
	contexts[d].refs++;
	pthread_mutex_unlock(&lock);
	*c = &contexts[d];
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
	if (d < 0 || d >= CUDA_DOUBLE_DEVICES || contexts[d].refs == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&lock);
	contexts[d].refs--;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(struct ctx *c)
{
	if (!c || c->magic != CTX_MAGIC || c->refs == 0 || depth == 16)
		return CUDA_ERROR_INVALID_CONTEXT;
	stack[depth++] = c;
	return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(struct ctx **c)
{
	if (depth == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	struct ctx *top = stack[--depth];
	if (c)
		*c = top;
	return CUDA_SUCCESS;
}

CUresult cuStreamCreate(struct stream **s, unsigned flags)
{
	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (flags != 1) /* xfabric copies on a CU_STREAM_NON_BLOCKING stream */
		return CUDA_ERROR_INVALID_VALUE;
	struct stream *st = malloc(sizeof *st);
	if (!st)
		return CUDA_ERROR_OUT_OF_MEMORY;
	memset(st, 0, sizeof *st);
	st->magic = STREAM_MAGIC;
	st->device = current()->device;
	pthread_mutex_lock(&lock);
	live_streams++;
	pthread_mutex_unlock(&lock);
	*s = st;
	return CUDA_SUCCESS;
}

static void land(struct stream *s)
{
	const char *delay = getenv("CUDA_DOUBLE_LAND_DELAY_US");
	if (delay && s->npend > 0)
		usleep((useconds_t)strtoul(delay, NULL, 10));
	int htod = 0;
	for (int i = 0; i < s->npend; i++) {
		memcpy(s->pend[i].dst, s->pend[i].src, s->pend[i].n);
		htod += s->pend[i].htod;
	}
	pthread_mutex_lock(&lock);
	htod_landed += htod;
	htod_pending -= htod;
	async_copies += s->npend - htod;
	pthread_mutex_unlock(&lock);
	s->npend = 0;
}

CUresult cuStreamSynchronize(struct stream *s)
{
	if (!s || s->magic != STREAM_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	land(s);
	return CUDA_SUCCESS;
}

int cuda_double_htod_landed(void)
{
	pthread_mutex_lock(&lock);
	int n = htod_landed;
	pthread_mutex_unlock(&lock);
	return n;
}

int cuda_double_dtoh_copies(void)
{
	pthread_mutex_lock(&lock);
	int n = dtoh_copies;
	pthread_mutex_unlock(&lock);
	return n;
}

int cuda_double_htod_pending(void)
{
	pthread_mutex_lock(&lock);
	int n = htod_pending;
	pthread_mutex_unlock(&lock);
	return n;
}

CUresult cuStreamDestroy_v2(struct stream *s)
{
	if (!s || s->magic != STREAM_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	land(s);
	s->magic = 0;
	free(s);
	pthread_mutex_lock(&lock);
	live_streams--;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
	pthread_mutex_lock(&lock);
	struct region *r = find((void *)(uintptr_t)p);
	CUresult res = CUDA_SUCCESS;
	if (!r)
		res = CUDA_ERROR_INVALID_VALUE;
	else if (attr == 2) /* MEMORY_TYPE: 1 host, 2 device */
		*(unsigned *)data = (r->kind == DEVICE_ALLOC || r->kind == IPC_MAPPED || r->kind == VMM_MAPPED) ? 2 : 1;
	else if (attr == 9) /* DEVICE_ORDINAL */
		*(int *)data = r->device;
	else if (attr == 7 && (r->kind == DEVICE_ALLOC || r->kind == IPC_MAPPED || r->kind == VMM_MAPPED)) /* BUFFER_ID */
		*(unsigned long long *)data = r->id;
	else
		res = CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&lock);
	return res;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
	pthread_mutex_lock(&lock);
	struct region *r = find((void *)(uintptr_t)p);
	int ok = r && (r->kind == DEVICE_ALLOC || r->kind == IPC_MAPPED || r->kind == VMM_MAPPED);
	if (ok) {
		*base = (CUdeviceptr)(uintptr_t)r->base;
		*size = r->len;
	}
	pthread_mutex_unlock(&lock);
	return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult device_range(CUdeviceptr p, size_t n)
{
	pthread_mutex_lock(&lock);
	struct region *r = find((void *)(uintptr_t)p);
	int ok = r && (r->kind == DEVICE_ALLOC || r->kind == IPC_MAPPED || r->kind == VMM_MAPPED) &&
		 (char *)(uintptr_t)p + n <= r->base + r->len;
	pthread_mutex_unlock(&lock);
	return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, struct stream *s)
{
	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!s || s->magic != STREAM_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	CUresult r = device_range(dst, n);
	if (r != CUDA_SUCCESS)
		return r;
	if (s->npend == MAX_PENDING)
		land(s);
	s->pend[s->npend++] = (struct pending){ (void *)(uintptr_t)dst, src, n, 1 };
	pthread_mutex_lock(&lock);
	htod_pending++;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, struct stream *s)
{
	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!s || s->magic != STREAM_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	CUresult r = device_range(src, n);
	if (r == CUDA_SUCCESS) {
		memcpy(dst, (void *)(uintptr_t)src, n);
		pthread_mutex_lock(&lock);
		dtoh_copies++;
		pthread_mutex_unlock(&lock);
	}
	return r;
}

/* DRM's ioctls for dumb buffers and PRIME export (drm.h, drm_mode.h). */
struct drm_create_dumb { uint32_t height, width, bpp, flags, handle, pitch; uint64_t size; };
struct drm_map_dumb { uint32_t handle, pad; uint64_t offset; };
struct drm_prime { uint32_t handle, flags; int32_t fd; };
struct drm_gem_close { uint32_t handle, pad; };
#define DRM_IOCTL_MODE_CREATE_DUMB _IOWR('d', 0xB2, struct drm_create_dumb)
#define DRM_IOCTL_MODE_MAP_DUMB _IOWR('d', 0xB3, struct drm_map_dumb)
#define DRM_IOCTL_PRIME_HANDLE_TO_FD _IOWR('d', 0x2d, struct drm_prime)
#define DRM_IOCTL_GEM_CLOSE _IOW('d', 0x09, struct drm_gem_close)

static int drm = -1;

/* Device memory from the DRM device CUDA_DOUBLE_DMABUF names: a dumb buffer of whole pages,
 * mapped, and its dma-buf. 0 on success. */
static int alloc_dmabuf(const char *dev, size_t len, char **p, int *fd, unsigned *gem)
{
	pthread_mutex_lock(&lock);
	if (drm < 0)
		drm = open(dev, O_RDWR | O_CLOEXEC);
	int card = drm;
	pthread_mutex_unlock(&lock);
	if (card < 0)
		return -1;
	/* Rows of 4096 bytes (1024 pixels of 32 bits). */
	struct drm_create_dumb c = { .height = (uint32_t)((len + 4095) / 4096), .width = 1024, .bpp = 32 };
	if (ioctl(card, DRM_IOCTL_MODE_CREATE_DUMB, &c) != 0)
		return -1;
	struct drm_gem_close g = { .handle = c.handle };
	struct drm_map_dumb m = { .handle = c.handle };
	struct drm_prime x = { .handle = c.handle, .flags = O_CLOEXEC | O_RDWR };
	if (ioctl(card, DRM_IOCTL_MODE_MAP_DUMB, &m) != 0 || ioctl(card, DRM_IOCTL_PRIME_HANDLE_TO_FD, &x) != 0) {
		ioctl(card, DRM_IOCTL_GEM_CLOSE, &g);
		return -1;
	}
	*p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, card, (off_t)m.offset);
	if (*p == MAP_FAILED) {
		close(x.fd);
		ioctl(card, DRM_IOCTL_GEM_CLOSE, &g);
		return -1;
	}
	*fd = x.fd;
	*gem = c.handle;
	return 0;
}

CUresult cuMemAlloc_v2(CUdeviceptr *d, size_t len)
{
	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (len == 0)
		return CUDA_ERROR_INVALID_VALUE;
	const char *dev = getenv("CUDA_DOUBLE_DMABUF");
	if (dev && *dev) {
		char *p;
		int fd;
		unsigned gem;
		if (alloc_dmabuf(dev, len, &p, &fd, &gem) != 0)
			return CUDA_ERROR_OUT_OF_MEMORY;
		pthread_mutex_lock(&lock);
		CUresult r = add(p, len, DEVICE_ALLOC, current()->device, fd);
		if (r == CUDA_SUCCESS)
			regions[nregions - 1].gem = gem;
		pthread_mutex_unlock(&lock);
		if (r != CUDA_SUCCESS) {
			struct drm_gem_close g = { .handle = gem };
			munmap(p, len);
			close(fd);
			ioctl(drm, DRM_IOCTL_GEM_CLOSE, &g);
			return r;
		}
		*d = (CUdeviceptr)(uintptr_t)p;
		return CUDA_SUCCESS;
	}
	char name[64];
	pthread_mutex_lock(&lock);
	unsigned long long id = next_id++; /* reserved: the memfd is named for it */
	pthread_mutex_unlock(&lock);
	snprintf(name, sizeof name, "cuda-double-%llu", id);
	int fd = (int)syscall(SYS_memfd_create, name, MFD_ALLOW_SEALING);
	/* Of a fixed size, as the driver's: sealed, so that no holder of it (an importer's
	 * peer) can shrink it under a mapping. */
	if (fd < 0 || ftruncate(fd, (off_t)len) != 0 || !seal_size(fd)) {
		if (fd >= 0)
			close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_mutex_lock(&lock);
	CUresult r = add(p, len, DEVICE_ALLOC, current()->device, fd);
	if (r == CUDA_SUCCESS)
		regions[nregions - 1].id = id;
	pthread_mutex_unlock(&lock);
	if (r != CUDA_SUCCESS) {
		munmap(p, len);
		close(fd);
		return r;
	}
	*d = (CUdeviceptr)(uintptr_t)p;
	return CUDA_SUCCESS;
}

/* Removes the region of `kind` based at p, unmapping and closing as needed. */
static CUresult remove_region(const void *p, enum kind kind, CUresult missing)
{
	pthread_mutex_lock(&lock);
	struct region *r = find(p);
	if (!r || r->base != p || r->kind != kind) {
		pthread_mutex_unlock(&lock);
		return missing;
	}
	if (kind != HOST_REGISTERED)
		munmap(r->base, r->len);
	if (kind == DEVICE_ALLOC)
		close(r->fd);
	if (r->gem) {
		struct drm_gem_close g = { .handle = r->gem };
		ioctl(drm, DRM_IOCTL_GEM_CLOSE, &g);
	}
	*r = regions[--nregions];
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr d)
{
	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	return remove_region((void *)(uintptr_t)d, DEVICE_ALLOC, CUDA_ERROR_INVALID_VALUE);
}

CUresult cuMemHostAlloc(void **pp, size_t len, unsigned flags)
{
	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (len == 0 || !(flags & 2)) /* xfabric always asks for DEVICEMAP */
		return CUDA_ERROR_INVALID_VALUE;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	memset(p, 0xab, len);
	pthread_mutex_lock(&lock);
	CUresult r = add(p, len, HOST_ALLOC, current()->device, -1);
	pthread_mutex_unlock(&lock);
	if (r != CUDA_SUCCESS) {
		munmap(p, len);
		return r;
	}
	*pp = p;
	return CUDA_SUCCESS;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags)
{
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	struct region *r = find(p);
	int ok = r && (r->kind == HOST_ALLOC || r->kind == HOST_REGISTERED);
	pthread_mutex_unlock(&lock);
	if (!ok)
		return CUDA_ERROR_INVALID_VALUE;
	*d = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
	return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p)
{
	return remove_region(p, HOST_ALLOC, CUDA_ERROR_INVALID_VALUE);
}

CUresult cuMemHostRegister_v2(void *p, size_t len, unsigned flags)
{
	(void)flags;
	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!p || len == 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	CUresult r = CUDA_SUCCESS;
	for (int i = 0; i < nregions; i++)
		if ((char *)p < regions[i].base + regions[i].len && regions[i].base < (char *)p + len)
			r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
	if (r == CUDA_SUCCESS)
		r = add(p, len, HOST_REGISTERED, current()->device, -1);
	pthread_mutex_unlock(&lock);
	return r;
}

CUresult cuMemHostUnregister(void *p)
{
	return remove_region(p, HOST_REGISTERED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
}

/* Handle layout (the double's own): pid, fd, length, device, magic, allocation id at 32. */
CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr base)
{
	pthread_mutex_lock(&lock);
	struct region *r = find((void *)(uintptr_t)base);
	int ok = r && r->base == (char *)(uintptr_t)base && r->kind == DEVICE_ALLOC;
	if (ok) {
		int32_t pid = getpid(), fd = r->fd, dev = r->device;
		uint64_t len = r->len, id = r->gem ? 0 : r->id;
		memset(h, 0, sizeof *h);
		memcpy(h->reserved + 32, &id, 8);
		memcpy(h->reserved, &pid, 4);
		memcpy(h->reserved + 4, &fd, 4);
		memcpy(h->reserved + 8, &len, 8);
		memcpy(h->reserved + 16, &dev, 4);
		memcpy(h->reserved + 20, "CUDBL", 5);
	}
	pthread_mutex_unlock(&lock);
	return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* The handle arrives by value, as in cuda.h. */
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *d, CUipcMemHandle h, unsigned flags)
{
	(void)flags;
	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (memcmp(h.reserved + 20, "CUDBL", 5) != 0)
		return CUDA_ERROR_INVALID_VALUE;
	const char *refuse = getenv("CUDA_DOUBLE_IPC_REFUSE");
	if (refuse && *refuse == '1')
		return CUDA_ERROR_NOT_SUPPORTED;
	int32_t pid, fd;
	uint64_t len, id;
	memcpy(&pid, h.reserved, 4);
	memcpy(&fd, h.reserved + 4, 4);
	memcpy(&len, h.reserved + 8, 8);
	memcpy(&id, h.reserved + 32, 8);
	if (pid == getpid()) /* the driver refuses to open a handle where it was made */
		return CUDA_ERROR_INVALID_CONTEXT;
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
	if (id != 0) {
		/* Still that allocation's memfd? A freed one's number may name another file now. */
		char want[96], got[96];
		snprintf(want, sizeof want, "/memfd:cuda-double-%llu (deleted)", (unsigned long long)id);
		ssize_t n = readlink(path, got, sizeof got - 1);
		if (n < 0)
			return CUDA_ERROR_INVALID_HANDLE;
		got[n] = 0;
		if (strcmp(want, got) != 0)
			return CUDA_ERROR_INVALID_HANDLE;
	}
	int local = open(path, O_RDWR);
	if (local < 0)
		return CUDA_ERROR_INVALID_HANDLE;
	/* The handle's length is the exporter's word: no more is mapped than the file holds,
	 * and a memfd must be sealed against shrinking (else pages could vanish under us). */
	struct stat st;
	int seals = fcntl(local, F_GET_SEALS);
	if (fstat(local, &st) != 0 || st.st_size < 0 || (uint64_t)st.st_size < len ||
	    (seals >= 0 && !(seals & F_SEAL_SHRINK))) {
		close(local);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, local, 0);
	close(local);
	if (p == MAP_FAILED)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&lock);
	CUresult r = add(p, len, IPC_MAPPED, current()->device, -1);
	pthread_mutex_unlock(&lock);
	if (r != CUDA_SUCCESS) {
		munmap(p, len);
		return r;
	}
	*d = (CUdeviceptr)(uintptr_t)p;
	return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr d)
{
	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	return remove_region((void *)(uintptr_t)d, IPC_MAPPED, CUDA_ERROR_INVALID_VALUE);
}

/* CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD (1): a dma-buf for a whole allocation, where it has one
 * (see the top); the driver's own checks: page-aligned range, known device memory. */
CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size, int type,
				       unsigned long long flags)
{
	long page = sysconf(_SC_PAGESIZE);
	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!handle || type != 1 || flags != 0 || size == 0 || dptr % (CUdeviceptr)page != 0 ||
	    size % (size_t)page != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	struct region *r = find((void *)(uintptr_t)dptr);
	CUresult res = CUDA_SUCCESS;
	size_t span = r ? (r->len + (size_t)page - 1) / (size_t)page * (size_t)page : 0;
	if (!r || r->kind != DEVICE_ALLOC || dptr + size > (CUdeviceptr)(uintptr_t)r->base + span)
		res = CUDA_ERROR_INVALID_VALUE;
	else if (!r->gem || r->base != (char *)(uintptr_t)dptr)
		res = CUDA_ERROR_NOT_SUPPORTED;
	else {
		int fd = fcntl(r->fd, F_DUPFD_CLOEXEC, 0);
		if (fd < 0)
			res = CUDA_ERROR_OUT_OF_MEMORY;
		else
			*(int *)handle = fd;
	}
	pthread_mutex_unlock(&lock);
	return res;
}

/* Asynchronous copies between any two addresses (unified addressing): held on the stream,
 * landed when an event recorded after them completes or the stream is synchronized. */
/* Memory a device reaches as its own (not host memory). */
static int on_device(const struct region *g)
{
	return g->kind == DEVICE_ALLOC || g->kind == IPC_MAPPED || g->kind == VMM_MAPPED;
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, struct stream *s)
{
	if (!current())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!s || s->magic != STREAM_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	const char *no_peer = getenv("CUDA_DOUBLE_NO_PEER");
	pthread_mutex_lock(&lock);
	struct region *d = find((void *)(uintptr_t)dst), *r = find((void *)(uintptr_t)src);
	/* A range starting in known memory must end inside it. */
	int ok = (!d || (char *)(uintptr_t)dst + n <= d->base + d->len) &&
		 (!r || (char *)(uintptr_t)src + n <= r->base + r->len) && dst && src;
	if (no_peer && *no_peer == '1')
		ok = ok && (!d || !on_device(d) || d->device == s->device) &&
		     (!r || !on_device(r) || r->device == s->device);
	pthread_mutex_unlock(&lock);
	if (!ok)
		return CUDA_ERROR_INVALID_VALUE;
	if (s->npend == MAX_PENDING)
		land(s);
	s->pend[s->npend++] = (struct pending){ (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, 0 };
	return CUDA_SUCCESS;
}

#define EVENT_MAGIC 0xe7e7e7
struct event { int magic; struct stream *stream; int polls_left; int recorded; };

CUresult cuEventCreate(struct event **e, unsigned flags)
{
	(void)flags;
	struct event *ev = calloc(1, sizeof *ev);
	if (!ev)
		return CUDA_ERROR_OUT_OF_MEMORY;
	ev->magic = EVENT_MAGIC;
	pthread_mutex_lock(&lock);
	live_events++;
	pthread_mutex_unlock(&lock);
	*e = ev;
	return CUDA_SUCCESS;
}

CUresult cuEventRecord(struct event *e, struct stream *s)
{
	if (!e || e->magic != EVENT_MAGIC || !s || s->magic != STREAM_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	const char *polls = getenv("CUDA_DOUBLE_EVENT_POLLS");
	e->stream = s;
	e->polls_left = polls ? atoi(polls) : 2;
	e->recorded = 1;
	return CUDA_SUCCESS;
}

#define CUDA_ERROR_NOT_READY 600

CUresult cuEventQuery(struct event *e)
{
	if (!e || e->magic != EVENT_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!e->recorded)
		return CUDA_SUCCESS;
	if (e->polls_left > 0) {
		e->polls_left--;
		return CUDA_ERROR_NOT_READY;
	}
	if (e->stream) {
		land(e->stream);
		e->stream = NULL;
	}
	return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(struct event *e)
{
	if (!e || e->magic != EVENT_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	e->magic = 0;
	free(e);
	pthread_mutex_lock(&lock);
	live_events--;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

int cuda_double_async_copies(void)
{
	pthread_mutex_lock(&lock);
	int n = async_copies;
	pthread_mutex_unlock(&lock);
	return n;
}

/*
 * Virtual memory management (cuMemCreate and its family). An allocation is a memfd named
 * cuda-double-vmm-<id>, of whole granules (VMM_GRANULE); its handle is VMM_HANDLE | id. A
 * reservation is an anonymous PROT_NONE mapping; cuMemMap maps the memfd over part of one
 * (still PROT_NONE, as the driver gives no access before cuMemSetAccess), cuMemSetAccess
 * makes it readable and writable, cuMemUnmap puts PROT_NONE anonymous memory back. Mapped
 * ranges are device memory to every other call (pointer queries, copies), and
 * cuIpcGetMemHandle refuses them, as the driver does. cuMemExportToShareableHandle
 * (POSIX_FILE_DESCRIPTOR only, and only for an allocation created asking for it) hands out
 * a duplicate of the memfd; cuMemImportFromShareableHandle takes only such a memfd (what else
 * a peer passes is refused) and makes a new allocation of it, its size the memfd's.
 * CUDA_DOUBLE_VMM_NO_FD=1 makes the device answer 0 for
 * CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED (a driver without the
 * handle type); CUDA_DOUBLE_IPC_REFUSE=1 makes every import answer CUDA_ERROR_NOT_SUPPORTED.
 * cuda_double_live() counts allocations and reservations too.
 */
#include <sys/stat.h>

#define VMM_GRANULE (2u << 20)
#define VMM_HANDLE 0x7d00000000000000ULL
#define MAX_VMM 64
#define MAX_RESV 64

struct memloc { int type; int id; };
struct allocprop { int type; unsigned handle_types; struct memloc loc; void *win32; unsigned char flags[8]; };
struct accessdesc { struct memloc loc; int flags; };

struct vmm { int used; int fd; size_t len; int device; unsigned handle_types; unsigned long long id; int refs; };
static struct vmm vmms[MAX_VMM];
struct resv { char *base; size_t len; };
static struct resv resvs[MAX_RESV];

static int live_vmm(void) /* under the lock */
{
	int n = 0;
	for (int i = 0; i < MAX_VMM; i++)
		n += vmms[i].used;
	for (int i = 0; i < MAX_RESV; i++)
		n += resvs[i].base != NULL;
	return n;
}

static struct vmm *vmm_of(unsigned long long h) /* under the lock */
{
	if ((h & 0xff00000000000000ULL) != VMM_HANDLE)
		return NULL;
	for (int i = 0; i < MAX_VMM; i++)
		if (vmms[i].used && VMM_HANDLE + vmms[i].id == h)
			return &vmms[i];
	return NULL;
}

static void vmm_put(struct vmm *v) /* under the lock */
{
	if (--v->refs == 0) {
		close(v->fd);
		v->used = 0;
	}
}

static CUresult vmm_new(int fd, size_t len, int device, unsigned types, unsigned long long id,
			unsigned long long *h) /* under the lock */
{
	for (int i = 0; i < MAX_VMM; i++)
		if (!vmms[i].used) {
			vmms[i] = (struct vmm){ 1, fd, len, device, types, id, 1 };
			*h = VMM_HANDLE + id;
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d)
{
	if (d < 0 || d >= CUDA_DOUBLE_DEVICES)
		return CUDA_ERROR_INVALID_DEVICE;
	if (attr == 102) { /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
		*v = 1;
		return CUDA_SUCCESS;
	}
	if (attr == 103) { /* HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
		const char *no = getenv("CUDA_DOUBLE_VMM_NO_FD");
		*v = !(no && *no == '1');
		return CUDA_SUCCESS;
	}
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemGetAllocationGranularity(size_t *g, const struct allocprop *p, int option)
{
	if (!g || !p || p->loc.type != 1 || p->loc.id < 0 || p->loc.id >= CUDA_DOUBLE_DEVICES ||
	    (option != 0 && option != 1))
		return CUDA_ERROR_INVALID_VALUE;
	*g = VMM_GRANULE;
	return CUDA_SUCCESS;
}

CUresult cuMemCreate(unsigned long long *h, size_t len, const struct allocprop *p, unsigned long long flags)
{
	if (!h || !p || flags != 0 || len == 0 || len % VMM_GRANULE != 0 || p->type != 1 ||
	    p->loc.type != 1 || p->loc.id < 0 || p->loc.id >= CUDA_DOUBLE_DEVICES)
		return CUDA_ERROR_INVALID_VALUE;
	if (p->handle_types & ~1u) /* only POSIX_FILE_DESCRIPTOR (1) is known here */
		return CUDA_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&lock);
	unsigned long long id = next_id++;
	pthread_mutex_unlock(&lock);
	char name[64];
	snprintf(name, sizeof name, "cuda-double-vmm-%llu", id);
	int fd = (int)syscall(SYS_memfd_create, name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, (off_t)len) != 0 || !seal_size(fd)) {
		if (fd >= 0)
			close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_mutex_lock(&lock);
	CUresult r = vmm_new(fd, len, p->loc.id, p->handle_types, id, h);
	pthread_mutex_unlock(&lock);
	if (r != CUDA_SUCCESS)
		close(fd);
	return r;
}

CUresult cuMemRelease(unsigned long long h)
{
	pthread_mutex_lock(&lock);
	struct vmm *v = vmm_of(h);
	if (v)
		vmm_put(v);
	pthread_mutex_unlock(&lock);
	return v ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuMemAddressReserve(CUdeviceptr *p, size_t len, size_t align, CUdeviceptr addr, unsigned long long flags)
{
	(void)addr;
	if (!p || len == 0 || len % VMM_GRANULE != 0 || flags != 0 || (align & (align - 1)) != 0)
		return CUDA_ERROR_INVALID_VALUE;
	char *m = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&lock);
	int i = 0;
	while (i < MAX_RESV && resvs[i].base)
		i++;
	if (i < MAX_RESV)
		resvs[i] = (struct resv){ m, len };
	pthread_mutex_unlock(&lock);
	if (i == MAX_RESV) {
		munmap(m, len);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*p = (CUdeviceptr)(uintptr_t)m;
	return CUDA_SUCCESS;
}

/* The reservation holding p..p+len, or NULL. Under the lock. */
static struct resv *resv_of(CUdeviceptr p, size_t len)
{
	char *a = (char *)(uintptr_t)p;
	for (int i = 0; i < MAX_RESV; i++)
		if (resvs[i].base && a >= resvs[i].base && len <= resvs[i].len &&
		    (size_t)(a - resvs[i].base) <= resvs[i].len - len)
			return &resvs[i];
	return NULL;
}

/* Whether a VMM mapping overlaps p..p+len. Under the lock. */
static int vmm_mapped_in(CUdeviceptr p, size_t len)
{
	char *a = (char *)(uintptr_t)p;
	for (int i = 0; i < nregions; i++)
		if (regions[i].kind == VMM_MAPPED && regions[i].base < a + len && a < regions[i].base + regions[i].len)
			return 1;
	return 0;
}

CUresult cuMemAddressFree(CUdeviceptr p, size_t len)
{
	pthread_mutex_lock(&lock);
	struct resv *r = resv_of(p, len);
	CUresult res = CUDA_SUCCESS;
	if (!r || r->base != (char *)(uintptr_t)p || r->len != len || vmm_mapped_in(p, len))
		res = CUDA_ERROR_INVALID_VALUE;
	else {
		munmap(r->base, r->len);
		r->base = NULL;
	}
	pthread_mutex_unlock(&lock);
	return res;
}

CUresult cuMemMap(CUdeviceptr p, size_t len, size_t offset, unsigned long long h, unsigned long long flags)
{
	if (offset != 0 || flags != 0 || len == 0 || len % VMM_GRANULE != 0 || p % VMM_GRANULE != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	struct vmm *v = vmm_of(h);
	CUresult res = CUDA_SUCCESS;
	if (!v)
		res = CUDA_ERROR_INVALID_HANDLE;
	else if (len > v->len || !resv_of(p, len) || vmm_mapped_in(p, len))
		res = CUDA_ERROR_INVALID_VALUE;
	else if (mmap((void *)(uintptr_t)p, len, PROT_NONE, MAP_SHARED | MAP_FIXED, v->fd, 0) == MAP_FAILED)
		res = CUDA_ERROR_OUT_OF_MEMORY;
	else {
		res = add((char *)(uintptr_t)p, len, VMM_MAPPED, v->device, -1);
		if (res == CUDA_SUCCESS) {
			regions[nregions - 1].id = v->id;
			regions[nregions - 1].vh = h;
			v->refs++;
		} else
			mmap((void *)(uintptr_t)p, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
	}
	pthread_mutex_unlock(&lock);
	return res;
}

/* The VMM mapping based at p of exactly len bytes, or NULL. Under the lock. */
static struct region *vmm_region(CUdeviceptr p, size_t len)
{
	struct region *r = find((void *)(uintptr_t)p);
	if (!r || r->kind != VMM_MAPPED || r->base != (char *)(uintptr_t)p || r->len != len)
		return NULL;
	return r;
}

CUresult cuMemSetAccess(CUdeviceptr p, size_t len, const struct accessdesc *d, size_t count)
{
	if (!d || count == 0)
		return CUDA_ERROR_INVALID_VALUE;
	int prot = PROT_NONE, device = 0;
	for (size_t i = 0; i < count; i++) {
		device = d[i].loc.id;
		if (d[i].loc.type != 1 || d[i].loc.id < 0 || d[i].loc.id >= CUDA_DOUBLE_DEVICES)
			return CUDA_ERROR_INVALID_DEVICE;
		if (d[i].flags == 3)
			prot = PROT_READ | PROT_WRITE;
		else if (d[i].flags == 1 && prot == PROT_NONE)
			prot = PROT_READ;
		else if (d[i].flags != 0 && d[i].flags != 1)
			return CUDA_ERROR_INVALID_VALUE;
	}
	pthread_mutex_lock(&lock);
	struct region *g = vmm_region(p, len);
	CUresult res = g ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
	if (res == CUDA_SUCCESS && mprotect((void *)(uintptr_t)p, len, prot) != 0)
		res = CUDA_ERROR_INVALID_VALUE;
	if (res == CUDA_SUCCESS)
		g->device = device;
	pthread_mutex_unlock(&lock);
	return res;
}

CUresult cuMemUnmap(CUdeviceptr p, size_t len)
{
	pthread_mutex_lock(&lock);
	struct region *r = vmm_region(p, len);
	if (r) {
		mmap((void *)(uintptr_t)p, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
		struct vmm *v = vmm_of(r->vh);
		if (v)
			vmm_put(v);
		*r = regions[--nregions];
	}
	pthread_mutex_unlock(&lock);
	return r ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemRetainAllocationHandle(unsigned long long *h, void *addr)
{
	pthread_mutex_lock(&lock);
	struct region *r = find(addr);
	struct vmm *v = r && r->kind == VMM_MAPPED ? vmm_of(r->vh) : NULL;
	if (v) {
		v->refs++;
		*h = r->vh;
	}
	pthread_mutex_unlock(&lock);
	return v ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemGetAllocationPropertiesFromHandle(struct allocprop *p, unsigned long long h)
{
	pthread_mutex_lock(&lock);
	struct vmm *v = vmm_of(h);
	if (v) {
		memset(p, 0, sizeof *p);
		p->type = 1;
		p->handle_types = v->handle_types;
		p->loc = (struct memloc){ 1, v->device };
	}
	pthread_mutex_unlock(&lock);
	return v ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuMemExportToShareableHandle(void *out, unsigned long long h, int type, unsigned long long flags)
{
	if (!out || type != 1 || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	const char *no = getenv("CUDA_DOUBLE_VMM_NO_FD");
	if (no && *no == '1')
		return CUDA_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&lock);
	struct vmm *v = vmm_of(h);
	CUresult res = CUDA_SUCCESS;
	if (!v)
		res = CUDA_ERROR_INVALID_HANDLE;
	else if (!(v->handle_types & 1)) /* not created shareable that way */
		res = CUDA_ERROR_INVALID_VALUE;
	else {
		int fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
		if (fd < 0)
			res = CUDA_ERROR_OUT_OF_MEMORY;
		else
			*(int *)out = fd;
	}
	pthread_mutex_unlock(&lock);
	return res;
}

/* The descriptor is the caller's still: the driver takes a reference of its own. */
CUresult cuMemImportFromShareableHandle(unsigned long long *h, void *os, int type)
{
	if (!h || type != 1)
		return CUDA_ERROR_INVALID_VALUE;
	const char *refuse = getenv("CUDA_DOUBLE_IPC_REFUSE");
	if (refuse && *refuse == '1')
		return CUDA_ERROR_NOT_SUPPORTED;
	int fd = (int)(intptr_t)os;
	char path[64], got[128];
	snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
	ssize_t n = readlink(path, got, sizeof got - 1);
	if (n < 0)
		return CUDA_ERROR_INVALID_HANDLE;
	got[n] = 0;
	unsigned long long their_id;
	char tail[16];
	/* Only the double's allocations: anything else a peer passes is not one. */
	if (sscanf(got, "/memfd:cuda-double-vmm-%llu %15s", &their_id, tail) != 2 || strcmp(tail, "(deleted)") != 0)
		return CUDA_ERROR_INVALID_HANDLE;
	/* Sealed at its size, as the double's allocations are: one the peer made (or could still
	 * shrink under our mapping) is not an allocation. */
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK) || !(seals & F_SEAL_GROW))
		return CUDA_ERROR_INVALID_HANDLE;
	struct stat st;
	if (fstat(fd, &st) != 0 || st.st_size <= 0 || (size_t)st.st_size % VMM_GRANULE != 0)
		return CUDA_ERROR_INVALID_HANDLE;
	int local = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (local < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&lock);
	unsigned long long id = next_id++;
	CUresult r = vmm_new(local, (size_t)st.st_size, 0, 1, id, h);
	pthread_mutex_unlock(&lock);
	if (r != CUDA_SUCCESS)
		close(local);
	return r;
}
