import DocumentEngine
import Foundation
import PostgresStore
import SQLiteStore
import Synchronization
import VersionedStore

/// The store implementations the store-level and mount-level suites run against.
public enum StoreKind: String, Sendable, CustomStringConvertible {
    /// ``MemoryStore``: the algorithm without a database, for tests where the database is not
    /// what is tested.
    case memory
    case sqlite
    case postgres

    public var description: String { rawValue }

    /// The environment variable naming the PostgreSQL server the tests use (scripts/test.sh
    /// starts one and sets it).
    public static let postgresVariable = "DOCFS_TEST_POSTGRES_URL"

    /// The server's URL, if the tests have one.
    public static var postgresURL: String? {
        ProcessInfo.processInfo.environment[postgresVariable].flatMap { $0.isEmpty ? nil : $0 }
    }

    /// SQLite, and PostgreSQL when ``postgresURL`` is set. scripts/test.sh always sets it, so CI
    /// runs both; a bare `swift test` without a server runs SQLite only.
    public static var all: [StoreKind] { postgresURL == nil ? [.sqlite] : [.sqlite, .postgres] }

    /// Every backend, memory included: the store contract holds on each.
    public static var everyBackend: [StoreKind] { [.memory] + all }
}

/// A fresh, empty store of one kind, removed with the fixture: for SQLite a file in a temporary
/// folder, for PostgreSQL a database of its own on the test server (dropped at the end).
public final class StoreFixture: Sendable {
    public let kind: StoreKind
    public let store: any VersionedDocumentStore
    /// For SQLite, the store file; for PostgreSQL, the database URL.
    public let location: String
    /// A folder of the fixture's own (the SQLite store's), removed with it.
    public let directory: String
    private let postgres: PostgresStore.Configuration?

    private static let counter = Atomic<Int>(0)

    public init(_ kind: StoreKind, chunkSize: Int = VersionedStore.defaultChunkSize, name: String = "Test")
        throws
    {
        self.kind = kind
        var template = Array("\(NSTemporaryDirectory())/docfs-store-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw CocoaError(.fileWriteUnknown) }
        directory = String(cString: made)
        switch kind {
        case .memory:
            store = MemoryStore(location: name, chunkSize: chunkSize)
            location = name
            postgres = nil
        case .sqlite:
            let path = directory + "/\(name).docstore"
            store = try SQLiteStore(path: path, options: .create, chunkSize: chunkSize)
            location = path
            postgres = nil
        case .postgres:
            let configuration = try Self.newDatabase()
            postgres = configuration
            do {
                store = try PostgresStore(
                    configuration: configuration, options: .create, chunkSize: chunkSize)
            } catch {
                // No deinit runs for a failed init: the database would stay behind.
                try? PostgresStore.dropDatabase(configuration)
                throw error
            }
            location = configuration.url
        }
    }

    deinit {
        if let postgres { try? PostgresStore.dropDatabase(postgres) }
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// A new, empty database on the test server.
    public static func newDatabase() throws -> PostgresStore.Configuration {
        guard let url = StoreKind.postgresURL else {
            throw DocumentStoreError.io("\(StoreKind.postgresVariable) is not set; run scripts/test.sh")
        }
        let number = counter.add(1, ordering: .relaxed).newValue
        let name = "docfs_test_\(getpid())_\(number)_\(UInt32.random(in: 0..<UInt32.max))"
        let configuration = try PostgresStore.Configuration(url: url).with(database: name)
        try PostgresStore.createDatabase(configuration)
        return configuration
    }

    /// Another store object on the same store, as another process would open it.
    public func reopen() throws -> any VersionedDocumentStore {
        switch kind {
        case .memory: return store  // a store in memory is one process's; share the object
        case .sqlite: return try SQLiteStore(path: location)
        case .postgres:
            guard let postgres else { throw DocumentStoreError.io("no PostgreSQL configuration") }
            return try PostgresStore(configuration: postgres)
        }
    }

    /// Drops the store's chunk cache, so the next reads come from the database.
    public func purgeCache() {
        store.purgeCache()
    }

    /// Cuts the store's database off: every connection to it is closed and new ones are refused,
    /// as when the server is down or unreachable, for this test's database only.
    public func cutConnections() throws {
        try admin("ALTER DATABASE \"\(try databaseName())\" ALLOW_CONNECTIONS false")
        try admin(
            """
            SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
            WHERE datname = '\(try databaseName())' AND pid <> pg_backend_pid()
            """)
    }

    /// Lets connections to the store's database in again.
    public func allowConnections() throws {
        try admin("ALTER DATABASE \"\(try databaseName())\" ALLOW_CONNECTIONS true")
    }

    private func databaseName() throws -> String {
        guard let postgres else { throw DocumentStoreError.io("not a PostgreSQL store") }
        return postgres.database
    }

    /// Runs a statement on the test server's maintenance database.
    @discardableResult
    private func admin(_ statement: String) throws -> String {
        guard let url = StoreKind.postgresURL else { throw DocumentStoreError.io("no test server") }
        return try Self.run(
            "/usr/bin/psql", ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", url, "-c", statement])
    }

    /// Runs one SQL statement on the store's database with the database's own command-line client
    /// (sqlite3 or psql); returns the output rows, one per line, columns joined by "|". Write SQL
    /// both understand (CAST, CASE, ||).
    @discardableResult
    public func sql(_ statement: String) throws -> String {
        switch kind {
        case .memory:
            throw DocumentStoreError.io("a store in memory has no SQL")
        case .sqlite:
            return try Self.run("/usr/bin/sqlite3", ["-bail", location, statement])
        case .postgres:
            return try Self.run(
                "/usr/bin/psql", ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", location, "-c", statement])
        }
    }

    private static func run(_ executable: String, _ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        let message = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw DocumentStoreError.io(
                "\(executable) \(arguments.last ?? ""): \(String(decoding: message, as: UTF8.self))")
        }
        var text = String(decoding: data, as: UTF8.self)
        if text.hasSuffix("\n") { text.removeLast() }
        return text
    }
}
