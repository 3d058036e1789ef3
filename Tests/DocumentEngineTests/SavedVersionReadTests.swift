import DocumentEngine
import Foundation
import SQLiteStore
import StoreTestSupport
import TestSupport
import Testing

/// Reads at a saved version on the stores that read parts of a stored chunk (SQLite's
/// incremental blob I/O, PostgreSQL's TOAST slices).
struct SavedVersionReadTests {
    /// The chunk size of these tests' stores.
    static let chunk = 64 * 1024

    /// A new flat document holding `bytes`, and the version that saved them.
    static func save(_ bytes: Data, in store: any DocumentStore) throws -> (DocumentInfo, VersionID) {
        let info = try store.createDocument(
            named: "big.bin", kind: .flat, type: nil, permissions: nil, origin: "")
        var changes = DocumentChanges(document: info.id, base: info.currentVersion)
        changes.contents[info.root] = .replace(DataContentsSource(bytes))
        return (info, try store.save(changes).version.id)
    }

    @Test(
        "Reads at a saved version: a first read learns the chunk map, small random reads fetch only their bytes, sequential ones whole chunks",
        arguments: StoreKind.all)
    func readsAtASavedVersion(_ kind: StoreKind) throws {
        let chunk = Self.chunk
        let fixture = try StoreFixture(kind, chunkSize: chunk)
        let store = fixture.store
        // Ten chunks and a partial one, all different (chunks are stored once per contents); a hole in chunk 4.
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        var bytes = Data(
            (0..<(10 * chunk + 1_000)).map { _ in
                state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
                return UInt8(truncatingIfNeeded: state >> 56)
            })
        bytes.replaceSubrange(4 * chunk..<5 * chunk, with: Data(count: chunk))
        let (info, version) = try Self.save(bytes, in: store)
        let reader = try fixture.reopen()
        func read(_ offset: Int, _ count: Int) throws -> Data {
            try reader.readContents(of: info.root, at: version, offset: Int64(offset), count: count)
        }
        func expected(_ offset: Int, _ count: Int) -> Data {
            bytes.subdata(in: min(offset, bytes.count)..<min(offset + count, bytes.count))
        }

        #expect(try read(0, 4096) == expected(0, 4096))  // learns the map of the whole file
        var statistics = reader.statistics
        // Random 4 KiB reads elsewhere: right bytes, and only those bytes come from the server.
        for offset in [
            7 * chunk + 123, 2 * chunk + 60_000, 10 * chunk + 500, 9 * chunk - 4096, 4 * chunk + 10,
        ] {
            let before = reader.statistics
            #expect(try read(offset, 4096) == expected(offset, 4096), "at \(offset)")
            let fetched = reader.statistics.bytesRead - before.bytesRead
            #expect(fetched <= 4096, "a 4 KiB read at \(offset) fetched \(fetched) bytes")
        }
        #expect(reader.statistics.chunksRead - statistics.chunksRead <= 10, "one or two slices per read")
        // A read that spans two chunks, and one past the end.
        #expect(try read(3 * chunk - 100, 300) == expected(3 * chunk - 100, 300))
        #expect(try read(10 * chunk + 900, 4096) == expected(10 * chunk + 900, 4096))
        #expect(try read(11 * chunk, 10).isEmpty)
        // Sequential reads through the file fetch whole chunks, each once.
        reader.purgeCache()
        statistics = reader.statistics
        var whole = Data()
        var offset = 0
        while offset < bytes.count {
            whole += try read(offset, 4096)
            offset += 4096
        }
        #expect(whole == bytes)
        let stored = Int(try fixture.sql("SELECT COUNT(*) FROM chunks")) ?? -1
        #expect(reader.statistics.chunksRead - statistics.chunksRead == stored, "one fetch per stored chunk")
    }

