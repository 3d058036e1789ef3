import DocumentEngine
import Foundation
import Synchronization

/// Writes one file's content update inside a save.
///
/// A file's contents are extents: chunks at byte offsets, cut where the content says
/// (``ContentDefinedChunker``), so an edit anywhere changes only the chunks around it, even when
/// an editor writes the whole file anew. An update is applied as windows: each starts at an
/// extent boundary before a changed range, is cut into chunks again, and ends at the first cut
/// past the change that is also a boundary of the extents before (or at the end of the file).
/// Extents outside the windows stay as they are. Only chunks whose bytes are new are stored, and
/// only extents that differ get a row. Chunks are read and written one at a time, so an update of
/// any size holds a few chunks in memory.
struct ContentWriter {
    let store: VersionedStore
    let tx: any StoreTransaction
    let node: StoreNodeID
    /// The file's size before; nil when the node was not a regular file before (new, or re-added).
    let previousSize: Int64?
    /// The state the save applies to.
    let lineage: Lineage
    let branch: Int64
    let version: VersionID
    /// The file's new bytes already cut and hashed, when the update gives all of them.
    var precut: Precut? = nil

    /// What a read sees so far, including this save's own rows (a conflict's are in its branch).
    var view: Lineage { branch == 0 ? lineage : Lineage(limit: lineage.limit, branch: branch) }

    /// Where the new contents start from before the changed ranges apply.
    private enum Base {
        /// The file's own contents before the save.
        case own
        /// Another file's contents (a copy, or a file that was another one before).
        case other(NodeLookup)
        /// Nothing: every byte is given.
        case none
    }

    /// What an update did: the file's new size, what it stored, and the extent rows it wrote
    /// (a nil extent removes the one that began there).
    struct Outcome {
        var size: Int64
        var chunks: Int
        var bytes: Int64
        var rows: [(start: Int64, extent: Extent?)]
    }

    func write(_ update: ContentUpdate) throws -> Outcome {
        let page = Int64(store.chunkSize)
        func pages(_ listed: [Int], below size: Int64) throws -> [Range<Int64>] {
            if let index = listed.first(where: { $0 < 0 }) {
                throw DocumentStoreError.invalidChange("negative chunk index \(index)")
            }
            return Set(listed).map(Int64.init).filter { $0 * page < size }.sorted()
                .map { $0 * page..<min(size, ($0 + 1) * page) }
        }
        switch update {
        case .chunks(let size, let given):
            guard size >= 0 else { throw DocumentStoreError.invalidChange("negative size") }
            for (index, data) in given {
                guard index >= 0 else {
                    throw DocumentStoreError.invalidChange("negative chunk index \(index)")
                }
                guard data.count <= store.chunkSize else {
                    throw DocumentStoreError.invalidChange("chunk \(index) is larger than the chunk size")
                }
            }
            let source = GivenChunks(chunks: given, page: page, size: size)
            return try apply(
                base: .own, size: size, changed: try pages(Array(given.keys), below: size), source: source)
        case .sparse(let size, let listed, let source):
            guard size >= 0 else { throw DocumentStoreError.invalidChange("negative size") }
            return try apply(
                base: .own, size: size, changed: try Self.held(pages(listed, below: size), source),
                edited: source.changedRanges, source: source)
        case .replace(let source):
            guard source.count >= 0 else { throw DocumentStoreError.invalidChange("negative size") }
            // This store's own bytes are shared, not read back inside its transaction.
            if let stored = source as? StoreContentsSource,
                (stored.store as? any VersionedDocumentStore)?.versionedStore === store
            {
                return try write(.copy(of: NodeLookup(stored.node, at: stored.version)))
            }
            let size = source.count
            return try apply(
                base: .none, size: size, changed: size > 0 ? [0..<size] : [],
                source: ExactSource(source: source))
        case .copy(let lookup):
            let base = try resolve(lookup)
            return try apply(
                base: .other(lookup), size: base.size, changed: [], source: ExactSource(source: nil))
        case .derived(let lookup, let size, let listed, let source):
            guard size >= 0 else { throw DocumentStoreError.invalidChange("negative size") }
            return try apply(
                base: .other(lookup), size: size, changed: try Self.held(pages(listed, below: size), source),
                edited: source.changedRanges, source: source)
        }
    }

