import SystemPackage

/// A filesystem served through libfuse's low-level API: one method per kernel request.
///
/// Methods run on libfuse's worker threads (plain pthreads, several at once), so a conforming
/// type must be thread-safe. Each method gets a reply object and must answer it exactly once,
/// before returning or, moved out of the handler, later from any thread (see ``Reply``). Never block a
/// Swift-concurrency thread waiting for a handler, and never wait inside a handler for
/// Swift-concurrency work that could need the thread you are on.
///
/// Every method has a default. Where the kernel remembers an `ENOSYS` answer for the whole
/// connection, the doc comment says so: answering `ENOSYS` (``Errno/noFunction``) there turns
/// the operation off for good, which is the cheapest "not supported" but cannot be undone.
public protocol FileSystem: Sendable {
    /// Called once when the kernel connects, before any other request: negotiate capabilities
    /// and limits. Default: keep libfuse's defaults.
    func initialize(_ config: inout KernelConfig)

    /// Called once when the session ends, after the last request has been answered (or the
    /// ``MountOptions/drainTimeout`` has passed) and the mount is gone: finish or persist
    /// pending work here. Default: nothing.
    func destroy()

    /// Look up `name` in `parent`. Default: `ENOENT`.
    func lookup(_ context: RequestContext, parent: NodeID, name: FileName, reply: consuming ReplyEntry)

    /// The kernel dropped `lookups` references to `node`. No reply. Default: nothing.
    func forget(node: NodeID, lookups: UInt64)

    /// Several forgets at once. Default: calls ``forget(node:lookups:)`` for each.
    func batchForget(_ items: [ForgetItem])

    /// Attributes of `node`; `handle` is set for `fstat`. Default: `ENOSYS` (implement it: the
    /// mount is unusable without it).
    func getattr(_ context: RequestContext, node: NodeID, handle: FileHandle?, reply: consuming ReplyAttr)

    /// Change attributes (chmod, chown, truncate, utimens); answer the new attributes.
    /// Default: `ENOSYS` (not remembered: the caller sees it each time).
    func setattr(
        _ context: RequestContext, node: NodeID, changes: SetAttributes, reply: consuming ReplyAttr)

    /// Target of a symbolic link. Default: `ENOSYS`.
    func readlink(_ context: RequestContext, node: NodeID, reply: consuming ReplyReadlink)

    /// Create a non-directory, non-symlink node (regular files too when `create` answers
    /// `ENOSYS`). Default: `ENOSYS`.
    func mknod(
        _ context: RequestContext, parent: NodeID, name: FileName, type: FileType,
        permissions: FilePermissions, rdev: UInt64, reply: consuming ReplyEntry)

    /// Create a directory. Default: `ENOSYS`.
    func mkdir(
        _ context: RequestContext, parent: NodeID, name: FileName, permissions: FilePermissions,
        reply: consuming ReplyEntry)

    /// Remove a non-directory name. Keep the node while it is open or looked up. Default:
    /// `ENOSYS`.
    func unlink(_ context: RequestContext, parent: NodeID, name: FileName, reply: consuming ReplyEmpty)

    /// Remove an empty directory. Default: `ENOSYS`.
    func rmdir(_ context: RequestContext, parent: NodeID, name: FileName, reply: consuming ReplyEmpty)

    /// Create a symbolic link `name` in `parent` pointing at `target` (raw bytes). Default:
    /// `ENOSYS`.
    func symlink(
        _ context: RequestContext, target: [UInt8], parent: NodeID, name: FileName,
        reply: consuming ReplyEntry)

    /// Rename, atomically replacing an existing target unless `flags` say otherwise. Answer
    /// `EINVAL` for flags you do not implement: ignoring ``RenameFlags/exchange`` or
    /// ``RenameFlags/noReplace`` destroys data. Default: `ENOSYS`; for a rename *with* flags
    /// the kernel remembers that and answers `EINVAL` to every later flagged rename.
    func rename(
        _ context: RequestContext, parent: NodeID, name: FileName, newParent: NodeID,
        newName: FileName, flags: RenameFlags, reply: consuming ReplyEmpty)

