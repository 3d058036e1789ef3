import Foundation

/// New contents for a regular-file wrapper.
public enum ContentUpdate: Sendable {
    /// The file is `size` bytes long; the listed chunks (index → the chunk's bytes, at most one
    /// chunk size, the last one possibly shorter) are new; other chunks below `size` keep their
    /// bytes, and bytes past a chunk's stored length read as zeros (sparse files).
    case chunks(size: Int64, [Int: Data])
    /// The file becomes the bytes of `source`. The store compares chunk by chunk and writes only
    /// chunks whose bytes differ.
    case replace(any ContentsSource)
    /// The file is `size` bytes long; each listed chunk index `i` below `size` is read from
    /// `source` at `i * chunkSize` (what of it the source holds: ``ContentsSource/heldRanges``),
    /// one chunk at a time (never more than a few chunks in memory), and written if its bytes
    /// differ; other chunks below `size` keep their bytes; chunks at or past `size` become holes.
    /// Indices at or past `size` are ignored, a negative one is an invalid change. A read shorter
    /// than asked leaves the rest of that chunk zeros; a read that throws aborts the save.
    case sparse(size: Int64, chunks: [Int], source: any ContentsSource)
    /// The file becomes the contents of another file of this store (`lookup`'s node at its
    /// version; as this save leaves it when the version is nil), sharing its chunks: no bytes are
    /// read or written.
    case copy(of: NodeLookup)
    /// The file is `size` bytes long and starts as a copy of `lookup`'s contents (cut or extended
    /// with zeros to `size`); each listed chunk index is then read from `source` as in
    /// ``sparse(size:chunks:source:)``. What a file system sends when a file it wrote was another
    /// file before (a rename over a name, a flat document's new file).
    case derived(from: NodeLookup, size: Int64, chunks: [Int], source: any ContentsSource)
}

extension ContentUpdate {
    /// The source the update reads its bytes from, if any.
    public var source: (any ContentsSource)? {
        switch self {
        case .replace(let source), .sparse(_, _, let source), .derived(_, _, _, let source): source
        case .chunks, .copy: nil
        }
    }
}

/// A store's work on a new file's bytes while they are still being written: cut into chunks
/// and hashed in order as they become final, so that the save that takes them
/// (``ContentsSource/preparation``) is left with storing them and the last few bytes. The
/// writer never waits for it: a store does it with CPU to spare, and drops it when told.
public protocol ContentsPreparation: AnyObject, Sendable {
    /// The first `count` bytes of the file are written and stay as they are unless ``cancel()``
    /// follows: the store may read them now. Never waits for that work.
    func advance(to count: Int64)
    /// Bytes below those advanced to may change, or no save will take the work: it stops, and
    /// nothing it did is used.
    func cancel()
    /// Does the rest of the work now, for a save of `source`, the file's final bytes, that runs
    /// inside a store transaction (``DocumentStore/transaction(durable:_:)``): a save there
    /// takes a preparation only when it is finished. ``DocumentStore/save(_:)-(DocumentChanges)`` finishes it
    /// itself.
    func finish(reading source: any ContentsSource) throws
}

/// What to do when a save is based on a version older than the document's current one.
public enum ConflictPolicy: Sendable {
    /// Keep both: the save becomes a conflict version beside the current one; nothing is
    /// overwritten (FV-*; the Document sees `inConflict`).
    case keepBoth
    /// Apply on top of the current version when no wrapper it touches changed since its base;
    /// otherwise keep both.
    case rebaseIfDisjoint
    /// Throw ``DocumentStoreError/conflict(document:base:current:)``.
    case fail
}

/// One atomic save of a document.
public struct DocumentChanges: Sendable {
    public var document: DocumentID
    /// The version the changes were made against.
    public var base: VersionID
    /// New or changed wrappers (the whole record is stored).
    public var nodes: [NodeRecord] = []
    /// Removed wrappers; removing a directory removes its subtree.
    public var removedNodes: [StoreNodeID] = []
    /// New contents of regular files.
    public var contents: [StoreNodeID: ContentUpdate] = [:]
    /// Who saved, for the version history (e.g. "docfs mount", "MyStuff pid 42").
    public var origin: String = ""
    public var conflictPolicy: ConflictPolicy = .keepBoth
    /// Whether the save returns only once it is on disk. When false it is still atomic and seen
    /// at once by every process, and survives the process being killed, but a power loss or OS
    /// crash may lose it until ``DocumentStore/synchronize()`` returns.
    public var durable: Bool = true

