import DocumentEngine
import Foundation
import Logging
import PostgresNIO
import Synchronization

/// The shared document store: one PostgreSQL database, used by several processes and machines.
///
/// The same data model and guarantees as ``DocumentEngine/SQLiteStore``: contents are fixed-size
/// chunks stored once per SHA-256; every save is one transaction that writes only the chunks and
/// wrapper rows that changed, and is a version; a save based on an older version is kept as a
/// conflict version; listing reads no contents and ranged reads read only the chunks they cover.
///
/// Writers take turns on one advisory lock (as SQLite's writers do on its write lock); readers
/// never wait for them. Every write that records an event notifies the channel `docfs_events`, so
/// observers in other processes learn of it at once (see ``waitForChange(after:timeout:)``).
///
/// Methods block the calling thread on network I/O; postgres-nio runs on an event loop thread of
/// the store's own, so they may be called from any thread that may block.
public final class PostgresStore: DocumentStore, StoreChangeNotifying, Sendable {
    /// How to open a store.
    public struct OpenOptions: OptionSet, Sendable {
        public let rawValue: Int
        public init(rawValue: Int) { self.rawValue = rawValue }
        /// Create the store's tables if the database has none.
        public static let create = OpenOptions(rawValue: 1)
    }

    public let configuration: Configuration
    /// The database's URL, without the password.
    public var location: String { configuration.url }
    public let chunkSize: Int
    let database: PostgresDatabase
    private let counters = Mutex(StoreStatistics())
    private let cache: Mutex<ChunkCache>
    /// What reads at saved versions learned: a file's size and chunk ids by index (immutable).
    private let pinned = Mutex(PinnedFiles())
    let listener: ChangeListener

    public var statistics: StoreStatistics { counters.withLock { $0 } }

    /// Opens the store in `configuration`'s database, creating its tables with `options: .create`
    /// (and `chunkSize`) if the database has none. The database itself must exist.
    ///
    /// A database without DocFS's tables (unless created), another application's database, or one
    /// written by a newer DocFS is refused with a ``DocumentStoreError`` that names the problem.
    public init(
        configuration: Configuration, options: OpenOptions = [],
        chunkSize: Int = SQLiteStore.defaultChunkSize, logger: Logger = Logger(label: "docfs.postgres")
    ) throws {
        self.configuration = configuration
        let location = configuration.url
        database = PostgresDatabase(
            configuration: try configuration.connectionConfiguration(), location: location,
            timeout: configuration.timeout, logger: logger)
        guard chunkSize > 0, chunkSize <= 64 << 20 else {
            throw DocumentStoreError.invalidChange("the chunk size must be between 1 byte and 64 MiB")
        }
        let stored = try database.transaction { db -> Int64 in
            // Two processes creating the same store at once: the second waits, then finds it.
            try db.query("SELECT pg_advisory_xact_lock($1)", [.int(PostgresSchema.writeLock)])
            let hasMeta = try db.exists(
                "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = current_schema() AND tablename = 'store_meta'"
            )
            if !hasMeta {
                guard options.contains(.create) else {
                    throw DocumentStoreError.notAStore(
                        path: location, reason: "the database has no DocFS store")
                }
                let others =
                    try db.scalar(
                        "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = current_schema()") ?? 0
                if others > 0 {
                    throw DocumentStoreError.notAStore(
                        path: location, reason: "the database holds another application's tables")
                }
                // One statement at a time: the extended query protocol takes no more.
                for statement in PostgresSchema.tables.split(separator: ";")
                where !statement.allSatisfy(\.isWhitespace) {
                    try db.query(String(statement))
                }
                try db.query(
                    """
                    INSERT INTO store_meta(key, value) VALUES ('application', $1), ('format', $2),
                        ('chunk_size', $3), ('next_node', 1)
                    """,
                    [
                        .int(PostgresSchema.applicationID), .int(PostgresSchema.formatVersion),
                        .int(Int64(chunkSize)),
                    ])
            }
            var meta: [String: Int64] = [:]
            for row in try db.query("SELECT key, value FROM store_meta") {
                meta[try row.string("key")] = try row.int("value")
            }
            guard meta["application"] == PostgresSchema.applicationID else {
                throw DocumentStoreError.notAStore(
                    path: location, reason: "its store_meta is another application's")
            }
            guard let format = meta["format"], let size = meta["chunk_size"], size > 0, size <= 64 << 20
            else {
                throw DocumentStoreError.corrupt(path: location, reason: "the store's metadata is missing")
            }
            if format > PostgresSchema.formatVersion {
                throw DocumentStoreError.newerFormat(
                    path: location, found: Int(format), supported: Int(PostgresSchema.formatVersion))
            }
            return size
        }
        self.chunkSize = Int(stored)
        cache = Mutex(ChunkCache(capacity: ChunkCache.storeCapacity))
        listener = ChangeListener(database: database)
    }

    deinit { listener.stop() }

    /// Runs `body` in one read-only snapshot, so several statements see one state of the store.
    func read<T>(_ body: (SQLConnection) throws -> T) throws -> T {
        try database.transaction(readOnly: true, body)
    }

    /// Runs `body` in one write transaction holding the store's write lock. A durable one returns
    /// once the commit is on the server's disk; otherwise it commits without waiting for the flush
    /// (`synchronous_commit = off`): atomic and seen by everyone at once, but a server crash may
    /// lose it until ``synchronize()`` returns.
    func write<T>(durable: Bool = true, _ body: (SQLConnection) throws -> T) throws -> T {
        // Every statement is a round trip: a deferred commit is set with the lock, in one.
        try database.transaction { db in
            try db.query(
                durable
                    ? "SELECT pg_advisory_xact_lock($1)"
                    : "SELECT pg_advisory_xact_lock($1), set_config('synchronous_commit', 'off', true)",
                [.int(PostgresSchema.writeLock)])
            return try body(db)
        }
    }

    // MARK: Documents

    public func documents() throws -> [DocumentInfo] {
        try database.withConnection { db in
            try db.query("SELECT * FROM documents WHERE deleted IS NULL ORDER BY name COLLATE \"C\"").map(
                Self.document)
        }
    }

    public func deletedDocuments() throws -> [DocumentInfo] {
        try database.withConnection { db in
            try db.query("SELECT * FROM documents WHERE deleted IS NOT NULL ORDER BY deleted").map(
                Self.document)
        }
    }

    public func document(_ id: DocumentID) throws -> DocumentInfo {
        try database.withConnection { db in try Self.fetchDocument(db, id) }
    }

    public func document(named name: String) throws -> DocumentInfo? {
        try database.withConnection { db in
            try db.query("SELECT * FROM documents WHERE name = $1 AND deleted IS NULL", [.text(name)]).first
                .map(
                    Self.document)
        }
    }

    static func fetchDocument(_ db: SQLConnection, _ id: DocumentID, forUpdate: Bool = false) throws
        -> DocumentInfo
    {
        guard let row = try db.query("SELECT * FROM documents WHERE id = $1", [.int(id.rawValue)]).first
        else {
            throw DocumentStoreError.noSuchDocument(id.description)
        }
        return try document(row)
    }

    static func document(_ row: SQLRow) throws -> DocumentInfo {
        DocumentInfo(
            id: DocumentID(rawValue: try row.int("id")), name: try row.string("name"),
            type: try row.string("type"),
            kind: DocumentKind(rawValue: Int(try row.int("kind"))) ?? .package,
            root: StoreNodeID(rawValue: try row.int("root")),
            currentVersion: VersionID(rawValue: try row.int("current_version")),
            created: Timestamp(rawValue: try row.int("created")),
            modified: Timestamp(rawValue: try row.int("modified")))
    }

