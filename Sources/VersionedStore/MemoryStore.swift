import DocumentEngine
import Foundation
import Synchronization
import Threading

/// A document store in memory: the versioned-store algorithm over plain Swift tables. Nothing
/// survives the process. For tests and tools that need a store but not a database.
public final class MemoryStore: VersionedDocumentStore, Sendable {
    public let versionedStore: VersionedStore

    /// An empty store named `location` (for messages).
    public init(location: String = "memory", chunkSize: Int = VersionedStore.defaultChunkSize) {
        versionedStore = VersionedStore(backend: MemoryBackend(location: location, chunkSize: chunkSize))
    }
}

/// The tables of a ``MemoryStore``. Values all the way down, so a read takes a copy as its
/// snapshot and a write publishes its copy only when it succeeds (atomic, rolled back on error).
struct MemoryTables: Sendable {
    struct ExtentEntry: Sendable {
        var branch: Int64
        var version: Int64
        var extent: Extent?
    }
    struct StoredEvent: Sendable {
        var event: StoreEvent
        var time: Timestamp
    }

    var nextNode: Int64 = 1
    var settings: [String: String] = [:]
    var documents: [DocumentID: DocumentInfo] = [:]
    var nextDocument: Int64 = 1
    var versions: [VersionID: VersionInfo] = [:]
    var nextVersion: Int64 = 1
    /// Every row of each wrapper.
    var nodes: [StoreNodeID: [StoredNode]] = [:]
    var nodesOfDocument: [DocumentID: Set<StoreNodeID>] = [:]
    /// Every extent row, by wrapper and start.
    var extents: [StoreNodeID: [Int64: [ExtentEntry]]] = [:]
    var chunks: [Int64: (hash: Data, data: Data)] = [:]
    var chunksByHash: [Data: Int64] = [:]
    var nextChunk: Int64 = 1
    var events: [StoredEvent] = []
    var nextSequence: Int64 = 1
}

final class MemoryBackend: StoreBackend {
    let location: String
    let chunkSize: Int
    private let tables = Mutex(MemoryTables())
    /// Writers take turns, as on a database's write lock.
    private let writer = OrderedLock(.storeWriter)

    init(location: String, chunkSize: Int) {
        self.location = location
        self.chunkSize = chunkSize
    }

    func read<T>(_ body: (any StoreTransaction) throws -> T) throws -> T {
        try body(MemoryTransaction(tables: tables.withLock { $0 }))
    }

    func access<T>(_ body: (any StoreTransaction) throws -> T) throws -> T { try read(body) }

    func write<T>(durable: Bool, _ body: (any StoreTransaction) throws -> T) throws -> T {
        writer.lock()
        defer { writer.unlock() }
        let transaction = MemoryTransaction(tables: tables.withLock { $0 })
        let result = try body(transaction)
        let published = transaction.tables
        tables.withLock { $0 = published }
        return result
    }

    func synchronize() throws {}

    private let lockTables = Locked(.storeWriter, LockTables())
    private let bell = LockBell()

    func lockTransaction<T>(timeout: Duration?, _ body: (any LockTransaction) throws -> T) throws -> T {
        let (result, released) = try lockTables.withLock { tables in
            let transaction = LockTablesTransaction(tables)
            let result = try body(transaction)
            tables = transaction.tables
            return (result, transaction.released)
        }
        if released { bell.ring() }
        return result
    }

    var lockGeneration: UInt64 { bell.current }

    func waitForLockRelease(after generation: UInt64, timeout: Duration) -> UInt64 {
        bell.wait(after: generation, timeout: timeout)
    }
}

/// One transaction over a copy of the tables.
final class MemoryTransaction: StoreTransaction {
    var tables: MemoryTables

    init(tables: MemoryTables) { self.tables = tables }

    func reserveNodeIDs(count: Int) throws -> Int64 {
        defer { tables.nextNode += Int64(count) }
        return tables.nextNode
    }

    func setting(_ key: String) throws -> String? { tables.settings[key] }
    func setSetting(_ key: String, _ value: String) throws { tables.settings[key] = value }

    // MARK: Documents

