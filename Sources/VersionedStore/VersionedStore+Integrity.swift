import DocumentEngine
import Foundation

extension VersionedStore {
    /// Checks the whole store: the database's own check where it has one, every chunk against
    /// its SHA-256 and size, references between tables, that every wrapper of every live document
    /// (at its current version) is reachable from the document's root through directories, and
    /// that sizes agree with the chunks. Reads every chunk once; does not change the store.
    public func checkIntegrity() throws -> IntegrityReport {
        var report = IntegrityReport()
        let storage = try backend.storageProblems()
        if !storage.isEmpty {
            report.problems = storage
            return report  // the rest would read damaged pages
        }
        return try backend.read { tx in
            // The same reason for many rows (every chunk of a missing pack) is one line.
            var unreadable: [(reason: String, rows: Int)] = []
            var index: [String: Int] = [:]
            try tx.forEachChunk { row in
                let chunk: ChunkRow
                do { chunk = try row.get() } catch {
                    let reason = "\(error)"
                    if let at = index[reason] {
                        unreadable[at].rows += 1
                    } else {
                        index[reason] = unreadable.count
                        unreadable.append((reason, 1))
                    }
                    return
                }
                if Self.hash(chunk.data) != chunk.hash {
                    report.problems.append("chunk \(chunk.id): its bytes do not match its hash")
                }
                if chunk.size != Int64(chunk.data.count) {
                    report.problems.append(
                        "chunk \(chunk.id): recorded size \(chunk.size) but \(chunk.data.count) bytes")
                }
                if chunk.data.count > chunkSize {
                    report.problems.append(
                        "chunk \(chunk.id): \(chunk.data.count) bytes, more than the chunk size \(chunkSize)")
                }
                report.chunksChecked += 1
            }
            for (reason, rows) in unreadable {
                let what = rows == 1 ? "a chunk row cannot be read" : "\(rows) chunk rows cannot be read"
                report.problems.append("\(what): \(reason)")
            }
            for kind in DanglingReference.allCases {
                for id in try tx.danglingReferences(kind) { report.problems.append("\(kind.message) \(id)") }
            }
            for document in try tx.documents(deleted: false) {
                report.documentsChecked += 1
                do {
                    try checkDocument(tx, document, into: &report)
                } catch let error as DocumentStoreError {
                    report.problems.append("\(document.name): \(error)")
                }
            }
            return report
        }
    }

    private func checkDocument(
        _ tx: any StoreTransaction, _ document: DocumentInfo, into report: inout IntegrityReport
    )
        throws
    {
        let nodes = try Self.nodes(tx, document: document.id, lineage: .current)
        report.nodesChecked += nodes.count
        guard let root = nodes[document.root] else {
            report.problems.append("\(document.name): its root wrapper is missing")
            return
        }
        if root.parent != nil { report.problems.append("\(document.name): its root has a parent") }
        if (root.kind == .directory) != (document.kind == .package) {
            report.problems.append("\(document.name): its root's kind does not match the document's")
        }
        var names: [StoreNodeID: Set<String>] = [:]
        for record in nodes.values.sorted(by: { $0.id < $1.id }) where record.id != document.root {
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
                report.problems.append("\(document.name): two wrappers named \(record.name) in one directory")
            }
            if let reason = FileName.problem(with: record.name) {
                report.problems.append(
                    "\(document.name): wrapper \(record.id.rawValue) has an invalid name: \(reason)")
            }
            if let target = record.linkOf {
                let file = nodes[target]
                if file == nil || file?.linkOf != nil || file?.kind == .directory || file?.parent == nil
                    || file?.kind != record.kind
                {
                    report.problems.append(
                        "\(document.name): hard link \(record.id.rawValue) (\(record.name)) does not name a file of the document"
                    )
                }
            }
        }
        // A hard link has no extents of its own: its file's are checked.
        for record in nodes.values.sorted(by: { $0.id < $1.id })
        where record.kind == .regularFile && record.linkOf == nil {
            // Every extent, past the end included; each must lie inside the file and after the last.
            let extents = try Self.extents(tx, node: record.id, lineage: .current, starts: 0...Int64.max)
            var end: Int64 = 0
            for (start, extent) in extents.sorted(by: { $0.key < $1.key }) {
                guard let bytes = try tx.chunkLength(extent.chunk) else { continue }
                if start >= record.size {
                    report.problems.append(
                        "\(document.name)/\(record.name): a chunk lies past the end of the file")
                } else if start + extent.length > record.size {
                    report.problems.append(
                        "\(document.name)/\(record.name): the last chunk is longer than the file")
                } else if start < end {
                    report.problems.append(
                        "\(document.name)/\(record.name): two chunks overlap at byte \(start)")
                } else if bytes != extent.length {
                    report.problems.append(
                        "\(document.name)/\(record.name): the chunk at byte \(start) holds \(bytes) bytes, not \(extent.length)"
                    )
                }
                end = max(end, start + extent.length)
            }
        }
    }
}