    public func createDocument(
        named name: String, kind: DocumentKind, type: String? = nil, permissions: Int? = nil,
        origin: String = ""
    ) throws -> DocumentInfo {
        try Self.validateDocumentName(name)
        return try write { db in
            try Self.requireFreeName(db, name)
            let now = Timestamp.now
            let root = try Self.allocateNodeIDs(db, count: 1)[0]
            guard
                let document = try db.scalar(
                    """
                    INSERT INTO documents(name, type, kind, root, current_version, created, modified)
                    VALUES ($1, $2, $3, $4, 0, $5, $6) RETURNING id
                    """,
                    [
                        .text(name), .text(type ?? SQLiteStore.typeIdentifier(forName: name)),
                        SQLValue(kind.rawValue), .int(root.rawValue), .int(now.rawValue), .int(now.rawValue),
                    ]
                ).map(DocumentID.init(rawValue:))
            else { throw DocumentStoreError.io("creating \(name) gave no document id") }
            let version = try Self.insertVersion(db, document: document, base: nil, origin: origin, now: now)
            let record = NodeRecord(
                id: root, document: document, parent: nil, name: name,
                kind: kind == .package ? .directory : .regularFile,
                permissions: permissions ?? (kind == .package ? 0o755 : 0o644), modified: now)
            try Self.insertNode(db, record, branch: 0, version: version)
            try db.query(
                "UPDATE documents SET current_version = $1 WHERE id = $2",
                [.int(version.rawValue), .int(document.rawValue)])
            try Self.insertEvent(
                db, .created, document: document, version: version, name: name, origin: origin)
            counters.withLock { $0.nodesWritten += 1 }
            return try Self.fetchDocument(db, document)
        }
    }

    public func renameDocument(_ id: DocumentID, to name: String) throws -> DocumentInfo {
        try Self.validateDocumentName(name)
        return try write { db in
            let current = try Self.fetchDocument(db, id)
            if current.name == name { return current }
            try Self.requireFreeName(db, name, except: id)
            try db.query(
                "UPDATE documents SET name = $1, modified = $2 WHERE id = $3",
                [.text(name), .int(Timestamp.now.rawValue), .int(id.rawValue)])
            try Self.insertEvent(
                db, .renamed, document: id, version: current.currentVersion, name: name, origin: "")
            return try Self.fetchDocument(db, id)
        }
    }

    public func deleteDocument(_ id: DocumentID, origin: String = "") throws {
        try write { db in
            let current = try Self.fetchDocument(db, id)
            try db.query(
                "UPDATE documents SET deleted = $1 WHERE id = $2 AND deleted IS NULL",
                [.int(Timestamp.now.rawValue), .int(id.rawValue)])
            try Self.insertEvent(
                db, .deleted, document: id, version: current.currentVersion, name: current.name,
                origin: origin)
        }
    }

    public func undeleteDocument(_ id: DocumentID, as name: String? = nil) throws -> DocumentInfo {
        try write { db in
            let current = try Self.fetchDocument(db, id)
            let newName = name ?? current.name
            try Self.validateDocumentName(newName)
            try Self.requireFreeName(db, newName, except: id)
            try db.query(
                "UPDATE documents SET deleted = NULL, name = $1 WHERE id = $2",
                [.text(newName), .int(id.rawValue)])
            try Self.insertEvent(
                db, .restored, document: id, version: current.currentVersion, name: newName, origin: "")
            return try Self.fetchDocument(db, id)
        }
    }

    /// Throws unless no live document other than `except` is named `name`.
    static func requireFreeName(_ db: SQLConnection, _ name: String, except id: DocumentID? = nil) throws {
        if try db.exists(
            "SELECT 1 FROM documents WHERE name = $1 AND deleted IS NULL AND id != $2",
            [.text(name), .int(id?.rawValue ?? -1)])
        {
            throw DocumentStoreError.documentExists(name)
        }
    }

    static func validateDocumentName(_ name: String) throws {
        if let reason = FileName.problem(with: name) {
            throw DocumentStoreError.invalidName(name, reason: reason)
        }
    }

    // MARK: Reading wrappers

    /// Which rows make up a version: the main line up to `limit`, plus a conflict branch on top.
    struct Lineage {
        var limit: Int64
        var branch: Int64

        static let current = Lineage(limit: .max, branch: 0)
    }

    static func lineage(_ db: SQLConnection, _ version: VersionID?) throws -> Lineage {
        guard let version else { return .current }
        guard
            let row = try db.query(
                "SELECT base, branch FROM versions WHERE id = $1", [.int(version.rawValue)]
            ).first
        else { throw DocumentStoreError.noSuchVersion(version) }
        let branch = try row.int("branch")
        if branch == 0 { return Lineage(limit: version.rawValue, branch: 0) }
        return Lineage(limit: try row.optionalInt("base") ?? 0, branch: branch)
    }

    public func nodes(of document: DocumentID, at version: VersionID? = nil) throws -> [NodeRecord] {
        try read { db in
            _ = try Self.fetchDocument(db, document)
            return try Self.nodes(db, document: document, lineage: Self.lineage(db, version)).values
                .sorted { $0.id < $1.id }
        }
    }

    /// The live records of a document as of `lineage`.
    static func nodes(_ db: SQLConnection, document: DocumentID, lineage: Lineage) throws -> [StoreNodeID:
        NodeRecord]
    {
        var result: [StoreNodeID: NodeRecord] = [:]
        let rows = try db.query(
            """
            SELECT DISTINCT ON (node) * FROM nodes
            WHERE document = $1 AND branch = 0 AND version <= $2
            ORDER BY node, version DESC
            """,
            [.int(document.rawValue), .int(lineage.limit)])
        for row in rows where try row.int("removed") == 0 {
            let record = try record(row)
            result[record.id] = record
        }
        if lineage.branch != 0 {
            let branchRows = try db.query(
                "SELECT * FROM nodes WHERE document = $1 AND branch = $2",
                [.int(document.rawValue), .int(lineage.branch)])
            for row in branchRows {
                let id = StoreNodeID(rawValue: try row.int("node"))
                result[id] = try row.int("removed") != 0 ? nil : try record(row)
            }
        }
        return result
    }

    public func node(_ id: StoreNodeID, at version: VersionID? = nil) throws -> NodeRecord? {
        guard let version else {
            return try database.withConnection { db in try Self.node(db, id, lineage: .current) }
        }
        // One statement is one snapshot: a lookup at a main-line version (what a mount asks for
        // every entry it lists) is one round trip instead of a transaction of four.
        let found = try database.withConnection { db in try Self.mainLineNode(db, id, at: version) }
        if let found { return found.record }
        return try read { db in try Self.node(db, id, lineage: Self.lineage(db, version)) }
    }

    public func nodes(_ lookups: [NodeLookup]) throws -> [Result<NodeRecord?, any Error>] {
        var results: [Result<NodeRecord?, any Error>] = []
        results.reserveCapacity(lookups.count)
        var start = lookups.startIndex
        while start < lookups.endIndex {
            let end = min(start + 2_000, lookups.endIndex)
            results += try nodesInOneStatement(Array(lookups[start..<end]))
            start = end
        }
        return results
    }

    /// Up to a few thousand lookups in one statement (one snapshot); the rare one at a conflict
    /// branch's version is read on its own afterwards.
    private func nodesInOneStatement(_ lookups: [NodeLookup]) throws -> [Result<NodeRecord?, any Error>] {
        let answers = try database.withConnection { db in try Self.mainLineLookups(db, lookups) }
        return zip(lookups, answers).map { lookup, answer in
            Result {
                switch try answer.get() {
                case .record(let record): return record
                case .onConflictBranch: return try node(lookup.node, at: lookup.version)
                }
            }
        }
    }

