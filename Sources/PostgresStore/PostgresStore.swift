import DocumentEngine
import Foundation
import Logging
import Synchronization
import VersionedStore

/// The shared document store: one PostgreSQL database, used by several processes and machines.
///
/// The versioned-store algorithm is ``VersionedStore``'s, as for the embedded store; this type
/// opens the database, checks it holds a DocFS store, and runs the algorithm's transactions on
/// PostgreSQL (``PostgresBackend``).
///
/// Writers take turns on one advisory lock (as SQLite's writers do on its write lock); readers
/// never wait for them. Every write that records an event notifies the channel `docfs_events`, so
/// observers in other processes learn of it at once (see ``waitForChange(after:timeout:)``).
///
/// Methods block the calling thread on network I/O (libpq, with a deadline on every wait), so they
/// may be called from any thread that may block.
public final class PostgresStore: VersionedDocumentStore, StoreChangeNotifying, Sendable {
    /// How to open a store.
    public struct OpenOptions: OptionSet, Sendable {
        public let rawValue: Int
        public init(rawValue: Int) { self.rawValue = rawValue }
        /// Create the store's tables if the database has none.
        public static let create = OpenOptions(rawValue: 1)
    }

    public let configuration: Configuration
    public let versionedStore: VersionedStore
    let database: PostgresDatabase
    let listener: ChangeListener

    /// Opens the store in `configuration`'s database, creating its tables with `options: .create`
    /// (and `chunkSize`) if the database has none. The database itself must exist.
    ///
    /// A database without DocFS's tables (unless created), another application's database, or one
    /// written by a newer DocFS is refused with a ``DocumentStoreError`` that names the problem.
    public init(
        configuration: Configuration, options: OpenOptions = [],
        chunkSize: Int = VersionedStore.defaultChunkSize, logger: Logger = Logger(label: "docfs.postgres")
    ) throws {
        self.configuration = configuration
        let location = configuration.url
        let database = PostgresDatabase(
            parameters: configuration.connectionParameters(), location: location,
            timeout: configuration.timeout, logger: logger)
        guard chunkSize > 0, chunkSize <= VersionedStore.maximumChunkSize else {
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
                for statement in (PostgresSchema.tables + ";" + PostgresSchema.lockTables).split(
                    separator: ";")
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
            if format < PostgresSchema.formatVersion { try PostgresSchema.migrate(db, from: format) }
            return size
        }
        self.database = database
        versionedStore = VersionedStore(backend: PostgresBackend(database: database, chunkSize: Int(stored)))
        listener = ChangeListener(database: database)
    }

    deinit { listener.stop() }

    // MARK: Change notifications

    public var changeGeneration: UInt64 { listener.start() }

    public func waitForChange(after generation: UInt64, timeout: Duration) -> UInt64 {
        listener.wait(after: generation, timeout: timeout)
    }
}

/// PostgreSQL's side of the versioned store: its connections, its dialect and its round-trip
/// savings (lookups in one statement, slices of chunks).
final class PostgresBackend: StoreBackend {
    let database: PostgresDatabase
    let chunkSize: Int
    var location: String { database.location }

    /// Hears other mounts' lock releases.
    let lockListener: ChangeListener

    init(database: PostgresDatabase, chunkSize: Int) {
        self.database = database
        self.chunkSize = chunkSize
        lockListener = ChangeListener(database: database, channel: PostgresSchema.lockChannel)
    }

    deinit { lockListener.stop() }

    /// Its own short transaction, taking turns on the lock tables' advisory lock (not the
    /// store's write lock), committed without waiting for the server's flush. A mount that stops
    /// in the middle of one (a machine cut off, a stopped process) would hold every other
    /// mount's lock requests: the server ends a transaction idle for 3 s.
    func lockTransaction<T>(timeout: Duration?, _ body: (any LockTransaction) throws -> T) throws -> T {
        try database.transaction(timeout: timeout) { db in
            try db.query(
                """
                SELECT set_config('idle_in_transaction_session_timeout', '3000', true),
                    pg_advisory_xact_lock($1), set_config('synchronous_commit', 'off', true)
                """,
                [.int(PostgresSchema.lockTablesLock)])
            return try body(PostgresLockTransaction(db: db))
        }
    }

    var lockGeneration: UInt64 { lockListener.start() }

    func waitForLockRelease(after generation: UInt64, timeout: Duration) -> UInt64 {
        lockListener.wait(after: generation, timeout: timeout)
    }

    /// One read-only `REPEATABLE READ` snapshot, so several statements see one state of the store.
    func read<T>(_ body: (any StoreTransaction) throws -> T) throws -> T {
        try database.transaction(readOnly: true) { db in try body(PostgresTransaction(db: db)) }
    }

    /// Statements on a pooled connection without BEGIN and COMMIT: two round trips fewer.
    func access<T>(_ body: (any StoreTransaction) throws -> T) throws -> T {
        try database.withConnection { db in try body(PostgresTransaction(db: db)) }
    }

