import Foundation
import StoreTestSupport
import TestSupport
import Testing
import VersionedStore

@testable import DocumentEngine

/// A store prepares a new file's bytes while they are written (`DocumentStore.prepareContents`):
/// the save that takes the preparation must store exactly the file, cut exactly as a save
/// without one would cut it, and must not take work that no longer holds.
@Suite struct PreparedContentsTests {
    static let chunk = 256 << 10
    static let size = 24 << 20

    init() {
        // The whole suite keeps both cores busy: an idle-priority step could wait seconds.
        VersionedStore.preparesAtNormalPriority()
    }

    /// A file being written: its bytes up to `written` are there.
    final class Growing: ContentsSource, @unchecked Sendable {
        let bytes: Data
        let written = Locked(0)
        init(_ bytes: Data) { self.bytes = bytes }
        var count: Int64 { Int64(written.withLock { $0 }) }
        func read(offset: Int64, count: Int) throws -> Data {
            let end = min(Int(offset) + count, written.withLock { $0 })
            guard Int(offset) < end else { return Data() }
            return bytes.subdata(in: Int(offset)..<end)
        }
    }

    /// A save's source: `bytes`, stable, carrying `preparation`, logging its reads.
    struct Saved: ContentsSource {
        let logged: LoggingSource
        let preparation: (any ContentsPreparation)?
        init(_ bytes: Data, _ preparation: (any ContentsPreparation)?, failingRead: Int? = nil) {
            logged = LoggingSource(bytes, failingRead: failingRead, stable: true)
            self.preparation = preparation
        }
        var count: Int64 { logged.count }
        var isStable: Bool { true }
        var reads: [SourceRead] { logged.reads }
        func read(offset: Int64, count: Int) throws -> Data { try logged.read(offset: offset, count: count) }
    }

    /// Writes `bytes` into a preparation up to `final` bytes and waits until it has read at
    /// least `waitFor` of them.
    static func prepare(_ store: any FileSystemStore, _ bytes: Data, final: Int, waitFor: Int) throws
        -> any ContentsPreparation
    {
        let source = Growing(bytes)
        let preparation = try #require(store.prepareContents(reading: source))
        let before = store.statistics.bytesPrepared
        var at = 0
        while at < final {
            at = min(final, at + (1 << 20))
            source.written.withLock { $0 = at }
            preparation.advance(to: Int64(at))
        }
        let start = Date()
        while store.statistics.bytesPrepared - before < Int64(waitFor), Date().timeIntervalSince(start) < 30 {
            usleep(10_000)
        }
        let read = store.statistics.bytesPrepared - before
        try #require(read >= Int64(waitFor), "the preparation read \(read) bytes")
        return preparation
    }

    /// A fresh file of `size` sample bytes, saved once first if `storedBefore`, then saved with
    /// a preparation that has read 16 of its first 20 MiB; checked to hold the bytes.
    static func savePrepared(_ kind: StoreKind, seed: UInt64, storedBefore: Bool) throws
        -> (file: FlatFile, bytes: Data, source: Saved, saved: SaveResult)
    {
        let file = try FlatFile(kind, chunkSize: chunk)
        let bytes = sampleBytes(size, seed: seed)
        if storedBefore { try file.save(.replace(LoggingSource(bytes, stable: true))) }
        let preparation = try prepare(file.store, bytes, final: 20 << 20, waitFor: 16 << 20)
        let source = Saved(bytes, preparation)
        let saved = try file.save(.replace(source))
        try file.expectHolds(bytes)
        return (file, bytes, source, saved)
    }

    @Test(
        "a save takes a preparation's chunks, cut as it would cut them, and reads only the rest",
        arguments: StoreKind.all)
    func saveTakesThePreparation(_ kind: StoreKind) throws {
        let (file, bytes, source, saved) = try Self.savePrepared(kind, seed: 41, storedBefore: false)
        // Every byte once: the prepared chunks' to store them, one read each, where the
        // preparation cut them (not at whole pages, as a save cuts a file itself), and the rest.
        let reads = source.reads
        // (The rest from the page its first byte is in.)
        let read = reads.reduce(0) { $0 + $1.count }
        #expect(read >= Self.size && read <= Self.size + Self.chunk, "\(read) bytes read")
        #expect(reads.contains { $0.offset % Int64(Self.chunk) != 0 }, "the save cut the file itself")
        #expect(saved.version.bytesWritten <= Int64(Self.size))
        // The same bytes saved without one store nothing: the cuts are the same.
        let again = try file.save(.replace(LoggingSource(bytes, stable: false)))
        #expect(again.chunksWritten == 0)
        #expect(try file.rows(of: again.version.id).isEmpty)
    }

