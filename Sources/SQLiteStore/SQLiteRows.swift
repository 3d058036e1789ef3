import DocumentEngine
import Foundation
import GRDB
import GRDBSQLite
import VersionedStore

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

/// A `Row` as a column source (rows built in memory, and single rows).
extension Row: ColumnSource {
    private func value(_ index: Int) -> DatabaseValue.Storage { (self[index] as DatabaseValue).storage }

    private static func describe(_ storage: DatabaseValue.Storage) -> String {
        switch storage {
        case .null: "NULL"
        case .int64(let value): "the integer \(value)"
        case .double(let value): "the real \(value)"
        case .string: "text"
        case .blob: "a blob"
        }
    }

    package func int64(_ index: Int, _ column: String) throws -> Int64 {
        guard let value = try optionalInt64(index, column) else { throw wrongType(column, "NULL", "Int64") }
        return value
    }

    package func optionalInt64(_ index: Int, _ column: String) throws -> Int64? {
        switch value(index) {
        case .null: return nil
        case .int64(let value): return value
        case let other: throw wrongType(column, Self.describe(other), "Int64")
        }
    }

    package func text(_ index: Int, _ column: String) throws -> String {
        guard let value = try optionalText(index, column) else { throw wrongType(column, "NULL", "String") }
        return value
    }

    package func optionalText(_ index: Int, _ column: String) throws -> String? {
        switch value(index) {
        case .null: return nil
        case .string(let value): return value
        case let other: throw wrongType(column, Self.describe(other), "String")
        }
    }

    package func optionalBlob(_ index: Int, _ column: String) throws -> Data? {
        switch value(index) {
        case .null: return nil
        case .blob(let value): return value
        case let other: throw wrongType(column, Self.describe(other), "Data")
        }
    }
}

extension Statement {
    /// Steps through the rows the statement selects with `arguments`, giving each to `body` as
    /// the statement's current row. GRDB's cursors build a row object per statement run, which
    /// was most of reading one wrapper row (a save looks up each record it removes or checks);
    /// the statement is reset afterwards, so that no read transaction outlives the call.
    func forEachRow(arguments: StatementArguments, _ body: (StatementRow) throws -> Void) throws {
        try setArguments(arguments)
        let handle = sqliteStatement
        defer { sqlite3_reset(handle) }
        let row = StatementRow(statement: handle)
        while true {
            let code = sqlite3_step(handle)
            if code == SQLITE_DONE { return }
            guard code == SQLITE_ROW else {
                let message = sqlite3_db_handle(handle).flatMap { sqlite3_errmsg($0) }.map {
                    String(cString: $0)
                }
                throw DatabaseError(resultCode: ResultCode(rawValue: code), message: message, sql: sql)
            }
            try body(row)
        }
    }
}

/// The row a statement is stepping through, read with SQLite's column functions: decoding
/// through GRDB's generic conversions spent most of reading 10,000 records in looking up
/// generic metadata (benchmark B6).
struct StatementRow: ColumnSource {
    let statement: SQLiteStatement

    private func type(_ index: Int) -> Int32 { sqlite3_column_type(statement, Int32(index)) }

    private static func describe(_ type: Int32) -> String {
        switch type {
        case SQLITE_NULL: "NULL"
        case SQLITE_INTEGER: "an integer"
        case SQLITE_FLOAT: "a real"
        case SQLITE_TEXT: "text"
        default: "a blob"
        }
    }

    package func int64(_ index: Int, _ column: String) throws -> Int64 {
        let type = type(index)
        guard type == SQLITE_INTEGER else { throw wrongType(column, Self.describe(type), "Int64") }
        return sqlite3_column_int64(statement, Int32(index))
    }

    package func optionalInt64(_ index: Int, _ column: String) throws -> Int64? {
        type(index) == SQLITE_NULL ? nil : try int64(index, column)
    }

    package func text(_ index: Int, _ column: String) throws -> String {
        let type = type(index)
        guard type == SQLITE_TEXT, let bytes = sqlite3_column_text(statement, Int32(index)) else {
            throw wrongType(column, Self.describe(type), "String")
        }
        let count = Int(sqlite3_column_bytes(statement, Int32(index)))
        return String(decoding: UnsafeBufferPointer(start: bytes, count: count), as: UTF8.self)
    }

    package func optionalText(_ index: Int, _ column: String) throws -> String? {
        type(index) == SQLITE_NULL ? nil : try text(index, column)
    }

    package func optionalBlob(_ index: Int, _ column: String) throws -> Data? {
        switch type(index) {
        case SQLITE_NULL: return nil
        case SQLITE_BLOB:
            let count = Int(sqlite3_column_bytes(statement, Int32(index)))
            guard count > 0, let bytes = sqlite3_column_blob(statement, Int32(index)) else { return Data() }
            return Data(bytes: bytes, count: count)
        case let other: throw wrongType(column, Self.describe(other), "Data")
        }
    }
}
