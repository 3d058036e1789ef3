import DocumentEngine
import FUSE
import Foundation
import SystemPackage
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// Creating, renaming and removing names: the work of `create`, `mknod`, `mkdir`, `symlink`,
/// `link`, `unlink`, `rmdir` and `rename`, whose kernel handlers only answer.
struct NameOperations: MountRoom {
    let view: MountView
    let texts: PropertyListTexts
    let saving: SavePipeline
    let conflictCopies: ConflictCopies
    let desktop: DesktopFolders
    let resolver: NodeResolver
}

extension NameOperations {
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
            try conflictCopies.refuseConflict(directory)
            try checkNoEquivalent(text, in: directory.children)
            let record = newRecord(
                id, document: directory.document, parent: directory.persistAs, name: text, kind: kind,
                permissions: permissions, context: context, linkTarget: linkTarget, device: device)
            let node = makeNode(storeID: id, document: directory.document, record: record, name: name)
            if kind == .regularFile { node.contents?.base = .empty(id) }
            texts.inheritPropertyList(&state, node, name: name, directory: directory)
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
        guard desktop.isVirtual(directory) else { return }
        switch desktop.trashPlace(directory)?.place {
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

    /// A new regular file in `parent`.
    func createFile(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, permissions: FilePermissions
    )
        throws(Errno) -> ViewNode
    {
        if parent == .root { return try createAtRoot(context, name: name, permissions: permissions) }
        guard let directory = try resolver.resolve(parent, loadingChildren: true) else {
            throw .noSuchFileOrDirectory
        }
        return try createInPackage(
            context, directory: directory, name: name, kind: .regularFile, permissions: permissions)
    }

    /// `create(2)`: a new regular file, open; its node, handle and attributes.
    func create(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, permissions: FilePermissions,
        flags: OpenFlags
    ) throws(Errno) -> (node: ViewNode, handle: UInt64, attributes: FileAttributes) {
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
        return (node, handle, attrs)
    }

    /// `mknod(2)`: the new node and its attributes.
    func mknod(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, type: FUSE.FileType,
        permissions: FilePermissions, rdev: UInt64
    ) throws(Errno) -> (ViewNode, FileAttributes) {
        guard !configuration.readOnly else { throw .readOnlyFileSystem }
        let kind: FileWrapper.Kind
        switch type {
        case .regular:
            let node = try createFile(context, parent: parent, name: name, permissions: permissions)
            return (node, state.withLock { _ in attributes(node) })
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
            guard let directory = try resolver.resolve(parent, loadingChildren: true) else {
                throw .noSuchFileOrDirectory
            }
            node = try createInPackage(
                context, directory: directory, name: name, kind: kind, permissions: permissions,
                device: device)
        }
        return (node, state.withLock { _ in attributes(node) })
    }

    /// `mkdir(2)`: the new node and its attributes.
    func mkdir(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, permissions: FilePermissions
    ) throws(Errno) -> (ViewNode, FileAttributes) {
        guard !configuration.readOnly else { throw .readOnlyFileSystem }
        let node: ViewNode
        if parent == .root, let owner = Self.trashOwner(name), owner == context.uid {
            // GIO and trash-cli make their trash folder when they do not find it: it is there.
            let trash = state.withLock { desktop.virtualFolder(&$0, .trash(uid: owner), parent: nil) }
            return (trash, state.withLock { _ in attributes(trash) })
        }
        if parent == .root {
            // A folder at the root is a new package document.
            let text = try validate(name)
            try ensureListing()
            node = try createDocument(
                context, name: name, text: text, root: DocumentRoot(kind: .directory),
                permissions: permissions)
        } else {
            guard let directory = try resolver.resolve(parent, loadingChildren: true) else {
                throw .noSuchFileOrDirectory
            }
            node = try createInPackage(
                context, directory: directory, name: name, kind: .directory, permissions: permissions)
        }
        return (node, state.withLock { _ in attributes(node) })
    }

    /// `symlink(2)`: the new node and its attributes.
    func symlink(
        _ context: RequestContext, target: [UInt8], parent: NodeID, name: FUSE.FileName
    ) throws(Errno) -> (ViewNode, FileAttributes) {
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
            guard let directory = try resolver.resolve(parent, loadingChildren: true) else {
                throw .noSuchFileOrDirectory
            }
            node = try createInPackage(
                context.umaskless, directory: directory, name: name, kind: .symbolicLink,
                permissions: FilePermissions(rawValue: 0o777), linkTarget: destination)
        }
        return (node, state.withLock { _ in attributes(node) })
    }

    /// `link(2)`: the new node and its attributes.
    func link(
        _ context: RequestContext, node: NodeID, newParent: NodeID, newName: FUSE.FileName
    ) throws(Errno) -> (ViewNode, FileAttributes) {
        guard !configuration.readOnly else { throw .readOnlyFileSystem }
        let text = try validate(newName)
        // A document is a file system of its own: a link from one into another, or into the
        // mount root (where each name is a document), is a link across file systems.
        guard newParent != .root, let directory = try resolver.resolve(newParent, loadingChildren: true)
        else {
            throw .improperLink
        }
        guard let file = try resolver.resolve(node) else { throw .improperLink }
        if desktop.isVirtual(directory) || desktop.isVirtual(file) { throw .improperLink }
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
        return (file, state.withLock { _ in attributes(file) })
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

    func remove(parent: NodeID, name: FUSE.FileName, directory: Bool) throws(Errno) {
        try checkLength(name)
        if parent == .root, Self.isReservedAtRoot(name) { throw .permissionDenied }
        if parent == .root {
            try changingRoot { () throws(Errno) in try removeAtRoot(name, directory: directory) }
            return
        }
        guard let directoryNode = try resolver.resolve(parent, loadingChildren: true) else {
            throw .noSuchFileOrDirectory
        }
        if try desktop.removeVirtual(directoryNode, name, isDirectory: directory) { return }
        if directory { try conflictCopies.ensureConflictLoaded(directoryNode) }
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
            texts.noteLeaving(&state, node, name: name, directory: directoryNode)
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
            try conflictCopies.resolveConflictEntry(conflict, directory: directory)
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
