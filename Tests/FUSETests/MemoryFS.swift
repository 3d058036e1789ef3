import FUSE
import Foundation
import Synchronization
import SystemPackage

/// An in-memory filesystem built only on the FUSE module's Swift API: files, directories,
/// symlinks, hard links, xattrs, rename flags, unlinked-but-open files and simple locks.
final class MemoryFS: FileSystem, @unchecked Sendable {
    struct Inode {
        var attributes: FileAttributes
        var data: [UInt8] = []
        var children: [FileName: UInt64] = [:]
        var target: [UInt8] = []
        var xattrs: [String: [UInt8]] = [:]
        var openCount = 0
    }
    struct Lock {
        var owner: LockOwner
        var lock: FileLock
    }
    struct State {
        var inodes: [UInt64: Inode] = [:]
        var nextIno: UInt64 = 2
        var nextHandle: UInt64 = 1
        var posixLocks: [UInt64: [Lock]] = [:]
        var flocks: [UInt64: [(owner: LockOwner, exclusive: Bool)]] = [:]
        var parked: [DeferredReply<ReplyData>] = []
        var counters: [String: Int] = [:]
        var configReport: [String] = []
        var meeting = 0
        var mostMeeting = 0
    }

    /// Behaviour knobs for particular tests.
    struct Behaviour: Sendable {
        var attributeTimeout: Duration = .seconds(1)
        var entryTimeout: Duration = .seconds(1)
        var openOptions: OpenOptions = []
        /// Reads of files with this prefix are parked and never answered by the handler.
        var blockPrefix = "block"
        /// Reads of files with this prefix drop the reply.
        var dropPrefix = "drop"
        /// Ask for FUSE_HANDLE_KILLPRIV_V2 and clear set-ID bits when a request says so.
        var killPrivV2 = false
        /// Ask for FUSE_POSIX_ACL (the kernel then caches each file's ACL).
        var posixACL = false
        /// Ask for FUSE_PARALLEL_DIROPS.
        var parallelDirops = true
        /// Lookups of names with this prefix wait up to a second for another such lookup to be
        /// in flight too (``lookupsAtOnce`` counts the most at once).
        var meetPrefix = "meet"
    }

    /// A class around the lock, so the node table's forget hook can reach it.
    final class Box: Sendable {
        let state = Mutex(State())
    }

    let table: NodeTable<UInt64>
    let box = Box()
    let behaviour: Behaviour
    let destroyed = Atomic<Int>(0)

    init(behaviour: Behaviour = Behaviour()) {
        self.behaviour = behaviour
        table = NodeTable(root: 1) { [box] ino, _ in
            box.state.withLock { MemoryFS.reap(ino, &$0, looked: false) }
        }
        let now = Timespec.now
        box.state.withLock {
            $0.inodes[1] = Inode(
                attributes: FileAttributes(
                    ino: 1, type: .directory,
                    permissions: [.ownerReadWriteExecute, .groupReadExecute, .otherReadExecute],
                    nlink: 2, atime: now, mtime: now, ctime: now))
        }
    }

    /// Frees an inode nobody can reach any more: no name, no open handle, no kernel reference.
    private static func reap(_ ino: UInt64, _ state: inout State, looked: Bool) {
        guard ino != 1, let inode = state.inodes[ino] else { return }
        if inode.attributes.nlink == 0 && inode.openCount == 0 && !looked {
            state.inodes[ino] = nil
            state.posixLocks[ino] = nil
            state.flocks[ino] = nil
        }
    }

    /// Clears set-user-ID, and set-group-ID if group-executable, when the request asks.
    private func killSetIDBits(
        _ context: RequestContext, _ inode: inout Inode, _ state: inout State, _ op: String
    ) {
        guard context.killsSetIDBits else { return }
        bump("kill " + op, &state)
        var bits = inode.attributes.permissions.rawValue & ~UInt32(S_ISUID)
        if bits & UInt32(S_IXGRP) != 0 { bits &= ~UInt32(S_ISGID) }
        inode.attributes.permissions = FilePermissions(rawValue: bits)
    }

