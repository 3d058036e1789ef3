import DocumentEngine
import Foundation
import StoreTestSupport
import TestSupport
import Testing
import VersionedStore

@testable import SQLiteStore

/// Changes an SQLite store logs durably before it saves them (`IntentLog`), and replays when a
/// process that logged them is gone.
@Suite("SQLite intent log")
struct SQLiteIntentLogTests {
    let file: FlatFile
    let sqlite: SQLiteStore
    let old = sampleBytes(64 * FlatFile.chunk, seed: 1)

    init() throws {
        file = try FlatFile(.sqlite)
        sqlite = try #require(file.store as? SQLiteStore)
        try file.save(.replace(DataContentsSource(old)))
    }

    /// Changes that write `bytes` at `offset` of the file, as the mount sends them: the pages it
    /// holds, against the current version.
    func changes(writing bytes: Data, at offset: Int, base: VersionID? = nil) throws -> (
        DocumentChanges, Data
    ) {
        var new = old
        new.replaceSubrange(offset..<offset + bytes.count, with: bytes)
        let range = Int64(offset)..<Int64(offset + bytes.count)
        let held = RangedSource.pages([range], below: new.count)
        let source = RangedSource(bytes: new, changedRanges: [range], heldRanges: held)
        let chunks = Set(
            held.flatMap { Int($0.lowerBound) / FlatFile.chunk...Int($0.upperBound - 1) / FlatFile.chunk })
        var changes = DocumentChanges(
            document: file.document.id, base: try base ?? sqlite.document(file.document.id).currentVersion)
        changes.contents[file.document.root] = .sparse(
            size: Int64(new.count), chunks: chunks.sorted(), source: source)
        changes.conflictPolicy = .rebaseIfDisjoint
        changes.origin = "test"
        return (changes, new)
    }

    /// Copies the store's files as a killed process leaves them; returns the copy's path.
    func crashImage() throws -> String {
        // Beside the store, in the fixture's folder, which goes with it.
        let folder = (sqlite.path as NSString).deletingLastPathComponent + "/image-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        let copy = folder + "/W.docstore"
        for suffix in ["", "-wal", "-packs", "-intents"]
        where FileManager.default.fileExists(atPath: sqlite.path + suffix) {
            try FileManager.default.copyItem(atPath: sqlite.path + suffix, toPath: copy + suffix)
        }
        return copy
    }

