import CLibPQ
import DocumentEngine
import Foundation
import Logging
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

/// An error PostgreSQL or libpq reported.
struct PostgresError: Error, CustomStringConvertible {
    /// The server's SQLSTATE code; nil when the server did not answer (libpq's own errors).
    let sqlState: String?
    let message: String
    /// Whether the connection is gone: nothing more can run on it.
    let connectionLost: Bool

    var description: String { sqlState.map { "\(message) (\($0))" } ?? message }

    /// A connection used after it was closed.
    static let closed = PostgresError(
        sqlState: nil, message: "the connection is closed", connectionLost: true)
}

/// The server's types a result column can have, as far as decoding cares (`pg_type.oid`).
private enum TypeOID {
    static let bytea: Oid = 17
    static let name: Oid = 19
    static let int8: Oid = 20
    static let int2: Oid = 21
    static let int4: Oid = 23
    static let text: Oid = 25
    static let oid: Oid = 26
    static let unknown: Oid = 705
    static let bpchar: Oid = 1042
    static let varchar: Oid = 1043
}

/// A value decoded from a result column in binary format.
protocol SQLDecodable {
    /// The value of `bytes`, a column of type `type`; nil if the type does not decode to it.
    static func decode(_ bytes: UnsafeRawBufferPointer, type: Oid) -> Self?
}

extension Int64: SQLDecodable {
    static func decode(_ bytes: UnsafeRawBufferPointer, type: Oid) -> Int64? {
        // Big-endian, of the column's own width.
        func read<T: FixedWidthInteger>(_: T.Type) -> T? {
            guard bytes.count == MemoryLayout<T>.size else { return nil }
            return T(bigEndian: bytes.loadUnaligned(as: T.self))
        }
        switch type {
        case TypeOID.int8: return read(Int64.self)
        case TypeOID.int4: return read(Int32.self).map(Int64.init)
        case TypeOID.int2: return read(Int16.self).map(Int64.init)
        case TypeOID.oid: return read(UInt32.self).map(Int64.init)
        default: return nil
        }
    }
}

extension String: SQLDecodable {
    static func decode(_ bytes: UnsafeRawBufferPointer, type: Oid) -> String? {
        switch type {
        case TypeOID.text, TypeOID.varchar, TypeOID.name, TypeOID.bpchar, TypeOID.unknown:
            return String(decoding: bytes, as: UTF8.self)
        default: return nil
        }
    }
}

extension Data: SQLDecodable {
    static func decode(_ bytes: UnsafeRawBufferPointer, type: Oid) -> Data? { Data(bytes) }
}

/// A statement's result (libpq's `PGresult`), freed with its last row. Not `Sendable`: it is
/// read on the thread that ran the statement, with the connection.
final class QueryResult {
    let pointer: OpaquePointer
    let rowCount: Int
    let columnNames: [String]

    init(_ pointer: OpaquePointer) {
        self.pointer = pointer
        rowCount = Int(PQntuples(pointer))
        columnNames = (0..<PQnfields(pointer)).map { String(cString: PQfname(pointer, $0)) }
    }

    deinit { PQclear(pointer) }

    var rows: [SQLRow] { (0..<rowCount).map { SQLRow(result: self, index: Int32($0)) } }
}

/// One result row, read by column name or position. A value of the wrong type or an unexpected
/// NULL is a damaged store, reported as an error rather than a crash.
struct SQLRow {
    let result: QueryResult
    let index: Int32

    /// The result's column names, in order.
    var columnNames: [String] { result.columnNames }

    private func position(_ column: String) throws -> Int {
        guard let position = result.columnNames.firstIndex(of: column) else {
            throw DocumentStoreError.corrupt(path: "", reason: "a result has no column \(column)")
        }
        return position
    }

    func optionalInt(_ column: String) throws -> Int64? {
        try decode(position(column), column, as: Int64.self, "an integer")
    }

    func int(_ column: String) throws -> Int64 {
        guard let value = try optionalInt(column) else {
            throw DocumentStoreError.corrupt(path: "", reason: "column \(column) is NULL")
        }
        return value
    }

    func optionalString(_ column: String) throws -> String? {
        try decode(position(column), column, as: String.self, "text")
    }

