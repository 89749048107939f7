/* A source address in the hints as C callers often pass one: a struct sockaddr_storage and
 * its size. The answer keeps that address (port included), as libfabric sizes a sockaddr by
 * its family; a source that is no address at all is an answer of none (-FI_ENODATA), never
 * another address in its place. */
#include "two.h"
#include <arpa/inet.h>
#include <netinet/in.h>

int main(void)
{
	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	REQUIRE(hints);
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG;
	hints->fabric_attr->prov_name = strdup("tcp");
	hints->addr_format = FI_SOCKADDR_IN;
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof ss);
	struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
	sin->sin_family = AF_INET;
	sin->sin_port = htons(45123);
	sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	hints->src_addr = malloc(sizeof ss);
	memcpy(hints->src_addr, &ss, sizeof ss);
	hints->src_addrlen = sizeof ss;
	REQUIRE(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info) == 0);
	REQUIRE(info->src_addr && info->src_addrlen >= sizeof *sin);
	struct sockaddr_in *got = info->src_addr;
	REQUIRE(got->sin_family == AF_INET && ntohs(got->sin_port) == 45123);
	REQUIRE(got->sin_addr.s_addr == htonl(INADDR_LOOPBACK));
	fi_freeinfo(info);

	/* No address: no answer. */
	memset(hints->src_addr, 0x7f, sizeof ss);
	info = (struct fi_info *)1;
	REQUIRE(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info) == -FI_ENODATA);
	REQUIRE(info == NULL);
	fi_freeinfo(hints);
	printf("src_hint: ok\n");
	return 0;
}
