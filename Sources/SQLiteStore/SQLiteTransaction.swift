import DocumentEngine
import Foundation
import GRDB
import StoreSQL
import VersionedStore

/// Row-level reads and writes in SQLite's dialect, on one GRDB connection inside a transaction.
///
/// The statements a save or a read runs every time are cached statements: compiling them again
/// for each save took a fifth of the daemon's CPU when every close saved (benchmark B5).
struct SQLiteTransaction: StoreTransaction {
    let db: Database
    /// Where large chunks' bytes go and come from; nil in migrations, which touch no chunk.
    var packs: PackFiles? = nil

    // MARK: Store metadata

    func reserveNodeIDs(count: Int) throws -> Int64 {
        guard
            let next = try Int64.fetchOne(
                db.cachedStatement(sql: "SELECT value FROM store_meta WHERE key = 'next_node'"))
        else { throw DocumentStoreError.corrupt(path: "", reason: "the node counter is missing") }
        try db.cachedStatement(sql: "UPDATE store_meta SET value = ? WHERE key = 'next_node'")
            .execute(arguments: [next + Int64(count)])
        return next
    }

    func setting(_ key: String) throws -> String? {
        try String.fetchOne(db, sql: "SELECT value FROM store_settings WHERE key = ?", arguments: [key])
    }

    func setSetting(_ key: String, _ value: String) throws {
        try db.execute(
            sql: "INSERT OR REPLACE INTO store_settings(key, value) VALUES (?, ?)", arguments: [key, value])
    }

    // MARK: Documents

    static func document(_ row: Row) throws -> DocumentInfo {
        DocumentInfo(
            id: DocumentID(rawValue: try row.stored("id")), name: try row.stored("name"),
            type: try row.stored("type"),
            kind: DocumentKind(rawValue: try row.stored("kind")) ?? .package,
            root: StoreNodeID(rawValue: try row.stored("root")),
            currentVersion: VersionID(rawValue: try row.stored("current_version")),
            created: Timestamp(rawValue: try row.stored("created")),
            modified: Timestamp(rawValue: try row.stored("modified")),
            deleted: try row.stored("deleted", as: Int64?.self).map(Timestamp.init(rawValue:)))
    }

    func document(_ id: DocumentID) throws -> DocumentInfo? {
        try Row.fetchOne(
            db.cachedStatement(sql: "SELECT * FROM documents WHERE id = ?"), arguments: [id.rawValue]
        )
        .map(Self.document)
    }

    func documents(deleted: Bool) throws -> [DocumentInfo] {
        try Row.fetchAll(
            db,
            sql: deleted
                ? "SELECT * FROM documents WHERE deleted IS NOT NULL ORDER BY deleted, id"
                : "SELECT * FROM documents WHERE deleted IS NULL ORDER BY name"
        ).map(Self.document)
    }

    func liveDocument(named name: String) throws -> DocumentInfo? {
        try Row.fetchOne(
            db.cachedStatement(sql: "SELECT * FROM documents WHERE name = ? AND deleted IS NULL"),
            arguments: [name]
        ).map(Self.document)
    }

    func insertDocument(name: String, type: String, kind: DocumentKind, root: StoreNodeID, created: Timestamp)
        throws -> DocumentID
    {
        try db.execute(
            sql: """
                INSERT INTO documents(name, type, kind, root, current_version, created, modified)
                VALUES (?, ?, ?, ?, 0, ?, ?)
                """,
            arguments: [name, type, kind.rawValue, root.rawValue, created.rawValue, created.rawValue])
        return DocumentID(rawValue: db.lastInsertedRowID)
    }

    func updateDocument(_ id: DocumentID, _ update: DocumentUpdate) throws {
        switch update {
        case .rename(let name, let modified):
            try db.execute(
                sql: "UPDATE documents SET name = ?, modified = ? WHERE id = ?",
                arguments: [name, modified.rawValue, id.rawValue])
        case .currentVersion(let version, let modified):
            try db.cachedStatement(sql: "UPDATE documents SET current_version = ?, modified = ? WHERE id = ?")
                .execute(arguments: [version.rawValue, modified.rawValue, id.rawValue])
        case .deleted(let time):
            try db.execute(
                sql: "UPDATE documents SET deleted = ? WHERE id = ?", arguments: [time.rawValue, id.rawValue])
        case .undeleted(let name):
            try db.execute(
                sql: "UPDATE documents SET deleted = NULL, name = ? WHERE id = ?",
                arguments: [name, id.rawValue])
        }
    }

