import Foundation
import StoreTestSupport
import TestSupport
import Testing

@testable import DocumentEngine
@testable import SQLiteStore

/// History that thins itself: the store keeps its policy, garbage
/// collection applies it without dropping what must stay, and the space comes back.
@Suite struct StoreRetentionTests {
    static func save(
        _ store: any DocumentStore, _ document: DocumentInfo, _ bytes: Data, base: VersionID? = nil
    )
        throws -> SaveResult
    {
        var changes = DocumentChanges(
            document: document.id, base: try base ?? store.document(document.id).currentVersion)
        changes.contents[document.root] = .replace(DataContentsSource(bytes))
        return try store.save(changes)
    }

    @Test(
        "The store keeps its policy for every process; a new store has the standard one",
        arguments: StoreKind.everyBackend)
    func policyIsKept(_ kind: StoreKind) throws {
        let fixture = try StoreFixture(kind)
        #expect(try fixture.store.retentionPolicy() == .standard)
        let policy = RetentionPolicy(
            keepLast: 3, keepAll: .seconds(600), tiers: [.hourly(for: .seconds(86400))],
            deletedDocumentsExpireAfter: .seconds(7 * 86400))
        try fixture.store.setRetentionPolicy(policy)
        #expect(try fixture.reopen().retentionPolicy() == policy)
    }

    @Test(
        "Collection never drops the current version, an unresolved conflict, or a deleted document before its expiry",
        arguments: StoreKind.everyBackend)
    func whatAlwaysStays(_ kind: StoreKind) throws {
        let fixture = try StoreFixture(kind)
        let store = fixture.store
        let document = try store.createDocument(
            named: "a.txt", kind: .flat, type: nil, permissions: nil, origin: "")
        var bases: [VersionID] = []
        for i in 0..<6 {
            bases.append(try Self.save(store, document, sampleBytes(10_000, seed: UInt64(i))).version.id)
        }
        // A save based on an old version keeps both: an unresolved conflict.
        let conflict = try Self.save(store, document, sampleBytes(10_000, seed: 99), base: bases[1])
        #expect(conflict.isConflict)
        let deleted = try store.createDocument(
            named: "gone.txt", kind: .flat, type: nil, permissions: nil, origin: "")
        let deletedBytes = sampleBytes(20_000, seed: 7)
        _ = try Self.save(store, deleted, deletedBytes)
        try store.deleteDocument(deleted.id, origin: "")

        try store.setRetentionPolicy(
            .init(keepLast: 1, keepAll: .zero, tiers: [], deletedDocumentsExpireAfter: .seconds(3600)))
        let report = try store.collectGarbage()
        let kept = try store.versions(of: document.id).map(\.id)
        #expect(kept.contains(bases[5]), "the current version")
        #expect(kept.contains(conflict.version.id), "the unresolved conflict")
        #expect(!kept.contains(bases[2]))
        #expect(report.versionsRemoved >= 4)
        // The conflict still reads as it was saved, on top of its base.
        let conflictRoot = try #require(try store.node(document.root, at: conflict.version.id))
        #expect(
            try store.readContents(
                of: document.root, at: conflict.version.id, offset: 0, count: Int(conflictRoot.size))
                == sampleBytes(10_000, seed: 99))
        // The deleted document is still restorable, with its contents.
        #expect(try store.deletedDocuments().map(\.id) == [deleted.id])
        let restored = try store.undeleteDocument(deleted.id, as: nil)
        #expect(try store.readContents(of: restored.root, at: nil, offset: 0, count: 20_000) == deletedBytes)
        #expect(try store.checkIntegrity().isClean)

