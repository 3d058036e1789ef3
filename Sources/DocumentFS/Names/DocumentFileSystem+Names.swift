import DocumentEngine
import FUSE
import Foundation
import SystemPackage
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// Creating, renaming and removing names.
extension DocumentFileSystem {
    /// Fails for a name longer than any this file system holds (NAME_MAX, 255 bytes): a lookup,
    /// removal or rename of one is ENAMETOOLONG, as on ext4, not ENOENT.
    func checkLength(_ name: FUSE.FileName) throws(Errno) {
        guard name.bytes.count <= 255 else { throw .fileNameTooLong }
    }

    /// Checks a new name: the store keeps names as UTF-8 text of at most 255 bytes.
    func validate(_ name: FUSE.FileName) throws(Errno) -> String {
        try checkLength(name)
        guard !name.bytes.isEmpty, !name.isDotOrDotDot, !name.bytes.contains(0x2F) else {
            throw .invalidArgument
        }
        guard let text = String(validating: name.bytes, as: UTF8.self) else { throw .illegalByteSequence }
        return text
    }

    /// Fails if `directory` has a child whose name is the same text in another Unicode form: the
    /// store compares names as text, so both could not be saved. One lookup, whatever the size of
    /// the directory.
    func checkNoEquivalent(_ text: String, in children: Children, except: ViewNode? = nil) throws(Errno) {
        guard let other = children.entry(equivalentTo: text), other !== except else { return }
        if !other.name.bytes.elementsEqual(text.utf8) { throw .fileExists }
    }

    /// Fails as `rename(2)` does when `target`, the name a rename goes to, cannot be replaced by
    /// something of `kind`: a folder only by a folder, and only when empty.
    func checkReplaceable(_ target: ViewNode, by kind: FileWrapper.Kind) throws(Errno) {
        if kind == .directory && target.kind != .directory { throw .notDirectory }
        if kind != .directory && target.kind == .directory { throw .isDirectory }
        if target.kind == .directory && !target.children.isEmpty { throw .directoryNotEmpty }
    }

    /// A new node record for a creation by `context`.
    func newRecord(
        _ id: StoreNodeID, document: DocumentID?, parent: StoreNodeID?, name: String, kind: FileWrapper.Kind,
        permissions: FilePermissions, context: RequestContext, linkTarget: String? = nil, device: UInt64 = 0
    ) -> NodeRecord {
        let mode = Int(permissions.rawValue & ~context.umask.rawValue & 0o7777)
        return NodeRecord(
            id: id, document: document ?? DocumentID(rawValue: 0), parent: parent, name: name, kind: kind,
            permissions: mode, uid: context.uid, gid: context.gid, modified: .now, linkTarget: linkTarget,
            device: device)
    }

    /// Creates a node in a package directory.
    func createInPackage(
        _ context: RequestContext, directory: ViewNode, name: FUSE.FileName, kind: FileWrapper.Kind,
        permissions: FilePermissions, linkTarget: String? = nil, device: UInt64 = 0
    ) throws(Errno) -> ViewNode {
        let text = try validate(name)
        try refuseVirtualCreation(in: directory, name, kind: kind)
        let id = try newStoreID()
        return try state.withLock { state throws(Errno) -> ViewNode in
            guard directory.kind == .directory, directory.linked else { throw .noSuchFileOrDirectory }
            guard directory.children[name] == nil else { throw .fileExists }
            try refuseConflict(directory)
            try checkNoEquivalent(text, in: directory.children)
            let record = newRecord(
                id, document: directory.document, parent: directory.persistAs, name: text, kind: kind,
                permissions: permissions, context: context, linkTarget: linkTarget, device: device)
            let node = makeNode(storeID: id, document: directory.document, record: record, name: name)
            if kind == .regularFile { node.contents?.base = .empty(id) }
            inheritPropertyList(&state, node, name: name, directory: directory)
            node.parent = directory
            directory.children[name] = node
            directory.record.modified = record.modified
            directory.record.changed = record.modified
            state.nodes[node.ino] = node
            // A scratch file changes the folder's times in the mount, but is no reason to save.
            if !isScratch(node) { changed(&state, directory) }
            changed(&state, node)
            return node
        }
    }

