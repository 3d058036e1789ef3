import DocumentEngine
import Foundation
import Synchronization
import VersionedStore

/// A store that forwards to a real one, and can be told to fail saves (to see a save error come
/// back from fsync/close) or to hold reads of contents (a file system request that never
/// returns, for the watchdog test).
final class ProxyStore: FileSystemStore, @unchecked Sendable {
    let inner: any FileSystemStore
    /// When set, every `save` throws.
    let failSaves = Atomic<Bool>(false)
    /// Saves attempted while `failSaves` was set.
    let failedSaves = Atomic<Int>(0)
    /// Milliseconds `documents()` waits after reading the listing (so that what it returns is
    /// stale by the time the caller uses it).
    let listingDelay = Atomic<Int>(0)
    /// Milliseconds `transaction` waits after its commit, before it returns (so that the
    /// caller's view of its change lags the store's).
    let commitDelay = Atomic<Int>(0)
    /// How many of the next `documents()` calls fail (as over a lost connection).
    let failListings = Atomic<Int>(0)
    /// "save" (durable), "deferred save" (`durable` false) and "synchronize", in call order.
    private let log = Mutex<[String]>([])
    var calls: [String] { log.withLock { $0 } }
    private let gate = NSCondition()
    private var holdReads = false
    private var heldReads = 0
    private var holdTransactions = false
    private var heldTransactions = 0
    private var holdConflicts = false
    private var heldConflicts = 0
    private var passedConflicts = 0

    init(_ inner: any FileSystemStore) { self.inner = inner }

    struct InjectedFailure: Error, CustomStringConvertible {
        var description: String { "injected save failure" }
    }

    /// Makes every `readContents` wait until ``releaseReads()``.
    func holdReadsOfContents() {
        gate.lock()
        holdReads = true
        gate.unlock()
    }

    func releaseReads() {
        gate.lock()
        holdReads = false
        gate.broadcast()
        gate.unlock()
    }

    /// Reads waiting at the gate now.
    var waitingReads: Int {
        gate.lock()
        defer { gate.unlock() }
        return heldReads
    }

    var location: String { inner.location }
    var chunkSize: Int { inner.chunkSize }
    var statistics: StoreStatistics { inner.statistics }

    func documents() throws -> [DocumentInfo] {
        if failListings.load(ordering: .sequentiallyConsistent) > 0 {
            failListings.subtract(1, ordering: .sequentiallyConsistent)
            throw DocumentStoreError.io("injected listing failure")
        }
        let infos = try inner.documents()
        let delay = listingDelay.load(ordering: .relaxed)
        if delay > 0 { usleep(UInt32(delay) * 1000) }
        return infos
    }
    func document(_ id: DocumentID) throws -> DocumentInfo { try inner.document(id) }
    func document(named name: String) throws -> DocumentInfo? { try inner.document(named: name) }
    func createDocument(named name: String, root: DocumentRoot, type: String?, origin: String) throws
        -> DocumentInfo
    {
        try inner.createDocument(named: name, root: root, type: type, origin: origin)
    }
    func renameDocument(_ id: DocumentID, to name: String) throws -> DocumentInfo {
        try inner.renameDocument(id, to: name)
    }
    func deleteDocument(_ id: DocumentID, origin: String) throws {
        try inner.deleteDocument(id, origin: origin)
    }
    func deletedDocuments() throws -> [DocumentInfo] { try inner.deletedDocuments() }
    func undeleteDocument(_ id: DocumentID, as name: String?) throws -> DocumentInfo {
        try inner.undeleteDocument(id, as: name)
    }
    func nodes(of document: DocumentID, at version: VersionID?) throws -> [NodeRecord] {
        try inner.nodes(of: document, at: version)
    }
    func node(_ id: StoreNodeID, at version: VersionID?) throws -> NodeRecord? {
        try inner.node(id, at: version)
    }
    func readContents(of node: StoreNodeID, at version: VersionID?, offset: Int64, count: Int) throws -> Data
    {
        gate.lock()
        heldReads += 1
        while holdReads { gate.wait() }
        heldReads -= 1
        gate.unlock()
        return try inner.readContents(of: node, at: version, offset: offset, count: count)
    }
    func makeNodeIDs(count: Int) throws -> [StoreNodeID] { try inner.makeNodeIDs(count: count) }
    func transaction<T>(durable: Bool, _ body: (any DocumentStoreTransaction) throws -> T) throws -> T {
        gate.lock()
        heldTransactions += 1
        while holdTransactions { gate.wait() }
        heldTransactions -= 1
        gate.unlock()
        // The group committer saves in transactions: they fail as saves do.
        if failSaves.load(ordering: .sequentiallyConsistent) {
            failedSaves.add(1, ordering: .sequentiallyConsistent)
            throw InjectedFailure()
        }
        let result = try inner.transaction(durable: durable, body)
        let delay = commitDelay.load(ordering: .relaxed)
        if delay > 0 { usleep(UInt32(delay) * 1000) }
        return result
    }

