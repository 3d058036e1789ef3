import DocumentEngine
import Foundation

/// A ``DocumentStore`` that is the versioned-store algorithm over a backend of its own: the
/// store types (``MemoryStore``, `SQLiteStore`, `PostgresStore`) add only how they open and what
/// is particular to their database; every store operation is ``VersionedStore``'s.
public protocol VersionedDocumentStore: FileSystemStore {
    var versionedStore: VersionedStore { get }
}

extension VersionedDocumentStore {
    public var location: String { versionedStore.location }
    public var chunkSize: Int { versionedStore.chunkSize }
    public var statistics: StoreStatistics { versionedStore.statistics }

    public func documents() throws -> [DocumentInfo] { try versionedStore.documents() }
    public func document(_ id: DocumentID) throws -> DocumentInfo { try versionedStore.document(id) }
    public func document(named name: String) throws -> DocumentInfo? {
        try versionedStore.document(named: name)
    }
    public func createDocument(named name: String, root: DocumentRoot, type: String?, origin: String) throws
        -> DocumentInfo
    {
        try versionedStore.createDocument(named: name, root: root, type: type, origin: origin)
    }
    public func renameDocument(_ id: DocumentID, to name: String) throws -> DocumentInfo {
        try versionedStore.renameDocument(id, to: name)
    }
    public func deleteDocument(_ id: DocumentID, origin: String = "") throws {
        try versionedStore.deleteDocument(id, origin: origin)
    }
    public func deletedDocuments() throws -> [DocumentInfo] { try versionedStore.deletedDocuments() }
    public func undeleteDocument(_ id: DocumentID, as name: String? = nil) throws -> DocumentInfo {
        try versionedStore.undeleteDocument(id, as: name)
    }

    public func nodes(of document: DocumentID, at version: VersionID?) throws -> [NodeRecord] {
        try versionedStore.nodes(of: document, at: version)
    }
    public func node(_ id: StoreNodeID, at version: VersionID?) throws -> NodeRecord? {
        try versionedStore.node(id, at: version)
    }
    public func nodes(_ lookups: [NodeLookup]) throws -> [Result<NodeRecord?, any Error>] {
        try versionedStore.nodes(lookups)
    }
    public func readContents(of node: StoreNodeID, at version: VersionID? = nil, offset: Int64, count: Int)
        throws
        -> Data
    {
        try versionedStore.readContents(of: node, at: version, offset: offset, count: count)
    }
    public func readContents(
        of node: StoreNodeID, at version: VersionID?, offset: Int64,
        into buffer: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        try versionedStore.readContents(of: node, at: version, offset: offset, into: buffer)
    }

    public func currentVersion(of document: DocumentID) throws -> VersionID {
        try versionedStore.currentVersion(of: document)
    }

    public func prepareContents(reading source: any ContentsSource) -> (any ContentsPreparation)? {
        versionedStore.prepareContents(reading: source)
    }

    public func makeNodeIDs(count: Int) throws -> [StoreNodeID] {
        try versionedStore.makeNodeIDs(count: count)
    }
    public func prepare(_ changes: DocumentChanges) throws -> PreparedChanges {
        try versionedStore.prepare(changes)
    }
    public func save(_ changes: DocumentChanges) throws -> SaveResult { try versionedStore.save(changes) }
    public func save(_ prepared: PreparedChanges) throws -> SaveResult { try versionedStore.save(prepared) }
    public func transaction<T>(durable: Bool, _ body: (any DocumentStoreTransaction) throws -> T) throws -> T
    {
        try versionedStore.transaction(durable: durable, body)
    }
    public func synchronize() throws { try versionedStore.synchronize() }

    public func versions(of document: DocumentID) throws -> [VersionInfo] {
        try versionedStore.versions(of: document)
    }
    public func restore(_ version: VersionID, of document: DocumentID, origin: String = "restore") throws
        -> SaveResult
    {
        try versionedStore.restore(version, of: document, origin: origin)
    }
    public func resolveConflict(_ version: VersionID) throws { try versionedStore.resolveConflict(version) }
    public func unresolvedConflicts() throws -> [VersionInfo] { try versionedStore.unresolvedConflicts() }
    public func collectGarbage(_ policy: RetentionPolicy, protecting protected: Set<VersionID>) throws
        -> CollectionReport
    {
        try versionedStore.collectGarbage(policy, protecting: protected)
    }
    public func setting(_ key: String) throws -> String? { try versionedStore.setting(key) }
    public func setSetting(_ key: String, _ value: String) throws {
        try versionedStore.setSetting(key, value)
    }

    public func events(after sequence: Int64) throws -> [StoreEvent] {
        try versionedStore.events(after: sequence)
    }
    public func latestEventSequence() throws -> Int64 { try versionedStore.latestEventSequence() }
    public func checkIntegrity() throws -> IntegrityReport { try versionedStore.checkIntegrity() }
    public func purgeCache() { versionedStore.purgeCache() }
    public var sharedLocks: (any SharedLockStore)? { versionedStore }
}
