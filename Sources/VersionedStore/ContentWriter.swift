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