    /// Makes every `transaction` (the group committer's saves) wait until
    /// ``releaseTransactions()``.
    func holdAllTransactions() {
        gate.lock()
        holdTransactions = true
        gate.unlock()
    }

    func releaseTransactions() {
        gate.lock()
        holdTransactions = false
        gate.broadcast()
        gate.unlock()
    }

    /// Transactions waiting at the gate now.
    var waitingTransactions: Int {
        gate.lock()
        defer { gate.unlock() }
        return heldTransactions
    }
    func prepare(_ changes: DocumentChanges) throws -> PreparedChanges { try inner.prepare(changes) }
    func save(_ changes: DocumentChanges) throws -> SaveResult { try save(inner.prepare(changes)) }
    func save(_ prepared: PreparedChanges) throws -> SaveResult {
        if failSaves.load(ordering: .sequentiallyConsistent) {
            failedSaves.add(1, ordering: .sequentiallyConsistent)
            throw InjectedFailure()
        }
        let result = try inner.save(prepared)
        log.withLock { $0.append(prepared.changes.durable ? "save" : "deferred save") }
        return result
    }
    func synchronize() throws {
        try inner.synchronize()
        log.withLock { $0.append("synchronize") }
    }
    func versions(of document: DocumentID) throws -> [VersionInfo] { try inner.versions(of: document) }
    func restore(_ version: VersionID, of document: DocumentID, origin: String) throws -> SaveResult {
        try inner.restore(version, of: document, origin: origin)
    }
    func resolveConflict(_ version: VersionID) throws { try inner.resolveConflict(version) }
    func unresolvedConflicts() throws -> [VersionInfo] {
        let versions = try inner.unresolvedConflicts()
        gate.lock()
        defer { gate.unlock() }
        if holdConflicts {
            // What was read stays what is returned: it grows stale while it waits.
            heldConflicts += 1
            let ticket = heldConflicts
            gate.broadcast()
            while holdConflicts && passedConflicts < ticket { gate.wait() }
        }
        return versions
    }

    /// Makes each `unresolvedConflicts` call wait, after reading the store, until
    /// ``passConflictListing()`` lets it return (one per call) or ``releaseConflictListings()``.
    func holdConflictListings() {
        gate.lock()
        holdConflicts = true
        gate.unlock()
    }

    /// Lets the oldest held conflict listing return.
    func passConflictListing() {
        gate.lock()
        passedConflicts += 1
        gate.broadcast()
        gate.unlock()
    }

    func releaseConflictListings() {
        gate.lock()
        holdConflicts = false
        gate.broadcast()
        gate.unlock()
    }

    /// Conflict listings that reached the gate since ``holdConflictListings()``.
    var heldConflictListings: Int {
        gate.lock()
        defer { gate.unlock() }
        return heldConflicts
    }
    func collectGarbage(_ policy: RetentionPolicy, protecting protected: Set<VersionID>) throws
        -> CollectionReport
    {
        try inner.collectGarbage(policy, protecting: protected)
    }
    func setting(_ key: String) throws -> String? { try inner.setting(key) }
    func setSetting(_ key: String, _ value: String) throws { try inner.setSetting(key, value) }
    func events(after sequence: Int64) throws -> [StoreEvent] { try inner.events(after: sequence) }
    func latestEventSequence() throws -> Int64 { try inner.latestEventSequence() }
    func checkIntegrity() throws -> IntegrityReport { try inner.checkIntegrity() }
}
