import CLinuxSupport
import FUSE
import Synchronization
import SystemPackage

#if canImport(Glibc)
    import Glibc
#endif

/// A passthrough over a backing folder that holds back, in memory, everything nobody made
/// durable, and drops it all at once at ``cutPower()`` (see main.swift for the model).
///
/// One lock guards everything, backing I/O included: requests run one at a time, which is
/// slow but leaves no interleaving to reason about.
final class LossyFileSystem: FileSystem {
    struct Options: Sendable {
        var backing: String
        var limbo: String
        /// Names become durable only by `fsync` of their directory (POSIX), not also by `fsync`
        /// of the file (ext4).
        var posixNames = false
    }

    /// A backing inode the kernel knows, or one with unsynced bytes.
    struct Node {
        /// `O_PATH` descriptor: names the inode whatever its names become.
        var fd: Int32
        var isDirectory: Bool
        /// Read-write descriptor, opened on first use.
        var dataFD: Int32 = -1
        /// Unsynced bytes; nil when the backing file is current.
        var overlay: FileOverlay?
    }

    struct State {
        var nodes: [UInt64: Node] = [:]
        var journal = NameJournal()
        /// Inodes with a name in limbo (`<ino>`), where removed inodes wait for an undo.
        var inLimbo: Set<UInt64> = []
        /// Descriptors of the directories journal records name, kept until the cut.
        var directories: [UInt64: Int32] = [:]
        /// Open directory handles' listings.
        var listings: [UInt64: [(name: FileName, ino: UInt64, type: FUSE.FileType)]] = [:]
        var nextHandle: UInt64 = 1
        var powerCut = false
    }

    let options: Options
    let table: NodeTable<UInt64>
    let rootIno: UInt64
    let limboFD: Int32
    let state = Mutex(State())
    static let timeout: Duration = .seconds(1)

    init(_ options: Options) throws(Errno) {
        self.options = options
        let rootFD = try Backing.openPath(options.backing)
        let root = try Backing.stat(rootFD)
        rootIno = UInt64(root.st_ino)
        table = NodeTable(root: rootIno)
        if Glibc.mkdir(options.limbo, 0o700) != 0 && errno != EEXIST { throw Errno(rawValue: errno) }
        limboFD = try Backing.openPath(options.limbo)
        guard try Backing.stat(limboFD).st_dev == root.st_dev else { throw Errno.improperLink }
        // Left by a lossyfs that did not end through a cut or an unmount: nothing to undo any more.
        for entry in try Backing.list(limboFD) where !entry.name.isDotOrDotDot {
            Backing.removeTree(limboFD, entry.name)
        }
        let rootIno = rootIno
        state.withLock { $0.nodes[rootIno] = Node(fd: rootFD, isDirectory: true) }
    }

    // MARK: - Helpers

    /// Runs a request under the lock; after a cut every request fails with EIO.
    /// Runs a request's `body` under the lock, with its reply in a box the body answers from
    /// (the lock's closure cannot consume the reply itself); an error it throws is the answer.
    func serve<R: Reply & ~Copyable & Sendable>(
        _ reply: consuming R, _ body: (inout State, DeferredReply<R>) throws(Errno) -> Void
    ) {
        let box = DeferredReply(reply)
        state.withLock { state in
            guard !state.powerCut else { return box.take()?.error(.ioError) }
            do throws(Errno) { try body(&state, box) } catch { box.take()?.error(error) }
        }
    }

    func node(_ id: NodeID, _ state: State) throws(Errno) -> (ino: UInt64, node: Node) {
        guard let ino = table.key(for: id), let node = state.nodes[ino] else { throw .noSuchFileOrDirectory }
        return (ino, node)
    }

    func directory(_ id: NodeID, _ state: State) throws(Errno) -> (ino: UInt64, fd: Int32) {
        let (ino, node) = try node(id, state)
        guard node.isDirectory else { throw .notDirectory }
        return (ino, node.fd)
    }

