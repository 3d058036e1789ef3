import DocumentEngine
import Foundation
import GRDB
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
    let mtime, ctime, atime, btime, size, linkTarget, xattrs, removed, version, branch: Int

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
        branch = try index("branch")
    }

    /// The record a `nodes` row holds.
    func record(_ row: Row) throws -> NodeRecord {
        let c = self
        let node: Int64 = try row.stored(c.node, "node")
        let kind = try FileWrapper.Kind(storedCode: try row.stored(c.kind, "kind"), node: node)
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
}
