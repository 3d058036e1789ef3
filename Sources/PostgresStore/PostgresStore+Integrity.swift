import DocumentEngine
import Foundation

extension PostgresStore {
    /// Checks the whole store: every chunk against its SHA-256 and size, references between
    /// tables, that every wrapper of every live document (at its current version) is reachable from
    /// the document's root through directories, and that sizes agree with the chunks. Reads every
    /// chunk once, a few at a time, in one snapshot; does not change the store.
    public func checkIntegrity() throws -> IntegrityReport {
        try read { db in
            var report = IntegrityReport()
            var after: Int64 = 0
            while true {
                let rows = try db.query(
                    "SELECT id, hash, size, data FROM chunks WHERE id > $1 ORDER BY id LIMIT 32",
                    [.int(after)])
                guard !rows.isEmpty else { break }
                for row in rows {
                    let id = try row.int("id")
                    after = id
                    let data = try row.optionalData("data") ?? Data()
                    if SQLiteStore.hash(data) != (try row.optionalData("hash") ?? Data()) {
                        report.problems.append("chunk \(id): its bytes do not match its hash")
                    }
                    let size = try row.int("size")
                    if size != Int64(data.count) {
                        report.problems.append("chunk \(id): recorded size \(size) but \(data.count) bytes")
                    }
                    if data.count > chunkSize {
                        report.problems.append(
                            "chunk \(id): \(data.count) bytes, more than the chunk size \(chunkSize)")
                    }
                    report.chunksChecked += 1
                }
            }

            let dangling: [(String, String)] = [
                (
                    "SELECT DISTINCT chunk AS id FROM chunk_map WHERE chunk IS NOT NULL AND chunk NOT IN (SELECT id FROM chunks)",
                    "a file refers to missing chunk"
                ),
                (
                    "SELECT DISTINCT document AS id FROM nodes WHERE document NOT IN (SELECT id FROM documents)",
                    "wrappers belong to missing document"
                ),
                (
                    "SELECT DISTINCT document AS id FROM versions WHERE document NOT IN (SELECT id FROM documents)",
                    "versions belong to missing document"
                ),
                (
                    "SELECT id FROM documents WHERE current_version NOT IN (SELECT id FROM versions)",
                    "document's current version is missing; document"
                ),
                (
                    "SELECT DISTINCT node AS id FROM chunk_map WHERE node NOT IN (SELECT node FROM nodes)",
                    "contents belong to missing wrapper"
                ),
            ]
            for (sql, message) in dangling {
                for row in try db.query(sql) { report.problems.append("\(message) \(try row.int("id"))") }
            }

            for document in try db.query("SELECT * FROM documents WHERE deleted IS NULL").map(Self.document) {
                report.documentsChecked += 1
                let nodes = try Self.nodes(db, document: document.id, lineage: .current)
                report.nodesChecked += nodes.count
                guard let root = nodes[document.root] else {
                    report.problems.append("\(document.name): its root wrapper is missing")
                    continue
                }
                if root.parent != nil { report.problems.append("\(document.name): its root has a parent") }
                if (root.kind == .directory) != (document.kind == .package) {
                    report.problems.append("\(document.name): its root's kind does not match the document's")
                }
                var names: [StoreNodeID: Set<String>] = [:]
                for record in nodes.values where record.id != document.root {
                    var seen: Set<StoreNodeID> = [record.id]
                    var current = record
                    var reachable = false
                    while let parentID = current.parent {
                        guard let parent = nodes[parentID], parent.kind == .directory else { break }
                        if parentID == document.root {
                            reachable = true
                            break
                        }
                        guard seen.insert(parentID).inserted else { break }
                        current = parent
                    }
                    if !reachable {
                        report.problems.append(
                            "\(document.name): wrapper \(record.id.rawValue) (\(record.name)) is not reachable from the root"
                        )
                    }
                    if let parent = record.parent, !names[parent, default: []].insert(record.name).inserted {
                        report.problems.append(
                            "\(document.name): two wrappers named \(record.name) in one directory")
                    }
                    if let reason = FileName.problem(with: record.name) {
                        report.problems.append(
                            "\(document.name): wrapper \(record.id.rawValue) has an invalid name: \(reason)")
                    }
                }
                for record in nodes.values where record.kind == .regularFile {
                    let size = Int64(chunkSize)
                    let count = (record.size + size - 1) / size
                    let rows = try db.query(
                        """
                        SELECT c.idx, ch.size AS bytes FROM
                          (SELECT DISTINCT ON (idx) idx, chunk FROM chunk_map WHERE node = $1 AND branch = 0
                           ORDER BY idx, version DESC) c
                        LEFT JOIN chunks ch ON ch.id = c.chunk
                        """,
                        [.int(record.id.rawValue)])
                    for row in rows {
                        let index = try row.int("idx")
                        guard let bytes = try row.optionalInt("bytes") else { continue }
                        if index >= count {
                            report.problems.append(
                                "\(document.name)/\(record.name): a chunk lies past the end of the file")
                        } else if index * size + bytes > record.size {
                            report.problems.append(
                                "\(document.name)/\(record.name): the last chunk is longer than the file")
                        }
                    }
                }
            }
            return report
        }
    }
}