    func removeDocument(_ id: DocumentID) throws {
        let d = id.rawValue
        try db.execute(
            sql: "DELETE FROM extents WHERE node IN (SELECT DISTINCT node FROM nodes WHERE document = ?)",
            arguments: [d])
        try db.execute(
            sql:
                "DELETE FROM extents_live WHERE node IN (SELECT DISTINCT node FROM nodes WHERE document = ?)",
            arguments: [d])
        try db.execute(sql: "DELETE FROM nodes WHERE document = ?", arguments: [d])
        try db.execute(sql: "DELETE FROM versions WHERE document = ?", arguments: [d])
        try db.execute(sql: "DELETE FROM documents WHERE id = ?", arguments: [d])
    }

    // MARK: Versions

    static func version(_ row: Row) throws -> VersionInfo {
        VersionInfo(
            id: VersionID(rawValue: try row.stored("id")),
            document: DocumentID(rawValue: try row.stored("document")),
            base: try row.stored("base", as: Int64?.self).map(VersionID.init(rawValue:)),
            created: Timestamp(rawValue: try row.stored("created")), origin: try row.stored("origin"),
            isConflict: try row.stored("branch", as: Int64.self) != 0,
            isResolved: try row.stored("resolved", as: Int64.self) != 0,
            bytesWritten: try row.stored("bytes_written"))
    }

    func insertVersion(document: DocumentID, base: VersionID?, origin: String, created: Timestamp) throws
        -> VersionID
    {
        try db.cachedStatement(
            sql: "INSERT INTO versions(document, base, created, origin) VALUES (?, ?, ?, ?)"
        )
        .execute(arguments: [document.rawValue, base?.rawValue, created.rawValue, origin])
        return VersionID(rawValue: db.lastInsertedRowID)
    }

    func version(_ id: VersionID) throws -> VersionInfo? {
        try Row.fetchOne(
            db.cachedStatement(sql: "SELECT * FROM versions WHERE id = ?"), arguments: [id.rawValue]
        )
        .map(Self.version)
    }

    func versions(of document: DocumentID) throws -> [VersionInfo] {
        try Row.fetchAll(
            db, sql: "SELECT * FROM versions WHERE document = ? ORDER BY id", arguments: [document.rawValue]
        )
        .map(Self.version)
    }

    func updateVersion(_ id: VersionID, _ update: VersionUpdate) throws -> VersionInfo {
        switch update {
        case .conflict:
            try db.cachedStatement(sql: "UPDATE versions SET branch = id WHERE id = ?").execute(arguments: [
                id.rawValue
            ])
        case .resolved:
            try db.execute(sql: "UPDATE versions SET resolved = 1 WHERE id = ?", arguments: [id.rawValue])
        case .bytesWritten(let bytes):
            try db.cachedStatement(sql: "UPDATE versions SET bytes_written = ? WHERE id = ?")
                .execute(arguments: [bytes, id.rawValue])
        }
        guard let info = try version(id) else { throw DocumentStoreError.noSuchVersion(id) }
        return info
    }

    func unresolvedConflicts() throws -> [VersionInfo] {
        try Row.fetchAll(
            db,
            sql: """
                SELECT versions.* FROM versions JOIN documents ON documents.id = versions.document
                WHERE versions.branch != 0 AND versions.resolved = 0 AND documents.deleted IS NULL
                ORDER BY versions.id
                """
        ).map(Self.version)
    }

    func removeVersions(_ ids: [VersionID]) throws {
        let statement = try db.cachedStatement(sql: "DELETE FROM versions WHERE id = ?")
        for id in ids { try statement.execute(arguments: [id.rawValue]) }
    }

    // MARK: Wrapper rows

    /// The columns a read of wrapper rows selects, in this order: every store is migrated to have
    /// them all before it is used. Named rather than `*`, so that their positions are worked out
    /// once, not from each statement's column names at every read (14% of the daemon's CPU while
    /// 10,000 files were deleted from a package, whose saves look up each removed record).
    static let nodeColumnNames = [
        "node", "branch", "version", "document", "parent", "name", "preferred_name", "kind", "permissions",
        "uid", "gid", "mtime", "ctime", "atime", "btime", "size", "link_target", "xattrs", "removed",
        "device", "link_of",
    ]
    static let nodeColumnList = nodeColumnNames.joined(separator: ", ")
    static let nodeColumns = Result { try NodeColumns(nodeColumnNames) }

