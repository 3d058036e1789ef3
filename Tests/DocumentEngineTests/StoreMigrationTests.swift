import Foundation
import GRDB
import StoreTestSupport
import TestSupport
import Testing

@testable import DocumentEngine
@testable import SQLiteStore
@testable import VersionedStore

/// Stores written before content-defined chunks (format 1: fixed-size chunks by index) open,
/// read the same, and take edits.
@Suite struct StoreMigrationTests {
    @Test("A format-1 store of fixed-size chunks is migrated to extents and reads the same")
    func formatOneStoreMigrates() throws {
        let tmp = try TemporaryDirectory()
        let path = tmp.path("Old.docstore")
        let chunk = 4096
        let bytes = sampleBytes(3 * chunk + 100, seed: 31)
        var document: DocumentInfo
        var version: VersionID
        do {
            let store = try SQLiteStore(path: path, options: .create, chunkSize: chunk)
            document = try store.createDocument(
                named: "old.bin", kind: .flat, type: nil, permissions: nil, origin: "")
            var changes = DocumentChanges(document: document.id, base: document.currentVersion)
            var record = try #require(try store.node(document.root))
            record.size = Int64(bytes.count)
            changes.nodes = [record]
            let saved = try store.save(changes)
            version = saved.version.id
        }
        // What format 1 wrote: chunk i of the file at index i of chunk_map, one row per chunk,
        // the last one shorter; no settings, no extents, no current extents.
        let queue = try DatabaseQueue(path: path)
        try queue.write { db in
            try db.execute(sql: "DROP TABLE extents; DROP TABLE extents_live; DROP TABLE store_settings")
            try db.execute(
                sql: """
                    CREATE TABLE chunk_map (node INTEGER NOT NULL, branch INTEGER NOT NULL, idx INTEGER NOT NULL,
                        version INTEGER NOT NULL, chunk INTEGER, PRIMARY KEY (node, branch, idx, version)) WITHOUT ROWID;
                    CREATE INDEX chunk_map_by_chunk ON chunk_map(chunk);
                    DELETE FROM grdb_migrations WHERE identifier IN ('v2', 'v3', 'v7');
                    UPDATE store_meta SET value = 1 WHERE key = 'format';
                    """)
            for index in 0..<4 {
                let piece = bytes.subdata(in: index * chunk..<min(bytes.count, (index + 1) * chunk))
                try db.execute(
                    sql: "INSERT INTO chunks(hash, size, data) VALUES (?, ?, ?)",
                    arguments: [VersionedStore.hash(piece), piece.count, piece])
                try db.execute(
                    sql: "INSERT INTO chunk_map(node, branch, idx, version, chunk) VALUES (?, 0, ?, ?, ?)",
                    arguments: [document.root.rawValue, index, version.rawValue, db.lastInsertedRowID])
            }
        }
        try queue.close()

        let store = try SQLiteStore(path: path)
        #expect(try store.readContents(of: document.root, at: nil, offset: 0, count: bytes.count) == bytes)
        #expect(
            try store.readContents(of: document.root, at: version, offset: Int64(chunk - 10), count: 20)
                == bytes.subdata(in: chunk - 10..<chunk + 10))
        #expect(try store.checkIntegrity().isClean)
        #expect(try store.retentionPolicy() == .standard)

