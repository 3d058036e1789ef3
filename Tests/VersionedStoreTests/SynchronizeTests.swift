import DocumentEngine
import Foundation
import Synchronization
import Testing

@testable import VersionedStore

/// A memory backend that counts the syncs the store asks of it.
private final class CountingBackend: StoreBackend {
    let inner = MemoryBackend(location: "memory", chunkSize: VersionedStore.defaultChunkSize)
    let syncs = Atomic(0)
    var location: String { inner.location }
    var chunkSize: Int { inner.chunkSize }
    func read<T>(_ body: (any StoreTransaction) throws -> T) throws -> T { try inner.read(body) }
    func access<T>(_ body: (any StoreTransaction) throws -> T) throws -> T { try inner.access(body) }
    func write<T>(durable: Bool, _ body: (any StoreTransaction) throws -> T) throws -> T {
        try inner.write(durable: durable, body)
    }
    func synchronize() throws { syncs.add(1, ordering: .relaxed) }
    func lockTransaction<T>(timeout: Duration?, _ body: (any LockTransaction) throws -> T) throws -> T {
        try inner.lockTransaction(timeout: timeout, body)
    }
    var lockGeneration: UInt64 { inner.lockGeneration }
    func waitForLockRelease(after generation: UInt64, timeout: Duration) -> UInt64 {
        inner.waitForLockRelease(after: generation, timeout: timeout)
    }
}

/// `synchronize()` asks the backend for a sync only when a deferred commit is not yet covered:
/// an fsync after a durable save costs no second disk sync (one sync where one suffices).
@Suite("VersionedStore.synchronize")
struct SynchronizeTests {
    private func setUp() throws -> (VersionedStore, CountingBackend, DocumentInfo) {
        let backend = CountingBackend()
        let store = VersionedStore(backend: backend)
        let document = try store.createDocument(
            named: "d.pkg", root: DocumentRoot(kind: .directory), type: nil, origin: "test")
        return (store, backend, document)
    }

    private func save(_ store: VersionedStore, _ document: DocumentInfo, durable: Bool) throws {
        let current = try store.document(document.id)
        var changes = DocumentChanges(document: document.id, base: current.currentVersion)
        var root = try #require(try store.node(document.root, at: nil))
        root.modified = Timestamp(rawValue: root.modified.rawValue + 1)
        changes.nodes = [root]
        changes.durable = durable
        _ = try store.save(changes)
    }

    @Test func durableCommitsNeedNoSync() throws {
        let (store, backend, document) = try setUp()
        try save(store, document, durable: true)
        try store.synchronize()
        #expect(backend.syncs.load(ordering: .relaxed) == 0)
    }

    @Test func aDeferredCommitIsSyncedOnce() throws {
        let (store, backend, document) = try setUp()
        try save(store, document, durable: false)
        try store.synchronize()
        #expect(backend.syncs.load(ordering: .relaxed) == 1)
        try store.synchronize()
        #expect(backend.syncs.load(ordering: .relaxed) == 1)
        try save(store, document, durable: false)
        try store.synchronize()
        #expect(backend.syncs.load(ordering: .relaxed) == 2)
    }

    @Test func aDurableCommitCoversTheDeferredOnesBeforeIt() throws {
        let (store, backend, document) = try setUp()
        try save(store, document, durable: false)
        try save(store, document, durable: false)
        try save(store, document, durable: true)
        try store.synchronize()
        #expect(backend.syncs.load(ordering: .relaxed) == 0)
        // A deferred commit after the durable one is not covered by it.
        try save(store, document, durable: false)
        try store.synchronize()
        #expect(backend.syncs.load(ordering: .relaxed) == 1)
    }
}
