import Foundation
import Testing
import TestSupport

@testable import VersionedStore

@Suite("ContentDefinedChunker")
struct ContentDefinedChunkerTests {
    let chunker = ContentDefinedChunker.standard

    // MARK: Format: these values are stored cut points; a change here is a store format change.

    @Test func parametersAndMasksArePinned() throws {
        #expect(try ContentDefinedChunker() == chunker)
        #expect(chunker.minimumSize == 16 << 10)
        #expect(chunker.averageSize == 64 << 10)
        #expect(chunker.maximumSize == 256 << 10)
        // 64 KiB is 2^16: 18 top bits before the normal size, 14 after.
        #expect(chunker.smallMask == 0xFFFF_C000_0000_0000)
        #expect(chunker.largeMask == 0xFFFC_0000_0000_0000)
    }

    @Test func gearTableIsPinned() {
        let gear = ContentDefinedChunker.gear
        #expect(gear.count == 256)
        #expect(gear[0] == 0xBBB7_2A68_ACCB_BE0B)
        #expect(gear[1] == 0xEDF2_4182_F763_93CD)
        #expect(gear[128] == 0x7CBA_4699_B615_7E46)
        #expect(gear[255] == 0x49DC_2E0A_2A0F_6CF2)
        #expect(Set(gear).count == 256)
    }

    @Test func cutPointsArePinned() {
        let data = randomData(count: 4 << 20, seed: 42)
        let ends = chunker.chunks(of: data).map(\.upperBound)
        // Checked against an independent Python transcription of the algorithm.
        #expect(ends.count == 55)
        #expect(Array(ends.prefix(6)) == [52741, 124_949, 245_236, 294_781, 379_798, 455_517])
        #expect(ends.last == data.count)
    }

    @Test func textCutPointsArePinned() {
        let ends = chunker.chunks(of: Fixtures.text.prefix(4 << 20)).map(\.upperBound)
        #expect(Array(ends.prefix(6)) == [26236, 107_551, 181_740, 268_115, 384_202, 455_529])
    }

    // MARK: Validation