    /// Creates a file or document at the mount root: a scratch file stays in memory, a name a
    /// hidden document still has in the store takes that document over, anything else is a new
    /// flat document.
    func createAtRoot(_ context: RequestContext, name: FUSE.FileName, permissions: FilePermissions)
        throws(Errno)
        -> ViewNode
    {
        let text = try validate(name)
        try ensureListing()
        if configuration.scratchNames.matches(name) {
            let id = try newStoreID()
            return try state.withLock { state throws(Errno) -> ViewNode in
                guard state.rootEntries[name] == nil else { throw .fileExists }
                let record = newRecord(
                    id, document: nil, parent: nil, name: text, kind: .regularFile, permissions: permissions,
                    context: context)
                let node = makeNode(storeID: id, document: nil, record: record, name: name)
                node.contents?.base = .empty(id)
                node.atMountRoot = true
                state.rootEntries[name] = node
                state.nodes[node.ino] = node
                state.rootChanged = .now
                return node
            }
        }
        // A document renamed away to a scratch name (vim's backup) is still in the store under
        // this name: the new file becomes its next version.
        let id = try newStoreID()
        if let adopted = try state.withLock({ state throws(Errno) -> ViewNode? in
            guard state.rootEntries[name] == nil else { throw .fileExists }
            guard let document = state.documents.values.first(where: { $0.info.name == text }) else {
                return nil
            }
            guard document.info.kind == .flat else { throw .fileExists }
            let record = newRecord(
                id, document: document.id, parent: nil, name: text, kind: .regularFile,
                permissions: permissions, context: context)
            let node = makeNode(storeID: id, document: document.id, record: record, name: name)
            node.contents?.base = .empty(id)
            adopt(&state, document, node)
            return node
        }) {
            return adopted
        }
        return try createDocument(
            context, name: name, text: text, root: DocumentRoot(kind: .regularFile), permissions: permissions)
    }

    /// Refuses to make anything in the history or the Trash, but the files trash tools write to
    /// `info/`.
    func refuseVirtualCreation(in directory: ViewNode, _ name: FUSE.FileName, kind: FileWrapper.Kind)
        throws(Errno)
    {
        guard isVirtual(directory) else { return }
        switch trashPlace(directory)?.place {
        case .info?, .expunged?:
            if kind == .regularFile || kind == .directory { return }
            throw .permissionDenied
        case .root?:
            throw state.withLock { _ in directory.children[name] != nil } ? .fileExists : .permissionDenied
        case .files?, .inside?:
            throw .permissionDenied
        case nil:
            throw .readOnlyFileSystem
        }
    }

    /// Creates a document in the store and shows it at the root, owned by the caller.
    func createDocument(
        _ context: RequestContext, name: FUSE.FileName, text: String, root: DocumentRoot,
        permissions: FilePermissions
    ) throws(Errno) -> ViewNode {
        // The history's and the trash folders' names are the mount's, never documents'.
        if Self.isReservedAtRoot(name) { throw .permissionDenied }
        try state.withLock { state throws(Errno) in
            if state.rootEntries[name] != nil { throw .fileExists }
        }
        var root = root
        root.permissions = Int(permissions.rawValue & ~context.umask.rawValue & 0o7777)
        root.uid = context.uid
        root.gid = context.gid
        return try changingRoot { () throws(Errno) -> ViewNode in
            // One transaction, the caller's ownership included; durable at the next `fsync` of the
            // mount root or of the new file, as a create on ext4.
            let (info, record) = try storeCall { () throws -> (DocumentInfo, NodeRecord?) in
                try store.transaction(durable: false) { tx in
                    let info = try tx.createDocument(named: text, root: root, type: nil, origin: origin)
                    return (info, try tx.node(info.root))
                }
            }
            guard let record else { throw .ioError }
            return try state.withLock { state throws(Errno) -> ViewNode in
                if let existing = state.documents[info.id] { return existing.root }
                guard state.rootEntries[name] == nil else { throw .fileExists }
                let document = install(&state, info: info, rootRecord: record)
                document.committed = [record.id: record]
                document.namesUnsynced = true
                state.rootChanged = .now
                return document.root
            }
        }
    }

