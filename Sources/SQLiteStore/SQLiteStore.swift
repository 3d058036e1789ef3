import DocumentEngine
import Foundation
import GRDB
import GRDBSQLite
import Synchronization
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// The embedded document store: one SQLite file (WAL), shared safely by several processes.
///
/// The versioned-store algorithm is ``VersionedStore``'s; this type opens the file, checks it is
/// a DocFS store, and runs the algorithm's transactions on SQLite (``SQLiteBackend``).
public final class SQLiteStore: VersionedDocumentStore, Sendable {
    /// How to open a store.
    public struct OpenOptions: OptionSet, Sendable {
        public let rawValue: Int
        public init(rawValue: Int) { self.rawValue = rawValue }
        /// Create the store (mode 0600) if there is no file at the path.
        public static let create = OpenOptions(rawValue: 1)
    }

    /// The default chunk size (``VersionedStore/defaultChunkSize``).
    public static let defaultChunkSize = VersionedStore.defaultChunkSize

    public let versionedStore: VersionedStore
    let backend: SQLiteBackend
    /// Changes made durable before they are saved.
    let intentLog: IntentLog

    /// The store file's path.
    public var path: String { backend.path }
    /// The connections, for tests that look at SQLite's settings.
    package var pool: DatabasePool { backend.pool }

    /// Opens the store at `path`, creating it with `options: .create` (and `chunkSize`) if missing.
    ///
    /// A missing, empty, truncated, foreign or damaged file, or one written by a newer DocFS, is
    /// refused with a ``DocumentStoreError`` that names the problem.
    public init(path: String, options: OpenOptions = [], chunkSize: Int = SQLiteStore.defaultChunkSize) throws
    {
        backend = try SQLiteBackend(path: path, create: options.contains(.create), chunkSize: chunkSize)
        versionedStore = VersionedStore(backend: backend)
        intentLog = IntentLog(storePath: path)
        // Changes a process that is gone logged and did not save: acknowledged, so saved first.
        try replayIntentLogs()
    }

    // MARK: The intent log

    public var logsIntents: Bool { true }

    /// Logs `changes` in the store's intent log (``VersionedStore/logIntent(_:in:makeBaseDurable:)``), its base
    /// made durable first: a replay applies the record to its base, which must be on disk before
    /// the record is.
    public func logIntent(_ changes: DocumentChanges) throws -> IntentID? {
        try versionedStore.logIntent(changes, in: intentLog) { () throws in
            if changes.base.rawValue > backend.durableThrough.load(ordering: .acquiring) {
                try backend.synchronize()
            }
        }
    }

    public func retireIntents(_ intents: [IntentID]) { intentLog.retire(intents) }

    /// Ends this process's writing, for a process that ends without releasing the store (the
    /// mount's daemon, once it unmounted): closes its intent log, removing it when everything
    /// it holds was saved, and copies the write-ahead log into the store file and empties it,
    /// so that the file (with its packs) holds every save on its own once the process is gone.
    /// A process that keeps the store open would leave its `-wal` holding the last saves,
    /// which a copy of the file alone would miss. Gives up after about 2 s if another
    /// process's reads hold the log (the store is open there, and its `-wal` part of it), and
    /// returns SQLite's reason then.
    @discardableResult
    public func finishWriting() -> String? {
        intentLog.close()
        return backend.emptyLog(waiting: 2)
    }

    /// Replays the logs in `<store>-intents` that no live process holds, then removes them.
    private func replayIntentLogs() throws {
        let failed = versionedStore.replayIntentLogs(in: intentLog.folder)
        if !failed.isEmpty { backend.unreplayedIntentLogs.withLock { $0 += failed } }
    }

    /// Intent logs that the opening could not save (and why): they stay, and the next opening
    /// tries again.
    public var unreplayedIntentLogs: [String] { backend.unreplayedIntentLogs.withLock { $0 } }