    @Test func invalidParametersAreRefused() {
        #expect(throws: ContentDefinedChunker.ParameterError.sizesOutOfOrder) {
            try ContentDefinedChunker(minimumSize: 0, averageSize: 1024, maximumSize: 4096)
        }
        #expect(throws: ContentDefinedChunker.ParameterError.sizesOutOfOrder) {
            try ContentDefinedChunker(minimumSize: 1024, averageSize: 1024, maximumSize: 4096)
        }
        #expect(throws: ContentDefinedChunker.ParameterError.sizesOutOfOrder) {
            try ContentDefinedChunker(minimumSize: 256, averageSize: 4096, maximumSize: 4096)
        }
        #expect(throws: ContentDefinedChunker.ParameterError.averageNotPowerOfTwo) {
            try ContentDefinedChunker(minimumSize: 256, averageSize: 3000, maximumSize: 8192)
        }
        #expect(throws: ContentDefinedChunker.ParameterError.averageNotPowerOfTwo) {
            try ContentDefinedChunker(minimumSize: 8, averageSize: 32, maximumSize: 128)
        }
        #expect(throws: ContentDefinedChunker.ParameterError.maximumTooLarge) {
            try ContentDefinedChunker(minimumSize: 1 << 20, averageSize: 2 << 20, maximumSize: (4 << 20) + 1)
        }
        #expect(throws: Never.self) {
            try ContentDefinedChunker(minimumSize: 1 << 20, averageSize: 2 << 20, maximumSize: 4 << 20)
        }
    }

    // MARK: Shape of the chunks

    @Test(arguments: [0, 1, 16 << 10, (16 << 10) + 1, 256 << 10, (256 << 10) + 1, 3 << 20])
    func chunksCoverRandomInputWithinBounds(count: Int) {
        let data = randomData(count: count, seed: UInt64(count))
        expectWellFormed(chunker.chunks(of: data), of: data, chunker)
    }

    @Test func chunksOfTextAndOfZerosAreWellFormed() {
        let text = Fixtures.text.prefix(8 << 20)
        expectWellFormed(chunker.chunks(of: text), of: text, chunker)
        // Constant bytes never match a mask, so every chunk is cut at maximumSize.
        let zeros = Data(count: 1 << 20)
        let ranges = chunker.chunks(of: zeros)
        expectWellFormed(ranges, of: zeros, chunker)
        #expect(ranges.map(\.count) == [256 << 10, 256 << 10, 256 << 10, 256 << 10])
    }

    @Test func rangesAreIndicesOfASlice() {
        let data = randomData(count: 1 << 20, seed: 7)
        let slice = data[1000..<900_000]
        let ranges = chunker.chunks(of: slice)
        expectWellFormed(ranges, of: slice, chunker)
        #expect(ranges.first?.lowerBound == 1000)
        // A slice holds the same bytes as a copy, so the chunks are the same, shifted.
        let copy = Data(slice)
        #expect(chunker.chunks(of: copy).map { $0.count } == ranges.map { $0.count })
    }

    @Test func cutNeverExceedsMaximumAndTakesShortBuffersWhole() {
        let data = randomData(count: 1 << 20, seed: 8)
        data.withUnsafeBytes { raw in
            #expect(chunker.cut(UnsafeRawBufferPointer(rebasing: raw[..<0])) == 0)
            #expect(chunker.cut(UnsafeRawBufferPointer(rebasing: raw[..<100])) == 100)
            #expect(chunker.cut(UnsafeRawBufferPointer(rebasing: raw[..<(16 << 10)])) == 16 << 10)
            #expect(chunker.cut(raw) <= 256 << 10)
            #expect(chunker.cut(raw) >= 16 << 10)
        }
    }

    @Test func smallParametersKeepTheirBounds() throws {
        let small = try ContentDefinedChunker(minimumSize: 256, averageSize: 1024, maximumSize: 4096)
        let data = randomData(count: 2 << 20, seed: 9)
        let ranges = small.chunks(of: data)
        expectWellFormed(ranges, of: data, small)
        let mean = Double(data.count) / Double(ranges.count)
        #expect(abs(mean - 1024) <= 0.25 * 1024, "mean chunk size \(mean)")
    }

    @Test func averageChunkSizeIsNearTheNormalSize() {
        let data = randomData(count: 32 << 20, seed: 10)
        let ranges = chunker.chunks(of: data)
        let mean = Double(data.count) / Double(ranges.count)
        #expect(abs(mean - 65536) <= 0.25 * 65536, "mean chunk size \(mean) over \(ranges.count) chunks")
    }

    // MARK: Streaming and resumption

    @Test func streamGivesTheOneShotBoundaries() {
        let data = Fixtures.text.prefix(6 << 20)
        let expected = chunker.chunks(of: data)
        // Whole reads, short reads of varying length, and tiny reads.
        for maxRead in [Int.max, 70_001, 4093] {
            var position = data.startIndex
            var generator = SplitMix64(seed: UInt64(maxRead & 0xFFFF))
            var stream = ContentDefinedChunker.Stream(chunker)
            var chunks: [Range<Int>] = []
            while let chunk = stream.next(read: { (n: Int) -> Data in
                #expect(n > 0 && n <= 2 * chunker.maximumSize)
                let length = min(n, maxRead == Int.max ? n : 1 + Int(generator.next() % UInt64(maxRead)))
                let upper = min(position + length, data.endIndex)
                defer { position = upper }
                return data[position..<upper]
            }) {
                // Read-ahead stays O(maximumSize): what was read but not yet yielded.
                #expect(position - data.startIndex - stream.offset <= 2 * chunker.maximumSize)
                let lower = data.startIndex + stream.offset - chunk.count
                #expect(chunk == data[lower..<lower + chunk.count])
                chunks.append(lower..<lower + chunk.count)
            }
            #expect(chunks == expected, "maxRead \(maxRead)")
            #expect(stream.next(read: { _ in Issue.record("read after the end"); return Data() }) == nil)
        }
    }

    @Test func streamOfEmptyInputIsEmpty() {
        var stream = ContentDefinedChunker.Stream(chunker)
        #expect(stream.next(read: { _ in Data() }) == nil)
        #expect(stream.offset == 0)
    }

    @Test func streamPassesReadErrorsOn() {
        struct ReadFailed: Error, Equatable {}
        var stream = ContentDefinedChunker.Stream(chunker)
        #expect(throws: ReadFailed()) {
            _ = try stream.next(read: { (_: Int) throws(ReadFailed) -> Data in throw ReadFailed() })
        }
        // The failed read left the stream usable.
        let data = randomData(count: 100_000, seed: 11)
        var served = false
        let chunk = stream.next(read: { _ in
            defer { served = true }
            return served ? Data() : data
        })
        #expect(chunk.map { chunker.chunks(of: data).first == 0..<$0.count } == true)
    }

    @Test func resumingAtACutPointGivesTheSameLaterCutPoints() {
        let data = Fixtures.text.prefix(12 << 20)
        let all = chunker.chunks(of: data)
        #expect(all.count > 40)
        for k in [1, 2, 17, all.count / 2, all.count - 1] {
            let start = all[k].lowerBound
            #expect(chunker.chunks(of: data, from: start) == Array(all[k...]), "from chunk \(k)")

            var stream = ContentDefinedChunker.Stream(chunker, startingAt: start)
            var position = start
            var ends: [Int] = []
            while stream.next(read: { n in
                let upper = min(position + n, data.endIndex)
                defer { position = upper }
                return data[position..<upper]
            }) != nil {
                ends.append(stream.offset)
            }
            #expect(ends == all[k...].map(\.upperBound), "stream from chunk \(k)")
        }
    }

    /// What the store will do: re-chunk from the last old cut point before an edit and stop at the
    /// first new cut point that is an old one shifted by the edit; splicing must equal a full re-chunk.
    @Test func reChunkingAWindowAroundAnEditMatchesAFullReChunk() {
        let old = Fixtures.text.prefix(16 << 20)
        let oldRanges = chunker.chunks(of: old)
        let editAt = 7_654_321, removed = 3000
        let inserted = Data("an inserted sentence that replaces a few lines\n".utf8)
        var new = Data(old[..<editAt])
        new.append(inserted)
        new.append(old[(editAt + removed)...])
        let shift = inserted.count - removed

        let firstAffected = oldRanges.lastIndex { $0.lowerBound <= editAt } ?? 0
        let oldEnds = Set(oldRanges.map(\.upperBound))
        var window: [Range<Int>] = []
        var position = oldRanges[firstAffected].lowerBound
        new.withUnsafeBytes { raw in
            while position < raw.count {
                let length = chunker.cut(UnsafeRawBufferPointer(rebasing: raw[position...]))
                window.append(position..<position + length)
                position += length
                let oldEnd = position - shift
                if position >= editAt + inserted.count && oldEnds.contains(oldEnd) { break }
            }
        }
        let resumeOld = oldRanges.firstIndex { $0.lowerBound == position - shift } ?? oldRanges.endIndex
        let spliced = Array(oldRanges[..<firstAffected]) + window
            + oldRanges[resumeOld...].map { ($0.lowerBound + shift)..<($0.upperBound + shift) }
        #expect(spliced == chunker.chunks(of: new))
        #expect(window.count <= 4, "re-chunked \(window.count) chunks")
    }

    // MARK: The point of it: an edit costs about its own size

    @Test func insertingAtTheStartStoresLittleNew() {
        #expect(Fixtures.inserted.count == 100)
        let old = Fixtures.text
        var new = Data(Fixtures.inserted)
        new.append(old)
        let (added, dropped) = unsharedBytes(old: old, new: new)
        #expect(added <= 2 * chunker.maximumSize, "new bytes to store: \(added)")
        #expect(dropped <= 2 * chunker.maximumSize, "old bytes no longer used: \(dropped)")
    }

    @Test func insertingInTheMiddleStoresLittleNew() {
        let old = Fixtures.text
        let middle = old.count / 2 + 12_345
        var new = Data(old[..<middle])
        new.append(Fixtures.inserted)
        new.append(old[middle...])
        let (added, dropped) = unsharedBytes(old: old, new: new)
        #expect(added <= 2 * chunker.maximumSize, "new bytes to store: \(added)")
        #expect(dropped <= 2 * chunker.maximumSize, "old bytes no longer used: \(dropped)")
    }

    @Test func appendingALineChangesOnlyTheLastChunks() {
        let old = Fixtures.text
        var new = old
        new.append(Data("and one more line at the very end of the file\n".utf8))
        let (added, _) = unsharedBytes(old: old, new: new)
        #expect(added <= chunker.maximumSize, "new bytes to store: \(added)")
        let oldRanges = chunker.chunks(of: old), newRanges = chunker.chunks(of: new)
        #expect(Array(oldRanges.dropLast()) == Array(newRanges.prefix(oldRanges.count - 1)))
    }

    // MARK: Helpers

    /// Bytes of `new`'s chunks that are not chunks of `old` (to store), and the reverse (to drop).
    private func unsharedBytes(old: Data, new: Data) -> (added: Int, dropped: Int) {
        let oldChunks = chunker.chunks(of: old).map { ChunkKey(old[$0]) }
        let newChunks = chunker.chunks(of: new).map { ChunkKey(new[$0]) }
        let oldSet = Set(oldChunks), newSet = Set(newChunks)
        let added = newChunks.filter { !oldSet.contains($0) }.reduce(0) { $0 + $1.bytes.count }
        let dropped = oldChunks.filter { !newSet.contains($0) }.reduce(0) { $0 + $1.bytes.count }
        return (added, dropped)
    }

    private func expectWellFormed(
        _ ranges: [Range<Int>], of data: Data, _ chunker: ContentDefinedChunker,
        sourceLocation: SourceLocation = #_sourceLocation
    ) {
        #expect(ranges.first?.lowerBound ?? data.startIndex == data.startIndex, sourceLocation: sourceLocation)
        #expect(ranges.last?.upperBound ?? data.endIndex == data.endIndex, sourceLocation: sourceLocation)
        #expect(data.isEmpty == ranges.isEmpty, sourceLocation: sourceLocation)
        for (a, b) in zip(ranges, ranges.dropFirst()) where a.upperBound != b.lowerBound {
            Issue.record("gap or overlap between \(a) and \(b)", sourceLocation: sourceLocation)
        }
        for (i, range) in ranges.enumerated() {
            let isLast = i == ranges.count - 1
            if range.count > chunker.maximumSize || range.isEmpty
                || (!isLast && range.count < chunker.minimumSize) {
                Issue.record("chunk \(i) \(range) has \(range.count) bytes", sourceLocation: sourceLocation)
            }
        }
    }
}

