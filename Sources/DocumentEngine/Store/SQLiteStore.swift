import Crypto
import Foundation
import GRDB
import GRDBSQLite
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// The embedded document store: one SQLite file (WAL), shared safely by several processes.
///
/// Contents are fixed-size chunks stored once per SHA-256 (shared between wrappers, documents and
/// versions). Every save is one IMMEDIATE transaction that writes only the chunks and wrapper
/// rows that changed, and is a version (see ``SQLiteSchema`` for the history model). Listing reads
/// no contents; ranged reads read only the chunks that cover the range.
public final class SQLiteStore: DocumentStore, Sendable {
    /// How to open a store.
    public struct OpenOptions: OptionSet, Sendable {
        public let rawValue: Int
        public init(rawValue: Int) { self.rawValue = rawValue }
        /// Create the store (mode 0600) if there is no file at the path.
        public static let create = OpenOptions(rawValue: 1)
    }

    /// The default chunk size: small enough that a small edit costs little, large enough that a
    /// sequential read is a few thousand lookups per GiB.
    public static let defaultChunkSize = 256 * 1024

    /// The store file's path.
    public let path: String
    public var location: String { path }
    public let chunkSize: Int
    let pool: DatabasePool
    private let counters = Mutex(StoreStatistics())
    /// Whether the writer connection may still be at `synchronous = NORMAL` after a deferred save.
    private let writerMayBeRelaxed = Atomic(false)
    private let cache: Mutex<ChunkCache>

    public var statistics: StoreStatistics { counters.withLock { $0 } }

    /// Opens the store at `path`, creating it with `options: .create` (and `chunkSize`) if missing.
    ///
    /// A missing, empty, truncated, foreign or damaged file, or one written by a newer DocFS, is
    /// refused with a ``DocumentStoreError`` that names the problem.
    public init(path: String, options: OpenOptions = [], chunkSize: Int = SQLiteStore.defaultChunkSize) throws
    {
        self.path = path
        let isNew = try Self.prepareFile(path: path, create: options.contains(.create))
        var configuration = Configuration()
        configuration.busyMode = .timeout(30)
        configuration.label = "docfs.store"
        do {
            pool = try DatabasePool(path: path, configuration: configuration)
            // FULL: a committed save survives power loss, which fsync's contract needs. Set here,
            // not in prepareDatabase: GRDB sets the writer to NORMAL when it turns WAL on, after
            // prepareDatabase ran. Only the writer commits, so only its setting matters.
            try pool.writeWithoutTransaction { try $0.execute(sql: "PRAGMA synchronous = FULL") }
        } catch {
            throw Self.storeError(error, path: path)
        }
        var storedChunkSize = chunkSize
        do {
            let migrator = SQLiteSchema.migrator(chunkSize: chunkSize)
            try pool.write { db in
                if try migrator.hasBeenSuperseded(db) {
                    throw DocumentStoreError.newerFormat(
                        path: path, found: SQLiteSchema.formatVersion + 1,
                        supported: SQLiteSchema.formatVersion)
                }
                if !isNew {
                    let applicationID = try Int32.fetchOne(db, sql: "PRAGMA application_id") ?? 0
                    let applied = try migrator.appliedIdentifiers(db)
                    if applicationID != SQLiteSchema.applicationID || applied.isEmpty {
                        throw DocumentStoreError.notAStore(path: path, reason: "it has no DocFS schema")
                    }
                }
            }
            try migrator.migrate(pool)
            storedChunkSize = try pool.read { db -> Int in
                guard
                    let format = try Int.fetchOne(
                        db, sql: "SELECT value FROM store_meta WHERE key = 'format'"),
                    let size = try Int.fetchOne(
                        db, sql: "SELECT value FROM store_meta WHERE key = 'chunk_size'"),
                    size > 0, size <= 64 << 20
                else {
                    throw DocumentStoreError.corrupt(path: path, reason: "the store's metadata is missing")
                }
                if format > SQLiteSchema.formatVersion {
                    throw DocumentStoreError.newerFormat(
                        path: path, found: format, supported: SQLiteSchema.formatVersion)
                }
                return size
            }
        } catch {
            throw Self.storeError(error, path: path)
        }
        self.chunkSize = storedChunkSize
        cache = Mutex(ChunkCache(capacity: ChunkCache.storeCapacity))
        if isNew {
            // Put the header (with the application id) into the file itself, not just the log.
            _ = try? pool.writeWithoutTransaction { try $0.checkpoint(.truncate) }
        }
    }

