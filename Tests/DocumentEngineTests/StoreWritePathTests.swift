import Foundation
import GRDB
import StoreTestSupport
import TestSupport
import Testing
import VersionedStore

@testable import DocumentEngine
@testable import PostgresStore
@testable import SQLiteStore

#if canImport(Glibc)
    import Glibc
#endif

// What the file system's write path needs from the store.

/// One read a contents source served.
struct SourceRead: Equatable, CustomStringConvertible {
    var offset: Int64
    var count: Int
    var description: String { "\(count)@\(offset)" }
}

/// The error ``LoggingSource`` throws when told to.
struct SourceFailure: Error, Equatable {}

/// Bytes in memory that log every read, and throw on read number `failingRead` (1-based).
struct LoggingSource: ContentsSource {
    let bytes: Data
    var failingRead: Int?
    let isStable: Bool
    let log = Locked<[SourceRead]>([])
    /// Asked at read number `probeAt` (1-based); its answer is kept in ``probed``.
    var probe: (@Sendable () -> Bool)? = nil
    var probeAt = 1
    private let probeAnswer = Locked<Bool?>(nil)

    init(_ bytes: Data, failingRead: Int? = nil, stable: Bool = false) {
        self.bytes = bytes
        self.failingRead = failingRead
        isStable = stable
    }

    var count: Int64 { Int64(bytes.count) }
    var reads: [SourceRead] { log.withLock { $0 } }
    var probed: Bool? { probeAnswer.withLock { $0 } }

    func read(offset: Int64, count: Int) throws -> Data {
        let number = log.withLock {
            $0.append(SourceRead(offset: offset, count: count))
            return $0.count
        }
        if number == probeAt, let probe { probeAnswer.withLock { $0 = probe() } }
        if number == failingRead { throw SourceFailure() }
        return try DataContentsSource(bytes).read(offset: offset, count: count)
    }
}

/// A flat document in a fresh store (SQLite unless told) with 4 KiB chunks.
struct FlatFile {
    static let chunk = 4096
    let fixture: StoreFixture
    var store: any VersionedDocumentStore { fixture.store }
    let document: DocumentInfo

    init(_ kind: StoreKind = .sqlite, chunkSize: Int = Self.chunk) throws {
        fixture = try StoreFixture(kind, chunkSize: chunkSize, name: "W")
        document = try fixture.store.createDocument(
            named: "file.bin", kind: .flat, type: nil, permissions: nil, origin: "test")
    }

    @discardableResult
    func save(_ update: ContentUpdate, durable: Bool = true) throws -> SaveResult {
        var changes = DocumentChanges(
            document: document.id, base: try store.document(document.id).currentVersion)
        changes.contents[document.root] = update
        changes.durable = durable
        return try store.save(changes)
    }

    /// The file reads as `expected`, and the store's integrity walk finds nothing.
    func expectHolds(_ expected: Data, sourceLocation: SourceLocation = #_sourceLocation) throws {
        #expect(try contents() == expected, sourceLocation: sourceLocation)
        #expect(try store.checkIntegrity().isClean, sourceLocation: sourceLocation)
    }

    func contents(at version: VersionID? = nil) throws -> Data {
        let size = try #require(try store.node(document.root, at: version)).size
        return try store.readContents(of: document.root, at: version, offset: 0, count: Int(size))
    }

    /// The extent rows a version wrote, as "start:chunk" ("start:" for a removal).
    func rows(of version: VersionID) throws -> [String] {
        try fixture.sql(
            """
            SELECT start || ':' || CASE WHEN chunk IS NULL THEN '' ELSE CAST(chunk AS TEXT) END FROM extents
            WHERE version = \(version.rawValue) ORDER BY start;
            """
        ).split(separator: "\n").map(String.init)
    }

    func chunkCount() throws -> Int {
        Int(try fixture.sql("SELECT COUNT(*) FROM chunks;")) ?? -1
    }

    /// `data` with chunk `index` replaced by `bytes`.
    static func replacing(_ data: Data, chunk index: Int, with bytes: Data) -> Data {
        var copy = data
        copy.replaceSubrange(index * chunk..<min(data.count, (index + 1) * chunk), with: bytes)
        return copy
    }
}

@Suite struct SparseUpdateTests {
    let c = FlatFile.chunk

    @Test(
        "Appending to a multi-chunk file reads its last page and writes at most a chunk",
        arguments: StoreKind.all)
    func appendIntoLastChunk(_ kind: StoreKind) throws {
        let file = try FlatFile(kind)
        let old = sampleBytes(10 * c + 100, seed: 1)
        try file.save(.replace(DataContentsSource(old)))
        file.fixture.purgeCache()
        let new = old + sampleBytes(50, seed: 2)
        let source = LoggingSource(new)
        let before = file.store.statistics
        let saved = try file.save(.sparse(size: Int64(new.count), chunks: [10], source: source))

        #expect(source.reads == [SourceRead(offset: Int64(10 * c), count: 150)])
        // The chunks around the end are cut again: the old bytes they hold are read, the new
        // chunk is at most a chunk size, and the extents before it stay.
        #expect(saved.bytesWritten >= 50 && saved.bytesWritten <= Int64(c), "\(saved.bytesWritten) bytes")
        #expect(file.store.statistics.chunksRead - before.chunksRead <= 3, "the last chunks only")
        #expect(try file.rows(of: saved.version.id).count <= 4)
        #expect(try file.store.node(file.document.root)?.size == Int64(new.count))
        #expect(try file.contents() == new)
        #expect(try file.store.checkIntegrity().isClean)
    }

