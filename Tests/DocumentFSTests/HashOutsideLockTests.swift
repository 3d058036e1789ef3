import DocumentEngine
import DocumentFS
import Foundation
import StoreTestSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// One save pipeline: every save a mount makes (a close's, an fsync's, the quiet saver's)
/// cuts and hashes its new contents before the store's write transaction, which every other
/// save waits for; inside it only lookups, new chunks and rows remain. The store counts the
/// bytes it hashes inside write transactions (``StoreStatistics/bytesHashedInWriteTransactions``).
@Suite(.serialized)
struct HashOutsideLockTests {
    @Test(
        "1,000 small-file closes and 1,000 sparse 4 KiB edits hash nothing while the write lock is held",
        arguments: StoreKind.all)
    func mountSaves(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        let store = fixture.store
        let hashedBefore = store.statistics.bytesHashedInWriteTransactions
        try await withMount(store) { mount in
            let folder = mount.path + "/Work.pkg"
            try await offThread {
                for i in 0..<1000 { try writeText(folder + "/small-\(i).txt", "small file \(i)\n") }
                // A file of 64 chunks' worth, then 1,000 edits of 4 KiB each, every one a save point.
                let big = folder + "/big.bin"
                let file = try OpenedFile(big, O_CREAT | O_WRONLY | O_TRUNC)
                try pwriteAll(file.fd, [UInt8](repeating: 7, count: 4 << 20), at: 0)
                _ = try sys(fsync(file.fd))
                file.close()
                var random = SplitMix64(seed: 42)
                for i in 0..<1000 {
                    let edit = try OpenedFile(big, O_WRONLY)
                    let offset = Int(random.next() % 1024) * 4096
                    try pwriteAll(
                        edit.fd, [UInt8](repeating: UInt8(truncatingIfNeeded: i), count: 4096), at: offset)
                    if i % 10 == 0 { _ = try sys(fsync(edit.fd)) }
                    edit.close()
                }
            }
            mount.mount.fileSystem.saveAll(durable: true)
        }
        #expect(try engine.text("Work.pkg", "small-999.txt") == "small file 999\n")
        #expect(try engine.record("Work.pkg", "big.bin")?.size == 4 << 20)
        #expect(
            store.statistics.bytesHashedInWriteTransactions == hashedBefore,
            "bytes hashed inside write transactions")
    }

    @Test(
        "a save prepared before its transaction hashes nothing in it; unprepared, the transaction hashes",
        arguments: StoreKind.everyBackend)
    func storeSaves(_ kind: StoreKind) throws {
        let fixture = try StoreFixture(kind, chunkSize: 64 * 1024)
        let store = fixture.store
        let info = try store.createDocument(
            named: "f.bin", kind: .flat, type: nil, permissions: nil, origin: "")
        var base = info.currentVersion
        func edit(_ i: Int) -> DocumentChanges {
            var changes = DocumentChanges(document: info.id, base: base)
            let data = Data(repeating: UInt8(truncatingIfNeeded: i), count: 4096)
            changes.contents[info.root] = .sparse(
                size: 1 << 20, chunks: [i % 16], source: EditSource(offset: Int64(i % 16) * 65536, data: data)
            )
            return changes
        }
        for i in 0..<100 { base = try store.save(edit(i)).version.id }
        let prepared = try store.prepare(edit(100))
        base = try store.transaction(durable: false) { tx in try tx.save(prepared) }.version.id
        #expect(store.statistics.bytesHashedInWriteTransactions == 0)
        _ = try store.transaction(durable: false) { tx in try tx.save(edit(101)) }
        #expect(store.statistics.bytesHashedInWriteTransactions > 0, "the counter counts")
    }
}

/// A file of zeros but for `data` at `offset`.
private struct EditSource: ContentsSource {
    let offset: Int64
    let data: Data
    var count: Int64 { 1 << 20 }
    var isStable: Bool { true }
    var changedRanges: [Range<Int64>]? { [offset..<offset + Int64(data.count)] }
    func read(offset: Int64, count: Int) throws -> Data {
        var result = Data(count: count)
        let from = max(offset, self.offset)
        let to = min(offset + Int64(count), self.offset + Int64(data.count))
        if from < to {
            result.replaceSubrange(
                Int(from - offset)..<Int(to - offset),
                with: data[Int(from - self.offset)..<Int(to - self.offset)])
        }
        return result
    }
}
