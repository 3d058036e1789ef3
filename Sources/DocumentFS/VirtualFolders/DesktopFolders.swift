import DocumentEngine
import FUSE
import Foundation
import Synchronization
import SystemPackage
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// A folder the mount makes up rather than a wrapper of the store.
enum VirtualRole: Hashable {
    /// `.docfs` at the root: reachable by its path, never listed (as ZFS's `.zfs`).
    case control
    /// `.docfs/versions`: a folder per document name, live or deleted.
    case versions
    /// `.docfs/versions/NAME`: an entry per kept version of the documents of that name.
    case versionsOf(String)
    /// `.Trash-UID` at the root: the XDG trash of the user UID, which is the store's Trash.
    case trash(uid: UInt32)
    /// `.Trash-UID/files`: the Trash's items.
    case trashFiles(uid: UInt32)
    /// `.Trash-UID/info`: an `NAME.trashinfo` per item, and the files GIO writes before it trashes.
    case trashInfo(uid: UInt32)
    /// `.Trash-UID/expunged`: where GIO's trash backend moves what it empties, then deletes it.
    case trashExpunged(uid: UInt32)
}

/// A version's tree of wrappers shown read-only: one kept version in the history, or one item of
/// the Trash. Its nodes are read from the store on first use, like a conflict entry's.
final class VersionTree {
    enum Purpose: Sendable {
        case history
        case trash(TrashItem)
    }

    let document: DocumentID
    let version: VersionID
    /// The tree's top node in the store: the document's root, or a trashed wrapper.
    let top: StoreNodeID
    let purpose: Purpose
    var isLoaded = false
    /// The node of ``top``, once shown.
    weak var root: ViewNode?

    init(document: DocumentID, version: VersionID, top: StoreNodeID, purpose: Purpose) {
        self.document = document
        self.version = version
        self.top = top
        self.purpose = purpose
    }

    var trashItem: TrashItem? {
        if case .trash(let item) = purpose { return item }
        return nil
    }
}

/// The history in the mount and the Trash that is the store's.
///
/// - **History.** `MOUNT/.docfs/versions/NAME/` lists every kept version of the documents named
///   NAME, live or deleted, as `2026-11-25 14.02.11 v42.ext` (local time; ` conflict` marks a
///   conflict version): a read-only folder for a package, a file for a flat document, read
///   lazily from that version. `.docfs` answers a lookup but is not listed, so `find`, `du`,
///   `rsync` and backups of the mount do not walk the history.
/// - **Trash.** `MOUNT/.Trash-UID` (UID: the caller's) is the XDG trash GIO, file managers and
///   trash-cli use, and it is the store's Trash: a rename into `files/` deletes the document (or
///   removes the wrapper from its package) as one new version and records it; `info/` shows a
///   `.trashinfo` per item; a rename out of `files/` brings the item back as one new version; a
///   removal of an item, or its move to `expunged/`, empties it from the Trash (its history stays
///   until retention expires it). Nothing is copied, and `docfs ls --deleted` and
///   `docfs restore --undelete` see the same deleted documents.
struct DesktopFolders: MountRoom {
    let view: MountView
    let saving: SavePipeline
    let conflictCopies: ConflictCopies
}

extension DesktopFolders {

    // MARK: - Virtual folders

    func virtualRecord(_ name: String, permissions: Int, uid: UInt32, gid: UInt32) -> NodeRecord {
        NodeRecord(
            id: StoreNodeID(rawValue: -1), document: DocumentID(rawValue: 0), parent: nil, name: name,
            kind: .directory, permissions: permissions, uid: uid, gid: gid, modified: .now)
    }