    @Test(
        "Listing a middle chunk changes it alone; a listed chunk with the same bytes writes no row",
        arguments: StoreKind.all)
    func middleChunk(_ kind: StoreKind) throws {
        let file = try FlatFile(kind)
        let old = sampleBytes(5 * c, seed: 3)
        try file.save(.replace(DataContentsSource(old)))
        let new = FlatFile.replacing(old, chunk: 2, with: sampleBytes(c, seed: 4))
        let source = LoggingSource(new)
        let saved = try file.save(.sparse(size: Int64(new.count), chunks: [2, 1, 2], source: source))

        #expect(source.reads.map(\.offset) == [Int64(c), Int64(2 * c)], "each listed page once, in order")
        // About the changed page is stored: its new bytes, and the chunks it touches.
        let written = try file.rows(of: saved.version.id)
        // In a file this small the cuts may not meet the old ones again before its end; the
        // chunks before the change stay.
        #expect(
            saved.bytesWritten >= Int64(c) && saved.bytesWritten <= Int64(4 * c),
            "\(saved.bytesWritten) bytes, \(saved.chunksWritten) chunks, rows \(written)")
        #expect(try file.contents() == new)
        // The same bytes again store nothing and write no row.
        let same = try file.save(.sparse(size: Int64(new.count), chunks: [1, 2], source: LoggingSource(new)))
        #expect(same.chunksWritten == 0)
        #expect(try file.rows(of: same.version.id).isEmpty)

        // Zeros are holes: no chunk holds them.
        let zeroed = FlatFile.replacing(new, chunk: 3, with: Data(count: c))
        let holed = try file.save(
            .sparse(size: Int64(zeroed.count), chunks: [3], source: LoggingSource(zeroed)))
        #expect(holed.bytesWritten <= Int64(2 * c))
        #expect(try file.contents() == zeroed)
        #expect(try file.store.checkIntegrity().isClean)
    }

    @Test(
        "Shrinking into an unlisted chunk cuts it; growing again reads zeros past the old end",
        arguments: StoreKind.all)
    func shrinkThenGrow(_ kind: StoreKind) throws {
        let file = try FlatFile(kind)
        let old = sampleBytes(3 * c, seed: 5)
        let first = try file.save(.replace(DataContentsSource(old)))
        let unread = LoggingSource(Data())

        let shrunk = try file.save(.sparse(size: Int64(c + 1000), chunks: [], source: unread))
        #expect(try file.contents() == old.prefix(c + 1000))
        #expect(
            try file.rows(of: shrunk.version.id).count >= 2, "the chunk at the new end cut, the rest removed")
        #expect(try file.store.checkIntegrity().isClean)

        try file.save(.sparse(size: Int64(3 * c + 10), chunks: [], source: unread))
        #expect(try file.contents() == old.prefix(c + 1000) + Data(count: 2 * c - 1000 + 10))
        #expect(try file.contents(at: first.version.id) == old, "history is intact")
        #expect(unread.reads.isEmpty)
        #expect(try file.store.checkIntegrity().isClean)
    }

    @Test("Size 0 empties the file; listed chunks at or past the size are not read", arguments: StoreKind.all)
    func sizeZeroAndIndicesPastTheEnd(_ kind: StoreKind) throws {
        let file = try FlatFile(kind)
        try file.save(.replace(DataContentsSource(sampleBytes(2 * c + 7, seed: 6))))
        let ignored = LoggingSource(sampleBytes(3 * c, seed: 7))
        try file.save(.sparse(size: 0, chunks: [0, 1, 2], source: ignored))
        #expect(ignored.reads.isEmpty)
        #expect(try file.store.node(file.document.root)?.size == 0)
        #expect(try file.contents().isEmpty)
        #expect(try file.store.checkIntegrity().isClean)

        let bytes = sampleBytes(2 * c, seed: 8)
        let source = LoggingSource(bytes)
        try file.save(.sparse(size: Int64(2 * c), chunks: [9, 1, 2], source: source))
        #expect(source.reads == [SourceRead(offset: Int64(c), count: c)])
        #expect(try file.contents() == Data(count: c) + bytes.suffix(c), "chunk 0 was emptied: zeros")

        let version = try file.store.document(file.document.id).currentVersion
        #expect(throws: DocumentStoreError.invalidChange("negative chunk index -1")) {
            try file.save(.sparse(size: Int64(2 * c), chunks: [0, -1], source: source))
        }
        #expect(try file.store.document(file.document.id).currentVersion == version)
    }

    @Test("A source that throws aborts the save: nothing of it is kept", arguments: StoreKind.all)
    func throwingSourceRollsBack(_ kind: StoreKind) throws {
        let file = try FlatFile(kind)
        let old = sampleBytes(4 * c, seed: 9)
        let saved = try file.save(.replace(DataContentsSource(old)))
        let chunks = try file.chunkCount()
        let versions = try file.store.versions(of: file.document.id)
        let statistics = file.store.statistics
        let source = LoggingSource(sampleBytes(6 * c, seed: 10), failingRead: 3)

        #expect(throws: SourceFailure()) {
            try file.save(.sparse(size: Int64(6 * c), chunks: Array(0..<6), source: source))
        }
        #expect(source.reads.count == 3, "the save stopped at the failing read")
        #expect(try file.store.document(file.document.id).currentVersion == saved.version.id)
        #expect(try file.store.versions(of: file.document.id) == versions)
        #expect(try file.contents() == old)
        #expect(try file.chunkCount() == chunks, "the two chunks written before the failure were rolled back")
        #expect(file.store.statistics.chunksWritten == statistics.chunksWritten)
        #expect(try file.store.checkIntegrity().isClean)
    }

    @Test(
        "A removed file restored or re-added shows no chunk from its earlier life", arguments: StoreKind.all)
    func restoreOfARemovedFile(_ kind: StoreKind) throws {
        let fixture = try StoreFixture(kind, chunkSize: c)
        let store = fixture.store
        let doc = try store.createDocument(
            named: "R.pkg", kind: .package, type: nil, permissions: nil, origin: "")
        let id = try store.makeNodeIDs(count: 1)[0]
        let old = sampleBytes(c, seed: 13) + Data(count: c) + sampleBytes(c, seed: 14)  // chunk 1 a hole
        var create = DocumentChanges(document: doc.id, base: doc.currentVersion)
        create.nodes = [
            NodeRecord(
                id: id, document: doc.id, parent: doc.root, name: "x", kind: .regularFile, permissions: 0o644)
        ]
        create.contents[id] = .replace(DataContentsSource(old))
        let v1 = try store.save(create)
        // Later the hole is filled and the file grows, then the file is removed.
        let grown =
            FlatFile.replacing(old, chunk: 1, with: sampleBytes(c, seed: 15)) + sampleBytes(c, seed: 16)
        var fill = DocumentChanges(document: doc.id, base: v1.version.id)
        fill.contents[id] = .sparse(size: Int64(4 * c), chunks: [1, 3], source: DataContentsSource(grown))
        let v2 = try store.save(fill)
        var remove = DocumentChanges(document: doc.id, base: v2.version.id)
        remove.removedNodes = [id]
        _ = try store.save(remove)

        _ = try store.restore(v1.version.id, of: doc.id, origin: "test")
        #expect(try store.node(id)?.size == Int64(3 * c))
        #expect(try store.readContents(of: id, at: nil, offset: 0, count: 4 * c) == old)
        #expect(try store.checkIntegrity().isClean)

        // Removed again, then re-added with a sparse update of chunk 0 alone: it has no bytes
        // from before to keep, so chunks 1 and 2 read as zeros.
        var again = DocumentChanges(document: doc.id, base: try store.document(doc.id).currentVersion)
        again.removedNodes = [id]
        let removed = try store.save(again)
        var readd = DocumentChanges(document: doc.id, base: removed.version.id)
        readd.nodes = create.nodes
        let first = sampleBytes(c, seed: 17)
        readd.contents[id] = .sparse(size: Int64(3 * c), chunks: [0], source: DataContentsSource(first))
        _ = try store.save(readd)
        #expect(
            try store.readContents(of: id, at: nil, offset: 0, count: 3 * c) == first + Data(count: 2 * c))
        #expect(try store.checkIntegrity().isClean)
    }

    @Test("A sparse save reads and writes one chunk at a time (streaming)", arguments: StoreKind.all)
    func streaming(_ kind: StoreKind) throws {
        let file = try FlatFile(kind)
        let live = Locked((now: 0, most: 0))
        let source = LiveBufferSource(live: live)
        let count = 256
        let saved = try file.save(.sparse(size: Int64(count * c), chunks: Array(0..<count), source: source))
        #expect(saved.bytesWritten == Int64(count * c))
        #expect(live.withLock { $0.now } == 0)
        #expect(
            live.withLock { $0.most } <= 2, "at most \(live.withLock { $0.most }) chunks were alive at once")
        #expect(
            try file.store.readContents(of: file.document.root, at: nil, offset: Int64(77 * c), count: c)
                == sampleBytes(c, seed: 77))
    }
}