    /// The mode bits of a file at the root, as this filesystem holds them.
    func permissions(of name: String) -> UInt32? {
        box.state.withLock { state in
            state.inodes[1]?.children[FileName(name)].flatMap {
                state.inodes[$0]?.attributes.permissions.rawValue
            }
        }
    }

    func count(_ name: String) -> Int { box.state.withLock { $0.counters[name] ?? 0 } }
    private func bump(_ name: String, _ state: inout State) { state.counters[name, default: 0] += 1 }
    var inodeCount: Int { box.state.withLock { $0.inodes.count } }
    var configReport: [String] { box.state.withLock { $0.configReport } }

    /// Answers every parked read with `data`.
    func releaseParked(with data: [UInt8]) {
        let parked = box.state.withLock { state in
            defer { state.parked = [] }
            return state.parked
        }
        for reply in parked { reply.take()?.data(data) }
    }
    var parkedCount: Int { box.state.withLock { $0.parked.count } }

    private func ino(_ node: NodeID) -> UInt64? { table.key(for: node) }

    private func withInode<R>(
        _ node: NodeID, _ body: (UInt64, inout State) throws(Errno) -> R
    ) throws(Errno) -> R {
        guard let ino = ino(node) else { throw .noSuchFileOrDirectory }
        return try box.state.withLock { state throws(Errno) -> R in
            guard state.inodes[ino] != nil else { throw Errno.noSuchFileOrDirectory }
            return try body(ino, &state)
        }
    }

    // MARK: lifecycle

    func initialize(_ config: inout KernelConfig) {
        var report: [String] = []
        func note(_ label: String, _ body: (inout KernelConfig) throws -> Void) {
            do {
                try body(&config)
                report.append("\(label): ok")
            } catch {
                report.append("\(label): \(error)")
            }
        }
        note("posixLocks+flock") { try $0.enable([.posixLocks, .flockLocks]) }
        note("readdirplus") { try $0.enable([.readdirplus, .readdirplusAuto]) }
        if behaviour.parallelDirops { note("parallelDirops") { try $0.enable(.parallelDirectoryOps) } }
        note("maxWrite 1GiB") { try $0.setMaxWrite(1 << 30) }
        note("maxWrite 128KiB") { try $0.setMaxWrite(128 * 1024) }
        note("timeGran 3") { try $0.setTimeGranularity(nanoseconds: 3) }
        note("timeGran 1000") { try $0.setTimeGranularity(nanoseconds: 1000) }
        note("maxBackground 64") { try $0.setMaxBackground(64) }
        note("congestion 100") { try $0.setCongestionThreshold(100) }
        if behaviour.killPrivV2 { note("killPrivV2") { try $0.enable(.handleKillPrivV2) } }
        if behaviour.posixACL { note("posixACL") { try $0.enable(.posixACL) } }
        config.disable([.spliceRead, .spliceWrite, .spliceMove])
        box.state.withLock { $0.configReport = report }
    }

    /// Runs inside ``destroy()``.
    let destroyHook = Mutex<(@Sendable () -> Void)?>(nil)

    func destroy() {
        destroyHook.withLock { $0 }?()
        destroyed.add(1, ordering: .relaxed)
    }

    // MARK: names

    private func entry(_ reply: consuming ReplyEntry, _ ino: UInt64, _ attributes: FileAttributes) {
        reply.entry(
            ino, in: table, attributes: attributes, attributeTimeout: behaviour.attributeTimeout,
            entryTimeout: behaviour.entryTimeout)
    }

    /// The most lookups of ``Behaviour/meetPrefix`` names that were in flight at once.
    var lookupsAtOnce: Int { box.state.withLock { $0.mostMeeting } }

    /// Waits up to a second for another lookup of a meeting name (``Behaviour/meetPrefix``).
    private func meet() {
        box.state.withLock { state in
            state.meeting += 1
            state.mostMeeting = max(state.mostMeeting, state.meeting)
        }
        let deadline = ContinuousClock.now + .seconds(1)
        while box.state.withLock({ $0.meeting }) < 2, ContinuousClock.now < deadline { usleep(1000) }
        box.state.withLock { $0.meeting -= 1 }
    }