    func string(_ column: String) throws -> String {
        guard let value = try optionalString(column) else {
            throw DocumentStoreError.corrupt(path: "", reason: "column \(column) is NULL")
        }
        return value
    }

    func optionalData(_ column: String) throws -> Data? {
        try decode(position(column), column, as: Data.self, "bytes")
    }

    /// The value at `index` (of the column `column`, for messages); nil for NULL.
    func decode<Value: SQLDecodable>(_ index: Int, _ column: String, as _: Value.Type, _ what: String)
        throws -> Value?
    {
        guard index >= 0, index < result.columnNames.count else {
            throw DocumentStoreError.corrupt(path: "", reason: "a result has no column \(column)")
        }
        let field = Int32(index)
        let pointer = result.pointer
        if PQgetisnull(pointer, self.index, field) != 0 { return nil }
        let length = Int(PQgetlength(pointer, self.index, field))
        let bytes = UnsafeRawBufferPointer(start: PQgetvalue(pointer, self.index, field), count: length)
        guard let value = Value.decode(bytes, type: PQftype(pointer, field)) else {
            throw DocumentStoreError.corrupt(path: "", reason: "column \(column) is not \(what)")
        }
        return value
    }
}

/// One libpq connection in non-blocking mode, used by one thread at a time (the pool lends it
/// out; the change listener owns its own). Every wait has a deadline: a server that does not
/// answer in time closes the connection and fails the statement.
// @unchecked: libpq's PGconn, a C pointer, used by one thread at a time.
final class PostgresConnection: @unchecked Sendable {
    // Touched only by the one thread the connection is lent to.
    private var handle: OpaquePointer?
    let location: String

    private init(handle: OpaquePointer, location: String) {
        self.handle = handle
        self.location = location
    }

    deinit { close() }

    /// Closes the connection; it cannot be used again.
    func close() {
        if let handle { PQfinish(handle) }
        handle = nil
    }

    /// Whether the connection is open and outside any transaction, so the pool may lend it again.
    var isReusable: Bool {
        guard let handle else { return false }
        return PQstatus(handle) == CONNECTION_OK && PQtransactionStatus(handle) == PQTRANS_IDLE
    }

    /// Connects with libpq's connection `parameters` (keyword, value) within `timeout`.
    static func connect(_ parameters: [(String, String)], timeout: Duration, location: String) throws
        -> PostgresConnection
    {
        let deadline = ContinuousClock.now + timeout
        let keys = parameters.map { strdup($0.0) } + [nil]
        let values = parameters.map { strdup($0.1) } + [nil]
        defer { for pointer in keys + values { free(pointer) } }
        let started = keys.withUnsafeBufferPointer { keys in
            values.withUnsafeBufferPointer { values in
                PQconnectStartParams(
                    UnsafeRawPointer(keys.baseAddress!).assumingMemoryBound(to: UnsafePointer<CChar>?.self),
                    UnsafeRawPointer(values.baseAddress!).assumingMemoryBound(to: UnsafePointer<CChar>?.self),
                    0)
            }
        }
        guard let started else { throw DocumentStoreError.io("cannot connect to \(location): out of memory") }
        let connection = PostgresConnection(handle: started, location: location)
        guard PQstatus(started) != CONNECTION_BAD else { throw connection.failure() }
        try connection.within(timeout) {
            var status = PGRES_POLLING_WRITING
            while status != PGRES_POLLING_OK {
                switch status {
                case PGRES_POLLING_FAILED: throw connection.failure()
                case PGRES_POLLING_READING: try connection.waitForSocket(writing: false, until: deadline)
                default: try connection.waitForSocket(writing: true, until: deadline)
                }
                status = PQconnectPoll(started)
            }
        }
        // Non-blocking sends: a large chunk never blocks past the deadline on a stalled server.
        guard PQsetnonblocking(started, 1) == 0 else { throw connection.failure() }
        return connection
    }

    /// Runs one statement with `values` bound to `$1`, `$2`, …; results come in binary format.
    func execute(_ sql: String, _ values: [SQLValue], timeout: Duration) throws -> QueryResult {
        guard let handle else {
            throw PostgresError.closed
        }
        let deadline = ContinuousClock.now + timeout
        return try within(timeout) { try execute(handle, sql, values, until: deadline) }
    }