/// Chunk `i` is `sampleBytes(count, seed: i)`, each in a buffer of its own whose life is counted.
struct LiveBufferSource: ContentsSource {
    let live: Locked<(now: Int, most: Int)>
    var count: Int64 { .max }

    func read(offset: Int64, count: Int) throws -> Data {
        let bytes = UnsafeMutableRawPointer.allocate(byteCount: max(1, count), alignment: 16)
        sampleBytes(count, seed: UInt64(offset) / UInt64(FlatFile.chunk)).copyBytes(
            to: bytes.assumingMemoryBound(to: UInt8.self), count: count)
        live.withLock {
            $0.now += 1
            $0.most = max($0.most, $0.now)
        }
        let live = live
        return Data(
            bytesNoCopy: bytes, count: count,
            deallocator: .custom { pointer, _ in
                pointer.deallocate()
                live.withLock { $0.now -= 1 }
            })
    }
}

/// New contents from a stable source are cut and hashed before the save's transaction, so
/// that saves of different documents do that work side by side.
@Suite struct PrecutTests {
    @Test(
        "A whole file from a stable source is cut before the transaction, into the chunks the transaction would cut",
        arguments: StoreKind.all)
    func precutMatchesTheTransaction(_ kind: StoreKind) throws {
        let bytes = sampleBytes(300 * 1024 + 77, seed: 31)
        let pages = (bytes.count + FlatFile.chunk - 1) / FlatFile.chunk
        for stableFirst in [true, false] {
            let file = try FlatFile(kind)
            var first = LoggingSource(bytes, stable: stableFirst)
            first.probe = { [fixture = file.fixture] in (try? Self.writerIsIdle(fixture)) ?? false }
            let saved = try file.save(.replace(first))
            #expect(saved.bytesWritten == Int64(bytes.count))
            // Either way the source is read once, before the store's write transaction: a
            // stable one into a precut, another into a plan that keeps its new chunks' bytes.
            #expect(first.reads.count == pages, "\(first.reads.count) reads")
            #expect(first.probed == true, "first read outside the write transaction")
            #expect(try file.contents(at: saved.version.id) == bytes)

            // The same bytes the other way deduplicate entirely: the cuts and hashes agree.
            let second = LoggingSource(bytes, stable: !stableFirst)
            let again = try file.save(
                .sparse(size: Int64(bytes.count), chunks: Array(0..<pages), source: second))
            #expect(again.chunksWritten == 0)
            #expect(again.bytesWritten == 0)
            #expect(try file.rows(of: again.version.id).isEmpty)
            try file.expectHolds(bytes)
        }
    }