    /// Create a hard link to `node`. Default: `ENOSYS` (`EPERM` is the POSIX answer for "no
    /// hard links here").
    func link(
        _ context: RequestContext, node: NodeID, newParent: NodeID, newName: FileName,
        reply: consuming ReplyEntry)

    /// Open a file. Default: success with ``FileHandle/none`` and no cache options. Answering
    /// `ENOSYS` asks for zero-message opens: the kernel remembers it and stops sending
    /// open and release for the connection.
    func open(_ context: RequestContext, node: NodeID, flags: OpenFlags, reply: consuming ReplyOpen)

    /// Read up to `size` bytes at `offset`. Default: `ENOSYS`.
    func read(
        _ context: RequestContext, node: NodeID, handle: FileHandle, offset: UInt64, size: Int,
        reply: consuming ReplyData)

    /// Write `data` at `offset` (already copied out of libfuse's buffer). Default: `ENOSYS`.
    func write(
        _ context: RequestContext, node: NodeID, handle: FileHandle, offset: UInt64, data: [UInt8],
        info: WriteInfo, reply: consuming ReplyWrite)

    /// Write `bytes` at `offset`, straight from libfuse's buffer: they are valid only until
    /// this call returns. Default: copies them and calls
    /// ``write(_:node:handle:offset:data:info:reply:)``. A filesystem that stores them before
    /// returning implements this one instead and saves the copy (7 % of DocumentFS's CPU
    /// while a 1 GiB file was written).
    func write(
        _ context: RequestContext, node: NodeID, handle: FileHandle, offset: UInt64,
        bytes: UnsafeRawBufferPointer, info: WriteInfo, reply: consuming ReplyWrite)

    /// Sent on every `close(2)` of a file descriptor (so possibly several times per open, after
    /// `dup` or `fork`); its error is what `close` returns. The kernel writes back dirty pages
    /// before sending it, so this is the natural commit point.
    ///
    /// Default: success without doing anything, because answering `ENOSYS` would make the
    /// kernel treat every later flush as a success without asking (it remembers that for the
    /// connection), and a filesystem added later could never hook in. A filesystem that saves
    /// MUST implement this and report a failed save here.
    func flush(
        _ context: RequestContext, node: NodeID, handle: FileHandle, lockOwner: LockOwner,
        reply: consuming ReplyEmpty)

    /// The last reference to an open is gone. Its error is ignored by the kernel. Default:
    /// success.
    func release(
        _ context: RequestContext, node: NodeID, handle: FileHandle, info: ReleaseInfo,
        reply: consuming ReplyEmpty)

    /// Make the file's data (and metadata unless ``FsyncFlags/dataSync``) durable; its error is
    /// what `fsync(2)` returns (editors abort a save on it).
    ///
    /// Default: success, for the same reason as ``flush(_:node:handle:lockOwner:reply:)``:
    /// `ENOSYS` is remembered as "always succeed". A filesystem that saves MUST implement it
    /// and answer success only once the data is safe.
    func fsync(
        _ context: RequestContext, node: NodeID, handle: FileHandle, flags: FsyncFlags,
        reply: consuming ReplyEmpty)

    /// Open a directory. Default: success with ``FileHandle/none``. `ENOSYS` is remembered
    /// like for ``open(_:node:flags:reply:)``.
    func opendir(_ context: RequestContext, node: NodeID, flags: OpenFlags, reply: consuming ReplyOpen)

    /// List entries after the cookie `offset` (0 = from the start). Default: `ENOSYS`.
    func readdir(
        _ context: RequestContext, node: NodeID, handle: FileHandle, offset: UInt64,
        reply: consuming ReplyDirectory)

    /// Like ``readdir(_:node:handle:offset:reply:)`` with an entry (and one lookup) per name.
    /// Only sent when ``KernelConfig/Capabilities/readdirplus`` is enabled. Default: `ENOSYS`.
    func readdirplus(
        _ context: RequestContext, node: NodeID, handle: FileHandle, offset: UInt64,
        reply: consuming ReplyDirectoryPlus)

    /// Close a directory handle. Default: success.
    func releasedir(
        _ context: RequestContext, node: NodeID, handle: FileHandle, reply: consuming ReplyEmpty)

    /// `fsync` on a directory. Default: success (`ENOSYS` would be remembered as success).
    func fsyncdir(
        _ context: RequestContext, node: NodeID, handle: FileHandle, flags: FsyncFlags,
        reply: consuming ReplyEmpty)