    func document(_ id: DocumentID) throws -> DocumentInfo? { tables.documents[id] }

    func documents(deleted: Bool) throws -> [DocumentInfo] {
        let matching = tables.documents.values.filter { ($0.deleted != nil) == deleted }
        if deleted {
            return matching.sorted {
                ($0.deleted ?? Timestamp(rawValue: 0), $0.id) < ($1.deleted ?? Timestamp(rawValue: 0), $1.id)
            }
        }
        return matching.sorted { Array($0.name.utf8).lexicographicallyPrecedes(Array($1.name.utf8)) }
    }

    func liveDocument(named name: String) throws -> DocumentInfo? {
        // Names compare bytewise, as in the databases.
        tables.documents.values.first { $0.deleted == nil && Array($0.name.utf8) == Array(name.utf8) }
    }

    func insertDocument(name: String, type: String, kind: DocumentKind, root: StoreNodeID, created: Timestamp)
        throws -> DocumentID
    {
        let id = DocumentID(rawValue: tables.nextDocument)
        tables.nextDocument += 1
        tables.documents[id] = DocumentInfo(
            id: id, name: name, type: type, kind: kind, root: root, currentVersion: VersionID(rawValue: 0),
            created: created, modified: created)
        return id
    }

    func updateDocument(_ id: DocumentID, _ update: DocumentUpdate) throws {
        guard var document = tables.documents[id] else {
            throw DocumentStoreError.noSuchDocument(id.description)
        }
        switch update {
        case .rename(let name, let modified):
            document.name = name
            document.modified = modified
        case .currentVersion(let version, let modified):
            document.currentVersion = version
            document.modified = modified
        case .deleted(let time): document.deleted = time
        case .undeleted(let name):
            document.deleted = nil
            document.name = name
        }
        tables.documents[id] = document
    }

    func removeDocument(_ id: DocumentID) throws {
        for node in tables.nodesOfDocument[id] ?? [] {
            tables.nodes[node] = nil
            tables.extents[node] = nil
        }
        tables.nodesOfDocument[id] = nil
        tables.versions = tables.versions.filter { $0.value.document != id }
        tables.documents[id] = nil
    }

    // MARK: Versions

    func insertVersion(document: DocumentID, base: VersionID?, origin: String, created: Timestamp) throws
        -> VersionID
    {
        let id = VersionID(rawValue: tables.nextVersion)
        tables.nextVersion += 1
        tables.versions[id] = VersionInfo(
            id: id, document: document, base: base, created: created, origin: origin, isConflict: false,
            isResolved: false, bytesWritten: 0)
        return id
    }

    func version(_ id: VersionID) throws -> VersionInfo? { tables.versions[id] }

    func versions(of document: DocumentID) throws -> [VersionInfo] {
        tables.versions.values.filter { $0.document == document }.sorted { $0.id < $1.id }
    }

    func updateVersion(_ id: VersionID, _ update: VersionUpdate) throws -> VersionInfo {
        guard var version = tables.versions[id] else { throw DocumentStoreError.noSuchVersion(id) }
        switch update {
        case .conflict: version.isConflict = true
        case .resolved: version.isResolved = true
        case .bytesWritten(let bytes): version.bytesWritten = bytes
        }
        tables.versions[id] = version
        return version
    }

    func unresolvedConflicts() throws -> [VersionInfo] {
        tables.versions.values.filter {
            $0.isConflict && !$0.isResolved && tables.documents[$0.document]?.deleted == nil
                && tables.documents[$0.document] != nil
        }
        .sorted { $0.id < $1.id }
    }

    func removeVersions(_ ids: [VersionID]) throws {
        for id in ids { tables.versions[id] = nil }
    }

    // MARK: Wrapper rows

    private func newest(_ rows: [StoredNode], branch: Int64, upTo limit: Int64) -> StoredNode? {
        rows.filter { $0.branch == branch && $0.record.version.rawValue <= limit }
            .max { $0.record.version < $1.record.version }
    }

    func latestNodes(of document: DocumentID, branch: Int64, upTo limit: Int64) throws -> [StoredNode] {
        (tables.nodesOfDocument[document] ?? []).sorted().compactMap { node in
            newest(tables.nodes[node] ?? [], branch: branch, upTo: limit).flatMap {
                $0.record.document == document ? $0 : nil
            }
        }
    }