    /// Whether another connection can take the store's write lock now (none of its write
    /// transactions is open).
    static func writerIsIdle(_ fixture: StoreFixture) throws -> Bool {
        switch fixture.kind {
        case .sqlite:
            var configuration = Configuration()
            configuration.busyMode = .immediateError
            let queue = try DatabaseQueue(path: fixture.location, configuration: configuration)
            do {
                try queue.inDatabase { db in
                    try db.execute(sql: "BEGIN IMMEDIATE")
                    try db.execute(sql: "ROLLBACK")
                }
                return true
            } catch { return false }
        case .postgres:
            let answer = try fixture.sql("SELECT pg_try_advisory_xact_lock(\(PostgresSchema.writeLock))")
            return answer.trimmingCharacters(in: .whitespacesAndNewlines) == "t"
        case .memory:
            return false
        }
    }

    @Test(
        "A large file's new chunks are stored ahead in batches; the save reads the source once",
        arguments: StoreKind.all)
    func largeFilesStoreChunksAhead(_ kind: StoreKind) throws {
        let file = try FlatFile(kind)
        let bytes = sampleBytes(10 << 20, seed: 34)
        let pages = (bytes.count + FlatFile.chunk - 1) / FlatFile.chunk
        var source = LoggingSource(bytes, stable: true)
        // Past 9 MiB, the first 8 MiB batch is already in the store, for all to see.
        source.probeAt = (9 << 20) / FlatFile.chunk
        source.probe = { [fixture = file.fixture] in
            (try? fixture.sql("SELECT count(*) FROM chunks").trimmingCharacters(in: .whitespacesAndNewlines))
                .flatMap { Int($0) }.map { $0 > 0 } ?? false
        }
        let saved = try file.save(.replace(source))
        #expect(saved.bytesWritten == Int64(bytes.count))
        // One pass to cut, hash and store the first 8 MiB in batches ahead; the rest is kept
        // for the save's own transaction.
        #expect(source.reads.count == pages, "\(source.reads.count) reads")
        #expect(source.probed == true, "chunks stored before the save")
        try file.expectHolds(bytes)
    }

    @Test("A stable source that covers part of a file is not precut", arguments: StoreKind.all)
    func partialUpdatesAreNotPrecut(_ kind: StoreKind) throws {
        let file = try FlatFile(kind)
        let old = sampleBytes(20 * FlatFile.chunk, seed: 32)
        try file.save(.replace(DataContentsSource(old)))
        let new = FlatFile.replacing(old, chunk: 7, with: sampleBytes(FlatFile.chunk, seed: 33))
        let source = LoggingSource(new, stable: true)
        try file.save(.sparse(size: Int64(new.count), chunks: [7], source: source))
        #expect(source.reads == [SourceRead(offset: Int64(7 * FlatFile.chunk), count: FlatFile.chunk)])
        #expect(try file.contents() == new)
    }
}

/// Small files are cut finer, so an edit of one stores a few KiB, not a large chunk's worth.
@Suite struct SmallFileChunkingTests {
    @Test(
        "An edit of a 200 KiB file stores at most two small chunks, however it is saved; a 2 MiB file keeps large chunks",
        arguments: StoreKind.all)
    func smallFilesCutFiner(_ kind: StoreKind) throws {
        let file = try FlatFile(kind, chunkSize: SQLiteStore.defaultChunkSize)
        let store = file.store
        func save(_ update: ContentUpdate) throws -> SaveResult { try file.save(update) }
        var bytes = sampleBytes(200 << 10, seed: 41)
        let first = try save(.replace(DataContentsSource(bytes)))
        #expect(first.chunksWritten >= 4, "\(first.chunksWritten) chunks for 200 KiB")
        // An editor's whole-file write, then an in-place write of the same page.
        for (round, offset) in [100_000, 150_000].enumerated() {
            bytes.replaceSubrange(offset..<offset + 100, with: sampleBytes(100, seed: UInt64(50 + round)))
            let update: ContentUpdate =
                round == 0
                ? .replace(DataContentsSource(bytes))
                : .sparse(size: Int64(bytes.count), chunks: [0], source: DataContentsSource(bytes))
            let saved = try save(update)
            #expect(saved.bytesWritten <= 64 << 10, "an edit stored \(saved.bytesWritten) bytes")
            #expect(try file.contents() == bytes)
        }
        let large = sampleBytes(2 << 20, seed: 42)
        let saved = try save(.replace(DataContentsSource(large)))
        #expect(saved.chunksWritten <= 32, "\(saved.chunksWritten) chunks for 2 MiB")
        #expect(try file.contents() == large)
        // Shrunk into the small class: the new end is cut again, the rest kept, the bytes right.
        let shrunk = sampleBytes(100 << 10, seed: 42)
        let cut = try save(.sparse(size: Int64(shrunk.count), chunks: [], source: DataContentsSource(shrunk)))
        #expect(cut.bytesWritten <= 100 << 10)
        #expect(try file.contents() == shrunk)
        #expect(try store.checkIntegrity().isClean)
    }
}