    /// The record of `id` at `version` and the version's lineage, read in one statement; nil when
    /// `version` is on a conflict branch (the caller reads it the long way).
    static func mainLineNode(_ db: SQLConnection, _ id: StoreNodeID, at version: VersionID) throws
        -> (lineage: Lineage, record: NodeRecord?)?
    {
        guard let answer = try mainLineLookups(db, [NodeLookup(id, at: version)]).first else {
            throw DocumentStoreError.corrupt(path: "", reason: "a lookup came back without an answer")
        }
        guard case .record(let record) = try answer.get() else { return nil }
        return (Lineage(limit: version.rawValue, branch: 0), record)
    }

    /// What one statement learns of a lookup: its record on the main line (nil if it does not
    /// exist at that version), or that its version is on a conflict branch.
    enum MainLineAnswer {
        case record(NodeRecord?)
        case onConflictBranch
    }

    /// Answers `lookups` in one statement, in their order; a lookup at a version that does not
    /// exist fails with `noSuchVersion`.
    static func mainLineLookups(_ db: SQLConnection, _ lookups: [NodeLookup]) throws
        -> [Result<MainLineAnswer, any Error>]
    {
        func array(_ values: [Int64?]) -> SQLValue {
            .text("{" + values.map { $0.map(String.init) ?? "NULL" }.joined(separator: ",") + "}")
        }
        let rows = try db.query(
            """
            SELECT l.ord AS lookup_index,
                (l.version IS NOT NULL AND v.id IS NULL)::int::bigint AS version_missing,
                COALESCE(v.branch, 0) AS version_branch, n.*
            FROM unnest($1::text::bigint[], $2::text::bigint[]) WITH ORDINALITY AS l(node, version, ord)
            LEFT JOIN versions v ON v.id = l.version
            LEFT JOIN LATERAL (
                SELECT * FROM nodes
                WHERE nodes.node = l.node AND nodes.branch = 0
                    AND nodes.version <= CASE
                        WHEN l.version IS NULL THEN 9223372036854775807
                        WHEN v.branch = 0 THEN v.id
                        ELSE COALESCE(v.base, 0) END
                ORDER BY nodes.version DESC LIMIT 1
            ) n ON true
            """,
            [array(lookups.map { $0.node.rawValue }), array(lookups.map { $0.version?.rawValue })])
        var answers = [Result<MainLineAnswer, any Error>?](repeating: nil, count: lookups.count)
        for row in rows {
            guard let index = try? Int(row.int("lookup_index")) - 1, answers.indices.contains(index) else {
                throw DocumentStoreError.corrupt(path: "", reason: "a lookup came back without its index")
            }
            let version = lookups[index].version
            answers[index] = Result {
                if try row.int("version_missing") != 0 {
                    throw DocumentStoreError.noSuchVersion(version ?? VersionID(rawValue: 0))
                }
                if version != nil, try row.int("version_branch") != 0 { return .onConflictBranch }
                guard try row.optionalInt("node") != nil, try row.int("removed") == 0 else { return .record(nil) }
                return .record(try record(row))
            }
        }
        return try answers.map { answer in
            guard let answer else {
                throw DocumentStoreError.corrupt(path: "", reason: "a lookup came back without an answer")
            }
            return answer
        }
    }

    static func node(_ db: SQLConnection, _ id: StoreNodeID, lineage: Lineage) throws -> NodeRecord? {
        if lineage.branch != 0,
            let row = try db.query(
                "SELECT * FROM nodes WHERE node = $1 AND branch = $2 ORDER BY version DESC LIMIT 1",
                [.int(id.rawValue), .int(lineage.branch)]
            ).first
        {
            return try row.int("removed") != 0 ? nil : try record(row)
        }
        guard
            let row = try db.query(
                "SELECT * FROM nodes WHERE node = $1 AND branch = 0 AND version <= $2 ORDER BY version DESC LIMIT 1",
                [.int(id.rawValue), .int(lineage.limit)]
            ).first
        else { return nil }
        return try row.int("removed") != 0 ? nil : try record(row)
    }

    static func record(_ row: SQLRow) throws -> NodeRecord {
        let kindValue = try row.int("kind")
        let kind: FileWrapper.Kind
        switch kindValue {
        case 0: kind = .regularFile
        case 1: kind = .directory
        case 2: kind = .symbolicLink
        default:
            throw DocumentStoreError.corrupt(
                path: "", reason: "wrapper \(try row.int("node")) has unknown kind \(kindValue)")
        }
        return NodeRecord(
            id: StoreNodeID(rawValue: try row.int("node")),
            document: DocumentID(rawValue: try row.int("document")),
            parent: try row.optionalInt("parent").map(StoreNodeID.init(rawValue:)),
            name: try row.string("name"),
            preferredName: try row.optionalString("preferred_name"), kind: kind,
            permissions: Int(try row.int("permissions")),
            uid: UInt32(truncatingIfNeeded: try row.int("uid")),
            gid: UInt32(truncatingIfNeeded: try row.int("gid")),
            modified: Timestamp(rawValue: try row.int("mtime")),
            changed: Timestamp(rawValue: try row.int("ctime")),
            accessed: Timestamp(rawValue: try row.int("atime")),
            created: Timestamp(rawValue: try row.int("btime")),
            size: try row.int("size"), linkTarget: try row.optionalString("link_target"),
            extendedAttributes: try XattrCoding.decode(try row.optionalData("xattrs") ?? Data()),
            version: VersionID(rawValue: try row.int("version")))
    }

    // MARK: Reading contents

    public func readContents(of node: StoreNodeID, at version: VersionID? = nil, offset: Int64, count: Int)
        throws -> Data
    {
        guard offset >= 0, count >= 0 else {
            throw DocumentStoreError.invalidChange("negative offset or count")
        }
        // A saved version never changes: what a read at one learned serves the next without the
        // server (a mount keeps reading what it read while the server is away).
        if let version, let data = try pinnedRead(node, version, offset: offset, count: count) { return data }
        return try read { db in
            let lineage: Lineage
            let found: NodeRecord?
            if let version, let mainLine = try Self.mainLineNode(db, node, at: version) {
                (lineage, found) = mainLine
            } else {
                lineage = try Self.lineage(db, version)
                found = try Self.node(db, node, lineage: lineage)
            }
            guard let record = found else { throw DocumentStoreError.noSuchNode(node) }
            guard record.kind == .regularFile else { throw DocumentStoreError.notARegularFile(node) }
            let end = min(record.size, offset + Int64(count))
            guard offset < end else { return Data() }
            let size = Int64(chunkSize)
            let first = offset / size
            let last = (end - 1) / size
            // At a saved version the map is learned a window at a time, so that the next reads
            // nearby (random ones too) fetch their chunks in one statement.
            let through =
                version == nil ? last : max(last, min((record.size - 1) / size, first + Self.mapWindow - 1))
            var map = try Self.chunkMap(db, node: node, lineage: lineage, from: first, through: through)
            for index in first...through where map[index] == nil { map[index] = .some(nil) }
            let chunks = try self.chunks(db, Set((first...last).compactMap { map[$0] ?? nil }))
            if let version {
                pinned.withLock { $0.learn(PinnedKey(node: node, version: version), size: record.size, map: map) }
            }
            return try assemble(offset: offset, end: end, map: map, chunks: chunks)
        }
    }

    /// Chunk-map indices a first read at a saved version learns (256 MiB of 256 KiB chunks).
    static let mapWindow: Int64 = 1_024

