/*
 * xfabric/fi_xpu.h: the host side of the device API (fi_xpu(3)) for programs built against
 * libfabric 1.17's headers (libfabric-dev's rdma/ headers) and linked with xfabric's
 * libfabric.so.1. Upstream declares these calls in rdma/fi_xpu.h and the object headers of
 * its main branch; 1.17 has none of them, so xfabric exports them as symbols of its own
 * (version node XFABRIC_1.0) and declares them here.
 *
 * Differences from upstream:
 *   - Upstream names the XPU when the object is created (struct fi_xpu_attr in the
 *     endpoint, CQ and counter attributes, fi_xpu_ctx), which 1.17's structures lack.
 *     xfabric names it at export: fi_*_export_xpu export to the CPU XPU (FI_HMEM_SYSTEM, a
 *     thread of this process) with the default ring size; xf_*_export_xpu take a
 *     struct xf_xpu_attr (XPU and ring size). FI_HMEM_CUDA and FI_HMEM_ZE XPUs get their
 *     shared blocks in device-visible host memory, prov_ctx being its device address; other
 *     XPUs answer -FI_EOPNOTSUPP.
 *   - The capability: 1.17 calls bit 44 FI_XPU_TRIGGER, upstream's main branch FI_XPU.
 *     xfabric keeps one bit with both meanings; FI_XPU is defined here as an alias of
 *     FI_XPU_TRIGGER. An endpoint to export is opened with FI_TRIGGER | FI_XPU_TRIGGER (or
 *     FI_XPU, the same bit), as for XPU triggers, which keep working unchanged; getinfo
 *     reports the bit only for providers where both work (shm, tcp, verbs).
 *   - Raw addresses and descriptors are 8 bytes (XF_XPU_KEY_SIZE).
 *   - fi_xpu_ctx, fi_xpu_ctx_query and fi_ep_export_xpu_wr are not provided.
 *
 * Handles: the caller owns the struct fid_xpu_* and the export call fills it. What its
 * prov_ctx points at belongs to the exported object (no release call of its own), and
 * exporting again fills in the same prov_ctx. Stop the XPU's use of a handle before closing
 * its object; a call through it afterwards still reaches memory that is there (kept until the
 * domain closes): a post or counter add answers -FI_ESHUTDOWN, a CQ read what its ring held.
 */
#ifndef XFABRIC_FI_XPU_HOST_H
#define XFABRIC_FI_XPU_HOST_H

#include <stddef.h>
#include <stdint.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include "fi_xpu_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Upstream's name for bit 44, which 1.17 calls FI_XPU_TRIGGER: the same bit. */
#ifndef FI_XPU
#define FI_XPU FI_XPU_TRIGGER
#endif

/* Bytes fi_av_get_xpu_addr and fi_mr_get_xpu_desc write (upstream's xpu_key_size). */
#define XF_XPU_KEY_SIZE 8

/* The XPU an xf_*_export_xpu call exports to, and its ring's size. */
struct xf_xpu_attr {
	enum fi_hmem_iface iface; /* FI_HMEM_SYSTEM (a CPU thread), FI_HMEM_CUDA, FI_HMEM_ZE */
	uint32_t reserved;        /* 0 */
	uint64_t device;          /* device of iface (0 for a CPU) */
	uint64_t slots;           /* ring slots, a power of two; 0: the default */
};

/* Export an enabled endpoint (opened with FI_TRIGGER | FI_XPU_TRIGGER), a CQ or a counter to
 * the CPU XPU: 0 and *xpu_X filled, or -FI_EINVAL (null or foreign fid, null handle),
 * -FI_EBADFLAGS (flags other than 0), -FI_EOPNOTSUPP (an endpoint without the capability),
 * -FI_EOPBADSTATE (not enabled, closing). */
int fi_ep_export_xpu(struct fid_ep *ep, uint64_t flags, struct fid_xpu_ep *xpu_ep);
int fi_cq_export_xpu(struct fid_cq *cq, uint64_t flags, struct fid_xpu_cq *xpu_cq);
int fi_cntr_export_xpu(struct fid_cntr *cntr, uint64_t flags, struct fid_xpu_cntr *xpu_cntr);

/* xfabric's: as above for the XPU and ring size `attr` names (null: as above). An
 * endpoint's ring: 2 to 262144 descriptors (default 1024); a CQ's: 2 to 65536 entries
 * (default: the queue's size, at most 4096); a counter's ring size is fixed (slots 0). */
int xf_ep_export_xpu(struct fid_ep *ep, const struct xf_xpu_attr *attr, uint64_t flags,
		     struct fid_xpu_ep *xpu_ep);
int xf_cq_export_xpu(struct fid_cq *cq, const struct xf_xpu_attr *attr, uint64_t flags,
		     struct fid_xpu_cq *xpu_cq);