    func latestNodes(of document: DocumentID, branch: Int64, upTo limit: Int64) throws -> [StoredNode] {
        // Each node's rows come newest first: the first is its latest, the rest are skipped
        // after reading one column.
        let statement = try db.cachedStatement(
            sql: """
                SELECT \(Self.nodeColumnList) FROM nodes INDEXED BY nodes_by_document_node
                WHERE document = ? AND branch = ? AND version <= ?
                ORDER BY node DESC, version DESC
                """)
        let columns = try Self.nodeColumns.get()
        var result: [StoredNode] = []
        var previous: Int64?
        try statement.forEachRow(arguments: [document.rawValue, branch, limit]) { row in
            let node = try row.int64(columns.node, "node")
            guard node != previous else { return }
            previous = node
            result.append(try columns.storedNode(row))
        }
        result.reverse()
        return result
    }

    func latestNode(_ node: StoreNodeID, branch: Int64, upTo limit: Int64) throws -> StoredNode? {
        try Self.storedNodes(
            db.cachedStatement(
                sql:
                    "SELECT \(Self.nodeColumnList) FROM nodes WHERE node = ? AND branch = ? AND version <= ? ORDER BY version DESC LIMIT 1"
            ),
            arguments: [node.rawValue, branch, limit]
        ).first
    }

    /// The `nodes` rows a statement selects (``nodeColumnList``), read as it steps.
    static func storedNodes(_ statement: Statement, arguments: StatementArguments) throws -> [StoredNode] {
        let columns = try nodeColumns.get()
        var result: [StoredNode] = []
        try statement.forEachRow(arguments: arguments) { row in result.append(try columns.storedNode(row)) }
        return result
    }

    func nodeChanged(_ node: StoreNodeID, after version: VersionID) throws -> Bool {
        try Bool.fetchOne(
            db.cachedStatement(
                sql: "SELECT 1 FROM nodes WHERE node = ? AND branch = 0 AND version > ? LIMIT 1"),
            arguments: [node.rawValue, version.rawValue]) == true
    }

    func nodesNamed(
        _ name: String, in parent: StoreNodeID, except: StoreNodeID, branch: Int64, upTo limit: Int64
    )
        throws -> [StoreNodeID]
    {
        try Int64.fetchAll(
            db.cachedStatement(
                sql: PortableSQL.nodesNamed(parent: "?1", name: "?2", except: "?3", branch: "?4", limit: "?5")
            ),
            arguments: [parent.rawValue, name, except.rawValue, branch, limit]
        ).map(StoreNodeID.init(rawValue:))
    }

    func insertNode(_ row: StoredNode) throws {
        let r = row.record
        if row.removed {
            try db.cachedStatement(
                sql: """
                    INSERT OR REPLACE INTO nodes(node, branch, version, document, parent, name, kind, permissions, uid,
                        gid, mtime, ctime, atime, btime, size, removed)
                    VALUES (?, ?, ?, ?, ?, ?, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)
                    """
            ).execute(arguments: [
                r.id.rawValue, row.branch, r.version.rawValue, r.document.rawValue, r.parent?.rawValue,
                r.name,
            ])
            return
        }
        try db.cachedStatement(
            sql: """
                INSERT OR REPLACE INTO nodes(node, branch, version, document, parent, name, preferred_name, kind,
                    permissions, uid, gid, mtime, ctime, atime, btime, size, link_target, xattrs, device, link_of,
                    removed)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)
                """
        ).execute(arguments: [
            r.id.rawValue, row.branch, r.version.rawValue, r.document.rawValue, r.parent?.rawValue, r.name,
            r.preferredName, r.kind.storedCode, r.permissions, Int64(r.uid), Int64(r.gid),
            r.modified.rawValue, r.changed.rawValue, r.accessed.rawValue, r.created.rawValue, r.size,
            r.linkTarget,
            r.extendedAttributes.isEmpty ? nil : XattrCoding.encode(r.extendedAttributes),
            Int64(bitPattern: r.device), r.linkOf?.rawValue,
        ])
    }

