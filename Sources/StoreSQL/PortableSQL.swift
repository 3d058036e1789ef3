import VersionedStore

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
        case .staleCurrentExtents:
            return """
                SELECT node FROM (SELECT * FROM (\(currentExtents())) d EXCEPT SELECT * FROM extents_live) a
                UNION
                SELECT node FROM (SELECT * FROM extents_live EXCEPT SELECT * FROM (\(currentExtents())) d) b
                """
        }
    }

    /// What `extents_live` holds, derived from the history: per file, the newest main-line row
    /// at each start that holds a chunk, and at start −1 the version of its newest row. Columns
    /// in `extents_live`'s order. `condition` (such as `AND node = ?`) narrows both parts to
    /// some files. The backends rebuild the table with it, and the integrity check compares
    /// the table with it.
    package static func currentExtents(_ condition: String = "") -> String {
        """
        SELECT e.node, e.start, e.version, e.chunk, e.length FROM extents e
        WHERE e.branch = 0 AND e.chunk IS NOT NULL \(condition) AND NOT EXISTS (
            SELECT 1 FROM extents n
            WHERE n.node = e.node AND n.branch = 0 AND n.start = e.start AND n.version > e.version)
        UNION ALL
        SELECT node, -1, max(version), NULL, 0 FROM extents WHERE branch = 0 \(condition) GROUP BY node
        """
    }

    /// `StoreTransaction.nodesNamed`, with the parameters' placeholders.
    ///
    /// A store never has two wrappers of one name in one folder at any version (every save
    /// checks it). So the newest main-line row up to `limit` that names it there, not removed,
    /// belongs to the only wrapper that can still have the name on the main line: any other
    /// one that had it then kept it would have had it at that row's version too. That row is
    /// one descending step of the `nodes_by_name` index, however many wrappers had the name
    /// before (a file saved by safe-saves leaves a removed one per save). A conflict branch
    /// adds its own rows of the name. Each candidate is then judged by its state at the lineage:
    /// the primary key (node, branch, version) read backwards finds that row first, since a
    /// branch's id is a version id, above the main line's 0.
    package static func nodesNamed(
        parent: String, name: String, except: String, branch: String, limit: String
    )
        -> String
    {
        """
        SELECT c.node FROM (
            SELECT node FROM (
                SELECT node FROM nodes
                WHERE parent = \(parent) AND name = \(name) AND branch = 0 AND removed = 0
                    AND version <= \(limit)
                ORDER BY version DESC LIMIT 1
            ) m
            UNION
            SELECT node FROM nodes
            WHERE parent = \(parent) AND name = \(name) AND branch = \(branch) AND \(branch) != 0
                AND removed = 0
        ) c
        WHERE c.node != \(except) AND (
            SELECT s.removed = 0 AND s.parent = \(parent) AND s.name = \(name) FROM nodes s
            WHERE s.node = c.node
                AND ((\(branch) != 0 AND s.branch = \(branch)) OR (s.branch = 0 AND s.version <= \(limit)))
            ORDER BY s.branch DESC, s.version DESC LIMIT 1
        )
        """
    }
}