    /// The part of the listed chunks' ranges to read from `source`: what it holds
    /// (``ContentsSource/heldRanges``); the rest are the starting file's bytes. Throws when
    /// bytes that may differ are not held.
    static func held(_ listed: [Range<Int64>], _ source: any ContentsSource) throws -> [Range<Int64>] {
        guard let held = source.heldRanges.map(merged) else { return listed }
        let differing = source.changedRanges.map { intersection(merged($0), listed) } ?? listed
        let readable = intersection(listed, held)
        func bytes(_ ranges: [Range<Int64>]) -> Int64 { ranges.reduce(0) { $0 + Int64($1.count) } }
        guard bytes(intersection(differing, readable)) == bytes(differing) else {
            throw DocumentStoreError.invalidChange("the contents source does not hold every byte it changed")
        }
        return readable
    }

    /// Makes the file `size` bytes long: `base` with the `changed` ranges (ascending, disjoint)
    /// read from `source`; bytes past the base's end that no range covers are zeros. `edited`,
    /// if given, are the ranges where the source's bytes may differ from the base's
    /// (``ContentsSource/changedRanges``): only around those are chunks cut again.
    private func apply(
        base baseKind: Base, size: Int64, changed: [Range<Int64>], edited: [Range<Int64>]? = nil,
        source: any ContentsSource
    ) throws -> Outcome {
        let own: Bool
        let base: Layout
        switch baseKind {
        case .own where previousSize != nil:
            own = true
            base = Layout(store: store, tx: tx, node: node, lineage: view, size: previousSize ?? 0)
        case .own, .none:
            own = false
            base = Layout(store: store, tx: tx, node: node, lineage: view, size: 0, empty: true)
        case .other(let lookup):
            own = false
            let resolved = try resolve(lookup)
            base = Layout(
                store: store, tx: tx, node: resolved.node, lineage: resolved.lineage, size: resolved.size)
        }
        // What must be cut again: the changed ranges, growth past the base's end (its last chunk
        // was cut by the end of the file, not by its content), and a shrink's new end.
        // Outside `changed` the bytes are the base's whatever `edited` says.
        var edits = edited.map { Self.intersection(Self.merged($0), changed) } ?? changed
        if size > base.size { edits.append(base.size..<size) }
        if size < base.size { edits.append(size..<size) }
        edits = Self.merged(edits)
        let content = NewContent(
            base: base, size: size, changed: changed, source: source, page: Int64(store.chunkSize))

        var written = (chunks: 0, bytes: Int64(0))
        // The new extents of every window, and where the windows are.
        var replaced: [(window: Range<Int64>, extents: [Int64: Extent])] = []
        var done: Int64 = 0
        var next = 0
        if let precut, precut.size == size, size > 0, Self.merged(changed) == [0..<size] {
            // Every byte is new: one window over the whole file, as the loop below would cut it
            // (from 0 to the end), with the cuts and hashes made before the transaction.
            replaced.append((0..<Int64.max, try storePrecut(precut, from: content, written: &written)))
            next = edits.count
        }
        while next < edits.count {
            let current = next
            let start = max(done, try base.boundary(before: edits[current].lowerBound))
            var stream = Chunking(store.chunking.method(forSize: size), startingAt: start)
            var cursor = start
            var extents: [Int64: Extent] = [:]
            var end = Int64.max
            while let data = try stream.next(read: { count in
                let bytes = try content.bytes(at: cursor, upTo: Int(min(Int64(count), size - cursor)))
                cursor += Int64(bytes.count)
                return bytes
            }) {
                let cut = stream.offset
                if let extent = try storeChunk(data, at: cut - Int64(data.count), written: &written) {
                    extents[cut - Int64(data.count)] = extent
                }
                if cut >= size { break }
                while next < edits.count, edits[next].upperBound <= cut { next += 1 }
                // Past this window's edits, before the next one, and not inside an old extent: the
                // old extents from here on are still right.
                if next > current, next == edits.count || edits[next].lowerBound >= cut,
                    try !base.isInsideExtent(cut)
                {
                    end = cut
                    break
                }
            }
            if end == .max { next = edits.count }
            replaced.append((start..<end, extents))
            done = end
        }

        // Rows: where the target differs from what the file has now.
        var target: [Int64: Extent] = [:]
        var current: [Int64: Extent] = [:]
        if own {
            for (window, extents) in replaced {
                let old = try base.extents(startingIn: window)
                for (start, extent) in old { current[start] = extent }
                target.merge(extents) { _, new in new }
            }
        } else {
            current = try VersionedStore.extents(tx, node: node, lineage: view, starts: 0...Int64.max)
            for (start, extent) in try base.extents(startingIn: 0..<Int64.max)
            where !replaced.contains(where: { $0.window.contains(start) }) && start < size {
                target[start] = extent
            }
            for (_, extents) in replaced { target.merge(extents) { _, new in new } }
        }
        var rows: [(start: Int64, extent: Extent?)] = []
        for (start, extent) in target.sorted(by: { $0.key < $1.key }) where current[start] != extent {
            rows.append((start, extent))
        }
        for start in current.keys.sorted() where target[start] == nil { rows.append((start, nil)) }
        if !rows.isEmpty { try tx.insertExtents(node, branch: branch, version: version, rows) }
        return Outcome(size: size, chunks: written.chunks, bytes: written.bytes, rows: rows)
    }