@Suite struct DeferredSaveTests {
    @Test("A deferred save is seen at once by another store on the file; the writer goes back to FULL")
    func visibleAtOnce() throws {
        let file = try FlatFile()
        let sqlite = try #require(file.store as? SQLiteStore)
        let other = try SQLiteStore(path: sqlite.path)
        let bytes = sampleBytes(3 * FlatFile.chunk + 5, seed: 11)
        let saved = try file.save(.replace(DataContentsSource(bytes)), durable: false)
        #expect(try other.document(file.document.id).currentVersion == saved.version.id)
        #expect(
            try other.readContents(of: file.document.root, at: nil, offset: 0, count: bytes.count) == bytes)
        #expect(try StoreTestTools.writerSynchronous(sqlite) == 2)

        // Also after a deferred save that failed.
        #expect(throws: SourceFailure()) {
            try file.save(
                .sparse(size: 10, chunks: [0], source: LoggingSource(Data(count: 10), failingRead: 1)),
                durable: false)
        }
        #expect(try StoreTestTools.writerSynchronous(sqlite) == 2)
        #expect(
            try other.readContents(of: file.document.root, at: nil, offset: 0, count: bytes.count) == bytes)
    }

    @Test("synchronize() returns when nothing is pending, after a checkpoint, and after deferred saves")
    func synchronize() throws {
        let file = try FlatFile()
        let sqlite = try #require(file.store as? SQLiteStore)
        try file.store.synchronize()
        try sqlite.checkpoint()
        #expect(StoreTestTools.fileSize(sqlite.path + "-wal") == 0)
        try file.store.synchronize()
        let bytes = sampleBytes(5000, seed: 12)
        try file.save(.replace(DataContentsSource(bytes)), durable: false)
        try file.store.synchronize()
        try file.store.synchronize()
        #expect(
            try SQLiteStore(path: sqlite.path).readContents(
                of: file.document.root, at: nil, offset: 0, count: 5000) == bytes)
    }

    /// The round store-torture's deferred file is at, after checking it holds exactly that round's
    /// bytes and that the store is whole.
    func verifiedRound(_ path: String, _ name: String) throws -> Int {
        typealias Contents = StoreRobustnessTests.TortureContents
        let store = try SQLiteStore(path: path)
        let report = try store.checkIntegrity()
        #expect(report.isClean, "\(report.problems)")
        let info = try #require(try store.document(named: name))
        let size = try #require(try store.node(info.root)).size
        let data = try store.readContents(of: info.root, at: nil, offset: 0, count: Int(size))
        guard let round = Contents.round(of: data) else {
            #expect(data.isEmpty)
            return 0
        }
        #expect(data == Contents.contents(round: round, index: round % Contents.fileCount))
        return round
    }

    @Test("A deferred save survives SIGKILL of the process that made it", .timeLimit(.minutes(3)))
    func aKilledProcessKeepsItsDeferredSaves() throws {
        guard let program = StoreRobustnessTests.tortureProgram() else {
            Issue.record(
                "store-torture is not built next to the tests; run `swift build --build-tests` first")
            return
        }
        let tmp = try TemporaryDirectory()
        let path = tmp.path("Deferred.docstore")
        let name = "Deferred.bin"
        do {
            let store = try SQLiteStore(path: path, options: .create, chunkSize: FlatFile.chunk)
            _ = try store.createDocument(
                named: name, kind: .flat, type: nil, permissions: nil, origin: "test")
        }
        var random = SystemRandomNumberGenerator()
        var lastRound = 0
        var acknowledged = 0
        for iteration in 0..<10 {
            let delay = 20 + Int(random.next() % 280)
            let child = Process()
            child.executableURL = program
            child.arguments = [path, name, "100000", "deferred"]
            let output = Pipe()
            child.standardOutput = output
            child.standardError = FileHandle.nullDevice
            try child.run()
            usleep(UInt32(delay * 1000))
            kill(child.processIdentifier, SIGKILL)
            child.waitUntilExit()
            let printed = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            let saved = printed.split(separator: "\n").compactMap { line in
                line.hasPrefix("saved ") ? Int(line.dropFirst(6)) : nil
            }
            let round = try verifiedRound(path, name)
            print(
                "deferred iteration \(iteration): killed after \(delay) ms, \(saved.count) saves acknowledged, at round \(round)"
            )
            #expect(round >= (saved.last ?? 0), "an acknowledged deferred save was lost")
            #expect(round >= lastRound, "the store went back in time")
            #expect(round <= max(saved.last ?? 0, lastRound) + 1)
            lastRound = max(lastRound, round)
            acknowledged += saved.count
        }
        #expect(acknowledged > 0, "the child never saved: it was killed too early every time")
    }
}