    public init(document: DocumentID, base: VersionID) {
        self.document = document
        self.base = base
    }

    /// Whether the save changes nothing.
    public var isEmpty: Bool { nodes.isEmpty && removedNodes.isEmpty && contents.isEmpty }
}

/// Changes whose new contents a store has cut into chunks and hashed already
/// (``DocumentStore/prepare(_:)``), outside the write transaction that saves them: the
/// transaction, which other saves wait for, then only stores the new chunks and writes rows.
public struct PreparedChanges: Sendable {
    public var changes: DocumentChanges
    /// The store's work, for that store only: a transaction of another store ignores it.
    package var work: (any Sendable)?

    /// Changes with nothing prepared: a transaction that saves them does all the work itself.
    public init(_ changes: DocumentChanges) {
        self.changes = changes
        work = nil
    }

    package init(_ changes: DocumentChanges, work: any Sendable) {
        self.changes = changes
        self.work = work
    }
}

/// A saved version of a document.
public struct VersionInfo: Sendable, Equatable {
    public var id: VersionID
    public var document: DocumentID
    /// The version the save was based on; nil for the first.
    public var base: VersionID?
    public var created: Timestamp
    /// Who saved.
    public var origin: String
    /// A save that lost a conflict: kept beside the current version (FV-1).
    public var isConflict: Bool
    /// A conflict version someone resolved (FV-2).
    public var isResolved: Bool
    /// Content bytes this save wrote.
    public var bytesWritten: Int64

    public init(
        id: VersionID, document: DocumentID, base: VersionID?, created: Timestamp, origin: String,
        isConflict: Bool, isResolved: Bool, bytesWritten: Int64
    ) {
        self.id = id
        self.document = document
        self.base = base
        self.created = created
        self.origin = origin
        self.isConflict = isConflict
        self.isResolved = isResolved
        self.bytesWritten = bytesWritten
    }
}

/// What a save did.
public struct SaveResult: Sendable, Equatable {
    public var version: VersionInfo
    /// The save conflicted and was kept as a conflict version.
    public var isConflict: Bool { version.isConflict }
    /// Content chunks written (new bytes, after deduplication).
    public var chunksWritten: Int
    /// Content bytes written.
    public var bytesWritten: Int64
    /// Wrapper records written.
    public var nodesWritten: Int
    /// The version the save was applied on top of when it was not its base (another process
    /// saved meanwhile, and the changes were disjoint: ``ConflictPolicy/rebaseIfDisjoint``).
    public var rebasedOnto: VersionID?

    public init(
        version: VersionInfo, chunksWritten: Int, bytesWritten: Int64, nodesWritten: Int,
        rebasedOnto: VersionID? = nil
    ) {
        self.version = version
        self.chunksWritten = chunksWritten
        self.bytesWritten = bytesWritten
        self.nodesWritten = nodesWritten
        self.rebasedOnto = rebasedOnto
    }
}

/// What garbage collection removed.
public struct CollectionReport: Sendable, Equatable {
    public var versionsRemoved = 0
    public var documentsRemoved = 0
    public var chunksRemoved = 0
    public var bytesFreed: Int64 = 0
    public init() {}
}

/// Something that changed in a store, for observers in this and other processes.
public struct StoreEvent: Sendable, Equatable {
    public enum Kind: String, Sendable {
        case created, saved, conflict, renamed, deleted, restored
        /// A conflict version was marked resolved (FV-2).
        case resolved
    }
    /// Increases with every event in the store.
    public var sequence: Int64
    public var kind: Kind
    public var document: DocumentID
    public var version: VersionID?
    /// The document's name after the event.
    public var name: String
    public var origin: String

    public init(
        sequence: Int64, kind: Kind, document: DocumentID, version: VersionID?, name: String, origin: String
    ) {
        self.sequence = sequence
        self.kind = kind
        self.document = document
        self.version = version
        self.name = name
        self.origin = origin
    }
}

