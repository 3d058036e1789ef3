import CLinuxSupport
import DocumentEngine
import Foundation
import StoreTestSupport
import TestSupport
import Testing
import VersionedStore

@testable import SQLiteStore

/// Large chunks' bytes live in pack files beside an SQLite store (`PackFiles`).
@Suite("SQLite packs")
struct SQLitePackTests {
    let file: FlatFile
    let sqlite: SQLiteStore
    var folder: String { sqlite.path + "-packs" }

    init() throws {
        file = try FlatFile(.sqlite, chunkSize: SQLiteStore.defaultChunkSize)
        sqlite = try #require(file.store as? SQLiteStore)
    }

    /// The pack files, by name.
    func packs() -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []).filter {
            $0.hasSuffix(".pack")
        }
        .sorted()
    }

    func packBytes() -> Int64 { StoreTestTools.sqliteStoreBytes(sqlite.path) - databaseBytes() }

    func packedCount() throws -> Int {
        Int(try file.fixture.sql("SELECT COUNT(*) FROM packed_chunks;")) ?? -1
    }

    func databaseBytes() -> Int64 {
        StoreTestTools.fileSize(sqlite.path) + StoreTestTools.fileSize(sqlite.path + "-wal")
    }

    /// The bytes of the pack at `path` that are in the page cache (nil on tmpfs, which keeps
    /// every page there).
    func residentBytes(of path: String) throws -> Int64? {
        let fd = open(path, O_RDONLY)
        try #require(fd >= 0)
        defer { close(fd) }
        var fs = statfs()
        try #require(fstatfs(fd, &fs) == 0)
        guard fs.f_type != 0x0102_1994 else { return nil }
        var st = stat()
        try #require(fstat(fd, &st) == 0)
        let size = Int(st.st_size)
        guard size > 0 else { return 0 }
        let map = try #require(mmap(nil, size, PROT_READ, MAP_SHARED, fd, 0))
        try #require(map != MAP_FAILED)
        defer { munmap(map, size) }
        let pageSize = Int(sysconf(Int32(_SC_PAGESIZE)))
        var resident = [UInt8](repeating: 0, count: (size + pageSize - 1) / pageSize)
        try #require(mincore(map, size, &resident) == 0)
        return Int64(resident.filter { $0 & 1 != 0 }.count * pageSize)
    }

    /// Chunks stored in one write transaction of `store`, bulk or not, as the chunks of one file
    /// from offset `from`; their ids.
    func storeChunks(_ chunks: [Data], bulk: Bool, in store: SQLiteStore? = nil, from: Int64 = 0) throws
        -> [Int64]
    {
        try (store ?? sqlite).backend.write(durable: true) { tx in
            if bulk { tx.storesBulk() }
            var offset = from
            return try chunks.map { chunk in
                defer { offset += Int64(chunk.count) }
                return try tx.insertChunk(hash: VersionedStore.hash(chunk), data: chunk, offset: offset)
            }
        }
    }

    /// Where a packed chunk is: its position in its pack.
    func position(ofChunk id: Int64, in fixture: FlatFile? = nil) throws -> Int64 {
        try #require(
            Int64(try (fixture ?? file).fixture.sql("SELECT position FROM packed_chunks WHERE id = \(id);")))
    }

    /// `count` chunks of about the store's chunk size, each of another length.
    func chunks(_ count: Int, seed: UInt64) -> [Data] {
        (0..<count).map { sampleBytes((256 << 10) - 997 * $0, seed: seed + UInt64($0)) }
    }

    @Test(
        "A bulk transaction's chunks go to the pack at page-aligned places, past the page cache, between other writes, and read back"
    )
    func bulkWritesBypassThePageCache() throws {
        // More than the staging holds: written in two O_DIRECT writes.
        let bulk = chunks(40, seed: 30)
        let ids = try storeChunks(bulk, bulk: true)
        let pack = try #require(packs().first)
        #expect(packs().count == 1)
        if let resident = try residentBytes(of: folder + "/" + pack) {
            #expect(resident == 0, "\(resident) bytes of bulk chunks are in the page cache")
        }
        #expect(try position(ofChunk: ids[0]) % Int64(PackFiles.directAlignment) == 0)
        #expect(try position(ofChunk: ids[39]) == (try position(ofChunk: ids[38])) + Int64(bulk[38].count))
        // A plain transaction's chunk follows, through the page cache (the first stays a row, in
        // its inline budget); then bulk again, from the next page.
        let plainBytes = [sampleBytes(200 << 10, seed: 80), sampleBytes(200 << 10, seed: 81)]
        let plain = try storeChunks(plainBytes, bulk: false)
        let more = chunks(3, seed: 90)
        let moreIDs = try storeChunks(more, bulk: true)
        #expect(try position(ofChunk: moreIDs[0]) % Int64(PackFiles.directAlignment) == 0)
        #expect(try position(ofChunk: moreIDs[0]) > (try position(ofChunk: plain[1])))
        let all = Dictionary(uniqueKeysWithValues: zip(ids + plain + moreIDs, bulk + plainBytes + more))
        let reopened = try SQLiteStore(path: sqlite.path)
        let read = try reopened.backend.read { tx in try tx.chunks(Array(all.keys)) }
        for (id, bytes) in all {
            #expect(read[id] == bytes, "chunk \(id)")
        }
        let report = try sqlite.checkIntegrity()
        #expect(report.isClean, "\(report)")
        // A bulk transaction that rolls back after gathering its chunks leaves the pack as it was.
        let committed = packBytes()
        struct Refused: Error {}
        #expect(throws: Refused.self) {
            try sqlite.backend.write(durable: true) { tx in
                tx.storesBulk()
                for chunk in chunks(3, seed: 100) {
                    _ = try tx.insertChunk(hash: VersionedStore.hash(chunk), data: chunk, offset: 0)
                }
                throw Refused()
            }
        }
        #expect(packBytes() == committed)
        let last = chunks(2, seed: 110)
        let lastIDs = try storeChunks(last, bulk: true)
        #expect(
            try reopened.backend.read { tx in try tx.chunks(lastIDs) } == [
                lastIDs[0]: last[0], lastIDs[1]: last[1],
            ])
    }

    @Test(
        "A packed chunk starts at the place within a page that it has in its file (bulk, plain, moved by collection), so a page of the file is a page of the pack"
    )
    func chunksKeepTheirPhase() throws {
        let offsets: [Int64] = [0, 1, 4095, 4096 + 2048, (1 << 30) + 123]
        let bytes = offsets.indices.map { sampleBytes(70_000 + 1_111 * $0, seed: 150 + UInt64($0)) }
        func place(bulk: Bool) throws -> [Int64] {
            try sqlite.backend.write(durable: true) { tx in
                if bulk { tx.storesBulk() }
                return try zip(bytes, offsets).map { chunk, offset in
                    var unique = chunk
                    unique[0] = bulk ? 1 : 2
                    return try tx.insertChunk(hash: VersionedStore.hash(unique), data: unique, offset: offset)
                }
            }
        }
        // The first plain chunks fit the transaction's inline budget and stay rows.
        let ids = try place(bulk: true) + place(bulk: false)
        let packed = try ids.filter { try sqlite.backend.packs.locate($0) != nil }
        #expect(packed.count >= 7)
        for id in packed {
            let index = ids.firstIndex(of: id) ?? 0
            #expect(try position(ofChunk: id) % 4096 == offsets[index % offsets.count] % 4096, "chunk \(id)")
        }
        try sqlite.backend.collectPacksMovingEverything()
        for id in packed {
            let index = ids.firstIndex(of: id) ?? 0
            #expect(try position(ofChunk: id) % 4096 == offsets[index % offsets.count] % 4096, "moved \(id)")
        }
        let read = try SQLiteStore(path: sqlite.path).backend.read { tx in try tx.chunks(packed) }
        for id in packed {
            let index = ids.firstIndex(of: id) ?? 0
            var expected = bytes[index % offsets.count]
            expected[0] = index < offsets.count ? 1 : 2
            #expect(read[id] == expected, "chunk \(id)")
        }
        #expect(try sqlite.checkIntegrity().isClean)
        // A whole file saved through the store: its 4 KiB pages fall on the pack's.
        let content = sampleBytes(6 << 20, seed: 160)
        try file.save(.replace(DataContentsSource(content)))
        try file.expectHolds(content)
    }

    @Test("A bulk chunk larger than the staging follows the staged ones, not under their padding")
    func bulkChunkLargerThanStaging() throws {
        let big = try FlatFile(.sqlite, chunkSize: 16 << 20)
        let store = try #require(big.store as? SQLiteStore)
        let bytes = [sampleBytes(100_003, seed: 120), sampleBytes(PackFiles.stagingLimit + 5, seed: 121)]
        let ids = try storeChunks(bytes, bulk: true, in: store)
        #expect(try position(ofChunk: ids[1], in: big) >= (try position(ofChunk: ids[0], in: big)) + 100_003)
        let read = try SQLiteStore(path: store.path).backend.read { tx in try tx.chunks(ids) }
        #expect(read == [ids[0]: bytes[0], ids[1]: bytes[1]])
        #expect(try store.checkIntegrity().isClean)
    }

    @Test(
        "A large save's chunks past its first 256 KiB go to a pack, and read back whole, in parts and reopened"
    )
    func largeSavesArePacked() throws {
        try sqlite.checkpoint()
        let before = databaseBytes()
        let bytes = sampleBytes(8 << 20, seed: 1)
        try file.save(.replace(DataContentsSource(bytes)))
        #expect(packs().count == 1)
        #expect(try packedCount() > 0)
        #expect(packBytes() >= (8 << 20) - (256 << 10))
        // The database and its log grew by the inline part and the rows, not by the file.
        #expect(databaseBytes() - before < 2 << 20)
        try file.expectHolds(bytes)
        let reopened = try SQLiteStore(path: sqlite.path)
        for (offset, count) in [(0, 4096), (5_000_000, 4096), ((8 << 20) - 100, 100), (1_234_567, 300_000)] {
            let part = try reopened.readContents(
                of: file.document.root, at: nil, offset: Int64(offset), count: count)
            #expect(part == bytes[offset..<offset + count])
        }
    }

    @Test("A small save stays in SQLite and makes no pack")
    func smallSavesStayRows() throws {
        let bytes = sampleBytes(200 << 10, seed: 2)
        try file.save(.replace(DataContentsSource(bytes)))
        #expect(packs().isEmpty)
        #expect(try packedCount() == 0)
        try file.expectHolds(bytes)
    }

    @Test("A transaction that rolls back cuts its bytes off the pack, and the next one goes on from there")
    func rollbackCutsThePack() throws {
        try file.save(.replace(DataContentsSource(sampleBytes(4 << 20, seed: 3))))
        let committed = packBytes()
        struct Refused: Error {}
        let chunk = sampleBytes(300 << 10, seed: 4)
        #expect(throws: Refused.self) {
            try sqlite.backend.write(durable: true) { tx in
                // At an offset whose place in its page is the pack's end's: no padding before it.
                _ = try tx.insertChunk(hash: VersionedStore.hash(chunk), data: chunk, offset: committed)
                #expect(packBytes() == committed + Int64(chunk.count))
                throw Refused()
            }
        }
        #expect(packBytes() == committed)
        let bytes = sampleBytes(4 << 20, seed: 5)
        try file.save(.replace(DataContentsSource(bytes)))
        try file.expectHolds(bytes)
    }

    @Test(
        "A long transaction through the page cache (not bulk) leaves only its last few megabytes of pack there, and reads back; a long save leaves none"
    )
    func longWritesLeaveThePageCache() throws {
        // A plain transaction's appends go through the page cache (a sparse save's, collection's).
        let plain = chunks(192, seed: 140)
        let ids = try storeChunks(plain, bulk: false)
        let pack = try #require(packs().first)
        #expect(StoreTestTools.fileSize(folder + "/" + pack) >= 3 * PackFiles.dropBehind)
        if let resident = try residentBytes(of: folder + "/" + pack) {
            #expect(
                resident <= 2 * PackFiles.dropBehind + (1 << 20),
                "\(resident) bytes of a pack are in the page cache")
        }
        let read = try SQLiteStore(path: sqlite.path).backend.read { tx in try tx.chunks(ids) }
        #expect(ids.map { read[$0] } == plain)
        // A whole file's save stores its batches ahead, in bulk, past the page cache: at most
        // its last part (under a batch), stored by the save's own transaction, stays.
        let other = try FlatFile(.sqlite, chunkSize: SQLiteStore.defaultChunkSize)
        let bytes = sampleBytes(48 << 20, seed: 14)
        try other.save(.replace(DataContentsSource(bytes)))
        let otherFolder = try #require(other.store as? SQLiteStore).path + "-packs"
        let otherPack = try #require(
            try FileManager.default.contentsOfDirectory(atPath: otherFolder).first { $0.hasSuffix(".pack") })
        if let resident = try residentBytes(of: otherFolder + "/" + otherPack) {
            #expect(
                resident <= PackFiles.dropBehind + (1 << 20),
                "\(resident) bytes of a 48 MiB save's pack are in the page cache")
        }
        try other.expectHolds(bytes)
    }

    @Test(
        "A store opened without its pack folder says so, makes no new folder for a save, and takes one made empty"
    )
    func missingFolder() throws {
        let bytes = sampleBytes(4 << 20, seed: 15)
        try file.save(.replace(DataContentsSource(bytes)))
        let packed = try packedCount()
        #expect(packed > 0)
        #expect(sqlite.chunksInMissingPackFolder == 0 && sqlite.missingPackFolderProblem == nil)
        #expect(rename(folder, folder + ".away") == 0)
        let copied = try SQLiteStore(path: sqlite.path)
        #expect(copied.chunksInMissingPackFolder == packed)
        let problem = try #require(copied.missingPackFolderProblem)
        #expect(problem.contains("is damaged: its pack folder \(folder) is missing"), "\(problem)")
        #expect(problem.contains("make an empty folder there"), "\(problem)")
        // Small files still read and save; a large save fails and leaves no new folder.
        let other = try copied.createDocument(
            named: "small.bin", kind: .flat, type: nil, permissions: nil, origin: "test")
        var small = DocumentChanges(document: other.id, base: other.currentVersion)
        small.contents[other.root] = .replace(DataContentsSource(sampleBytes(1000, seed: 16)))
        _ = try copied.save(small)
        var large = DocumentChanges(document: other.id, base: try copied.document(other.id).currentVersion)
        large.contents[other.root] = .replace(DataContentsSource(sampleBytes(4 << 20, seed: 17)))
        do {
            _ = try copied.save(large)
            Issue.record("a large save made a new pack folder")
        } catch let error as DocumentStoreError {
            #expect("\(error)".contains("is missing"), "\(error)")
        }
        #expect(access(folder, F_OK) != 0)
        // An empty folder made by hand: saves go on.
        #expect(mkdir(folder, 0o700) == 0)
        _ = try copied.save(large)
        // One line for the missing pack, with how many rows it takes.
        let missing = try copied.checkIntegrity().problems.filter { $0.contains("is missing") }
        #expect(missing.count == 1, "\(missing)")
        #expect(missing.first?.hasPrefix("\(packed) chunk rows cannot be read: ") == true, "\(missing)")
    }

    @Test("A pack that is missing or cut short is a clear error, in reads and in the integrity walk")
    func damagedPacks() throws {
        let bytes = sampleBytes(4 << 20, seed: 6)
        try file.save(.replace(DataContentsSource(bytes)))
        let pack = try #require(packs().first)
        let path = folder + "/" + pack
        #expect(truncate(path, 1 << 20) == 0)
        let cut = try SQLiteStore(path: sqlite.path)
        #expect(throws: DocumentStoreError.self) {
            _ = try cut.readContents(of: file.document.root, at: nil, offset: 3 << 20, count: 4096)
        }
        #expect(try cut.checkIntegrity().problems.contains { $0.contains("ends before the chunk's bytes") })
        #expect(rename(path, path + ".moved") == 0)
        let moved = try SQLiteStore(path: sqlite.path)
        do {
            _ = try moved.readContents(of: file.document.root, at: nil, offset: 3 << 20, count: 4096)
            Issue.record("a read without the pack succeeded")
        } catch let error as DocumentStoreError {
            #expect("\(error)".contains("is missing"))
            #expect("\(error)".contains(folder))
        }
        #expect(try moved.checkIntegrity().problems.contains { $0.contains("is missing") })
    }

    @Test("Garbage collection moves what is still needed out of a pack mostly garbage, and removes it")
    func collectionCompacts() throws {
        let kept = try file.store.createDocument(
            named: "kept.bin", kind: .flat, type: nil, permissions: nil, origin: "test")
        let keptBytes = sampleBytes(3 << 20, seed: 7)
        var changes = DocumentChanges(document: kept.id, base: kept.currentVersion)
        changes.contents[kept.root] = .replace(DataContentsSource(keptBytes))
        _ = try file.store.save(changes)
        try file.save(.replace(DataContentsSource(sampleBytes(12 << 20, seed: 8))))
        let old = try #require(packs().first)
        #expect(packs().count == 1)
        // A second store has read from the old pack, and keeps its file open.
        let reader = try SQLiteStore(path: sqlite.path)
        #expect(
            try reader.readContents(of: kept.root, at: nil, offset: 1 << 20, count: 10)
                == keptBytes[(1 << 20)..<(1 << 20) + 10])

        let small = sampleBytes(1000, seed: 9)
        try file.save(.replace(DataContentsSource(small)))
        try file.store.setRetentionPolicy(
            .init(keepLast: 1, keepAll: .zero, tiers: [], deletedDocumentsExpireAfter: .seconds(3600)))
        _ = try file.store.collectGarbage()

        #expect(!packs().contains(old))
        #expect(packBytes() < 4 << 20)
        try file.expectHolds(small)
        let now = try file.store.readContents(of: kept.root, at: nil, offset: 0, count: keptBytes.count)
        #expect(now == keptBytes)
        #expect(
            try reader.readContents(of: kept.root, at: nil, offset: 0, count: keptBytes.count) == keptBytes)
        #expect(
            try SQLiteStore(path: sqlite.path).readContents(
                of: kept.root, at: nil, offset: 0, count: keptBytes.count) == keptBytes)
    }

    @Test("A read whose snapshot named a pack that collection removed finds the chunk where it went")
    func staleSnapshotFindsTheChunk() throws {
        let bytes = sampleBytes(4 << 20, seed: 10)
        try file.save(.replace(DataContentsSource(bytes)))
        let id = try #require(Int64(try file.fixture.sql("SELECT MIN(id) FROM packed_chunks;")))
        let place = try #require(try sqlite.backend.packs.locate(id))
        let expected = try sqlite.backend.packs.read(place)
        // The whole pack moved, as collection does, by a store that never had it open.
        let mover = try SQLiteStore(path: sqlite.path)
        try mover.backend.collectPacksMovingEverything()
        #expect(!packs().contains(PackFiles.name(place.pack)))
        // A fresh store has no open file of the old pack: it must look the chunk up again.
        let fresh = try SQLiteStore(path: sqlite.path)
        #expect(try fresh.backend.packs.readChunk(id, at: place) == expected)
        #expect(try fresh.backend.packs.readChunk(id, at: place, 10..<20) == expected[10..<20])
        try file.expectHolds(bytes)
    }

    @Test(
        "A slice of a packed chunk learns the places of the packed chunks around it at once, one of a chunk in a row only its own; chunks in rows among them still read from their rows, and a learned place stays good after collection"
    )
    func slicesLearnNearbyPlaces() throws {
        let bytes = sampleBytes(8 << 20, seed: 12)
        try file.save(.replace(DataContentsSource(bytes)))
        let packed = try file.fixture.sql("SELECT id FROM packed_chunks ORDER BY id;").split(separator: "\n")
            .compactMap { Int64($0) }
        let all = try file.fixture.sql("SELECT id FROM chunks ORDER BY id;").split(separator: "\n")
            .compactMap { Int64($0) }
        let inline = all.filter { !packed.contains($0) }
        try #require(packed.count > 8 && !inline.isEmpty)
        let reader = try SQLiteStore(path: sqlite.path)
        let packs = reader.backend.packs
        func slice(_ id: Int64, _ range: Range<Int>) throws -> Data? {
            var data = Data(count: range.count)
            let read = try data.withUnsafeMutableBytes { try reader.backend.chunkSlice(id, range, into: $0) }
            return read ? data : nil
        }
        func whole(_ id: Int64) throws -> Data {
            try #require(try reader.backend.wholeChunks([id])?[id])
        }

        // A chunk in a row first: its own place only.
        #expect(try slice(inline[0], 10..<20) == (try whole(inline[0]))[10..<20])
        for id in packed { #expect(packs.cachedPlace(id) == nil, "chunk \(id)") }
        let middle = packed[packed.count / 2]
        let part = try slice(middle, 100..<4196)
        #expect(part == (try whole(middle))[100..<4196])
        // The places of the other packed chunks are known without a statement of their own; the
        // inline ones are not taken for packed.
        for id in packed { #expect(packs.cachedPlace(id) != nil, "chunk \(id)") }
        for id in inline.dropFirst() { #expect(packs.cachedPlace(id) == nil, "chunk \(id)") }
        for id in inline + [packed.first!, packed.last!] {
            #expect(try slice(id, 10..<20) == (try whole(id))[10..<20], "chunk \(id)")
        }
        // The packs move; a place learned before, of a chunk never read, still finds its bytes.
        let unread = packed[1]
        let expected = try SQLiteStore(path: sqlite.path).backend.wholeChunks([unread])?[unread]
        let mover = try SQLiteStore(path: sqlite.path)
        try mover.backend.collectPacksMovingEverything()
        #expect(try slice(unread, 0..<4096) == expected?[0..<4096])
        let fresh = try SQLiteStore(path: sqlite.path)
        for offset in [300_000, 5_000_000, (8 << 20) - 4096] {
            var data = Data(count: 4096)
            let count = try data.withUnsafeMutableBytes {
                try fresh.readContents(of: file.document.root, at: nil, offset: Int64(offset), into: $0)
            }
            #expect(count == 4096 && data == bytes[offset..<offset + 4096])
        }
    }

    @Test("Collection removes a pack no chunk names, but not one a writer holds")
    func strayPacks() throws {
        try file.save(.replace(DataContentsSource(sampleBytes(2 << 20, seed: 11))))
        let stray = folder + "/" + PackFiles.name(1)
        let held = folder + "/" + PackFiles.name(2)
        for path in [stray, held] { try Data(count: 4 << 20).write(to: URL(fileURLWithPath: path)) }
        let fd = open(held, O_RDONLY)
        defer { close(fd) }
        #expect(flock(fd, LOCK_SH) == 0)
        try sqlite.backend.reclaimSpace()
        #expect(!FileManager.default.fileExists(atPath: stray))
        #expect(FileManager.default.fileExists(atPath: held))
        #expect(packs().count == 2)
    }

    @Test(
        "A new store is not made beside another store's packs, and a pack folder that is a file is a clear error"
    )
    func foreignPacks() throws {
        try file.save(.replace(DataContentsSource(sampleBytes(2 << 20, seed: 14))))
        let moved = sqlite.path + ".moved"
        #expect(rename(sqlite.path, moved) == 0)
        do {
            _ = try SQLiteStore(path: sqlite.path, options: .create)
            Issue.record("a store was made beside another store's packs")
        } catch let error as DocumentStoreError {
            #expect("\(error)".contains("holds the packs of another store"))
        }
        let other = try StoreFixture(.sqlite, chunkSize: SQLiteStore.defaultChunkSize, name: "F")
        try Data("not a folder".utf8).write(to: URL(fileURLWithPath: other.location + "-packs"))
        let document = try other.store.createDocument(
            named: "f.bin", kind: .flat, type: nil, permissions: nil, origin: "test")
        var changes = DocumentChanges(document: document.id, base: document.currentVersion)
        changes.contents[document.root] = .replace(DataContentsSource(sampleBytes(2 << 20, seed: 15)))
        do {
            _ = try other.store.save(changes)
            Issue.record("a save packed chunks into a file")
        } catch let error as DocumentStoreError {
            #expect("\(error)".contains("is not a folder"))
        }
        #expect(try other.store.document(document.id).currentVersion == document.currentVersion)
    }

    @Test("Two stores on one file write packs of their own and read each other's")
    func twoWriters() throws {
        let other = try SQLiteStore(path: sqlite.path)
        let second = try other.createDocument(
            named: "second.bin", kind: .flat, type: nil, permissions: nil, origin: "test")
        let first = sampleBytes(3 << 20, seed: 12)
        let secondBytes = sampleBytes(3 << 20, seed: 13)
        try file.save(.replace(DataContentsSource(first)))
        var changes = DocumentChanges(document: second.id, base: second.currentVersion)
        changes.contents[second.root] = .replace(DataContentsSource(secondBytes))
        _ = try other.save(changes)
        #expect(packs().count == 2)
        #expect(
            try other.readContents(of: file.document.root, at: nil, offset: 0, count: first.count) == first)
        #expect(
            try sqlite.readContents(of: second.root, at: nil, offset: 0, count: secondBytes.count)
                == secondBytes)
        #expect(try sqlite.checkIntegrity().isClean)
    }
}

extension SQLiteBackend {
    /// Moves every pack's chunks, whatever their garbage, as collection does for the ones it moves.
    func collectPacksMovingEverything() throws {
        try collectPacks(movingAll: true)
    }
}