    /// Filesystem statistics. Default: ``FileSystemStatistics/plausibleDefault`` (zeros make
    /// file managers refuse to copy).
    func statfs(_ context: RequestContext, node: NodeID, reply: consuming ReplyStatfs)

    /// Set an extended attribute. Default: `ENOTSUP` (not `EPERM`, which makes cp and editors
    /// complain). `ENOSYS` would be remembered: every later setxattr fails with `EOPNOTSUPP`
    /// without being sent.
    func setxattr(
        _ context: RequestContext, node: NodeID, name: String, value: [UInt8], flags: XattrFlags,
        reply: consuming ReplyEmpty)

    /// Get an extended attribute (``ReplyXattr/value(_:)`` handles size probes). Default:
    /// `ENODATA`, which keeps xattrs available to a filesystem that supports some names.
    ///
    /// Trade-off: the kernel asks for `security.capability` before every `write(2)`; only an
    /// `ENOSYS` answer is remembered (then every getxattr fails with `EOPNOTSUPP` without a
    /// round trip). A filesystem with no xattrs at all should answer `ENOSYS` here; one with
    /// xattrs should answer such probes from memory.
    func getxattr(
        _ context: RequestContext, node: NodeID, name: String, reply: consuming ReplyXattr)

    /// List extended attribute names (``ReplyXattr/names(_:)``). Default: an empty list, for the
    /// same trade-off as ``getxattr(_:node:name:reply:)`` (`ENOSYS` is remembered).
    func listxattr(_ context: RequestContext, node: NodeID, reply: consuming ReplyXattr)

    /// Remove an extended attribute. Default: `ENODATA` (`ENOSYS` is remembered as
    /// `EOPNOTSUPP` for every later call).
    func removexattr(
        _ context: RequestContext, node: NodeID, name: String, reply: consuming ReplyEmpty)

    /// Check access (not sent with the `default_permissions` mount option). Default: `ENOSYS`,
    /// which the kernel remembers as "always allowed".
    func access(_ context: RequestContext, node: NodeID, mask: AccessMask, reply: consuming ReplyEmpty)

    /// Create and open a file. Apply `context.umask` to `permissions`. Default: `ENOSYS`, which
    /// the kernel remembers: it then uses ``mknod(_:parent:name:type:permissions:rdev:reply:)``
    /// followed by ``open(_:node:flags:reply:)``.
    func create(
        _ context: RequestContext, parent: NodeID, name: FileName, permissions: FilePermissions,
        flags: OpenFlags, reply: consuming ReplyCreate)

    /// Test for a POSIX lock conflicting with `lock`. Only sent when
    /// ``KernelConfig/Capabilities/posixLocks`` is enabled (otherwise the kernel keeps locks
    /// local to this host). Default: `ENOSYS`.
    func getlk(
        _ context: RequestContext, node: NodeID, handle: FileHandle, owner: LockOwner,
        lock: FileLock, reply: consuming ReplyLock)

    /// Acquire or release a POSIX lock; `wait` is set for `F_SETLKW` (answer when granted, or
    /// `EINTR` when ``Reply/isInterrupted``). Only sent with
    /// ``KernelConfig/Capabilities/posixLocks``. Default: `ENOSYS`.
    func setlk(
        _ context: RequestContext, node: NodeID, handle: FileHandle, owner: LockOwner,
        lock: FileLock, wait: Bool, reply: consuming ReplyEmpty)

    /// BSD `flock(2)`. Only sent with ``KernelConfig/Capabilities/flockLocks``. Default:
    /// `ENOSYS`.
    func flock(
        _ context: RequestContext, node: NodeID, handle: FileHandle, owner: LockOwner,
        operation: FlockOperation, reply: consuming ReplyEmpty)

    /// Allocate or deallocate space. Default: `ENOSYS`, remembered as `EOPNOTSUPP` (glibc's
    /// `posix_fallocate` then falls back to writing zeros).
    func fallocate(
        _ context: RequestContext, node: NodeID, handle: FileHandle, mode: FallocateMode,
        offset: UInt64, length: UInt64, reply: consuming ReplyEmpty)