@Suite struct FullDiskTests {
    @Test(
        "SQLITE_FULL on a full disk, and I/O errors SQLite met as ENOSPC or EDQUOT, are noSpace; SQLITE_FULL on a disk with room is a damaged store; other I/O errors pass"
    )
    func mapping() {
        let path = "/somewhere/S.docstore"
        func mapped(_ code: ResultCode, _ systemErrno: Int32) -> DocumentStoreError? {
            SQLiteStore.storeError(DatabaseError(resultCode: code), path: path, systemErrno: systemErrno)
                as? DocumentStoreError
        }
        #expect(mapped(.SQLITE_FULL, 0) == .noSpace(path))
        #expect(mapped(.SQLITE_IOERR_WRITE, ENOSPC) == .noSpace(path))
        #expect(mapped(.SQLITE_IOERR_SHMSIZE, EDQUOT) == .noSpace(path))
        #expect(mapped(.SQLITE_IOERR_WRITE, EIO) == nil)
        #expect(DocumentStoreError.noSpace(path).description == "the disk holding the store \(path) is full")
        // A damaged file can make SQLite say "full" too: on a disk with room, it is the file.
        let roomy = NSTemporaryDirectory() + "/S.docstore"
        let damaged = SQLiteStore.storeError(
            DatabaseError(resultCode: .SQLITE_FULL), path: roomy, systemErrno: 0)
        if case .corrupt(let at, _)? = damaged as? DocumentStoreError {
            #expect(at == roomy)
        } else {
            Issue.record("SQLITE_FULL on a disk with room was \(damaged), not corrupt")
        }
        #expect(
            SQLiteStore.storeError(DatabaseError(resultCode: .SQLITE_FULL), path: roomy, systemErrno: ENOSPC)
                as? DocumentStoreError == .noSpace(roomy))
    }

    /// Runs `body` with a store path on a tmpfs of `size` (its folder is `disk`), unmounted after.
    func onTmpfs(size: String, _ body: (_ disk: String, _ path: String) throws -> Void) throws {
        let tmp = try TemporaryDirectory()
        let disk = tmp.path("disk")
        try tmp.mkdir("disk")
        guard mount("tmpfs", disk, "tmpfs", 0, "size=\(size),mode=0700") == 0 else {
            Issue.record("cannot mount a tmpfs on \(disk): \(String(cString: strerror(errno)))")
            return
        }
        defer {
            if umount2(disk, 0) != 0 { umount2(disk, Int32(MNT_DETACH)) }
        }
        try body(disk, disk + "/Full.docstore")
    }

    @Test(
        "A full disk fails the save with noSpace; the store stays whole and saves again once there is room",
        .enabled(if: getuid() == 0, "mounting a tmpfs needs root"))
    func fullDisk() throws {
        try onTmpfs(size: "4m") { disk, path in
            let store = try SQLiteStore(path: path, options: .create, chunkSize: FlatFile.chunk)
            let document = try store.createDocument(
                named: "Full.pkg", kind: .package, type: nil, permissions: nil, origin: "test")
            var version = document.currentVersion
            var saved: [(StoreNodeID, Data)] = []
            // Allocated now: allocating is a write too, and would meet the full disk first.
            let ids = try store.makeNodeIDs(count: 210)

            /// Saves a new 64 KiB file; returns the error if the save failed.
            func addFile(durable: Bool = true) throws -> DocumentStoreError? {
                let id = ids[saved.count]
                let bytes = sampleBytes(64 * 1024, seed: UInt64(1000 + saved.count))
                var changes = DocumentChanges(document: document.id, base: version)
                changes.nodes = [
                    NodeRecord(
                        id: id, document: document.id, parent: document.root, name: "f\(saved.count)",
                        kind: .regularFile, permissions: 0o644)
                ]
                changes.contents[id] = .replace(DataContentsSource(bytes))
                changes.durable = durable
                do {
                    version = try store.save(changes).version.id
                    saved.append((id, bytes))
                    return nil
                } catch let error as DocumentStoreError {
                    return error
                }
            }

            var failure: DocumentStoreError?
            while failure == nil && saved.count < 200 { failure = try addFile() }
            print("full disk: \(saved.count) saves fit, then \(String(describing: failure))")
            #expect(failure == .noSpace(path))
            #expect(failure?.description.contains(path) == true)
            #expect(saved.count > 10, "a 4 MiB disk holds more than ten 64 KiB files")

            func expectWhole() throws {
                #expect(try store.document(document.id).currentVersion == version)
                for (id, bytes) in saved {
                    #expect(try store.readContents(of: id, at: nil, offset: 0, count: bytes.count) == bytes)
                }
                let report = try store.checkIntegrity()
                #expect(report.isClean, "\(report.problems)")
            }
            try expectWhole()
            // A deferred save fails alike, and leaves the writer at FULL.
            #expect(try addFile(durable: false) == .noSpace(path))
            #expect(try StoreTestTools.writerSynchronous(store) == 2)
            try expectWhole()

            guard mount("tmpfs", disk, "tmpfs", UInt(MS_REMOUNT), "size=64m,mode=0700") == 0 else {
                Issue.record("cannot grow the tmpfs: \(String(cString: strerror(errno)))")
                return
            }
            #expect(try addFile() == nil)
            #expect(try addFile(durable: false) == nil)
            try store.synchronize()
            try expectWhole()
        }
    }

    @Test(
        "A large save whose batches, stored ahead, meet a full disk fails with noSpace naming the store; it stays whole",
        .enabled(if: getuid() == 0, "mounting a tmpfs needs root"))
    func fullDiskInALargeSave() throws {
        try onTmpfs(size: "8m") { disk, path in
            let store = try SQLiteStore(path: path, options: .create)
            let document = try store.createDocument(
                named: "big.bin", kind: .flat, type: nil, permissions: nil, origin: "test")
            let small = sampleBytes(100_000, seed: 40)
            var changes = DocumentChanges(document: document.id, base: document.currentVersion)
            changes.contents[document.root] = .replace(DataContentsSource(small))
            let version = try store.save(changes).version.id
            // 24 MiB: five batches of 4 MiB are stored ahead of the save, and the disk holds 8.
            let large = sampleBytes(24 << 20, seed: 41)
            changes = DocumentChanges(document: document.id, base: version)
            changes.contents[document.root] = .replace(DataContentsSource(large))
            #expect(throws: DocumentStoreError.noSpace(path)) { _ = try store.save(changes) }
            #expect(try store.document(document.id).currentVersion == version)
            #expect(
                try store.readContents(of: document.root, at: nil, offset: 0, count: small.count) == small)
            #expect(try store.checkIntegrity().isClean)
            // With room, the same save goes through; what the failed one left is garbage.
            guard mount("tmpfs", disk, "tmpfs", UInt(MS_REMOUNT), "size=96m,mode=0700") == 0 else {
                Issue.record("cannot grow the tmpfs: \(String(cString: strerror(errno)))")
                return
            }
            _ = try store.save(changes)
            #expect(
                try store.readContents(of: document.root, at: nil, offset: 0, count: large.count) == large)
            #expect(try store.checkIntegrity().isClean)
        }
    }
}