    /// A read at `version` from what earlier reads at it learned: from the chunk cache (without
    /// the server), else with one statement for the missing chunks; nil if the map is not known.
    private func pinnedRead(_ node: StoreNodeID, _ version: VersionID, offset: Int64, count: Int) throws -> Data? {
        let key = PinnedKey(node: node, version: version)
        guard let entry = pinned.withLock({ $0.reading(key, until: offset + Int64(count)) }) else { return nil }
        let end = min(entry.size, offset + Int64(count))
        guard offset < end else { return Data() }
        let size = Int64(chunkSize)
        var map: [Int64: Int64?] = [:]
        for index in (offset / size)...((end - 1) / size) {
            guard let chunk = entry.map[index] else { return nil }
            map[index] = chunk
        }
        var chunks: [Int64: Data] = [:]
        var missing: Set<Int64> = []
        cache.withLock { cache in
            for case .some(let id) in map.values {
                if let data = cache.get(id) { chunks[id] = data } else { missing.insert(id) }
            }
        }
        let smallRead = size / 8
        if missing.count == 1, let id = missing.first, map.count == 1, end - offset <= smallRead,
            offset != entry.lastEnd
        {
            // A small read away from the last one (a random read) fetches just its bytes: a
            // chunk is stored uncompressed and out of line, so the server reads only that slice
            // of it, not the whole 256 KiB. Sequential readers read and cache whole chunks.
            let within = offset - (offset / size) * size
            let part = try database.withConnection { db in
                try db.query(
                    "SELECT substring(data FROM $2::int FOR $3::int) AS part FROM chunks WHERE id = $1",
                    [.int(id), .int(within + 1), .int(end - offset)]
                ).first?.optionalData("part")
            }
            if let part, part.count == Int(end - offset) {
                counters.withLock {
                    $0.chunksRead += 1
                    $0.bytesRead += Int64(part.count)
                }
                return part
            }
            return nil
        }
        if !missing.isEmpty {
            // Chunks never change, so they need no snapshot; one the retention policy collected
            // since is missing, and the full read says what became of the version.
            let fetched = try database.withConnection { db in try self.chunks(db, missing) }
            guard missing.allSatisfy({ fetched[$0] != nil }) else { return nil }
            chunks.merge(fetched) { old, _ in old }
        }
        return try? assemble(offset: offset, end: end, map: map, chunks: chunks)
    }

    /// The bytes `offset..<end` of a file from its chunk map and chunks.
    private func assemble(offset: Int64, end: Int64, map: [Int64: Int64?], chunks: [Int64: Data]) throws
        -> Data
    {
        var result = Data(count: Int(end - offset))
        let size = Int64(chunkSize)
        for index in (offset / size)...((end - 1) / size) {
            guard let chunkID = map[index] ?? nil else { continue }  // a hole reads as zeros
            guard let chunk = chunks[chunkID] else {
                throw DocumentStoreError.corrupt(path: location, reason: "chunk \(chunkID) is missing")
            }
            let chunkStart = index * size
            let from = max(offset, chunkStart)
            let to = min(end, chunkStart + Int64(chunk.count))
            guard from < to else { continue }
            result.replaceSubrange(
                Int(from - offset)..<Int(to - offset),
                with: chunk[
                    chunk.startIndex + Int(from - chunkStart)..<chunk.startIndex + Int(to - chunkStart)])
        }
        return result
    }

    /// Chunk ids by index (nil for a hole) for indices `first...last` as of `lineage`.
    static func chunkMap(
        _ db: SQLConnection, node: StoreNodeID, lineage: Lineage, from first: Int64, through last: Int64
    ) throws -> [Int64: Int64?] {
        var map: [Int64: Int64?] = [:]
        let rows = try db.query(
            """
            SELECT DISTINCT ON (idx) idx, chunk FROM chunk_map
            WHERE node = $1 AND branch = 0 AND idx BETWEEN $2 AND $3 AND version <= $4
            ORDER BY idx, version DESC
            """,
            [.int(node.rawValue), .int(first), .int(last), .int(lineage.limit)])
        for row in rows { map[try row.int("idx")] = .some(try row.optionalInt("chunk")) }
        if lineage.branch != 0 {
            let branchRows = try db.query(
                """
                SELECT DISTINCT ON (idx) idx, chunk FROM chunk_map
                WHERE node = $1 AND branch = $2 AND idx BETWEEN $3 AND $4
                ORDER BY idx, version DESC
                """,
                [.int(node.rawValue), .int(lineage.branch), .int(first), .int(last)])
            for row in branchRows { map[try row.int("idx")] = .some(try row.optionalInt("chunk")) }
        }
        return map
    }

    /// Chunks' bytes by id, from the cache or the database in one query (counted).
    func chunks(_ db: SQLConnection, _ ids: Set<Int64>) throws -> [Int64: Data] {
        var result: [Int64: Data] = [:]
        var missing: [Int64] = []
        cache.withLock { cache in
            for id in ids {
                if let data = cache.get(id) { result[id] = data } else { missing.append(id) }
            }
        }
        guard !missing.isEmpty else { return result }
        let list = missing.map(String.init).joined(separator: ",")
        var read = (chunks: 0, bytes: Int64(0))
        for row in try db.query("SELECT id, data FROM chunks WHERE id = ANY('{\(list)}'::bigint[])") {
            let id = try row.int("id")
            let data = try row.optionalData("data") ?? Data()
            result[id] = data
            read.chunks += 1
            read.bytes += Int64(data.count)
            cache.withLock { $0.put(id, data) }
        }
        counters.withLock {
            $0.chunksRead += read.chunks
            $0.bytesRead += read.bytes
        }
        return result
    }

    func chunk(_ db: SQLConnection, _ id: Int64) throws -> Data {
        guard let data = try chunks(db, [id])[id] else {
            throw DocumentStoreError.corrupt(path: location, reason: "chunk \(id) is missing")
        }
        return data
    }

    /// Makes every save committed before the call durable, deferred ones included: a commit that
    /// waits for the flush of the server's log flushes everything logged before it.
    public func synchronize() throws {
        try database.transaction { db in
            // An id makes the commit write (and flush) a commit record; a read-only one would not.
            try db.query("SELECT pg_current_xact_id()")
        }
    }

    /// Drops cached chunks (for tests and benchmarks that measure cold reads).
    public func purgeCache() {
        cache.withLock { $0.removeAll() }
        pinned.withLock { $0.removeAll() }
    }

    // MARK: Saving

    public func makeNodeIDs(count: Int) throws -> [StoreNodeID] {
        try write { db in try Self.allocateNodeIDs(db, count: count) }
    }

    static func allocateNodeIDs(_ db: SQLConnection, count: Int) throws -> [StoreNodeID] {
        guard count > 0 else { return [] }
        guard
            let next = try db.scalar(
                "UPDATE store_meta SET value = value + $1 WHERE key = 'next_node' RETURNING value - $1",
                [.int(Int64(count))])
        else {
            throw DocumentStoreError.corrupt(path: "", reason: "the node counter is missing")
        }
        return (0..<Int64(count)).map { StoreNodeID(rawValue: next + $0) }
    }

    public func save(_ changes: DocumentChanges) throws -> SaveResult {
        try write(durable: changes.durable) { db in try self.save(db, changes) }
    }

