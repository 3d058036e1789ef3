#ifndef DOCFS_CFUSE3_SHIM_H
#define DOCFS_CFUSE3_SHIM_H

// 312, not 35: with 35 fuse_session_loop_mt is a function-like macro Swift cannot import.
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/stat.h>

// Helpers for what Swift cannot express directly: the FUSE_BUFVEC_INIT macro (its one-element
// array imports as a tuple) and the open(2) flags glibc only exposes under _GNU_SOURCE.

/// fuse_lowlevel_notify_store for one memory buffer.
static inline int docfs_notify_store(struct fuse_session *se, fuse_ino_t ino, off_t offset,
                                     const void *data, size_t size) {
    struct fuse_bufvec bufv = FUSE_BUFVEC_INIT(size);
    bufv.buf[0].mem = (void *)data;
    return fuse_lowlevel_notify_store(se, ino, offset, &bufv, 0);
}

/// Total size of a buffer vector (what retrieve_reply delivers).
static inline size_t docfs_bufvec_size(const struct fuse_bufvec *src) {
    return fuse_buf_size(src);
}

/// Copies a buffer vector into flat memory; returns the bytes copied or a negative errno.
static inline ssize_t docfs_bufvec_copy(struct fuse_bufvec *src, void *dst, size_t size) {
    struct fuse_bufvec dstv = FUSE_BUFVEC_INIT(size);
    dstv.buf[0].mem = dst;
    return fuse_buf_copy(&dstv, src, 0);
}

/// Open flags that need _GNU_SOURCE (values differ between architectures).
static inline int docfs_o_direct(void) {
#ifdef O_DIRECT
    return O_DIRECT;
#elif defined(__x86_64__) || defined(__i386__)
    return 040000;
#else
    return 0200000;
#endif
}

static inline int docfs_o_noatime(void) {
#ifdef O_NOATIME
    return O_NOATIME;
#else
    return 01000000;
#endif
}

static inline int docfs_o_path(void) {
#ifdef O_PATH
    return O_PATH;
#else
    return 010000000;
#endif
}

// Declared here because glibc only declares them under _GNU_SOURCE.
int pthread_setname_np(pthread_t thread, const char *name);
int pipe2(int pipefd[2], int flags);

/// A close-on-exec pipe.
static inline int docfs_pipe_cloexec(int fds[2]) {
    return pipe2(fds, O_CLOEXEC);
}

/// The device number of the file system mounted at `path`, from the mount's superblock:
/// statx with AT_STATX_DONT_SYNC, so no request is sent to a FUSE server that is not serving
/// yet (a plain stat right after mounting waits for an INIT nobody answers). 0 on success.
static inline int docfs_mount_device(const char *path, unsigned int *major, unsigned int *minor) {
    struct statx stx;
    memset(&stx, 0, sizeof stx);
    if (syscall(SYS_statx, AT_FDCWD, path, 0x4000 /* AT_STATX_DONT_SYNC */, 0, &stx) != 0) return -1;
    *major = stx.stx_dev_major;
    *minor = stx.stx_dev_minor;
    return 0;
}

#endif
