import DocumentEngine
import Foundation
import Synchronization

extension VersionedStore {
    // MARK: Saving

    public func makeNodeIDs(count: Int) throws -> [StoreNodeID] {
        guard count > 0 else { return [] }
        let first = try write(durable: true, counted: false) { tx in try tx.reserveNodeIDs(count: count) }
        return (0..<Int64(count)).map { StoreNodeID(rawValue: first + $0) }
    }

    public func save(_ changes: DocumentChanges) throws -> SaveResult { try save(prepare(changes)) }

    /// Saves changes this store prepared, in a write transaction of their own.
    public func save(_ prepared: PreparedChanges) throws -> SaveResult {
        let work = work(of: prepared)
        var carried: [CarriedExtents] = []
        let result = try write(durable: prepared.changes.durable) { tx in
            carried = []
            return try self.save(tx, prepared.changes, event: nil, work: work, carried: &carried)
        }
        if !carried.isEmpty { pinned.withLock { files in for file in carried { files.carry(file) } } }
        return result
    }

    /// Cuts and hashes the new contents of `changes` outside any write transaction, which saves
    /// of other documents wait for: whole new files into precuts (finishing the preparations
    /// made while they were written), other updates into plans against the changes' base,
    /// whose bytes, at a saved version, never change (``ContentPlan``).
    public func prepare(_ changes: DocumentChanges) throws -> PreparedChanges {
        let precut = try precut(changes)
        let planned = changes.contents.filter { precut[$0.key] == nil && Self.isPlannable($0.value) }
        var plans: [StoreNodeID: ContentPlan] = [:]
        if !planned.isEmpty {
            let lineage = Lineage(limit: changes.base.rawValue, branch: 0)
            try backend.read { tx in
                for (id, update) in planned.sorted(by: { $0.key < $1.key }) {
                    let previous = try Self.node(tx, id, lineage: lineage)
                    guard previous?.linkOf == nil else { continue }  // the save says why not
                    let previousSize = previous?.kind == .regularFile ? previous?.size : nil
                    let writer = ContentWriter(
                        store: self, tx: tx, node: id, previousSize: previousSize, lineage: lineage,
                        branch: 0,
                        version: VersionID(rawValue: 0))
                    var sink = HashingSink(store: self, tx: tx)
                    var plan = try writer.plan(update, into: &sink)
                    plan.bytes = try sink.finish()
                    plan.written.chunks += sink.written.chunks
                    plan.written.bytes += sink.written.bytes
                    plan.basedOn = changes.base
                    plan.previousSize = previousSize
                    plans[id] = plan
                }
            }
        }
        return PreparedChanges(
            changes, work: PreparedWork(store: ObjectIdentifier(self), precut: precut, plans: plans))
    }

    /// Updates a plan can be made for ahead: those that cut new bytes. A copy cuts nothing, and
    /// one from a file as this save leaves it cannot be read before the save.
    static func isPlannable(_ update: ContentUpdate) -> Bool {
        switch update {
        case .chunks, .sparse, .replace: true
        case .derived(let lookup, _, _, _): lookup.version != nil
        case .copy: false
        }
    }

    /// What this store prepared for `prepared`; none for another store's.
    func work(of prepared: PreparedChanges) -> PreparedWork? {
        guard let work = prepared.work as? PreparedWork, work.store == ObjectIdentifier(self) else {
            return nil
        }
        return work
    }

    /// Writes `update` for the node `writer` is for: from `plan` when it still applies (the file
    /// is as it was at the plan's base), else cut, hashed and stored here.
    func write(
        _ update: ContentUpdate, with writer: ContentWriter, plan: ContentPlan?, previous: NodeRecord?,
        _ tx: any StoreTransaction
    ) throws -> ContentWriter.Outcome {
        if let plan, try plan.applies(previous: previous, tx) {
            do { return try writer.finish(plan) } catch is ContentPlan.Stale {}
        }
        return try writer.write(update)
    }

