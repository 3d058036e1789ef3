import DocumentEngine
import Foundation
import Synchronization

/// The versioned-store algorithm, once, over any ``StoreBackend``.
///
/// History is kept without copying: a wrapper is a series of immutable rows, one per version that
/// changed it, and a file's contents are extent rows (a chunk at a byte offset), one per version
/// that changed what starts at that offset. The state at version V is, per wrapper (and per
/// offset), the row with the highest version ≤ V. So a save writes only the rows it changes, and reading an old version needs no
/// copy. Branch 0 is the main line; a conflict version's rows carry its own id as branch and apply
/// on top of the main line as of the version it was based on.
///
/// Contents are content-defined chunks (at most a chunk size long) stored once per SHA-256, shared between wrappers, documents and
/// versions; all-zero chunks are holes. A save's contents come in as data or as a source that
/// never calls the store: bytes the store already holds (a copy, a file derived from another)
/// are named by node and version and resolved inside the transaction.
public final class VersionedStore: Sendable {
    /// The default chunk size: small enough that a small edit costs little, large enough that a
    /// sequential read is a few thousand lookups per GiB.
    public static let defaultChunkSize = 256 * 1024
    /// The largest chunk size a store may be created with.
    public static let maximumChunkSize = 64 << 20

    package let backend: any StoreBackend
    public var location: String { backend.location }
    public var chunkSize: Int { backend.chunkSize }
    let counters = Mutex(StoreStatistics())
    private let prepared = Atomic<Int64>(0)
    let cache = Mutex(ChunkCache(capacity: ChunkCache.storeCapacity))
    /// What reads at saved versions learned: a file's size and chunk ids by index (immutable).
    let pinned = Mutex(PinnedFiles())
    /// Commits through this store that did not wait for the disk, and how many of them a sync or
    /// a durable commit has covered since: an `fsync` after a durable save needs no second sync.
    let durability = Mutex((deferred: 0, covered: 0))

    /// How contents are cut into chunks: content-defined, at most a chunk size long, and finer
    /// for small files (``Chunking/Policy``).
    let chunking: Chunking.Policy

    package init(backend: any StoreBackend) {
        self.backend = backend
        chunking = Chunking.Policy(chunkSize: backend.chunkSize)
    }

    public var statistics: StoreStatistics {
        var statistics = counters.withLock { $0 }
        statistics.bytesPrepared = prepared.load(ordering: .relaxed)
        return statistics
    }

    /// Counts bytes a preparation cut ahead (``StoreStatistics/bytesPrepared``): atomic, since
    /// its low-priority thread must not hold a lock that saves take.
    func countPrepared(_ bytes: Int64) { prepared.add(bytes, ordering: .relaxed) }

    // MARK: Documents

    public func documents() throws -> [DocumentInfo] {
        try backend.access { try $0.documents(deleted: false) }
    }

    public func deletedDocuments() throws -> [DocumentInfo] {
        try backend.access { try $0.documents(deleted: true) }
    }

    public func document(_ id: DocumentID) throws -> DocumentInfo {
        try backend.access { try Self.fetchDocument($0, id) }
    }

    public func document(named name: String) throws -> DocumentInfo? {
        try backend.access { try $0.liveDocument(named: name) }
    }

    public func currentVersion(of id: DocumentID) throws -> VersionID {
        try backend.currentVersion(of: id) ?? document(id).currentVersion
    }

    static func fetchDocument(_ tx: any StoreTransaction, _ id: DocumentID) throws -> DocumentInfo {
        guard let document = try tx.document(id) else {
            throw DocumentStoreError.noSuchDocument(id.description)
        }
        return document
    }

    public func createDocument(named name: String, root: DocumentRoot, type: String?, origin: String) throws
        -> DocumentInfo
    {
        try write(durable: true) { tx in
            try createDocument(tx, named: name, root: root, type: type, origin: origin)
        }
    }