    static func time(_ ts: timespec) -> Timespec {
        Timespec(seconds: Int64(ts.tv_sec), nanoseconds: Int64(ts.tv_nsec))
    }

    func attributes(_ ino: UInt64, _ state: State) throws(Errno) -> FileAttributes {
        guard let node = state.nodes[ino] else { throw .noSuchFileOrDirectory }
        let st = try Backing.stat(node.fd)
        guard let type = FUSE.FileType(mode: st.st_mode) else { throw .ioError }
        var links = UInt32(st.st_nlink)
        if !node.isDirectory, state.inLimbo.contains(ino), links > 0 { links -= 1 }
        var attributes = FileAttributes(
            ino: ino, type: type, permissions: FilePermissions(rawValue: st.st_mode & 0o7777), nlink: links,
            uid: st.st_uid, gid: st.st_gid, rdev: UInt64(st.st_rdev), size: UInt64(st.st_size),
            blocks: UInt64(st.st_blocks), blockSize: UInt32(st.st_blksize), atime: Self.time(st.st_atim),
            mtime: Self.time(st.st_mtim), ctime: Self.time(st.st_ctim))
        if let overlay = node.overlay {
            attributes.size = overlay.size
            attributes.blocks = nil
            attributes.mtime = overlay.modified
        }
        return attributes
    }

    /// The node for `name` in the directory `parentFD`, made known if new.
    func enter(_ state: inout State, _ parentFD: Int32, _ name: FileName) throws(Errno) -> UInt64 {
        guard let st = try Backing.stat(parentFD, name) else { throw .noSuchFileOrDirectory }
        let ino = UInt64(st.st_ino)
        if state.nodes[ino] == nil {
            let fd = try Backing.openPath(parentFD, name)
            guard UInt64(try Backing.stat(fd).st_ino) == ino else {
                close(fd)
                throw .ioError
            }
            state.nodes[ino] = Node(fd: fd, isDirectory: st.st_mode & S_IFMT == S_IFDIR)
        }
        return ino
    }

    func reply(_ reply: DeferredReply<ReplyEntry>, _ ino: UInt64, _ state: State) throws(Errno) {
        let attributes = try attributes(ino, state)
        reply.take()?.entry(
            ino, in: table, attributes: attributes, attributeTimeout: Self.timeout, entryTimeout: Self.timeout)
    }

    /// Journals a call's changes; keeps a descriptor of each directory they are in.
    func journal(_ state: inout State, _ changes: [Change], changesTree: Bool = false) {
        for change in changes where state.directories[change.slot.directory] == nil {
            if let fd = state.nodes[change.slot.directory]?.fd {
                state.directories[change.slot.directory] = fcntl(fd, F_DUPFD_CLOEXEC, 0)
            }
        }
        state.journal.append(changes, changesTree: changesTree)
    }

    static func limboName(_ ino: UInt64) -> FileName { FileName("\(ino)") }

    /// Gives the file at `name` in `directoryFD` a name in limbo, so an undo can bring it back.
    func keepInLimbo(_ state: inout State, _ directoryFD: Int32, _ name: FileName, _ ino: UInt64)
        throws(Errno)
    {
        guard !state.inLimbo.contains(ino) else { return }
        do {
            try Backing.link(directoryFD, name, limboFD, Self.limboName(ino))
        } catch .fileExists {
            try Backing.unlink(limboFD, Self.limboName(ino))
            try Backing.link(directoryFD, name, limboFD, Self.limboName(ino))
        }
        state.inLimbo.insert(ino)
    }

    /// Removes from limbo what no undo needs any more.
    func release(_ inos: [UInt64], _ state: inout State) {
        for ino in inos where state.inLimbo.contains(ino) && !state.journal.needs(ino) {
            let name = Self.limboName(ino)
            let isDirectory = (try? Backing.stat(limboFD, name)).map { $0.st_mode & S_IFMT == S_IFDIR }
            try? Backing.unlink(limboFD, name, directoryToo: isDirectory ?? false)
            state.inLimbo.remove(ino)
        }
    }

