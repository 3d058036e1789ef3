import DocumentEngine
import Foundation

/// Writes one file's content update inside a save: only chunks whose bytes differ get a new
/// chunk-map row, and only bytes the store does not hold yet become new chunks. Chunks are read
/// and written one at a time, so an update of any size holds about one chunk in memory.
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

    var chunkSize: Int64 { Int64(store.chunkSize) }

    /// What a read sees so far, including this save's own rows (a conflict's are in its branch).
    var view: Lineage { branch == 0 ? lineage : Lineage(limit: lineage.limit, branch: branch) }

    /// Where a chunk's new contents come from.
    private enum ChunkSource {
        /// These bytes (at most one chunk, none past the end).
        case bytes(Data)
        /// A chunk the store holds already, or a hole (nil).
        case stored(Int64?)
    }

    /// Rounds up without computing `bytes + size - 1`, which overflows near Int64.max.
    private func chunkCount(_ bytes: Int64) -> Int64 { bytes / chunkSize + (bytes % chunkSize == 0 ? 0 : 1) }

    func write(_ update: ContentUpdate) throws -> (size: Int64, chunks: Int, bytes: Int64) {
        let size = chunkSize
        let newSize: Int64
        let indices: [Int64]?  // ascending and below the new end; nil for every chunk below it
        let sourceOf: (Int64) throws -> ChunkSource  // the new contents of chunk `index`
        switch update {
        case .chunks(let s, let given):
            guard s >= 0 else { throw DocumentStoreError.invalidChange("negative size") }
            for (index, data) in given {
                guard index >= 0 else {
                    throw DocumentStoreError.invalidChange("negative chunk index \(index)")
                }
                guard data.count <= store.chunkSize else {
                    throw DocumentStoreError.invalidChange("chunk \(index) is larger than the chunk size")
                }
            }
            newSize = s
            let count = chunkCount(s)
            indices = given.keys.map(Int64.init).filter { $0 < count }.sorted()
            sourceOf = { index in
                let data = given[Int(index)] ?? Data()
                // Bytes past the end of the file are not kept, so growing it later reads zeros.
                let keep = Int(min(Int64(data.count), s - index * size))
                return .bytes(keep < data.count ? data.prefix(keep) : data)
            }
        case .sparse(let s, let listed, let source):
            guard s >= 0 else { throw DocumentStoreError.invalidChange("negative size") }
            try Self.checkIndices(listed)
            newSize = s
            let count = chunkCount(s)
            indices = Set(listed.lazy.map(Int64.init).filter { $0 < count }).sorted()
            sourceOf = { index in
                .bytes(try Self.read(source, chunk: index, of: s, chunkSize: size, exact: false))
            }
        case .replace(let source):
            guard source.count >= 0 else { throw DocumentStoreError.invalidChange("negative size") }
            newSize = source.count
            indices = nil
            sourceOf = { index in
                .bytes(try Self.read(source, chunk: index, of: newSize, chunkSize: size, exact: true))
            }
        case .copy(let lookup):
            let base = try resolve(lookup)
            return try write(.derived(from: lookup, size: base.size, chunks: [], source: EmptySource()))
        case .derived(let lookup, let s, let listed, let source):
            guard s >= 0 else { throw DocumentStoreError.invalidChange("negative size") }
            try Self.checkIndices(listed)
            let base = try resolve(lookup)
            newSize = s
            indices = nil
            let dirty = Set(listed.lazy.map(Int64.init))
            let baseCount = chunkCount(base.size)
            let baseMap = try VersionedStore.chunkMap(
                tx, node: lookup.node, lineage: base.lineage, from: 0,
                through: min(baseCount, chunkCount(s)) - 1)
            sourceOf = { index in
                if dirty.contains(index) {
                    return .bytes(try Self.read(source, chunk: index, of: s, chunkSize: size, exact: false))
                }
                guard index < baseCount, let chunk = baseMap[index] ?? nil else { return .stored(nil) }
                // The base's last chunk may reach past the new end: cut it there.
                let end = min(s, base.size) - index * size
                if let length = try tx.chunkLength(chunk), length > end {
                    return .bytes(try store.chunk(tx, chunk).prefix(Int(max(0, end))))
                }
                return .stored(chunk)
            }
        }
        return try apply(newSize: newSize, indices: indices, sourceOf: sourceOf)
    }

    private func apply(newSize: Int64, indices: [Int64]?, sourceOf: (Int64) throws -> ChunkSource) throws
        -> (size: Int64, chunks: Int, bytes: Int64)
    {
        let size = chunkSize
        let newCount = chunkCount(newSize)
        var chunks = 0
        var bytes: Int64 = 0

        /// Makes chunk `index` hold `source`; an all-zero chunk is a hole. Bytes equal to what is
        /// there already (same hash, so the same chunk) write nothing.
        func put(_ index: Int64, _ source: ChunkSource) throws {
            let chunkID: Int64?
            switch source {
            case .stored(let id): chunkID = id
            case .bytes(let data):
                if VersionedStore.isZero(data) {
                    chunkID = nil
                } else {
                    let hash = VersionedStore.hash(data)
                    if let id = try tx.chunkID(hash: hash) {
                        chunkID = id
                    } else {
                        chunkID = try tx.insertChunk(hash: hash, data: data)
                        chunks += 1
                        bytes += Int64(data.count)
                    }
                }
            }
            if try VersionedStore.chunkAt(tx, node: node, lineage: view, index: index) == chunkID { return }
            try tx.insertChunkEntry(node, branch: branch, index: index, version: version, chunk: chunkID)
        }

        // Chunks past the new end become holes, so that growing the file later reads zeros. A node
        // that was no file before (a removed file restored) may still have rows from its old life:
        // they all go, so that unlisted chunks read as zeros rather than as bytes from back then.
        let keptBelow = previousSize == nil ? 0 : newCount
        let stale = try VersionedStore.chunkMap(tx, node: node, lineage: view, from: keptBelow, through: .max)
        for (index, chunk) in stale.sorted(by: { $0.key < $1.key }) where chunk != nil {
            try tx.insertChunkEntry(node, branch: branch, index: index, version: version, chunk: nil)
        }
        if let indices {
            for index in indices { try put(index, sourceOf(index)) }
        } else {
            var index: Int64 = 0
            while index < newCount {
                try put(index, sourceOf(index))
                index += 1
            }
        }
        // A shrink that ends inside an unlisted chunk cuts that chunk at the new end.
        let last = newCount - 1
        if newSize < previousSize ?? 0, newSize % size != 0, let indices, indices.last != last,
            let old = try VersionedStore.chunkAt(tx, node: node, lineage: view, index: last),
            let stored = try tx.chunkLength(old), stored > newSize - last * size
        {
            try put(last, .bytes(try store.chunk(tx, old).prefix(Int(newSize - last * size))))
        }
        return (newSize, chunks, bytes)
    }

    /// The file a copy or derived update starts from, as of this save's state when its version is
    /// nil.
    private func resolve(_ lookup: NodeLookup) throws -> (size: Int64, lineage: Lineage) {
        let baseLineage = lookup.version == nil ? view : try Lineage.of(tx, lookup.version)
        guard let record = try VersionedStore.node(tx, lookup.node, lineage: baseLineage) else {
            throw DocumentStoreError.noSuchNode(lookup.node)
        }
        guard record.kind == .regularFile else { throw DocumentStoreError.notARegularFile(lookup.node) }
        return (record.size, baseLineage)
    }

    private static func checkIndices(_ listed: [Int]) throws {
        if let index = listed.first(where: { $0 < 0 }) {
            throw DocumentStoreError.invalidChange("negative chunk index \(index)")
        }
    }

    /// Chunk `index` of a file of `fileSize` bytes from `source`; `exact` when the source must
    /// hold every byte (a shorter read leaves zeros otherwise).
    private static func read(
        _ source: any ContentsSource, chunk index: Int64, of fileSize: Int64, chunkSize: Int64, exact: Bool
    ) throws -> Data {
        let wanted = Int(min(chunkSize, fileSize - index * chunkSize))
        let data = try source.read(offset: index * chunkSize, count: wanted)
        if exact, data.count != wanted {
            throw DocumentStoreError.invalidChange("the contents source ended early")
        }
        guard data.count <= wanted else {
            throw DocumentStoreError.invalidChange(
                "the contents source gave \(data.count) bytes for chunk \(index), more than \(wanted)")
        }
        return data
    }
}

/// A source with no bytes, for updates that list no chunks.
private struct EmptySource: ContentsSource {
    var count: Int64 { 0 }
    func read(offset: Int64, count: Int) throws -> Data { Data() }
}
