import Foundation

/// Splits bytes into content-defined chunks with FastCDC (Xia et al., USENIX ATC 2016 and IEEE TPDS 2020):
/// a gear rolling hash, no cut point before `minimumSize`, and normalized chunking at level 2.
///
/// Cut points follow the content, not the offsets, so inserting or deleting bytes changes only the
/// chunks around the edit; the chunks after it are the same bytes as before and deduplicate.
///
/// **Resumption.** Where a chunk ends depends only on the bytes from its own start up to
/// `maximumSize` bytes later (and on where the data ends, if sooner). So chunking started at any cut
/// point yields exactly the later cut points of chunking from the beginning, and two versions of a
/// file that agree after a common cut point agree on every cut point after it. To re-chunk an edited
/// file, start at the last old cut point at or before the edit and stop at the first new cut point
/// past the edit that is also an old cut point (shifted by the change in length): the rest is unchanged.
///
/// Cut points are part of the store format: the gear table, the masks and the cut rule must never
/// change, and neither may the sizes the store cuts with (`Chunking.Policy`).
public struct ContentDefinedChunker: Sendable, Equatable {
    /// No chunk but the last is shorter than this.
    public let minimumSize: Int
    /// The normal size: the harder mask applies before it, the easier one after it (a power of two).
    public let averageSize: Int
    /// No chunk is longer than this.
    public let maximumSize: Int

    /// Tested before `averageSize`: log2(averageSize) + 2 bits, so cuts there are 4 times rarer.
    let smallMask: UInt64
    /// Tested from `averageSize` on: log2(averageSize) − 2 bits, so cuts there are 4 times likelier.
    let largeMask: UInt64

    /// The largest `maximumSize` accepted; it bounds the memory a `Stream` holds.
    public static let largestMaximumSize = 4 << 20

    /// 16 KiB / 64 KiB / 256 KiB: the 256 KiB maximum is the store's former fixed chunk size, so no
    /// chunk is larger than before, and a 64 KiB normal size keeps the chunk count of a large file
    /// (and so the rows per file version) modest while an edit costs about one to three chunks.
    public static let standard = ContentDefinedChunker(
        checkedMinimumSize: 16 << 10, averageSize: 64 << 10, maximumSize: 256 << 10)

    /// Why parameters were refused.
    public enum ParameterError: Error, Equatable, Sendable {
        /// `0 < minimumSize < averageSize < maximumSize` does not hold.
        case sizesOutOfOrder
        /// `averageSize` is not a power of two of at least 64 (the large mask needs at least 4 bits).
        case averageNotPowerOfTwo
        /// `maximumSize` is above `largestMaximumSize`.
        case maximumTooLarge
    }

    /// Requires `0 < minimumSize < averageSize < maximumSize ≤ 4 MiB`, `averageSize` a power of two ≥ 64.
    public init(
        minimumSize: Int = 16 << 10, averageSize: Int = 64 << 10, maximumSize: Int = 256 << 10
    ) throws(ParameterError) {
        guard minimumSize > 0, minimumSize < averageSize, averageSize < maximumSize else {
            throw .sizesOutOfOrder
        }
        guard averageSize >= 64, averageSize.nonzeroBitCount == 1 else { throw .averageNotPowerOfTwo }
        guard maximumSize <= Self.largestMaximumSize else { throw .maximumTooLarge }
        self.init(checkedMinimumSize: minimumSize, averageSize: averageSize, maximumSize: maximumSize)
    }

    private init(checkedMinimumSize minimumSize: Int, averageSize: Int, maximumSize: Int) {
        self.minimumSize = minimumSize
        self.averageSize = averageSize
        self.maximumSize = maximumSize
        let bits = averageSize.trailingZeroBitCount
        // The top bits: bit k of a gear hash depends on the last k + 1 bytes only, so the top bits are
        // the ones that see the whole 64-byte window (low bits would cut on short repeated patterns).
        smallMask = UInt64.max << UInt64(64 - (bits + 2))
        largeMask = UInt64.max << UInt64(64 - (bits - 2))
    }

