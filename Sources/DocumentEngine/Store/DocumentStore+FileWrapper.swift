import Foundation

#if canImport(Glibc)
    import Glibc
#endif

// The bridge between file wrappers and a document store. Reading builds the tree from metadata
// only; saving diffs the tree against the stored one so that only what changed is written.

extension DocumentStore {
    /// The wrapper tree of `document` at `version` (its current version when nil), built from the
    /// store's records without reading any contents.
    ///
    /// Regular files read their bytes lazily from the store, pinned to the version read, so later
    /// saves do not change what the tree shows. Keys are the stored names, `filename` is the key,
    /// and `preferredFilename` is the stored preferred name (or the key). Every wrapper remembers
    /// the store node it came from, so ``save(_:to:base:origin:conflictPolicy:)`` writes only what
    /// changed. The root's key and filename are the document's name.
    public func fileWrapper(for document: DocumentID, at version: VersionID? = nil) throws -> FileWrapper {
        let info = try self.document(document)
        let pinned: VersionID
        if let version {
            guard try versions(of: document).contains(where: { $0.id == version }) else {
                throw DocumentStoreError.noSuchVersion(version)
            }
            pinned = version
        } else {
            pinned = info.currentVersion
        }
        let tree = try StoredTree(
            records: nodes(of: document, at: pinned), root: info.root, location: location)
        let storeID = ObjectIdentifier(self)
        let wrapper = try tree.makeWrapper { record in
            (
                StoreContentsSource(store: self, node: record.id, version: pinned, count: record.size),
                FileWrapper.StoreOrigin(store: storeID, node: record.id, version: pinned)
            )
        }
        wrapper.state.withLock {
            $0.storedTree = CachedStoredTree(store: storeID, document: document, version: pinned, tree: tree)
        }
        return wrapper
    }

