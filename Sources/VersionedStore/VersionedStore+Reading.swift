import DocumentEngine
import Foundation
import Synchronization

extension VersionedStore {
    // MARK: Reading contents

    public func readContents(of node: StoreNodeID, at version: VersionID?, offset: Int64, count: Int) throws
        -> Data
    {
        guard offset >= 0, count >= 0 else {
            throw DocumentStoreError.invalidChange("negative offset or count")
        }
        // A saved version never changes: what a read at one learned serves the next without the
        // database (and a mount keeps reading what it read while a server is away).
        if let entry = pinnedEntry(node, version, until: Self.end(offset, count)),
            let data = try pinnedRead(entry, offset: offset, count: count)
        {
            return data
        }
        return try unpinnedRead(of: node, at: version, offset: offset, count: count)
    }

    /// Reads `node`'s bytes from `offset` into `buffer`: the count read, fewer than the buffer
    /// holds only at the end of the file.
    ///
    /// A random read of a part of a chunk at a saved version goes from the backend straight
    /// into `buffer`, without the copies, sets and maps of ``readContents(of:at:offset:count:)``.
    public func readContents(
        of node: StoreNodeID, at version: VersionID?, offset: Int64,
        into buffer: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        guard offset >= 0 else { throw DocumentStoreError.invalidChange("negative offset") }
        let data: Data
        if let entry = pinnedEntry(node, version, until: Self.end(offset, buffer.count)) {
            if let count = try directRead(entry, offset: offset, into: buffer) { return count }
            data =
                try pinnedRead(entry, offset: offset, count: buffer.count)
                ?? unpinnedRead(of: node, at: version, offset: offset, count: buffer.count)
        } else {
            data = try unpinnedRead(of: node, at: version, offset: offset, count: buffer.count)
        }
        return data.copyPrefix(into: buffer)
    }

    /// What earlier reads at saved version `version` learned of `node`, as it was before this
    /// read, which ends at `end`; nil when they learned nothing (or `version` is nil).
    private func pinnedEntry(_ node: StoreNodeID, _ version: VersionID?, until end: Int64) -> PinnedFile? {
        guard let version else { return nil }
        return pinned.withLock { $0.reading(PinnedKey(node: node, version: version), until: end) }
    }

    /// Where a read of `count` bytes from `offset` ends, at most `Int64.max` (a caller may ask for
    /// all there is with `Int.max`).
    private static func end(_ offset: Int64, _ count: Int) -> Int64 {
        let (sum, overflow) = offset.addingReportingOverflow(Int64(count))
        return overflow ? .max : sum
    }

    /// A read the pinned extents cannot answer: through a transaction.
    private func unpinnedRead(of node: StoreNodeID, at version: VersionID?, offset: Int64, count: Int) throws
        -> Data
    {
        let mainLine = try version.flatMap { version in
            try backend.mainLineLookups([NodeLookup(node, at: version)])?.first.map { try $0.get() }
        }
        var linked: StoreNodeID?
        let data = try backend.read { tx -> Data in
            let lineage: Lineage
            let found: NodeRecord?
            if let version, case .record(let record) = mainLine {
                (lineage, found) = (Lineage(limit: version.rawValue, branch: 0), record)
            } else {
                lineage = try Lineage.of(tx, version, reading: node)
                found = try Self.node(tx, node, lineage: lineage)
            }
            guard let record = found else { throw DocumentStoreError.noSuchNode(node) }
            guard record.kind == .regularFile else { throw DocumentStoreError.notARegularFile(node) }
            if let target = record.linkOf {
                // A hard link's bytes are the file's it names.
                linked = target
                return Data()
            }
            let end = min(record.size, offset + Int64(count))
            guard offset < end else { return Data() }
            // An extent that covers `offset` begins at most one extent length before it. At a
            // saved version the extents are learned a window at a time, so that the next reads
            // nearby (random ones too) need only their chunks.
            let first = max(0, offset - longestExtent + 1)
            let through = version == nil ? end : min(record.size, max(end, offset + Self.learnedWindow))
            let all = try Self.extents(tx, node: node, lineage: lineage, starts: first...(through - 1))
            let sorted = all.sorted { $0.key < $1.key }.map { (start: $0.key, extent: $0.value) }
            let learned = PinnedFile(size: record.size, covered: first..<through, extents: sorted)
            guard let overlapping = learned.extents(overlapping: offset, end, longest: longestExtent) else {
                throw DocumentStoreError.corrupt(
                    path: location, reason: "the extents of \(node) cannot be read")
            }
            let chunks = try self.chunks(tx, Set(overlapping.map(\.extent.chunk)))
            if let version { pinned.withLock { $0.learn(PinnedKey(node: node, version: version), learned) } }
            return try assemble(offset: offset, end: end, extents: overlapping, chunks: chunks)
        }
        if let linked {
            guard linked != node else {
                throw DocumentStoreError.corrupt(path: location, reason: "hard link \(node) names itself")
            }
            return try readContents(of: linked, at: version, offset: offset, count: count)
        }
        return data
    }