    /// Copy a range between two open files without a round trip through the caller. Default:
    /// `ENOSYS`, remembered as `EOPNOTSUPP` (the kernel then copies through read and write).
    func copyFileRange(
        _ context: RequestContext, nodeIn: NodeID, handleIn: FileHandle, offsetIn: UInt64,
        nodeOut: NodeID, handleOut: FileHandle, offsetOut: UInt64, length: Int, flags: UInt32,
        reply: consuming ReplyWrite)

    /// `SEEK_DATA`/`SEEK_HOLE` (the kernel handles the other whences). Default: `ENOSYS`,
    /// remembered: the kernel then treats the whole file as data.
    func lseek(
        _ context: RequestContext, node: NodeID, handle: FileHandle, offset: Int64,
        whence: SeekWhence, reply: consuming ReplyLseek)
}

extension FileSystem {
    public func initialize(_ config: inout KernelConfig) {}
    public func destroy() {}

    public func lookup(
        _ context: RequestContext, parent: NodeID, name: FileName, reply: consuming ReplyEntry
    ) {
        reply.error(.noSuchFileOrDirectory)
    }

    public func forget(node: NodeID, lookups: UInt64) {}

    public func batchForget(_ items: [ForgetItem]) {
        for item in items { forget(node: item.node, lookups: item.lookups) }
    }

    public func getattr(
        _ context: RequestContext, node: NodeID, handle: FileHandle?, reply: consuming ReplyAttr
    ) {
        reply.error(.noFunction)
    }

    public func setattr(
        _ context: RequestContext, node: NodeID, changes: SetAttributes, reply: consuming ReplyAttr
    ) {
        reply.error(.noFunction)
    }

    public func readlink(_ context: RequestContext, node: NodeID, reply: consuming ReplyReadlink) {
        reply.error(.noFunction)
    }

    public func mknod(
        _ context: RequestContext, parent: NodeID, name: FileName, type: FileType,
        permissions: FilePermissions, rdev: UInt64, reply: consuming ReplyEntry
    ) {
        reply.error(.noFunction)
    }

    public func mkdir(
        _ context: RequestContext, parent: NodeID, name: FileName, permissions: FilePermissions,
        reply: consuming ReplyEntry
    ) {
        reply.error(.noFunction)
    }

    public func unlink(
        _ context: RequestContext, parent: NodeID, name: FileName, reply: consuming ReplyEmpty
    ) {
        reply.error(.noFunction)
    }

    public func rmdir(
        _ context: RequestContext, parent: NodeID, name: FileName, reply: consuming ReplyEmpty
    ) {
        reply.error(.noFunction)
    }

    public func symlink(
        _ context: RequestContext, target: [UInt8], parent: NodeID, name: FileName,
        reply: consuming ReplyEntry
    ) {
        reply.error(.noFunction)
    }

    public func rename(
        _ context: RequestContext, parent: NodeID, name: FileName, newParent: NodeID,
        newName: FileName, flags: RenameFlags, reply: consuming ReplyEmpty
    ) {
        reply.error(.noFunction)
    }

    public func link(
        _ context: RequestContext, node: NodeID, newParent: NodeID, newName: FileName,
        reply: consuming ReplyEntry
    ) {
        reply.error(.noFunction)
    }

    public func open(_ context: RequestContext, node: NodeID, flags: OpenFlags, reply: consuming ReplyOpen) {
        reply.opened(.none)
    }

    public func read(
        _ context: RequestContext, node: NodeID, handle: FileHandle, offset: UInt64, size: Int,
        reply: consuming ReplyData
    ) {
        reply.error(.noFunction)
    }

    public func write(
        _ context: RequestContext, node: NodeID, handle: FileHandle, offset: UInt64, data: [UInt8],
        info: WriteInfo, reply: consuming ReplyWrite
    ) {
        reply.error(.noFunction)
    }

    public func write(
        _ context: RequestContext, node: NodeID, handle: FileHandle, offset: UInt64,
        bytes: UnsafeRawBufferPointer, info: WriteInfo, reply: consuming ReplyWrite
    ) {
        write(
            context, node: node, handle: handle, offset: offset, data: Array(bytes), info: info, reply: reply)
    }

