import DocumentEngine
import Foundation
import Synchronization

/// Writes one file's content update inside a save, or plans it before the save's transaction.
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

    /// Writes `update` in the save's write transaction: cuts, hashes and stores here. Saves
    /// take this path only when no plan made before the transaction applies
    /// (``VersionedStore/prepare(_:)``).
    func write(_ update: ContentUpdate) throws -> Outcome {
        var sink = StoringSink(store: store, tx: tx)
        return try finish(plan(update, into: &sink))
    }

    /// Cuts `update` into the windows of new chunks it makes, handing each chunk to `sink`,
    /// and reads the extents the new ones replace: everything a save needs but storing the
    /// chunks and writing the rows (``finish(_:)``). Reads through `tx`, which need not be the
    /// save's: at a saved version the extents never change.
    func plan<Sink: ChunkSink>(_ update: ContentUpdate, into sink: inout Sink) throws -> ContentPlan {
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
            return try plan(
                base: .own, size: size, changed: try pages(Array(given.keys), below: size), source: source,
                into: &sink)
        case .sparse(let size, let listed, let source):
            guard size >= 0 else { throw DocumentStoreError.invalidChange("negative size") }
            return try plan(
                base: .own, size: size, changed: try Self.held(pages(listed, below: size), source),
                edited: source.changedRanges, source: source, into: &sink)
        case .replace(let source):
            guard source.count >= 0 else { throw DocumentStoreError.invalidChange("negative size") }
            // This store's own bytes are shared, not read back inside its transaction.
            if let stored = source as? StoreContentsSource,
                (stored.store as? any VersionedDocumentStore)?.versionedStore === store
            {
                return try plan(.copy(of: NodeLookup(stored.node, at: stored.version)), into: &sink)
            }
            let size = source.count
            return try plan(
                base: .none, size: size, changed: size > 0 ? [0..<size] : [],
                source: ExactSource(source: source), into: &sink)
        case .copy(let lookup):
            let base = try resolve(lookup)
            return try plan(
                base: .other(lookup), size: base.size, changed: [], source: ExactSource(source: nil),
                into: &sink)
        case .derived(let lookup, let size, let listed, let source):
            guard size >= 0 else { throw DocumentStoreError.invalidChange("negative size") }
            return try plan(
                base: .other(lookup), size: size, changed: try Self.held(pages(listed, below: size), source),
                edited: source.changedRanges, source: source, into: &sink)
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

    /// The plan that makes the file `size` bytes long: `base` with the `changed` ranges
    /// (ascending, disjoint) read from `source`; bytes past the base's end that no range covers
    /// are zeros. `edited`, if given, are the ranges where the source's bytes may differ from the
    /// base's (``ContentsSource/changedRanges``): only around those are chunks cut again.
    private func plan<Sink: ChunkSink>(
        base baseKind: Base, size: Int64, changed: [Range<Int64>], edited: [Range<Int64>]? = nil,
        source: any ContentsSource, into sink: inout Sink
    ) throws -> ContentPlan {
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

        var plan = ContentPlan(node: node, size: size)
        // Where the windows of new chunks are.
        var windows: [Range<Int64>] = []
        var done: Int64 = 0
        var next = 0
        if let precut, precut.size == size, size > 0, Self.merged(changed) == [0..<size] {
            // Every byte is new: one window over the whole file, as the loop below would cut it
            // (from 0 to the end), with the cuts and hashes made before the transaction.
            plan.pieces = try storePrecut(precut, from: content, written: &plan.written)
            windows.append(0..<Int64.max)
            next = edits.count
        }
        while next < edits.count {
            let current = next
            let start = max(done, try base.boundary(before: edits[current].lowerBound))
            var stream = Chunking(store.chunking.method(forSize: size), startingAt: start)
            var cursor = start
            var end = Int64.max
            while let data = try stream.next(read: { count in
                let bytes = try content.bytes(at: cursor, upTo: Int(min(Int64(count), size - cursor)))
                cursor += Int64(bytes.count)
                return bytes
            }) {
                let cut = stream.offset
                let at = cut - Int64(data.count)
                if let chunk = try sink.take(data, at: at) {
                    plan.pieces.append(ContentPlan.Piece(start: at, length: Int64(data.count), chunk: chunk))
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
            windows.append(start..<end)
            done = end
        }

        // What the rows are worked out against: the file's extents inside the windows now, or,
        // when it starts from another base, all of its extents and the base's outside them.
        if own {
            for window in windows {
                plan.current.merge(try base.extents(startingIn: window)) { _, new in new }
            }
        } else {
            plan.current = try VersionedStore.extents(tx, node: node, lineage: view, starts: 0...Int64.max)
            for (start, extent) in try base.extents(startingIn: 0..<Int64.max)
            where !windows.contains(where: { $0.contains(start) }) && start < size {
                plan.kept[start] = extent
            }
        }
        plan.written.chunks += sink.written.chunks
        plan.written.bytes += sink.written.bytes
        sink.written = (0, 0)
        return plan
    }

    /// Stores the chunks of `plan` the store lacks (from the plan's bytes) and writes the rows
    /// where the file's extents change. Throws ``ContentPlan/Stale`` when a chunk the plan did
    /// not keep the bytes of is gone (collected since the plan was made).
    func finish(_ plan: ContentPlan) throws -> Outcome {
        var written = plan.written
        var target = plan.kept
        for piece in plan.pieces {
            let id: Int64
            switch piece.chunk {
            case .stored(let stored):
                id = stored
            case .hashed(let hash):
                id = try VersionedStore.storeChunk(tx, hash: hash, offset: piece.start, written: &written) {
                    guard let data = plan.bytes[hash] else { throw ContentPlan.Stale() }
                    return data
                }
            }
            target[piece.start] = Extent(chunk: id, length: piece.length)
        }
        var rows: [(start: Int64, extent: Extent?)] = []
        for (start, extent) in target.sorted(by: { $0.key < $1.key }) where plan.current[start] != extent {
            rows.append((start, extent))
        }
        for start in plan.current.keys.sorted() where target[start] == nil { rows.append((start, nil)) }
        if !rows.isEmpty { try tx.insertExtents(node, branch: branch, version: version, rows) }
        return Outcome(size: plan.size, chunks: written.chunks, bytes: written.bytes, rows: rows)
    }

    /// Stores the chunks of a precut file that the store lacks, from the precut's pending bytes
    /// or else read from `content` again; returns the extents of the whole file.
    private func storePrecut(
        _ precut: Precut, from content: NewContent, written: inout (chunks: Int, bytes: Int64)
    )
        throws -> [ContentPlan.Piece]
    {
        var pieces: [ContentPlan.Piece] = []
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
            pieces.append(ContentPlan.Piece(start: at, length: Int64(piece.length), chunk: .stored(id)))
        }
        return pieces
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

/// A source that must hold every byte asked for (a whole new file); none when there is nothing
/// to read.
struct ExactSource: ContentsSource {
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
struct GivenChunks: ContentsSource {
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
