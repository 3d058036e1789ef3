import DocumentEngine
import Foundation
import Synchronization

/// The extents of one file as of one lineage, read from the store as a window needs them.
final class Layout {
    let store: VersionedStore
    let tx: any StoreTransaction
    let node: StoreNodeID
    let lineage: Lineage
    let size: Int64
    /// Extent starts read so far, and the extents that begin there.
    private var known: Range<Int64> = 0..<0
    private var extents: [(start: Int64, extent: Extent)] = []
    private let empty: Bool

    init(
        store: VersionedStore, tx: any StoreTransaction, node: StoreNodeID, lineage: Lineage, size: Int64,
        empty: Bool = false
    ) {
        self.store = store
        self.tx = tx
        self.node = node
        self.lineage = lineage
        self.size = size
        self.empty = empty
    }

    private var longest: Int64 { store.longestExtent }
    /// The chunk read last: a window reads the base between a source's held pages, often
    /// several stretches of one chunk in turn.
    private var lastChunk: (id: Int64, data: Data)?

    /// Reads the extents beginning in `range` unless they are known.
    private func need(_ range: Range<Int64>) throws {
        guard !empty, !range.isEmpty else { return }
        if known.lowerBound <= range.lowerBound && known.upperBound >= range.upperBound { return }
        // A few megabytes at a time, ahead of what is asked: windows move forward.
        let upper = max(range.upperBound, min(Int64.max - longest * 64, range.lowerBound) + longest * 16)
        if !known.isEmpty, range.lowerBound >= known.lowerBound, range.lowerBound <= known.upperBound {
            let found = try VersionedStore.extents(
                tx, node: node, lineage: lineage, starts: known.upperBound...(upper - 1))
            extents += found.sorted { $0.key < $1.key }.map { (start: $0.key, extent: $0.value) }
            known = known.lowerBound..<upper
        } else {
            let found = try VersionedStore.extents(
                tx, node: node, lineage: lineage, starts: range.lowerBound...(upper - 1))
            extents = found.sorted { $0.key < $1.key }.map { (start: $0.key, extent: $0.value) }
            known = range.lowerBound..<upper
        }
    }

    /// The extents beginning in `range`, by start.
    func extents(startingIn range: Range<Int64>) throws -> [Int64: Extent] {
        if empty || range.isEmpty { return [:] }
        if range.upperBound == .max {
            let found = try VersionedStore.extents(
                tx, node: node, lineage: lineage, starts: range.lowerBound...Int64.max)
            return found
        }
        try need(range)
        var result: [Int64: Extent] = [:]
        for item in extents where range.contains(item.start) { result[item.start] = item.extent }
        return result
    }

    /// The extent covering `position`, if any.
    func extent(covering position: Int64) throws -> (start: Int64, extent: Extent)? {
        guard !empty, position >= 0 else { return nil }
        try need(max(0, position - longest + 1)..<position + 1)
        return extents.last { $0.start <= position && position < $0.start + $0.extent.length }
    }

    /// Whether `position` lies strictly inside an extent (a cut there would split it).
    func isInsideExtent(_ position: Int64) throws -> Bool {
        guard let covering = try extent(covering: position) else { return false }
        return covering.start < position
    }

    /// Where a window that changes bytes from `position` on may start: the start of the extent
    /// holding the byte before (its end was decided by the bytes up to `position`), or, in a hole,
    /// the end of the extent before it, or a multiple of the longest extent in a long hole.
    func boundary(before position: Int64) throws -> Int64 {
        guard position > 0 else { return 0 }
        if let covering = try extent(covering: position - 1) { return covering.start }
        let lower = max(0, position - 2 * longest)
        try need(lower..<position)
        let previousEnd = extents.filter { $0.start < position }.map { $0.start + $0.extent.length }
            .filter { $0 <= position - 1 }.max()
        return previousEnd ?? max(lower, (position - 1) / longest * longest)
    }