/// A chunk compared by its bytes; hashed with a word-wise FNV-1a variant written here.
private struct ChunkKey: Hashable {
    let bytes: Data
    init(_ bytes: Data) { self.bytes = bytes }
    static func == (a: ChunkKey, b: ChunkKey) -> Bool { a.bytes == b.bytes }
    func hash(into hasher: inout Hasher) {
        var digest: UInt64 = 0xCBF2_9CE4_8422_2325
        bytes.withUnsafeBytes { raw in
            var i = 0
            while i + 8 <= raw.count {
                digest = (digest ^ raw.loadUnaligned(fromByteOffset: i, as: UInt64.self)) &* 0x100_0000_01B3
                i += 8
            }
            while i < raw.count {
                digest = (digest ^ UInt64(raw[i])) &* 0x100_0000_01B3
                i += 1
            }
        }
        hasher.combine(digest)
        hasher.combine(bytes.count)
    }
}


private func randomData(count: Int, seed: UInt64) -> Data {
    var generator = SplitMix64(seed: seed)
    var data = Data(count: count)
    data.withUnsafeMutableBytes { raw in
        var i = 0
        while i + 8 <= raw.count {
            raw.storeBytes(of: generator.next(), toByteOffset: i, as: UInt64.self)
            i += 8
        }
        while i < raw.count {
            raw[i] = UInt8(truncatingIfNeeded: generator.next())
            i += 1
        }
    }
    return data
}