    func latestNode(_ node: StoreNodeID, branch: Int64, upTo limit: Int64) throws -> StoredNode? {
        newest(tables.nodes[node] ?? [], branch: branch, upTo: limit)
    }

    func nodeChanged(_ node: StoreNodeID, after version: VersionID) throws -> Bool {
        (tables.nodes[node] ?? []).contains { $0.branch == 0 && $0.record.version > version }
    }

    func nodesNamed(
        _ name: String, in parent: StoreNodeID, except: StoreNodeID, branch: Int64, upTo limit: Int64
    )
        throws -> [StoreNodeID]
    {
        let named = tables.nodes.filter { node, rows in
            guard node != except else { return false }
            let onBranch = branch == 0 ? [] : rows.filter { $0.branch == branch }
            let scope =
                onBranch.isEmpty
                ? rows.filter { $0.branch == 0 && $0.record.version.rawValue <= limit } : onBranch
            guard let state = scope.max(by: { $0.record.version < $1.record.version }) else { return false }
            return !state.removed && state.record.parent == parent && state.record.name == name
        }
        return named.keys.sorted()
    }

    func insertNode(_ row: StoredNode) throws {
        var rows = tables.nodes[row.record.id] ?? []
        rows.removeAll { $0.branch == row.branch && $0.record.version == row.record.version }
        rows.append(row)
        tables.nodes[row.record.id] = rows
        tables.nodesOfDocument[row.record.document, default: []].insert(row.record.id)
    }

    func nodeRowKeys(of document: DocumentID) throws -> [(key: NodeRowKey, removed: Bool)] {
        (tables.nodesOfDocument[document] ?? []).flatMap { node in
            (tables.nodes[node] ?? []).filter { $0.record.document == document }.map {
                (NodeRowKey(node: node, branch: $0.branch, version: $0.record.version), $0.removed)
            }
        }
    }

    func removeNodeRows(_ keys: [NodeRowKey]) throws {
        for key in keys {
            tables.nodes[key.node]?.removeAll { $0.branch == key.branch && $0.record.version == key.version }
        }
    }

    func removeBranch(_ branch: Int64) throws {
        for node in tables.nodes.keys { tables.nodes[node]?.removeAll { $0.branch == branch } }
        for node in tables.extents.keys {
            for index in tables.extents[node]?.keys.map({ $0 }) ?? [] {
                tables.extents[node]?[index]?.removeAll { $0.branch == branch }
            }
        }
    }

    // MARK: Extents

    func extents(_ node: StoreNodeID, branch: Int64, upTo limit: Int64, starts: ClosedRange<Int64>) throws
        -> [Int64: Extent?]
    {
        var map: [Int64: Extent?] = [:]
        for (start, entries) in tables.extents[node] ?? [:] where starts.contains(start) {
            if let newest = entries.filter({ $0.branch == branch && $0.version <= limit }).max(by: {
                $0.version < $1.version
            }) {
                map[start] = .some(newest.extent)
            }
        }
        return map
    }

    func insertExtents(
        _ node: StoreNodeID, branch: Int64, version: VersionID, _ rows: [(start: Int64, extent: Extent?)]
    ) throws {
        for (start, extent) in rows {
            var entries = tables.extents[node]?[start] ?? []
            entries.removeAll { $0.branch == branch && $0.version == version.rawValue }
            entries.append(
                MemoryTables.ExtentEntry(branch: branch, version: version.rawValue, extent: extent))
            tables.extents[node, default: [:]][start] = entries
        }
    }

    func extentRowKeys(of document: DocumentID) throws -> [(key: ExtentRowKey, hasChunk: Bool)] {
        (tables.nodesOfDocument[document] ?? []).flatMap { node in
            (tables.extents[node] ?? [:]).flatMap { start, entries in
                entries.filter { $0.branch == 0 }.map {
                    (
                        ExtentRowKey(
                            node: node, branch: 0, start: start, version: VersionID(rawValue: $0.version)),
                        $0.extent != nil
                    )
                }
            }
        }
    }