    func dataFD(_ state: inout State, _ ino: UInt64) throws(Errno) -> Int32 {
        guard var node = state.nodes[ino] else { throw .noSuchFileOrDirectory }
        guard !node.isDirectory else { throw .isDirectory }
        if node.dataFD < 0 {
            node.dataFD = try Backing.reopenForData(node.fd)
            state.nodes[ino] = node
        }
        return node.dataFD
    }

    /// Runs `body` on the file's overlay, made if it has none.
    func changeContents(
        _ state: inout State, _ ino: UInt64, _ body: (inout FileOverlay, Int32) throws(Errno) -> Void
    ) throws(Errno) {
        let fd = try dataFD(&state, ino)
        guard var node = state.nodes[ino] else { throw .noSuchFileOrDirectory }
        var overlay: FileOverlay
        if let existing = node.overlay {
            overlay = existing
        } else {
            let st = try Backing.stat(fd)
            overlay = FileOverlay(backingSize: UInt64(st.st_size), modified: Self.time(st.st_mtim))
        }
        try body(&overlay, fd)
        node.overlay = overlay
        state.nodes[ino] = node
    }

    /// Drops a node nobody needs: the kernel forgot it and it has no unsynced bytes.
    func dropIfUnused(_ state: inout State, _ ino: UInt64) {
        guard ino != rootIno, let node = state.nodes[ino], node.overlay == nil, table.node(for: ino) == nil
        else { return }
        close(node.fd)
        if node.dataFD >= 0 { close(node.dataFD) }
        state.nodes[ino] = nil
    }

    /// Writes every overlay to its backing file and makes every name change durable.
    private func persistAll(_ state: inout State) -> (files: Int, bytes: Int, names: Int) {
        var files = 0
        var bytes = 0
        for (ino, node) in state.nodes {
            guard let overlay = node.overlay, node.dataFD >= 0 else { continue }
            do {
                try overlay.persist(to: node.dataFD, dataOnly: false)
                files += 1
                bytes += overlay.pendingBytes
                state.nodes[ino]?.overlay = nil
            } catch {
                Log.say("could not write back inode \(ino): \(error)")
            }
        }
        let names = state.journal.count
        release(state.journal.syncAll(), &state)
        for ino in Array(state.nodes.keys) { dropIfUnused(&state, ino) }
        return (files, bytes, names)
    }

    // MARK: - Power

    /// The "sync" signal: what `syncfs(2)` would do if the kernel forwarded it (it does not; see
    /// main.swift).
    func syncEverything() {
        state.withLock { state in
            guard !state.powerCut else { return }
            let (files, bytes, names) = persistAll(&state)
            Log.say("sync: wrote \(bytes) bytes of \(files) files, made \(names) name changes durable")
        }
    }

    /// Cuts the power: runs `abort` (which ends the connection and detaches the mount) while no
    /// request runs, then puts the backing folder back as it was at the last durable point and
    /// forgets every unsynced byte.
    func cutPower(abort: () -> Void) {
        state.withLock { state in
            guard !state.powerCut else { return }
            state.powerCut = true
            abort()
            let records = state.journal.undoOrder
            for record in records {
                for change in record.changes {
                    if let after = change.after { detach(&state, change.slot, after) }
                }
                for change in record.changes {
                    if let before = change.before { attach(&state, change.slot, before) }
                }
            }
            for entry in (try? Backing.list(limboFD)) ?? [] where !entry.name.isDotOrDotDot {
                Backing.removeTree(limboFD, entry.name)
            }
            var files = 0
            var bytes = 0
            for (_, node) in state.nodes {
                if let overlay = node.overlay {
                    files += 1
                    bytes += overlay.pendingBytes
                }
                close(node.fd)
                if node.dataFD >= 0 { close(node.dataFD) }
            }
            state.nodes = [:]
            for (_, fd) in state.directories { close(fd) }
            state.directories = [:]
            Log.say(
                "power cut: dropped \(bytes) unsynced bytes of \(files) files, undid \(records.count) name changes"
            )
        }
    }