    /// Saves `wrapper` as the new tree of `document`, writing only what differs from the stored
    /// tree at `base`, as one version.
    ///
    /// A wrapper read from this store (``fileWrapper(for:at:)``) keeps its node; one whose
    /// metadata and contents are unchanged writes nothing. A changed name, parent, preferred name
    /// or attribute writes one record; changed contents write only the chunks that differ. A new
    /// wrapper takes the node of a removed wrapper at the same place when their kinds allow it,
    /// otherwise a fresh node. Stored wrappers missing from the tree are removed. The root must be
    /// a directory for a package document and a regular file for a flat one.
    ///
    /// After a save that did not conflict, the tree's wrappers refer to the new version, and
    /// regular files read their (unchanged) bytes from the store.
    @discardableResult
    public func save(
        _ wrapper: FileWrapper, to document: DocumentID, base: VersionID, origin: String,
        conflictPolicy: ConflictPolicy = .keepBoth
    ) throws -> SaveResult {
        let info = try self.document(document)
        // The records at `base` as this wrapper last read or saved them (a version never changes),
        // or read now: a package of many wrappers is not read again for every save.
        let storeID = ObjectIdentifier(self)
        let stored: StoredTree
        if let cached = wrapper.state.withLock({ $0.storedTree }), cached.store == storeID,
            cached.document == document, cached.version == base
        {
            stored = cached.tree
        } else {
            stored = try StoredTree(
                records: nodes(of: document, at: base), root: info.root, location: location)
        }
        let items = try WrapperSnapshot.walk(wrapper)
        // A flat document's root may be a file, a link or a special file; never a folder.
        guard (items[0].kind == .directory) == (info.kind == .package) else {
            throw DocumentStoreError.invalidChange(
                "the root of \(info.name.debugDescription) must \(info.kind == .package ? "" : "not ")be a directory wrapper"
            )
        }
        var plan = SavePlan(store: self, stored: stored, items: items)
        try plan.assignNodes(root: info.root)

        var changes = DocumentChanges(document: document, base: base)
        changes.origin = origin
        changes.conflictPolicy = conflictPolicy
        let now = Timestamp.now
        let umask = POSIX.currentUmask()
        var conflictVersions: Set<VersionID>?
        // The kind each kept node has after the save, for hard links to the files they name.
        var keptKinds: [StoreNodeID: FileWrapper.Kind] = [:]
        for (index, item) in items.enumerated() {
            if let id = plan.assigned[index] { keptKinds[id] = item.kind }
        }
        for (index, item) in items.enumerated() {
            guard let id = plan.assigned[index] else { continue }
            let previous = stored.records[id]
            var record = try item.record(
                id: id, document: document,
                parent: item.parent.flatMap { plan.assigned[$0] },
                name: id == info.root ? (previous?.name ?? info.name) : item.key,
                previous: previous, now: now, umask: umask)
            let unchangedContents = try item.source.map { source in
                guard let previous, previous.kind == .regularFile else { return false }
                return try plan.holdsStoredContents(
                    source, of: previous, base: base, conflicts: &conflictVersions)
            }
            if let previous, let file = previous.linkOf {
                // A hard link reads as a wrapper of its own. Left as it was, it stays a link; once
                // its wrapper differs, or its file is gone, it becomes a file of its own with the
                // same bytes (a wrapper tree has no shared files).
                record.linkOf = file
                if record == previous, unchangedContents ?? true, keptKinds[file] == previous.kind {
                    continue
                }
                record.linkOf = nil
                record.changed = now
                changes.nodes.append(record)
                if item.kind == .regularFile {
                    changes.contents[id] =
                        unchangedContents == true
                        ? .copy(of: NodeLookup(id, at: base))
                        : item.source.map { .replace($0) } ?? .chunks(size: 0, [:])
                }
                continue
            }
            if record != previous {
                record.changed = now
                changes.nodes.append(record)
            }
            guard let source = item.source else { continue }
            if unchangedContents == true { continue }
            if let stored = source as? StoreContentsSource, stored.store === self, stored.count >= 0 {
                // Bytes this store holds (a copied or moved wrapper) are shared, not read back
                // and written again, and the save never reads its own store meanwhile.
                changes.contents[id] = .copy(of: NodeLookup(stored.node, at: stored.version))
            } else {
                changes.contents[id] = .replace(source)
            }
        }
        let claimed = Set(plan.assigned.compactMap { $0 })
        changes.removedNodes = stored.records.keys.filter { !claimed.contains($0) }.sorted()

        let result = try save(changes)
        if !result.isConflict {
            plan.adopt(
                version: result.version.id, savedRecords: changes.nodes, onlySaved: result.rebasedOnto != nil)
        }
        // The new version's records are the old ones with this save's changes, unless the store
        // applied it on top of another process's version (rebase), or a link reads as its file
        // (a record the save did not send may read differently).
        let next: CachedStoredTree? =
            !result.isConflict && result.rebasedOnto == nil && !stored.hasLinks
                && !changes.nodes.contains(where: { $0.linkOf != nil })
            ? CachedStoredTree(
                store: storeID, document: document, version: result.version.id,
                tree: stored.applying(changes, version: result.version.id))
            : nil
        wrapper.state.withLock { $0.storedTree = next }
        return result
    }
}

/// A version's stored tree kept with the root wrapper it was read as (or saved from).
struct CachedStoredTree: Sendable {
    var store: ObjectIdentifier
    var document: DocumentID
    var version: VersionID
    var tree: StoredTree
}

/// A document's records at one version, indexed for building and diffing trees.
struct StoredTree: Sendable {
    private(set) var records: [StoreNodeID: NodeRecord]
    let root: StoreNodeID
    /// Children of each directory by name.
    private(set) var children: [StoreNodeID: [String: StoreNodeID]]

    /// Some record is another name of a file (reads as that file).
    var hasLinks: Bool { records.values.contains { $0.linkOf != nil } }

    /// The tree after `changes` were saved as `version`: what the store reads at that version
    /// when nothing else was saved in between. Costs the size of the change.
    func applying(_ changes: DocumentChanges, version: VersionID) -> StoredTree {
        var tree = self
        for id in changes.removedNodes {
            guard let old = tree.records.removeValue(forKey: id) else { continue }
            if let parent = old.parent, tree.children[parent]?[old.name] == id {
                tree.children[parent]?[old.name] = nil
            }
        }
        for var record in changes.nodes {
            record.version = version
            if let old = tree.records[record.id], let parent = old.parent,
                tree.children[parent]?[old.name] == record.id
            {
                tree.children[parent]?[old.name] = nil
            }
            tree.records[record.id] = record
            if let parent = record.parent { tree.children[parent, default: [:]][record.name] = record.id }
        }
        return tree
    }