    func createDocument(
        _ tx: any StoreTransaction, named name: String, root: DocumentRoot, type: String?, origin: String,
        contents prepared: PreparedChanges? = nil
    ) throws -> DocumentInfo {
        try Self.validateDocumentName(name)
        var contents: ContentUpdate?
        if let prepared {
            guard root.kind == .regularFile, let node = root.node,
                let update = prepared.changes.contents[node],
                prepared.changes.contents.count == 1
            else {
                throw DocumentStoreError.invalidChange(
                    "\(name.debugDescription): only a flat document's file, named by its node, has first contents"
                )
            }
            contents = update
        }
        if root.kind == .symbolicLink && root.linkTarget == nil {
            throw DocumentStoreError.invalidChange("link \(name.debugDescription) has no destination")
        }
        let kind = root.documentKind
        let isDevice = root.kind == .characterDevice || root.kind == .blockDevice
        let defaultPermissions = root.kind == .directory ? 0o755 : root.kind == .symbolicLink ? 0o777 : 0o644
        try Self.requireFreeName(tx, name)
        let now = Timestamp.now
        let rootID = try root.node ?? StoreNodeID(rawValue: tx.reserveNodeIDs(count: 1))
        let document = try tx.insertDocument(
            name: name, type: type ?? DocumentInfo.typeIdentifier(forName: name), kind: kind,
            root: rootID,
            created: now)
        let version = try tx.insertVersion(document: document, base: nil, origin: origin, created: now)
        var record = NodeRecord(
            id: rootID, document: document, parent: nil, name: name, kind: root.kind,
            permissions: root.permissions ?? defaultPermissions, uid: root.uid ?? UInt32(getuid()),
            gid: root.gid ?? UInt32(getgid()), modified: now,
            linkTarget: root.kind == .symbolicLink ? root.linkTarget : nil,
            device: isDevice ? root.device : 0)
        if let contents {
            // The first contents are written at the version that creates the file.
            let planned = prepared.flatMap { self.work(of: $0) }
            let writer = ContentWriter(
                store: self, tx: tx, node: rootID, previousSize: nil, lineage: .current, branch: 0,
                version: version, precut: planned?.precut[rootID] ?? finishedPreparation(of: contents))
            let written = try write(contents, with: writer, plan: planned?.plans[rootID], previous: nil, tx)
            record.size = written.size
            _ = try tx.updateVersion(version, .bytesWritten(written.bytes))
            counters.withLock {
                $0.chunksWritten += written.chunks
                $0.bytesWritten += written.bytes
            }
        }
        try tx.insertNode(StoredNode(record: record.at(version), branch: 0, removed: false))
        try tx.updateDocument(document, .currentVersion(version, modified: now))
        try tx.insertEvent(
            .created, document: document, version: version, name: name, origin: origin, time: now)
        counters.withLock { $0.nodesWritten += 1 }
        return try Self.fetchDocument(tx, document)
    }

    public func renameDocument(_ id: DocumentID, to name: String) throws -> DocumentInfo {
        try write(durable: true) { tx in try Self.renameDocument(tx, id, to: name) }
    }

    static func renameDocument(_ tx: any StoreTransaction, _ id: DocumentID, to name: String) throws
        -> DocumentInfo
    {
        try validateDocumentName(name)
        let current = try fetchDocument(tx, id)
        if current.name == name { return current }
        try requireFreeName(tx, name, except: id)
        let now = Timestamp.now
        try tx.updateDocument(id, .rename(name, modified: now))
        try tx.insertEvent(
            .renamed, document: id, version: current.currentVersion, name: name, origin: "", time: now)
        return try fetchDocument(tx, id)
    }

    /// Swaps two live documents' names, through a name no document can have (the store's names
    /// are unique among live documents at every statement, not only at the commit).
    static func exchangeDocuments(_ tx: any StoreTransaction, _ first: DocumentID, _ second: DocumentID)
        throws -> (DocumentInfo, DocumentInfo)
    {
        let a = try fetchDocument(tx, first)
        let b = try fetchDocument(tx, second)
        guard a.deleted == nil else { throw DocumentStoreError.noSuchDocument(first.description) }
        guard b.deleted == nil else { throw DocumentStoreError.noSuchDocument(second.description) }
        guard first != second else { return (a, b) }
        let now = Timestamp.now
        // A slash is in no valid name.
        try tx.updateDocument(second, .rename("/exchange/\(second.rawValue)", modified: now))
        try tx.updateDocument(first, .rename(b.name, modified: now))
        try tx.updateDocument(second, .rename(a.name, modified: now))
        try tx.insertEvent(
            .renamed, document: first, version: a.currentVersion, name: b.name, origin: "", time: now)
        try tx.insertEvent(
            .renamed, document: second, version: b.currentVersion, name: a.name, origin: "", time: now)
        return (try fetchDocument(tx, first), try fetchDocument(tx, second))
    }

