import DocumentEngine
import Foundation

/// Where each column of a `nodes` row is, looked up once per query: looking each value up by
/// name took a third of `Document.open` of a package of 10,000 wrappers (benchmark B6), on
/// SQLite and on PostgreSQL alike. Both backends decode records here.
package struct NodeColumns {
    package let node, document, parent, name, preferredName, kind, permissions, uid, gid: Int
    package let mtime, ctime, atime, btime, size, linkTarget, xattrs, version: Int
    /// Only in rows of the `nodes` table itself, not in a bare record.
    package let removed, branch: Int?
    /// Since format 5; a record without it is no device.
    package let device: Int?
    /// Since format 6 (PostgreSQL 5); a record without it is no hard link.
    package let linkOf: Int?

    package init(_ names: [String]) throws {
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
        linkOf = indices["link_of"]
        branch = indices["branch"]
    }

    /// The record a `nodes` row holds.
    package func record(_ row: some ColumnSource) throws -> NodeRecord {
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
            linkOf: try c.linkOf.flatMap { try row.optionalInt64($0, "link_of") }.map(
                StoreNodeID.init(rawValue:)),
            version: VersionID(rawValue: try row.int64(c.version, "version")))
    }

    /// The row of the `nodes` table: a record, or the mark that its wrapper was removed.
    package func storedNode(_ row: some ColumnSource) throws -> StoredNode {
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
package protocol ColumnSource {
    func int64(_ index: Int, _ column: String) throws -> Int64
    func optionalInt64(_ index: Int, _ column: String) throws -> Int64?
    func text(_ index: Int, _ column: String) throws -> String
    func optionalText(_ index: Int, _ column: String) throws -> String?
    func optionalBlob(_ index: Int, _ column: String) throws -> Data?
}

package func wrongType(_ column: String, _ found: String, _ expected: String) -> DocumentStoreError {
    .corrupt(path: "", reason: "column \(column) holds \(found), not \(expected)")
}