    // Decoders of stored rows, for the fuzz targets and the damaged-row tests.
    static func record(_ row: Row) throws -> NodeRecord {
        try NodeColumns(Array(row.columnNames)).record(row)
    }
    static func document(_ row: Row) throws -> DocumentInfo { try SQLiteTransaction.document(row) }
    static func version(_ row: Row) throws -> VersionInfo { try SQLiteTransaction.version(row) }
    static func storeError(_ error: any Error, path: String, systemErrno: Int32 = 0) -> any Error {
        SQLiteBackend.storeError(error, path: path, systemErrno: systemErrno)
    }

    /// Chunks the store names in packs although their folder (`<store>-packs`) was missing when
    /// it was opened, as when a store is copied without it: 0 for a whole store. Reads of those
    /// chunks fail, and no save makes a new folder in its place.
    public var chunksInMissingPackFolder: Int { backend.packs.chunksInMissingFolder }

    /// Why the store cannot be used whole, when ``chunksInMissingPackFolder`` is not 0.
    public var missingPackFolderProblem: String? { backend.packs.missingFolderError?.description }

    /// Copies the write-ahead log into the database file and truncates the log, so that the
    /// log's size afterwards measures exactly what later transactions write.
    public func checkpoint() throws { try backend.checkpoint() }

    /// The checkpoints the background thread has completed, for tests.
    package var backgroundCheckpoints: Int { backend.checkpointer.checkpoints }
    /// Holds background checkpoints back, for tests; resume before the store is released.
    package func suspendBackgroundCheckpoints() { backend.checkpointer.suspend() }
    package func resumeBackgroundCheckpoints() { backend.checkpointer.resume() }

    /// The embedded default store: `Default.docstore` in the Documents folder of the app id
    /// `docfs` (see ``SearchPaths``).
    public static func defaultStorePath(environment: [String: String] = ProcessInfo.processInfo.environment)
        -> String
    {
        SearchPaths(appID: "docfs", environment: environment).documents.appendingPathComponent(
            "Default.docstore"
        ).path
    }

}

/// SQLite's side of the versioned store: its connections, its dialect and its file.
final class SQLiteBackend: StoreBackend {
    let path: String
    var location: String { path }
    let chunkSize: Int
    let pool: DatabasePool
    /// Checkpoints the log beside the commits instead of inside them.
    let checkpointer: Checkpointer
    /// Reads that need no snapshot (parts of chunks, a document's current version), outside the
    /// pool.
    let plainReads: PlainReads
    /// Large chunks' bytes, beside the store.
    let packs: PackFiles
    /// Whether the writer connection may still be at `synchronous = NORMAL` after a deferred save.
    private let writerMayBeRelaxed = Atomic(false)
    /// Intent logs the opening could not save, and why (``SQLiteStore/unreplayedIntentLogs``).
    let unreplayedIntentLogs = Mutex<[String]>([])
    /// Versions up to this id are on disk: a durable commit or ``synchronize()`` put them there.
    let durableThrough = Atomic<Int64>(0)
    /// News of lock releases, from this process and others.
    let lockBell: LockBellFile

