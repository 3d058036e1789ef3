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

/// Where each column of a `nodes` row is, looked up once per query: looking each value up by
/// name took a third of `Document.open` of a package of 10,000 wrappers (issue 7, B6).
struct NodeColumns {
    let node, document, parent, name, preferredName, kind, permissions, uid, gid: Int
    let mtime, ctime, atime, btime, size, linkTarget, xattrs, version: Int
    /// Only in rows of the `nodes` table itself, not in a bare record.
    let removed, branch: Int?
    /// Since format 5; a record without it is no device.
    let device: Int?

    init(_ names: [String]) throws {
        var indices: [String: Int] = [:]
        for (index, name) in names.enumerated() where indices[name] == nil {
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
        version = try index("version")
        removed = indices["removed"]
        device = indices["device"]
        branch = indices["branch"]
    }

    init(_ row: Row) throws { try self.init(Array(row.columnNames)) }

    /// The record a `nodes` row holds.
    func record(_ row: some ColumnSource) throws -> NodeRecord {
        let c = self
        let node = try row.int64(c.node, "node")
        let kind = try FileWrapper.Kind(storedCode: try row.int64(c.kind, "kind"), node: node)
        return NodeRecord(
            id: StoreNodeID(rawValue: node),
            document: DocumentID(rawValue: try row.int64(c.document, "document")),
            parent: try row.optionalInt64(c.parent, "parent").map(StoreNodeID.init(rawValue:)),
            name: try row.text(c.name, "name"),
            preferredName: try row.optionalText(c.preferredName, "preferred_name"),
            kind: kind, permissions: Int(try row.int64(c.permissions, "permissions")),
            uid: UInt32(truncatingIfNeeded: try row.int64(c.uid, "uid")),
            gid: UInt32(truncatingIfNeeded: try row.int64(c.gid, "gid")),
            modified: Timestamp(rawValue: try row.int64(c.mtime, "mtime")),
            changed: Timestamp(rawValue: try row.int64(c.ctime, "ctime")),
            accessed: Timestamp(rawValue: try row.int64(c.atime, "atime")),
            created: Timestamp(rawValue: try row.int64(c.btime, "btime")),
            size: try row.int64(c.size, "size"),
            linkTarget: try row.optionalText(c.linkTarget, "link_target"),
            device: try c.device.map { UInt64(bitPattern: try row.int64($0, "device")) } ?? 0,
            extendedAttributes: try XattrCoding.decode(try row.optionalBlob(c.xattrs, "xattrs") ?? Data()),
            version: VersionID(rawValue: try row.int64(c.version, "version")))
    }

    /// The row of the `nodes` table: a record, or the mark that its wrapper was removed.
    func storedNode(_ row: some ColumnSource) throws -> StoredNode {
        guard let removedColumn = removed, let branchColumn = branch else {
            throw DocumentStoreError.corrupt(
                path: "", reason: "a wrapper row has no removed or branch column")
        }
        let removed = try row.int64(removedColumn, "removed") != 0
        let record: NodeRecord
        if removed {
            record = NodeRecord(
                id: StoreNodeID(rawValue: try row.int64(node, "node")),
                document: DocumentID(rawValue: try row.int64(document, "document")),
                parent: try row.optionalInt64(parent, "parent").map(StoreNodeID.init(rawValue:)),
                name: try row.text(name, "name"), kind: .regularFile, permissions: 0, uid: 0, gid: 0,
                modified: Timestamp(rawValue: 0),
                version: VersionID(rawValue: try row.int64(version, "version")))
        } else {
            record = try self.record(row)
        }
        return StoredNode(record: record, branch: try row.int64(branchColumn, "branch"), removed: removed)
    }
}

/// The values of one result row, by column index. A value of the wrong type (a damaged or
/// hand-edited store) throws, naming the column, where GRDB's subscripts would stop the process.
protocol ColumnSource {
    func int64(_ index: Int, _ column: String) throws -> Int64
    func optionalInt64(_ index: Int, _ column: String) throws -> Int64?
    func text(_ index: Int, _ column: String) throws -> String
    func optionalText(_ index: Int, _ column: String) throws -> String?
    func optionalBlob(_ index: Int, _ column: String) throws -> Data?
}

private func wrongType(_ column: String, _ found: String, _ expected: String) -> DocumentStoreError {
    .corrupt(path: "", reason: "column \(column) holds \(found), not \(expected)")
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

    func int64(_ index: Int, _ column: String) throws -> Int64 {
        guard let value = try optionalInt64(index, column) else { throw wrongType(column, "NULL", "Int64") }
        return value
    }

    func optionalInt64(_ index: Int, _ column: String) throws -> Int64? {
        switch value(index) {
        case .null: return nil
        case .int64(let value): return value
        case let other: throw wrongType(column, Self.describe(other), "Int64")
        }
    }

    func text(_ index: Int, _ column: String) throws -> String {
        guard let value = try optionalText(index, column) else { throw wrongType(column, "NULL", "String") }
        return value
    }

    func optionalText(_ index: Int, _ column: String) throws -> String? {
        switch value(index) {
        case .null: return nil
        case .string(let value): return value
        case let other: throw wrongType(column, Self.describe(other), "String")
        }
    }

    func optionalBlob(_ index: Int, _ column: String) throws -> Data? {
        switch value(index) {
        case .null: return nil
        case .blob(let value): return value
        case let other: throw wrongType(column, Self.describe(other), "Data")
        }
    }
}

/// The row a statement is stepping through, read with SQLite's column functions: decoding
/// through GRDB's generic conversions spent most of reading 10,000 records in looking up
/// generic metadata (issue 15, B6).
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

    func int64(_ index: Int, _ column: String) throws -> Int64 {
        let type = type(index)
        guard type == SQLITE_INTEGER else { throw wrongType(column, Self.describe(type), "Int64") }
        return sqlite3_column_int64(statement, Int32(index))
    }

    func optionalInt64(_ index: Int, _ column: String) throws -> Int64? {
        type(index) == SQLITE_NULL ? nil : try int64(index, column)
    }

    func text(_ index: Int, _ column: String) throws -> String {
        let type = type(index)
        guard type == SQLITE_TEXT, let bytes = sqlite3_column_text(statement, Int32(index)) else {
            throw wrongType(column, Self.describe(type), "String")
        }
        let count = Int(sqlite3_column_bytes(statement, Int32(index)))
        return String(decoding: UnsafeBufferPointer(start: bytes, count: count), as: UTF8.self)
    }

    func optionalText(_ index: Int, _ column: String) throws -> String? {
        type(index) == SQLITE_NULL ? nil : try text(index, column)
    }

    func optionalBlob(_ index: Int, _ column: String) throws -> Data? {
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
