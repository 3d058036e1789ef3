import DocumentEngine
import Foundation

/// Where a ``VersionedStore`` keeps its rows: a database and its dialect.
///
/// The versioned-store algorithm (conflicts, rebase, sparse updates, restore, retention, the
/// integrity walk) lives once, in ``VersionedStore``; a backend only runs transactions of
/// row-level reads and writes (``StoreTransaction``) and may offer shortcuts that save round
/// trips. A backend never calls back into the store.
package protocol StoreBackend: Sendable {
    /// Where the rows are (a path or URL without password), for messages.
    var location: String { get }
    /// Bytes per content chunk, fixed when the store was created.
    var chunkSize: Int { get }

    /// Runs `body` in one read-only snapshot.
    func read<T>(_ body: (any StoreTransaction) throws -> T) throws -> T
    /// Runs `body` without a shared snapshot, each statement on its own: for answers that one
    /// statement gives, where a transaction would only add round trips.
    func access<T>(_ body: (any StoreTransaction) throws -> T) throws -> T
    /// Runs `body` in one write transaction, holding the store's write lock so that writers take
    /// turns (event sequence numbers then commit in order). A durable one returns once the commit
    /// is on disk; otherwise it is atomic and seen by everyone, but reaches the disk later.
    func write<T>(durable: Bool, _ body: (any StoreTransaction) throws -> T) throws -> T
    /// Makes every write committed before the call durable, deferred ones included.
    func synchronize() throws

    /// Runs `body` as one short transaction over the lock tables (``LockTransaction``), which
    /// does not wait for the store's write lock where the database lets it. With `timeout`, a
    /// store that does not answer within it fails the transaction (a server across a network);
    /// a local file ignores it.
    func lockTransaction<T>(timeout: Duration?, _ body: (any LockTransaction) throws -> T) throws -> T
    /// Grows whenever any process may have released a lock (``LockTransaction/notifyLockRelease()``),
    /// and whenever such news may have been missed.
    var lockGeneration: UInt64 { get }
    /// Blocks until ``lockGeneration`` exceeds `generation` or `timeout` passes; returns it then.
    func waitForLockRelease(after generation: UInt64, timeout: Duration) -> UInt64

    /// Problems the database itself finds in its files (SQLite's `integrity_check`); empty when
    /// it has no such check. Run before the store's own walk, which reads the rows.
    func storageProblems() throws -> [String]
    /// Gives the space of deleted rows back after garbage collection (to the file system, or to
    /// the database's free space for reuse).
    func reclaimSpace() throws

    /// Answers `lookups` in one round trip where the backend can; nil when it has no such
    /// shortcut (then each lookup is one read).
    func mainLineLookups(_ lookups: [NodeLookup]) throws -> [Result<MainLineAnswer, any Error>]?
    /// Bytes `range` of chunk `id` without reading the whole chunk, where the backend can read a
    /// part of a stored value; nil otherwise.
    func chunkSlice(_ id: Int64, _ range: Range<Int>) throws -> Data?
    /// Bytes `range` of chunk `id` read into `buffer` (as long as the range); false where
    /// ``chunkSlice(_:_:)`` would give nil.
    func chunkSlice(_ id: Int64, _ range: Range<Int>, into buffer: UnsafeMutableRawBufferPointer) throws
        -> Bool
    /// Whole chunks by id, read outside any transaction where the backend has a cheaper way
    /// than a query (chunks never change); nil otherwise, or when one of them is gone (a query
    /// then tells what became of it).
    func wholeChunks(_ ids: [Int64]) throws -> [Int64: Data]?
    /// The document's current version, read outside any transaction where the backend has a
    /// cheaper way than a query; nil otherwise, or when there is no such document (a query then
    /// says so).
    func currentVersion(of document: DocumentID) throws -> VersionID?
}