private enum Fixtures {
    /// 64 MiB of text-like lines: words from a 4096-word pseudo-random vocabulary, 4 to 15 per line.
    static let text: Data = {
        var generator = SplitMix64(seed: 0x7465_7874)
        let letters = Array("etaoinshrdlcumwfgypbvkjxqz".utf8)
        let vocabulary: [[UInt8]] = (0..<4096).map { _ in
            let length = 1 + Int(generator.next() % 10)
            return (0..<length).map { _ in letters[Int(generator.next() % 13 + generator.next() % 14)] }
        }
        let size = 64 << 20
        var bytes: [UInt8] = []
        bytes.reserveCapacity(size + 256)
        while bytes.count < size {
            let words = 4 + Int(generator.next() % 12)
            for w in 0..<words {
                if w > 0 { bytes.append(0x20) }
                bytes.append(contentsOf: vocabulary[Int(generator.next() % 4096)])
            }
            bytes.append(0x0A)
        }
        return Data(bytes[..<size])
    }()

    /// 100 bytes: a new first line, as an editor inserting a line would write it.
    static let inserted: Data = {
        let line = Array("A heading inserted by an editor that rewrites the whole file on save; it is exactly 100 bytes.".utf8)
        return Data(line + Array(repeating: UInt8(0x2E), count: 99 - line.count) + [0x0A])
    }()
}