        // Resolved, the conflict goes at the next collection.
        try store.resolveConflict(conflict.version.id)
        _ = try store.collectGarbage()
        #expect(try store.versions(of: document.id).map(\.id) == [bases[5]])
        #expect(try store.checkIntegrity().isClean)
    }

    @Test(
        "A wrapper no later version changed reads at its record's version after collection dropped that version; one that changed does not",
        arguments: StoreKind.everyBackend)
    func unchangedWrapperReadsAtADroppedVersion(_ kind: StoreKind) throws {
        let fixture = try StoreFixture(kind)
        let store = fixture.store
        let document = try store.createDocument(
            named: "p.pkg", kind: .package, type: nil, permissions: nil, origin: "")
        let ids = try store.makeNodeIDs(count: 2)
        let kept = sampleBytes(600_000, seed: 20)
        var version = document.currentVersion
        // Saves a file of the package: a record and its bytes.
        func save(_ id: StoreNodeID, _ name: String, _ bytes: Data) throws -> VersionID {
            var changes = DocumentChanges(document: document.id, base: version)
            changes.nodes = [
                NodeRecord(
                    id: id, document: document.id, parent: document.root, name: name, kind: .regularFile,
                    permissions: 0o644)
            ]
            changes.contents[id] = .replace(DataContentsSource(bytes))
            version = try store.save(changes).version.id
            return version
        }
        let keptAt = try save(ids[0], "kept.bin", kept)
        let changedAt = try save(ids[1], "changed.bin", sampleBytes(300_000, seed: 21))
        for seed in 22..<25 { _ = try save(ids[1], "changed.bin", sampleBytes(300_000, seed: UInt64(seed))) }
        try store.setRetentionPolicy(
            .init(keepLast: 1, keepAll: .zero, tiers: [], deletedDocumentsExpireAfter: .zero))
        _ = try store.collectGarbage()
        #expect(!(try store.versions(of: document.id).map(\.id).contains(keptAt)))
        // The store reopened, as a new mount would: nothing read before is remembered.
        let reopened = try fixture.reopen()
        let record = try #require(try reopened.node(ids[0], at: nil))
        #expect(record.version == keptAt)
        #expect(try reopened.node(ids[0], at: keptAt)?.size == Int64(kept.count))
        #expect(try reopened.readContents(of: ids[0], at: keptAt, offset: 0, count: kept.count) == kept)
        // A copy of it, named by that version (as `cp` through a mount makes it).
        var changes = DocumentChanges(document: document.id, base: version)
        let copyID = try reopened.makeNodeIDs(count: 1)[0]
        changes.nodes = [
            NodeRecord(
                id: copyID, document: document.id, parent: document.root, name: "copy.bin",
                kind: .regularFile,
                permissions: 0o644)
        ]
        changes.contents[copyID] = .copy(of: NodeLookup(ids[0], at: keptAt))
        // In the same save the file itself changes (written before the copy, by node order):
        // the copy is of the bytes as of that version all the same.
        let replacement = sampleBytes(200_000, seed: 26)
        var keptRecord = try #require(try reopened.node(ids[0], at: nil))
        keptRecord.size = Int64(replacement.count)
        changes.nodes.append(keptRecord)
        changes.contents[ids[0]] = .replace(DataContentsSource(replacement))
        _ = try reopened.save(changes)
        #expect(try reopened.readContents(of: copyID, at: nil, offset: 0, count: kept.count + 1) == kept)
        #expect(
            try reopened.readContents(of: ids[0], at: nil, offset: 0, count: kept.count) == replacement)
        // A wrapper that changed after the dropped version cannot be read as of it.
        #expect(throws: DocumentStoreError.noSuchVersion(changedAt)) {
            _ = try reopened.readContents(of: ids[1], at: changedAt, offset: 0, count: 10)
        }
        #expect(try reopened.checkIntegrity().isClean)
    }

    @Test("Collection is due once per interval, whichever process runs it", arguments: StoreKind.everyBackend)
    func dueOncePerInterval(_ kind: StoreKind) throws {
        let fixture = try StoreFixture(kind)
        let store = fixture.store
        let document = try store.createDocument(
            named: "a.txt", kind: .flat, type: nil, permissions: nil, origin: "")
        for i in 0..<4 { _ = try Self.save(store, document, sampleBytes(1000, seed: UInt64(i))) }
        try store.setRetentionPolicy(.currentOnly)
        #expect(try store.collectGarbageIfDue(every: .seconds(3600))?.versionsRemoved == 4)
        _ = try Self.save(store, document, sampleBytes(1000, seed: 9))
        #expect(
            try fixture.reopen().collectGarbageIfDue(every: .seconds(3600)) == nil,
            "collected within the hour")
        #expect(try store.versions(of: document.id).count == 2)
    }

    @Test("After collection the SQLite store, its file and its packs, gives its space back")
    func sqliteFileShrinks() throws {
        let fixture = try StoreFixture(.sqlite)
        let store = fixture.store
        let document = try store.createDocument(
            named: "big.bin", kind: .flat, type: nil, permissions: nil, origin: "")
        for i in 0..<24 { _ = try Self.save(store, document, sampleBytes(1 << 20, seed: UInt64(i))) }
        try (store as? SQLiteStore)?.checkpoint()
        let before = StoreTestTools.sqliteStoreBytes(fixture.location)
        #expect(before > 20 << 20)
        _ = try store.collectGarbage(.currentOnly)
        let after = StoreTestTools.sqliteStoreBytes(fixture.location)
        #expect(after < 4 << 20, "the store file is \(after) bytes after collection (was \(before))")
        #expect(
            try store.readContents(of: document.root, at: nil, offset: 0, count: 1 << 20)
                == sampleBytes(1 << 20, seed: 23))
        #expect(try store.checkIntegrity().isClean)
    }

    @Test("After collection a PostgreSQL store that is mostly garbage gives its chunks' space back")
    func postgresGivesSpaceBack() throws {
        guard StoreKind.postgresURL != nil else { return }
        let fixture = try StoreFixture(.postgres)
        let store = fixture.store
        let document = try store.createDocument(
            named: "big.bin", kind: .flat, type: nil, permissions: nil, origin: "")
        for i in 0..<12 { _ = try Self.save(store, document, sampleBytes(8 << 20, seed: UInt64(i))) }
        let size = { Int64(try fixture.sql("SELECT pg_total_relation_size('chunks')")) ?? -1 }
        let before = try size()
        #expect(before > 90 << 20)
        _ = try store.collectGarbage(.currentOnly)
        let after = try size()
        #expect(after < 16 << 20, "the chunks take \(after) bytes after collection (were \(before))")
        #expect(
            try store.readContents(of: document.root, at: nil, offset: 0, count: 8 << 20)
                == sampleBytes(8 << 20, seed: 11))
    }

    @Test("A store made before incremental vacuum is rebuilt once by its first collection")
    func oldStoreIsVacuumedOnce() throws {
        let fixture = try StoreFixture(.sqlite)
        try fixture.sql("PRAGMA auto_vacuum = NONE; VACUUM;")
        #expect(try fixture.sql("PRAGMA auto_vacuum") == "0")
        _ = try fixture.reopen().collectGarbage(.currentOnly)
        #expect(try fixture.sql("PRAGMA auto_vacuum") == "2")
    }
}