    init(records list: [NodeRecord], root: StoreNodeID, location: String) throws {
        var records: [StoreNodeID: NodeRecord] = [:]
        var children: [StoreNodeID: [String: StoreNodeID]] = [:]
        for record in list {
            records[record.id] = record
            guard let parent = record.parent else { continue }
            if children[parent, default: [:]].updateValue(record.id, forKey: record.name) != nil {
                throw DocumentStoreError.corrupt(
                    path: location,
                    reason: "two wrappers named \(record.name.debugDescription) in one directory")
            }
        }
        guard records[root] != nil else {
            throw DocumentStoreError.corrupt(path: location, reason: "the document's root wrapper is missing")
        }
        self.records = records
        self.root = root
        self.children = children
    }

    /// Builds the wrappers reachable from the root. `regular` gives a regular file's source and
    /// every wrapper's origin.
    func makeWrapper(
        _ regular: (NodeRecord) -> (any ContentsSource, FileWrapper.StoreOrigin?)
    ) throws -> FileWrapper {
        guard let rootRecord = records[root] else {
            throw DocumentStoreError.noSuchNode(root)
        }
        return try makeWrapper(rootRecord, regular, depth: 0)
    }

    private func makeWrapper(
        _ record: NodeRecord, _ regular: (NodeRecord) -> (any ContentsSource, FileWrapper.StoreOrigin?),
        depth: Int
    ) throws -> FileWrapper {
        // Parent links come from the store; a damaged store must not recurse forever.
        guard depth < 4096 else {
            throw DocumentStoreError.corrupt(path: "", reason: "wrappers nest more than 4096 levels deep")
        }
        let (source, origin) = regular(record)
        let storage: FileWrapper.Storage
        var children: [String: FileWrapper] = [:]
        switch record.kind {
        case .regularFile:
            storage = .regular(FileWrapper.Regular(source: source, loaded: nil))
        case .symbolicLink:
            storage = .link(FileWrapper.Link(destination: record.linkTarget ?? "", origin: nil))
        case .directory:
            for (name, id) in self.children[record.id] ?? [:] {
                guard let child = records[id] else { continue }
                children[name] = try makeWrapper(child, regular, depth: depth + 1)
            }
            storage = .directory(FileWrapper.Directory(children: children, origin: nil))
        case .fifo, .socket, .characterDevice, .blockDevice:
            storage = .special(record.kind, device: record.device)
        }
        var attributes = FileWrapper.Attributes(
            permissions: record.permissions & 0o7777, modificationDate: record.modified.date,
            creationDate: record.created.date, ownerID: Int(record.uid), groupID: Int(record.gid))
        attributes.extendedAttributes = record.extendedAttributes
        let wrapper = FileWrapper(storage: storage, attributes: attributes)
        wrapper.state.withLock {
            $0.filename = record.name
            $0.preferredFilename = record.preferredName ?? record.name
            $0.storeOrigin = origin
        }
        for child in children.values {
            child.state.withLock {
                $0.parents[ObjectIdentifier(wrapper)] = FileWrapper.WeakParent(wrapper: wrapper)
            }
        }
        return wrapper
    }
}

/// One occurrence of a wrapper in a tree being saved, read under its lock.
struct WrapperSnapshot {
    let wrapper: FileWrapper
    let key: String
    /// Index of the parent's occurrence; nil for the root.
    let parent: Int?
    let kind: FileWrapper.Kind
    let attributes: FileWrapper.Attributes
    let preferredFilename: String?
    let origin: FileWrapper.StoreOrigin?
    /// A regular file's contents and the generation they were read at.
    let source: (any ContentsSource)?
    let generation: UInt64
    let linkTarget: String?
    /// A device's number.
    let device: UInt64