/// Counters of a store's I/O, for tests and benchmarks.
public struct StoreStatistics: Sendable, Equatable {
    /// Content chunks read from the database (cache misses).
    public var chunksRead = 0
    /// Content bytes read from the database.
    public var bytesRead: Int64 = 0
    /// Content chunks written.
    public var chunksWritten = 0
    /// Content bytes written.
    public var bytesWritten: Int64 = 0
    /// Wrapper records written.
    public var nodesWritten = 0
    /// Content bytes cut into chunks and hashed ahead of their save by preparations, while they
    /// were written (``ContentsPreparation``).
    public var bytesPrepared: Int64 = 0
    /// Bytes of new contents hashed inside write transactions, which other saves wait for: only
    /// saves whose plan, made before their transaction, no longer applied (another process
    /// changed the file meanwhile) hash there.
    public var bytesHashedInWriteTransactions: Int64 = 0
    /// Write transactions committed that can change documents (saves, creations, renames,
    /// deletions, ``DocumentStore/transaction(durable:_:)``), not counting reservations of node
    /// ids, which change nothing a reader sees.
    public var transactionsCommitted = 0
    public init() {}
}

/// Problems an integrity check found.
public struct IntegrityReport: Sendable, Equatable {
    /// Each problem in one line, naming what is wrong.
    public var problems: [String] = []
    public var documentsChecked = 0
    public var nodesChecked = 0
    public var chunksChecked = 0
    public var isClean: Bool { problems.isEmpty }
    public init() {}
}

/// Errors from document stores.
public enum DocumentStoreError: Error, Sendable, Equatable, CustomStringConvertible, LocalizedError {
    case noSuchDocument(String)
    case noSuchNode(StoreNodeID)
    case noSuchVersion(VersionID)
    case documentExists(String)
    case invalidName(String, reason: String)
    case notARegularFile(StoreNodeID)
    case invalidChange(String)
    case conflict(document: DocumentID, base: VersionID, current: VersionID)
    /// The file is not a DocFS store (not SQLite, or another application's database).
    case notAStore(path: String, reason: String)
    /// The store is damaged.
    case corrupt(path: String, reason: String)
    /// The store was written by a newer DocFS.
    case newerFormat(path: String, found: Int, supported: Int)
    case io(String)
    /// The disk holding the store (its location) is full, or the user's quota is used up; the
    /// change that hit it was not made.
    case noSpace(String)

    public var description: String {
        switch self {
        case .noSuchDocument(let name): return "no such document: \(name)"
        case .noSuchNode(let id): return "no such wrapper: \(id)"
        case .noSuchVersion(let id): return "no such version: \(id)"
        case .documentExists(let name): return "a document named \(name.debugDescription) already exists"
        case .invalidName(let name, let reason): return "invalid name \(name.debugDescription): \(reason)"
        case .notARegularFile(let id): return "\(id) is not a regular file"
        case .invalidChange(let reason): return "invalid change: \(reason)"
        case .conflict(let document, let base, let current):
            return "\(document) changed since \(base): it is at \(current)"
        case .notAStore(let path, let reason): return "\(path) is not a DocFS store: \(reason)"
        case .corrupt(let path, let reason):
            return path.isEmpty
                ? "the store is damaged: \(reason)" : "the store \(path) is damaged: \(reason)"
        case .newerFormat(let path, let found, let supported):
            return
                "the store \(path) has format \(found), newer than this program's \(supported); upgrade DocFS"
        case .io(let message): return message
        case .noSpace(let location): return "the disk holding the store \(location) is full"
        }
    }

    public var errorDescription: String? { description }
}

/// A place documents are kept: list, create, open, rename and delete documents; read their
/// wrapper trees (metadata only) and contents by range; save changes atomically; keep versions.
///
/// Methods block; call them from a thread that may block (not a Swift-concurrency pool thread in
/// a hot loop). Implementations are thread-safe and may be shared by several processes.
public protocol DocumentStore: AnyObject, Sendable {
    /// Where the store is (a path or URL), for messages.
    var location: String { get }
    /// Bytes per content chunk, fixed when the store was created.
    var chunkSize: Int { get }
    /// I/O counters since the store was opened.
    var statistics: StoreStatistics { get }

