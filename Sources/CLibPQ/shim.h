#ifndef DOCFS_CLIBPQ_SHIM_H
#define DOCFS_CLIBPQ_SHIM_H

// PostgreSQL's own client library (Debian's libpq-dev).
#include <libpq-fe.h>
#include <poll.h>

#endif