    /// Bytes of extent starts a first read at a saved version learns (256 MiB).
    static let learnedWindow: Int64 = 256 << 20

    /// No extent is longer than the store's chunk size: fixed chunks were that long, and
    /// content-defined ones are at most that long.
    var longestExtent: Int64 { Int64(chunkSize) }

    /// A read from what earlier reads at a saved version learned (`entry`, as it was before this
    /// read): from the chunk cache (without the database), else with one read of the missing
    /// chunks; nil if the extents are not known.
    private func pinnedRead(_ entry: PinnedFile, offset: Int64, count: Int) throws -> Data? {
        let end = min(entry.size, Self.end(offset, count))
        guard offset < end else { return Data() }
        guard let overlapping = entry.extents(overlapping: offset, end, longest: longestExtent) else {
            return nil
        }
        var chunks: [Int64: Data] = [:]
        var missing: Set<Int64> = []
        cache.withLock { cache in
            for item in overlapping {
                if let data = cache.get(item.extent.chunk) {
                    chunks[item.extent.chunk] = data
                } else {
                    missing.insert(item.extent.chunk)
                }
            }
        }
        if !missing.isEmpty, end - offset <= Int64(chunkSize) / 8, offset != entry.lastEnd {
            var sliced = Data(count: Int(end - offset))
            if try sliced.withUnsafeMutableBytes({ try directRead(entry, offset: offset, into: $0) }) != nil {
                return sliced
            }
        }
        if !missing.isEmpty {
            // Chunks never change, so they need no snapshot; one the retention policy collected
            // since is missing, and the full read says what became of the version.
            let fetched = try directChunks(missing) ?? backend.access { tx in try self.chunks(tx, missing) }
            guard missing.allSatisfy({ fetched[$0] != nil }) else { return nil }
            chunks.merge(fetched) { old, _ in old }
        }
        return try? assemble(offset: offset, end: end, extents: overlapping, chunks: chunks)
    }

    /// ``pinnedRead(_:offset:count:)`` into `buffer` where every chunk the read needs is cached,
    /// or it is a small read away from the last one (a random read) and the backend reads the
    /// slices of the chunks it lacks, not whole (sequential readers read and cache whole
    /// chunks); nil otherwise (`buffer` may then hold some of the bytes).
    private func directRead(_ entry: PinnedFile, offset: Int64, into buffer: UnsafeMutableRawBufferPointer)
        throws
        -> Int?
    {
        let end = min(entry.size, Self.end(offset, buffer.count))
        guard offset < end else { return 0 }
        guard let base = buffer.baseAddress,
            let overlapping = entry.indices(overlapping: offset, end, longest: longestExtent)
        else { return nil }
        let random = end - offset <= Int64(chunkSize) / 8 && offset != entry.lastEnd
        var cursor = offset
        for index in overlapping {
            let (start, extent) = entry.extents[index]
            let from = max(cursor, start)
            let to = min(end, start + extent.length)
            guard from < to else { continue }
            if from > cursor { memset(base + Int(cursor - offset), 0, Int(from - cursor)) }
            let target = UnsafeMutableRawBufferPointer(
                rebasing: buffer[Int(from - offset)..<Int(to - offset)])
            let within = Int(from - start)..<Int(to - start)
            if let chunk = cache.withLock({ $0.get(extent.chunk) }) {
                guard within.upperBound <= chunk.count else { return nil }
                chunk.withUnsafeBytes { bytes in
                    target.copyMemory(from: UnsafeRawBufferPointer(rebasing: bytes[within]))
                }
            } else {
                guard random, try backend.chunkSlice(extent.chunk, within, into: target) else { return nil }
                counters.withLock {
                    $0.chunksRead += 1
                    $0.bytesRead += Int64(within.count)
                }
            }
            cursor = to
        }
        if cursor < end { memset(base + Int(cursor - offset), 0, Int(end - cursor)) }
        return Int(end - offset)
    }