    private func execute(
        _ handle: OpaquePointer, _ sql: String, _ values: [SQLValue], until deadline: ContinuousClock.Instant
    ) throws -> QueryResult {
        let sent = Self.withParameters(values) { types, pointers, lengths, formats in
            PQsendQueryParams(handle, sql, Int32(values.count), types, pointers, lengths, formats, 1)
        }
        guard sent == 1 else { throw failure() }
        // What libpq could not write at once (a large chunk), written as the socket drains.
        while true {
            let flushed = PQflush(handle)
            if flushed == 0 { break }
            if flushed < 0 { throw failure() }
            try waitForSocket(writing: true, until: deadline)
            // The server may be answering already; taking its input keeps it from blocking.
            guard PQconsumeInput(handle) == 1 else { throw failure() }
        }
        // The last result, freed here unless it is handed over (a timeout can come at any wait).
        var last: OpaquePointer?
        var handedOver = false
        defer { if !handedOver, let last { PQclear(last) } }
        var error: PostgresError?
        while true {
            while PQisBusy(handle) != 0 {
                try waitForSocket(writing: false, until: deadline)
                guard PQconsumeInput(handle) == 1 else { throw failure() }
            }
            guard let next = PQgetResult(handle) else { break }
            let status = PQresultStatus(next)
            if status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK || status == PGRES_EMPTY_QUERY {
                if let last { PQclear(last) }
                last = next
            } else {
                if error == nil { error = serverError(next) }
                PQclear(next)
            }
        }
        if let error { throw error }
        guard let result = last else {
            throw PostgresError(sqlState: nil, message: "a statement gave no result", connectionLost: false)
        }
        handedOver = true
        return QueryResult(result)
    }

    /// Waits until the server sends something or `deadline` passes; takes what it sent. Returns
    /// false at the deadline.
    func awaitInput(until deadline: ContinuousClock.Instant) throws -> Bool {
        guard let handle else {
            throw PostgresError.closed
        }
        do {
            try waitForSocket(writing: false, until: deadline)
        } catch is Timeout {
            return false
        }
        guard PQconsumeInput(handle) == 1 else { throw failure() }
        return true
    }

    /// Takes the notifications (`NOTIFY`) received so far; returns how many there were.
    func takeNotifications() -> Int {
        guard let handle else { return 0 }
        var count = 0
        while let notification = PQnotifies(handle) {
            PQfreemem(notification)
            count += 1
        }
        return count
    }

    private struct Timeout: Error {}

    /// Waits until the socket is readable (or writable, with `writing`); throws ``Timeout`` at
    /// `deadline`.
    private func waitForSocket(writing: Bool, until deadline: ContinuousClock.Instant) throws {
        guard let handle, PQsocket(handle) >= 0 else { throw failure() }
        var descriptor = pollfd(
            fd: PQsocket(handle), events: Int16(POLLIN) | (writing ? Int16(POLLOUT) : 0), revents: 0)
        while true {
            let remaining = deadline - ContinuousClock.now
            guard remaining > .zero else { throw Timeout() }
            let milliseconds = remaining / .milliseconds(1)
            let ready = poll(&descriptor, 1, Int32(min(milliseconds.rounded(.up), 60_000)))
            if ready > 0 { return }
            if ready < 0 && errno != EINTR {
                let message = String(cString: strerror(errno))
                close()
                throw PostgresError(sqlState: nil, message: message, connectionLost: true)
            }
        }
    }

    /// Runs `body`, turning a ``Timeout`` into the store's error: the connection is closed, as a
    /// statement or a login was left half done.
    private func within<T>(_ timeout: Duration, _ body: () throws -> T) throws -> T {
        do {
            return try body()
        } catch is Timeout {
            close()
            let seconds = max(1, Int(timeout.components.seconds))
            throw DocumentStoreError.io("the PostgreSQL store \(location) did not answer within \(seconds) s")
        }
    }

    /// libpq's last error on this connection.
    private func failure() -> PostgresError {
        guard let handle else {
            return PostgresError.closed
        }
        let message = Self.firstLine(PQerrorMessage(handle))
        let lost = PQstatus(handle) == CONNECTION_BAD
        if lost { close() }
        return PostgresError(sqlState: nil, message: message, connectionLost: lost)
    }