    func lookup(_ context: RequestContext, parent: NodeID, name: FileName, reply: consuming ReplyEntry) {
        if name.string.hasPrefix(behaviour.meetPrefix) { meet() }
        do throws(Errno) {
            let (child, attributes) = try withInode(parent) { (ino, state) throws(Errno) in
                guard let dir = state.inodes[ino], dir.attributes.type == .directory else {
                    throw Errno.notDirectory
                }
                guard let child = dir.children[name], let inode = state.inodes[child] else {
                    throw Errno.noSuchFileOrDirectory
                }
                return (child, inode.attributes)
            }
            entry(reply, child, attributes)
        } catch { reply.error(error) }
    }

    func forget(node: NodeID, lookups: UInt64) { table.forget(node, lookups: lookups) }
    func batchForget(_ items: [ForgetItem]) { table.forget(items) }

    func getattr(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle?, reply: consuming ReplyAttr
    ) {
        do throws(Errno) {
            let attributes = try withInode(node) { ino, state in state.inodes[ino]!.attributes }
            reply.attributes(attributes, timeout: behaviour.attributeTimeout)
        } catch { reply.error(error) }
    }

    func setattr(
        _ context: RequestContext, node: NodeID, changes: SetAttributes, reply: consuming ReplyAttr
    ) {
        do throws(Errno) {
            let attributes = try withInode(node) { (ino, state) throws(Errno) in
                var inode = state.inodes[ino]!
                let now = Timespec.now
                if let permissions = changes.permissions { inode.attributes.permissions = permissions }
                if let uid = changes.uid { inode.attributes.uid = uid }
                if let gid = changes.gid { inode.attributes.gid = gid }
                killSetIDBits(context, &inode, &state, "setattr")
                if let size = changes.size {
                    guard inode.attributes.type == .regular else { throw Errno.isDirectory }
                    inode.data = Array(inode.data.prefix(Int(size)))
                    inode.data += repeatElement(0, count: Int(size) - inode.data.count)
                    inode.attributes.size = size
                    inode.attributes.mtime = now
                }
                switch changes.atime {
                case .now: inode.attributes.atime = now
                case .time(let t): inode.attributes.atime = t
                case nil: break
                }
                switch changes.mtime {
                case .now: inode.attributes.mtime = now
                case .time(let t): inode.attributes.mtime = t
                case nil: break
                }
                inode.attributes.ctime = changes.ctime ?? now
                state.inodes[ino] = inode
                return inode.attributes
            }
            reply.attributes(attributes, timeout: behaviour.attributeTimeout)
        } catch { reply.error(error) }
    }

    func readlink(_ context: RequestContext, node: NodeID, reply: consuming ReplyReadlink) {
        do throws(Errno) {
            let target = try withInode(node) { (ino, state) throws(Errno) in
                guard state.inodes[ino]!.attributes.type == .symbolicLink else { throw Errno.invalidArgument }
                return state.inodes[ino]!.target
            }
            reply.target(target)
        } catch { reply.error(error) }
    }

    /// Adds a new inode named `name` in `parent`.
    private func make(
        _ context: RequestContext, parent: NodeID, name: FileName, type: FUSE.FileType,
        permissions: FilePermissions, configure: (inout Inode) -> Void = { _ in }
    ) throws(Errno) -> (UInt64, FileAttributes) {
        try withInode(parent) { (dirIno, state) throws(Errno) in
            guard state.inodes[dirIno]!.attributes.type == .directory else { throw Errno.notDirectory }
            guard state.inodes[dirIno]!.children[name] == nil else { throw Errno.fileExists }
            guard name.bytes.count <= 255 else { throw Errno.fileNameTooLong }
            let now = Timespec.now
            let ino = state.nextIno
            state.nextIno += 1
            var inode = Inode(
                attributes: FileAttributes(
                    ino: ino, type: type, permissions: permissions, nlink: type == .directory ? 2 : 1,
                    uid: context.uid, gid: context.gid, atime: now, mtime: now, ctime: now))
            configure(&inode)
            state.inodes[ino] = inode
            state.inodes[dirIno]!.children[name] = ino
            if type == .directory { state.inodes[dirIno]!.attributes.nlink += 1 }
            state.inodes[dirIno]!.attributes.mtime = now
            state.inodes[dirIno]!.attributes.ctime = now
            return (ino, inode.attributes)
        }
    }