    /// The virtual folder for `role`, made on first use. Its inode number is fixed for the mount.
    func virtualFolder(_ state: inout State, _ role: VirtualRole, parent: ViewNode?) -> ViewNode {
        if let known = state.virtualFolders[role] { return known }
        let base: UInt64 = 1 << 61
        let ino: UInt64
        let name: String
        var permissions = 0o555
        var owner = (uid: rootOwner.uid, gid: rootOwner.gid)
        switch role {
        case .control: (ino, name) = (base | 1, Self.controlName.string)
        case .versions: (ino, name) = (base | 2, Self.versionsName.string)
        case .versionsOf(let documentName):
            state.nextVirtualInode &+= 1
            (ino, name) = (base | 1 << 48 | state.nextVirtualInode, documentName)
        case .trash(let uid):
            (ino, name) = (base | 1 << 40 | UInt64(uid), ".Trash-\(uid)")
            (permissions, owner) = (0o700, (uid, uid))
        case .trashFiles(let uid):
            (ino, name) = (base | 2 << 40 | UInt64(uid), "files")
            (permissions, owner) = (0o700, (uid, uid))
        case .trashInfo(let uid):
            (ino, name) = (base | 3 << 40 | UInt64(uid), "info")
            (permissions, owner) = (0o700, (uid, uid))
        case .trashExpunged(let uid):
            (ino, name) = (base | 4 << 40 | UInt64(uid), "expunged")
            (permissions, owner) = (0o700, (uid, uid))
        }
        let node = ViewNode(
            role: role, ino: ino, name: FUSE.FileName(name),
            record: virtualRecord(name, permissions: permissions, uid: owner.uid, gid: owner.gid))
        node.parent = parent
        parent?.children[node.name] = node
        state.virtualFolders[role] = node
        state.nodes[ino] = node
        if case .trash(let uid) = role {
            for child in [VirtualRole.trashFiles(uid: uid), .trashInfo(uid: uid), .trashExpunged(uid: uid)] {
                _ = virtualFolder(&state, child, parent: node)
            }
        }
        if role == .control { _ = virtualFolder(&state, .versions, parent: node) }
        return node
    }

    /// The virtual folder a lookup of `name` at the root finds, for the user `uid`.
    func virtualAtRoot(_ name: FUSE.FileName, uid: UInt32) -> ViewNode? {
        if name == Self.controlName { return state.withLock { virtualFolder(&$0, .control, parent: nil) } }
        if let owner = Self.trashOwner(name), owner == uid {
            return state.withLock { virtualFolder(&$0, .trash(uid: owner), parent: nil) }
        }
        return nil
    }

    /// The virtual folder or version tree `node` is part of, if any.
    func isVirtual(_ node: ViewNode?) -> Bool {
        guard let node else { return false }
        return node.role != nil || node.tree != nil
    }

    /// Reads a virtual folder's children from the store (at every `opendir`, and at a lookup of a
    /// name it does not have), or a version tree's wrappers on first use.
    func refreshVirtual(_ node: ViewNode, force: Bool) throws(Errno) {
        if node.tree != nil {
            try ensureTreeLoaded(node)
            return
        }
        guard let role = node.role else { return }
        if !force && state.withLock({ _ in node.listed }) { return }
        switch role {
        case .control, .trash, .trashExpunged:
            break
        case .versions:
            let names = try storeCall {
                Set(try store.documents().map(\.name) + store.deletedDocuments().map(\.name))
            }
            state.withLock { state in
                for name in names where node.children[FUSE.FileName(name)] == nil {
                    let folder = virtualFolderOfVersions(&state, name, parent: node)
                    node.children[folder.name] = folder
                }
                for child in Array(node.children.values) where !names.contains(child.name.string) {
                    dropVirtualChild(&state, child, from: node)
                }
            }
        case .versionsOf(let name):
            try refreshVersions(of: name, in: node)
        case .trashFiles(let uid):
            try refreshTrash(uid: uid)
        case .trashInfo(let uid):
            try refreshTrash(uid: uid)
        }
        state.withLock { _ in node.listed = true }
    }