    private func detach(_ state: inout State, _ slot: Slot, _ object: Object) {
        guard let directory = state.directories[slot.directory] else {
            return Log.say("undo: no descriptor for directory \(slot.directory)")
        }
        do {
            guard let st = try Backing.stat(directory, slot.name), UInt64(st.st_ino) == object.ino else {
                return Log.say("undo: \(slot.name) in \(slot.directory) is not inode \(object.ino)")
            }
            if object.isDirectory {
                try Backing.rename(directory, slot.name, limboFD, Self.limboName(object.ino))
                state.inLimbo.insert(object.ino)
            } else {
                try keepInLimbo(&state, directory, slot.name, object.ino)
                try Backing.unlink(directory, slot.name)
            }
        } catch {
            Log.say("undo: could not remove \(slot.name) from \(slot.directory): \(error)")
        }
    }

    private func attach(_ state: inout State, _ slot: Slot, _ object: Object) {
        guard let directory = state.directories[slot.directory], state.inLimbo.contains(object.ino) else {
            return Log.say("undo: cannot put inode \(object.ino) back as \(slot.name)")
        }
        do {
            if object.isDirectory {
                try Backing.rename(limboFD, Self.limboName(object.ino), directory, slot.name)
                state.inLimbo.remove(object.ino)
            } else {
                try Backing.link(limboFD, Self.limboName(object.ino), directory, slot.name)
            }
        } catch {
            Log.say("undo: could not put inode \(object.ino) back as \(slot.name): \(error)")
        }
    }

    // MARK: - Lifecycle

    func initialize(_ config: inout KernelConfig) {
        // Every write must reach the daemon to be held back: no writeback cache. Nothing changes
        // the backing folder behind the kernel's back, so cached pages need no invalidation.
        config.disable([
            .writebackCache, .autoInvalidateData, .dontMask, .spliceRead, .spliceWrite, .spliceMove,
        ])
        try? config.enable(.atomicOpenTruncate)
        try? config.setMaxWrite(config.maxWriteLimit)
    }

    func destroy() {
        state.withLock { state in
            guard !state.powerCut else { return }
            let (files, bytes, names) = persistAll(&state)
            Log.say("unmounted: wrote \(bytes) bytes of \(files) files, made \(names) name changes durable")
        }
    }

    // MARK: - Names

    func lookup(_ context: RequestContext, parent: NodeID, name: FileName, reply: consuming ReplyEntry) {
        serve(reply) { state, reply throws(Errno) in
            let (_, parentFD) = try directory(parent, state)
            try self.reply(reply, try enter(&state, parentFD, name), state)
        }
    }

    func forget(node: NodeID, lookups: UInt64) {
        let ino = table.key(for: node)
        table.forget(node, lookups: lookups)
        if let ino { state.withLock { dropIfUnused(&$0, ino) } }
    }

    func batchForget(_ items: [ForgetItem]) {
        for item in items { forget(node: item.node, lookups: item.lookups) }
    }

    // MARK: - Attributes

    func getattr(_ context: RequestContext, node: NodeID, handle: FUSE.FileHandle?, reply: consuming ReplyAttr) {
        serve(reply) { state, reply throws(Errno) in
            reply.take()?.attributes(try attributes(try self.node(node, state).ino, state), timeout: Self.timeout)
        }
    }

