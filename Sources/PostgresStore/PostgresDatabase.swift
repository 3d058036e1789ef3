import DocumentEngine
import Foundation
import Logging
import PostgresNIO
import Synchronization

/// A value bound to a query parameter.
enum SQLValue: Sendable {
    case int(Int64)
    case text(String)
    case bytes(Data)
    case null
}

extension SQLValue: ExpressibleByIntegerLiteral, ExpressibleByStringLiteral {
    init(integerLiteral value: Int64) { self = .int(value) }
    init(stringLiteral value: String) { self = .text(value) }
    init(_ value: Int64?) { self = value.map(SQLValue.int) ?? .null }
    init(_ value: Int) { self = .int(Int64(value)) }
    init(_ value: String?) { self = value.map(SQLValue.text) ?? .null }
    init(_ value: Data?) { self = value.map(SQLValue.bytes) ?? .null }
}

/// One result row, read by column name. A value of the wrong type or an unexpected NULL is a
/// damaged store, reported as an error rather than a crash.
struct SQLRow {
    let row: PostgresRandomAccessRow

    init(_ row: PostgresRow) { self.row = row.makeRandomAccess() }

    /// The result's column names, in order.
    var columnNames: [String] { row.map(\.columnName) }

    private func cell(_ column: String) throws -> PostgresCell {
        guard row.contains(column) else {
            throw DocumentStoreError.corrupt(path: "", reason: "a result has no column \(column)")
        }
        return row[column]
    }

    func optionalInt(_ column: String) throws -> Int64? {
        let cell = try cell(column)
        guard cell.bytes != nil else { return nil }
        do { return try cell.decode(Int64.self) } catch {
            throw DocumentStoreError.corrupt(path: "", reason: "column \(column) is not an integer")
        }
    }

    func int(_ column: String) throws -> Int64 {
        guard let value = try optionalInt(column) else {
            throw DocumentStoreError.corrupt(path: "", reason: "column \(column) is NULL")
        }
        return value
    }

    func optionalString(_ column: String) throws -> String? {
        let cell = try cell(column)
        guard cell.bytes != nil else { return nil }
        do { return try cell.decode(String.self) } catch {
            throw DocumentStoreError.corrupt(path: "", reason: "column \(column) is not text")
        }
    }

    func string(_ column: String) throws -> String {
        guard let value = try optionalString(column) else {
            throw DocumentStoreError.corrupt(path: "", reason: "column \(column) is NULL")
        }
        return value
    }

    /// The value at `index` (of the column `column`, for messages); nil for NULL.
    func decode<Value: PostgresDecodable>(_ index: Int, _ column: String, as _: Value.Type, _ what: String)
        throws
        -> Value?
    {
        guard index < row.count else {
            throw DocumentStoreError.corrupt(path: "", reason: "a result has no column \(column)")
        }
        let cell = row[index]
        guard cell.bytes != nil else { return nil }
        do { return try cell.decode(Value.self) } catch {
            throw DocumentStoreError.corrupt(path: "", reason: "column \(column) is not \(what)")
        }
    }

    func optionalData(_ column: String) throws -> Data? {
        let cell = try cell(column)
        guard cell.bytes != nil else { return nil }
        do { return try cell.decode(Data.self) } catch {
            throw DocumentStoreError.corrupt(path: "", reason: "column \(column) is not bytes")
        }
    }
}

/// One connection lent to a caller for a few statements. Every wait is bounded: a server that
/// does not answer within the timeout closes the connection and fails the statement.
struct SQLConnection {
    /// Counts statements that completed, so a caller can tell whether anything ran.
    final class Counter: @unchecked Sendable {
        // Used by the one thread the connection is lent to.
        var completed = 0
    }

    let connection: PostgresConnection
    let logger: Logger
    let timeout: Duration
    let location: String
    let counter = Counter()