    /// Makes `node` the document's node at the root under the document's name.
    func adopt(_ state: inout State, _ document: DocumentState, _ node: ViewNode) {
        let old = document.root
        if old !== node {
            if old.atMountRoot, state.rootEntries[old.name] === old, !isHidden(old, of: document) {
                state.rootEntries[old.name] = nil
                old.linked = false
            }
            old.document = nil
            if old.storeID == document.info.root { old.reportedIno = old.ino | (1 << 63) }
        }
        node.reportedIno = node.storeID == document.info.root ? nil : inodeNumber(document.info.root)
        node.document = document.id
        node.persistAs = document.info.root
        node.atMountRoot = true
        node.parent = nil
        node.record.document = document.id
        node.record.parent = nil
        node.name = FUSE.FileName(document.info.name)
        document.root = node
        state.rootEntries[node.name] = node
        state.nodes[node.ino] = node
        state.rootChanged = .now
        changed(&state, node)
    }

    /// Whether the document's node was renamed away under a scratch name.
    func isHidden(_ node: ViewNode, of document: DocumentState) -> Bool {
        node.name.string != document.info.name
    }

    /// A new regular file in `parent`.
    func createFile(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, permissions: FilePermissions
    )
        throws(Errno) -> ViewNode
    {
        if parent == .root { return try createAtRoot(context, name: name, permissions: permissions) }
        guard let directory = try resolve(parent, loadingChildren: true) else { throw .noSuchFileOrDirectory }
        return try createInPackage(
            context, directory: directory, name: name, kind: .regularFile, permissions: permissions)
    }

    public func create(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, permissions: FilePermissions,
        flags: OpenFlags, reply: consuming ReplyCreate
    ) {
        do throws(Errno) {
            guard !configuration.readOnly else { throw .readOnlyFileSystem }
            let node = try createFile(context, parent: parent, name: name, permissions: permissions)
            let (handle, attrs) = state.withLock { state in
                node.openHandles += 1
                node.openedGeneration = node.contents?.generation
                let handle = state.nextHandle
                state.nextHandle += 1
                state.files[handle] = OpenFile(
                    node: node, writable: flags.isWritable, generation: node.contents?.generation ?? 0,
                    snapshot: nil, wrote: true, writers: [context.pid, threadGroup(of: context.pid)])
                return (handle, attributes(node))
            }
            reply.created(
                node.ino, in: table, attributes: attrs, handle: FUSE.FileHandle(handle),
                attributeTimeout: configuration.attributeTimeout, entryTimeout: configuration.entryTimeout)
        } catch { reply.error(error) }
    }

    public func mknod(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, type: FUSE.FileType,
        permissions: FilePermissions, rdev: UInt64, reply: consuming ReplyEntry
    ) {
        do throws(Errno) {
            guard !configuration.readOnly else { throw .readOnlyFileSystem }
            let kind: FileWrapper.Kind
            switch type {
            case .regular:
                let node = try createFile(context, parent: parent, name: name, permissions: permissions)
                entry(reply, node, state.withLock { _ in attributes(node) })
                return
            case .fifo: kind = .fifo
            case .socket: kind = .socket
            case .characterDevice: kind = .characterDevice
            case .blockDevice: kind = .blockDevice
            case .directory, .symbolicLink: throw .invalidArgument
            }
            // Special files are metadata-only wrappers; the kernel serves their I/O (the mount is
            // nodev, so a device node here cannot be opened).
            let device = kind == .characterDevice || kind == .blockDevice ? rdev : 0
            let node: ViewNode
            if parent == .root {
                node = try createSpecialAtRoot(
                    context, name: name, kind: kind, permissions: permissions, device: device)
            } else {
                guard let directory = try resolve(parent, loadingChildren: true) else {
                    throw .noSuchFileOrDirectory
                }
                node = try createInPackage(
                    context, directory: directory, name: name, kind: kind, permissions: permissions,
                    device: device)
            }
            entry(reply, node, state.withLock { _ in attributes(node) })
        } catch { reply.error(error) }
    }

