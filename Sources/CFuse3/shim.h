#ifndef DOCFS_CFUSE3_SHIM_H
#define DOCFS_CFUSE3_SHIM_H

// 312, not 35: with 35 fuse_session_loop_mt is a function-like macro Swift cannot import.
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/stat.h>

// Helpers for what Swift cannot express directly: the FUSE_BUFVEC_INIT macro (its one-element
// array imports as a tuple) and the open(2) flags glibc only exposes under _GNU_SOURCE.

/// pthread_timedjoin_np (a GNU extension the headers hide without _GNU_SOURCE): joins `thread`
/// if it ends within `milliseconds`; 0 when joined, ETIMEDOUT when it is still running.
extern int pthread_timedjoin_np(pthread_t thread, void **result, const struct timespec *deadline);
static inline int docfs_join_within(pthread_t thread, long milliseconds) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);  // the clock pthread_timedjoin_np measures
    deadline.tv_sec += milliseconds / 1000;
    deadline.tv_nsec += (milliseconds % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec += 1;
        deadline.tv_nsec -= 1000000000L;
    }
    return pthread_timedjoin_np(thread, NULL, &deadline);
}

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

/// An O_PATH descriptor on the root of the file system mounted at `path`. Held across an
/// unmount, it keeps that file system (and so its connection number) alive until closed.
static inline int docfs_pin_mount(const char *path) {
    return open(path, docfs_o_path() | O_DIRECTORY | O_CLOEXEC);
}

/// Aborts FUSE connection `minor` through fusectl's abort file. 1 when aborted, -1 on error.
static inline int docfs_abort_connection(unsigned int minor) {
    char file[64];
    snprintf(file, sizeof file, "/sys/fs/fuse/connections/%u/abort", minor);
    int abortFD = open(file, O_WRONLY | O_CLOEXEC);
    if (abortFD < 0) return -1;
    int result = write(abortFD, "1", 1) == 1 ? 1 : -1;
    close(abortFD);
    return result;
}

/// Aborts FUSE connection `minor` (via fusectl) when `pinned` (from docfs_pin_mount) is that
/// file system, device major:minor; then closes `pinned`. A connection number is only reused
/// once its file system is gone, which the pin prevents, so another mount is never aborted.
/// Returns 1 when aborted, 0 when `pinned` is another file system, -1 on error.
static inline int docfs_abort_pinned_connection(int pinned, unsigned int major, unsigned int minor) {
    if (pinned < 0) return -1;
    struct statx stx;
    memset(&stx, 0, sizeof stx);
    int result = 0;
    if (syscall(SYS_statx, pinned, "", 0x1000 /* AT_EMPTY_PATH */ | 0x4000 /* AT_STATX_DONT_SYNC */, 0, &stx) != 0) {
        result = -1;
    } else if (stx.stx_dev_major == major && stx.stx_dev_minor == minor) {
        result = docfs_abort_connection(minor);
    }
    close(pinned);
    return result;
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