    func removeExtentRows(_ keys: [ExtentRowKey]) throws {
        for key in keys {
            tables.extents[key.node]?[key.start]?.removeAll {
                $0.branch == key.branch && $0.version == key.version.rawValue
            }
        }
    }

    // MARK: Chunks

    func chunkID(hash: Data) throws -> Int64? { tables.chunksByHash[hash] }

    func insertChunk(hash: Data, data: Data, offset: Int64) throws -> Int64 {
        let id = tables.nextChunk
        tables.nextChunk += 1
        tables.chunks[id] = (hash, data)
        tables.chunksByHash[hash] = id
        return id
    }

    func chunks(_ ids: [Int64]) throws -> [Int64: Data] {
        var result: [Int64: Data] = [:]
        for id in ids { if let chunk = tables.chunks[id] { result[id] = chunk.data } }
        return result
    }

    func chunkLength(_ id: Int64) throws -> Int64? { tables.chunks[id].map { Int64($0.data.count) } }

    func removeUnreferencedChunks() throws -> (count: Int, bytes: Int64) {
        var referenced: Set<Int64> = []
        for map in tables.extents.values {
            for entries in map.values {
                for entry in entries { if let chunk = entry.extent?.chunk { referenced.insert(chunk) } }
            }
        }
        var freed = (count: 0, bytes: Int64(0))
        for (id, chunk) in tables.chunks where !referenced.contains(id) {
            tables.chunks[id] = nil
            tables.chunksByHash[chunk.hash] = nil
            freed.count += 1
            freed.bytes += Int64(chunk.data.count)
        }
        return freed
    }

    func forEachChunk(_ body: (Result<ChunkRow, any Error>) throws -> Void) throws {
        for (id, chunk) in tables.chunks.sorted(by: { $0.key < $1.key }) {
            try body(
                .success(ChunkRow(id: id, hash: chunk.hash, size: Int64(chunk.data.count), data: chunk.data)))
        }
    }

    // MARK: Events

    func insertEvent(
        _ kind: StoreEvent.Kind, document: DocumentID, version: VersionID?, name: String, origin: String,
        time: Timestamp
    ) throws {
        let event = StoreEvent(
            sequence: tables.nextSequence, kind: kind, document: document, version: version, name: name,
            origin: origin)
        tables.nextSequence += 1
        tables.events.append(MemoryTables.StoredEvent(event: event, time: time))
    }

    func events(after sequence: Int64) throws -> [StoreEvent] {
        tables.events.map(\.event).filter { $0.sequence > sequence }
    }

    func latestEventSequence() throws -> Int64 { tables.events.last?.event.sequence ?? 0 }

    func removeEvents(before time: Timestamp) throws { tables.events.removeAll { $0.time < time } }

    // MARK: Integrity

    func danglingReferences(_ kind: DanglingReference) throws -> [Int64] {
        switch kind {
        case .staleCurrentExtents:
            return []  // no copy of the current extents to disagree
        case .missingChunk:
            var missing: Set<Int64> = []
            for map in tables.extents.values {
                for entries in map.values {
                    for entry in entries {
                        if let chunk = entry.extent?.chunk, tables.chunks[chunk] == nil {
                            missing.insert(chunk)
                        }
                    }
                }
            }
            return missing.sorted()
        case .nodeWithoutDocument:
            return Set(tables.nodes.values.flatMap { $0.map(\.record.document) }).filter {
                tables.documents[$0] == nil
            }
            .map(\.rawValue).sorted()
        case .versionWithoutDocument:
            return Set(tables.versions.values.map(\.document)).filter { tables.documents[$0] == nil }.map(
                \.rawValue
            )
            .sorted()
        case .missingCurrentVersion:
            return tables.documents.values.filter { tables.versions[$0.currentVersion] == nil }.map(
                \.id.rawValue
            )
            .sorted()
        case .contentsWithoutNode:
            return tables.extents.filter { node, map in
                !map.values.allSatisfy(\.isEmpty) && (tables.nodes[node] ?? []).isEmpty
            }
            .keys.map(\.rawValue).sorted()
        }
    }
}
