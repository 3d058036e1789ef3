import DocumentEngine
import Foundation
import Synchronization
import Threading

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
final class BatchStorer: Sendable {
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
    private let inFlight = Monitor(false)
    private let outcome = Mutex<(stored: (chunks: Int, bytes: Int64), error: (any Error)?)>(
        ((0, 0), nil))

    init(store: VersionedStore) { self.store = store }

    /// Hands `chunks`, each with its bytes, over to be stored, once the batch before is.
    func store(_ chunks: [Chunk]) {
        inFlight.wait(until: { !$0 }, then: { $0 = true })
        queue.async { [self] in
            defer { inFlight.withLock { $0 = false } }
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
            // Chunks nothing references yet: no reader sees them, so the write is not counted.
            let added = try store.write(durable: false, counted: false) { tx -> (chunks: Int, bytes: Int64) in
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
    private let pending = WorkCount()
    private let results = Mutex<[Hashed]>([])
    /// Hashers of this process at work: each keeps two cores busy while it hands chunks over.
    private static let running = Atomic(0)
    private static let cores = max(1, ProcessInfo.processInfo.activeProcessorCount)

    init() { Self.running.add(1, ordering: .relaxed) }

    deinit { Self.running.subtract(1, ordering: .relaxed) }

    func add(_ data: Data) {
        guard Self.running.load(ordering: .relaxed) * 2 <= Self.cores else {
            // After the chunks handed over, so that the results stay in order.
            pending.wait()
            let hashed = Self.hashed(data)
            results.withLock { $0.append(hashed) }
            return
        }
        pending.enter()
        queue.async { [self] in
            let hashed = Self.hashed(data)
            results.withLock { $0.append(hashed) }
            pending.leave()
        }
    }

    private static func hashed(_ data: Data) -> Hashed {
        Hashed(data: data, hash: VersionedStore.isZero(data) ? nil : VersionedStore.hash(data))
    }

    /// Every chunk added so far, hashed, once they all are.
    func take() -> [Hashed] {
        pending.wait()
        return results.withLock { results in
            defer { results = [] }
            return results
        }
    }
}