    func save(_ db: SQLConnection, _ changes: DocumentChanges) throws -> SaveResult {
        let document = try Self.fetchDocument(db, changes.document)
        var conflict = false
        if changes.base != document.currentVersion {
            switch changes.conflictPolicy {
            case .fail:
                throw DocumentStoreError.conflict(
                    document: document.id, base: changes.base, current: document.currentVersion)
            case .keepBoth:
                conflict = true
            case .rebaseIfDisjoint:
                let touched = Set(
                    changes.nodes.map(\.id) + changes.removedNodes + Array(changes.contents.keys))
                conflict = try touched.contains { id in
                    try db.exists(
                        "SELECT 1 FROM nodes WHERE node = $1 AND branch = 0 AND version > $2 LIMIT 1",
                        [.int(id.rawValue), .int(changes.base.rawValue)])
                }
            }
        }
        let now = Timestamp.now
        let version = try Self.insertVersion(
            db, document: document.id, base: changes.base, origin: changes.origin, now: now)
        let branch: Int64 = conflict ? version.rawValue : 0
        if conflict {
            try db.query("UPDATE versions SET branch = id WHERE id = $1", [.int(version.rawValue)])
        }
        // The state the changes apply to: the base for a conflict, else the current version.
        let before = conflict ? Lineage(limit: changes.base.rawValue, branch: 0) : Lineage.current
        var written = (chunks: 0, bytes: Int64(0), nodes: 0)

        var records: [StoreNodeID: NodeRecord] = [:]
        for record in changes.nodes {
            guard record.document == document.id else {
                throw DocumentStoreError.invalidChange("\(record.id) belongs to another document")
            }
            records[record.id] = record
        }
        for (id, update) in changes.contents {
            let previous = try Self.node(db, id, lineage: before)
            guard var record = records[id] ?? previous else { throw DocumentStoreError.noSuchNode(id) }
            guard record.kind == .regularFile else { throw DocumentStoreError.notARegularFile(id) }
            let result = try writeContents(
                db, node: id, update: update,
                previousSize: previous?.kind == .regularFile ? previous?.size : nil,
                lineage: before, branch: branch, version: version)
            record.size = result.size
            written.chunks += result.chunks
            written.bytes += result.bytes
            records[id] = record
        }
        // What this save removes: the listed wrappers and their subtrees as they were before,
        // except wrappers the save keeps (moved out of a removed folder in the same save).
        var removed: [StoreNodeID: NodeRecord] = [:]
        if !changes.removedNodes.isEmpty {
            if let kept = changes.removedNodes.first(where: { records[$0] != nil }) {
                throw DocumentStoreError.invalidChange("\(kept) is both changed and removed")
            }
            let all = try Self.nodes(db, document: document.id, lineage: before)
            var children: [StoreNodeID: [StoreNodeID]] = [:]
            for record in all.values {
                if let parent = record.parent { children[parent, default: []].append(record.id) }
            }
            var frontier = changes.removedNodes
            var seen: Set<StoreNodeID> = []
            while let next = frontier.popLast() {
                guard seen.insert(next).inserted, records[next] == nil else { continue }
                if next == document.root {
                    throw DocumentStoreError.invalidChange("the document's root cannot be removed")
                }
                if let record = all[next] { removed[next] = record }
                frontier += children[next] ?? []
            }
        }
        try validate(db, records: records, removed: Set(removed.keys), document: document, lineage: before)
        for record in records.values {
            try Self.insertNode(db, record, branch: branch, version: version)
            written.nodes += 1
        }
        for record in removed.values {
            try Self.insertTombstone(db, record, branch: branch, version: version)
            written.nodes += 1
        }
        guard
            let versionRow = try db.query(
                "UPDATE versions SET bytes_written = $1 WHERE id = $2 RETURNING *",
                [.int(written.bytes), .int(version.rawValue)]
            ).first
        else { throw DocumentStoreError.noSuchVersion(version) }
        if !conflict {
            try db.query(
                "UPDATE documents SET current_version = $1, modified = $2 WHERE id = $3",
                [.int(version.rawValue), .int(now.rawValue), .int(document.id.rawValue)])
        }
        try Self.insertEvent(
            db, conflict ? .conflict : .saved, document: document.id, version: version, name: document.name,
            origin: changes.origin)
        counters.withLock {
            $0.chunksWritten += written.chunks
            $0.bytesWritten += written.bytes
            $0.nodesWritten += written.nodes
        }
        let info = try Self.version(versionRow)
        return SaveResult(
            version: info, chunksWritten: written.chunks, bytesWritten: written.bytes,
            nodesWritten: written.nodes)
    }

    /// Checks that changed records form a valid tree: parents exist and are directories, names are
    /// valid and unique among siblings.
    private func validate(
        _ db: SQLConnection, records: [StoreNodeID: NodeRecord], removed: Set<StoreNodeID>,
        document: DocumentInfo,
        lineage: Lineage
    ) throws {
        for record in records.values {
            if record.id == document.root {
                guard record.parent == nil else {
                    throw DocumentStoreError.invalidChange("the root cannot move")
                }
                continue
            }
            if let reason = FileName.problem(with: record.name) {
                throw DocumentStoreError.invalidName(record.name, reason: reason)
            }
            guard let parentID = record.parent else {
                throw DocumentStoreError.invalidChange("\(record.id) has no parent")
            }
            guard !removed.contains(parentID),
                let parent = try records[parentID] ?? Self.node(db, parentID, lineage: lineage),
                parent.document == document.id, parent.kind == .directory
            else {
                throw DocumentStoreError.invalidChange(
                    "the parent of \(record.name.debugDescription) is not a directory")
            }
            if record.kind == .symbolicLink && record.linkTarget == nil {
                throw DocumentStoreError.invalidChange(
                    "link \(record.name.debugDescription) has no destination")
            }
            // Another live wrapper with this name in this parent?
            let candidates = try db.query(
                "SELECT DISTINCT node FROM nodes WHERE parent = $1 AND name = $2 AND node != $3",
                [.int(parentID.rawValue), .text(record.name), .int(record.id.rawValue)]
            ).map { StoreNodeID(rawValue: try $0.int("node")) }
            for candidate in candidates where !removed.contains(candidate) {
                let current = try records[candidate] ?? Self.node(db, candidate, lineage: lineage)
                if let current, current.parent == parentID, current.name == record.name {
                    throw DocumentStoreError.invalidChange(
                        "\(record.name.debugDescription) already exists in its directory")
                }
            }
            if records.values.contains(where: {
                $0.id != record.id && $0.parent == parentID && $0.name == record.name
            }) {
                throw DocumentStoreError.invalidChange(
                    "two wrappers named \(record.name.debugDescription) in one directory")
            }
        }
    }

