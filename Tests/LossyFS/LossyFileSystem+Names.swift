import FUSE
import SystemPackage

#if canImport(Glibc)
    import Glibc
#endif

/// The calls that change names: each is done in the backing folder at once and journaled, so
/// that a cut can undo it (see ``NameJournal``).
extension LossyFileSystem {
    /// Makes a node with `make`, gives it the caller's owner, journals it and answers its entry.
    private func makeNode(
        _ context: RequestContext, _ parent: NodeID, _ name: FileName, _ reply: consuming ReplyEntry,
        isDirectory: Bool = false, _ make: (Int32, UnsafePointer<CChar>) -> Int32
    ) {
        serve(reply) { state, reply throws(Errno) in
            let (parentIno, parentFD) = try directory(parent, state)
            try Backing.withName(name) { cName throws(Errno) in try Backing.check(make(parentFD, cName)) }
            try? Backing.chown(parentFD, name, uid: context.uid, gid: context.gid)
            let ino = try enter(&state, parentFD, name)
            journal(
                &state,
                [
                    Change(
                        slot: Slot(directory: parentIno, name: name), before: nil,
                        after: Object(ino: ino, isDirectory: isDirectory))
                ],
                changesTree: isDirectory)
            try self.reply(reply, ino, state)
        }
    }

    func mknod(
        _ context: RequestContext, parent: NodeID, name: FileName, type: FUSE.FileType,
        permissions: FilePermissions, rdev: UInt64, reply: consuming ReplyEntry
    ) {
        makeNode(context, parent, name, reply) {
            mknodat($0, $1, type.modeBits | permissions.rawValue, dev_t(rdev))
        }
    }

    func mkdir(
        _ context: RequestContext, parent: NodeID, name: FileName, permissions: FilePermissions,
        reply: consuming ReplyEntry
    ) {
        makeNode(context, parent, name, reply, isDirectory: true) { mkdirat($0, $1, permissions.rawValue) }
    }

    func symlink(
        _ context: RequestContext, target: [UInt8], parent: NodeID, name: FileName, reply: consuming ReplyEntry
    ) {
        let target = target.map { CChar(bitPattern: $0) } + [0]
        makeNode(context, parent, name, reply) { directory, name in
            target.withUnsafeBufferPointer { buffer in
                buffer.baseAddress.map { symlinkat($0, directory, name) } ?? -1
            }
        }
    }

    func create(
        _ context: RequestContext, parent: NodeID, name: FileName, permissions: FilePermissions,
        flags: OpenFlags, reply: consuming ReplyCreate
    ) {
        serve(reply) { state, reply throws(Errno) in
            let (parentIno, parentFD) = try directory(parent, state)
            let made = try Backing.withName(name) { cName in
                openat(parentFD, cName, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, permissions.rawValue)
            }
            if made < 0 && (errno != EEXIST || flags.contains(.exclusive)) { throw Errno(rawValue: errno) }
            if made >= 0 { try? Backing.chown(parentFD, name, uid: context.uid, gid: context.gid) }
            let ino = try enter(&state, parentFD, name)
            if made >= 0 {
                if state.nodes[ino]?.dataFD ?? 0 < 0 { state.nodes[ino]?.dataFD = made } else { close(made) }
                journal(
                    &state,
                    [
                        Change(
                            slot: Slot(directory: parentIno, name: name), before: nil,
                            after: Object(ino: ino, isDirectory: false))
                    ])
            } else if flags.contains(.truncate) {
                try changeContents(&state, ino) { overlay, _ in overlay.truncate(to: 0) }
            }
            reply.take()?.created(
                ino, in: table, attributes: try attributes(ino, state), handle: FUSE.FileHandle(ino),
                options: [.keepCache], attributeTimeout: Self.timeout, entryTimeout: Self.timeout)
        }
    }

    func unlink(_ context: RequestContext, parent: NodeID, name: FileName, reply: consuming ReplyEmpty) {
        serve(reply) { state, reply throws(Errno) in
            let (parentIno, parentFD) = try directory(parent, state)
            guard let st = try Backing.stat(parentFD, name) else { throw .noSuchFileOrDirectory }
            guard st.st_mode & S_IFMT != S_IFDIR else { throw .isDirectory }
            let ino = UInt64(st.st_ino)
            try keepInLimbo(&state, parentFD, name, ino)
            try Backing.unlink(parentFD, name)
            journal(
                &state,
                [
                    Change(
                        slot: Slot(directory: parentIno, name: name),
                        before: Object(ino: ino, isDirectory: false), after: nil)
                ])
            reply.take()?.ok()
        }
    }

