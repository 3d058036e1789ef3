import DocumentEngine
import Foundation
import SQLiteStore
import StoreTestSupport
import TestSupport
import Testing

/// The write-ahead log is copied into the database file beside the commits, not inside them.
@Suite("SQLite checkpoints")
struct SQLiteCheckpointTests {
    let file: FlatFile
    let sqlite: SQLiteStore
    var database: Int64 { StoreTestTools.fileSize(sqlite.path) }
    var log: Int64 { StoreTestTools.fileSize(sqlite.path + "-wal") }

    init() throws {
        file = try FlatFile()
        sqlite = try #require(file.store as? SQLiteStore)
        try sqlite.checkpoint()
    }

    /// Runs `body` with background checkpoints held back.
    func suspended(_ body: () throws -> Void) rethrows {
        sqlite.suspendBackgroundCheckpoints()
        defer { sqlite.resumeBackgroundCheckpoints() }
        try body()
    }

    func waitForCheckpoints(_ count: Int) {
        let deadline = Date().addingTimeInterval(20)
        while sqlite.backgroundCheckpoints < count && Date() < deadline { usleep(5000) }
    }

    @Test("A commit past 1,000 frames leaves the checkpoint to the background thread, which copies the log")
    func commitsDoNotCheckpoint() throws {
        let before = database
        let bytes = sampleBytes(6 << 20, seed: 1)
        try suspended {
            try file.save(.replace(DataContentsSource(bytes)))
            // SQLite's own automatic checkpoint would have copied the log inside that commit.
            #expect(database == before)
            #expect(log > 6 << 20)
            #expect(sqlite.backgroundCheckpoints == 0)
        }
        waitForCheckpoints(1)
        #expect(sqlite.backgroundCheckpoints == 1)
        #expect(database >= before + (6 << 20))
        // Everything was copied, so the next commit writes the log from its start again.
        let logAfter = log
        let small = sampleBytes(100_000, seed: 2)
        try file.save(.replace(DataContentsSource(small)))
        #expect(log == logAfter)
        try file.expectHolds(small)
        #expect(
            try SQLiteStore(path: sqlite.path).readContents(
                of: file.document.root, at: nil, offset: 0, count: 100_000) == small)
    }

    @Test(
        "When the background falls behind, a commit past 8,000 frames checkpoints itself, so the log stays bounded"
    )
    func theLogStaysBounded() throws {
        let before = database
        var last = Data()
        try suspended {
            for round in 0..<10 {
                last = sampleBytes(8 << 20, seed: UInt64(100 + round))
                try file.save(.replace(DataContentsSource(last)))
            }
            #expect(sqlite.backgroundCheckpoints == 0)
            // 80 MiB were committed; the log holds at most the backstop's 8,000 frames of 4 KiB
            // and one more save (2,048 frames), the database file the rest.
            #expect(log < 48 << 20, "the log grew to \(log) bytes")
            #expect(database >= before + (32 << 20))
        }
        try file.expectHolds(last)
    }

    @Test("A store closes while a background checkpoint is pending, and opens again whole")
    func closesWithACheckpointPending() throws {
        let path = sqlite.path
        let root = file.document.root
        let bytes = sampleBytes(6 << 20, seed: 3)
        do {
            let other = try SQLiteStore(path: path)
            var changes = DocumentChanges(
                document: file.document.id, base: try other.document(file.document.id).currentVersion)
            changes.contents[root] = .replace(DataContentsSource(bytes))
            _ = try other.save(changes)
        }  // released here, with its checkpoint requested and perhaps running
        let reopened = try SQLiteStore(path: path)
        #expect(try reopened.readContents(of: root, at: nil, offset: 0, count: bytes.count) == bytes)
        #expect(try reopened.checkIntegrity().isClean)
    }
}