    /// Stores one chunk's bytes unless the store has them; nil for zeros (a hole).
    private func storeChunk(_ data: Data, at offset: Int64, written: inout (chunks: Int, bytes: Int64))
        throws -> Extent?
    {
        if VersionedStore.isZero(data) { return nil }
        let id = try VersionedStore.storeChunk(
            tx, hash: VersionedStore.hash(data), offset: offset, written: &written
        ) {
            data
        }
        return Extent(chunk: id, length: Int64(data.count))
    }

    /// Stores the chunks of a precut file that the store lacks, from the precut's pending bytes
    /// or else read from `content` again; returns the extents of the whole file.
    private func storePrecut(
        _ precut: Precut, from content: NewContent, written: inout (chunks: Int, bytes: Int64)
    )
        throws -> [Int64: Extent]
    {
        var extents: [Int64: Extent] = [:]
        var at: Int64 = 0
        written.chunks += precut.stored.chunks
        written.bytes += precut.stored.bytes
        for piece in precut.pieces {
            defer { at += Int64(piece.length) }
            guard let hash = piece.hash else { continue }
            let id = try VersionedStore.storeChunk(tx, hash: hash, offset: at, written: &written) {
                if let data = precut.pending[hash] { return data }
                var data = Data(capacity: piece.length)
                while data.count < piece.length {
                    let more = try content.bytes(at: at + Int64(data.count), upTo: piece.length - data.count)
                    if more.isEmpty {
                        throw DocumentStoreError.invalidChange("the contents source ended early")
                    }
                    data.append(more)
                }
                return data
            }
            extents[at] = Extent(chunk: id, length: Int64(piece.length))
        }
        return extents
    }

    /// The file a copy or derived update starts from, as of this save's state when its version is
    /// nil.
    /// A hard link's bytes are those of the file it names.
    private func resolve(_ lookup: NodeLookup) throws -> (node: StoreNodeID, size: Int64, lineage: Lineage) {
        let baseLineage =
            lookup.version == nil ? view : try Lineage.of(tx, lookup.version, reading: lookup.node)
        guard var record = try VersionedStore.node(tx, lookup.node, lineage: baseLineage) else {
            throw DocumentStoreError.noSuchNode(lookup.node)
        }
        if let target = record.linkOf {
            guard let file = try VersionedStore.node(tx, target, lineage: baseLineage), file.linkOf == nil
            else {
                throw DocumentStoreError.noSuchNode(target)
            }
            record = file
        }
        guard record.kind == .regularFile else { throw DocumentStoreError.notARegularFile(lookup.node) }
        return (record.id, record.size, baseLineage)
    }