extension StoreBackend {
    package func mainLineLookups(_ lookups: [NodeLookup]) throws -> [Result<MainLineAnswer, any Error>]? {
        nil
    }
    package func chunkSlice(_ id: Int64, _ range: Range<Int>) throws -> Data? { nil }
    package func chunkSlice(_ id: Int64, _ range: Range<Int>, into buffer: UnsafeMutableRawBufferPointer)
        throws
        -> Bool
    {
        guard buffer.count == range.count, let data = try chunkSlice(id, range), data.count == range.count
        else {
            return false
        }
        _ = data.copyPrefix(into: buffer)
        return true
    }
    package func wholeChunks(_ ids: [Int64]) throws -> [Int64: Data]? { nil }
    package func currentVersion(of document: DocumentID) throws -> VersionID? { nil }
    package func storageProblems() throws -> [String] { [] }
    package func reclaimSpace() throws {}
}

/// What one round trip learned of a lookup: its record on the main line (nil if it does not
/// exist at that version), that its version is on a conflict branch, or that the store has no
/// such version (retention may have dropped it while the wrapper stayed as it was). For the
/// last two a transaction's read answers.
package enum MainLineAnswer: Sendable {
    case record(NodeRecord?)
    case onConflictBranch
    case noSuchVersion
}

/// A wrapper row: a record as one version (or conflict branch) left it, or its removal.
package struct StoredNode: Sendable, Equatable {
    /// The record; for a removal only its id, document, parent, name and version count.
    package var record: NodeRecord
    /// 0 for the main line, else the conflict version whose branch it is on.
    package var branch: Int64
    /// A removal (tombstone): the wrapper does not exist from this version on.
    package var removed: Bool

    public init(record: NodeRecord, branch: Int64, removed: Bool) {
        self.record = record
        self.branch = branch
        self.removed = removed
    }
}

/// A change to a document's row.
package enum DocumentUpdate: Sendable {
    case rename(String, modified: Timestamp)
    case currentVersion(VersionID, modified: Timestamp)
    case deleted(Timestamp)
    /// Live again, under `name`.
    case undeleted(name: String)
}

/// A change to a version's row.
package enum VersionUpdate: Sendable {
    /// The version lost a conflict: its rows are a branch of its own.
    case conflict
    case resolved
    case bytesWritten(Int64)
}

/// The key of a wrapper row, for retention.
package struct NodeRowKey: Hashable, Sendable {
    package var node: StoreNodeID
    package var branch: Int64
    package var version: VersionID
    public init(node: StoreNodeID, branch: Int64, version: VersionID) {
        self.node = node
        self.branch = branch
        self.version = version
    }
}

/// The key of an extent row, for retention.
package struct ExtentRowKey: Hashable, Sendable {
    package var node: StoreNodeID
    package var branch: Int64
    package var start: Int64
    package var version: VersionID
    public init(node: StoreNodeID, branch: Int64, start: Int64, version: VersionID) {
        self.node = node
        self.branch = branch
        self.start = start
        self.version = version
    }
}

/// A run of a file's bytes that one chunk holds: `length` bytes from the extent's start.
package struct Extent: Hashable, Sendable {
    package var chunk: Int64
    package var length: Int64
    public init(chunk: Int64, length: Int64) {
        self.chunk = chunk
        self.length = length
    }
}

/// A stored chunk, for the integrity walk.
package struct ChunkRow: Sendable {
    package var id: Int64
    package var hash: Data
    package var size: Int64
    package var data: Data
    public init(id: Int64, hash: Data, size: Int64, data: Data) {
        self.id = id
        self.hash = hash
        self.size = size
        self.data = data
    }
}

/// Rows that refer to something missing, by kind, for the integrity walk.
package enum DanglingReference: Sendable, Hashable, CaseIterable {
    /// An extent row names a chunk that does not exist (the id is the chunk's).
    case missingChunk
    /// Wrapper rows name a document that does not exist (the id is the document's).
    case nodeWithoutDocument
    /// Versions name a document that does not exist.
    case versionWithoutDocument
    /// A document's current version does not exist (the id is the document's).
    case missingCurrentVersion
    /// Extent rows belong to a wrapper that has no rows (the id is the wrapper's).
    case contentsWithoutNode
    /// A backend's copy of a file's current extents disagrees with its history (the id is the
    /// wrapper's). Backends without such a copy have none.
    case staleCurrentExtents

    var message: String {
        switch self {
        case .missingChunk: return "a file refers to missing chunk"
        case .nodeWithoutDocument: return "wrappers belong to missing document"
        case .versionWithoutDocument: return "versions belong to missing document"
        case .missingCurrentVersion: return "document's current version is missing; document"
        case .contentsWithoutNode: return "contents belong to missing wrapper"
        case .staleCurrentExtents: return "the current extents disagree with the history of wrapper"
        }
    }
}