/// Bytes in memory that name the ranges where they differ from the file they update, and log
/// the reads they serve.
struct RangedSource: ContentsSource {
    let bytes: Data
    let changedRanges: [Range<Int64>]?
    /// When set, the only bytes it serves (as the mount's spill holds written pages): a read
    /// past them throws.
    var heldRanges: [Range<Int64>]? = nil
    let log = Locked<[SourceRead]>([])
    var count: Int64 { Int64(bytes.count) }
    var isStable: Bool { true }
    var reads: [SourceRead] { log.withLock { $0 } }
    func read(offset: Int64, count: Int) throws -> Data {
        log.withLock { $0.append(SourceRead(offset: offset, count: count)) }
        if let heldRanges {
            var at = offset
            let end = min(offset + Int64(count), Int64(bytes.count))
            for range in heldRanges.sorted(by: { $0.lowerBound < $1.lowerBound }) where range.lowerBound <= at
            {
                at = max(at, range.upperBound)
            }
            if at < end { throw SourceFailure() }
        }
        return try DataContentsSource(bytes).read(offset: offset, count: count)
    }

    /// `ranges` widened to whole 4 KiB pages below `size`, as the mount holds them.
    static func pages(_ ranges: [Range<Int64>], below size: Int) -> [Range<Int64>] {
        ranges.compactMap { range in
            let low = range.lowerBound / 4096 * 4096
            let high = min(Int64(size), (range.upperBound + 4095) / 4096 * 4096)
            return low < high ? low..<high : nil
        }
    }
}

/// ``ContentsSource/changedRanges``: a save cuts again only around the edits, and the result is
/// the one cutting the whole file gives.
@Suite struct ChangedRangesTests {
    static let chunk = 256 << 10

    /// The current extents of `document`'s root as "start+length:chunk".
    static func extents(_ fixture: StoreFixture, _ document: DocumentInfo) throws -> [String] {
        try fixture.sql(
            """
            SELECT start || '+' || length || ':' || COALESCE(CAST(chunk AS TEXT), '') FROM extents_live
            WHERE node = \(document.root.rawValue) ORDER BY start;
            """
        ).split(separator: "\n").map(String.init)
    }