    /// The server's error in `result`.
    private func serverError(_ result: OpaquePointer) -> PostgresError {
        let state = PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map { String(cString: $0) }
        let primary = PQresultErrorField(result, Int32(UInt8(ascii: "M")))
        let message = primary.map { String(cString: $0) } ?? Self.firstLine(PQresultErrorMessage(result))
        // 08: connection exceptions; 57P01/02: the server is shutting down.
        let lost =
            (handle.map { PQstatus($0) == CONNECTION_BAD } ?? true) || state?.hasPrefix("08") == true
            || state == "57P01" || state == "57P02"
        return PostgresError(sqlState: state, message: message, connectionLost: lost)
    }

    private static func firstLine(_ text: UnsafePointer<CChar>?) -> String {
        let text = text.map { String(cString: $0) } ?? ""
        let line = text.split(whereSeparator: \.isNewline).first.map(String.init) ?? ""
        return line.trimmingCharacters(in: .whitespaces).isEmpty ? "unknown error" : line
    }

    /// Calls `body` with libpq's parameter arrays for `values`, all in binary format. The values'
    /// own bytes are passed without copies; they live until `body` returns.
    private static func withParameters<R>(
        _ values: [SQLValue],
        _ body: (
            UnsafePointer<Oid>?, UnsafePointer<UnsafePointer<CChar>?>?, UnsafePointer<Int32>?,
            UnsafePointer<Int32>?
        ) -> R
    ) -> R {
        var types: [Oid] = []
        var pointers: [UnsafePointer<CChar>?] = []
        var lengths: [Int32] = []
        let formats = [Int32](repeating: 1, count: values.count)
        let integers = UnsafeMutablePointer<Int64>.allocate(capacity: max(1, values.count))
        defer { integers.deallocate() }
        // A value of no bytes still needs a pointer (libpq reads NULL as SQL NULL): its unused
        // integer slot.
        func bytes(_ raw: UnsafeRawBufferPointer, _ index: Int) -> UnsafePointer<CChar> {
            guard let base = raw.baseAddress, raw.count > 0 else {
                return UnsafeRawPointer(integers + index).assumingMemoryBound(to: CChar.self)
            }
            return base.assumingMemoryBound(to: CChar.self)
        }
        func bind(_ index: Int) -> R {
            guard index < values.count else { return body(types, pointers, lengths, formats) }
            switch values[index] {
            case .int(let value):
                (integers + index).initialize(to: value.bigEndian)
                types.append(TypeOID.int8)
                pointers.append(UnsafeRawPointer(integers + index).assumingMemoryBound(to: CChar.self))
                lengths.append(8)
                return bind(index + 1)
            case .text(var text):
                return text.withUTF8 { utf8 in
                    types.append(TypeOID.text)
                    pointers.append(bytes(UnsafeRawBufferPointer(utf8), index))
                    lengths.append(Int32(utf8.count))
                    return bind(index + 1)
                }
            case .bytes(let data):
                return data.withUnsafeBytes { raw in
                    types.append(TypeOID.bytea)
                    pointers.append(bytes(raw, index))
                    lengths.append(Int32(raw.count))
                    return bind(index + 1)
                }
            case .null:
                types.append(0)  // the server infers it
                pointers.append(nil)
                lengths.append(0)
                return bind(index + 1)
            }
        }
        return bind(0)
    }
}

/// One connection lent to a caller for a few statements.
struct SQLConnection {
    /// Counts statements that completed, so a caller can tell whether anything ran.
    final class Counter: Sendable {
        private let count = Atomic(0)
        var completed: Int { count.load(ordering: .relaxed) }
        func add() { count.add(1, ordering: .relaxed) }
    }

    let connection: PostgresConnection
    let timeout: Duration
    let counter = Counter()

    @discardableResult
    func query(_ sql: String, _ values: [SQLValue] = []) throws -> [SQLRow] {
        let result = try connection.execute(sql, values, timeout: timeout)
        counter.add()
        return result.rows
    }

    /// The first row's first column as an integer, or nil without rows or for NULL.
    func scalar(_ sql: String, _ values: [SQLValue] = []) throws -> Int64? {
        guard let row = try query(sql, values).first else { return nil }
        return try row.decode(0, "?column?", as: Int64.self, "an integer")
    }