    /// One save inside a write transaction; `event` overrides the recorded event's kind;
    /// `work` holds its new contents cut and hashed before it (``prepare(_:)``). `carried` gets
    /// the files whose extents at the new version follow from those at the current one, for the
    /// reads at that version to know them once the transaction commits.
    func save(
        _ tx: any StoreTransaction, _ changes: DocumentChanges, event: StoreEvent.Kind?,
        work: PreparedWork? = nil, carried: inout [CarriedExtents]
    ) throws -> SaveResult {
        let document = try Self.fetchDocument(tx, changes.document)
        var conflict = false
        var changes = changes
        if changes.base != document.currentVersion {
            switch changes.conflictPolicy {
            case .fail:
                throw DocumentStoreError.conflict(
                    document: document.id, base: changes.base, current: document.currentVersion)
            case .keepBoth:
                conflict = true
            case .rebaseIfDisjoint:
                if let rebased = try rebased(tx, changes, document: document) {
                    changes = rebased
                } else {
                    conflict = true
                }
            }
        }
        let now = Timestamp.now
        let version = try tx.insertVersion(
            document: document.id, base: changes.base, origin: changes.origin, created: now)
        let branch: Int64 = conflict ? version.rawValue : 0
        if conflict { try tx.updateVersion(version, .conflict) }
        // The state the changes apply to: the base for a conflict, else the current version.
        let before = conflict ? Lineage(limit: changes.base.rawValue, branch: 0) : Lineage.current
        var written = (chunks: 0, bytes: Int64(0), nodes: 0)

        var records: [StoreNodeID: NodeRecord] = [:]
        for record in changes.nodes {
            guard record.document == document.id else {
                throw DocumentStoreError.invalidChange("\(record.id) belongs to another document")
            }
            records[record.id] = record
        }
        for (id, update) in changes.contents.sorted(by: { $0.key < $1.key }) {
            let previous = try Self.node(tx, id, lineage: before)
            guard var record = records[id] ?? previous else { throw DocumentStoreError.noSuchNode(id) }
            guard record.kind == .regularFile else { throw DocumentStoreError.notARegularFile(id) }
            guard record.linkOf == nil else {
                throw DocumentStoreError.invalidChange(
                    "\(id) is a hard link: its contents are those of \(record.linkOf.map { "\($0)" } ?? "")")
            }
            let writer = ContentWriter(
                store: self, tx: tx, node: id,
                previousSize: previous?.kind == .regularFile ? previous?.size : nil,
                lineage: before, branch: branch, version: version,
                precut: work?.precut[id] ?? finishedPreparation(of: update))
            let result = try write(update, with: writer, plan: work?.plans[id], previous: previous, tx)
            if !conflict, changes.base == document.currentVersion {
                carried.append(
                    CarriedExtents(
                        node: id, from: document.currentVersion, to: version, size: result.size,
                        rows: result.rows))
            }
            record.size = result.size
            written.chunks += result.chunks
            written.bytes += result.bytes
            records[id] = record
        }
        // What this save removes: the listed wrappers and their subtrees as they were before,
        // except wrappers the save keeps (moved out of a removed folder in the same save).
        var removed: [StoreNodeID: NodeRecord] = [:]
        if !changes.removedNodes.isEmpty {
            if let kept = changes.removedNodes.first(where: { records[$0] != nil }) {
                throw DocumentStoreError.invalidChange("\(kept) is both changed and removed")
            }
            // Removing files and links touches only them; the whole tree is read (to find
            // subtrees) only when a folder goes.
            var listed: [StoreNodeID: NodeRecord] = [:]
            for id in changes.removedNodes {
                if id == document.root {
                    throw DocumentStoreError.invalidChange("the document's root cannot be removed")
                }
                if let record = try Self.node(tx, id, lineage: before), record.document == document.id {
                    listed[id] = record
                }
            }
            if !listed.values.contains(where: { $0.kind == .directory }) {
                removed = listed
            } else {
                let all = try Self.nodes(tx, document: document.id, lineage: before)
                var children: [StoreNodeID: [StoreNodeID]] = [:]
                for record in all.values {
                    if let parent = record.parent { children[parent, default: []].append(record.id) }
                }
                var frontier = changes.removedNodes
                var seen: Set<StoreNodeID> = []
                while let next = frontier.popLast() {
                    guard seen.insert(next).inserted, records[next] == nil else { continue }
                    if let record = all[next] { removed[next] = record }
                    frontier += children[next] ?? []
                }
            }
        }
        try validate(tx, records: records, removed: Set(removed.keys), document: document, lineage: before)
        for record in records.values.sorted(by: { $0.id < $1.id }) {
            try tx.insertNode(StoredNode(record: record.at(version), branch: branch, removed: false))
            written.nodes += 1
        }
        for record in removed.values.sorted(by: { $0.id < $1.id }) {
            try tx.insertNode(StoredNode(record: record.at(version), branch: branch, removed: true))
            written.nodes += 1
        }
        let info = try tx.updateVersion(version, .bytesWritten(written.bytes))
        if !conflict { try tx.updateDocument(document.id, .currentVersion(version, modified: now)) }
        try tx.insertEvent(
            event ?? (conflict ? .conflict : .saved), document: document.id, version: version,
            name: document.name,
            origin: changes.origin, time: now)
        counters.withLock {
            $0.chunksWritten += written.chunks
            $0.bytesWritten += written.bytes
            $0.nodesWritten += written.nodes
        }
        return SaveResult(
            version: info, chunksWritten: written.chunks, bytesWritten: written.bytes,
            nodesWritten: written.nodes,
            rebasedOnto: !conflict && changes.base != document.currentVersion ? document.currentVersion : nil)
    }