    init(path: String, create: Bool, chunkSize: Int) throws {
        self.path = path
        guard chunkSize > 0, chunkSize <= VersionedStore.maximumChunkSize else {
            throw DocumentStoreError.invalidChange("the chunk size must be between 1 byte and 64 MiB")
        }
        lockBell = LockBellFile(storePath: path)
        let isNew = try Self.prepareFile(path: path, create: create)
        var configuration = Configuration()
        configuration.busyMode = .timeout(30)
        configuration.label = "docfs.store"
        let checkpointer = Checkpointer(path: path)
        self.checkpointer = checkpointer
        let packs = PackFiles(storePath: path)
        self.packs = packs
        plainReads = PlainReads(path: path, packs: packs)
        do {
            pool = try DatabasePool(path: path, configuration: configuration)
            // FULL: a committed save survives power loss, which fsync's contract needs. Set here,
            // not in prepareDatabase: GRDB sets the writer to NORMAL when it turns WAL on, after
            // prepareDatabase ran. Only the writer commits, so only its setting matters.
            try pool.writeWithoutTransaction { db in
                try db.execute(sql: "PRAGMA synchronous = FULL")
                // A save of up to 16 MiB keeps its pages in memory until it commits: with the
                // default 2 MiB a save of a few chunks spilled, and wrote pages to the log twice.
                try db.execute(sql: "PRAGMA cache_size = -16384")
                if let connection = db.sqliteConnection { checkpointer.install(on: connection) }
            }
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
                    size > 0, size <= VersionedStore.maximumChunkSize
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
        var folder = stat()
        if !isNew, stat(packs.folder, &folder) != 0, errno == ENOENT {
            // Copied without its packs' folder? Counted only then: packed chunks are many rows.
            let count = try? pool.read { db in
                try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM packed_chunks") ?? 0
            }
            if let count, count > 0 { packs.folderMissing(chunks: count) }
        }
        if isNew {
            // Incremental vacuum must be chosen before the first table, or made so by a VACUUM;
            // on a new store that costs nothing. It lets garbage collection give space back.
            // Then the header (with the application id) goes into the file itself, not just the log.
            _ = try? pool.writeWithoutTransaction { db in
                try db.execute(sql: "PRAGMA auto_vacuum = INCREMENTAL")
                try db.execute(sql: "VACUUM")
                try db.checkpoint(.truncate)
            }
        }
    }

    deinit {
        // The hook's context is the checkpointer, which must not be called once it is closed.
        pool.writeWithoutTransaction { db in
            if let connection = db.sqliteConnection { checkpointer.uninstall(from: connection) }
        }
        checkpointer.close()
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
            // Another store's packs, left where this one would put its own, would be taken for
            // its garbage.
            let packs = PackFiles(storePath: path)
            if !packs.files().isEmpty {
                throw DocumentStoreError.io(
                    "cannot create the store \(path): \(packs.folder) holds the packs of another store; move or remove it"
                )
            }
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
        case .SQLITE_FULL:
            // SQLite also says "full" for a damaged file whose page numbers run past its limit: a
            // disk with room left means the file is at fault, not the disk.
            if systemErrno != ENOSPC && systemErrno != EDQUOT, Self.diskHasRoom(path) {
                return DocumentStoreError.corrupt(
                    path: path,
                    reason: "SQLite finds it full although its disk has room: its pages are damaged")
            }
            return DocumentStoreError.noSpace(path)
        // Growing the -shm file or syncing reports the errno only as SQLITE_IOERR.
        case .SQLITE_IOERR where systemErrno == ENOSPC || systemErrno == EDQUOT:
            return DocumentStoreError.noSpace(path)
        case .SQLITE_READONLY, .SQLITE_PERM, .SQLITE_CANTOPEN:
            return DocumentStoreError.io(
                "cannot open the store \(path): \(error.message ?? "permission denied")")
        default: return error
        }
    }

    /// Whether the file system holding `path` has more than 16 MiB free for this user.
    static func diskHasRoom(_ path: String) -> Bool {
        var st = statvfs()
        let folder = (path as NSString).deletingLastPathComponent
        guard statvfs(folder.isEmpty ? "." : folder, &st) == 0 else { return false }
        return UInt64(st.f_bavail) * UInt64(st.f_frsize) > 16 << 20
    }

    /// An error for a system call on the store's files that failed with `code`.
    static func systemError(_ code: Int32, path: String, doing what: String) -> DocumentStoreError {
        StoreFiles.systemError(code, path: path, doing: what)
    }

    // The statements a save or a read runs every time are cached statements: compiling them
    // again for each save took a fifth of the daemon's CPU when every close saved (benchmark B5).