    func exists(_ sql: String, _ values: [SQLValue] = []) throws -> Bool {
        try !query(sql, values).isEmpty
    }
}

/// A small pool of PostgreSQL connections, used through blocking calls on the caller's thread
/// (a FUSE worker, a command's main thread, a test); nothing runs on a Swift-concurrency thread.
final class PostgresDatabase: Sendable {
    /// libpq's connection parameters.
    let parameters: [(String, String)]
    /// Where the database is, without the password, for messages.
    let location: String
    let timeout: Duration
    let logger: Logger
    private let idle = Mutex<[PostgresConnection]>([])
    private static let maxIdle = 4

    init(parameters: [(String, String)], location: String, timeout: Duration, logger: Logger) {
        self.parameters = parameters
        self.location = location
        self.timeout = timeout
        self.logger = logger
    }

    /// Opens a new connection (not pooled), e.g. for LISTEN, within `limit` (the database's
    /// timeout when nil).
    func connect(within limit: Duration? = nil) throws -> PostgresConnection {
        try PostgresConnection.connect(parameters, timeout: limit ?? timeout, location: location)
    }

    /// Runs `body` with a pooled connection, each request within `limit` (the database's
    /// timeout when nil). A connection that failed (closed, timed out) is dropped, so the next
    /// call reconnects.
    @discardableResult
    func withConnection<T>(within limit: Duration? = nil, _ body: (SQLConnection) throws -> T) throws -> T {
        let timeout = limit ?? timeout
        if let pooled = idle.withLock({ $0.popLast() }) {
            let lent = SQLConnection(connection: pooled, timeout: timeout)
            do {
                return try use(lent, body)
            } catch let error as PostgresError where error.connectionLost && lent.counter.completed == 0 {
                // The server dropped the idle connection (a restart, a failover) and nothing
                // ran on it: the same request on a new connection is safe.
                logger.debug("a pooled connection was closed; reconnecting")
            } catch {
                throw Self.storeError(error, location: location)
            }
        }
        do {
            return try use(SQLConnection(connection: try connect(within: timeout), timeout: timeout), body)
        } catch {
            throw Self.storeError(error, location: location)
        }
    }

    /// Runs `body` on `lent`, then pools the connection if it can serve again.
    private func use<T>(_ lent: SQLConnection, _ body: (SQLConnection) throws -> T) throws -> T {
        defer { giveBack(lent.connection) }
        return try body(lent)
    }

    private func giveBack(_ connection: PostgresConnection) {
        guard connection.isReusable else {
            connection.close()
            return
        }
        let pooled = idle.withLock { idle -> Bool in
            guard idle.count < Self.maxIdle else { return false }
            idle.append(connection)
            return true
        }
        if !pooled { connection.close() }
    }

    /// Runs `body` in one transaction: committed if it returns, rolled back if it throws. Each
    /// request is given `timeout` (the database's when nil).
    @discardableResult
    func transaction<T>(
        readOnly: Bool = false, timeout: Duration? = nil, _ body: (SQLConnection) throws -> T
    ) throws -> T {
        try withConnection(within: timeout) { connection in
            try connection.query(
                readOnly
                    ? "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
                    : "BEGIN ISOLATION LEVEL READ COMMITTED")
            do {
                let result = try body(connection)
                try connection.query("COMMIT")
                return result
            } catch {
                // A connection that cannot roll back is not pooled again (see `isReusable`).
                _ = try? connection.query("ROLLBACK")
                throw error
            }
        }
    }

    /// PostgreSQL's errors as the store's, naming the problem.
    static func storeError(_ error: any Error, location: String) -> any Error {
        guard let error = error as? PostgresError else { return error }
        guard let state = error.sqlState else {
            return DocumentStoreError.io("cannot reach the PostgreSQL store \(location): \(error.message)")
        }
        switch state {
        case "53100", "53000": return DocumentStoreError.noSpace(location)
        case "3D000": return DocumentStoreError.notAStore(path: location, reason: "no such database")
        case "XX001", "XX002": return DocumentStoreError.corrupt(path: location, reason: error.message)
        default: return DocumentStoreError.io("the PostgreSQL store \(location): \(error.message) (\(state))")
        }
    }
}
