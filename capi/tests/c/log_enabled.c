/* fi_log_enabled follows FI_LOG_LEVEL, as libfabric's does: prints, for each fi_log_level
 * (warn, trace, info, debug), 1 or 0. */
#include <rdma/fabric.h>
#include <rdma/providers/fi_log.h>
#include <stdio.h>

int main(void)
{
	printf("warn %d trace %d info %d debug %d\n", fi_log_enabled(NULL, FI_LOG_WARN, FI_LOG_CORE),
	       fi_log_enabled(NULL, FI_LOG_TRACE, FI_LOG_CORE),
	       fi_log_enabled(NULL, FI_LOG_INFO, FI_LOG_CORE),
	       fi_log_enabled(NULL, FI_LOG_DEBUG, FI_LOG_CORE));
	return 0;
}