    func documents() throws -> [DocumentInfo]
    func document(_ id: DocumentID) throws -> DocumentInfo
    /// The document's ``DocumentInfo/currentVersion``, as ``document(_:)`` gives it: for a
    /// caller that needs only that, before every open (a mount's close-to-open check).
    func currentVersion(of document: DocumentID) throws -> VersionID
    func document(named name: String) throws -> DocumentInfo?
    /// Creates a document whose root is `root`: an empty folder (a package), an empty file, a
    /// symbolic link or a special file (flat documents).
    func createDocument(named name: String, root: DocumentRoot, type: String?, origin: String) throws
        -> DocumentInfo
    func renameDocument(_ id: DocumentID, to name: String) throws -> DocumentInfo
    /// Removes the document from listings; its versions stay until the retention policy drops them.
    func deleteDocument(_ id: DocumentID, origin: String) throws
    /// Documents deleted but still restorable.
    func deletedDocuments() throws -> [DocumentInfo]
    /// Makes a deleted document visible again, under `name` if given.
    func undeleteDocument(_ id: DocumentID, as name: String?) throws -> DocumentInfo

    /// All wrapper records of a document at `version` (current when nil).
    func nodes(of document: DocumentID, at version: VersionID?) throws -> [NodeRecord]
    /// One wrapper record at `version` (current when nil), or nil if it does not exist there.
    func node(_ id: StoreNodeID, at version: VersionID?) throws -> NodeRecord?
    /// Several wrapper records, each at its own version (current when nil), in the order asked:
    /// nil where one does not exist there, an error where that one cannot be read. A store on a
    /// server answers them in one round trip (a mount listing its documents asks for every root).
    func nodes(_ lookups: [NodeLookup]) throws -> [Result<NodeRecord?, any Error>]
    /// Up to `count` bytes of a regular file from `offset`, reading only the chunks that cover them.
    func readContents(of node: StoreNodeID, at version: VersionID?, offset: Int64, count: Int) throws -> Data
    /// Reads a regular file's bytes from `offset` into `buffer` (current when `version` is nil):
    /// the count read, fewer than the buffer holds only at the end of the file.
    func readContents(
        of node: StoreNodeID, at version: VersionID?, offset: Int64,
        into buffer: UnsafeMutableRawBufferPointer
    ) throws -> Int

    /// Fresh node ids for new wrappers.
    func makeNodeIDs(count: Int) throws -> [StoreNodeID]
    /// Cuts and hashes the new contents of `changes` against their base, reading the sources
    /// now, for a transaction to save (``DocumentStoreTransaction/save(_:)-(PreparedChanges)``).
    /// Blocks no other save. A preparation whose base has changed by the time it is saved (another
    /// process saved the file meanwhile) is done again inside the transaction.
    func prepare(_ changes: DocumentChanges) throws -> PreparedChanges
    /// Saves changes atomically as one new version: prepares them, then saves them in a
    /// transaction of their own.
    func save(_ changes: DocumentChanges) throws -> SaveResult
    /// Saves changes this store prepared (``prepare(_:)``) in a transaction of their own.
    func save(_ prepared: PreparedChanges) throws -> SaveResult
    /// Runs `body` as one atomic write: the documents it creates, saves and deletes are
    /// committed together, or, when it throws, not at all. `body` must not call the store
    /// itself. Durable when `durable`, as ``DocumentChanges/durable``.
    func transaction<T>(durable: Bool, _ body: (any DocumentStoreTransaction) throws -> T) throws -> T
    /// Makes every save committed before the call durable, including deferred ones
    /// (``DocumentChanges/durable`` false).
    func synchronize() throws

    /// Every version of a document, oldest first.
    func versions(of document: DocumentID) throws -> [VersionInfo]
    /// Makes `version`'s tree the current one, as a new save.
    func restore(_ version: VersionID, of document: DocumentID, origin: String) throws -> SaveResult
    /// Marks a conflict version resolved (FV-2), recording a ``StoreEvent/Kind/resolved`` event.
    /// Resolving a version that is not an unresolved conflict does nothing.
    func resolveConflict(_ version: VersionID) throws
    /// The unresolved conflict versions of every live (not deleted) document, oldest first.
    func unresolvedConflicts() throws -> [VersionInfo]
    /// Drops versions the policy no longer keeps (never a current version, an unresolved
    /// conflict, or one of `protected`), removes deleted documents past their expiry, deletes the
    /// chunks nothing references and gives their space back.
    func collectGarbage(_ policy: RetentionPolicy, protecting protected: Set<VersionID>) throws
        -> CollectionReport
    /// A setting kept in the store for every process that uses it (the retention policy), or nil.
    func setting(_ key: String) throws -> String?
    func setSetting(_ key: String, _ value: String) throws