    /// The parts of `ranges` inside `within`, both in order and disjoint (as ``merged(_:)``
    /// gives them), leaving out empty ones.
    static func intersection(_ ranges: [Range<Int64>], _ within: [Range<Int64>]) -> [Range<Int64>] {
        var result: [Range<Int64>] = []
        var i = 0
        var j = 0
        while i < ranges.count, j < within.count {
            let low = max(ranges[i].lowerBound, within[j].lowerBound)
            let high = min(ranges[i].upperBound, within[j].upperBound)
            if low < high { result.append(low..<high) }
            if ranges[i].upperBound < within[j].upperBound { i += 1 } else { j += 1 }
        }
        return result
    }

    /// Ranges in order, overlapping and touching ones joined; empty ones (a shrink's end) kept
    /// unless another range covers them.
    static func merged(_ ranges: [Range<Int64>]) -> [Range<Int64>] {
        var result: [Range<Int64>] = []
        for range in ranges.sorted(by: { ($0.lowerBound, $0.upperBound) < ($1.lowerBound, $1.upperBound) }) {
            if let last = result.last, range.lowerBound <= last.upperBound,
                !(range.isEmpty && range.lowerBound == last.upperBound && !last.isEmpty)
            {
                result[result.count - 1] = last.lowerBound..<max(last.upperBound, range.upperBound)
            } else {
                result.append(range)
            }
        }
        return result
    }
}

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

/// A whole file's new bytes cut into chunks and hashed before the save's write transaction.
/// Cutting and hashing are most of the cost of storing new bytes and need no store, so saves of
/// different documents do them side by side rather than in turn; the transaction reads only
/// the chunks the store lacks again. Only for stable sources (``ContentsSource/isStable``).
///
/// A large file's new chunks are also stored on the way, in transactions of their own of about
/// ``batchBytes`` each: one huge transaction made SQLite's log search for every page it
/// wrote in a log as large as the file. They are stored on a thread of their own
/// (``BatchStorer``), one batch at a time while the next is cut and hashed: stored by the
/// cutting thread, writing a 1 GiB file's packs was a third of the save's time, with a core
/// idle. Until the save commits, those chunks are referenced by nothing, like any chunk garbage
/// collection may take: the save's transaction looks each one up, and stores again any that is
/// gone.
struct Precut: Sendable {
    struct Piece: Sendable {
        let length: Int
        /// nil for a chunk of zeros (a hole).
        let hash: Data?
    }
    let size: Int64
    let pieces: [Piece]
    /// The chunks and bytes stored ahead of the save.
    var stored = (chunks: 0, bytes: Int64(0))
    /// The bytes of the last part, not stored ahead, by hash: the save's transaction stores
    /// them without reading the source again (at most about ``batchBytes``).
    var pending: [Data: Data] = [:]

    /// 4 MiB: a batch being stored, one being filled and the chunks waiting to be hashed hold
    /// at most three of these (the daemon's memory, B7).
    static let batchBytes = 4 << 20
}

/// Stores a precut's batches of chunks in write transactions of their own, on a serial queue,
/// at most one at a time while the caller fills the next.
private final class BatchStorer: @unchecked Sendable {
    /// A chunk of a batch: its bytes, or none when they are to be read from the batch's source
    /// only if the store lacks the chunk.
    struct Chunk: Sendable {
        let hash: Data
        let offset: Int64
        let length: Int
        let data: Data?
    }

    private let store: VersionedStore
    private let queue = DispatchQueue(label: "docfs.store.batches", target: .global(qos: .userInitiated))
    /// One batch of bytes in flight: the caller waits for it before handing over the next.
    private let slot = DispatchSemaphore(value: 1)
    private let outcome = Mutex<(stored: (chunks: Int, bytes: Int64), error: (any Error)?)>(
        ((0, 0), nil))

    init(store: VersionedStore) { self.store = store }

    /// Hands `chunks`, each with its bytes, over to be stored, once the batch before is.
    func store(_ chunks: [Chunk]) {
        slot.wait()
        queue.async { [self] in
            defer { slot.signal() }
            run(chunks, source: nil)
        }
    }