    /// Writes the chunks of a content update that differ from the previous ones. Chunks are read
    /// and written one at a time, so an update of any size holds about one chunk in memory.
    /// `previousSize` is nil when the node was not a regular file before (new, or re-added).
    private func writeContents(
        _ db: SQLConnection, node: StoreNodeID, update: ContentUpdate, previousSize: Int64?, lineage: Lineage,
        branch: Int64, version: VersionID
    ) throws -> (size: Int64, chunks: Int, bytes: Int64) {
        let size = Int64(chunkSize)
        // Rounds up without computing `bytes + size - 1`, which overflows near Int64.max.
        func chunkCount(_ bytes: Int64) -> Int64 { bytes / size + (bytes % size == 0 ? 0 : 1) }
        let newSize: Int64
        let indices: [Int64]?  // ascending and below the new end; nil for every chunk below it
        let bytesOf: (Int64) throws -> Data  // the new bytes of chunk `index`, none past the end
        switch update {
        case .chunks(let s, let given):
            guard s >= 0 else { throw DocumentStoreError.invalidChange("negative size") }
            for (index, data) in given {
                guard index >= 0 else {
                    throw DocumentStoreError.invalidChange("negative chunk index \(index)")
                }
                guard data.count <= chunkSize else {
                    throw DocumentStoreError.invalidChange("chunk \(index) is larger than the chunk size")
                }
            }
            newSize = s
            let count = chunkCount(s)
            indices = given.keys.map(Int64.init).filter { $0 < count }.sorted()
            bytesOf = { index in
                let data = given[Int(index)] ?? Data()
                // Bytes past the end of the file are not kept, so growing it later reads zeros.
                let keep = Int(min(Int64(data.count), s - index * size))
                return keep < data.count ? data.prefix(keep) : data
            }
        case .sparse(let s, let listed, let source):
            guard s >= 0 else { throw DocumentStoreError.invalidChange("negative size") }
            if let index = listed.first(where: { $0 < 0 }) {
                throw DocumentStoreError.invalidChange("negative chunk index \(index)")
            }
            newSize = s
            let count = chunkCount(s)
            indices = Set(listed.lazy.map(Int64.init).filter { $0 < count }).sorted()
            bytesOf = { index in
                let wanted = Int(min(size, s - index * size))
                let data = try source.read(offset: index * size, count: wanted)
                guard data.count <= wanted else {
                    throw DocumentStoreError.invalidChange(
                        "the contents source gave \(data.count) bytes for chunk \(index), more than \(wanted)"
                    )
                }
                return data
            }
        case .replace(let source):
            guard source.count >= 0 else { throw DocumentStoreError.invalidChange("negative size") }
            newSize = source.count
            indices = nil
            bytesOf = { index in
                let wanted = Int(min(size, newSize - index * size))
                let data = try source.read(offset: index * size, count: wanted)
                guard data.count == wanted else {
                    throw DocumentStoreError.invalidChange("the contents source ended early")
                }
                return data
            }
        }
        let newCount = chunkCount(newSize)
        // What a read sees so far, including this save's own rows (a conflict's are in its branch).
        let view = branch == 0 ? lineage : Lineage(limit: lineage.limit, branch: branch)
        var chunks = 0
        var bytes: Int64 = 0

        /// Makes chunk `index` hold `data`; an all-zero chunk is a hole. Bytes equal to what is
        /// there already (same hash, so the same chunk) write nothing.
        func put(_ index: Int64, _ data: Data) throws {
            var chunkID: Int64?
            if !SQLiteStore.isZero(data) {
                let (id, isNew) = try Self.storeChunk(db, data)
                chunkID = id
                if isNew {
                    chunks += 1
                    bytes += Int64(data.count)
                }
            }
            if try Self.chunkAt(db, node: node, lineage: view, index: index) == chunkID { return }
            try Self.insertChunkRow(
                db, node: node, branch: branch, index: index, version: version, chunk: chunkID)
        }

        // Chunks past the new end become holes, so that growing the file later reads zeros. A node
        // that was no file before (a removed file restored) may still have rows from its old life:
        // they all go, so that unlisted chunks read as zeros rather than as bytes from back then.
        let keptBelow = previousSize == nil ? 0 : newCount
        let stale = try Self.chunkMap(db, node: node, lineage: view, from: keptBelow, through: .max)
        for (index, chunk) in stale.sorted(by: { $0.key < $1.key }) where chunk != nil {
            try Self.insertChunkRow(
                db, node: node, branch: branch, index: index, version: version, chunk: nil)
        }
        if let indices {
            for index in indices { try put(index, bytesOf(index)) }
        } else {
            var index: Int64 = 0
            while index < newCount {
                try put(index, bytesOf(index))
                index += 1
            }
        }
        // A shrink that ends inside an unlisted chunk cuts that chunk at the new end.
        let last = newCount - 1
        if newSize < previousSize ?? 0, newSize % size != 0, let indices, indices.last != last,
            let old = try Self.chunkAt(db, node: node, lineage: view, index: last),
            let stored = try db.scalar("SELECT size FROM chunks WHERE id = $1", [.int(old)]),
            stored > newSize - last * size
        {
            try put(last, try chunk(db, old).prefix(Int(newSize - last * size)))
        }
        return (newSize, chunks, bytes)
    }

    /// The chunk at `index` as of `lineage`; nil for a hole, and where no row says anything (both
    /// read as zeros).
    static func chunkAt(_ db: SQLConnection, node: StoreNodeID, lineage: Lineage, index: Int64) throws
        -> Int64?
    {
        if lineage.branch != 0,
            let row = try db.query(
                """
                SELECT chunk FROM chunk_map WHERE node = $1 AND branch = $2 AND idx = $3
                ORDER BY version DESC LIMIT 1
                """,
                [.int(node.rawValue), .int(lineage.branch), .int(index)]
            ).first
        {
            return try row.optionalInt("chunk")
        }
        return try db.query(
            """
            SELECT chunk FROM chunk_map WHERE node = $1 AND branch = 0 AND idx = $2 AND version <= $3
            ORDER BY version DESC LIMIT 1
            """,
            [.int(node.rawValue), .int(index), .int(lineage.limit)]
        ).first?.optionalInt("chunk")
    }

    static func insertChunkRow(
        _ db: SQLConnection, node: StoreNodeID, branch: Int64, index: Int64, version: VersionID, chunk: Int64?
    ) throws {
        try db.query(
            """
            INSERT INTO chunk_map(node, branch, idx, version, chunk) VALUES ($1, $2, $3, $4, $5)
            ON CONFLICT (node, branch, idx, version) DO UPDATE SET chunk = EXCLUDED.chunk
            """,
            [.int(node.rawValue), .int(branch), .int(index), .int(version.rawValue), SQLValue(chunk)])
    }

    /// The id of the chunk holding `data`, inserting it if new.
    static func storeChunk(_ db: SQLConnection, _ data: Data) throws -> (Int64, Bool) {
        let hash = SQLiteStore.hash(data)
        if let id = try db.scalar("SELECT id FROM chunks WHERE hash = $1", [.bytes(hash)]) {
            return (id, false)
        }
        guard
            let id = try db.scalar(
                "INSERT INTO chunks(hash, size, data) VALUES ($1, $2, $3) RETURNING id",
                [.bytes(hash), SQLValue(data.count), .bytes(data)])
        else { throw DocumentStoreError.io("storing a chunk gave no id") }
        return (id, true)
    }

    static func insertVersion(
        _ db: SQLConnection, document: DocumentID, base: VersionID?, origin: String, now: Timestamp
    ) throws -> VersionID {
        guard
            let id = try db.scalar(
                "INSERT INTO versions(document, base, created, origin) VALUES ($1, $2, $3, $4) RETURNING id",
                [.int(document.rawValue), SQLValue(base?.rawValue), .int(now.rawValue), .text(origin)])
        else { throw DocumentStoreError.io("recording a version gave no id") }
        return VersionID(rawValue: id)
    }

    static func insertNode(_ db: SQLConnection, _ r: NodeRecord, branch: Int64, version: VersionID) throws {
        let kind: Int64
        switch r.kind {
        case .regularFile: kind = 0
        case .directory: kind = 1
        case .symbolicLink: kind = 2
        }
        try db.query(
            """
            INSERT INTO nodes(node, branch, version, document, parent, name, preferred_name, kind,
                permissions, uid, gid, mtime, ctime, atime, btime, size, link_target, xattrs, removed)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, 0)
            ON CONFLICT (node, branch, version) DO UPDATE SET document = EXCLUDED.document,
                parent = EXCLUDED.parent, name = EXCLUDED.name, preferred_name = EXCLUDED.preferred_name,
                kind = EXCLUDED.kind, permissions = EXCLUDED.permissions, uid = EXCLUDED.uid, gid = EXCLUDED.gid,
                mtime = EXCLUDED.mtime, ctime = EXCLUDED.ctime, atime = EXCLUDED.atime, btime = EXCLUDED.btime,
                size = EXCLUDED.size, link_target = EXCLUDED.link_target, xattrs = EXCLUDED.xattrs, removed = 0
            """,
            [
                .int(r.id.rawValue), .int(branch), .int(version.rawValue), .int(r.document.rawValue),
                SQLValue(r.parent?.rawValue), .text(r.name),
                SQLValue(r.preferredName == r.name ? nil : r.preferredName), .int(kind),
                SQLValue(r.permissions & 0o7777), .int(Int64(r.uid)), .int(Int64(r.gid)),
                .int(r.modified.rawValue), .int(r.changed.rawValue), .int(r.accessed.rawValue),
                .int(r.created.rawValue), .int(r.kind == .regularFile ? r.size : 0), SQLValue(r.linkTarget),
                SQLValue(r.extendedAttributes.isEmpty ? nil : XattrCoding.encode(r.extendedAttributes)),
            ])
    }