    func mknod(
        _ context: RequestContext, parent: NodeID, name: FileName, type: FUSE.FileType,
        permissions: FilePermissions, rdev: UInt64, reply: consuming ReplyEntry
    ) {
        do throws(Errno) {
            let (ino, attributes) = try make(
                context, parent: parent, name: name, type: type, permissions: permissions)
            entry(reply, ino, attributes)
        } catch { reply.error(error) }
    }

    func mkdir(
        _ context: RequestContext, parent: NodeID, name: FileName, permissions: FilePermissions,
        reply: consuming ReplyEntry
    ) {
        do throws(Errno) {
            let (ino, attributes) = try make(
                context, parent: parent, name: name, type: .directory, permissions: permissions)
            entry(reply, ino, attributes)
        } catch { reply.error(error) }
    }

    func symlink(
        _ context: RequestContext, target: [UInt8], parent: NodeID, name: FileName,
        reply: consuming ReplyEntry
    ) {
        do throws(Errno) {
            let (ino, attributes) = try make(
                context, parent: parent, name: name, type: .symbolicLink,
                permissions: FilePermissions(rawValue: 0o777)
            ) {
                $0.target = target
                $0.attributes.size = UInt64(target.count)
            }
            entry(reply, ino, attributes)
        } catch { reply.error(error) }
    }

    func create(
        _ context: RequestContext, parent: NodeID, name: FileName, permissions: FilePermissions,
        flags: OpenFlags, reply: consuming ReplyCreate
    ) {
        do throws(Errno) {
            let (ino, attributes) = try make(
                context, parent: parent, name: name, type: .regular, permissions: permissions
            ) { $0.openCount = 1 }
            let handle = box.state.withLock { state in
                defer { state.nextHandle += 1 }
                return FUSE.FileHandle(state.nextHandle)
            }
            reply.created(
                ino, in: table, attributes: attributes, handle: handle, options: behaviour.openOptions,
                attributeTimeout: behaviour.attributeTimeout, entryTimeout: behaviour.entryTimeout)
        } catch { reply.error(error) }
    }

    /// Removes `name` from `dir`; the inode lives on while open or known to the kernel.
    private static func removeName(
        _ name: FileName, in dirIno: UInt64, _ state: inout State, table: NodeTable<UInt64>
    ) {
        guard let child = state.inodes[dirIno]?.children.removeValue(forKey: name) else { return }
        let now = Timespec.now
        state.inodes[dirIno]?.attributes.mtime = now
        if state.inodes[child]?.attributes.type == .directory {
            state.inodes[dirIno]?.attributes.nlink -= 1
            state.inodes[child]?.attributes.nlink = 0
        } else {
            state.inodes[child]?.attributes.nlink -= 1
        }
        state.inodes[child]?.attributes.ctime = now
        reap(child, &state, looked: table.node(for: child) != nil)
    }

    func unlink(_ context: RequestContext, parent: NodeID, name: FileName, reply: consuming ReplyEmpty) {
        do throws(Errno) {
            try withInode(parent) { (dirIno, state) throws(Errno) in
                guard let child = state.inodes[dirIno]!.children[name] else {
                    throw Errno.noSuchFileOrDirectory
                }
                guard state.inodes[child]?.attributes.type != .directory else { throw Errno.isDirectory }
                MemoryFS.removeName(name, in: dirIno, &state, table: table)
            }
            reply.ok()
        } catch { reply.error(error) }
    }