    /// Runs `body` in one IMMEDIATE transaction. A durable one commits with `synchronous = FULL`
    /// (it is on disk when this returns); otherwise with NORMAL, which in WAL mode commits
    /// atomically and survives the process, but reaches the disk only at the next checkpoint,
    /// durable commit or ``synchronize()``.
    func writeDatabase<T>(durable: Bool, _ body: (Database) throws -> T) throws -> T {
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
                    var newest: Int64?
                    packs.beginTransaction()
                    do {
                        try db.inTransaction(.immediate) {
                            result = try body(db)
                            try packs.prepareCommit()
                            // Under the write lock: every version up to it is in the log before
                            // this commit's frames, so this commit's sync makes them durable.
                            if durable {
                                newest = try Int64.fetchOne(db, sql: "SELECT max(id) FROM versions")
                            }
                            return .commit
                        }
                    } catch {
                        packs.rolledBack()
                        throw error
                    }
                    packs.committed()
                    if let newest { durableThrough.max(newest, ordering: .acquiringAndReleasing) }
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

    // MARK: StoreBackend

    func read<T>(_ body: (any StoreTransaction) throws -> T) throws -> T {
        do { return try pool.read { db in try body(SQLiteTransaction(db: db, packs: packs)) } } catch {
            throw Self.storeError(error, path: path)
        }
    }

    /// Incremental blob I/O: SQLite reads the overflow pages that hold the range (the pointer
    /// map of an incremental-vacuum file lets it skip to them), not the whole chunk, so a cold
    /// 4 KiB read costs a few pages instead of up to 256 KiB.
    func chunkSlice(_ id: Int64, _ range: Range<Int>) throws -> Data? {
        do { return try plainReads.read(id, range) } catch { throw Self.storeError(error, path: path) }
    }

    /// A packed chunk's slice goes from its pack straight into the caller's buffer.
    func chunkSlice(_ id: Int64, _ range: Range<Int>, into buffer: UnsafeMutableRawBufferPointer) throws
        -> Bool
    {
        do { return try plainReads.read(id, range, into: buffer) } catch {
            throw Self.storeError(error, path: path)
        }
    }

    /// Incremental blob I/O for whole chunks too: a cold sequential read spent a third of its
    /// CPU in the pool's queue, transaction and statement around `SELECT data`, and SQLite
    /// copied each blob twice (into a value, then into `Data`); a blob handle reads it once.
    func wholeChunks(_ ids: [Int64]) throws -> [Int64: Data]? {
        do {
            var result: [Int64: Data] = [:]
            for id in ids {
                guard let data = try plainReads.whole(id) else { return nil }
                result[id] = data
            }
            return result
        } catch {
            throw Self.storeError(error, path: path)
        }
    }

    func currentVersion(of document: DocumentID) throws -> VersionID? {
        do {
            return try plainReads.currentVersion(of: document.rawValue).map(VersionID.init(rawValue:))
        } catch {
            throw Self.storeError(error, path: path)
        }
    }

    /// SQLite reads cost no round trip: a snapshot is as cheap as single statements.
    func access<T>(_ body: (any StoreTransaction) throws -> T) throws -> T { try read(body) }

    func write<T>(durable: Bool, _ body: (any StoreTransaction) throws -> T) throws -> T {
        try writeDatabase(durable: durable) { db in try body(SQLiteTransaction(db: db, packs: packs)) }
    }

    /// On the writer connection, as a deferred commit: locks need not survive a power cut, since
    /// every mount's lease has run out by the time the machine is back.
    func lockTransaction<T>(timeout: Duration?, _ body: (any LockTransaction) throws -> T) throws -> T {
        var released = false
        let result = try writeDatabase(durable: false) { db in
            let transaction = SQLiteLockTransaction(db: db)
            let result = try body(transaction)
            released = transaction.released
            return result
        }
        if released { lockBell.ring() }
        return result
    }

    var lockGeneration: UInt64 { lockBell.generation }

    func waitForLockRelease(after generation: UInt64, timeout: Duration) -> UInt64 {
        lockBell.wait(after: generation, timeout: timeout)
    }

    func storageProblems() throws -> [String] {
        let problems: [String]
        do { problems = try pool.read { db in try String.fetchAll(db, sql: "PRAGMA integrity_check") } } catch
        {
            throw Self.storeError(error, path: path)
        }
        let logs = unreplayedIntentLogs.withLock { $0 }.map {
            "intent log not saved yet (acknowledged fsyncs wait in it; the next opening tries again): \($0)"
        }
        return (problems == ["ok"] ? [] : problems.map { "SQLite: \($0)" }) + logs
    }

    /// Gives freed pages back to the file system: a store made before incremental vacuum is
    /// rebuilt once by a VACUUM (which needs the file's size again in free disk); later ones
    /// only truncate their free pages. The write-ahead log is truncated too, and packs give
    /// their garbage back first (``collectPacks(movingAll:)``).
    func reclaimSpace() throws {
        try collectPacks()
        try truncatingLog { db in
            if try Int.fetchOne(db, sql: "PRAGMA auto_vacuum") != 2 {
                try db.execute(sql: "PRAGMA auto_vacuum = INCREMENTAL")
                try db.execute(sql: "VACUUM")
            } else {
                try db.execute(sql: "PRAGMA incremental_vacuum")
            }
        }
    }

    func checkpoint() throws { try truncatingLog { _ in } }

    /// A checkpoint that empties the log, on a connection of its own that waits at most
    /// `seconds` for other connections' reads (the writer's waits 30 s); nil when it did, else
    /// why not.
    func emptyLog(waiting seconds: Int32) -> String? {
        checkpointer.excluding { () -> String? in
            // FULL: the log is synced before it is copied, the file before the log is emptied.
            guard
                let db = openPlainConnection(
                    path, setup: "PRAGMA synchronous = FULL; SELECT count(*) FROM sqlite_schema")
            else { return "cannot open \(path)" }
            defer { sqlite3_close_v2(db) }
            sqlite3_busy_timeout(db, seconds * 1000)
            guard sqlite3_wal_checkpoint_v2(db, nil, SQLITE_CHECKPOINT_TRUNCATE, nil, nil) == SQLITE_OK else {
                return String(cString: sqlite3_errmsg(db))
            }
            return nil
        }
    }

    /// Runs `body` on the writer, then copies the whole log into the database file and empties
    /// it. A checkpoint running elsewhere makes that fail at once with SQLITE_BUSY (SQLite calls
    /// no busy handler for it): this store's own background checkpoints are held off meanwhile,
    /// another process's are waited out, for up to 10 s; `body` runs once.
    private func truncatingLog(_ body: (Database) throws -> Void) throws {
        do {
            try checkpointer.excluding {
                try pool.writeWithoutTransaction(body)
                var attempts = 0
                while true {
                    do {
                        _ = try pool.writeWithoutTransaction { try $0.checkpoint(.truncate) }
                        return
                    } catch let error as DatabaseError
                        where error.resultCode == .SQLITE_BUSY && attempts < 200
                    {
                        attempts += 1
                        usleep(50_000)
                    }
                }
            }
        } catch {
            throw Self.storeError(error, path: path)
        }
    }

    /// Makes every save committed before the call durable, deferred ones included.
    func synchronize() throws {
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
        // Every version committed before the sync is durable once it succeeded.
        let newest = try? pool.read { db in try Int64.fetchOne(db, sql: "SELECT max(id) FROM versions") }
        let log = open(path + "-wal", O_RDONLY | O_CLOEXEC)
        if log >= 0 {
            defer { close(log) }
            try Self.fsyncRetrying(log, path: path, doing: "synchronize")
            try Self.syncFolder(
                (path as NSString).deletingLastPathComponent, path: path, doing: "synchronize")
        } else if errno != ENOENT {
            throw Self.systemError(errno, path: path, doing: "synchronize")
        }
        if let newest = newest ?? nil { durableThrough.max(newest, ordering: .acquiringAndReleasing) }
    }

    /// `fsync`, retried when interrupted; a failure is reported for the store at `path`.
    static func fsyncRetrying(_ fd: Int32, path: String, doing what: String) throws {
        try StoreFiles.fsyncRetrying(fd, path: path, doing: what)
    }

    /// Syncs `folder` (the empty path: the current one), so that entries made in it survive a
    /// power cut; a failure is reported for `path`.
    static func syncFolder(_ folder: String, path: String, doing what: String) throws {
        try StoreFiles.syncFolder(folder, path: path, doing: what)
    }

}