    static func insertTombstone(_ db: SQLConnection, _ r: NodeRecord, branch: Int64, version: VersionID)
        throws
    {
        try db.query(
            """
            INSERT INTO nodes(node, branch, version, document, parent, name, kind, permissions, uid, gid,
                mtime, ctime, atime, btime, size, removed)
            VALUES ($1, $2, $3, $4, $5, $6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)
            ON CONFLICT (node, branch, version) DO UPDATE SET parent = EXCLUDED.parent, name = EXCLUDED.name,
                kind = 0, permissions = 0, uid = 0, gid = 0, mtime = 0, ctime = 0, atime = 0, btime = 0, size = 0,
                preferred_name = NULL, link_target = NULL, xattrs = NULL, removed = 1
            """,
            [
                .int(r.id.rawValue), .int(branch), .int(version.rawValue), .int(r.document.rawValue),
                SQLValue(r.parent?.rawValue), .text(r.name),
            ])
    }

    /// Records an event and notifies listeners; PostgreSQL delivers the notification at commit,
    /// and only if the transaction commits.
    static func insertEvent(
        _ db: SQLConnection, _ kind: StoreEvent.Kind, document: DocumentID, version: VersionID?, name: String,
        origin: String
    ) throws {
        // pg_notify is NOTIFY (delivered at commit), in the same statement as the event.
        try db.query(
            """
            WITH event AS (
                INSERT INTO events(kind, document, version, name, origin, time) VALUES ($1, $2, $3, $4, $5, $6)
                RETURNING sequence)
            SELECT pg_notify('\(PostgresSchema.channel)', '') FROM event
            """,
            [
                .text(kind.rawValue), .int(document.rawValue), SQLValue(version?.rawValue), .text(name),
                .text(origin), .int(Timestamp.now.rawValue),
            ])
    }

    // MARK: Versions

    public func versions(of document: DocumentID) throws -> [VersionInfo] {
        try read { db in
            _ = try Self.fetchDocument(db, document)
            return try db.query(
                "SELECT * FROM versions WHERE document = $1 ORDER BY id", [.int(document.rawValue)]
            )
            .map(Self.version)
        }
    }

    static func version(_ db: SQLConnection, _ id: VersionID) throws -> VersionInfo {
        guard let row = try db.query("SELECT * FROM versions WHERE id = $1", [.int(id.rawValue)]).first else {
            throw DocumentStoreError.noSuchVersion(id)
        }
        return try version(row)
    }

    static func version(_ row: SQLRow) throws -> VersionInfo {
        VersionInfo(
            id: VersionID(rawValue: try row.int("id")),
            document: DocumentID(rawValue: try row.int("document")),
            base: try row.optionalInt("base").map(VersionID.init(rawValue:)),
            created: Timestamp(rawValue: try row.int("created")),
            origin: try row.string("origin"), isConflict: try row.int("branch") != 0,
            isResolved: try row.int("resolved") != 0,
            bytesWritten: try row.int("bytes_written"))
    }

    public func restore(_ version: VersionID, of document: DocumentID, origin: String = "restore") throws
        -> SaveResult
    {
        try write { db in
            let info = try Self.version(db, version)
            guard info.document == document else { throw DocumentStoreError.noSuchVersion(version) }
            let doc = try Self.fetchDocument(db, document)
            let targetLineage = try Self.lineage(db, version)
            let target = try Self.nodes(db, document: document, lineage: targetLineage)
            let current = try Self.nodes(db, document: document, lineage: .current)
            var changes = DocumentChanges(document: document, base: doc.currentVersion)
            changes.origin = origin
            changes.conflictPolicy = .fail
            for (id, record) in target {
                var unchanged = record
                unchanged.version = current[id]?.version ?? unchanged.version
                if current[id] != unchanged { changes.nodes.append(record) }
                guard record.kind == .regularFile else { continue }
                // Only files whose chunks differ are read and compared: a restore costs the change.
                if let now = current[id], now.kind == .regularFile, now.size == record.size {
                    let last = max(0, (record.size - 1) / Int64(chunkSize))
                    let then = try Self.chunkMap(db, node: id, lineage: targetLineage, from: 0, through: last)
                    let present = try Self.chunkMap(db, node: id, lineage: .current, from: 0, through: last)
                    if then.mapValues({ $0 ?? -1 }).filter({ $0.value != -1 })
                        == present.mapValues({ $0 ?? -1 }).filter({ $0.value != -1 })
                    {
                        continue
                    }
                }
                // Old versions never change, so another connection may read them meanwhile.
                changes.contents[id] = .replace(
                    StoreContentsSource(store: self, node: id, version: version, count: record.size))
            }
            changes.removedNodes = current.keys.filter { target[$0] == nil }
            var result = try self.save(db, changes)
            try db.query(
                "UPDATE events SET kind = 'restored' WHERE sequence = (SELECT MAX(sequence) FROM events)")
            result.version = try Self.version(db, result.version.id)
            return result
        }
    }

    public func resolveConflict(_ version: VersionID) throws {
        try write { db in
            let info = try Self.version(db, version)
            guard info.isConflict, !info.isResolved else { return }  // FV-2: not a conflict, or resolved
            try db.query("UPDATE versions SET resolved = 1 WHERE id = $1", [.int(version.rawValue)])
            let document = try Self.fetchDocument(db, info.document)
            try Self.insertEvent(
                db, .resolved, document: info.document, version: version, name: document.name, origin: "resolve")
        }
    }

    public func unresolvedConflicts() throws -> [VersionInfo] {
        try read { db in
            try db.query(
                """
                SELECT versions.* FROM versions JOIN documents ON documents.id = versions.document
                WHERE versions.branch <> 0 AND versions.resolved = 0 AND documents.deleted IS NULL
                ORDER BY versions.id
                """
            )
            .map(Self.version)
        }
    }

    // MARK: Retention

    public func collectGarbage(_ policy: RetentionPolicy) throws -> CollectionReport {
        // Versions it drops must not be read from memory afterwards.
        pinned.withLock { $0.removeAll() }
        return try write { db in
            var report = CollectionReport()
            let now = Timestamp.now
            let keep = policy.keepFor.components
            let horizon = now.rawValue - keep.seconds * 1_000_000_000 - keep.attoseconds / 1_000_000_000
            for row in try db.query("SELECT id, deleted FROM documents") {
                let document = DocumentID(rawValue: try row.int("id"))
                if let deleted = try row.optionalInt("deleted"), deleted < horizon {
                    try Self.removeDocument(db, document)
                    report.documentsRemoved += 1
                    continue
                }
                report.versionsRemoved += try Self.pruneVersions(
                    db, document, policy: policy, horizon: horizon)
            }
            let unreferenced = try db.query(
                """
                DELETE FROM chunks WHERE NOT EXISTS (SELECT 1 FROM chunk_map WHERE chunk = chunks.id)
                RETURNING size
                """)
            for row in unreferenced {
                report.chunksRemoved += 1
                report.bytesFreed += try row.int("size")
            }
            try db.query(
                "DELETE FROM events WHERE time < $1", [.int(now.rawValue - 7 * 24 * 3600 * 1_000_000_000)])
            return report
        }
    }

    private static func removeDocument(_ db: SQLConnection, _ document: DocumentID) throws {
        let d = SQLValue.int(document.rawValue)
        try db.query(
            "DELETE FROM chunk_map WHERE node IN (SELECT DISTINCT node FROM nodes WHERE document = $1)", [d])
        try db.query("DELETE FROM nodes WHERE document = $1", [d])
        try db.query("DELETE FROM versions WHERE document = $1", [d])
        try db.query("DELETE FROM documents WHERE id = $1", [d])
    }