    /// Events after `sequence`, oldest first.
    func events(after sequence: Int64) throws -> [StoreEvent]
    /// The sequence of the latest event.
    func latestEventSequence() throws -> Int64

    /// Checks every chunk against its hash, that every wrapper is reachable, that nothing dangles,
    /// and that sizes agree.
    func checkIntegrity() throws -> IntegrityReport
}

/// The changes one ``DocumentStore/transaction(durable:_:)`` can make; each is what the store's
/// method of the same name does, and all of them commit together: a crash leaves all of them or
/// none. Each sees what the ones before it in the transaction did.
public protocol DocumentStoreTransaction {
    func document(_ id: DocumentID) throws -> DocumentInfo
    /// The live document named `name`, if any, as the transaction sees it.
    func document(named name: String) throws -> DocumentInfo?
    /// One wrapper record at the current version as the transaction sees it (a hard link's own
    /// record), or nil.
    func node(_ id: StoreNodeID) throws -> NodeRecord?
    /// Creates a document as ``DocumentStore/createDocument(named:root:type:origin:)`` does; a
    /// flat document's regular file starts with `contents` (nil: empty), in the same version:
    /// the update the changes give for the root's node (``DocumentRoot/node``, which must be
    /// set), prepared by this store; their document and base are not used.
    func createDocument(
        named name: String, root: DocumentRoot, type: String?, origin: String, contents: PreparedChanges?
    ) throws -> DocumentInfo
    /// Renames a live document; the name must be free (delete the document that has it first, in
    /// the same transaction, to replace it).
    func renameDocument(_ id: DocumentID, to name: String) throws -> DocumentInfo
    /// Swaps the names of two live documents, as `renameat2(RENAME_EXCHANGE)` swaps two names.
    func exchangeDocuments(_ first: DocumentID, _ second: DocumentID) throws -> (DocumentInfo, DocumentInfo)
    func deleteDocument(_ id: DocumentID, origin: String) throws
    /// Saves one document's changes, prepared by this store, as a new version of it (the
    /// changes' ``DocumentChanges/durable`` is the transaction's).
    func save(_ prepared: PreparedChanges) throws -> SaveResult
    /// Makes `version`'s tree the current one, as a new save (``DocumentStore/restore(_:of:origin:)``).
    func restore(_ version: VersionID, of document: DocumentID, origin: String) throws -> SaveResult
    func resolveConflict(_ version: VersionID) throws
    /// Brings a deleted document back, as ``DocumentStore/undeleteDocument(_:as:)``.
    func undeleteDocument(_ id: DocumentID, as name: String?) throws -> DocumentInfo
    /// A setting, as ``DocumentStore/setting(_:)``, read inside the transaction.
    func setting(_ key: String) throws -> String?
    func setSetting(_ key: String, _ value: String) throws
}

extension DocumentStoreTransaction {
    /// Saves `changes` as a new version, cutting and hashing their new contents here, inside the
    /// transaction; changes prepared before it (``DocumentStore/prepare(_:)``) keep it short.
    public func save(_ changes: DocumentChanges) throws -> SaveResult { try save(PreparedChanges(changes)) }

    /// Creates an empty document (``DocumentStore/createDocument(named:root:type:origin:)``).
    public func createDocument(named name: String, root: DocumentRoot, type: String?, origin: String) throws
        -> DocumentInfo
    {
        try createDocument(named: name, root: root, type: type, origin: origin, contents: nil)
    }
}

extension DocumentStore {
    /// Nothing prepared: the transaction that saves the changes does all the work.
    public func prepare(_ changes: DocumentChanges) throws -> PreparedChanges { PreparedChanges(changes) }

    /// In a transaction of their own.
    public func save(_ prepared: PreparedChanges) throws -> SaveResult {
        try transaction(durable: prepared.changes.durable) { try $0.save(prepared) }
    }

    /// Through ``readContents(of:at:offset:count:)``, copied.
    public func readContents(
        of node: StoreNodeID, at version: VersionID?, offset: Int64,
        into buffer: UnsafeMutableRawBufferPointer
    ) throws -> Int {
        try readContents(of: node, at: version, offset: offset, count: buffer.count).copyPrefix(into: buffer)
    }