    /// Sizes stay in one class of the store's cutting (up to a chunk, or over it): a file that
    /// changes class keeps the extents it had, which a whole new cut would not give.
    @Test(
        "Random edits saved with their ranges: the bytes, and the extents a cut of the whole file gives",
        arguments: [
            (20_000, 250_000, false), (300_000, 1_600_000, false), (20_000, 250_000, true),
            (300_000, 1_600_000, true),
        ])
    func editsMatchAFullCut(_ bounds: (Int, Int, Bool)) throws {
        // `held`: the source holds only the edited pages, and the store reads the rest itself.
        let (low, high, held) = bounds
        let file = try FlatFile(.sqlite, chunkSize: Self.chunk)
        let twin = try file.store.createDocument(
            named: "twin.bin", kind: .flat, type: nil, permissions: nil, origin: "test")
        var bytes = sampleBytes((low + high) / 2, seed: UInt64(low))
        let first = try file.save(.replace(DataContentsSource(bytes)))
        // Read at its version, the whole file is known; each save then carries what is known
        // to its own version (``CarriedExtentsTests``), which the reads below check too.
        #expect(
            try file.store.readContents(
                of: file.document.root, at: first.version.id, offset: 0, count: bytes.count) == bytes)
        var random = SplitMix64(seed: UInt64(high))
        for round in 0..<40 {
            var new = bytes
            var edited: [Range<Int64>] = []
            if round % 7 == 3 {
                let cut = Int.random(in: low...new.count, using: &random)
                edited.append(Int64(cut)..<Int64(new.count))
                new = new.prefix(cut)
            }
            for _ in 0..<Int.random(in: 1...3, using: &random) {
                let length = Int.random(in: 1...9000, using: &random)
                let at = Int.random(in: 0...min(new.count + 5000, high - length), using: &random)
                if at + length > new.count { new.append(Data(count: at + length - new.count)) }
                new.replaceSubrange(at..<at + length, with: sampleBytes(length, seed: random.next()))
                edited.append(Int64(at)..<Int64(at + length))
            }
            let pages = (new.count + Self.chunk - 1) / Self.chunk
            let saved = try file.save(
                .sparse(
                    size: Int64(new.count), chunks: Array(0..<pages),
                    source: RangedSource(
                        bytes: new, changedRanges: edited.reversed(),
                        heldRanges: held ? RangedSource.pages(edited, below: new.count) : nil)))
            #expect(try file.contents() == new, "round \(round)")
            let atVersion = try file.store.readContents(
                of: file.document.root, at: saved.version.id, offset: 0, count: new.count)
            #expect(atVersion == new, "round \(round), at its version")
            var changes = DocumentChanges(
                document: twin.id, base: try file.store.document(twin.id).currentVersion)
            changes.contents[twin.root] = .replace(DataContentsSource(new))
            _ = try file.store.save(changes)
            #expect(
                try Self.extents(file.fixture, file.document) == Self.extents(file.fixture, twin),
                "round \(round)")
            bytes = new
        }
        #expect(try file.store.checkIntegrity().isClean)
    }

    @Test(
        "A save that lists every chunk but names one small edit reads only around it",
        arguments: StoreKind.all)
    func onlyAroundTheEdit(_ kind: StoreKind) throws {
        let file = try FlatFile(kind, chunkSize: Self.chunk)
        let old = sampleBytes(6 * Self.chunk, seed: 9)
        try file.save(.replace(DataContentsSource(old)))
        var new = old
        let at = 3 * Self.chunk + 1000
        new.replaceSubrange(at..<at + 100, with: sampleBytes(100, seed: 10))
        let source = RangedSource(bytes: new, changedRanges: [Int64(at)..<Int64(at + 100)])
        try file.save(.sparse(size: Int64(new.count), chunks: Array(0..<6), source: source))
        try file.expectHolds(new)
        // The chunk around the edit starts at most a chunk size before it and ends at most one
        // after it: pages 2 to 4, not all six.
        let pages = Set(source.reads.map { $0.offset / Int64(Self.chunk) })
        #expect(pages.contains(3) && pages.isSubset(of: [2, 3, 4]), "\(source.reads)")
    }

    @Test(
        "A source that holds only its edited pages is read there alone; one missing a changed byte is refused",
        arguments: StoreKind.all)
    func heldPagesOnly(_ kind: StoreKind) throws {
        let file = try FlatFile(kind, chunkSize: Self.chunk)
        let old = sampleBytes(6 * Self.chunk, seed: 11)
        try file.save(.replace(DataContentsSource(old)))
        var new = old
        let edits: [Range<Int>] = [
            8192..<8292, 3 * Self.chunk + 5000..<3 * Self.chunk + 9000, 1_500_000..<1_500_010,
        ]
        for (index, edit) in edits.enumerated() {
            new.replaceSubrange(edit, with: sampleBytes(edit.count, seed: UInt64(20 + index)))
        }
        let edited = edits.map { Int64($0.lowerBound)..<Int64($0.upperBound) }
        let held = RangedSource.pages(edited, below: new.count)
        let source = RangedSource(bytes: new, changedRanges: edited, heldRanges: held)
        try file.save(.sparse(size: Int64(new.count), chunks: Array(0..<6), source: source))
        try file.expectHolds(new)
        #expect(source.reads.reduce(0) { $0 + $1.count } <= 4 * 4096, "\(source.reads)")
        #expect(try file.store.checkIntegrity().isClean)

        // A changed byte outside what the source holds: the save fails and the file stays.
        var bad = new
        bad.replaceSubrange(100_000..<100_010, with: sampleBytes(10, seed: 30))
        let refused = RangedSource(
            bytes: bad, changedRanges: [100_000..<100_010], heldRanges: [98_304..<100_004])
        #expect(throws: DocumentStoreError.self) {
            try file.save(.sparse(size: Int64(bad.count), chunks: [0], source: refused))
        }
        #expect(refused.reads.isEmpty)
        try file.expectHolds(new)
    }
}

/// A save's files at its new version are known from what reads at the version before learned.
@Suite(.enabled(if: StoreKind.postgresURL != nil))
struct CarriedExtentsTests {
    @Test(
        "After a save, unchanged bytes at its version read from what the store knew before, with the server gone"
    )
    func readsAtTheNewVersionNeedNoServer() throws {
        let file = try FlatFile(.postgres, chunkSize: 256 << 10)
        let root = file.document.root
        let old = sampleBytes(1 << 20, seed: 21)
        try file.save(.replace(DataContentsSource(old)))
        let before = try file.store.document(file.document.id).currentVersion
        // A read at that version learns the file's extents and caches its chunks.
        #expect(try file.store.readContents(of: root, at: before, offset: 0, count: old.count) == old)
        var new = old
        new.replaceSubrange(700_000..<700_100, with: sampleBytes(100, seed: 22))
        let saved = try file.save(
            .sparse(
                size: Int64(new.count), chunks: [2],
                source: RangedSource(bytes: new, changedRanges: [700_000..<700_100])))
        try file.fixture.cutConnections()
        defer { try? file.fixture.allowConnections() }
        let unchanged = try file.store.readContents(of: root, at: saved.version.id, offset: 0, count: 300_000)
        #expect(unchanged == new.prefix(300_000))
    }
}