    func setattr(_ context: RequestContext, node: NodeID, changes: SetAttributes, reply: consuming ReplyAttr) {
        serve(reply) { state, reply throws(Errno) in
            let (ino, target) = try self.node(node, state)
            let path = Backing.procPath(target.fd)
            let isLink = try Backing.stat(target.fd).st_mode & S_IFMT == S_IFLNK
            if let permissions = changes.permissions, !isLink {
                try Backing.check(chmod(path, permissions.rawValue))
            }
            if changes.uid != nil || changes.gid != nil {
                try Backing.check(
                    fchownat(
                        target.fd, "", changes.uid ?? UInt32.max, changes.gid ?? UInt32.max, Backing.emptyPath
                    ))
            }
            if let size = changes.size {
                try changeContents(&state, ino) { overlay, _ in
                    overlay.truncate(to: size)
                    overlay.modified = .now
                }
            }
            if !isLink && (changes.atime != nil || changes.mtime != nil) {
                func spec(_ change: SetAttributes.TimeChange?) -> timespec {
                    switch change {
                    case .now: timespec(tv_sec: 0, tv_nsec: (1 << 30) - 1)  // UTIME_NOW
                    case .time(let t): timespec(tv_sec: Int(t.seconds), tv_nsec: Int(t.nanoseconds))
                    case nil: timespec(tv_sec: 0, tv_nsec: docfs_utime_omit())
                    }
                }
                var times = [spec(changes.atime), spec(changes.mtime)]
                try Backing.check(utimensat(AT_FDCWD, path, &times, 0))
                if changes.mtime != nil, state.nodes[ino]?.overlay != nil {
                    let st = try Backing.stat(target.fd)
                    state.nodes[ino]?.overlay?.modified = Self.time(st.st_mtim)
                }
            }
            reply.take()?.attributes(try attributes(ino, state), timeout: Self.timeout)
        }
    }

    func readlink(_ context: RequestContext, node: NodeID, reply: consuming ReplyReadlink) {
        serve(reply) { state, reply throws(Errno) in
            let (_, link) = try self.node(node, state)
            var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
            let count = try Backing.check(readlinkat(link.fd, "", &buffer, buffer.count))
            reply.take()?.target(buffer[..<count].map { UInt8(bitPattern: $0) })
        }
    }

    func statfs(_ context: RequestContext, node: NodeID, reply: consuming ReplyStatfs) {
        serve(reply) { state, reply throws(Errno) in
            guard let root = state.nodes[rootIno] else { throw .ioError }
            var s = statvfs()
            try Backing.check(fstatvfs(root.fd, &s))
            reply.take()?.statistics(
                FileSystemStatistics(
                    blockSize: UInt64(s.f_bsize), fragmentSize: UInt64(s.f_frsize),
                    blocks: UInt64(s.f_blocks),
                    blocksFree: UInt64(s.f_bfree), blocksAvailable: UInt64(s.f_bavail),
                    files: UInt64(s.f_files),
                    filesFree: UInt64(s.f_ffree), filesAvailable: UInt64(s.f_favail),
                    nameMax: UInt64(s.f_namemax)))
        }
    }

    // No extended attributes: ENOSYS makes the kernel stop asking (see FileSystem).
    func getxattr(_ context: RequestContext, node: NodeID, name: String, reply: consuming ReplyXattr) {
        reply.error(.noFunction)
    }

    func listxattr(_ context: RequestContext, node: NodeID, reply: consuming ReplyXattr) { reply.error(.noFunction) }

    // MARK: - Contents

    func open(_ context: RequestContext, node: NodeID, flags: OpenFlags, reply: consuming ReplyOpen) {
        serve(reply) { state, reply throws(Errno) in
            let (ino, _) = try self.node(node, state)
            _ = try dataFD(&state, ino)
            if flags.contains(.truncate) && flags.isWritable {
                try changeContents(&state, ino) { overlay, _ in
                    overlay.truncate(to: 0)
                    overlay.modified = .now
                }
            }
            reply.take()?.opened(FUSE.FileHandle(ino), options: [.keepCache])
        }
    }

    func read(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, offset: UInt64, size: Int,
        reply: consuming ReplyData
    ) {
        serve(reply) { state, reply throws(Errno) in
            let (ino, _) = try self.node(node, state)
            let fd = try dataFD(&state, ino)
            if let overlay = state.nodes[ino]?.overlay {
                reply.take()?.data(try overlay.read(at: offset, count: size, backing: fd))
            } else {
                var bytes = [UInt8](repeating: 0, count: size)
                let count = try Backing.check(pread(fd, &bytes, size, off_t(offset)))
                reply.take()?.data(bytes[..<count])
            }
        }
    }