    /// The gear table: 256 successive outputs of splitmix64 (Steele, Lea & Flood, 2014) from the seed
    /// 0x446F_6346_5343_4443 ("DocFSCDC"). Computed rather than listed so it is short to audit; the
    /// generator and seed are frozen because cut points are stored.
    static let gear: [UInt64] = {
        var state: UInt64 = 0x446F_6346_5343_4443
        return (0..<256).map { _ in
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }()

    /// The length of the first chunk of `bytes`: all of them if there are at most `minimumSize` or no
    /// cut point comes before `maximumSize`; never more than `maximumSize`.
    ///
    /// As in the paper, the cut lies before the byte whose hash matched, so it may look at one byte
    /// past the chunk, but never at or past offset `maximumSize`.
    public func cut(_ bytes: UnsafeRawBufferPointer) -> Int {
        let count = bytes.count
        guard count > minimumSize, let base = bytes.baseAddress else { return count }
        let end = Swift.min(count, maximumSize)
        let normalEnd = Swift.min(averageSize, end)
        let smallMask = smallMask
        let largeMask = largeMask
        return Self.gear.withUnsafeBufferPointer { gear -> Int in
            var hash: UInt64 = 0
            var index = minimumSize  // cut-point skipping: the first minimumSize bytes are not even hashed
            if let cut = Self.scan(gear, base, &hash, &index, to: normalEnd, mask: smallMask) { return cut }
            if let cut = Self.scan(gear, base, &hash, &index, to: end, mask: largeMask) { return cut }
            return end
        }
    }

    /// Rolls the gear hash over `base[index..<end]` and returns the first index where `hash & mask`
    /// is zero. Two bytes a step: the hash after the second is computed from the hash before
    /// the first, so the loop's dependency chain is one shift and one add per two bytes (a third
    /// faster than byte by byte), and every byte's hash is still checked, so the cuts are the same.
    @inline(__always)
    private static func scan(
        _ gear: UnsafeBufferPointer<UInt64>, _ base: UnsafeRawPointer, _ hash: inout UInt64,
        _ index: inout Int, to end: Int, mask: UInt64
    ) -> Int? {
        while index &+ 1 < end {
            let g0 = gear[Int(base.load(fromByteOffset: index, as: UInt8.self))]
            let g1 = gear[Int(base.load(fromByteOffset: index &+ 1, as: UInt8.self))]
            let first = (hash &<< 1) &+ g0
            let second = (hash &<< 2) &+ ((g0 &<< 1) &+ g1)
            if first & mask == 0 { return index }
            if second & mask == 0 { return index &+ 1 }
            hash = second
            index &+= 2
        }
        if index < end {
            hash = (hash &<< 1) &+ gear[Int(base.load(fromByteOffset: index, as: UInt8.self))]
            if hash & mask == 0 { return index }
            index &+= 1
        }
        return nil
    }

    /// The chunks of `data` as consecutive index ranges of `data` that cover it.
    public func chunks(of data: Data) -> [Range<Int>] {
        chunks(of: data, from: data.startIndex)
    }

    /// The chunks of `data[start...]`, where `start` is a cut point of `data` (or its start index).
    /// By the resumption property these are exactly the chunks of `chunks(of: data)` from `start` on.
    public func chunks(of data: Data, from start: Int) -> [Range<Int>] {
        precondition(start >= data.startIndex && start <= data.endIndex, "start \(start) is outside the data")
        var ranges: [Range<Int>] = []
        ranges.reserveCapacity((data.endIndex - start) / averageSize + 1)
        data.withUnsafeBytes { raw in
            var offset = start - data.startIndex
            while offset < raw.count {
                let length = cut(UnsafeRawBufferPointer(rebasing: raw[offset...]))
                let lower = data.startIndex + offset
                ranges.append(lower..<lower + length)
                offset += length
            }
        }
        return ranges
    }

    /// Yields a byte stream's chunks one at a time, with the same cut points as `chunks(of:)`,
    /// holding at most 2 × `maximumSize` bytes besides the chunk it returns (if `read` returns no
    /// more than it is asked for).
    ///
    /// To resume at a known cut point, start the reader there and pass that offset as `startingAt`.
    public struct Stream: Sendable {
        public let chunker: ContentDefinedChunker
        /// The stream offset where the next chunk starts: `startingAt` plus the bytes yielded so far.
        public private(set) var offset: Int
        private var buffer: [UInt8] = []
        /// The first byte of `buffer` not yet yielded.
        private var start = 0
        private var atEnd = false

        public init(_ chunker: ContentDefinedChunker, startingAt offset: Int = 0) {
            self.chunker = chunker
            self.offset = offset
        }

        /// The next chunk's bytes, or nil after the last.
        ///
        /// `read(n)` returns up to `n` (> 0) bytes following those it returned before, and empty data
        /// at the end of the stream; it is not called again after that. A short read is fine.
        /// If `read` throws, the stream is unchanged but for the bytes it had already read, and may be retried.
        public mutating func next<E: Error>(read: (Int) throws(E) -> Data) throws(E) -> Data? {
            let maximumSize = chunker.maximumSize
            // A cut needs maximumSize bytes ahead (or the end) to be the same as a one-shot cut.
            if !atEnd && buffer.count - start < maximumSize {
                // Compact only once a whole maximumSize has been yielded, so the copying stays
                // amortized to at most one byte per byte read.
                if start >= maximumSize {
                    buffer.removeFirst(start)
                    start = 0
                }
                if buffer.capacity < 2 * maximumSize { buffer.reserveCapacity(2 * maximumSize) }
                while buffer.count - start < maximumSize {
                    let more = try read(2 * maximumSize - buffer.count)
                    if more.isEmpty {
                        atEnd = true
                        break
                    }
                    buffer.append(contentsOf: more)
                }
            }
            guard start < buffer.count else { return nil }
            let chunker = chunker
            let start = start
            let (length, chunk) = buffer.withUnsafeBytes { raw -> (Int, Data) in
                let rest = UnsafeRawBufferPointer(rebasing: raw[start...])
                let length = chunker.cut(rest)
                return (length, Data(UnsafeRawBufferPointer(rebasing: rest[..<length])))
            }
            self.start += length
            offset += length
            return chunk
        }
    }
}
