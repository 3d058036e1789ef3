#ifndef DOCFS_CLINUXSUPPORT_H
#define DOCFS_CLINUXSUPPORT_H

// Linux calls that Swift's Glibc module does not export.
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <sys/vfs.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <fcntl.h>
#include <errno.h>

static inline int docfs_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath,
                                  unsigned int flags) {
    return (int)syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath, flags);
}

// Declared here rather than through _GNU_SOURCE, which would make this module's view of the
// system headers differ from Swift's Glibc module.
extern ssize_t copy_file_range(int fd_in, off_t *off_in, int fd_out, off_t *off_out, size_t len,
                               unsigned int flags);

static inline ssize_t docfs_copy_file_range(int fd_in, int fd_out, size_t len) {
    return copy_file_range(fd_in, NULL, fd_out, NULL, len, 0);
}

/// The f_type of the file system holding `path`, or -1 with errno set.
static inline long long docfs_fs_type(const char *path) {
    struct statfs fs;
    if (statfs(path, &fs) != 0) return -1;
    return (long long)(unsigned long)fs.f_type;
}

/// An unnamed file in `directory` (O_TMPFILE), read-write, 0600; -1 with errno set where the
/// file system has no O_TMPFILE.
static inline int docfs_open_tmpfile(const char *directory) {
    return openat(AT_FDCWD, directory, __O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
}

/// `path` opened for writes that bypass the page cache (O_DIRECT); -1 with errno set where the
/// file system refuses them (EINVAL).
static inline int docfs_open_direct_writes(const char *path) {
    return open(path, O_WRONLY | __O_DIRECT | O_CLOEXEC);
}

/// Frees the range so it reads as zeros (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE).
extern int fallocate(int fd, int mode, off_t offset, off_t len);
static inline int docfs_punch_hole(int fd, off_t offset, off_t length) {
    return fallocate(fd, 0x02 | 0x01, offset, length);
}

/// UTIME_OMIT, which Swift cannot import because it is a macro of an expression.
static inline long docfs_utime_omit(void) { return UTIME_OMIT; }

/* syncfs(2): declared by unistd.h only with _GNU_SOURCE. Writes back one file system's dirty pages. */
extern int syncfs(int fd);
static inline int docfs_syncfs(int fd) { return syncfs(fd); }

/* sync_file_range(2) with SYNC_FILE_RANGE_WRITE (2; its constants need _GNU_SOURCE): starts
   writing a range's dirty pages back and returns without waiting for the disk. */
extern int sync_file_range(int fd, off_t offset, off_t nbytes, unsigned int flags);
static inline int docfs_start_writeback(int fd, off_t offset, off_t length) {
    return sync_file_range(fd, offset, length, 2);
}

/* Waits until a range's pages are on disk (WAIT_BEFORE | WRITE | WAIT_AFTER), then lets the page
   cache drop them (POSIX_FADV_DONTNEED): 0, or the errno of the first step that failed. */
static inline int docfs_drop_written(int fd, off_t offset, off_t length) {
    if (sync_file_range(fd, offset, length, 1 | 2 | 4) != 0) return errno;
    return posix_fadvise(fd, offset, length, POSIX_FADV_DONTNEED);
}

/// CRC-32C (Castagnoli) of `count` bytes, continuing from `crc` (0 to start).
uint32_t docfs_crc32c(uint32_t crc, const void *bytes, size_t count);

/* Names the calling thread (at most 15 bytes are kept), as pthread_setname_np, which glibc
   declares only under _GNU_SOURCE. */
int docfs_set_thread_name(const char *name);

#endif
