import DocumentEngine
import FUSE
import Foundation
import Synchronization
import SystemPackage
import VersionedStore

/// Conflict entries opened, removed, kept and copied (the entries themselves are part of the
/// root's view, ``ViewState/conflicts``).
struct ConflictCopies: MountRoom {
    let view: MountView
    let texts: PropertyListTexts
    let reconciler: Reconciler
    let saving: SavePipeline
}

extension ConflictCopies {
    /// Reads a conflict version's wrapper records unless they were read.
    func ensureConflictLoaded(_ node: ViewNode) throws(Errno) {
        guard let entry = state.withLock({ conflictEntry(&$0, of: node) }),
            !state.withLock({ _ in entry.isLoaded })
        else { return }
        let records = try storeCall { try store.nodes(of: entry.version.document, at: entry.version.id) }
        state.withLock { state in
            guard !entry.isLoaded else { return }
            entry.isLoaded = true
            let rootID = entry.root.storeID
            var byID: [StoreNodeID: ViewNode] = [rootID: entry.root]
            for record in records where record.id != rootID {
                byID[record.id] = makeConflictNode(
                    &state, version: entry.version.id, record: record, name: FUSE.FileName(record.name))
            }
            for record in records where record.id != rootID {
                guard let node = byID[record.id], let parent = record.parent.flatMap({ byID[$0] }) else {
                    continue
                }
                node.parent = parent
                parent.children[node.name] = node
            }
        }
    }

    /// Fails with `EACCES` for a node of a conflict version: nothing in it can change.
    func refuseConflict(_ node: ViewNode?) throws(Errno) {
        if node?.conflict != nil { throw .permissionDenied }
    }

    /// `unlink`/`rmdir` of a conflict entry: resolves the conflict (the current version stays).
    func resolveConflictEntry(_ entry: ConflictEntry, directory: Bool) throws(Errno) {
        if directory {
            try ensureConflictLoaded(entry.root)
            try state.withLock { _ throws(Errno) in
                if !entry.root.children.isEmpty { throw .directoryNotEmpty }
            }
        }
        try storeCall { try store.resolveConflict(entry.version.id) }
        state.withLock { state in
            dropConflict(&state, entry)
            state.rootChanged = .now
        }
    }

    /// Adds `records`, a tree as it was at `version`, to `changes` as new wrappers of the
    /// changes' document under `newIDs`: the tree's root (`root`) named `name` in `parent`, and
    /// regular files sharing the bytes they had, nothing copied.
    static func addCopies(
        of records: [NodeRecord], at version: VersionID, newIDs: [StoreNodeID: StoreNodeID],
        root: StoreNodeID,
        parent: StoreNodeID?, name: String, to changes: inout DocumentChanges
    ) {
        for var record in records {
            let old = record.id
            record.id = newIDs[old] ?? old
            record.document = changes.document
            record.parent = old == root ? parent : record.parent.flatMap { newIDs[$0] }
            record.linkOf = record.linkOf.flatMap { newIDs[$0] }
            if old == root {
                record.name = name
                record.preferredName = nil
            }
            changes.nodes.append(record)
            if record.kind == .regularFile && record.linkOf == nil {
                changes.contents[record.id] = .copy(of: NodeLookup(old, at: version))
            }
        }
    }

    /// A rename of a conflict entry to another name: keep both. The conflict version becomes a new
    /// document of that name (replacing `replaced`), sharing its chunks, and the conflict is
    /// resolved, in one store transaction.
    func copyConflict(
        _ entry: ConflictEntry, as newName: FUSE.FileName, _ newText: String,
        replacing replaced: DocumentState?
    ) throws(Errno) {
        let version = entry.version.id
        let tree = try storedTree(of: entry.version.document, at: version, root: nil)
        try copyAsDocument(
            tree, as: newName, newText, replacing: replaced, shownAs: entry.root.ino,
            inTransaction: { tx in try tx.resolveConflict(version) },
            afterward: { state in self.dropConflict(&state, entry) })
    }

    /// A conflict entry moved into a package: the conflict version's tree becomes wrappers of the
    /// package under `newName` (sharing its chunks), and the conflict is resolved, in one store
    /// transaction, as a move of anything else would be.
    func copyConflict(
        _ entry: ConflictEntry, into directory: ViewNode, as newName: FUSE.FileName, _ newText: String,
        flags: RenameFlags
    ) throws(Errno) {
        let version = entry.version.id
        let tree = try storedTree(of: entry.version.document, at: version, root: nil)
        try copy(
            tree, into: directory, as: newName, newText, flags: flags, shownAs: entry.root.ino,
            inTransaction: { tx in try tx.resolveConflict(version) },
            afterward: { state in self.dropConflict(&state, entry) })
    }

