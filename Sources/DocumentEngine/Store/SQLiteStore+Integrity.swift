import Crypto
import Foundation
import GRDB

extension SQLiteStore {
    /// Checks the whole store: SQLite's own integrity check, every chunk against its SHA-256 and
    /// size, references between tables, that every wrapper of every live document (at its current
    /// version) is reachable from the document's root through directories, and that sizes agree
    /// with the chunks. Reads every chunk once; does not change the store.
    public func checkIntegrity() throws -> IntegrityReport {
        try read { db in
            var report = IntegrityReport()
            let sqliteProblems = try String.fetchAll(db, sql: "PRAGMA integrity_check")
            if sqliteProblems != ["ok"] {
                report.problems += sqliteProblems.map { "SQLite: \($0)" }
                return report  // the rest would read damaged pages
            }

            let chunks = try Row.fetchCursor(db, sql: "SELECT id, hash, size, data FROM chunks")
            while let row = try chunks.next() {
                let id: Int64
                let data: Data
                let hash: Data
                let size: Int64
                do {
                    id = try row.stored("id")
                    data = try row.stored("data", as: Data?.self) ?? Data()
                    hash = try row.stored("hash", as: Data?.self) ?? Data()
                    size = try row.stored("size")
                } catch {
                    report.problems.append("a chunk row cannot be read: \(error)")
                    continue
                }
                if Data(SHA256.hash(data: data)) != hash {
                    report.problems.append("chunk \(id): its bytes do not match its hash")
                }
                if size != Int64(data.count) {
                    report.problems.append("chunk \(id): recorded size \(size) but \(data.count) bytes")
                }
                if data.count > chunkSize {
                    report.problems.append(
                        "chunk \(id): \(data.count) bytes, more than the chunk size \(chunkSize)")
                }
                report.chunksChecked += 1
            }

            let dangling: [(String, String)] = [
                (
                    "SELECT DISTINCT chunk FROM chunk_map WHERE chunk IS NOT NULL AND chunk NOT IN (SELECT id FROM chunks)",
                    "a file refers to missing chunk"
                ),
                (
                    "SELECT DISTINCT document FROM nodes WHERE document NOT IN (SELECT id FROM documents)",
                    "wrappers belong to missing document"
                ),
                (
                    "SELECT DISTINCT document FROM versions WHERE document NOT IN (SELECT id FROM documents)",
                    "versions belong to missing document"
                ),
                (
                    "SELECT id FROM documents WHERE current_version NOT IN (SELECT id FROM versions)",
                    "document's current version is missing; document"
                ),
                (
                    "SELECT DISTINCT node FROM chunk_map WHERE node NOT IN (SELECT node FROM nodes)",
                    "contents belong to missing wrapper"
                ),
            ]
            for (sql, message) in dangling {
                for id in try Int64.fetchAll(db, sql: sql) { report.problems.append("\(message) \(id)") }
            }

            for document in try Row.fetchAll(db, sql: "SELECT * FROM documents WHERE deleted IS NULL").map(
                Self.document)
            {
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
                    let rows = try Row.fetchAll(
                        db,
                        sql: """
                            SELECT c.idx, c.chunk, ch.size AS bytes FROM chunk_map c
                            JOIN (SELECT idx, MAX(version) AS v FROM chunk_map WHERE node = ? AND branch = 0 GROUP BY idx) latest
                              ON c.idx = latest.idx AND c.version = latest.v
                            LEFT JOIN chunks ch ON ch.id = c.chunk
                            WHERE c.node = ? AND c.branch = 0
                            """,
                        arguments: [record.id.rawValue, record.id.rawValue])
                    for row in rows {
                        let index: Int64
                        let stored: Int64?
                        do {
                            index = try row.stored("idx")
                            stored = try row.stored("bytes", as: Int64?.self)
                        } catch {
                            report.problems.append("\(document.name)/\(record.name): \(error)")
                            continue
                        }
                        guard let bytes = stored else { continue }
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