    /// Takes a virtual folder's child out of it: its nodes go once the kernel forgets them.
    func dropVirtualChild(_ state: inout State, _ child: ViewNode, from folder: ViewNode) {
        if folder.children[child.name] === child { folder.children[child.name] = nil }
        guard child.role == nil else { return }
        func release(_ node: ViewNode) {
            node.linked = false
            if node.openHandles == 0 && table.node(for: node.ino) == nil && state.nodes[node.ino] === node {
                state.nodes[node.ino] = nil
            }
            for grandchild in node.children.values { release(grandchild) }
        }
        release(child)
    }

    /// `.docfs/versions/NAME`, one folder per name for the mount's life.
    private func virtualFolderOfVersions(_ state: inout State, _ name: String, parent: ViewNode) -> ViewNode {
        if let known = state.virtualFolders[.versionsOf(name)] {
            known.parent = parent
            return known
        }
        let folder = virtualFolder(&state, .versionsOf(name), parent: nil)
        folder.parent = parent
        return folder
    }

    // MARK: - History

    /// The entry name of a version: its local time and id, and the document's extension.
    static func historyName(_ version: VersionInfo, documentName: String, kind: DocumentKind) -> String {
        var seconds = time_t(version.created.seconds)
        var parts = tm()
        localtime_r(&seconds, &parts)
        var buffer = [CChar](repeating: 0, count: 64)
        let count = strftime(&buffer, buffer.count, "%Y-%m-%d %H.%M.%S", &parts)
        let time = String(decoding: buffer.prefix(count).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        var name = "\(time) v\(version.id.rawValue)"
        if version.isConflict { name += " conflict" }
        if let dot = documentName.lastIndex(of: "."), dot != documentName.startIndex,
            documentName.index(after: dot) != documentName.endIndex, documentName[dot...].utf8.count <= 32
        {
            name += documentName[dot...]
        }
        return name
    }

    private func refreshVersions(of name: String, in folder: ViewNode) throws(Errno) {
        let (documents, versions, roots) = try storeCall {
            () throws -> ([DocumentInfo], [DocumentID: [VersionInfo]], [NodeLookup: NodeRecord]) in
            let documents = try (store.documents() + store.deletedDocuments()).filter { $0.name == name }
            var versions: [DocumentID: [VersionInfo]] = [:]
            var lookups: [NodeLookup] = []
            for document in documents {
                let kept = try store.versions(of: document.id)
                versions[document.id] = kept
                lookups += kept.map { NodeLookup(document.root, at: $0.id) }
            }
            var roots: [NodeLookup: NodeRecord] = [:]
            for (lookup, result) in zip(lookups, try store.nodes(lookups)) {
                if case .success(let record?) = result { roots[lookup] = record }
            }
            return (documents, versions, roots)
        }
        state.withLock { state in
            var wanted: [FUSE.FileName: (DocumentInfo, VersionInfo, NodeRecord)] = [:]
            for document in documents {
                for version in versions[document.id] ?? [] {
                    guard let root = roots[NodeLookup(document.root, at: version.id)] else { continue }
                    let entry = FUSE.FileName(
                        Self.historyName(version, documentName: name, kind: document.kind))
                    wanted[entry] = (document, version, root)
                }
            }
            for child in Array(folder.children.values) where wanted[child.name] == nil {
                dropVirtualChild(&state, child, from: folder)
            }
            for (entry, (document, version, root)) in wanted where folder.children[entry] == nil {
                let tree = VersionTree(
                    document: document.id, version: version.id, top: root.id, purpose: .history)
                let node = makeTreeNode(&state, tree, record: root, name: entry)
                node.parent = folder
                folder.children[entry] = node
            }
        }
    }

    /// A tree node's inode number: deterministic, in a range of its own per purpose.
    func treeInode(_ state: inout State, _ tree: VersionTree, node: StoreNodeID) -> UInt64 {
        let v = UInt64(bitPattern: tree.version.rawValue)
        let n = UInt64(bitPattern: node.rawValue)
        let mark: UInt64
        switch tree.purpose {
        case .history: mark = 1 << 63
        case .trash: mark = 1 << 63 | 1 << 62
        }
        if v < 1 << 30, n < 1 << 32 { return mark | v << 32 | n }
        state.nextVirtualInode &+= 1
        return 1 << 61 | 1 << 56 | state.nextVirtualInode
    }

    /// A read-only node of `tree` for `record`.
    func makeTreeNode(_ state: inout State, _ tree: VersionTree, record: NodeRecord, name: FUSE.FileName)
        -> ViewNode
    {
        var shown = record
        shown.permissions &= ~0o222
        let ino = treeInode(&state, tree, node: record.id)
        let node = ViewNode(
            storeID: record.id, document: nil, name: name, record: shown, conflict: (tree.version, ino))
        node.tree = tree
        if record.kind == .regularFile {
            node.contents = FileContents(
                base: ContentBase(node: record.id, version: record.version, size: record.size),
                spill: spillFiles)
        }
        if record.id == tree.top { tree.root = node }
        state.nodes[ino] = node
        return node
    }

    /// Reads a history or Trash tree's wrappers unless they were read.
    func ensureTreeLoaded(_ node: ViewNode) throws(Errno) {
        guard let tree = state.withLock({ _ in node.tree }), !state.withLock({ _ in tree.isLoaded }) else {
            return
        }
        let stored = try conflictCopies.storedTree(of: tree.document, at: tree.version, root: tree.top)
        state.withLock { state in
            guard !tree.isLoaded, let root = tree.root else { return }
            tree.isLoaded = true
            var byID: [StoreNodeID: ViewNode] = [tree.top: root]
            for record in stored.records where record.id != tree.top {
                byID[record.id] = makeTreeNode(&state, tree, record: record, name: FUSE.FileName(record.name))
            }
            for record in stored.records where record.id != tree.top {
                guard let node = byID[record.id], let parent = record.parent.flatMap({ byID[$0] }) else {
                    continue
                }
                node.parent = parent
                parent.children[node.name] = node
            }
            Self.joinLinks(stored.records, byID)
        }
    }

    // MARK: - Trash

    /// Shows the store's Trash in `files/` and `info/` of every trash folder of the mount.
    func refreshTrash(uid: UInt32) throws(Errno) {
        // Each item is read at the version it was trashed from (a deleted document's, its
        // last): not at its record's own version, which is older when the record did not
        // change in the last saves (a hard link's bytes, a folder's files, did).
        let (items, roots) = try storeCall { () throws -> ([TrashItem], [String: (NodeRecord, VersionID)]) in
            let items = try store.trash()
            var lookups: [NodeLookup] = []
            for item in items {
                if let node = item.node {
                    lookups.append(NodeLookup(node, at: item.version))
                } else {
                    let document = try store.document(item.document)
                    lookups.append(NodeLookup(document.root, at: document.currentVersion))
                }
            }
            var roots: [String: (NodeRecord, VersionID)] = [:]
            for ((item, lookup), result) in zip(zip(items, lookups), try store.nodes(lookups)) {
                if case .success(let record?) = result {
                    roots[item.name] = (record, lookup.version ?? record.version)
                }
            }
            return (items, roots)
        }
        state.withLock { state in
            let trash = virtualFolder(&state, .trash(uid: uid), parent: nil)
            let files = virtualFolder(&state, .trashFiles(uid: uid), parent: trash)
            let info = virtualFolder(&state, .trashInfo(uid: uid), parent: trash)
            var wanted: [FUSE.FileName: (TrashItem, (record: NodeRecord, version: VersionID))] = [:]
            for item in items {
                if let root = roots[item.name] { wanted[FUSE.FileName(item.name)] = (item, root) }
            }
            for child in Array(files.children.values) {
                if let (item, _) = wanted[child.name], child.tree?.trashItem == item { continue }
                dropVirtualChild(&state, child, from: files)
            }
            for (name, (item, root)) in wanted where files.children[name] == nil {
                let tree = VersionTree(
                    document: item.document, version: root.version, top: root.record.id, purpose: .trash(item)
                )
                var record = root.record
                record.version = root.version
                let node = makeTreeNode(&state, tree, record: record, name: name)
                node.parent = files
                files.children[name] = node
            }
            // info/: an entry per item, beside the files trash tools write there themselves.
            for child in Array(info.children.values) where child.tree != nil {
                dropVirtualChild(&state, child, from: info)
            }
            for (_, (item, _)) in wanted {
                let name = FUSE.FileName(item.name + ".trashinfo")
                if let scratch = info.children[name], scratch.tree == nil {
                    dropVirtualChild(&state, scratch, from: info)
                }
                info.children[name] = makeInfoNode(&state, item, uid: uid)
            }
            files.listed = true
            info.listed = true
        }
    }

    /// `NAME.trashinfo` for an item, as the XDG trash specification has it.
    static func trashInfo(_ item: TrashItem) -> Data {
        var allowed = CharacterSet.alphanumerics.intersection(
            CharacterSet(charactersIn: Unicode.Scalar(0)..<Unicode.Scalar(128)))
        allowed.insert(charactersIn: "-._~/")
        let path =
            item.originalPath.addingPercentEncoding(withAllowedCharacters: allowed) ?? item.originalPath
        var seconds = time_t(item.deleted.seconds)
        var parts = tm()
        localtime_r(&seconds, &parts)
        var buffer = [CChar](repeating: 0, count: 64)
        let count = strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%S", &parts)
        let date = String(decoding: buffer.prefix(count).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return Data("[Trash Info]\nPath=\(path)\nDeletionDate=\(date)\n".utf8)
    }

    private func makeInfoNode(_ state: inout State, _ item: TrashItem, uid: UInt32) -> ViewNode {
        let text = Self.trashInfo(item)
        let tree = VersionTree(
            document: item.document, version: item.version ?? VersionID(rawValue: 0),
            top: StoreNodeID(rawValue: -2), purpose: .trash(item))
        let record = NodeRecord(
            id: StoreNodeID(rawValue: -2), document: DocumentID(rawValue: 0), parent: nil,
            name: item.name + ".trashinfo", kind: .regularFile, permissions: 0o400, uid: uid, gid: uid,
            modified: item.deleted, size: Int64(text.count))
        state.nextVirtualInode &+= 1
        let ino = 1 << 61 | 1 << 52 | state.nextVirtualInode
        let node = ViewNode(
            storeID: record.id, document: nil, name: FUSE.FileName(record.name), record: record,
            conflict: (tree.version, ino))
        node.tree = tree
        node.contents = FileContents(
            base: ContentBase(node: record.id, version: nil, size: Int64(text.count), bytes: text),
            spill: spillFiles)
        state.nodes[ino] = node
        return node
    }

    /// The trash a node is in, and where: nil outside every trash folder.
    enum TrashPlace {
        case root, files, info, expunged
        /// In an item's tree (`files/NAME/…`), or something moved to `expunged/`.
        case inside
    }

    func trashPlace(_ node: ViewNode?) -> (uid: UInt32, place: TrashPlace)? {
        var current = node
        var depth = 0
        while let n = current {
            switch n.role {
            case .trash(let uid): return (uid, depth == 0 ? .root : .inside)
            case .trashFiles(let uid): return (uid, depth == 0 ? .files : .inside)
            case .trashInfo(let uid): return (uid, depth == 0 ? .info : .inside)
            case .trashExpunged(let uid): return (uid, depth == 0 ? .expunged : .inside)
            default: break
            }
            current = n.parent
            depth += 1
        }
        return nil
    }

    /// Moves the document or wrapper `node` (named `name` in `from`, nil: the root) to the Trash
    /// as `trashName`: one new version without it, and a record of where it was.
    func moveToTrash(_ node: ViewNode, from: ViewNode?, uid: UInt32, as trashName: FUSE.FileName)
        throws(Errno)
    {
        let (document, isRoot) = try state.withLock { state throws(Errno) -> (DocumentState, Bool) in
            guard let document = self.document(&state, of: node), node.conflict == nil, node.tree == nil,
                isPersisted(node), !isHidden(document.root, of: document)
            else {
                // Scratch files and conflict entries are nowhere in the store to be trashed from.
                throw .improperLink
            }
            return (document, node === document.root)
        }
        let files = state.withLock { virtualFolder(&$0, .trashFiles(uid: uid), parent: nil) }
        if state.withLock({ _ in files.children[trashName] != nil }) { throw .fileExists }
        let now = Timestamp.now
        if isRoot {
            // Its unsaved changes, the deletion and the Trash's record of it: one transaction.
            try saving.save(document, durable: false, wholeFiles: true) { tx in
                try tx.deleteDocument(document.id, origin: self.origin)
                var record = try tx.trashRecord(location: self.store.location)
                record.names[document.id.rawValue] = trashName.string
                record.emptied.remove(document.id.rawValue)
                try tx.setTrashRecord(record)
            }
            let notices = state.withLock { state -> [Notice] in
                document.dirty = false
                if state.rootEntries[document.root.name] === document.root { detach(&state, document.root) }
                state.documents[document.id] = nil
                state.rootGeneration &+= 1
                state.rootChanged = .now
                files.listed = false
                return [.inode(mountRootInode)]
            }
            send(notices)
        } else {
            // The package's unsaved changes first, as the earlier calls' own transaction: the
            // item is the wrapper as they left it (its bytes, a hard link it is), at a version
            // that has it.
            try saving.save(document, durable: false, wholeFiles: true)
            let (version, path, top) = try state.withLock {
                state throws(Errno) -> (VersionID, String, StoreNodeID) in
                guard node.linked, document.committed?[node.persistAs] != nil else {
                    throw .noSuchFileOrDirectory
                }
                var parts: [String] = []
                var current: ViewNode? = node
                while let n = current, !n.atMountRoot {
                    parts.append(n.name.string)
                    current = n.parent
                }
                parts.append(document.info.name)
                let top = node.persistAs
                unlinkName(&state, node)
                return (document.base, parts.reversed().joined(separator: "/"), top)
            }
            let item = TrashItem(
                name: trashName.string, document: document.id, node: top, version: version,
                originalPath: path,
                deleted: now)
            // The version without the wrapper and the Trash's record of it: one transaction.
            try saving.save(document, durable: false) { tx in
                var record = try tx.trashRecord(location: self.store.location)
                record.wrappers.removeAll { $0.name == item.name }
                record.wrappers.append(item)
                try tx.setTrashRecord(record)
            }
            state.withLock { _ in files.listed = false }
        }
        try refreshTrash(uid: uid)
        // The kernel moved the dentry into files/ with the wrapper's inode, which keeps showing
        // the wrapper (descriptors open on it read it still); the item is another node, with a
        // type and size of its own, which the kernel finds once it looks the name up again.
        // Had the old inode stood for the item instead, the kernel would have taken the
        // item's attributes for the old inode's and failed its next read (EIO).
        send([.entry(parent: files.ino, name: trashName)])
    }

    /// Brings the Trash item `item` (its tree's root `shown`) back as `newName` in `to` (nil: the
    /// root), as one new version.
    func restoreFromTrash(
        _ shown: ViewNode, item: TrashItem, to: ViewNode?, as newName: FUSE.FileName, _ newText: String,
        flags: RenameFlags
    ) throws(Errno) {
        if let to, to.role != nil || to.tree != nil || to.conflict != nil { throw .improperLink }
        let forget: (any DocumentStoreTransaction) throws -> Void = { tx in
            var record = try tx.trashRecord(location: self.store.location)
            record.wrappers.removeAll { $0.name == item.name }
            if item.isDocument {
                record.names[item.document.rawValue] = nil
                // A deleted document whose copy came back stays deleted, and out of the Trash.
                record.emptied.insert(item.document.rawValue)
            }
            try tx.setTrashRecord(record)
        }
        let afterward: (inout State) -> Void = { state in
            if let parent = shown.parent { self.dropVirtualChild(&state, shown, from: parent) }
        }
        if item.isDocument, to == nil {
            try ensureListing()
            let taken = state.withLock { state in
                state.rootEntries[newName] != nil
                    || state.documents.values.contains { $0.info.name == newText }
            }
            if taken { throw .fileExists }
            let (info, root) = try storeCall { () throws -> (DocumentInfo, NodeRecord?) in
                try store.transaction(durable: false) { tx in
                    let info = try tx.undeleteDocument(item.document, as: newText)
                    var record = try tx.trashRecord(location: store.location)
                    record.names[item.document.rawValue] = nil
                    record.emptied.remove(item.document.rawValue)
                    try tx.setTrashRecord(record)
                    return (info, try tx.node(info.root))
                }
            }
            guard let root else { throw .ioError }
            let notices = state.withLock { state -> [Notice] in
                afterward(&state)
                let document = install(&state, info: info, rootRecord: root)
                document.namesUnsynced = true
                standIn(&state, shown.ino, for: document.root)
                state.rootChanged = .now
                return [.entry(parent: mountRootInode, name: newName), .inode(mountRootInode)]
            }
            send(notices)
            return
        }
        let tree = try conflictCopies.storedTree(
            of: item.document, at: shown.tree?.version ?? item.version ?? VersionID(rawValue: 0),
            root: shown.storeID)
        if let to {
            try conflictCopies.copy(
                tree, into: to, as: newName, newText, flags: flags, shownAs: shown.ino, inTransaction: forget,
                afterward: afterward)
        } else {
            try ensureListing()
            let replaced = state.withLock { state in
                state.rootEntries[newName].flatMap { self.document(&state, of: $0) }
            }
            if replaced != nil, flags.contains(.noReplace) { throw .fileExists }
            try conflictCopies.copyAsDocument(
                tree, as: newName, newText, replacing: replaced, shownAs: shown.ino, inTransaction: forget,
                afterward: afterward)
        }
    }

    /// Drops `item` from the Trash (GIO's and trash-cli's "empty"): its history stays until
    /// retention expires it.
    func emptyTrashItem(_ item: TrashItem) throws(Errno) {
        try storeCall {
            try store.transaction(durable: false) { tx in
                var record = try tx.trashRecord(location: store.location)
                record.wrappers.removeAll { $0.name == item.name }
                if item.isDocument {
                    record.names[item.document.rawValue] = nil
                    record.emptied.insert(item.document.rawValue)
                }
                try tx.setTrashRecord(record)
            }
        }
    }

    // MARK: - Requests on virtual folders

    /// `rename(2)` where either side is virtual; false when neither is.
    func renameVirtual(
        _ from: ViewNode?, _ name: FUSE.FileName, _ to: ViewNode?, _ newName: FUSE.FileName,
        _ newText: String,
        flags: RenameFlags
    ) throws(Errno) -> Bool {
        let source = trashPlace(from)
        let target = trashPlace(to)
        guard isVirtual(from) || isVirtual(to) else { return false }
        if flags.contains(.exchange) { throw .improperLink }
        switch (source?.place, target?.place) {
        case (nil, .files?):
            // Into the Trash.
            guard let uid = target?.uid, !isVirtual(from) else { throw .improperLink }
            let node = try state.withLock { state throws(Errno) -> ViewNode in
                guard let node = from.map({ $0.children[name] }) ?? state.rootEntries[name] else {
                    throw .noSuchFileOrDirectory
                }
                return node
            }
            try moveToTrash(node, from: from, uid: uid, as: newName)
        case (.files?, nil):
            // Out of the Trash: restore.
            guard !isVirtual(to) else { throw .improperLink }
            let shown = try state.withLock { _ throws(Errno) -> ViewNode in
                guard let shown = from?.children[name] else { throw .noSuchFileOrDirectory }
                return shown
            }
            guard let item = shown.tree?.trashItem else { throw .noSuchFileOrDirectory }
            try restoreFromTrash(shown, item: item, to: to, as: newName, newText, flags: flags)
        case (.files?, .expunged?):
            // GIO's trash backend empties an item by moving it here, then deleting it.
            let shown = try state.withLock { _ throws(Errno) -> ViewNode in
                guard let shown = from?.children[name] else { throw .noSuchFileOrDirectory }
                return shown
            }
            if let item = shown.tree?.trashItem { try emptyTrashItem(item) }
            state.withLock { _ in
                from?.children[name] = nil
                shown.name = newName
                shown.parent = to
                to?.children[newName] = shown
            }
        case (.info?, .info?), (.expunged?, .expunged?):
            // Files trash tools write (GIO's info file, by a rename of a temporary one).
            try state.withLock { _ throws(Errno) in
                guard let node = from?.children[name] else { throw .noSuchFileOrDirectory }
                guard node.tree == nil || source?.place == .expunged else { throw .permissionDenied }
                if let replaced = to?.children[newName] {
                    guard replaced.tree == nil else { throw .fileExists }
                    replaced.linked = false
                }
                from?.children[name] = nil
                node.name = newName
                node.parent = to
                to?.children[newName] = node
            }
        default:
            // The history, and the Trash's other parts, do not change.
            if from?.tree.map({ if case .history = $0.purpose { true } else { false } }) == true
                || to?.tree.map({ if case .history = $0.purpose { true } else { false } }) == true
                || from?.role.map(Self.isHistoryRole) == true || to?.role.map(Self.isHistoryRole) == true
            {
                throw .readOnlyFileSystem
            }
            throw .permissionDenied
        }
        return true
    }

    static func isHistoryRole(_ role: VirtualRole) -> Bool {
        switch role {
        case .control, .versions, .versionsOf: return true
        default: return false
        }
    }

    /// `unlink`/`rmdir` in a virtual folder; false when `directory` is not one.
    func removeVirtual(_ directory: ViewNode, _ name: FUSE.FileName, isDirectory: Bool) throws(Errno) -> Bool
    {
        guard isVirtual(directory) else { return false }
        guard let (_, place) = trashPlace(directory) else { throw .readOnlyFileSystem }
        let node = try state.withLock { _ throws(Errno) -> ViewNode in
            guard let node = directory.children[name] else { throw .noSuchFileOrDirectory }
            if isDirectory && node.kind != .directory { throw .notDirectory }
            if !isDirectory && node.kind == .directory { throw .isDirectory }
            return node
        }
        if isDirectory, node.tree != nil { try ensureTreeLoaded(node) }
        switch place {
        case .root:
            throw .permissionDenied
        case .files:
            // Emptying one item (rm -r of it, trash-cli's trash-empty).
            try state.withLock { _ throws(Errno) in
                if isDirectory && !node.children.isEmpty { throw .directoryNotEmpty }
            }
            if let item = node.tree?.trashItem { try emptyTrashItem(item) }
            state.withLock { state in dropVirtualChild(&state, node, from: directory) }
        case .info, .expunged, .inside:
            // A file a tool wrote, or something being emptied: gone from the mount. An item's
            // own info file goes with the item, not before.
            try state.withLock { state throws(Errno) in
                if isDirectory && !node.children.isEmpty { throw .directoryNotEmpty }
                if place == .info, node.tree != nil { return }
                dropVirtualChild(&state, node, from: directory)
            }
        }
        return true
    }
}