    public func mkdir(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, permissions: FilePermissions,
        reply: consuming ReplyEntry
    ) {
        do throws(Errno) {
            guard !configuration.readOnly else { throw .readOnlyFileSystem }
            let node: ViewNode
            if parent == .root, let owner = Self.trashOwner(name), owner == context.uid {
                // GIO and trash-cli make their trash folder when they do not find it: it is there.
                let trash = state.withLock { virtualFolder(&$0, .trash(uid: owner), parent: nil) }
                entry(reply, trash, state.withLock { _ in attributes(trash) })
                return
            }
            if parent == .root {
                // A folder at the root is a new package document.
                let text = try validate(name)
                try ensureListing()
                node = try createDocument(
                    context, name: name, text: text, root: DocumentRoot(kind: .directory),
                    permissions: permissions)
            } else {
                guard let directory = try resolve(parent, loadingChildren: true) else {
                    throw .noSuchFileOrDirectory
                }
                node = try createInPackage(
                    context, directory: directory, name: name, kind: .directory, permissions: permissions)
            }
            entry(reply, node, state.withLock { _ in attributes(node) })
        } catch { reply.error(error) }
    }

    public func symlink(
        _ context: RequestContext, target: [UInt8], parent: NodeID, name: FUSE.FileName,
        reply: consuming ReplyEntry
    ) {
        do throws(Errno) {
            guard !configuration.readOnly else { throw .readOnlyFileSystem }
            guard let destination = String(validating: target, as: UTF8.self) else {
                throw .illegalByteSequence
            }
            let node: ViewNode
            if parent == .root {
                // A link at the root is a flat document whose root is the link (Apple's link
                // wrapper), unless it has a scratch name (emacs's lock `.#name`).
                node = try createSpecialAtRoot(
                    context.umaskless, name: name, kind: .symbolicLink,
                    permissions: FilePermissions(rawValue: 0o777),
                    linkTarget: destination)
            } else {
                guard let directory = try resolve(parent, loadingChildren: true) else {
                    throw .noSuchFileOrDirectory
                }
                node = try createInPackage(
                    context.umaskless, directory: directory, name: name, kind: .symbolicLink,
                    permissions: FilePermissions(rawValue: 0o777), linkTarget: destination)
            }
            entry(reply, node, state.withLock { _ in attributes(node) })
        } catch { reply.error(error) }
    }

    public func link(
        _ context: RequestContext, node: NodeID, newParent: NodeID, newName: FUSE.FileName,
        reply: consuming ReplyEntry
    ) {
        do throws(Errno) {
            guard !configuration.readOnly else { throw .readOnlyFileSystem }
            let text = try validate(newName)
            // A document is a file system of its own: a link from one into another, or into the
            // mount root (where each name is a document), is a link across file systems.
            guard newParent != .root, let directory = try resolve(newParent, loadingChildren: true) else {
                throw .improperLink
            }
            guard let file = try resolve(node) else { throw .improperLink }
            if isVirtual(directory) || isVirtual(file) { throw .improperLink }
            let id = try newStoreID()
            let alias = try state.withLock { state throws(Errno) -> ViewNode in
                guard file.conflict == nil, directory.conflict == nil else { throw .permissionDenied }
                guard file.kind != .directory else { throw .notPermitted }
                guard file.linked else { throw .noSuchFileOrDirectory }
                guard !file.atMountRoot, file.document != nil, file.document == directory.document else {
                    throw .improperLink
                }
                guard directory.kind == .directory, directory.linked else { throw .noSuchFileOrDirectory }
                guard directory.children[newName] == nil else { throw .fileExists }
                try checkNoEquivalent(text, in: directory.children)
                // Scratch files are never saved, so a saved name cannot stand for one, nor a
                // scratch name for a saved file: tools that link temporary files fall back.
                guard isPersisted(file), !configuration.scratchNames.matches(newName) else {
                    throw .notPermitted
                }
                guard file.aliases.count < 65_000 else { throw .tooManyLinks }
                var record = file.record
                record.id = id
                record.parent = directory.persistAs
                record.name = text
                record.preferredName = nil
                record.linkOf = file.persistAs
                let alias = ViewNode(storeID: id, document: file.document, name: newName, record: record)
                alias.linkOf = file
                alias.parent = directory
                directory.children[newName] = alias
                file.aliases[ObjectIdentifier(alias)] = alias
                let now = Timestamp.now
                file.record.changed = now
                directory.record.modified = now
                directory.record.changed = now
                changed(&state, alias)
                changed(&state, file)
                changed(&state, directory)
                return alias
            }
            _ = alias
            entry(reply, file, state.withLock { _ in attributes(file) })
        } catch { reply.error(error) }
    }