    /// Hands `chunks` without their bytes over to be stored after the batches before; the bytes
    /// of those the store lacks are read from `source` then. Such a batch holds no bytes while it
    /// waits, so the caller does not wait for the one before.
    func store(_ chunks: [Chunk], readingFrom source: any ContentsSource) {
        queue.async { [self] in run(chunks, source: source) }
    }

    private func run(_ chunks: [Chunk], source: (any ContentsSource)?) {
        guard outcome.withLock({ $0.error == nil }) else { return }
        do {
            // The bytes of the chunks the store lacks, read before the write transaction, which
            // the saves of other documents wait for. Bytes the store has are never read: a file
            // written again with the same bytes costs no second pass over them.
            var read: [Int: Data] = [:]
            let unread = chunks.indices.filter { chunks[$0].data == nil }
            if let source, !unread.isEmpty {
                let stored = try store.backend.read { tx in
                    try tx.chunkIDs(hashes: unread.map { chunks[$0].hash })
                }
                let lacking = unread.filter { stored[chunks[$0].hash] == nil }
                for index in lacking { read[index] = try Self.bytes(of: chunks[index], from: source) }
            }
            let added = try store.write(durable: false) { tx -> (chunks: Int, bytes: Int64) in
                tx.storesBulk()
                var added = (chunks: 0, bytes: Int64(0))
                for (index, chunk) in chunks.enumerated() {
                    _ = try VersionedStore.storeChunk(
                        tx, hash: chunk.hash, offset: chunk.offset, written: &added
                    ) {
                        if let data = chunk.data ?? read[index] { return data }
                        // There when looked up, collected since.
                        guard let source else {
                            throw DocumentStoreError.invalidChange("a batch's chunk has no bytes")
                        }
                        return try Self.bytes(of: chunk, from: source)
                    }
                }
                return added
            }
            outcome.withLock {
                $0.stored.chunks += added.chunks
                $0.stored.bytes += added.bytes
            }
        } catch {
            outcome.withLock { $0.error = error }
        }
    }

    private static func bytes(of chunk: Chunk, from source: any ContentsSource) throws -> Data {
        let data = try source.read(offset: chunk.offset, count: chunk.length)
        guard data.count == chunk.length else {
            throw DocumentStoreError.invalidChange("the contents source ended early")
        }
        return data
    }

    /// What every batch stored, once all are; the first failure, if one failed.
    func finish() throws -> (chunks: Int, bytes: Int64) {
        queue.sync {}
        let result = outcome.withLock { $0 }
        if let error = result.error { throw error }
        return result.stored
    }
}

extension VersionedStore {
    /// The id of the chunk with this hash, stored first (its bytes from `data`, which is called
    /// only then, and counted in `written`) when the store lacks it; `offset` is where it starts
    /// in the file it is stored for.
    static func storeChunk(
        _ tx: any StoreTransaction, hash: Data, offset: Int64, written: inout (chunks: Int, bytes: Int64),
        data: () throws -> Data
    ) throws -> Int64 {
        if let id = try tx.chunkID(hash: hash) { return id }
        let bytes = try data()
        let id = try tx.insertChunk(hash: hash, data: bytes, offset: offset)
        written.chunks += 1
        written.bytes += Int64(bytes.count)
        return id
    }

    /// Precuts the updates of `changes` that give every byte of a file from a stable source,
    /// finishing the preparations of those that have one (``PreparedContents``).
    func precut(_ changes: DocumentChanges) throws -> [StoreNodeID: Precut] {
        var result: [StoreNodeID: Precut] = [:]
        for (id, update) in changes.contents {
            guard let (size, source) = precutSource(update) else {
                update.source?.preparation?.cancel()
                continue
            }
            if let prepared = try finishPreparation(of: update, size: size, source: source) {
                result[id] = prepared
            } else {
                result[id] = try precut(size: size, source: source, page: Int64(chunkSize))
            }
        }
        return result
    }