    func rmdir(_ context: RequestContext, parent: NodeID, name: FileName, reply: consuming ReplyEmpty) {
        do throws(Errno) {
            try withInode(parent) { (dirIno, state) throws(Errno) in
                guard let child = state.inodes[dirIno]!.children[name] else {
                    throw Errno.noSuchFileOrDirectory
                }
                guard state.inodes[child]?.attributes.type == .directory else { throw Errno.notDirectory }
                guard state.inodes[child]?.children.isEmpty == true else { throw Errno.directoryNotEmpty }
                MemoryFS.removeName(name, in: dirIno, &state, table: table)
            }
            reply.ok()
        } catch { reply.error(error) }
    }

    func rename(
        _ context: RequestContext, parent: NodeID, name: FileName, newParent: NodeID,
        newName: FileName, flags: RenameFlags, reply: consuming ReplyEmpty
    ) {
        do throws(Errno) {
            guard !flags.contains(.whiteout), flags != [.noReplace, .exchange] else {
                throw .invalidArgument
            }
            guard let from = ino(parent), let to = ino(newParent) else {
                throw .noSuchFileOrDirectory
            }
            try box.state.withLock { state throws(Errno) in
                guard let source = state.inodes[from]?.children[name] else {
                    throw Errno.noSuchFileOrDirectory
                }
                guard state.inodes[to]?.attributes.type == .directory else { throw Errno.notDirectory }
                let target = state.inodes[to]?.children[newName]
                let now = Timespec.now
                if flags.contains(.exchange) {
                    guard let target else { throw Errno.noSuchFileOrDirectory }
                    state.inodes[from]!.children[name] = target
                    state.inodes[to]!.children[newName] = source
                } else {
                    if let target {
                        guard !flags.contains(.noReplace) else { throw Errno.fileExists }
                        if target == source { return }
                        let sourceIsDir = state.inodes[source]!.attributes.type == .directory
                        let targetIsDir = state.inodes[target]!.attributes.type == .directory
                        if sourceIsDir && !targetIsDir { throw Errno.notDirectory }
                        if !sourceIsDir && targetIsDir { throw Errno.isDirectory }
                        if targetIsDir && !(state.inodes[target]!.children.isEmpty) {
                            throw Errno.directoryNotEmpty
                        }
                        MemoryFS.removeName(newName, in: to, &state, table: table)
                    }
                    state.inodes[from]!.children[name] = nil
                    state.inodes[to]!.children[newName] = source
                    if state.inodes[source]!.attributes.type == .directory && from != to {
                        state.inodes[from]!.attributes.nlink -= 1
                        state.inodes[to]!.attributes.nlink += 1
                    }
                }
                state.inodes[from]!.attributes.mtime = now
                state.inodes[to]!.attributes.mtime = now
                state.inodes[source]!.attributes.ctime = now
            }
            reply.ok()
        } catch { reply.error(error) }
    }

    func link(
        _ context: RequestContext, node: NodeID, newParent: NodeID, newName: FileName,
        reply: consuming ReplyEntry
    ) {
        do throws(Errno) {
            guard let source = ino(node), let dir = ino(newParent) else { throw .noSuchFileOrDirectory }
            let attributes = try box.state.withLock { state throws(Errno) in
                guard state.inodes[source] != nil, state.inodes[dir] != nil else {
                    throw Errno.noSuchFileOrDirectory
                }
                guard state.inodes[source]!.attributes.type != .directory else { throw Errno.notPermitted }
                guard state.inodes[dir]!.children[newName] == nil else { throw Errno.fileExists }
                state.inodes[dir]!.children[newName] = source
                state.inodes[source]!.attributes.nlink += 1
                state.inodes[source]!.attributes.ctime = .now
                return state.inodes[source]!.attributes
            }
            entry(reply, source, attributes)
        } catch { reply.error(error) }
    }

    // MARK: files