    /// A tree of wrappers as a version of a document stored it: `root`'s subtree, or the whole
    /// document.
    struct StoredTree {
        var version: VersionID
        var records: [NodeRecord]
        var root: NodeRecord
    }

    /// Reads the subtree of `root` (the document's root when nil) at `version`.
    func storedTree(of document: DocumentID, at version: VersionID, root: StoreNodeID?) throws(Errno)
        -> StoredTree
    {
        let all = try storeCall { try store.nodes(of: document, at: version) }
        guard let top = all.first(where: { root == nil ? $0.parent == nil : $0.id == root }) else {
            throw .noSuchFileOrDirectory
        }
        guard root != nil else { return StoredTree(version: version, records: all, root: top) }
        var children: [StoreNodeID: [NodeRecord]] = [:]
        for record in all { if let parent = record.parent { children[parent, default: []].append(record) } }
        var records: [NodeRecord] = []
        var pending = [top]
        while let record = pending.popLast() {
            records.append(record)
            pending += children[record.id] ?? []
        }
        // A link to a file outside the subtree reads as that file: it becomes a file of its own.
        let inside = Set(records.map(\.id))
        let byID = Dictionary(all.map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
        records = records.map { record in
            guard let target = record.linkOf, !inside.contains(target), let file = byID[target] else {
                return record
            }
            var own = file
            own.id = record.id
            own.parent = record.parent
            own.name = record.name
            own.linkOf = nil
            return own
        }
        return StoredTree(version: version, records: records, root: top)
    }

    /// Makes `tree` a new document named `newName` at the root (replacing `replaced`), sharing its
    /// chunks, in one store transaction with `inTransaction`; `afterward` runs under the lock once
    /// the mount shows it. The kernel's inode `shownAs` stands for the new document until the
    /// kernel asks again (its dentry moved there).
    func copyAsDocument(
        _ tree: StoredTree, as newName: FUSE.FileName, _ newText: String, replacing replaced: DocumentState?,
        shownAs: UInt64, inTransaction: @escaping (any DocumentStoreTransaction) throws -> Void,
        afterward: (inout State) -> Void
    ) throws(Errno) {
        let records = tree.records
        let root = tree.root
        let ids = try newStoreIDs(count: records.count - 1)
        var newIDs: [StoreNodeID: StoreNodeID] = [:]
        for (record, id) in zip(records.filter { $0.id != root.id }, ids) { newIDs[record.id] = id }
        let (info, saved) = try storeCall {
            try store.transaction(durable: false) { tx -> (DocumentInfo, SaveResult) in
                if let replaced { try tx.deleteDocument(replaced.id, origin: origin) }
                let info: DocumentInfo
                var changes: DocumentChanges
                var rootRecord = root
                rootRecord.parent = nil
                (info, changes) = try createDocument(tx, like: rootRecord, named: newText)
                newIDs[root.id] = info.root
                Self.addCopies(
                    of: records, at: tree.version, newIDs: newIDs, root: root.id, parent: nil, name: newText,
                    to: &changes)
                let saved = try tx.save(changes)
                try inTransaction(tx)
                return (info, saved)
            }
        }
        var rootRecord = root
        rootRecord.id = info.root
        rootRecord.document = info.id
        rootRecord.parent = nil
        rootRecord.name = newText
        rootRecord.version = saved.version.id
        var current = info
        current.currentVersion = saved.version.id
        let notices = state.withLock { state -> [Notice] in
            if let replaced {
                if state.rootEntries[replaced.root.name] === replaced.root { detach(&state, replaced.root) }
                state.documents[replaced.id] = nil
            }
            afterward(&state)
            let document = install(&state, info: current, rootRecord: rootRecord)
            standIn(&state, shownAs, for: document.root)
            state.rootChanged = .now
            return [.entry(parent: mountRootInode, name: newName), .inode(mountRootInode)]
        }
        send(notices)
    }

    /// Makes `tree` wrappers of the package folder `directory` under `newName` (sharing its
    /// chunks), as a move of anything else there would be, in one store transaction with
    /// `inTransaction`; `afterward` runs under the lock once the mount shows them. The kernel's
    /// inode `shownAs` stands for the new wrapper until the kernel asks again.
    func copy(
        _ tree: StoredTree, into directory: ViewNode, as newName: FUSE.FileName, _ newText: String,
        flags: RenameFlags, shownAs: UInt64,
        inTransaction: @escaping (any DocumentStoreTransaction) throws -> Void,
        afterward: (inout State) -> Void
    ) throws(Errno) {
        guard let destination = state.withLock({ document(&$0, of: directory) }) else {
            throw .noSuchFileOrDirectory
        }
        try ensureLoaded(destination)
        let records = tree.records
        let root = tree.root
        let ids = try newStoreIDs(count: records.count)
        var newIDs: [StoreNodeID: StoreNodeID] = [:]
        for (record, id) in zip(records, ids) { newIDs[record.id] = id }
        destination.saving.lock()
        defer { destination.saving.unlock() }
        // The package's unsaved changes are saved first, as the earlier calls' own transaction,
        // so that the copy is the only change its transaction makes: again while other writers
        // change the package in between (a busy package answers EBUSY after many tries).
        var attempts = 0
        var planned: DocumentChanges?
        while planned == nil {
            if attempts == 50 { throw .resourceBusy }
            attempts += 1
            texts.compileTexts(of: destination)
            try saving.saveLocked(destination, durable: false, wholeFiles: true)
            planned = try planCopy()
        }
        guard let changes = planned else { throw .resourceBusy }
        func planCopy() throws(Errno) -> DocumentChanges? {
            try state.withLock { state throws(Errno) -> DocumentChanges? in
                guard directory.kind == .directory, directory.linked else { throw .noSuchFileOrDirectory }
                guard !destination.dirty else { return nil }
                let target = directory.children[newName]
                if flags.contains(.noReplace) && target != nil { throw .fileExists }
                if let target { try checkReplaceable(target, by: root.kind) }
                try checkNoEquivalent(newText, in: directory.children, except: target)
                var changes = replacing(target, in: destination)
                if var record = destination.committed?[directory.persistAs] {
                    record.modified = .now
                    record.changed = record.modified
                    changes.nodes.append(record)
                }
                Self.addCopies(
                    of: records, at: tree.version, newIDs: newIDs, root: root.id, parent: directory.persistAs,
                    name: newText,
                    to: &changes)
                return changes
            }
        }
        let saved = try storeCall {
            try store.transaction(durable: false) { tx -> SaveResult in
                let saved = try tx.saveOnTop(changes)
                try inTransaction(tx)
                return saved
            }
        }
        let notices = state.withLock { state -> [Notice] in
            if let target = directory.children[newName] { unlinkName(&state, target) }
            var nodes: [StoreNodeID: ViewNode] = [:]
            var shown: [NodeRecord] = []
            for var record in changes.nodes {
                record.version = saved.version.id
                destination.committed?[record.id] = record
                if record.id == directory.persistAs { directory.record = record }
                guard records.contains(where: { newIDs[$0.id] == record.id }) else { continue }
                let node = makeNode(
                    storeID: record.id, document: destination.id, record: record,
                    name: FUSE.FileName(record.name))
                nodes[record.id] = node
                shown.append(record)
                if record.linkOf == nil { state.nodes[node.ino] = node }
            }
            for record in shown {
                guard let node = nodes[record.id] else { continue }
                let parent =
                    record.parent == directory.persistAs ? directory : record.parent.flatMap { nodes[$0] }
                node.parent = parent
                parent?.children[node.name] = node
            }
            Self.joinLinks(shown, nodes)
            destination.base = saved.version.id
            afterward(&state)
            state.rootChanged = .now
            if let moved = newIDs[root.id].flatMap({ nodes[$0] }) { standIn(&state, shownAs, for: moved) }
            return [
                .entry(parent: directory.ino, name: newName), .inode(directory.ino), .inode(mountRootInode),
            ]
        }
        send(notices)
    }

    /// A rename of a conflict entry onto its document's name: the conflict version becomes the
    /// current one, and the conflict is resolved.
    func keepConflict(_ entry: ConflictEntry, as document: DocumentState) throws(Errno) {
        try ensureLoaded(document)
        texts.compileTexts(of: document)
        document.saving.lock()
        defer { document.saving.unlock() }
        // The mount's own unsaved changes go into the history first, so nothing is lost: they,
        // the restore and the resolution are one transaction.
        let version = entry.version.id
        try saving.saveLocked(document, durable: false, wholeFiles: true) { tx in
            _ = try tx.restore(version, of: document.id, origin: self.origin)
            try tx.resolveConflict(version)
        }
        try reconciler.reloadLocked(document, force: true)
        let notices = state.withLock { state -> [Notice] in
            dropConflict(&state, entry)
            // The kernel moved the entry's dentry onto the document's name: until it asks again,
            // the entry's inode stands for the document.
            standIn(&state, entry.root.ino, for: document.root)
            state.rootChanged = .now
            return [.entry(parent: mountRootInode, name: document.root.name), .inode(mountRootInode)]
        }
        send(notices)
    }
}