    /// Creates an empty document: a package's root directory or an empty flat file.
    public func createDocument(
        named name: String, kind: DocumentKind, type: String?, permissions: Int?, origin: String
    ) throws -> DocumentInfo {
        try createDocument(
            named: name,
            root: DocumentRoot(kind: kind == .package ? .directory : .regularFile, permissions: permissions),
            type: type, origin: origin)
    }

    /// All wrapper records of a document at its current version.
    public func nodes(of document: DocumentID) throws -> [NodeRecord] { try nodes(of: document, at: nil) }

    /// One wrapper record at the current version, or nil if it does not exist.
    public func node(_ id: StoreNodeID) throws -> NodeRecord? { try node(id, at: nil) }

    /// One lookup after another: right for an embedded store, where a lookup costs no round trip.
    public func nodes(_ lookups: [NodeLookup]) throws -> [Result<NodeRecord?, any Error>] {
        lookups.map { lookup in Result { try node(lookup.node, at: lookup.version) } }
    }

    public func currentVersion(of document: DocumentID) throws -> VersionID {
        try self.document(document).currentVersion
    }

    /// ``collectGarbage(_:protecting:)`` with nothing protected beyond what the policy keeps, and
    /// the versions the Trash shows wrappers from while the policy keeps deleted documents.
    public func collectGarbage(_ policy: RetentionPolicy) throws -> CollectionReport {
        try collectGarbage(policy, protecting: trashedVersions(policy: policy))
    }

    /// Applies the store's own retention policy; the Trash's wrappers are kept as deleted
    /// documents are.
    public func collectGarbage(protecting protected: Set<VersionID> = []) throws -> CollectionReport {
        let policy = try retentionPolicy()
        let report = try collectGarbage(policy, protecting: protected.union(trashedVersions(policy: policy)))
        try setSetting(Self.collectedSetting, String(Timestamp.now.rawValue))
        return report
    }

    /// Applies the store's retention policy unless some process did within `interval`; nil when
    /// it was not due. What the mount and `docfs` run in the background, so history thins itself.
    public func collectGarbageIfDue(every interval: Duration, protecting protected: Set<VersionID> = [])
        throws -> CollectionReport?
    {
        let seconds = interval.components.seconds
        if let text = try setting(Self.collectedSetting), let last = Int64(text),
            Timestamp.now.rawValue - last < seconds * 1_000_000_000
        {
            return nil
        }
        return try collectGarbage(protecting: protected)
    }

    /// The store's retention policy: ``RetentionPolicy/standard`` until one is set.
    public func retentionPolicy() throws -> RetentionPolicy {
        guard let text = try setting(Self.retentionSetting) else { return .standard }
        do { return try RetentionPolicy(parsing: text) } catch {
            throw DocumentStoreError.corrupt(
                path: location, reason: "its retention policy \(text.debugDescription) is invalid: \(error)")
        }
    }

    /// Keeps `policy` in the store, for every process that uses it.
    public func setRetentionPolicy(_ policy: RetentionPolicy) throws {
        try setSetting(Self.retentionSetting, policy.description)
    }

    static var retentionSetting: String { "retention" }
    static var collectedSetting: String { "collected" }

    /// One query per document; stores override it with one query.
    public func unresolvedConflicts() throws -> [VersionInfo] {
        try documents().flatMap { try versions(of: $0.id).filter { $0.isConflict && !$0.isResolved } }
            .sorted { $0.id < $1.id }
    }
}

/// A wrapper record to look up: `node` at `version` (current when nil).
public struct NodeLookup: Hashable, Sendable {
    public var node: StoreNodeID
    public var version: VersionID?

    public init(_ node: StoreNodeID, at version: VersionID?) {
        self.node = node
        self.version = version
    }
}

/// A regular wrapper's contents in a store, read by range on demand.
public struct StoreContentsSource: ContentsSource {
    public let store: any DocumentStore
    public let node: StoreNodeID
    /// The version to read; nil reads the current one.
    public let version: VersionID?
    public let count: Int64

    public init(store: any DocumentStore, node: StoreNodeID, version: VersionID?, count: Int64) {
        self.store = store
        self.node = node
        self.version = version
        self.count = count
    }

    public func read(offset: Int64, count: Int) throws -> Data {
        try store.readContents(of: node, at: version, offset: offset, count: count)
    }
}