    /// Drops main-line versions older than the policy keeps, folding their rows into the oldest
    /// kept version; returns how many were dropped.
    private static func pruneVersions(
        _ db: SQLConnection, _ document: DocumentID, policy: RetentionPolicy, horizon: Int64
    ) throws -> Int {
        let d = SQLValue.int(document.rawValue)
        let mainline = try db.query(
            "SELECT id, created FROM versions WHERE document = $1 AND branch = 0 ORDER BY id DESC", [d]
        ).map { (id: try $0.int("id"), created: try $0.int("created")) }
        guard mainline.count > policy.keepLast else { return 0 }
        var keep = mainline.prefix(policy.keepLast).map(\.id)
        keep += mainline.dropFirst(policy.keepLast).filter { $0.created >= horizon }.map(\.id)
        var cutoff = keep.min() ?? 0
        // An unresolved conflict version reads the main line as of its base: keep that.
        if let base = try db.scalar(
            "SELECT MIN(base) FROM versions WHERE document = $1 AND branch != 0 AND resolved = 0", [d])
        {
            cutoff = min(cutoff, base)
        }
        // Resolved conflict versions go, with their rows.
        let resolved = try db.query(
            "SELECT id FROM versions WHERE document = $1 AND branch != 0 AND resolved = 1", [d]
        ).map { try $0.int("id") }
        for branch in resolved {
            try db.query("DELETE FROM chunk_map WHERE branch = $1", [.int(branch)])
            try db.query("DELETE FROM nodes WHERE branch = $1", [.int(branch)])
            try db.query("DELETE FROM versions WHERE id = $1", [.int(branch)])
        }
        // Rows superseded at or before the cutoff are invisible to every kept version.
        try db.query(
            """
            DELETE FROM chunk_map WHERE branch = 0 AND version < $1
              AND node IN (SELECT DISTINCT node FROM nodes WHERE document = $2)
              AND EXISTS (SELECT 1 FROM chunk_map c2 WHERE c2.node = chunk_map.node AND c2.branch = 0
                          AND c2.idx = chunk_map.idx AND c2.version > chunk_map.version AND c2.version <= $1)
            """,
            [.int(cutoff), d])
        try db.query(
            """
            DELETE FROM nodes WHERE document = $2 AND branch = 0 AND version < $1
              AND EXISTS (SELECT 1 FROM nodes n2 WHERE n2.node = nodes.node AND n2.branch = 0
                          AND n2.version > nodes.version AND n2.version <= $1)
            """,
            [.int(cutoff), d])
        // Wrappers removed at or before the cutoff are gone from every kept version.
        let gone = try db.query(
            "SELECT node FROM nodes WHERE document = $1 AND branch = 0 AND version <= $2 AND removed = 1",
            [d, .int(cutoff)]
        ).map { try $0.int("node") }
        for node in gone {
            if try db.exists(
                "SELECT 1 FROM nodes WHERE node = $1 AND branch = 0 AND version > $2",
                [.int(node), .int(cutoff)])
            {
                continue
            }
            try db.query("DELETE FROM chunk_map WHERE node = $1 AND branch = 0", [.int(node)])
            try db.query("DELETE FROM nodes WHERE node = $1 AND branch = 0", [.int(node)])
        }
        let removed = try db.query(
            "DELETE FROM versions WHERE document = $1 AND branch = 0 AND id < $2 RETURNING id",
            [d, .int(cutoff)]
        ).count
        return removed + resolved.count
    }

    // MARK: Events

    public func events(after sequence: Int64) throws -> [StoreEvent] {
        try database.withConnection { db in
            try db.query("SELECT * FROM events WHERE sequence > $1 ORDER BY sequence", [.int(sequence)])
                .compactMap {
                    row -> StoreEvent? in
                    guard let kind = StoreEvent.Kind(rawValue: try row.string("kind")) else { return nil }
                    return StoreEvent(
                        sequence: try row.int("sequence"), kind: kind,
                        document: DocumentID(rawValue: try row.int("document")),
                        version: try row.optionalInt("version").map(VersionID.init(rawValue:)),
                        name: try row.string("name"), origin: try row.string("origin"))
                }
        }
    }

    public func latestEventSequence() throws -> Int64 {
        try database.withConnection { db in try db.scalar("SELECT MAX(sequence) FROM events") ?? 0 }
    }

    // MARK: Change notifications

    public var changeGeneration: UInt64 { listener.start() }

    public func waitForChange(after generation: UInt64, timeout: Duration) -> UInt64 {
        listener.wait(after: generation, timeout: timeout)
    }
}

extension PostgresStore {
    /// Creates `configuration`'s database on its server unless it exists, connecting to the
    /// server's `postgres` database to do so; returns whether it created it.
    @discardableResult
    public static func createDatabase(
        _ configuration: Configuration, logger: Logger = Logger(label: "docfs.postgres")
    )
        throws -> Bool
    {
        let admin = PostgresDatabase(
            configuration: try configuration.with(database: "postgres").connectionConfiguration(),
            location: configuration.with(database: "postgres").url, timeout: configuration.timeout,
            logger: logger)
        return try admin.withConnection { db in
            if try db.exists("SELECT 1 FROM pg_database WHERE datname = $1", [.text(configuration.database)])
            {
                return false
            }
            do {
                try db.query("CREATE DATABASE \(quotedIdentifier(configuration.database))")
            } catch let error as PSQLError where error.serverInfo?[.sqlState] == "42P04" {
                return false  // created meanwhile by someone else
            }
            return true
        }
    }

    /// Drops `configuration`'s database, closing every connection to it (for tests).
    public static func dropDatabase(
        _ configuration: Configuration, logger: Logger = Logger(label: "docfs.postgres")
    )
        throws
    {
        let admin = PostgresDatabase(
            configuration: try configuration.with(database: "postgres").connectionConfiguration(),
            location: configuration.with(database: "postgres").url, timeout: configuration.timeout,
            logger: logger)
        try admin.withConnection { db in
            try db.query("DROP DATABASE IF EXISTS \(quotedIdentifier(configuration.database)) WITH (FORCE)")
        }
    }

    /// `name` as an SQL identifier in double quotes.
    static func quotedIdentifier(_ name: String) -> String {
        "\"" + name.replacingOccurrences(of: "\"", with: "\"\"") + "\""
    }
}

/// A file at a saved version.
struct PinnedKey: Hashable {
    var node: StoreNodeID
    var version: VersionID
}

/// What reads at a saved version learned of a file: its size, and chunk ids (nil for a hole) of
/// the indices read.
struct PinnedFile {
    var size: Int64
    var map: [Int64: Int64?]
    /// Where the last read of it ended (a read starting there is sequential).
    var lastEnd: Int64 = -1
}

/// The files reads at saved versions learned, bounded: about 8 MB of chunk-map entries (enough
/// for some 60 GiB of 256 KiB chunks), then it starts over.
struct PinnedFiles {
    static let maxFiles = 50_000
    static let maxEntries = 250_000

    private(set) var files: [PinnedKey: PinnedFile] = [:]
    private var entries = 0

    mutating func learn(_ key: PinnedKey, size: Int64, map: [Int64: Int64?]) {
        if files.count >= Self.maxFiles || entries + map.count > Self.maxEntries { removeAll() }
        var file = files[key] ?? PinnedFile(size: size, map: [:])
        let before = file.map.count
        file.map.merge(map) { _, new in new }
        entries += file.map.count - before
        files[key] = file
    }

    /// The file as it was before this read, which ends at `end`.
    mutating func reading(_ key: PinnedKey, until end: Int64) -> PinnedFile? {
        guard let file = files[key] else { return nil }
        files[key]?.lastEnd = end
        return file
    }

    mutating func removeAll() {
        files.removeAll()
        entries = 0
    }
}
