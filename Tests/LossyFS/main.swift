// lossyfs: a file system that loses, at a power cut, everything nobody made durable.
//
//     lossyfs BACKING MOUNTPOINT [-o names=posix] [-o limbo=DIR] [-d]
//
// Serves BACKING (a folder) at MOUNTPOINT in the foreground, as root (it reads and writes every
// file, and gives new files the caller's owner; `allow_other` and `default_permissions`, so
// that a server running as another user, PostgreSQL, can use it). Signals:
//   SIGUSR1  cut the power: drop every unsynced byte and name change, put BACKING back as it
//            was at the last durable point, detach the mount and exit 0. Processes using the
//            mount get ENOTCONN or ECONNABORTED (EIO for requests in flight). Mount again on
//            the same BACKING to "reboot".
//   SIGUSR2  make everything durable now (what syncfs(2) would do, were it forwarded).
//   SIGTERM, SIGINT, SIGHUP, fusermount3 -u: a clean unmount, which makes everything durable.
// A SIGKILL of lossyfs itself is not a power cut: BACKING keeps the names of that moment and
// loses the unsynced bytes.
//
// The model (see FileOverlay and NameJournal):
// - Data: write, truncate, O_TRUNC and fallocate (size, PUNCH_HOLE, ZERO_RANGE; space is not
//   modelled) change an in-memory overlay of the file's pages; reads merge it over BACKING.
//   fsync and fdatasync (FUSE_FSYNC, with or without FUSE_FSYNC_FDATASYNC) write the file's
//   overlay to its backing file and fsync it. At a cut every overlay is dropped whole (no torn
//   or partly kept writes).
// - Names: create, mknod, mkdir, symlink, link, unlink, rmdir, rename (RENAME_NOREPLACE,
//   RENAME_EXCHANGE) are done in BACKING at once and journaled; a removed or replaced inode
//   keeps a hard link (a rmdir'ed folder, its place) in a limbo folder beside BACKING (same file
//   system; `-o limbo=`, default BACKING.lossyfs-limbo) until no undo can need it. A change
//   becomes durable with fsync of a folder it is in (FUSE_FSYNCDIR), or with fsync/fdatasync of
//   the file it names (ext4 commits a new file's entry with the file; `-o names=posix` turns
//   that off), together with every older change of the same names and, for a change of the
//   folder tree, every older change. At a cut the journal is undone newest first.
// - Not modelled (durable at once): chmod, chown, utimens (except the mtime of unsynced
//   writes), and the backing folder's own fsyncs. No extended attributes (ENOSYS), no locks
//   (the kernel keeps them), no O_TMPFILE (libfuse 3.14 cannot: EOPNOTSUPP).
// - The kernel's writeback cache is off, so every write(2) and every written-back page of a
//   shared mmap reaches lossyfs before it can be held back; the page cache stays on (shared
//   writable mmap needs it; direct_io would refuse it) and is never stale, because nothing but
//   this mount changes BACKING while it runs, and a cut ends the mount: the next one starts
//   with an empty page cache.
//
// What the kernel (6.18) forwards, read in fs/fuse and fs/sync.c:
// - fsync(2), fdatasync(2), msync(MS_SYNC), and writes on O_SYNC/O_DSYNC descriptors
//   (generic_write_sync → vfs_fsync_range) reach fuse_fsync: dirty pages are written back
//   (FUSE_WRITE), then FUSE_FSYNC is sent (FUSE_FSYNC_FDATASYNC for the data-only ones); a
//   directory's fsync is FUSE_FSYNCDIR.
// - syncfs(2) and sync(2) run sync_filesystem: dirty pages are written back (FUSE_WRITE), then
//   fuse_sync_fs returns 0 at once unless fc->sync_fs, which only virtio_fs_get_tree sets
//   (and, in later trees, fuseblk and iomap mounts): a /dev/fuse mount never gets
//   FUSE_SYNCFS, and libfuse 3.14 has no handler for it anyway (it would answer ENOSYS, after
//   which the kernel clears fc->sync_fs). So syncfs makes nothing durable here; SIGUSR2 does
//   what it would.
// - sync_file_range(2) (fs/sync.c) only starts or waits for writeback of the page-cache range
//   (filemap_fdatawrite_range, file_fdatawait_range) and never calls ->fsync: lossyfs sees at
//   most FUSE_WRITEs of dirty mmap pages, and, as Linux defines it, nothing becomes durable.
import CFuse3
import FUSE
import Foundation
import SystemPackage