    func logs(_ path: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: path + "-intents")) ?? []).filter {
            $0.hasSuffix(".log")
        }
    }

    func contents(_ store: SQLiteStore) throws -> Data {
        let size = try #require(try store.node(file.document.root, at: nil)).size
        return try store.readContents(of: file.document.root, at: nil, offset: 0, count: Int(size))
    }

    @Test(
        "Logged changes are not saved, survive the process, and the next open saves them and removes the log")
    func replayedOnOpen() throws {
        let (changes, new) = try changes(writing: sampleBytes(10_000, seed: 2), at: 5_000)
        let versions = try sqlite.versions(of: file.document.id).count
        #expect(try sqlite.logIntent(changes) != nil)
        #expect(try file.contents() == old, "logging saved")
        let image = try crashImage()
        #expect(logs(image).count == 1)
        let recovered = try SQLiteStore(path: image)
        #expect(try contents(recovered) == new)
        #expect(try recovered.versions(of: file.document.id).count == versions + 1)
        #expect(try recovered.checkIntegrity().isClean)
        #expect(logs(image).isEmpty)
        // Opened again: nothing replays twice.
        #expect(try SQLiteStore(path: image).versions(of: file.document.id).count == versions + 1)
    }

    @Test("A log its process still holds is left alone by another opening of the store")
    func liveLogIsLeftAlone() throws {
        let (changes, _) = try changes(writing: sampleBytes(100, seed: 3), at: 0)
        _ = try sqlite.logIntent(changes)
        let other = try SQLiteStore(path: sqlite.path)
        #expect(try contents(other) == old)
        #expect(logs(sqlite.path).count == 1)
    }

    @Test(
        "Retired intents are not replayed; a log whose intents are all retired is removed when the store closes"
    )
    func retiredAreNotReplayed() throws {
        let (changes, new) = try changes(writing: sampleBytes(4096, seed: 4), at: 8192)
        let id = try #require(try sqlite.logIntent(changes))
        _ = try sqlite.save(changes)
        sqlite.retireIntents([id])
        // A second record after the retirement starts a new epoch at the log's start.
        let (second, newer) = try self.changes(writing: sampleBytes(4096, seed: 5), at: 20_000)
        let secondID = try #require(try sqlite.logIntent(second))
        let records = try readRecords(sqlite.path)
        #expect(records.map(\.sequence).contains(secondID.rawValue))
        #expect(!records.contains { $0.sequence == id.rawValue && $0.epoch == records.map(\.epoch).max() })
        _ = try sqlite.save(second)
        sqlite.retireIntents([secondID])
        let versions = try sqlite.versions(of: file.document.id).count
        let image = try crashImage()
        let recovered = try SQLiteStore(path: image)
        #expect(try recovered.versions(of: file.document.id).count == versions)
        var expected = new
        expected.replaceSubrange(20_000..<24_096, with: newer[20_000..<24_096])
        #expect(try contents(recovered) == expected)
        // Closing a store whose intents are all retired removes its log.
        let path = try crashImage()
        do {
            let store = try SQLiteStore(path: path)
            let (third, _) = try self.changes(
                writing: Data([1]), at: 0, base: try store.document(file.document.id).currentVersion)
            let thirdID = try #require(try store.logIntent(third))
            _ = try store.save(third)
            store.retireIntents([thirdID])
            #expect(logs(path).count == 1)
        }
        #expect(logs(path).isEmpty)
    }

    @Test("A save that committed before its retirement reached the disk is not replayed again")
    func savedButNotRetired() throws {
        let (changes, new) = try changes(writing: sampleBytes(6000, seed: 6), at: 30_000)
        _ = try #require(try sqlite.logIntent(changes))
        _ = try sqlite.save(changes)
        let versions = try sqlite.versions(of: file.document.id).count
        let recovered = try SQLiteStore(path: try crashImage())
        #expect(try recovered.versions(of: file.document.id).count == versions)
        #expect(try recovered.unresolvedConflicts().isEmpty)
        #expect(try contents(recovered) == new)
    }

    @Test("A replay whose file another process changed since keeps both: its bytes become a conflict version")
    func replayAfterAnotherSave() throws {
        let base = try sqlite.document(file.document.id).currentVersion
        let (changes, logged) = try changes(writing: sampleBytes(3000, seed: 7), at: 100, base: base)
        _ = try #require(try sqlite.logIntent(changes))
        // Another process saves the same bytes' chunk first.
        let (theirs, other) = try self.changes(writing: sampleBytes(3000, seed: 8), at: 200, base: base)
        _ = try sqlite.save(theirs)
        let recovered = try SQLiteStore(path: try crashImage())
        #expect(try contents(recovered) == other)
        let conflict = try #require(try recovered.unresolvedConflicts().first)
        let size = try #require(try recovered.node(file.document.root, at: conflict.id)).size
        #expect(
            try recovered.readContents(of: file.document.root, at: conflict.id, offset: 0, count: Int(size))
                == logged)
    }

    @Test("A torn record is skipped; a whole record after it is still replayed")
    func tornRecordBeforeAWholeOne() throws {
        let (first, _) = try changes(writing: sampleBytes(5000, seed: 9), at: 0)
        _ = try sqlite.logIntent(first)
        // The second record holds everything the first did (the mount logs all it has not saved).
        var both = old
        both.replaceSubrange(0..<5000, with: sampleBytes(5000, seed: 9))
        both.replaceSubrange(100_000..<100_500, with: sampleBytes(500, seed: 10))
        let source = RangedSource(
            bytes: both, changedRanges: [0..<5000, 100_000..<100_500],
            heldRanges: [0..<8192, 98_304..<102_400])
        var second = DocumentChanges(document: file.document.id, base: first.base)
        second.contents[file.document.root] = .sparse(
            size: Int64(both.count), chunks: [0, 1, 24], source: source)
        _ = try sqlite.logIntent(second)
        let image = try crashImage()
        // Tear the second record's payload (its header is whole): it must be skipped, and the
        // first replayed alone.
        let log = image + "-intents/" + (logs(image).first ?? "")
        let fd = open(log, O_RDWR)
        try #require(fd >= 0)
        var junk: UInt8 = 0xFF
        let records = IntentLog.records(in: fd)
        try #require(records.count == 2)
        let firstLength = Int64(IntentLog.headerSize + records[0].payload.count)
        #expect(
            pwrite(fd, &junk, 1, off_t(IntentLog.aligned(firstLength) + Int64(IntentLog.headerSize) + 10))
                == 1)
        #expect(IntentLog.records(in: fd).count == 1)
        close(fd)
        let recovered = try SQLiteStore(path: image)
        var expected = old
        expected.replaceSubrange(0..<5000, with: sampleBytes(5000, seed: 9))
        #expect(try contents(recovered) == expected)

        // The first record torn instead: the second, whole, is found after it.
        let image2 = try crashImage()
        let fd2 = open(image2 + "-intents/" + (logs(image2).first ?? ""), O_RDWR)
        try #require(fd2 >= 0)
        #expect(pwrite(fd2, &junk, 1, off_t(IntentLog.headerSize + 10)) == 1)
        close(fd2)
        #expect(try contents(try SQLiteStore(path: image2)) == both)
    }

    @Test("A whole-file rewrite larger than 1 MiB is saved, not logged; a few pages of a big file are logged")
    func whatIsLogged() throws {
        let big = sampleBytes(2 << 20, seed: 11)
        var replace = DocumentChanges(
            document: file.document.id, base: try sqlite.document(file.document.id).currentVersion)
        replace.contents[file.document.root] = .replace(DataContentsSource(big))
        #expect(try sqlite.logIntent(replace) == nil)
        // 1.5 MiB of pages spread over the file's every chunk: logging writes less than a save.
        let size = 8 << 20
        let bytes = sampleBytes(size, seed: 12)
        let held = stride(from: 0, to: size, by: 16_384).map { Int64($0)..<Int64($0 + 3 * 1024) }
        let source = RangedSource(bytes: bytes, changedRanges: held, heldRanges: held)
        var sparse = DocumentChanges(document: file.document.id, base: replace.base)
        sparse.contents[file.document.root] = .sparse(
            size: Int64(size), chunks: Array(0..<size / FlatFile.chunk), source: source)
        #expect(try sqlite.logIntent(sparse) != nil)
    }

    @Test("A log that cannot be saved stays, the store still opens, and fsck names it")
    func unsavableLogStays() throws {
        let image = try crashImage()
        try FileManager.default.createDirectory(atPath: image + "-intents", withIntermediateDirectories: true)
        // Whole by its checksums, but nothing this DocFS can read: as a newer DocFS's record.
        let log = image + "-intents/00000000000000aa.log"
        try IntentLog.record(
            epoch: 1, sequence: 1, kind: .changes, payload: Data([0xFF, 0xFF, 0xFF, 0xFF, 1, 2, 3])
        )
        .write(to: URL(fileURLWithPath: log))
        let store = try SQLiteStore(path: image)
        #expect(store.unreplayedIntentLogs.count == 1)
        #expect(try contents(store) == old)
        let report = try store.checkIntegrity()
        #expect(!report.isClean)
        #expect(report.problems.contains { $0.contains("intent log not saved yet") && $0.contains("aa.log") })
        #expect(FileManager.default.fileExists(atPath: log))
    }

    func readRecords(_ path: String) throws -> [IntentLog.Record] {
        let name = try #require(logs(path).first)
        let fd = open(path + "-intents/" + name, O_RDONLY)
        try #require(fd >= 0)
        defer { close(fd) }
        return IntentLog.records(in: fd).filter { $0.kind == .changes }
    }
}
