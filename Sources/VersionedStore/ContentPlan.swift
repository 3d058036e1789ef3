import DocumentEngine
import Foundation
import Synchronization

/// One file's content update worked out before it is written: the chunks of its windows, cut
/// and hashed, and the extents they replace (``ContentWriter/plan(_:into:)``). A save makes it
/// before its write transaction, so that the transaction, which every other save waits for,
/// only looks chunks up, stores the new ones and writes rows (``ContentWriter/finish(_:)``).
struct ContentPlan: Sendable {
    /// Thrown by ``ContentWriter/finish(_:)`` when a chunk the plan counted on is gone (garbage
    /// collection took it between the plan and the transaction): the save writes the update
    /// itself instead.
    struct Stale: Error {}

    enum Chunk: Sendable {
        /// A chunk the store holds, by id.
        case stored(Int64)
        /// A chunk by its hash: the store may hold it, or it is new and ``bytes`` has it.
        case hashed(Data)
    }

    /// A new extent: a chunk at a byte offset. Holes have none.
    struct Piece: Sendable {
        var start: Int64
        var length: Int64
        var chunk: Chunk
    }

    /// The node the plan is for, and the version it was worked out against (nil: in the save's
    /// own transaction), where the file was `previousSize` bytes long (nil: no regular file).
    var node: StoreNodeID
    var basedOn: VersionID?
    var previousSize: Int64?
    /// The file's size after the update.
    var size: Int64
    /// The new extents of every window.
    var pieces: [Piece] = []
    /// What the rows are worked out against: the file's extents inside the windows now, or, for a
    /// file that starts from another's bytes (or from nothing), all of its extents.
    var current: [Int64: Extent] = [:]
    /// The extents of the file it starts from outside the windows, when that is another file.
    var kept: [Int64: Extent] = [:]
    /// Chunks and bytes stored already (ahead of the transaction, or by it).
    var written = (chunks: 0, bytes: Int64(0))
    /// The bytes of new chunks the store lacked when the plan was made, by hash.
    var bytes: [Data: Data] = [:]

    init(node: StoreNodeID, size: Int64) {
        self.node = node
        self.size = size
    }

    /// Whether the plan applies in `tx`, where the file's record before the save is `previous`:
    /// a file that did not exist then still does not, and one that did has not changed since
    /// the plan's base (every change of a file's bytes writes its record again).
    func applies(previous: NodeRecord?, _ tx: any StoreTransaction) throws -> Bool {
        guard let basedOn, previousSize == (previous?.kind == .regularFile ? previous?.size : nil) else {
            return false
        }
        guard previous != nil else { return true }
        return try !tx.nodeChanged(node, after: basedOn)
    }
}

/// What ``VersionedStore/prepare(_:)`` did for one save: whole new files precut, other updates
/// planned.
struct PreparedWork: Sendable {
    /// The store that made it: another's transaction must not use it.
    let store: ObjectIdentifier
    var precut: [StoreNodeID: Precut]
    var plans: [StoreNodeID: ContentPlan]
}

/// Where a plan's new chunks go as they are cut.
protocol ChunkSink {
    /// Chunks and bytes this sink stored.
    var written: (chunks: Int, bytes: Int64) { get set }
    /// Takes the chunk `data` that starts at `offset` of the file: nil for a hole (all zeros).
    mutating func take(_ data: Data, at offset: Int64) throws -> ContentPlan.Chunk?
}

/// Hashes and stores each chunk at once, in the save's write transaction: the path a save takes
/// when no plan made before it applies. Counts what it hashes there
/// (``StoreStatistics/bytesHashedInWriteTransactions``).
struct StoringSink: ChunkSink {
    let store: VersionedStore
    let tx: any StoreTransaction
    var written = (chunks: 0, bytes: Int64(0))

    mutating func take(_ data: Data, at offset: Int64) throws -> ContentPlan.Chunk? {
        if VersionedStore.isZero(data) { return nil }
        let hash = VersionedStore.hash(data)
        store.count { $0.bytesHashedInWriteTransactions += Int64(data.count) }
        return .stored(
            try VersionedStore.storeChunk(tx, hash: hash, offset: offset, written: &written) { data })
    }
}

/// Hashes each chunk and keeps its bytes, before the save's write transaction. Once the bytes
/// kept pass ``Precut/batchBytes``, those of chunks the store lacks are stored ahead, in write
/// transactions of their own on another thread (as a precut's are), and the rest let go: a save
/// of a file changed all over holds a few batches, not the file.
final class HashingSink: ChunkSink {
    let store: VersionedStore
    /// The read transaction the plan is made in, to look chunks up.
    let tx: any StoreTransaction
    var written = (chunks: 0, bytes: Int64(0))
    private(set) var bytes: [Data: Data] = [:]
    private var held = 0
    private var storer: BatchStorer?

    init(store: VersionedStore, tx: any StoreTransaction) {
        self.store = store
        self.tx = tx
    }

    func take(_ data: Data, at offset: Int64) throws -> ContentPlan.Chunk? {
        if VersionedStore.isZero(data) { return nil }
        let hash = VersionedStore.hash(data)
        if bytes[hash] == nil {
            bytes[hash] = data
            held += data.count
            if held >= Precut.batchBytes { try storeAhead() }
        }
        return .hashed(hash)
    }

    /// Lets go of the bytes of chunks the store has, and stores the others ahead.
    private func storeAhead() throws {
        let found = try tx.chunkIDs(hashes: Array(bytes.keys))
        let lacking = bytes.filter { found[$0.key] == nil }.map {
            BatchStorer.Chunk(hash: $0.key, offset: 0, length: $0.value.count, data: $0.value)
        }
        if !lacking.isEmpty {
            if storer == nil { storer = BatchStorer(store: store) }
            storer?.store(lacking)
        }
        bytes = [:]
        held = 0
    }

    /// The bytes of the chunks the store lacks that were not stored ahead, once every batch
    /// stored ahead is in the store; what those stored is added to ``written``.
    func finish() throws -> [Data: Data] {
        if let storer {
            let stored = try storer.finish()
            written.chunks += stored.chunks
            written.bytes += stored.bytes
        }
        guard !bytes.isEmpty else { return [:] }
        let found = try tx.chunkIDs(hashes: Array(bytes.keys))
        return bytes.filter { found[$0.key] == nil }
    }
}