#if canImport(Glibc)
    import Glibc
#endif

/// Messages on standard error.
enum Log {
    static func say(_ message: String) {
        FileHandle.standardError.write(Data("lossyfs: \(message)\n".utf8))
    }
}

func usage() -> Never {
    Log.say("usage: lossyfs BACKING MOUNTPOINT [-o names=posix] [-o limbo=DIR] [-d]")
    exit(2)
}

/// Parses the arguments, mounts, and serves until a cut or an unmount.
func runLossyFS() -> Never {
    var positional: [String] = []
    var posixNames = false
    var limbo: String?
    var debug = false
    var arguments = CommandLine.arguments.dropFirst()
    while let argument = arguments.popFirst() {
        switch argument {
        case "-o":
            guard let value = arguments.popFirst() else { usage() }
            for option in value.split(separator: ",") {
                if option == "names=posix" {
                    posixNames = true
                } else if option == "names=ext4" {
                    posixNames = false
                } else if option.hasPrefix("limbo=") {
                    limbo = String(option.dropFirst("limbo=".count))
                } else {
                    Log.say("unknown option \(option)")
                    usage()
                }
            }
        case "-d": debug = true
        case "-h", "--help": usage()
        default: positional.append(argument)
        }
    }
    guard positional.count == 2 else { usage() }
    let backing = URL(fileURLWithPath: positional[0]).standardizedFileURL.path
    let mountpoint = URL(fileURLWithPath: positional[1]).standardizedFileURL.path
    guard !mountpoint.hasPrefix(backing + "/"), !backing.hasPrefix(mountpoint + "/"), backing != mountpoint
    else {
        Log.say("BACKING and MOUNTPOINT must not contain each other")
        exit(2)
    }

    // One descriptor per known inode: allow as many as the system lets us.
    var limit = rlimit()
    if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 {
        limit.rlim_cur = limit.rlim_max
        setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    }

    // A parent's thread may have blocked signals (a Swift test's does): unblock them all, or
    // SIGTERM would never end the mount. SIGUSR1 and SIGUSR2 are taken by one thread with
    // sigwait: blocked before any thread starts.
    var none = sigset_t()
    sigemptyset(&none)
    pthread_sigmask(SIG_SETMASK, &none, nil)
    var powerSignals = sigset_t()
    sigemptyset(&powerSignals)
    sigaddset(&powerSignals, SIGUSR1)
    sigaddset(&powerSignals, SIGUSR2)
    pthread_sigmask(SIG_BLOCK, &powerSignals, nil)

    let fileSystem: LossyFileSystem
    do {
        fileSystem = try LossyFileSystem(
            .init(backing: backing, limbo: limbo ?? backing + ".lossyfs-limbo", posixNames: posixNames))
    } catch {
        Log.say("cannot serve \(backing): \(error)")
        exit(1)
    }

    var options = MountOptions()
    options.fsName = backing
    options.subtype = "lossyfs"
    options.allowOther = getuid() == 0
    options.handleSignals = true
    options.debug = debug
    options.threadName = "lossyfs"
    let session: Session
    do {
        session = try Session(filesystem: fileSystem, mountpoint: mountpoint, options: options)
    } catch {
        Log.say("cannot mount at \(mountpoint): \(error)")
        exit(1)
    }
    // The connection's number, taken now: at the cut a stat of the mount would wait for ourselves.
    var major: UInt32 = 0
    var minor: UInt32 = 0
    let knowsConnection = docfs_mount_device(mountpoint, &major, &minor) == 0
    let connection = minor

    let signals = powerSignals
    let watcher = Thread {
        while true {
            var signal: Int32 = 0
            var waitFor = signals
            guard sigwait(&waitFor, &signal) == 0 else { continue }
            if signal == SIGUSR2 {
                fileSystem.syncEverything()
                continue
            }
            fileSystem.cutPower {
                if !knowsConnection || docfs_abort_connection(connection) != 1 {
                    Log.say("could not abort FUSE connection \(connection); detaching only")
                }
                // libfuse does not unmount an aborted connection: detach it here, before the end
                // of the session (the abort ends it) lets the process exit.
                if umount2(mountpoint, 2) != 0 {  // MNT_DETACH
                    Log.say("umount2 \(mountpoint): \(Errno(rawValue: errno))")
                }
            }
            session.requestUnmount()
            return
        }
    }
    watcher.start()

    do {
        try session.run()
    } catch {
        Log.say("session ended: \(error)")
        exit(1)
    }
    exit(0)
}

runLossyFS()