    /// The size and the source to precut an update from, when it gives every byte of a file
    /// from a stable source.
    func precutSource(_ update: ContentUpdate) -> (Int64, any ContentsSource)? {
        let page = Int64(chunkSize)
        switch update {
        case .replace(let source) where source.isStable && source.count > 0:
            return (source.count, ExactSource(source: source))
        case .sparse(let size, let listed, let source) where source.isStable && size > 0:
            let pages = (size + page - 1) / page
            guard Set(listed.filter { $0 >= 0 && Int64($0) < pages }).count == pages else { return nil }
            // A source holding part of the file leaves the rest to the store's own bytes.
            if let held = source.heldRanges,
                ContentWriter.intersection(ContentWriter.merged(held), [0..<size]) != [0..<size]
            {
                return nil
            }
            // Every chunk listed, but few bytes changed (an edit of a file under a chunk
            // long): cutting again around the edits, in the save, is less work.
            if let edited = source.changedRanges, edited.reduce(0, { $0 + $1.count }) < size / 2 {
                return nil
            }
            return (size, source)
        default:
            return nil
        }
    }

    func precut(size: Int64, source: any ContentsSource, page: Int64) throws -> Precut {
        let builder = PrecutBuilder(store: self)
        return try builder.cut(size: size, source: source, page: page, from: 0)
    }
}

/// Cuts a whole file's new bytes into chunks in order, hashes them and stores them in batches
/// (``Precut``): a save's precut, which may start with the chunks a preparation already cut and
/// hashed (``take(_:from:)``, ``PreparedContents``).
final class PrecutBuilder {
    let store: VersionedStore
    private let hasher: ChunkHasher
    private let storer: BatchStorer
    private var pieces: [Precut.Piece] = []
    private var unhashed = 0
    private var batch: [BatchStorer.Chunk] = []
    private var batched = 0
    /// Where the next collected chunk starts.
    private var offset: Int64 = 0

    init(store: VersionedStore) {
        self.store = store
        hasher = ChunkHasher()
        storer = BatchStorer(store: store)
    }

    /// Takes chunks already cut and hashed (a preparation's, ``PreparedContents``), from offset
    /// 0 on, before any other, and hands them over to be stored in batches at once: their bytes
    /// are read from `source` there, and only for chunks the store lacks, while this builder
    /// cuts the rest of the file.
    func take(_ prepared: [Precut.Piece], from source: any ContentsSource) {
        var lazy: [BatchStorer.Chunk] = []
        var length = 0
        for piece in prepared {
            pieces.append(piece)
            defer { offset += Int64(piece.length) }
            // A chunk of zeros (a hole) is not stored.
            guard let hash = piece.hash else { continue }
            lazy.append(BatchStorer.Chunk(hash: hash, offset: offset, length: piece.length, data: nil))
            length += piece.length
            guard length >= Precut.batchBytes else { continue }
            storer.store(lazy, readingFrom: source)
            lazy = []
            length = 0
        }
        if !lazy.isEmpty { storer.store(lazy, readingFrom: source) }
    }

    /// Takes the file's next chunk.
    func add(_ chunk: Data) {
        hasher.add(chunk)
        unhashed += chunk.count
        if unhashed >= Precut.batchBytes {
            unhashed = 0
            collect(hasher.take())
        }
    }

    /// Takes the hashed chunks in order; the last part (under a batch) is left to the save's
    /// own transaction, so a small file is still stored in one.
    private func collect(_ hashed: [ChunkHasher.Hashed]) {
        for chunk in hashed {
            pieces.append(Precut.Piece(length: chunk.data.count, hash: chunk.hash))
            defer { offset += Int64(chunk.data.count) }
            guard let hash = chunk.hash else { continue }
            batch.append(
                BatchStorer.Chunk(hash: hash, offset: offset, length: chunk.data.count, data: chunk.data))
            batched += chunk.data.count
            guard batched >= Precut.batchBytes else { continue }
            storer.store(batch)
            batch = []
            batched = 0
        }
    }