    func write(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, offset: UInt64,
        bytes: UnsafeRawBufferPointer, info: WriteInfo, reply: consuming ReplyWrite
    ) {
        serve(reply) { state, reply throws(Errno) in
            let (ino, _) = try self.node(node, state)
            try changeContents(&state, ino) { overlay, fd throws(Errno) in
                try overlay.write(bytes, at: offset, backing: fd)
                overlay.modified = .now
            }
            reply.take()?.written(bytes.count)
        }
    }

    func fallocate(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, mode: FallocateMode, offset: UInt64,
        length: UInt64, reply: consuming ReplyEmpty
    ) {
        serve(reply) { state, reply throws(Errno) in
            let (ino, _) = try self.node(node, state)
            let keepSize = mode.contains(.keepSize)
            switch mode.subtracting(.keepSize) {
            case []:
                // Space is not modelled: only a size change is visible.
                if !keepSize {
                    try changeContents(&state, ino) { overlay, _ in
                        if offset + length > overlay.size { overlay.truncate(to: offset + length) }
                    }
                }
            case .punchHole where keepSize, .zeroRange:
                try changeContents(&state, ino) { overlay, fd throws(Errno) in
                    if !keepSize && offset + length > overlay.size { overlay.truncate(to: offset + length) }
                    try overlay.zero(at: offset, count: length, backing: fd)
                    overlay.modified = .now
                }
            default:
                throw .notSupported
            }
            reply.take()?.ok()
        }
    }

    func fsync(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, flags: FsyncFlags, reply: consuming ReplyEmpty
    ) {
        serve(reply) { state, reply throws(Errno) in
            let (ino, synced) = try self.node(node, state)
            if let overlay = synced.overlay {
                try overlay.persist(to: try dataFD(&state, ino), dataOnly: flags.contains(.dataSync))
                state.nodes[ino]?.overlay = nil
            }
            if !options.posixNames { release(state.journal.syncNames(of: ino), &state) }
            reply.take()?.ok()
        }
    }

    func opendir(_ context: RequestContext, node: NodeID, flags: OpenFlags, reply: consuming ReplyOpen) {
        serve(reply) { state, reply throws(Errno) in
            _ = try directory(node, state)
            let handle = state.nextHandle
            state.nextHandle += 1
            state.listings[handle] = []
            reply.take()?.opened(FUSE.FileHandle(handle))
        }
    }

    func readdir(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, offset: UInt64,
        reply: consuming ReplyDirectory
    ) {
        serve(reply) { state, reply throws(Errno) in
            let (_, fd) = try directory(node, state)
            if offset == 0 || state.listings[handle.rawValue] == nil {
                state.listings[handle.rawValue] = try Backing.list(fd).map { entry in
                    let type: FUSE.FileType =
                        switch Int32(entry.type) {
                        case Int32(DT_DIR): .directory
                        case Int32(DT_LNK): .symbolicLink
                        case Int32(DT_CHR): .characterDevice
                        case Int32(DT_BLK): .blockDevice
                        case Int32(DT_FIFO): .fifo
                        case Int32(DT_SOCK): .socket
                        default: .regular
                        }
                    return (entry.name, entry.ino, type)
                }
            }
            let entries = state.listings[handle.rawValue] ?? []
            guard let listing = reply.take() else { return }
            for (index, entry) in entries.enumerated().dropFirst(Int(offset)) {
                if listing.add(ino: entry.ino, offset: UInt64(index + 1), type: entry.type, name: entry.name) {
                    break
                }
            }
            listing.finish()
        }
    }

    func releasedir(_ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, reply: consuming ReplyEmpty) {
        state.withLock { _ = $0.listings.removeValue(forKey: handle.rawValue) }
        reply.ok()
    }

    func fsyncdir(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, flags: FsyncFlags, reply: consuming ReplyEmpty
    ) {
        serve(reply) { state, reply throws(Errno) in
            let (ino, _) = try directory(node, state)
            release(state.journal.syncDirectory(ino), &state)
            reply.take()?.ok()
        }
    }
}