    /// The file's bytes `range` (zeros in holes and past the end).
    func bytes(_ range: Range<Int64>) throws -> Data {
        var result = Data(count: Int(range.count))
        guard !empty, !range.isEmpty, range.lowerBound < size else { return result }
        try need(max(0, range.lowerBound - longest + 1)..<range.upperBound)
        for item in extents
        where item.start < range.upperBound && item.start + item.extent.length > range.lowerBound {
            let chunk: Data
            if let last = lastChunk, last.id == item.extent.chunk {
                chunk = last.data
            } else {
                chunk = try store.chunk(tx, item.extent.chunk)
                lastChunk = (item.extent.chunk, chunk)
            }
            let from = max(range.lowerBound, item.start)
            let to = min(range.upperBound, item.start + min(item.extent.length, Int64(chunk.count)), size)
            guard from < to else { continue }
            result.replaceSubrange(
                Int(from - range.lowerBound)..<Int(to - range.lowerBound),
                with: chunk[
                    chunk.startIndex + Int(from - item.start)..<chunk.startIndex + Int(to - item.start)])
        }
        return result
    }
}

/// A contents source read a page (a chunk size) at a time, at page offsets, as a file system's
/// written pages are kept; one page is held at a time. Bytes past what a page holds are zeros.
final class PagedSource {
    let source: any ContentsSource
    let size: Int64
    let page: Int64
    /// The last span read, and its bytes.
    private var held: (span: Range<Int64>, data: Data)?

    init(source: any ContentsSource, size: Int64, page: Int64) {
        self.source = source
        self.size = size
        self.page = page
    }

    /// The bytes `range` (inside one page), reading its whole page.
    func bytes(_ range: Range<Int64>) throws -> Data {
        let start = range.lowerBound / page * page
        return try bytes(range, within: start..<min(size, start + page))
    }

    /// The bytes `range`, reading all of `span` (inside one page, around `range`): the part of
    /// a page a source holds (``ContentsSource/heldRanges``) is read at once, not all of it.
    func bytes(_ range: Range<Int64>, within span: Range<Int64>) throws -> Data {
        if held?.span != span {
            held = nil  // let the last span go before the next is read
            let wanted = span.count
            let data = try source.read(offset: span.lowerBound, count: wanted)
            if data.count > wanted {
                throw DocumentStoreError.invalidChange(
                    "the contents source gave \(data.count) bytes at \(span.lowerBound), more than \(wanted)")
            }
            held = (span, data)
        }
        guard let data = held?.data else { return Data(count: range.count) }
        let from = Int(range.lowerBound - span.lowerBound)
        let to = Int(range.upperBound - span.lowerBound)
        // A slice shares the span's storage: no copy when the source holds every byte.
        if to <= data.count { return data[data.startIndex + from..<data.startIndex + to] }
        var result = Data(count: range.count)
        if from < data.count {
            let upto = min(to, data.count)
            result.replaceSubrange(
                0..<upto - from, with: data[data.startIndex + from..<data.startIndex + upto])
        }
        return result
    }
}

/// The bytes of the file being written: changed ranges from the update's source (a page at a
/// time), the rest from the base (zeros past its end).
final class NewContent {
    let base: Layout
    let size: Int64
    let changed: [Range<Int64>]
    let pages: PagedSource

    init(base: Layout, size: Int64, changed: [Range<Int64>], source: any ContentsSource, page: Int64) {
        self.base = base
        self.size = size
        self.changed = changed
        pages = PagedSource(source: source, size: size, page: page)
    }

    /// Up to `count` bytes at `offset`: the first stretch that comes from one place (a page of
    /// the source, or the base), as it is, without joining stretches; empty only at the end.
    func bytes(at offset: Int64, upTo count: Int) throws -> Data {
        let at = offset
        let end = min(size, offset + Int64(count))
        if at < end {
            // The first changed range that ends past `at`.
            var low = 0
            var high = changed.count
            while low < high {
                let middle = (low + high) / 2
                if changed[middle].upperBound <= at { low = middle + 1 } else { high = middle }
            }
            if low < changed.count, changed[low].lowerBound <= at {
                let pageStart = at / pages.page * pages.page
                let span =
                    max(
                        pageStart, changed[low].lowerBound)..<min(
                        size, changed[low].upperBound, pageStart + pages.page)
                return try pages.bytes(at..<min(end, span.upperBound), within: span)
            } else {
                let to = min(end, low < changed.count ? changed[low].lowerBound : end)
                return try base.bytes(at..<to)
            }
        }
        return Data()
    }
}
