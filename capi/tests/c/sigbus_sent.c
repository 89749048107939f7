/* A SIGBUS another process sends (kill, sigqueue) is not a fault of a shm segment: with
 * xfabric's guard installed (shm maps a segment for an endpoint), it must still end the
 * process as it would have without xfabric. The child opens an shm endpoint, then sends itself
 * SIGBUS; the parent checks that it died of it, not that the guard swallowed it, then opens a
 * domain of its own, which reclaims the dead child's segment, and checks that none is left. */
#include "two.h"
#include <dirent.h>

/* Files in /dev/shm of xfabric's segments named for `pid`. */
static int segments_of(pid_t pid)
{
	char prefix[64];
	snprintf(prefix, sizeof prefix, "xfabric-shm-%d-", (int)pid);
	DIR *d = opendir("/dev/shm");
	if (!d)
		FAIL("opendir /dev/shm");
	int n = 0;
	for (struct dirent *e; (e = readdir(d));)
		n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
	closedir(d);
	return n;
}

int main(void)
{
	alarm(60);
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0)
		FAIL("fork");
	if (pid == 0) {
		struct fi_info *info;
		struct fid_fabric *fabric;
		struct fid_domain *domain;
		open_domain(FI_MSG, 0, FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY,
			    &info, &fabric, &domain);
		struct fid_ep *ep;
		CHECK(fi_endpoint(domain, info, &ep, NULL));
		kill(getpid(), SIGBUS);
		sleep(2);
		fprintf(stderr, "sigbus_sent: the child survived a SIGBUS sent to it\n");
		_exit(0);
	}
	int st;
	if (waitpid(pid, &st, 0) != pid)
		FAIL("waitpid");
	if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGBUS)
		FAIL("the child ended with status %#x, not by SIGBUS", st);
	/* Opening a domain reclaims segments of dead owners. */
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	open_domain(FI_MSG, 0, FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY,
		    &info, &fabric, &domain);
	close_domain(info, fabric, domain);
	if (segments_of(pid) != 0)
		FAIL("the dead child's segment is still in /dev/shm");
	printf("sigbus_sent: a SIGBUS sent ends the process\n");
	return 0;
}
