import DocumentEngine
import Foundation
import StoreSQL
import VersionedStore

/// Row-level reads and writes in PostgreSQL's dialect, on one connection (inside a transaction,
/// or statement by statement for ``PostgresBackend/access(_:)``). Every statement is a round trip.
struct PostgresTransaction: StoreTransaction {
    let db: SQLConnection

    // MARK: Store metadata

    func reserveNodeIDs(count: Int) throws -> Int64 {
        guard
            let next = try db.scalar(
                "UPDATE store_meta SET value = value + $1 WHERE key = 'next_node' RETURNING value - $1",
                [.int(Int64(count))])
        else { throw DocumentStoreError.corrupt(path: "", reason: "the node counter is missing") }
        return next
    }

    func setting(_ key: String) throws -> String? {
        try db.query("SELECT value FROM store_settings WHERE key = $1", [.text(key)]).first?.string("value")
    }

    func setSetting(_ key: String, _ value: String) throws {
        try db.query(
            "INSERT INTO store_settings(key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            [.text(key), .text(value)])
    }

    // MARK: Documents

    static func document(_ row: SQLRow) throws -> DocumentInfo {
        DocumentInfo(
            id: DocumentID(rawValue: try row.int("id")), name: try row.string("name"),
            type: try row.string("type"),
            kind: DocumentKind(rawValue: Int(try row.int("kind"))) ?? .package,
            root: StoreNodeID(rawValue: try row.int("root")),
            currentVersion: VersionID(rawValue: try row.int("current_version")),
            created: Timestamp(rawValue: try row.int("created")),
            modified: Timestamp(rawValue: try row.int("modified")),
            deleted: try row.optionalInt("deleted").map(Timestamp.init(rawValue:)))
    }

    func document(_ id: DocumentID) throws -> DocumentInfo? {
        try db.query("SELECT * FROM documents WHERE id = $1", [.int(id.rawValue)]).first.map(Self.document)
    }

    func documents(deleted: Bool) throws -> [DocumentInfo] {
        try db.query(
            deleted
                ? "SELECT * FROM documents WHERE deleted IS NOT NULL ORDER BY deleted, id"
                : "SELECT * FROM documents WHERE deleted IS NULL ORDER BY name COLLATE \"C\""
        ).map(Self.document)
    }

    func liveDocument(named name: String) throws -> DocumentInfo? {
        try db.query("SELECT * FROM documents WHERE name = $1 AND deleted IS NULL", [.text(name)]).first
            .map(Self.document)
    }

    func insertDocument(name: String, type: String, kind: DocumentKind, root: StoreNodeID, created: Timestamp)
        throws -> DocumentID
    {
        guard
            let id = try db.scalar(
                """
                INSERT INTO documents(name, type, kind, root, current_version, created, modified)
                VALUES ($1, $2, $3, $4, 0, $5, $5) RETURNING id
                """,
                [
                    .text(name), .text(type), SQLValue(kind.rawValue), .int(root.rawValue),
                    .int(created.rawValue),
                ])
        else { throw DocumentStoreError.io("creating \(name) gave no document id") }
        return DocumentID(rawValue: id)
    }

    func updateDocument(_ id: DocumentID, _ update: DocumentUpdate) throws {
        switch update {
        case .rename(let name, let modified):
            try db.query(
                "UPDATE documents SET name = $1, modified = $2 WHERE id = $3",
                [.text(name), .int(modified.rawValue), .int(id.rawValue)])
        case .currentVersion(let version, let modified):
            try db.query(
                "UPDATE documents SET current_version = $1, modified = $2 WHERE id = $3",
                [.int(version.rawValue), .int(modified.rawValue), .int(id.rawValue)])
        case .deleted(let time):
            try db.query(
                "UPDATE documents SET deleted = $1 WHERE id = $2", [.int(time.rawValue), .int(id.rawValue)])
        case .undeleted(let name):
            try db.query(
                "UPDATE documents SET deleted = NULL, name = $1 WHERE id = $2",
                [.text(name), .int(id.rawValue)])
        }
    }

    func removeDocument(_ id: DocumentID) throws {
        let d = SQLValue.int(id.rawValue)
        try db.query(
            "DELETE FROM extents WHERE node IN (SELECT DISTINCT node FROM nodes WHERE document = $1)", [d])
        try db.query(
            "DELETE FROM extents_live WHERE node IN (SELECT DISTINCT node FROM nodes WHERE document = $1)",
            [d])
        try db.query("DELETE FROM nodes WHERE document = $1", [d])
        try db.query("DELETE FROM versions WHERE document = $1", [d])
        try db.query("DELETE FROM documents WHERE id = $1", [d])
    }

    // MARK: Versions

    static func version(_ row: SQLRow) throws -> VersionInfo {
        VersionInfo(
            id: VersionID(rawValue: try row.int("id")),
            document: DocumentID(rawValue: try row.int("document")),
            base: try row.optionalInt("base").map(VersionID.init(rawValue:)),
            created: Timestamp(rawValue: try row.int("created")), origin: try row.string("origin"),
            isConflict: try row.int("branch") != 0, isResolved: try row.int("resolved") != 0,
            bytesWritten: try row.int("bytes_written"))
    }

    func insertVersion(document: DocumentID, base: VersionID?, origin: String, created: Timestamp) throws
        -> VersionID
    {
        guard
            let id = try db.scalar(
                "INSERT INTO versions(document, base, created, origin) VALUES ($1, $2, $3, $4) RETURNING id",
                [.int(document.rawValue), SQLValue(base?.rawValue), .int(created.rawValue), .text(origin)])
        else { throw DocumentStoreError.io("recording a version gave no id") }
        return VersionID(rawValue: id)
    }

    func version(_ id: VersionID) throws -> VersionInfo? {
        try db.query("SELECT * FROM versions WHERE id = $1", [.int(id.rawValue)]).first.map(Self.version)
    }

    func versions(of document: DocumentID) throws -> [VersionInfo] {
        try db.query("SELECT * FROM versions WHERE document = $1 ORDER BY id", [.int(document.rawValue)])
            .map(Self.version)
    }

    func updateVersion(_ id: VersionID, _ update: VersionUpdate) throws -> VersionInfo {
        // The row comes back with the update: one round trip.
        let rows: [SQLRow]
        switch update {
        case .conflict:
            rows = try db.query(
                "UPDATE versions SET branch = id WHERE id = $1 RETURNING *", [.int(id.rawValue)])
        case .resolved:
            rows = try db.query(
                "UPDATE versions SET resolved = 1 WHERE id = $1 RETURNING *", [.int(id.rawValue)])
        case .bytesWritten(let bytes):
            rows = try db.query(
                "UPDATE versions SET bytes_written = $1 WHERE id = $2 RETURNING *",
                [.int(bytes), .int(id.rawValue)])
        }
        guard let row = rows.first else { throw DocumentStoreError.noSuchVersion(id) }
        return try Self.version(row)
    }

    func unresolvedConflicts() throws -> [VersionInfo] {
        try db.query(
            """
            SELECT versions.* FROM versions JOIN documents ON documents.id = versions.document
            WHERE versions.branch <> 0 AND versions.resolved = 0 AND documents.deleted IS NULL
            ORDER BY versions.id
            """
        ).map(Self.version)
    }

    func removeVersions(_ ids: [VersionID]) throws {
        guard !ids.isEmpty else { return }
        try db.query(
            "DELETE FROM versions WHERE id = ANY($1::text::bigint[])", [Self.array(ids.map(\.rawValue))])
    }

    // MARK: Wrapper rows

    func latestNodes(of document: DocumentID, branch: Int64, upTo limit: Int64) throws -> [StoredNode] {
        try db.query(
            """
            SELECT DISTINCT ON (node) * FROM nodes
            WHERE document = $1 AND branch = $2 AND version <= $3
            ORDER BY node, version DESC
            """,
            [.int(document.rawValue), .int(branch), .int(limit)]
        ).storedNodes()
    }

    func latestNode(_ node: StoreNodeID, branch: Int64, upTo limit: Int64) throws -> StoredNode? {
        try db.query(
            "SELECT * FROM nodes WHERE node = $1 AND branch = $2 AND version <= $3 ORDER BY version DESC LIMIT 1",
            [.int(node.rawValue), .int(branch), .int(limit)]
        ).storedNodes().first
    }

    func nodeChanged(_ node: StoreNodeID, after version: VersionID) throws -> Bool {
        try db.exists(
            "SELECT 1 FROM nodes WHERE node = $1 AND branch = 0 AND version > $2 LIMIT 1",
            [.int(node.rawValue), .int(version.rawValue)])
    }

    func nodesNamed(
        _ name: String, in parent: StoreNodeID, except: StoreNodeID, branch: Int64, upTo limit: Int64
    )
        throws -> [StoreNodeID]
    {
        try db.query(
            PortableSQL.nodesNamed(
                parent: "$1", name: "$2", except: "$3", branch: "$4::bigint", limit: "$5::bigint"),
            [.int(parent.rawValue), .text(name), .int(except.rawValue), .int(branch), .int(limit)]
        ).map { StoreNodeID(rawValue: try $0.int("node")) }
    }

    func insertNode(_ row: StoredNode) throws {
        let r = row.record
        try db.query(
            """
            INSERT INTO nodes(node, branch, version, document, parent, name, preferred_name, kind,
                permissions, uid, gid, mtime, ctime, atime, btime, size, link_target, xattrs, removed, device,
                link_of)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20,
                $21)
            ON CONFLICT (node, branch, version) DO UPDATE SET document = EXCLUDED.document,
                parent = EXCLUDED.parent, name = EXCLUDED.name, preferred_name = EXCLUDED.preferred_name,
                kind = EXCLUDED.kind, permissions = EXCLUDED.permissions, uid = EXCLUDED.uid, gid = EXCLUDED.gid,
                mtime = EXCLUDED.mtime, ctime = EXCLUDED.ctime, atime = EXCLUDED.atime, btime = EXCLUDED.btime,
                size = EXCLUDED.size, link_target = EXCLUDED.link_target, xattrs = EXCLUDED.xattrs,
                removed = EXCLUDED.removed, device = EXCLUDED.device, link_of = EXCLUDED.link_of
            """,
            row.removed
                ? [
                    .int(r.id.rawValue), .int(row.branch), .int(r.version.rawValue),
                    .int(r.document.rawValue),
                    SQLValue(r.parent?.rawValue), .text(r.name), .null, 0, 0, 0, 0, 0, 0, 0, 0, 0, .null,
                    .null, 1, 0, .null,
                ]
                : [
                    .int(r.id.rawValue), .int(row.branch), .int(r.version.rawValue),
                    .int(r.document.rawValue),
                    SQLValue(r.parent?.rawValue), .text(r.name), SQLValue(r.preferredName),
                    .int(r.kind.storedCode), SQLValue(r.permissions), .int(Int64(r.uid)), .int(Int64(r.gid)),
                    .int(r.modified.rawValue), .int(r.changed.rawValue), .int(r.accessed.rawValue),
                    .int(r.created.rawValue), .int(r.size), SQLValue(r.linkTarget),
                    SQLValue(r.extendedAttributes.isEmpty ? nil : XattrCoding.encode(r.extendedAttributes)),
                    0, .int(Int64(bitPattern: r.device)), SQLValue(r.linkOf?.rawValue),
                ])
    }

    func nodeRowKeys(of document: DocumentID) throws -> [(key: NodeRowKey, removed: Bool)] {
        try db.query(
            "SELECT node, branch, version, removed FROM nodes WHERE document = $1", [.int(document.rawValue)]
        ).map { row in
            (
                NodeRowKey(
                    node: StoreNodeID(rawValue: try row.int("node")), branch: try row.int("branch"),
                    version: VersionID(rawValue: try row.int("version"))),
                try row.int("removed") != 0
            )
        }
    }

    func removeNodeRows(_ keys: [NodeRowKey]) throws {
        for batch in Self.batches(keys) {
            try db.query(
                """
                DELETE FROM nodes USING unnest($1::text::bigint[], $2::text::bigint[], $3::text::bigint[]) AS k(n, b, v)
                WHERE nodes.node = k.n AND nodes.branch = k.b AND nodes.version = k.v
                """,
                [
                    Self.array(batch.map(\.node.rawValue)), Self.array(batch.map(\.branch)),
                    Self.array(batch.map(\.version.rawValue)),
                ])
        }
    }

    func removeBranch(_ branch: Int64) throws {
        try db.query("DELETE FROM extents WHERE branch = $1", [.int(branch)])
        try db.query("DELETE FROM nodes WHERE branch = $1", [.int(branch)])
    }

    static func record(_ row: SQLRow) throws -> NodeRecord {
        try NodeColumns(row.columnNames).record(row)
    }

    // MARK: Extents

    func extents(_ node: StoreNodeID, branch: Int64, upTo limit: Int64, starts: ClosedRange<Int64>) throws
        -> [Int64: Extent?]
    {
        var map: [Int64: Extent?] = [:]
        // One round trip either way. On the main line, when no row of the file is newer than
        // `limit`, its current extents are the answer (see `PostgresSchema`); a file without
        // that row has no rows at all. Otherwise the latest row at each start. The conditions
        // that pick a branch use no column, so PostgreSQL runs only the branch that holds.
        for row in try db.query(
            """
            WITH newest AS (SELECT version FROM extents_live WHERE node = $1 AND start = -1 AND $2 = 0)
            SELECT start, chunk, length FROM extents_live
            WHERE (SELECT version FROM newest) <= $5 AND node = $1 AND start BETWEEN greatest($3, 0) AND $4
            UNION ALL
            (SELECT DISTINCT ON (start) start, chunk, length FROM extents
            WHERE ($2 <> 0 OR (SELECT version FROM newest) > $5)
                AND node = $1 AND branch = $2 AND start BETWEEN $3 AND $4 AND version <= $5
            ORDER BY start, version DESC)
            """,
            [
                .int(node.rawValue), .int(branch), .int(starts.lowerBound), .int(starts.upperBound),
                .int(limit),
            ])
        {
            map[try row.int("start")] = .some(
                try row.optionalInt("chunk").map { Extent(chunk: $0, length: try row.int("length")) })
        }
        return map
    }

    func insertExtents(
        _ node: StoreNodeID, branch: Int64, version: VersionID, _ rows: [(start: Int64, extent: Extent?)]
    ) throws {
        // One statement per few thousand rows: a copy of 1 GiB is 8,192 rows, which one round
        // trip each took 1.9 s (B11). The main line's current extents change in the same statement.
        for batch in Self.batches(rows) {
            try db.query(
                """
                WITH r AS (
                    SELECT * FROM unnest($4::text::bigint[], $5::text::bigint[], $6::text::bigint[])
                        AS r(start, chunk, length)
                ), history AS (
                    INSERT INTO extents(node, branch, start, version, chunk, length)
                    SELECT $1, $2, r.start, $3, r.chunk, r.length FROM r
                    ON CONFLICT (node, branch, start, version)
                        DO UPDATE SET chunk = EXCLUDED.chunk, length = EXCLUDED.length
                ), gone AS (
                    DELETE FROM extents_live l USING r
                    WHERE $2 = 0 AND l.node = $1 AND l.start = r.start AND r.chunk IS NULL
                )
                INSERT INTO extents_live(node, start, version, chunk, length)
                SELECT $1, r.start, $3, r.chunk, r.length FROM r WHERE $2 = 0 AND r.chunk IS NOT NULL
                UNION ALL SELECT $1, -1, $3, NULL, 0 WHERE $2 = 0
                ON CONFLICT (node, start)
                    DO UPDATE SET version = EXCLUDED.version, chunk = EXCLUDED.chunk, length = EXCLUDED.length
                """,
                [
                    .int(node.rawValue), .int(branch), .int(version.rawValue),
                    Self.array(batch.map(\.start)), Self.array(batch.map { $0.extent?.chunk }),
                    Self.array(batch.map { $0.extent?.length ?? 0 }),
                ])
        }
    }

    func extentRowKeys(of document: DocumentID) throws -> [(key: ExtentRowKey, hasChunk: Bool)] {
        try db.query(
            """
            SELECT node, start, version, (chunk IS NOT NULL)::int::bigint AS has_chunk FROM extents
            WHERE branch = 0 AND node IN (SELECT DISTINCT node FROM nodes WHERE document = $1)
            """,
            [.int(document.rawValue)]
        ).map { row in
            (
                ExtentRowKey(
                    node: StoreNodeID(rawValue: try row.int("node")), branch: 0, start: try row.int("start"),
                    version: VersionID(rawValue: try row.int("version"))),
                try row.int("has_chunk") != 0
            )
        }
    }

    func removeExtentRows(_ keys: [ExtentRowKey]) throws {
        for batch in Self.batches(keys) {
            try db.query(
                """
                DELETE FROM extents
                USING unnest($1::text::bigint[], $2::text::bigint[], $3::text::bigint[], $4::text::bigint[]) AS k(n, b, s, v)
                WHERE extents.node = k.n AND extents.branch = k.b AND extents.start = k.s AND extents.version = k.v
                """,
                [
                    Self.array(batch.map(\.node.rawValue)), Self.array(batch.map(\.branch)),
                    Self.array(batch.map(\.start)), Self.array(batch.map(\.version.rawValue)),
                ])
        }
        let nodes = Set(keys.lazy.filter { $0.branch == 0 }.map(\.node.rawValue))
        if !nodes.isEmpty { try PostgresSchema.rebuildLiveExtents(db, of: Array(nodes)) }
    }

    // MARK: Chunks

    func chunkID(hash: Data) throws -> Int64? {
        try db.scalar("SELECT id FROM chunks WHERE hash = $1", [.bytes(hash)])
    }

    func chunkIDs(hashes: [Data]) throws -> [Data: Int64] {
        var ids: [Data: Int64] = [:]
        for batch in Self.batches(hashes) {
            // Hex text in a text array, decoded by the server: bytea has no array literal of its own
            // that libpq's text parameters pass without escaping.
            let hex =
                "{" + batch.map { $0.map { String(format: "%02x", $0) }.joined() }.joined(separator: ",")
                + "}"
            for row in try db.query(
                "SELECT hash, id FROM chunks WHERE hash = ANY(ARRAY(SELECT decode(h, 'hex') FROM unnest($1::text[]) AS h))",
                [.text(hex)])
            {
                if let hash = try row.optionalData("hash") { ids[hash] = try row.int("id") }
            }
        }
        return ids
    }

    func insertChunk(hash: Data, data: Data, offset: Int64) throws -> Int64 {
        guard
            let id = try db.scalar(
                "INSERT INTO chunks(hash, size, data) VALUES ($1, $2, $3) RETURNING id",
                [.bytes(hash), SQLValue(data.count), .bytes(data)])
        else { throw DocumentStoreError.io("storing a chunk gave no id") }
        return id
    }

    func chunks(_ ids: [Int64]) throws -> [Int64: Data] {
        var result: [Int64: Data] = [:]
        for row in try db.query(
            "SELECT id, data FROM chunks WHERE id = ANY($1::text::bigint[])", [Self.array(ids)])
        {
            result[try row.int("id")] = try row.optionalData("data") ?? Data()
        }
        return result
    }

    func chunkLength(_ id: Int64) throws -> Int64? {
        try db.scalar("SELECT size FROM chunks WHERE id = $1", [.int(id)])
    }

    func removeUnreferencedChunks() throws -> (count: Int, bytes: Int64) {
        let rows = try db.query(
            "DELETE FROM chunks WHERE NOT EXISTS (SELECT 1 FROM extents WHERE chunk = chunks.id) RETURNING size"
        )
        return (rows.count, try rows.reduce(0) { $0 + (try $1.int("size")) })
    }

    func forEachChunk(_ body: (Result<ChunkRow, any Error>) throws -> Void) throws {
        var after: Int64 = 0
        while true {
            let rows = try db.query(
                "SELECT id, hash, size, data FROM chunks WHERE id > $1 ORDER BY id LIMIT 32", [.int(after)])
            guard !rows.isEmpty else { return }
            for row in rows {
                after = try row.int("id")
                let id = after
                try body(
                    Result {
                        ChunkRow(
                            id: id, hash: try row.optionalData("hash") ?? Data(), size: try row.int("size"),
                            data: try row.optionalData("data") ?? Data())
                    })
            }
        }
    }

    // MARK: Events

    func insertEvent(
        _ kind: StoreEvent.Kind, document: DocumentID, version: VersionID?, name: String, origin: String,
        time: Timestamp
    ) throws {
        // pg_notify is NOTIFY (delivered at commit, only if it commits), in the event's statement.
        try db.query(
            """
            WITH event AS (
                INSERT INTO events(kind, document, version, name, origin, time) VALUES ($1, $2, $3, $4, $5, $6)
                RETURNING sequence)
            SELECT pg_notify('\(PostgresSchema.channel)', '') FROM event
            """,
            [
                .text(kind.rawValue), .int(document.rawValue), SQLValue(version?.rawValue), .text(name),
                .text(origin),
                .int(time.rawValue),
            ])
    }

    func events(after sequence: Int64) throws -> [StoreEvent] {
        try db.query("SELECT * FROM events WHERE sequence > $1 ORDER BY sequence", [.int(sequence)])
            .compactMap {
                row -> StoreEvent? in
                guard let kind = StoreEvent.Kind(rawValue: try row.string("kind")) else { return nil }
                return StoreEvent(
                    sequence: try row.int("sequence"), kind: kind,
                    document: DocumentID(rawValue: try row.int("document")),
                    version: try row.optionalInt("version").map(VersionID.init(rawValue:)),
                    name: try row.string("name"),
                    origin: try row.string("origin"))
            }
    }

    func latestEventSequence() throws -> Int64 {
        try db.scalar("SELECT MAX(sequence) FROM events") ?? 0
    }

    func removeEvents(before time: Timestamp) throws {
        try db.query("DELETE FROM events WHERE time < $1", [.int(time.rawValue)])
    }

    // MARK: Integrity

    func danglingReferences(_ kind: DanglingReference) throws -> [Int64] {
        try db.query(PortableSQL.dangling(kind)).map { row in
            guard let value = try row.decode(0, "reference", as: Int64.self, "an integer") else {
                throw DocumentStoreError.corrupt(path: "", reason: "a reference is NULL")
            }
            return value
        }
    }

    // MARK: Arrays

    /// A bigint array as one text parameter (`$n::text::bigint[]`): one bind for any length.
    static func array(_ values: [Int64?]) -> SQLValue {
        .text("{" + values.map { $0.map(String.init) ?? "NULL" }.joined(separator: ",") + "}")
    }

    static func array(_ values: [Int64]) -> SQLValue { array(values.map { Optional($0) }) }

    /// Keys in statements of a few thousand.
    static func batches<Key>(_ keys: [Key]) -> [ArraySlice<Key>] {
        stride(from: 0, to: keys.count, by: 5_000).map { keys[$0..<min($0 + 5_000, keys.count)] }
    }
}

extension [SQLRow] {
    /// The `nodes` rows of a result, their columns located once from the first row.
    func storedNodes() throws -> [StoredNode] {
        guard let first else { return [] }
        let columns = try NodeColumns(first.columnNames)
        return try map { try columns.storedNode($0) }
    }
}

/// A result row read by column position (``NodeColumns``): looking columns up by name hashed
/// every name of every row, most of reading a package's 10,000 records (benchmark B6).
extension SQLRow: ColumnSource {
    package func int64(_ index: Int, _ column: String) throws -> Int64 {
        try Self.required(optionalInt64(index, column), column)
    }

    package func optionalInt64(_ index: Int, _ column: String) throws -> Int64? {
        try decode(index, column, as: Int64.self, "an integer")
    }

    package func text(_ index: Int, _ column: String) throws -> String {
        try Self.required(optionalText(index, column), column)
    }

    package func optionalText(_ index: Int, _ column: String) throws -> String? {
        try decode(index, column, as: String.self, "text")
    }

    package func optionalBlob(_ index: Int, _ column: String) throws -> Data? {
        try decode(index, column, as: Data.self, "bytes")
    }

    private static func required<Value>(_ value: Value?, _ column: String) throws -> Value {
        guard let value else {
            throw DocumentStoreError.corrupt(path: "", reason: "column \(column) is NULL")
        }
        return value
    }
}