    public func deleteDocument(_ id: DocumentID, origin: String) throws {
        try write(durable: true) { tx in try Self.deleteDocument(tx, id, origin: origin) }
    }

    static func deleteDocument(_ tx: any StoreTransaction, _ id: DocumentID, origin: String) throws {
        let current = try Self.fetchDocument(tx, id)
        let now = Timestamp.now
        if current.deleted == nil { try tx.updateDocument(id, .deleted(now)) }
        try tx.insertEvent(
            .deleted, document: id, version: current.currentVersion, name: current.name, origin: origin,
            time: now)
    }

    public func transaction<T>(durable: Bool, _ body: (any DocumentStoreTransaction) throws -> T) throws -> T
    {
        let carried = CarriedList()
        let result = try write(durable: durable) { tx in
            carried.files = []
            return try body(Transaction(store: self, tx: tx, carried: carried))
        }
        if !carried.files.isEmpty {
            pinned.withLock { files in for file in carried.files { files.carry(file) } }
        }
        return result
    }

    /// The files a transaction's saves carried extents for, known to reads once it commits.
    final class CarriedList {
        var files: [CarriedExtents] = []
    }

    /// A ``DocumentStoreTransaction`` over one write transaction of the backend.
    struct Transaction: DocumentStoreTransaction {
        let store: VersionedStore
        let tx: any StoreTransaction
        let carried: CarriedList

        func document(_ id: DocumentID) throws -> DocumentInfo { try VersionedStore.fetchDocument(tx, id) }
        func document(named name: String) throws -> DocumentInfo? { try tx.liveDocument(named: name) }
        func node(_ id: StoreNodeID) throws -> NodeRecord? {
            try VersionedStore.node(tx, id, lineage: .current)
        }
        func createDocument(
            named name: String, root: DocumentRoot, type: String?, origin: String, contents: PreparedChanges?
        ) throws -> DocumentInfo {
            try store.createDocument(
                tx, named: name, root: root, type: type, origin: origin, contents: contents)
        }
        func renameDocument(_ id: DocumentID, to name: String) throws -> DocumentInfo {
            try VersionedStore.renameDocument(tx, id, to: name)
        }
        func exchangeDocuments(_ first: DocumentID, _ second: DocumentID) throws -> (
            DocumentInfo, DocumentInfo
        ) {
            try VersionedStore.exchangeDocuments(tx, first, second)
        }
        func restore(_ version: VersionID, of document: DocumentID, origin: String) throws -> SaveResult {
            try store.restore(tx, version, of: document, origin: origin)
        }
        func deleteDocument(_ id: DocumentID, origin: String) throws {
            try VersionedStore.deleteDocument(tx, id, origin: origin)
        }
        func save(_ prepared: PreparedChanges) throws -> SaveResult {
            try store.save(
                tx, prepared.changes, event: nil, work: store.work(of: prepared), carried: &carried.files)
        }
        func resolveConflict(_ version: VersionID) throws { try VersionedStore.resolveConflict(tx, version) }
        func undeleteDocument(_ id: DocumentID, as name: String?) throws -> DocumentInfo {
            try VersionedStore.undeleteDocument(tx, id, as: name)
        }
        func setting(_ key: String) throws -> String? { try tx.setting(key) }
        func setSetting(_ key: String, _ value: String) throws { try tx.setSetting(key, value) }
    }

    public func undeleteDocument(_ id: DocumentID, as name: String?) throws -> DocumentInfo {
        try write(durable: true) { tx in try Self.undeleteDocument(tx, id, as: name) }
    }

    static func undeleteDocument(_ tx: any StoreTransaction, _ id: DocumentID, as name: String?) throws
        -> DocumentInfo
    {
        let current = try Self.fetchDocument(tx, id)
        let newName = name ?? current.name
        try Self.validateDocumentName(newName)
        try Self.requireFreeName(tx, newName, except: id)
        try tx.updateDocument(id, .undeleted(name: newName))
        try tx.insertEvent(
            .restored, document: id, version: current.currentVersion, name: newName, origin: "", time: .now)
        return try Self.fetchDocument(tx, id)
    }

    /// Throws unless no live document other than `except` is named `name`.
    static func requireFreeName(_ tx: any StoreTransaction, _ name: String, except id: DocumentID? = nil)
        throws
    {
        if let other = try tx.liveDocument(named: name), other.id != id {
            throw DocumentStoreError.documentExists(name)
        }
    }