int xf_cntr_export_xpu(struct fid_cntr *cntr, const struct xf_xpu_attr *attr, uint64_t flags,
		       struct fid_xpu_cntr *xpu_cntr);

/* The raw address of `fi_addr` (8 bytes into buf; *len in: buf's size, out: 8). Copy it
 * where the XPU reads it and pass its address as dest_addr / src_addr. -FI_ETOOSMALL when
 * *len < 8, -FI_EINVAL for an address not in the AV. */
int fi_av_get_xpu_addr(struct fid_av *av, fi_addr_t fi_addr, void *buf, size_t *len);

/* The raw descriptor of a region (8 bytes, sizes as fi_av_get_xpu_addr). From this call on,
 * XPU-posted operations may use the region as local memory (range and access checked at
 * each use). */
int fi_mr_get_xpu_desc(struct fid_mr *mr, void *buf, size_t *len);

#ifdef __cplusplus
}
#endif

/* The device header's numbers are libfabric's. */
XF_XPU_ASSERT(XF_XPU_EAGAIN == FI_EAGAIN && XF_XPU_EINVAL == FI_EINVAL &&
		      XF_XPU_ENOSYS == FI_ENOSYS && XF_XPU_EOPNOTSUPP == FI_EOPNOTSUPP &&
		      XF_XPU_ESHUTDOWN == FI_ESHUTDOWN && XF_XPU_ETIMEDOUT == FI_ETIMEDOUT &&
		      XF_XPU_EAVAIL == FI_EAVAIL && XF_XPU_EOVERRUN == FI_EOVERRUN,
	      "XF_XPU_E* are libfabric's FI_E* numbers");
XF_XPU_ASSERT(XF_XPU_CLASS_EP == FI_CLASS_EP && XF_XPU_CLASS_CQ == FI_CLASS_CQ &&
		      XF_XPU_CLASS_CNTR == FI_CLASS_CNTR,
	      "XF_XPU_CLASS_* are fabric.h's FI_CLASS_*");
XF_XPU_ASSERT(XF_XPU_ADDR_UNSPEC == FI_ADDR_UNSPEC, "FI_ADDR_UNSPEC");
XF_XPU_ASSERT(XF_XPU_CQ_FORMAT_TAGGED == FI_CQ_FORMAT_TAGGED &&
		      XF_XPU_CQ_FORMAT_DATA == FI_CQ_FORMAT_DATA &&
		      XF_XPU_CQ_FORMAT_MSG == FI_CQ_FORMAT_MSG &&
		      XF_XPU_CQ_FORMAT_CONTEXT == FI_CQ_FORMAT_CONTEXT,
	      "XF_XPU_CQ_FORMAT_* are enum fi_cq_format's");
XF_XPU_ASSERT(sizeof(struct xf_xpu_cq_tagged_entry) == sizeof(struct fi_cq_tagged_entry) &&
		      XF_XPU_OFFSET(struct xf_xpu_cq_tagged_entry, tag) ==
			      XF_XPU_OFFSET(struct fi_cq_tagged_entry, tag) &&
		      XF_XPU_OFFSET(struct xf_xpu_cq_tagged_entry, data) ==
			      XF_XPU_OFFSET(struct fi_cq_tagged_entry, data),
	      "struct fi_cq_tagged_entry");
XF_XPU_ASSERT(sizeof(struct fi_cq_entry) == 8 && sizeof(struct fi_cq_msg_entry) == 24 &&
		      sizeof(struct fi_cq_data_entry) == 40,
	      "CQ formats are word prefixes of the tagged entry");
XF_XPU_ASSERT(sizeof(struct xf_xpu_cq_err_entry) == sizeof(struct fi_cq_err_entry) &&
		      XF_XPU_OFFSET(struct xf_xpu_cq_err_entry, olen) ==
			      XF_XPU_OFFSET(struct fi_cq_err_entry, olen) &&
		      XF_XPU_OFFSET(struct xf_xpu_cq_err_entry, err) ==
			      XF_XPU_OFFSET(struct fi_cq_err_entry, err) &&
		      XF_XPU_OFFSET(struct xf_xpu_cq_err_entry, prov_errno) ==
			      XF_XPU_OFFSET(struct fi_cq_err_entry, prov_errno) &&
		      XF_XPU_OFFSET(struct xf_xpu_cq_err_entry, err_data) ==
			      XF_XPU_OFFSET(struct fi_cq_err_entry, err_data),
	      "struct fi_cq_err_entry");
XF_XPU_ASSERT(sizeof(struct xf_xpu_attr) == 24, "struct xf_xpu_attr");

#endif /* XFABRIC_FI_XPU_HOST_H */