    func open(_ context: RequestContext, node: NodeID, flags: OpenFlags, reply: consuming ReplyOpen) {
        do throws(Errno) {
            let handle = try withInode(node) { (ino, state) throws(Errno) in
                guard state.inodes[ino]!.attributes.type == .regular else { throw Errno.isDirectory }
                if flags.contains(.truncate) && flags.isWritable {
                    state.inodes[ino]!.data = []
                    state.inodes[ino]!.attributes.size = 0
                }
                var inode = state.inodes[ino]!
                killSetIDBits(context, &inode, &state, "open")
                state.inodes[ino] = inode
                state.inodes[ino]!.openCount += 1
                defer { state.nextHandle += 1 }
                return FUSE.FileHandle(state.nextHandle)
            }
            reply.opened(handle, options: behaviour.openOptions)
        } catch { reply.error(error) }
    }

    private func name(of ino: UInt64, _ state: State) -> String {
        for inode in state.inodes.values {
            if let (name, _) = inode.children.first(where: { $0.value == ino }) { return name.string }
        }
        return ""
    }

    func read(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, offset: UInt64, size: Int,
        reply: consuming ReplyData
    ) {
        let result = Result { () throws(Errno) -> ([UInt8], String) in
            try withInode(node) { ino, state in
                bump("read", &state)
                let data = state.inodes[ino]!.data
                let start = min(Int(offset), data.count)
                let end = min(start + size, data.count)
                return (Array(data[start..<end]), name(of: ino, state))
            }
        }
        switch result {
        case .failure(let errno):
            reply.error(errno)
        case .success(let (bytes, name)):
            if name.hasPrefix(behaviour.blockPrefix) {
                let parked = DeferredReply(reply)
                box.state.withLock { $0.parked.append(parked) }
            } else if name.hasPrefix(behaviour.dropPrefix) {
                return
            } else {
                reply.data(bytes)
            }
        }
    }

    func write(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, offset: UInt64, data: [UInt8],
        info: WriteInfo, reply: consuming ReplyWrite
    ) {
        do throws(Errno) {
            try withInode(node) { ino, state in
                var inode = state.inodes[ino]!
                let end = Int(offset) + data.count
                if inode.data.count < end {
                    inode.data += repeatElement(0, count: end - inode.data.count)
                }
                inode.data.replaceSubrange(Int(offset)..<end, with: data)
                inode.attributes.size = UInt64(inode.data.count)
                inode.attributes.mtime = .now
                killSetIDBits(context, &inode, &state, "write")
                state.inodes[ino] = inode
            }
            reply.written(data.count)
        } catch { reply.error(error) }
    }

    func flush(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, lockOwner: LockOwner,
        reply: consuming ReplyEmpty
    ) {
        box.state.withLock { bump("flush", &$0) }
        reply.ok()
    }

    func release(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, info: ReleaseInfo,
        reply: consuming ReplyEmpty
    ) {
        if let ino = ino(node) {
            let looked = table.node(for: ino) != nil
            box.state.withLock { state in
                state.inodes[ino]?.openCount -= 1
                if info.releaseFlockLocks, let owner = info.lockOwner {
                    state.flocks[ino]?.removeAll { $0.owner == owner }
                }
                MemoryFS.reap(ino, &state, looked: looked)
            }
        }
        reply.ok()
    }

    func fsync(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, flags: FsyncFlags,
        reply: consuming ReplyEmpty
    ) {
        box.state.withLock { bump(flags.contains(.dataSync) ? "fdatasync" : "fsync", &$0) }
        reply.ok()
    }

    // MARK: directories

    /// ".", ".." and the children in name order; the cookie of entry i is i + 1.
    private func listing(_ node: NodeID) throws(Errno) -> [(UInt64, FileName, FileAttributes)] {
        try withInode(node) { (ino, state) throws(Errno) in
            let dir = state.inodes[ino]!
            guard dir.attributes.type == .directory else { throw Errno.notDirectory }
            var entries = [(ino, FileName("."), dir.attributes), (ino, FileName(".."), dir.attributes)]
            for (name, child) in dir.children.sorted(by: {
                $0.key.bytes.lexicographicallyPrecedes($1.key.bytes)
            }) {
                if let inode = state.inodes[child] { entries.append((child, name, inode.attributes)) }
            }
            return entries
        }
    }