    /// `changes` applied on top of the document's current version instead of their older base,
    /// or nil when they must be kept as a conflict: when a wrapper they touch changed since the
    /// base, or when the tree they would make is not valid (a name taken meanwhile, a parent
    /// removed). A folder whose only change here is its times (a name made or taken in it)
    /// merges: its current record with the later of each time, so two writers can add files
    /// to one folder at once.
    private func rebased(_ tx: any StoreTransaction, _ changes: DocumentChanges, document: DocumentInfo)
        throws -> DocumentChanges?
    {
        let base = Lineage(limit: changes.base.rawValue, branch: 0)
        let removed = Set(changes.removedNodes)
        var result = changes
        let touched = Set(changes.nodes.map(\.id) + changes.removedNodes + Array(changes.contents.keys))
        for id in touched.sorted() where try tx.nodeChanged(id, after: changes.base) {
            guard let index = result.nodes.firstIndex(where: { $0.id == id }), !removed.contains(id),
                changes.contents[id] == nil
            else { return nil }
            let mine = result.nodes[index]
            guard mine.kind == .directory, let before = try Self.node(tx, id, lineage: base),
                mine.sameExceptTimes(before), let current = try Self.node(tx, id, lineage: .current),
                current.kind == .directory
            else { return nil }
            result.nodes[index] = current.withLaterTimes(of: mine)
        }
        var records: [StoreNodeID: NodeRecord] = [:]
        for record in result.nodes { records[record.id] = record }
        do {
            try validate(tx, records: records, removed: removed, document: document, lineage: .current)
        } catch DocumentStoreError.invalidChange {
            return nil
        }
        return result
    }