    /// The tree in pre-order (parents before children, siblings by key). A wrapper that appears
    /// in several directories appears once per place.
    static func walk(_ root: FileWrapper) throws -> [WrapperSnapshot] {
        var items: [WrapperSnapshot] = []
        var pending: [(FileWrapper, String, Int?)] = [
            (root, root.filename ?? root.preferredFilename ?? "", nil)
        ]
        while let (wrapper, key, parent) = pending.popLast() {
            let index = items.count
            let item = try WrapperSnapshot(wrapper, key: key, parent: parent)
            items.append(item)
            if item.kind == .directory {
                let children = try wrapper.children()
                // Reversed so that popping visits siblings in key order.
                for (childKey, child) in children.sorted(by: { $0.key > $1.key }) {
                    if let reason = FileName.problem(with: childKey) {
                        throw DocumentStoreError.invalidName(childKey, reason: reason)
                    }
                    pending.append((child, childKey, index))
                }
            }
        }
        return items
    }

    init(_ wrapper: FileWrapper, key: String, parent: Int?) throws {
        self.wrapper = wrapper
        self.key = key
        self.parent = parent
        let state = wrapper.state.withLock { $0 }
        kind = state.storage.kind
        attributes = state.attributes
        preferredFilename = state.preferredFilename
        origin = state.storeOrigin
        if case .regular(let regular) = state.storage {
            // A loaded copy holds the same bytes as its source (sources are immutable).
            source = regular.source
            generation = regular.generation
        } else {
            source = nil
            generation = 0
        }
        linkTarget = kind == .symbolicLink ? try wrapper.symbolicLinkDestination() : nil
        if case .special(_, let number) = state.storage { device = number } else { device = 0 }
    }

    /// The record this occurrence should have. Unchanged attributes keep the stored values
    /// exactly (a `Date` cannot hold every nanosecond timestamp), so an unchanged wrapper yields
    /// a record equal to `previous`.
    func record(
        id: StoreNodeID, document: DocumentID, parent: StoreNodeID?, name: String, previous: NodeRecord?,
        now: Timestamp, umask: mode_t
    ) throws -> NodeRecord {
        func exact(_ date: Date?, _ stored: Timestamp?) -> Timestamp? {
            guard let date else { return nil }
            if let stored, stored.date == date { return stored }
            return Timestamp(date)
        }
        let modified = exact(attributes.modificationDate, previous?.modified) ?? now
        // New permissions are treated as a write to disk treats them (W-3): less the umask, so
        // that a new wrapper's 0o666 does not become a world-writable file on export.
        var permissions = attributes.permissions & 0o7777
        if permissions != previous?.permissions { permissions &= ~Int(umask) }
        return NodeRecord(
            id: id, document: document, parent: parent, name: name,
            preferredName: preferredFilename == name ? nil : preferredFilename, kind: kind,
            permissions: permissions,
            uid: attributes.ownerID.flatMap(UInt32.init(exactly:)) ?? previous?.uid ?? UInt32(geteuid()),
            gid: attributes.groupID.flatMap(UInt32.init(exactly:)) ?? previous?.gid ?? UInt32(getegid()),
            modified: modified, changed: previous?.changed ?? now, accessed: previous?.accessed ?? modified,
            created: exact(attributes.creationDate, previous?.created) ?? previous?.created ?? now,
            size: source?.count ?? 0, linkTarget: linkTarget, device: device,
            extendedAttributes: attributes.extendedAttributes.filter { $0.key.hasPrefix("user.") },
            version: previous?.version ?? VersionID(rawValue: 0))
    }
}

/// Which store node each wrapper occurrence saves to, and the bookkeeping after the save.
struct SavePlan {
    let store: any DocumentStore
    let stored: StoredTree
    let items: [WrapperSnapshot]
    /// The node of each occurrence.
    var assigned: [StoreNodeID?]
    /// Whether the occurrence is the wrapper's first in the tree (later ones are copies).
    var firstOccurrence: [Bool]

    init(store: any DocumentStore, stored: StoredTree, items: [WrapperSnapshot]) {
        self.store = store
        self.stored = stored
        self.items = items
        assigned = Array(repeating: nil, count: items.count)
        firstOccurrence = Array(repeating: true, count: items.count)
    }

