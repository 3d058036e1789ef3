#ifndef DOCFS_CFUSE3_SHIM_H
#define DOCFS_CFUSE3_SHIM_H

// 312, not 35: with 35 fuse_session_loop_mt is a function-like macro Swift cannot import.
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#endif