    func readdir(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, offset: UInt64,
        reply: consuming ReplyDirectory
    ) {
        do throws(Errno) {
            let entries = try listing(node)
            for (index, (ino, name, attributes)) in entries.enumerated().dropFirst(Int(offset)) {
                if reply.add(ino: ino, offset: UInt64(index + 1), type: attributes.type, name: name) { break }
            }
            reply.finish()
        } catch { reply.error(error) }
    }

    func readdirplus(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, offset: UInt64,
        reply: consuming ReplyDirectoryPlus
    ) {
        do throws(Errno) {
            box.state.withLock { bump("readdirplus", &$0) }
            let entries = try listing(node)
            for (index, (ino, name, attributes)) in entries.enumerated().dropFirst(Int(offset)) {
                let full = reply.add(
                    ino, in: table, attributes: attributes, offset: UInt64(index + 1), name: name,
                    attributeTimeout: behaviour.attributeTimeout, entryTimeout: behaviour.entryTimeout)
                if full { break }
            }
            reply.finish()
        } catch { reply.error(error) }
    }

    func statfs(_ context: RequestContext, node: NodeID, reply: consuming ReplyStatfs) {
        reply.statistics(
            FileSystemStatistics(blockSize: 4096, blocks: 1000, blocksFree: 600, files: 500, filesFree: 400))
    }

    // MARK: xattrs

    func setxattr(
        _ context: RequestContext, node: NodeID, name: String, value: [UInt8], flags: XattrFlags,
        reply: consuming ReplyEmpty
    ) {
        do throws(Errno) {
            guard name.hasPrefix("user.") else { throw .notSupported }
            try withInode(node) { (ino, state) throws(Errno) in
                let exists = state.inodes[ino]!.xattrs[name] != nil
                if flags.contains(.create) && exists { throw Errno.fileExists }
                if flags.contains(.replace) && !exists { throw Errno.noData }
                state.inodes[ino]!.xattrs[name] = value
            }
            reply.ok()
        } catch { reply.error(error) }
    }

    func getxattr(_ context: RequestContext, node: NodeID, name: String, reply: consuming ReplyXattr) {
        do throws(Errno) {
            let value = try withInode(node) { (ino, state) throws(Errno) in
                bump("getxattr " + name, &state)
                guard let value = state.inodes[ino]!.xattrs[name] else { throw Errno.noData }
                return value
            }
            reply.value(value)
        } catch { reply.error(error) }
    }

    func listxattr(_ context: RequestContext, node: NodeID, reply: consuming ReplyXattr) {
        do throws(Errno) {
            let names = try withInode(node) { ino, state in state.inodes[ino]!.xattrs.keys.sorted() }
            reply.names(names)
        } catch { reply.error(error) }
    }

    func removexattr(_ context: RequestContext, node: NodeID, name: String, reply: consuming ReplyEmpty) {
        do throws(Errno) {
            try withInode(node) { (ino, state) throws(Errno) in
                guard state.inodes[ino]!.xattrs.removeValue(forKey: name) != nil else { throw Errno.noData }
            }
            reply.ok()
        } catch { reply.error(error) }
    }

    // MARK: locks

    func getlk(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, owner: LockOwner,
        lock: FileLock, reply: consuming ReplyLock
    ) {
        let conflict = ino(node).flatMap { ino in
            box.state.withLock { state in
                state.posixLocks[ino, default: []].first {
                    $0.owner != owner && $0.lock.overlaps(lock)
                        && ($0.lock.kind == .write || lock.kind == .write)
                }?.lock
            }
        }
        reply.lock(conflict ?? FileLock(kind: .unlock, start: lock.start, end: lock.end))
    }