    /// A node may change kind in place unless it was a regular file: its chunk rows would stay
    /// behind a node that is no longer a file.
    static func canReuse(_ previous: FileWrapper.Kind, as kind: FileWrapper.Kind) -> Bool {
        previous == kind || previous != .regularFile
    }

    mutating func assignNodes(root: StoreNodeID) throws {
        let storeID = ObjectIdentifier(store)
        var claimed: Set<StoreNodeID> = [root]
        assigned[0] = root
        // First the wrappers that came from this store, wherever they are now (moves keep nodes).
        for index in items.indices.dropFirst() {
            guard let origin = items[index].origin, origin.store == storeID,
                let previous = stored.records[origin.node],
                Self.canReuse(previous.kind, as: items[index].kind),
                claimed.insert(origin.node).inserted
            else { continue }
            assigned[index] = origin.node
        }
        // Then new wrappers take the node left at their place, so a replaced file is one changed
        // record and only its changed chunks.
        var fresh: [Int] = []
        for index in items.indices.dropFirst() where assigned[index] == nil {
            if let parent = items[index].parent, let parentID = assigned[parent],
                let candidate = stored.children[parentID]?[items[index].key],
                let previous = stored.records[candidate], Self.canReuse(previous.kind, as: items[index].kind),
                claimed.insert(candidate).inserted
            {
                assigned[index] = candidate
            } else {
                fresh.append(index)
            }
        }
        if !fresh.isEmpty {
            let ids = try store.makeNodeIDs(count: fresh.count)
            for (index, id) in zip(fresh, ids) { assigned[index] = id }
        }
        var seen: Set<ObjectIdentifier> = []
        for index in items.indices {
            firstOccurrence[index] = seen.insert(ObjectIdentifier(items[index].wrapper)).inserted
        }
    }

    /// Whether `source` is this store's contents of `previous`'s node as they are at `base`.
    func holdsStoredContents(
        _ source: any ContentsSource, of previous: NodeRecord, base: VersionID,
        conflicts: inout Set<VersionID>?
    ) throws -> Bool {
        guard let source = source as? StoreContentsSource, source.store === store, source.node == previous.id,
            source.count == previous.size, let version = source.version
        else { return false }
        if version == base { return true }
        // An older main-line version shows the same bytes if the record (rewritten with every
        // content change) has not changed since.
        guard version < base, previous.version <= version else { return false }
        if conflicts == nil {
            conflicts = Set(try store.versions(of: previous.document).filter(\.isConflict).map(\.id))
        }
        return conflicts?.contains(version) == false
    }

    /// Points the saved wrappers at `version`: their origin, their contents (read from the
    /// store from now on, unless they changed meanwhile) and the dates the store assigned.
    /// `onlySaved`: the save was applied on top of another process's version, whose other
    /// wrappers may differ from this tree's, so only the wrappers this save wrote are pointed at
    /// it (the rest keep reading what they read).
    func adopt(version: VersionID, savedRecords: [NodeRecord], onlySaved: Bool) {
        let storeID = ObjectIdentifier(store)
        var saved: [StoreNodeID: NodeRecord] = [:]
        for record in savedRecords { saved[record.id] = record }
        for (index, item) in items.enumerated() where firstOccurrence[index] {
            guard let id = assigned[index] else { continue }
            if onlySaved && saved[id] == nil { continue }
            let record = saved[id] ?? stored.records[id]
            let storeSource = item.source.map {
                StoreContentsSource(store: store, node: id, version: version, count: $0.count)
            }
            item.wrapper.state.withLock { s in
                s.storeOrigin = FileWrapper.StoreOrigin(store: storeID, node: id, version: version)
                if s.attributes.modificationDate == nil, let record {
                    s.attributes.modificationDate = record.modified.date
                }
                if let storeSource, case .regular(var regular) = s.storage,
                    regular.generation == item.generation
                {
                    regular.source = storeSource
                    regular.generation &+= 1
                    s.storage = .regular(regular)
                }
            }
        }
    }
}