    /// The name a file's node moves to when it leaves its own: a saved one first.
    func heir(of file: ViewNode) -> ViewNode? {
        let names = file.aliases.values.sorted { $0.storeID < $1.storeID }
        return names.first { isPersisted($0) } ?? names.first
    }

    /// Takes the name `entry` out of its directory, as `unlink` or a rename over it does. A file
    /// with other names keeps its node: it moves to one of them, so its inode and contents stay.
    func unlinkName(_ state: inout State, _ entry: ViewNode) {
        if let file = entry.linkOf {
            file.aliases[ObjectIdentifier(entry)] = nil
            file.record.changed = .now
            changed(&state, file)
            detach(&state, entry)
            return
        }
        guard let heir = heir(of: entry), let place = heir.parent, let from = entry.parent else {
            detach(&state, entry)
            return
        }
        entry.aliases[ObjectIdentifier(heir)] = nil
        heir.linkOf = nil
        detach(&state, heir)
        if from.children[entry.name] === entry { from.children[entry.name] = nil }
        let now = Timestamp.now
        from.record.modified = now
        from.record.changed = now
        changed(&state, from)
        entry.name = heir.name
        entry.parent = place
        entry.record.name = heir.record.name
        entry.record.parent = place.persistAs
        entry.record.changed = now
        place.children[heir.name] = entry
        changed(&state, place)
        changed(&state, entry)
    }

    /// Creates a symbolic link or a special file at the mount root: a document of its own, or a
    /// node kept in memory under a scratch name.
    func createSpecialAtRoot(
        _ context: RequestContext, name: FUSE.FileName, kind: FileWrapper.Kind, permissions: FilePermissions,
        linkTarget: String? = nil, device: UInt64 = 0
    ) throws(Errno) -> ViewNode {
        let text = try validate(name)
        try ensureListing()
        guard configuration.scratchNames.matches(name) else {
            return try createDocument(
                context, name: name, text: text,
                root: DocumentRoot(kind: kind, linkTarget: linkTarget, device: device),
                permissions: permissions)
        }
        let id = try newStoreID()
        return try state.withLock { state throws(Errno) -> ViewNode in
            guard state.rootEntries[name] == nil else { throw .fileExists }
            let record = newRecord(
                id, document: nil, parent: nil, name: text, kind: kind, permissions: permissions,
                context: context, linkTarget: linkTarget, device: device)
            let node = makeNode(storeID: id, document: nil, record: record, name: name)
            node.atMountRoot = true
            state.rootEntries[name] = node
            state.nodes[node.ino] = node
            state.rootChanged = .now
            return node
        }
    }

    /// Whether the node is a file under a scratch name (never saved).
    func isScratch(_ node: ViewNode) -> Bool {
        node.kind != .directory && configuration.scratchNames.matches(node.name)
    }

    /// Takes `node` out of the tree; open handles keep it alive.
    func detach(_ state: inout State, _ node: ViewNode) {
        node.linked = false
        if node.atMountRoot {
            if state.rootEntries[node.name] === node { state.rootEntries[node.name] = nil }
            state.rootChanged = .now
        } else if let parent = node.parent {
            if parent.children[node.name] === node { parent.children[node.name] = nil }
            let now = Timestamp.now
            parent.record.modified = now
            parent.record.changed = now
            if !isScratch(node) { changed(&state, parent) }
        }
        changed(&state, node)
        func release(_ n: ViewNode) {
            n.linked = false
            if n.openHandles == 0 && table.node(for: n.ino) == nil { state.nodes[n.ino] = nil }
            for child in n.children.values { release(child) }
        }
        release(node)
    }