    func setlk(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, owner: LockOwner,
        lock: FileLock, wait: Bool, reply: consuming ReplyEmpty
    ) {
        do throws(Errno) {
            try withInode(node) { (ino, state) throws(Errno) in
                var locks = state.posixLocks[ino, default: []]
                if lock.kind == .unlock {
                    // Simplified: unlocking any part drops the owner's overlapping locks.
                    locks.removeAll { $0.owner == owner && $0.lock.overlaps(lock) }
                } else {
                    let conflict = locks.contains {
                        $0.owner != owner && $0.lock.overlaps(lock)
                            && ($0.lock.kind == .write || lock.kind == .write)
                    }
                    // Blocking waits are not implemented here: a waiter would get EAGAIN too.
                    if conflict { throw Errno.resourceTemporarilyUnavailable }
                    locks.removeAll { $0.owner == owner && $0.lock.overlaps(lock) }
                    locks.append(Lock(owner: owner, lock: lock))
                }
                state.posixLocks[ino] = locks
            }
            reply.ok()
        } catch { reply.error(error) }
    }

    func flock(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, owner: LockOwner,
        operation: FlockOperation, reply: consuming ReplyEmpty
    ) {
        do throws(Errno) {
            try withInode(node) { (ino, state) throws(Errno) in
                var holders = state.flocks[ino, default: []]
                holders.removeAll { $0.owner == owner }
                switch operation {
                case .unlock:
                    break
                case .shared:
                    if holders.contains(where: { $0.exclusive }) {
                        throw Errno.resourceTemporarilyUnavailable
                    }
                    holders.append((owner, false))
                case .exclusive:
                    if !holders.isEmpty { throw Errno.resourceTemporarilyUnavailable }
                    holders.append((owner, true))
                }
                state.flocks[ino] = holders
            }
            reply.ok()
        } catch { reply.error(error) }
    }

    // MARK: ranges

    func fallocate(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, mode: FallocateMode,
        offset: UInt64, length: UInt64, reply: consuming ReplyEmpty
    ) {
        do throws(Errno) {
            guard mode.isEmpty || mode == .keepSize || mode == [.keepSize, .punchHole] else {
                throw .notSupported
            }
            try withInode(node) { ino, state in
                var data = state.inodes[ino]!.data
                let end = Int(offset + length)
                if mode.contains(.punchHole) {
                    for i in Int(offset)..<min(end, data.count) { data[i] = 0 }
                } else if !mode.contains(.keepSize) && data.count < end {
                    data += repeatElement(0, count: end - data.count)
                }
                state.inodes[ino]!.data = data
                state.inodes[ino]!.attributes.size = UInt64(data.count)
            }
            reply.ok()
        } catch { reply.error(error) }
    }

    func copyFileRange(
        _ context: RequestContext, nodeIn: NodeID, handleIn: FUSE.FileHandle, offsetIn: UInt64,
        nodeOut: NodeID, handleOut: FUSE.FileHandle, offsetOut: UInt64, length: Int, flags: UInt32,
        reply: consuming ReplyWrite
    ) {
        do throws(Errno) {
            guard let source = ino(nodeIn), let target = ino(nodeOut) else { throw .noSuchFileOrDirectory }
            let copied = try box.state.withLock { state throws(Errno) in
                guard let input = state.inodes[source]?.data, var output = state.inodes[target]?.data else {
                    throw Errno.noSuchFileOrDirectory
                }
                bump("copy_file_range", &state)
                let start = min(Int(offsetIn), input.count)
                let chunk = input[start..<min(start + length, input.count)]
                let end = Int(offsetOut) + chunk.count
                if output.count < end { output += repeatElement(0, count: end - output.count) }
                output.replaceSubrange(Int(offsetOut)..<end, with: chunk)
                state.inodes[target]!.data = output
                state.inodes[target]!.attributes.size = UInt64(output.count)
                return chunk.count
            }
            reply.written(copied)
        } catch { reply.error(error) }
    }

    func lseek(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, offset: Int64,
        whence: SeekWhence, reply: consuming ReplyLseek
    ) {
        do throws(Errno) {
            let size = try withInode(node) { ino, state in Int64(state.inodes[ino]!.data.count) }
            switch whence {
            case .data:
                guard offset < size else { throw .noSuchAddressOrDevice }
                reply.offset(offset)
            case .hole:
                guard offset <= size else { throw .noSuchAddressOrDevice }
                reply.offset(size)
            default:
                throw .invalidArgument
            }
        } catch { reply.error(error) }
    }
}