    /// One write transaction holding the store's write lock. A durable one returns once the
    /// commit is on the server's disk; otherwise it commits without waiting for the flush
    /// (`synchronous_commit = off`): atomic and seen by everyone at once, but a server crash may
    /// lose it until ``synchronize()`` returns.
    func write<T>(durable: Bool, _ body: (any StoreTransaction) throws -> T) throws -> T {
        // Every statement is a round trip: a deferred commit is set with the lock, in one.
        try database.transaction { db in
            try db.query(
                durable
                    ? "SELECT pg_advisory_xact_lock($1)"
                    : "SELECT pg_advisory_xact_lock($1), set_config('synchronous_commit', 'off', true)",
                [.int(PostgresSchema.writeLock)])
            return try body(PostgresTransaction(db: db))
        }
    }

    /// A commit that waits for the flush of the server's log flushes everything logged before it.
    func synchronize() throws {
        try database.transaction { db in
            // The server waits for the flush only when the transaction logged a change before its
            // commit record (RecordTransactionCommit's `wrote_xlog`): one with only an id commits
            // asynchronously, and a power cut then takes every deferred commit before it. So it
            // changes a row.
            try db.query(
                """
                INSERT INTO store_meta(key, value) VALUES ('synchronized', 1)
                ON CONFLICT (key) DO UPDATE SET value = store_meta.value + 1
                """)
        }
    }

    /// Marks the deleted rows' space reusable (VACUUM cannot run inside a transaction), and gives
    /// the chunks' space back to the file system when most of it is free: a plain VACUUM only
    /// lets the server reuse it. `VACUUM FULL` locks the table while it copies the live chunks,
    /// so it runs only then, when there is little to copy (under a quarter of the table, which
    /// is over 64 MiB).
    func reclaimSpace() throws {
        try database.withConnection { db in
            try db.query("VACUUM (ANALYZE) chunks, extents, extents_live, nodes, versions, events")
            let table = try db.scalar("SELECT pg_total_relation_size('chunks')") ?? 0
            let live = try db.scalar("SELECT COALESCE(SUM(size), 0)::bigint FROM chunks") ?? 0
            if table > 64 << 20, live * 4 < table {
                try db.query("VACUUM (FULL, ANALYZE) chunks")
            }
        }
    }

    /// A chunk is stored uncompressed and out of line, so the server reads only the TOAST slices
    /// of the bytes asked for, not the whole chunk.
    func chunkSlice(_ id: Int64, _ range: Range<Int>) throws -> Data? {
        try database.withConnection { db in
            try db.query(
                "SELECT substring(data FROM $2::int FOR $3::int) AS part FROM chunks WHERE id = $1",
                [.int(id), .int(Int64(range.lowerBound + 1)), .int(Int64(range.count))]
            ).first?.optionalData("part")
        }
    }

    /// Answers `lookups` in one statement, in their order; a lookup at a version that does not
    /// exist fails with `noSuchVersion`.
    func mainLineLookups(_ lookups: [NodeLookup]) throws -> [Result<MainLineAnswer, any Error>]? {
        try database.withConnection { db in try Self.mainLineLookups(db, lookups) }
    }

    static func mainLineLookups(_ db: SQLConnection, _ lookups: [NodeLookup]) throws
        -> [Result<MainLineAnswer, any Error>]
    {
        let array: ([Int64?]) -> SQLValue = PostgresTransaction.array
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
        let columns = try rows.first.map { try NodeColumns($0.columnNames) }
        for row in rows {
            guard let index = try? Int(row.int("lookup_index")) - 1, answers.indices.contains(index) else {
                throw DocumentStoreError.corrupt(path: "", reason: "a lookup came back without its index")
            }
            let version = lookups[index].version
            answers[index] = Result {
                if try row.int("version_missing") != 0 { return .noSuchVersion }
                if version != nil, try row.int("version_branch") != 0 { return .onConflictBranch }
                guard try row.optionalInt("node") != nil, try row.int("removed") == 0 else {
                    return .record(nil)
                }
                guard let columns else { return .record(nil) }
                return .record(try columns.record(row))
            }
        }
        return try answers.map { answer in
            guard let answer else {
                throw DocumentStoreError.corrupt(path: "", reason: "a lookup came back without an answer")
            }
            return answer
        }
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
        let admin = serverDatabase(configuration, logger: logger)
        return try admin.withConnection { db in
            if try db.exists("SELECT 1 FROM pg_database WHERE datname = $1", [.text(configuration.database)])
            {
                return false
            }
            do {
                try db.query("CREATE DATABASE \(quotedIdentifier(configuration.database))")
            } catch let error as PostgresError where error.sqlState == "42P04" {
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
        let admin = serverDatabase(configuration, logger: logger)
        try admin.withConnection { db in
            try db.query("DROP DATABASE IF EXISTS \(quotedIdentifier(configuration.database)) WITH (FORCE)")
        }
    }

    /// The server's `postgres` database, for creating and dropping `configuration`'s.
    private static func serverDatabase(_ configuration: Configuration, logger: Logger) -> PostgresDatabase {
        let server = configuration.with(database: "postgres")
        return PostgresDatabase(
            parameters: server.connectionParameters(), location: server.url, timeout: configuration.timeout,
            logger: logger)
    }

    /// `name` as an SQL identifier in double quotes.
    static func quotedIdentifier(_ name: String) -> String {
        "\"" + name.replacingOccurrences(of: "\"", with: "\"\"") + "\""
    }
}