    /// Creates (0600) or checks the file before SQLite opens it; returns whether it is new.
    private static func prepareFile(path: String, create: Bool) throws -> Bool {
        var st = stat()
        if stat(path, &st) != 0 {
            guard errno == ENOENT else {
                throw DocumentStoreError.io(
                    "cannot open the store \(path): \(String(cString: strerror(errno)))")
            }
            guard create else { throw DocumentStoreError.notAStore(path: path, reason: "no such file") }
            let fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0o600)
            guard fd >= 0 else { throw systemError(errno, path: path, doing: "create") }
            close(fd)
            return true
        }
        guard (st.st_mode & S_IFMT) == S_IFREG else {
            throw DocumentStoreError.notAStore(path: path, reason: "it is not a regular file")
        }
        if st.st_size == 0 {
            if create { return true }
            throw DocumentStoreError.notAStore(path: path, reason: "the file is empty")
        }
        guard let handle = FileHandle(forReadingAtPath: path) else {
            throw DocumentStoreError.io("cannot read the store \(path): permission denied")
        }
        defer { try? handle.close() }
        let header = (try? handle.read(upToCount: 100)) ?? Data()
        guard header.count >= 16, header.prefix(16) == Data("SQLite format 3\0".utf8) else {
            throw DocumentStoreError.notAStore(path: path, reason: "it is not an SQLite database")
        }
        guard header.count == 100 else {
            throw DocumentStoreError.corrupt(
                path: path, reason: "the file is truncated (\(st.st_size) bytes)")
        }
        let applicationID = header[68..<72].reduce(0) { $0 << 8 | Int32($1) }
        if applicationID == SQLiteSchema.applicationID { return false }
        // 0 in the file's header: another application's database, or a DocFS store whose header
        // is still only in the write-ahead log. Ask a read-only connection, so that a foreign file
        // is never switched to WAL or otherwise touched.
        if applicationID == 0 {
            var readOnly = Configuration()
            readOnly.readonly = true
            let probed = try? DatabaseQueue(path: path, configuration: readOnly).read { db in
                try Int32.fetchOne(db, sql: "PRAGMA application_id")
            }
            if probed == SQLiteSchema.applicationID { return false }
        }
        throw DocumentStoreError.notAStore(path: path, reason: "it is another application's SQLite database")
    }

    /// Turns SQLite's errors into ones that name the problem. `systemErrno` is the connection's
    /// `sqlite3_system_errno`, which tells a full disk among I/O errors.
    static func storeError(_ error: any Error, path: String, systemErrno: Int32 = 0) -> any Error {
        guard let error = error as? DatabaseError else { return error }
        switch error.resultCode {
        case .SQLITE_NOTADB:
            return DocumentStoreError.notAStore(path: path, reason: "it is not an SQLite database")
        case .SQLITE_CORRUPT:
            return DocumentStoreError.corrupt(path: path, reason: error.message ?? "malformed database")
        case .SQLITE_FULL: return DocumentStoreError.noSpace(path)
        // Growing the -shm file or syncing reports the errno only as SQLITE_IOERR.
        case .SQLITE_IOERR where systemErrno == ENOSPC || systemErrno == EDQUOT:
            return DocumentStoreError.noSpace(path)
        case .SQLITE_READONLY, .SQLITE_PERM, .SQLITE_CANTOPEN:
            return DocumentStoreError.io(
                "cannot open the store \(path): \(error.message ?? "permission denied")")
        default: return error
        }
    }

    func read<T>(_ body: (Database) throws -> T) throws -> T {
        do { return try pool.read(body) } catch { throw Self.storeError(error, path: path) }
    }

    /// An error for a system call on the store's files that failed with `code`.
    static func systemError(_ code: Int32, path: String, doing what: String) -> DocumentStoreError {
        if code == ENOSPC || code == EDQUOT { return .noSpace(path) }
        return .io("cannot \(what) the store \(path): \(String(cString: strerror(code)))")
    }

    // The statements a save or a read runs every time are cached statements: compiling them
    // again for each save took a fifth of the daemon's CPU when every close saved (issue 7, B5).

    /// Runs `body` in one IMMEDIATE transaction. A durable one commits with `synchronous = FULL`
    /// (it is on disk when this returns); otherwise with NORMAL, which in WAL mode commits
    /// atomically and survives the process, but reaches the disk only at the next checkpoint,
    /// durable commit or ``synchronize()``.
    func write<T>(durable: Bool = true, _ body: (Database) throws -> T) throws -> T {
        do {
            return try pool.writeWithoutTransaction { db in
                do {
                    // The pragma fails inside a transaction, hence no `pool.write` here. It takes
                    // effect when it is compiled, so it is never a cached (reused) statement.
                    if !durable || writerMayBeRelaxed.load(ordering: .acquiring) {
                        try db.execute(sql: "PRAGMA synchronous = \(durable ? "FULL" : "NORMAL")")
                        if durable { writerMayBeRelaxed.store(false, ordering: .releasing) }
                    }
                    defer { if !durable { restoreFullSynchronous(db) } }
                    var result: T?
                    try db.inTransaction(.immediate) {
                        result = try body(db)
                        return .commit
                    }
                    guard let result else {
                        throw DocumentStoreError.io("a transaction on \(path) gave no result")
                    }
                    return result
                } catch {
                    let systemErrno = db.sqliteConnection.map { sqlite3_system_errno($0) } ?? 0
                    throw Self.storeError(error, path: path, systemErrno: systemErrno)
                }
            }
        } catch {
            throw Self.storeError(error, path: path)
        }
    }

    /// Puts the writer connection back to `synchronous = FULL` after a deferred transaction,
    /// whether it committed or not.
    private func restoreFullSynchronous(_ db: Database) {
        // A failed COMMIT can leave the transaction open; the pragma would fail inside it, and
        // GRDB traps on a transaction left open at the end of an access.
        if db.isInsideTransaction { try? db.rollback() }
        do { try db.execute(sql: "PRAGMA synchronous = FULL") } catch {
            // The next write retries before it commits anything.
            writerMayBeRelaxed.store(true, ordering: .releasing)
        }
    }

    // MARK: Documents

    public func documents() throws -> [DocumentInfo] {
        try read { db in
            try Row.fetchAll(db, sql: "SELECT * FROM documents WHERE deleted IS NULL ORDER BY name").map(
                Self.document)
        }
    }

    public func deletedDocuments() throws -> [DocumentInfo] {
        try read { db in
            try Row.fetchAll(db, sql: "SELECT * FROM documents WHERE deleted IS NOT NULL ORDER BY deleted")
                .map(Self.document)
        }
    }

    public func document(_ id: DocumentID) throws -> DocumentInfo {
        try read { db in try Self.fetchDocument(db, id) }
    }

    public func document(named name: String) throws -> DocumentInfo? {
        try read { db in
            try Row.fetchOne(
                db.cachedStatement(sql: "SELECT * FROM documents WHERE name = ? AND deleted IS NULL"),
                arguments: [name]
            )
            .map(Self.document)
        }
    }

    static func fetchDocument(_ db: Database, _ id: DocumentID) throws -> DocumentInfo {
        guard
            let row = try Row.fetchOne(
                db.cachedStatement(sql: "SELECT * FROM documents WHERE id = ?"), arguments: [id.rawValue])
        else {
            throw DocumentStoreError.noSuchDocument(id.description)
        }
        return try document(row)
    }

    static func document(_ row: Row) throws -> DocumentInfo {
        DocumentInfo(
            id: DocumentID(rawValue: try row.stored("id")), name: try row.stored("name"),
            type: try row.stored("type"),
            kind: DocumentKind(rawValue: try row.stored("kind")) ?? .package,
            root: StoreNodeID(rawValue: try row.stored("root")),
            currentVersion: VersionID(rawValue: try row.stored("current_version")),
            created: Timestamp(rawValue: try row.stored("created")),
            modified: Timestamp(rawValue: try row.stored("modified")))
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
            try db.execute(
                sql: """
                    INSERT INTO documents(name, type, kind, root, current_version, created, modified)
                    VALUES (?, ?, ?, ?, 0, ?, ?)
                    """,
                arguments: [
                    name, type ?? Self.typeIdentifier(forName: name), kind.rawValue, root.rawValue,
                    now.rawValue, now.rawValue,
                ])
            let document = DocumentID(rawValue: db.lastInsertedRowID)
            let version = try Self.insertVersion(db, document: document, base: nil, origin: origin, now: now)
            let record = NodeRecord(
                id: root, document: document, parent: nil, name: name,
                kind: kind == .package ? .directory : .regularFile,
                permissions: permissions ?? (kind == .package ? 0o755 : 0o644), modified: now)
            try Self.insertNode(db, record, branch: 0, version: version)
            try db.execute(
                sql: "UPDATE documents SET current_version = ? WHERE id = ?",
                arguments: [version.rawValue, document.rawValue])
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
            try db.execute(
                sql: "UPDATE documents SET name = ?, modified = ? WHERE id = ?",
                arguments: [name, Timestamp.now.rawValue, id.rawValue])
            try Self.insertEvent(
                db, .renamed, document: id, version: current.currentVersion, name: name, origin: "")
            return try Self.fetchDocument(db, id)
        }
    }

    public func deleteDocument(_ id: DocumentID, origin: String = "") throws {
        try write { db in
            let current = try Self.fetchDocument(db, id)
            try db.execute(
                sql: "UPDATE documents SET deleted = ? WHERE id = ? AND deleted IS NULL",
                arguments: [Timestamp.now.rawValue, id.rawValue])
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
            try db.execute(
                sql: "UPDATE documents SET deleted = NULL, name = ? WHERE id = ?",
                arguments: [newName, id.rawValue])
            try Self.insertEvent(
                db, .restored, document: id, version: current.currentVersion, name: newName, origin: "")
            return try Self.fetchDocument(db, id)
        }
    }

    /// Throws unless no live document other than `except` is named `name`.
    static func requireFreeName(_ db: Database, _ name: String, except id: DocumentID? = nil) throws {
        let taken = try Bool.fetchOne(
            db, sql: "SELECT 1 FROM documents WHERE name = ? AND deleted IS NULL AND id != ?",
            arguments: [name, id?.rawValue ?? -1])
        if taken == true { throw DocumentStoreError.documentExists(name) }
    }

    static func validateDocumentName(_ name: String) throws {
        if let reason = FileName.problem(with: name) {
            throw DocumentStoreError.invalidName(name, reason: reason)
        }
    }

    /// A type identifier from the name's extension, for documents created without one.
    package static func typeIdentifier(forName name: String) -> String {
        let ext = (name as NSString).pathExtension.lowercased()
        switch ext {
        case "": return "public.data"
        case "txt", "text": return "public.plain-text"
        case "md", "markdown": return "net.daringfireball.markdown"
        case "rtf": return "public.rtf"
        case "rtfd": return "com.apple.rtfd"
        case "png": return "public.png"
        case "jpg", "jpeg": return "public.jpeg"
        case "json": return "public.json"
        case "plist": return "com.apple.property-list"
        default: return "dyn.docfs.\(ext)"
        }
    }

    // MARK: Reading wrappers

    /// Which rows make up a version: the main line up to `limit`, plus a conflict branch on top.
    struct Lineage {
        var limit: Int64
        var branch: Int64

        static let current = Lineage(limit: .max, branch: 0)
    }

    static func lineage(_ db: Database, _ version: VersionID?) throws -> Lineage {
        guard let version else { return .current }
        guard
            let row = try Row.fetchOne(
                db.cachedStatement(sql: "SELECT base, branch FROM versions WHERE id = ?"),
                arguments: [version.rawValue])
        else { throw DocumentStoreError.noSuchVersion(version) }
        let branch: Int64 = try row.stored("branch")
        if branch == 0 { return Lineage(limit: version.rawValue, branch: 0) }
        return Lineage(limit: try row.stored("base", as: Int64?.self) ?? 0, branch: branch)
    }

    public func nodes(of document: DocumentID, at version: VersionID? = nil) throws -> [NodeRecord] {
        try read { db in
            _ = try Self.fetchDocument(db, document)
            return try Self.nodes(db, document: document, lineage: Self.lineage(db, version)).values
                .sorted { $0.id < $1.id }
        }
    }

    /// The live records of a document as of `lineage`.
    static func nodes(_ db: Database, document: DocumentID, lineage: Lineage) throws -> [StoreNodeID:
        NodeRecord]
    {
        var result: [StoreNodeID: NodeRecord] = [:]
        var removed: Set<StoreNodeID> = []
        let rows = try Row.fetchCursor(
            db,
            sql: """
                SELECT n.* FROM nodes n
                JOIN (SELECT node, MAX(version) AS v FROM nodes
                      WHERE document = ? AND branch = 0 AND version <= ? GROUP BY node) latest
                  ON n.node = latest.node AND n.branch = 0 AND n.version = latest.v
                """,
            arguments: [document.rawValue, lineage.limit])
        var columns: NodeColumns?
        while let row = try rows.next() {
            let c = try columns ?? NodeColumns(row)
            columns = c
            let id = StoreNodeID(rawValue: try row.stored(c.node, "node"))
            if try row.stored(c.removed, "removed", as: Int64.self) != 0 {
                removed.insert(id)
            } else {
                result[id] = try record(row, c)
            }
        }
        if lineage.branch != 0 {
            let branchRows = try Row.fetchCursor(
                db, sql: "SELECT * FROM nodes WHERE document = ? AND branch = ?",
                arguments: [document.rawValue, lineage.branch])
            var branchColumns: NodeColumns?
            while let row = try branchRows.next() {
                let c = try branchColumns ?? NodeColumns(row)
                branchColumns = c
                let id = StoreNodeID(rawValue: try row.stored(c.node, "node"))
                if try row.stored(c.removed, "removed", as: Int64.self) != 0 {
                    result[id] = nil
                } else {
                    result[id] = try record(row, c)
                }
            }
        }
        return result
    }

    public func node(_ id: StoreNodeID, at version: VersionID? = nil) throws -> NodeRecord? {
        try read { db in try Self.node(db, id, lineage: Self.lineage(db, version)) }
    }

    static func node(_ db: Database, _ id: StoreNodeID, lineage: Lineage) throws -> NodeRecord? {
        if lineage.branch != 0,
            let row = try Row.fetchOne(
                db.cachedStatement(
                    sql: "SELECT * FROM nodes WHERE node = ? AND branch = ? ORDER BY version DESC LIMIT 1"),
                arguments: [id.rawValue, lineage.branch])
        {
            return try row.stored("removed", as: Int64.self) != 0 ? nil : try record(row)
        }
        guard
            let row = try Row.fetchOne(
                db.cachedStatement(
                    sql:
                        "SELECT * FROM nodes WHERE node = ? AND branch = 0 AND version <= ? ORDER BY version DESC LIMIT 1"
                ),
                arguments: [id.rawValue, lineage.limit])
        else { return nil }
        return try row.stored("removed", as: Int64.self) != 0 ? nil : try record(row)
    }

    static func record(_ row: Row) throws -> NodeRecord {
        try record(row, NodeColumns(row))
    }

    static func record(_ row: Row, _ c: NodeColumns) throws -> NodeRecord {
        let node: Int64 = try row.stored(c.node, "node")
        let kindValue: Int = try row.stored(c.kind, "kind")
        let kind: FileWrapper.Kind
        switch kindValue {
        case 0: kind = .regularFile
        case 1: kind = .directory
        case 2: kind = .symbolicLink
        default:
            throw DocumentStoreError.corrupt(
                path: "", reason: "wrapper \(node) has unknown kind \(kindValue)")
        }
        let xattrs: Data? = try row.stored(c.xattrs, "xattrs")
        return NodeRecord(
            id: StoreNodeID(rawValue: node),
            document: DocumentID(rawValue: try row.stored(c.document, "document")),
            parent: try row.stored(c.parent, "parent", as: Int64?.self).map(StoreNodeID.init(rawValue:)),
            name: try row.stored(c.name, "name"),
            preferredName: try row.stored(c.preferredName, "preferred_name"),
            kind: kind, permissions: try row.stored(c.permissions, "permissions"),
            uid: UInt32(truncatingIfNeeded: try row.stored(c.uid, "uid", as: Int64.self)),
            gid: UInt32(truncatingIfNeeded: try row.stored(c.gid, "gid", as: Int64.self)),
            modified: Timestamp(rawValue: try row.stored(c.mtime, "mtime")),
            changed: Timestamp(rawValue: try row.stored(c.ctime, "ctime")),
            accessed: Timestamp(rawValue: try row.stored(c.atime, "atime")),
            created: Timestamp(rawValue: try row.stored(c.btime, "btime")),
            size: try row.stored(c.size, "size"), linkTarget: try row.stored(c.linkTarget, "link_target"),
            extendedAttributes: try XattrCoding.decode(xattrs ?? Data()),
            version: VersionID(rawValue: try row.stored(c.version, "version")))
    }

    // MARK: Reading contents

    public func readContents(of node: StoreNodeID, at version: VersionID? = nil, offset: Int64, count: Int)
        throws -> Data
    {
        guard offset >= 0, count >= 0 else {
            throw DocumentStoreError.invalidChange("negative offset or count")
        }
        return try read { db in
            let lineage = try Self.lineage(db, version)
            guard let record = try Self.node(db, node, lineage: lineage) else {
                throw DocumentStoreError.noSuchNode(node)
            }
            guard record.kind == .regularFile else { throw DocumentStoreError.notARegularFile(node) }
            let end = min(record.size, offset + Int64(count))
            guard offset < end else { return Data() }
            var result = Data(count: Int(end - offset))
            let size = Int64(chunkSize)
            let first = offset / size
            let last = (end - 1) / size
            let map = try Self.chunkMap(db, node: node, lineage: lineage, from: first, through: last)
            for index in first...last {
                guard let chunkID = map[index] ?? nil else { continue }  // a hole reads as zeros
                let chunk = try self.chunk(db, chunkID)
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
    }

    /// Chunk ids by index (nil for a hole) for indices `first...last` as of `lineage`.
    static func chunkMap(
        _ db: Database, node: StoreNodeID, lineage: Lineage, from first: Int64, through last: Int64
    )
        throws -> [Int64: Int64?]
    {
        var map: [Int64: Int64?] = [:]
        let rows = try Row.fetchCursor(
            db,
            sql: """
                SELECT idx, chunk FROM chunk_map
                WHERE node = ? AND branch = 0 AND idx BETWEEN ? AND ? AND version <= ?
                ORDER BY idx, version DESC
                """,
            arguments: [node.rawValue, first, last, lineage.limit])
        while let row = try rows.next() {
            let index: Int64 = try row.stored("idx")
            if map[index] == nil { map[index] = .some(try row.stored("chunk")) }
        }
        if lineage.branch != 0 {
            let branchRows = try Row.fetchCursor(
                db,
                sql: """
                    SELECT idx, chunk FROM chunk_map WHERE node = ? AND branch = ? AND idx BETWEEN ? AND ?
                    ORDER BY idx, version DESC
                    """,
                arguments: [node.rawValue, lineage.branch, first, last])
            var seen: Set<Int64> = []
            while let row = try branchRows.next() {
                let index: Int64 = try row.stored("idx")
                if seen.insert(index).inserted { map[index] = .some(try row.stored("chunk")) }
            }
        }
        return map
    }

    /// A chunk's bytes, from the cache or the database (counted).
    func chunk(_ db: Database, _ id: Int64) throws -> Data {
        if let cached = cache.withLock({ $0.get(id) }) { return cached }
        guard
            let data = try Data.fetchOne(
                db.cachedStatement(sql: "SELECT data FROM chunks WHERE id = ?"), arguments: [id])
        else {
            throw DocumentStoreError.corrupt(path: path, reason: "chunk \(id) is missing")
        }
        counters.withLock {
            $0.chunksRead += 1
            $0.bytesRead += Int64(data.count)
        }
        cache.withLock { $0.put(id, data) }
        return data
    }

    /// Copies the write-ahead log into the database file and truncates the log, so that the
    /// log's size afterwards measures exactly what later transactions write.
    public func checkpoint() throws {
        do { _ = try pool.writeWithoutTransaction { try $0.checkpoint(.truncate) } } catch {
            throw Self.storeError(error, path: path)
        }
    }

    /// Makes every save committed before the call durable, deferred ones included.
    public func synchronize() throws {
        // Why an fsync of the write-ahead log through a descriptor of our own is enough:
        // - Every commit, deferred or not, has written its frames into the -wal file with
        //   write(2) before it returned, and fsync flushes the file (the inode), not the
        //   descriptor: so every committed frame of any connection or process reaches the disk.
        // - Frames no longer in the log were copied into the database file by a checkpoint, which
        //   fsyncs the database file before the log may be restarted, truncated or deleted; so a
        //   missing log means nothing is pending.
        // - SQLite keeps no POSIX locks on the -wal file (they are on the database and -shm
        //   files), so closing our descriptor cannot release one of its locks.
        // - SQLite fsyncs the directory only when it first fsyncs a new log, which deferred
        //   commits may not have done yet; so the directory is fsynced too, or a new log could
        //   vanish with its frames.
        let log = open(path + "-wal", O_RDONLY | O_CLOEXEC)
        guard log >= 0 else {
            if errno == ENOENT { return }
            throw Self.systemError(errno, path: path, doing: "synchronize")
        }
        defer { close(log) }
        try Self.fsyncRetrying(log, path: path)
        let folder = (path as NSString).deletingLastPathComponent
        let directory = open(folder.isEmpty ? "." : folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard directory >= 0 else { throw Self.systemError(errno, path: path, doing: "synchronize") }
        defer { close(directory) }
        try Self.fsyncRetrying(directory, path: path)
    }

    private static func fsyncRetrying(_ fd: Int32, path: String) throws {
        while fsync(fd) != 0 {
            if errno != EINTR { throw systemError(errno, path: path, doing: "synchronize") }
        }
    }

    /// The embedded default store: `Default.docstore` in the Documents folder of the app id
    /// `docfs` (see ``SearchPaths``).
    public static func defaultStorePath(environment: [String: String] = ProcessInfo.processInfo.environment)
        -> String
    {
        SearchPaths(appID: "docfs", environment: environment).documents.appendingPathComponent(
            "Default.docstore"
        ).path
    }

    /// Drops cached chunks (for tests and benchmarks that measure cold reads).
    public func purgeCache() {
        cache.withLock { $0.removeAll() }
    }

    // MARK: Saving

    public func makeNodeIDs(count: Int) throws -> [StoreNodeID] {
        try write { db in try Self.allocateNodeIDs(db, count: count) }
    }

    static func allocateNodeIDs(_ db: Database, count: Int) throws -> [StoreNodeID] {
        guard count > 0 else { return [] }
        guard let next = try Int64.fetchOne(db, sql: "SELECT value FROM store_meta WHERE key = 'next_node'")
        else {
            throw DocumentStoreError.corrupt(path: "", reason: "the node counter is missing")
        }
        try db.execute(
            sql: "UPDATE store_meta SET value = ? WHERE key = 'next_node'", arguments: [next + Int64(count)])
        return (0..<Int64(count)).map { StoreNodeID(rawValue: next + $0) }
    }

    public func save(_ changes: DocumentChanges) throws -> SaveResult {
        try write(durable: changes.durable) { db in try self.save(db, changes) }
    }

    func save(_ db: Database, _ changes: DocumentChanges) throws -> SaveResult {
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
                    try Bool.fetchOne(
                        db.cachedStatement(
                            sql: "SELECT 1 FROM nodes WHERE node = ? AND branch = 0 AND version > ? LIMIT 1"),
                        arguments: [id.rawValue, changes.base.rawValue]) == true
                }
            }
        }
        let now = Timestamp.now
        let version = try Self.insertVersion(
            db, document: document.id, base: changes.base, origin: changes.origin, now: now)
        let branch: Int64 = conflict ? version.rawValue : 0
        if conflict {
            try db.cachedStatement(sql: "UPDATE versions SET branch = id WHERE id = ?").execute(arguments: [
                version.rawValue
            ])
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
            guard var record = try records[id] ?? Self.node(db, id, lineage: before) else {
                throw DocumentStoreError.noSuchNode(id)
            }
            guard record.kind == .regularFile else { throw DocumentStoreError.notARegularFile(id) }
            let previous = try Self.node(db, id, lineage: before)
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
        try db.cachedStatement(sql: "UPDATE versions SET bytes_written = ? WHERE id = ?").execute(arguments: [
            written.bytes, version.rawValue,
        ])
        if !conflict {
            try db.cachedStatement(sql: "UPDATE documents SET current_version = ?, modified = ? WHERE id = ?")
                .execute(arguments: [version.rawValue, now.rawValue, document.id.rawValue])
        }
        try Self.insertEvent(
            db, conflict ? .conflict : .saved, document: document.id, version: version, name: document.name,
            origin: changes.origin)
        counters.withLock {
            $0.chunksWritten += written.chunks
            $0.bytesWritten += written.bytes
            $0.nodesWritten += written.nodes
        }
        let info = try Self.version(db, version)
        return SaveResult(
            version: info, chunksWritten: written.chunks, bytesWritten: written.bytes,
            nodesWritten: written.nodes)
    }

    /// Checks that changed records form a valid tree: parents exist and are directories, names are
    /// valid and unique among siblings.
    private func validate(
        _ db: Database, records: [StoreNodeID: NodeRecord], removed: Set<StoreNodeID>, document: DocumentInfo,
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
            let candidates = try Int64.fetchAll(
                db, sql: "SELECT DISTINCT node FROM nodes WHERE parent = ? AND name = ? AND node != ?",
                arguments: [parentID.rawValue, record.name, record.id.rawValue])
            for candidate in candidates.map(StoreNodeID.init(rawValue:)) where !removed.contains(candidate) {
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
        _ db: Database, node: StoreNodeID, update: ContentUpdate, previousSize: Int64?, lineage: Lineage,
        branch: Int64,
        version: VersionID
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
            if !Self.isZero(data) {
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
            let stored = try Int64.fetchOne(
                db.cachedStatement(sql: "SELECT size FROM chunks WHERE id = ?"), arguments: [old]),
            stored > newSize - last * size
        {
            try put(last, try chunk(db, old).prefix(Int(newSize - last * size)))
        }
        return (newSize, chunks, bytes)
    }

    /// The chunk at `index` as of `lineage`; nil for a hole, and where no row says anything (both
    /// read as zeros).
    static func chunkAt(_ db: Database, node: StoreNodeID, lineage: Lineage, index: Int64) throws -> Int64? {
        if lineage.branch != 0,
            let row = try Row.fetchOne(
                db.cachedStatement(
                    sql: """
                        SELECT chunk FROM chunk_map WHERE node = ? AND branch = ? AND idx = ?
                        ORDER BY version DESC LIMIT 1
                        """),
                arguments: [node.rawValue, lineage.branch, index])
        {
            return try row.stored("chunk", as: Int64?.self)
        }
        return try Row.fetchOne(
            db.cachedStatement(
                sql: """
                    SELECT chunk FROM chunk_map WHERE node = ? AND branch = 0 AND idx = ? AND version <= ?
                    ORDER BY version DESC LIMIT 1
                    """),
            arguments: [node.rawValue, index, lineage.limit]
        ).flatMap { try $0.stored("chunk", as: Int64?.self) }
    }

    static func insertChunkRow(
        _ db: Database, node: StoreNodeID, branch: Int64, index: Int64, version: VersionID, chunk: Int64?
    ) throws {
        try db.cachedStatement(
            sql: "INSERT OR REPLACE INTO chunk_map(node, branch, idx, version, chunk) VALUES (?, ?, ?, ?, ?)"
        ).execute(arguments: [node.rawValue, branch, index, version.rawValue, chunk])
    }

    package static func hash(_ data: Data) -> Data { Data(SHA256.hash(data: data)) }

    /// Whether every byte is zero: such a chunk is stored as a hole.
    package static func isZero(_ data: Data) -> Bool {
        data.withUnsafeBytes { raw in
            var words = raw.count / 8
            var index = 0
            while words > 0 {
                if raw.loadUnaligned(fromByteOffset: index, as: UInt64.self) != 0 { return false }
                index += 8
                words -= 1
            }
            while index < raw.count {
                if raw[index] != 0 { return false }
                index += 1
            }
            return true
        }
    }

    /// The id of the chunk holding `data`, inserting it if new.
    static func storeChunk(_ db: Database, _ data: Data) throws -> (Int64, Bool) {
        let hash = hash(data)
        if let id = try Int64.fetchOne(
            db.cachedStatement(sql: "SELECT id FROM chunks WHERE hash = ?"), arguments: [hash])
        {
            return (id, false)
        }
        // Not a cached statement: one would keep the last chunk's bytes alive with its arguments.
        try db.execute(
            sql: "INSERT INTO chunks(hash, size, data) VALUES (?, ?, ?)", arguments: [hash, data.count, data])
        return (db.lastInsertedRowID, true)
    }

    static func insertVersion(
        _ db: Database, document: DocumentID, base: VersionID?, origin: String, now: Timestamp
    ) throws
        -> VersionID
    {
        try db.cachedStatement(
            sql: "INSERT INTO versions(document, base, created, origin) VALUES (?, ?, ?, ?)"
        ).execute(arguments: [document.rawValue, base?.rawValue, now.rawValue, origin])
        return VersionID(rawValue: db.lastInsertedRowID)
    }

    static func insertNode(_ db: Database, _ r: NodeRecord, branch: Int64, version: VersionID) throws {
        let kind: Int
        switch r.kind {
        case .regularFile: kind = 0
        case .directory: kind = 1
        case .symbolicLink: kind = 2
        }
        try db.cachedStatement(
            sql: """
                INSERT OR REPLACE INTO nodes(node, branch, version, document, parent, name, preferred_name, kind,
                    permissions, uid, gid, mtime, ctime, atime, btime, size, link_target, xattrs, removed)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)
                """
        ).execute(arguments: [
            r.id.rawValue, branch, version.rawValue, r.document.rawValue, r.parent?.rawValue, r.name,
            r.preferredName == r.name ? nil : r.preferredName, kind, r.permissions & 0o7777, Int64(r.uid),
            Int64(r.gid),
            r.modified.rawValue, r.changed.rawValue, r.accessed.rawValue, r.created.rawValue,
            r.kind == .regularFile ? r.size : 0, r.linkTarget,
            r.extendedAttributes.isEmpty ? nil : XattrCoding.encode(r.extendedAttributes),
        ])
    }

    static func insertTombstone(_ db: Database, _ r: NodeRecord, branch: Int64, version: VersionID) throws {
        try db.cachedStatement(
            sql: """
                INSERT OR REPLACE INTO nodes(node, branch, version, document, parent, name, kind, permissions, uid, gid,
                    mtime, ctime, atime, btime, size, removed)
                VALUES (?, ?, ?, ?, ?, ?, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)
                """
        ).execute(arguments: [
            r.id.rawValue, branch, version.rawValue, r.document.rawValue, r.parent?.rawValue, r.name,
        ])
    }

    static func insertEvent(
        _ db: Database, _ kind: StoreEvent.Kind, document: DocumentID, version: VersionID?, name: String,
        origin: String
    ) throws {
        try db.cachedStatement(
            sql: "INSERT INTO events(kind, document, version, name, origin, time) VALUES (?, ?, ?, ?, ?, ?)"
        ).execute(arguments: [
            kind.rawValue, document.rawValue, version?.rawValue, name, origin, Timestamp.now.rawValue,
        ])
    }

    // MARK: Versions

    public func versions(of document: DocumentID) throws -> [VersionInfo] {
        try read { db in
            _ = try Self.fetchDocument(db, document)
            return try Row.fetchAll(
                db, sql: "SELECT * FROM versions WHERE document = ? ORDER BY id",
                arguments: [document.rawValue]
            )
            .map(Self.version)
        }
    }

    static func version(_ db: Database, _ id: VersionID) throws -> VersionInfo {
        guard
            let row = try Row.fetchOne(
                db.cachedStatement(sql: "SELECT * FROM versions WHERE id = ?"), arguments: [id.rawValue])
        else {
            throw DocumentStoreError.noSuchVersion(id)
        }
        return try version(row)
    }

    static func version(_ row: Row) throws -> VersionInfo {
        VersionInfo(
            id: VersionID(rawValue: try row.stored("id")),
            document: DocumentID(rawValue: try row.stored("document")),
            base: try row.stored("base", as: Int64?.self).map(VersionID.init(rawValue:)),
            created: Timestamp(rawValue: try row.stored("created")),
            origin: try row.stored("origin"), isConflict: try row.stored("branch", as: Int64.self) != 0,
            isResolved: try row.stored("resolved", as: Int64.self) != 0,
            bytesWritten: try row.stored("bytes_written"))
    }

    public func restore(_ version: VersionID, of document: DocumentID, origin: String = "restore") throws
        -> SaveResult
    {
        try write { db in
            let info = try Self.version(db, version)
            guard info.document == document else { throw DocumentStoreError.noSuchVersion(version) }
            let doc = try Self.fetchDocument(db, document)
            let target = try Self.nodes(db, document: document, lineage: Self.lineage(db, version))
            let current = try Self.nodes(db, document: document, lineage: .current)
            var changes = DocumentChanges(document: document, base: doc.currentVersion)
            changes.origin = origin
            changes.conflictPolicy = .fail
            let targetLineage = try Self.lineage(db, version)
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
                changes.contents[id] = .replace(
                    StoreContentsSource(store: self, node: id, version: version, count: record.size))
            }
            // Remove what the old version did not have, deepest-first order does not matter:
            // removal takes subtrees.
            changes.removedNodes = current.keys.filter { target[$0] == nil }
            var result = try self.save(db, changes)
            try db.execute(
                sql: "UPDATE events SET kind = 'restored' WHERE sequence = (SELECT MAX(sequence) FROM events)"
            )
            result.version = try Self.version(db, result.version.id)
            return result
        }
    }

    public func resolveConflict(_ version: VersionID) throws {
        try write { db in
            let info = try Self.version(db, version)
            guard info.isConflict, !info.isResolved else { return }  // FV-2: not a conflict, or resolved
            try db.execute(
                sql: "UPDATE versions SET resolved = 1 WHERE id = ?", arguments: [version.rawValue])
            let document = try Self.fetchDocument(db, info.document)
            try Self.insertEvent(
                db, .resolved, document: info.document, version: version, name: document.name, origin: "resolve")
        }
    }

    public func unresolvedConflicts() throws -> [VersionInfo] {
        try read { db in
            try Row.fetchAll(
                db,
                sql: """
                    SELECT versions.* FROM versions JOIN documents ON documents.id = versions.document
                    WHERE versions.branch != 0 AND versions.resolved = 0 AND documents.deleted IS NULL
                    ORDER BY versions.id
                    """
            )
            .map(Self.version)
        }
    }

    // MARK: Retention

    public func collectGarbage(_ policy: RetentionPolicy) throws -> CollectionReport {
        try write { db in
            var report = CollectionReport()
            let now = Timestamp.now
            let keep = policy.keepFor.components
            let horizon = now.rawValue - keep.seconds * 1_000_000_000 - keep.attoseconds / 1_000_000_000
            for row in try Row.fetchAll(db, sql: "SELECT id, deleted FROM documents") {
                let document = DocumentID(rawValue: try row.stored("id"))
                if let deleted = try row.stored("deleted", as: Int64?.self), deleted < horizon {
                    try self.removeDocument(db, document)
                    report.documentsRemoved += 1
                    continue
                }
                report.versionsRemoved += try pruneVersions(db, document, policy: policy, horizon: horizon)
            }
            let unreferenced = try Row.fetchAll(
                db,
                sql:
                    "SELECT id, size FROM chunks WHERE NOT EXISTS (SELECT 1 FROM chunk_map WHERE chunk = chunks.id)"
            )
            for row in unreferenced {
                try db.execute(
                    sql: "DELETE FROM chunks WHERE id = ?", arguments: [try row.stored("id", as: Int64.self)])
                report.chunksRemoved += 1
                report.bytesFreed += try row.stored("size", as: Int64.self)
            }
            try db.execute(
                sql: "DELETE FROM events WHERE time < ?",
                arguments: [now.rawValue - 7 * 24 * 3600 * 1_000_000_000])
            return report
        }
    }

    private func removeDocument(_ db: Database, _ document: DocumentID) throws {
        let d = document.rawValue
        try db.execute(
            sql: "DELETE FROM chunk_map WHERE node IN (SELECT DISTINCT node FROM nodes WHERE document = ?)",
            arguments: [d])
        try db.execute(sql: "DELETE FROM nodes WHERE document = ?", arguments: [d])
        try db.execute(sql: "DELETE FROM versions WHERE document = ?", arguments: [d])
        try db.execute(sql: "DELETE FROM documents WHERE id = ?", arguments: [d])
    }

    /// Drops main-line versions older than the policy keeps, folding their rows into the oldest
    /// kept version; returns how many were dropped.
    private func pruneVersions(
        _ db: Database, _ document: DocumentID, policy: RetentionPolicy, horizon: Int64
    ) throws -> Int {
        let d = document.rawValue
        let mainline = try Row.fetchAll(
            db, sql: "SELECT id, created FROM versions WHERE document = ? AND branch = 0 ORDER BY id DESC",
            arguments: [d])
        guard mainline.count > policy.keepLast else { return 0 }
        var keep = try mainline.prefix(policy.keepLast).map { try $0.stored("id", as: Int64.self) }
        keep += try mainline.dropFirst(policy.keepLast).filter {
            try $0.stored("created", as: Int64.self) >= horizon
        }
        .map { try $0.stored("id", as: Int64.self) }
        var cutoff = keep.min() ?? 0
        // An unresolved conflict version reads the main line as of its base: keep that.
        if let base = try Int64.fetchOne(
            db, sql: "SELECT MIN(base) FROM versions WHERE document = ? AND branch != 0 AND resolved = 0",
            arguments: [d])
        {
            cutoff = min(cutoff, base)
        }
        // Resolved conflict versions go, with their rows.
        let resolved = try Int64.fetchAll(
            db, sql: "SELECT id FROM versions WHERE document = ? AND branch != 0 AND resolved = 1",
            arguments: [d])
        for branch in resolved {
            try db.execute(sql: "DELETE FROM chunk_map WHERE branch = ?", arguments: [branch])
            try db.execute(sql: "DELETE FROM nodes WHERE branch = ?", arguments: [branch])
            try db.execute(sql: "DELETE FROM versions WHERE id = ?", arguments: [branch])
        }
        // Rows superseded at or before the cutoff are invisible to every kept version.
        try db.execute(
            sql: """
                DELETE FROM chunk_map WHERE branch = 0 AND version < :cutoff
                  AND node IN (SELECT DISTINCT node FROM nodes WHERE document = :d)
                  AND EXISTS (SELECT 1 FROM chunk_map c2 WHERE c2.node = chunk_map.node AND c2.branch = 0
                              AND c2.idx = chunk_map.idx AND c2.version > chunk_map.version AND c2.version <= :cutoff)
                """,
            arguments: ["cutoff": cutoff, "d": d])
        try db.execute(
            sql: """
                DELETE FROM nodes WHERE document = :d AND branch = 0 AND version < :cutoff
                  AND EXISTS (SELECT 1 FROM nodes n2 WHERE n2.node = nodes.node AND n2.branch = 0
                              AND n2.version > nodes.version AND n2.version <= :cutoff)
                """,
            arguments: ["cutoff": cutoff, "d": d])
        // Wrappers removed at or before the cutoff are gone from every kept version.
        let gone = try Int64.fetchAll(
            db,
            sql: "SELECT node FROM nodes WHERE document = ? AND branch = 0 AND version <= ? AND removed = 1",
            arguments: [d, cutoff])
        for node in gone {
            let newer = try Bool.fetchOne(
                db, sql: "SELECT 1 FROM nodes WHERE node = ? AND branch = 0 AND version > ?",
                arguments: [node, cutoff])
            if newer == true { continue }
            try db.execute(sql: "DELETE FROM chunk_map WHERE node = ? AND branch = 0", arguments: [node])
            try db.execute(sql: "DELETE FROM nodes WHERE node = ? AND branch = 0", arguments: [node])
        }
        let removed =
            try Int.fetchOne(
                db, sql: "SELECT COUNT(*) FROM versions WHERE document = ? AND branch = 0 AND id < ?",
                arguments: [d, cutoff]) ?? 0
        try db.execute(
            sql: "DELETE FROM versions WHERE document = ? AND branch = 0 AND id < ?", arguments: [d, cutoff])
        return removed + resolved.count
    }

    // MARK: Events

    public func events(after sequence: Int64) throws -> [StoreEvent] {
        try read { db in
            try Row.fetchAll(
                db, sql: "SELECT * FROM events WHERE sequence > ? ORDER BY sequence", arguments: [sequence]
            ).compactMap {
                row -> StoreEvent? in
                guard let kind = StoreEvent.Kind(rawValue: try row.stored("kind")) else { return nil }
                return StoreEvent(
                    sequence: try row.stored("sequence"), kind: kind,
                    document: DocumentID(rawValue: try row.stored("document")),
                    version: try row.stored("version", as: Int64?.self).map(VersionID.init(rawValue:)),
                    name: try row.stored("name"), origin: try row.stored("origin"))
            }
        }
    }

    public func latestEventSequence() throws -> Int64 {
        try read { db in try Int64.fetchOne(db.cachedStatement(sql: "SELECT MAX(sequence) FROM events")) ?? 0
        }
    }

    /// The SQLite `data_version` of a dedicated connection: it changes when another connection
    /// (in this or another process) commits. Observers poll it cheaply.
    func dataVersion(_ db: Database) throws -> Int64 {
        try Int64.fetchOne(db.cachedStatement(sql: "PRAGMA data_version")) ?? 0
    }
}

/// Reading a column of a stored row. GRDB's subscript stops the process when a value cannot be
/// converted (NULL, or text where an integer belongs); a damaged or hand-edited store can hold
/// such values, so every row the store decodes goes through `stored`, which throws instead.
extension Row {
    /// ``stored(_:as:)`` by the column's index (``NodeColumns``); a value of the wrong type is
    /// described through the column's name.
    func stored<Value: DatabaseValueConvertible>(
        _ index: Int, _ column: String, as _: Value.Type = Value.self
    )
        throws -> Value
    {
        do { return try decode(Value.self, atIndex: index) } catch {
            return try stored(column, as: Value.self)
        }
    }

    func stored<Value: DatabaseValueConvertible>(_ column: String, as _: Value.Type = Value.self) throws
        -> Value
    {
        do {
            return try decode(Value.self, forColumn: column)
        } catch {
            let found: String
            switch (self[column] as DatabaseValue).storage {
            case .null: found = "NULL"
            case .int64(let value): found = "the integer \(value)"
            case .double(let value): found = "the real \(value)"
            case .string: found = "text"
            case .blob: found = "a blob"
            }
            throw DocumentStoreError.corrupt(
                path: "", reason: "column \(column) holds \(found), not \(Value.self)")
        }
    }
}

/// The store's `user.` extended attributes as one blob: u32 count, then per attribute a u16 name
/// length, the name, a u32 value length and the value (little-endian). Decoding checks every
/// length, so a damaged row gives an error, not a crash.
package enum XattrCoding {
    package static func encode(_ xattrs: [String: Data]) -> Data {
        var out = Data()
        func append<T: FixedWidthInteger>(_ v: T) {
            withUnsafeBytes(of: v.littleEndian) { out.append(contentsOf: $0) }
        }
        append(UInt32(xattrs.count))
        for (name, value) in xattrs.sorted(by: { $0.key < $1.key }) {
            let bytes = Data(name.utf8)
            append(UInt16(truncatingIfNeeded: bytes.count))
            out.append(bytes)
            append(UInt32(truncatingIfNeeded: value.count))
            out.append(value)
        }
        return out
    }

    package static func decode(_ data: Data) throws -> [String: Data] {
        if data.isEmpty { return [:] }
        let bytes = [UInt8](data)
        var offset = 0
        func take(_ n: Int) throws -> ArraySlice<UInt8> {
            guard n >= 0, n <= bytes.count - offset else {
                throw DocumentStoreError.corrupt(
                    path: "", reason: "extended attributes are truncated at byte \(offset)")
            }
            defer { offset += n }
            return bytes[offset..<offset + n]
        }
        func integer<T: FixedWidthInteger>(_: T.Type) throws -> T {
            try take(MemoryLayout<T>.size).reversed().reduce(T(0)) { $0 << 8 | T($1) }
        }
        let count = try integer(UInt32.self)
        guard Int(count) <= bytes.count / 6 else {
            throw DocumentStoreError.corrupt(
                path: "", reason: "extended attribute count \(count) is too large")
        }
        var result: [String: Data] = [:]
        for _ in 0..<count {
            let nameLength = Int(try integer(UInt16.self))
            guard let name = String(validating: try take(nameLength), as: UTF8.self) else {
                throw DocumentStoreError.corrupt(path: "", reason: "an extended attribute name is not UTF-8")
            }
            let valueLength = Int(try integer(UInt32.self))
            result[name] = Data(try take(valueLength))
        }
        guard offset == bytes.count else {
            throw DocumentStoreError.corrupt(path: "", reason: "extended attributes have trailing bytes")
        }
        return result
    }
}

/// A least-recently-used cache of chunk bytes by chunk id (ids are never reused).
package struct ChunkCache {
    /// What a store keeps. The kernel's page cache already keeps what a mount read (keep_cache);
    /// this cache serves the rest of a chunk to the next read request and a few hot chunks, so it
    /// stays small: with 64 MiB, streaming one large file took a daemon past 100 MiB (bench B7).
    package static let storeCapacity = 32 << 20

    let capacity: Int
    private var entries: [Int64: (data: Data, tick: UInt64)] = [:]
    private var bytes = 0
    private var tick: UInt64 = 0

    package init(capacity: Int) { self.capacity = capacity }

    package mutating func get(_ id: Int64) -> Data? {
        guard let entry = entries[id] else { return nil }
        tick += 1
        entries[id] = (entry.data, tick)
        return entry.data
    }

    package mutating func put(_ id: Int64, _ data: Data) {
        guard data.count <= capacity / 4 else { return }
        tick += 1
        if let old = entries.updateValue((data, tick), forKey: id) { bytes -= old.data.count }
        bytes += data.count
        if bytes > capacity {
            // Evict the oldest quarter at once so eviction is amortised.
            let victims = entries.sorted { $0.value.tick < $1.value.tick }.prefix(max(1, entries.count / 4))
            for (key, value) in victims {
                entries[key] = nil
                bytes -= value.data.count
            }
        }
    }

    package mutating func removeAll() {
        entries = [:]
        bytes = 0
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

/// Where each column of a `nodes` row is, looked up once per query: looking each value up by
/// name took a third of `Document.open` of a package of 10,000 wrappers (issue 7, B6).
struct NodeColumns {
    let node, document, parent, name, preferredName, kind, permissions, uid, gid: Int
    let mtime, ctime, atime, btime, size, linkTarget, xattrs, removed, version: Int

    init(_ row: Row) throws {
        var indices: [String: Int] = [:]
        for (index, name) in row.columnNames.enumerated() where indices[name] == nil {
            indices[name] = index
        }
        func index(_ name: String) throws -> Int {
            guard let index = indices[name] else {
                throw DocumentStoreError.corrupt(path: "", reason: "a wrapper record has no \(name) column")
            }
            return index
        }
        node = try index("node")
        document = try index("document")
        parent = try index("parent")
        name = try index("name")
        preferredName = try index("preferred_name")
        kind = try index("kind")
        permissions = try index("permissions")
        uid = try index("uid")
        gid = try index("gid")
        mtime = try index("mtime")
        ctime = try index("ctime")
        atime = try index("atime")
        btime = try index("btime")
        size = try index("size")
        linkTarget = try index("link_target")
        xattrs = try index("xattrs")
        removed = try index("removed")
        version = try index("version")
    }
}