    func nodeRowKeys(of document: DocumentID) throws -> [(key: NodeRowKey, removed: Bool)] {
        try Row.fetchAll(
            db, sql: "SELECT node, branch, version, removed FROM nodes WHERE document = ?",
            arguments: [document.rawValue]
        ).map { row in
            (
                NodeRowKey(
                    node: StoreNodeID(rawValue: try row.stored("node")), branch: try row.stored("branch"),
                    version: VersionID(rawValue: try row.stored("version"))),
                try row.stored("removed", as: Int64.self) != 0
            )
        }
    }

    func removeNodeRows(_ keys: [NodeRowKey]) throws {
        let statement = try db.cachedStatement(
            sql: "DELETE FROM nodes WHERE node = ? AND branch = ? AND version = ?")
        for key in keys {
            try statement.execute(arguments: [key.node.rawValue, key.branch, key.version.rawValue])
        }
    }

    func removeBranch(_ branch: Int64) throws {
        try db.execute(sql: "DELETE FROM extents WHERE branch = ?", arguments: [branch])
        try db.execute(sql: "DELETE FROM nodes WHERE branch = ?", arguments: [branch])
    }

    // MARK: Extents

    func extents(_ node: StoreNodeID, branch: Int64, upTo limit: Int64, starts: ClosedRange<Int64>) throws
        -> [Int64: Extent?]
    {
        var map: [Int64: Extent?] = [:]
        if branch == 0 {
            // No main-line row of the file is newer than `limit`: its current extents are the answer.
            guard
                let newest = try Int64.fetchOne(
                    db.cachedStatement(sql: "SELECT version FROM extents_live WHERE node = ? AND start = -1"),
                    arguments: [node.rawValue])
            else { return map }
            if newest <= limit {
                try db.cachedStatement(
                    sql:
                        "SELECT start, chunk, length FROM extents_live WHERE node = ? AND start BETWEEN ? AND ?"
                ).forEachRow(arguments: [node.rawValue, max(0, starts.lowerBound), starts.upperBound]) {
                    row in
                    let chunk = try row.optionalInt64(1, "chunk")
                    map[try row.int64(0, "start")] = .some(
                        try chunk.map { Extent(chunk: $0, length: try row.int64(2, "length")) })
                }
                return map
            }
        }
        // The latest row at each start, found by SQLite in one walk of the primary key: with
        // max(), the bare columns are that row's. (Sorting every version's rows instead, and
        // skipping all but the first of each start here, made a save of a file with a long
        // history, such as fsx's thousand msyncs, read every row it ever had.)
        let rows = try Row.fetchCursor(
            db.cachedStatement(
                sql: """
                    SELECT start, chunk, length, max(version) FROM extents
                    WHERE node = ? AND branch = ? AND start BETWEEN ? AND ? AND version <= ?
                    GROUP BY start
                    """),
            arguments: [node.rawValue, branch, starts.lowerBound, starts.upperBound, limit])
        while let row = try rows.next() {
            let start: Int64 = try row.stored(0, "start")
            let chunk = try row.stored(1, "chunk", as: Int64?.self)
            map[start] = .some(try chunk.map { Extent(chunk: $0, length: try row.stored(2, "length")) })
        }
        return map
    }

    func insertExtents(
        _ node: StoreNodeID, branch: Int64, version: VersionID, _ rows: [(start: Int64, extent: Extent?)]
    ) throws {
        // An embedded database has no round trips to save: one cached statement per row.
        let statement = try db.cachedStatement(
            sql:
                "INSERT OR REPLACE INTO extents(node, branch, start, version, chunk, length) VALUES (?, ?, ?, ?, ?, ?)"
        )
        for (start, extent) in rows {
            try statement.execute(arguments: [
                node.rawValue, branch, start, version.rawValue, extent?.chunk, extent?.length ?? 0,
            ])
        }
        guard branch == 0 else { return }
        let live = try db.cachedStatement(
            sql:
                "INSERT OR REPLACE INTO extents_live(node, start, version, chunk, length) VALUES (?, ?, ?, ?, ?)"
        )
        let gone = try db.cachedStatement(sql: "DELETE FROM extents_live WHERE node = ? AND start = ?")
        for (start, extent) in rows {
            if let extent {
                try live.execute(arguments: [
                    node.rawValue, start, version.rawValue, extent.chunk, extent.length,
                ])
            } else {
                try gone.execute(arguments: [node.rawValue, start])
            }
        }
        try live.execute(arguments: [node.rawValue, -1, version.rawValue, nil, 0])
    }