    public func unlink(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, reply: consuming ReplyEmpty
    ) {
        do throws(Errno) {
            guard !configuration.readOnly else { throw .readOnlyFileSystem }
            try remove(parent: parent, name: name, directory: false)
            reply.ok()
        } catch { reply.error(error) }
    }

    public func rmdir(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, reply: consuming ReplyEmpty
    ) {
        do throws(Errno) {
            guard !configuration.readOnly else { throw .readOnlyFileSystem }
            try remove(parent: parent, name: name, directory: true)
            reply.ok()
        } catch { reply.error(error) }
    }

    func remove(parent: NodeID, name: FUSE.FileName, directory: Bool) throws(Errno) {
        try checkLength(name)
        if parent == .root, Self.isReservedAtRoot(name) { throw .permissionDenied }
        if parent == .root {
            try changingRoot { () throws(Errno) in try removeAtRoot(name, directory: directory) }
            return
        }
        guard let directoryNode = try resolve(parent, loadingChildren: true) else {
            throw .noSuchFileOrDirectory
        }
        if try removeVirtual(directoryNode, name, isDirectory: directory) { return }
        if directory { try ensureConflictLoaded(directoryNode) }
        try state.withLock { state throws(Errno) in
            guard let node = directoryNode.children[name] else { throw .noSuchFileOrDirectory }
            if directory && node.kind != .directory { throw .notDirectory }
            if !directory && node.kind == .directory { throw .isDirectory }
            if directory && !node.children.isEmpty { throw .directoryNotEmpty }
            if directoryNode.conflict != nil {
                // Inside a conflict entry a removal only hides the file in this mount, so that
                // `rm -r` of the entry gets to its `rmdir`, which resolves the conflict.
                directoryNode.children[name] = nil
                node.linked = false
                return
            }
            noteLeaving(&state, node, name: name, directory: directoryNode)
            unlinkName(&state, node)
        }
    }

    /// `unlink` and `rmdir` at the root: the document goes (to its history), or a scratch file or
    /// a conflict entry.
    private func removeAtRoot(_ name: FUSE.FileName, directory: Bool) throws(Errno) {
        try ensureListing()
        var conflict: ConflictEntry?
        let document = try state.withLock { state throws(Errno) -> DocumentState? in
            guard let node = state.rootEntries[name] else { throw .noSuchFileOrDirectory }
            if directory && node.kind != .directory { throw .notDirectory }
            if !directory && node.kind == .directory { throw .isDirectory }
            if directory && !node.children.isEmpty { throw .directoryNotEmpty }
            if let entry = conflictEntry(&state, of: node) {
                conflict = entry
                return nil
            }
            guard let document = self.document(&state, of: node), !isHidden(node, of: document) else {
                // A scratch file: it was never saved.
                detach(&state, node)
                return nil
            }
            return document
        }
        if let conflict {
            try resolveConflictEntry(conflict, directory: directory)
            return
        }
        guard let document else { return }
        if directory {
            // The package may have unloaded children the kernel never asked about.
            try ensureLoaded(document)
            try state.withLock { _ throws(Errno) in
                if !document.root.children.isEmpty { throw .directoryNotEmpty }
            }
        }
        // Changes not yet saved are dropped: `rm -r` emptied the package first, and the
        // version kept for restoring should be the one with the contents.
        document.saving.lock()
        defer { document.saving.unlock() }
        // Durable at the next `fsync` of the mount root, as an unlink on ext4.
        try storeCall {
            try store.transaction(durable: false) { tx in
                try tx.deleteDocument(document.id, origin: origin)
            }
        }
        state.withLock { state in
            document.dirty = false
            if state.rootEntries[document.root.name] === document.root { detach(&state, document.root) }
            state.documents[document.id] = nil
        }
    }
}

extension RequestContext {
    /// The context with no umask (symbolic links are always 0777).
    var umaskless: RequestContext {
        var copy = self
        copy.umask = FilePermissions(rawValue: 0)
        return copy
    }
    static func umaskless(_ context: RequestContext) -> RequestContext { context.umaskless }
}