    func rmdir(_ context: RequestContext, parent: NodeID, name: FileName, reply: consuming ReplyEmpty) {
        serve(reply) { state, reply throws(Errno) in
            let (parentIno, parentFD) = try directory(parent, state)
            guard let st = try Backing.stat(parentFD, name) else { throw .noSuchFileOrDirectory }
            guard st.st_mode & S_IFMT == S_IFDIR else { throw .notDirectory }
            let ino = UInt64(st.st_ino)
            let fd = try Backing.openPath(parentFD, name)
            defer { close(fd) }
            guard try Backing.list(fd).allSatisfy({ $0.name.isDotOrDotDot }) else { throw .directoryNotEmpty }
            try Backing.rename(parentFD, name, limboFD, Self.limboName(ino))
            state.inLimbo.insert(ino)
            journal(
                &state,
                [
                    Change(
                        slot: Slot(directory: parentIno, name: name),
                        before: Object(ino: ino, isDirectory: true), after: nil)
                ],
                changesTree: true)
            reply.take()?.ok()
        }
    }

    func rename(
        _ context: RequestContext, parent: NodeID, name: FileName, newParent: NodeID, newName: FileName,
        flags: RenameFlags, reply: consuming ReplyEmpty
    ) {
        serve(reply) { state, reply throws(Errno) in
            guard !flags.contains(.whiteout), flags != [.noReplace, .exchange] else { throw .invalidArgument }
            let (fromIno, fromFD) = try directory(parent, state)
            let (toIno, toFD) = try directory(newParent, state)
            guard let source = try Backing.stat(fromFD, name) else { throw .noSuchFileOrDirectory }
            let moved = Object(ino: UInt64(source.st_ino), isDirectory: source.st_mode & S_IFMT == S_IFDIR)
            let replaced = try Backing.stat(toFD, newName).map {
                Object(ino: UInt64($0.st_ino), isDirectory: $0.st_mode & S_IFMT == S_IFDIR)
            }
            let from = Slot(directory: fromIno, name: name)
            let to = Slot(directory: toIno, name: newName)
            if flags.contains(.exchange) {
                guard let replaced else { throw .noSuchFileOrDirectory }
                try Backing.rename(fromFD, name, toFD, newName, flags: flags.rawValue)
                if replaced != moved {
                    journal(
                        &state,
                        [
                            Change(slot: from, before: moved, after: replaced),
                            Change(slot: to, before: replaced, after: moved),
                        ],
                        changesTree: moved.isDirectory || replaced.isDirectory)
                }
                reply.take()?.ok()
                return
            }
            if let replaced {
                guard !flags.contains(.noReplace) else { throw .fileExists }
                // Two names of one file: rename does nothing (POSIX).
                if replaced.ino == moved.ino {
                    reply.take()?.ok()
                    return
                }
                if moved.isDirectory && !replaced.isDirectory { throw .notDirectory }
                if !moved.isDirectory && replaced.isDirectory { throw .isDirectory }
                if replaced.isDirectory {
                    let fd = try Backing.openPath(toFD, newName)
                    defer { close(fd) }
                    guard try Backing.list(fd).allSatisfy({ $0.name.isDotOrDotDot }) else {
                        throw .directoryNotEmpty
                    }
                    try Backing.rename(toFD, newName, limboFD, Self.limboName(replaced.ino))
                    do throws(Errno) {
                        try Backing.rename(fromFD, name, toFD, newName)
                    } catch {
                        try? Backing.rename(limboFD, Self.limboName(replaced.ino), toFD, newName)
                        throw error
                    }
                    state.inLimbo.insert(replaced.ino)
                } else {
                    try keepInLimbo(&state, toFD, newName, replaced.ino)
                    do throws(Errno) {
                        try Backing.rename(fromFD, name, toFD, newName)
                    } catch {
                        release([replaced.ino], &state)
                        throw error
                    }
                }
            } else {
                try Backing.rename(fromFD, name, toFD, newName, flags: flags.rawValue)
            }
            journal(
                &state,
                [
                    Change(slot: from, before: moved, after: nil),
                    Change(slot: to, before: replaced, after: moved),
                ],
                changesTree: moved.isDirectory)
            reply.take()?.ok()
        }
    }

    func link(
        _ context: RequestContext, node: NodeID, newParent: NodeID, newName: FileName, reply: consuming ReplyEntry
    ) {
        serve(reply) { state, reply throws(Errno) in
            let (ino, linked) = try self.node(node, state)
            guard !linked.isDirectory else { throw .notPermitted }
            guard try attributes(ino, state).nlink > 0 else { throw .noSuchFileOrDirectory }
            let (parentIno, parentFD) = try directory(newParent, state)
            try Backing.link(linked.fd, parentFD, newName)
            journal(
                &state,
                [
                    Change(
                        slot: Slot(directory: parentIno, name: newName), before: nil,
                        after: Object(ino: ino, isDirectory: false))
                ])
            try self.reply(reply, ino, state)
        }
    }
}