    public func flush(
        _ context: RequestContext, node: NodeID, handle: FileHandle, lockOwner: LockOwner,
        reply: consuming ReplyEmpty
    ) {
        reply.ok()
    }

    public func release(
        _ context: RequestContext, node: NodeID, handle: FileHandle, info: ReleaseInfo,
        reply: consuming ReplyEmpty
    ) {
        reply.ok()
    }

    public func fsync(
        _ context: RequestContext, node: NodeID, handle: FileHandle, flags: FsyncFlags,
        reply: consuming ReplyEmpty
    ) {
        reply.ok()
    }

    public func opendir(
        _ context: RequestContext, node: NodeID, flags: OpenFlags, reply: consuming ReplyOpen
    ) {
        reply.opened(.none)
    }

    public func readdir(
        _ context: RequestContext, node: NodeID, handle: FileHandle, offset: UInt64,
        reply: consuming ReplyDirectory
    ) {
        reply.error(.noFunction)
    }

    public func readdirplus(
        _ context: RequestContext, node: NodeID, handle: FileHandle, offset: UInt64,
        reply: consuming ReplyDirectoryPlus
    ) {
        reply.error(.noFunction)
    }

    public func releasedir(
        _ context: RequestContext, node: NodeID, handle: FileHandle, reply: consuming ReplyEmpty
    ) {
        reply.ok()
    }

    public func fsyncdir(
        _ context: RequestContext, node: NodeID, handle: FileHandle, flags: FsyncFlags,
        reply: consuming ReplyEmpty
    ) {
        reply.ok()
    }

    public func statfs(_ context: RequestContext, node: NodeID, reply: consuming ReplyStatfs) {
        reply.statistics(.plausibleDefault)
    }

    public func setxattr(
        _ context: RequestContext, node: NodeID, name: String, value: [UInt8], flags: XattrFlags,
        reply: consuming ReplyEmpty
    ) {
        reply.error(.notSupported)
    }

    public func getxattr(
        _ context: RequestContext, node: NodeID, name: String, reply: consuming ReplyXattr
    ) {
        reply.error(.noData)
    }

    public func listxattr(_ context: RequestContext, node: NodeID, reply: consuming ReplyXattr) {
        reply.names([])
    }

    public func removexattr(
        _ context: RequestContext, node: NodeID, name: String, reply: consuming ReplyEmpty
    ) {
        reply.error(.noData)
    }

    public func access(
        _ context: RequestContext, node: NodeID, mask: AccessMask, reply: consuming ReplyEmpty
    ) {
        reply.error(.noFunction)
    }

    public func create(
        _ context: RequestContext, parent: NodeID, name: FileName, permissions: FilePermissions,
        flags: OpenFlags, reply: consuming ReplyCreate
    ) {
        reply.error(.noFunction)
    }

    public func getlk(
        _ context: RequestContext, node: NodeID, handle: FileHandle, owner: LockOwner,
        lock: FileLock, reply: consuming ReplyLock
    ) {
        reply.error(.noFunction)
    }

    public func setlk(
        _ context: RequestContext, node: NodeID, handle: FileHandle, owner: LockOwner,
        lock: FileLock, wait: Bool, reply: consuming ReplyEmpty
    ) {
        reply.error(.noFunction)
    }

    public func flock(
        _ context: RequestContext, node: NodeID, handle: FileHandle, owner: LockOwner,
        operation: FlockOperation, reply: consuming ReplyEmpty
    ) {
        reply.error(.noFunction)
    }

    public func fallocate(
        _ context: RequestContext, node: NodeID, handle: FileHandle, mode: FallocateMode,
        offset: UInt64, length: UInt64, reply: consuming ReplyEmpty
    ) {
        reply.error(.noFunction)
    }

    public func copyFileRange(
        _ context: RequestContext, nodeIn: NodeID, handleIn: FileHandle, offsetIn: UInt64,
        nodeOut: NodeID, handleOut: FileHandle, offsetOut: UInt64, length: Int, flags: UInt32,
        reply: consuming ReplyWrite
    ) {
        reply.error(.noFunction)
    }

    public func lseek(
        _ context: RequestContext, node: NodeID, handle: FileHandle, offset: Int64,
        whence: SeekWhence, reply: consuming ReplyLseek
    ) {
        reply.error(.noFunction)
    }
}