/// Row-level reads and writes inside one backend transaction. Used only on the thread that runs
/// the transaction's body.
package protocol StoreTransaction {
    // MARK: Store metadata

    /// Reserves `count` fresh node ids; returns the first.
    func reserveNodeIDs(count: Int) throws -> Int64
    /// A store setting (the retention policy), or nil.
    func setting(_ key: String) throws -> String?
    func setSetting(_ key: String, _ value: String) throws

    // MARK: Documents

    /// The document's row, live or deleted.
    func document(_ id: DocumentID) throws -> DocumentInfo?
    /// Live documents by name (bytewise), or deleted ones by deletion time.
    func documents(deleted: Bool) throws -> [DocumentInfo]
    func liveDocument(named name: String) throws -> DocumentInfo?
    /// A new document row with current version 0; returns its id.
    func insertDocument(
        name: String, type: String, kind: DocumentKind, root: StoreNodeID, created: Timestamp
    ) throws -> DocumentID
    func updateDocument(_ id: DocumentID, _ update: DocumentUpdate) throws
    /// Removes the document and every row of it: versions, wrapper rows, chunk-map rows.
    func removeDocument(_ id: DocumentID) throws

    // MARK: Versions

    func insertVersion(document: DocumentID, base: VersionID?, origin: String, created: Timestamp) throws
        -> VersionID
    func version(_ id: VersionID) throws -> VersionInfo?
    /// Oldest first.
    func versions(of document: DocumentID) throws -> [VersionInfo]
    /// Changes the row and returns it as it is now.
    @discardableResult func updateVersion(_ id: VersionID, _ update: VersionUpdate) throws -> VersionInfo
    /// Unresolved conflict versions of live documents, oldest first.
    func unresolvedConflicts() throws -> [VersionInfo]
    func removeVersions(_ ids: [VersionID]) throws

    // MARK: Wrapper rows

    /// The newest row of each wrapper of `document` in `branch` with a version ≤ `limit`,
    /// removals included.
    func latestNodes(of document: DocumentID, branch: Int64, upTo limit: Int64) throws -> [StoredNode]
    /// The newest row of `node` in `branch` with a version ≤ `limit`.
    func latestNode(_ node: StoreNodeID, branch: Int64, upTo limit: Int64) throws -> StoredNode?
    /// Whether the main line has a row of `node` newer than `version`.
    func nodeChanged(_ node: StoreNodeID, after version: VersionID) throws -> Bool
    /// Wrappers other than `except` named `name` in `parent` and not removed as of a lineage:
    /// their newest row on `branch` if that is not 0 and they have one there, else their newest
    /// main-line row up to version `limit`. Only wrappers with some row of that name can be
    /// among them. The SQL backends do not read each one's rows (a name saved by safe-saves has
    /// a removed wrapper per save): see `PortableSQL.nodesNamed`.
    func nodesNamed(
        _ name: String, in parent: StoreNodeID, except: StoreNodeID, branch: Int64, upTo limit: Int64
    )
        throws -> [StoreNodeID]
    /// Writes a row (replacing one with the same node, branch and version).
    func insertNode(_ row: StoredNode) throws
    /// Every wrapper row of `document`, for retention.
    func nodeRowKeys(of document: DocumentID) throws -> [(key: NodeRowKey, removed: Bool)]
    func removeNodeRows(_ keys: [NodeRowKey]) throws
    /// Removes every row, wrapper and chunk-map, of a conflict branch.
    func removeBranch(_ branch: Int64) throws

    // MARK: Extents

    /// The newest row of each start offset in `starts` of `node` in `branch` with a version ≤
    /// `limit`: the extent that begins there, or nil where one was removed. On the main line
    /// (branch 0) removals may be left out, and the cost should follow the file's extents, not
    /// its history, when `limit` is at or after its newest row.
    func extents(_ node: StoreNodeID, branch: Int64, upTo limit: Int64, starts: ClosedRange<Int64>) throws
        -> [Int64: Extent?]
    /// Writes one row per start offset (replacing one with the same node, branch, start and
    /// version); nil removes the extent that began there. All of a save's rows of one file come
    /// at once, so a backend may write them in one statement (a 1 GiB copy is 8,192 rows).
    func insertExtents(
        _ node: StoreNodeID, branch: Int64, version: VersionID, _ rows: [(start: Int64, extent: Extent?)])
        throws
    /// Every extent row of `document`'s wrappers on the main line, and whether it holds a chunk
    /// (false for a removal), for retention.
    func extentRowKeys(of document: DocumentID) throws -> [(key: ExtentRowKey, hasChunk: Bool)]
    func removeExtentRows(_ keys: [ExtentRowKey]) throws

    // MARK: Chunks

    func chunkID(hash: Data) throws -> Int64?
    /// The ids of those chunks of `hashes` the store has, by hash: ``chunkID(hash:)`` of each,
    /// which a backend whose every statement is a round trip answers in one.
    func chunkIDs(hashes: [Data]) throws -> [Data: Int64]
    /// Stores a new chunk; `offset` is where it starts in the file it is stored for. A backend
    /// that keeps chunks in files of its own places it so that that file's page boundaries fall
    /// on its own: a page-aligned read of the file is then one page of the pack, not two.
    func insertChunk(hash: Data, data: Data, offset: Int64) throws -> Int64
    /// The rest of the transaction stores bulk data (a large file's chunks ahead of its save): a
    /// backend that keeps a small save's chunks apart from large ones' keeps none apart here.
    func storesBulk()
    /// The chunks' bytes by id; a missing id is missing from the answer.
    func chunks(_ ids: [Int64]) throws -> [Int64: Data]
    func chunkLength(_ id: Int64) throws -> Int64?
    /// Deletes chunks no extent row refers to; returns how many and their bytes.
    func removeUnreferencedChunks() throws -> (count: Int, bytes: Int64)
    /// Every chunk, in id order, a few at a time; a row that cannot be decoded comes as its error.
    func forEachChunk(_ body: (Result<ChunkRow, any Error>) throws -> Void) throws

    // MARK: Events

    /// Records an event (and tells listeners at commit, where the backend can).
    func insertEvent(
        _ kind: StoreEvent.Kind, document: DocumentID, version: VersionID?, name: String, origin: String,
        time: Timestamp) throws
    func events(after sequence: Int64) throws -> [StoreEvent]
    func latestEventSequence() throws -> Int64
    func removeEvents(before time: Timestamp) throws

    // MARK: Integrity

    /// Ids of rows that refer to something missing.
    func danglingReferences(_ kind: DanglingReference) throws -> [Int64]
}

extension FileWrapper.Kind {
    /// The kind's code in stored rows.
    package var storedCode: Int64 {
        switch self {
        case .regularFile: return 0
        case .directory: return 1
        case .symbolicLink: return 2
        case .fifo: return 3
        case .socket: return 4
        case .characterDevice: return 5
        case .blockDevice: return 6
        }
    }

    /// The kind a stored row's code names; an unknown code is a damaged store.
    public init(storedCode code: Int64, node: Int64) throws {
        switch code {
        case 0: self = .regularFile
        case 1: self = .directory
        case 2: self = .symbolicLink
        case 3: self = .fifo
        case 4: self = .socket
        case 5: self = .characterDevice
        case 6: self = .blockDevice
        default:
            throw DocumentStoreError.corrupt(path: "", reason: "wrapper \(node) has unknown kind \(code)")
        }
    }
}

extension StoreTransaction {
    package func storesBulk() {}

    package func chunkIDs(hashes: [Data]) throws -> [Data: Int64] {
        var ids: [Data: Int64] = [:]
        for hash in hashes where ids[hash] == nil {
            if let id = try chunkID(hash: hash) { ids[hash] = id }
        }
        return ids
    }
}