    @Test(
        "a file written again with bytes the store has: the prepared chunks' bytes are not read",
        arguments: StoreKind.all)
    func storedBytesAreNotReadAgain(_ kind: StoreKind) throws {
        let (_, _, source, saved) = try Self.savePrepared(kind, seed: 47, storedBefore: true)
        #expect(saved.chunksWritten == 0)
        // Only the bytes past the prepared chunks (from the page the first of them is in): the
        // store has every prepared chunk, so none is read to be stored.
        let read = source.reads.reduce(0) { $0 + $1.count }
        #expect(read <= Self.size - (16 << 20) + 2 * Self.chunk, "\(read) bytes read")
        #expect(source.reads.allSatisfy { $0.offset >= (15 << 20) }, "\(source.reads.prefix(4))")
    }

    @Test("a cancelled preparation, or one of other bytes, is not taken", arguments: StoreKind.all)
    func cancelledIsNotTaken(_ kind: StoreKind) throws {
        let file = try FlatFile(kind, chunkSize: Self.chunk)
        let bytes = sampleBytes(Self.size, seed: 42)
        // The writer changed a byte the preparation read, and cancelled it.
        var changed = bytes
        changed[5 << 20] ^= 0xFF
        let cancelled = try Self.prepare(file.store, bytes, final: 20 << 20, waitFor: 8 << 20)
        cancelled.cancel()
        let source = Saved(changed, cancelled)
        try file.save(.replace(source))
        try file.expectHolds(changed)
        #expect(source.reads.map(\.offset).min() == 0)
        // A file shorter than what the preparation cut is not what it prepared.
        let longer = try Self.prepare(file.store, bytes, final: 20 << 20, waitFor: 16 << 20)
        let short = bytes.prefix(10 << 20)
        try file.save(.replace(Saved(short, longer)))
        try file.expectHolds(short)
    }

    @Test("a save tried again after its finish failed stores the file", arguments: StoreKind.all)
    func failedFinishIsNotTakenAgain(_ kind: StoreKind) throws {
        let file = try FlatFile(kind, chunkSize: Self.chunk)
        let bytes = sampleBytes(Self.size, seed: 46)
        let preparation = try Self.prepare(file.store, bytes, final: 20 << 20, waitFor: 16 << 20)
        // Its third read fails: the prepared chunks were taken, the save was not made.
        #expect(throws: (any Error).self) {
            try file.save(.replace(Saved(bytes, preparation, failingRead: 3)))
        }
        try file.save(.replace(Saved(bytes, preparation)))
        try file.expectHolds(bytes)
    }

    @Test(
        "inside a store transaction a save takes a finished preparation only",
        arguments: StoreKind.all)
    func transactionsTakeFinishedPreparations(_ kind: StoreKind) throws {
        let file = try FlatFile(kind, chunkSize: Self.chunk)
        for finished in [false, true] {
            let bytes = sampleBytes(Self.size, seed: finished ? 44 : 45)
            let preparation = try Self.prepare(file.store, bytes, final: 20 << 20, waitFor: 16 << 20)
            let source = Saved(bytes, preparation)
            if finished { try preparation.finish(reading: source) }
            let before = source.reads.count
            try file.store.transaction(durable: true) { tx in
                var changes = DocumentChanges(
                    document: file.document.id, base: try tx.document(file.document.id).currentVersion)
                changes.contents[file.document.root] = .replace(source)
                _ = try tx.save(changes)
            }
            // Finished, the transaction has every chunk's hash and the last batch's bytes, and
            // reads nothing; otherwise it cuts the whole file itself.
            let inside = source.reads.count - before
            if finished {
                #expect(inside == 0, "\(inside) reads inside the transaction")
            } else {
                #expect(inside >= Self.size / Self.chunk, "\(inside) reads inside the transaction")
            }
            try file.expectHolds(bytes)
        }
    }
}
