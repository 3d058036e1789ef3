import DocumentEngine
import FUSE
import Foundation
import SystemPackage
import Threading
import VersionedStore

extension MountRoom {
    static var controlName: FUSE.FileName { ".docfs" }
    static var versionsName: FUSE.FileName { "versions" }

    /// Runs `body`, a change of the root's documents (a create, a rename, a removal, a move to or
    /// from the Trash or a package, keeping a conflict), as in flight until it returns. Its
    /// store transaction commits before the view shows it; a root listing read in between
    /// would show the document already there (and the view would then install it twice: two
    /// states for one document, one of them behind a name the store no longer has) or already
    /// gone. ``Reconciler/refreshListing()`` applies no listing while a change is in flight, and the
    /// generation each one bumps at its end tells it that a listing it read is older.
    func changingRoot<T>(_ body: () throws(Errno) -> T) throws(Errno) -> T {
        state.withLock { $0.rootChangesInFlight += 1 }
        defer {
            state.withLock { state in
                state.rootChangesInFlight -= 1
                state.rootGeneration &+= 1
            }
        }
        return try body()
    }

    /// Reads the root listing from the store unless it was read.
    func ensureListing() throws(Errno) {
        if state.withLock({ $0.listed }) { return }
        let infos = renamingReserved(try storeCall { try store.documents() })
        let records = try storeCall { try rootRecords(of: infos) }
        let roots = infos.compactMap { info in records[info.id].map { (info, $0) } }
        let conflicts = fetchConflicts(
            roots: Dictionary(infos.map { ($0.id, $0.root) }) { first, _ in first })
        state.withLock { state in
            guard !state.listed else { return }
            for (info, record) in roots where state.documents[info.id] == nil {
                _ = install(&state, info: info, rootRecord: record)
            }
            if let conflicts {
                _ = reconcileConflicts(&state, versions: conflicts.versions, records: conflicts.records)
            }
            state.listed = true
        }
    }

    /// The root records of `infos` at their current versions, in one store call. A document
    /// whose root cannot be read is left out (and logged), not the others.
    func rootRecords(of infos: [DocumentInfo]) throws -> [DocumentID: NodeRecord] {
        guard !infos.isEmpty else { return [:] }
        let results = try store.nodes(infos.map { NodeLookup($0.root, at: $0.currentVersion) })
        var records: [DocumentID: NodeRecord] = [:]
        for (info, result) in zip(infos, results) {
            switch result {
            case .success(let record?): records[info.id] = record
            case .success(nil): continue
            case .failure(let error): logger.warning("cannot read the document \(info.name): \(error)")
            }
        }
        return records
    }

    /// A document's state and node at the root, from its listing and root record.
    func install(_ state: inout State, info: DocumentInfo, rootRecord: NodeRecord) -> DocumentState {
        let node = makeNode(
            storeID: info.root, document: info.id, record: rootRecord, name: FUSE.FileName(info.name))
        node.atMountRoot = true
        let document = DocumentState(info: info, root: node)
        state.documents[info.id] = document
        state.rootGeneration &+= 1
        state.nodes[node.ino] = node
        if let shown = state.rootEntries[node.name], let conflict = conflictEntry(&state, of: shown) {
            // A document keeps its name: a conflict entry that had it is no longer shown.
            dropConflict(&state, conflict)
        }
        if state.rootEntries[node.name] == nil { state.rootEntries[node.name] = node }
        return document
    }

    /// Reads a document's wrapper records unless they were read.
    func ensureLoaded(_ document: DocumentState) throws(Errno) {
        if state.withLock({ _ in document.isLoaded }) { return }
        let version = state.withLock { _ in document.base }
        let records = try storeCall { try store.nodes(of: document.id, at: version) }
        let countedFolders = state.withLock { state -> Bool in
            guard !document.isLoaded else { return false }
            attachTree(&state, document, records: records, version: version)
            return document.root.subdirectoryCount > 0
        }
        // Until now the root's link count was 2, its folders unknown; the kernel may hold that.
        if countedFolders { attributesChanged(document.root) }
    }

    /// Builds the node tree of a freshly read document.
    private func attachTree(
        _ state: inout State, _ document: DocumentState, records: [NodeRecord], version: VersionID
    ) {
        var byID: [StoreNodeID: ViewNode] = [document.info.root: document.root]
        var committed: [StoreNodeID: NodeRecord] = [:]
        for record in records {
            committed[record.id] = record
            if record.id == document.info.root {
                // The node at the root may already carry unsaved changes (chmod, a write).
                if document.root.persistAs == record.id && !document.dirty && !document.root.contentsModified
                {
                    document.root.record = record
                }
                continue
            }
            let node = makeNode(
                storeID: record.id, document: document.id, record: record, name: FUSE.FileName(record.name))
            byID[record.id] = node
            if record.linkOf == nil { state.nodes[node.ino] = node }
        }
        for record in records where record.id != document.info.root {
            guard let node = byID[record.id], let parentID = record.parent, let parent = byID[parentID] else {
                continue
            }
            node.parent = parent
            parent.children[node.name] = node
        }
        Self.joinLinks(records, byID)
        document.committed = committed
        document.base = version
    }

    /// The user a `.Trash-UID` name is for; nil for any other name.
    static func trashOwner(_ name: FUSE.FileName) -> UInt32? {
        let bytes = name.bytes
        let prefix = Array(".Trash-".utf8)
        guard bytes.count > prefix.count, bytes.count <= prefix.count + 10,
            Array(bytes.prefix(prefix.count)) == prefix
        else { return nil }
        let digits = bytes.dropFirst(prefix.count)
        guard digits.allSatisfy({ (0x30...0x39).contains($0) }), digits.first != 0x30 || digits.count == 1
        else {
            return nil
        }
        return UInt32(String(decoding: digits, as: UTF8.self))
    }

    /// Names at the root that are never documents: the history's and the trash folders'.
    static func isReservedAtRoot(_ name: FUSE.FileName) -> Bool {
        name == controlName || name == ".Trash" || trashOwner(name) != nil
    }

    /// The documents to show at the root: a document with one of the mount's own names (a
    /// `.Trash-0` GIO made in a mount of an older DocFS, when the Trash was not the store's) is
    /// renamed once, visibly (`Trash-0 (old)`), so its contents stay reachable; in a read-only
    /// mount it is left out.
    func renamingReserved(_ infos: [DocumentInfo]) -> [DocumentInfo] {
        var taken = Set(infos.map(\.name))
        return infos.compactMap { info in
            guard Self.isReservedAtRoot(FUSE.FileName(info.name)) else { return info }
            guard !configuration.readOnly else { return nil }
            var name = String(info.name.drop { $0 == "." }) + " (old)"
            var n = 2
            while taken.contains(name) {
                name = String(info.name.drop { $0 == "." }) + " (old \(n))"
                n += 1
            }
            do {
                let renamed = try store.renameDocument(info.id, to: name)
                taken.insert(name)
                logger.notice(
                    "\(info.name) is a name of the mount's own now: the document is renamed \(name)")
                return renamed
            } catch {
                logger.warning(
                    "\(info.name) is a name of the mount's own now, and renaming the document failed: \(error)"
                )
                return nil
            }
        }
    }
}