    /// Checks that changed records form a valid tree: parents exist and are directories, names are
    /// valid and unique among siblings.
    private func validate(
        _ tx: any StoreTransaction, records: [StoreNodeID: NodeRecord], removed: Set<StoreNodeID>,
        document: DocumentInfo, lineage: Lineage
    ) throws {
        var names: [StoreNodeID: [String: StoreNodeID]] = [:]
        for record in records.values.sorted(by: { $0.id < $1.id }) {
            if record.id == document.root {
                guard record.parent == nil else {
                    throw DocumentStoreError.invalidChange("the root cannot move")
                }
                continue
            }
            if let reason = FileName.problem(with: record.name) {
                throw DocumentStoreError.invalidName(record.name, reason: reason)
            }
            guard let parentID = record.parent else {
                throw DocumentStoreError.invalidChange("\(record.id) has no parent")
            }
            guard !removed.contains(parentID),
                let parent = try records[parentID] ?? Self.node(tx, parentID, lineage: lineage),
                parent.document == document.id, parent.kind == .directory
            else {
                throw DocumentStoreError.invalidChange(
                    "the parent of \(record.name.debugDescription) is not a directory")
            }
            if record.kind == .symbolicLink && record.linkTarget == nil {
                throw DocumentStoreError.invalidChange(
                    "link \(record.name.debugDescription) has no destination")
            }
            if let target = record.linkOf {
                // A hard link names a file of this document that is not itself a link, and
                // stays of its kind.
                guard target != record.id, !removed.contains(target),
                    let file = try records[target] ?? Self.node(tx, target, lineage: lineage),
                    file.document == document.id, file.linkOf == nil, file.kind != .directory,
                    file.parent != nil
                else {
                    throw DocumentStoreError.invalidChange(
                        "hard link \(record.name.debugDescription) does not name a file of its document")
                }
                guard record.kind == file.kind else {
                    throw DocumentStoreError.invalidChange(
                        "hard link \(record.name.debugDescription) is not of its file's kind")
                }
            }
            if record.device != 0 && record.kind != .characterDevice && record.kind != .blockDevice {
                throw DocumentStoreError.invalidChange(
                    "\(record.name.debugDescription) has a device number but is not a device")
            }
            // Another live wrapper with this name in this parent?
            let named = try tx.nodesNamed(
                record.name, in: parentID, except: record.id, branch: lineage.branch, upTo: lineage.limit)
            for candidate in named where !removed.contains(candidate) {
                let current = try records[candidate] ?? Self.node(tx, candidate, lineage: lineage)
                if let current, current.parent == parentID, current.name == record.name {
                    throw DocumentStoreError.invalidChange(
                        "\(record.name.debugDescription) already exists in its directory")
                }
            }
            if names[parentID, default: [:]].updateValue(record.id, forKey: record.name) != nil {
                throw DocumentStoreError.invalidChange(
                    "two wrappers named \(record.name.debugDescription) in one directory")
            }
        }
    }

    // MARK: Versions

    public func versions(of document: DocumentID) throws -> [VersionInfo] {
        try backend.read { tx in
            _ = try Self.fetchDocument(tx, document)
            return try tx.versions(of: document)
        }
    }

    public func restore(_ version: VersionID, of document: DocumentID, origin: String) throws -> SaveResult {
        try write(durable: true) { tx in try restore(tx, version, of: document, origin: origin) }
    }

    func restore(_ tx: any StoreTransaction, _ version: VersionID, of document: DocumentID, origin: String)
        throws -> SaveResult
    {
        guard let info = try tx.version(version), info.document == document else {
            throw DocumentStoreError.noSuchVersion(version)
        }
        let doc = try Self.fetchDocument(tx, document)
        let targetLineage = try Lineage.of(tx, version)
        let target = try Self.nodes(tx, document: document, lineage: targetLineage)
        let current = try Self.nodes(tx, document: document, lineage: .current)
        var changes = DocumentChanges(document: document, base: doc.currentVersion)
        changes.origin = origin
        changes.conflictPolicy = .fail
        for (id, record) in target {
            var unchanged = record
            unchanged.version = current[id]?.version ?? unchanged.version
            if current[id] != unchanged { changes.nodes.append(record) }
            guard record.kind == .regularFile, record.linkOf == nil else { continue }
            // Only files whose extents differ change: a restore costs the change.
            if let now = current[id], now.kind == .regularFile, now.size == record.size {
                let all = 0...Int64.max
                let then = try Self.extents(tx, node: id, lineage: targetLineage, starts: all)
                if then == (try Self.extents(tx, node: id, lineage: .current, starts: all)) { continue }
            }
            changes.contents[id] = .copy(of: NodeLookup(id, at: version))
        }
        changes.removedNodes = current.keys.filter { target[$0] == nil }.sorted()
        var carried: [CarriedExtents] = []
        return try self.save(tx, changes, event: .restored, carried: &carried)
    }

    public func resolveConflict(_ version: VersionID) throws {
        try write(durable: true) { tx in try Self.resolveConflict(tx, version) }
    }

    static func resolveConflict(_ tx: any StoreTransaction, _ version: VersionID) throws {
        guard let info = try tx.version(version) else { throw DocumentStoreError.noSuchVersion(version) }
        guard info.isConflict, !info.isResolved else { return }  // FV-2: not a conflict, or resolved
        try tx.updateVersion(version, .resolved)
        let document = try Self.fetchDocument(tx, info.document)
        try tx.insertEvent(
            .resolved, document: info.document, version: version, name: document.name, origin: "resolve",
            time: .now)
    }

    public func unresolvedConflicts() throws -> [VersionInfo] {
        try backend.access { try $0.unresolvedConflicts() }
    }
}