    @discardableResult
    func query(_ sql: String, _ values: [SQLValue] = []) throws -> [SQLRow] {
        var binds = PostgresBindings(capacity: values.count)
        for value in values {
            switch value {
            case .int(let v): binds.append(v)
            case .text(let v): binds.append(v)
            case .bytes(let v): binds.append(ByteBuffer(bytes: v))
            case .null: binds.appendNull()
            }
        }
        let future = connection.query(PostgresQuery(unsafeSQL: sql, binds: binds), logger: logger)
        let result = try wait(future)
        counter.completed += 1
        return result.map(SQLRow.init)
    }

    /// The first row's first column as an integer, or nil without rows or for NULL.
    func scalar(_ sql: String, _ values: [SQLValue] = []) throws -> Int64? {
        guard let row = try query(sql, values).first, row.row.count > 0 else { return nil }
        let cell = row.row[0]
        guard cell.bytes != nil else { return nil }
        do { return try cell.decode(Int64.self) } catch {
            throw DocumentStoreError.corrupt(path: "", reason: "a result is not an integer")
        }
    }

    func exists(_ sql: String, _ values: [SQLValue] = []) throws -> Bool {
        try !query(sql, values).isEmpty
    }

    func wait<T: Sendable>(_ future: EventLoopFuture<T>) throws -> T {
        try PostgresDatabase.wait(future, timeout: timeout, location: location) {
            connection.closeSoon()
        }
    }
}

/// A small pool of PostgreSQL connections on one event loop thread of its own, used through
/// blocking calls.
///
/// The blocking waits run on the caller's thread (a FUSE worker, a command's main thread, a test)
/// and never on an event loop or a Swift-concurrency pool thread's work: all of postgres-nio's
/// work happens on this pool's own event loop, so a blocked caller cannot starve it.
final class PostgresDatabase: Sendable {
    let configuration: PostgresConnection.Configuration
    /// Where the database is, without the password, for messages.
    let location: String
    let timeout: Duration
    let logger: Logger
    private let group: MultiThreadedEventLoopGroup
    private let idle = Mutex<[PostgresConnection]>([])
    private let nextID = Atomic<Int>(1)
    private static let maxIdle = 4

    init(configuration: PostgresConnection.Configuration, location: String, timeout: Duration, logger: Logger)
    {
        var configuration = configuration
        configuration.options.connectTimeout = .seconds(Int64(max(1, timeout.components.seconds)))
        self.configuration = configuration
        self.location = location
        self.timeout = timeout
        self.logger = logger
        group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    }

    deinit {
        for connection in idle.withLock({ $0 }) { connection.closeSoon() }
        // Shut down from another thread: the group may be released on one of its own.
        let group = self.group
        Thread.detachNewThread { try? group.syncShutdownGracefully() }
    }

    /// Opens a new connection (not pooled), e.g. for LISTEN.
    func connect() throws -> PostgresConnection {
        let id = nextID.add(1, ordering: .relaxed).oldValue
        let future = PostgresConnection.connect(
            on: group.next(), configuration: configuration, id: id, logger: logger)
        return try Self.wait(future, timeout: timeout, location: location) {
            // Connected too late: nobody will use it.
            future.whenSuccess { $0.closeSoon() }
        }
    }

    /// Runs `body` with a pooled connection. A connection that failed (closed, timed out) is
    /// dropped, so the next call reconnects.
    @discardableResult
    func withConnection<T>(_ body: (SQLConnection) throws -> T) throws -> T {
        let pooled = idle.withLock { $0.popLast() }
        if let pooled {
            if !pooled.isClosed {
                let lent = SQLConnection(
                    connection: pooled, logger: logger, timeout: timeout, location: location)
                do {
                    return try use(lent, body)
                } catch  where lent.counter.completed == 0 && Self.isConnectionFailure(error) {
                    // The server dropped the idle connection (a restart, a failover) and nothing
                    // ran on it: the same request on a new connection is safe.
                    logger.debug("a pooled connection was closed; reconnecting")
                } catch {
                    throw Self.storeError(error, location: location)
                }
            } else {
                pooled.closeSoon()
            }
        }
        do {
            let lent = SQLConnection(
                connection: try connect(), logger: logger, timeout: timeout, location: location)
            return try use(lent, body)
        } catch {
            throw Self.storeError(error, location: location)
        }
    }

