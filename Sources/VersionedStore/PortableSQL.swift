/// Statements both SQL backends run as written: standard SQL over the tables they share.
package enum PortableSQL {
    /// The ids (first column) of rows that refer to something missing.
    package static func dangling(_ kind: DanglingReference) -> String {
        switch kind {
        case .missingChunk:
            return
                "SELECT DISTINCT chunk FROM extents WHERE chunk IS NOT NULL AND chunk NOT IN (SELECT id FROM chunks)"
        case .nodeWithoutDocument:
            return "SELECT DISTINCT document FROM nodes WHERE document NOT IN (SELECT id FROM documents)"
        case .versionWithoutDocument:
            return "SELECT DISTINCT document FROM versions WHERE document NOT IN (SELECT id FROM documents)"
        case .missingCurrentVersion:
            return "SELECT id FROM documents WHERE current_version NOT IN (SELECT id FROM versions)"
        case .contentsWithoutNode:
            return "SELECT DISTINCT node FROM extents WHERE node NOT IN (SELECT node FROM nodes)"
        }
    }
}