    /// Cuts the file's bytes from `start` (a cut point, where the chunks given so far end) to
    /// `size`, reading `source` a page at a time, and gives the precut of the whole file.
    func cut(size: Int64, source: any ContentsSource, page: Int64, from start: Int64) throws -> Precut {
        let pages = PagedSource(source: source, size: size, page: page)
        var stream = Chunking(store.chunking.method(forSize: size), startingAt: start)
        var cursor = start
        do {
            while let data = try stream.next(read: { count in
                guard cursor < size else { return Data() }
                let to = min(size, cursor + Int64(count), (cursor / page + 1) * page)
                let bytes = try pages.bytes(cursor..<to)
                cursor = to
                return bytes
            }) {
                add(data)
            }
        } catch {
            abandon()
            throw error
        }
        collect(hasher.take())
        let stored = try storer.finish()
        var pending: [Data: Data] = [:]
        for chunk in batch { pending[chunk.hash] = chunk.data }
        return Precut(size: size, pieces: pieces, stored: stored, pending: pending)
    }

    /// Waits for the batch being stored, so that no batch is left storing once given up.
    func abandon() { _ = try? storer.finish() }
}

/// Hashes chunks on another thread while the caller cuts the next ones, and gives them back in
/// the order they were added; on the caller's thread while the machine has no core to spare.
///
/// Cutting and hashing cost about the same per byte (0.7 ms per MB each on this project's test
/// machine); done one after the other they were most of a whole-file save's own CPU. But a chunk
/// handed to another thread costs CPU of its own (a wake-up, its bytes read on another core):
/// with as many saves hashing as cores, two writers each replacing a 32 MiB file six times took
/// 0.72-0.76 s with every chunk hashed by its cutter against 0.78-0.87 s with a thread each.
private final class ChunkHasher: Sendable {
    struct Hashed: Sendable {
        let data: Data
        /// nil for a chunk of zeros (a hole).
        let hash: Data?
    }
    // Serial, so the results come in the order the chunks were added.
    private let queue = DispatchQueue(label: "docfs.store.hash", target: .global(qos: .userInitiated))
    private let group = DispatchGroup()
    private let results = Mutex<[Hashed]>([])
    /// Hashers of this process at work: each keeps two cores busy while it hands chunks over.
    private static let running = Atomic(0)
    private static let cores = max(1, ProcessInfo.processInfo.activeProcessorCount)

    init() { Self.running.add(1, ordering: .relaxed) }

    deinit { Self.running.subtract(1, ordering: .relaxed) }

    func add(_ data: Data) {
        guard Self.running.load(ordering: .relaxed) * 2 <= Self.cores else {
            // After the chunks handed over, so that the results stay in order.
            group.wait()
            let hashed = Self.hashed(data)
            results.withLock { $0.append(hashed) }
            return
        }
        queue.async(group: group) { [self] in
            let hashed = Self.hashed(data)
            results.withLock { $0.append(hashed) }
        }
    }

    private static func hashed(_ data: Data) -> Hashed {
        Hashed(data: data, hash: VersionedStore.isZero(data) ? nil : VersionedStore.hash(data))
    }

    /// Every chunk added so far, hashed, once they all are.
    func take() -> [Hashed] {
        group.wait()
        return results.withLock { results in
            defer { results = [] }
            return results
        }
    }
}

/// A source that must hold every byte asked for (a whole new file); none when there is nothing
/// to read.
private struct ExactSource: ContentsSource {
    let source: (any ContentsSource)?
    var count: Int64 { source?.count ?? 0 }
    func read(offset: Int64, count: Int) throws -> Data {
        guard let source else { return Data() }
        let data = try source.read(offset: offset, count: count)
        if data.count != count { throw DocumentStoreError.invalidChange("the contents source ended early") }
        return data
    }
}

/// `ContentUpdate.chunks`: each listed fixed-size chunk's bytes, zeros past them.
private struct GivenChunks: ContentsSource {
    let chunks: [Int: Data]
    let page: Int64
    let size: Int64
    var count: Int64 { size }
    func read(offset: Int64, count: Int) throws -> Data {
        var result = Data(count: count)
        var at = offset
        while at < offset + Int64(count) {
            let index = at / page
            let to = min(offset + Int64(count), (index + 1) * page)
            if let data = chunks[Int(index)] {
                let from = Int(at - index * page)
                let upto = min(data.count, Int(to - index * page))
                if from < upto {
                    result.replaceSubrange(
                        Int(at - offset)..<Int(at - offset) + (upto - from),
                        with: data[data.startIndex + from..<data.startIndex + upto])
                }
            }
            at = to
        }
        return result
    }
}