    @Test(
        "Reads into a buffer give what reads into Data give: at a saved version and the current one, across chunks, in a hole, past the end; a random 4 KiB read fetches only its bytes",
        arguments: StoreKind.all)
    func readsIntoABuffer(_ kind: StoreKind) throws {
        let chunk = Self.chunk
        let fixture = try StoreFixture(kind, chunkSize: chunk)
        var bytes = sampleBytes(10 * chunk + 1_000, seed: 41)
        // Zeros long enough that chunks of only zeros are cut from them: holes, with no extent.
        bytes.replaceSubrange(3 * chunk..<6 * chunk, with: Data(count: 3 * chunk))
        let (info, version) = try Self.save(bytes, in: fixture.store)
        let reader = try fixture.reopen()
        func read(_ offset: Int, _ count: Int, at version: VersionID?) throws -> Data {
            // Page-aligned, as the mount's reads are, and a byte off, as a caller's may be.
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: count + 1, alignment: 4096)
            defer { buffer.deallocate() }
            memset(buffer.baseAddress!, 0xA5, count + 1)
            let shifted = offset % 2 == 0 ? 0 : 1
            let target = UnsafeMutableRawBufferPointer(rebasing: buffer[shifted..<shifted + count])
            let read = try reader.readContents(
                of: info.root, at: version, offset: Int64(offset), into: target)
            #expect(read <= count)
            return Data(target[0..<read])
        }
        func expected(_ offset: Int, _ count: Int) -> Data {
            bytes.subdata(in: min(offset, bytes.count)..<min(offset + count, bytes.count))
        }
        let reads = [
            (0, 4096), (7 * chunk + 123, 4096), (2 * chunk + 60_000, 4096), (10 * chunk + 500, 4096),
            (9 * chunk - 4096, 4096), (4 * chunk + 10, 4096), (3 * chunk - 100, 300), (chunk, 3 * chunk),
            (10 * chunk + 900, 4096), (11 * chunk, 10), (5 * chunk - 1, 2), (0, bytes.count + 10),
        ]
        for version in [version, nil] {
            reader.purgeCache()
            for (offset, count) in reads {
                #expect(try read(offset, count, at: version) == expected(offset, count), "\(offset)+\(count)")
            }
        }
        // Random 4 KiB reads at the saved version, now that its map is known: only their bytes.
        reader.purgeCache()
        _ = try read(0, 4096, at: version)
        for offset in [6 * chunk + 4096, 8 * chunk + 777, 1 * chunk + 32_768] {
            let before = reader.statistics
            #expect(try read(offset, 4096, at: version) == expected(offset, 4096))
            let fetched = reader.statistics.bytesRead - before.bytesRead
            #expect(fetched <= 4096, "a 4 KiB read at \(offset) fetched \(fetched) bytes")
        }
        // Sequential reads into a buffer fetch each stored chunk once, and then serve from it.
        reader.purgeCache()
        let statistics = reader.statistics
        var whole = Data()
        while whole.count < bytes.count { whole += try read(whole.count, 4096, at: version) }
        #expect(whole == bytes)
        let stored = Int(try fixture.sql("SELECT COUNT(*) FROM chunks")) ?? -1
        #expect(reader.statistics.chunksRead - statistics.chunksRead == stored, "one fetch per stored chunk")
        // From the cached chunks, reads that begin in one extent or hole and end in the next.
        for offset in stride(from: 0, to: bytes.count, by: 3_001) {
            #expect(try read(offset, 5_000, at: version) == expected(offset, 5_000), "at \(offset)")
        }
        #expect(reader.statistics.chunksRead == statistics.chunksRead + stored, "all from the cache")
    }

    @Test(
        "SQLite reads slices outside any transaction: a truncating checkpoint right after 200 of them succeeds"
    )
    func slicesHoldNoReadTransaction() throws {
        let fixture = try StoreFixture(.sqlite)
        let store = fixture.store
        let sqlite = try #require(store as? SQLiteStore)
        let info = try store.createDocument(
            named: "big.bin", kind: .flat, type: nil, permissions: nil, origin: "")
        let bytes = sampleBytes(3 << 20, seed: 7)
        var changes = DocumentChanges(document: info.id, base: info.currentVersion)
        changes.contents[info.root] = .replace(DataContentsSource(bytes))
        let version = try store.save(changes).version.id
        let reader = try #require(try fixture.reopen() as? SQLiteStore)
        #expect(
            try reader.readContents(of: info.root, at: version, offset: 0, count: 4096) == bytes.prefix(4096))
        let before = reader.statistics
        var state: UInt64 = 1
        for _ in 0..<200 {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            let offset = Int(state >> 33) % (bytes.count - 4096)
            let read = try reader.readContents(of: info.root, at: version, offset: Int64(offset), count: 4096)
            #expect(read == bytes.subdata(in: offset..<offset + 4096), "at \(offset)")
        }
        #expect(reader.statistics.bytesRead - before.bytesRead <= 200 * 4096, "slices, not whole chunks")
        // TRUNCATE needs every reader gone; a slice connection still in a read would make it busy.
        try reader.checkpoint()
        #expect(StoreTestTools.fileSize(sqlite.path + "-wal") == 0)
    }
}
