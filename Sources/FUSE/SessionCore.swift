import CFuse3
import Logging
import Synchronization
import SystemPackage

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// libfuse's `struct fuse_session *`, for the threads that share it.
// @unchecked: a C pointer. libfuse's calls on a session from several threads (receive, process,
// notify) are the ones its multi-threaded loop makes too.
struct SessionHandle: @unchecked Sendable {
    let pointer: OpaquePointer
}

/// What the C callbacks reach through `fuse_req_userdata`: the filesystem, the logger and the
/// gate that stops replies once libfuse's session is about to be freed.
final class SessionCore: Sendable {
    let filesystem: any FileSystem
    let logger: Logger
    let options: MountOptions
    /// libfuse's session; set once before mounting, cleared only after the gate is closed. Read
    /// when the session starts and ends, not per request.
    private let sessionHandle = Mutex<SessionHandle?>(nil)
    var session: OpaquePointer? {
        get { sessionHandle.withLock { $0?.pointer } }
        set { sessionHandle.withLock { $0 = newValue.map(SessionHandle.init(pointer:)) } }
    }
    /// Replies made and not yet answered or dropped: the end of the session waits for them.
    private let outstanding = Atomic<Int>(0)
    /// Replies inside a libfuse call right now.
    private let inFlight = Atomic<Int>(0)
    /// Set at teardown: later replies are dropped instead of touching a freed session.
    private let closed = Atomic<Bool>(false)
    private let destroyed = Atomic<Bool>(false)
    /// Set once the kernel's INIT has been handled; `destroy` pairs with it.
    let initialized = Atomic<Bool>(false)
    let notifications: NotificationQueue
    /// What ``RawProtocol`` saw of the kernel's INIT, and what it adds to the reply.
    struct KernelInit {
        var unique: UInt64 = 0
        /// The kernel offered `FUSE_HANDLE_KILLPRIV_V2`.
        var offered = false
        var replyFlags: UInt32 = 0
    }
    let kernelInit = Mutex(KernelInit())
    /// Set between the filesystem's `initialize` and the INIT reply that carries ``KernelInit/replyFlags``.
    let initReplyPending = Atomic<Bool>(false)

    init(filesystem: any FileSystem, options: MountOptions, logger: Logger) {
        self.filesystem = filesystem
        self.options = options
        self.logger = logger
        notifications = NotificationQueue(logger: logger)
    }

    static func from(_ userdata: UnsafeMutableRawPointer) -> SessionCore {
        Unmanaged<SessionCore>.fromOpaque(userdata).takeUnretainedValue()
    }

    // MARK: Reply accounting

    // Atomics, not a lock: every request passes here twice, on every worker thread at once,
    // and waiting for the counts happens only at the end of the session.

    func replyCreated() { outstanding.add(1, ordering: .relaxed) }

    /// Runs a reply's libfuse call unless the gate is closed (then answers -ENOTCONN), and counts
    /// the reply finished.
    func sendReply(_ request: fuse_req_t, _ body: (fuse_req_t) -> CInt) -> CInt {
        defer { outstanding.subtract(1, ordering: .releasing) }
        inFlight.add(1, ordering: .sequentiallyConsistent)
        defer { inFlight.subtract(1, ordering: .sequentiallyConsistent) }
        // Checked after counting in flight: `closeGate` sets the flag first and then waits
        // for what is in flight, so no call starts once it waited.
        guard !closed.load(ordering: .sequentiallyConsistent) else {
            logger.debug("reply after the session closed: dropped")
            return -ENOTCONN
        }
        return body(request)
    }

    /// Waits up to `timeout` for outstanding replies; returns how many are still pending.
    func drain(timeout: Duration) -> Int {
        let clock = ContinuousClock()
        let deadline = clock.now + timeout
        while outstanding.load(ordering: .acquiring) > 0 && clock.now < deadline { usleep(1000) }
        return max(0, outstanding.load(ordering: .acquiring))
    }

    /// Stops replies from reaching libfuse and waits for those inside a libfuse call.
    func closeGate() {
        closed.store(true, ordering: .sequentiallyConsistent)
        while inFlight.load(ordering: .sequentiallyConsistent) > 0 { usleep(100) }
    }

    // MARK: Lifecycle callbacks