/// The store's way of cutting contents: content-defined, or fixed-size where the chunk size is
/// too small for content-defined chunks.
struct Chunking: Sendable {
    enum Method: Sendable {
        case contentDefined(ContentDefinedChunker)
        case fixed(Int)
    }
    let method: Method
    private var stream: ContentDefinedChunker.Stream?
    private(set) var offset: Int64
    private var pending = Data()

    init(_ method: Method, startingAt offset: Int64) {
        self.method = method
        self.offset = offset
        if case .contentDefined(let chunker) = method {
            stream = ContentDefinedChunker.Stream(chunker, startingAt: Int(offset))
        }
    }

    /// How a store cuts files: by the file's size, so a small file's edit stores a few KiB, not
    /// about a large chunk.
    ///
    /// An edit stores the one to three chunks around it. With one cut for every file that was
    /// about 200 KB for an edit of a file under 256 KiB (xfstests' fsx: one `msync` a save, 257 MB
    /// of chunks in 20,000 operations); small files now cut eight times finer. Files at most
    /// ``smallFileLimit`` long use ``small``, longer ones ``large``: the class is the new
    /// size's, so identical files always cut alike. A file that changes class keeps the extents
    /// it has; windows of new cuts end where a new cut meets an old boundary, as always, so
    /// contents stay right and only the edit's neighbourhood is cut again.
    struct Policy: Sendable {
        let large: Method
        let small: Method
        /// The longest file cut with ``small``: one chunk size (256 KiB by default), the files a
        /// large cut gives one to three chunks. Not more: a 1 MB image cut small took 55 chunks
        /// instead of 7, and its save wrote a fifth more to SQLite's log.
        let smallFileLimit: Int64

        init(chunkSize: Int) {
            large = Chunking.method(chunkSize: chunkSize)
            // A store whose chunks are too small to cut by content eighths has one class.
            let eighths = Chunking.method(chunkSize: chunkSize / 8)
            if case .contentDefined = eighths { small = eighths } else { small = large }
            smallFileLimit = Int64(chunkSize)
        }

        func method(forSize size: Int64) -> Method { size <= smallFileLimit ? small : large }
    }

    /// The chunking for chunks of at most `chunkSize` bytes: content-defined with a normal size
    /// of half that and a minimum of an eighth (32, 128 and 256 KiB by default; 4, 16 and 32 KiB
    /// for small files), fixed-size below 128 bytes. Half, not a quarter: every chunk costs a row,
    /// an index entry and a part-filled page, and an edit still costs about one chunk.
    static func method(chunkSize: Int) -> Method {
        let maximum = min(chunkSize, ContentDefinedChunker.largestMaximumSize)
        var average = 1
        while average * 2 <= maximum / 2 { average *= 2 }
        if let chunker = try? ContentDefinedChunker(
            minimumSize: max(1, average / 4), averageSize: average, maximumSize: maximum)
        {
            return .contentDefined(chunker)
        }
        return .fixed(chunkSize)
    }

    /// The next chunk's bytes, reading through `read` (up to the count asked, at least one byte
    /// until the end, then empty).
    mutating func next(read: (Int) throws -> Data) throws -> Data? {
        switch method {
        case .contentDefined:
            guard var stream else { return nil }
            // Taken out while it runs: a second reference to its buffer would make every
            // append copy the whole buffer.
            self.stream = nil
            defer { self.stream = stream }
            let chunk = try stream.next(read: read)
            offset = Int64(stream.offset)
            return chunk
        case .fixed(let size):
            var data = try read(size)
            while !data.isEmpty && data.count < size {
                let more = try read(size - data.count)
                if more.isEmpty { break }
                data.append(more)
            }
            if data.isEmpty { return nil }
            offset += Int64(data.count)
            return data
        }
    }
}