    static func validateDocumentName(_ name: String) throws {
        if let reason = FileName.problem(with: name) {
            throw DocumentStoreError.invalidName(name, reason: reason)
        }
    }

    // MARK: Reading wrappers

    public func nodes(of document: DocumentID, at version: VersionID?) throws -> [NodeRecord] {
        try backend.read { tx in
            _ = try Self.fetchDocument(tx, document)
            let lineage = try Lineage.of(tx, version)
            guard lineage.branch == 0 else {
                return try Self.resolvingLinks(
                    Self.nodes(tx, document: document, lineage: lineage).values.sorted { $0.id < $1.id })
            }
            // On the main line each node has one latest row: no dictionary needed, and the rows
            // come mostly in node order, which the sort finds in one pass.
            var records: [NodeRecord] = []
            for row in try tx.latestNodes(of: document, branch: 0, upTo: lineage.limit) where !row.removed {
                records.append(row.record)
            }
            records.sort { $0.id < $1.id }
            return try Self.resolvingLinks(records)
        }
    }

    /// A document's records with each hard link read as the file it names (they are all in
    /// `records`, sorted by id).
    static func resolvingLinks(_ records: [NodeRecord]) throws -> [NodeRecord] {
        guard records.contains(where: { $0.linkOf != nil }) else { return records }
        var byID: [StoreNodeID: NodeRecord] = [:]
        for record in records { byID[record.id] = record }
        return try records.map { record in
            guard let target = record.linkOf else { return record }
            guard let file = byID[target], file.linkOf == nil else {
                throw DocumentStoreError.corrupt(
                    path: "",
                    reason: "hard link \(record.id) (\(record.name)) names a missing wrapper \(target)")
            }
            return record.resolvingLink(to: file)
        }
    }

    /// `record`, read as the file it names when it is a hard link.
    static func resolvingLink(_ record: NodeRecord?, _ file: (StoreNodeID) throws -> NodeRecord?) throws
        -> NodeRecord?
    {
        guard let record, let target = record.linkOf else { return record }
        guard let named = try file(target), named.linkOf == nil else {
            throw DocumentStoreError.corrupt(
                path: "", reason: "hard link \(record.id) (\(record.name)) names a missing wrapper \(target)")
        }
        return record.resolvingLink(to: named)
    }

    /// The live records of a document as of `lineage`.
    static func nodes(_ tx: any StoreTransaction, document: DocumentID, lineage: Lineage) throws
        -> [StoreNodeID: NodeRecord]
    {
        var result: [StoreNodeID: NodeRecord] = [:]
        for row in try tx.latestNodes(of: document, branch: 0, upTo: lineage.limit) where !row.removed {
            result[row.record.id] = row.record
        }
        if lineage.branch != 0 {
            for row in try tx.latestNodes(of: document, branch: lineage.branch, upTo: .max) {
                result[row.record.id] = row.removed ? nil : row.record
            }
        }
        return result
    }

    public func node(_ id: StoreNodeID, at version: VersionID?) throws -> NodeRecord? {
        try Self.resolvingLink(unresolvedNode(id, at: version)) { try unresolvedNode($0, at: version) }
    }

    /// The record as stored: a hard link's own row.
    func unresolvedNode(_ id: StoreNodeID, at version: VersionID?) throws -> NodeRecord? {
        if let version, let answer = try backend.mainLineLookups([NodeLookup(id, at: version)])?.first,
            case .record(let record) = try answer.get()
        {
            return record
        }
        return try backend.read { tx in try Self.node(tx, id, lineage: Lineage.of(tx, version, reading: id)) }
    }

    public func nodes(_ lookups: [NodeLookup]) throws -> [Result<NodeRecord?, any Error>] {
        var results: [Result<NodeRecord?, any Error>] = []
        results.reserveCapacity(lookups.count)
        var start = lookups.startIndex
        while start < lookups.endIndex {
            let end = min(start + 2_000, lookups.endIndex)
            let batch = Array(lookups[start..<end])
            if let answers = try backend.mainLineLookups(batch) {
                for (lookup, answer) in zip(batch, answers) {
                    results.append(
                        Result {
                            switch try answer.get() {
                            case .record(let record):
                                return try Self.resolvingLink(record) { try node($0, at: lookup.version) }
                            case .onConflictBranch, .noSuchVersion:
                                return try node(lookup.node, at: lookup.version)
                            }
                        })
                }
            } else {
                results += batch.map { lookup in Result { try node(lookup.node, at: lookup.version) } }
            }
            start = end
        }
        return results
    }