    /// Runs the filesystem's `destroy` once, whoever asks first (our teardown or libfuse).
    func runDestroy() {
        guard initialized.load(ordering: .acquiring) else { return }
        guard
            destroyed.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing)
                .exchanged
        else { return }
        filesystem.destroy()
    }
}

// MARK: - The C operation table

/// Reaches the core of a request, or answers EIO if the request is malformed.
private func withCore(_ req: fuse_req_t?, _ body: (SessionCore, fuse_req_t) -> Void) {
    guard let req else { return }
    guard let userdata = fuse_req_userdata(req) else {
        fuse_reply_err(req, EIO)
        return
    }
    body(SessionCore.from(userdata), req)
}

/// Copies a C string argument, answering EINVAL if the kernel sent none.
private func copyName(_ req: fuse_req_t, _ cName: UnsafePointer<CChar>?) -> FileName? {
    guard let cName else {
        fuse_reply_err(req, EINVAL)
        return nil
    }
    return FileName(cString: cName)
}

private func handle(_ fi: UnsafeMutablePointer<fuse_file_info>?) -> FileHandle {
    FileHandle(fi?.pointee.fh ?? 0)
}

private func permissions(_ mode: mode_t) -> FilePermissions {
    FilePermissions(rawValue: mode & 0o7777)
}

