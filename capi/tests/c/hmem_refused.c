/* Device-memory registration where the device is missing: fi_mr_regattr with FI_HMEM_CUDA
 * and FI_HMEM_ZE must fail, leave no MR, and leave the domain usable (a host registration
 * after it works). xfabric offers FI_HMEM only where a device interface is usable: without
 * one, getinfo with FI_HMEM answers -FI_ENODATA, and on a domain opened without FI_HMEM a
 * device registration is -FI_EOPNOTSUPP. A provider that offers FI_HMEM anyway (libfabric's
 * shm does) must refuse a missing interface with -FI_ENOSYS. */
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#define CHECK(call)                                                                         \
	do {                                                                                \
		int _r = (int)(call);                                                       \
		if (_r) {                                                                   \
			fprintf(stderr, "hmem_refused: %s: %s\n", #call, fi_strerror(-_r));  \
			return 1;                                                           \
		}                                                                           \
	} while (0)

static int try_iface(struct fid_domain *domain, enum fi_hmem_iface iface, const char *name,
		     int want)
{
	static char buf[4096];
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof buf };
	struct fi_mr_attr attr = { .mr_iov = &iov, .iov_count = 1,
				   .access = FI_SEND | FI_RECV, .requested_key = 1,
				   .iface = iface };
	struct fid_mr *mr = NULL;
	int ret = fi_mr_regattr(domain, &attr, 0, &mr);
	if (ret == 0) {
		fprintf(stderr, "hmem_refused: registering %s memory succeeded\n", name);
		return 1;
	}
	if (ret != want) {
		fprintf(stderr, "hmem_refused: %s: %s (%d), not %s\n", name, fi_strerror(-ret), ret,
			fi_strerror(-want));
		return 1;
	}
	if (mr) {
		fprintf(stderr, "hmem_refused: %s: a failed registration returned an MR\n", name);
		return 1;
	}
	printf("%s registration refused: %s\n", name, fi_strerror(-ret));
	return 0;
}

int main(void)
{
	struct fi_info *hints = fi_allocinfo(), *info;
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG | FI_HMEM;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
				      FI_MR_PROV_KEY | FI_MR_HMEM;
	const char *prov = getenv("FI_PROVIDER");
	if (prov)
		hints->fabric_attr->prov_name = strdup(prov);
	int want = -FI_ENOSYS;
	int ret = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info);
	if (ret == -FI_ENODATA) {
		printf("FI_HMEM not offered: no device interface\n");
		hints->caps = FI_MSG;
		hints->domain_attr->mr_mode &= ~FI_MR_HMEM;
		want = -FI_EOPNOTSUPP;
		ret = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info);
	}
	CHECK(ret);
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
	CHECK(fi_domain(fabric, info, &domain, NULL));
	if (try_iface(domain, FI_HMEM_CUDA, "CUDA", want) ||
	    try_iface(domain, FI_HMEM_ZE, "Level Zero", want))
		return 1;
	static char host[4096];
	struct fid_mr *mr;
	CHECK(fi_mr_reg(domain, host, sizeof host, FI_SEND | FI_RECV, 0, 2, 0, &mr, NULL));
	CHECK(fi_close(&mr->fid));
	CHECK(fi_close(&domain->fid));
	CHECK(fi_close(&fabric->fid));
	fi_freeinfo(info);
	fi_freeinfo(hints);
	printf("hmem_refused: ok\n");
	return 0;
}