    /// Runs `body` on `lent`, then pools the connection, or closes it if it may be broken.
    private func use<T>(_ lent: SQLConnection, _ body: (SQLConnection) throws -> T) throws -> T {
        do {
            let result = try body(lent)
            giveBack(lent.connection)
            return result
        } catch {
            if Self.leavesConnectionUsable(error) {
                giveBack(lent.connection)
            } else {
                lent.connection.closeSoon()
            }
            throw error
        }
    }

    /// Whether `error` says the connection failed (rather than the server refusing a statement).
    private static func isConnectionFailure(_ error: any Error) -> Bool {
        if let error = error as? PSQLError { return error.serverInfo == nil }
        return false
    }

    private func giveBack(_ connection: PostgresConnection) {
        if connection.isClosed { return }
        let extra = idle.withLock { idle -> PostgresConnection? in
            if idle.count >= Self.maxIdle { return connection }
            idle.append(connection)
            return nil
        }
        extra?.closeSoon()
    }

    /// Whether a connection that met `error` can serve again: after the server's own answer (a
    /// constraint, a missing row) yes; after a timeout or a broken channel, no.
    private static func leavesConnectionUsable(_ error: any Error) -> Bool {
        if let error = error as? PSQLError { return error.serverInfo != nil }
        if case DocumentStoreError.io = error { return false }
        return error is DocumentStoreError
    }

    /// Runs `body` in one transaction: committed if it returns, rolled back if it throws.
    @discardableResult
    func transaction<T>(
        readOnly: Bool = false, _ body: (SQLConnection) throws -> T
    ) throws -> T {
        try withConnection { connection in
            try connection.query(
                readOnly
                    ? "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
                    : "BEGIN ISOLATION LEVEL READ COMMITTED")
            do {
                let result = try body(connection)
                try connection.query("COMMIT")
                return result
            } catch {
                if !connection.connection.isClosed { _ = try? connection.query("ROLLBACK") }
                throw error
            }
        }
    }

    /// Waits for `future` at most `timeout`; on timeout runs `cancel` and throws.
    static func wait<T: Sendable>(
        _ future: EventLoopFuture<T>, timeout: Duration, location: String, cancel: () -> Void
    ) throws -> T {
        let done = DispatchSemaphore(value: 0)
        let box = ResultBox<T>()
        future.whenComplete { result in
            box.value.withLock { $0 = result }
            done.signal()
        }
        let seconds = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18
        if done.wait(timeout: .now() + seconds) == .timedOut {
            cancel()
            throw DocumentStoreError.io(
                "the PostgreSQL store \(location) did not answer within \(Int(seconds)) s")
        }
        guard let result = box.value.withLock({ $0 }) else {
            throw DocumentStoreError.io("the PostgreSQL store \(location) gave no result")
        }
        return try result.get()
    }

    /// PostgreSQL's errors as the store's, naming the problem.
    static func storeError(_ error: any Error, location: String) -> any Error {
        if error is DocumentStoreError { return error }
        guard let error = error as? PSQLError else { return error }
        if let server = error.serverInfo {
            let message = server[.message] ?? "error"
            let state = server[.sqlState] ?? ""
            switch state {
            case "53100", "53000": return DocumentStoreError.noSpace(location)
            case "3D000": return DocumentStoreError.notAStore(path: location, reason: "no such database")
            case "XX001", "XX002": return DocumentStoreError.corrupt(path: location, reason: message)
            default:
                return DocumentStoreError.io("the PostgreSQL store \(location): \(message) (\(state))")
            }
        }
        return DocumentStoreError.io(
            "cannot reach the PostgreSQL store \(location): \(String(describing: error.code))")
    }
}

private final class ResultBox<T: Sendable>: Sendable {
    let value = Mutex<Result<T, any Error>?>(nil)
}

extension PostgresConnection {
    /// Starts closing the connection without waiting for it. The connection stays alive until
    /// it is closed (postgres-nio asserts that no open connection is freed).
    func closeSoon() {
        let closed: EventLoopFuture<Void> = close()
        closed.whenComplete { _ in withExtendedLifetime(self) {} }
    }
}