// Every callback copies its C arguments before returning: names, buffers and fuse_file_info
// die with the callback, while the reply may be sent later from another thread.
func makeOperations() -> fuse_lowlevel_ops {
    var ops = fuse_lowlevel_ops()
    ops.`init` = { userdata, conn in
        guard let userdata, let conn else { return }
        let core = SessionCore.from(userdata)
        var config = KernelConfig(conn.pointee, offersKillPrivV2: core.kernelInit.withLock { $0.offered })
        core.filesystem.initialize(&config)
        config.apply(to: &conn.pointee)
        var added: UInt32 = 0
        if config.wanted.contains(.handleKillPrivV2) { added |= RawProtocol.handleKillPrivV2 }
        if config.wanted.contains(.parallelDirectoryOps) { added |= RawProtocol.parallelDirops }
        if added != 0 {
            core.kernelInit.withLock { $0.replyFlags = added }
            core.initReplyPending.store(true, ordering: .releasing)
        }
        core.initialized.store(true, ordering: .releasing)
        core.logger.debug(
            "FUSE \(config.protocolVersion.major).\(config.protocolVersion.minor) connected",
            metadata: ["want": "\(String(config.wanted.rawValue, radix: 16))"])
    }
    ops.destroy = { userdata in
        guard let userdata else { return }
        SessionCore.from(userdata).runDestroy()
    }
    ops.lookup = { req, parent, cName in
        withCore(req) { core, req in
            guard let name = copyName(req, cName) else { return }
            core.filesystem.lookup(
                RequestContext(req), parent: NodeID(parent), name: name,
                reply: ReplyEntry(req, core, "lookup"))
        }
    }
    ops.forget = { req, ino, nlookup in
        withCore(req) { core, req in
            core.filesystem.forget(node: NodeID(ino), lookups: nlookup)
            fuse_reply_none(req)
        }
    }
    ops.forget_multi = { req, count, forgets in
        withCore(req) { core, req in
            var items: [ForgetItem] = []
            if let forgets {
                items.reserveCapacity(count)
                for i in 0..<count {
                    items.append(ForgetItem(node: NodeID(forgets[i].ino), lookups: forgets[i].nlookup))
                }
            }
            core.filesystem.batchForget(items)
            fuse_reply_none(req)
        }
    }
    ops.getattr = { req, ino, fi in
        withCore(req) { core, req in
            core.filesystem.getattr(
                RequestContext(req), node: NodeID(ino), handle: fi.map { FileHandle($0.pointee.fh) },
                reply: ReplyAttr(req, core, "getattr", node: NodeID(ino)))
        }
    }
    ops.setattr = { req, ino, attr, toSet, fi in
        withCore(req) { core, req in
            guard let attr else {
                fuse_reply_err(req, EINVAL)
                return
            }
            let changes = SetAttributes(
                attr.pointee, valid: toSet, handle: fi.map { FileHandle($0.pointee.fh) })
            core.filesystem.setattr(
                RequestContext(req), node: NodeID(ino), changes: changes,
                reply: ReplyAttr(req, core, "setattr", node: NodeID(ino)))
        }
    }
    ops.readlink = { req, ino in
        withCore(req) { core, req in
            core.filesystem.readlink(
                RequestContext(req), node: NodeID(ino), reply: ReplyReadlink(req, core, "readlink"))
        }
    }
    ops.mknod = { req, parent, cName, mode, rdev in
        withCore(req) { core, req in
            guard let name = copyName(req, cName) else { return }
            guard let type = FileType(mode: mode) else {
                fuse_reply_err(req, EINVAL)
                return
            }
            core.filesystem.mknod(
                RequestContext(req), parent: NodeID(parent), name: name, type: type,
                permissions: permissions(mode), rdev: UInt64(rdev), reply: ReplyEntry(req, core, "mknod"))
        }
    }
    ops.mkdir = { req, parent, cName, mode in
        withCore(req) { core, req in
            guard let name = copyName(req, cName) else { return }
            core.filesystem.mkdir(
                RequestContext(req), parent: NodeID(parent), name: name, permissions: permissions(mode),
                reply: ReplyEntry(req, core, "mkdir"))
        }
    }
    ops.unlink = { req, parent, cName in
        withCore(req) { core, req in
            guard let name = copyName(req, cName) else { return }
            core.filesystem.unlink(
                RequestContext(req), parent: NodeID(parent), name: name,
                reply: ReplyEmpty(req, core, "unlink"))
        }
    }
    ops.rmdir = { req, parent, cName in
        withCore(req) { core, req in
            guard let name = copyName(req, cName) else { return }
            core.filesystem.rmdir(
                RequestContext(req), parent: NodeID(parent), name: name,
                reply: ReplyEmpty(req, core, "rmdir"))
        }
    }
    ops.symlink = { req, cTarget, parent, cName in
        withCore(req) { core, req in
            guard let target = copyName(req, cTarget), let name = copyName(req, cName) else { return }
            core.filesystem.symlink(
                RequestContext(req), target: target.bytes, parent: NodeID(parent), name: name,
                reply: ReplyEntry(req, core, "symlink"))
        }
    }
    ops.rename = { req, parent, cName, newParent, cNewName, flags in
        withCore(req) { core, req in
            guard let name = copyName(req, cName), let newName = copyName(req, cNewName) else { return }
            core.filesystem.rename(
                RequestContext(req), parent: NodeID(parent), name: name, newParent: NodeID(newParent),
                newName: newName, flags: RenameFlags(rawValue: flags),
                reply: ReplyEmpty(req, core, "rename"))
        }
    }
    ops.link = { req, ino, newParent, cNewName in
        withCore(req) { core, req in
            guard let newName = copyName(req, cNewName) else { return }
            core.filesystem.link(
                RequestContext(req), node: NodeID(ino), newParent: NodeID(newParent), newName: newName,
                reply: ReplyEntry(req, core, "link"))
        }
    }
    ops.open = { req, ino, fi in
        withCore(req) { core, req in
            core.filesystem.open(
                RequestContext(req), node: NodeID(ino), flags: OpenFlags(rawValue: fi?.pointee.flags ?? 0),
                reply: ReplyOpen(req, core, "open"))
        }
    }
    ops.read = { req, ino, size, offset, fi in
        withCore(req) { core, req in
            core.filesystem.read(
                RequestContext(req), node: NodeID(ino), handle: handle(fi),
                offset: UInt64(clamping: offset), size: size, reply: ReplyData(req, core, "read"))
        }
    }
    ops.write = { req, ino, buf, size, offset, fi in
        withCore(req) { core, req in
            let bytes = UnsafeRawBufferPointer(start: size > 0 ? buf : nil, count: buf == nil ? 0 : size)
            let info = WriteInfo(
                flags: OpenFlags(rawValue: fi?.pointee.flags ?? 0),
                isWritePage: fi?.pointee.writepage == 1,
                lockOwner: fi.map { LockOwner($0.pointee.lock_owner) })
            core.filesystem.write(
                RequestContext(req), node: NodeID(ino), handle: handle(fi),
                offset: UInt64(clamping: offset), bytes: bytes, info: info,
                reply: ReplyWrite(req, core, "write"))
        }
    }
    ops.flush = { req, ino, fi in
        withCore(req) { core, req in
            core.filesystem.flush(
                RequestContext(req), node: NodeID(ino), handle: handle(fi),
                lockOwner: LockOwner(fi?.pointee.lock_owner ?? 0), reply: ReplyEmpty(req, core, "flush"))
        }
    }
    ops.release = { req, ino, fi in
        withCore(req) { core, req in
            let info = ReleaseInfo(
                flags: OpenFlags(rawValue: fi?.pointee.flags ?? 0), flush: fi?.pointee.flush == 1,
                releaseFlockLocks: fi?.pointee.flock_release == 1,
                lockOwner: fi.map { LockOwner($0.pointee.lock_owner) })
            core.filesystem.release(
                RequestContext(req), node: NodeID(ino), handle: handle(fi), info: info,
                reply: ReplyEmpty(req, core, "release"))
        }
    }
    ops.fsync = { req, ino, datasync, fi in
        withCore(req) { core, req in
            core.filesystem.fsync(
                RequestContext(req), node: NodeID(ino), handle: handle(fi),
                flags: datasync != 0 ? .dataSync : [], reply: ReplyEmpty(req, core, "fsync"))
        }
    }
    ops.opendir = { req, ino, fi in
        withCore(req) { core, req in
            core.filesystem.opendir(
                RequestContext(req), node: NodeID(ino), flags: OpenFlags(rawValue: fi?.pointee.flags ?? 0),
                reply: ReplyOpen(req, core, "opendir"))
        }
    }
    ops.readdir = { req, ino, size, offset, fi in
        withCore(req) { core, req in
            core.filesystem.readdir(
                RequestContext(req), node: NodeID(ino), handle: handle(fi),
                offset: UInt64(bitPattern: Int64(offset)),
                reply: ReplyDirectory(req, core, "readdir", capacity: size))
        }
    }
    ops.readdirplus = { req, ino, size, offset, fi in
        withCore(req) { core, req in
            core.filesystem.readdirplus(
                RequestContext(req), node: NodeID(ino), handle: handle(fi),
                offset: UInt64(bitPattern: Int64(offset)),
                reply: ReplyDirectoryPlus(req, core, "readdirplus", capacity: size))
        }
    }
    ops.releasedir = { req, ino, fi in
        withCore(req) { core, req in
            core.filesystem.releasedir(
                RequestContext(req), node: NodeID(ino), handle: handle(fi),
                reply: ReplyEmpty(req, core, "releasedir"))
        }
    }
    ops.fsyncdir = { req, ino, datasync, fi in
        withCore(req) { core, req in
            core.filesystem.fsyncdir(
                RequestContext(req), node: NodeID(ino), handle: handle(fi),
                flags: datasync != 0 ? .dataSync : [], reply: ReplyEmpty(req, core, "fsyncdir"))
        }
    }
    ops.statfs = { req, ino in
        withCore(req) { core, req in
            core.filesystem.statfs(
                RequestContext(req), node: NodeID(ino), reply: ReplyStatfs(req, core, "statfs"))
        }
    }
    ops.setxattr = { req, ino, cName, value, size, flags in
        withCore(req) { core, req in
            guard let name = copyName(req, cName) else { return }
            let bytes = value.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) } ?? []
            core.filesystem.setxattr(
                RequestContext(req), node: NodeID(ino), name: name.string, value: bytes,
                flags: XattrFlags(rawValue: flags), reply: ReplyEmpty(req, core, "setxattr"))
        }
    }
    ops.getxattr = { req, ino, cName, size in
        withCore(req) { core, req in
            guard let name = copyName(req, cName) else { return }
            core.filesystem.getxattr(
                RequestContext(req), node: NodeID(ino), name: name.string,
                reply: ReplyXattr(req, core, "getxattr", size: size))
        }
    }
    ops.listxattr = { req, ino, size in
        withCore(req) { core, req in
            core.filesystem.listxattr(
                RequestContext(req), node: NodeID(ino), reply: ReplyXattr(req, core, "listxattr", size: size))
        }
    }
    ops.removexattr = { req, ino, cName in
        withCore(req) { core, req in
            guard let name = copyName(req, cName) else { return }
            core.filesystem.removexattr(
                RequestContext(req), node: NodeID(ino), name: name.string,
                reply: ReplyEmpty(req, core, "removexattr"))
        }
    }
    ops.access = { req, ino, mask in
        withCore(req) { core, req in
            core.filesystem.access(
                RequestContext(req), node: NodeID(ino), mask: AccessMask(rawValue: mask),
                reply: ReplyEmpty(req, core, "access"))
        }
    }
    ops.create = { req, parent, cName, mode, fi in
        withCore(req) { core, req in
            guard let name = copyName(req, cName) else { return }
            core.filesystem.create(
                RequestContext(req), parent: NodeID(parent), name: name, permissions: permissions(mode),
                flags: OpenFlags(rawValue: fi?.pointee.flags ?? 0), reply: ReplyCreate(req, core, "create"))
        }
    }
    ops.getlk = { req, ino, fi, lock in
        withCore(req) { core, req in
            guard let lock else {
                fuse_reply_err(req, EINVAL)
                return
            }
            core.filesystem.getlk(
                RequestContext(req), node: NodeID(ino), handle: handle(fi),
                owner: LockOwner(fi?.pointee.lock_owner ?? 0), lock: FileLock(lock.pointee),
                reply: ReplyLock(req, core, "getlk"))
        }
    }
    ops.setlk = { req, ino, fi, lock, sleep in
        withCore(req) { core, req in
            guard let lock else {
                fuse_reply_err(req, EINVAL)
                return
            }
            core.filesystem.setlk(
                RequestContext(req), node: NodeID(ino), handle: handle(fi),
                owner: LockOwner(fi?.pointee.lock_owner ?? 0), lock: FileLock(lock.pointee),
                wait: sleep != 0, reply: ReplyEmpty(req, core, "setlk"))
        }
    }
    ops.flock = { req, ino, fi, op in
        withCore(req) { core, req in
            core.filesystem.flock(
                RequestContext(req), node: NodeID(ino), handle: handle(fi),
                owner: LockOwner(fi?.pointee.lock_owner ?? 0), operation: FlockOperation(op),
                reply: ReplyEmpty(req, core, "flock"))
        }
    }
    ops.fallocate = { req, ino, mode, offset, length, fi in
        withCore(req) { core, req in
            core.filesystem.fallocate(
                RequestContext(req), node: NodeID(ino), handle: handle(fi),
                mode: FallocateMode(rawValue: mode), offset: UInt64(clamping: offset),
                length: UInt64(clamping: length), reply: ReplyEmpty(req, core, "fallocate"))
        }
    }
    ops.copy_file_range = { req, inoIn, offIn, fiIn, inoOut, offOut, fiOut, length, flags in
        withCore(req) { core, req in
            core.filesystem.copyFileRange(
                RequestContext(req), nodeIn: NodeID(inoIn), handleIn: handle(fiIn),
                offsetIn: UInt64(clamping: offIn), nodeOut: NodeID(inoOut), handleOut: handle(fiOut),
                offsetOut: UInt64(clamping: offOut), length: length, flags: UInt32(bitPattern: flags),
                reply: ReplyWrite(req, core, "copy_file_range"))
        }
    }
    ops.lseek = { req, ino, offset, whence, fi in
        withCore(req) { core, req in
            core.filesystem.lseek(
                RequestContext(req), node: NodeID(ino), handle: handle(fi), offset: Int64(offset),
                whence: SeekWhence(whence), reply: ReplyLseek(req, core, "lseek"))
        }
    }
    ops.retrieve_reply = { req, cookie, ino, offset, bufv in
        withCore(req) { core, req in
            var data: [UInt8] = []
            if let bufv {
                let size = docfs_bufvec_size(bufv)
                data = [UInt8](repeating: 0, count: size)
                let copied = data.withUnsafeMutableBytes { docfs_bufvec_copy(bufv, $0.baseAddress, size) }
                data.removeLast(size - max(0, min(size, copied)))
            }
            fuse_reply_none(req)
            // A nil cookie is the wake-up sent by Session.requestUnmount.
            if let cookie {
                core.notifications.retrieved(id: UInt64(UInt(bitPattern: cookie)), data: data)
            }
        }
    }
    return ops
}