    /// Derives `extents_live` again from `extents` for `nodes` (all files when nil).
    func rebuildLiveExtents(of nodes: Set<StoreNodeID>?) throws {
        let insert = "INSERT INTO extents_live(node, start, version, chunk, length) "
        guard let nodes else {
            return try db.execute(sql: "DELETE FROM extents_live; " + insert + PortableSQL.currentExtents())
        }
        let sql =
            "DELETE FROM extents_live WHERE node = ?; " + insert + PortableSQL.currentExtents("AND node = ?")
        for node in nodes {
            try db.execute(sql: sql, arguments: [node.rawValue, node.rawValue, node.rawValue])
        }
    }

    func extentRowKeys(of document: DocumentID) throws -> [(key: ExtentRowKey, hasChunk: Bool)] {
        var result: [(key: ExtentRowKey, hasChunk: Bool)] = []
        let rows = try Row.fetchCursor(
            db,
            sql: """
                SELECT node, start, version, chunk IS NOT NULL FROM extents
                WHERE branch = 0 AND node IN (SELECT DISTINCT node FROM nodes WHERE document = ?)
                """,
            arguments: [document.rawValue])
        while let row = try rows.next() {
            result.append(
                (
                    ExtentRowKey(
                        node: StoreNodeID(rawValue: try row.stored(0, "node")), branch: 0,
                        start: try row.stored(1, "start"),
                        version: VersionID(rawValue: try row.stored(2, "version"))),
                    try row.stored(3, "chunk", as: Int64.self) != 0
                ))
        }
        return result
    }

    func removeExtentRows(_ keys: [ExtentRowKey]) throws {
        let statement = try db.cachedStatement(
            sql: "DELETE FROM extents WHERE node = ? AND branch = ? AND start = ? AND version = ?")
        for key in keys {
            try statement.execute(arguments: [key.node.rawValue, key.branch, key.start, key.version.rawValue])
        }
        try rebuildLiveExtents(of: Set(keys.lazy.filter { $0.branch == 0 }.map(\.node)))
    }

    // MARK: Chunks

    func chunkID(hash: Data) throws -> Int64? {
        try Int64.fetchOne(db.cachedStatement(sql: "SELECT id FROM chunks WHERE hash = ?"), arguments: [hash])
    }

    func storesBulk() { packs?.beginBulk() }

    func insertChunk(hash: Data, data: Data, offset: Int64) throws -> Int64 {
        if let packs, let place = try packs.place(data, phase: Int(offset % Int64(PackFiles.pageSize))) {
            try db.cachedStatement(sql: "INSERT INTO chunks(hash, size, data) VALUES (?, ?, X'')")
                .execute(arguments: [hash, data.count])
            let id = db.lastInsertedRowID
            try db.cachedStatement(
                sql: "INSERT INTO packed_chunks(id, pack, position, size) VALUES (?, ?, ?, ?)"
            )
            .execute(arguments: [id, place.pack, place.position, place.size])
            return id
        }
        // Cached: preparing it was a twentieth of a small save's CPU. A cached statement keeps
        // its last arguments, so empty ones replace the chunk's bytes once it has run.
        let statement = try db.cachedStatement(sql: "INSERT INTO chunks(hash, size, data) VALUES (?, ?, ?)")
        try statement.execute(arguments: [hash, data.count, data])
        let id = db.lastInsertedRowID
        try statement.setArguments([Data(), 0, Data()])
        return id
    }

    /// The columns ``bytes(_:id:)`` reads, from ``chunksWithPlaces``.
    private static let bytesColumns = "c.data, p.pack, p.position, p.size AS packed_size"
    private static let chunksWithPlaces = "chunks c LEFT JOIN packed_chunks p ON p.id = c.id"

    /// Chunk `id`'s bytes from a row of ``bytesColumns``: its data, or its pack's (nil when the
    /// data is NULL).
    private func bytes(_ row: Row, id: Int64) throws -> Data? {
        guard let pack = try row.stored("pack", as: Int64?.self) else {
            return try row.stored("data", as: Data?.self)
        }
        guard let packs else {
            throw DocumentStoreError.corrupt(path: "", reason: "chunk \(id) is in a pack")
        }
        return try packs.readChunk(
            id,
            at: PackFiles.Place(
                pack: pack, position: try row.stored("position"),
                size: Int(try row.stored("packed_size", as: Int64.self))))
    }