    /// The bytes `offset..<end` of a file from the extents that overlap them; zeros elsewhere.
    private func assemble(
        offset: Int64, end: Int64, extents: [(start: Int64, extent: Extent)], chunks: [Int64: Data]
    ) throws -> Data {
        // Appended in order, with zeros only for holes: a buffer zeroed first and then
        // overwritten cost a twelfth of a random write's CPU (each takes its page in).
        var result = Data(capacity: Int(end - offset))
        var cursor = offset
        for (start, extent) in extents.sorted(by: { $0.start < $1.start }) {
            guard let chunk = chunks[extent.chunk] else {
                throw DocumentStoreError.corrupt(path: location, reason: "chunk \(extent.chunk) is missing")
            }
            let from = max(cursor, start)
            let to = min(end, start + min(extent.length, Int64(chunk.count)))
            guard from < to else { continue }
            if from > cursor { result.append(Data(count: Int(from - cursor))) }
            result.append(chunk[chunk.startIndex + Int(from - start)..<chunk.startIndex + Int(to - start)])
            cursor = to
        }
        if cursor < end { result.append(Data(count: Int(end - cursor))) }
        return result
    }

    /// The extents of `node` as of `lineage` that begin in `starts`; removals are left out.
    static func extents(
        _ tx: any StoreTransaction, node: StoreNodeID, lineage: Lineage, starts: ClosedRange<Int64>
    )
        throws -> [Int64: Extent]
    {
        var map = try tx.extents(node, branch: 0, upTo: lineage.limit, starts: starts)
        if lineage.branch != 0 {
            map.merge(try tx.extents(node, branch: lineage.branch, upTo: .max, starts: starts)) { _, new in
                new
            }
        }
        return map.compactMapValues { $0 }
    }

    /// Chunks' bytes by id read by the backend outside any transaction (counted and cached as
    /// ``chunks(_:_:)`` does); nil where it cannot.
    private func directChunks(_ ids: Set<Int64>) throws -> [Int64: Data]? {
        guard let fetched = try backend.wholeChunks(ids.sorted()) else { return nil }
        cache.withLock { cache in for (id, data) in fetched { cache.put(id, data) } }
        counters.withLock {
            $0.chunksRead += fetched.count
            $0.bytesRead += fetched.values.reduce(0) { $0 + Int64($1.count) }
        }
        return fetched
    }

    /// Chunks' bytes by id, from the cache or the database (counted).
    func chunks(_ tx: any StoreTransaction, _ ids: Set<Int64>) throws -> [Int64: Data] {
        var result: [Int64: Data] = [:]
        var missing: [Int64] = []
        cache.withLock { cache in
            for id in ids {
                if let data = cache.get(id) { result[id] = data } else { missing.append(id) }
            }
        }
        guard !missing.isEmpty else { return result }
        let fetched = try tx.chunks(missing.sorted())
        var read = (chunks: 0, bytes: Int64(0))
        for (id, data) in fetched {
            result[id] = data
            read.chunks += 1
            read.bytes += Int64(data.count)
        }
        cache.withLock { cache in for (id, data) in fetched { cache.put(id, data) } }
        counters.withLock {
            $0.chunksRead += read.chunks
            $0.bytesRead += read.bytes
        }
        return result
    }

    func chunk(_ tx: any StoreTransaction, _ id: Int64) throws -> Data {
        guard let data = try chunks(tx, [id])[id] else {
            throw DocumentStoreError.corrupt(path: location, reason: "chunk \(id) is missing")
        }
        return data
    }

    /// Makes every save this store committed before the call durable. A durable commit covers
    /// the deferred ones before it (the log is flushed up to it), so only deferred commits since
    /// the last durable one or sync cost a sync.
    public func synchronize() throws {
        let target = durability.withLock { $0.deferred }
        guard durability.withLock({ $0.covered < target }) else { return }
        try backend.synchronize()
        durability.withLock { $0.covered = max($0.covered, target) }
    }

    /// A write transaction through the backend, counted for ``synchronize()``.
    func write<T>(durable: Bool, counted: Bool = true, _ body: (any StoreTransaction) throws -> T) throws -> T
    {
        // Deferred commits finished before this one starts are in the log ahead of it.
        let before = durability.withLock { $0.deferred }
        let result = try backend.write(durable: durable, body)
        durability.withLock { ledger in
            if durable { ledger.covered = max(ledger.covered, before) } else { ledger.deferred += 1 }
        }
        if counted { counters.withLock { $0.transactionsCommitted += 1 } }
        return result
    }

    /// Drops cached chunks and learned chunk maps (for tests and benchmarks of cold reads).
    public func purgeCache() {
        cache.withLock { $0.removeAll() }
        pinned.withLock { $0.removeAll() }
    }
}