        // An edit in the middle: the fixed chunks around it are cut again, the old version stays.
        var edited = bytes
        edited.replaceSubrange(5000..<5010, with: Data(repeating: 0x41, count: 10))
        var changes = DocumentChanges(document: document.id, base: version)
        changes.contents[document.root] = .sparse(
            size: Int64(edited.count), chunks: [1], source: DataContentsSource(edited))
        let saved = try store.save(changes)
        #expect(try store.readContents(of: document.root, at: nil, offset: 0, count: edited.count) == edited)
        #expect(
            try store.readContents(of: document.root, at: version, offset: 0, count: bytes.count) == bytes)
        #expect(saved.bytesWritten <= Int64(bytes.count))
        #expect(try store.checkIntegrity().isClean)
    }

    @Test(
        "A store from before the current-extents table gets one, derived from its history, and the names index",
        arguments: StoreKind.all)
    func currentExtentsAreDerived(_ kind: StoreKind) throws {
        let fixture = try StoreFixture(kind, chunkSize: 64 * 1024)
        let store = fixture.store
        let document = try store.createDocument(
            named: "m.bin", kind: .flat, type: nil, permissions: nil, origin: "")
        var saved: [(version: VersionID, bytes: Data)] = []
        for seed in 0..<3 {
            let bytes = sampleBytes(200_000 + seed * 50_000, seed: UInt64(40 + seed))
            var changes = DocumentChanges(
                document: document.id, base: try store.document(document.id).currentVersion)
            var record = try #require(try store.node(document.root))
            record.size = Int64(bytes.count)
            changes.nodes = [record]
            changes.contents[document.root] = .replace(DataContentsSource(bytes))
            saved.append((try store.save(changes).version.id, bytes))
        }
        // What the formats before wrote: no extents_live, names indexed by parent and name only
        // (SQLite: migrations up to v6, format 6; PostgreSQL: format 5).
        let before =
            "DROP TABLE extents_live; DROP INDEX nodes_by_name; CREATE INDEX nodes_by_parent ON nodes(parent, name)"
        switch kind {
        case .sqlite:
            _ = try fixture.sql(
                "\(before); DELETE FROM grdb_migrations WHERE identifier IN ('v7', 'v8'); UPDATE store_meta SET value = 6 WHERE key = 'format'"
            )
        default:
            _ = try fixture.sql("\(before); UPDATE store_meta SET value = 5 WHERE key = 'format'")
        }
        let reopened = try fixture.reopen()
        let indexes = try fixture.sql(
            kind == .sqlite
                ? "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'nodes' ORDER BY name"
                : "SELECT indexname FROM pg_indexes WHERE tablename = 'nodes' ORDER BY indexname")
        #expect(indexes.contains("nodes_by_name") && !indexes.contains("nodes_by_parent"), "\(indexes)")
        for (version, bytes) in saved {
            #expect(
                try reopened.readContents(of: document.root, at: version, offset: 0, count: bytes.count)
                    == bytes)
        }
        let last = try #require(saved.last).bytes
        #expect(try reopened.readContents(of: document.root, at: nil, offset: 0, count: last.count) == last)
        let report = try reopened.checkIntegrity()
        #expect(report.isClean, "\(report.problems)")
    }
    @Test(
        "A format-9 SQLite store opens as format 10, without the index of extents by chunk, and collection removes exactly the chunks nothing names"
    )
    func extentsByChunkDropped() throws {
        let file = try FlatFile(.sqlite, chunkSize: VersionedStore.defaultChunkSize)
        let first = sampleBytes(3 << 20, seed: 70)
        let second = sampleBytes(3 << 20, seed: 71)
        let kept = try file.save(.replace(DataContentsSource(first))).version.id
        _ = try file.save(.replace(DataContentsSource(second)))
        _ = try file.fixture.sql(
            "CREATE INDEX extents_by_chunk ON extents(chunk); DELETE FROM grdb_migrations WHERE identifier = 'v10'; UPDATE store_meta SET value = 9 WHERE key = 'format'"
        )
        let reopened = try #require(try file.fixture.reopen() as? SQLiteStore)
        #expect(try file.fixture.sql("SELECT value FROM store_meta WHERE key = 'format'") == "10")
        #expect(
            try file.fixture.sql("SELECT COUNT(*) FROM sqlite_master WHERE name = 'extents_by_chunk'") == "0")
        // A chunk nothing names, beside the two versions' chunks.
        let stray = sampleBytes(100_000, seed: 72)
        try reopened.backend.write(durable: true) { tx in
            _ = try tx.insertChunk(hash: VersionedStore.hash(stray), data: stray, offset: 0)
        }
        let removed = try reopened.backend.write(durable: true) { tx in try tx.removeUnreferencedChunks() }
        #expect(removed.count == 1 && removed.bytes == Int64(stray.count))
        #expect(
            try reopened.readContents(of: file.document.root, at: kept, offset: 0, count: first.count)
                == first)
        #expect(
            try reopened.readContents(of: file.document.root, at: nil, offset: 0, count: second.count)
                == second)
        let again = try reopened.backend.write(durable: true) { tx in try tx.removeUnreferencedChunks() }
        #expect(again.count == 0)
        let report = try reopened.checkIntegrity()
        #expect(report.isClean, "\(report.problems)")
    }
}