    static func node(_ tx: any StoreTransaction, _ id: StoreNodeID, lineage: Lineage) throws -> NodeRecord? {
        if lineage.branch != 0, let row = try tx.latestNode(id, branch: lineage.branch, upTo: .max) {
            return row.removed ? nil : row.record
        }
        guard let row = try tx.latestNode(id, branch: 0, upTo: lineage.limit) else { return nil }
        return row.removed ? nil : row.record
    }

    // MARK: Events

    public func events(after sequence: Int64) throws -> [StoreEvent] {
        try backend.access { try $0.events(after: sequence) }
    }

    public func latestEventSequence() throws -> Int64 {
        try backend.access { try $0.latestEventSequence() }
    }

    // MARK: Helpers shared with the retention and integrity code

    /// Versions that garbage collection just dropped must not be read from memory afterwards.
    func forgetPinnedReads(at versions: Set<VersionID>) {
        guard !versions.isEmpty else { return }
        pinned.withLock { $0.forget(versions) }
    }

    func count(_ update: (inout StoreStatistics) -> Void) { counters.withLock { update(&$0) } }

    package static func hash(_ data: Data) -> Data { SHA256.hash(data) }

    package static func hash(_ bytes: UnsafeRawBufferPointer) -> Data { SHA256.hash(bytes) }

    /// Whether every byte is zero: such a chunk is stored as a hole.
    package static func isZero(_ data: Data) -> Bool { data.withUnsafeBytes { isZero($0) } }

    /// Whether every byte is zero.
    package static func isZero(_ raw: UnsafeRawBufferPointer) -> Bool {
        var words = raw.count / 8
        var index = 0
        while words > 0 {
            if raw.loadUnaligned(fromByteOffset: index, as: UInt64.self) != 0 { return false }
            index += 8
            words -= 1
        }
        while index < raw.count {
            if raw[index] != 0 { return false }
            index += 1
        }
        return true
    }
}

/// Which rows make up a version: the main line up to `limit`, plus a conflict branch on top.
struct Lineage: Sendable {
    var limit: Int64
    var branch: Int64

    static let current = Lineage(limit: .max, branch: 0)

    static func of(_ tx: any StoreTransaction, _ version: VersionID?) throws -> Lineage {
        guard let version else { return .current }
        guard let info = try tx.version(version) else { throw DocumentStoreError.noSuchVersion(version) }
        return of(info)
    }

    private static func of(_ info: VersionInfo) -> Lineage {
        if !info.isConflict { return Lineage(limit: info.id.rawValue, branch: 0) }
        return Lineage(limit: info.base?.rawValue ?? 0, branch: info.id.rawValue)
    }

    /// The lineage that reads `node` as of `version`, which retention may have dropped: a node
    /// that no version since changed still reads, from the same rows as at its document's current
    /// version (every change of a file's bytes writes its record again, so none of its rows is
    /// newer than its record). A mount opens a file at its record's version, and `docfs gc`
    /// drops versions whose records stay current: without this, such files failed to read
    /// (ESTALE) in the next mount. The lineage stops at `version`, so that a save reading it
    /// (a copy) does not see what the save itself wrote. A version past the document's current
    /// one was never made, and is no such version.
    static func of(_ tx: any StoreTransaction, _ version: VersionID?, reading node: StoreNodeID) throws
        -> Lineage
    {
        guard let version else { return .current }
        if let info = try tx.version(version) { return of(info) }
        let atVersion = Lineage(limit: version.rawValue, branch: 0)
        if let then = try VersionedStore.node(tx, node, lineage: atVersion),
            let document = try tx.document(then.document),
            version.rawValue <= document.currentVersion.rawValue,
            let now = try VersionedStore.node(
                tx, node, lineage: Lineage(limit: document.currentVersion.rawValue, branch: 0)),
            now.version == then.version
        {
            return atVersion
        }
        throw DocumentStoreError.noSuchVersion(version)
    }
}

extension NodeRecord {
    /// The record as the row of `version` stores it.
    func at(_ version: VersionID) -> NodeRecord {
        var record = self
        record.version = version
        if record.kind != .regularFile { record.size = 0 }
        if record.preferredName == record.name { record.preferredName = nil }
        record.permissions &= 0o7777
        return record
    }
}