    func chunks(_ ids: [Int64]) throws -> [Int64: Data] {
        var result: [Int64: Data] = [:]
        let statement = try db.cachedStatement(
            sql: "SELECT \(Self.bytesColumns) FROM \(Self.chunksWithPlaces) WHERE c.id = ?")
        for id in ids {
            if let row = try Row.fetchOne(statement, arguments: [id]) { result[id] = try bytes(row, id: id) }
        }
        return result
    }

    func chunkLength(_ id: Int64) throws -> Int64? {
        try Int64.fetchOne(db.cachedStatement(sql: "SELECT size FROM chunks WHERE id = ?"), arguments: [id])
    }

    func removeUnreferencedChunks() throws -> (count: Int, bytes: Int64) {
        // Extents have no index by chunk (format 10): the chunks no extent names are found with
        // one pass over the extents, into a table of their own, rather than a search per chunk.
        try db.execute(
            sql: """
                DROP TABLE IF EXISTS temp.unreferenced_chunks;
                CREATE TEMP TABLE unreferenced_chunks(id INTEGER PRIMARY KEY);
                INSERT INTO unreferenced_chunks
                    SELECT id FROM chunks WHERE id NOT IN (SELECT chunk FROM extents WHERE chunk IS NOT NULL);
                """)
        defer { try? db.execute(sql: "DROP TABLE IF EXISTS temp.unreferenced_chunks") }
        let row = try Row.fetchOne(
            db, sql: "SELECT COUNT(*), TOTAL(size) FROM chunks WHERE id IN temp.unreferenced_chunks")
        // Their bytes in packs become garbage, which `PackCollection` gives back.
        try db.execute(sql: "DELETE FROM packed_chunks WHERE id IN temp.unreferenced_chunks")
        try db.execute(sql: "DELETE FROM chunks WHERE id IN temp.unreferenced_chunks")
        return (
            Int(try row?.stored(0, "count", as: Int64.self) ?? 0),
            Int64(try row?.stored(1, "size", as: Double.self) ?? 0)
        )
    }

    func forEachChunk(_ body: (Result<ChunkRow, any Error>) throws -> Void) throws {
        let rows = try Row.fetchCursor(
            db,
            sql:
                "SELECT c.id, c.hash, c.size, \(Self.bytesColumns) FROM \(Self.chunksWithPlaces) ORDER BY c.id"
        )
        while let row = try rows.next() {
            try body(
                Result {
                    let id: Int64 = try row.stored("id")
                    return ChunkRow(
                        id: id, hash: try row.stored("hash", as: Data?.self) ?? Data(),
                        size: try row.stored("size"), data: try bytes(row, id: id) ?? Data())
                })
        }
    }

    // MARK: Events

    func insertEvent(
        _ kind: StoreEvent.Kind, document: DocumentID, version: VersionID?, name: String, origin: String,
        time: Timestamp
    ) throws {
        try db.cachedStatement(
            sql: "INSERT INTO events(kind, document, version, name, origin, time) VALUES (?, ?, ?, ?, ?, ?)"
        ).execute(arguments: [
            kind.rawValue, document.rawValue, version?.rawValue, name, origin, time.rawValue,
        ])
    }

    func events(after sequence: Int64) throws -> [StoreEvent] {
        try Row.fetchAll(
            db, sql: "SELECT * FROM events WHERE sequence > ? ORDER BY sequence", arguments: [sequence]
        )
        .compactMap { row -> StoreEvent? in
            guard let kind = StoreEvent.Kind(rawValue: try row.stored("kind")) else { return nil }
            return StoreEvent(
                sequence: try row.stored("sequence"), kind: kind,
                document: DocumentID(rawValue: try row.stored("document")),
                version: try row.stored("version", as: Int64?.self).map(VersionID.init(rawValue:)),
                name: try row.stored("name"), origin: try row.stored("origin"))
        }
    }

    func latestEventSequence() throws -> Int64 {
        try Int64.fetchOne(db.cachedStatement(sql: "SELECT MAX(sequence) FROM events")) ?? 0
    }

    func removeEvents(before time: Timestamp) throws {
        try db.execute(sql: "DELETE FROM events WHERE time < ?", arguments: [time.rawValue])
    }

    // MARK: Integrity

    func danglingReferences(_ kind: DanglingReference) throws -> [Int64] {
        try Int64.fetchAll(db, sql: PortableSQL.dangling(kind))
    }
}
