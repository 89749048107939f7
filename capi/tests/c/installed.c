/* Built with `pkg-config --cflags --libs libfabric` against an install made by
 * scripts/install.sh: asks for an shm endpoint's info and says which library answered. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <rdma/fabric.h>

int main(void)
{
	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	Dl_info where;
	int ret;

	if (!hints)
		return 1;
	hints->ep_attr->type = FI_EP_RDM;
	hints->fabric_attr->prov_name = strdup("shm");
	ret = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info);
	if (ret) {
		fprintf(stderr, "fi_getinfo: %s\n", fi_strerror(-ret));
		return 1;
	}
	if (!dladdr((void *)fi_getinfo, &where) || !where.dli_fname)
		return 1;
	printf("provider %s\nlibrary %s\n", info->fabric_attr->prov_name, where.dli_fname);
	fi_freeinfo(info);
	fi_freeinfo(hints);
	return 0;
}
