/* fi_mr_regattr from a program built against API 1.9 headers: its struct fi_mr_attr ends at
 * auth_key (iface and device came in 1.10). The library must read nothing past it: the
 * structure here ends exactly where an unreadable page starts, so a read of iface faults. */
#include "two.h"
#include <sys/mman.h>

/* struct fi_mr_attr before API 1.10. */
struct mr_attr_1_9 {
	const struct iovec *mr_iov;
	size_t iov_count;
	uint64_t access;
	uint64_t offset;
	uint64_t requested_key;
	void *context;
	size_t auth_key_size;
	uint8_t *auth_key;
};

int main(void)
{
	alarm(60);
	struct fi_info *hints = fi_allocinfo(), *info;
	REQUIRE(hints);
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	const char *prov = getenv("FI_PROVIDER");
	if (prov)
		hints->fabric_attr->prov_name = strdup(prov);
	CHECK(fi_getinfo(FI_VERSION(1, 9), NULL, NULL, 0, hints, &info));
	fi_freeinfo(hints);
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
	CHECK(fi_domain(fabric, info, &domain, NULL));

	long page = sysconf(_SC_PAGESIZE);
	char *two = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	REQUIRE(two != MAP_FAILED);
	REQUIRE(mprotect(two + page, page, PROT_NONE) == 0);
	struct mr_attr_1_9 *a = (struct mr_attr_1_9 *)(two + page - sizeof *a);
	static char buf[4096];
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof buf };
	memset(a, 0, sizeof *a);
	a->mr_iov = &iov;
	a->iov_count = 1;
	a->access = FI_SEND | FI_RECV;
	a->requested_key = 1;
	struct fid_mr *mr = NULL;
	CHECK(fi_mr_regattr(domain, (const struct fi_mr_attr *)(void *)a, 0, &mr));
	REQUIRE(mr != NULL);
	CHECK(fi_close(&mr->fid));
	munmap(two, 2 * page);
	close_domain(info, fabric, domain);
	printf("mr_attr_before_1_10: ok\n");
	return 0;
}
